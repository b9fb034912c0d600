"""Response-time percentiles (p95, p99, any quantile) of M/G/1-FCFS devices, the Edge TPU included.

None of the papers gives tails; edgemux inverts the Pollaczek-Khinchine transform numerically.

Method
------
In M/G/1-FCFS the stationary waiting time is a geometric sum (Pollaczek-Khinchine / Benes):
``W = X_1 + ... + X_K`` with ``P(K = k) = (1 - rho) rho^k`` and ``X_j`` i.i.d. with the equilibrium
(residual) density ``f_e(x) = P(S > x) / E[S]``. On a lattice of step ``dt`` the generating function of W
is ``(1 - rho) / (1 - rho phi_e)``, with ``phi_e`` that of the discretized ``f_e``; evaluating it at the
N-th roots of unity (one FFT) and transforming back (one inverse FFT) gives W's probability mass on the
grid. A tagged request of tenant i then sees ``R_i = W + S_i`` with ``S_i`` its own service time (for the
Edge TPU ``e_i + o_i`` with probability ``1 - q_i``, else ``e_i``); the sum is one more FFT product.
Quantiles are read from the cumulative mass by linear interpolation.

Discretization. Service distributions come from ``Distribution.lattice`` (mass at grid points, cell mass
centred so the mean is kept). The residual's cell ``[k dt, (k+1) dt)`` gets ``P(S' > k) / E[S']`` (exact
for a lattice service ``S'``), split between the cell's two end points (mean kept). ``rho`` is the exact
``lam E[S]`` (not the lattice's): in heavy traffic the tail decays like ``1 - rho``, so a lattice error of
1e-5 in the mean would move p99 by 1e-3 at rho = 0.99.

Grid length. The DFT wraps any mass beyond the grid back onto it (aliasing), so the grid must hold all but
a negligible tail. The Cramér-Lundberg inequality bounds the waiting-time tail,
``P(W > t) <= exp(-theta t)``, where ``theta > 0`` solves ``lam (M_S(theta) - 1) = theta`` (``M_S`` the
service moment generating function, computed on a coarse lattice). The grid spans
``ln(1e11) / theta`` (1.1 x margin) plus the support of the service times (the point beyond which they hold
less than 1e-12), so the wrapped mass is below ~1e-11; the grid size is a power of two between 2^14 and
2^22 points with ``dt`` at most 1/64 of the smallest mean service time.

Accuracy (tests): M/M/1 response quantiles within 0.5 % of ``ln(1/(1-q)) / (mu - lam)`` and the M/D/1
waiting-time CDF within 1e-3 of the Erlang (Crommelin) formula up to rho = 0.95.

Not covered: the one-step correlation of Edge TPU services (see ``perf.edgetpu``); a tagged request's
switch is treated as independent of the wait it sees. Units: ms, req/s. Pure functions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, localcontext
from functools import lru_cache

import numpy as np
from scipy.optimize import brentq

from edgemux.cluster.workload import Tenant
from edgemux.perf.edgetpu import service_mixture, tenant_services
from edgemux.perf.queueing import per_ms
from edgemux.perf.result import Latency, Unstable
from edgemux.profiles.distributions import Distribution, LatticeMemo, lattice

__all__ = [
    "LatticeDistribution",
    "support_ms",
    "lundberg_exponent",
    "mg1_waiting_distribution",
    "mg1_response_distribution",
    "mg1_response_quantiles",
    "edgetpu_response_quantiles",
    "edgetpu_response_laws",
    "plan_grid",
    "convolve_pmfs",
    "mm1_response_quantile",
    "md1_waiting_cdf",
]

_TAIL = 1e-11          # mass allowed beyond the grid
_SUPPORT_TAIL = 1e-12  # a service time's "support" ends where less than this is left beyond it
_MIN_N = 1 << 14
_MAX_N = 1 << 22
_CELLS_PER_MEAN = 64


@dataclass(frozen=True)
class LatticeDistribution:
    """A distribution (ms) given as probability mass ``pmf[k]`` at ``k * dt_ms``; each point stands for the
    cell ``[(k - 1/2) dt, (k + 1/2) dt)``."""

    dt_ms: float
    pmf: np.ndarray

    @property
    def mean(self) -> float:
        """Mean (ms)."""
        return float(np.dot(np.arange(self.pmf.size), self.pmf) * self.dt_ms)

    def cdf(self, t_ms: float | np.ndarray) -> float | np.ndarray:
        """``P(X <= t)`` (interpolated between cell edges)."""
        cum = np.cumsum(self.pmf)
        x = (np.arange(self.pmf.size) + 0.5) * self.dt_ms
        out = np.interp(t_ms, x, cum, left=float(self.pmf[0]), right=1.0)
        out = np.where(np.asarray(t_ms) < 0, 0.0, out)
        return float(out) if np.ndim(t_ms) == 0 else out

    def quantile(self, q: float) -> float:
        """Smallest t (ms) with ``P(X <= t) >= q``, interpolated between cell edges; ``0 < q < 1``."""
        return self._quantile(q, np.cumsum(self.pmf))

    def quantiles(self, qs: Sequence[float]) -> list[float]:
        """:meth:`quantile` at each of ``qs`` (one cumulative sum)."""
        cum = np.cumsum(self.pmf)
        return [self._quantile(q, cum) for q in qs]

    def _quantile(self, q: float, cum: np.ndarray) -> float:
        if not 0.0 < q < 1.0:
            raise ValueError(f"quantile level must be in (0, 1), got {q}")
        k = int(np.searchsorted(cum, q, side="left"))
        if k >= cum.size:
            return (cum.size - 0.5) * self.dt_ms
        hi_x = (k + 0.5) * self.dt_ms
        if k == 0:
            return 0.0  # the first point stands for [0, dt/2): the atom at 0 and a sliver of mass
        lo_x = (k - 0.5) * self.dt_ms
        lo_c, hi_c = float(cum[k - 1]), float(cum[k])
        if hi_c <= lo_c:
            return hi_x
        return lo_x + (q - lo_c) / (hi_c - lo_c) * self.dt_ms


def support_ms(d: Distribution) -> float:
    """A point (ms) beyond which ``d`` holds less than 1e-12 of its mass (found on its own lattice by
    doubling). Used to size the DFT grid. Memoized for hashable distributions (a pure function)."""
    try:
        return _support_cached(d)
    except TypeError:  # an unhashable distribution
        return _support(d)


@lru_cache(maxsize=8192)
def _support_cached(d: Distribution) -> float:
    return _support(d)


def _support(d: Distribution) -> float:
    x = d.mean + 10.0 * math.sqrt(max(d.var, 0.0))
    if not x > 0:
        x = 1.0
    for _ in range(60):
        n = 4097
        mass = lattice(d, x / (n - 1), n, {})  # a device's mixture: its few distinct laws once each
        if mass[-1] < _SUPPORT_TAIL:
            return x
        x *= 2.0
    return x


def _lattice_mgf_root(lam: float, mass: np.ndarray, dt: float, mean: float) -> float:
    """theta > 0 with ``lam (sum_k mass_k exp(theta k dt) - 1) = theta`` (per ms)."""
    xs = np.arange(mass.size) * dt
    pos = mass > 0
    logm = np.log(mass[pos])
    xp = xs[pos]

    def h(theta: float) -> float:
        z = logm + theta * xp
        top = float(z.max())
        if top > 700.0:
            return math.inf
        return lam * (float(np.exp(z).sum()) - 1.0) - theta

    hi = 1.0 / mean
    while h(hi) <= 0.0:
        hi *= 2.0
    lo = hi
    while True:  # h < 0 just above 0 because h'(0) = rho - 1 < 0; find such a point below the root
        lo /= 2.0
        if h(lo) < 0.0:
            break
        if lo < 1e-300:
            return lo
    return brentq(h, lo, hi, xtol=1e-12 * hi, rtol=1e-10)


def lundberg_exponent(rate_rps: float, service: Distribution) -> float:
    """The Cramér-Lundberg exponent theta (1/ms): ``P(W > t) <= exp(-theta t)`` for M/G/1-FCFS, the root
    of ``lam (E[exp(theta S)] - 1) = theta`` (computed on a lattice of the service time). Requires
    ``0 < rho < 1``."""
    lam = per_ms(rate_rps)
    m = service.mean
    if not (lam > 0 and m > 0 and lam * m < 1):
        raise ValueError("the Lundberg exponent needs 0 < rho < 1")
    return _lundberg(lam, service, support_ms(service))


def _lundberg(lam: float, service: Distribution, ls: float) -> float:
    m = service.mean
    n = 4097
    dt = ls / (n - 1)
    return _lattice_mgf_root(lam, lattice(service, dt, n, {}), dt, m)


@dataclass(frozen=True)
class _Waiting:
    dt: float
    n: int
    fft: np.ndarray  # rfft of W's pmf on the grid
    rho: float


def plan_grid(rate_rps: float, service: Distribution, owns: Sequence[Distribution],
              cells_per_mean: int = _CELLS_PER_MEAN) -> tuple[float, int]:
    """Grid step (ms) and size (cells) for the wait of M/G/1-FCFS with aggregate ``service`` at ``rate_rps``
    plus the longest of the ``owns`` service times (module doc: its span and step). ``cells_per_mean``: the
    resolution of the shortest mean (fewer for a law only summarized afterwards, ``perf.sojourn``); the
    smallest grid shrinks with it."""
    lam = per_ms(rate_rps)
    ls = support_ms(service)
    own_support = max((support_ms(o) for o in owns), default=0.0)
    m = service.mean
    if lam * m > 0 and not (m > 0 and lam * m < 1):
        raise ValueError("the Lundberg exponent needs 0 < rho < 1")
    theta = _lundberg(lam, service, ls) if lam * m > 0 else math.inf
    lw = 1.1 * math.log(1.0 / _TAIL) / theta if math.isfinite(theta) else 0.0
    length = lw + ls + own_support
    means = [d.mean for d in (service, *owns) if d.mean > 0]
    scale = min(means) if means else length
    n = max(1 << 10, _MIN_N * cells_per_mean // _CELLS_PER_MEAN)
    while n < _MAX_N and (length / n > scale / cells_per_mean):
        n *= 2
    return length / (n - 1), n


def _waiting(rate_rps: float, service: Distribution, dt: float, n: int, memo: LatticeMemo | None = None
             ) -> _Waiting:
    lam = per_ms(rate_rps)
    s = np.asarray(lattice(service, dt, n, memo), dtype=float)
    s = s / s.sum()
    mean_cells = float(np.dot(np.arange(n), s))
    rho = lam * service.mean  # the exact rho: the heavy-traffic tail decays like (1 - rho), so keep it exact
    if mean_cells <= 0.0 or rho <= 0.0:
        w = np.zeros(n)
        w[0] = 1.0
        return _Waiting(dt, n, np.fft.rfft(w), 0.0)
    cell = np.cumsum(s)                           # in place below: each new array at 16k cells is a mapping
    np.subtract(1.0, cell, out=cell)
    np.clip(cell, 0.0, None, out=cell)            # P(S' > k), S' in cells
    cell /= mean_cells                            # residual mass on cell [k, k+1)
    r = 0.5 * cell
    r[1:] += 0.5 * cell[:-1]
    phi = np.fft.rfft(r)
    wf = (1.0 - rho) / (1.0 - rho * phi)
    return _Waiting(dt, n, wf, rho)


def convolve_pmfs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Two pmfs on one lattice convolved (the law of the sum), truncated to ``a``'s length with the mass
    beyond it kept in the last cell (zero-padded FFT: no wrap-around)."""
    n = a.size
    size = 1 << (n + b.size - 2).bit_length()
    c = np.clip(np.fft.irfft(np.fft.rfft(a, size) * np.fft.rfft(b, size), size)[:n], 0.0, None)
    c[-1] += max(0.0, float(a.sum() * b.sum()) - float(c.sum()))
    return c


def _to_pmf(fft: np.ndarray, n: int) -> np.ndarray:
    p = np.fft.irfft(fft, n)
    np.clip(p, 0.0, None, out=p)   # in place: at 16k cells and more every new array is a fresh mapping
    p /= p.sum()
    return p


def mg1_waiting_distribution(rate_rps: float, service: Distribution, *,
                             where: str = "device") -> LatticeDistribution | Unstable:
    """The stationary waiting-time distribution (ms) of M/G/1-FCFS with aggregate service ``service``, by
    DFT inversion of the Pollaczek-Khinchine transform (module docstring). ``Unstable`` when rho >= 1."""
    lam = per_ms(rate_rps)
    rho = lam * service.mean
    if rho >= 1.0:
        return Unstable(rho, where)
    if rho <= 0.0:
        return LatticeDistribution(1.0, np.array([1.0]))
    dt, n = plan_grid(rate_rps, service, ())
    w = _waiting(rate_rps, service, dt, n)
    return LatticeDistribution(dt, _to_pmf(w.fft, n))


def mg1_response_distribution(rate_rps: float, service: Distribution, own: Distribution | None = None, *,
                              where: str = "device") -> LatticeDistribution | Unstable:
    """The response-time distribution (ms) ``R = W + S_own`` of a request whose own service time is
    ``own`` (default: ``service``, single class), W the M/G/1-FCFS wait for aggregate ``service``."""
    own = service if own is None else own
    lam = per_ms(rate_rps)
    rho = lam * service.mean
    if rho >= 1.0:
        return Unstable(rho, where)
    dt, n = plan_grid(rate_rps, service, (own,))
    w = _waiting(rate_rps, service, dt, n)
    o = np.asarray(own.lattice(dt, n), dtype=float)
    return LatticeDistribution(dt, _to_pmf(w.fft * np.fft.rfft(o / o.sum()), n))


def mg1_response_quantiles(rate_rps: float, service: Distribution, own: Distribution | None = None,
                           qs: Sequence[float] = (0.95, 0.99), *, where: str = "device") -> list[Latency]:
    """Response-time quantiles (ms) of M/G/1-FCFS (e.g. p95, p99) for a request with service ``own``
    (default ``service``). No paper equation: numerical P-K inversion (module docstring)."""
    r = mg1_response_distribution(rate_rps, service, own, where=where)
    if isinstance(r, Unstable):
        return [r for _ in qs]
    return [r.quantile(q) for q in qs]


def edgetpu_response_laws(tenants: Sequence[Tenant], *, where: str = "device",
                          which: Sequence[int] | None = None, cells_per_mean: int = _CELLS_PER_MEAN
                          ) -> list[LatticeDistribution | None] | Unstable:
    """Per-tenant response-time laws (ms) on a shared Edge TPU, tenants' order: W from the P-K inversion with
    the switch mixture of Ibis Eq. 1-2 (``perf.edgetpu.service_mixture``), convolved with each tenant's own
    ``e_i (+ o_i)`` service. One W is computed for all tenants. ``which``: indices of the tenants wanted
    (default all); the others get None. The grid is planned from every tenant either way, so a tenant's
    law does not depend on ``which``. ``cells_per_mean``: as for :func:`plan_grid`. ``Unstable`` when
    rho >= 1."""
    wanted = range(len(tenants)) if which is None else which
    lam_rps = math.fsum(t.rate_rps for t in tenants)
    agg = service_mixture(tenants)
    rho = per_ms(lam_rps) * agg.mean
    if rho >= 1.0:
        return Unstable(rho, where)
    owns = tenant_services(tenants)
    dt, n = plan_grid(lam_rps, agg, owns, cells_per_mean)
    # one memo for the grid: the aggregate and the tenants' own laws are mixtures of the same few models' laws
    memo: LatticeMemo = {}
    w = _waiting(lam_rps, agg, dt, n, memo)
    by_own: dict[Distribution, LatticeDistribution] = {}  # tenants of one model share one own law, so one law
    out: list[LatticeDistribution | None] = [None] * len(tenants)
    for i in wanted:
        law = by_own.get(owns[i])
        if law is None:
            ol = np.asarray(lattice(owns[i], dt, n, memo), dtype=float)
            law = by_own[owns[i]] = LatticeDistribution(dt, _to_pmf(w.fft * np.fft.rfft(ol / ol.sum()), n))
        out[i] = law
    return out


def edgetpu_response_quantiles(tenants: Sequence[Tenant], qs: Sequence[float] = (0.95, 0.99), *,
                               where: str = "device", which: Sequence[int] | None = None
                               ) -> list[list[Latency]]:
    """Per-tenant response-time quantiles (ms) on a shared Edge TPU (``qs`` per tenant, tenants' order),
    from :func:`edgetpu_response_laws`; the tenants not in ``which`` get an empty list."""
    if not tenants:
        return []
    wanted = range(len(tenants)) if which is None else which
    laws = edgetpu_response_laws(tenants, where=where, which=which)
    if isinstance(laws, Unstable):
        return [[laws for _ in qs] if i in wanted else [] for i in range(len(tenants))]
    by_law: dict[int, list[Latency]] = {}  # tenants of one model share one law: its quantiles once
    out: list[list[Latency]] = []
    for law in laws:
        if law is None:
            out.append([])
            continue
        got = by_law.get(id(law))
        if got is None:
            got = by_law[id(law)] = list(law.quantiles(qs))
        out.append(list(got))
    return out


def mm1_response_quantile(rate_rps: float, mean_ms: float, q: float, *, where: str = "device") -> Latency:
    """Closed form for M/M/1-FCFS: ``P(R > t) = exp(-(mu - lam) t)``, so the q-quantile is
    ``ln(1/(1-q)) / (mu - lam)`` (ms). Reference for the numerical inversion."""
    lam = per_ms(rate_rps)
    rho = lam * mean_ms
    if rho >= 1.0:
        return Unstable(rho, where)
    return math.log(1.0 / (1.0 - q)) / (1.0 / mean_ms - lam)


def md1_waiting_cdf(rate_rps: float, service_ms: float, t_ms: float) -> float:
    """Exact M/D/1-FCFS waiting-time CDF (Erlang 1909, Crommelin 1932):
    ``P(W <= t) = (1 - rho) sum_{k=0}^{floor(t/D)} (lam (k D - t))^k / k! exp(-lam (k D - t))``.

    The alternating sum cancels catastrophically for large ``lam t``, so it is evaluated in decimal
    arithmetic with enough digits (terms reach ``exp(2 lam t)``: ``2 lam t / ln 10`` digits more than double
    precision). Reference for the numerical inversion; ``rho < 1`` required.
    """
    lam = per_ms(rate_rps)
    d = service_ms
    rho = lam * d
    if not (0.0 <= rho < 1.0):
        raise ValueError(f"M/D/1 CDF needs 0 <= rho < 1, got {rho}")
    if t_ms < 0:
        return 0.0
    digits = 30 + int(2.0 * lam * t_ms / math.log(10.0)) + 2 * int(math.log10(t_ms / d + 2.0))
    with localcontext() as ctx:
        ctx.prec = digits
        L, D, T = Decimal(float(lam)), Decimal(float(d)), Decimal(float(t_ms))
        total = Decimal(0)
        fact = Decimal(1)
        for k in range(int(math.floor(t_ms / d)) + 1):
            if k > 0:
                fact *= k
            x = L * (k * D - T)
            power = Decimal(1) if k == 0 else x**k  # Decimal refuses 0**0
            total += power / fact * (-x).exp()
        return float((1 - L * D) * total)
