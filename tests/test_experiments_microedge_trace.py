"""microedge-trace (MicroEdge Fig. 6): the replay's accounting on a hand-built trace, and the invariants of a
quick run that hold by construction (not which configuration wins, which online first fit does not fix)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgemux.experiments.microedge_cameras import six_tpus
from edgemux.experiments.microedge_trace import CONFIGS, at_fps, minute_ends, minute_means, replay, trace_events
from edgemux.experiments.registry import names
from edgemux.experiments.runner import ExperimentResult, run_experiment
from edgemux.sim.workloads import StreamEvent, camera

# slow: not in `make test-fast` (the module's expensive fixture is built once: make test distributes
# whole modules, --dist loadscope)
pytestmark = pytest.mark.slow

MINUTES_QUICK = 120


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[ExperimentResult, Path]:
    out = tmp_path_factory.mktemp("trace")
    return run_experiment("microedge-trace", out, seed=0, quick=True), out


def _rows(res: ExperimentResult, config: str) -> list[dict[str, Any]]:
    return [r for r in res.rows if r["config"] == config]


def test_registered() -> None:
    assert "microedge-trace" in names() and "microedge-cameras" in names()


def test_minute_means_by_hand() -> None:
    # 0 until 30 s, 2 from 30 s, 1 from 90 s: minute 0 = (30*0 + 30*2)/60 = 1; minute 1 = (30*2 + 30*1)/60
    assert minute_means([30.0, 90.0], [2, 1], 180.0).tolist() == [1.0, 1.5, 1.0]
    # events at a minute boundary belong to the minute they start
    assert minute_means([0.0, 60.0], [3, 5], 120.0).tolist() == [3.0, 5.0]
    assert minute_ends([0.0, 60.0], [3, 5], 120.0) == [3, 5]   # the state after every event before 60 (m+1)


def test_replay_by_hand() -> None:
    # one TPU, Coral-Pie cameras 0.35 units: a and b fit (0.7), c is rejected; c's removal is ignored
    a, b, c, d = (camera(n) for n in "abcd")
    ev = [StreamEvent(0.0, "add", a, "24x7"), StreamEvent(10.0, "add", b, "bursty"),
          StreamEvent(20.0, "add", c, "bursty"), StreamEvent(70.0, "remove", c, "bursty"),
          StreamEvent(80.0, "remove", a, "24x7"), StreamEvent(90.0, "add", d, "bursty")]
    rep = replay("microedge", {}, six_tpus(1), ev, 120.0)
    assert (rep.offered, rep.admitted, rep.rejected, rep.removed) == (4, 3, 1, 1)
    assert dict(rep.rejections) == {"tpu-units": 1}
    assert rep.served == [1, 2, 2, 2, 1, 2]
    assert rep.units == pytest.approx([0.35, 0.7, 0.7, 0.7, 0.35, 0.7])
    assert rep.served_by_kind[-1] == {"24x7": 0, "bursty": 2}
    assert [sorted(s.placements) for s in rep.minute_snapshots] == [["a", "b"], ["b", "d"]]


def test_at_fps_changes_only_the_named_classes() -> None:
    _, ev = trace_events(0, quick=True)
    slow = at_fps(ev, ("sparse",), 7.5)
    def key(e: StreamEvent) -> tuple[float, str, str, str]:
        return (e.time_s, e.action, e.app.name, e.kind)

    assert [key(e) for e in slow] == [key(e) for e in ev]
    assert {e.app.rate_rps for e in slow if e.kind == "sparse"} == {7.5}
    assert all(e1 is e0 for e1, e0 in zip(slow, ev) if e0.kind != "sparse")


def test_no_co_compiling_keeps_one_model_per_tpu() -> None:
    params, ev = trace_events(0, quick=True)
    for opts in ({"partitioning": False, "co_compiling": False}, {"partitioning": True, "co_compiling": False}):
        rep = replay("microedge", opts, six_tpus(), ev, params.horizon_s)
        for s in rep.minute_snapshots:
            assert all(len(ld.profiles) <= 1 for ld in s.device_loads.values())


def test_quick_run_writes_csv_and_png(quick: tuple[ExperimentResult, Path]) -> None:
    res, out = quick
    csv_path, png = out / "microedge-trace.csv", out / "microedge-trace.png"
    assert csv_path.stat().st_size > 0 and png.stat().st_size > 0
    with csv_path.open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(CONFIGS) * MINUTES_QUICK
    assert {r["config"] for r in rows} == {t for t, _, _ in CONFIGS}
    assert res.assumptions and any(r.metric.startswith("co-compiling alone") for r in res.summary)
    assert {r["config"] for r in res.extra["sensitivity"]} == {t for t, _, _ in CONFIGS}


def test_invariants_every_minute(quick: tuple[ExperimentResult, Path]) -> None:
    res, _ = quick
    offered_by_minute: dict[int, int] = {}
    for r in res.rows:
        assert r["max_tpu_units"] <= 1 + 1e-9                    # TPU Units Rule on every TPU
        assert 0.0 <= r["tpu_utilization"] <= 1 + 1e-9
        assert r["tpu_utilization"] <= r["trace_demand"] + 1e-6    # only offered cameras are placed
        assert r["cameras_served_mean"] <= r["trace_cameras_mean"] + 1e-6
        assert r["admitted_total"] <= r["offered_total"]
        assert r["rejected_total"] == r["offered_total"] - r["admitted_total"]
        # conservation: served = admitted - removed (of admitted apps), split over the stream classes
        assert r["cameras_served"] == r["admitted_total"] - r["removed_total"]
        assert r["cameras_served"] == r["served_24x7"] + r["served_sparse"] + r["served_bursty"]
        # every configuration sees the same trace
        assert offered_by_minute.setdefault(r["minute"], r["offered_total"]) == r["offered_total"]
    for tag, _, _ in CONFIGS:
        rows = _rows(res, tag)
        assert [r["minute"] for r in rows] == list(range(MINUTES_QUICK))
        assert np.all(np.diff([r["offered_total"] for r in rows]) >= 0)


def test_totals_and_latency_counts(quick: tuple[ExperimentResult, Path]) -> None:
    res, _ = quick
    _, ev = trace_events(0, quick=True)
    adds = sum(e.action == "add" for e in ev)
    for t in res.extra["totals"]:
        assert t["offered"] == adds
        assert t["admitted"] + t["rejected"] == t["offered"]
        assert sum(int(x.split(":")[1]) for x in t["rejections"].split()) == t["rejected"]
        assert t["removed"] <= t["admitted"]
        assert 0 < t["latency_samples"] <= 6 and t["latency_distinct"] <= t["latency_samples"]
        assert t["latency_over_budget_exec_alone"] <= t["latency_over_budget"] <= t["latency_pieces"]
    for s in res.extra["sensitivity"]:
        assert s["offered"] == adds and s["admitted"] + s["rejected"] == s["offered"]
