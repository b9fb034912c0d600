"""perf.gpu: time-sharing bounds and per-app estimate, Ibis Eq. 8 and Eq. 10 errors, MPS, batching."""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgemux.cluster.workload import Arrival, BatchLaw, Tenant
from edgemux.perf.gpu import (
    batch_law_for,
    batch_responses,
    batch_single_model,
    gpu_fcfs_responses,
    gpu_ps_responses,
    ibis_eq8_error,
    ibis_mps_responses,
    ibis_ps_responses,
    mps_responses,
    timeshare_bounds,
    timeshare_responses,
    timeshare_independent_responses,
    lowest_priority_bound,
)
from edgemux.perf.queueing import md1_response, mg1_response, mm1_response
from edgemux.perf.result import Unstable
from edgemux.profiles.distributions import Deterministic, Exponential, bimodal


def T(name: str, rps: float, service, model: str | None = None, batch: BatchLaw | None = None) -> Tenant:
    return Tenant(name, model or name, Arrival.poisson(rps), service, batch=batch)


# ------------------------------------------------------------------ PS, Eq. 8
def test_eq8_example_from_docstring() -> None:
    ts = [T("short", 10.0, Deterministic(5.0)), T("long", 10.0, Deterministic(45.0))]  # rho = 0.5
    assert gpu_ps_responses(ts) == pytest.approx([10.0, 90.0])
    assert ibis_ps_responses(ts) == pytest.approx([30.0, 70.0])
    assert ibis_eq8_error(ts) == pytest.approx([20.0, -20.0])


@settings(max_examples=50)
@given(st.lists(st.tuples(st.floats(0.1, 40.0), st.floats(0.5, 40.0)), min_size=1, max_size=5), st.floats(0.01, 0.95))
def test_eq8_error_closed_form(spec, rho: float) -> None:
    work = sum(r * m for r, m in spec) / 1000.0
    ts = [T(f"t{i}", r * rho / work, Exponential(m)) for i, (r, m) in enumerate(spec)]
    lam = sum(t.rate_rps for t in ts)
    mean = sum(t.rate_rps * t.service.mean for t in ts) / lam
    err = ibis_eq8_error(ts)
    for t, e in zip(ts, err):
        assert e == pytest.approx(rho * (mean - t.service.mean) / (1 - rho), rel=1e-9, abs=1e-9)
    # Eq. 8 is right on the rate-weighted average
    assert sum(t.rate_rps * e for t, e in zip(ts, err)) / lam == pytest.approx(0.0, abs=1e-7 * mean / (1 - rho))


def test_eq8_error_at_rho_one_where_only_the_exact_side_is_unstable() -> None:
    # rho = 1 up to rounding: Eq. 7's aggregate arithmetic lands just below 1 (a finite, huge wait) while the
    # per-class sum reaches 1, so the error is Unstable (it used to raise TypeError on float - Unstable)
    ts = [T("a", 33.3, Deterministic(7.154285578057881)), T("b", 117, Deterministic(6.465674888255265)),
          T("c", 0.7000000000000001, Deterministic(7.540469035437982))]
    assert all(isinstance(e, Unstable) for e in gpu_ps_responses(ts))
    assert not any(isinstance(p, Unstable) for p in ibis_ps_responses(ts))
    err = ibis_eq8_error(ts)
    assert len(err) == 3 and all(isinstance(e, Unstable) for e in err)


def test_identical_tenants_eq8_exact() -> None:
    ts = [T(f"t{i}", 20.0, Exponential(10.0)) for i in range(3)]
    assert ibis_ps_responses(ts) == pytest.approx(gpu_ps_responses(ts))


# ------------------------------------------------------------------ time sharing
def test_timeshare_one_app_is_mg1_fcfs() -> None:
    ts = [T("a", 60.0, bimodal(5.0, 55.0, 0.1))]
    s = ts[0].service
    assert timeshare_responses(ts) == pytest.approx([mg1_response(60.0, 10.0, s.var + 100.0)])
    assert timeshare_bounds(ts)[0][0] == pytest.approx(timeshare_responses(ts)[0])


@given(st.integers(1, 6), st.floats(0.01, 0.97))
def test_timeshare_identical_exponential_apps(k: int, rho: float) -> None:
    """The point estimate is exact here (M/M/1); the admission bound is at least that."""
    ts = [T(f"t{i}", 1000.0 * rho / 10.0 / k, Exponential(10.0)) for i in range(k)]
    exact = mm1_response(1000.0 * rho / 10.0, 10.0)
    for r, b in zip(timeshare_independent_responses(ts), timeshare_responses(ts)):
        assert r == pytest.approx(exact, rel=1e-9)
        assert b >= exact * (1 - 1e-12)


def test_lowest_priority_bound_matches_priority_formula() -> None:
    """Two exponential classes, the second as lowest preemptive priority (Kleinrock): with rho_1 = 0.3,
    rho_2 = 0.4, S = 10 ms each, E[R_2] = S/(1-rho_1) + R/((1-rho_1)(1-rho)), R = sum lam E[S^2]/2."""
    ts = [T("hi", 30.0, Exponential(10.0)), T("lo", 40.0, Exponential(10.0))]
    residual = (0.03 * 200.0 + 0.04 * 200.0) / 2.0
    assert lowest_priority_bound(ts)[1] == pytest.approx(10.0 / 0.7 + residual / (0.7 * 0.3))
    # one app: the bound is P-K itself
    one = [T("a", 60.0, bimodal(5.0, 55.0, 0.1))]
    assert lowest_priority_bound(one) == pytest.approx(timeshare_independent_responses(one))


def test_timeshare_bounds_and_unstable() -> None:
    ts = [T("a", 20.0, Deterministic(10.0)), T("b", 20.0, Deterministic(30.0))]  # rho 0.8
    (f1, p1), (f2, p2) = timeshare_bounds(ts)
    assert (f1, f2) == pytest.approx(gpu_fcfs_responses(ts))
    assert (p1, p2) == pytest.approx([50.0, 150.0])
    hot = [T("a", 60.0, Deterministic(10.0)), T("b", 20.0, Deterministic(30.0))]
    assert all(isinstance(x, Unstable) for x in timeshare_responses(hot) + gpu_ps_responses(hot))


def test_timeshare_dominant_app_saturates_before_rho_one() -> None:
    """In the independent point estimate a dominant app saturates before rho = 1; the bound stays finite."""
    ts = [T("big", 80.0, Exponential(10.0)), T("small", 19.0, Exponential(10.0))]  # rho = 0.99
    r = timeshare_independent_responses(ts, where="gpu0")
    assert isinstance(r[0], Unstable) and "big" in r[0].where
    assert not isinstance(r[1], Unstable)
    assert all(not isinstance(x, Unstable) for x in timeshare_responses(ts))


def test_point_estimate_runs_low_on_a_mixed_device_and_the_bound_does_not() -> None:
    """The Ibis-like mix at rho = 0.8 (a 10.8 ms app beside 190 and 408 ms apps): the simulated mean of the
    light app is above the independent point estimate beyond the CI, and below the admission bound."""
    from edgemux.cluster.workload import DeviceSpec, Discipline
    from edgemux.experiments.validation import ibis_like_mix
    from edgemux.profiles.types import DeviceKind
    from edgemux.sim.run import simulate_device

    ts = ibis_like_mix(0.8)
    dev = DeviceSpec("gpu0", DeviceKind.GPU_EMBEDDED, Discipline.GPU_TIMESHARE)
    sim = simulate_device(dev, ts, requests=60_000, replications=6, seed=3).tenants
    point, bound = timeshare_independent_responses(ts), timeshare_responses(ts)
    light = 3
    assert sim[ts[light].name].mean_ms.lo > point[light]
    for t, b in zip(ts, bound):
        assert b >= sim[t.name].mean_ms.lo


# ------------------------------------------------------------------ MPS
def test_mps_exact_and_eq10() -> None:
    ts = [T("a", 50.0, Exponential(10.0)), T("b", 50.0, Exponential(10.0))]  # a = 1, c = 2, rho = 0.5
    assert mps_responses(ts, 2.0) == pytest.approx([10.0 / 0.75] * 2)
    assert ibis_mps_responses(ts, 2.0) == pytest.approx([20.0, 20.0])
    het = [T("a", 50.0, Exponential(4.0)), T("b", 50.0, Exponential(16.0))]
    r = mps_responses(het, 1.65)
    assert r[1] / r[0] == pytest.approx(4.0)


# ------------------------------------------------------------------ batching
def batch_sim(groups: list[tuple[float, float, float]], B: int, tau: float, n: int, seed: int) -> list[float]:
    """Independent oracle: the batching discipline simulated request by request.

    groups: (rate per ms, k1, k2) per model. When the device is free, a model's queue is ready once it
    holds B requests or its oldest waited tau; among ready queues the oldest head goes first."""
    rng = np.random.default_rng(seed)
    lam = sum(g[0] for g in groups)
    horizon = n / lam
    parts = []
    for gi, (lg, _, _) in enumerate(groups):
        t = np.cumsum(rng.exponential(1.0 / lg, int(lg * horizon * 1.3) + 50))
        t = t[t < horizon]
        parts.append(np.stack([t, np.full(t.size, gi)], 1))
    a = np.concatenate(parts)
    a = a[np.argsort(a[:, 0], kind="stable")]
    times, gid = a[:, 0].tolist(), a[:, 1].astype(int).tolist()
    qs: list[deque[float]] = [deque() for _ in groups]
    free_at, i, warm = 0.0, 0, 0.1 * horizon
    resp: list[list[float]] = [[] for _ in groups]
    while i < len(times) or any(qs):
        best = None
        for g, q in enumerate(qs):
            if q:
                ready = q[B - 1] if len(q) >= B else q[0] + tau
                key = (max(free_at, ready), q[0])
                if best is None or key < best[0]:
                    best = (key, g)
        nxt = times[i] if i < len(times) else math.inf
        if best is not None and best[0][0] <= nxt:
            start, g = best[0][0], best[1]
            b = min(B, len(qs[g]))
            done = start + b * groups[g][1] + groups[g][2]
            for _ in range(b):
                t0 = qs[g].popleft()
                if t0 > warm:
                    resp[g].append(done - t0)
            free_at = done
        else:
            qs[gid[i]].append(times[i])
            i += 1
    return [float(np.mean(r)) for r in resp]


@pytest.mark.parametrize("B,tau,rho", [(4, 10.0, 0.3), (4, 10.0, 0.8), (8, 2.0, 0.6), (4, 0.0, 0.9), (2, 50.0, 0.5)])
def test_batch_chain_against_simulation(B: int, tau: float, rho: float) -> None:
    k1, k2 = 2.0, 8.0
    lam = rho / (k1 + k2 / B)  # utilization at full batches
    est = batch_single_model(1000.0 * lam, BatchLaw(k1, k2), B, tau)
    sim = batch_sim([(lam, k1, k2)], B, tau, n=60_000, seed=5)[0]
    assert est.response_ms == pytest.approx(sim, rel=0.03)
    assert 1.0 <= est.mean_batch <= B and sum(est.batch_pmf) == pytest.approx(1.0)
    assert 0.0 < est.utilization < 1.0


@given(st.floats(0.01, 0.97), st.floats(0.0, 30.0), st.floats(0.5, 5.0), st.floats(0.5, 20.0))
@settings(max_examples=25, deadline=None)
def test_batch_of_one_is_md1(rho: float, tau: float, k1: float, k2: float) -> None:
    lam_rps = 1000.0 * rho / (k1 + k2)
    est = batch_single_model(lam_rps, BatchLaw(k1, k2), 1, tau)
    assert est.response_ms == pytest.approx(md1_response(lam_rps, k1 + k2), rel=1e-7)


def test_batch_idle_and_unstable() -> None:
    law = BatchLaw(2.0, 8.0)
    assert batch_single_model(0.0, law, 4, 10.0).response_ms == pytest.approx(20.0)  # waits tau, runs alone
    assert batch_single_model(0.0, law, 1, 10.0).response_ms == pytest.approx(10.0)
    # full batches of 4 take 16 ms: 4 requests per 16 ms is the most it can take
    r = batch_single_model(250.0, law, 4, 10.0)
    assert isinstance(r, Unstable) and r.rho == pytest.approx(1.0)
    assert not isinstance(batch_single_model(240.0, law, 4, 10.0), Unstable)


def test_batch_law_defaults() -> None:
    t = T("a", 10.0, Deterministic(7.0))
    assert batch_law_for([t]) == BatchLaw(7.0, 0.0)
    u = T("b", 30.0, Deterministic(7.0), model="a", batch=BatchLaw(1.0, 4.0))
    law = batch_law_for([t, u])
    assert (law.k1_ms, law.k2_ms) == pytest.approx((0.25 * 7 + 0.75 * 1, 0.75 * 4))


def test_batch_two_models_against_simulation() -> None:
    law = BatchLaw(2.0, 8.0)
    lam = 0.5 / 4.0 / 2  # two models, rho(full batches) = 0.5
    ts = [T("a", 1000 * lam, Deterministic(10.0), batch=law), T("b", 1000 * lam, Deterministic(10.0), batch=law)]
    est, u = batch_responses(ts, 4, 10.0)
    sim = batch_sim([(lam, 2.0, 8.0), (lam, 2.0, 8.0)], 4, 10.0, n=60_000, seed=9)
    for e, s in zip(est, sim):
        assert e == pytest.approx(s, rel=0.08)
    assert 0.5 < u < 1.0
    alone = batch_single_model(1000 * lam, law, 4, 10.0).response_ms
    assert est[0] > alone


def test_batch_responses_one_model_shared_by_tenants() -> None:
    law = BatchLaw(2.0, 8.0)
    ts = [T("a", 50.0, Deterministic(10.0), model="m", batch=law),
          T("b", 100.0, Deterministic(10.0), model="m", batch=law)]
    est, u = batch_responses(ts, 4, 10.0)
    one = batch_single_model(150.0, law, 4, 10.0)
    assert est == pytest.approx([one.response_ms] * 2)
    assert u == pytest.approx(one.utilization)
    hot, _ = batch_responses([T("a", 300.0, Deterministic(10.0), batch=law)], 4, 10.0)
    assert isinstance(hot[0], Unstable)


def test_poisson_formulas_are_scipys_exactly() -> None:
    """``perf.gpu.poisson_pmf``/``poisson_sf`` are scipy.stats.poisson's own formulas without its per-call
    checks: equal to it element for element, edge cases (mu = 0, k far in the tail, large mu) included."""
    from scipy.stats import poisson

    from edgemux.perf.gpu import poisson_pmf, poisson_sf

    rng = np.random.default_rng(7)
    mus = np.concatenate([[0.0, 1e-12, 0.5, 1.0, 30.0, 400.0], rng.exponential(20.0, 200)])
    ks = np.arange(0, 120)
    assert np.array_equal(poisson_pmf(ks[None, :], mus[:, None]), poisson.pmf(ks[None, :], mus[:, None]))
    for m in (0, 1, 3, 17, 64):
        assert np.array_equal(poisson_sf(m, mus), poisson.sf(m, mus))
