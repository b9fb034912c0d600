"""What every peer server in this folder shares: its command line (``--model FILE.onnx --name APP --port N``)
and the one ONNX Runtime session it serves, the model file ``bench_peers.py`` exported from edgemux's zoo, on
the CPU provider with one intra-op and one inter-op thread, the options of edgemux's
``OnnxRuntimeBackend(threads=1)`` (``bench_peers.py``'s direct call uses it too). This file runs inside each
peer's own virtual environment, which has onnxruntime and numpy but not edgemux."""

from __future__ import annotations

import argparse
from typing import Any


def server_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The peer server's arguments: ``model`` (ONNX file), ``name`` (the app, served as the model name),
    ``port`` and ``grpc_port`` (None: no gRPC listener)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--grpc-port", type=int, default=None, help="also serve the protocol over gRPC here")
    return ap.parse_args(argv)


def open_session(path: str) -> tuple[Any, str, str]:
    """(session, input name, output name) for the single-input, single-output model at ``path``."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return session, session.get_inputs()[0].name, session.get_outputs()[0].name
