"""Closed-loop tenants on one shared device: mean value analysis (MVA).

The open estimators (``perf.device``) take each tenant's arrival rate. A benchmark client, or an app that
waits for each answer before it sends the next request, has no arrival rate of its own: its rate is
``population / (think + response)`` and depends on the answer. Exact multi-class MVA (Reiser and Lavenberg
1980) solves one device with ``K`` such tenants, tenant ``k`` keeping ``N_k`` requests in flight and
thinking ``Z_k`` ms between an answer and its next request, by recursion over the population vectors
``n <= N``. It rests on the arrival theorem: a request of tenant ``k`` arriving at the device sees the
device as it is in equilibrium with one request of its own tenant fewer, ``n - e_k``.

The residence time per discipline (the one place that says how a discipline shares the device here):

``ps``            ``R_k(n) = S_k (1 + Q(n - e_k))``: egalitarian processor sharing; exact (BCMP: a PS
                  station is product form, and insensitive to the service-time law beyond its mean).
``gpu-timeshare`` the same as ``ps`` while every tenant keeps at most one request in flight (Ibis §3.3:
                  one CUDA context's requests are FIFO, contexts time-share, so with one request per
                  tenant the device is time-shared among all present); refused otherwise, since a tenant's
                  own FIFO queue then mixes FCFS with PS and MVA has no exact form for it.
``fcfs``          ``R_k(n) = S_k + sum_j S_j Q_j(n - e_k)``: each request ahead is served whole first. Exact
                  for class-independent exponential service; with class-dependent means it is the usual
                  approximation (Bard-Schweitzer's core, without its fixed point); with one request per
                  tenant and no think time it gives ``sum_j S_j``, a cyclic round, exact for any law.

Units: ms. Pure functions.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from edgemux.cluster.workload import Discipline

__all__ = ["ClosedTenant", "closed_responses", "CLOSED_DISCIPLINES"]


@dataclass(frozen=True)
class ClosedTenant:
    """A closed-loop tenant: mean service time ``service_ms`` on the device when alone, ``population``
    requests in flight, ``think_ms`` between an answer and the next request."""

    service_ms: float
    population: int = 1
    think_ms: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.service_ms) and self.service_ms > 0):
            raise ValueError(f"service_ms must be a finite number > 0, got {self.service_ms!r}")
        if isinstance(self.population, bool) or not isinstance(self.population, int) or self.population < 0:
            raise ValueError(f"population must be an int >= 0, got {self.population!r}")
        if not (math.isfinite(self.think_ms) and self.think_ms >= 0):
            raise ValueError(f"think_ms must be a finite number >= 0, got {self.think_ms!r}")


def _ps(service: Sequence[float], k: int, queue: Sequence[float]) -> float:
    return service[k] * (1.0 + sum(queue))


def _fcfs(service: Sequence[float], k: int, queue: Sequence[float]) -> float:
    return service[k] + sum(s * q for s, q in zip(service, queue))


# a discipline's residence time at the device for a request of tenant k that sees ``queue`` (per tenant)
CLOSED_DISCIPLINES = {Discipline.PS: _ps, Discipline.GPU_TIMESHARE: _ps, Discipline.FCFS: _fcfs}

_MAX_STATES = 200_000  # population vectors the recursion may visit (prod of N_k + 1)


def closed_responses(tenants: Sequence[ClosedTenant], discipline: Discipline) -> list[float]:
    """Each tenant's mean response time (ms, at the device: waiting and service) when ``tenants`` share one
    device under ``discipline`` in a closed loop (exact MVA; see the module doc for where it is exact).
    A tenant with population 0 gets the response a single request of it would see (its arrival-theorem
    view of the others). ``ValueError`` for a discipline without a closed-loop form here, a
    ``gpu-timeshare`` tenant with more than one request in flight, or more than ``_MAX_STATES`` vectors."""
    residence = CLOSED_DISCIPLINES.get(discipline)
    if residence is None:
        known = ", ".join(d.value for d in CLOSED_DISCIPLINES)
        raise ValueError(f"no closed-loop form for discipline '{discipline.value}' (known: {known})")
    if discipline is Discipline.GPU_TIMESHARE and any(t.population > 1 for t in tenants):
        raise ValueError("gpu-timeshare in a closed loop needs at most one request in flight per tenant "
                         "(a tenant's own FIFO queue is not processor sharing)")
    if not tenants:
        return []
    pops = [t.population for t in tenants]
    if math.prod(p + 1 for p in pops) > _MAX_STATES:
        raise ValueError(f"populations {pops} make more than {_MAX_STATES} states")
    service = [t.service_ms for t in tenants]
    think = [t.think_ms for t in tenants]
    K = len(tenants)
    # queue lengths per tenant at each population vector, filled in order of total population
    queues: dict[tuple[int, ...], list[float]] = {}
    for n in sorted(itertools.product(*(range(p + 1) for p in pops)), key=sum):
        if sum(n) == 0:
            queues[n] = [0.0] * K
            continue
        q = [0.0] * K
        for k in range(K):
            if n[k] == 0:
                continue
            seen = queues[n[:k] + (n[k] - 1,) + n[k + 1:]]
            r = residence(service, k, seen)
            q[k] = n[k] * r / (think[k] + r)  # Little's law on tenant k's loop: X_k R_k
        queues[n] = q
    full = tuple(pops)
    out = []
    for k in range(K):
        seen = queues[full[:k] + (full[k] - 1,) + full[k + 1:]] if full[k] else queues[full]
        out.append(residence(service, k, seen))
    return out
