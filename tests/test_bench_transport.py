"""bench_transport.py: binary HTTP beside system shared memory through a gateway, in --quick mode: every row
measured over both transports, and bad arguments refused in one line. Nothing asserts a figure (the full
run's output is in docs/results.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_transport.py"), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.slow
def test_quick_run_measures_every_app_over_both_transports() -> None:
    done = _run("--quick")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith(("tpu", "det"))]
    assert [r[0] for r in rows] == ["tpu32", "tpu224", "det"], done.stdout
    assert [int(r[1]) for r in rows] == [32 * 32 * 3, 224 * 224 * 3, 4 * 3 * 416 * 416]
    for r in rows:
        float(r[2]), float(r[-1])  # a cost per transport and their difference, in ms
    assert "load generator's SHM_MIN_BYTES" in done.stdout


@pytest.mark.parametrize("args, message", [
    (("--sizes", "32,x"), "--sizes must be comma-separated integers"),
    (("--sizes", "16"), "sizes >= 32"),
    (("--seconds", "0"), "--seconds > 0"),
])
def test_bad_arguments_are_one_line_and_exit_2(args: tuple[str, ...], message: str) -> None:
    done = _run(*args)
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1
