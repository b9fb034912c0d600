"""The Open Inference Protocol codec's own cost, per request body, beside the standard library's.

For each tensor (FP32, batch 1: 3x64x64, the zoo's squeezenet1_1@64 input, and 224x224x3, a 224-pixel
image), the request body as ``tritonclient.http`` would send it (JSON ``data``, and the binary extension)
and a 1000-logit response, this times in one run, interleaved:

* decode:   ``protocol.decode_infer_request`` (what the agent runs on every request) against the
            standard library's floor for the same JSON body, ``json.loads`` plus ``numpy.array`` of the
            data (no checks at all);
* encode:   ``protocol.encode_infer_response`` of the logits as JSON ``data`` against ``json.dumps`` of
            the header with ``tolist()`` data, and ``protocol.encode_infer_request`` of the input as JSON
            against the same standard-library form.

Each figure is the median of ``--rounds`` rounds of ``--repeat`` calls (ms per call); the ratio is the
standard library's time over the codec's. Single-threaded, in this process.

    .venv/bin/python benchmarks/bench_codec.py [--rounds N] [--repeat N]

Units: ms.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from edgemux.runtime.dataplane.protocol import decode_infer_request, encode_infer_request, encode_infer_response

SHAPES = {"3x64x64": (1, 3, 64, 64), "224x224x3": (1, 224, 224, 3)}


def _stdlib_request(x: np.ndarray) -> bytes:
    """The JSON body as tritonclient builds it (json.dumps of tolist() data)."""
    doc = {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    return json.dumps(doc).encode()


def _stdlib_decode(body: bytes) -> np.ndarray:
    doc = json.loads(body)
    t = doc["inputs"][0]
    return np.array(t["data"], dtype=np.float32).reshape(t["shape"])


def _stdlib_response(out: np.ndarray) -> bytes:
    doc = {"model_name": "m", "model_version": "1",
           "outputs": [{"name": "logits", "datatype": "FP32", "shape": list(out.shape), "data": out.ravel().tolist()}]}
    return json.dumps(doc, separators=(",", ":")).encode()


def _median_ms(fns: dict[str, Callable[[], Any]], rounds: int, repeat: int) -> dict[str, float]:
    """Interleaved rounds: every function runs ``repeat`` times per round, in turn; median ms per call."""
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for f in fns.values():
        f()  # warm-up
    for _ in range(rounds):
        for k, f in fns.items():
            t0 = time.perf_counter()
            for _ in range(repeat):
                f()
            samples[k].append((time.perf_counter() - t0) / repeat * 1000.0)
    return {k: statistics.median(v) for k, v in samples.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15, help="interleaved rounds (default 15)")
    ap.add_argument("--repeat", type=int, default=5, help="calls per function per round (default 5)")
    args = ap.parse_args()
    if args.rounds < 1 or args.repeat < 1:
        ap.error("--rounds and --repeat must be >= 1")
    print(f"host: {platform.machine()}, Python {platform.python_version()}, numpy {np.__version__}")
    logits = np.random.default_rng(1).standard_normal((1, 1000)).astype(np.float32)
    print(f"{'tensor':<11} {'path':<44} {'edgemux ms':>10} {'stdlib ms':>10} {'ratio':>7}")
    for label, shape in SHAPES.items():
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        body = _stdlib_request(x)  # what tritonclient sends: the codec must read the stdlib's text
        binary, headers = encode_infer_request({"input": x}, binary=True)
        hlen = headers["Inference-Header-Content-Length"]
        np.testing.assert_array_equal(decode_infer_request(body).input("input"), _stdlib_decode(body))
        m = _median_ms({
            "decode json": lambda: decode_infer_request(body),
            "stdlib decode json": lambda: _stdlib_decode(body),
            "decode binary": lambda: decode_infer_request(binary, hlen),
            "encode request json": lambda: encode_infer_request({"input": x}, binary=False),
            "stdlib encode request json": lambda: _stdlib_request(x),
            "encode response json": lambda: encode_infer_response("m", "1", {"logits": logits}),
            "stdlib encode response json": lambda: _stdlib_response(logits),
        }, args.rounds, args.repeat)
        rows = [
            (f"decode request, JSON ({len(body) / 1e3:.0f} kB)", m["decode json"], m["stdlib decode json"]),
            (f"decode request, binary ({len(binary) / 1e3:.0f} kB)", m["decode binary"], None),
            ("encode request, JSON", m["encode request json"], m["stdlib encode request json"]),
            ("encode response, JSON (1000 logits)", m["encode response json"], m["stdlib encode response json"]),
        ]
        for path, ours, std in rows:
            ratio = f"{std / ours:>6.1f}x" if std is not None else f"{'-':>7}"
            std_s = f"{std:>10.3f}" if std is not None else f"{'-':>10}"
            print(f"{label:<11} {path:<44} {ours:>10.3f} {std_s} {ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
