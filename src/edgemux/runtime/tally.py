"""Per-request counting on the serving path, cheap enough for every request: what an agent or a gateway
observed of each app (and an agent of each profile), read out as the cumulative
:class:`~edgemux.runtime.messages.Observations` of its reports.

The tallies are mutable and touched by one thread (the process's event loop): a request costs a logarithm
and a few dictionary increments, where building the frozen ``adapt.monitor`` values per request would copy a
histogram. ``observations()`` freezes them. Units: ms.
"""

from __future__ import annotations

import math

from edgemux.adapt.calibrate import Observed
from edgemux.adapt.monitor import AppCounters, LatencyHistogram, ServiceMoments
from edgemux.adapt.serving import DeviceTime
from edgemux.runtime.messages import Observations

__all__ = ["Tally"]


class _Moments:
    """Welford's running mean and sum of squared deviations (ms, ms²), and the largest sample (ms)."""

    __slots__ = ("n", "mean", "m2", "top")

    def __init__(self) -> None:
        self.n = 0
        self.mean = 0.0
        self.m2 = 0.0
        self.top = 0.0

    def add(self, x: float) -> None:
        self.n += 1
        d = x - self.mean
        self.mean += d / self.n
        self.m2 += d * (x - self.mean)
        if x > self.top:
            self.top = x

    def frozen(self) -> ServiceMoments:
        return ServiceMoments(self.n, self.mean, self.m2, self.top)


class _App:
    __slots__ = ("arrivals", "refused", "failed", "buckets", "total_ms", "waited_ms")

    def __init__(self) -> None:
        self.arrivals = 0
        self.refused = 0
        self.failed = 0
        self.buckets: dict[int, int] = {}
        self.total_ms = 0.0
        self.waited_ms = 0.0


class Tally:
    """Cumulative counts of one process (``incarnation``: a restart starts from zero under a new one)."""

    def __init__(self, incarnation: str) -> None:
        self.incarnation = incarnation
        self._apps: dict[str, _App] = {}
        self._profiles: dict[str, tuple[_Moments, _Moments]] = {}
        self._device: dict[str, list[float]] = {}  # app -> [answers, queueing + service ms]

    def _app(self, app: str) -> _App:
        a = self._apps.get(app)
        if a is None:
            a = self._apps[app] = _App()
        return a

    def answered(self, app: str, latency_ms: float, waited_ms: float = 0.0) -> None:
        """One request of ``app`` answered after ``latency_ms`` (ms), ``waited_ms`` of it for its policing
        token."""
        a = self._app(app)
        a.arrivals += 1
        k = LatencyHistogram.index(latency_ms) if latency_ms > 0 and math.isfinite(latency_ms) else 0
        a.buckets[k] = a.buckets.get(k, 0) + 1
        a.total_ms += max(latency_ms, 0.0)
        a.waited_ms += max(waited_ms, 0.0)

    def refused(self, app: str) -> None:
        """One request of ``app`` refused (policing 429, full queue 503): the tenant's, not the system's,
        failure, but it counts in the rate the app sends."""
        a = self._app(app)
        a.arrivals += 1
        a.refused += 1

    def failed(self, app: str) -> None:
        """One request of ``app`` that got no answer (an error of the system: 5xx, timeout)."""
        a = self._app(app)
        a.arrivals += 1
        a.failed += 1

    def served(self, app: str, profile: str, queue_ms: float, service_ms: float, switched: bool) -> None:
        """One request of ``app`` executed by ``profile`` on a device, whoever sent it: its wait in the
        device's queue and its service time (ms), and whether it paid a model switch. The service time goes
        to the profile's moments (calibration); queue + service to the app's device time (the serving path
        is what its sender saw beyond it)."""
        pair = self._profiles.get(profile)
        if pair is None:
            pair = self._profiles[profile] = (_Moments(), _Moments())
        pair[1 if switched else 0].add(service_ms)
        d = self._device.get(app)
        if d is None:
            d = self._device[app] = [0, 0.0]
        d[0] += 1
        d[1] += max(queue_ms + service_ms, 0.0)

    def observations(self) -> Observations:
        """The cumulative counts as a report's message."""
        apps = {name: AppCounters(a.arrivals, a.refused, a.failed, LatencyHistogram(dict(a.buckets), a.total_ms),
                                  a.waited_ms)
                for name, a in self._apps.items()}
        profiles = {name: Observed(ex.frozen(), sw.frozen()) for name, (ex, sw) in self._profiles.items()}
        device = {name: DeviceTime(int(n), total) for name, (n, total) in self._device.items()}
        return Observations(self.incarnation, apps, profiles, device)
