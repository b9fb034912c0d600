"""Smoke tests of the issue-4 benchmark scripts: each runs in --quick mode with tiny counts as a subprocess
(as a user would run it), exits 0 and prints its table headers and its ratio lines.

Nothing here asserts a figure: the numbers depend on the host (and on what else runs on it); the targets
are judged by the scripts' full runs, whose output says whether each is met.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "benchmarks"
TIMEOUT_S = 300  # a bound, not an expectation: each script takes seconds in --quick mode (120 s was hit once
# with both cores busy and another suite running beside this one)


def _run(script: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(BENCH / script), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=False)
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.slow
def test_predicted_vs_observed_quick_prints_table_and_ratio() -> None:
    out = _run("bench_predicted_vs_observed.py", "--quick", "--requests", "60", "--seed", "3")
    assert "REAL onnxruntime" in out and "nothing emulated" in out
    for column in ("rho", "app", "pred b2b", "pred load", "observed ms ± CI95", "err load", "within 15%?"):
        assert column in out
    for rho in ("0.3", "0.5", "0.7"):
        assert any(line.startswith(f" {rho} app1") for line in out.splitlines()), out
    assert "ratio worst |error| / target, as-served profile" in out
    assert "sender lateness" in out


@pytest.mark.slow
def test_serving_quick_prints_overheads_throughput_and_ratio() -> None:
    out = _run("bench_serving.py", "--quick", "--requests", "40")
    for row in ("(a) direct OnnxRuntimeBackend.run", "(b) client -> agent (HTTP)", "(c) client -> gateway -> agent"):
        assert row in out
    for column in ("p50 ms", "p99 ms"):
        assert column in out
    assert "agent   (b - a)" in out and "gateway (c - a)" in out
    assert "ratio agent overhead / target" in out and "ratio gateway overhead / target" in out
    assert "k=  1:" in out and "highest sustained throughput" in out
    assert "EMULATED" in out and "IN-PROCESS" in out


@pytest.mark.slow
def test_agent_breakdown_runs_every_path_and_prints_the_splits() -> None:
    out = _run("bench_agent_breakdown.py", "--rounds", "1", "--block", "3")
    for path in ("direct onnxruntime", "direct, 3 ms idle before each", "model floor: core + model inline",
                 "model floor: core + worker thread", "floor: bare core, one write", "floor: bare core, 2 MB / 0.75 MB",
                 "agent uvloop, raw, two writes", "agent uvloop, edgemux Client", "agent asyncio, raw, one write"):
        assert path in out, out
    assert "the edgemux Client's own work" in out
    assert "the model after 3 ms idle" in out and "the agent adds" in out
    assert "asyncio vs uvloop agent" in out


@pytest.mark.slow
def test_move_under_load_loses_no_request() -> None:
    """bench_move --quick: the app moves between two devices of a node and between two nodes while the
    gateway carries its load; the script exits 1 if a single request failed."""
    out = _run("bench_move.py", "--quick")
    assert "failed requests: 0 of" in out, out
    for window in ("before", "move 1 (same node)", "between", "move 2 (other node)", "after"):
        assert window in out
    assert "longest gap between two answers" in out


def test_codec_bench_prints_every_path_with_its_ratio() -> None:
    out = _run("bench_codec.py", "--rounds", "1", "--repeat", "1")
    for shape in ("3x64x64", "224x224x3"):
        rows = [line for line in out.splitlines() if line.startswith(shape)]
        assert len(rows) == 4, out
        assert all(line.split()[-1] == "-" or line.split()[-1].endswith("x") for line in rows), out
    done = subprocess.run([sys.executable, str(BENCH / "bench_codec.py"), "--rounds", "0"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--rounds and --repeat must be >= 1" in done.stderr
