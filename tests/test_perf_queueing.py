"""perf.queueing: hand-computed values and properties of the textbook formulas."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from edgemux.perf.queueing import (
    erlang_c,
    ibis_mgc_ps_ratio,
    ibis_mgc_ps_response,
    ibis_pk_waiting,
    limited_ps_class_responses,
    limited_ps_number,
    limited_ps_response,
    md1_response,
    md1_waiting,
    mg1_ps_response,
    mg1_response,
    mg1_waiting,
    mm1_response,
    ps_class_responses,
    utilization,
)
from edgemux.perf.result import Unstable

rates = st.floats(min_value=0.0, max_value=500.0, allow_nan=False)
means = st.floats(min_value=0.01, max_value=100.0, allow_nan=False)
servers = st.floats(min_value=0.2, max_value=12.0, allow_nan=False)


# ------------------------------------------------------------------ hand-computed values
def test_pk_hand_values() -> None:
    # lam = 50 req/s = 0.05 /ms, E[S] = 10 ms, E[S^2] = 200 ms^2 (exponential): rho = 0.5
    assert mg1_waiting(50.0, 10.0, 200.0) == pytest.approx(10.0)
    assert mg1_response(50.0, 10.0, 200.0) == pytest.approx(20.0)
    assert mm1_response(50.0, 10.0) == pytest.approx(20.0)
    assert md1_waiting(50.0, 10.0) == pytest.approx(5.0)
    assert md1_response(50.0, 10.0) == pytest.approx(15.0)
    # Ibis Eq. 3 as printed, with Var = 100 ms^2, is the same number
    assert ibis_pk_waiting(50.0, 10.0, 100.0) == pytest.approx(10.0)


def test_ps_per_class_hand_values() -> None:
    # rho = 0.02*5 + 0.03*10 = 0.4
    r = ps_class_responses([20.0, 30.0], [5.0, 10.0])
    assert r == pytest.approx([5.0 / 0.6, 10.0 / 0.6])


def test_limited_ps_c2_is_mm2() -> None:
    # c = 2, a = lam S = 1, rho = 0.5: M/M/2 mean S / (1 - rho^2) = 13.33 ms; Eq. 10 says 20 ms
    assert limited_ps_response(100.0, 10.0, 2.0) == pytest.approx(10.0 / 0.75)
    assert ibis_mgc_ps_response(100.0, 10.0, 2.0) == pytest.approx(20.0)
    assert ibis_mgc_ps_ratio(100.0, 10.0, 2.0) == pytest.approx(1.5)
    assert erlang_c(2, 1.0) == pytest.approx(1.0 / 3.0)


def test_fractional_cpu_share_below_one_core() -> None:
    # c = 0.5 core, S = 10 ms, lam = 20 req/s: rho = 0.4; alone a request needs 20 ms
    assert limited_ps_response(20.0, 10.0, 0.5) == pytest.approx(20.0 / 0.6)
    assert ibis_mgc_ps_response(20.0, 10.0, 0.5) == pytest.approx(10.0 / 0.6)  # Eq. 11 underestimates by c
    assert limited_ps_response(0.0, 10.0, 0.5) == pytest.approx(20.0)


def test_ibis_c165_example() -> None:
    # Ibis Fig. 11: c = 1.65; at rho = 0.5 Eq. 10 is 1 + rho (c - 1) = 1.325 times the exact mean
    s, c, rho = 10.0, 1.65, 0.5
    lam = 1000.0 * rho * c / s
    assert ibis_mgc_ps_ratio(lam, s, c) == pytest.approx(1.325)


def test_lambda_zero() -> None:
    assert mg1_response(0.0, 10.0, 100.0) == 10.0
    assert limited_ps_response(0.0, 10.0, 3.0) == 10.0
    assert limited_ps_number(0.0, 10.0, 3.0) == 0.0
    assert ps_class_responses([0.0, 0.0], [5.0, 10.0]) == [5.0, 10.0]


def test_unstable_results() -> None:
    for r in (mg1_response(100.0, 10.0, 200.0), md1_response(150.0, 10.0), mm1_response(100.0, 10.0),
              limited_ps_response(200.0, 10.0, 2.0), ibis_mgc_ps_response(250.0, 10.0, 2.0)):
        assert isinstance(r, Unstable) and r.rho >= 1.0
    r = ps_class_responses([60.0, 60.0], [10.0, 10.0], where="gpu0")
    assert all(isinstance(x, Unstable) and x.where == "gpu0" and x.rho == pytest.approx(1.2) for x in r)


def test_bad_inputs() -> None:
    with pytest.raises(ValueError):
        mg1_waiting(10.0, 10.0, 50.0)  # E[S^2] < E[S]^2
    with pytest.raises(ValueError):
        mg1_waiting(-1.0, 10.0, 100.0)
    with pytest.raises(ValueError):
        limited_ps_response(10.0, 10.0, 0.0)


# ------------------------------------------------------------------ properties
@given(rates, means)
def test_unstable_iff_rho_at_least_one(rate: float, mean: float) -> None:
    rho = utilization(rate, mean)
    for r in (mm1_response(rate, mean), md1_response(rate, mean), mg1_response(rate, mean, 2 * mean * mean),
              mg1_ps_response(rate, mean)):
        assert isinstance(r, Unstable) == (rho >= 1.0)
        if not isinstance(r, Unstable):
            assert r >= mean and math.isfinite(r)


@given(st.floats(0.0, 0.98), means, servers)
@example(rho=5e-324, mean=0.5, c=0.5)  # a subnormal rate once made E[N]/lam collapse to 0
def test_limited_ps_nonnegative_and_at_least_alone(rho: float, mean: float, c: float) -> None:
    lam = 1000.0 * rho * c / mean
    r = limited_ps_response(lam, mean, c)
    assert not isinstance(r, Unstable)
    assert r >= mean / min(1.0, c) * (1 - 1e-9)
    assert isinstance(limited_ps_response(1000.0 * c / mean * 1.0001, mean, c), Unstable)


@given(st.floats(0.0, 0.9), st.floats(0.0, 0.9), means, servers)
def test_monotone_in_lambda(r1: float, r2: float, mean: float, c: float) -> None:
    lo, hi = sorted((r1, r2))
    lam_lo, lam_hi = 1000.0 * lo / mean, 1000.0 * hi / mean
    assert mm1_response(lam_lo, mean) <= mm1_response(lam_hi, mean)
    assert md1_response(lam_lo, mean) <= md1_response(lam_hi, mean)
    assert limited_ps_response(lam_lo * c, mean, c) <= limited_ps_response(lam_hi * c, mean, c) * (1 + 1e-12)


@given(st.floats(0.0, 0.97), means)
def test_mg1_exponential_is_mm1_and_md1_half_wait(rho: float, mean: float) -> None:
    lam = 1000.0 * rho / mean
    assert mg1_response(lam, mean, 2 * mean * mean) == pytest.approx(mm1_response(lam, mean), rel=1e-12)
    assert md1_waiting(lam, mean) == pytest.approx(0.5 * (mm1_response(lam, mean) - mean), rel=1e-12, abs=1e-12)


@given(st.floats(0.0, 0.97), means)
@example(rho=5e-324, mean=1.5)  # subnormal rate: n/lam lost its precision and gave 2.0 instead of 1.5
def test_limited_ps_c1_is_mg1_ps(rho: float, mean: float) -> None:
    lam = 1000.0 * rho / mean
    assert limited_ps_response(lam, mean, 1.0) == pytest.approx(mg1_ps_response(lam, mean), rel=1e-10)
    assert ibis_mgc_ps_response(lam, mean, 1.0) == pytest.approx(limited_ps_response(lam, mean, 1.0), rel=1e-10)


@given(st.floats(0.0, 200.0), means)
def test_limited_ps_many_servers_is_service_time(offered: float, mean: float) -> None:
    lam = 1000.0 * offered / mean
    assert limited_ps_response(lam, mean, 1e6) == pytest.approx(mean, rel=1e-9)


@given(st.floats(0.01, 0.97), means, st.integers(1, 8))
def test_limited_ps_integer_c_is_mmc(rho: float, mean: float, c: int) -> None:
    a = rho * c
    lam = 1000.0 * a / mean
    exact_mmc = mean + erlang_c(c, a) * mean / (c * (1.0 - rho))
    assert limited_ps_response(lam, mean, float(c)) == pytest.approx(exact_mmc, rel=1e-9)


@given(st.floats(0.01, 0.97), means, st.floats(1.0, 2.0))
def test_eq10_ratio_closed_form_between_one_and_two_servers(rho: float, mean: float, c: float) -> None:
    lam = 1000.0 * rho * c / mean
    assert ibis_mgc_ps_ratio(lam, mean, c) == pytest.approx(1.0 + rho * (c - 1.0), rel=1e-9)


@given(st.floats(0.01, 0.97), means, st.floats(1.0, 10.0))
def test_eq10_overestimates_for_more_than_one_server(rho: float, mean: float, c: float) -> None:
    lam = 1000.0 * rho * c / mean
    assert ibis_mgc_ps_ratio(lam, mean, c) >= 1.0 - 1e-12


@settings(max_examples=40)
@given(st.floats(0.01, 0.95), st.floats(0.3, 6.0))
def test_chain_by_brute_force_and_little(rho: float, c: float) -> None:
    """E[N] from the closed-form tail equals a brute-force sum of the birth-death chain, and
    E[R] = E[N] / lam (Little)."""
    mean = 7.0
    lam_ms = rho * c / mean
    a = lam_ms * mean
    weights = [1.0]
    for n in range(1, 20000):
        weights.append(weights[-1] * a / min(n, c))
        if weights[-1] < 1e-300 or (n > c and weights[-1] < 1e-18 * max(weights)):
            break
    total = math.fsum(weights)
    en = math.fsum(n * w for n, w in enumerate(weights)) / total
    assert limited_ps_number(1000.0 * lam_ms, mean, c) == pytest.approx(en, rel=1e-9)
    assert limited_ps_response(1000.0 * lam_ms, mean, c) == pytest.approx(en / lam_ms, rel=1e-9)


def test_limited_ps_per_class_split() -> None:
    # E[R_i] = S_i E[R] / E[S]; the rate-weighted average of the classes is the aggregate mean
    rates, ms = [30.0, 70.0], [4.0, 12.0]
    r = limited_ps_class_responses(rates, ms, 1.65)
    mean = (30 * 4 + 70 * 12) / 100.0
    agg = limited_ps_response(100.0, mean, 1.65)
    assert r == pytest.approx([4.0 * agg / mean, 12.0 * agg / mean])
    assert (30 * r[0] + 70 * r[1]) / 100.0 == pytest.approx(agg)
    assert limited_ps_class_responses(rates, ms, 1.0) == pytest.approx(ps_class_responses(rates, ms))


def test_limited_ps_huge_load_many_servers_is_finite() -> None:
    r = limited_ps_response(1000.0 * 900.0 / 10.0, 10.0, 1000.0)  # a = 900 on c = 1000
    assert not isinstance(r, Unstable) and 10.0 <= r < 12.0
