"""A lean discrete-event engine in virtual time (ms).

Events live in one binary heap keyed by ``(time, priority, sequence)``: the earliest time first, then the
lower priority number, then the order in which they were scheduled (SimPy's rule), so a run is a
deterministic function of what was scheduled. Cancelling marks the heap entry dead instead of removing it
(lazy invalidation: O(1) now, skipped when popped), which keeps every operation O(log n).

Handlers are called as ``handler(time_ms, data)``; passing the time avoids an attribute read per event
on the hot path (``engine.now`` holds it too).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from heapq import heappop, heappush
from typing import Any

__all__ = ["Engine", "Handler", "PRIO_DEPARTURE", "PRIO_ARRIVAL", "PRIO_TIMER"]

Handler = Callable[[float, Any], None]
"""An event handler: called with the event's virtual time (ms) and the data it was scheduled with."""

# At equal times a departure frees the server before a simultaneous arrival looks at it, and an arrival
# joins its queue before a batching timer decides what to start (so the batch includes it).
PRIO_DEPARTURE = 0
PRIO_ARRIVAL = 1
PRIO_TIMER = 2

# Index of the handler inside a heap entry: cancel() clears it.
_HANDLER = 3


class Engine:
    """Event heap and virtual clock (ms).

    ``schedule`` returns the heap entry as the event's handle; ``cancel(handle)`` invalidates it.
    ``executed`` counts handlers actually run (cancelled events are not counted).
    """

    __slots__ = ("now", "executed", "_heap", "_seq")

    def __init__(self, start_ms: float = 0.0) -> None:
        self.now: float = start_ms
        self.executed: int = 0
        self._heap: list[list[Any]] = []
        self._seq = itertools.count()

    def schedule(self, time_ms: float, priority: int, handler: Handler, data: Any = None) -> list[Any]:
        """Run ``handler(time_ms, data)`` at virtual time ``time_ms`` (ms, absolute, >= now).

        Lower ``priority`` runs first among events at the same time; ties after that run in scheduling
        order. Returns a handle for ``cancel``. Raises ``ValueError`` for a time in the past or NaN.
        """
        if not time_ms >= self.now:
            raise ValueError(f"cannot schedule at {time_ms} ms: before now ({self.now} ms) or not a number")
        entry = [time_ms, priority, next(self._seq), handler, data]
        heappush(self._heap, entry)
        return entry

    def after(self, delay_ms: float, priority: int, handler: Handler, data: Any = None) -> list[Any]:
        """``schedule`` at ``now + delay_ms`` (ms, >= 0)."""
        return self.schedule(self.now + delay_ms, priority, handler, data)

    @staticmethod
    def cancel(handle: list[Any]) -> None:
        """Invalidate a scheduled event; cancelling twice or after it ran does nothing."""
        handle[_HANDLER] = None

    def peek(self) -> float:
        """Time (ms) of the next live event, ``inf`` when none is left."""
        heap = self._heap
        while heap and heap[0][_HANDLER] is None:
            heappop(heap)
        return heap[0][0] if heap else math.inf

    def clear(self) -> None:
        """Drop every scheduled event: a run that has seen what it needed ends when the handler returns."""
        self._heap.clear()

    def __len__(self) -> int:
        """Heap entries, cancelled ones included (they leave lazily)."""
        return len(self._heap)

    def run(self, until: float = math.inf) -> int:
        """Process events in order while their time is <= ``until`` (ms); returns how many ran.

        The clock stops at the last event run (or at ``until`` when it is finite and reached), so a later
        ``run`` continues where this one stopped.
        """
        heap = self._heap
        pop = heappop
        ran = 0
        while heap:
            entry = heap[0]
            t = entry[0]
            if t > until:
                break
            pop(heap)
            handler = entry[3]
            if handler is None:
                continue
            self.now = t
            handler(t, entry[4])
            ran += 1
        if until != math.inf and self.now < until and (not heap or heap[0][0] > until):
            self.now = until
        self.executed += ran
        return ran
