"""Weighted round robin over an app's endpoints, with failover.

A placement with more than one share partitions an app's requests over devices (e.g. 0.6 / 0.4). The client
spreads requests with nginx's *smooth* weighted round robin: deterministic, interleaved (weights 3:2 give
``a b a b a``, not ``a a a b b``) and exact over every cycle of integer weights; float weights work the
same way, with counts never drifting from their shares. An endpoint that fails is marked down for a
cooldown (skipped, its share spread over the others in proportion), then tried again; a retry can exclude
the endpoint that just failed.

Times are seconds on the router's clock (``time.monotonic`` by default).
"""

from __future__ import annotations

import math
import numbers
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from edgemux.cluster.state import Placement
from edgemux.errors import EdgemuxError

# How long a failed endpoint is skipped when mark_down is not told until when (seconds).
DEFAULT_COOLDOWN_S = 5.0


@dataclass(frozen=True)
class Endpoint:
    """Where requests for one share go: the ``device`` path (``node-3/tpu0``) and the ``url`` of the agent
    that serves it (empty when the device is served in-process)."""

    device: str
    url: str = ""


class NoEndpointError(EdgemuxError):
    """No endpoint of ``app`` can take a request now (all down, excluded, or with zero weight).
    ``retry_after_s`` is the time in seconds until the first down endpoint comes back (None if none will)."""

    def __init__(self, app: str, detail: str, retry_after_s: float | None) -> None:
        super().__init__(f"app '{app}': no endpoint available ({detail})")
        self.app = app
        self.retry_after_s = retry_after_s


class WeightedRouter:
    """Smooth weighted round robin over one app's endpoints, skipping endpoints marked down.

    Thread-safe: the HTTP server may route one app from several threads.
    """

    def __init__(
        self,
        app: str,
        weights: Mapping[Endpoint, float] | Iterable[tuple[Endpoint, float]],
        clock: Callable[[], float] = time.monotonic,
        cooldown_s: float = DEFAULT_COOLDOWN_S,
    ) -> None:
        if not (math.isfinite(cooldown_s) and cooldown_s >= 0):
            raise ValueError(f"cooldown_s must be a finite number of seconds >= 0, got {cooldown_s!r}")
        self.app = app
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._lock = threading.Lock()
        self._weights: dict[Endpoint, float] = {}
        self._current: dict[Endpoint, float] = {}  # nginx's current_weight, per endpoint
        self._down: dict[Endpoint, float] = {}  # endpoint -> clock time (s) when it may be tried again
        self.update(weights)

    @classmethod
    def from_placement(
        cls,
        placement: Placement,
        urls: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        cooldown_s: float = DEFAULT_COOLDOWN_S,
    ) -> WeightedRouter:
        """A router over a placement's shares: one endpoint per device, weighted by the share's weight;
        ``urls`` maps device paths to agent URLs."""
        urls = urls or {}
        pairs = [(Endpoint(s.device, urls.get(s.device, "")), s.weight) for s in placement.shares]
        return cls(placement.app, pairs, clock=clock, cooldown_s=cooldown_s)

    @property
    def weights(self) -> dict[Endpoint, float]:
        """The endpoints and their weights (a copy)."""
        with self._lock:
            return dict(self._weights)

    def update(self, weights: Mapping[Endpoint, float] | Iterable[tuple[Endpoint, float]]) -> None:
        """Replace the endpoints and weights in place (routes republished after a migration or
        re-partitioning). Endpoints that stay keep their round-robin position and any down mark, so the
        interleaving continues without a jolt; new endpoints start fresh."""
        pairs = list(weights.items() if isinstance(weights, Mapping) else weights)
        new = _validated(self.app, pairs)
        with self._lock:
            self._weights = new
            self._current = {e: self._current.get(e, 0.0) for e in new}
            self._down = {e: t for e, t in self._down.items() if e in new}

    def pick(self, exclude: frozenset[Endpoint] = frozenset(), now: float | None = None) -> Endpoint:
        """The endpoint for the next request, skipping those marked down (until their cooldown ends), those
        in ``exclude`` (e.g. the one that just failed, on retry) and those with weight 0. ``now`` is seconds on
        the router's clock (default: read it). Raises :class:`NoEndpointError` when none is left."""
        with self._lock:
            t = self._clock() if now is None else now
            for e in [e for e, until in self._down.items() if until <= t]:
                del self._down[e]  # cooldown over: try it again
            eligible = [
                e for e, w in self._weights.items() if w > 0 and e not in exclude and e not in self._down
            ]
            if not eligible:
                raise self._none_left(exclude, t)
            # nginx: every eligible endpoint earns its weight; the richest is picked and pays the round's total.
            total = 0.0
            best = eligible[0]
            for e in eligible:
                self._current[e] += self._weights[e]
                total += self._weights[e]
                if self._current[e] > self._current[best]:
                    best = e  # strict '>' keeps ties in declaration order: deterministic
            self._current[best] -= total
            return best

    def mark_down(self, endpoint: Endpoint, until: float | None = None) -> None:
        """Skip ``endpoint`` until clock time ``until`` (seconds; default: now + cooldown_s), after a failure."""
        with self._lock:
            self._require(endpoint)
            self._down[endpoint] = self._clock() + self.cooldown_s if until is None else until

    def mark_up(self, endpoint: Endpoint) -> None:
        """Route to ``endpoint`` again now (e.g. its agent reported healthy)."""
        with self._lock:
            self._require(endpoint)
            self._down.pop(endpoint, None)

    def is_down(self, endpoint: Endpoint, now: float | None = None) -> bool:
        """Whether ``endpoint`` is skipped at ``now`` (seconds on the router's clock; default: read it)."""
        with self._lock:
            t = self._clock() if now is None else now
            return self._down.get(endpoint, -math.inf) > t

    def _require(self, endpoint: Endpoint) -> None:
        if endpoint not in self._weights:
            known = ", ".join(e.device for e in self._weights)
            raise ValueError(f"app '{self.app}' has no endpoint {endpoint.device!r} (endpoints: {known})")

    def _none_left(self, exclude: frozenset[Endpoint], t: float) -> NoEndpointError:
        parts = []
        down = [e for e in self._weights if e in self._down]
        if down:
            parts.append("down: " + ", ".join(f"{e.device} for {self._down[e] - t:.3g} s" for e in down))
        excluded = [e.device for e in self._weights if e in exclude and e not in self._down]
        if excluded:
            parts.append("excluded: " + ", ".join(excluded))
        zero = [e.device for e, w in self._weights.items() if w == 0 and e not in exclude and e not in self._down]
        if zero:
            parts.append("weight 0: " + ", ".join(zero))
        retry = min((self._down[e] - t for e in down), default=None)
        return NoEndpointError(self.app, "; ".join(parts), retry)


def _validated(app: str, pairs: list[tuple[Endpoint, float]]) -> dict[Endpoint, float]:
    if not pairs:
        raise ValueError(f"app '{app}': routes need at least one endpoint")
    out: dict[Endpoint, float] = {}
    for endpoint, weight in pairs:
        if not isinstance(endpoint, Endpoint):
            raise ValueError(f"app '{app}': endpoints must be Endpoint, got {endpoint!r}")
        if endpoint in out:
            raise ValueError(f"app '{app}': endpoint {endpoint.device!r} appears twice")
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not math.isfinite(weight) or weight < 0:
            raise ValueError(
                f"app '{app}': weight of endpoint {endpoint.device!r} must be a finite number >= 0, got {weight!r}"
            )
        out[endpoint] = float(weight)
    if not any(w > 0 for w in out.values()):
        raise ValueError(f"app '{app}': at least one endpoint needs a positive weight")
    return out
