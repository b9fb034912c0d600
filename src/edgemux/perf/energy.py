"""FPGA-GPU performance and energy model (Kim et al., paper 004, §3.1, Eq. 1-4 and 7).

Per accelerator i with C concurrent workers, worker j running batches of ``bs_j``:

- Eq. 1: computation time of one batch ``T_j = (alpha * bs_j + beta) * Q(C)`` (ms here), Q the slowdown
  from concurrency (``Q(1) = 1``);
- Eq. 2: throughput ``H = sum_j bs_j / T_j`` (requests per unit time; req/s here, so ``1000 bs / T``);
- Eq. 3: energy per request ``E = P / H`` (J/request with P in W and H in req/s).

The paper expands Eq. 3 as ``sum_j (T_j / bs_j) * P``; that equals ``P / H`` only for one worker (for C
identical workers it is C^2 times larger), so edgemux implements the definition ``P / H``
(:func:`energy_per_request_j`) and offers the expansion separately (:func:`paper_eq3_expansion_j`).

Units: ms, req/s, W, J. Pure functions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = [
    "computation_time_ms",
    "throughput_rps",
    "energy_per_request_j",
    "paper_eq3_expansion_j",
    "efficiency",
    "expected_computing_time_s",
    "utilization_power_w",
]


def computation_time_ms(alpha_ms: float, beta_ms: float, batch: float, slowdown: float = 1.0) -> float:
    """Eq. 1: ``T = (alpha * bs + beta) * Q(C)`` (ms) for one batch of ``batch`` requests on one worker;
    ``alpha_ms`` per request, ``beta_ms`` per batch, ``slowdown`` = Q(C) >= 1 (1 for a lone worker)."""
    if batch < 1:
        raise ValueError(f"batch size must be >= 1, got {batch}")
    if alpha_ms < 0 or beta_ms < 0 or alpha_ms + beta_ms <= 0:
        raise ValueError(f"need alpha, beta >= 0 ms and alpha + beta > 0, got {alpha_ms}, {beta_ms}")
    if not slowdown > 0:
        raise ValueError(f"slowdown Q(C) must be > 0, got {slowdown}")
    return (alpha_ms * batch + beta_ms) * slowdown


def throughput_rps(alpha_ms: float, beta_ms: float, batches: Sequence[float], slowdown: float = 1.0) -> float:
    """Eq. 2: ``H = sum_j bs_j / T_j`` in req/s for the accelerator's workers (one batch size per worker,
    ``len(batches)`` = C, all with the same ``slowdown`` = Q(C))."""
    if not batches:
        return 0.0
    return math.fsum(1000.0 * b / computation_time_ms(alpha_ms, beta_ms, b, slowdown) for b in batches)


def energy_per_request_j(power_w: float, throughput: float) -> float:
    """Eq. 3 (definition): ``E = P / H`` (J/request) with the active power P (W) and throughput H (req/s).
    ``math.inf`` for a zero throughput."""
    if power_w < 0:
        raise ValueError(f"power must be >= 0 W, got {power_w}")
    if throughput <= 0:
        return math.inf
    return power_w / throughput


def paper_eq3_expansion_j(alpha_ms: float, beta_ms: float, batches: Sequence[float], power_w: float,
                          slowdown: float = 1.0) -> float:
    """Eq. 3's printed right-hand side ``sum_j (T_j / bs_j) * P`` (J/request, T in s). Equal to
    :func:`energy_per_request_j` only for one worker; kept to show the difference."""
    return math.fsum(computation_time_ms(alpha_ms, beta_ms, b, slowdown) / 1000.0 / b for b in batches) * power_w


def efficiency(throughput: float, energy_j: float) -> float:
    """Eq. 4's per-accelerator term ``H / E`` (req/s per J/request): what the scheduler ranks accelerators
    by when it activates (highest first) or deactivates (lowest first) them."""
    if energy_j <= 0:
        raise ValueError(f"energy per request must be > 0 J, got {energy_j}")
    return throughput / energy_j


def expected_computing_time_s(requests: float, throughputs_rps: Sequence[float]) -> float:
    """Eq. 7: ``T_avg = |D| / sum_i H_i`` (s) to process ``requests`` on accelerators with the given
    throughputs (req/s). ``math.inf`` when nothing is active."""
    total = math.fsum(throughputs_rps)
    if total <= 0:
        return math.inf if requests > 0 else 0.0
    return requests / total


def utilization_power_w(idle_w: float, max_w: float, utilization: float) -> float:
    """Active power (W) at ``utilization`` in [0, 1] of an accelerator's peak throughput, linear between its idle
    and full-load power: ``P = idle + (max - idle) * u`` (the linear server power model of Fan, Weber and
    Barroso, "Power provisioning for a warehouse-sized computer", ISCA 2007). Kim et al.'s P(C) (Eq. 3) is read
    through it: C workers at the best batch reach utilization H(C) / max_C H(C)."""
    if idle_w < 0 or max_w < idle_w:
        raise ValueError(f"need 0 <= idle <= max power, got idle {idle_w} W and max {max_w} W")
    if not 0.0 <= utilization <= 1.0 + 1e-12:
        raise ValueError(f"utilization must be in [0, 1], got {utilization}")
    return idle_w + (max_w - idle_w) * min(utilization, 1.0)
