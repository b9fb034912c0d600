"""Textbook queueing formulas the device estimators are built from.

Pure functions: no I/O, no clocks, no randomness. Units: rates in req/s (converted to req/ms inside with
``lam = rate_rps / 1000``), times in ms, second moments in ms^2. Every function returns
:class:`~edgemux.perf.result.Unstable` instead of a number when the offered load is >= 1 (never a negative
or infinite latency). ``where`` only labels that ``Unstable``.

Contents
--------
- M/G/1-FCFS: Pollaczek-Khinchine mean waiting time (Ibis Eq. 3) and response time (Eq. 5); M/D/1 (Eq. 4);
  M/M/1.
- M/G/1-PS: aggregate ``E[S]/(1-rho)`` and the exact per-class ``S_i/(1-rho)`` (insensitive).
- M/G/c limited processor sharing (n requests each progress at rate ``min(1, c/n)``, c may be fractional):
  the exact mean from the birth-death chain of the number in system, aggregate and per class.
- Ibis Eq. 10/11 ``E[R] = c/(c mu - lam)`` as the paper states it, and how far it lands from the exact
  limited-PS mean.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence

from edgemux.perf.result import Latency, Unstable

__all__ = [
    "per_ms",
    "utilization",
    "mg1_waiting",
    "mg1_response",
    "ibis_pk_waiting",
    "md1_waiting",
    "md1_response",
    "mm1_response",
    "mg1_ps_response",
    "ps_class_responses",
    "limited_ps_number",
    "limited_ps_response",
    "limited_ps_class_responses",
    "erlang_c",
    "ibis_mgc_ps_response",
    "ibis_mgc_ps_ratio",
]


def per_ms(rate_rps: float) -> float:
    """A rate in req/s as req/ms (``rate_rps / 1000``)."""
    return rate_rps / 1000.0


def _check(rate_rps: float, mean_ms: float) -> None:
    if not (rate_rps >= 0 and math.isfinite(rate_rps)):
        raise ValueError(f"arrival rate must be a finite number >= 0 req/s, got {rate_rps}")
    if not (mean_ms >= 0 and math.isfinite(mean_ms)):
        raise ValueError(f"mean service time must be a finite number >= 0 ms, got {mean_ms}")


def utilization(rate_rps: float, mean_ms: float, servers: float = 1.0) -> float:
    """Offered load ``rho = lam * E[S] / c`` (dimensionless; Ibis Table 1: ``rho = lam / (c mu)``).

    ``rate_rps`` in req/s, ``mean_ms`` in ms, ``servers`` = c (> 0, may be fractional).
    """
    _check(rate_rps, mean_ms)
    if not servers > 0:
        raise ValueError(f"servers must be > 0, got {servers}")
    return per_ms(rate_rps) * mean_ms / servers


def mg1_waiting(rate_rps: float, mean_ms: float, second_moment_ms2: float, *, where: str = "device") -> Latency:
    """Mean waiting time in queue (ms) of M/G/1-FCFS: Pollaczek-Khinchine, ``lam E[S^2] / (2 (1 - rho))``.

    Ibis Eq. 3 (the paper's form ``(rho + lam mu Var[S]) / (2 (mu - lam))`` is the same number; see
    :func:`ibis_pk_waiting`). ``rate_rps`` in req/s, ``mean_ms`` = E[S] in ms, ``second_moment_ms2`` =
    E[S^2] in ms^2. ``Unstable`` when ``rho >= 1``.
    """
    _check(rate_rps, mean_ms)
    if second_moment_ms2 < mean_ms * mean_ms * (1 - 1e-12):
        raise ValueError(f"E[S^2]={second_moment_ms2} ms^2 is below E[S]^2={mean_ms * mean_ms} ms^2")
    lam = per_ms(rate_rps)
    rho = lam * mean_ms
    if rho >= 1.0:
        return Unstable(rho, where)
    return lam * second_moment_ms2 / (2.0 * (1.0 - rho))


def mg1_response(rate_rps: float, mean_ms: float, second_moment_ms2: float, *, where: str = "device") -> Latency:
    """Mean response time (ms) of M/G/1-FCFS: P-K waiting (Ibis Eq. 3) plus ``E[S]`` (Eq. 5)."""
    w = mg1_waiting(rate_rps, mean_ms, second_moment_ms2, where=where)
    return w if isinstance(w, Unstable) else w + mean_ms


def ibis_pk_waiting(rate_rps: float, mean_ms: float, var_ms2: float, *, where: str = "device") -> Latency:
    """Ibis Eq. 3 verbatim: ``E[w] = (rho + lam mu Var[S]) / (2 (mu - lam))`` with ``mu = 1/E[S]`` (ms).

    Algebraically identical to :func:`mg1_waiting` with ``E[S^2] = Var[S] + E[S]^2``; kept to show it.
    What matters is which ``Var[S]`` is passed: the Edge TPU estimator passes the true variance of the
    service-time mixture, not the variance of the tenants' mean service times.
    """
    _check(rate_rps, mean_ms)
    lam = per_ms(rate_rps)
    rho = lam * mean_ms
    if rho >= 1.0:
        return Unstable(rho, where)
    if mean_ms == 0.0:
        return 0.0
    mu = 1.0 / mean_ms
    return (rho + lam * mu * var_ms2) / (2.0 * (mu - lam))


def md1_waiting(rate_rps: float, service_ms: float, *, where: str = "device") -> Latency:
    """Mean waiting time (ms) of M/D/1-FCFS: ``rho/(1-rho) * S/2`` (Ibis Eq. 4, ``1/(2 mu)`` = S/2)."""
    _check(rate_rps, service_ms)
    rho = per_ms(rate_rps) * service_ms
    if rho >= 1.0:
        return Unstable(rho, where)
    return rho / (1.0 - rho) * service_ms / 2.0


def md1_response(rate_rps: float, service_ms: float, *, where: str = "device") -> Latency:
    """Mean response time (ms) of M/D/1-FCFS: Ibis Eq. 4 plus the service time ``S`` (Eq. 5)."""
    w = md1_waiting(rate_rps, service_ms, where=where)
    return w if isinstance(w, Unstable) else w + service_ms


def mm1_response(rate_rps: float, mean_ms: float, *, where: str = "device") -> Latency:
    """Mean response time (ms) of M/M/1 (any work-conserving order, so also M/G/1-PS): ``1/(mu - lam)``.

    Ibis Eq. 6 in ms: ``E[S] / (1 - rho)``.
    """
    _check(rate_rps, mean_ms)
    rho = per_ms(rate_rps) * mean_ms
    if rho >= 1.0:
        return Unstable(rho, where)
    return mean_ms / (1.0 - rho)


def mg1_ps_response(rate_rps: float, mean_ms: float, *, where: str = "device") -> Latency:
    """Mean response time (ms) of M/G/1 egalitarian processor sharing: ``E[S]/(1-rho)`` (Ibis Eq. 6).

    Exact and insensitive to the service-time distribution beyond its mean.
    """
    return mm1_response(rate_rps, mean_ms, where=where)


def _aggregate(rates_rps: Sequence[float], means_ms: Sequence[float]) -> tuple[float, float]:
    if len(rates_rps) != len(means_ms):
        raise ValueError("need one mean service time per arrival rate")
    for r, m in zip(rates_rps, means_ms):
        _check(r, m)
    lam = math.fsum(rates_rps)
    work = math.fsum(per_ms(r) * m for r, m in zip(rates_rps, means_ms))  # rho at one server
    return lam, work


def ps_class_responses(rates_rps: Sequence[float], means_ms: Sequence[float], *,
                       where: str = "device") -> list[Latency]:
    """Per-class mean response times (ms) of multi-class M/G/1-PS: ``E[R_i] = S_i / (1 - rho)``.

    ``rho = sum_i lam_i S_i``. Exact for egalitarian PS with Poisson arrivals, whatever the service-time
    distributions (insensitivity; each class's slowdown ``E[R_i]/S_i`` is the same ``1/(1-rho)``). This is
    the textbook form; Ibis Eq. 8 instead adds the aggregate wait to ``S_i`` (see ``perf.gpu``).
    """
    _, rho = _aggregate(rates_rps, means_ms)
    if rho >= 1.0:
        return [Unstable(rho, where) for _ in means_ms]
    return [m / (1.0 - rho) for m in means_ms]


def _limited_ps_series(a: float, c: float) -> tuple[list[float], float, float]:
    """The stationary law of the birth-death chain with birth ``lam`` and death ``mu*min(n, c)`` at offered
    load ``a = lam/mu`` (servers' worth of work, ``0 < a < c``): the terms ``pi_n / K`` for n = 0..m-1
    (m = ceil(c), or fewer where they are negligible), the normalizer ``K`` and ``E[N] K``."""
    rho = a / c
    m = math.ceil(c)  # for n >= m the death rate is c*mu; for 1 <= n < m (< c) it is n*mu
    # Terms n = 0..m-1 are a^n/n! (relative to pi_0). Far past the mode they are negligible, so stop at
    # n_max (the geometric tail, proportional to the last term, is then negligible too).
    n_max = m - 1
    cutoff = int(a + 40.0 * math.sqrt(a) + 60.0)
    truncated = n_max > cutoff
    if truncated:
        n_max = cutoff
    log_a = math.log(a)
    logs = [n * log_a - math.lgamma(n + 1) for n in range(n_max + 1)]
    top = max(logs)
    t = [math.exp(x - top) for x in logs]
    s0 = math.fsum(t)
    s1 = math.fsum(n * tn for n, tn in enumerate(t))
    if not truncated:
        last = t[-1]  # relative pi_{m-1}; pi_n = pi_{m-1} rho^(n-m+1) for n >= m
        g = rho / (1.0 - rho)
        s0 += last * g
        s1 += last * ((m - 1) * g + rho / (1.0 - rho) ** 2)
    return t, s0, s1


def _limited_ps_number(a: float, c: float) -> float:
    """E[N] of the birth-death chain of :func:`_limited_ps_series`; requires ``a < c``."""
    if a == 0.0:
        return 0.0
    _, s0, s1 = _limited_ps_series(a, c)
    return s1 / s0


def limited_ps_at_most(rate_rps: float, mean_ms: float, servers: float, j: int) -> float:
    """``P(N <= j)`` in M/G/c limited PS (:func:`limited_ps_number`'s model) for ``0 <= j < ceil(c)``,
    the states in which every request runs at full speed (dimensionless); requires a stable queue."""
    a = per_ms(rate_rps) * mean_ms
    if a == 0.0:
        return 1.0
    t, s0, _ = _limited_ps_series(a, servers)
    return min(1.0, math.fsum(t[: j + 1]) / s0)


def limited_ps_number(rate_rps: float, mean_ms: float, servers: float, *, where: str = "device") -> float | Unstable:
    """Exact mean number in system E[N] of M/G/c limited processor sharing (dimensionless).

    With n requests present each progresses at rate ``min(1, c/n)``, ``c`` = ``servers`` > 0 possibly
    fractional (``c < 1``: a lone request runs at rate c). The queue is symmetric (Kelly), hence insensitive:
    N is the birth-death chain with birth ``lam`` and death ``mu * min(n, c)``, ``mu = 1/E[S]``. Its
    stationary law is ``pi_n ∝ a^n / n!`` for ``n < ceil(c)`` and geometric with ratio ``rho = a/c`` beyond,
    ``a = lam E[S]``; the geometric tail is summed in closed form. Model of Ibis Eq. 10 (MPS) and Eq. 11
    (CPU stage). ``Unstable`` when ``rho >= 1``.
    """
    _check(rate_rps, mean_ms)
    if not (servers > 0 and math.isfinite(servers)):
        raise ValueError(f"servers must be a finite number > 0, got {servers}")
    a = per_ms(rate_rps) * mean_ms
    rho = a / servers
    if rho >= 1.0:
        return Unstable(rho, where)
    return _limited_ps_number(a, servers)


def limited_ps_response(rate_rps: float, mean_ms: float, servers: float, *, where: str = "device") -> Latency:
    """Exact mean response time (ms) of M/G/c limited PS: ``E[N]/lam`` by Little's law.

    See :func:`limited_ps_number` for the model. At ``lam = 0`` it is the time alone:
    ``E[S] / min(1, c)``. ``c = 1`` gives M/G/1-PS ``E[S]/(1-rho)``; ``c -> inf`` gives ``E[S]``; integer c
    gives the M/M/c mean ``E[S] + C(c, a) E[S] / (c (1 - rho))`` (Erlang C). Implements the model of Ibis
    Eq. 10/11 exactly (the paper's closed form is :func:`ibis_mgc_ps_response`).
    """
    n = limited_ps_number(rate_rps, mean_ms, servers, where=where)
    if isinstance(n, Unstable):
        return n
    lam = per_ms(rate_rps)
    # Below the smallest normal float, n and lam are subnormal and n/lam loses its precision (even to 0):
    # the load is nil there, and a request runs alone.
    if lam < sys.float_info.min or n < sys.float_info.min:
        return mean_ms / min(1.0, servers)
    return n / lam


def limited_ps_class_responses(rates_rps: Sequence[float], means_ms: Sequence[float], servers: float, *,
                               where: str = "device") -> list[Latency]:
    """Per-class exact mean response times (ms) of multi-class M/G/c limited PS: ``S_i E[R] / E[S]``.

    In a symmetric queue the classes of the requests present are, given their number, independent draws with
    probabilities ``lam_i S_i / sum_j lam_j S_j``, so ``E[N_i] = E[N] lam_i S_i / (lam E[S])`` and by
    Little ``E[R_i] = S_i E[R] / E[S]``, where ``E[R]`` is the aggregate mean with ``lam = sum lam_i`` and
    ``E[S] = sum lam_i S_i / lam``. Ibis Eq. 10/11 model, exact form.
    """
    lam_rps, _ = _aggregate(rates_rps, means_ms)
    if lam_rps == 0.0:
        mean = math.fsum(means_ms) / len(means_ms) if means_ms else 0.0
    else:
        mean = math.fsum(r * m for r, m in zip(rates_rps, means_ms)) / lam_rps
    r = limited_ps_response(lam_rps, mean, servers, where=where)
    if isinstance(r, Unstable):
        return [r for _ in means_ms]
    if mean == 0.0:
        return [0.0 for _ in means_ms]
    return [m * r / mean for m in means_ms]


def erlang_c(servers: int, offered: float) -> float:
    """Erlang C: probability that an arrival waits in M/M/c with ``servers`` = c (integer) and offered load
    ``a = lam E[S]`` (< c). Used to compare Ibis Eq. 10/11 with the exact mean for integer c."""
    if servers < 1 or offered < 0 or offered >= servers:
        raise ValueError(f"need integer c >= 1 and 0 <= a < c, got c={servers}, a={offered}")
    # Erlang B by its stable recursion, then C = B / (1 - rho (1 - B))
    b = 1.0
    for k in range(1, servers + 1):
        b = offered * b / (k + offered * b)
    rho = offered / servers
    return b / (1.0 - rho * (1.0 - b))


def ibis_mgc_ps_response(rate_rps: float, mean_ms: float, servers: float, *, where: str = "device") -> Latency:
    """Ibis Eq. 10 (MPS) and Eq. 11 (CPU stage) as the paper states them: ``E[R] = c / (c mu - lam)`` (ms).

    Equivalently ``E[S] / (1 - rho)`` with ``rho = lam E[S] / c``: M/G/1-PS at utilization ``rho``. It equals
    the exact limited-PS mean (:func:`limited_ps_response`) only for ``c = 1``. For ``c > 1`` it
    overestimates; for ``1 < c <= 2`` the ratio is exactly ``1 + rho (c - 1)`` (e.g. c = 2, rho = 0.5:
    20 ms instead of 13.33 ms for E[S] = 10 ms, +50 %), and for integer c it is
    ``rho c / C(c, rho c)`` on the waiting part. For ``c < 1`` (a fractional CPU share) it *under*estimates
    by the factor c: a lone request needs ``E[S]/c``, not ``E[S]``.
    """
    _check(rate_rps, mean_ms)
    if not (servers > 0 and math.isfinite(servers)):
        raise ValueError(f"servers must be a finite number > 0, got {servers}")
    rho = per_ms(rate_rps) * mean_ms / servers
    if rho >= 1.0:
        return Unstable(rho, where)
    return mean_ms / (1.0 - rho)


def ibis_mgc_ps_ratio(rate_rps: float, mean_ms: float, servers: float, *, where: str = "device") -> float | Unstable:
    """How much Ibis Eq. 10/11 misses the exact limited-PS mean: ``Eq10 / exact`` (dimensionless, 1 = exact).

    ``> 1`` for ``c > 1`` (overestimate), ``< 1`` for ``c < 1``, ``1`` for ``c = 1``.
    """
    paper = ibis_mgc_ps_response(rate_rps, mean_ms, servers, where=where)
    exact = limited_ps_response(rate_rps, mean_ms, servers, where=where)
    if isinstance(paper, Unstable):
        return paper
    if isinstance(exact, Unstable):
        return exact
    if exact == 0.0:
        return 1.0
    return paper / exact
