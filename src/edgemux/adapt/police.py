"""Token-bucket policing of an app's requests, as a pure value: the arithmetic that the runtime's client and
gateway (``runtime.policing.TokenBucket``, which adds a lock and a clock), the agent and the cluster
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

__all__ = ["Admission", "Bucket", "Policing", "check_contract", "check_max_wait"]

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


def _wait_s(tokens: float, rate_rps: float) -> float:
    """Seconds until one whole token is there at level ``tokens``, refilled at ``rate_rps`` tokens/s."""
    if tokens >= 1.0:
        return 0.0
    wait = (1.0 - tokens) / rate_rps
    return 0.0 if wait <= EPS_S else wait


# The admission of a request that goes at once (the usual one): immutable, so one object serves them all.
_GO = Admission(True, 0.0, 0.0)


def check_contract(rate_rps: float, burst: float) -> None:
    """Raise ``ValueError`` naming the argument unless ``rate_rps`` is a finite number > 0 (req/s) and
    ``burst`` a finite number >= 1 (requests: one request needs one whole token)."""
    for name, value in (("rate_rps", rate_rps), ("burst", burst)):
        # a float first: the usual case, without the abstract-class check (a new bucket per request is checked)
        if type(value) is not float and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
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
        return self._derived(*self._level(now_s))

    def _derived(self, tokens: float, last_s: float) -> Bucket:
        """This contract at another level: a refill (capped at ``burst``) or a reservation (a token less) of
        a valid bucket, at a time not before its own. Valid by construction, so ``__post_init__``'s checks
        are not run again (they were most of an admission's cost on a request's path); only the time, which
        comes from the caller's clock, is checked."""
        if not math.isfinite(last_s):
            raise ValueError(f"last_s must be a finite time in seconds, got {last_s!r}")
        b = object.__new__(Bucket)
        b.__dict__.update(rate_rps=self.rate_rps, burst=self.burst, tokens=tokens, last_s=last_s)
        return b

    def _level(self, now_s: float) -> tuple[float, float]:
        """(tokens, time) of :meth:`refilled` without making the bucket (a request's path makes one, not two)."""
        if now_s <= self.last_s:
            return self.tokens, self.last_s
        return min(self.burst, self.tokens + (now_s - self.last_s) * self.rate_rps), now_s

    def wait_s(self) -> float:
        """Seconds until one whole token is available at the current level (no refill: call :meth:`refilled`
        first); 0.0 when one is there."""
        return _wait_s(self.tokens, self.rate_rps)

    def acquire(self, now_s: float) -> tuple[float, Bucket]:
        """Take one token at ``now_s`` (s): the wait in seconds until it is there (0.0: go now) and the
        bucket with it reserved. The token is reserved whatever the wait, so the request must be sent after
        it."""
        b = self.refilled(now_s)
        return b.wait_s(), b._derived(b.tokens - 1.0, b.last_s)

    def admit(self, now_s: float, max_wait_s: float) -> tuple[Admission, Bucket]:
        """Admit a request at ``now_s`` (s) if its token is there within ``max_wait_s`` seconds (reserving
        it), else refuse it without consuming anything; a refusal's ``retry_after_s`` is the time until a
        token will be there (if nobody else takes it). Returns the admission and the new bucket."""
        if not (max_wait_s >= 0):
            check_max_wait(max_wait_s)  # raises, naming the argument
        # _level and _wait_s written out: this runs once per request on the gateway's and the agents' paths
        tokens, last_s = self.tokens, self.last_s
        if not (now_s <= last_s):  # later (or NaN, refused by _derived): the refill
            tokens, last_s = min(self.burst, tokens + (now_s - last_s) * self.rate_rps), now_s
        if tokens >= 1.0:  # a token is there: the usual admission
            return _GO, self._derived(tokens - 1.0, last_s)
        wait = _wait_s(tokens, self.rate_rps)
        if wait > max_wait_s:
            return Admission(False, 0.0, wait), self._derived(tokens, last_s)
        return (_GO if wait == 0.0 else Admission(True, wait, 0.0)), self._derived(tokens - 1.0, last_s)

    def reconfigured(self, rate_rps: float, burst: float, now_s: float) -> Bucket:
        """The bucket with a new contract (``rate_rps`` req/s, ``burst`` requests) from ``now_s`` (s), e.g.
        after re-admission: the refill up to ``now_s`` is settled at the old rate, tokens earned so far are
        kept, capped at the new burst, and reservations stay owed."""
        check_contract(rate_rps, burst)
        b = self.refilled(now_s)
        return Bucket(float(rate_rps), float(burst), min(b.tokens, float(burst)), b.last_s)


@dataclass(frozen=True)
class Policing:
    """The one rule that turns an app's contract (``rate_rps`` req/s, ``burst`` requests) into its token
    bucket, used by the runtime's gateway, client and agents (``runtime.ingress.dispatch.RouteTable``,
    ``runtime.dataplane.agent``) and by the cluster simulator, so that what the simulator predicts is what
    the runtime does. ``enabled=False`` (simulator only): no policing.

    The bucket refills at ``contract * (1 + rate_margin)`` req/s. Not at the contract itself: the contract is
    a *mean* rate, and a Poisson stream at exactly its bucket's rate is a critically loaded queue whose
    waits grow without bound (over 10 min at 10 req/s, a 40-request bucket at the mean rate makes 12 % of
    the requests wait and refuses 1 %). The default margin 0.1 is ``AdaptSettings.rate_tolerance``'s default:
    the bucket lets through what the detector still calls within contract. Its depth is ``burst_s`` seconds
    of that rate (44 requests at 11 req/s, so that a Poisson stream at its contract practically never waits)
    or ``min_depth`` requests or the app's own burst, whichever is largest. The floor matters for slow apps:
    how often a Poisson stream finds its bucket empty depends on the depth in *requests*, not seconds (the
    bucket is a queue with deterministic service at 1.1x the arrival rate, whatever the rate), so 4 s of
    0.2 req/s (under one request) would refuse a slow app's ordinary bunching while 40 requests practically
    never do. A request whose token is more than ``max_wait_s`` (s) away is refused (HTTP 429).
    ``Policing.exact()`` polices the contract as written (margin 0, depth the app's burst)."""

    enabled: bool = True
    rate_margin: float = 0.1
    burst_s: float = 4.0
    max_wait_s: float = 0.5
    min_depth: float = 40.0

    def __post_init__(self) -> None:
        for name in ("rate_margin", "burst_s", "min_depth"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0):
                raise ValueError(f"policing {name} must be a finite number >= 0, got {v!r}")
        check_max_wait(self.max_wait_s)
        if not math.isfinite(self.max_wait_s):
            raise ValueError(f"policing max_wait_s must be finite, got {self.max_wait_s!r}")

    @classmethod
    def exact(cls, max_wait_s: float = 0.5) -> Policing:
        """Police the contract exactly as written: refill at the contract, depth the app's burst."""
        return cls(rate_margin=0.0, burst_s=0.0, max_wait_s=max_wait_s, min_depth=0.0)

    def contract(self, rate_rps: float, burst: float) -> tuple[float, float]:
        """The bucket's (refill rate req/s, depth requests) for a contract of ``rate_rps`` req/s with bursts
        of ``burst`` requests."""
        rate = rate_rps * (1.0 + self.rate_margin)
        return rate, max(float(burst), self.burst_s * rate, self.min_depth, 1.0)
