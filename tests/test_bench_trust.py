"""Smoke tests of the trust benchmarks (issue "Trust"): each runs short, as a subprocess as a user would run
it, and its report is checked for what does not depend on the host: the chaos run loses no request and no app
(its own checks, which a lost request fails), and the isolation run's abuser is refused by policing while its
counts add up. The co-tenants' attainment is a host-dependent figure, judged by the full run (docs/results.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "benchmarks"
TIMEOUT_S = 600  # a bound, not an expectation: each run takes under a minute on an idle host


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCH / script), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=False)


@pytest.mark.slow
def test_chaos_loses_nothing() -> None:
    done = _run("chaos.py", "--chaos-s", "10", "--every-s", "2", "--tail-s", "3", "--apps", "2", "--nodes", "2",
                "--seed", "1", "--json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    r = json.loads(done.stdout)
    assert r["holds"] and all(r["checks"].values())
    # a kill takes its restart's time too (seconds on a busy host): at least one lands in the 10 s
    assert len(r["kills"]) >= 1 and all(k["exit"] == -9 for k in r["kills"])
    q = r["requests"]
    assert q["lost"] == 0 and q["sent"] == q["answered"] + sum(q["failed_explicitly"].values())
    assert q["answered"] > 0 and r["store_apps"] == ["app0", "app1"] and r["store_problems"] == []


@pytest.mark.slow
def test_isolation_polices_the_abuser_at_the_agent() -> None:
    done = _run("bench_isolation.py", "--scenario", "agent", "--phase-s", "6", "--json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    r = json.loads(done.stdout)
    (s,) = r["scenarios"]
    assert s["path"] == "agent" and set(s["devices"]) == {"tpu", "cpu"}
    assert r["devices"]["cpu/cpu0"].startswith("REAL") and r["devices"]["tpu/tpu0"] == "emulated"
    for d in s["devices"].values():
        abuse = d["phases"]["abuse"]
        # the extra 2x went straight to the agent, whose bucket refused what exceeded the contract's burst
        assert abuse["abuser_extra"]["refused_429"] > 0, abuse
        for phase in d["phases"].values():
            c = phase["cotenant"]
            assert c["sent"] == c["answered"] + c["refused_429"] + c["failed"] and c["sent"] > 0
            assert 0.0 <= c["attainment"] <= 1.0


@pytest.mark.parametrize(("script", "args", "words"), [
    ("chaos.py", ["--every-s", "10", "--chaos-s", "5"], "must not exceed --chaos-s"),
    ("chaos.py", ["--chaos-s", "0"], "--chaos-s must be in"),
    ("chaos.py", ["--apps", "0"], "--apps must be in 1..32"),
    ("bench_isolation.py", ["--phase-s", "2"], "--phase-s must be in [6, 600] s"),
])
def test_bad_options_are_one_line(script: str, args: list[str], words: str) -> None:
    done = _run(script, *args)
    assert done.returncode == 2 and words in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
