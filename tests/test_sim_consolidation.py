"""Energy and consolidation in the cluster simulator: energy by hand with no load, nodes switched off at low
load and never while they hold a tenant, woken when the load rises, an arrival waiting for a node to wake, no
request lost, and bad power arguments."""

from __future__ import annotations

import pytest

from edgemux.adapt.consolidate import ConsolidationSettings
from edgemux.adapt.settings import AdaptSettings
from edgemux.cluster.power import NodePower
from edgemux.cluster.state import App, Placement, Share, Slo
from edgemux.experiments.dynamic_trace import tpus
from edgemux.policies.registry import get
from edgemux.sim.cluster import Arrive, ClusterRun, Fail, Leave, Rate, simulate_cluster

NODES = 4
CLUSTER = tpus(NODES)
SETTINGS = AdaptSettings(window_s=60.0)
CONS = ConsolidationSettings(switch_off_below=0.3, wake_above=0.6)
POLICY = get("ibis")


def _power(wake_s: float = 60.0) -> dict[str, NodePower]:
    return {n.name: NodePower(n.name, 2.0, {f"{n.name}/tpu0": 1.5}, wake_s, 0.1) for n in CLUSTER.nodes}


def _run(trace: list, horizon_s: float, consolidation: ConsolidationSettings | None, **kw: object) -> ClusterRun:
    return simulate_cluster(CLUSTER, POLICY, trace, horizon_s=horizon_s, seed=3, settings=SETTINGS,
                            model_load_s=1.0, power=_power(**kw), consolidation=consolidation)  # type: ignore[arg-type]


def _app(i: int, rate: float) -> App:
    return App(f"a{i}", "mobilenet_v2", rate, Slo(50.0, "mean"))


def test_energy_with_no_load_by_hand() -> None:
    on = _run([], 600.0, None)
    assert on.energy_kwh * 3.6e6 == pytest.approx(NODES * 2.0 * 600.0)
    off = _run([], 600.0, CONS)
    # the first tick (60 s) switches the empty nodes off one by one, one per tick, down to min_on = 1:
    # node k goes off at 60 k s (k = 1..3)
    offs = sorted(c.time_s for c in off.power_changes if c.state == "off")
    assert offs == [60.0, 120.0, 180.0]
    expect = 2.0 * 600.0 + sum(2.0 * t + 0.1 * (600.0 - t) for t in offs)
    assert off.energy_kwh * 3.6e6 == pytest.approx(expect)
    assert sum(e.off_s for e in off.energy) == pytest.approx(sum(600.0 - t for t in offs))


def _holds(run: ClusterRun, node: str, t: float) -> bool:
    """Whether some app was served on ``node`` at time ``t`` (by the actions and arrivals the run recorded)."""
    for name in {w.app for w in run.windows}:
        devices = [w for w in run.windows if w.app == name and w.start_s <= t < w.end_s]
        if any(node == d.split("/")[0] for w in devices for d in w.devices):
            return True
    return False


def test_low_load_switches_nodes_off_keeps_every_request_and_never_a_holder() -> None:
    # one app per node (as a spreading placement leaves them): consolidation must move apps to empty nodes
    trace = [Arrive(0.0, _app(i, 4.0), Placement(f"a{i}", (Share(f"n{i}/tpu0", 1.0, "ibis-edgetpu/mobilenet_v2"),)))
             for i in range(NODES)]
    on = _run(trace, 1800.0, None)
    run = _run(trace, 1800.0, CONS)
    assert run.energy_kwh < 0.7 * on.energy_kwh
    for c in run.power_changes:
        if c.state == "off":
            assert not _holds(run, c.node, c.time_s + 1e-6), c
    totals = {t.app: t for t in run.totals}
    assert set(totals) == {f"a{i}" for i in range(NODES)}
    assert all(t.answered + t.refused == t.requests for t in run.totals)  # nothing lost
    within = sum(t.within_slo for t in run.totals) / sum(t.requests for t in run.totals)
    assert within >= 0.99
    assert any(a.reason == "consolidate" and a.moved for a in run.actions)


def test_rising_load_wakes_nodes_and_an_arrival_waits_for_one() -> None:
    """Four apps at a low rate are packed on few nodes; then their rates rise past what those nodes hold and a
    fifth app arrives: nodes are woken, and the arrival waits for one if the nodes on cannot take it."""
    trace: list = [Arrive(0.0, _app(i, 4.0)) for i in range(NODES)]
    trace += [Rate(900.0, f"a{i}", 120.0) for i in range(NODES)]
    trace += [Arrive(905.0, _app(9, 120.0)), Leave(1700.0, "a9")]
    run = _run(trace, 1800.0, CONS, wake_s=30.0)
    states = [(c.time_s, c.node, c.state) for c in run.power_changes]
    assert any(s == "waking" and t >= 900.0 for t, _, s in states), states
    woke = [(t, n) for t, n, s in states if s == "on" and t >= 900.0]
    assert woke
    for d in run.delayed:
        assert d.app == "a9" and d.admitted_s is not None and d.admitted_s >= d.arrived_s


def test_seeded_and_deterministic() -> None:
    trace = [Arrive(0.0, _app(i, 4.0)) for i in range(NODES)]
    a, b = _run(trace, 600.0, CONS), _run(trace, 600.0, CONS)
    assert a.energy == b.energy and a.power_changes == b.power_changes and a.totals == b.totals


def test_bad_power_arguments() -> None:
    with pytest.raises(ValueError, match="consolidation needs power"):
        simulate_cluster(CLUSTER, POLICY, [], horizon_s=60.0, settings=SETTINGS, consolidation=CONS)
    with pytest.raises(ValueError, match="consolidation needs power"):
        simulate_cluster(CLUSTER, POLICY, [], horizon_s=60.0, power=_power(), consolidation=CONS)
    short = dict(list(_power().items())[:2])
    with pytest.raises(ValueError, match="power must give every node of the cluster and no other: missing n2, n3"):
        simulate_cluster(CLUSTER, POLICY, [], horizon_s=60.0, power=short)
    wrong = _power()
    wrong["n0"] = NodePower("n0", 2.0, {"n9/tpu0": 1.0}, 10.0)
    with pytest.raises(ValueError, match="power\\['n0'\\] names devices node 'n0' does not have: n9/tpu0"):
        simulate_cluster(CLUSTER, POLICY, [], horizon_s=60.0, power=wrong)


def test_an_app_that_sends_nothing_for_a_window_is_no_load() -> None:
    trace = [Arrive(0.0, _app(0, 4.0)), Rate(100.0, "a0", 0.0), Rate(400.0, "a0", 4.0)]
    run = _run(trace, 600.0, CONS)
    assert run.total("a0").requests > 0


def test_app_energy_is_its_dynamic_share() -> None:
    """Each app's energy is the dynamic power times its requests' service time; with the nodes' idle energy it
    adds up to the cluster's (one node, always on)."""
    trace = [Arrive(0.0, _app(0, 20.0)), Arrive(0.0, _app(1, 10.0))]
    run = _run(trace, 600.0, None)
    apps = dict(run.app_energy)
    assert set(apps) == {"a0", "a1"} and apps["a0"] > apps["a1"] > 0
    idle = NODES * 2.0 * 600.0
    assert run.energy_kwh * 3.6e6 == pytest.approx(idle + sum(apps.values()), rel=1e-9)


def test_a_failed_node_is_never_switched_off_or_drained() -> None:
    """With no load the empty nodes are switched off one per tick down to min_on (the test above); a node whose
    agent is dead cannot be switched through it: n0 fails at 0 s, so from the first tick (60 s, dead for more
    than dead_after_s) it is left out: n1 and n2 go off, n3 stays on, n0 keeps drawing its idle power."""
    run = _run([Fail(0.0, "n0")], 600.0, CONS)
    offs = [(c.time_s, c.node) for c in run.power_changes if c.state == "off"]
    assert offs == [(60.0, "n1"), (120.0, "n2")]
    assert not [c for c in run.power_changes if c.node == "n0"]
    energy = {e.node: e for e in run.energy}
    assert energy["n0"].off_s == 0.0 and energy["n0"].joules == pytest.approx(2.0 * 600.0)
