"""Periodic streams (camera frames) on an FCFS device: a worst-case latency bound from network calculus.

Why. The P-K estimators assume Poisson arrivals. A camera sends one frame every ``T = 1000/fps`` ms; a few
cameras on one Edge TPU queue far less than Poisson streams of the same rates do (one camera alone never
queues). Admission at p99 with the Poisson tail turns away cameras that fit: a single 15 FPS Coral-Pie
camera (23.3 ms per frame) gets a Poisson p99 of 74.6 ms against a frame budget of 66.7 ms, while every frame
really takes 23.3 ms.

Bound. Tenant i sends at most ``floor(tau / T_i) + 1`` requests in any closed window of length ``tau``,
whatever its phase, and each takes at most ``s_i`` ms on the device (the largest execution time of its
profile, plus its model-switch cost when another model shares the device). So the work arriving in any
window is at most ``sum_i s_i (floor(tau / T_i) + 1) <= sum_i s_i + tau U`` with ``U = sum_i s_i / T_i``.
On a work-conserving FCFS server of rate 1, a request's response time is the backlog just after it
arrives (itself included, ties served last in the worst case), which is ``sup_u [A[u, a] - (a - u)]`` over
the start ``u`` of its busy period, hence at most ``sup_tau (sum_i s_i + tau U - tau) = sum_i s_i`` when
``U <= 1``: one request of every tenant, itself included. The bound holds for every request, so it bounds
the mean and every percentile at once, for any phases (the simulator draws them uniformly at random).

It is exact for one stream alone (D/D/1: ``s``) and tight when the phases align; with many small streams
the Poisson estimate (which, for a superposition of periodic streams, is itself an upper estimate: nD/D/1
queues less than M/D/1) is the smaller one, so :func:`cap` takes the minimum of the two.

Applies only when every tenant of the device is periodic and every execution time has a finite largest
value (deterministic, empirical, shifted or mixtures of those, or a calibrated profile's observed largest
execution: ``Tenant.service_max_ms``); otherwise ``None``. Units: ms, req/s.
"""

from __future__ import annotations

from collections.abc import Sequence

from edgemux.cluster.workload import ArrivalKind, Tenant
from edgemux.perf.result import Latency, Unstable
from edgemux.profiles.distributions import Deterministic, Distribution, Empirical, Mixture, Shifted

__all__ = ["largest_ms", "largest_service_ms", "periodic_fcfs_bound", "cap"]


def largest_ms(d: Distribution) -> float | None:
    """The largest value ``d`` can take (ms), or ``None`` when its support is unbounded (exponential,
    gamma, or an unknown kind)."""
    if isinstance(d, Deterministic):
        return d.value
    if isinstance(d, Empirical):
        return float(max(d.samples))
    if isinstance(d, Shifted):
        base = largest_ms(d.base)
        return None if base is None else base + d.shift_ms
    if isinstance(d, Mixture):
        tops = [largest_ms(p) for p, w in zip(d.parts, d.weights) if w > 0]
        return None if any(t is None for t in tops) else max(t for t in tops if t is not None)
    return None


def largest_service_ms(t: Tenant) -> float | None:
    """The largest execution time (ms) of tenant ``t``: its law's largest value, else the largest one
    observed (``Tenant.service_max_ms``, a calibrated profile's), else None (unbounded, none known)."""
    top = largest_ms(t.service)
    return top if top is not None else t.service_max_ms


def periodic_fcfs_bound(tenants: Sequence[Tenant]) -> float | None:
    """The worst-case device response time (ms) of every request of ``tenants`` on one FCFS device,
    ``sum_i s_i`` with ``s_i`` tenant i's largest execution time plus its switch cost (when another model
    shares the device); ``None`` when a tenant is not periodic, an execution time is unbounded, or the
    worst-case load ``sum_i s_i fps_i / 1000`` exceeds 1 (see the module docstring)."""
    if not tenants or any(t.arrival.kind is not ArrivalKind.PERIODIC for t in tenants):
        return None
    models = {t.cache_key for t in tenants}  # a co-compiled set switches nothing within itself
    total = 0.0
    load = 0.0
    for t in tenants:
        top = largest_service_ms(t)
        if top is None:
            return None
        s = top + (t.switch_ms if len(models) > 1 else 0.0)
        total += s
        load += s * t.rate_rps / 1000.0
    if not load <= 1.0:
        return None
    return total


def cap(estimates: Sequence[Latency], bound: float | None) -> list[Latency]:
    """Each estimate lowered to ``bound`` where the bound applies (an ``Unstable`` Poisson estimate
    becomes the bound: with ``U <= 1`` the periodic queue is stable whatever the Poisson model says)."""
    if bound is None:
        return list(estimates)
    return [bound if isinstance(x, Unstable) else min(x, bound) for x in estimates]

