"""What one monitoring window observed: per app its arrivals, answers, refusals and latency statistics, and
per (model, device) the service-time moments the devices measured.

A window is built from the raw observations of one period (``AppWindow.of``): the caller (the control plane
from agents' metrics, the simulator from its departures) passes counts and latency samples. Times: ``*_s``
seconds (the window's bounds, in whatever clock the caller keeps), ``*_ms`` milliseconds, rates req/s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["AppCounters", "AppWindow", "LatencyHistogram", "LatencySummary", "ServiceMoments"]

# the standard normal's 95 % quantile: one-sided 95 % confidence bounds
Z_ONE_SIDED_95 = 1.6448536269514722

# Bucket i of a LatencyHistogram holds latencies in [BASE_MS * GROWTH**i, BASE_MS * GROWTH**(i+1)) ms, so
# a percentile read back is within GROWTH - 1 = 1 % of the true sample quantile; below BASE_MS everything
# is bucket 0 (a microsecond is below any SLO edgemux judges).
HISTOGRAM_BASE_MS = 0.001
HISTOGRAM_GROWTH = 1.01
_LOG_GROWTH = math.log(HISTOGRAM_GROWTH)


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
class LatencyHistogram:
    """Latencies (ms) counted in log-spaced buckets: mergeable across processes and windows (counts add,
    a later cumulative histogram minus an earlier one is the window between), with percentiles within 1 %.
    ``buckets`` maps bucket index to count (sparse); ``total_ms`` is the exact sum, for the mean."""

    buckets: Mapping[int, int] = field(default_factory=dict)
    total_ms: float = 0.0

    @property
    def count(self) -> int:
        return sum(self.buckets.values())

    @staticmethod
    def index(latency_ms: float) -> int:
        """The bucket of one latency (ms)."""
        if latency_ms <= HISTOGRAM_BASE_MS:
            return 0
        return int(math.log(latency_ms / HISTOGRAM_BASE_MS) / _LOG_GROWTH)

    @classmethod
    def of(cls, samples_ms: Sequence[float] | np.ndarray) -> LatencyHistogram:
        """The histogram of ``samples_ms`` (finite, >= 0 ms)."""
        x = np.asarray(samples_ms, dtype=float)
        if x.size and (not np.all(np.isfinite(x)) or np.any(x < 0)):
            raise ValueError("latency samples must be finite and >= 0 ms")
        idx = np.zeros(x.size, dtype=np.int64)
        pos = x > HISTOGRAM_BASE_MS
        idx[pos] = (np.log(x[pos] / HISTOGRAM_BASE_MS) / _LOG_GROWTH).astype(np.int64)
        keys, counts = np.unique(idx, return_counts=True)
        return cls({int(k): int(c) for k, c in zip(keys, counts)}, float(x.sum()))

    def merge(self, other: LatencyHistogram) -> LatencyHistogram:
        """Both sample sets together."""
        out = dict(self.buckets)
        for k, c in other.buckets.items():
            out[k] = out.get(k, 0) + c
        return LatencyHistogram(out, self.total_ms + other.total_ms)

    def minus(self, earlier: LatencyHistogram) -> LatencyHistogram:
        """What was added since ``earlier`` (an earlier state of the same cumulative histogram);
        ``ValueError`` if ``earlier`` has counts this one lacks (not an earlier state: a restarted source)."""
        out = {}
        for k, c in self.buckets.items():
            d = c - earlier.buckets.get(k, 0)
            if d < 0:
                raise ValueError(f"histogram bucket {k} went down ({earlier.buckets.get(k, 0)} -> {c})")
            if d:
                out[k] = d
        if any(k not in self.buckets for k, c in earlier.buckets.items() if c):
            raise ValueError("histogram lost buckets: not an earlier state of this one")
        return LatencyHistogram(out, max(self.total_ms - earlier.total_ms, 0.0))

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (0 <= q <= 1) in ms: the geometric middle of the bucket holding it; nan when
        empty."""
        n = self.count
        if n == 0:
            return math.nan
        rank = q * (n - 1)
        seen = 0
        for k in sorted(self.buckets):
            seen += self.buckets[k]
            if seen > rank:
                return HISTOGRAM_BASE_MS * HISTOGRAM_GROWTH ** (k + 0.5) if k > 0 else HISTOGRAM_BASE_MS
        raise AssertionError("unreachable: the ranks cover the counts")  # pragma: no cover

    def summary(self) -> LatencySummary | None:
        """The window statistics the detectors read; None when empty."""
        n = self.count
        if n == 0:
            return None
        return LatencySummary(n, self.total_ms / n, self.quantile(0.5), self.quantile(0.95), self.quantile(0.99))

    def to_json(self) -> dict[str, object]:
        return {"buckets": {str(k): c for k, c in sorted(self.buckets.items())}, "total_ms": self.total_ms}

    @classmethod
    def from_json(cls, data: object) -> LatencyHistogram:
        """The inverse of ``to_json``; ``ValueError`` naming what is malformed."""
        if not isinstance(data, Mapping) or not isinstance(data.get("buckets", {}), Mapping):
            raise ValueError("latency histogram: expected {\"buckets\": {index: count}, \"total_ms\": ms}")
        total = data.get("total_ms", 0.0)
        if isinstance(total, bool) or not isinstance(total, (int, float)) or not (0 <= total < math.inf):
            raise ValueError(f"latency histogram: total_ms must be a finite number >= 0, got {total!r}")
        buckets: dict[int, int] = {}
        for k, c in data.get("buckets", {}).items():
            try:
                i = int(k)
            except (TypeError, ValueError):
                raise ValueError(f"latency histogram: bucket index {k!r} is not an integer") from None
            if i < 0 or isinstance(c, bool) or not isinstance(c, int) or c < 0:
                raise ValueError(f"latency histogram: bucket {k!r} needs an index >= 0 and a count >= 0, got {c!r}")
            buckets[i] = c
        return cls(buckets, float(total))


@dataclass(frozen=True)
class AppCounters:
    """What one process (an agent, a gateway) saw of one app since it started, cumulative like Prometheus
    counters: requests that arrived, were refused (429/503), failed (no answer), the answered ones'
    latencies (ms) and the sum of their policing waits (``waited_ms``, ms: part of their latency). Two
    reports of one process subtract to the window between them."""

    arrivals: int = 0
    refused: int = 0
    failed: int = 0
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    waited_ms: float = 0.0

    def merge(self, other: AppCounters) -> AppCounters:
        return AppCounters(self.arrivals + other.arrivals, self.refused + other.refused,
                           self.failed + other.failed, self.latency.merge(other.latency),
                           self.waited_ms + other.waited_ms)

    def minus(self, earlier: AppCounters) -> AppCounters:
        """The counts since ``earlier``; ``ValueError`` when a count went down (the process restarted)."""
        for name in ("arrivals", "refused", "failed"):
            if getattr(self, name) < getattr(earlier, name):
                raise ValueError(f"{name} went down ({getattr(earlier, name)} -> {getattr(self, name)})")
        return AppCounters(self.arrivals - earlier.arrivals, self.refused - earlier.refused,
                           self.failed - earlier.failed, self.latency.minus(earlier.latency),
                           max(self.waited_ms - earlier.waited_ms, 0.0))

    def window(self, app: str, start_s: float, end_s: float) -> AppWindow:
        """These counts as the window ``[start_s, end_s)`` of ``app``. Requests that arrived but are not
        answered, refused or failed yet are in flight: they count as arrivals of this window only."""
        answered = self.latency.count
        arrivals = max(self.arrivals, answered + self.refused + self.failed)
        return AppWindow(app, float(start_s), float(end_s), arrivals, self.refused, self.failed,
                         self.latency.summary(), self.waited_ms)

    def to_json(self) -> dict[str, object]:
        return {"arrivals": self.arrivals, "refused": self.refused, "failed": self.failed,
                "latency": self.latency.to_json(), **({"waited_ms": self.waited_ms} if self.waited_ms else {})}

    @classmethod
    def from_json(cls, data: object) -> AppCounters:
        """The inverse of ``to_json``; ``ValueError`` naming the field that is malformed."""
        if not isinstance(data, Mapping):
            raise ValueError(f"app counters: expected an object, got {type(data).__name__}")
        counts = []
        for name in ("arrivals", "refused", "failed"):
            v = data.get(name, 0)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"app counters: {name} must be an integer >= 0, got {v!r}")
            counts.append(v)
        waited = data.get("waited_ms", 0.0)
        if isinstance(waited, bool) or not isinstance(waited, (int, float)) or not (math.isfinite(waited)
                                                                                    and waited >= 0):
            raise ValueError(f"app counters: waited_ms must be a finite number >= 0, got {waited!r}")
        return cls(counts[0], counts[1], counts[2], LatencyHistogram.from_json(data.get("latency", {})),
                   float(waited))


@dataclass(frozen=True)
class AppWindow:
    """One app over ``[start_s, end_s)``: ``arrivals`` requests came (answered, refused or failed),
    ``refused`` were turned away by policing or a full queue (429/503), ``failed`` got no answer (errors,
    timeouts); ``latency`` summarizes the answered ones (None when none was answered); ``waited_ms`` is the
    sum of the answered ones' policing waits (ms: their wait for a token, inside their latency; 0 where
    nobody counted it)."""

    app: str
    start_s: float
    end_s: float
    arrivals: int
    refused: int
    failed: int
    latency: LatencySummary | None
    waited_ms: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.waited_ms) and self.waited_ms >= 0):
            raise ValueError(f"app {self.app!r}: waited_ms must be a finite number >= 0, got {self.waited_ms!r}")
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

    def rate_upper_rps(self, z: float = Z_ONE_SIDED_95) -> float:
        """An upper confidence bound of the app's rate (req/s): the Poisson mean ``m`` whose count would fall
        ``z`` standard deviations above ``n`` arrivals, ``(n - m) / sqrt(m) = -z``, i.e.
        ``m = n + z²/2 + z sqrt(n + z²/4)``, over ``T`` seconds (the score bound; ``z`` = 1.645: one-sided
        95 %; the cruder ``n + z sqrt(n)`` covers only about 93 %). What a re-admission should plan for:
        one window's count is noisy (50 requests: +-14 % at one standard deviation), and a contract set at a
        low draw would be exceeded again at once."""
        n = self.arrivals
        return (n + z * z / 2.0 + z * math.sqrt(n + z * z / 4.0)) / self.duration_s

    def rate_lower_rps(self, z: float = Z_ONE_SIDED_95) -> float:
        """The matching lower confidence bound (req/s): ``(n + z²/2 - z sqrt(n + z²/4)) / T``. An app is
        called over its contract only when even this bound is above it: in a 2 s window an app sending
        exactly 10 req/s shows more than 11 req/s about a third of the time."""
        n = self.arrivals
        return max(0.0, n + z * z / 2.0 - z * math.sqrt(n + z * z / 4.0)) / self.duration_s

    @property
    def lost(self) -> int:
        """Requests refused or failed."""
        return self.refused + self.failed


@dataclass(frozen=True)
class ServiceMoments:
    """Running service-time moments of one (model, device): ``n`` samples, their mean (ms) and the sum of
    squared deviations ``m2`` (ms²), merged exactly across windows (Chan et al.'s pairwise update), and the
    largest sample (``max_ms``, ms; 0 when not known): a calibrated profile keeps a bounded support with it."""

    n: int = 0
    mean_ms: float = 0.0
    m2: float = 0.0
    max_ms: float = 0.0

    @classmethod
    def of(cls, samples_ms: Sequence[float] | np.ndarray) -> ServiceMoments:
        x = np.asarray(samples_ms, dtype=float)
        if x.size == 0:
            return cls()
        if not np.all(np.isfinite(x)) or np.any(x < 0):
            raise ValueError("service-time samples must be finite and >= 0 ms")
        mean = float(x.mean())
        return cls(int(x.size), mean, float(np.sum((x - mean) ** 2)), float(x.max()))

    def merge(self, other: ServiceMoments) -> ServiceMoments:
        """The moments of both sample sets together."""
        if other.n == 0:
            return self
        if self.n == 0:
            return other
        n = self.n + other.n
        delta = other.mean_ms - self.mean_ms
        mean = self.mean_ms + delta * other.n / n
        return ServiceMoments(n, mean, self.m2 + other.m2 + delta * delta * self.n * other.n / n,
                              max(self.max_ms, other.max_ms))

    @property
    def variance_ms2(self) -> float:
        """Sample variance (ms², n - 1 in the denominator); nan below two samples."""
        return self.m2 / (self.n - 1) if self.n > 1 else math.nan

    @property
    def scv(self) -> float:
        """Squared coefficient of variation (variance / mean²)."""
        return self.variance_ms2 / self.mean_ms ** 2 if self.n > 1 and self.mean_ms > 0 else math.nan
