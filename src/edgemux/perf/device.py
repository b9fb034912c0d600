"""The bridge the CLI, the validation and the policies use: every tenant's latency on one device.

:func:`predict_device` asks the estimator of the device's sharing discipline (``perf.estimators``, one per
``cluster.workload.Discipline``, the same description the simulator executes; its docstring lists them)
for the device part, then completes each tenant's estimate end to end.

End to end, each tenant adds its CPU stage (exact M/G/c limited PS, Ibis Eq. 11 model) and its constant
network latency (means add exactly, Ibis §3.6). Every discipline gives p95/p99 end to end: exact P-K
inversion on FCFS and one-instance spatial devices, the laws of ``perf.sojourn`` elsewhere, a CPU stage's
law convolved in (``perf.estimators``' table says which is exact, approximate or an upper estimate).

Arrivals: every estimator assumes Poisson arrivals at ``arrival.rate_rps`` whatever the arrival kind. For
periodic camera streams (and for replayed traces smoother than Poisson) this overestimates queueing, i.e.
it is conservative; ``method`` says so when it applies. On an FCFS device whose tenants are all periodic
with bounded execution times, the worst-case bound of ``perf.periodic`` (one request of every tenant)
holds for every request, so it caps the mean and the percentiles (the smaller of the two is given).

Units: ms, req/s. Pure functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from edgemux.cluster.workload import ArrivalKind, DeviceSpec, Tenant
from edgemux.perf.estimators import estimator_for, fcfs_responses, fcfs_tails
from edgemux.perf.result import Latency
from edgemux.perf.tandem import end_to_end, tenant_cpu_ms

__all__ = ["TenantEstimate", "predict_device", "device_utilization", "fcfs_responses", "fcfs_tails"]


@dataclass(frozen=True)
class TenantEstimate:
    """One tenant's predicted latency on a device (ms). ``Unstable`` where a queue has no steady state."""

    name: str
    mean_ms: Latency          # end to end: cpu + device + network
    p50_ms: Latency | None    # end to end; every estimator gives one (None: not asked for)
    p95_ms: Latency | None    # end to end; every estimator gives one (None: not asked for)
    p99_ms: Latency | None
    device_ms: Latency        # device queueing + service
    cpu_ms: Latency           # 0.0 without a CPU stage
    network_ms: float
    rho: float                # device utilization from all tenants
    method: str               # formula + paper equation
    bounds_ms: tuple[Latency, Latency] | None = None   # gpu-timeshare: (FCFS, PS) device latency


def device_utilization(device: DeviceSpec, tenants: Sequence[Tenant]) -> float:
    """Utilization rho of ``device`` from all its tenants (dimensionless; >= 1 means overloaded).

    fcfs: ``lam E[S]`` with switch overheads (Ibis Eq. 1-2); ps, gpu-timeshare: ``sum lam_i E[e_i]``;
    mps: ``sum lam_i E[e_i] / c``; spatial: the largest of the tenants' ``lam_i E[e_i] / k_i`` (each tenant
    has its own instances, so the busiest one decides stability); batch: the busy fraction the batching estimator finds, or the load at
    full batches ``sum lam_g T_g(B) / B`` when even that is >= 1.
    """
    if not tenants:
        return 0.0
    return estimator_for(device.discipline).utilization(device, tenants)


def predict_device(device: DeviceSpec, tenants: Sequence[Tenant],
                   tails: Sequence[str] | None = None) -> dict[str, TenantEstimate]:
    """Every tenant's predicted latency on ``device`` (mean end to end, device and CPU parts, p50/p95/p99),
    keyed by tenant name. ``tails``: the names of the tenants whose percentiles are wanted (default all;
    the others get None), as admission asks only for the percentile SLOs. See ``perf.estimators`` for the
    estimator used per discipline; each estimate's ``method`` names it with its paper equation."""
    tenants = list(tenants)
    if not tenants:
        return {}
    names = [t.name for t in tenants]
    if len(set(names)) != len(names):
        raise ValueError(f"tenant names on device {device.name!r} must be unique, got {names}")
    which = None if tails is None else [i for i, n in enumerate(names) if n in set(tails)]
    part = estimator_for(device.discipline).predict(device, tenants, which)
    method = part.method
    if any(t.arrival.kind is not ArrivalKind.POISSON for t in tenants) and "periodic streams:" not in method:
        method += "; Poisson arrivals assumed (conservative for periodic streams)"
    out: dict[str, TenantEstimate] = {}
    for i, t in enumerate(tenants):
        cpu = tenant_cpu_ms(t)
        out[t.name] = TenantEstimate(
            name=t.name,
            mean_ms=end_to_end(cpu, part.device_ms[i], t.network_ms),
            p50_ms=part.p50_ms[i],
            p95_ms=part.p95_ms[i],
            p99_ms=part.p99_ms[i],
            device_ms=part.device_ms[i],
            cpu_ms=cpu,
            network_ms=t.network_ms,
            rho=part.rho,
            method=method,
            bounds_ms=part.bounds_ms[i],
        )
    return out
