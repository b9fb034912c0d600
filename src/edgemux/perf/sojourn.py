"""Response-time laws (ms) where no exact law is known: the processor-sharing family, the lowest-priority
bound of GPU time-sharing, a CPU stage in tandem before the device. They give the p95/p99 (and, but on
the processor-sharing family, the p50) of the disciplines that P-K inversion (``perf.tails``) does not cover.

The common form: a request's response time, given what it starts with (its own service ``x``, or the work
``u`` it waits behind), is a shifted gamma matched to two moments (with an atom where the request may run
undisturbed), and the law is the mixture of those over the starting law (:class:`GammaMixture`, its
quantiles solved on the closed-form CDF; on a lattice only to be convolved). The means are exact wherever the discipline's mean estimator is
exact; the shape is the approximation, checked against the simulator by ``edgemux validate`` (the
``approx-tail`` rows of the families ps, mps, gpu-timeshare, batch and cpu-tandem: no quantile more than
10 % under the simulated one; the overestimate is reported).

* **M/G/1-PS** (aggregate rate ``lam``, ``E[S]``, ``E[S^2]``, ``rho = lam E[S]``): a request of size x
  stays ``T(x) >= x``, with ``E[T(x)] = x / (1 - rho)`` (exact) and
  ``Var T(x) = lam m2 / (1 - rho)^3 * (x - a (1 - exp(-x / a)))``, ``a = E[S] / (1 - rho)``,
  ``m2 = max(E[S^2], 2 E[S]^2)``. With ``m2 = 2 E[S]^2`` that is the exact M/M/1-PS variance (Coffman,
  Muntz & Trotter, J. ACM 17(1), 1970); with ``m2 = E[S^2]`` it has the exact slope of M/G/1-PS for long
  requests (the work arriving during a long sojourn is compound Poisson of variance ``lam E[S^2]`` per ms,
  stretched by ``1/(1-rho)``). The larger of the two is taken because the conditional variance is nearly
  insensitive at ordinary sizes: a simulated M/D/1-PS (2 M requests per point) gave 0.91-0.98 of the
  M/M/1 value at the mean size for rho 0.1-0.8, and 1.83-1.95 times the slope form's
  (``benchmarks/tail_sweeps.py --only md1ps``). The atom: with
  probability ``(1 - rho) e^(-lam x)`` the request finds the device idle and none arrives: ``T = x``.
* **M/G/c limited PS** (MPS, a CPU stage): the mean is exact (``x E[R] / E[S]``, ``perf.queueing``); the
  variance is the PS form at the load ``rho_eff = 1 - E[S] / E[R]`` that gives the exact mean slowdown; a
  request is never faster than alone (``x / min(1, c)``), and runs unslowed throughout at least when it
  finds at most ``floor(c - 1)`` others and none arrives (the atom,
  from the exact law of the number present).
* **GPU time-sharing** (the lowest-priority bound of ``perf.gpu.lowest_priority_bound``): the tagged request
  waits for the work ``U = W + x`` (W the exact P-K wait of all apps' work, by inversion) while the other
  apps' arrivals preempt it: a busy period started by U, of mean ``U / (1 - rho_H)`` and variance
  ``U lam_H E[S_H^2] / (1 - rho_H)^3`` (exact moments of a delay busy period), ``rho_H`` the other apps'
  load. Its mean is the bound's mean exactly, and the bound holds request by request (the docstring of
  ``lowest_priority_bound``), so its quantiles are upper estimates of the discipline's.
* **Batching**: :func:`batch_laws`.
* **Tandem** (CPU stage, then the device): the two stages' laws convolved, as if independent (means add
  exactly; the stages' sojourns are correlated, which the validation measures).

Units: ms, req/s (req/ms inside the formulas). Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.special import gammainc, gammaincinv

from edgemux.cluster.workload import CpuStage, Tenant
from edgemux.perf.gpu import BatchEstimate, aggregate_moments, batch_estimates
from edgemux.perf.queueing import limited_ps_at_most, limited_ps_response, per_ms
from edgemux.perf.result import Latency, Unstable
from edgemux.perf.tails import LatticeDistribution, convolve_pmfs, edgetpu_response_laws, support_ms
from edgemux.profiles.distributions import Distribution, second_moment

__all__ = [
    "CELLS",
    "GammaMixture",
    "Law",
    "as_lattice",
    "ps_laws",
    "limited_ps_laws",
    "timeshare_laws",
    "cpu_stage_law",
    "tandem",
    "capped",
    "batch_laws",
    "law_quantiles",
]

CELLS = 4096            # lattice points of a law: a cell is under 0.03 % of its span
_BINS = 32              # a starting law is grouped into at most this many points of equal mass order
_TOP = 1.0 - 1e-7       # the span covers every component up to this quantile
_START_CELLS = 8        # lattice cells per shortest mean of the P-K law a time-sharing law starts from
_SCAN = 33              # points of the CDF scan that brackets each quantile


def _starts(d: Distribution) -> tuple[np.ndarray, np.ndarray]:
    """The law of ``d`` (ms) as at most ``_BINS`` (value, mass) points: its lattice grouped by cumulative
    mass, each group at its mass-weighted mean (so the mean is kept)."""
    if d.var <= 0.0:
        return np.array([d.mean]), np.array([1.0])
    top = max(support_ms(d), d.mean)
    n = 4096
    dt = top / (n - 1)
    p = np.asarray(d.lattice(dt, n), dtype=float)
    p = p / p.sum()
    x = np.arange(n) * dt
    return _grouped(x, p)


def _grouped(x: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Points ``x`` (ms) of mass ``p`` as at most ``_BINS`` points: grouped by cumulative mass, each group
    at its mass-weighted mean (the mean is kept); negligible masses dropped."""
    keep = p > 1e-15
    x, p = x[keep], p[keep]
    if x.size <= _BINS:
        return x, p
    group = np.minimum((np.cumsum(p) - 0.5 * p) * _BINS, _BINS - 1).astype(np.intp)
    mass = np.bincount(group, weights=p, minlength=_BINS)
    first = np.bincount(group, weights=p * x, minlength=_BINS)
    used = mass > 0
    return first[used] / mass[used], mass[used]


@dataclass(frozen=True, eq=False)
class GammaMixture:
    """A law (ms): with mass ``weight[k]``, ``shift[k] + G_k`` where G_k is 0 with probability ``atom[k]``
    and else gamma of ``shape[k]`` and ``scale[k]``; a component with ``shape[k] == 0`` is a point mass at
    ``shift[k] + point[k]``. Quantiles are solved on the closed-form CDF (no lattice), so a law costs a few
    thousand incomplete-gamma evaluations; :meth:`lattice` gives it on a lattice for a convolution."""

    weight: np.ndarray
    shift: np.ndarray
    atom: np.ndarray
    shape: np.ndarray
    scale: np.ndarray
    point: np.ndarray

    @property
    def mean(self) -> float:
        """Mean (ms)."""
        g = self.shape > 0
        excess = np.where(g, (1.0 - self.atom) * self.shape * self.scale, self.point)
        return float(np.dot(self.weight, self.shift + excess))

    def cdf(self, t_ms: float | np.ndarray) -> np.ndarray:
        """``P(X <= t)`` at each of ``t_ms``."""
        t = np.atleast_1d(np.asarray(t_ms, dtype=float))[:, None]
        g = self.shape > 0
        rest = np.clip(t - self.shift, 0.0, None)
        part = np.where(g, self.atom * (t >= self.shift)
                        + (1.0 - self.atom) * gammainc(np.where(g, self.shape, 1.0), rest / np.where(g, self.scale, 1.0)),
                        (t >= self.shift + self.point).astype(float))
        return part @ self.weight

    def top(self) -> float:
        """A point (ms) beyond all but 1e-7 of every component."""
        g = self.shape > 0
        return float(np.max(np.where(g, self.shift + gammaincinv(np.where(g, self.shape, 1.0), _TOP) * self.scale,
                                     self.shift + self.point)))

    def quantile(self, q: float) -> float:
        """Smallest t (ms) with ``P(X <= t) >= q`` (to 1e-9 of the span, or of the level), ``0 < q < 1``."""
        return self.quantiles((q,))[0]

    def quantiles(self, qs: Sequence[float]) -> list[float]:
        """:meth:`quantile` at each of ``qs``: the CDF scanned at 33 points over the span, then every
        bracketing cell narrowed at once by the Illinois method (to 1e-9 of the span or of the level)."""
        if any(not 0.0 < q < 1.0 for q in qs):
            raise ValueError(f"quantile levels must be in (0, 1), got {list(qs)}")
        q = np.asarray(qs, dtype=float)
        lo0, hi0 = float(np.min(self.shift)), self.top()
        grid = np.linspace(lo0, hi0, _SCAN)
        c = self.cdf(grid)
        k = np.searchsorted(c, q, side="left")
        inside = (k > 0) & (k < grid.size)
        out = grid[np.minimum(k, grid.size - 1)].copy()
        if not inside.any():
            return [float(x) for x in out]
        kk = k[inside]
        qq = q[inside]
        a, b = grid[kk - 1].copy(), grid[kk].copy()
        fa, fb = c[kk - 1] - qq, c[kk] - qq                 # fa < 0 <= fb
        side = np.zeros(qq.size)
        tol = 1e-9 * max(hi0, 1.0)
        for _ in range(60):
            live = (b - a > tol) & (fb != 0.0)
            if not live.any():
                break
            # regula falsi, halving the stale end's value (Illinois); bisect where the step fails
            t = np.where(fb > fa, b - fb * (b - a) / np.where(fb > fa, fb - fa, 1.0), 0.5 * (a + b))
            t = np.where((a < t) & (t < b), t, 0.5 * (a + b))
            ft = self.cdf(t) - qq
            up = live & (ft >= 0.0)
            down = live & (ft < 0.0)
            fa = np.where(up & (side == 1), fa / 2.0, fa)
            fb = np.where(down & (side == -1), fb / 2.0, fb)
            b, fb = np.where(up, t, b), np.where(up, ft, fb)
            a, fa = np.where(down, t, a), np.where(down, ft, fa)
            side = np.where(up, 1, np.where(down, -1, side))
            fb = np.where(live & (np.abs(ft) <= 1e-10) & up, 0.0, fb)
        out[inside] = b
        return [float(x) for x in out]

    def lattice(self) -> LatticeDistribution:
        """The law on a lattice of ``CELLS`` points spanning it."""
        span = self.top()
        dt = span / (CELLS - 2) if span > 0 else 1.0
        edges = (np.arange(CELLS + 1) - 0.5) * dt            # point k stands for [(k - 1/2) dt, (k + 1/2) dt)
        pmf = np.clip(np.diff(self.cdf(edges)), 0.0, None)
        pmf[-1] += max(0.0, 1.0 - float(pmf.sum()))          # the sliver beyond the span
        return LatticeDistribution(dt, pmf)


Law = LatticeDistribution | GammaMixture
"""A response-time law (ms): on a lattice, or a gamma mixture in closed form."""


def as_lattice(law: Law) -> LatticeDistribution:
    """``law`` on a lattice (itself when it is one)."""
    return law if isinstance(law, LatticeDistribution) else law.lattice()


def _gamma_mixture(shift: np.ndarray, excess: np.ndarray, var: np.ndarray, mass: np.ndarray,
                   atom: np.ndarray | None = None) -> GammaMixture:
    """The mixture over components k (mass ``mass[k]``) of ``shift[k] + G_k``: G_k is 0 with probability
    ``atom[k]`` (default 0), else gamma, so that G_k has mean ``excess[k]`` and variance ``var[k]`` (a
    point mass at the mean where either is 0)."""
    atom = np.zeros_like(shift) if atom is None else np.clip(atom, 0.0, 1.0)
    rest = 1.0 - atom
    gam = (excess > 0) & (var > 0) & (rest > 1e-12)
    # the gamma part's moments given G_k > 0: E = excess / rest, E^2 = (var + excess^2) / rest
    safe = np.where(gam, rest, 1.0)
    m = excess / safe
    v = np.maximum((var + excess * excess) / safe - m * m, 0.0)
    gam &= v > 0
    shape = np.where(gam, m * m / np.where(gam, v, 1.0), 0.0)
    scale = np.where(gam, v / np.where(gam, m, 1.0), 0.0)
    return GammaMixture(np.asarray(mass, dtype=float) / float(np.sum(mass)), np.asarray(shift, dtype=float),
                        np.where(gam, atom, 0.0), shape, scale, np.where(gam, 0.0, excess))


def _indices(tenants: Sequence[Tenant], which: Sequence[int] | None) -> list[int]:
    return list(range(len(tenants))) if which is None else list(which)


def _ps_form(x: np.ndarray, rho: float, lam: float, lam_m2: float, es: float
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, variance, atom) of the PS sojourn of requests of sizes ``x`` (ms) at load ``rho`` with
    arrival rate ``lam`` (1/ms), ``lam_m2 = lam E[S^2]`` (ms) and aggregate mean ``es`` (ms): the module
    docstring's form; the atom is the probability of being served alone throughout (``T = x``)."""
    a = es / (1.0 - rho)
    mean = x / (1.0 - rho)
    var = lam_m2 / (1.0 - rho) ** 3 * (x - a * -np.expm1(-x / a)) if a > 0 else np.zeros_like(x)
    atom = (1.0 - rho) * np.exp(-lam * x)
    return mean, np.maximum(var, 0.0), atom


def ps_laws(tenants: Sequence[Tenant], *, where: str = "device", which: Sequence[int] | None = None
            ) -> list[GammaMixture | None] | Unstable:
    """Every tenant's device response law (ms) under M/G/1 egalitarian PS (module docstring), or those at
    ``which`` (the others None); ``Unstable`` when rho >= 1."""
    lam_rps, es, es2 = aggregate_moments(tenants)
    lam = per_ms(lam_rps)
    rho = lam * es
    if rho >= 1.0:
        return Unstable(rho, where)
    out: list[GammaMixture | None] = [None] * len(tenants)
    for i in _indices(tenants, which):
        x, p = _starts(tenants[i].service)
        mean, var, atom = _ps_form(x, rho, lam, lam * max(es2, 2.0 * es * es), es)
        out[i] = _gamma_mixture(x, mean - x, var, p, atom)
    return out


def _limited(services: Sequence[Distribution], rates_rps: Sequence[float], servers: float, *,
             where: str, which: Sequence[int] | None = None) -> list[GammaMixture | None] | Unstable:
    """Laws (ms) of classes with ``services`` at ``rates_rps`` sharing M/G/c limited PS of ``servers`` (of
    those at ``which``, the others None)."""
    lam = per_ms(math.fsum(rates_rps))
    if lam <= 0.0:
        es = math.fsum(d.mean for d in services) / len(services)
        es2 = math.fsum(second_moment(d) for d in services) / len(services)
    else:
        es = math.fsum(per_ms(r) * d.mean for r, d in zip(rates_rps, services)) / lam
        es2 = math.fsum(per_ms(r) * second_moment(d) for r, d in zip(rates_rps, services)) / lam
    if es <= 0.0:
        zero = np.zeros(1)
        return [GammaMixture(np.ones(1), zero, zero, zero, zero, zero) for _ in services]   # nothing to do
    r = limited_ps_response(1000.0 * lam, es, servers, where=where)
    if isinstance(r, Unstable):
        return r
    rho = max(0.0, 1.0 - es / float(r))        # the PS load with the exact mean slowdown E[R]/E[S]
    alone = 1.0 / min(1.0, servers)
    # a request runs unslowed while the others number at most j; it stays so throughout at least when it
    # finds at most j and none arrives (the atom is that lower estimate)
    j = max(0, math.floor(servers - 1.0)) if servers >= 1.0 else 0
    unslowed = limited_ps_at_most(1000.0 * lam, es, servers, j)
    out: list[GammaMixture | None] = [None] * len(services)
    for i in (range(len(services)) if which is None else which):
        x, p = _starts(services[i])
        lam_eff = rho / es                      # the PS arrival rate at that load
        _, var, _ = _ps_form(x, rho, lam_eff, lam_eff * max(es2, 2.0 * es * es), es)
        atom = unslowed * np.exp(-lam * x)
        mean = x * float(r) / es                # exact: E[R | x] = x E[R] / E[S]
        out[i] = _gamma_mixture(alone * x, np.maximum(mean - alone * x, 0.0), var, p, atom)
    return out


def limited_ps_laws(tenants: Sequence[Tenant], servers: float, *, where: str = "device",
                    which: Sequence[int] | None = None) -> list[GammaMixture | None] | Unstable:
    """Every tenant's device response law (ms) under M/G/c limited PS with ``servers`` (MPS; module
    docstring), or those at ``which``; ``Unstable`` when the work reaches ``servers``."""
    return _limited([t.service for t in tenants], [t.rate_rps for t in tenants], servers, where=where, which=which)


def cpu_stage_law(stage: CpuStage, rate_rps: float, *, where: str = "cpu") -> GammaMixture | Unstable:
    """The law (ms) of a CPU stage: ``stage.cores`` shared by limited PS among one app's requests."""
    laws = _limited([stage.service], [rate_rps], stage.cores, where=where)
    if isinstance(laws, Unstable):
        return laws
    assert laws[0] is not None
    return laws[0]


def timeshare_laws(tenants: Sequence[Tenant], *, where: str = "device", which: Sequence[int] | None = None
                   ) -> list[GammaMixture | None] | Unstable:
    """Every app's law (ms) under the lowest-priority bound of GPU time-sharing (module docstring), or
    those at ``which``: the exact P-K law of ``W + x`` stretched by the other apps' preemptions.
    ``Unstable`` when rho >= 1."""
    lam_rps, es, es2 = aggregate_moments(tenants)
    lam = per_ms(lam_rps)
    rho = lam * es
    if rho >= 1.0:
        return Unstable(rho, where)
    # U = W + x for every app at once (one P-K wait; time-sharing pays no switch)
    wanted = _indices(tenants, which)
    # (a coarse grid: the law is summarized in _BINS points right after)
    starts = edgetpu_response_laws([replace(t, switch_ms=0.0) for t in tenants], where=where, which=wanted,
                                   cells_per_mean=_START_CELLS)
    assert not isinstance(starts, Unstable)
    out: list[GammaMixture | None] = [None] * len(tenants)
    for i in wanted:
        # the other apps' rate, load and lam_H E[S_H^2]: the device's totals less this app's own
        # (none when the app is alone: no round-off left over)
        own = per_ms(tenants[i].rate_rps)
        alone = len(tenants) == 1
        lam_h = 0.0 if alone else max(lam - own, 0.0)
        rho_h = 0.0 if alone else max(rho - own * tenants[i].service.mean, 0.0)
        m2_h = 0.0 if alone else max(lam * es2 - own * second_moment(tenants[i].service), 0.0)
        u = starts[i]
        assert u is not None
        x, p = _grouped(np.arange(u.pmf.size) * u.dt_ms, u.pmf)
        stretch = 1.0 / (1.0 - rho_h)
        var = x * m2_h * stretch ** 3 if lam_h > 0 else np.zeros_like(x)
        out[i] = _gamma_mixture(x, x * (stretch - 1.0), var, p / p.sum())
    return out


def _erlang_cdf(j: int, lam: float, t: np.ndarray) -> np.ndarray:
    """``P(S_j <= t)`` for the j-th arrival time ``S_j`` of a Poisson process of rate ``lam`` (1/ms), S_0 = 0."""
    t = np.asarray(t, dtype=float)
    if j == 0:
        return np.where(t >= 0.0, 1.0, 0.0)
    return np.where(t > 0.0, gammainc(j, lam * np.clip(t, 0.0, None)), 0.0)


def _window_sf(lam: float, B: int, tau: float, w: np.ndarray) -> np.ndarray:
    """``P(W > w)`` for a random request's wait for its batch window to close (ms), when every window is
    opened by a request finding the device idle: it closes ``tau`` after its first request or at its B-th.
    The j-th request after the first (arriving at ``S_j``) waits ``min(tau - S_j, S_{B-1} - S_j)``, and is in
    the window when ``S_j <= tau``; the B-th waits 0."""
    if B <= 1 or tau <= 0.0 or lam <= 0.0:
        return np.zeros_like(w)
    n = math.fsum(float(_erlang_cdf(j, lam, np.array(tau))) for j in range(B))    # E[requests per window]
    out = np.zeros_like(w)
    for j in range(B - 1):
        out += _erlang_cdf(j, lam, tau - w) * (1.0 - _erlang_cdf(B - 1 - j, lam, w))
    return np.where(w < tau, out / n, 0.0)


def batch_laws(tenants: Sequence[Tenant], max_batch: int, timeout_ms: float, *, where: str = "device",
               estimates: tuple[dict[str, BatchEstimate] | Unstable, float] | None = None,
               which: Sequence[int] | None = None) -> list[LatticeDistribution | None] | Unstable:
    """Every tenant's response law (ms) on a batching device: the upper envelope (the larger quantile at
    every level) of a light-traffic and a heavy-traffic law, both with the batching chain's exact mean
    (``perf.gpu.batch_estimates``), on one lattice. The model's requests' own batch times ``T(b)`` follow
    the request's view of the chain's batch sizes (``b p(b) / E[b]``).

    * light: the wait for the window to close (:func:`_window_sf`), then for the batch in service (its
      residual, with the device's utilization as probability), then an exponential queue (probability the
      utilization) carrying whatever mean is left; bounded by the timeout where the load is light;
    * heavy: ``T(1)`` plus a gamma of shape 2 with the rest of the mean, the shape of a queue whose waits
      pile up (its overestimate at light load is what the envelope's other side covers).

    ``edgemux validate`` (family batch) checks it: no quantile under the simulated one beyond 10 %, the
    overestimate reported. ``estimates``: :func:`perf.gpu.batch_estimates`' answer when already computed.
    ``Unstable`` when even full batches cannot keep up."""
    est, u = estimates if estimates is not None else batch_estimates(tenants, max_batch, timeout_ms, where=where)
    if isinstance(est, Unstable):
        return est
    B, tau = int(max_batch), float(timeout_ms)
    # every batch of the device, weighted by its dispatch rate: the batch found in service
    sizes = np.arange(1, B + 1, dtype=float)
    rates = {m: per_ms(math.fsum(t.rate_rps for t in tenants if t.model == m)) for m in est}
    beta = {m: rates[m] / e.mean_batch for m, e in est.items()}
    busy: list[tuple[np.ndarray, np.ndarray]] = []
    for m, e in est.items():
        assert e.law is not None
        busy.append((e.law.k1_ms * sizes + e.law.k2_ms, beta[m] * np.asarray(e.batch_pmf)))
    all_t = np.concatenate([t for t, _ in busy])
    all_w = np.concatenate([w for _, w in busy])
    all_w = all_w / all_w.sum() if all_w.sum() > 0 else np.full(all_w.size, 1.0 / all_w.size)
    mean_t = float(np.dot(all_w, all_t))
    # one lattice for all: the span covers the heavy laws' far quantile and the light laws' queues
    spans = [tau + float(all_t.max())]
    for m, e in est.items():
        assert e.law is not None
        excess = max(e.response_ms - e.law.batch_ms(1), 0.0)
        spans.append(e.law.batch_ms(1) + gammaincinv(2.0, _TOP) * excess / 2.0)
    dt = max(spans) / (CELLS - 2)
    x = np.arange(CELLS) * dt
    edges = (np.arange(CELLS + 1) - 0.5) * dt
    # residual of the batch in service: density P(T > r) / E[T], with probability u
    resid_sf = (all_t[None, :] > x[:, None]) @ all_w                   # P(T > r) at every lattice point
    resid = u * resid_sf * dt / mean_t if mean_t > 0 else np.zeros(CELLS)
    resid[0] += max(0.0, 1.0 - float(resid.sum()))
    laws: dict[str, LatticeDistribution] = {}
    models = {tenants[i].model for i in _indices(tenants, which)}
    for m, e in est.items():
        if m not in models:
            continue
        assert e.law is not None
        p = np.asarray(e.batch_pmf) * sizes
        p = p / p.sum()
        own = np.zeros(CELLS)                                    # the request's own batch time T(b)
        for pb, tb in zip(p, e.law.k1_ms * sizes + e.law.k2_ms):
            own[min(int(round(tb / dt)), CELLS - 1)] += pb
        dispatch = e.response_ms - float(np.dot(p, e.law.k1_ms * sizes + e.law.k2_ms))
        sf = _window_sf(rates[m], B, tau, edges)
        window = np.clip(-np.diff(sf), 0.0, None)
        window[0] += max(0.0, 1.0 - float(window.sum()))
        light = convolve_pmfs(convolve_pmfs(window, resid), own)
        left = dispatch - float(np.dot(x, window)) - float(np.dot(x, resid))
        if left > 0.0 and u > 0.0:
            cdf = -np.expm1(-np.clip(edges, 0.0, None) * u / left)
            queue = u * np.diff(cdf)
            queue[0] += 1.0 - u
            light = convolve_pmfs(light, queue)
        t1 = e.law.batch_ms(1)
        heavy = _gamma_mixture(np.array([t1]), np.array([max(e.response_ms - t1, 0.0)]),
                               np.array([max(e.response_ms - t1, 0.0) ** 2 / 2.0]), np.array([1.0]))
        heavy_cdf = heavy.cdf(x + 0.5 * dt)
        cdf = np.minimum(np.cumsum(light), heavy_cdf)          # the larger quantile at every level
        cdf[-1] = 1.0
        pmf = np.diff(np.concatenate([[0.0], np.maximum.accumulate(cdf)]))
        laws[m] = LatticeDistribution(dt, pmf)
    return [laws.get(t.model) for t in tenants]


def tandem(first: Law, second: Law) -> LatticeDistribution:
    """The law (ms) of the sum of two independent laws, on the coarser of their lattices."""
    one, two = as_lattice(first), as_lattice(second)
    dt = max(one.dt_ms, two.dt_ms)
    a, b = _regrid(one, dt), _regrid(two, dt)
    pmf = convolve_pmfs(np.pad(a, (0, b.size - 1)), b)      # the whole support of the sum
    return LatticeDistribution(dt, pmf / pmf.sum())


def _regrid(law: LatticeDistribution, dt: float) -> np.ndarray:
    """``law``'s mass moved onto a lattice of step ``dt`` >= its own, split linearly (keeps the mean)."""
    if dt == law.dt_ms:
        return law.pmf
    pos = np.arange(law.pmf.size) * law.dt_ms / dt
    lo = np.floor(pos).astype(np.intp)
    frac = pos - lo
    out = np.zeros(int(lo[-1]) + 2)
    np.add.at(out, lo, law.pmf * (1.0 - frac))
    np.add.at(out, lo + 1, law.pmf * frac)
    return out


def capped(law: LatticeDistribution, bound_ms: float) -> LatticeDistribution:
    """``min(X, bound_ms)`` for X of ``law``: the mass beyond the bound moved onto it (a worst-case bound
    that holds for every request, ``perf.periodic``)."""
    k = int(math.floor(bound_ms / law.dt_ms + 0.5))
    if k >= law.pmf.size - 1:
        return law
    pmf = law.pmf[: k + 1].copy()
    pmf[k] += float(law.pmf[k + 1:].sum())
    return LatticeDistribution(law.dt_ms, pmf)


def law_quantiles(law: Law | Unstable, qs: Sequence[float], shift_ms: float = 0.0
                  ) -> list[Latency]:
    """``law``'s quantiles (ms) at ``qs``, plus ``shift_ms`` (a constant such as the network latency)."""
    if isinstance(law, Unstable):
        return [law for _ in qs]
    return [q + shift_ms for q in law.quantiles(qs)]
