"""Power states and consolidation: node power and energy against hand-computed cases, bad power figures, and the
consolidation planner (drain a lightly loaded node make before break, switch off only empty nodes, wake ahead of
demand by the wake-up time, keep every SLO through the policy)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from edgemux.adapt.consolidate import (
    ConsolidationSettings,
    PowerView,
    consolidate_plan,
    holding,
    mean_utilization,
    observed_utilization,
    utilization_trend,
)
from edgemux.adapt.monitor import AppWindow
from edgemux.cluster.power import EnergyMeter, NodePower, PowerError, PowerState, node_power_w
from edgemux.cluster.state import App, Cluster, Device, Node, Placement, Share, Slo
from edgemux.cluster.workload import Discipline
from edgemux.experiments.ibis_capacity import TPU_MEMORY_MB
from edgemux.policies.base import Rejection, Snapshot
from edgemux.policies.registry import get
from edgemux.profiles.types import DeviceKind

NODES = 4
# the dynamic-trace cluster's nodes (experiments.dynamic_trace.tpus): one Edge TPU each, memory no limit
CLUSTER = Cluster(tuple(Node(f"n{i}", 4, 4096, (Device(f"n{i}", "tpu0", DeviceKind.EDGETPU, Discipline.FCFS,
                                                         TPU_MEMORY_MB, profile_set="ibis-edgetpu"),))
                        for i in range(NODES)))
POLICY = get("ibis")
SETTINGS = ConsolidationSettings(switch_off_below=0.3, wake_above=0.6)


def _admit(apps: list[App]) -> Snapshot:
    snap = Snapshot(CLUSTER)
    for a in apps:
        d = POLICY.decide(a, snap)
        assert not isinstance(d, Rejection), d
        snap = snap.with_placement(a, d)
    return snap


def _spread(apps: list[App]) -> Snapshot:
    """App i on node i (mod the nodes), as a spread-first placement would leave them."""
    snap = Snapshot(CLUSTER)
    for i, a in enumerate(apps):
        snap = snap.with_placement(a, Placement(a.name, (Share(f"n{i % NODES}/tpu0", 1.0,
                                                                f"ibis-edgetpu/{a.model}"),)))
    return snap


def _app(i: int, rate: float, model: str = "mobilenet_v2", slo_ms: float = 50.0) -> App:
    return App(f"a{i}", model, rate, Slo(slo_ms, "mean"))


# ------------------------------------------------------------------------------------------ power states


def test_node_power_by_hand() -> None:
    p = NodePower("n0", idle_w=5.0, dynamic_w={"n0/tpu0": 2.0}, wake_s=30.0, off_w=0.5)
    assert node_power_w(p, PowerState.OFF) == 0.5
    assert node_power_w(p, PowerState.WAKING) == 5.0
    assert node_power_w(p, PowerState.ON) == 5.0
    assert node_power_w(p, PowerState.ON, {"n0/tpu0": 0.25}) == pytest.approx(5.5)
    assert p.peak_w == 7.0
    with pytest.raises(PowerError, match=r"node 'n0' has no device 'n9/gpu0'"):
        node_power_w(p, PowerState.ON, {"n9/gpu0": 0.5})
    with pytest.raises(PowerError, match=r"utilization must be in \[0, 1\], got 1.5"):
        node_power_w(p, PowerState.ON, {"n0/tpu0": 1.5})


def test_energy_meter_by_hand() -> None:
    p = NodePower("n0", idle_w=5.0, dynamic_w={"n0/tpu0": 2.0}, wake_s=30.0)
    m = EnergyMeter(p)
    m.advance(100.0, PowerState.ON, {"n0/tpu0": 40.0})   # 5 W x 100 s + 2 W x 40 s busy
    m.advance(400.0, PowerState.OFF)                     # nothing
    m.advance(430.0, PowerState.WAKING)                  # 5 W x 30 s
    m.advance(530.0, PowerState.ON)                      # idle 100 s
    assert m.joules == pytest.approx(500 + 80 + 0 + 150 + 500)
    assert m.seconds == {"on": 200.0, "waking": 30.0, "off": 300.0}
    assert m.by_state["waking"] == pytest.approx(150.0)
    assert m.kwh == pytest.approx(1230 / 3.6e6)
    with pytest.raises(PowerError, match="time went back from 530.0 s to 500.0 s"):
        m.advance(500.0, PowerState.ON)
    with pytest.raises(PowerError, match="was off and cannot have been busy"):
        m.advance(600.0, PowerState.OFF, {"n0/tpu0": 1.0})
    with pytest.raises(PowerError, match=r"busy 20.0 s in an interval of 10.0 s"):
        EnergyMeter(p).advance(10.0, PowerState.ON, {"n0/tpu0": 20.0})


@pytest.mark.parametrize(("kw", "message"), [
    ({"idle_w": -1.0}, r"node 'n0'.idle_w: expected a finite power > 0 W, got -1.0"),
    ({"idle_w": 0.0}, r"idle_w: expected a finite power > 0 W, got 0.0"),
    ({"idle_w": None}, r"idle_w: expected a finite power > 0 W, got None"),
    ({"dynamic_w": {"n0/tpu0": -2.0}}, r"dynamic_w\['n0/tpu0'\]: expected a finite power >= 0 W, got -2.0"),
    ({"wake_s": -5.0}, r"node 'n0'.wake_s: expected a wake-up time >= 0 s, got -5.0"),
    ({"wake_s": math.nan}, r"wake_s: expected a wake-up time >= 0 s, got nan"),
    ({"off_w": 9.0}, r"off_w: switched off \(9.0 W\) cannot draw more than idle \(5.0 W\)"),
])
def test_bad_power_figures_are_refused(kw: dict[str, Any], message: str) -> None:
    base: dict[str, Any] = {"node": "n0", "idle_w": 5.0, "dynamic_w": {"n0/tpu0": 2.0}, "wake_s": 30.0}
    base.update(kw)
    with pytest.raises(PowerError, match=message):
        NodePower(**base)


# ------------------------------------------------------------------------------------------- the planner


def test_settings_need_hysteresis() -> None:
    with pytest.raises(ValueError, match="must be below wake_above"):
        ConsolidationSettings(switch_off_below=0.6, wake_above=0.5)
    with pytest.raises(ValueError, match=r"wake_above must be a utilization in \(0, 1\), got 1.5"):
        ConsolidationSettings(wake_above=1.5)
    with pytest.raises(ValueError, match="min_on must be an integer >= 1, got 0"):
        ConsolidationSettings(min_on=0)


def test_low_load_drains_the_lightest_node_onto_the_others() -> None:
    snap = _spread([_app(i, 5.0) for i in range(4)])  # one small app per node
    assert all(len(holding(snap, f"n{i}")) == 1 for i in range(NODES))
    plan = consolidate_plan(POLICY, snap, PowerView(wake_s={f"n{i}": 30.0 for i in range(NODES)}), SETTINGS)
    assert len(plan.draining) == 1 and not plan.switch_off and not plan.wake
    node = plan.draining[0]
    moved = holding(snap, node)
    assert [t.app for t in plan.transitions] == list(moved)
    after = snap
    for t in plan.transitions:
        after = t.applied(after)
        assert t.reason.kind == "consolidate" and node not in {s.device.split("/")[0] for s in t.placement.shares}
    assert holding(after, node) == ()
    # every tenant of the devices the apps went to still meets its SLO: the policy's own check re-run
    for name, placement in after.placements.items():
        assert not isinstance(POLICY.decide(after.apps[name], after.without(name)), Rejection)
    # the next step switches the emptied node off; the node still holding its tenant is never listed
    view = PowerView(draining=frozenset({node}), wake_s={f"n{i}": 30.0 for i in range(NODES)})
    assert consolidate_plan(POLICY, after, view, SETTINGS).switch_off == (node,)
    assert consolidate_plan(POLICY, snap, view, SETTINGS).switch_off == ()


def test_a_node_holding_a_tenant_is_never_switched_off() -> None:
    """Whatever the view says (every node draining), only nodes that hold nothing are switched off."""
    snap = _admit([_app(0, 5.0), _app(1, 5.0)])
    view = PowerView(draining=frozenset(f"n{i}" for i in range(NODES)))
    plan = consolidate_plan(POLICY, snap, view, SETTINGS)
    holders = {n for n in (f"n{i}" for i in range(NODES)) if holding(snap, n)}
    assert holders and not holders & set(plan.switch_off)
    assert set(plan.switch_off) == {f"n{i}" for i in range(NODES)} - holders


def test_high_load_drains_nothing() -> None:
    snap = _spread([_app(i, 80.0) for i in range(NODES)])  # 80 req/s x 4.91 ms: about 0.39 each
    assert mean_utilization(snap) >= SETTINGS.switch_off_below
    plan = consolidate_plan(POLICY, snap, PowerView(), SETTINGS)
    assert plan.empty


def test_a_drain_that_would_push_the_others_past_wake_above_is_not_planned() -> None:
    """Three nodes on, each just under switch_off_below: draining one would put its load on two, past
    wake_above with a tighter setting, so nothing is drained; with the default setting it is."""
    busy = _spread([_app(i, 4.3, "inception_v3", 500.0) for i in range(3)])  # 4.3/s x 62.95 ms: about 0.27 each
    view = PowerView(off=frozenset({"n3"}), wake_s={"n3": 30.0})
    on = frozenset({"n0", "n1", "n2"})
    u = mean_utilization(busy, on)
    assert 0.25 < u < SETTINGS.switch_off_below
    tight = ConsolidationSettings(switch_off_below=0.3, wake_above=0.35)
    assert consolidate_plan(POLICY, busy, view, tight).empty
    plan = consolidate_plan(POLICY, busy, view, SETTINGS)
    assert len(plan.draining) == 1 and len(plan.transitions) == 1


def test_min_on_nodes_stay_on() -> None:
    snap = _admit([_app(0, 1.0)])
    view = PowerView(off=frozenset({"n1", "n2", "n3"}), wake_s={f"n{i}": 30.0 for i in range(NODES)})
    plan = consolidate_plan(POLICY, snap, view, SETTINGS)
    assert not plan.draining and not plan.switch_off


def test_wake_ahead_of_demand_uses_the_wake_up_time() -> None:
    """At utilization u with the load rising, a node is woken when u + trend x wake_s passes wake_above: a
    longer wake-up time wakes it earlier."""
    snap = _admit([_app(i, 40.0) for i in range(2)])
    on = frozenset({"n0", "n1"})
    u = mean_utilization(snap, on)
    assert u < SETTINGS.wake_above
    trend = (SETTINGS.wake_above - u) / 100.0  # reaches wake_above in 100 s
    view = PowerView(off=frozenset({"n2", "n3"}), wake_s={"n2": 60.0, "n3": 120.0})
    # the longest wake-up among the off nodes (120 s) is more than 100 s away: wake, the readiest node first
    plan = consolidate_plan(POLICY, snap, view, SETTINGS, trend_per_s=trend)
    assert plan.wake == ("n2",) and not plan.transitions
    quick = PowerView(off=frozenset({"n2", "n3"}), wake_s={"n2": 30.0, "n3": 60.0})
    assert consolidate_plan(POLICY, snap, quick, SETTINGS, trend_per_s=trend).wake == ()
    # a falling load never wakes one
    assert consolidate_plan(POLICY, snap, view, SETTINGS, trend_per_s=-trend).wake == ()


def test_an_app_without_room_wakes_a_node_and_stops_draining() -> None:
    snap = _spread([_app(i, 5.0) for i in range(3)])  # n2 still holds a2
    view = PowerView(off=frozenset({"n3"}), draining=frozenset({"n2"}), wake_s={"n3": 30.0})
    plan = consolidate_plan(POLICY, snap, view, SETTINGS, starved=True)
    assert plan.wake == ("n3",) and plan.undrain == ("n2",) and any("no room" in r for r in plan.reasons)


def test_apps_in_flight_keep_their_node() -> None:
    snap = _spread([_app(i, 5.0) for i in range(4)])
    everyone = frozenset(snap.placements)
    plan = consolidate_plan(POLICY, snap, PowerView(), SETTINGS, exclude=everyone)
    assert not plan.transitions and not plan.draining


def test_an_unknown_node_in_the_view_is_refused() -> None:
    with pytest.raises(ValueError, match="power view names nodes the cluster does not have: n9"):
        consolidate_plan(POLICY, Snapshot(CLUSTER), PowerView(off=frozenset({"n9"})), SETTINGS)


def test_a_drain_that_can_no_longer_finish_stops() -> None:
    """A draining node that still holds a tenant whose move is not in flight (the move failed, or an arrival
    landed there) stops draining, so that the next drain is not blocked; while the move is in flight it
    keeps draining."""
    snap = _spread([_app(i, 5.0) for i in range(3)])  # n2 holds a2
    view = PowerView(draining=frozenset({"n2"}))
    plan = consolidate_plan(POLICY, snap, view, SETTINGS)
    assert plan.undrain == ("n2",) and not plan.switch_off and not plan.draining
    assert any("n2 still holds a2 with no move in flight" in r for r in plan.reasons)
    moving = consolidate_plan(POLICY, snap, view, SETTINGS, exclude=frozenset({"a2"}))
    assert moving.empty


def test_observed_utilization_is_the_contract_formula_at_the_sent_rates() -> None:
    """At the rates the windows show, the observed mean equals mean_utilization of a snapshot whose contracts
    are those rates; an app that sent nothing adds no load."""
    snap = _spread([_app(i, 20.0) for i in range(NODES)])
    sent = {"a0": 10.0, "a1": 40.0, "a2": 0.0}  # a3 has no window
    windows = {a: AppWindow(a, 100.0, 105.0, int(r * 5), 0, 0, None) for a, r in sent.items()}
    on = frozenset({"n0", "n1", "n2", "n3"})
    at_rates = _spread([_app(0, 10.0), _app(1, 40.0)])
    assert observed_utilization(snap, windows, on) == pytest.approx(mean_utilization(at_rates, on))
    assert observed_utilization(snap, windows, frozenset({"n1"})) == pytest.approx(
        mean_utilization(at_rates, frozenset({"n1"})))
    assert observed_utilization(snap, {}, on) == 0.0


def test_the_trend_is_the_slope_over_the_last_windows() -> None:
    assert utilization_trend([]) == 0.0 and utilization_trend([(0.0, 0.5)]) == 0.0
    # the last TREND_WINDOWS (3) windows: from (10, 0.2) to (25, 0.6), not from the first sample
    hist = [(0.0, 0.9), (5.0, 0.1), (10.0, 0.2), (15.0, 0.3), (20.0, 0.4), (25.0, 0.6)]
    assert utilization_trend(hist[:2]) == pytest.approx(-0.16)
    assert utilization_trend(hist) == pytest.approx((0.6 - 0.2) / 15.0)
