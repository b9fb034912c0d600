"""Rigorous lower and upper bounds on M/G/1-FCFS response-time quantiles (Edge TPU included), in closed
form, to decide an SLO check without the DFT inversion of ``perf.tails`` when the bounds settle it.

Setting (the model ``perf.tails`` inverts): Poisson arrivals at rate ``lam`` (1/ms), i.i.d. services S
(the device's aggregate service, for the Edge TPU the switch mixture of Ibis Eq. 1-2), ``rho = lam E[S]
< 1``; W the stationary FCFS wait; a tagged request of tenant i sees ``R_i = W + S_i`` with its own service
``S_i`` independent of W.

The adjustment coefficient ``theta*`` is the positive root of ``lam (M_S(theta) - 1) = theta``
(``M_S`` the moment generating function). It is computed from the *analytic* MGF (atoms, gamma,
exponential parts; no lattice) and bracketed, ``theta_lo <= theta* <= theta_hi``, with floating-point
margins checked explicitly.

Theorem 1 (two-sided Cramér-Lundberg bounds on the wait). Write ``N(x) = Fbar_e(x)`` for the tail of the
equilibrium (residual) law ``F_e`` of S (density ``Fbar_S / E[S]``), ``G(x) = e^{-theta x}
int_(x,inf) e^{theta y} dF_e(y)`` and ``M_e(theta) = (M_S(theta) - 1) / (theta E[S])``. For ``x >= 0``:

    (a) P(W > x) <= min(rho, C exp(-theta x))   for 0 < theta <= theta* and any
        C >= sup_x N(x) / (G(x) + delta e^{-theta x} / rho),  delta = 1 - rho M_e(theta) >= 0;
        C = 1 always qualifies (``G >= N``): Kingman's bound;
    (b) P(W > x) >= C exp(-theta x)             for theta >= theta* (``M_S(theta) < inf``) and any
        C <= inf_{x: N(x) > 0} N(x) / G(x).

Proof. ``Z(x) = P(W > x)``, ``x >= 0``, is the unique bounded solution of the defective renewal equation
``Z = T Z``, ``(T Z)(x) = rho N(x) + rho int_[0,x] Z(x - y) dF_e(y)`` (W is a geometric(rho) sum of
``F_e`` ladder heights, Pollaczek-Khinchine/Benes). T is monotone and a contraction of factor rho in the
sup norm, so ``Z_0 >= T Z_0`` (resp. ``<=``) for a bounded ``Z_0`` gives ``Z <= Z_0`` (resp. ``>=``): the
iterates ``T^n Z_0`` are monotone and converge to Z. For ``Z_0(x) = C e^{-theta x}``, using
``rho int_[0,x] e^{theta y} dF_e = rho M_e(theta) - rho e^{theta x} G(x)``,

    (T Z_0)(x) - Z_0(x) = rho N(x) - C rho G(x) - C e^{-theta x} (1 - rho M_e(theta)).

``rho M_e(theta) - 1 = (lam (M_S(theta) - 1) - theta) / theta`` and ``lam (M_S - 1) - theta`` is convex,
0 at 0, negative just right of 0, zero at theta*: ``delta >= 0`` below theta*, ``<= 0`` above. (a): the
difference is ``<= 0`` iff ``C (rho G(x) + delta e^{-theta x}) >= rho N(x)``; also ``Z <= Z(0) = rho``.
(b): with ``delta <= 0`` it is ``>= rho (N(x) - C G(x)) >= 0``. QED.

The constants are computed on a grid of 256 cells over ``[0, max S]`` for a discrete S (beyond ``max S``,
``N = 0``): N and G are continuous and non-increasing (``G' = -theta G - f_e``), so on a cell
``[a, b]`` the ratio in (a) is at most ``N(a) / (G(b) + delta e^{-theta b} / rho)`` and the one in (b) at
least ``N(b) / G(a)``; also ``N(x) / G(x) = 1 / E[exp(theta V_x)] >= exp(-theta (max S - x))`` with
``V_x`` the equilibrium residual beyond x (at most ``max S - x``). (a) is tried at ``theta*`` with
``C = 1`` and at a few ``theta < theta*`` with the computed C (the best bound is kept); (b) at
``theta_hi >= theta*``. For a service with a continuous part only ``C = 1`` in (a) and no (b) are used.
M/M/1 check: ``theta* = mu - lam``, and the sup in (a) and inf in (b) are both ``rho``: the exact tail.

Corollary (response). Conditioning on ``S_i``: ``P(R_i > t) = P(S_i > t) + E[P(W > t - S_i); S_i <= t]``.
With (a), (b):

    U(t) = P(S_i > t) + E[min(rho, C_a exp(-theta_a (t - S_i))); S_i <= t]       >= P(R_i > t)
    L(t) = P(S_i > t) + E[C_b exp(-theta_hi (t - S_i)); S_i <= t]                 <= P(R_i > t)

both non-increasing and right-continuous in t. The q-quantile ``t_q = inf{t: P(R_i > t) <= 1 - q}``
therefore satisfies ``inf{t: L(t) <= 1 - q} <= t_q <= inf{t: U(t) <= 1 - q}``. For a discrete ``S_i``
(atoms: deterministic, empirical, their mixtures and shifts: every Edge TPU catalog profile) U and L are
sums of exponentials between breakpoints and the crossing is solved in closed form per piece. For a
service with a continuous part (gamma, exponential) the Chernoff form ``U(t) <= exp(-theta t) M_i(theta)``
gives ``t_q <= (ln M_i(theta_lo) + ln(1/(1-q))) / theta_lo``, and ``P(R_i > t) >= P(W > t)`` gives
``t_q >= ln(C_b / (1 - q)) / theta_hi`` (``C_b = 0`` without (b): no lower bound beyond 0). With
``C_b = 0``, L is the own service's tail: ``t_q`` is at least the own service's quantile (``W >= 0``).

Floating point: every bound is widened by a relative 1e-9 after the (well-conditioned) computation; the
bracket of ``theta*`` is verified with an explicit rounding margin. Unsupported service laws (anything but
the distributions of ``profiles.distributions``) give ``None``: the caller inverts.

These bound the *true* model quantile; the DFT estimate of ``perf.tails`` approximates that within its
documented accuracy, so a caller deciding ``estimate <= SLO`` from the bounds keeps a margin
(:func:`edgetpu_decision_bounds`). Units: ms, req/s. Pure functions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from edgemux.cluster.workload import Tenant
from edgemux.perf.edgetpu import request_shares, same_model_probabilities
from edgemux.profiles.distributions import (
    Deterministic,
    Distribution,
    Empirical,
    Exponential,
    Gamma,
    Mixture,
    Shifted,
)

__all__ = [
    "ServiceLaw",
    "service_law",
    "tenant_law",
    "aggregate_law",
    "adjustment_bracket",
    "QuantileBounds",
    "response_quantile_bounds",
    "mg1_quantile_bounds",
    "edgetpu_quantile_bounds",
    "DecisionBounds",
    "edgetpu_decision_bounds",
    "device_laws",
]

_WIDEN = 1e-9  # relative widening of every bound (rounding)


@dataclass(frozen=True)
class ServiceLaw:
    """A service-time law as atoms ``(x, p)`` plus continuous parts ``(weight, shift, dist)`` with ``dist``
    gamma or exponential (total weight 1). ``mean`` in ms."""

    atoms: tuple[tuple[float, float], ...]
    cont: tuple[tuple[float, float, Distribution], ...]
    mean: float

    @property
    def discrete(self) -> bool:
        return not self.cont

    def log_mgf(self, theta: float) -> float:
        """``ln E[exp(theta S)]`` (``inf`` beyond the abscissa of convergence)."""
        return _logsumexp(self._log_terms(theta))

    def _log_terms(self, theta: float) -> list[tuple[float, float]]:
        """(log term, its derivative in theta) per part; the MGF is the sum of the exp of the terms."""
        out = [(math.log(p) + theta * x, x) for x, p in self.atoms if p > 0]
        for w, shift, d in self.cont:
            if w <= 0:
                continue
            lm, dlm = _cont_log_mgf(d, theta)
            out.append((math.log(w) + theta * shift + lm, shift + dlm))
        return out


def _cont_log_mgf(d: Distribution, theta: float) -> tuple[float, float]:
    if isinstance(d, Exponential):
        a = 1.0 - d.mean_ms * theta
        if a <= 0:
            return math.inf, math.inf
        return -math.log(a), d.mean_ms / a
    if isinstance(d, Gamma):
        k = 1.0 / d.scv
        s = d.mean_ms * d.scv
        a = 1.0 - s * theta
        if a <= 0:
            return math.inf, math.inf
        return -k * math.log(a), k * s / a
    raise TypeError(type(d).__name__)  # pragma: no cover - service_law admits only these


def _logsumexp(terms: list[tuple[float, float]]) -> float:
    if not terms:
        return -math.inf
    top = max(t for t, _ in terms)
    if math.isinf(top):
        return top
    return top + math.log(math.fsum(math.exp(t - top) for t, _ in terms))


class _Unsupported(Exception):
    pass


def _decompose(d: Distribution, w: float, shift: float, atoms: list[tuple[float, float]],
               cont: list[tuple[float, float, Distribution]]) -> None:
    if isinstance(d, Deterministic):
        atoms.append((shift + d.value, w))
    elif isinstance(d, Shifted):
        _decompose(d.base, w, shift + d.shift_ms, atoms, cont)
    elif isinstance(d, Mixture):
        for part, wp in zip(d.parts, d.weights):
            if wp > 0:
                _decompose(part, w * wp, shift, atoms, cont)
    elif isinstance(d, Empirical):
        n = len(d.samples)
        for s in d.samples:
            atoms.append((shift + s, w / n))
    elif isinstance(d, (Exponential, Gamma)):
        cont.append((w, shift, d))
    else:
        raise _Unsupported(type(d).__name__)


def _merge(atoms: list[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    acc: dict[float, float] = {}
    for x, p in atoms:
        acc[x] = acc.get(x, 0.0) + p
    return tuple(sorted(acc.items()))


@lru_cache(maxsize=4096)
def service_law(d: Distribution) -> ServiceLaw | None:
    """``d`` as a :class:`ServiceLaw`; ``None`` for a law the bounds do not cover. Memoized (pure)."""
    atoms: list[tuple[float, float]] = []
    cont: list[tuple[float, float, Distribution]] = []
    try:
        _decompose(d, 1.0, 0.0, atoms, cont)
    except _Unsupported:
        return None
    if any(x < 0 for x, _ in atoms):
        return None
    return ServiceLaw(_merge(atoms), tuple(cont), float(d.mean))


def _switch_law(base: ServiceLaw, q: float, o: float) -> ServiceLaw:
    """``e + o`` with probability ``1 - q``, else ``e`` (Ibis Eq. 1 as a law)."""
    atoms = [(x, q * p) for x, p in base.atoms] + [(x + o, (1.0 - q) * p) for x, p in base.atoms]
    cont = [(q * w, s, d) for w, s, d in base.cont] + [((1.0 - q) * w, s + o, d) for w, s, d in base.cont]
    return ServiceLaw(_merge([a for a in atoms if a[1] > 0]), tuple(c for c in cont if c[0] > 0),
                      base.mean + (1.0 - q) * o)


def tenant_law(tenant: Tenant, q: float) -> ServiceLaw | None:
    """The law of one request of ``tenant`` whose model ran the previous request with probability ``q``
    (``perf.edgetpu.tenant_service``)."""
    base = service_law(tenant.service)
    if base is None:
        return None
    if tenant.switch_ms == 0.0 or q >= 1.0:
        return base
    return _switch_law(base, q, tenant.switch_ms)


def aggregate_law(laws: Sequence[ServiceLaw], weights: Sequence[float]) -> ServiceLaw:
    """The mixture of ``laws`` with ``weights`` (summing to 1; zero weights dropped)."""
    atoms: list[tuple[float, float]] = []
    cont: list[tuple[float, float, Distribution]] = []
    mean = 0.0
    for law, w in zip(laws, weights):
        if w <= 0:
            continue
        atoms.extend((x, w * p) for x, p in law.atoms)
        cont.extend((w * cw, s, d) for cw, s, d in law.cont)
        mean += w * law.mean
    return ServiceLaw(_merge(atoms), tuple(cont), mean)


# ------------------------------------------------------------------------------- adjustment coefficient


def _f(law: ServiceLaw, lam: float, theta: float) -> tuple[float, float, float, float]:
    """``f(theta) = ln M_S(theta) - ln(1 + theta/lam)`` (convex, ``f(0) = 0``, ``f'(0) = E[S] - 1/lam < 0``;
    its positive root is theta*), ``f'``, ``ln M_S`` and a bound on the rounding error of f."""
    terms = law._log_terms(theta)
    lm = _logsumexp(terms)
    if math.isinf(lm):
        return math.inf, math.inf, lm, 0.0
    top = max(t for t, _ in terms)
    ws = [math.exp(t - top) for t, _ in terms]
    tot = math.fsum(ws)
    dlm = math.fsum(w * d for w, (_, d) in zip(ws, terms)) / tot
    lr = math.log1p(theta / lam)
    f = lm - lr
    err = 64.0 * (len(terms) + 4) * 2.2e-16 * (1.0 + abs(top) + abs(lm) + abs(lr))
    return f, dlm - 1.0 / (lam + theta), lm, err


def adjustment_bracket(lam_per_ms: float, law: ServiceLaw) -> tuple[float, float] | None:
    """``(theta_lo, theta_hi)`` with ``theta_lo <= theta* <= theta_hi`` (1/ms), verified including rounding;
    ``None`` when ``rho`` is not in (0, 1) or the bracket cannot be certified."""
    lam = lam_per_ms
    m1 = law.mean
    if not (lam > 0 and m1 > 0 and lam * m1 < 1.0):
        return None
    m2 = math.fsum(p * x * x for x, p in law.atoms) + math.fsum(
        w * (d.var + (d.mean + s) ** 2) for w, s, d in law.cont)
    rho = lam * m1
    # e^x >= 1 + x + x^2/2 (x >= 0) gives f >= 0 at 2 (1 - rho) / (lam E[S^2]): an upper bracket
    hi = 2.0 * (1.0 - rho) / (lam * m2)
    lo = 0.0
    fh, dh, _, eh = _f(law, lam, hi)
    for _ in range(200):  # beyond the abscissa of a continuous part: bisect back (f < 0 moves lo up)
        if math.isfinite(fh) and fh > eh:
            break
        mid = 0.5 * (lo + hi)
        fm, dm, _, em = _f(law, lam, mid)
        if not math.isfinite(fm) or fm > em:
            hi, fh, dh, eh = mid, fm, dm, em
        else:
            lo = mid
    if not (math.isfinite(fh) and fh > eh):
        return None
    for _ in range(100):  # Newton from the right on a convex function: decreasing iterates, all >= theta*
        if dh <= 0:
            return None
        nxt = hi - fh / dh
        if not nxt < hi or hi - nxt <= 1e-13 * hi:
            break
        fn, dn, _, en = _f(law, lam, nxt)
        if not fn > en:
            break
        hi, fh, dh, eh = nxt, fn, dn, en
    for eps in (1e-9, 1e-7, 1e-5, 1e-3, 1e-2, 1e-1):
        cand = hi * (1.0 - eps)
        fl, _, _, el = _f(law, lam, cand)
        if fl < -el:
            return cand, hi
    return None


# ------------------------------------------------------------------------------------------ quantiles


@dataclass(frozen=True)
class QuantileBounds:
    """``lower <= q-quantile <= upper`` (ms) of a response time."""

    q: float
    lower: float
    upper: float


def _first_crossing(breaks: list[float], piece, alpha: float) -> float:
    """``inf{t >= breaks[0]: g(t) <= alpha}`` for a non-increasing, right-continuous g that on
    ``[b_j, b_{j+1})`` equals ``A + B exp(-theta (t - b_j))``; ``piece(j) -> (A, B, theta)``."""
    for j, b in enumerate(breaks):
        a, bb, theta = piece(j)
        if a + bb <= alpha:
            return b
        if a >= alpha or bb <= 0:
            continue
        t = b + math.log(bb / (alpha - a)) / theta
        nxt = breaks[j + 1] if j + 1 < len(breaks) else math.inf
        if t < nxt:
            return t
    return math.inf  # pragma: no cover - the last piece decays to A < alpha


def _discrete_crossing(atoms: tuple[tuple[float, float], ...], theta: float, alpha: float, const: float,
                       rho: float | None = None) -> float:
    """``inf{t: B(t) <= alpha}`` for ``B(t) = P(S > t) + sum_{x <= t} p g(t - x)`` over the atoms
    ``(x, p)`` of S, with ``g(y) = const exp(-theta y)``, capped at ``rho`` when given: the upper bound U
    (``rho`` given) and the lower bound L (``rho=None``) of the module docstring."""
    # with the cap, const exp(-theta y) <= rho from y = c on; before that g is the constant rho
    c = 0.0 if rho is None else max(0.0, math.log(const / rho) / theta)
    xs = [x for x, _ in atoms]
    breaks = sorted(set(xs + [x + c for x in xs]))

    def piece(j: int) -> tuple[float, float, float]:
        b = breaks[j]
        a = 0.0
        bb = 0.0
        for x, p in atoms:
            if x > b:
                a += p
            elif b < x + c:
                assert rho is not None  # c > 0 only when rho is given (c = 0 makes this branch x > b)
                a += rho * p
            else:
                bb += const * p * math.exp(-theta * (b - x))
        return a, bb, theta

    return _first_crossing(breaks, piece, alpha)


@dataclass(frozen=True)
class _Wait:
    rho: float
    theta_lo: float
    theta_hi: float
    const: float     # P(W > x) >= const exp(-theta_hi x) (Theorem 1(b); 0 when not available)
    uppers: tuple[tuple[float, float], ...] = ()  # (theta, C): P(W > x) <= C exp(-theta x) (Theorem 2)


_SLACK = (0.03, 0.08, 0.15, 0.25, 0.4)   # theta = theta_lo (1 - s) tried for Theorem 2
_CELLS = 256                              # grid cells over the support for the sup in Theorem 2


def _equilibrium_grid(agg: ServiceLaw, theta: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """On a grid over ``[0, max S]`` (discrete aggregate): the grid, ``N(x) = Fbar_e(x) = E[(S - x)^+] /
    E[S]`` and ``G(x) = e^{-theta x} int_(x,inf) e^{theta y} dF_e(y) = E[(e^{theta (S - x)} - 1)^+] /
    (theta E[S])``; both are continuous and non-increasing (``G' = -theta G - f_e``)."""
    x = np.array([a for a, _ in agg.atoms])
    p = np.array([b for _, b in agg.atoms])
    top = float(x.max())
    grid = np.linspace(0.0, top, _CELLS + 1)
    d = x[None, :] - grid[:, None]
    pos = d > 0
    dp = np.where(pos, d, 0.0)
    n_bar = (p * dp).sum(axis=1) / agg.mean
    g = (p * np.expm1(theta * dp)).sum(axis=1) / (theta * agg.mean)
    return grid, n_bar, g, top


def _upper_constant(lam: float, agg: ServiceLaw, theta: float) -> float | None:
    """Theorem 1(a)'s constant at ``theta < theta*`` for a discrete aggregate: an upper estimate of
    ``sup_x N(x) / (G(x) + delta e^{-theta x} / rho)``, ``delta = 1 - rho M_e(theta)``, taking on each grid
    cell ``N`` at its left and the (non-increasing) denominator at its right end; ``None`` unless < 1."""
    lm = agg.log_mgf(theta)
    rho = lam * agg.mean
    delta = 1.0 - lam * math.expm1(lm) / theta  # 1 - rho M_e(theta) > 0 below theta*
    delta -= 1e-12 * (1.0 + abs(lm))
    if not delta > 0:
        return None
    grid, n_bar, g, top = _equilibrium_grid(agg, theta)
    if not top > 0:
        return None
    den = g + np.exp(-theta * grid) * delta / rho
    c = float((n_bar[:-1] / den[1:]).max()) * (1.0 + 1e-9)
    return c if c < 1.0 else None


def _lower_constant(agg: ServiceLaw, theta: float) -> float:
    """Theorem 1(b)'s constant at ``theta >= theta*`` for a discrete aggregate: a lower estimate of
    ``inf_x r(x)``, ``r = N / G`` where ``N > 0``; on each grid cell ``r >= N(right) / G(left)``, and
    ``r(x) = 1 / E[e^{theta V_x}] >= e^{-theta (max S - x)}`` because the residual ``V_x`` of the
    equilibrium law beyond x is at most ``max S - x``."""
    grid, n_bar, g, top = _equilibrium_grid(agg, theta)
    if not top > 0:
        return 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        cell = np.where(g[:-1] > 0, n_bar[1:] / g[:-1], 1.0)
    cell = np.maximum(cell, np.exp(-theta * (top - grid[:-1])))
    return max(0.0, float(cell.min()) * (1.0 - 1e-9))


def _wait(lam: float, agg: ServiceLaw, tight: bool = True) -> _Wait | None:
    """theta* bracket and Theorem 1's constants: (b) for a discrete aggregate, (a) with ``C = 1`` and,
    with ``tight``, the computed constants below theta* (:func:`_tight_uppers`)."""
    br = adjustment_bracket(lam, agg)
    if br is None:
        return None
    lo, hi = br
    lm = agg.log_mgf(hi)
    if not math.isfinite(lm):
        return None
    const = min(lam * agg.mean, _lower_constant(agg, hi)) if agg.discrete else 0.0
    w = _Wait(lam * agg.mean, lo, hi, const, ((lo, 1.0),))
    return _tight_uppers(w, lam, agg) if tight else w


def _tight_uppers(w: _Wait, lam: float, agg: ServiceLaw) -> _Wait:
    """``w`` with Theorem 1(a)'s computed constants at ``theta_lo (1 - s)``, ``s`` in ``_SLACK``, added
    (a discrete aggregate only)."""
    uppers = [(w.theta_lo, 1.0)]
    if agg.discrete:
        for s in _SLACK:
            th = w.theta_lo * (1.0 - s)
            c = _upper_constant(lam, agg, th)
            if c is not None:
                uppers.append((th, c))
    return replace(w, uppers=tuple(uppers))


def _bounds_own(w: _Wait, own: ServiceLaw, qs: Sequence[float]) -> list[QuantileBounds]:
    out = []
    for q in qs:
        alpha = 1.0 - q
        if own.discrete:
            up = min(_discrete_crossing(own.atoms, th, alpha, c, w.rho) for th, c in w.uppers)
            low = _discrete_crossing(own.atoms, w.theta_hi, alpha, w.const * (1.0 - 1e-12))
        else:
            up = (own.log_mgf(w.theta_lo) + math.log(1.0 / alpha)) / w.theta_lo
            c = w.const * (1.0 - 1e-12)
            low = math.log(c / alpha) / w.theta_hi if c > alpha else 0.0
        out.append(QuantileBounds(q, max(0.0, low * (1.0 - _WIDEN)), up * (1.0 + _WIDEN)))
    return out


def response_quantile_bounds(lam_per_ms: float, agg: ServiceLaw, own: ServiceLaw,
                             qs: Sequence[float]) -> list[QuantileBounds] | None:
    """Bounds on the q-quantiles of ``R = W + S_own``, W the M/G/1-FCFS wait for aggregate ``agg`` at
    ``lam_per_ms`` (1/ms). ``None`` when ``rho`` is not in (0, 1) or theta* cannot be bracketed."""
    w = _wait(lam_per_ms, agg)
    if w is None:
        return None
    return _bounds_own(w, own, qs)


def mg1_quantile_bounds(rate_rps: float, service: Distribution, own: Distribution | None = None,
                        qs: Sequence[float] = (0.95, 0.99)) -> list[QuantileBounds] | None:
    """Bounds on the quantiles ``perf.tails.mg1_response_quantiles`` estimates (same arguments)."""
    agg = service_law(service)
    ol = agg if own is None else service_law(own)
    if agg is None or ol is None:
        return None
    return response_quantile_bounds(rate_rps / 1000.0, agg, ol, qs)


def device_laws(tenants: Sequence[Tenant]) -> tuple[float, list[ServiceLaw], ServiceLaw] | None:
    """The device's total rate (1/ms), each tenant's own service law (with its switch mixture) and the
    aggregate law; ``None`` when a service law is not covered."""
    lam = math.fsum(t.rate_rps for t in tenants) / 1000.0
    p = request_shares(tenants)
    q = same_model_probabilities(tenants)
    laws = []
    for t, qi in zip(tenants, q):
        law = tenant_law(t, qi)
        if law is None:
            return None
        laws.append(law)
    total = math.fsum(pi for pi in p if pi > 0)
    return lam, laws, aggregate_law(laws, [pi / total for pi in p])


def edgetpu_quantile_bounds(tenants: Sequence[Tenant], qs: Sequence[float] = (0.95, 0.99),
                            which: Sequence[int] | None = None) -> list[list[QuantileBounds] | None] | None:
    """Bounds on the per-tenant quantiles of ``perf.tails.edgetpu_response_quantiles`` (device part, no
    network), for the tenants at indices ``which`` (default all; the others get ``None``). ``None`` when
    the bounds do not apply (a service law not covered, ``rho`` not in (0, 1))."""
    if not tenants:
        return []
    setup = device_laws(tenants)
    if setup is None:
        return None
    lam, laws, agg = setup
    w = _wait(lam, agg)
    if w is None:
        return None
    idx = range(len(tenants)) if which is None else which
    out: list[list[QuantileBounds] | None] = [None] * len(tenants)
    for i in idx:
        out[i] = _bounds_own(w, laws[i], qs)
    return out


# ------------------------------------------------------------------------------ deciding with a margin

DFT_REL_TOL = 0.01        # relative allowance for the DFT estimate's error against the true quantile
DFT_CELLS_TOL = 4.0       # ... plus this many grid cells (the grid step is at most E[S] / 64)
_MAX_CELLS = float(1 << 20)  # a quarter of the DFT grid cap (perf.tails._MAX_N)


class DecisionBounds:
    """Quantile bounds of the tenants of one Edge TPU, computed on demand from cheap to tight, and the
    absolute part of the allowance for the DFT estimate's error (:func:`edgetpu_decision_bounds`)."""

    def __init__(self, lam: float, wait: _Wait, agg: ServiceLaw, laws: Sequence[ServiceLaw],
                 which: Sequence[int], qs: Sequence[float], tol_abs_ms: float) -> None:
        self.tol_abs_ms = tol_abs_ms
        self._lam = lam
        self._wait = wait
        self._tight: _Wait | None = None
        self._agg = agg
        self._laws = list(laws)
        self._which = list(which)
        self._qs = tuple(qs)
        self._memo: dict[tuple[int, float, bool], QuantileBounds] = {}

    def tolerance_ms(self, value_ms: float) -> float:
        """Allowance for the DFT estimate near ``value_ms``: ``DFT_REL_TOL |value| + tol_abs_ms``."""
        return DFT_REL_TOL * abs(value_ms) + self.tol_abs_ms

    def _w(self, tight: bool) -> _Wait:
        if not tight:
            return self._wait
        if self._tight is None:
            self._tight = _tight_uppers(self._wait, self._lam, self._agg)
        return self._tight

    def bound(self, i: int, q: float, tight: bool = True) -> QuantileBounds:
        """Bounds on tenant i's q-quantile; ``tight=False``: Kingman's ``C = 1`` upper bound only (no
        computed constant of Theorem 1(a), cheaper)."""
        key = (i, q, tight)
        if key not in self._memo:
            self._memo[key] = _bounds_own(self._w(tight), self._laws[i], (q,))[0]
        return self._memo[key]

    @property
    def bounds(self) -> list[list[QuantileBounds] | None]:
        """Tight bounds per tenant (tenants' order; ``None`` for those not asked for), one per ``qs``."""
        out: list[list[QuantileBounds] | None] = [None] * len(self._laws)
        for i in self._which:
            out[i] = [self.bound(i, q) for q in self._qs]
        return out

    def refined_upper(self, i: int, q: float) -> float:
        """A tighter upper bound on tenant i's q-quantile: Theorem 1(a)'s bound passed once more through
        the renewal operator (:func:`_refined_upper`); the tight bound when that does not apply."""
        plain = self.bound(i, q)
        if not self._agg.discrete or not self._laws[i].discrete:
            return plain.upper
        return min(plain.upper, _refined_upper(self._w(True), self._agg, self._laws[i], q, plain))


def edgetpu_decision_bounds(tenants: Sequence[Tenant], qs: Sequence[float] = (0.95, 0.99),
                            which: Sequence[int] | None = None) -> DecisionBounds | None:
    """:func:`edgetpu_quantile_bounds` with the allowance a caller needs to decide ``estimate <= SLO`` as
    the DFT estimate of ``perf.tails.edgetpu_response_quantiles`` would: accept when ``upper + tol <=
    SLO``, reject when ``lower - tol > SLO``, ``tol = tolerance_ms(bound)``; ``None`` when the bounds do
    not apply or the DFT grid may hit its size cap (then its step is not bounded as assumed).

    The allowance is ``DFT_REL_TOL`` of the value plus ``DFT_CELLS_TOL`` grid cells. The DFT grid step is
    at most ``scale / 64 * n / (n - 1)`` with ``scale`` the smallest mean service time it sees (the
    aggregate's and every tenant's own, ``perf.tails._plan``), unless the grid size hit its cap 2^22. The grid
    span is ``1.1 ln(1e11) / theta_lattice`` plus service supports; ``theta_lattice`` (from a
    mean-preserving lattice, whose MGF is larger by Jensen) is close below theta*, and the span is
    estimated here with ``theta_lo / 4`` and 8 x the largest service time; above ``2^20`` cells of the
    smallest execution mean the bounds are not used."""
    if not tenants:
        return None
    setup = device_laws(tenants)
    if setup is None:
        return None
    lam, laws, agg = setup
    w = _wait(lam, agg, tight=False)
    if w is None:
        return None
    # each tenant's own execution mean (ms), what service_law(t.service).mean holds (covered: device_laws)
    smallest = min((m for m in (float(t.service.mean) for t in tenants) if m > 0), default=0.0)
    top = max((x for x, _ in agg.atoms), default=0.0)
    for cw, s, d in agg.cont:
        top = max(top, s + d.mean + 40.0 * math.sqrt(d.var))
    span = 1.1 * math.log(1e11) / (w.theta_lo / 4.0) + 8.0 * top
    if not (smallest > 0 and span / (smallest / 64.0) <= _MAX_CELLS):
        return None
    idx = range(len(tenants)) if which is None else which
    scale = min([agg.mean] + [law.mean for law in laws if law.mean > 0])
    return DecisionBounds(lam, w, agg, laws, idx, qs, DFT_CELLS_TOL * scale / 64.0 * (1.0 + 1e-4))


_REFINE_POINTS = 257


def _refined_upper(w: _Wait, agg: ServiceLaw, own: ServiceLaw, q: float, plain: QuantileBounds) -> float:
    """Corollary with ``T Z_a`` in place of ``Z_a``: if ``Z <= Z_a`` then ``Z = T Z <= T Z_a`` (T monotone),
    and for ``Z_a(x) = C e^{-theta x}`` (``C <= 1``) in closed form

        (T Z_a)(x) = rho N(x) + C rho (M_e(theta) e^{-theta x} - G(x)),

    non-increasing (T maps tail functions to tail functions). With ``min(rho, T Z_a)`` in U, U is
    evaluated on a grid of 257 points of ``[lower, plain upper]`` (the answer lies there: ``T Z_a <=
    Z_a``) for every ``(theta, C)`` of Theorem 1(a); the first grid point where ``U <= 1 - q`` (with a
    1e-9 relative margin) is an upper bound on the quantile."""
    alpha = (1.0 - q) * (1.0 - 1e-9)
    lo, hi = plain.lower, plain.upper
    if not (math.isfinite(hi) and hi > lo):
        return hi
    ax = np.array([a for a, _ in agg.atoms])
    ap = np.array([b for _, b in agg.atoms])
    ox = np.array([a for a, _ in own.atoms])
    op = np.array([b for _, b in own.atoms])
    ts = np.linspace(lo, hi, _REFINE_POINTS)
    x = ts[:, None] - ox[None, :]                       # t - s_k
    inside = x >= 0
    xs = np.where(inside, x, 0.0)
    d = ax[None, None, :] - xs[:, :, None]              # S - x
    dp = np.where(d > 0, d, 0.0)
    n_bar = (ap * dp).sum(axis=2) / agg.mean
    tail_own = (op * ~inside).sum(axis=1)               # P(S_i > t)
    best = hi
    for theta, c in w.uppers:
        me = math.expm1(agg.log_mgf(theta)) / (theta * agg.mean)
        g = (ap * np.expm1(theta * dp)).sum(axis=2) / (theta * agg.mean)
        z1 = w.rho * n_bar + c * w.rho * (me * np.exp(-theta * xs) - g)
        z1 = np.minimum(w.rho, z1 * (1.0 + 1e-9))
        u = tail_own + (op * np.where(inside, z1, 0.0)).sum(axis=1)
        ok = np.flatnonzero(u <= alpha)
        if ok.size:
            best = min(best, float(ts[ok[0]]))
    return best
