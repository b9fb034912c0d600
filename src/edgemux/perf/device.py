"""The bridge the CLI, the validation and the policies use: every tenant's latency on one device.

:func:`predict_device` dispatches on the device's sharing discipline (``cluster.workload.Discipline``,
the same description the simulator executes):

========== ============================================================================================
fcfs       Edge TPU: M/G/1-FCFS, P-K with the model-switch mixture (Ibis Eq. 1-5; plain M/G/1 when no
           switches apply); p95/p99 by numerical P-K inversion (``perf.tails``).
ps         M/G/1 egalitarian PS: ``S_i / (1 - rho)`` per tenant (exact, insensitive).
gpu-timeshare  embedded GPU (FIFO within an app, PS across apps): ``bounds_ms = (FCFS, PS)`` as in Ibis
           §3.3 (P-K Eq. 3, 5 and exact ``S_i/(1-rho)``, Eq. 6-8 family); ``device_ms`` is a proven upper
           bound, each app as the lowest class of a preemptive-priority M/G/1 (``perf.gpu.timeshare_responses``),
           because the simulator shows the Ibis bounds do not bracket this discipline at high load and the
           point estimate ``timeshare_independent_responses`` runs low on mixed request sizes.
mps        M/G/c limited PS with fractional ``c = device.servers`` (model of Ibis Eq. 10), exact:
           ``E[R_i] = S_i E[R] / E[S]``.
batch      batching chain with Ibis Eq. 9 batch times (``perf.gpu.batch_responses``).
spatial    controlled spatial sharing (Dhakal et al. §IV): each tenant its own M/G/k, k = its instances at
           its share (``perf.spatial``): exact P-K for k = 1 with p95/p99 by inversion, Lee-Longton for k > 1.
========== ============================================================================================

End to end, each tenant adds its CPU stage (exact M/G/c limited PS, Ibis Eq. 11 model) and its constant
network latency (means add exactly, Ibis §3.6). Tails are given only where a method applies: FCFS
devices, for tenants without a CPU stage (the tail of a PS CPU stage is not modelled); elsewhere None.

Arrivals: every estimator assumes Poisson arrivals at ``arrival.rate_rps`` whatever the arrival kind. For
periodic camera streams (and for replayed traces smoother than Poisson) this overestimates queueing, i.e.
it is conservative; ``method`` says so when it applies. On an FCFS device whose tenants are all periodic
with bounded execution times, the worst-case bound of ``perf.periodic`` (one request of every tenant)
holds for every request, so it caps the mean and the percentiles (the smaller of the two is given).

Units: ms, req/s. Pure functions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from edgemux.cluster.workload import ArrivalKind, DeviceSpec, Discipline, Tenant, shares_used
from edgemux.perf.edgetpu import edgetpu_responses, edgetpu_utilization, same_model_probabilities
from edgemux.perf.gpu import (
    batch_responses,
    gpu_fcfs_responses,
    gpu_ps_responses,
    mps_responses,
    timeshare_responses,
)
from edgemux.perf.periodic import cap, periodic_fcfs_bound
from edgemux.perf.queueing import per_ms
from edgemux.perf.result import Latency, Unstable
from edgemux.perf.spatial import spatial_quantiles, spatial_responses
from edgemux.perf.tails import edgetpu_response_quantiles
from edgemux.perf.tandem import end_to_end, tenant_cpu_ms

__all__ = ["TenantEstimate", "predict_device", "device_utilization", "fcfs_responses", "fcfs_tails"]


@dataclass(frozen=True)
class TenantEstimate:
    """One tenant's predicted latency on a device (ms). ``Unstable`` where a queue has no steady state."""

    name: str
    mean_ms: Latency          # end to end: cpu + device + network
    p95_ms: Latency | None    # None where no tail method applies (PS-type devices, CPU stage present)
    p99_ms: Latency | None
    device_ms: Latency        # device queueing + service
    cpu_ms: Latency           # 0.0 without a CPU stage
    network_ms: float
    rho: float                # device utilization from all tenants
    method: str               # formula + paper equation
    bounds_ms: tuple[Latency, Latency] | None = None   # gpu-timeshare: (FCFS, PS) device latency


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
               where: str = "device") -> dict[int, tuple[Latency, Latency]]:
    """End-to-end (p95, p99) in ms of the tenants at indices ``which`` on an FCFS device: the P-K inversion
    (``perf.tails``, computed for those tenants only) capped by the periodic ``bound`` of
    :func:`fcfs_responses`, plus each tenant's network latency."""
    qs = edgetpu_response_quantiles(tenants, (0.95, 0.99), where=where, which=which)
    out: dict[int, tuple[Latency, Latency]] = {}
    for i in which:
        q95, q99 = cap(qs[i], bound)
        out[i] = (_shift(q95, tenants[i].network_ms), _shift(q99, tenants[i].network_ms))
    return out


def device_utilization(device: DeviceSpec, tenants: Sequence[Tenant]) -> float:
    """Utilization rho of ``device`` from all its tenants (dimensionless; >= 1 means overloaded).

    fcfs: ``lam E[S]`` with switch overheads (Ibis Eq. 1-2); ps, gpu-timeshare: ``sum lam_i E[e_i]``;
    mps: ``sum lam_i E[e_i] / c``; spatial: the largest of the tenants' ``lam_i E[e_i] / k_i`` (each tenant
    has its own instances, so the busiest one decides stability); batch: the busy fraction the batching estimator finds, or the load at
    full batches ``sum lam_g T_g(B) / B`` when even that is >= 1.
    """
    if not tenants:
        return 0.0
    d = device.discipline
    if d is Discipline.FCFS:
        return edgetpu_utilization(tenants)
    work = math.fsum(per_ms(t.rate_rps) * t.service.mean for t in tenants)
    if d in (Discipline.PS, Discipline.GPU_TIMESHARE):
        return work
    if d is Discipline.MPS:
        return work / device.servers
    if d is Discipline.SPATIAL:
        return max(per_ms(t.rate_rps) * t.service.mean / t.instances for t in tenants)
    if d is Discipline.BATCH:
        _, u = batch_responses(tenants, device.max_batch, device.batch_timeout_ms, where=device.name)
        return u
    raise ValueError(f"no estimator for discipline {d!r}")


def predict_device(device: DeviceSpec, tenants: Sequence[Tenant]) -> dict[str, TenantEstimate]:
    """Every tenant's predicted latency on ``device`` (mean end to end, device and CPU parts, p95/p99 where
    a tail method applies), keyed by tenant name. See the module docstring for the estimator used per
    discipline; each estimate's ``method`` names it with its paper equation."""
    tenants = list(tenants)
    if not tenants:
        return {}
    names = [t.name for t in tenants]
    if len(set(names)) != len(names):
        raise ValueError(f"tenant names on device {device.name!r} must be unique, got {names}")
    where = device.name
    d = device.discipline
    p95: list[Latency | None] = [None] * len(tenants)
    p99: list[Latency | None] = [None] * len(tenants)
    bounds: list[tuple[Latency, Latency] | None] = [None] * len(tenants)
    if d is Discipline.FCFS:
        dev, bound = fcfs_responses(tenants, where=where)
        rho = edgetpu_utilization(tenants)
        method = ("M/G/1-FCFS P-K + switch mixture (Ibis Eq. 1-5)" if _switching(tenants)
                  else "M/G/1-FCFS P-K (Ibis Eq. 3, 5)")
        need_tail = [i for i, t in enumerate(tenants) if t.cpu is None]
        if need_tail:
            for i, (q95, q99) in fcfs_tails(tenants, need_tail, bound, where=where).items():
                p95[i], p99[i] = q95, q99
            method += "; p95/p99 by P-K inversion (DFT)"
        if bound is not None:
            method += (f"; periodic streams: every request within the worst-case FIFO bound "
                       f"{bound:.2f} ms (network calculus), which caps these")
    elif d is Discipline.PS:
        dev = gpu_ps_responses(tenants, where=where)
        rho = device_utilization(device, tenants)
        method = "M/G/1-PS S_i/(1-rho), exact (Ibis Eq. 6 per class)"
    elif d is Discipline.GPU_TIMESHARE:
        fcfs = gpu_fcfs_responses(tenants, where=where)
        ps = gpu_ps_responses(tenants, where=where)
        bounds = list(zip(fcfs, ps))
        dev = timeshare_responses(tenants, where=where)
        rho = device_utilization(device, tenants)
        method = ("GPU time-sharing: upper bound, the app as lowest class of a preemptive-priority M/G/1 "
                  "(proven for FIFO within an app); bounds = (M/G/1-FCFS Eq. 3, 5; M/G/1-PS S_i/(1-rho), "
                  "Eq. 6-8)")
    elif d is Discipline.MPS:
        dev = mps_responses(tenants, device.servers, where=where)
        rho = device_utilization(device, tenants)
        method = f"M/G/c limited PS, c={device.servers:g}, exact S_i*E[R]/E[S] (model of Ibis Eq. 10)"
    elif d is Discipline.SPATIAL:
        dev = spatial_responses(tenants, where=where)
        rho = device_utilization(device, tenants)
        need_tail = [i for i, t in enumerate(tenants) if t.cpu is None]
        tails = spatial_quantiles([tenants[i] for i in need_tail], where=where)
        for i, (q95, q99) in zip(need_tail, tails):
            p95[i], p99[i] = _shift(q95, tenants[i].network_ms), _shift(q99, tenants[i].network_ms)
        ks = sorted({t.instances for t in tenants})
        method = ("spatial shares (Dhakal §IV), per tenant M/G/k: "
                  + ("M/G/1 P-K, exact" if ks == [1] else "Lee-Longton approximation for k > 1 (exact P-K for k = 1)")
                  + f"; instances hold {shares_used(tenants):.3g} of the device")
    elif d is Discipline.BATCH:
        dev, rho = batch_responses(tenants, device.max_batch, device.batch_timeout_ms, where=where)
        many = len({t.model for t in tenants}) > 1
        method = (f"batching chain, B={device.max_batch}, timeout={device.batch_timeout_ms:g} ms, "
                  f"batch time k1*b+k2 (Ibis Eq. 9)" + ("; models combined by fixed point (approx.)" if many else ""))
        if any(t.batch is None for t in tenants):
            method += "; no batch law: b requests take b*E[S]"
        if isinstance(dev[0], Unstable):
            rho = dev[0].rho
    else:  # pragma: no cover - Discipline is closed
        raise ValueError(f"no estimator for discipline {d!r}")
    if any(t.arrival.kind is not ArrivalKind.POISSON for t in tenants) and "periodic streams:" not in method:
        method += "; Poisson arrivals assumed (conservative for periodic streams)"
    out: dict[str, TenantEstimate] = {}
    for i, t in enumerate(tenants):
        cpu = tenant_cpu_ms(t)
        out[t.name] = TenantEstimate(
            name=t.name,
            mean_ms=end_to_end(cpu, dev[i], t.network_ms),
            p95_ms=p95[i],
            p99_ms=p99[i],
            device_ms=dev[i],
            cpu_ms=cpu,
            network_ms=t.network_ms,
            rho=rho,
            method=method,
            bounds_ms=bounds[i],
        )
    return out


def _shift(x: Latency, by: float) -> Latency:
    return x if isinstance(x, Unstable) else x + by
