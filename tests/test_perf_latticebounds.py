"""perf.latticebounds: the lattice brackets hold the exact M/D/1 CDF and a simulated M/G/1 CDF (within the
simulation's confidence interval), narrow as the lattice refines, and the quantile verdicts are
consistent, independent of the other devices in a call, and never more optimistic than the truth."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgemux.perf.latticebounds import CDF_ERR, Queries, Queues, cdf_brackets, decide_quantiles
from edgemux.perf.tails import md1_waiting_cdf, mg1_response_quantiles
from edgemux.profiles.distributions import Deterministic, Mixture
from edgemux.sim.lindley import lindley_waits


def one(lam: float, x: list[float], p: list[float]) -> Queues:
    return Queues(np.array([lam]), np.array([x]), np.array([p]))


def ask(t: list[float], y: list[list[float]] | None = None, r: list[list[float]] | None = None,
        q: float = 0.95, queue: list[int] | None = None) -> Queries:
    n = len(t)
    y = y if y is not None else [[0.0]] * n
    r = r if r is not None else [[1.0]] * n
    return Queries(np.array(queue if queue is not None else [0] * n, dtype=np.intp), np.array(y, dtype=float),
                   np.array(r, dtype=float), np.array(t, dtype=float), np.full(n, q))


@settings(max_examples=40, deadline=None)
@given(rho=st.floats(0.05, 0.95), d=st.floats(1.0, 50.0), frac=st.floats(0.05, 8.0))
def test_md1_wait_cdf_inside_the_bracket(rho: float, d: float, frac: float) -> None:
    lam = rho / d
    t = frac * d
    lo, hi = cdf_brackets(one(lam, [d], [1.0]), ask([t]), 1024)
    exact = md1_waiting_cdf(lam * 1000.0, d, t)
    assert lo[0] - CDF_ERR <= exact <= hi[0] + CDF_ERR
    assert hi[0] - lo[0] < 0.02   # 1024 cells: a narrow bracket, not a vacuous one


def test_bracket_narrows_with_the_lattice() -> None:
    queues = one(0.85 / 17.5, [5.0, 25.0, 40.0], [0.5, 0.3, 0.2])
    qr = ask([200.0], [[25.0]])
    widths = [float(np.subtract(*cdf_brackets(queues, qr, cells)[::-1])[0]) for cells in (256, 1024, 4096)]
    assert widths[0] > 3.5 * widths[1] > 3.5 * 3.5 * widths[2] > 0


def test_simulated_cdf_inside_the_bracket() -> None:
    """A seeded M/G/1 with a three-point service (an Edge TPU switch mixture's shape): the empirical
    P(R <= t) of a tenant with a two-point own service lies in the bracket, up to the 99.9 % interval of
    the batch means."""
    rng = np.random.default_rng(7)
    x, p = np.array([5.0, 25.0, 40.0]), np.array([0.5, 0.3, 0.2])
    lam = 0.8 / float(x @ p)
    n = 2_000_000
    arrivals = np.cumsum(rng.exponential(1.0 / lam, n))
    services = rng.choice(x, size=n, p=p)
    w = lindley_waits(arrivals, services)[n // 10:]
    own = rng.choice([25.0, 30.0], size=w.size, p=[0.7, 0.3])   # independent of W, as in the model
    r = w + own
    for t in (60.0, 120.0, 200.0):
        hits = (r <= t).reshape(30, -1).mean(axis=1)
        mean, half = hits.mean(), 3.66 * hits.std(ddof=1) / math.sqrt(hits.size)
        lo, hi = cdf_brackets(one(lam, list(x), list(p)), ask([t], [[25.0, 30.0]], [[0.7, 0.3]]))
        assert lo[0] - half <= mean <= hi[0] + half, (t, lo[0], mean, hi[0], half)


def test_verdicts_bracket_the_dft_estimate() -> None:
    """ok means the certified upper bound is within t; the bound sits above the DFT estimate (minus its
    1 % allowance)."""
    s = Mixture((Deterministic(5.0), Deterministic(25.0), Deterministic(40.0)), (0.5, 0.3, 0.2))
    lam = 0.85 / s.mean
    p95, p99 = mg1_response_quantiles(lam * 1000.0, s, Deterministic(25.0), (0.95, 0.99))
    queues = one(lam, [5.0, 25.0, 40.0], [0.5, 0.3, 0.2])
    for q, est in ((0.95, p95), (0.99, p99)):
        ts = [est * f for f in (0.9, 0.97, 1.03, 1.2)]
        ok, up = decide_quantiles(queues, ask(ts, [[25.0]] * 4, q=q), want_upper=np.ones(4, dtype=bool))
        assert list(ok) == [False, False, True, True], (q, est, ok, up)
        for t, good, u in zip(ts, ok, up):
            assert (u <= t) == good
            if good:
                assert est * 0.99 <= u   # a bound: never below the estimate (less its allowance)


def test_a_device_answers_the_same_alone_or_in_a_batch() -> None:
    a = (0.04, [5.0, 25.0, 40.0], [0.5, 0.3, 0.2])
    b = (0.02, [10.0, 30.0], [0.6, 0.4])
    alone = decide_quantiles(one(*a), ask([150.0, 100.0], [[25.0], [5.0]]), want_upper=np.array([True, True]))
    both = Queues(np.array([b[0], a[0]]), np.array([b[1] + [0.0], a[1]]), np.array([b[2] + [0.0], a[2]]))
    mixed = decide_quantiles(both, ask([90.0, 150.0, 100.0], [[10.0], [25.0], [5.0]], queue=[0, 1, 1]),
                             want_upper=np.array([True, True, True]))
    assert list(mixed[0][1:]) == list(alone[0])
    assert list(mixed[1][1:]) == list(alone[1])


def test_nonpositive_time_is_never_met() -> None:
    ok, up = decide_quantiles(one(0.01, [10.0], [1.0]), ask([0.0, -5.0, 50.0]))
    assert list(ok) == [False, False, True]
    assert math.isinf(up[0]) and math.isinf(up[1]) and up[2] == 50.0


@pytest.mark.parametrize("q", [0.95, 0.99])
def test_verdict_is_monotone_in_the_time(q: float) -> None:
    queues = one(0.03, [4.5, 19.0, 42.0], [0.4, 0.4, 0.2])
    ts = list(np.linspace(20.0, 400.0, 60))
    ok, _ = decide_quantiles(queues, Queries(np.zeros(60, dtype=np.intp), np.full((60, 1), 19.0),
                                             np.ones((60, 1)), np.array(ts), np.full(60, q)))
    assert ok.any() and not ok.all()
    first = int(np.argmax(ok))
    assert ok[first:].all()
