"""CPU use of other processes on this (shared) host, for the benchmarks that measure latency: how many
cores others used during a measurement, and a wait for a lull before one (Linux /proc/stat; elsewhere
nothing is known and nothing waits), and how such a benchmark prints its report (``print_report``). Units:
seconds, cores."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["host_busy_s", "own_cpu_s", "print_report", "wait_quiet"]


def host_busy_s() -> float | None:
    """CPU seconds all processes have been busy since boot (from /proc/stat; None where absent)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    total = sum(ticks[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    return (total - idle) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """CPU seconds used by this process (all its threads)."""
    t = os.times()
    return t.user + t.system


def wait_quiet(max_wait_s: float, threshold_cores: float = 0.25, window_s: float = 1.0) -> tuple[float, float | None]:
    """Wait (at most ``max_wait_s`` seconds) until other processes use less than ``threshold_cores`` CPU
    cores over two consecutive ``window_s`` windows; returns (seconds waited, their last usage in cores, or
    None where /proc/stat is unavailable). On a shared host this starts a measurement in a lull of the
    others' work instead of in the middle of it; it cannot keep them from starting meanwhile."""
    start = time.perf_counter()
    calm = 0
    usage: float | None = None
    while True:
        b0, o0, t0 = host_busy_s(), own_cpu_s(), time.perf_counter()
        if b0 is None or max_wait_s <= 0:
            return 0.0, None
        time.sleep(window_s)
        b1, o1, t1 = host_busy_s(), own_cpu_s(), time.perf_counter()
        usage = max(0.0, (b1 - b0) - (o1 - o0)) / (t1 - t0) if b1 is not None else None
        calm = calm + 1 if usage is not None and usage < threshold_cores else 0
        if calm >= 2 or time.perf_counter() - start >= max_wait_s:
            return time.perf_counter() - start, usage


def print_report(run: Callable[[], dict[str, Any]], json_only: bool) -> int:
    """Run a real-CPU benchmark (``run`` prints its tables and returns its figures): with ``json_only`` the
    tables go to stderr and the figures alone, as JSON, to stdout (the project's ``--json`` rule). Returns 0."""
    if not json_only:
        run()
        return 0
    with contextlib.redirect_stdout(sys.stderr):
        report = run()
    print(json.dumps(report))
    return 0


class OthersMeter:
    """The CPU the host's other processes use while a benchmark runs: started at construction, read with
    ``cores()`` (cores on average since then; None where /proc/stat cannot say)."""

    def __init__(self) -> None:
        self.busy0, self.own0, self.w0 = host_busy_s(), own_cpu_s(), time.perf_counter()

    def cores(self) -> float | None:
        busy1, own1, w1 = host_busy_s(), own_cpu_s(), time.perf_counter()
        if self.busy0 is None or busy1 is None or w1 <= self.w0:
            return None
        return max(0.0, (busy1 - self.busy0) - (own1 - self.own0)) / (w1 - self.w0)


def exit_unless_positive(ap: Any, script: str, values: list[tuple[str, float]]) -> None:
    """``ap.exit(2, ...)`` naming the first option whose value is not a finite number > 0 (the CLI rule)."""
    import math

    for name, value in values:
        if not (value > 0 and math.isfinite(value)):
            ap.exit(2, f"{script}: error: {name} must be a number > 0, got {value:g}\n")
