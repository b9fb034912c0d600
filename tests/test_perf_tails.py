"""perf.tails: P-K transform inversion against closed forms and a Lindley simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgemux.cluster.workload import Arrival, Tenant
from edgemux.perf.edgetpu import service_mixture, tenant_service
from edgemux.perf.result import Unstable
from edgemux.perf.tails import (
    edgetpu_response_quantiles,
    lundberg_exponent,
    md1_waiting_cdf,
    mg1_response_distribution,
    mg1_response_quantiles,
    mg1_waiting_distribution,
    mm1_response_quantile,
)
from edgemux.profiles.distributions import Deterministic, Exponential, Gamma, bimodal


@pytest.mark.parametrize("rho", [0.1, 0.3, 0.7, 0.9, 0.95, 0.99])
def test_mm1_quantiles(rho: float) -> None:
    lam = 1000.0 * rho / 10.0
    qs = (0.5, 0.95, 0.99, 0.999)
    got = mg1_response_quantiles(lam, Exponential(10.0), qs=qs)
    for q, g in zip(qs, got):
        assert g == pytest.approx(mm1_response_quantile(lam, 10.0, q), rel=5e-3)


@pytest.mark.parametrize("rho", [0.3, 0.5, 0.8, 0.95])
def test_md1_waiting_cdf_matches_erlang(rho: float) -> None:
    lam = 1000.0 * rho / 10.0
    w = mg1_waiting_distribution(lam, Deterministic(10.0))
    for t in (0.0, 3.0, 10.0, 17.5, 40.0, 100.0, 250.0):
        assert w.cdf(t) == pytest.approx(md1_waiting_cdf(lam, 10.0, t), abs=1e-3)
    assert w.mean == pytest.approx(rho / (1 - rho) * 5.0, rel=1e-3)


def test_md1_cdf_closed_form_sanity() -> None:
    assert md1_waiting_cdf(50.0, 10.0, 0.0) == pytest.approx(0.5)
    # high rho and long t: the alternating sum needs the extra digits; CDF is monotone and below 1
    vals = [md1_waiting_cdf(95.0, 10.0, t) for t in (100.0, 400.0, 1000.0, 2000.0)]
    assert all(0 < a < b <= 1.0 for a, b in zip(vals, vals[1:]))
    assert vals[-1] > 0.999


def test_waiting_mean_is_pk_for_gamma() -> None:
    s = Gamma(8.0, 2.5)
    lam = 1000.0 * 0.75 / 8.0
    w = mg1_waiting_distribution(lam, s)
    pk = (lam / 1000.0) * (s.var + 64.0) / (2 * 0.25)
    assert w.mean == pytest.approx(pk, rel=2e-3)


def test_lundberg_exponent_mm1() -> None:
    # for exponential service theta = mu - lam
    assert lundberg_exponent(50.0, Exponential(10.0)) == pytest.approx(0.05, rel=1e-2)


def test_unstable_and_idle() -> None:
    assert all(isinstance(x, Unstable) for x in mg1_response_quantiles(100.0, Deterministic(10.0)))
    # no traffic: the response is the service time itself
    q = mg1_response_quantiles(0.0, Deterministic(10.0), qs=(0.5, 0.99))
    assert q == pytest.approx([10.0, 10.0], abs=0.01)
    r = mg1_response_distribution(0.0, Exponential(5.0))
    assert r.quantile(0.99) == pytest.approx(5.0 * math.log(100.0), rel=2e-3)


def _lindley(services: np.ndarray, gaps: np.ndarray) -> np.ndarray:
    """Response times of FCFS given service times and inter-arrival gaps (ms)."""
    w = 0.0
    out = np.empty(services.size)
    for i in range(services.size):
        out[i] = w + services[i]
        w = max(0.0, out[i] - gaps[i])
    return out


def test_bimodal_tail_against_lindley_simulation() -> None:
    s = bimodal(5.0, 55.0, 0.1)  # mean 10 ms, scv 2.25
    lam = 70.0  # rho = 0.7
    rng = np.random.default_rng(7)
    n = 400_000
    r = _lindley(s.sample(rng, n), rng.exponential(1000.0 / lam, n))[20_000:]
    p95, p99 = mg1_response_quantiles(lam, s)
    assert p95 == pytest.approx(float(np.quantile(r, 0.95)), rel=0.03)
    assert p99 == pytest.approx(float(np.quantile(r, 0.99)), rel=0.03)


def test_edgetpu_tails_tagged_tenant() -> None:
    ts = [Tenant("a", "m1", Arrival.poisson(15.0), Deterministic(20.0), switch_ms=10.0),
          Tenant("b", "m2", Arrival.poisson(45.0), Deterministic(5.0), switch_ms=4.0)]
    q = edgetpu_response_quantiles(ts, (0.5, 0.95, 0.99))
    # each tenant's tail = same W convolved with its own (switch-mixture) service
    for t, row in zip(ts, q):
        ref = mg1_response_quantiles(60.0, service_mixture(ts), tenant_service(t, ts), qs=(0.5, 0.95, 0.99))
        assert row == pytest.approx(ref, rel=1e-4)  # same method; grids differ slightly
        assert row[0] <= row[1] <= row[2]
    assert q[0][1] > q[1][1]  # the long tenant's p95 is longer
    # simulation with the real sequence-dependent switches (the estimator treats them as independent):
    # within 5 % (measured: +2 % to +4 %)
    rng = np.random.default_rng(3)
    n = 1_000_000
    who = rng.random(n) < 0.25  # tenant a
    prev = np.concatenate([[True], who[:-1]])
    serv = np.where(who, 20.0 + 10.0 * (prev != who), 5.0 + 4.0 * (prev != who))
    r = _lindley(serv, rng.exponential(1000.0 / 60.0, n))
    for mask, row in ((who, q[0]), (~who, q[1])):
        rr = r[mask][20_000:]
        assert row[1] == pytest.approx(float(np.quantile(rr, 0.95)), rel=0.05)
        assert row[2] == pytest.approx(float(np.quantile(rr, 0.99)), rel=0.05)


def test_which_computes_a_subset_with_the_same_numbers() -> None:
    ts = [Tenant("a", "m1", Arrival.poisson(15.0), Deterministic(20.0), switch_ms=10.0),
          Tenant("b", "m2", Arrival.poisson(45.0), Deterministic(5.0), switch_ms=4.0),
          Tenant("c", "m3", Arrival.periodic(4.0), Deterministic(62.95), switch_ms=19.39)]
    full = edgetpu_response_quantiles(ts, (0.95, 0.99))
    part = edgetpu_response_quantiles(ts, (0.95, 0.99), which=[2, 0])
    assert part == [full[0], [], full[2]]  # identical floats: the grid is planned from every tenant
    over = [Tenant(t.name, t.model, Arrival.poisson(40.0), t.service, switch_ms=t.switch_ms) for t in ts]
    assert all(isinstance(x, Unstable) for x in edgetpu_response_quantiles(over, which=[1])[1])
    assert edgetpu_response_quantiles(over, which=[1])[0] == []


def test_quantiles_match_quantile() -> None:
    r = mg1_response_distribution(50.0, bimodal(5.0, 55.0, 0.1))
    qs = (0.5, 0.9, 0.95, 0.99)
    assert r.quantiles(qs) == [r.quantile(q) for q in qs]
