"""``ibis-hotspot-live``: the live rows are the simulator's rows of the same requests, and a short run on the
local cluster (real processes, emulated Edge TPUs) detects the surge and moves eff to the idle node without
failing a request. Timing is the host's: nothing here compares a latency with a threshold; the figures of
the full experiment are in docs/results.md with the command that printed them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgemux.adapt.settings import AdaptSettings
from edgemux.experiments.ibis_hotspot import EFF, MOB
from edgemux.experiments.ibis_hotspot_live import live_rows, run_live
from edgemux.experiments.registry import names


def test_registered() -> None:
    assert "ibis-hotspot-live" in names()


def test_live_rows_count_every_request_in_the_control_planes_windows() -> None:
    sends = np.array([0.5, 1.2, 2.9, 3.1, 4.0, 9.9])
    ok = np.array([True, True, False, True, True, True])
    lat = np.array([10.0, 200.0, np.nan, 30.0, 40.0, 50.0])
    refused = np.array([False, False, True, False, False, False])
    rows = live_rows(EFF, sends, ok, lat, refused, horizon_s=10.0, window_s=5.0,
                     contract=lambda t: 10.0 if t < 5 else 33.0, devices=lambda t: ("n1/tpu0",), phase_s=3.0)
    # bounds at 3 + 5k: [0, 3), [3, 8), [8, 10)
    assert [(r.start_s, r.end_s) for r in rows] == [(0.0, 3.0), (3.0, 8.0), (8.0, 10.0)]
    assert [r.arrivals for r in rows] == [3, 2, 1] and [r.refused for r in rows] == [1, 0, 0]
    assert [r.answered for r in rows] == [2, 2, 1]
    assert [r.within_slo for r in rows] == [1, 2, 1]  # 200 ms is over eff's 100 ms SLO
    assert rows[0].rate_rps == pytest.approx(1.0) and rows[1].contract_rps == 33.0
    assert rows[1].p95_ms == pytest.approx(np.percentile([30.0, 40.0], 95))
    assert sum(r.arrivals for r in rows) == sends.size  # every request in exactly one window
    # no phase: windows from the load's start
    assert [r.start_s for r in live_rows(MOB, sends, ok, lat, refused, 10.0, 5.0, lambda t: 10.0,
                                         lambda t: ())] == [0.0, 5.0]


@pytest.mark.slow
def test_a_short_live_run_moves_eff_to_the_idle_node_and_fails_nothing(tmp_path) -> None:
    """16 s of load, the surge at 4 s, 1 s windows (5 answered requests judge a window): the control plane
    finds the hotspot, moves eff (make before break, through the agents) to n2/tpu0 above its old
    contract, mob stays on n1/tpu0, and every request is answered or refused by policing: none fails."""
    settings = AdaptSettings(window_s=1.0, min_samples=5)
    live = run_live(seed=1, horizon_s=16.0, surge_at_s=4.0, settings=settings, workdir=tmp_path)
    assert live.initial == {"eff": ("n1/tpu0",), "mob": ("n1/tpu0",)}, live.described["before"]
    moves = [a for a in live.run.actions if a.app == "eff"]
    assert moves, live.events
    assert moves[0].to_devices == ("n2/tpu0",) and moves[0].rate_rps > EFF.rate_rps
    assert moves[0].time_s >= 4.0 and moves[0].serve_s >= moves[0].time_s
    assert not [a for a in live.run.actions if a.app == "mob"]
    assert live.failed == {"eff": 0, "mob": 0}, live.reports
    eff, mob = live.run.total("eff"), live.run.total("mob")
    assert eff.requests > mob.requests > 0 and mob.refused == 0
    assert all(math.isfinite(r.start_s) for r in live.run.windows)
    assert {r.devices for r in live.run.rows("eff") if r.end_s > moves[0].serve_s + 1.0} == {("n2/tpu0",)}
