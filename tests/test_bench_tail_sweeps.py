"""``benchmarks/tail_sweeps.py`` runs (quick) and prints its figures; a bad option exits 2 with argparse's usage, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "tail_sweeps.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_quick_sweeps_print_their_figures() -> None:
    out = _run("--quick", "--only", "md1ps")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("/ M/M/1 form") == 3
    out = _run("--quick", "--only", "tandem")
    assert out.returncode == 0, out.stderr
    assert "range" in out.stdout and "Traceback" not in out.stderr


def test_bad_option_is_one_line() -> None:
    out = _run("--only", "nope")
    assert out.returncode == 2 and "Traceback" not in out.stderr and "invalid choice" in out.stderr
