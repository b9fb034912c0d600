"""One adaptation cycle (``adapt.cycle``), on small hand-built snapshots and windows: the order of its actions
(power tick, calibration, findings, refusals, moves, then consolidation in the planner's order), "once when it
starts to count" for findings and "once while it lasts" for refusals, the power tick, calibration, apps with a
move in flight, a dead node's evacuation and its absence from consolidation, and the arrival path."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgemux.adapt.calibrate import Observed
from edgemux.adapt.consolidate import ConsolidationSettings, PowerView
from edgemux.adapt.cycle import (ACTION_KINDS, CycleAction, CycleState, Drain, Found, Move, Recalibrated, Refused,
                                 SwitchOff, Undrain, Unexplained, Wake, Woke, cycle, power_tick, wake_for_arrival)
from edgemux.adapt.monitor import AppWindow, ServiceMoments
from edgemux.adapt.settings import AdaptSettings
from edgemux.cluster.state import App, Cluster, Device, Node, Placement, Share, Slo
from edgemux.cluster.workload import Discipline
from edgemux.policies import Snapshot, get
from edgemux.profiles.types import DeviceKind

POLICY = get("ibis")
SET = AdaptSettings(min_samples=20, trigger_windows=2, min_dwell_s=60.0)
CONS = ConsolidationSettings(switch_off_below=0.3, wake_above=0.6)


def tpu(node: str) -> Device:
    # 12 MB so that both models fit at once (6.56 + 3.75 MB), as in tests/test_adapt.py
    return Device(node, "tpu0", DeviceKind.EDGETPU, Discipline.FCFS, 12.0, profile_set="ibis-edgetpu")


def cluster(n: int) -> Cluster:
    return Cluster(tuple(Node(f"n{i}", 4, 4096, (tpu(f"n{i}"),)) for i in range(1, n + 1)))


EFF = App("eff", "efficientnet-S", 10.0, Slo(100.0, "p95"))
MOB = App("mob", "mobilenet_v2", 10.0, Slo(50.0, "p95"))


def on(app: App, node: str) -> Placement:
    model = {"eff": "efficientnet-S", "mob": "mobilenet_v2"}.get(app.name, app.model)
    return Placement(app.name, (Share(f"{node}/tpu0", 1.0, f"ibis-edgetpu/{model}"),), node)


def colocated(n: int = 2) -> Snapshot:
    """EfficientNet-S and MobileNetV2 on n1/tpu0 (Ibis Fig. 20), the other nodes empty."""
    return Snapshot(cluster(n), {"eff": EFF, "mob": MOB}, {"eff": on(EFF, "n1"), "mob": on(MOB, "n1")})


def window(app: str, rate_rps: float, latency_ms: float, t0: float, dur: float = 5.0) -> AppWindow:
    return AppWindow.of(app, t0, t0 + dur, np.full(int(round(rate_rps * dur)), latency_ms))


def surge(t0: float) -> dict[str, AppWindow]:
    """eff sends 3x its contract; mob's p95 is over its SLO."""
    return {"eff": window("eff", 30.0, 40.0, t0), "mob": window("mob", 10.0, 65.0, t0)}


def kinds(actions: tuple[CycleAction, ...]) -> list[str]:
    return [a.kind for a in actions]


def run(windows: list[dict[str, AppWindow]], snap: Snapshot, **kw: object) -> list[tuple[CycleAction, ...]]:
    """One cycle per window (each ending 5 s after it starts), the state carried; the actions of each."""
    state, out = CycleState(), []
    for w in windows:
        now = next(iter(w.values())).end_s if w else 0.0
        res = cycle(state, POLICY, snap, w, SET, now, **kw)  # type: ignore[arg-type]
        state = res.state
        out.append(res.actions)
    return out


# ------------------------------------------------------------------------------------------------- order


def test_the_power_tick_comes_first_and_the_step_plans_with_the_woken_node() -> None:
    """n2 is waking, ready during the second window: the cycle says so first, then moves eff there (the Ibis
    rule on the second surge window). Ready exactly at the window's end it serves only after the window's
    decisions (the window is [start, end)): the same surge finds no room on n1 alone, and power_tick, which a
    driver calls after the window's actions, then sets n2 on."""
    snap = colocated()
    ready = PowerView(waking=frozenset({"n2"}), wake_s={"n2": 60.0}, ready_s={"n2": 9.5})
    first, second = run([surge(0.0), surge(5.0)], snap, power=ready)
    assert not any(isinstance(a, Woke) for a in first)  # 5 s: not ready yet
    assert isinstance(second[0], Woke) and second[0].node == "n2"
    moves = [a for a in second if isinstance(a, Move)]
    assert [(m.app, m.what, m.transition.placement.shares[0].device) for m in moves] == [("eff", "moved", "n2/tpu0")]
    # the order: the tick, every finding, then the moves
    assert kinds(second) == ["woke"] + ["finding"] * (len(second) - 2) + ["move"]
    at_end = PowerView(waking=frozenset({"n2"}), wake_s={"n2": 60.0}, ready_s={"n2": 10.0})
    _, still = run([surge(0.0), surge(5.0)], snap, power=at_end)
    assert not any(isinstance(a, (Woke, Move)) for a in still)
    assert [a.refusal.app for a in still if isinstance(a, Refused)] == ["eff"]
    assert power_tick(at_end, 10.0) == (Woke("n2"),)


def test_consolidation_comes_after_the_step_in_the_planners_order() -> None:
    """A draining node that holds nothing is switched off, a draining one that still holds an app stops
    draining, and (an app found no room since the last cycle) an off node wakes: SwitchOff, Undrain, Wake, in
    that order, after the step's own actions."""
    snap = Snapshot(cluster(4), {"eff": EFF, "mob": MOB}, {"eff": on(EFF, "n1"), "mob": on(MOB, "n1")})
    snap = snap.with_placement(App("a", "mobilenet_v2", 5.0, Slo(50.0, "mean")),
                               Placement("a", (Share("n3/tpu0", 1.0, "ibis-edgetpu/mobilenet_v2"),), "n3"))
    power = PowerView(off=frozenset({"n4"}), draining=frozenset({"n2", "n3"}), wake_s={"n4": 30.0})
    res = cycle(CycleState(starved=True), POLICY, snap, {}, SET, 5.0, power=power, consolidation=CONS)
    cons = [a for a in res.actions if isinstance(a, (SwitchOff, Undrain, Wake, Drain))]
    assert [(a.kind, a.node) for a in cons] == [("switch-off", "n2"), ("undrain", "n3"), ("wake", "n4")]
    assert isinstance(cons[2], Wake) and cons[2].wake_s == 30.0 and "no room" in cons[2].reason
    assert res.actions[-3:] == tuple(cons) and any(isinstance(a, Found) for a in res.actions)
    assert not res.state.starved


def test_a_refused_move_wakes_a_node_in_the_same_cycle() -> None:
    """n2 is off: eff's surge finds no room on n1 alone; the refusal starves the cycle, whose consolidation
    wakes n2 right after it."""
    snap = colocated()
    power = PowerView(off=frozenset({"n2"}), wake_s={"n2": 30.0})
    _, second = run([surge(0.0), surge(5.0)], snap, power=power, consolidation=CONS)
    assert kinds(second)[-2:] == ["refused", "wake"]


def test_a_drain_moves_its_apps_then_says_so() -> None:
    """At low load on four nodes with one small app each, the cycle drains one: its apps' moves (reason
    consolidate) come before the Drain that names them."""
    apps = [App(f"a{i}", "mobilenet_v2", 5.0, Slo(50.0, "mean")) for i in range(1, 5)]
    snap = Snapshot(cluster(4))
    for i, a in enumerate(apps, start=1):
        snap = snap.with_placement(a, Placement(a.name, (Share(f"n{i}/tpu0", 1.0, "ibis-edgetpu/mobilenet_v2"),)))
    windows = {a.name: window(a.name, 5.0, 10.0, 0.0) for a in apps}
    res = cycle(CycleState(), POLICY, snap, windows, SET, 5.0, power=PowerView(), consolidation=CONS)
    moves = [a for a in res.actions if isinstance(a, Move)]
    drains = [a for a in res.actions if isinstance(a, Drain)]
    assert len(drains) == 1 and res.actions[-1] is drains[0]
    assert drains[0].apps == tuple(m.app for m in moves) and moves
    assert all(m.transition.reason.kind == "consolidate" and m.what == "moved" for m in moves)
    assert len(res.state.utilization) == 1 and res.state.utilization[0][0] == 5.0


# ------------------------------------------------------------------------------- once while it lasts


def test_a_finding_is_first_once_and_a_refusal_once_while_it_lasts() -> None:
    """On one node eff's surge cannot move: the findings count from the second window (first there only) and
    the refusal is new on the second window, not on the third; a calm window ends both, and the next surge's
    refusal is new again."""
    snap = colocated(1)
    calm = {"eff": window("eff", 10.0, 20.0, 15.0), "mob": window("mob", 10.0, 15.0, 15.0)}
    w1, w2, w3, w4, w5, w6 = run([surge(0.0), surge(5.0), surge(10.0), calm, surge(20.0), surge(25.0)], snap)
    found = {i: [(a.finding.kind, a.finding.app, a.acted, a.first) for a in w if isinstance(a, Found)]
             for i, w in enumerate((w1, w2, w3, w4, w5, w6), start=1)}
    assert found[1] and all(not acted for _, _, acted, _ in found[1])
    assert ("over-contract", "eff", True, True) in found[2]
    assert ("over-contract", "eff", True, False) in found[3] and not any(first for *_, first in found[3])
    refused = {i: [(a.refusal.app, a.first) for a in w if isinstance(a, Refused)]
               for i, w in enumerate((w1, w2, w3, w4, w5, w6), start=1)}
    assert refused == {1: [], 2: [("eff", True)], 3: [("eff", False)], 4: [], 5: [], 6: [("eff", True)]}
    assert found[6] and ("over-contract", "eff", True, True) in found[6]


def test_an_unexplained_hotspot_is_reported_when_it_starts_to_count() -> None:
    """mob misses its SLO at the contracted rates (no over-contract tenant): unexplained on the second window
    (the first that counts), not again on the third, though it is found on every one."""
    snap = colocated()
    slow = [{"eff": window("eff", 10.0, 40.0, t), "mob": window("mob", 10.0, 65.0, t)} for t in (0.0, 5.0, 10.0)]
    w1, w2, w3 = run(slow, snap)
    assert [a.finding.kind for a in w2 if isinstance(a, Unexplained)] == ["slo-violated"]
    assert not [a for a in w1 + w3 if isinstance(a, Unexplained)]
    assert any(isinstance(a, Found) and a.finding.kind == "slo-violated" and a.acted for a in w3)


# ----------------------------------------------------------------------------------------- power tick


def test_power_tick_sets_on_the_nodes_whose_time_has_come() -> None:
    view = PowerView(waking=frozenset({"n3", "n1", "n2"}), ready_s={"n1": 10.0, "n3": 9.0, "n2": 10.5})
    assert power_tick(view, 10.0) == (Woke("n1"), Woke("n3"))  # name order; n2 later
    assert power_tick(view, 8.0) == ()
    assert power_tick(PowerView(waking=frozenset({"n1"})), 1e9) == ()  # no ready time: it stays waking
    # in a cycle the woken node is on for the rest of it: consolidation counts it (min_on = 1: a drain)
    snap = Snapshot(cluster(2))
    res = cycle(CycleState(), POLICY, snap, {}, SET, 10.0, consolidation=CONS,
                power=PowerView(waking=frozenset({"n2"}), ready_s={"n2": 9.0}, wake_s={"n2": 30.0}))
    assert kinds(res.actions)[0] == "woke" and any(isinstance(a, SwitchOff) for a in res.actions)


def test_the_arrival_path_wakes_the_readiest_node_once() -> None:
    snap = Snapshot(cluster(3), {"mob": MOB}, {"mob": on(MOB, "n1")})
    view = PowerView(off=frozenset({"n2", "n3"}), draining=frozenset(), wake_s={"n2": 60.0, "n3": 20.0})
    state, actions = wake_for_arrival(CycleState(), POLICY, snap, view, CONS)
    assert state.starved and [(a.kind, a.node) for a in actions] == [("wake", "n3")]  # type: ignore[union-attr]
    # a node already waking: starved, nothing more woken
    waking = PowerView(off=frozenset({"n2"}), waking=frozenset({"n3"}), wake_s=view.wake_s)
    state, actions = wake_for_arrival(CycleState(), POLICY, snap, waking, CONS)
    assert state.starved and actions == ()
    # every node on: the rejection stands, nothing changes
    state, actions = wake_for_arrival(CycleState(), POLICY, snap, PowerView(), CONS)
    assert state == CycleState() and actions == ()
    # a draining node (that still holds an app) stops draining when one is woken
    draining = PowerView(off=frozenset({"n3"}), draining=frozenset({"n2"}), wake_s={"n3": 20.0})
    held = Snapshot(cluster(3), {"mob": MOB}, {"mob": on(MOB, "n2")})
    _, actions = wake_for_arrival(CycleState(), POLICY, held, draining, CONS)
    assert [type(a) for a in actions] == [Undrain, Wake]
    # the next cycle's consolidation wakes for a starved state even with no load
    starved = CycleState(starved=True)
    res = cycle(starved, POLICY, snap, {}, SET, 5.0, consolidation=CONS,
                power=PowerView(off=frozenset({"n2", "n3"}), wake_s=view.wake_s))
    assert [a.node for a in res.actions if isinstance(a, Wake)] == ["n3"] and not res.state.starved


# ---------------------------------------------------------------------------------------- calibration


def test_calibration_comes_before_the_step_and_is_first_once() -> None:
    """Observed executions of MobileNetV2 five times slower than the catalog's: the catalog is replaced
    before the findings (the at-risk detector then predicts with it), the profile is first once; fewer than
    ``calibration_samples`` change nothing."""
    snap = colocated()
    name = "ibis-edgetpu/mobilenet_v2"
    base = snap.catalog
    slow = base.get(name).exec[1].mean_ms * 5.0
    rng = np.random.default_rng(0)
    observed = {name: Observed(exec=ServiceMoments.of(rng.normal(slow, 0.1, 400)))}
    # mob a little over its contract, and proven so (13 req/s in 5 s: lower 95 % bound 10.6 req/s)
    windows = {"eff": window("eff", 10.0, 40.0, 0.0), "mob": window("mob", 13.0, 30.0, 0.0)}
    res = cycle(CycleState(), POLICY, snap, windows, SET, 5.0, observed=observed, base_catalog=base)
    assert isinstance(res.actions[0], Recalibrated) and res.actions[0].first == (name,)
    catalog = res.actions[0].catalog
    assert catalog.get(name).exec[1].mean_ms == pytest.approx(slow, rel=0.01)
    # with the slow profile mob at a little over its contract is predicted to miss: at risk
    assert any(isinstance(a, Found) and a.finding.kind == "slo-at-risk" for a in res.actions)
    plain = cycle(CycleState(), POLICY, snap, windows, SET, 5.0)
    assert not any(isinstance(a, Found) and a.finding.kind == "slo-at-risk" for a in plain.actions)
    # the next window, the snapshot holding the calibrated catalog: a new catalog, nothing first
    again = cycle(res.state, POLICY, Snapshot(snap.cluster, snap.apps, snap.placements, catalog), windows, SET,
                  10.0, observed=observed, base_catalog=base)
    assert isinstance(again.actions[0], Recalibrated) and again.actions[0].first == ()
    few = {name: Observed(exec=ServiceMoments.of(rng.normal(slow, 0.1, 50)))}
    assert not any(isinstance(a, Recalibrated)
                   for a in cycle(CycleState(), POLICY, snap, windows, SET, 5.0, observed=few,
                                  base_catalog=base).actions)


# --------------------------------------------------------------------------------- busy and dead nodes


def test_an_app_with_a_move_in_flight_is_left_alone() -> None:
    snap = colocated()
    first, second = run([surge(0.0), surge(5.0)], snap, busy=frozenset({"eff"}))
    for w in (first, second):
        assert not any(isinstance(a, Found) and a.finding.app == "eff" for a in w)  # its window is not read
        assert not any(isinstance(a, (Move, Refused)) for a in w)


def test_a_dead_node_is_evacuated_and_left_out_of_consolidation() -> None:
    """n1's agent is silent: both apps are evacuated (reason agent-dead) at once; consolidation neither drains
    nor switches off the dead node, though it holds (in the snapshot) the apps leaving it."""
    snap = colocated(3)
    seen = {"n1": 0.0, "n2": 30.0, "n3": 30.0}
    res = cycle(CycleState(), POLICY, snap, {}, SET, 30.0, last_seen_s=seen, power=PowerView(), consolidation=CONS)
    dead = [a for a in res.actions if isinstance(a, Found) and a.finding.kind == "agent-dead"]
    assert len(dead) == 1 and dead[0].acted and dead[0].first and dead[0].finding.node == "n1"
    moves = [a for a in res.actions if isinstance(a, Move)]
    assert sorted(m.app for m in moves) == ["eff", "mob"]
    assert all(m.transition.reason.kind == "agent-dead" and m.transition.placement.shares[0].device != "n1/tpu0"
               for m in moves)
    power = [a for a in res.actions if isinstance(a, (SwitchOff, Undrain, Wake, Drain))]
    assert all(a.node != "n1" for a in power)


# ------------------------------------------------------------------------------------------ comparable


def test_every_action_has_a_key_and_json() -> None:
    snap = colocated()
    ready = PowerView(waking=frozenset({"n2"}), wake_s={"n2": 60.0}, ready_s={"n2": 9.0})
    actions = [a for w in run([surge(0.0), surge(5.0)], snap, power=ready, consolidation=CONS) for a in w]
    assert {a.kind for a in actions} >= {"woke", "finding", "move"}
    assert set(ACTION_KINDS) == {"woke", "recalibrated", "finding", "unexplained", "refused", "move", "switch-off",
                                 "undrain", "wake", "drain"}
    for a in actions:
        assert a.key()[0] == a.kind and a.to_json()["action"] == a.kind
        json.dumps(a.to_json())
    # the same inputs give the same keys (what two drivers are compared by)
    again = [a for w in run([surge(0.0), surge(5.0)], snap, power=ready, consolidation=CONS) for a in w]
    assert [a.key() for a in again] == [a.key() for a in actions]


def test_consolidation_needs_power_states() -> None:
    with pytest.raises(ValueError, match="consolidation needs the nodes' power states"):
        cycle(CycleState(), POLICY, colocated(), {}, SET, 5.0, consolidation=CONS)
