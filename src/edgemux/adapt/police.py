"""Token-bucket policing of an app's requests, as a pure value: the arithmetic that the runtime's client and
gateway (``runtime.ingress.policing.TokenBucket``, which adds a lock and a clock), the agent and the cluster
simulator (``sim.cluster``, in virtual time) all run, so that the policing the simulator predicts is the
policing the runtime does.

A :class:`Bucket` of capacity ``burst`` (requests) refills continuously at ``rate_rps`` tokens (requests) per
second up to ``burst``, and each request takes one token. A request that finds no token may wait for the
next one (its token is reserved at once, so the level goes negative and waiting requests are served in
arrival order), or, when it would wait longer than the caller allows, is refused without consuming anything.
Ibis §4.2 polices each app at its contracted rate this way so that an app sending more than its contract
queues in its own bucket instead of overloading the device its neighbours share.

Every method returns a new bucket (the old one is unchanged). Times are seconds (``*_s``) on whatever
clock the caller keeps (monotonic, or the simulator's virtual time); rates req/s; levels in tokens.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

__all__ = ["Admission", "Bucket", "check_contract", "check_max_wait"]

# Waits shorter than this (seconds) count as no wait: float sums of 1/rate drift by ~1e-16 s per step, and a
# request that is due "now" must not be made to wait for a femtosecond.
EPS_S = 1e-9


@dataclass(frozen=True)
class Admission:
    """What to do with one request: if ``admitted``, send it after ``wait_s`` seconds (0.0: now); if not,
    answer 429 and tell the client to retry after ``retry_after_s`` seconds (when a token will be there)."""

    admitted: bool
    wait_s: float = 0.0
    retry_after_s: float = 0.0


def check_contract(rate_rps: float, burst: float) -> None:
    """Raise ``ValueError`` naming the argument unless ``rate_rps`` is a finite number > 0 (req/s) and
    ``burst`` a finite number >= 1 (requests: one request needs one whole token)."""
    for name, value in (("rate_rps", rate_rps), ("burst", burst)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"{name} must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value!r}")
    if rate_rps <= 0:
        raise ValueError(f"rate_rps must be > 0 requests per second, got {rate_rps!r}")
    if burst < 1:
        raise ValueError(f"burst must be >= 1 request (one request needs one whole token), got {burst!r}")


def check_max_wait(max_wait_s: float) -> None:
    """Raise ``ValueError`` unless ``max_wait_s`` is >= 0 seconds (NaN is refused too)."""
    if not (max_wait_s >= 0):
        raise ValueError(f"max_wait_s must be >= 0 seconds, got {max_wait_s!r}")


@dataclass(frozen=True)
class Bucket:
    """A token bucket: ``rate_rps`` (tokens per second), ``burst`` (capacity, tokens), ``tokens`` (the level
    at ``last_s``; negative while waiting requests hold reservations not yet refilled) and ``last_s`` (the
    time, s, the level was last brought up to date). :meth:`full` makes a new one."""

    rate_rps: float
    burst: float
    tokens: float
    last_s: float

    def __post_init__(self) -> None:
        check_contract(self.rate_rps, self.burst)
        if not (math.isfinite(self.tokens) and self.tokens <= self.burst):
            raise ValueError(f"tokens must be finite and <= burst ({self.burst!r}), got {self.tokens!r}")
        if not math.isfinite(self.last_s):
            raise ValueError(f"last_s must be a finite time in seconds, got {self.last_s!r}")

    @classmethod
    def full(cls, rate_rps: float, burst: float, now_s: float) -> Bucket:
        """A bucket that starts full (``burst`` tokens) at ``now_s`` (s), refilled at ``rate_rps`` (req/s)."""
        check_contract(rate_rps, burst)
        return cls(float(rate_rps), float(burst), float(burst), float(now_s))

    def refilled(self, now_s: float) -> Bucket:
        """The bucket at ``now_s`` (s): tokens earned since ``last_s``, capped at ``burst``. A ``now_s`` older
        than ``last_s`` (a clock read before another thread's) earns nothing: time never runs backwards for
        the bucket."""
        if now_s <= self.last_s:
            return self
        return Bucket(self.rate_rps, self.burst, min(self.burst, self.tokens + (now_s - self.last_s) * self.rate_rps),
                      now_s)

    def wait_s(self) -> float:
        """Seconds until one whole token is available at the current level (no refill: call :meth:`refilled`
        first); 0.0 when one is there."""
        if self.tokens >= 1.0:
            return 0.0
        wait = (1.0 - self.tokens) / self.rate_rps
        return 0.0 if wait <= EPS_S else wait

    def acquire(self, now_s: float) -> tuple[float, Bucket]:
        """Take one token at ``now_s`` (s): the wait in seconds until it is there (0.0: go now) and the
        bucket with it reserved. The token is reserved whatever the wait, so the request must be sent after
        it."""
        b = self.refilled(now_s)
        return b.wait_s(), Bucket(b.rate_rps, b.burst, b.tokens - 1.0, b.last_s)

    def admit(self, now_s: float, max_wait_s: float) -> tuple[Admission, Bucket]:
        """Admit a request at ``now_s`` (s) if its token is there within ``max_wait_s`` seconds (reserving
        it), else refuse it without consuming anything; a refusal's ``retry_after_s`` is the time until a
        token will be there (if nobody else takes it). Returns the admission and the new bucket."""
        check_max_wait(max_wait_s)
        b = self.refilled(now_s)
        wait = b.wait_s()
        if wait > max_wait_s:
            return Admission(False, 0.0, wait), b
        return Admission(True, wait, 0.0), Bucket(b.rate_rps, b.burst, b.tokens - 1.0, b.last_s)

    def reconfigured(self, rate_rps: float, burst: float, now_s: float) -> Bucket:
        """The bucket with a new contract (``rate_rps`` req/s, ``burst`` requests) from ``now_s`` (s), e.g.
        after re-admission: the refill up to ``now_s`` is settled at the old rate, tokens earned so far are
        kept, capped at the new burst, and reservations stay owed."""
        check_contract(rate_rps, burst)
        b = self.refilled(now_s)
        return Bucket(float(rate_rps), float(burst), min(b.tokens, float(burst)), b.last_s)
