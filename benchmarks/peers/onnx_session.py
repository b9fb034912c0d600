"""The one ONNX Runtime session every peer server in this folder serves: the model file ``bench_peers.py``
exported from edgemux's zoo, on the CPU provider with one intra-op and one inter-op thread, the options of
edgemux's ``OnnxRuntimeBackend(threads=1)``. This file runs inside each peer's own virtual environment,
which has onnxruntime and numpy but not edgemux."""

from __future__ import annotations

from typing import Any


def open_session(path: str) -> tuple[Any, str, str]:
    """(session, input name, output name) for the single-input, single-output model at ``path``."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return session, session.get_inputs()[0].name, session.get_outputs()[0].name
