"""benchmarks/bench_fpga_gpu_fit.py: a tiny run prints JSON alone with --json (a fit of Eq. 1 on the real CPU),
and bad options are one line with exit code 2, never a traceback. Nothing is asserted about speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_fpga_gpu_fit.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


def test_json_alone_on_stdout() -> None:
    done = _run("--size", "32", "--repeats", "2", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert len(report["rows"]) == 8 and {(r["workers"], r["batch"]) for r in report["rows"]} == {
        (w, b) for w in (1, 2) for b in (1, 2, 4, 8)}
    # a fit, or (on a host busy enough to bend the measurements off the law) the reason there is none
    if report["fit"] is None:
        assert report["problem"]
    else:
        assert set(report["fit"]["q"]) == {"1", "2"} and report["fit"]["q"]["1"] == 1.0


@pytest.mark.parametrize(("args", "words"), [
    (["--size", "7"], "--size: input_size: 7x7 is too small for squeezenet1_1"),
    (["--workers", "0,1"], "--workers must be integers >= 1, got '0,1'"),
    (["--workers", "2"], "--workers must include 1"),
    (["--workers", "1,x"], "--workers must be comma-separated integers"),
    (["--repeats", "1"], "--repeats must be >= 2, got 1"),
    (["--model", "vgg99"], "unknown zoo model 'vgg99'"),
])
def test_bad_options(args: list[str], words: str) -> None:
    done = _run(*args)
    assert done.returncode == 2 and words in done.stderr and "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0
