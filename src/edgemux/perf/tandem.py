"""End-to-end latency of an app: CPU stage, then the shared device, plus the network (Ibis §3.6, Fig. 2).

``R_total = R_cpu + R_device + network``: means add exactly (linearity of expectation) even though the
stages' sojourn times are correlated. The device's arrival stream stays Poisson behind the CPU stage: a
limited processor-sharing queue is a symmetric queue, hence quasi-reversible, so its departures form a
Poisson process (Kelly); the device estimators therefore apply unchanged.

Units: ms. Pure functions.
"""

from __future__ import annotations

from edgemux.cluster.workload import Tenant
from edgemux.perf.cpu import cpu_response
from edgemux.perf.result import Latency, add

__all__ = ["end_to_end", "tenant_cpu_ms", "tenant_end_to_end"]


def end_to_end(cpu_ms: Latency, device_ms: Latency, network_ms: float = 0.0) -> Latency:
    """Mean end-to-end latency (ms): ``R_cpu + R_device + network`` (Ibis §3.6, ``R_total = R_CPU +
    R_GPU/TPU``, plus MVSP's network term). The first ``Unstable`` stage wins."""
    return add(cpu_ms, device_ms, network_ms)


def tenant_cpu_ms(tenant: Tenant) -> Latency:
    """Mean CPU-stage latency (ms) of ``tenant`` (Ibis Eq. 11 model, exact); 0.0 without a CPU stage."""
    if tenant.cpu is None:
        return 0.0
    return cpu_response(tenant.cpu, tenant.rate_rps, where=f"cpu of {tenant.name}")


def tenant_end_to_end(tenant: Tenant, device_ms: Latency) -> Latency:
    """Mean end-to-end latency (ms) of ``tenant`` given its mean device latency ``device_ms``."""
    return end_to_end(tenant_cpu_ms(tenant), device_ms, tenant.network_ms)
