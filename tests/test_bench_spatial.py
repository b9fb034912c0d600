"""benchmarks/bench_spatial.py (issue 15): bad arguments are one line and exit code 2; ``--quick --json`` runs
every measurement on the real CPU at tiny sizes and prints JSON alone on stdout. Timings are not asserted
(the host may be busy); what must hold whatever the host does is: no request failed or lost through a
share change in either mode, and 4 instances sharing one copy of the weights hold less memory than 4 with
their own. The full run's figures are in docs/results.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_spatial.py"


@pytest.mark.parametrize("args, message", [
    (("--rate", "0"), "--rate must be a number > 0"),
    (("--seconds", "-1"), "--seconds must be a number > 0"),
    (("--slo-x", "nan"), "--slo-x must be a number > 0"),
])
def test_bad_arguments_are_one_line_and_exit_2(args: tuple[str, ...], message: str) -> None:
    done = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert done.stdout == ""


@pytest.mark.slow
def test_quick_json_run() -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--quick", "--json"], capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)  # JSON and nothing else on stdout
    assert "REAL CPU" in done.stderr
    assert len(report["curves"]) >= 2
    assert {r["instances"] for r in report["throughput"]["rows"]} >= {1, 2, 4}
    for run in report["change"]:
        assert run["failed"] == 0 and run["lost"] == 0 and run["answered"] == run["sent"], run
    four = {m["shared"]: m["total_mb"] for m in report["memory"] if m["instances"] == 4 and m["optimization"]
            == "extended"}
    assert four[True] < four[False]
