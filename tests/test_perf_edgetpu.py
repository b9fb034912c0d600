"""perf.edgetpu: the Edge TPU switch mixture (Ibis Eq. 1-5) with the true second moment."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgemux.cluster.workload import Arrival, Tenant
from edgemux.perf.edgetpu import (
    edgetpu_responses,
    edgetpu_utilization,
    edgetpu_waiting,
    mean_service_times,
    same_model_probabilities,
    service_mixture,
    service_moments,
    tenant_service,
)
from edgemux.perf.gpu import gpu_fcfs_responses
from edgemux.perf.queueing import mg1_response
from edgemux.perf.result import Unstable
from edgemux.profiles.distributions import Deterministic, Exponential, Gamma, bimodal, second_moment


def tenant(name: str, model: str, rps: float, service, switch: float = 0.0) -> Tenant:
    return Tenant(name, model, Arrival.poisson(rps), service, switch_ms=switch)


def two_models() -> list[Tenant]:
    return [tenant("a", "m1", 10.0, Deterministic(20.0), 10.0), tenant("b", "m2", 30.0, Deterministic(5.0), 4.0)]


def test_hand_computed_two_models() -> None:
    ts = two_models()
    # p = (0.25, 0.75); S_a = 20 + 0.75*10 = 27.5, S_b = 5 + 0.25*4 = 6
    assert same_model_probabilities(ts) == pytest.approx([0.25, 0.75])
    assert mean_service_times(ts) == pytest.approx([27.5, 6.0])
    m1, m2 = service_moments(ts)
    assert m1 == pytest.approx(11.375)
    # 0.25 (0.25*400 + 0.75*900) + 0.75 (0.75*25 + 0.25*81)
    assert m2 == pytest.approx(223.0)
    w = 0.04 * 223.0 / (2 * (1 - 0.04 * 11.375))
    assert edgetpu_waiting(ts) == pytest.approx(w)
    assert edgetpu_responses(ts) == pytest.approx([w + 27.5, w + 6.0])
    assert edgetpu_utilization(ts) == pytest.approx(0.455)


def test_true_second_moment_exceeds_variance_of_means() -> None:
    # Ibis' Var of the means misses each tenant's own variance and the switch spread
    ts = [tenant("a", "m1", 20.0, Exponential(10.0), 5.0), tenant("b", "m2", 20.0, Exponential(10.0), 5.0)]
    m1, m2 = service_moments(ts)
    means = mean_service_times(ts)
    var_of_means = np.var(means)
    assert m2 - m1 * m1 > var_of_means + 99.0


def test_same_model_pays_no_switch() -> None:
    ts = [tenant("a", "shared", 10.0, Deterministic(8.0), 12.0), tenant("b", "shared", 30.0, Deterministic(8.0), 12.0)]
    assert mean_service_times(ts) == pytest.approx([8.0, 8.0])
    assert edgetpu_responses(ts) == pytest.approx([mg1_response(40.0, 8.0, 64.0)] * 2)


def test_switch_only_between_different_models() -> None:
    # a and b share a model, c runs another: a pays its switch when the previous request was c's
    ts = [tenant("a", "x", 10.0, Deterministic(5.0), 10.0), tenant("b", "x", 10.0, Deterministic(5.0), 10.0),
          tenant("c", "y", 20.0, Deterministic(5.0), 10.0)]
    assert same_model_probabilities(ts) == pytest.approx([0.5, 0.5, 0.5])
    assert mean_service_times(ts) == pytest.approx([10.0, 10.0, 10.0])


def test_one_tenant_is_plain_md1() -> None:
    ts = [tenant("a", "m", 50.0, Deterministic(10.0), 15.0)]
    assert edgetpu_responses(ts) == pytest.approx([15.0])  # M/D/1, rho 0.5: W = 5
    assert tenant_service(ts[0], ts) == ts[0].service


def test_no_switch_reduces_to_aggregate_mg1() -> None:
    ts = [tenant("a", "m1", 20.0, Exponential(10.0)), tenant("b", "m2", 40.0, bimodal(2.0, 20.0, 0.2))]
    assert edgetpu_responses(ts) == pytest.approx(gpu_fcfs_responses(ts))


def test_identical_tenants_different_models() -> None:
    ts = [tenant(f"t{i}", f"m{i}", 10.0, Deterministic(10.0), 5.0) for i in range(4)]
    r = edgetpu_responses(ts)
    assert r[0] == pytest.approx(r[1]) == pytest.approx(r[3])
    assert mean_service_times(ts) == pytest.approx([10.0 + 0.75 * 5.0] * 4)


def test_lambda_zero_and_overload() -> None:
    ts = [tenant("a", "m1", 0.0, Deterministic(10.0), 4.0), tenant("b", "m2", 0.0, Deterministic(6.0), 4.0)]
    assert edgetpu_responses(ts) == pytest.approx([12.0, 8.0])  # equal shares at lam = 0, no wait
    hot = [tenant("a", "m1", 60.0, Deterministic(10.0), 4.0), tenant("b", "m2", 60.0, Deterministic(6.0), 4.0)]
    r = edgetpu_responses(hot, where="tpu0")
    assert all(isinstance(x, Unstable) and x.where == "tpu0" for x in r)


def test_mixture_distribution_matches_moments() -> None:
    ts = [tenant("a", "m1", 10.0, Gamma(20.0, 0.3), 10.0), tenant("b", "m2", 30.0, Deterministic(5.0), 4.0),
          tenant("c", "m2", 5.0, Exponential(3.0), 4.0)]
    mix = service_mixture(ts)
    m1, m2 = service_moments(ts)
    assert mix.mean == pytest.approx(m1)
    assert second_moment(mix) == pytest.approx(m2)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(st.floats(1.0, 50.0), st.floats(0.5, 30.0), st.floats(0.0, 20.0), st.integers(0, 2)),
                min_size=1, max_size=4), st.integers(0, 2**31 - 1))
def test_mixture_second_moment_vs_monte_carlo(spec, seed: int) -> None:
    ts = [tenant(f"t{i}", f"m{m}", r, Exponential(e), o) for i, (r, e, o, m) in enumerate(spec)]
    mix = service_mixture(ts)
    x = mix.sample(np.random.default_rng(seed), 200_000)
    m1, m2 = service_moments(ts)
    se1 = x.std() / np.sqrt(x.size)
    se2 = (x**2).std() / np.sqrt(x.size)
    assert abs(x.mean() - m1) < 5 * se1 + 1e-9
    assert abs((x**2).mean() - m2) < 5 * se2 + 1e-9


@settings(max_examples=30, deadline=None)
@given(st.floats(0.001, 0.99), st.floats(0.001, 0.99))
def test_monotone_and_unstable_iff_rho_ge_1(r1: float, r2: float) -> None:
    # (from lam > 0: at lam = 0 the shares p_i are undefined and taken as equal)
    base = two_models()
    full = 1.0 / 0.455  # scale that puts rho at 1 (rho is linear in a common scale of the rates)
    lo, hi = sorted((r1, r2))

    def at(scale: float) -> list[Tenant]:
        return [Tenant(t.name, t.model, Arrival.poisson(t.rate_rps * scale), t.service, t.switch_ms) for t in base]

    a, b = edgetpu_responses(at(lo * full)), edgetpu_responses(at(hi * full))
    assert all(x <= y * (1 + 1e-12) and x > 0 for x, y in zip(a, b))
    assert all(isinstance(x, Unstable) for x in edgetpu_responses(at(full * 1.0001)))
