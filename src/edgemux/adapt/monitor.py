"""What one monitoring window observed: per app its arrivals, answers, refusals and latency statistics, and
per (model, device) the service-time moments the devices measured.

A window is built from the raw observations of one period (``AppWindow.of``): the caller (the control plane
from agents' metrics, the simulator from its departures) passes counts and latency samples. Times: ``*_s``
seconds (the window's bounds, in whatever clock the caller keeps), ``*_ms`` milliseconds, rates req/s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["AppWindow", "LatencySummary", "ServiceMoments"]


@dataclass(frozen=True)
class LatencySummary:
    """Latency statistics of ``count`` answered requests (ms)."""

    count: int
    mean_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float

    @classmethod
    def of(cls, samples_ms: Sequence[float] | np.ndarray) -> LatencySummary | None:
        """The statistics of ``samples_ms`` (ms); None for no sample. Percentiles are numpy's linear ones."""
        x = np.asarray(samples_ms, dtype=float)
        if x.size == 0:
            return None
        if not np.all(np.isfinite(x)) or np.any(x < 0):
            raise ValueError("latency samples must be finite and >= 0 ms")
        p50, p95, p99 = np.percentile(x, [50.0, 95.0, 99.0])
        return cls(int(x.size), float(x.mean()), float(p50), float(p95), float(p99))

    def at(self, stat: str) -> float:
        """The statistic an SLO names (``mean``, ``p50``, ``p95``, ``p99``), ms."""
        try:
            return {"mean": self.mean_ms, "p50": self.p50_ms, "p95": self.p95_ms, "p99": self.p99_ms}[stat]
        except KeyError:
            raise ValueError(f"unknown latency statistic {stat!r}: expected mean, p50, p95 or p99") from None


@dataclass(frozen=True)
class AppWindow:
    """One app over ``[start_s, end_s)``: ``arrivals`` requests came (answered, refused or failed),
    ``refused`` were turned away by policing or a full queue (429/503), ``failed`` got no answer (errors,
    timeouts); ``latency`` summarizes the answered ones (None when none was answered)."""

    app: str
    start_s: float
    end_s: float
    arrivals: int
    refused: int
    failed: int
    latency: LatencySummary | None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.start_s) and math.isfinite(self.end_s) and self.end_s > self.start_s):
            raise ValueError(f"app {self.app!r}: a window needs finite bounds with end_s > start_s, "
                             f"got [{self.start_s}, {self.end_s})")
        for name in ("arrivals", "refused", "failed"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"app {self.app!r}: {name} must be an integer >= 0, got {v!r}")
        if self.refused + self.failed > self.arrivals:
            raise ValueError(f"app {self.app!r}: refused + failed ({self.refused + self.failed}) exceed "
                             f"arrivals ({self.arrivals})")
        answered = self.latency.count if self.latency is not None else 0
        if answered > self.arrivals - self.refused - self.failed:
            raise ValueError(f"app {self.app!r}: {answered} latencies for "
                             f"{self.arrivals - self.refused - self.failed} answered requests")

    @classmethod
    def of(cls, app: str, start_s: float, end_s: float, latencies_ms: Sequence[float] | np.ndarray,
           refused: int = 0, failed: int = 0) -> AppWindow:
        """The window of ``app`` whose answered requests took ``latencies_ms`` (ms), plus ``refused`` and
        ``failed`` ones."""
        summary = LatencySummary.of(latencies_ms)
        answered = summary.count if summary is not None else 0
        return cls(app, float(start_s), float(end_s), answered + refused + failed, refused, failed, summary)

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def rate_rps(self) -> float:
        """Observed offered rate, λ̂ (req/s): every arrival, refused ones included (what the app sends)."""
        return self.arrivals / self.duration_s

    @property
    def lost(self) -> int:
        """Requests refused or failed."""
        return self.refused + self.failed


@dataclass(frozen=True)
class ServiceMoments:
    """Running service-time moments of one (model, device): ``n`` samples, their mean (ms) and the sum of
    squared deviations ``m2`` (ms²), merged exactly across windows (Chan et al.'s pairwise update)."""

    n: int = 0
    mean_ms: float = 0.0
    m2: float = 0.0

    @classmethod
    def of(cls, samples_ms: Sequence[float] | np.ndarray) -> ServiceMoments:
        x = np.asarray(samples_ms, dtype=float)
        if x.size == 0:
            return cls()
        if not np.all(np.isfinite(x)) or np.any(x < 0):
            raise ValueError("service-time samples must be finite and >= 0 ms")
        mean = float(x.mean())
        return cls(int(x.size), mean, float(np.sum((x - mean) ** 2)))

    def merge(self, other: ServiceMoments) -> ServiceMoments:
        """The moments of both sample sets together."""
        if other.n == 0:
            return self
        if self.n == 0:
            return other
        n = self.n + other.n
        delta = other.mean_ms - self.mean_ms
        mean = self.mean_ms + delta * other.n / n
        return ServiceMoments(n, mean, self.m2 + other.m2 + delta * delta * self.n * other.n / n)

    @property
    def variance_ms2(self) -> float:
        """Sample variance (ms², n - 1 in the denominator); nan below two samples."""
        return self.m2 / (self.n - 1) if self.n > 1 else math.nan

    @property
    def scv(self) -> float:
        """Squared coefficient of variation (variance / mean²)."""
        return self.variance_ms2 / self.mean_ms ** 2 if self.n > 1 and self.mean_ms > 0 else math.nan
