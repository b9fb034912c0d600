"""Simulation statistics: Student-t confidence intervals across independent replications, and the
per-replication measurements (latency percentiles, throughput, busy fraction) they are built from.

Units: latencies in ms, throughput in req/s, utilization as a fraction in [0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as _st

__all__ = [
    "CI", "TenantSimStats", "DeviceSimResult", "confidence_interval", "busy_fraction", "time_average_in_system",
    "percentiles_inplace",
]


@dataclass(frozen=True)
class CI:
    """Mean over replications (``value``) and its two-sided Student-t confidence interval ``[lo, hi]``.

    With a single replication there is no spread to estimate: ``lo``/``hi`` are -inf/+inf. A statistic
    missing in some replication (e.g. a tenant with no measured request) makes all three NaN.
    """

    value: float
    lo: float
    hi: float

    @property
    def half_width(self) -> float:
        """Half the interval's width (same unit as ``value``)."""
        return (self.hi - self.lo) / 2.0

    @property
    def rel_half_width(self) -> float:
        """Half width relative to ``|value|`` (inf when the value is 0)."""
        return self.half_width / abs(self.value) if self.value != 0 else math.inf

    def contains(self, x: float) -> bool:
        """Whether ``x`` lies in ``[lo, hi]``."""
        return self.lo <= x <= self.hi

    def __str__(self) -> str:
        return f"{self.value:.6g} ± {self.half_width:.3g}"


def confidence_interval(samples: Sequence[float] | np.ndarray, confidence: float = 0.95) -> CI:
    """Mean of per-replication ``samples`` and its Student-t interval at ``confidence`` (e.g. 0.95)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    x = np.asarray(samples, dtype=float)
    if x.size == 0:
        raise ValueError("a confidence interval needs at least one replication")
    if np.isnan(x).any():
        return CI(math.nan, math.nan, math.nan)
    mean = float(x.mean())
    if x.size == 1:
        return CI(mean, -math.inf, math.inf)
    half = float(_st.t.ppf(0.5 + confidence / 2.0, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return CI(mean, mean - half, mean + half)


@dataclass(frozen=True)
class TenantSimStats:
    """One tenant's simulated end-to-end latency (ms) and throughput (req/s), each a CI over replications.

    ``completed`` is the number of measured (post-warm-up) requests summed over replications.
    """

    name: str
    completed: int
    mean_ms: CI
    p50_ms: CI
    p95_ms: CI
    p99_ms: CI
    throughput_rps: CI


@dataclass(frozen=True)
class DeviceSimResult:
    """What ``simulate_device`` measured.

    ``utilization`` is the device's busy fraction (time with at least one request in service, switch
    overhead included) in the measurement window. ``engine`` is ``"lindley"`` or ``"event"``;
    ``events`` counts state-changing events over all replications: arrivals plus departures (plus CPU-stage
    completions and batching timers for the event engine; implicit, 2 per request, on the Lindley path).
    """

    tenants: dict[str, TenantSimStats]
    utilization: CI
    replications: int
    engine: str
    events: int


def busy_fraction(busy_start: np.ndarray, busy_end: np.ndarray, t0: float, t1: float) -> float:
    """Fraction of ``[t0, t1]`` (ms) covered by the disjoint busy intervals ``[start_k, end_k]``."""
    if not t1 > t0:
        return math.nan
    s = np.clip(np.asarray(busy_start, dtype=float), t0, t1)
    e = np.clip(np.asarray(busy_end, dtype=float), t0, t1)
    return float(np.sum(e - s) / (t1 - t0))


def time_average_in_system(arrival_ms: np.ndarray, departure_ms: np.ndarray, t0: float, t1: float) -> float:
    """Time-average number of requests present in ``[t0, t1]`` (ms), each present from arrival to departure.

    The same sum of clipped intervals as ``busy_fraction``; here the intervals may overlap, so it can exceed 1.
    """
    return busy_fraction(arrival_ms, departure_ms, t0, t1)


def percentiles_inplace(values: np.ndarray, q: Sequence[float]) -> list[float]:
    """``np.percentile(values, q)`` (its default "linear" method), bit for bit, several times faster on the
    long latency arrays of a replication (``benchmarks/bench_lindley.py`` prints both); ``values`` (1-D
    float64) is reordered in place.

    Why: numpy partitions at all the order statistics it needs in one call, and its partition with several
    ``kth`` costs several times one with a single ``kth``. Here each needed order statistic is
    selected by a single-``kth`` partition of the part above the previous one (which shrinks), and the
    interpolation is numpy's: virtual index ``(n - 1) q/100``, weight ``gamma`` its fraction, ``a + (b - a)
    gamma`` below 0.5 and ``b - (b - a)(1 - gamma)`` from 0.5 (``numpy.lib._function_base_impl._lerp``).
    tests/test_sim_stats.py checks equality with ``np.percentile`` over many sizes, ties and quantiles. An
    array holding NaN goes to ``np.percentile`` itself; an empty one raises ``ValueError``."""
    x = values
    n = x.size
    if x.ndim != 1 or x.dtype != np.float64:
        raise ValueError("percentiles_inplace takes a 1-D float64 array")
    if n == 0:
        raise ValueError("percentiles of no values")
    if np.isnan(x).any():
        return [float(v) for v in np.percentile(x, q)]
    qs = np.true_divide(np.asarray(q, dtype=float), 100)
    if np.any((qs < 0) | (qs > 1)):
        raise ValueError(f"percentiles must be in [0, 100], got {list(q)}")
    virtual = (n - 1) * qs
    prev = np.floor(virtual).astype(np.int64)
    nxt = prev + 1
    top = virtual >= n - 1  # numpy takes the last value for both ends there
    prev[top] = n - 1
    nxt[top] = n - 1
    gamma = virtual - np.floor(virtual)
    lo = 0  # x[:lo] is in place already: every order statistic below lo has been selected
    for k in sorted(set(prev.tolist()) | set(nxt.tolist())):
        x[lo:].partition(k - lo)
        lo = k + 1
    out = []
    for i in range(qs.size):
        a, b, t = float(x[prev[i]]), float(x[nxt[i]]), float(gamma[i])
        diff = b - a
        out.append(b - diff * (1 - t) if t >= 0.5 else a + diff * t)
    return out
