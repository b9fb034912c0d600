"""Where an agent's per-request overhead goes: A/B comparisons measured in one run, interleaved.

``bench_serving.py`` measures the agent's overhead over a direct ONNX Runtime call; this script splits it.
Every path sends the same request (``zoo:squeezenet1_1@64``, batch 1, binary tensor data: a 49 kB body,
a 4 kB answer) from this process over a keep-alive loopback connection, in interleaved blocks so that a
slow moment of the host hits every path alike:

* floor:      a bare application on edgemux's server core (``runtime.httpserver``: a router and one
              middleware, as the agent has) that reads the body and returns a fixed 4 kB answer: the HTTP cost
              alone, no decoding, no model.
* agent:      ``edgemux agent`` processes (cluster ``examples/local/cluster.yaml``, node ``cpu-1``: a REAL ONNX
              Runtime CPU device), one on uvloop and one on the standard asyncio loop
              (``EDGEMUX_EVENT_LOOP=asyncio``).
* clients:    "raw" sends the pre-encoded body with ``http.client`` and does not decode the answer, either
              in one write (``client._OneWriteHTTPConnection``) or in two (plain ``http.client``, which
              writes the head and the body separately); "edgemux Client" is ``runtime.ingress.client.Client``
              (encoding, policing, routing, deadline, decoding).
* direct:     ``OnnxRuntimeBackend.run`` in this process on the same model, back to back, and again after
              3 ms of sleep before each call (the idle gap a server's device thread sees between requests).
* big floor:  the same bare app taking 2 MB and answering 0.75 MB (a detector's image and raw outputs):
              what moving large tensors through one Python HTTP hop costs on this host.
* model floors: a bare application on the server core in a separate process that reads the binary tensor and runs the same
              model, either on its event loop ("inline") or on a worker thread it wakes and that wakes the
              loop back (the agent's hand-off, without its bookkeeping): what HTTP plus inference costs
              before any of edgemux's own work.

It also reads each agent thread's CPU time from ``/proc`` over a block of requests (Linux only): the event
loop's thread (HTTP, decoding, encoding) against the device worker's (ONNX Runtime and its hand-off).

    .venv/bin/python benchmarks/bench_agent_breakdown.py [--rounds N] [--block N]

Units: ms.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from hostload import host_busy_s, own_cpu_s  # benchmarks/hostload.py, beside this script

ROOT = Path(__file__).resolve().parents[1]
MODEL = "zoo:squeezenet1_1@64"


def _start_agent(port: int, loop: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, EDGEMUX_EVENT_LOOP=loop)
    cmd = [sys.executable, "-m", "edgemux", "agent", "--cluster", str(ROOT / "examples/local/cluster.yaml"),
           "--node", "cpu-1", "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(url + "/v2/health/live", timeout=1).read()
            break
        except OSError:
            time.sleep(0.1)
    else:
        proc.kill()
        raise RuntimeError(f"agent on port {port} did not come up")
    req = urllib.request.Request(url + "/v1/apps/sq", method="PUT", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"device": "cpu0", "model": MODEL}).encode())
    urllib.request.urlopen(req, timeout=120).read()
    return proc


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _floor_server(body_out: bytes) -> tuple[int, Callable[[], None]]:
    """A bare application on the server core, on its own loop thread; returns (port, stop)."""
    from edgemux.runtime.httpserver import Application, Handler, Request, Response, get, post
    from edgemux.runtime.httputil import Site, start_site
    from edgemux.runtime.process import new_event_loop

    async def handler(request: Request) -> Response:
        await request.read()
        return Response(body_out)

    async def passthrough(request: Request, handler: Handler) -> Response:
        return await handler(request)

    loop = new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    port = _free_port()

    async def start() -> Site:
        app = Application([get("/v2/health/live", handler), post("/v2/models/{app}/infer", handler)],
                          middlewares=[passthrough], client_max_size=16 * 10**6)  # the agent's limit
        return await start_site(app, "127.0.0.1", port)

    site = asyncio.run_coroutine_threadsafe(start(), loop).result(30)

    def stop() -> None:
        asyncio.run_coroutine_threadsafe(site.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)

    return port, stop


def serve_model_floor(port: int, mode: str) -> None:
    """Entry point of a model-floor process: a bare application on the server core that reads the binary
    tensor of ``MODEL`` and runs it on an ``OnnxRuntimeBackend`` (1 thread), on the loop (``inline``) or on
    a worker thread (``thread``), answering the output's raw bytes."""
    import queue

    from edgemux.runtime.dataplane.backends import ModelSource, OnnxRuntimeBackend
    from edgemux.runtime.dataplane.protocol import HEADER_LENGTH_HEADER
    from edgemux.runtime.httpserver import Application, Request, Response, get, post
    from edgemux.runtime.httputil import start_site
    from edgemux.runtime.process import run as run_loop

    backend = OnnxRuntimeBackend(threads=1)
    info = backend.load("sq", ModelSource.parse(MODEL))
    spec = info.inputs[0]
    shape = [1 if d < 1 else d for d in spec.shape]
    jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def worker() -> None:
        while True:
            x, fut, loop = jobs.get()
            y = backend.run("sq", {spec.name: x})
            loop.call_soon_threadsafe(fut.set_result, y)

    threading.Thread(target=worker, daemon=True).start()

    async def infer(request: Request) -> Response:
        body = await request.read()
        offset = int(request.headers[HEADER_LENGTH_HEADER])
        x = np.frombuffer(body, dtype=np.float32, offset=offset).reshape(shape)
        if mode == "inline":
            out = backend.run("sq", {spec.name: x})
        else:
            loop = asyncio.get_running_loop()
            fut = loop.create_future()
            jobs.put((x, fut, loop))
            out = await fut
        return Response(b"".join(np.ascontiguousarray(v).tobytes() for v in out.values()))

    async def live(request: Request) -> Response:
        return Response(b"ok", content_type="text/plain")

    async def main() -> None:
        app = Application([get("/v2/health/live", live), post("/v2/models/{app}/infer", infer)],
                          client_max_size=16 * 10**6)
        await start_site(app, "127.0.0.1", port)
        await asyncio.Event().wait()

    run_loop(main())


def _start_model_floor(port: int, mode: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, __file__, "--serve-model-floor", str(port), mode],
                            stdout=subprocess.DEVNULL)
    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/live", timeout=1).read()
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"model floor ({mode}) on port {port} did not come up")


def _procs_cpu_s(pids: list[int]) -> float | None:
    """CPU seconds the processes ``pids`` used so far (Linux ``/proc``; None elsewhere)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            return None
        fields = stat[stat.rindex(")") + 2:].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds per thread of ``pid`` (Linux ``/proc``), keyed 'tid name'."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[f"{tid} {name}"] = (int(fields[11]) + int(fields[12])) / tick
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40, help="interleaved rounds (default 40)")
    ap.add_argument("--block", type=int, default=50, help="requests per path per round (default 50)")
    ap.add_argument("--serve-model-floor", nargs=2, metavar=("PORT", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve_model_floor:
        serve_model_floor(int(args.serve_model_floor[0]), args.serve_model_floor[1])
        return 0
    if args.rounds < 1 or args.block < 1:
        ap.error("--rounds and --block must be >= 1")

    from edgemux.runtime.dataplane.backends import ModelSource, OnnxRuntimeBackend
    from edgemux.runtime.ingress.client import AppRoute, Client
    from edgemux.runtime.process import event_loop_name
    from edgemux.runtime.dataplane.protocol import encode_infer_request

    backend = OnnxRuntimeBackend(threads=1)
    info = backend.load("sq", ModelSource.parse(MODEL))
    spec = info.inputs[0]
    x = np.random.default_rng(0).standard_normal([1 if d < 1 else d for d in spec.shape]).astype(np.float32)
    inputs = {spec.name: x}
    body, headers = encode_infer_request(inputs, binary=True)
    answer_bytes = len(encode_infer_request({"o": np.zeros((1, 1000), np.float32)}, binary=True)[0])

    uv_port, aio_port = _free_port(), _free_port()
    agents = {"uvloop": _start_agent(uv_port, ""), "asyncio": _start_agent(aio_port, "asyncio")}
    floor_port, floor_stop = _floor_server(b"\0" * answer_bytes)
    # the same bare app moving a detector's tensors: 2 MB in (a 416x416 FP32 image is 2.1 MB), 0.75 MB out
    big_body, big_answer = b"\1" * 2_000_000, 750_000
    big_port, big_stop = _floor_server(b"\0" * big_answer)
    inline_port, thread_port = _free_port(), _free_port()
    model_floors = [_start_model_floor(inline_port, "inline"), _start_model_floor(thread_port, "thread")]
    contract = {"rate_rps": 1e9, "burst": 1e9}
    clients = {
        "uvloop": Client(AppRoute("sq", "sq", {f"http://127.0.0.1:{uv_port}": 1.0}, **contract), timeout_s=30),
        "asyncio": Client(AppRoute("sq", "sq", {f"http://127.0.0.1:{aio_port}": 1.0}, **contract), timeout_s=30),
    }
    from edgemux.runtime.ingress.client import _OneWriteHTTPConnection

    conns = {
        "uv1": _OneWriteHTTPConnection("127.0.0.1", uv_port, timeout=30),
        "uv2": http.client.HTTPConnection("127.0.0.1", uv_port, timeout=30),
        "aio1": _OneWriteHTTPConnection("127.0.0.1", aio_port, timeout=30),
        "floor1": _OneWriteHTTPConnection("127.0.0.1", floor_port, timeout=30),
        "floor2": http.client.HTTPConnection("127.0.0.1", floor_port, timeout=30),
        "big": _OneWriteHTTPConnection("127.0.0.1", big_port, timeout=30),
        "inline": _OneWriteHTTPConnection("127.0.0.1", inline_port, timeout=30),
        "thread": _OneWriteHTTPConnection("127.0.0.1", thread_port, timeout=30),
    }

    def after_idle() -> None:
        time.sleep(0.003)  # outside the timed call: paths() times only the run after it

    def post(conn: http.client.HTTPConnection, data: bytes = body) -> None:
        conn.request("POST", "/v2/models/sq/infer", body=data, headers=dict(headers))
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}")

    # raw paths send the pre-encoded body and do not decode the answer: the difference to the edgemux
    # Client path is the client's own work (encode, policing, routing, deadline, decode)
    paths: dict[str, Callable[[], Any]] = {
        "direct onnxruntime (in process)": lambda: backend.run("sq", inputs),
        "direct, 3 ms idle before each": lambda: backend.run("sq", inputs),
        "model floor: core + model inline": lambda: post(conns["inline"]),
        "model floor: core + worker thread": lambda: post(conns["thread"]),
        "floor: bare core, one write": lambda: post(conns["floor1"]),
        "floor: bare core, two writes": lambda: post(conns["floor2"]),
        "floor: bare core, 2 MB / 0.75 MB": lambda: post(conns["big"], big_body),
        "agent uvloop, raw, one write": lambda: post(conns["uv1"]),
        "agent uvloop, raw, two writes": lambda: post(conns["uv2"]),
        "agent uvloop, edgemux Client": lambda: clients["uvloop"].infer("sq", inputs, binary=True),
        "agent asyncio, raw, one write": lambda: post(conns["aio1"]),
    }
    try:
        for fn in paths.values():
            for _ in range(200):
                fn()
        lat: dict[str, list[float]] = {k: [] for k in paths}
        pids = [p.pid for p in agents.values()]
        busy0, own0, agents0, t0 = host_busy_s(), own_cpu_s(), _procs_cpu_s(pids), time.perf_counter()
        for _ in range(args.rounds):
            for k, fn in paths.items():
                for _ in range(args.block):
                    if k == "direct, 3 ms idle before each":
                        after_idle()
                    ts = time.perf_counter()  # not t0: that one times the whole measurement (others' load)
                    fn()
                    lat[k].append((time.perf_counter() - ts) * 1000.0)
        busy1, own1, agents1, t1 = host_busy_s(), own_cpu_s(), _procs_cpu_s(pids), time.perf_counter()
        others = (None if busy0 is None or busy1 is None or agents0 is None or agents1 is None
                  else max(0.0, (busy1 - busy0) - (own1 - own0) - (agents1 - agents0)) / (t1 - t0))
        # per-thread CPU of the uvloop agent over one more block of requests
        n_cpu = 2000
        pid = agents["uvloop"].pid
        before = _thread_cpu_s(pid) if sys.platform.startswith("linux") else {}
        for _ in range(n_cpu):
            clients["uvloop"].infer("sq", inputs, binary=True)
        after = _thread_cpu_s(pid) if before else {}
    finally:
        for c in clients.values():
            c.close()
        for conn in conns.values():
            conn.close()
        floor_stop()
        big_stop()
        for proc in [*agents.values(), *model_floors]:
            proc.terminate()
            proc.wait(30)

    print("Agent overhead breakdown: A/B paths interleaved in one run")
    print(f"request: {MODEL}, batch 1, binary tensor data, {len(body)} B body, {answer_bytes} B answer; "
          f"{args.rounds} rounds x {args.block} requests per path; this process's loop: {event_loop_name()}")
    print("other processes used " + (f"{others:.2f}" if others is not None else "n/a")
          + f" of {os.cpu_count()} cores meanwhile (their load slows every path; the A/B differences are "
            "measured side by side)")
    print(f"{'path':<36} {'p50 ms':>8} {'p10 ms':>8} {'mean ms':>8}")
    med = {}
    for k, v in lat.items():
        a = np.asarray(v)
        med[k] = float(np.median(a))
        print(f"{k:<36} {med[k]:>8.3f} {float(np.percentile(a, 10)):>8.3f} {float(a.mean()):>8.3f}")
    d = med["direct onnxruntime (in process)"]
    raw = med["agent uvloop, raw, one write"]
    cl = med["agent uvloop, edgemux Client"]
    f1, f2 = med["floor: bare core, one write"], med["floor: bare core, two writes"]
    print()
    print(f"agent overhead over direct, edgemux Client: {cl - d:.3f} ms at p50; raw one-write client: {raw - d:.3f} ms")
    print(f"  HTTP floor (bare server core, same sizes, raw client): {f1:.3f} ms; with 2 MB in and 0.75 MB out: "
          f"{med['floor: bare core, 2 MB / 0.75 MB']:.3f} ms (one hop; the gateway adds a second)")
    print(f"  the edgemux Client's own work (encode, policing, routing, decode): {cl - raw:+.3f} ms")
    idle = med["direct, 3 ms idle before each"]
    inline, thread = med["model floor: core + model inline"], med["model floor: core + worker thread"]
    print(f"  the model after 3 ms idle: {idle:.3f} ms vs {d:.3f} ms back to back ({idle - d:+.3f} ms)")
    print(f"  server core + model on the loop: {inline - d:.3f} ms over direct; on a worker thread: "
          f"{thread - d:.3f} ms (hand-off {thread - inline:+.3f} ms); the agent adds {raw - thread:+.3f} ms of "
          "its own work to the worker-thread floor")
    print(f"two writes vs one: agent {med['agent uvloop, raw, two writes'] - raw:+.3f} ms, "
          f"bare server core {f2 - f1:+.3f} ms at p50 (positive: two writes are slower)")
    aio = med["agent asyncio, raw, one write"]
    print(f"asyncio vs uvloop agent: {aio - raw:+.3f} ms at p50 ({100 * (aio - raw) / raw:+.1f} %; "
          "positive: uvloop faster)")
    if before and after:
        print(f"uvloop agent's CPU per request by thread, over {n_cpu} requests (ms):")
        for key in sorted(after, key=lambda k: -(after[k] - before.get(k, 0.0))):
            used = (after[key] - before.get(key, 0.0)) * 1000.0 / n_cpu
            if used > 0:
                # Python does not name OS threads, so tell them apart by role: the main thread runs the
                # event loop; of the others, the device worker is the one that spends
                role = "main: event loop (HTTP, codecs)" if int(key.split()[0]) == pid else \
                    "other: device worker (ONNX Runtime, hand-off) or executor"
                print(f"  {key:<40} {used:.3f}  {role}")
        print(f"  (the direct call takes {d:.3f} ms back to back; ONNX Runtime runs slower between idle gaps)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
