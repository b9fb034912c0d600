"""Token-bucket policing of an app's requests at its contracted rate (req/s) and burst (requests).

Admission and placement assumed the app sends at most ``rate`` requests per second with bursts of at most
``burst``; the client polices with this bucket so that a misbehaving tenant cannot break the SLOs of the
others sharing its devices. The arithmetic (start full, refill at ``rate_rps`` up to ``burst``, one token a
request, reservations for waiting requests, refusal without consuming) is the pure
:class:`edgemux.adapt.police.Bucket`, the one the cluster simulator runs too; :class:`TokenBucket` adds the
clock and the lock a server needs.

All times here are seconds (``*_s``) on the bucket's clock (``time.monotonic`` by default).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from edgemux.adapt.police import Admission, Bucket, check_contract

__all__ = ["Admission", "TokenBucket"]


class TokenBucket:
    """A token bucket of capacity ``burst`` (requests) refilled at ``rate_rps`` (requests per second).

    Thread-safe: the HTTP server may police one app from several threads.
    """

    def __init__(self, rate_rps: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        check_contract(rate_rps, burst)
        self._clock = clock
        self._lock = threading.Lock()
        self._bucket = Bucket.full(rate_rps, burst, clock())

    @property
    def rate_rps(self) -> float:
        """Refill rate in tokens (requests) per second."""
        return self._bucket.rate_rps

    @property
    def burst(self) -> float:
        """Capacity in tokens (requests): how many back-to-back requests an idle app may send."""
        return self._bucket.burst

    def tokens(self, now: float | None = None) -> float:
        """Tokens available at ``now`` (seconds on the bucket's clock; default: read it); negative when
        waiting requests have reserved tokens not yet refilled."""
        with self._lock:
            self._bucket = self._bucket.refilled(self._now(now))
            return self._bucket.tokens

    def try_acquire(self, now: float | None = None) -> float:
        """Take one token: return 0.0 if the request may go now, else the wait in seconds until its token is
        available. The token is reserved either way, so the caller must send the request after the wait."""
        with self._lock:
            wait, self._bucket = self._bucket.acquire(self._now(now))
            return wait

    def admit(self, max_wait_s: float, now: float | None = None) -> Admission:
        """Admit a request if its token is available within ``max_wait_s`` seconds (reserving the token),
        else refuse it without consuming anything. A refusal's ``retry_after_s`` is the time in seconds
        until a token will be available (if nobody else takes it)."""
        with self._lock:  # Bucket.admit checks max_wait_s
            admission, self._bucket = self._bucket.admit(self._clock() if now is None else now, max_wait_s)
            return admission

    def reconfigure(self, rate_rps: float, burst: float, now: float | None = None) -> None:
        """Change the contract (rate in req/s, burst in requests) in place, e.g. after re-admission. Tokens
        earned so far are kept, capped at the new burst; reservations stay owed."""
        check_contract(rate_rps, burst)
        with self._lock:
            self._bucket = self._bucket.reconfigured(rate_rps, burst, self._now(now))

    def _now(self, now: float | None) -> float:
        return self._clock() if now is None else now
