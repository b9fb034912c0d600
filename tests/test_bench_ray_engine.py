"""bench_ray_engine.py (issue 14) refuses bad arguments in one line with exit code 2, before any Ray cluster
starts. Its full run (local Ray clusters of 3, 6 and 9 nodes, a few minutes) is in docs/results.md; the
engine itself is tested in tests/test_engine_ray.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_ray_engine.py"


@pytest.mark.parametrize("args, message", [
    (("--sizes", "3,x"), "--sizes must be comma-separated integers"),
    (("--sizes", "0"), "--sizes >= 1"),
    (("--rate", "0"), "--rate > 0"),
    (("--requests", "5"), "--requests >= 20"),
    (("--dead-after-s", "-1"), "--dead-after-s > 0"),
])
def test_bad_arguments_are_one_line_and_exit_2(args: tuple[str, ...], message: str) -> None:
    done = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert done.stdout == ""
