"""The token bucket's pure arithmetic (``adapt.police.Bucket``), which the runtime's ``TokenBucket`` and the
cluster simulator share: refill, the burst cap, reservations, refusal without consuming, reconfiguration,
and arguments checked with messages that name them. Times in s."""

from __future__ import annotations

import math

import pytest

from edgemux.adapt.police import Admission, Bucket


def test_starts_full_and_refills_at_rate_up_to_burst() -> None:
    b = Bucket.full(2.0, 3.0, now_s=10.0)
    assert (b.rate_rps, b.burst, b.tokens, b.last_s) == (2.0, 3.0, 3.0, 10.0)
    _, b = b.acquire(10.0)
    _, b = b.acquire(10.0)
    assert b.tokens == 1.0
    assert b.refilled(10.5).tokens == 2.0  # 0.5 s x 2 tokens/s
    assert b.refilled(3600.0).tokens == 3.0  # capped at the burst
    assert b.refilled(9.0) is b  # a stale time earns nothing


def test_values_are_immutable_each_call_returns_a_new_bucket() -> None:
    b = Bucket.full(1.0, 1.0, 0.0)
    wait, after = b.acquire(0.0)
    assert wait == 0.0 and b.tokens == 1.0 and after.tokens == 0.0
    with pytest.raises(AttributeError):
        b.tokens = 5.0  # type: ignore[misc]


def test_derived_buckets_are_the_buckets_the_constructor_makes() -> None:
    """admit, acquire and refilled make their buckets without checking them again (valid by construction):
    each equals, hashes and reads like the constructor's, stays immutable, and a clock that is not finite is
    still refused."""
    b = Bucket.full(2.0, 3.0, 10.0)
    made = [b.admit(10.0, 1.0)[1], b.acquire(11.0)[1], b.acquire(10.0)[1].refilled(10.25)]
    built = [Bucket(2.0, 3.0, 2.0, 10.0), Bucket(2.0, 3.0, 2.0, 11.0), Bucket(2.0, 3.0, 2.5, 10.25)]
    assert made == built and [hash(m) for m in made] == [hash(c) for c in built]
    assert [repr(m) for m in made] == [repr(c) for c in built]
    with pytest.raises(AttributeError):
        made[0].tokens = 5.0  # type: ignore[misc]
    for bad in (math.inf, math.nan):
        with pytest.raises(ValueError, match="last_s must be a finite time"):
            b.admit(bad, 1.0)


def test_reservations_wait_in_arrival_order() -> None:
    b = Bucket.full(2.0, 3.0, 0.0)
    waits = []
    for _ in range(6):
        w, b = b.acquire(0.0)
        waits.append(w)
    assert waits == [0.0, 0.0, 0.0, 0.5, 1.0, 1.5] and b.tokens == -3.0
    w, _ = b.acquire(1.5)  # the three waiters have been served: the next waits a whole token
    assert w == pytest.approx(0.5)


def test_admit_waits_within_max_wait_and_refuses_without_consuming() -> None:
    b = Bucket.full(4.0, 1.0, 0.0)
    a, b = b.admit(0.0, 0.0)
    assert a == Admission(True, 0.0, 0.0)
    a, b = b.admit(0.0, 0.3)
    assert a.admitted and a.wait_s == pytest.approx(0.25) and b.tokens == -1.0
    level = b.tokens
    for _ in range(50):  # a storm of refusals leaves the level where it was
        a, b = b.admit(0.0, 0.3)
        assert not a.admitted and a.retry_after_s == pytest.approx(0.5)
    assert b.tokens == level
    a, _ = b.admit(0.5, 0.0)  # the token the refused ones did not take is there on time
    assert a == Admission(True, 0.0, 0.0)


def test_a_steady_stream_at_the_rate_never_waits() -> None:
    b = Bucket.full(25.0, 1.0, 0.0)
    for k in range(1000):
        a, b = b.admit(k / 25.0, 0.0)
        assert a == Admission(True, 0.0, 0.0)


def test_reconfigure_settles_the_old_rate_keeps_tokens_capped_and_reservations_owed() -> None:
    b = Bucket.full(1.0, 10.0, 0.0)
    for _ in range(10):
        _, b = b.acquire(0.0)
    r = b.reconfigured(5.0, 2.0, now_s=1.0)  # one token earned at the old rate by 1 s
    assert (r.rate_rps, r.burst, r.tokens, r.last_s) == (5.0, 2.0, 1.0, 1.0)
    full = Bucket.full(1.0, 10.0, 0.0).reconfigured(5.0, 2.0, 0.0)
    assert full.tokens == 2.0  # capped at the new burst
    owed = Bucket.full(1.0, 1.0, 0.0).acquire(0.0)[1].acquire(0.0)[1].reconfigured(2.0, 4.0, 0.0)
    assert owed.tokens == -1.0 and owed.acquire(0.0)[0] == pytest.approx(1.0)  # (1 - -1) / 2 tokens/s


@pytest.mark.parametrize("rate, burst, message", [
    (0, 1, "rate_rps must be > 0 requests per second, got 0"),
    (math.nan, 1, "rate_rps must be finite, got nan"),
    ("3", 1, "rate_rps must be a number, got '3'"),
    (1, 0.5, "burst must be >= 1 request"),
    (1, math.inf, "burst must be finite, got inf"),
    (1, True, "burst must be a number, got True"),
])
def test_bad_contracts_name_the_argument(rate: object, burst: object, message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        Bucket.full(rate, burst, 0.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        Bucket.full(1.0, 1.0, 0.0).reconfigured(rate, burst, 0.0)  # type: ignore[arg-type]


def test_bad_levels_times_and_waits_name_the_argument() -> None:
    with pytest.raises(ValueError, match="tokens must be finite and <= burst"):
        Bucket(1.0, 2.0, 3.0, 0.0)
    with pytest.raises(ValueError, match="last_s must be a finite time"):
        Bucket(1.0, 2.0, 1.0, math.inf)
    for bad in (-0.1, math.nan):
        with pytest.raises(ValueError, match="max_wait_s must be >= 0 seconds"):
            Bucket.full(1.0, 1.0, 0.0).admit(0.0, bad)
