"""The papers' own formulas where edgemux uses a different (exact) one, for side-by-side reports.

``edgemux validate`` prints how far each lands from the simulator (informational rows). Each entry is
``(family, fn)`` with ``fn(device, tenants) -> [Latency per tenant]`` in ms, tenants' order.

- ps, gpu-timeshare: Ibis Eq. 6-8, ``E[R_i] = (1/(mu - lam) - 1/mu) + S_i`` (exact only for identical
  tenants; off by ``rho (S - S_i)/(1 - rho)``, see ``perf.gpu.ibis_eq8_error``).
- mps: Ibis Eq. 10, ``c/(c mu - lam)`` split per tenant like Eq. 8 (overestimates for c > 1).
- fcfs: Ibis Eq. 1-5 with ``Var[S]`` taken as the variance of the tenants' mean service times S_i (how
  the paper combines Eq. 1-3), instead of the mixture's true second moment.

Pure functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from edgemux.cluster.workload import DeviceSpec, Discipline, Tenant
from edgemux.perf.edgetpu import mean_service_times, request_shares
from edgemux.perf.gpu import ibis_mps_responses, ibis_ps_responses
from edgemux.perf.queueing import ibis_pk_waiting
from edgemux.perf.result import Latency, Unstable

__all__ = ["PAPER_FORMS", "PaperForm", "for_discipline", "ibis_eq8", "ibis_eq10", "ibis_tpu_var_of_means"]

PaperForm = Callable[[DeviceSpec, Sequence[Tenant]], list[Latency]]


def ibis_eq8(device: DeviceSpec, tenants: Sequence[Tenant]) -> list[Latency]:
    """Ibis Eq. 6-8 per tenant (ms): aggregate PS wait plus ``S_i``."""
    return ibis_ps_responses(tenants, where=device.name)


def ibis_eq10(device: DeviceSpec, tenants: Sequence[Tenant]) -> list[Latency]:
    """Ibis Eq. 10 per tenant (ms) with ``c = device.servers``."""
    return ibis_mps_responses(tenants, device.servers, where=device.name)


def ibis_tpu_var_of_means(device: DeviceSpec, tenants: Sequence[Tenant]) -> list[Latency]:
    """Ibis Eq. 1-5 per tenant (ms) with ``Var[S] = sum_i p_i (S_i - S)^2`` (variance of the tenants' mean
    service times, switch included) in Eq. 3."""
    p = request_shares(tenants)
    s = mean_service_times(tenants)
    mean = math.fsum(pi * si for pi, si in zip(p, s))
    var = math.fsum(pi * (si - mean) ** 2 for pi, si in zip(p, s))
    w = ibis_pk_waiting(math.fsum(t.rate_rps for t in tenants), mean, var, where=device.name)
    if isinstance(w, Unstable):
        return [w for _ in tenants]
    return [w + si for si in s]


PAPER_FORMS: dict[Discipline, list[tuple[str, PaperForm]]] = {
    Discipline.FCFS: [("Ibis Eq. 3 with Var of tenants' means", ibis_tpu_var_of_means)],
    Discipline.PS: [("Ibis Eq. 8 (PS: aggregate wait + S_i)", ibis_eq8)],
    Discipline.GPU_TIMESHARE: [("Ibis Eq. 8 (PS: aggregate wait + S_i)", ibis_eq8)],
    Discipline.MPS: [("Ibis Eq. 10 (MPS: c/(c mu - lam))", ibis_eq10)],
    Discipline.BATCH: [],
    Discipline.SPATIAL: [],
}
"""The paper forms per discipline (none where the papers give no other formula)."""


def for_discipline(discipline: Discipline) -> list[tuple[str, PaperForm]]:
    """The paper forms to report next to edgemux's estimator for ``discipline`` (may be empty)."""
    return list(PAPER_FORMS[discipline])
