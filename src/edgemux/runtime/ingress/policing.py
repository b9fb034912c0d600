"""Token-bucket policing of an app's requests at its contracted rate (req/s) and burst (requests).

Admission and placement assumed the app sends at most ``rate`` requests per second with bursts of at most
``burst``; the client polices with this bucket so that a misbehaving tenant cannot break the SLOs of the
others sharing its devices. The bucket starts full, refills continuously at ``rate_rps`` tokens per second
up to ``burst`` tokens, and each request takes one token. A request that finds no token may wait for the
next one (a token is reserved for it, so waiting requests are served in arrival order) or, when it would
wait longer than the caller allows, is refused without consuming anything (HTTP 429 with Retry-After).

All times here are seconds (``*_s``) on the bucket's clock (``time.monotonic`` by default).
"""

from __future__ import annotations

import math
import numbers
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

# Waits shorter than this (seconds) count as no wait: float sums of 1/rate drift by ~1e-16 s per step, and a
# request that is due "now" must not be made to wait for a femtosecond.
_EPS_S = 1e-9


@dataclass(frozen=True)
class Admission:
    """What to do with one request: if ``admitted``, send it after ``wait_s`` seconds (0.0: now); if not,
    answer 429 and tell the client to retry after ``retry_after_s`` seconds (when a token will be there)."""

    admitted: bool
    wait_s: float = 0.0
    retry_after_s: float = 0.0


class TokenBucket:
    """A token bucket of capacity ``burst`` (requests) refilled at ``rate_rps`` (requests per second).

    Thread-safe: the HTTP server may police one app from several threads.
    """

    def __init__(self, rate_rps: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        _check(rate_rps, burst)
        self._rate = float(rate_rps)
        self._burst = float(burst)
        self._clock = clock
        self._lock = threading.Lock()
        # Tokens at time self._last; negative while tokens are reserved by requests that are waiting.
        self._tokens = self._burst
        self._last = clock()

    @property
    def rate_rps(self) -> float:
        """Refill rate in tokens (requests) per second."""
        return self._rate

    @property
    def burst(self) -> float:
        """Capacity in tokens (requests): how many back-to-back requests an idle app may send."""
        return self._burst

    def tokens(self, now: float | None = None) -> float:
        """Tokens available at ``now`` (seconds on the bucket's clock; default: read it); negative when
        waiting requests have reserved tokens not yet refilled."""
        with self._lock:
            self._refill(self._now(now))
            return self._tokens

    def try_acquire(self, now: float | None = None) -> float:
        """Take one token: return 0.0 if the request may go now, else the wait in seconds until its token is
        available. The token is reserved either way, so the caller must send the request after the wait."""
        with self._lock:
            t = self._now(now)
            self._refill(t)
            wait = self._wait()
            self._tokens -= 1.0
            return wait

    def admit(self, max_wait_s: float, now: float | None = None) -> Admission:
        """Admit a request if its token is available within ``max_wait_s`` seconds (reserving the token),
        else refuse it without consuming anything. A refusal's ``retry_after_s`` is the time in seconds
        until a token will be available (if nobody else takes it)."""
        if not (max_wait_s >= 0):  # also refuses NaN
            raise ValueError(f"max_wait_s must be >= 0 seconds, got {max_wait_s!r}")
        with self._lock:
            t = self._now(now)
            self._refill(t)
            wait = self._wait()
            if wait > max_wait_s:
                return Admission(False, 0.0, wait)
            self._tokens -= 1.0
            return Admission(True, wait, 0.0)

    def reconfigure(self, rate_rps: float, burst: float, now: float | None = None) -> None:
        """Change the contract (rate in req/s, burst in requests) in place, e.g. after re-admission. Tokens
        earned so far are kept, capped at the new burst; reservations stay owed."""
        _check(rate_rps, burst)
        with self._lock:
            self._refill(self._now(now))  # settle the refill at the old rate first
            self._rate = float(rate_rps)
            self._burst = float(burst)
            self._tokens = min(self._tokens, self._burst)

    def _now(self, now: float | None) -> float:
        return self._clock() if now is None else now

    def _refill(self, t: float) -> None:
        # A caller's `now` may be slightly older than the last one seen (read before another thread took the
        # lock): time never runs backwards for the bucket, so such a call just earns nothing.
        if t > self._last:
            self._tokens = min(self._burst, self._tokens + (t - self._last) * self._rate)
            self._last = t

    def _wait(self) -> float:
        """Seconds until one whole token is available, given the current (refilled) level."""
        if self._tokens >= 1.0:
            return 0.0
        wait = (1.0 - self._tokens) / self._rate
        return 0.0 if wait <= _EPS_S else wait


def _check(rate_rps: float, burst: float) -> None:
    for name, value in (("rate_rps", rate_rps), ("burst", burst)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"{name} must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value!r}")
    if rate_rps <= 0:
        raise ValueError(f"rate_rps must be > 0 requests per second, got {rate_rps!r}")
    if burst < 1:
        raise ValueError(f"burst must be >= 1 request (one request needs one whole token), got {burst!r}")
