"""sim.stats.percentiles_inplace: numpy's linear percentiles, bit for bit, by single-kth selections."""

from __future__ import annotations

import numpy as np
import pytest

from edgemux.sim.stats import percentiles_inplace

QS = ([50.0, 95.0, 99.0], [95.0, 99.0], [0.0, 100.0], [99.9, 0.1, 50.0], [37.5], [50.0, 50.0, 99.0])


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 10, 99, 100, 101, 1000, 4097, 25_000])
def test_equals_numpy_bit_for_bit(n: int) -> None:
    rng = np.random.default_rng(n)
    draws = (rng.exponential(3.0, n), rng.integers(0, 4, n).astype(float),  # many ties
             np.sort(rng.normal(0.0, 1.0, n)), np.sort(rng.uniform(0, 1, n))[::-1].copy(), np.full(n, 2.5))
    for x in draws:
        for q in QS:
            want = np.percentile(x, q)
            y = x.copy()
            got = percentiles_inplace(y, q)
            assert np.array_equal(np.array(got), want), (n, q, got, want)
            assert np.array_equal(np.sort(y), np.sort(x))  # reordered, nothing lost


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # numpy's own inf - inf, in the reference
def test_infinities_and_nan_follow_numpy() -> None:
    x = np.array([1.0, np.inf, 3.0, np.inf, 2.0])
    assert np.array_equal(np.array(percentiles_inplace(x.copy(), [10, 50, 99])), np.percentile(x, [10, 50, 99]),
                          equal_nan=True)
    x = np.array([1.0, np.nan, 3.0])
    assert all(np.isnan(percentiles_inplace(x.copy(), [50, 99])))


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentiles_inplace(np.empty(0), [50.0])
    with pytest.raises(ValueError, match="1-D float64"):
        percentiles_inplace(np.arange(5), [50])
    with pytest.raises(ValueError, match=r"\[0, 100\]"):
        percentiles_inplace(np.arange(5.0), [101])
