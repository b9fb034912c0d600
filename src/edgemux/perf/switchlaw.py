"""The exact response-time law of a shared Edge TPU whose switch depends on the request served before.

``perf.tails`` (and ``perf.edgetpu``'s means) treat a request's model switch as independent of the wait it
sees: W comes from Pollaczek-Khinchine with i.i.d. services drawn from the switch mixture, and a tagged
request's own service pays its switch with probability ``1 - q_i`` on top. On the device the two are one
event: under FCFS the request served just before the tagged one is the previous *arrival*, whose class
(tenant) decides both how long the tagged request waits (its own response time, less the gap between the
two arrivals) and whether the tagged request pays a switch. A short model that waits behind a long one is
exactly the request that pays its switch; the i.i.d. reading separates them and under-estimates the short
model's tail (on the catalog's Edge TPU profiles against the simulator, a p95 by up to 18 %; on the real
Edge TPU files of ``edgemux validate --measurements``, p95 down to -14 %).

The law. Tenant ``c`` sends a share ``p_c`` of the Poisson arrivals (rate ``lam``); ``U_c`` is its
execution time, ``V_c = U_c + o_c`` with its switch; a switch is paid when the previous request ran a model
of another cache key (co-compiled models reload nothing between each other). With ``R_c`` the response law
of a request of tenant c, and the previous arrival's class drawn independently by ``p`` (merged Poisson
streams), the Lindley recursion gives, exactly,

    R_c' = sum_c p_c (R_c - A)^+ (*) S(c', c),    S(c', c) = U_c' if c and c' share a key, else V_c',

A the gap between two arrivals (exponential). Grouping the classes by key ``h`` (``G_h = sum_{c in h} p_c
R_c``, a measure of mass ``P_h``; ``H = sum_h G_h``, the law of any arrival's response):

    G_h = (H - A)^+ (*) a_h + (G_h - A)^+ (*) b_h,   a_h = sum_{c in h} p_c V_c,  b_h = sum_{c in h} p_c (U_c - V_c).

Solution. On a lattice of step dt the gap is read as geometric, ``P(A >= j dt) = g^j`` with ``g = 1 /
(1 + lam dt)``, so that ``E[A] = 1/lam`` exactly: with ``g = exp(-lam dt)`` the gap would be half a cell
short on average, a load higher by ``lam dt / 2``, which the wait amplifies by ``1 / (1 - rho)`` (+4.6 % on
the mean at rho = 0.9 in the validation grid). For a measure X on the lattice with generating
function ``X(z)``, ``(X - A)^+`` then has ``c(z) X(z) + d(z) k``, with ``c(z) = (1 - g) z / (z - g)``,
``d(z) = (z - 1) / (z - g)`` and the one number ``k = g X(g) = sum_k X_k g^(k+1)`` (the mass that reaches
0). At each DFT point ``z`` the recursion is then a linear system of size G (keys) in ``G_h(z)``, given
``k_h``; the solution is affine in ``k``, and ``k_h = g G_h(g)`` read back from the solution is a G x G
linear system for ``k`` itself. One pass, no iteration: its answer equals the fixed point of the recursion
(power iteration started from the i.i.d. law, checked in ``tests/test_perf_switchlaw.py``), and it agrees
with the simulator's Edge TPU within its confidence intervals on the mean, p95 and p99
(``edgemux validate``, family ``edgetpu-switch``). The grid is ``perf.tails``'s (its span holds all but
~1e-11 of the i.i.d. law; the switch law's tail decays at nearly the same rate).

Exact for Poisson arrivals (``ValueError`` otherwise: a periodic stream's interleaving is not random).
Units: ms, req/s. Pure functions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from edgemux.cluster.workload import ArrivalKind, Tenant
from edgemux.perf.edgetpu import request_shares, service_mixture, tenant_services
from edgemux.perf.queueing import per_ms
from edgemux.perf.result import Latency, Unstable
from edgemux.perf.tails import LatticeDistribution, plan_grid
from edgemux.profiles.distributions import Distribution, Shifted

__all__ = ["switch_response_laws", "switch_response_quantiles"]

_MAX_ENTRIES = 1 << 24  # complex entries of the per-point G x G systems: 256 MB


def switch_response_laws(tenants: Sequence[Tenant], *, where: str = "device") -> list[LatticeDistribution] | Unstable:
    """Each tenant's response-time law (ms, device part: wait and own service with its switch) on one FCFS
    Edge TPU, the switch decided by the request served before (module doc). ``Unstable`` when ``rho >=
    1``; ``ValueError`` for an arrival process other than Poisson, no traffic at all, or more models than
    the grid's memory bound allows (``_MAX_ENTRIES``)."""
    tenants = list(tenants)
    if not tenants:
        return []
    periodic = [t.name for t in tenants if t.arrival.kind is not ArrivalKind.POISSON]
    if periodic:
        raise ValueError(f"the switch law needs Poisson arrivals; {periodic[0]} is {tenants[0].arrival.kind.value}")
    lam_rps = math.fsum(t.rate_rps for t in tenants)
    if lam_rps <= 0.0:
        raise ValueError("the switch law needs traffic: every tenant's rate is 0")
    agg = service_mixture(tenants)
    rho = per_ms(lam_rps) * agg.mean
    if rho >= 1.0:
        return Unstable(rho, where)
    owns = tenant_services(tenants)
    dt, n = plan_grid(lam_rps, agg, owns)
    g = 1.0 / (1.0 + per_ms(lam_rps) * dt)  # geometric gap with the mean 1/lam exactly (module doc)
    p = request_shares(tenants)
    keys = sorted({t.cache_key for t in tenants})
    group = [keys.index(t.cache_key) for t in tenants]
    G = len(keys)
    if (n // 2 + 1) * G * G > _MAX_ENTRIES:
        raise ValueError(f"the switch law of {G} models on a grid of {n} cells needs more than {_MAX_ENTRIES} "
                         "matrix entries (about 256 MB)")

    def spectrum(d: Distribution) -> np.ndarray:
        mass = np.asarray(d.lattice(dt, n), dtype=float)
        return np.fft.rfft(mass / mass.sum())

    fu = [spectrum(t.service) for t in tenants]
    fv = [spectrum(Shifted(t.service, t.switch_ms)) if t.switch_ms > 0 else fu[i] for i, t in enumerate(tenants)]
    z = np.exp(-2j * np.pi * np.arange(n // 2 + 1) / n)   # rfft's points, X[j] = sum_k x_k z_j^k
    cz = (1.0 - g) * z / (z - g)
    dz = (z - 1.0) / (z - g)
    a = [sum((p[c] * fv[c] for c in range(len(tenants)) if group[c] == h), np.zeros_like(z)) for h in range(G)]
    b = [sum((p[c] * (fu[c] - fv[c]) for c in range(len(tenants)) if group[c] == h), np.zeros_like(z))
         for h in range(G)]
    mass = np.array([math.fsum(p[c] for c in range(len(tenants)) if group[c] == h) for h in range(G)])

    # per z: (I - c a 1^T - c diag(b)) G(z) = d (k_H a + diag(b) k); at z = 1 (j = 0) the masses themselves
    m = np.empty((z.size, G, G), dtype=complex)
    for h in range(G):
        m[:, h, :] = (-cz * a[h])[:, None]
        m[:, h, h] += 1.0 - cz * b[h]
    m[0] = np.eye(G)
    inv = np.linalg.inv(m)
    basis = []   # the solution for k = e_u (u = 0..G-1), without the masses at z = 1
    for u in range(G):
        rhs = np.stack([dz * (a[h] + (b[h] if h == u else 0.0)) for h in range(G)], axis=1)
        rhs[0] = 0.0
        basis.append(np.einsum("zij,zj->zi", inv, rhs))
    fixed = np.zeros((z.size, G), dtype=complex)
    fixed[0] = mass
    powers = g ** np.arange(1, n + 1, dtype=float)
    # k_h = sum_k G_h[k] g^(k+1), G_h the inverse transform of fixed + sum_u k_u basis_u: affine in k
    coef = np.array([[np.fft.irfft(basis[u][:, h], n) @ powers for u in range(G)] for h in range(G)])
    const = np.array([np.fft.irfft(fixed[:, h], n) @ powers for h in range(G)])
    k = np.linalg.solve(np.eye(G) - coef, const)
    spec = fixed + sum(k[u] * basis[u] for u in range(G))
    whole = cz * spec.sum(axis=1) + dz * k.sum()      # (H - A)^+
    whole[0] = 1.0
    laws: list[LatticeDistribution] = []
    for c in range(len(tenants)):
        h = group[c]
        own = cz * spec[:, h] + dz * k[h]               # (G_h - A)^+
        own[0] = mass[h]
        r = np.fft.irfft(whole * fv[c] + own * (fu[c] - fv[c]), n)
        r = np.clip(r, 0.0, None)
        laws.append(LatticeDistribution(dt, r / r.sum()))
    return laws


def switch_response_quantiles(tenants: Sequence[Tenant], qs: Sequence[float] = (0.95, 0.99), *,
                              where: str = "device") -> list[list[Latency]]:
    """Per tenant (tenants' order), its response-time quantiles ``qs`` (ms) from :func:`switch_response_laws`."""
    laws = switch_response_laws(tenants, where=where)
    if isinstance(laws, Unstable):
        return [[laws for _ in qs] for _ in tenants]
    return [list(law.quantiles(qs)) for law in laws]
