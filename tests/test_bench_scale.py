"""``benchmarks/bench_scale.py`` as a user runs it: ``--json`` prints one JSON document on stdout and nothing
else, every size's row with its figures; bad options are one line, exit 2, before anything starts. Its
figures are not asserted (they depend on the host; docs/results.md has a full run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "bench_scale.py"
TIMEOUT_S = 300  # a bound, not an expectation: 10 nodes take a few seconds


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=False)


def test_json_is_the_whole_stdout_with_a_row_per_size() -> None:
    done = _run("--sizes", "10", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = json.loads(done.stdout)
    assert row["nodes"] == 10 and row["apps"] == 100 and row["ready"] == 100
    assert len(row["adapt_cycles_ms"]) == 3 and row["adapt_ms"] == sorted(row["adapt_cycles_ms"])[1]
    assert "| nodes |" in done.stderr   # the table went to stderr


@pytest.mark.parametrize(("args", "words"), [
    (["--sizes", "x"], "--sizes must be comma-separated node counts"),
    (["--sizes", "10,0"], "every node count must be at least 1"),
    (["--apps-per-device", "0"], "--apps-per-device must be a number > 0"),
])
def test_bad_options_are_one_line_exit_2(args: list[str], words: str) -> None:
    done = _run(*args)
    assert done.returncode == 2 and words in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert done.stdout == ""
