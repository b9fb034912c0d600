"""One instance in its own process: the child side of ``gpushare.ProcessInstances``.

It is run by path (``python instance_child.py``), not imported through the ``edgemux`` package, so that a child
loads only numpy and onnxruntime: a process per instance is how NVIDIA MPS gives each instance its own share
(``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` is read once, when the process's CUDA context is created), and it should
cost what the session costs, not the control plane's imports.

Protocol, pickled values over the binary stdin/stdout (stdout carries nothing else: the child points file
descriptor 1 at stderr so a library that prints cannot corrupt a frame):

* parent -> child, first: ``{"path", "providers", "provider_options", "optimization", "threads"}``;
* child -> parent: ``{"ok": True, "inputs", "outputs", "providers", "pid", "mps_percentage"}`` once the session
  is built, or ``{"ok": False, "error": text}`` (then it exits 1);
* parent -> child: ``("run", {name: array})``; child -> parent: ``("ok", {name: array}, exec_ms)`` where
  ``exec_ms`` is the session's run alone, timed in the child (so a share curve does not count the pipe), or
  ``("error", text)``;
* parent -> child: ``("close",)`` or end of file: the child exits 0.
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from typing import Any


def _session(cfg: dict[str, Any]) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = int(cfg.get("threads", 1))
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.graph_optimization_level = {
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[cfg.get("optimization", "all")]
    providers = list(cfg["providers"])
    options = [dict(o) for o in cfg.get("provider_options", [{} for _ in providers])]
    session = ort.InferenceSession(cfg["path"], opts, providers=providers, provider_options=options)
    if providers[0] not in session.get_providers():
        # onnxruntime falls back to the CPU silently when a provider cannot start (no driver, no device)
        raise RuntimeError(f"onnxruntime could not start {providers[0]} (session has {session.get_providers()})")
    return session


def main() -> int:
    """Serve one instance over stdin/stdout until told to close; 0 on a clean close, 1 when set-up failed."""
    rx = sys.stdin.buffer
    tx = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed from now on goes to stderr, never into a frame
    sys.stdout = sys.stderr

    def send(value: Any) -> None:
        pickle.dump(value, tx, protocol=pickle.HIGHEST_PROTOCOL)
        tx.flush()

    try:
        cfg = pickle.load(rx)
        session = _session(cfg)
    except Exception as e:  # reported to the parent as data, which raises it as its own error
        send({"ok": False, "error": f"{type(e).__name__}: {e}"})
        return 1
    names = [o.name for o in session.get_outputs()]
    send({"ok": True, "pid": os.getpid(), "providers": session.get_providers(),
          "mps_percentage": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
          "inputs": [(i.name, i.type, list(i.shape)) for i in session.get_inputs()],
          "outputs": [(o.name, o.type, list(o.shape)) for o in session.get_outputs()]})
    while True:
        try:
            msg = pickle.load(rx)
        except EOFError:
            return 0
        if msg[0] == "close":
            return 0
        try:
            t0 = time.perf_counter()
            out = session.run(names, msg[1])
            exec_ms = (time.perf_counter() - t0) * 1e3
            send(("ok", dict(zip(names, out)), exec_ms))
        except Exception as e:  # a bad request fails that request, not the instance
            send(("error", f"{type(e).__name__}: {e}"))


if __name__ == "__main__":
    sys.exit(main())
