"""Process-level settings of edgemux's long-running processes (agent, gateway, control plane, benchmarks).

``run`` / ``new_event_loop``: the serving processes run their asyncio code on uvloop (libuv) when it is
installed, as uvicorn does. On the agent's loopback path the gain is small (``benchmarks/
bench_agent_breakdown.py`` compares the two loops side by side: 1.1 % at p50 in one run); the benchmarks
print which loop they measured. Set ``EDGEMUX_EVENT_LOOP=asyncio`` to run on the standard library's loop
(uvloop missing: the same).

``tune_allocator``: the admission path works on numpy arrays of a few hundred kilobytes (every Edge TPU
candidate's lattice at once). glibc serves allocations above its mmap threshold (128 kB at start) with
fresh pages and returns them on free, so every such temporary pays its page faults again: measured on the
admission benchmark, a third of a slow decision. Raising the threshold (and the trim threshold with it)
keeps those pages in the heap for reuse, as ``MALLOC_MMAP_THRESHOLD_`` would. Only where the C library
is glibc; elsewhere nothing changes.

``space_full_collections``: a full garbage collection walks every object the process holds, ~40 ms for a
control plane with 10,000 apps, and with Python's default (one per 10 collections of the middle generation)
one came every ~25 applies of a large cluster (a decision's short-lived objects are promoted): the apply p99
of ``benchmarks/bench_scale.py``. Spaced to one per ``FULL_GC_EVERY`` middle collections; garbage without
cycles is freed at once either way. A process-wide setting, so the entry point sets it, not a library.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import ctypes.util
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from edgemux.errors import InputError

__all__ = ["FULL_GC_EVERY", "event_loop_name", "new_event_loop", "run", "space_full_collections", "tune_allocator"]

FULL_GC_EVERY = 100

T = TypeVar("T")

_M_TRIM_THRESHOLD = -1   # glibc's mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
_MMAP_BYTES = 64 << 20
_TRIM_BYTES = 128 << 20


def space_full_collections() -> None:
    """Full garbage collections at most once per ``FULL_GC_EVERY`` middle-generation collections (module doc)."""
    young, middle, full = gc.get_threshold()
    if 0 < full < FULL_GC_EVERY:
        gc.set_threshold(young, middle, FULL_GC_EVERY)


def tune_allocator() -> bool:
    """Raise glibc's mmap threshold to 64 MiB and its trim threshold to 128 MiB for this process; True when
    applied (glibc found and both calls accepted), False elsewhere."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_BYTES))


def _factory() -> tuple[str, Callable[[], asyncio.AbstractEventLoop]]:
    """(name, loop factory) per ``EDGEMUX_EVENT_LOOP``: unset or empty (uvloop when installed, else
    asyncio), ``uvloop`` (required) or ``asyncio``; anything else is an ``InputError``."""
    raw = os.environ.get("EDGEMUX_EVENT_LOOP", "")
    want = raw.strip().lower()
    if want not in ("", "uvloop", "asyncio"):
        raise InputError("EDGEMUX_EVENT_LOOP", f"expected 'uvloop', 'asyncio' or unset, got {raw!r}")
    if want != "asyncio":
        try:
            import uvloop
        except ImportError:
            if want == "uvloop":
                raise InputError("EDGEMUX_EVENT_LOOP", "'uvloop' asked for, but uvloop is not installed") from None
        else:
            return f"uvloop {uvloop.__version__}", uvloop.new_event_loop
    return "asyncio", asyncio.new_event_loop


def event_loop_name() -> str:
    """Which event loop ``run`` and ``new_event_loop`` give: ``"uvloop X.Y"`` or ``"asyncio"``."""
    return _factory()[0]


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's when installed (and not turned off), else the standard library's."""
    return _factory()[1]()


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the loop ``new_event_loop`` makes."""
    try:
        factory = _factory()[1]
    except InputError:
        main.close()  # never run: close it, or Python warns that it was never awaited
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
