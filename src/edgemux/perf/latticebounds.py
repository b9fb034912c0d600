"""Certified bounds on M/G/1-FCFS response-time CDFs for services with finitely many values (every Edge TPU
profile: deterministic execution times plus the switch), by rounding to a lattice; many devices at once.

Setting (the model of ``perf.tails`` and ``perf.tailbounds``): Poisson arrivals at rate ``lam`` (1/ms),
i.i.d. services S with atoms ``(x_a, p_a)``, ``rho = lam E[S] < 1``; W the stationary FCFS wait; a tagged
request of tenant i sees ``R_i = W + S_i``, its own service ``S_i`` (atoms ``(y_b, r_b)``) independent of W.

Method. W is a geometric sum (Pollaczek-Khinchine / Benes): ``W = X_1 + ... + X_K``, ``P(K = k) = (1 -
rho) rho^k``, ``X_j`` i.i.d. with the equilibrium law ``F_e(x) = E[min(S, x)] / E[S]``, which has a density.
On a lattice of step h round every ladder height up, ``X+ = h ceil(X/h)``, or down, ``X- = h floor(X/h)``,
and the own service likewise. Coupled on the same K and X_j this gives, path by path,
``R- <= R <= R+``, so for every t

    P(R+ <= t) <= P(R <= t) <= P(R- <= t).                                         (1)

Both rounded sums live on the lattice and are computed exactly there: ``floor(X/h) = k`` with probability
``m_k = F_e((k+1) h) - F_e(k h)``, which for atoms is ``sum_a p_a clip(x_a - k h, 0, h) / E[S]`` (exact),
and ``ceil(X/h) = floor(X/h) + 1`` almost surely (``F_e`` has no atoms). With ``phi(z) = sum_k m_k z^k``
the generating functions are ``(1 - rho) / (1 - rho phi(z))`` (down) and ``(1 - rho) / (1 - rho z phi(z))``
(up), ``rho`` the exact ``lam E[S]``. Their first n coefficients depend only on ``m_0..m_{n-1}`` (no part
of a sum below n exceeds it), so the masses beyond the grid are dropped, not wrapped. The coefficients are
read by a damped DFT of length 2n (Abate-Whitt): evaluating at ``r w^j`` with ``r^(2n) = 1e-10`` folds the
coefficients from 2n on back onto the grid multiplied by at most 1e-10 (their total is at most 1), and
undamping amplifies the rounding error by at most ``r^(-n) = 1e5``; a CDF read from it is within
``CDF_ERR`` of the exact lattice value, which the callers add as a margin.

Precision. Between the two roundings every ladder height moves by one cell, so the bracket of a quantile
is about h times the number of ladder heights in the sum: it shrinks in proportion to the cells
(``tests/test_perf_latticebounds.py`` checks the narrowing). :func:`decide_quantiles` asks the coarsest lattice
first and finer ones only for what it leaves open (``LEVELS``: 128, 512, 2048 cells).

Units: ms, req/s (rates given per ms where named ``_per_ms``). Pure functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from edgemux.cluster.workload import Tenant
from edgemux.perf.tailbounds import device_laws

__all__ = ["CDF_ERR", "LEVELS", "Queues", "Queries", "cdf_brackets", "decide_quantiles", "first_fit_quantiles",
           "device_quantile_verdicts"]

CDF_ERR = 1e-7
"""Bound (probability) on the numerical error of a lattice CDF read from the damped DFT (see above)."""
LEVELS = (128, 512, 2048)
"""Lattice cells over ``[0, t_max]`` of a device, coarse then fine."""
_DAMP = 1e-10   # r^(2n): weight of the folded coefficients
_ROUND = 1e-12  # relative nudge so that float ceil/floor round outwards


@dataclass(frozen=True)
class Queues:
    """C devices: arrival rates ``lam_per_ms`` (1/ms, shape (C,)) and aggregate service laws as atoms ``x``
    (ms) with probabilities ``p``, shape (C, A), each row summing to 1 (pad with ``p = 0``)."""

    lam_per_ms: np.ndarray
    x: np.ndarray
    p: np.ndarray

    @property
    def mean(self) -> np.ndarray:
        """E[S] per device (ms)."""
        return (self.x * self.p).sum(axis=1)

    @property
    def rho(self) -> np.ndarray:
        """Utilization ``lam E[S]`` per device."""
        return self.lam_per_ms * self.mean


@dataclass(frozen=True)
class Queries:
    """Q questions ``P(R <= t)``: the device index ``queue`` (Q,), the own service's atoms ``y`` (ms) with
    probabilities ``r`` (Q, B; pad with ``r = 0``), the time ``t_ms`` (Q,) and, for
    :func:`decide_quantiles`, the quantile level ``q`` (Q,)."""

    queue: np.ndarray
    y: np.ndarray
    r: np.ndarray
    t_ms: np.ndarray
    q: np.ndarray | None = None

    def take(self, idx: np.ndarray) -> "Queries":
        """The queries at ``idx``."""
        return Queries(self.queue[idx], self.y[idx], self.r[idx], self.t_ms[idx],
                       None if self.q is None else self.q[idx])


def _cells(x: np.ndarray, p: np.ndarray, mean: np.ndarray, h: np.ndarray, n: int) -> np.ndarray:
    """``m_k`` (rows x n): the mass of ``floor(X/h) = k`` under each row's equilibrium law; an atom at x gives
    h to every cell below its own and its remainder to its own."""
    rows, _ = x.shape
    hh = h[:, None]
    c = np.minimum(np.floor(x / hh), n).astype(np.intp)          # the cell holding the atom (n: beyond)
    rem = np.maximum(x - c * hh, 0.0)
    flat = (np.arange(rows)[:, None] * (n + 1) + c).ravel()
    size = rows * (n + 1)
    full = np.bincount(flat, weights=p.ravel(), minlength=size).reshape(rows, n + 1)
    part = np.bincount(flat, weights=(p * rem).ravel(), minlength=size).reshape(rows, n + 1)
    above = np.cumsum(full[:, :0:-1], axis=1)[:, ::-1]            # P(atom in a cell > k), k < n
    return (hh * above + part[:, :n]) / mean[:, None]


@lru_cache(maxsize=16)
def _transform_points(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For a damped DFT of length 2n: the damping ``r^k`` (k < 2n), the points ``z_j = r w^j`` numpy's
    rfft evaluates at, and ``1 / (1 - z_j)`` (r < 1: no pole)."""
    big = 2 * n
    r = _DAMP ** (1.0 / big)
    damp = r ** np.arange(big)
    z = r * np.exp(-2j * np.pi * np.arange(n + 1) / big)
    return damp, z, 1.0 / (1.0 - z)


def _wait_cdfs(queues: Queues, rows: np.ndarray, h: np.ndarray, n: int,
               down: bool = True) -> tuple[np.ndarray | None, np.ndarray]:
    """Cumulative distributions of the rounded-down and rounded-up waits on cells ``0..n-1``
    (``P(W-/h <= k)``, ``P(W+/h <= k)``), each rows x n: the coefficients of ``G(z) / (1 - z)``, read
    directly (a cumulative sum's coefficients tend to 1, so what folds back is ``r^(2n) / (1 - r^(2n))``
    at most). ``h``: the step of each row. ``down=False``: the rounded-up one only (``None`` first)."""
    x, p = queues.x[rows], queues.p[rows]
    mean = (x * p).sum(axis=1)
    m = _cells(x, p, mean, h, n)
    damp, z, inv = _transform_points(n)
    phi = np.fft.rfft(m * damp[:n], 2 * n, axis=1)                 # zero-padded to 2n by rfft itself
    rho = (queues.lam_per_ms[rows] * mean)[:, None]
    scale = (1.0 - rho) / damp[:n]                                 # linear: applied to the real result
    rp = rho * phi
    if not down:
        g = inv / (1.0 - z * rp)
        return None, np.fft.irfft(g, 2 * n, axis=1)[:, :n] * scale
    g = np.empty((2 * rows.size, n + 1), dtype=complex)
    np.divide(inv, 1.0 - rp, out=g[:rows.size])
    np.divide(inv, 1.0 - z * rp, out=g[rows.size:])
    cum = np.fft.irfft(g, 2 * n, axis=1)[:, :n]
    return cum[:rows.size] * scale, cum[rows.size:] * scale


def _steps(queues: Queues, queries: Queries, cells: int) -> np.ndarray:
    """Lattice step per device (ms): its largest positive query time over ``cells - 1`` cells."""
    tmax = np.zeros(queues.lam_per_ms.size)
    pos = queries.t_ms > 0
    np.maximum.at(tmax, queries.queue[pos], queries.t_ms[pos])
    return tmax / (cells - 1)


def _up_shift(y: np.ndarray, h: np.ndarray) -> np.ndarray:
    return np.ceil(y / h * (1.0 + _ROUND)).astype(np.intp)       # at least y / h cells: rounded outwards


def _gather(cum: np.ndarray, row: np.ndarray, at: np.ndarray, shift: np.ndarray, r: np.ndarray) -> np.ndarray:
    """``sum_b r_b cum[row, at - shift_b]`` (0 where the index is negative): the CDF of a lattice wait plus a
    lattice own service at cell ``at``; ``at`` has the shape of ``row`` plus optional trailing axes."""
    extra = at.ndim - row.ndim
    idx = at[..., None] - shift.reshape(shift.shape[:1] + (1,) * extra + shift.shape[1:])
    rr = row.reshape(row.shape + (1,) * (extra + 1))
    val = cum[rr, np.clip(idx, 0, cum.shape[1] - 1)]
    rw = r.reshape(r.shape[:1] + (1,) * extra + r.shape[1:])
    return (np.where(idx >= 0, val, 0.0) * rw).sum(axis=-1)


@dataclass(frozen=True)
class _Level:
    lower: np.ndarray      # per query: P(R+ <= t), a lower bound on P(R <= t)
    upper: np.ndarray      # per query: P(R- <= t), an upper bound
    up: np.ndarray         # per query's row: cumulative P(W+/h <= k), k < cells
    row: np.ndarray        # per query: its row in ``up``
    h: np.ndarray          # per query: the lattice step (ms)


def _level(queues: Queues, queries: Queries, cells: int, steps: np.ndarray, refute: bool = True) -> _Level:
    """One lattice for the devices ``queries`` ask about; ``refute=False`` skips the rounded-down lattice
    (``upper`` is then 1: nothing refuted)."""
    rows, row = np.unique(queries.queue, return_inverse=True)
    down, up = _wait_cdfs(queues, rows, steps[rows], cells, down=refute)
    h = steps[queries.queue]
    hq = h[:, None]
    t_lo = np.floor(queries.t_ms / h * (1.0 - _ROUND)).astype(np.intp)    # P(R+ <= t) = P(R+ <= t_lo h)
    t_hi = np.floor(queries.t_ms / h * (1.0 + _ROUND)).astype(np.intp)
    s_dn = np.maximum(np.floor(queries.y / hq * (1.0 - _ROUND)), 0).astype(np.intp)
    lower = _gather(up, row, np.minimum(t_lo, cells - 1), _up_shift(queries.y, hq), queries.r)
    lower = np.where(t_lo >= 0, lower, 0.0)
    upper = np.ones(t_hi.size) if down is None else \
        np.where(t_hi < cells, _gather(down, row, np.minimum(t_hi, cells - 1), s_dn, queries.r), 1.0)
    return _Level(lower, upper, up, row, h)


def cdf_brackets(queues: Queues, queries: Queries, cells: int = LEVELS[0]) -> tuple[np.ndarray, np.ndarray]:
    """``(lower, upper)``: ``lower[j] <= P(R <= t_j) <= upper[j]`` for every query (up to ``CDF_ERR``,
    which the caller allows for), by (1) on a lattice of ``cells`` cells per device with step ``t_max /
    (cells - 1)`` (``t_max`` the device's largest query time). The devices asked must have ``0 < rho < 1``
    and their query times must be positive."""
    lv = _level(queues, queries, cells, _steps(queues, queries, cells))
    return lv.lower, lv.upper


def decide_quantiles(queues: Queues, queries: Queries, levels: tuple[int, ...] = LEVELS,
                     want_upper: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(ok, upper_ms)`` per query: ``ok[j]`` when the ``q[j]``-quantile of R is certainly at most ``t_j``
    (ms), i.e. the rounded-up lattice reaches ``q[j] + CDF_ERR`` by ``t_j`` on some level of ``levels``
    (coarse first; a finer level only for the queries still open: neither certified nor refuted), else
    not. A query refuted by the rounded-down lattice (its CDF below ``q[j] - CDF_ERR`` at ``t_j``) is
    final, since every finer level refutes it too; so is ``t_j <= 0``. ``upper_ms[j]``: for queries with
    ``want_upper``, an upper bound on the quantile from the lattice of the level that decided (``inf``
    when beyond the grid); for the others ``t_j`` when ok, else ``inf``. It exceeds ``t_j`` exactly
    when the answer is no.

    A device's lattice depends only on the device and its own queries (the largest ``t``), not on the
    other devices asked in the same call: ask every percentile tenant of a device, always, for the same
    answer everywhere."""
    ok, upper_ms, _ = _decide(queues, queries, levels, want_upper, None, False)
    return ok, upper_ms


def first_fit_quantiles(queues: Queues, queries: Queries, known_ok: np.ndarray,
                        levels: tuple[int, ...] = LEVELS) -> tuple[np.ndarray, np.ndarray]:
    """:func:`decide_quantiles` for devices in order of preference, when only the first device whose
    queries all hold matters: ``(ok, undecided)`` per query. ``known_ok`` marks queries already known to
    hold (not evaluated; a device's lattice still spans all its queries, so the answers are those of
    :func:`decide_quantiles`). After each level, the queries still open on devices after the first
    device certified in full are dropped (``undecided``, with ``ok`` False): that device wins whatever
    they would say."""
    ok, _, undecided = _decide(queues, queries, levels, None, known_ok, True)
    return ok, undecided


def _decide(queues: Queues, queries: Queries, levels: tuple[int, ...], want_upper: np.ndarray | None,
            known_ok: np.ndarray | None, first_fit: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    assert queries.q is not None
    q_all = queries.q  # the quantile level per query; `q_all[open_]` is `queries.take(open_).q`
    nq = queries.t_ms.size
    ok = np.zeros(nq, dtype=bool) if known_ok is None else np.asarray(known_ok, dtype=bool).copy()
    undecided = np.zeros(nq, dtype=bool)
    upper_ms = np.where(ok, queries.t_ms, np.inf)
    want = np.zeros(nq, dtype=bool) if want_upper is None else np.asarray(want_upper, dtype=bool)
    open_ = np.flatnonzero((queries.t_ms > 0) & ~ok)
    positive = queries.t_ms > 0
    nqueue = queues.lam_per_ms.size
    for li, cells in enumerate(levels):
        if first_fit and open_.size:
            # the first device with every query settled true wins: later devices need no finer lattice
            failing = np.zeros(nqueue, dtype=bool)
            failing[queries.queue[~ok]] = True
            asked = np.zeros(nqueue, dtype=bool)
            asked[queries.queue] = True
            won = np.flatnonzero(asked & ~failing)
            if won.size:
                late = queries.queue[open_] > won[0]
                undecided[open_[late]] = True
                open_ = open_[~late]
        if not open_.size:
            break
        steps = _steps(queues, queries.take(np.flatnonzero(positive)), cells)
        sub = queries.take(open_)
        last = li == len(levels) - 1
        lv = _level(queues, sub, cells, steps, refute=not last)   # the last level refutes by default
        q = q_all[open_]
        good = lv.lower >= q + CDF_ERR
        done = good | (lv.upper < q - CDF_ERR) | last
        idx = open_[done]
        ok[idx] = good[done]
        upper_ms[idx] = np.where(good[done], sub.t_ms[done], np.inf)
        w = np.flatnonzero(done & want[open_])
        if w.size:
            cum = lv.up
            f = _gather(cum, lv.row[w], np.broadcast_to(np.arange(cells), (w.size, cells)),
                        _up_shift(sub.y[w], lv.h[w][:, None]), sub.r[w])
            f = np.maximum.accumulate(f, axis=1)
            for j, k in enumerate(w.tolist()):
                at = int(np.searchsorted(f[j], q[k] + CDF_ERR, side="left"))
                b = np.inf if at >= cells else at * float(lv.h[k])
                t = float(sub.t_ms[k])
                upper_ms[open_[k]] = min(b, t) if good[k] else max(b, np.nextafter(t, np.inf))
        open_ = open_[~done]
    return ok, upper_ms, undecided


def device_quantile_verdicts(tenants: Sequence[Tenant], which: Sequence[int], qs: Sequence[float],
                             t_ms: Sequence[float], want_upper: Sequence[bool] | None = None
                             ) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`decide_quantiles` for the tenants at ``which`` of one FCFS device (the Edge TPU switch mixture
    of ``perf.edgetpu``): is tenant ``which[j]``'s ``qs[j]``-quantile of the device response time at most
    ``t_ms[j]`` (ms)? ``None`` when a service law has a continuous part or ``rho`` is not in (0, 1)."""
    setup = device_laws(tenants)
    if setup is None:
        return None
    lam, laws, agg = setup
    if not agg.discrete or not all(laws[i].discrete for i in which) or not 0.0 < lam * agg.mean < 1.0:
        return None
    queues = Queues(np.array([lam]), np.array([[x for x, _ in agg.atoms]]), np.array([[p for _, p in agg.atoms]]))
    width = max(len(laws[i].atoms) for i in which)
    y = np.zeros((len(which), width))
    r = np.zeros((len(which), width))
    for j, i in enumerate(which):
        for k, (x, p) in enumerate(laws[i].atoms):
            y[j, k], r[j, k] = x, p
    queries = Queries(np.zeros(len(which), dtype=np.intp), y, r, np.asarray(t_ms, dtype=float),
                      np.asarray(qs, dtype=float))
    return decide_quantiles(queues, queries, want_upper=None if want_upper is None else np.asarray(want_upper))
