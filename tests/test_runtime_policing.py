"""Token-bucket policing: deterministic with a fake clock (seconds), exact counts, and the meter's bound over
any arrival sequence."""

from __future__ import annotations

import math
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgemux.runtime.policing import Admission, TokenBucket


class FakeClock:
    """A clock the test moves by hand (seconds)."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize(
    "rate, burst, message",
    [
        (0, 1, "rate_rps must be > 0 requests per second, got 0"),
        (-2.0, 1, "rate_rps must be > 0"),
        (math.inf, 1, "rate_rps must be finite, got inf"),
        (math.nan, 1, "rate_rps must be finite, got nan"),
        (1, 0.5, "burst must be >= 1 request"),
        (1, math.inf, "burst must be finite"),
        ("3", 1, "rate_rps must be a number, got '3'"),
        (1, True, "burst must be a number, got True"),
    ],
)
def test_arguments_are_validated(rate, burst, message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        TokenBucket(rate, burst, clock=FakeClock())


def test_max_wait_is_validated() -> None:
    bucket = TokenBucket(1, 1, clock=FakeClock())
    for bad in (-0.1, math.nan):
        with pytest.raises(ValueError, match="max_wait_s must be >= 0 seconds"):
            bucket.admit(bad)


def test_starts_full_then_reserves_in_arrival_order() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate_rps=2, burst=3, clock=clock)
    # three tokens at once, then each reservation waits half a second more than the one before
    assert [bucket.try_acquire() for _ in range(6)] == [0.0, 0.0, 0.0, 0.5, 1.0, 1.5]
    assert bucket.tokens() == -3.0  # three reserved, not yet refilled
    clock.t = 1.5  # the three waiters have been served; nothing left
    assert bucket.try_acquire() == pytest.approx(0.5)


@pytest.mark.parametrize("rate, burst, T", [(10, 5, 10.0), (2.5, 1, 8.0), (30, 7, 3.0), (1000, 50, 0.5)])
def test_steady_overload_admits_exactly_rate_times_T_plus_burst(rate: float, burst: int, T: float) -> None:
    """Arrivals far faster than the rate, no waiting allowed: over [0, T] exactly burst + rate*T get in."""
    clock = FakeClock()
    bucket = TokenBucket(rate, burst, clock=clock)
    per_s = 10 * rate  # ten arrivals per token
    n = int(round(T * per_s))
    admitted = 0
    for k in range(n + 1):  # arrivals at 0, 1/per_s, ..., T (computed, not accumulated)
        clock.t = k / per_s
        admitted += bucket.admit(0.0).admitted
    assert admitted == burst + round(rate * T)


def test_steady_rate_at_contract_is_never_refused() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate_rps=25, burst=1, clock=clock)
    for k in range(1000):
        clock.t = k / 25
        assert bucket.admit(0.0) == Admission(True, 0.0, 0.0)


def test_refusal_consumes_nothing() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate_rps=1, burst=1, clock=clock)
    assert bucket.admit(0.0).admitted
    for _ in range(100):  # a storm of refused requests ...
        refused = bucket.admit(0.25)
        assert not refused.admitted and refused.retry_after_s == pytest.approx(1.0)
    clock.t = 1.0  # ... does not delay the next token
    assert bucket.admit(0.0) == Admission(True, 0.0, 0.0)


def test_admit_waits_within_max_wait_and_reports_retry_after() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate_rps=4, burst=2, clock=clock)
    assert bucket.admit(0.0).wait_s == 0.0 and bucket.admit(0.0).wait_s == 0.0
    first = bucket.admit(0.3)
    assert first.admitted and first.wait_s == pytest.approx(0.25)
    second = bucket.admit(0.3)  # would wait 0.5 s behind the reservation
    assert not second.admitted and second.retry_after_s == pytest.approx(0.5)
    clock.t = 0.25
    assert bucket.admit(0.3).wait_s == pytest.approx(0.25)


def test_long_idle_caps_at_burst() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate_rps=100, burst=3, clock=clock)
    clock.t = 3600.0
    assert bucket.tokens() == 3.0
    assert [bucket.admit(0.0).admitted for _ in range(5)] == [True, True, True, False, False]


def test_time_going_backwards_earns_nothing() -> None:
    bucket = TokenBucket(rate_rps=1, burst=1, clock=FakeClock(10.0))
    assert bucket.try_acquire(now=10.0) == 0.0
    assert bucket.try_acquire(now=9.0) == pytest.approx(1.0)  # a stale `now` from a slow thread


def test_reconfigure_keeps_earned_tokens_capped_at_new_burst() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate_rps=1, burst=10, clock=clock)
    bucket.reconfigure(rate_rps=5, burst=2)
    assert bucket.tokens() == 2.0 and (bucket.rate_rps, bucket.burst) == (5.0, 2.0)
    bucket.admit(0.0), bucket.admit(0.0)
    assert bucket.try_acquire() == pytest.approx(0.2)
    with pytest.raises(ValueError, match="rate_rps must be > 0"):
        bucket.reconfigure(0, 1)


def test_thread_safe_exactly_burst_admitted_at_one_instant() -> None:
    bucket = TokenBucket(rate_rps=1, burst=50, clock=FakeClock())
    admitted: list[int] = []
    start = threading.Barrier(8)

    def worker() -> None:
        start.wait()
        admitted.append(sum(bucket.admit(0.0).admitted for _ in range(500)))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sum(admitted) == 50


# Tolerance on the meter's bound, in requests: float sums of waits drift by ~1e-15 s, and the bucket admits
# up to 1e-9 s early; 1e-6 of a token covers both for rates below 1000 req/s without loosening the bound.
TOL = 1e-6


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(0.1, 1000),
    burst=st.integers(1, 20),
    max_wait=st.floats(0, 2) | st.just(0.0),
    gaps=st.lists(st.floats(0, 0.5) | st.just(0.0), min_size=1, max_size=120),
)
def test_property_admitted_in_any_window_within_burst_plus_rate_T(
    rate: float, burst: int, max_wait: float, gaps: list[float]
) -> None:
    """For every admitted i <= j (by send time s = arrival + wait), the window [s_i, s_j] holds j-i+1 requests,
    and a token bucket meter allows at most burst + rate*(s_j - s_i) of them. No admitted request waits more
    than max_wait_s; refused ones are told a positive retry_after."""
    bucket = TokenBucket(rate, burst, clock=FakeClock())
    t = 0.0
    sent: list[float] = []
    for gap in gaps:
        t += gap
        a = bucket.admit(max_wait, now=t)
        if a.admitted:
            assert 0.0 <= a.wait_s <= max_wait
            sent.append(t + a.wait_s)
        else:
            assert a.retry_after_s > max_wait
    assert sent == sorted(sent)  # reservations keep arrival order
    for i in range(len(sent)):
        for j in range(i, len(sent)):
            assert j - i + 1 <= burst + rate * (sent[j] - sent[i]) + TOL
