"""The event engine: ordering by (time, priority, sequence), lazy cancellation, run(until)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgemux.sim.engine import PRIO_ARRIVAL, Engine


def test_order_time_then_priority_then_sequence() -> None:
    eng = Engine()
    seen: list[str] = []

    def h(t: float, tag: str) -> None:
        seen.append(tag)

    eng.schedule(2.0, 0, h, "t2")
    eng.schedule(1.0, 5, h, "t1-p5")
    eng.schedule(1.0, 0, h, "t1-p0-first")
    eng.schedule(1.0, 0, h, "t1-p0-second")
    assert eng.run() == 4
    assert seen == ["t1-p0-first", "t1-p0-second", "t1-p5", "t2"]
    assert eng.now == 2.0 and eng.executed == 4


def test_cancel_is_lazy_and_not_counted() -> None:
    eng = Engine()
    seen: list[int] = []
    a = eng.schedule(1.0, 0, lambda t, d: seen.append(d), 1)
    eng.schedule(2.0, 0, lambda t, d: seen.append(d), 2)
    eng.cancel(a)
    eng.cancel(a)
    assert len(eng) == 2  # still in the heap until popped
    assert eng.peek() == 2.0
    assert eng.run() == 1 and seen == [2]


def test_handlers_can_schedule_and_run_until_stops() -> None:
    eng = Engine()
    times: list[float] = []

    def tick(t: float, _: object) -> None:
        times.append(t)
        eng.after(1.5, 0, tick)

    eng.schedule(0.0, 0, tick)
    eng.run(until=5.0)
    assert times == [0.0, 1.5, 3.0, 4.5]
    assert eng.now == 5.0
    eng.run(until=6.0)
    assert times[-1] == 6.0


def test_scheduling_in_the_past_or_nan_raises() -> None:
    eng = Engine()
    eng.schedule(3.0, 0, lambda t, d: None)
    eng.run()
    with pytest.raises(ValueError, match="before now"):
        eng.schedule(2.0, 0, lambda t, d: None)
    with pytest.raises(ValueError):
        eng.schedule(math.nan, 0, lambda t, d: None)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 3), st.booleans()), max_size=60))
def test_matches_sorted_order(events: list[tuple[int, int, bool]]) -> None:
    """Whatever is scheduled, live events run exactly in sorted (time, priority, sequence) order."""
    eng = Engine()
    seen: list[int] = []
    for k, (t, p, cancel) in enumerate(events):
        h = eng.schedule(float(t), p, lambda now, d: seen.append(d), k)
        if cancel:
            eng.cancel(h)
    eng.run()
    expect = [k for k, (t, p, c) in sorted(enumerate(events), key=lambda e: (e[1][0], e[1][1], e[0])) if not c]
    assert seen == expect


def test_clear_drops_every_scheduled_event_and_ends_the_run() -> None:
    eng = Engine()
    seen: list[float] = []

    def stop(t: float, _: object) -> None:
        seen.append(t)
        eng.clear()

    eng.schedule(1.0, PRIO_ARRIVAL, lambda t, _: seen.append(t))
    eng.schedule(2.0, PRIO_ARRIVAL, stop)
    eng.schedule(3.0, PRIO_ARRIVAL, lambda t, _: seen.append(t))
    assert eng.run() == 2 and seen == [1.0, 2.0] and len(eng) == 0 and eng.peek() == math.inf
