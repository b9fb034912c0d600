"""Control-variate estimator: unbiased, narrower, and its CI covers the exact value."""

from __future__ import annotations

import numpy as np
import pytest

from edgemux.cluster.workload import Arrival, DeviceSpec, Discipline, Tenant
from edgemux.profiles.distributions import Exponential, bimodal
from edgemux.profiles.types import DeviceKind
from edgemux.sim.control import _regress, control_expectations, simulate_controlled


def _tenants(rho: float) -> list[Tenant]:
    means = [10.0, 20.0]
    lam = 1000.0 * rho / (sum(means) / 2)
    return [Tenant("a", "m", Arrival.poisson(lam / 2), bimodal(5.0, 55.0, 0.1)),
            Tenant("b", "m", Arrival.poisson(lam / 2), Exponential(20.0))]


def test_control_expectation_is_pk():
    ts = [Tenant("a", "m", Arrival.poisson(50.0), Exponential(10.0))]
    # M/M/1 with lambda = 0.05/ms, S = 10 ms: R = 1 / (0.1 - 0.05) = 20 ms
    assert control_expectations(ts, 1.0)[0] == pytest.approx(20.0)
    # twice as fast: S = 5 ms, rho = 0.25, R = 5/(1-0.25)
    assert control_expectations(ts, 2.0)[0] == pytest.approx(5.0 / 0.75)
    with pytest.raises(ValueError, match="unstable"):
        control_expectations([Tenant("a", "m", Arrival.poisson(200.0), Exponential(10.0))], 1.0)


def test_ps_high_load_controlled_ci_covers_exact_and_is_narrower():
    rho = 0.85
    ts = _tenants(rho)
    dev = DeviceSpec("d", DeviceKind.GPU_EMBEDDED, Discipline.PS)
    res = simulate_controlled(dev, ts, requests=40_000, replications=12, seed=3)
    for t in ts:
        exact = t.service.mean / (1 - rho)
        cm = res[t.name]
        assert cm.controlled.half_width < cm.plain.half_width
        # 99.9 % coverage check: widen the 95 % interval by the t-ratio
        assert abs(cm.controlled.value - exact) <= 2.2 * cm.controlled.half_width


def test_regress_recovers_known_shift():
    rng = np.random.default_rng(0)
    x = rng.normal(10.0, 1.0, 50)
    y = 3.0 + 2.0 * (x - 10.0) + rng.normal(0, 0.01, 50)
    cm = _regress(y, x, 10.0, 0.95)
    assert cm.controlled.value == pytest.approx(3.0, abs=0.01)
    assert cm.correlation > 0.99
    flat = _regress(np.array([1.0, 2.0, 3.0]), np.array([5.0, 5.0, 5.0]), 5.0, 0.95)
    assert flat.controlled == flat.plain


def test_rejects_cpu_stage_and_few_replications():
    from dataclasses import replace

    from edgemux.cluster.workload import CpuStage

    ts = _tenants(0.5)
    dev = DeviceSpec("d", DeviceKind.GPU_EMBEDDED, Discipline.PS)
    with pytest.raises(ValueError, match="replications"):
        simulate_controlled(dev, ts, requests=1000, replications=2)
    with pytest.raises(ValueError, match="device alone"):
        simulate_controlled(dev, [replace(ts[0], cpu=CpuStage(1, Exponential(1.0)))], requests=1000, replications=3)
