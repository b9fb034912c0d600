"""bench_peers.py (issue 17): the side-by-side benchmark runs edgemux's agent and gateway in --quick mode,
reports a peer it cannot start with the reason instead of skipping it, and refuses bad arguments.

The peers themselves (KServe, Ray Serve, MLServer, PyTriton: about 2 GB from PyPI) are not installed here;
the script's full run, whose output is in docs/results.md, measures them. Nothing asserts a figure.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "benchmarks"


def _run(*args: str, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCH / "bench_peers.py"), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout_s, check=False)


@pytest.mark.slow
def test_quick_run_measures_edgemux_and_reports_a_peer_that_is_not_installed(tmp_path: Path) -> None:
    done = _run("--quick", "--peers", "kserve", "--no-install", "--peers-dir", str(tmp_path),
                "--requests", "20", "--concurrency", "1", "--seconds", "0.3")
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    for row in ("edgemux agent                        json", "edgemux agent                        binary",
                "edgemux gateway -> agent             json", "edgemux gateway -> agent             binary"):
        assert row in out, out
    # the floors (peers/floor_server.py, and peers/floor_relay.py in front of the agent) are measured beside
    # edgemux in both forms, the relay's throughput not
    for row in ("  floor                                json", "  floor                                binary",
                "  floor relay -> agent                 json", "  floor relay -> agent                 binary"):
        assert row in out, out
    assert out.count("the relay floor's added overhead") == 2, out
    assert not any(line.startswith("floor relay") for line in out.splitlines()), out
    # the peer is reported with the reason, not skipped
    assert "KServe ModelServer" in out and "could not start: not installed in" in out, out
    assert "gateway's added overhead, json" in out and "gateway's added overhead, binary" in out
    assert out.count("of the agent's own p50 overhead") == 2 and "0.5 target" in out, out
    # gRPC and shared memory, on edgemux's agent and gateway and (gRPC) the gRPC floor
    for row in ("edgemux agent                        grpc", "edgemux agent                        shm",
                "edgemux gateway -> agent             grpc", "edgemux gateway -> agent             shm",
                "  floor                                grpc"):
        assert row in out, out
    assert out.count("edgemux agent's own cost over the floor") == 3, out
    assert out.count("shared memory beside binary") == 2 and "gateway's added overhead over gRPC" in out, out
    assert "no peer answered this form" in out
    throughput = [line for line in out.splitlines() if line.startswith("edgemux agent") and "(" in line]
    assert len(throughput) == 2, out
    assert all(line.split()[-1] == "0" for line in throughput), out  # no failed request at k=1


@pytest.mark.parametrize("args, message", [
    (("--peers", "torchserve"), "unknown peer 'torchserve'"),
    (("--concurrency", "1,x"), "--concurrency must be comma-separated integers"),
    (("--concurrency", "0"), "--concurrency levels must be >= 1"),
    (("--requests", "5"), "--requests must be at least 20"),
    (("--seconds", "0"), "--seconds must be > 0"),
])
def test_bad_arguments_are_one_line_and_exit_2(args: tuple[str, ...], message: str) -> None:
    done = _run(*args, timeout_s=60)
    assert done.returncode == 2
    assert message in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert done.stdout == ""


def test_an_answer_is_checked_against_onnxruntime() -> None:
    sys.path.insert(0, str(BENCH))
    try:
        from bench_peers import check_answer
    finally:
        sys.path.remove(str(BENCH))
    expected = np.arange(10, dtype=np.float32).reshape(1, 10)

    def answer(values: np.ndarray, binary: bool) -> tuple[bytes, str | None]:
        # by hand, as a peer would write them: JSON data, or Triton's binary extension
        entry: dict[str, object] = {"name": "logits", "shape": [1, 10], "datatype": "FP32"}
        if not binary:
            entry["data"] = values.ravel().tolist()
            return json.dumps({"model_name": "sq", "outputs": [entry]}).encode(), None
        raw = values.astype("<f4").tobytes()
        entry["parameters"] = {"binary_data_size": len(raw)}
        head = json.dumps({"model_name": "sq", "outputs": [entry]}).encode()
        return head + raw, str(len(head))

    for binary in (False, True):
        body, hlen = answer(expected, binary)
        assert check_answer(200, body, hlen, "logits", expected) is None
        body, hlen = answer(expected + 1, binary)
        assert check_answer(200, body, hlen, "logits", expected) == "wrong values in the answer"
    assert check_answer(200, b'{"outputs": []}', None, "logits", expected) == "no output 'logits' in the answer"
    assert check_answer(500, b"Internal Server Error", None, "logits", expected).startswith("HTTP 500")
    assert check_answer(200, b"not json", None, "logits", expected).startswith("unreadable answer")
