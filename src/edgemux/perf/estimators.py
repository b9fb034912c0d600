"""The estimator of each sharing discipline: one :class:`Estimator` per
:class:`~edgemux.cluster.workload.Discipline`, in :data:`ESTIMATORS` (``estimator_for``).

========== ============================================================================================
fcfs       Edge TPU: M/G/1-FCFS, P-K with the model-switch mixture (Ibis Eq. 1-5; plain M/G/1 when no
           switches apply); p95/p99 by numerical P-K inversion (``perf.tails``).
ps         M/G/1 egalitarian PS: ``S_i / (1 - rho)`` per tenant (exact, insensitive); p95/p99 from the
           sojourn law of ``perf.sojourn`` (two exact moments per request size, approximated shape).
gpu-timeshare  embedded GPU (FIFO within an app, PS across apps): ``bounds_ms = (FCFS, PS)`` as in Ibis
           §3.3 (P-K Eq. 3, 5 and exact ``S_i/(1-rho)``, Eq. 6-8 family); ``device_ms`` is a proven upper
           bound, each app as the lowest class of a preemptive-priority M/G/1 (``perf.gpu.timeshare_responses``),
           because the simulator shows the Ibis bounds do not bracket this discipline at high load and the
           point estimate ``timeshare_independent_responses`` runs low on mixed request sizes; p95/p99 from
           the law of that bound (``perf.sojourn.timeshare_laws``), an upper estimate.
mps        M/G/c limited PS with fractional ``c = device.servers`` (model of Ibis Eq. 10), exact:
           ``E[R_i] = S_i E[R] / E[S]``; p95/p99 from ``perf.sojourn.limited_ps_laws``.
batch      batching chain with Ibis Eq. 9 batch times (``perf.gpu.batch_responses``); p95/p99 from the
           envelope of a light- and a heavy-traffic law (``perf.sojourn.batch_laws``), an upper estimate.
spatial    controlled spatial sharing (Dhakal et al. §IV): each tenant its own M/G/k, k = its instances at
           its share (``perf.spatial``): exact P-K for k = 1 with p95/p99 by inversion, Lee-Longton for k > 1.
========== ============================================================================================

Every discipline gives p50/p95/p99 end to end for every tenant (the median from the same laws, except on
ps and mps devices, whose gamma shape fits the tail and not the body: there the mean, an upper estimate);
a tenant with a CPU stage gets the CPU stage's law (``perf.sojourn.cpu_stage_law``) convolved with its
device law, as if the stages were independent.
Each estimator gives the device's utilization, every tenant's device response mean (``responses``, what
admission's mean checks read), the device part of a full prediction (``predict``: means, utilization,
method, tails where a method applies, bounds) that ``perf.device.predict_device`` completes end to end,
and the linear necessary condition its mean puts on a mean SLO (``mean_row``, the offline optimum's
relaxation). On an FCFS device whose tenants are all periodic with bounded execution times, the
worst-case bound of ``perf.periodic`` (one request of every tenant) holds for every request, so it caps
the mean and the percentiles.

Units: ms, req/s (req/ms inside the formulas). Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edgemux.cluster.workload import DeviceSpec, Discipline, Tenant, shares_used
from edgemux.perf.edgetpu import edgetpu_responses, edgetpu_utilization, same_model_probabilities
from edgemux.perf.gpu import (
    batch_estimates,
    batch_responses,
    gpu_fcfs_responses,
    gpu_ps_responses,
    mps_responses,
    timeshare_responses,
)
from edgemux.perf.periodic import cap, periodic_fcfs_bound
from edgemux.perf.queueing import limited_ps_response, per_ms
from edgemux.perf.result import Latency, Unstable
from edgemux.perf.sojourn import (
    Law,
    batch_laws,
    capped,
    cpu_stage_law,
    law_quantiles,
    limited_ps_laws,
    ps_laws,
    tandem,
    timeshare_laws,
)
from edgemux.perf.spatial import mgk_law, spatial_quantiles, spatial_responses
from edgemux.perf.tails import LatticeDistribution, edgetpu_response_laws, edgetpu_response_quantiles
from edgemux.perf.tandem import tenant_end_to_end

__all__ = [
    "DeviceEstimate",
    "Estimator",
    "ESTIMATORS",
    "MeanRow",
    "estimator_for",
    "fcfs_responses",
    "fcfs_tails",
    "mps_work_limit",
]


@dataclass(frozen=True)
class DeviceEstimate:
    """The device part of a prediction, per tenant in the tenants' order (ms): device response means,
    end-to-end p50/p95/p99 (CPU stage and network included; None only for a tenant not asked for), the (FCFS,
    PS) bounds of gpu-timeshare; the device utilization and the method (formula + paper equation)."""

    device_ms: list[Latency]
    rho: float
    method: str
    p50_ms: list[Latency | None]
    p95_ms: list[Latency | None]
    p99_ms: list[Latency | None]
    bounds_ms: list[tuple[Latency, Latency] | None]


QS = (0.5, 0.95, 0.99)  # the quantiles a prediction gives (p50, p95, p99)
Quantiles = tuple[list[Latency | None], list[Latency | None], list[Latency | None]]


def _none(n: int) -> Quantiles:
    return [None] * n, [None] * n, [None] * n


MeanRow = tuple[float | None, float]
"""A linear necessary condition for a tenant's mean SLO, ``(k, rhs)``: ``sum_b coef_b <= rhs`` over the
device's tenants b, with ``coef_b = r_b + k w_b`` or, when k is None, ``coef_b = w_b`` (``w_b = lam_b
E[e_b]``, ``r_b = lam_b E[e_b^2] / 2`` in ms, lam in req/ms)."""


class Estimator:
    """One discipline's estimator. Subclasses give ``utilization``, ``responses``, ``predict`` and, where
    the mean yields one, ``mean_row``; ``laws``: every tenant's device response law, from which ``predict``
    reads p50/p95/p99 (FCFS and spatial invert P-K per tenant instead, and give laws for tenants with a CPU
    stage; ``median_is_mean``: the p50 is the mean end to end); ``tail_bounds``: certified quantile bounds (``perf.tailbounds``, ``perf.latticebounds``)
    settle the tail verdicts, so admission need not invert every tail."""

    discipline: Discipline
    tail_bounds = False
    tail_method = ""
    # the median is the mean end to end: where the law's body (not its tail) is not modelled well enough
    median_is_mean = False

    def utilization(self, device: DeviceSpec, tenants: Sequence[Tenant]) -> float:
        """Utilization rho of ``device`` from its (non-empty) tenants (dimensionless; >= 1: overloaded)."""
        raise NotImplementedError

    def responses(self, device: DeviceSpec, tenants: Sequence[Tenant]) -> list[Latency]:
        """Every tenant's device response mean (ms, queueing + service), tenants' order."""
        raise NotImplementedError

    def laws(self, device: DeviceSpec, tenants: Sequence[Tenant], which: Sequence[int]
             ) -> Sequence[Law | None] | Unstable:
        """The device response-time laws (ms) of the tenants at indices ``which`` (None for the others);
        ``Unstable`` when the device is overloaded."""
        raise NotImplementedError

    def predict(self, device: DeviceSpec, tenants: Sequence[Tenant], tails: Sequence[int] | None = None
                ) -> DeviceEstimate:
        """The device part of every tenant's prediction; ``responses``' means with the rest. ``tails``: the
        indices of the tenants whose p50/p95/p99 are wanted (default all; the others get None): admission asks
        only for the tenants with a percentile SLO."""
        raise NotImplementedError

    def mean_row_applies(self, periodic: bool) -> bool:
        """Whether the mean gives a linear necessary condition for a mean SLO (of a ``periodic`` stream)."""
        return False

    def mean_row(self, t_ms: float, e_ms: float, w: float, r_ms: float, servers: float) -> MeanRow | None:
        """The linear condition for a tenant of mean execution ``e_ms``, own work ``w`` and ``r_ms`` whose
        device response must stay within ``t_ms`` (its SLO less CPU stage and network; ``t_ms >= e_ms``),
        on a device of ``servers``; None when the tenant misses it even alone."""
        raise NotImplementedError(f"{self.discipline.value}: no linear mean-SLO row")

    def _from_laws(self, device: DeviceSpec, tenants: Sequence[Tenant], tails: Sequence[int] | None,
                   means: list[Latency], rho: float, method: str,
                   bounds: list[tuple[Latency, Latency] | None] | None = None) -> DeviceEstimate:
        """A prediction whose p50/p95/p99 (of the tenants at ``tails``) come from ``laws`` (CPU stages
        convolved, network added; the p50 the mean end to end with ``median_is_mean``)."""
        which = _wanted(tenants, tails)
        laws = self.laws(device, tenants, which) if which else [None] * len(tenants)
        p50, p95, p99 = _end_to_end_tails(tenants, which, laws)
        if self.median_is_mean:
            for i in which:
                p50[i] = tenant_end_to_end(tenants[i], means[i])
        return DeviceEstimate(means, rho, method + "; " + self.tail_method, p50, p95, p99,
                              bounds if bounds is not None else [None] * len(tenants))


def _end_to_end_tails(tenants: Sequence[Tenant], which: Sequence[int],
                      laws: Sequence[Law | None] | Unstable) -> Quantiles:
    """(p50, p95, p99) end to end (ms) of the tenants at ``which`` from their device ``laws``: a CPU stage's
    law convolved in first (``perf.sojourn.tandem``), the network latency added; None for the others."""
    p50, p95, p99 = _none(len(tenants))
    for i in which:
        t = tenants[i]
        law: Law | Unstable = laws if isinstance(laws, Unstable) else _known(laws[i])
        if t.cpu is not None and not isinstance(law, Unstable):
            cpu = cpu_stage_law(t.cpu, t.rate_rps, where=f"cpu of {t.name}")
            law = cpu if isinstance(cpu, Unstable) else tandem(cpu, law)
        p50[i], p95[i], p99[i] = law_quantiles(law, QS, t.network_ms)
    return p50, p95, p99


def _wanted(tenants: Sequence[Tenant], tails: Sequence[int] | None) -> list[int]:
    """The indices whose tails are asked for (all by default), in order."""
    return list(range(len(tenants))) if tails is None else sorted(set(tails))


def _known(law: Law | None) -> Law:
    assert law is not None  # asked for
    return law


def _work(tenants: Sequence[Tenant]) -> float:
    return math.fsum(per_ms(t.rate_rps) * t.service.mean for t in tenants)


def _shift(x: Latency, by: float) -> Latency:
    return x if isinstance(x, Unstable) else x + by


def _switching(tenants: Sequence[Tenant]) -> bool:
    q = same_model_probabilities(tenants)
    return any(t.switch_ms > 0 and qi < 1.0 for t, qi in zip(tenants, q))


def fcfs_responses(tenants: Sequence[Tenant], *, where: str = "device") -> tuple[list[Latency], float | None]:
    """Device response-time means (ms) on an FCFS device: P-K with the switch mixture (Ibis Eq. 1-5),
    capped by the worst-case bound of ``perf.periodic`` when every tenant is a periodic stream; the bound
    (ms, or ``None`` when it does not apply) is returned too, as it caps the percentiles as well."""
    bound = periodic_fcfs_bound(tenants)
    return cap(edgetpu_responses(tenants, where=where), bound), bound


def fcfs_tails(tenants: Sequence[Tenant], which: Sequence[int], bound: float | None, *,
               where: str = "device") -> dict[int, tuple[Latency, ...]]:
    """End-to-end quantiles ``QS`` (p50, p95, p99) in ms of the tenants at indices ``which`` on an FCFS
    device: the P-K inversion (``perf.tails``, computed for those tenants only) capped by the periodic
    ``bound`` of :func:`fcfs_responses`, plus each tenant's network latency."""
    qs = edgetpu_response_quantiles(tenants, QS, where=where, which=which)
    return {i: tuple(_shift(q, tenants[i].network_ms) for q in cap(qs[i], bound)) for i in which}


def mps_work_limit(ratio: float, servers: float) -> float:
    """The largest offered work ``A`` (servers' worth, < c) of M/G/c limited PS at which the slowdown
    ``E[R] / E[S] = E[N](A) / A`` is at most ``ratio`` (dimensionless); 0 when even a light load exceeds it."""
    alone = 1.0 / min(1.0, servers)
    if ratio < alone:
        return 0.0

    def slow(a: float) -> float:
        r = limited_ps_response(a * 1000.0, 1.0, servers)   # mean 1 ms: the response is the slowdown
        return math.inf if isinstance(r, Unstable) else float(r)

    lo, hi = 0.0, servers
    for _ in range(80):   # the slowdown increases in A; stop at the float resolution
        mid = 0.5 * (lo + hi)
        if slow(mid) <= ratio:
            lo = mid
        else:
            hi = mid
    return lo


class FcfsEstimator(Estimator):
    """fcfs: M/G/1 with the switch mixture (Ibis Eq. 1-5); utilization ``lam E[S]`` with switch overheads
    (Ibis Eq. 1-2); p95/p99 by P-K inversion for tenants without a CPU stage, capped by the periodic bound."""

    discipline = Discipline.FCFS
    tail_bounds = True

    def utilization(self, device: DeviceSpec, tenants: Sequence[Tenant]) -> float:
        return edgetpu_utilization(tenants)

    def responses(self, device: DeviceSpec, tenants: Sequence[Tenant]) -> list[Latency]:
        return fcfs_responses(tenants, where=device.name)[0]

    def predict(self, device: DeviceSpec, tenants: Sequence[Tenant], tails: Sequence[int] | None = None
                ) -> DeviceEstimate:
        where = device.name
        dev, bound = fcfs_responses(tenants, where=where)
        which = _wanted(tenants, tails)
        rho = edgetpu_utilization(tenants)
        method = ("M/G/1-FCFS P-K + switch mixture (Ibis Eq. 1-5)" if _switching(tenants)
                  else "M/G/1-FCFS P-K (Ibis Eq. 3, 5)")
        p50, p95, p99 = _none(len(tenants))
        plain = [i for i in which if tenants[i].cpu is None]
        if plain:
            for i, (q50, q95, q99) in fcfs_tails(tenants, plain, bound, where=where).items():
                p50[i], p95[i], p99[i] = q50, q95, q99
        staged = [i for i in which if tenants[i].cpu is not None]
        if staged:
            c50, c95, c99 = _end_to_end_tails(tenants, staged, self.laws(device, tenants, staged))
            for i in staged:
                p50[i], p95[i], p99[i] = c50[i], c95[i], c99[i]
        if which:
            method += "; p50/p95/p99 by P-K inversion (DFT)" + ("; CPU stage convolved in" if staged else "")
        if bound is not None:
            method += (f"; periodic streams: every request within the worst-case FIFO bound "
                       f"{bound:.2f} ms (network calculus), which caps these")
        return DeviceEstimate(dev, rho, method, p50, p95, p99, [None] * len(tenants))

    def laws(self, device: DeviceSpec, tenants: Sequence[Tenant], which: Sequence[int]
             ) -> Sequence[Law | None] | Unstable:
        # the P-K law of each tenant, each request's wait capped by the periodic bound where it applies
        bound = periodic_fcfs_bound(tenants)
        laws = edgetpu_response_laws(tenants, where=device.name, which=which)
        if bound is None:
            return laws if isinstance(laws, Unstable) else list(laws)
        if isinstance(laws, Unstable):
            point = LatticeDistribution(bound, np.array([0.0, 1.0]))
            return [point if i in which else None for i in range(len(tenants))]
        return [None if law is None else capped(law, bound) for law in laws]

    def mean_row_applies(self, periodic: bool) -> bool:
        # a periodic stream's mean is capped by the worst-case bound: the P-K row is not necessary there
        return not periodic

    def mean_row(self, t_ms: float, e_ms: float, w: float, r_ms: float, servers: float) -> MeanRow | None:
        # P-K: W + e <= t with W = sum r_b / (1 - sum w_b), i.e. sum r_b + (t - e) sum w_b <= t - e; switches
        # left out (they only lengthen services, so the row stays necessary)
        k = t_ms - e_ms
        return k, k


class PsEstimator(Estimator):
    """ps: M/G/1 egalitarian PS, ``S_i / (1 - rho)`` per tenant (exact, insensitive); rho the summed work."""

    discipline = Discipline.PS
    tail_method = ("p95/p99 from the PS sojourn law (two exact moments per size, gamma shape; approx.); "
                   "p50 as the mean (an upper estimate: the law's body is not modelled)")
    median_is_mean = True

    def utilization(self, device: DeviceSpec, tenants: Sequence[Tenant]) -> float:
        return _work(tenants)

    def responses(self, device: DeviceSpec, tenants: Sequence[Tenant]) -> list[Latency]:
        return gpu_ps_responses(tenants, where=device.name)

    def laws(self, device: DeviceSpec, tenants: Sequence[Tenant], which: Sequence[int]
             ) -> Sequence[Law | None] | Unstable:
        return ps_laws(tenants, where=device.name, which=which)

    def predict(self, device: DeviceSpec, tenants: Sequence[Tenant], tails: Sequence[int] | None = None
                ) -> DeviceEstimate:
        return self._from_laws(device, tenants, tails, self.responses(device, tenants),
                               self.utilization(device, tenants), "M/G/1-PS S_i/(1-rho), exact (Ibis Eq. 6 per class)")

    def mean_row_applies(self, periodic: bool) -> bool:
        return True

    def mean_row(self, t_ms: float, e_ms: float, w: float, r_ms: float, servers: float) -> MeanRow | None:
        return None, 1.0 - e_ms / t_ms   # e / (1 - sum w_b) <= t (exact)


class TimeshareEstimator(Estimator):
    """gpu-timeshare: the proven upper bound (each app the lowest class of a preemptive-priority M/G/1),
    with the Ibis bounds (FCFS, PS) beside it; rho the summed work."""

    discipline = Discipline.GPU_TIMESHARE
    tail_method = "p50/p95/p99 from the bound's law (exact P-K wait, busy-period stretch by two moments; upper est.)"

    def utilization(self, device: DeviceSpec, tenants: Sequence[Tenant]) -> float:
        return _work(tenants)

    def responses(self, device: DeviceSpec, tenants: Sequence[Tenant]) -> list[Latency]:
        return timeshare_responses(tenants, where=device.name)

    def predict(self, device: DeviceSpec, tenants: Sequence[Tenant], tails: Sequence[int] | None = None
                ) -> DeviceEstimate:
        where = device.name
        fcfs = gpu_fcfs_responses(tenants, where=where)
        ps = gpu_ps_responses(tenants, where=where)
        bounds: list[tuple[Latency, Latency] | None] = list(zip(fcfs, ps))
        return self._from_laws(
            device, tenants, tails, timeshare_responses(tenants, where=where), self.utilization(device, tenants),
            "GPU time-sharing: upper bound, the app as lowest class of a preemptive-priority M/G/1 (proven for "
            "FIFO within an app); bounds = (M/G/1-FCFS Eq. 3, 5; M/G/1-PS S_i/(1-rho), Eq. 6-8)", bounds)

    def laws(self, device: DeviceSpec, tenants: Sequence[Tenant], which: Sequence[int]
             ) -> Sequence[Law | None] | Unstable:
        return timeshare_laws(tenants, where=device.name, which=which)

    def mean_row_applies(self, periodic: bool) -> bool:
        return True

    def mean_row(self, t_ms: float, e_ms: float, w: float, r_ms: float, servers: float) -> MeanRow | None:
        # the secant relaxation of the lowest-priority bound on [u_lo, 1] (policies.offline's docstring)
        b = t_ms * w - e_ms
        u_lo = (-b + math.sqrt(b * b + 4.0 * t_ms * r_ms)) / (2.0 * t_ms)
        if u_lo > 1.0 - w:
            return None
        k = t_ms * (1.0 + u_lo + w) - e_ms
        return k, k - t_ms * u_lo


class MpsEstimator(Estimator):
    """mps: M/G/c limited PS with fractional ``c = device.servers``, exact ``E[R_i] = S_i E[R] / E[S]``
    (model of Ibis Eq. 10); rho the summed work over c."""

    discipline = Discipline.MPS
    tail_method = ("p95/p99 from the limited-PS sojourn law (approx.); p50 as the mean (an upper estimate: "
                   "the law's body is not modelled)")
    median_is_mean = True

    def utilization(self, device: DeviceSpec, tenants: Sequence[Tenant]) -> float:
        return _work(tenants) / device.servers

    def responses(self, device: DeviceSpec, tenants: Sequence[Tenant]) -> list[Latency]:
        return mps_responses(tenants, device.servers, where=device.name)

    def laws(self, device: DeviceSpec, tenants: Sequence[Tenant], which: Sequence[int]
             ) -> Sequence[Law | None] | Unstable:
        return limited_ps_laws(tenants, device.servers, where=device.name, which=which)

    def predict(self, device: DeviceSpec, tenants: Sequence[Tenant], tails: Sequence[int] | None = None
                ) -> DeviceEstimate:
        return self._from_laws(device, tenants, tails, self.responses(device, tenants), self.utilization(device, tenants),
                               f"M/G/c limited PS, c={device.servers:g}, exact S_i*E[R]/E[S] (model of Ibis Eq. 10)")

    def mean_row_applies(self, periodic: bool) -> bool:
        return True

    def mean_row(self, t_ms: float, e_ms: float, w: float, r_ms: float, servers: float) -> MeanRow | None:
        # E[R] = e g(A), g increasing: A <= A* with g(A*) = t / e (exact)
        return None, mps_work_limit(t_ms / e_ms, servers) if e_ms > 0 else servers


class BatchEstimator(Estimator):
    """batch: the batching chain with Ibis Eq. 9 batch times; rho the busy fraction it finds, or the load at
    full batches ``sum lam_g T_g(B) / B`` when even that is >= 1. No linear mean row (not additive)."""

    discipline = Discipline.BATCH
    tail_method = "p50/p95/p99 from the envelope of a light- and a heavy-traffic law (upper est.)"

    def utilization(self, device: DeviceSpec, tenants: Sequence[Tenant]) -> float:
        _, u = batch_responses(tenants, device.max_batch, device.batch_timeout_ms, where=device.name)
        return u

    def responses(self, device: DeviceSpec, tenants: Sequence[Tenant]) -> list[Latency]:
        return batch_responses(tenants, device.max_batch, device.batch_timeout_ms, where=device.name)[0]

    def predict(self, device: DeviceSpec, tenants: Sequence[Tenant], tails: Sequence[int] | None = None
                ) -> DeviceEstimate:
        B, tau = device.max_batch, device.batch_timeout_ms
        est, rho = batch_estimates(tenants, B, tau, where=device.name)
        dev: list[Latency] = ([est for _ in tenants] if isinstance(est, Unstable)
                              else [est[t.model].response_ms for t in tenants])
        many = len({t.model for t in tenants}) > 1
        method = (f"batching chain, B={B}, timeout={tau:g} ms, "
                  f"batch time k1*b+k2 (Ibis Eq. 9)" + ("; models combined by fixed point (approx.)" if many else ""))
        if any(t.batch is None for t in tenants):
            method += "; no batch law: b requests take b*E[S]"
        if isinstance(est, Unstable):
            rho = est.rho
        which = _wanted(tenants, tails)
        laws = (batch_laws(tenants, B, tau, where=device.name, estimates=(est, rho), which=which) if which
                else [None] * len(tenants))
        p50, p95, p99 = _end_to_end_tails(tenants, which, laws)
        return DeviceEstimate(dev, rho, method + "; " + self.tail_method, p50, p95, p99, [None] * len(tenants))

    def laws(self, device: DeviceSpec, tenants: Sequence[Tenant], which: Sequence[int]
             ) -> Sequence[Law | None] | Unstable:
        return batch_laws(tenants, device.max_batch, device.batch_timeout_ms, where=device.name, which=which)


class SpatialEstimator(Estimator):
    """spatial: each tenant its own M/G/k at its share (exact P-K for k = 1 with p95/p99 by inversion,
    Lee-Longton for k > 1); rho the busiest tenant's ``lam_i E[e_i] / k_i``. Tenants do not interact, so
    no row over the device's tenants is necessary for a mean SLO: the check decides."""

    discipline = Discipline.SPATIAL

    def utilization(self, device: DeviceSpec, tenants: Sequence[Tenant]) -> float:
        return max(per_ms(t.rate_rps) * t.service.mean / t.instances for t in tenants)

    def responses(self, device: DeviceSpec, tenants: Sequence[Tenant]) -> list[Latency]:
        return spatial_responses(tenants, where=device.name)

    def predict(self, device: DeviceSpec, tenants: Sequence[Tenant], tails: Sequence[int] | None = None
                ) -> DeviceEstimate:
        where = device.name
        dev = spatial_responses(tenants, where=where)
        which = _wanted(tenants, tails)
        rho = self.utilization(device, tenants)
        p50, p95, p99 = _none(len(tenants))
        need_tail = [i for i in which if tenants[i].cpu is None]
        for i, qs in zip(need_tail, spatial_quantiles([tenants[i] for i in need_tail], QS, where=where)):
            p50[i], p95[i], p99[i] = (_shift(q, tenants[i].network_ms) for q in qs)
        staged = [i for i in which if tenants[i].cpu is not None]
        if staged:
            c50, c95, c99 = _end_to_end_tails(tenants, staged, self.laws(device, tenants, staged))
            for i in staged:
                p50[i], p95[i], p99[i] = c50[i], c95[i], c99[i]
        ks = sorted({t.instances for t in tenants})
        method = ("spatial shares (Dhakal §IV), per tenant M/G/k: "
                  + ("M/G/1 P-K, exact" if ks == [1] else "Lee-Longton approximation for k > 1 (exact P-K for k = 1)")
                  + f"; instances hold {shares_used(tenants):.3g} of the device"
                  + "; p50/p95/p99 from each tenant's M/G/k law" + ("; CPU stage convolved in" if staged else ""))
        return DeviceEstimate(dev, rho, method, p50, p95, p99, [None] * len(tenants))

    def laws(self, device: DeviceSpec, tenants: Sequence[Tenant], which: Sequence[int]
             ) -> Sequence[Law | None] | Unstable:
        out: list[Law | None] = [None] * len(tenants)
        for i in which:
            t = tenants[i]
            law = mgk_law(t.rate_rps, t.service, t.instances, where=device.name)
            if isinstance(law, Unstable):
                return law
            out[i] = law
        return out


ESTIMATORS: dict[Discipline, Estimator] = {
    Discipline.FCFS: FcfsEstimator(),
    Discipline.PS: PsEstimator(),
    Discipline.GPU_TIMESHARE: TimeshareEstimator(),
    Discipline.MPS: MpsEstimator(),
    Discipline.BATCH: BatchEstimator(),
    Discipline.SPATIAL: SpatialEstimator(),
}
"""One estimator per discipline."""


def estimator_for(discipline: Discipline) -> Estimator:
    """The estimator of ``discipline``."""
    return ESTIMATORS[discipline]
