"""benchmarks/bench_spatiotemporal.py (Dhakal Table III on the real CPU): bad arguments are one line and exit
code 2; ``--quick --json`` measures the laws, plans and executes the three schedules on the real CPU at tiny
sizes and prints JSON alone on stdout. Timings are not asserted (the host may be busy); what holds whatever
the host does: every planned batch is >= 1, every plan ends by the deadline under the measured laws, the
spatio-temporal slots running at once hold at most the whole device, and each run executed every round it
planned. The full run's figures are in docs/results.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_spatiotemporal.py"


@pytest.mark.parametrize("args, message", [
    (("--rounds", "0"), "--rounds must be an integer >= 1"),
    (("--round-ms", "nan"), "--round-ms must be a number > 0"),
    (("--deadline-ms", "40"), "--deadline-ms must be a number in (0, round-ms]"),
    (("--share", "1"), "--share must be a number in (0, 1)"),
    (("--plan-q", "20"), "--plan-q must be a number in [50, 100]"),
    (("--rounds", "x"), "invalid int value"),
    (("--bogus",), "unrecognized arguments"),
])
def test_bad_arguments_are_one_line_and_exit_2(args: tuple[str, ...], message: str) -> None:
    done = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert done.stdout == ""


def _law(report: dict[str, Any], model: str, share: float) -> tuple[float, float]:
    row = next(r for r in report["laws"] if r["name"] == model)
    s = next(x for x in row["shares"] if x["share"] == share)
    return s["k1_ms"], s["k2_ms"]


@pytest.mark.slow
def test_quick_json_run() -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--quick", "--json"], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)  # JSON and nothing else on stdout
    assert "REAL CPU" in done.stderr
    rounds = report["args"]["rounds"]
    deadline = report["args"]["deadline_ms"]
    assert len(report["laws"]) == 3
    for row in report["laws"]:
        assert [s["share"] for s in row["shares"]] == [report["args"]["share"], 1.0]
        for s in row["shares"]:
            assert s["k1_ms"] >= 0 and s["k2_ms"] >= 0 and s["k1_ms"] + s["k2_ms"] > 0
            assert s["fit_max_rel_err"] >= 0 and s["points"][0]["batch"] == 1
    assert set(report["plans"]) == set(report["runs"]) == {"temporal", "temporal-bl", "spatio-temporal"}
    for kind, plan in report["plans"].items():
        for slots in plan["slots"]:
            for s in slots:
                assert s["batch"] >= 1, (kind, s)
                assert s["end_ms"] <= deadline + 1e-6, (kind, s)  # the plan ends by the deadline ...
                k1, k2 = _law(report, s["model"], s["share"])
                # ... under the law measured at the slot's share
                assert abs((s["end_ms"] - s["start_ms"]) - (k1 * s["batch"] + k2)) < 1e-6, (kind, s)
            for a in slots:  # shares running at once hold at most the whole device
                at_once = sum(b["share"] for b in slots if b["start_ms"] <= a["start_ms"] < b["end_ms"])
                assert at_once <= 1.0 + 1e-6, (kind, slots)
    assert all(s["share"] == 1.0 for slots in report["plans"]["temporal"]["slots"] for s in slots)
    assert report["plans"]["spatio-temporal"]["slots"][0], "spatio-temporal planned nothing"
    for kind, run in report["runs"].items():
        assert run["rounds"] == rounds and run["rounds_executed"] == rounds, (kind, run)
        assert run["batches"] == run["batches_planned"] == sum(a["batches_run"] for a in run["apps"])
        assert 0 <= run["misses"] <= run["batches"]
        assert run["span_s"] >= rounds * report["args"]["round_ms"] / 1e3 - 1e-9
    st = report["runs"]["spatio-temporal"]
    assert st["batches"] == st["batches_planned"] == rounds * len(report["plans"]["spatio-temporal"]["slots"][0])
    assert report["ratios"]["paper_table3"] == pytest.approx(356 / 97)
    assert report["ratios"]["simulator"] == pytest.approx(366.7 / 100.0, rel=1e-3)
