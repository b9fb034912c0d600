"""Controlled spatial sharing (Dhakal et al., papers/002 §IV-B, §IV-D; GSLICE): share curves, the knee,
the ``spatial`` discipline's estimator and the Multi-Model primitive.

A **share curve** lists ``(share, ms)`` points: the latency of one request of a model running alone with
that share of a device (a GPU's SM percentage, a CPU's intra-op threads over its cores). Past its **knee**
more share buys (almost) no latency, so several instances at the knee serve more than one instance with
the whole device. A curve must be non-increasing in share; measured curves carry noise (Dhakal's own
MobileNet points are 1.003 ms at 15 % and 1.023 ms at 100 %, +2 % the "wrong" way), so a point may exceed a
point at a smaller share by at most :data:`CURVE_NOISE`; more is refused as a curve that is not
non-increasing.

On a ``spatial`` device each tenant runs ``instances`` instances, each holding ``share`` of the device and
serving one request at a time at the latency of that share; a tenant's instances take its requests from one
FIFO queue and tenants do not slow each other down (CSS isolates them, Dhakal Fig. 1c), so each tenant is
an M/G/k queue of its own (k = ``instances``). The estimator (:func:`spatial_responses`):

* k = 1: M/G/1 Pollaczek-Khinchine, exact; p95/p99 by numerical inversion (``perf.tails``), exact up to
  the lattice.
* k > 1: the Lee-Longton (Allen-Cunneen) approximation ``W = C(k, a) E[S] / (k (1 - rho)) (1 + c_s^2) / 2``
  with Erlang C; exact for exponential service, within a few percent otherwise at the loads admission
  allows (``edgemux validate --family spatial`` states the error against the simulator). p95/p99 from the
  matching waiting-time law (no wait with probability 1 - C, else exponential with the conditional mean)
  convolved with the service time.

Units: ms, req/s; shares are fractions of one device in (0, 1]. Pure functions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from edgemux.cluster.workload import Tenant, check_shares, shares_used
from edgemux.perf.queueing import erlang_c, per_ms
from edgemux.perf.result import Latency, Unstable
from edgemux.perf.tails import LatticeDistribution, convolve_pmfs, mg1_response_distribution
from edgemux.profiles.distributions import Distribution, Scaled, scv, second_moment

__all__ = [
    "CURVE_NOISE", "KNEE_TOLERANCE", "ShareCurve", "SpatialPlan", "check_curve", "latency_at", "slowdown",
    "knee", "at_share", "shares_used", "check_shares", "mgk_response", "mgk_law", "mgk_quantiles", "spatial_responses",
    "spatial_quantiles", "multi_model",
]

ShareCurve = tuple[tuple[float, float], ...]
"""``((share, ms), ...)`` sorted by share: a model's latency alone at each share of a device."""

CURVE_NOISE = 0.05
"""How much (relative) a curve's latency at a larger share may exceed its latency at a smaller share and
still count as non-increasing (measurement noise; see the module docstring)."""

KNEE_TOLERANCE = 0.15
"""The knee is the smallest share whose latency is within this fraction of the latency at the curve's
largest share. Dhakal define the knee only in words ("after a certain knee GPU%, further reduction in
latency is slight or nonexistent", §IV-B); their Multi-Model's own choices in Table IV accept up to +13.2 %
(ResNet-50: 29.1 ms at 2 x 50 % against 25.7 ms at 100 %; AlexNet +11.8 %, VGG-19 +8.9 %, MobileNet
+5.2 %), so edgemux reads "slight" as within 15 %."""

_EPS = 1e-9


def check_curve(points: Sequence[tuple[float, float]], *, where: str = "share curve") -> ShareCurve:
    """``points`` as a valid :data:`ShareCurve` (sorted by share), or ``ValueError`` naming the problem:
    no points, a share outside (0, 1], a repeated share, a latency that is not a finite number > 0 ms, or a
    latency that rises with share by more than :data:`CURVE_NOISE`."""
    if not points:
        raise ValueError(f"{where}: needs at least one (share, ms) point")
    out = []
    for share, ms in points:
        share, ms = float(share), float(ms)
        if not (math.isfinite(share) and 0.0 < share <= 1.0):
            raise ValueError(f"{where}: share must be in (0, 1], got {share:g}")
        if not (math.isfinite(ms) and ms > 0.0):
            raise ValueError(f"{where}: latency must be a finite number > 0 ms, got {ms:g} at share {share:g}")
        out.append((share, ms))
    out.sort()
    for (s0, _), (s1, _) in zip(out, out[1:]):
        if s1 - s0 < _EPS:
            raise ValueError(f"{where}: share {s0:g} appears twice")
    for i, (s1, m1) in enumerate(out):
        for s0, m0 in out[:i]:
            if m1 > m0 * (1.0 + CURVE_NOISE):
                raise ValueError(
                    f"{where}: latency must not increase with share, but {m1:g} ms at share {s1:g} is more than "
                    f"{m0:g} ms at share {s0:g} (+{100 * (m1 / m0 - 1):.0f} %, noise allowance "
                    f"{100 * CURVE_NOISE:g} %)")
    return tuple(out)


def latency_at(curve: ShareCurve, share: float) -> float:
    """Latency (ms) of one request alone at ``share``: linear between the curve's points, flat above its
    largest share; ``ValueError`` below its smallest share (no extrapolation towards 0, where latency
    explodes, Dhakal Fig. 2a)."""
    if not curve:
        raise ValueError("empty share curve")
    if not (math.isfinite(share) and 0.0 < share <= 1.0):
        raise ValueError(f"share must be in (0, 1], got {share:g}")
    lo_share = curve[0][0]
    if share < lo_share - _EPS:
        raise ValueError(f"share {share:g} is below the profiled range [{lo_share:g}, {curve[-1][0]:g}]")
    if share >= curve[-1][0]:
        return curve[-1][1]
    for (s0, m0), (s1, m1) in zip(curve, curve[1:]):
        if s0 - _EPS <= share <= s1:
            return m0 + (m1 - m0) * (share - s0) / (s1 - s0)
    return curve[0][1]  # share == lo_share within _EPS


def slowdown(curve: ShareCurve, share: float) -> float:
    """How much slower one request runs at ``share`` than at the curve's largest share (>= about 1).
    Without a curve (a model never profiled at shares) the work is assumed to stretch as ``1 / share``: the
    conservative reading, a model that uses the whole device."""
    if not curve:
        if not (math.isfinite(share) and 0.0 < share <= 1.0):
            raise ValueError(f"share must be in (0, 1], got {share:g}")
        return 1.0 / share
    return latency_at(curve, share) / curve[-1][1]


def knee(curve: ShareCurve, tolerance: float = KNEE_TOLERANCE) -> float:
    """The knee share: the smallest profiled share whose latency is within ``tolerance`` (a fraction) of
    the latency at the largest profiled share."""
    if not curve:
        raise ValueError("empty share curve")
    if not (0.0 <= tolerance < 1.0):
        raise ValueError(f"knee tolerance must be in [0, 1), got {tolerance:g}")
    top = curve[-1][1]
    return next(s for s, ms in curve if ms <= top * (1.0 + tolerance))


def at_share(tenant: Tenant, curve: ShareCurve, share: float, instances: int = 1) -> Tenant:
    """``tenant`` (whose ``service`` is its execution time with the whole device) as it runs on a spatial
    device with ``instances`` instances of ``share`` each: its service stretched by :func:`slowdown`."""
    f = slowdown(curve, share)
    service = tenant.service if abs(f - 1.0) < 1e-12 else Scaled(tenant.service, f)
    # the stretched service has no known largest value (the observed one was at the whole device)
    return replace(tenant, service=service, share=share, instances=instances, service_max_ms=None)


def _wait_params(rate_rps: float, service: Distribution, k: int) -> tuple[float, float, float]:
    """(rho, probability of waiting, conditional mean wait ms) of the Lee-Longton M/G/k approximation."""
    lam = per_ms(rate_rps)
    a = lam * service.mean
    rho = a / k
    if k == 1:
        # P-K: W = lam E[S^2] / (2 (1 - rho)); P(wait) = rho
        w = lam * second_moment(service) / (2.0 * (1.0 - rho)) if lam > 0 else 0.0
        return rho, rho, (w / rho if rho > 0 else 0.0)
    c = erlang_c(k, a)
    cond = service.mean / (k * (1.0 - rho)) * (1.0 + scv(service)) / 2.0
    return rho, c, cond


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"instances must be an integer >= 1, got {k!r}")


def mgk_response(rate_rps: float, service: Distribution, k: int, *, where: str = "device") -> Latency:
    """Mean response time (ms) of an M/G/k FIFO queue: exact P-K for k = 1, Lee-Longton for k > 1."""
    _check_k(k)
    if rate_rps <= 0:
        return service.mean
    rho = per_ms(rate_rps) * service.mean / k
    if rho >= 1.0:
        return Unstable(rho, where)
    _, p_wait, cond = _wait_params(rate_rps, service, k)
    return service.mean + p_wait * cond


def mgk_law(rate_rps: float, service: Distribution, k: int, *, where: str = "device"
            ) -> LatticeDistribution | Unstable:
    """Response-time law (ms) of an M/G/k FIFO queue: the exact P-K inversion for k = 1; for k > 1 the
    Lee-Longton waiting law (0 with probability 1 - C, else exponential with the conditional mean)
    convolved with the service time on a lattice."""
    _check_k(k)
    lam_rho = per_ms(rate_rps) * service.mean / k
    if lam_rho >= 1.0:
        return Unstable(lam_rho, where)
    if k == 1 and rate_rps > 0:
        return mg1_response_distribution(rate_rps, service, where=where)
    _, p_wait, cond = _wait_params(rate_rps, service, k) if rate_rps > 0 else (0.0, 0.0, 0.0)
    # the lattice spans the service's spread and the wait's exponential to 1e-12
    top = service.mean * 6.0 + 6.0 * math.sqrt(service.var) + (cond * 28.0 if cond > 0 else 0.0) + 1e-9
    n = 1 << 14
    dt = top / n
    mass = np.asarray(service.lattice(dt, n), dtype=float)
    edges = (np.arange(n + 1) - 0.5) * dt
    wait = (p_wait * np.diff(-np.expm1(-np.clip(edges, 0.0, None) / cond)) if cond > 0 else np.zeros(n))
    wait[0] += 1.0 - float(wait.sum())
    return LatticeDistribution(dt, convolve_pmfs(mass / mass.sum(), wait))


def mgk_quantiles(rate_rps: float, service: Distribution, k: int, qs: Sequence[float] = (0.95, 0.99), *,
                  where: str = "device") -> list[Latency]:
    """Response-time quantiles (ms) of an M/G/k FIFO queue (:func:`mgk_law`)."""
    law = mgk_law(rate_rps, service, k, where=where)
    if isinstance(law, Unstable):
        return [law for _ in qs]
    return list(law.quantiles(qs))


def spatial_responses(tenants: Sequence[Tenant], *, where: str = "device") -> list[Latency]:
    """Each tenant's mean device response time (ms) on a spatial device: its own M/G/k, k = its instances.
    ``ValueError`` when the instances hold more than the device."""
    check_shares(tenants, where=where)
    return [mgk_response(t.rate_rps, t.service, t.instances, where=where) for t in tenants]


def spatial_quantiles(tenants: Sequence[Tenant], qs: Sequence[float] = (0.95, 0.99), *,
                      where: str = "device") -> list[list[Latency]]:
    """Each tenant's device response-time quantiles (ms) on a spatial device (:func:`mgk_quantiles`)."""
    check_shares(tenants, where=where)
    return [mgk_quantiles(t.rate_rps, t.service, t.instances, qs, where=where) for t in tenants]


@dataclass(frozen=True)
class SpatialPlan:
    """Multi-Model's answer (Dhakal §IV-D): run ``instances`` instances at ``share`` each; ``latency_ms`` is
    the predicted SLO statistic at the planned rate, ``used`` the device fraction held."""

    share: float
    instances: int
    latency_ms: float

    @property
    def used(self) -> float:
        return self.share * self.instances


def multi_model(tenant: Tenant, curve: ShareCurve, *, slo_ms: float, stat: str = "mean",
                available: float = 1.0, shares: Sequence[float] | None = None,
                max_utilization: float = 1.0) -> SpatialPlan | str:
    """Dhakal's Multi-Model primitive as a pure function: the instance count and share for ``tenant`` (its
    ``service`` with the whole device, its ``rate_rps``) so that ``stat`` (mean, p95 or p99) of its device
    latency stays <= ``slo_ms`` within ``available`` of the device.

    The share is the smallest candidate (``shares``, default the curve's points) at which a lone request
    meets the SLO, but never below the knee (below it latency climbs steeply, Dhakal Fig. 2a); then the
    fewest instances at that share that carry the rate, each instance busy at most ``max_utilization`` of
    the time (an admission policy's cap). If they do not fit, larger shares are tried. Returns a
    :class:`SpatialPlan`, or a sentence saying why none exists."""
    if stat not in ("mean", "p95", "p99"):
        raise ValueError(f"stat must be mean, p95 or p99, got {stat!r}")
    if not (slo_ms > 0 and math.isfinite(slo_ms)):
        raise ValueError(f"slo_ms must be a finite number > 0, got {slo_ms!r}")
    if not (0.0 < available <= 1.0 + 1e-9):
        raise ValueError(f"available share must be in (0, 1], got {available:g}")
    if not (0.0 < max_utilization <= 1.0):
        raise ValueError(f"max_utilization must be in (0, 1], got {max_utilization:g}")
    cands = sorted(set(shares if shares is not None else [s for s, _ in curve] or [1.0]))
    floor = knee(curve) if curve else 0.0
    best_reason = f"no share of at most {available:.3g} of the device meets {stat} <= {slo_ms:g} ms"
    for share in cands:
        if share < floor - _EPS or share > available + 1e-9:
            continue
        t = at_share(tenant, curve, share)
        if _stat(t, 1, stat, rate=0.0) > slo_ms:
            continue  # even a lone request misses the SLO at this share
        for k in range(1, int(available / share + 1e-9) + 1):
            if per_ms(tenant.rate_rps) * t.service.mean / k > max_utilization:
                continue
            v = _stat(t, k, stat, rate=tenant.rate_rps)
            if v <= slo_ms:
                return SpatialPlan(share, k, v)
        best_reason = (f"at share {share:g}, {int(available / share + 1e-9)} instance(s) (all that fit in "
                       f"{available:.3g} of the device) cannot carry {tenant.rate_rps:g} req/s within "
                       f"{stat} <= {slo_ms:g} ms")
    return best_reason


def _stat(t: Tenant, k: int, stat: str, *, rate: float) -> float:
    if stat == "mean":
        v = mgk_response(rate, t.service, k)
    else:
        v = mgk_quantiles(rate, t.service, k, (0.95 if stat == "p95" else 0.99,))[0]
    return math.inf if isinstance(v, Unstable) else float(v)
