"""A device worker's accounting: per-app counters, executions in flight, busy periods, utilization over a
window, the drain-time estimate, and power states with the modelled energy.

A :class:`DeviceMeter` is not locked: its :class:`~edgemux.runtime.dataplane.worker.DeviceWorker` calls it under
its own lock, with times from its own clock (seconds). Busy periods are the simulator's: time with at
least one execution in flight.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from edgemux.profiles.power import device_power

__all__ = ["AppStats", "DeviceMeter"]

# Before any request has finished there is no observed service time to estimate a queue's drain time
# from; 1 ms per queued request is a short, honest "try again soon".
_UNOBSERVED_SERVICE_S = 0.001


@dataclass
class AppStats:
    """Per-app counters. ``requests`` counts every ``submit``; each ends as ``completed``, ``failed`` (bad
    input, unknown model, backend error, cancelled or dropped at close) or ``rejected`` (queue full, worker
    closed), or is still pending. Times are sums over completed requests, in ms."""

    requests: int = 0
    completed: int = 0
    failed: int = 0
    rejected: int = 0
    latency_ms_total: float = 0.0
    queue_ms_total: float = 0.0
    service_ms_total: float = 0.0

    def as_dict(self) -> dict[str, float | int]:
        n = self.completed
        return {
            "requests": self.requests, "completed": n, "failed": self.failed, "rejected": self.rejected,
            "latency_ms_total": self.latency_ms_total, "queue_ms_total": self.queue_ms_total,
            "service_ms_total": self.service_ms_total,
            "latency_ms_mean": self.latency_ms_total / n if n else 0.0,
            "queue_ms_mean": self.queue_ms_total / n if n else 0.0,
            "service_ms_mean": self.service_ms_total / n if n else 0.0,
        }

    def complete(self, queue_ms: float, service_ms: float) -> None:
        """Count one completed request that waited ``queue_ms`` and executed ``service_ms`` (ms)."""
        self.completed += 1
        self.queue_ms_total += queue_ms
        self.service_ms_total += service_ms
        self.latency_ms_total += queue_ms + service_ms


class DeviceMeter:
    """The accounting of one device of ``kind`` since clock ``now`` (s), utilization over ``window_s``."""

    def __init__(self, kind: str, window_s: float, now: float) -> None:
        self.window_s = window_s
        self.apps: dict[str, AppStats] = {}
        self.inflight = 0
        self.max_inflight = 0
        self.executions = 0          # backend calls (a batch is one)
        self.executed_requests = 0
        self.occupied_s = 0.0        # sum of execution durations, for the drain-time estimate
        self.switches = 0
        self.created = now
        self._busy_since: float | None = None
        self._busy_total_s = 0.0
        self._busy_periods: deque[tuple[float, float]] = deque()  # closed busy periods within the window
        # power (cluster.power's states): modelled from the device kind's figures where there are some
        self.power = device_power(kind)
        self.off = False
        self._on_s = 0.0                  # seconds spent on before the current on period
        self._on_since: float | None = now

    def app(self, name: str) -> AppStats:
        """The counters of app ``name`` (created on first use)."""
        stats = self.apps.get(name)
        if stats is None:
            stats = self.apps[name] = AppStats()
        return stats

    def started(self, now: float) -> None:
        """One execution started at ``now`` (s): the device is busy from then if it was not."""
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        if self._busy_since is None:
            self._busy_since = now

    def ended(self, start: float, end: float, requests: int) -> None:
        """Count one execution of ``requests`` requests that ran from ``start`` to ``end`` (s) and close the
        device's busy period when nothing else runs."""
        self.inflight -= 1
        self.executions += 1
        self.executed_requests += requests
        self.occupied_s += end - start
        if self.inflight == 0 and self._busy_since is not None:
            self._busy_total_s += end - self._busy_since
            self._busy_periods.append((self._busy_since, end))
            self._busy_since = None
            self._prune(end)

    def busy_s(self, now: float) -> float:
        """Seconds busy since the start, up to ``now``."""
        return self._busy_total_s + (now - self._busy_since if self._busy_since is not None else 0.0)

    def utilization(self, now: float) -> float:
        """The fraction of the last ``window_s`` seconds (or of the time since the start, when shorter) with
        at least one execution in flight."""
        self._prune(now)
        start = now - self.window_s
        busy = sum(min(e, now) - max(s, start) for s, e in self._busy_periods if e > start)
        if self._busy_since is not None:
            busy += now - max(self._busy_since, start)
        span = min(self.window_s, now - self.created)
        return min(1.0, busy / span) if span > 0 else 0.0

    def retry_after(self, queued: int, servers: int) -> float:
        """Seconds until ``queued`` waiting requests have drained through ``servers`` parallel executions, at
        the observed service time per request (at least 1 ms)."""
        per_request_s = (self.occupied_s / self.executed_requests if self.executed_requests
                         else _UNOBSERVED_SERVICE_S)
        return max(0.001, queued * per_request_s / servers)

    def switch(self, off: bool, now: float) -> None:
        """The device is switched ``off`` (or on) at ``now`` (s); the time it is on is counted for energy."""
        if off and not self.off:
            if self._on_since is not None:
                self._on_s += now - self._on_since
            self._on_since = None
        elif not off and self.off:
            self._on_since = now
        self.off = off

    def energy(self, now: float, utilization: float) -> dict[str, Any]:
        """The modelled power (W) now and energy (J) so far, per app its dynamic share (J); {} without figures."""
        if self.power is None:
            return {}
        on_s = self._on_s + (now - self._on_since if self._on_since is not None else 0.0)
        dyn = self.power.active_w - self.power.idle_w
        return {"power_w": 0.0 if self.off else self.power.at(utilization),
                "energy_j": self.power.idle_w * on_s + dyn * self.busy_s(now),
                "app_energy_j": {a: dyn * st.service_ms_total / 1000.0 for a, st in sorted(self.apps.items())},
                "power_source": self.power.source}

    def _prune(self, now: float) -> None:
        start = now - self.window_s
        while self._busy_periods and self._busy_periods[0][1] <= start:
            self._busy_periods.popleft()
