"""Multi-tenant Edge TPU: M/G/1-FCFS with model-switch overhead (Ibis §3.2, Eq. 1-5).

The device runs one request at a time, non-preemptively, in arrival order. A request of tenant i runs its
execution time ``e_i`` plus the switch overhead ``o_i`` when the previous request the device ran used
another model. Tenants that share a model (AI as a Service: the same ``Tenant.model`` string) pay no switch
between each other, so the switch probability is computed per *model*:

    p_i = lam_i / lam                                   (Ibis P(M_i), Table 1)
    q_i = sum of p_j over tenants j with model_j == model_i   (probability the previous request ran i's model)
    S_i = E[e_i] + (1 - q_i) o_i                         (Eq. 1, with q_i in place of P(M_i))
    E[S] = sum_i p_i S_i                                  (Eq. 2)
    E[S^2] = sum_i p_i [ q_i E[e_i^2] + (1 - q_i) E[(e_i + o_i)^2] ]   (true second moment of the mixture)
    E[w] = lam E[S^2] / (2 (1 - rho)),  rho = lam E[S]    (Eq. 3, Pollaczek-Khinchine)
    E[R_i] = E[w] + S_i                                    (Eq. 5)

With one tenant or one model, or all ``o_i = 0``, this is plain M/G/1-FCFS (and M/D/1, Eq. 4, for a
deterministic execution time). Ibis plugs the variance of the tenants' *mean* service times into Eq. 3;
edgemux uses the true second moment of the service-time mixture above, which also counts each tenant's own
execution-time variance and the switch/no-switch spread.

Approximation: consecutive service times are not independent (a request's switch depends on the previous
request's model, and so does that request's own service), while P-K assumes i.i.d. services. The arrival
classes themselves are i.i.d. (merged Poisson streams), so the marginal mixture above is exact; only the
one-step correlation is ignored (checked against the simulator by ``edgemux validate``).

Units: ms, req/s. Pure functions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from edgemux.cluster.workload import ArrivalKind, Tenant
from edgemux.perf.queueing import mg1_waiting, per_ms
from edgemux.perf.result import Latency, Unstable
from edgemux.profiles.distributions import Distribution, Mixture, Shifted, second_moment

__all__ = [
    "request_shares",
    "same_model_probabilities",
    "mean_service_times",
    "service_moments",
    "service_mixture",
    "tenant_service",
    "tenant_services",
    "edgetpu_utilization",
    "edgetpu_waiting",
    "edgetpu_responses",
]


def request_shares(tenants: Sequence[Tenant]) -> list[float]:
    """``P(M_i) = lam_i / lam`` per tenant (Ibis Eq. 1 / Table 1), dimensionless.

    With no traffic at all (every rate 0) the shares are equal, so formulas stay defined at ``lam = 0``.
    """
    lam = math.fsum(t.rate_rps for t in tenants)
    if lam <= 0.0:
        return [1.0 / len(tenants)] * len(tenants) if tenants else []
    return [t.rate_rps / lam for t in tenants]


def same_model_probabilities(tenants: Sequence[Tenant]) -> list[float]:
    """``q_i``: probability that the previous request ran tenant i's model (sum of the shares of the
    tenants with the same ``model``); a request of tenant i pays its switch ``o_i`` with probability
    ``1 - q_i``. Dimensionless. Ibis Eq. 1 with tenants grouped by model.

    The rate share is right when requests interleave at random (Poisson). A periodic stream does not: equal-
    rate cameras of different models interleave in a fixed order, so every frame can follow another model's
    frame. A periodic tenant therefore gets ``q_i = 0`` whenever another model shares the device (it pays its
    switch on every request; the simulator shows the rate share would leave such a device overloaded while
    the estimate says rho = 0.9), and 1 when it is the only model."""
    p = request_shares(tenants)
    by_model: dict[str, float] = {}
    for t, pi in zip(tenants, p):  # by cache key: co-compiled models reload nothing between each other
        by_model[t.cache_key] = by_model.get(t.cache_key, 0.0) + pi
    alone = len(by_model) == 1
    return [(1.0 if alone else 0.0) if t.arrival.kind is ArrivalKind.PERIODIC else min(1.0, by_model[t.cache_key])
            for t in tenants]


def mean_service_times(tenants: Sequence[Tenant]) -> list[float]:
    """``S_i = E[e_i] + (1 - q_i) o_i`` per tenant (ms), Ibis Eq. 1 with switches grouped by model."""
    q = same_model_probabilities(tenants)
    return [t.service.mean + (1.0 - qi) * t.switch_ms for t, qi in zip(tenants, q)]


def service_moments(tenants: Sequence[Tenant]) -> tuple[float, float]:
    """``(E[S], E[S^2])`` of the aggregate service time (ms, ms^2): Ibis Eq. 2 and the true second moment
    ``sum_i p_i [q_i E[e_i^2] + (1 - q_i) E[(e_i + o_i)^2]]`` of the switch mixture."""
    p = request_shares(tenants)
    q = same_model_probabilities(tenants)
    m1 = 0.0
    m2 = 0.0
    for t, pi, qi in zip(tenants, p, q):
        e1 = t.service.mean
        e2 = second_moment(t.service)
        o = t.switch_ms
        m1 += pi * (e1 + (1.0 - qi) * o)
        m2 += pi * (qi * e2 + (1.0 - qi) * (e2 + 2.0 * o * e1 + o * o))
    return m1, m2


def tenant_service(tenant: Tenant, tenants: Sequence[Tenant]) -> Distribution:
    """The service-time distribution (ms) of one request of ``tenant`` on this device:
    ``e_i + o_i`` with probability ``1 - q_i``, else ``e_i`` (Ibis Eq. 1 as a distribution).
    ``tenant`` must be one of ``tenants``."""
    return _own_service(tenant, same_model_probabilities(tenants)[_index(tenant, tenants)])


def tenant_services(tenants: Sequence[Tenant]) -> list[Distribution]:
    """:func:`tenant_service` of every tenant, tenants' order (one pass over the device, not one per tenant).
    Tenants of one model at one device get equal values, which the tail estimator computes once."""
    made: dict[tuple[Distribution, float, float], Distribution] = {}  # one object per distinct law
    out = []
    for t, qi in zip(tenants, same_model_probabilities(tenants)):
        key = (t.service, t.switch_ms, qi)
        law = made.get(key)
        if law is None:
            law = made[key] = _own_service(t, qi)
        out.append(law)
    return out


def _own_service(tenant: Tenant, qi: float) -> Distribution:
    if tenant.switch_ms == 0.0 or qi >= 1.0:
        return tenant.service
    return Mixture((tenant.service, Shifted(tenant.service, tenant.switch_ms)), (qi, 1.0 - qi))


def service_mixture(tenants: Sequence[Tenant]) -> Distribution:
    """The aggregate service-time distribution (ms) the device sees: a ``Mixture`` over tenants (weights
    ``p_i``) of each tenant's switch mixture (Ibis Eq. 1-2). Its mean and second moment are
    :func:`service_moments`; the tail estimator (``perf.tails``) inverts P-K with it."""
    p = request_shares(tenants)
    q = same_model_probabilities(tenants)
    parts: list[Distribution] = []
    weights: list[float] = []
    for t, pi, qi in zip(tenants, p, q):
        if pi <= 0.0:
            continue
        if t.switch_ms == 0.0 or qi >= 1.0:
            parts.append(t.service)
            weights.append(pi)
            continue
        if qi > 0.0:
            parts.append(t.service)
            weights.append(pi * qi)
        parts.append(Shifted(t.service, t.switch_ms))
        weights.append(pi * (1.0 - qi))
    total = math.fsum(weights)
    return Mixture(tuple(parts), tuple(w / total for w in weights))


def edgetpu_utilization(tenants: Sequence[Tenant]) -> float:
    """Device utilization ``rho = lam E[S]`` with switches included (dimensionless), Ibis Table 1."""
    lam = per_ms(math.fsum(t.rate_rps for t in tenants))
    m1, _ = service_moments(tenants)
    return lam * m1


def edgetpu_waiting(tenants: Sequence[Tenant], *, where: str = "device") -> Latency:
    """Mean waiting time in queue (ms) on the shared Edge TPU: P-K (Ibis Eq. 3) with the switch mixture's
    true moments. ``Unstable`` when ``rho >= 1``."""
    lam_rps = math.fsum(t.rate_rps for t in tenants)
    m1, m2 = service_moments(tenants)
    return mg1_waiting(lam_rps, m1, m2, where=where)


def edgetpu_responses(tenants: Sequence[Tenant], *, where: str = "device") -> list[Latency]:
    """Per-tenant mean device response time (ms): ``E[R_i] = E[w] + S_i`` (Ibis Eq. 5 with Eq. 1-3),
    in the order of ``tenants``."""
    if not tenants:
        return []
    w = edgetpu_waiting(tenants, where=where)
    if isinstance(w, Unstable):
        return [w for _ in tenants]
    return [w + s for s in mean_service_times(tenants)]


def _index(tenant: Tenant, tenants: Sequence[Tenant]) -> int:
    for i, t in enumerate(tenants):
        if t is tenant:
            return i
    for i, t in enumerate(tenants):
        if t == tenant:
            return i
    raise ValueError(f"tenant {tenant.name!r} is not among the device's tenants")
