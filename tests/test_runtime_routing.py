"""Smooth weighted round robin with failover: exact proportions, interleaving, cooldowns on a fake clock
(seconds), republished weights, and the deviation bound over any number of picks."""

from __future__ import annotations

import math
import threading
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgemux.cluster.state import Placement, Share
from edgemux.runtime.ingress.routing import Endpoint, NoEndpointError, WeightedRouter

A, B, C = Endpoint("node-1/tpu0", "http://n1:8000"), Endpoint("node-2/gpu0", "http://n2:8000"), Endpoint("node-3/cpu")


class FakeClock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _picks(router: WeightedRouter, n: int, **kw) -> list[Endpoint]:
    return [router.pick(**kw) for _ in range(n)]


def _longest_run(seq: list[Endpoint]) -> int:
    run = best = 1
    for prev, cur in zip(seq, seq[1:]):
        run = run + 1 if cur == prev else 1
        best = max(best, run)
    return best


def test_exact_proportions_over_every_cycle_of_integer_weights() -> None:
    router = WeightedRouter("cam", {A: 5, B: 1, C: 1}, clock=FakeClock())
    for _ in range(20):  # twenty whole cycles of 7 picks
        assert Counter(_picks(router, 7)) == {A: 5, B: 1, C: 1}


def test_nginx_smooth_sequence() -> None:
    """nginx's documented example: weights 5, 1, 1 give a a b a c a a, not a a a a a b c."""
    router = WeightedRouter("cam", [(A, 5), (B, 1), (C, 1)], clock=FakeClock())
    assert _picks(router, 7) == [A, A, B, A, C, A, A]


def test_float_partition_weights_from_a_placement() -> None:
    placement = Placement("cam", (Share("node-1/tpu0", 0.6, "p"), Share("node-2/gpu0", 0.4, "p")))
    router = WeightedRouter.from_placement(placement, urls={"node-1/tpu0": "http://n1:8000"}, clock=FakeClock())
    assert router.weights == {Endpoint("node-1/tpu0", "http://n1:8000"): 0.6, Endpoint("node-2/gpu0"): 0.4}
    seq = _picks(router, 1000)
    counts = Counter(e.device for e in seq)
    assert counts == {"node-1/tpu0": 600, "node-2/gpu0": 400}
    for k in range(5, 1001, 5):  # within one pick of the share after every cycle of five
        assert abs(Counter(e.device for e in seq[:k])["node-1/tpu0"] - 0.6 * k) < 1
    assert _longest_run(seq) == 2  # a b a a b ...


def test_equal_weights_strictly_alternate() -> None:
    router = WeightedRouter("cam", {A: 0.25, B: 0.25, C: 0.25}, clock=FakeClock())
    assert _picks(router, 9) == [A, B, C] * 3


def test_zero_weight_endpoint_gets_nothing() -> None:
    router = WeightedRouter("cam", {A: 1, B: 0}, clock=FakeClock())
    assert set(_picks(router, 10)) == {A}


def test_failover_skips_down_endpoint_until_cooldown_ends() -> None:
    clock = FakeClock()
    router = WeightedRouter("cam", {A: 0.5, B: 0.5}, clock=clock, cooldown_s=2.0)
    router.mark_down(A)  # default: now + cooldown_s
    assert router.is_down(A) and not router.is_down(B)
    assert set(_picks(router, 10)) == {B}
    clock.t = 1.999
    assert router.pick() == B
    clock.t = 2.0  # cooldown over: A is tried again
    assert not router.is_down(A)
    assert Counter(_picks(router, 10)) == {A: 5, B: 5}


def test_mark_down_until_and_mark_up() -> None:
    clock = FakeClock(100.0)
    router = WeightedRouter("cam", {A: 1, B: 1, C: 2}, clock=clock)
    router.mark_down(C, until=130.0)
    assert Counter(_picks(router, 10)) == {A: 5, B: 5}  # C's share goes to the others in proportion
    router.mark_up(C)
    assert Counter(_picks(router, 40)) == {A: 10, B: 10, C: 20}


def test_retry_excludes_the_endpoint_that_failed() -> None:
    router = WeightedRouter("cam", {A: 0.9, B: 0.1}, clock=FakeClock())
    first = router.pick()
    assert first == A
    assert router.pick(exclude=frozenset({first})) == B


def test_no_endpoint_error_names_the_app_and_when_to_retry() -> None:
    clock = FakeClock()
    router = WeightedRouter("cam", {A: 1, B: 1, C: 0}, clock=clock)
    router.mark_down(A, until=3.0)
    router.mark_down(B, until=7.5)
    with pytest.raises(NoEndpointError) as e:
        router.pick()
    assert e.value.app == "cam" and e.value.retry_after_s == pytest.approx(3.0)
    assert str(e.value) == (
        "app 'cam': no endpoint available (down: node-1/tpu0 for 3 s, node-2/gpu0 for 7.5 s; weight 0: node-3/cpu)"
    )
    router.mark_up(B)
    with pytest.raises(NoEndpointError, match=r"excluded: node-2/gpu0") as e2:
        router.pick(exclude=frozenset({B}))
    assert e2.value.retry_after_s == pytest.approx(3.0)
    clock.t = 3.0
    assert router.pick(exclude=frozenset({B})) == A


def test_update_weights_in_place_keeps_working() -> None:
    clock = FakeClock()
    router = WeightedRouter("cam", {A: 0.6, B: 0.4}, clock=clock)
    _picks(router, 3)  # mid-cycle
    router.mark_down(B, until=50.0)
    router.update({A: 0.2, B: 0.3, C: 0.5})  # a migration republished the routes
    assert router.is_down(B)  # a down mark survives republishing
    router.mark_up(B)
    assert Counter(_picks(router, 1000)) == {A: 200, B: 300, C: 500}
    router.update([(C, 1.0)])  # A and B drained away
    assert set(_picks(router, 5)) == {C}
    with pytest.raises(ValueError, match="app 'cam' has no endpoint 'node-1/tpu0'"):
        router.mark_down(A)


@pytest.mark.parametrize(
    "weights, message",
    [
        ({}, "app 'cam': routes need at least one endpoint"),
        ({A: -0.1}, "weight of endpoint 'node-1/tpu0' must be a finite number >= 0, got -0.1"),
        ({A: math.nan}, "must be a finite number >= 0, got nan"),
        ({A: math.inf}, "must be a finite number >= 0, got inf"),
        ({A: "1"}, "must be a finite number >= 0, got '1'"),
        ({A: 0, B: 0.0}, "at least one endpoint needs a positive weight"),
        ([(A, 1), (A, 2)], "endpoint 'node-1/tpu0' appears twice"),
        ([("node-1/tpu0", 1)], "endpoints must be Endpoint"),
    ],
)
def test_weights_are_validated(weights, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        WeightedRouter("cam", weights, clock=FakeClock())


def test_thread_safe_counts_exact_under_concurrency() -> None:
    router = WeightedRouter("cam", {A: 3, B: 1}, clock=FakeClock())
    seen: list[Endpoint] = []
    lock = threading.Lock()

    def worker() -> None:
        got = _picks(router, 1000)
        with lock:
            seen.extend(got)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert Counter(seen) == {A: 3000, B: 1000}


# Bounds on |count_i - n * share_i| after n picks. Over-serving is below 1 pick (proof: only the endpoint with
# the largest current weight, which is >= total/N > 0, pays the total, so current weights stay above -total).
# Under-serving has no tight closed form; a search over <= 8 endpoints found at most 1.16 picks: 2 is the bound.
OVER_BOUND, UNDER_BOUND = 1.0, 2.0


@settings(max_examples=150, deadline=None)
@given(
    weights=st.lists(st.floats(0, 100) | st.integers(0, 20).map(float), min_size=1, max_size=8).filter(
        lambda ws: sum(ws) > 0
    ),
    n=st.integers(1, 300),
)
def test_property_counts_stay_close_to_weight_shares(weights: list[float], n: int) -> None:
    endpoints = [Endpoint(f"node-{i}/dev") for i in range(len(weights))]
    router = WeightedRouter("cam", list(zip(endpoints, weights)), clock=FakeClock())
    total = sum(weights)
    counts = Counter()
    for k in range(1, n + 1):
        counts[router.pick()] += 1
        for e, w in zip(endpoints, weights):
            deviation = counts[e] - k * w / total
            assert -UNDER_BOUND < deviation < OVER_BOUND + 1e-9
            if w == 0:
                assert counts[e] == 0
