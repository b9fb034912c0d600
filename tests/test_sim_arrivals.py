"""Arrival generation: Poisson, periodic with random phase, replay, merging."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgemux.cluster.workload import Arrival
from edgemux.sim.arrivals import arrival_times, generate_arrivals, merge_streams


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_poisson_count_mode_gaps_are_exponential() -> None:
    t = arrival_times(Arrival.poisson(200.0), rng(1), n=200_000)
    assert t.size == 200_000 and np.all(np.diff(t) >= 0) and t[0] > 0
    gaps = np.diff(np.concatenate([[0.0], t]))
    mean_gap = 1000.0 / 200.0
    # mean within 5 standard errors; exponential: sd == mean, so CV of the gaps ~ 1
    assert abs(gaps.mean() - mean_gap) < 5 * mean_gap / math.sqrt(gaps.size)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.02)


def test_poisson_horizon_mode_count_and_bounds() -> None:
    horizon = 100_000.0  # ms
    t = arrival_times(Arrival.poisson(50.0), rng(2), horizon_ms=horizon)
    assert np.all(t < horizon) and np.all(np.diff(t) >= 0)
    expected = 50.0 * horizon / 1000.0
    assert abs(t.size - expected) < 5 * math.sqrt(expected)


def test_periodic_has_random_phase_and_exact_period() -> None:
    fps = 30.0
    period = 1000.0 / fps
    phases = []
    for seed in range(200):
        t = arrival_times(Arrival.periodic(fps), rng(seed), n=50)
        assert 0.0 <= t[0] < period
        np.testing.assert_allclose(np.diff(t), period, rtol=0, atol=1e-9)
        phases.append(t[0])
    # phase is uniform on [0, period): mean period/2, spread over the whole interval
    assert np.mean(phases) == pytest.approx(period / 2, rel=0.15)
    assert min(phases) < 0.1 * period and max(phases) > 0.9 * period


def test_periodic_horizon_and_jitter() -> None:
    t = arrival_times(Arrival.periodic(10.0), rng(3), horizon_ms=1000.0)
    assert t.size == 10 and np.all(t < 1000.0)
    j = arrival_times(Arrival.periodic(10.0), rng(3), n=1000, jitter_ms=2.0)
    base = arrival_times(Arrival.periodic(10.0), rng(3), n=1000)
    assert np.all(np.diff(j) >= 0)
    assert np.max(np.abs(j - base)) <= 2.0 + 1e-9 and np.max(np.abs(j - base)) > 0


def test_replay_shifted_to_zero_and_truncated() -> None:
    a = Arrival.replay([105.0, 100.0, 130.5])
    t = arrival_times(a, rng(), n=10)
    np.testing.assert_array_equal(t, [0.0, 5.0, 30.5])
    np.testing.assert_array_equal(arrival_times(a, rng(), n=2), [0.0, 5.0])
    np.testing.assert_array_equal(arrival_times(a, rng(), horizon_ms=30.0), [0.0, 5.0])


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        arrival_times(Arrival.poisson(1.0), rng())
    with pytest.raises(ValueError, match="exactly one"):
        arrival_times(Arrival.poisson(1.0), rng(), n=1, horizon_ms=1.0)
    with pytest.raises(ValueError, match=">= 0"):
        arrival_times(Arrival.poisson(1.0), rng(), n=-1)
    with pytest.raises(ValueError, match="rate 0"):
        arrival_times(Arrival.poisson(0.0), rng(), n=5)
    assert arrival_times(Arrival.poisson(0.0), rng(), horizon_ms=10.0).size == 0
    with pytest.raises(ValueError, match="jitter"):
        arrival_times(Arrival.periodic(1.0), rng(), n=5, jitter_ms=-1)


def test_merge_is_sorted_and_ties_break_by_tenant_then_position() -> None:
    times, idx = merge_streams([np.array([1.0, 2.0, 2.0]), np.array([0.5, 2.0]), np.array([])])
    np.testing.assert_array_equal(times, [0.5, 1.0, 2.0, 2.0, 2.0])
    np.testing.assert_array_equal(idx, [1, 0, 0, 0, 1])
    t0, i0 = merge_streams([])
    assert t0.size == 0 and i0.size == 0
    # one stream skips the sort only when it is already in order
    t1, i1 = merge_streams([np.array([3.0, 1.0, 2.0])])
    np.testing.assert_array_equal(t1, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(i1, [0, 0, 0])


def test_generate_arrivals_exact_total_and_proportions() -> None:
    arrivals = [Arrival.poisson(100.0), Arrival.periodic(30.0), Arrival.poisson(0.0), Arrival.poisson(370.0)]
    rngs = [rng(10 + i) for i in range(4)]
    times, idx = generate_arrivals(arrivals, rngs, 100_000)
    assert times.size == 100_000 and np.all(np.diff(times) >= 0)
    counts = np.bincount(idx, minlength=4)
    assert counts[2] == 0
    shares = counts / counts.sum()
    np.testing.assert_allclose(shares, [0.2, 0.06, 0.0, 0.74], atol=0.01)
    # the periodic tenant's frames are all present up to the cut: constant spacing, no gap
    np.testing.assert_allclose(np.diff(times[idx == 1]), 1000.0 / 30.0, atol=1e-9)


def test_generate_arrivals_is_deterministic_per_tenant_stream() -> None:
    a = [Arrival.poisson(100.0), Arrival.poisson(50.0)]
    t1, i1 = generate_arrivals(a, [rng(1), rng(2)], 5000)
    t2, i2 = generate_arrivals(a, [rng(1), rng(2)], 5000)
    np.testing.assert_array_equal(t1, t2)
    np.testing.assert_array_equal(i1, i2)


def test_generate_arrivals_with_replay_keeps_alignment_and_ignores_total() -> None:
    a = [Arrival.replay([1000.0, 1010.0, 1500.0]), Arrival.replay([1005.0]), Arrival.poisson(100.0)]
    times, idx = generate_arrivals(a, [rng(0), rng(1), rng(2)], 7)
    np.testing.assert_array_equal(times[idx == 0], [0.0, 10.0, 500.0])
    np.testing.assert_array_equal(times[idx == 1], [5.0])
    poisson = times[idx == 2]
    assert np.all(poisson <= 500.0) and 20 < poisson.size < 90  # ~50 expected over 500 ms


def test_generate_arrivals_rejects_all_zero_rates() -> None:
    with pytest.raises(ValueError, match="rate 0"):
        generate_arrivals([Arrival.poisson(0.0)], [rng()], 10)
    with pytest.raises(ValueError, match="at least one"):
        generate_arrivals([], [], 10)


def test_generate_arrivals_with_jitter_is_complete_and_sorted() -> None:
    a = [Arrival.periodic(100.0), Arrival.periodic(50.0)]
    times, idx = generate_arrivals(a, [rng(4), rng(5)], 3_000, jitter_ms=15.0)  # jitter > period of app 0
    assert times.size == 3_000 and np.all(np.diff(times) >= 0)
    counts = np.bincount(idx)
    assert abs(counts[0] - 2_000) <= 3 and abs(counts[1] - 1_000) <= 3
