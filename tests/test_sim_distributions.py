"""Service-time samples the simulator draws agree with the distributions' analytic moments (Ciw-style)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgemux.profiles.distributions import (
    Deterministic,
    Empirical,
    Exponential,
    Gamma,
    Mixture,
    Shifted,
    bimodal,
    from_moments,
)

N = 400_000

CASES = [
    Deterministic(3.0),
    Exponential(2.5),
    Gamma(4.0, 0.25),
    Gamma(1.0, 3.0),
    bimodal(1.0, 10.0, 0.1),
    Mixture((Exponential(1.0), Deterministic(5.0)), (0.7, 0.3)),
    Empirical((1.0, 2.0, 2.0, 7.5)),
    Shifted(Exponential(1.0), 2.0),
    from_moments(3.0, 4.0),
]


@pytest.mark.parametrize("d", CASES, ids=lambda d: type(d).__name__)
def test_sample_mean_and_variance(d) -> None:
    x = d.sample(np.random.default_rng(123), N)
    assert x.shape == (N,) and np.all(x >= 0)
    sd = math.sqrt(d.var)
    # sample mean within 5 standard errors; sample variance within 5% (or exact for zero variance)
    assert abs(x.mean() - d.mean) <= 5 * sd / math.sqrt(N) + 1e-12
    if d.var == 0:
        assert x.var() == 0
    else:
        assert x.var() == pytest.approx(d.var, rel=0.05)


def test_sampling_is_seeded() -> None:
    d = bimodal(1.0, 4.0, 0.3)
    a = d.sample(np.random.default_rng(9), 1000)
    b = d.sample(np.random.default_rng(9), 1000)
    c = d.sample(np.random.default_rng(10), 1000)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
