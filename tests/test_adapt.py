"""The adapt layer's pure decisions: monitor windows, detectors, the Ibis planner and the damping loop, on a
two-node Edge TPU cluster where EfficientNet-S and MobileNetV2 share one device (Ibis Fig. 20's setting)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings as hsettings
from hypothesis import strategies as st

from edgemux.adapt.detect import detect, observed_rates
from edgemux.adapt.loop import AdaptState, step
from edgemux.adapt.monitor import AppWindow, LatencySummary, ServiceMoments
from edgemux.adapt.plan import (evacuate_plan, ibis_plan, live_snapshot, reclaim_plan, repartition, shift,
                                transition_kind)
from edgemux.adapt.settings import AdaptSettings
from edgemux.cluster.state import App, Cluster, Device, Node, Placement, Share, Slo
from edgemux.cluster.workload import Discipline
from edgemux.policies import Snapshot, get
from edgemux.policies.moves import check_move
from edgemux.profiles.types import DeviceKind


def tpu(node: str) -> Device:
    # 12 MB so that both models fit at once (6.56 + 3.75 MB): the test is about load, not memory
    return Device(node, "tpu0", DeviceKind.EDGETPU, Discipline.FCFS, 12.0, profile_set="ibis-edgetpu")


CLUSTER = Cluster((Node("n1", 4, 4096, (tpu("n1"),)), Node("n2", 4, 4096, (tpu("n2"),))))
EFF = App("eff", "efficientnet-S", 10.0, Slo(100.0, "p95"))
MOB = App("mob", "mobilenet_v2", 10.0, Slo(50.0, "p95"))
SET = AdaptSettings(min_samples=20, trigger_windows=2, min_dwell_s=60.0)


def colocated() -> Snapshot:
    """Both apps on n1/tpu0 (p95 predicted 44 and 34 ms at their contracts: admitted), n2 idle."""
    pl = {"eff": Placement("eff", (Share("n1/tpu0", 1.0, "ibis-edgetpu/efficientnet-S"),), "n1"),
          "mob": Placement("mob", (Share("n1/tpu0", 1.0, "ibis-edgetpu/mobilenet_v2"),), "n1")}
    snap = Snapshot(CLUSTER, {"eff": EFF, "mob": MOB}, pl)
    for name in pl:
        assert check_move(get("ibis"), snap.apps[name], snap, pl[name]) is None
    return snap


def window(app: str, rate_rps: float, latency_ms: float, t0: float = 0.0, dur: float = 5.0,
           refused: int = 0) -> AppWindow:
    n = int(round(rate_rps * dur)) - refused
    return AppWindow.of(app, t0, t0 + dur, np.full(n, latency_ms), refused=refused)


def surge(t0: float = 0.0) -> dict[str, AppWindow]:
    """EfficientNet-S sends 3x its contract; MobileNetV2's p95 is over its SLO."""
    return {"eff": window("eff", 30.0, 40.0, t0), "mob": window("mob", 10.0, 65.0, t0)}


def calm(t0: float = 0.0) -> dict[str, AppWindow]:
    return {"eff": window("eff", 10.0, 20.0, t0), "mob": window("mob", 10.0, 15.0, t0)}


# ------------------------------------------------------------------------------------------------ monitor


def test_latency_summary_and_window_rates() -> None:
    x = np.arange(1.0, 101.0)
    s = LatencySummary.of(x)
    assert s is not None and s.count == 100 and s.mean_ms == 50.5
    assert s.at("p95") == pytest.approx(np.percentile(x, 95)) and s.at("mean") == 50.5
    with pytest.raises(ValueError, match="unknown latency statistic 'p90'"):
        s.at("p90")
    assert LatencySummary.of([]) is None
    w = AppWindow.of("a", 10.0, 15.0, x, refused=20, failed=5)
    assert (w.arrivals, w.lost, w.rate_rps) == (125, 25, 25.0)


@pytest.mark.parametrize("kw, message", [
    ({"start_s": 5.0, "end_s": 5.0}, "end_s > start_s"),
    ({"arrivals": -1}, "arrivals must be an integer >= 0"),
    ({"refused": 8, "failed": 5}, r"refused \+ failed \(13\) exceed arrivals \(10\)"),
    ({"latency": LatencySummary(11, 1.0, 1.0, 1.0, 1.0)}, "11 latencies for 10 answered"),
])
def test_bad_windows_are_named(kw: dict, message: str) -> None:
    base = dict(app="a", start_s=0.0, end_s=5.0, arrivals=10, refused=0, failed=0, latency=None)
    with pytest.raises(ValueError, match=message):
        AppWindow(**{**base, **kw})
    with pytest.raises(ValueError, match="finite and >= 0"):
        LatencySummary.of([1.0, float("nan")])


@given(st.lists(st.floats(0.0, 1e3), min_size=0, max_size=40), st.lists(st.floats(0.0, 1e3), max_size=40))
@hsettings(max_examples=60, deadline=None)
def test_service_moments_merge_equals_the_moments_of_both(a: list[float], b: list[float]) -> None:
    m = ServiceMoments.of(a).merge(ServiceMoments.of(b))
    both = np.array(a + b)
    assert m.n == both.size
    if both.size:
        assert m.mean_ms == pytest.approx(both.mean(), rel=1e-9, abs=1e-9)
    if both.size > 1:
        assert m.variance_ms2 == pytest.approx(both.var(ddof=1), rel=1e-6, abs=1e-6)


# ----------------------------------------------------------------------------------------------- settings


def test_settings_ranges_and_options() -> None:
    assert AdaptSettings().with_options({"min_dwell_s": "30", "trigger_windows": "3"}) == \
        AdaptSettings(min_dwell_s=30.0, trigger_windows=3)
    with pytest.raises(ValueError, match=r"adapt setting window_s: expected a number in \[0.1, 3600\], got 0"):
        AdaptSettings(window_s=0)
    with pytest.raises(ValueError, match="trigger_windows: expected an integer in"):
        AdaptSettings(trigger_windows=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="expected a number in .* got nan"):
        AdaptSettings(headroom=float("nan"))
    with pytest.raises(ValueError, match="unknown adapt setting 'dwell': expected one of window_s, "):
        AdaptSettings().with_options({"dwell": "1"})
    with pytest.raises(ValueError, match="adapt setting min_samples: expected an integer, got 'many'"):
        AdaptSettings().with_options({"min_samples": "many"})


# --------------------------------------------------------------------------------------------- detectors


def test_nothing_is_found_when_every_app_keeps_its_contract() -> None:
    assert detect(colocated(), calm(), SET) == []


def test_a_surge_is_over_contract_violated_and_at_risk() -> None:
    found = {(f.kind, f.app): f for f in detect(colocated(), surge(), SET)}
    assert set(found) == {("over-contract", "eff"), ("slo-violated", "mob"), ("slo-at-risk", "mob")}
    oc = found[("over-contract", "eff")]
    assert (oc.observed, oc.limit, oc.unit, oc.devices) == (30.0, 10.0, "req/s", ("n1/tpu0",))
    assert found[("slo-violated", "mob")].observed == 65.0
    # the prediction at the observed rates is the admission's estimator at 30 req/s: p95 over 50 ms
    risk = found[("slo-at-risk", "mob")]
    assert 50.0 < risk.observed < 70.0 and "at the observed rates" in risk.detail
    # at the rate the window proves (its lower 95 % bound: 26.2 req/s of 150 arrivals in 5 s), not its count
    proven = surge()["eff"].rate_lower_rps()
    assert 20.0 < proven < 30.0 and observed_rates(colocated(), surge()).apps["eff"].rate_rps == proven


def test_a_count_over_the_contract_that_the_window_does_not_prove_predicts_nothing_new() -> None:
    """An app at its contract shows more than it in about half of its windows: 12 req/s of a 10 req/s
    contract in 5 s (60 arrivals) is within the noise (lower 95 % bound 9.7 req/s), so the devices are
    predicted at the contracts (the snapshot itself: no at-risk finding can come of it), as on a calm
    window; 14 req/s (lower bound 11.5) is proven, and predicted at 11.5."""
    snap = colocated()
    noisy = {"eff": window("eff", 12.0, 20.0), "mob": window("mob", 12.0, 15.0)}
    assert noisy["eff"].rate_rps == 12.0 and noisy["eff"].rate_lower_rps() < 10.0
    assert observed_rates(snap, noisy) is snap
    assert [f.kind for f in detect(snap, noisy, SET)] == [f.kind for f in detect(snap, calm(), SET)] == []
    proven = {"eff": window("eff", 14.0, 20.0)}
    rated = observed_rates(snap, proven).apps["eff"].rate_rps
    assert rated == proven["eff"].rate_lower_rps() and 11.0 < rated < 12.0


def test_too_few_samples_are_not_judged_and_drops_are_found() -> None:
    few = {"mob": window("mob", 2.0, 500.0)}  # 10 answered < min_samples 20
    assert detect(colocated(), few, SET) == []
    drops = {"mob": window("mob", 10.0, 10.0, refused=5)}  # 5 of 50 refused > 1 %
    (f,) = detect(colocated(), drops, SET)
    assert (f.kind, f.observed) == ("dropping", 0.1)


def test_a_silent_agent_is_dead() -> None:
    (f,) = detect(colocated(), {}, SET, now_s=100.0, last_seen_s={"n1": 99.0, "n2": 80.0})
    assert (f.kind, f.node, f.devices, f.observed) == ("agent-dead", "n2", ("n2/tpu0",), 20.0)


def test_a_bucket_that_refuses_while_the_app_is_above_its_contract_is_over_contract() -> None:
    """11.6 req/s against 10: its 95 % lower rate bound (5 s window) is under the 11 req/s limit, but its own
    bucket refused 3 of 58 requests: that is evidence enough. The same refusals at 9.6 req/s are not."""
    snap = colocated()
    w = window("eff", 11.6, 20.0, refused=3)
    assert w.rate_lower_rps() < 11.0
    found = {(f.kind, f.app) for f in detect(snap, {"eff": w}, SET)}
    assert ("over-contract", "eff") in found and ("dropping", "eff") in found
    below = {(f.kind, f.app) for f in detect(snap, {"eff": window("eff", 9.6, 20.0, refused=3)}, SET)}
    assert ("over-contract", "eff") not in below and ("dropping", "eff") in below


def raised() -> Snapshot:
    """``colocated`` with eff's contract raised to 30 req/s by an earlier move (declared: 10)."""
    snap = colocated()
    return snap.without("eff").with_placement(replace(EFF, rate_rps=30.0), snap.placements["eff"])


def test_a_raised_contract_the_app_no_longer_uses_is_under_contract_with_hysteresis() -> None:
    snap, declared = raised(), {"eff": 10.0, "mob": 10.0}
    (f,) = [f for f in detect(snap, {"eff": window("eff", 12.0, 20.0)}, SET, declared=declared)]
    assert (f.kind, f.app, f.observed, f.limit) == ("under-contract", "eff", 12.0, 30.0)
    # not without the declared contracts, not within the band (upper bound x 1.1 >= 30 / 1.1), and never for
    # an app at its declared contract
    assert detect(snap, {"eff": window("eff", 12.0, 20.0)}, SET) == []
    assert detect(snap, {"eff": window("eff", 24.0, 20.0)}, SET, declared=declared) == []
    assert detect(colocated(), {"mob": window("mob", 2.0, 10.0)}, SET, declared=declared) == []


def test_idle_capacity_is_a_lightly_used_device_and_can_be_switched_off() -> None:
    snap = colocated()
    quiet = replace(SET, idle_utilization=0.5)
    (f,) = detect(snap, calm(), quiet)
    assert (f.kind, f.app, f.devices, f.node, f.unit) == ("idle-capacity", None, ("n1/tpu0",), "n1", "utilization")
    # eff + mob at 10 req/s: 14.7 % busy executing, 42.5 % if every request paid its switch; some do
    assert 0.147 < f.observed < 0.425 and f.key == ("idle-capacity", "n1/tpu0")
    assert detect(snap, calm(), replace(SET, idle_utilization=0.0)) == []
    assert detect(snap, calm(), SET) == []  # 5 % by default


# ---------------------------------------------------------------------------------------------- planner


def test_rate_bounds_cover_the_poisson_rate_95_percent_of_the_time() -> None:
    """``AppWindow.rate_upper_rps`` is a one-sided 95 % bound: over 4000 seeded Poisson windows at 30 req/s
    (5 s), it is at or above the true rate in 95 % of them, within the binomial 99 % interval."""
    rng = np.random.default_rng(7)
    n = 4000
    covered = sum(AppWindow("a", 0.0, 5.0, int(k), 0, 0, None).rate_upper_rps() >= 30.0
                  for k in rng.poisson(150.0, n))
    half = 2.576 * (0.95 * 0.05 / n) ** 0.5
    assert 0.95 - half <= covered / n <= 0.95 + half
    # the lower bound: an app sending exactly at the over-contract limit (11 req/s) in 2 s windows is called
    # over it in about 5 % of them (6.4 % here: the normal score bound is approximate for a count of 22),
    # not the third that lambda-hat alone would give
    counts = rng.poisson(22.0, n)
    flagged = sum(AppWindow("a", 0.0, 2.0, int(k), 0, 0, None).rate_lower_rps() > 11.0 for k in counts)
    assert flagged / n <= 0.08 and sum(int(k) > 22 for k in counts) / n > 0.3


def test_ibis_rule_moves_the_over_contract_tenant_to_where_it_fits_at_its_rate() -> None:
    snap = colocated()
    plan = ibis_plan(get("ibis"), snap, detect(snap, surge(), SET), surge(), SET)
    (t,) = plan.transitions
    assert t.app == "eff" and [s.device for s in t.placement.shares] == ["n2/tpu0"]
    # re-admitted at the window's upper 95 % rate bound plus 10 % headroom, not at its point estimate
    w = surge()["eff"]
    z, n = 1.6448536269514722, w.arrivals
    assert t.rate_rps == pytest.approx((n + z * z / 2 + z * (n + z * z / 4) ** 0.5) / w.duration_s * 1.1)
    assert t.rate_rps > 30.0 * 1.1 and t.reason.kind == "over-contract"
    assert not plan.refused and not plan.unexplained
    # the plan is sound: the app at its new rate passes the policy's own check where it goes
    after = snap.without("eff").with_placement(replace(EFF, rate_rps=t.rate_rps), t.placement)
    assert check_move(get("ibis"), after.apps["eff"], after, t.placement) is None


def test_no_room_is_a_refusal_with_the_rejection_as_data() -> None:
    one = Cluster((Node("n1", 4, 4096, (tpu("n1"),)),))
    snap = Snapshot(one, colocated().apps, colocated().placements)
    plan = ibis_plan(get("ibis"), snap, detect(snap, surge(), SET), surge(), SET)
    assert not plan.transitions
    (r,) = plan.refused
    assert r.app == "eff" and r.rejection.constraint and "eff" in r.rejection.message


def test_a_hotspot_without_an_over_contract_tenant_is_unexplained() -> None:
    snap = colocated()
    slow = {"eff": window("eff", 10.0, 20.0), "mob": window("mob", 10.0, 80.0)}  # within contract, SLO missed
    plan = ibis_plan(get("ibis"), snap, detect(snap, slow, SET), slow, SET)
    assert not plan.transitions and [f.kind for f in plan.unexplained] == ["slo-violated"]


# a camera app split over both TPUs (mobilenet_v2, p95 <= 40 ms) beside eff on n1/tpu0
CAM = App("cam", "mobilenet_v2", 60.0, Slo(40.0, "p95"))


def split(w1: float) -> Placement:
    return Placement("cam", (Share("n1/tpu0", w1, "ibis-edgetpu/mobilenet_v2"),
                             Share("n2/tpu0", 1.0 - w1, "ibis-edgetpu/mobilenet_v2")), "n1")


def with_cam(w1: float) -> Snapshot:
    eff = Placement("eff", (Share("n1/tpu0", 1.0, "ibis-edgetpu/efficientnet-S"),), "n1")
    return Snapshot(CLUSTER, {"eff": EFF, "cam": CAM}, {"eff": eff, "cam": split(w1)})


def test_repartition_weights_the_pieces_by_the_room_each_device_has() -> None:
    """Half of cam on the TPU eff shares breaks cam's SLO there; the re-partition takes weight off it, in
    proportion to each device's room, keeps the devices and profiles, and passes the admission check; beyond
    what both devices admit it is a rejection naming the shortfall."""
    pol, snap = get("ibis"), with_cam(0.5)
    assert check_move(pol, CAM, snap, split(0.5)) is not None  # as placed (profiles "turned out slower")
    new = repartition(pol, snap, CAM, split(0.5))
    assert isinstance(new, Placement) and check_move(pol, CAM, snap, new) is None
    w = {s.device: s.weight for s in new.shares}
    assert [(s.device, s.profile) for s in new.shares] == [(s.device, s.profile) for s in split(0.5).shares]
    assert w["n1/tpu0"] < 0.4 < 0.6 < w["n2/tpu0"] and sum(w.values()) == pytest.approx(1.0, abs=1e-12)
    assert shift(split(0.5), new) == pytest.approx(0.5 - w["n1/tpu0"]) and shift(new, new) == 0.0
    # more rate: still both devices, ever more on the idle one; then no room
    faster = repartition(pol, snap, replace(CAM, rate_rps=140.0), split(0.5))
    assert isinstance(faster, Placement) and faster.shares[0].weight < w["n1/tpu0"]
    too_much = repartition(pol, snap, replace(CAM, rate_rps=400.0), split(0.5))
    assert not isinstance(too_much, Placement)
    assert too_much.constraint == "repartition" and "of the 400 req/s it needs" in too_much.message


def test_an_unexplained_hotspot_on_a_split_app_is_relieved_by_new_weights_not_a_move() -> None:
    """eff's SLO is missed on n1/tpu0 with every app within its contract: no over-contract tenant, so Ibis
    has nothing to move, but cam can take weight off n1/tpu0; the step plans that (same devices, nothing
    to load), not twice within the dwell time, and not at all for a shift below repartition_min_shift."""
    pol, snap = get("ibis"), with_cam(0.5)
    hot = {"eff": window("eff", 10.0, 120.0), "cam": window("cam", 60.0, 30.0)}
    res = step(AdaptState(), pol, snap, hot, SET, 0.0)
    assert not res.plan.transitions  # seen once: damped
    res = step(res.state, pol, snap, hot, SET, 5.0)
    (t,) = res.plan.transitions
    assert t.app == "cam" and t.reason.kind == "slo-violated" and t.rate_rps == CAM.rate_rps
    assert {s.device for s in t.placement.shares} == {"n1/tpu0", "n2/tpu0"} and not res.plan.unexplained
    assert t.placement.shares[0].weight < 0.4
    later = step(res.state, pol, snap, hot, SET, 10.0)
    assert not later.plan.transitions and later.held == ()  # dwelling: cam is held (its finding is eff's)
    # a re-partition that moves less than repartition_min_shift is not planned; the hotspot stays unexplained
    strict = replace(SET, repartition_min_shift=0.5)
    res = step(step(AdaptState(), pol, snap, hot, strict, 0.0).state, pol, snap, hot, strict, 5.0)
    assert not res.plan.transitions and [f.kind for f in res.plan.unexplained] == ["slo-violated"]
    # a hotspot on a device without a split app stays unexplained, as before
    solo = colocated()
    slow = {"eff": window("eff", 10.0, 20.0), "mob": window("mob", 10.0, 80.0)}
    res = step(step(AdaptState(), pol, solo, slow, SET, 0.0).state, pol, solo, slow, SET, 5.0)
    assert not res.plan.transitions and res.plan.unexplained


def test_an_over_contract_split_app_is_repartitioned_over_its_own_devices_first() -> None:
    """cam sends 2x its contract: its own two devices can take that with new weights, so the Ibis rule
    re-partitions it there (no model to load) instead of re-admitting it from scratch."""
    pol = get("ibis")
    snap = with_cam(0.25)
    assert check_move(pol, CAM, snap, split(0.25)) is None
    wins = {"cam": window("cam", 120.0, 45.0), "eff": window("eff", 10.0, 20.0)}
    plan = ibis_plan(pol, snap, detect(snap, wins, SET), wins, SET)
    (t,) = plan.transitions
    assert t.app == "cam" and t.rate_rps > 120.0
    assert [s.device for s in t.placement.shares] == ["n1/tpu0", "n2/tpu0"]
    assert t.placement.shares[0].weight < 0.25


def test_reclamation_lowers_a_raised_contract_in_place_never_below_the_declared_one() -> None:
    snap, declared = raised(), {"eff": 10.0, "mob": 10.0}
    wins = {"eff": window("eff", 12.0, 20.0)}
    plan = reclaim_plan(snap, detect(snap, wins, SET, declared=declared), wins, declared, SET)
    (t,) = plan.transitions
    assert t.placement == snap.placements["eff"] and t.reason.kind == "under-contract"
    assert t.rate_rps == pytest.approx(wins["eff"].rate_upper_rps() * 1.1) and 10.0 < t.rate_rps < 30.0
    # silent: back to the declared contract, no lower
    idle = {"eff": window("eff", 0.0, 20.0)}
    (t0,) = reclaim_plan(snap, detect(snap, idle, SET, declared=declared), idle, declared, SET).transitions
    assert t0.rate_rps == 10.0
    assert not reclaim_plan(snap, detect(snap, wins, SET, declared=declared), wins, declared, SET,
                            exclude=frozenset({"eff"})).transitions


def test_the_loop_reclaims_after_trigger_windows_and_not_within_the_dwell() -> None:
    pol, snap, declared = get("ibis"), raised(), {"eff": 10.0, "mob": 10.0}
    quiet = {"eff": window("eff", 12.0, 20.0), "mob": window("mob", 10.0, 15.0)}
    r1 = step(AdaptState(), pol, snap, quiet, SET, now_s=5.0, declared=declared)
    assert not r1.plan.transitions and [f.kind for f in r1.findings] == ["under-contract"]
    r2 = step(r1.state, pol, snap, quiet, SET, now_s=10.0, declared=declared)
    (t,) = r2.plan.transitions
    assert t.app == "eff" and t.placement == snap.placements["eff"] and r2.state.last_move_s == {"eff": 10.0}
    moved = AdaptState(r1.state.streaks, {"eff": 0.0})  # moved at 0 s: dwelling until 60 s
    assert not step(moved, pol, snap, quiet, SET, now_s=10.0, declared=declared).plan.transitions
    assert not step(r1.state, pol, snap, quiet, SET, now_s=10.0).plan.transitions  # no declared: no reclaim


# ------------------------------------------------------------------------------------------------- loop


def test_a_finding_must_persist_for_trigger_windows_then_the_app_dwells() -> None:
    pol, snap, state = get("ibis"), colocated(), AdaptState()
    r1 = step(state, pol, snap, surge(0.0), SET, now_s=5.0)
    assert not r1.plan.transitions and r1.findings and not r1.acted  # seen once: not yet
    r2 = step(r1.state, pol, snap, surge(5.0), SET, now_s=10.0)
    (t,) = r2.plan.transitions
    assert t.app == "eff" and r2.state.last_move_s == {"eff": 10.0}
    # the same surge seen again before the dwell time is over (as if the move had not helped): no new move
    r3 = step(r2.state, pol, snap, surge(10.0), SET, now_s=15.0)
    r4 = step(r3.state, pol, snap, surge(15.0), SET, now_s=20.0)
    assert not r3.plan.transitions and not r4.plan.transitions and r4.held == ("eff",)
    # a calm window breaks the streak
    r5 = step(r1.state, pol, snap, calm(5.0), SET, now_s=10.0)
    assert not r5.findings and r5.state.streaks == {}


def test_a_noisy_load_moves_an_app_at_most_once_per_dwell_time() -> None:
    """An app whose rate wanders around its contract for an hour of 5 s windows: the moves the loop plans
    are at least ``min_dwell_s`` apart, and the whole hour plans at most 3600 / min_dwell_s of them."""
    rng = np.random.default_rng(7)
    pol, snap, state = get("ibis"), colocated(), AdaptState()
    moves: list[float] = []
    for i in range(720):
        t0 = 5.0 * i
        rate = float(rng.choice([9.0, 30.0]))  # half the windows a surge, at random
        wins = {"eff": window("eff", rate, 40.0, t0), "mob": window("mob", 10.0, 65.0 if rate > 20 else 15.0, t0)}
        r = step(state, pol, snap, wins, SET, now_s=t0 + 5.0)
        state = r.state
        moves += [t0 + 5.0 for t in r.plan.transitions if t.app == "eff"]
    assert moves and all(b - a >= SET.min_dwell_s for a, b in zip(moves, moves[1:]))
    assert len(moves) <= 3600 / SET.min_dwell_s


# ------------------------------------------------------------------------------------------ evacuation


def dead(node: str, now_s: float = 100.0) -> dict[str, float]:
    """last_seen_s with ``node`` silent for 20 s (over dead_after_s, 15 s) and the other node just heard."""
    return {n.name: (now_s - 20.0 if n.name == node else now_s - 1.0) for n in CLUSTER.nodes}


def test_a_dead_nodes_apps_are_replaced_at_once_beyond_the_dwell_and_the_move_limit() -> None:
    """Both apps on n1, n1's agent silent: the first step re-places both on n2 (12 MB holds both models, each
    at its contract within its SLO there), though eff is in its dwell time and the step limit is one move."""
    pol, snap = get("ibis"), colocated()
    state = AdaptState(last_move_s={"eff": 90.0})
    r = step(state, pol, snap, calm(95.0), SET, now_s=100.0, last_seen_s=dead("n1"))
    assert sorted(t.app for t in r.plan.transitions) == ["eff", "mob"] and not r.plan.refused
    for t in r.plan.transitions:
        assert [s.device for s in t.placement.shares] == ["n2/tpu0"] and t.reason.kind == "agent-dead"
        assert t.rate_rps == snap.apps[t.app].rate_rps and t.reason.node == "n1"
    after = snap.without("eff").without("mob")
    for t in r.plan.transitions:  # each move passes admission with the other already there
        assert check_move(pol, snap.apps[t.app], after, t.placement) is None
        after = after.with_placement(snap.apps[t.app], t.placement)
    # an app with a move in flight is left alone: the snapshot still shows it where it was
    busy = step(AdaptState(), pol, snap, calm(95.0), SET, now_s=100.0, last_seen_s=dead("n1"),
                busy=frozenset({"mob"}))
    assert [t.app for t in busy.plan.transitions] == ["eff"]


def test_nothing_is_moved_onto_a_dead_node() -> None:
    """A surge that would move eff to n2 (test_ibis_rule_...) while n2 is dead: no transition to n2; eff has
    no room on the live cluster, and the refusal says so."""
    pol, snap = get("ibis"), colocated()
    r1 = step(AdaptState(), pol, snap, surge(90.0), SET, now_s=95.0, last_seen_s=dead("n2", 95.0))
    r2 = step(r1.state, pol, snap, surge(95.0), SET, now_s=100.0, last_seen_s=dead("n2"))
    assert all(s.device != "n2/tpu0" for t in r2.plan.transitions for s in t.placement.shares)
    assert not r2.plan.transitions and [r.app for r in r2.plan.refused] == ["eff"]
    # n2 alive: the same surge moves eff there (the control for the check above)
    alive = {"n1": 99.0, "n2": 99.0}
    r3 = step(step(AdaptState(), pol, snap, surge(90.0), SET, now_s=95.0, last_seen_s=alive).state, pol, snap,
              surge(95.0), SET, now_s=100.0, last_seen_s=alive)
    assert [s.device for t in r3.plan.transitions for s in t.placement.shares] == ["n2/tpu0"]


def test_a_split_app_losing_a_piece_is_reweighted_onto_its_live_device() -> None:
    """cam split over n1 and n2 (alone), n2 dead: its live piece on n1 takes the whole rate (nothing to load),
    within its SLO there; the live snapshot kept the live piece's load as it was."""
    pol, snap = get("ibis"), Snapshot(CLUSTER, {"cam": CAM}, {"cam": split(0.5)})
    live, affected = live_snapshot(snap, frozenset({"n2"}))
    assert affected == ("cam",) and list(live.cluster.devices) == ["n1/tpu0"]
    assert live.apps["cam"].rate_rps == pytest.approx(30.0)
    assert live.load("n1/tpu0").work == pytest.approx(snap.load("n1/tpu0").work)
    (f,) = [f for f in detect(snap, {}, SET, now_s=100.0, last_seen_s=dead("n2")) if f.kind == "agent-dead"]
    plan, after = evacuate_plan(pol, snap, [f])
    (t,) = plan.transitions
    assert t.app == "cam" and [(s.device, s.weight) for s in t.placement.shares] == [("n1/tpu0", 1.0)]
    assert transition_kind(snap.placements["cam"], t.placement) == "repartitioned"
    assert check_move(pol, CAM, snap.without("cam"), t.placement) is None and "n2/tpu0" not in after.cluster.devices


def test_an_app_no_live_device_takes_stays_with_the_rejection_as_data() -> None:
    """eff alone on n1, n1 dead, n2's TPU too small for EfficientNet-S (4 of 6.56 MB): refused, naming memory."""
    small = Cluster((Node("n1", 4, 4096, (tpu("n1"),)),
                     Node("n2", 4, 4096, (replace(tpu("n2"), memory_mb=4.0),))))
    pl = {"eff": Placement("eff", (Share("n1/tpu0", 1.0, "ibis-edgetpu/efficientnet-S"),), "n1")}
    snap = Snapshot(small, {"eff": EFF}, pl)
    (f,) = detect(snap, {}, SET, now_s=100.0, last_seen_s=dead("n1"))
    plan, _ = evacuate_plan(get("ibis"), snap, [f])
    (r,) = plan.refused
    assert not plan.transitions and r.app == "eff" and r.reason.node == "n1" and "memory" in r.rejection.message
