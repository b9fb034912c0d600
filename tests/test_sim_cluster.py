"""The cluster simulator (``sim.cluster``) on Ibis Fig. 20's setting: two Edge TPU nodes, EfficientNet-S
("eff", 10 req/s, p95 <= 100 ms) and MobileNetV2 ("mob", 10 req/s, p95 <= 50 ms) packed on n1/tpu0 by the
Ibis policy; at 60 s eff sends 3x its contract. Static placement against the adaptation loop, departures,
rejections, the model load time, determinism and input checks. Each run is a few tenths of a second."""

from __future__ import annotations

from dataclasses import replace

import pytest

from edgemux.adapt.settings import AdaptSettings
from edgemux.cluster.state import App, Cluster, Device, Node, Placement, Share, Slo
from edgemux.cluster.workload import Discipline
from edgemux.policies import Rejection, Snapshot, get
from edgemux.policies.base import Policy
from edgemux.profiles.types import DeviceKind
from edgemux.adapt.cycle import Found, Move
from edgemux.sim.cluster import (
    Arrive,
    ClusterRun,
    Fail,
    Leave,
    Place,
    Policing,
    Rate,
    replay_admission,
    simulate_cluster,
)


def tpu(node: str, memory_mb: float = 12.0) -> Device:
    # 12 MB: both models fit at once (6.56 + 3.75 MB), as in tests/test_adapt.py
    return Device(node, "tpu0", DeviceKind.EDGETPU, Discipline.FCFS, memory_mb, profile_set="ibis-edgetpu")


CLUSTER = Cluster((Node("n1", 4, 4096, (tpu("n1"),)), Node("n2", 4, 4096, (tpu("n2"),))))
EFF = App("eff", "efficientnet-S", 10.0, Slo(100.0, "p95"))
MOB = App("mob", "mobilenet_v2", 10.0, Slo(50.0, "p95"))
SURGE = [Arrive(0.0, EFF), Arrive(0.0, MOB), Rate(60.0, "eff", 30.0)]
HORIZON = 180.0
ADAPT = AdaptSettings()


def run(trace: list = SURGE, *, settings: AdaptSettings | None = ADAPT, seed: int = 0,
        cluster: Cluster = CLUSTER, **kw: object) -> ClusterRun:
    return simulate_cluster(cluster, get("ibis"), trace, horizon_s=kw.pop("horizon_s", HORIZON),  # type: ignore[arg-type]
                            seed=seed, settings=settings, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def static() -> ClusterRun:
    return run(settings=None)


@pytest.fixture(scope="module")
def adaptive() -> ClusterRun:
    return run()


def test_same_seed_same_result_other_seed_another(adaptive: ClusterRun) -> None:
    assert run() == adaptive
    other = run(seed=1)
    assert other != adaptive and other.total("eff").requests != adaptive.total("eff").requests


def test_static_placement_leaves_eff_violating_while_the_bucket_keeps_mob_within_slo(static: ClusterRun) -> None:
    assert not static.actions and not static.findings  # no controller
    eff, mob = static.rows("eff"), static.rows("mob")
    assert all(r.devices == ("n1/tpu0",) for r in eff + mob)
    before = [r for r in eff if r.end_s <= 60.0]
    after = [r for r in eff if r.start_s >= 60.0]
    assert all(r.p95_ms is not None and r.p95_ms <= 100.0 and r.refused == 0 for r in before)
    # the surge queues in eff's own bucket: every window from then on misses, and most requests are refused
    assert all(r.p95_ms is not None and r.p95_ms > 100.0 for r in after)
    assert sum(r.refused for r in after) > 0.5 * sum(r.arrivals for r in after)
    # its neighbour sees eff at (about) its contract only
    assert all(r.p95_ms is not None and r.p95_ms <= 50.0 and r.refused == 0 for r in mob)
    assert static.total("mob").attainment >= 0.99  # type: ignore[operator]
    assert static.total("eff").attainment < 0.5  # type: ignore[operator]


def test_adaptation_moves_eff_once_to_the_idle_node_then_it_meets_its_slo(adaptive: ClusterRun) -> None:
    (a,) = adaptive.actions
    assert (a.app, a.from_devices, a.to_devices, a.reason) == ("eff", ("n1/tpu0",), ("n2/tpu0",), "over-contract")
    assert a.kind == "moved" and a.moved
    assert a.time_s == 70.0 and a.serve_s == 71.0  # second surge window (trigger_windows 2), 1 s model load
    assert 30.0 < a.rate_rps < 40.0  # 1.1 x the observed ~30 req/s
    first_hot = min(f.time_s for f in adaptive.findings if f.kind == "slo-violated" and f.app == "eff")
    assert first_hot == 65.0
    eff = adaptive.rows("eff")
    late = [r for r in eff if r.start_s >= a.serve_s]
    assert late and all(r.devices == ("n2/tpu0",) and r.contract_rps == a.rate_rps for r in late)
    assert all(r.p95_ms is not None and r.p95_ms <= 100.0 and r.refused == 0 for r in late)
    assert all(r.p95_ms is not None and r.p95_ms <= 50.0 for r in adaptive.rows("mob"))
    assert adaptive.total("mob").attainment >= 0.99  # type: ignore[operator]
    t = adaptive.total("eff")
    assert t.requests == t.refused + t.answered and t.within_slo <= t.answered
    assert t.attainment > 0.9  # type: ignore[operator]


def test_model_load_time_delays_when_the_new_placement_serves() -> None:
    slow = run(model_load_s=7.0)
    (a,) = slow.actions
    assert (a.time_s, a.serve_s) == (70.0, 77.0)
    by_start = {r.start_s: r for r in slow.rows("eff")}
    # until 77 s eff is still served on n1 and policed at its old contract: refusals go on
    assert by_start[70.0].devices == ("n1/tpu0",) and by_start[70.0].refused > 50
    assert by_start[75.0].devices == ("n2/tpu0",) and by_start[80.0].refused == 0


def test_an_app_that_leaves_frees_its_device() -> None:
    small = Cluster((Node("n1", 4, 4096, (tpu("n1", memory_mb=8.0),)),))  # one EfficientNet-S at a time
    eff2, eff3 = replace(EFF, name="eff2"), replace(EFF, name="eff3")
    trace = [Arrive(0.0, EFF), Arrive(10.0, eff2), Leave(20.0, "eff"), Arrive(30.0, eff3), Rate(35.0, "eff2", 5.0),
             Leave(40.0, "eff2")]
    res = run(trace, settings=None, cluster=small, horizon_s=60.0)
    (rej,) = res.rejected
    assert (rej.time_s, rej.app, rej.constraint) == (10.0, "eff2", "device-memory")
    assert "eff2" in rej.message and "device-memory: 6.56 MB needed > 1.44 MB free on n1/tpu0" in rej.message
    assert [t.app for t in res.totals] == ["eff", "eff3"]
    assert [r.start_s for r in res.rows("eff")] == [0.0, 5.0, 10.0, 15.0]  # nothing sent after it left
    assert 150 < res.total("eff").requests < 250 and res.rows("eff3")[0].devices == ("n1/tpu0",)


def test_without_policing_the_surge_reaches_the_device_and_hurts_the_neighbour(static: ClusterRun) -> None:
    raw = run(settings=None, policing=Policing(enabled=False))
    assert raw.total("eff").refused == 0
    mob_after = [r.p95_ms for r in raw.rows("mob") if r.start_s >= 60.0]
    mob_policed = [r.p95_ms for r in static.rows("mob") if r.start_s >= 60.0]
    assert max(mob_after) > max(mob_policed)  # type: ignore[type-var]


class Pinned(Policy):
    """Places every app where ``placements`` says (a test policy: the split is the point, not the choice)."""

    name = "pinned"

    def __init__(self, placements: dict[str, Placement]) -> None:
        self.placements = placements

    def filter(self, app: App, snapshot: Snapshot, device: Device) -> Rejection | None:
        return None

    def decide(self, app: App, snapshot: Snapshot) -> Placement | Rejection:
        return self.placements[app.name]


def test_split_placement_cpu_stage_and_periodic_frames() -> None:
    cam = App("cam", "mobilenet_v2", 15.0, Slo(66.7, "p99"), periodic=True, cpu_cores=1.0, cpu_ms=5.0)
    split = Placement("cam", (Share("n1/tpu0", 0.25, "ibis-edgetpu/mobilenet_v2"),
                              Share("n2/tpu0", 0.75, "ibis-edgetpu/mobilenet_v2")), cpu_node="n1")
    res = simulate_cluster(CLUSTER, Pinned({"cam": split}), [Arrive(0.0, cam)], horizon_s=40.0, seed=3)
    t = res.total("cam")
    assert t.requests in (599, 600) and t.answered == t.requests  # one frame every 1/15 s
    served = dict(res.served)
    assert sum(served.values()) == t.requests and 0.18 < served["n1/tpu0"] / t.requests < 0.32
    # every frame takes its CPU stage and its execution; a lone camera never queues long
    assert all(r.mean_ms is not None and 5.0 + 4.91 - 1e-6 <= r.mean_ms < 40.0 for r in res.rows("cam"))


def on(app: str, node: str, model: str) -> Placement:
    return Placement(app, (Share(f"{node}/tpu0", 1.0, f"ibis-edgetpu/{model}"),), node)


def test_an_offline_plan_places_arrivals_and_re_places_apps_at_once() -> None:
    """An Arrive with a placement skips the policy (which would have put eff on n1; mob, decided by the policy,
    joins it on n2: tight packing); a Place moves an app with no model load and polices its new contract from
    that instant."""
    trace = [Arrive(0.0, EFF, on("eff", "n2", "efficientnet-S")), Arrive(0.0, MOB), Rate(30.0, "eff", 30.0),
             Place(60.0, "eff", on("eff", "n1", "efficientnet-S"), 33.0)]
    res = run(trace, settings=None, horizon_s=120.0)
    by_start = {r.start_s: r for r in res.rows("eff")}
    assert by_start[0.0].devices == ("n2/tpu0",) and res.rows("mob")[0].devices == ("n2/tpu0",)
    assert by_start[40.0].refused > 50 and by_start[40.0].contract_rps == 10.0  # 30 req/s against 10
    assert by_start[60.0].devices == ("n1/tpu0",) and by_start[60.0].contract_rps == 33.0
    assert sum(r.refused for r in res.rows("eff") if r.start_s >= 60.0) == 0 and not res.actions


def test_a_contract_raised_in_place_serves_at_once_and_is_no_migration() -> None:
    """On a single TPU with room for eff at 30 req/s, the Ibis rule re-admits it where it is: no model to
    load, so the new contract polices from the decision on, and the action is not a migration."""
    one = Cluster((Node("n1", 4, 4096, (tpu("n1"),)),))
    res = run([Arrive(0.0, EFF), Rate(30.0, "eff", 30.0)], cluster=one, horizon_s=90.0, model_load_s=5.0)
    (a,) = res.actions
    assert a.serve_s == a.time_s and a.kind == "contract" and not a.moved and a.to_devices == a.from_devices == ("n1/tpu0",)
    assert a.reason in ("over-contract", "dropping") and a.rate_rps > 30.0
    assert sum(r.refused for r in res.rows("eff") if r.start_s >= a.time_s) == 0


@pytest.mark.parametrize("kwargs, trace, message", [
    ({"horizon_s": -1.0}, SURGE[:1], "horizon_s must be a finite number of seconds > 0, got -1.0"),
    ({}, [Arrive(0.0, EFF), Rate(5.0, "ghost", 3.0)], r"trace\[1\] \(Rate at 5.0 s\): unknown app 'ghost' \(never"),
    ({}, [Arrive(10.0, EFF), Arrive(5.0, MOB)], r"trace\[1\] \(Arrive at 5.0 s\): events out of order"),
    ({}, [Arrive(0.0, EFF), Leave(1.0, "eff"), Rate(2.0, "eff", 1.0)], "unknown app 'eff' .has left"),
    ({}, [Arrive(0.0, EFF), Arrive(1.0, EFF)], "app 'eff' arrives twice"),
    ({}, [Arrive(0.0, EFF), Rate(1.0, "eff", -2.0)], "rate_rps must be a finite number >= 0"),
    ({}, [Arrive(500.0, EFF)], r"time_s must be within \[0, horizon_s=180\]"),
    ({"model_load_s": -1.0}, SURGE, "model_load_s must be a finite number of seconds >= 0"),
    ({}, [Arrive(0.0, EFF, on("mob", "n1", "mobilenet_v2"))],
     r"trace\[0\] .*the placement is for app 'mob', not 'eff'"),
    ({}, [Arrive(0.0, EFF), Place(1.0, "eff", on("mob", "n1", "mobilenet_v2"), 5.0)],
     "the placement is for app 'mob', not 'eff'"),
    ({}, [Arrive(0.0, EFF), Place(1.0, "eff", on("eff", "n2", "efficientnet-S"), 0.0)],
     "rate_rps must be a finite number > 0"),
    ({}, [Place(1.0, "eff", on("eff", "n2", "efficientnet-S"), 5.0)], "unknown app 'eff' .never arrived"),
    ({}, [Arrive(0.0, EFF), Fail(1.0, "n9")], r"trace\[1\] \(Fail at 1.0 s\): unknown node 'n9' \(the cluster has n1, n2\)"),
    ({}, [Fail(1.0, "n2"), Fail(2.0, "n2")], "node 'n2' fails twice"),
])
def test_bad_inputs_name_the_problem(kwargs: dict, trace: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        run(trace, **kwargs)


def test_bad_policing_is_named() -> None:
    with pytest.raises(ValueError, match="policing rate_margin must be a finite number >= 0"):
        Policing(rate_margin=-0.1)
    with pytest.raises(ValueError, match="max_wait_s must be >= 0 seconds"):
        Policing(max_wait_s=-1.0)


def test_a_batch_device_is_refused_by_name() -> None:
    batch = Device("n1", "gpu0", DeviceKind.EDGETPU, Discipline.BATCH, 12.0, profile_set="ibis-edgetpu")
    cluster = Cluster((Node("n1", 4, 4096, (batch,)),))
    pin = Placement("mob", (Share("n1/gpu0", 1.0, "ibis-edgetpu/mobilenet_v2"),), "n1")
    with pytest.raises(ValueError, match="device 'n1/gpu0': the cluster simulator does not simulate batch devices"):
        simulate_cluster(cluster, Pinned({"mob": pin}), [Arrive(0.0, MOB)], horizon_s=10.0)


# ------------------------------------------------------------------------------------- admission alone


def by_hand(policy: Policy, cluster: Cluster, apps: list[App]) -> list[Placement | Rejection]:
    """The loop the experiments used to write: decide each arrival on the snapshot so far."""
    snap, out = Snapshot(cluster), []
    for a in apps:
        d = policy.decide(a, snap)
        out.append(d)
        if isinstance(d, Placement):
            snap = snap.with_placement(a, d)
    return out


def test_admission_alone_decides_as_the_loop_it_replaces_and_keeps_every_state() -> None:
    """Eleven cameras-worth of apps on two TPUs: the replay's decisions are those of the hand loop, every
    admission's snapshot holds the apps admitted so far, a leave frees its room (a later arrival fits
    again), and events for a rejected app change nothing."""
    apps = [App(f"m{i}", "mobilenet_v2", 40.0, Slo(50.0, "p95")) for i in range(11)]
    expected = by_hand(get("ibis"), CLUSTER, apps)
    rejected = [a.name for a, d in zip(apps, expected) if isinstance(d, Rejection)]
    assert rejected and len(rejected) < len(apps)  # the cluster fills up part way
    first = next(i for i, d in enumerate(expected) if isinstance(d, Rejection))
    trace = [Arrive(0.0, a) for a in apps] + [Rate(1.0, rejected[0], 5.0), Leave(2.0, rejected[0]),
                                              Leave(3.0, "m0"), Arrive(4.0, replace(apps[first], name="late"))]
    steps = replay_admission(CLUSTER, get("ibis"), trace)
    assert [s.event for s in steps] == trace
    assert [s.decision for s in steps[:len(apps)]] == expected
    assert [s.changed for s in steps] == [isinstance(d, Placement) for d in expected] + [False, False, True, True]
    admitted = [a.name for a, d in zip(apps, expected) if isinstance(d, Placement)]
    assert sorted(steps[len(apps) - 1].snapshot.placements) == sorted(admitted)
    assert "m0" not in steps[-2].snapshot.placements
    assert isinstance(steps[-1].decision, Placement) and "late" in steps[-1].snapshot.placements


def test_admission_alone_can_stop_at_the_first_rejection() -> None:
    apps = [App(f"m{i}", "mobilenet_v2", 40.0, Slo(50.0, "p95")) for i in range(11)]
    steps = replay_admission(CLUSTER, get("ibis"), [Arrive(0.0, a) for a in apps], stop_at_rejection=True)
    assert isinstance(steps[-1].decision, Rejection)
    assert all(isinstance(s.decision, Placement) for s in steps[:-1]) and len(steps) < len(apps)


def test_admission_alone_takes_batch_devices_and_offline_plans_and_refuses_a_bad_trace() -> None:
    """No station is built without traffic, so a batch device is fine; a Place re-places at its contract."""
    batch = Device("n1", "gpu0", DeviceKind.EDGETPU, Discipline.BATCH, 12.0, profile_set="ibis-edgetpu")
    cluster = Cluster((Node("n1", 4, 4096, (batch,)),))
    pin = Placement("mob", (Share("n1/gpu0", 1.0, "ibis-edgetpu/mobilenet_v2"),), "n1")
    steps = replay_admission(cluster, Pinned({"mob": pin}), [Arrive(0.0, MOB), Place(1.0, "mob", pin, 20.0)])
    assert steps[0].decision == pin and steps[1].changed and steps[1].snapshot.apps["mob"].rate_rps == 20.0
    with pytest.raises(ValueError, match=r"trace\[1\] \(Leave at 1.0 s\): unknown app 'ghost'"):
        replay_admission(cluster, Pinned({}), [Arrive(0.0, MOB), Leave(1.0, "ghost")])


# ------------------------------------------------------------------------------------------- node failure


def test_a_failed_node_loses_its_requests_and_the_controller_evacuates_its_apps() -> None:
    """n1 (both apps) fails at 30 s: its agent is silent, so the cycle finds it agent-dead at the first window
    more than dead_after_s (15 s) later, 50 s, and moves both apps to n2 (serving at 51 s); every request
    routed to n1 meanwhile is lost and counted as failed in its window (the dropping detector sees it)."""
    res = run([Arrive(0.0, EFF), Arrive(0.0, MOB), Fail(30.0, "n1")], horizon_s=120.0)
    (failure,) = res.failures
    assert (failure.node, failure.time_s) == ("n1", 30.0) and failure.routed > 300
    assert sum(t.lost for t in res.totals) == failure.in_flight + failure.routed
    for t in res.totals:
        assert t.requests == t.refused + t.answered + t.lost
    assert [(a.time_s, a.serve_s, a.app, a.to_devices, a.reason, a.kind) for a in res.actions] == [
        (50.0, 51.0, "eff", ("n2/tpu0",), "agent-dead", "moved"), (50.0, 51.0, "mob", ("n2/tpu0",), "agent-dead", "moved")]
    dead = [f for f in res.findings if f.kind == "agent-dead"]
    assert dead[0].time_s == 50.0 and dead[0].acted and dead[0].devices == ("n1/tpu0",)
    for name in ("eff", "mob"):
        rows = {r.start_s: r for r in res.rows(name)}
        assert all(rows[t].answered == 0 and rows[t].arrivals > 0 for t in (30.0, 35.0, 40.0, 45.0))
        assert all(r.answered == r.arrivals and r.devices == ("n2/tpu0",) for r in res.rows(name) if r.start_s >= 55.0)
    # the monitor saw every request of those windows fail: the dropping detector at 100 %
    dropping = [a.finding for t, a in res.decisions if isinstance(a, Found) and a.finding.kind == "dropping"
                and 30.0 < t <= 50.0]
    assert dropping and all(f.observed == 1.0 for f in dropping)
    # the decisions record the same moves the Actions show, in order
    assert [a.app for _, a in res.decisions if isinstance(a, Move)] == ["eff", "mob"]


def test_requests_in_flight_at_a_failure_are_lost_and_a_static_placement_never_recovers() -> None:
    """InceptionV3 at 10 req/s keeps its TPU busy 63 % of the time: the request in service at the failure is
    lost (seed 0: one), and with no controller every later one too; the device served the others."""
    inc = App("inc", "inception_v3", 10.0, Slo(500.0, "p95"))
    res = run([Arrive(0.0, inc), Fail(30.0, "n1")], horizon_s=60.0, settings=None)
    (failure,) = res.failures
    t = res.total("inc")
    assert failure.in_flight == 1 and t.lost == failure.in_flight + failure.routed
    assert t.answered + t.lost == t.requests and dict(res.served)["n1/tpu0"] == t.answered + failure.in_flight
    assert all(r.answered == 0 for r in res.rows("inc") if r.start_s >= 30.0)
    assert not res.findings and not res.actions


def test_a_failed_empty_node_changes_nothing_but_is_found_dead() -> None:
    res = run([Arrive(0.0, EFF), Arrive(0.0, MOB), Fail(10.0, "n2")], horizon_s=60.0, settings=ADAPT)
    assert res.failures[0].in_flight == res.failures[0].routed == 0 and all(t.lost == 0 for t in res.totals)
    assert any(f.kind == "agent-dead" and f.time_s == 30.0 for f in res.findings)
    assert run([Arrive(0.0, EFF), Arrive(0.0, MOB)], horizon_s=60.0).totals == res.totals


def test_a_failed_cpu_stage_node_loses_the_requests_bound_for_live_devices() -> None:
    """A camera split over n1 and n2 with its CPU stage on n1 (60 ms a frame: busy 90 % of the time): when n1
    fails the frame in that stage is lost, bound for n2 or not, and so is every later one (each passes the dead
    stage; no controller moves it)."""
    cam = App("cam", "mobilenet_v2", 15.0, Slo(200.0, "p99"), periodic=True, cpu_cores=1.0, cpu_ms=60.0)
    split = Placement("cam", (Share("n1/tpu0", 0.25, "ibis-edgetpu/mobilenet_v2"),
                              Share("n2/tpu0", 0.75, "ibis-edgetpu/mobilenet_v2")), cpu_node="n1")
    res = simulate_cluster(CLUSTER, Pinned({"cam": split}), [Arrive(0.0, cam), Fail(20.0, "n1")], horizon_s=40.0,
                           seed=3)
    t, (failure,) = res.total("cam"), res.failures
    assert t.answered + t.lost == t.requests and t.lost == failure.in_flight + failure.routed
    assert failure.routed >= 299 and failure.in_flight == 1  # 15 frames a second for 20 s; seed 3
    assert all(r.answered == 0 for r in res.rows("cam") if r.start_s >= 20.0)
    # before the failure only the frame in the stage at 20 s went unanswered
    assert sum(r.arrivals - r.answered for r in res.rows("cam") if r.end_s <= 20.0) == failure.in_flight
