"""The spatial-share discipline (Dhakal et al. §IV): share curves, the knee, the M/G/k estimator, Multi-Model,
and the simulator's station, against closed forms, hand-computed cases and each other."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgemux.cluster.workload import Arrival, DeviceSpec, Discipline, Tenant, check_shares
from edgemux.perf.device import device_utilization, predict_device
from edgemux.perf.result import Unstable
from edgemux.perf.spatial import (
    SpatialPlan,
    at_share,
    check_curve,
    knee,
    latency_at,
    mgk_quantiles,
    mgk_response,
    multi_model,
    slowdown,
)
from edgemux.profiles.distributions import Deterministic, Exponential, Scaled
from edgemux.profiles.types import DeviceKind
from edgemux.sim.engine import Engine
from edgemux.sim.devices import SpatialStation
from edgemux.sim.run import simulate_device

CURVE = check_curve([(1.0, 10.0), (0.25, 14.0), (0.5, 10.8)])
SPATIAL = DeviceSpec("gpu0", DeviceKind.GPU_DISCRETE, Discipline.SPATIAL)


def test_curve_sorted_and_interpolated():
    assert CURVE == ((0.25, 14.0), (0.5, 10.8), (1.0, 10.0))
    assert latency_at(CURVE, 0.375) == pytest.approx(12.4)
    assert latency_at(CURVE, 1.0) == 10.0
    assert slowdown(CURVE, 0.25) == pytest.approx(1.4)
    # the knee: smallest share within 10 % of the latency at the largest share
    assert knee(CURVE) == 0.5
    assert knee(CURVE, tolerance=0.5) == 0.25
    assert knee(CURVE, tolerance=0.0) == 1.0


def test_dhakal_mobilenet_points_pass_as_noise():
    # papers/002 line 88: 1.003 ms at 15 %, 1.023 ms at 100 %: +2 % the "wrong" way, within the allowance
    curve = check_curve([(0.15, 1.003), (1.0, 1.023)])
    assert knee(curve) == 0.15


@pytest.mark.parametrize("points, needle", [
    ([], "at least one"),
    ([(0.0, 5.0)], "share must be in (0, 1]"),
    ([(1.2, 5.0)], "share must be in (0, 1]"),
    ([(0.5, 0.0)], "latency must be a finite number > 0"),
    ([(0.5, math.nan)], "latency must be a finite number > 0"),
    ([(0.5, 5.0), (0.5, 4.0)], "appears twice"),
    ([(0.25, 10.0), (1.0, 12.0)], "must not increase with share"),
])
def test_bad_curves_are_refused(points, needle):
    with pytest.raises(ValueError, match=None) as e:
        check_curve(points, where="profile x")
    assert needle in str(e.value) and "profile x" in str(e.value)


def test_latency_below_the_profiled_range_is_refused():
    with pytest.raises(ValueError, match="below the profiled range"):
        latency_at(CURVE, 0.1)
    with pytest.raises(ValueError, match=r"share must be in \(0, 1\]"):
        latency_at(CURVE, 1.5)
    # no curve: the conservative 1/share stretch
    assert slowdown((), 0.25) == 4.0


@pytest.mark.parametrize("share, instances", [(0.0, 1), (1.01, 1), (math.nan, 1), (0.5, 0), (0.5, 1.5), (0.5, True)])
def test_tenant_refuses_bad_share_or_instances(share, instances):
    with pytest.raises(ValueError, match="share must be in|instances must be an integer"):
        Tenant("a", "m", Arrival.poisson(1.0), Deterministic(1.0), share=share, instances=instances)


def test_more_instances_than_the_device_holds():
    ts = [Tenant("a", "m", Arrival.poisson(10.0), Deterministic(5.0), share=0.25, instances=3),
          Tenant("b", "n", Arrival.poisson(10.0), Deterministic(5.0), share=0.5)]
    for call in (lambda: predict_device(SPATIAL, ts), lambda: simulate_device(SPATIAL, ts, requests=100),
                 lambda: check_shares(ts, where="gpu0")):
        with pytest.raises(ValueError, match=r"hold 1.25 of the device.*a 3 x 0.25, b 1 x 0.5"):
            call()


def test_mmk_closed_forms():
    # M/M/2, lambda = 0.15/ms, E[S] = 10 ms: a = 1.5, C(2, 1.5) = 0.642857, W = C / (2 mu - lambda) = 12.857 ms
    assert mgk_response(150.0, Exponential(10.0), 2) == pytest.approx(22.857142857, rel=1e-9)
    # M/M/1 quantile: R ~ Exp(mu - lambda): p95 = ln(20) / (0.1 - 0.05) = 59.915 ms
    p95, p99 = mgk_quantiles(50.0, Exponential(10.0), 1)
    assert p95 == pytest.approx(math.log(20) / 0.05, rel=2e-3)
    assert p99 == pytest.approx(math.log(100) / 0.05, rel=2e-3)
    # M/M/2 response-time tail: P(R > t) = e^{-mu t} (1 + C mu / (mu - (2 mu - lambda)) (1 - e^{-(mu - 2mu + lam) t}))
    mu, lam, c = 0.1, 0.15, 0.6428571428571429
    d = 2 * mu - lam

    def tail(t):
        return math.exp(-mu * t) + c * mu / (mu - d) * (math.exp(-d * t) - math.exp(-mu * t))
    p95_2 = mgk_quantiles(150.0, Exponential(10.0), 2, (0.95,))[0]
    assert tail(p95_2) == pytest.approx(0.05, rel=2e-2)
    assert isinstance(mgk_response(250.0, Exponential(10.0), 2), Unstable)
    with pytest.raises(ValueError, match="instances must be an integer"):
        mgk_response(1.0, Exponential(10.0), 0)


def test_estimate_agrees_with_simulation_and_utilization():
    ts = [Tenant("a", "m", Arrival.poisson(150.0), Exponential(10.0), share=0.25, instances=2),
          Tenant("b", "n", Arrival.poisson(40.0), Deterministic(12.0), share=0.5)]
    est = predict_device(SPATIAL, ts)
    sim = simulate_device(SPATIAL, ts, requests=60_000, replications=5, seed=3).tenants
    for t in ts:
        ci = sim[t.name].mean_ms
        assert abs(est[t.name].mean_ms - ci.value) <= max(3 * ci.half_width, 0.03 * ci.value)
    # b is an M/D/1 alone on its share: exact, whatever a does
    assert est["b"].mean_ms == pytest.approx(12.0 + 0.04 * 144.0 / (2 * (1 - 0.48)))
    assert device_utilization(SPATIAL, ts) == pytest.approx(0.75)
    assert "spatial shares" in est["a"].method and "Lee-Longton" in est["a"].method


def test_isolation_a_flood_on_one_share_leaves_the_other_alone():
    quiet = Tenant("q", "n", Arrival.poisson(40.0), Deterministic(12.0), share=0.5)
    for load in (10.0, 190.0):
        ts = [Tenant("a", "m", Arrival.poisson(load), Exponential(10.0), share=0.25, instances=2), quiet]
        assert predict_device(SPATIAL, ts)["q"].mean_ms == pytest.approx(predict_device(SPATIAL, [quiet])["q"].mean_ms)


def test_station_hand_computed():
    # tenant 0 has two instances, tenant 1 one; requests (arrival ms, tenant, service ms)
    arrivals = [(0.0, 0, 10.0), (1.0, 0, 10.0), (2.0, 0, 10.0), (3.0, 1, 4.0), (4.0, 1, 4.0)]
    eng, done = Engine(), {}
    st = SpatialStation(eng, lambda now, r: done.__setitem__(r, now), [s for _, _, s in arrivals],
                        [t for _, t, _ in arrivals], [2, 1])
    for i, (a, _, _) in enumerate(arrivals):
        eng.schedule(a, 0, st.arrive, i)
    eng.run()
    # 0 and 1 start at once; 2 waits for the first free instance (10); tenant 1 never waits for tenant 0
    assert done == {0: 10.0, 1: 11.0, 2: 20.0, 3: 7.0, 4: 11.0}
    assert st.busy_start == [0.0] and st.busy_end == [20.0]


def test_scaled_distribution_moments_and_lattice():
    d = Scaled(Exponential(4.0), 2.5)
    assert d.mean == 10.0 and d.var == pytest.approx(100.0)
    x = d.sample(np.random.default_rng(0), 200_000)
    assert x.mean() == pytest.approx(10.0, rel=0.01)
    m = d.lattice(0.5, 2000)
    assert m.sum() == pytest.approx(1.0) and float(np.dot(m, np.arange(2000) * 0.5)) == pytest.approx(10.0, rel=0.03)
    with pytest.raises(ValueError, match="scale factor"):
        Scaled(Exponential(1.0), 0.0)


def test_at_share_stretches_service():
    t = Tenant("a", "m", Arrival.poisson(10.0), Deterministic(10.0))
    s = at_share(t, CURVE, 0.25, 3)
    assert s.service.mean == pytest.approx(14.0) and (s.share, s.instances) == (0.25, 3)
    assert at_share(t, CURVE, 1.0).service is t.service


def test_multi_model_smallest_share_then_instances():
    t = Tenant("a", "m", Arrival.poisson(120.0), Exponential(10.0))
    plan = multi_model(t, CURVE, slo_ms=30.0)
    # never below the knee (0.5), and 2 instances at 0.5 carry 120 req/s within a 30 ms mean (one is unstable)
    assert isinstance(plan, SpatialPlan) and (plan.share, plan.instances) == (0.5, 2)
    assert plan.latency_ms == pytest.approx(mgk_response(120.0, Exponential(10.8), 2))
    assert plan.used == 1.0
    # a lower rate needs a single instance at the knee
    one = multi_model(Tenant("a", "m", Arrival.poisson(40.0), Exponential(10.0)), CURVE, slo_ms=30.0)
    assert isinstance(one, SpatialPlan) and (one.share, one.instances) == (0.5, 1)
    # not enough room: a reason, not a plan
    why = multi_model(t, CURVE, slo_ms=30.0, available=0.5)
    assert isinstance(why, str) and "cannot carry 120 req/s" in why
    assert "no share" in multi_model(t, CURVE, slo_ms=5.0)  # type: ignore[operator]
    with pytest.raises(ValueError, match="stat must be"):
        multi_model(t, CURVE, slo_ms=30.0, stat="p90")
    with pytest.raises(ValueError, match="available share"):
        multi_model(t, CURVE, slo_ms=30.0, available=0.0)
