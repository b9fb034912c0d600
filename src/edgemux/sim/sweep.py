"""One sharing station without the event heap: a sweep over the arrivals in time order.

A device alone (no CPU stage before it) has only two kinds of events, arrivals (known in advance, sorted)
and its own next departure (one at a time). The event engine (``sim.engine`` with ``sim.devices``' stations)
pays a heap push, a pop and a cancelled entry per arrival for that; this sweep walks the arrivals and, before
each, lets every departure due by then happen. It is the same arithmetic as
:class:`~edgemux.sim.devices.LimitedPsStation` and :class:`~edgemux.sim.devices.GpuTimeshareStation`, in the
same order (a departure at the very time of an arrival goes first, as ``PRIO_DEPARTURE`` orders it), so the
two give identical departures (tests/test_sim_sweep.py checks it bit for bit) and the validation grid's
processor-sharing cases run several times faster. The stations stay the reference, and the only
implementation where stations chain (CPU stage, then device).

Times are ms.
"""

from __future__ import annotations

import math
from collections import deque
from heapq import heappop, heappush

import numpy as np


def limited_ps(arrival_ms: list[float], service_ms: list[float], capacity: float
               ) -> tuple[np.ndarray, list[float], list[float]]:
    """Limited processor sharing (rate ``min(1, c/n)`` each with n present; ``c = capacity``) fed requests
    arriving at ``arrival_ms`` (sorted) with work ``service_ms`` (ms at rate 1). Returns the departure time
    of each request and the busy periods' starts and ends (ms)."""
    if not (capacity > 0 and math.isfinite(capacity)):
        raise ValueError(f"processor-sharing capacity must be a finite number > 0, got {capacity}")
    c = float(capacity)
    n_req = len(arrival_ms)
    done = [math.nan] * n_req
    busy_s: list[float] = []
    busy_e: list[float] = []
    jobs: list[tuple[float, int]] = []  # (virtual finish, request)
    v = 0.0  # virtual time: attained service of a request present since V=0 (restarts each busy period)
    last = 0.0  # real time at which V was last brought up to date
    dep = math.inf  # real time of the next departure (inf when idle)
    for i in range(n_req + 1):
        t = arrival_ms[i] if i < n_req else math.inf
        while jobs and dep <= t:  # departures due by this arrival go first
            v, req = heappop(jobs)
            last = dep
            done[req] = dep
            if jobs:
                remaining = jobs[0][0] - v
                if remaining < 0.0:
                    remaining = 0.0
                n = len(jobs)
                dep = last + remaining / (c / n if n > c else 1.0)
            else:
                dep = math.inf
                busy_e.append(last)
        if i == n_req:
            break
        n = len(jobs)
        if n:
            v += (t - last) * (c / n if n > c else 1.0)
        else:
            v = 0.0
            busy_s.append(t)
        last = t
        heappush(jobs, (v + service_ms[i], i))
        remaining = jobs[0][0] - v
        if remaining < 0.0:
            remaining = 0.0
        n += 1
        dep = t + remaining / (c / n if n > c else 1.0)
    return np.array(done), busy_s, busy_e


def gpu_timeshare(arrival_ms: list[float], service_ms: list[float], app: list[int], n_apps: int
                  ) -> tuple[np.ndarray, list[float], list[float]]:
    """Embedded-GPU time sharing: FIFO within an app (``app[i]`` of each request), processor sharing across
    the apps with work (each head at rate 1/k). Same inputs and outputs as :func:`limited_ps`."""
    n_req = len(arrival_ms)
    done = [math.nan] * n_req
    busy_s: list[float] = []
    busy_e: list[float] = []
    waiting: list[deque[int]] = [deque() for _ in range(n_apps)]
    active = [False] * n_apps
    heads: list[tuple[float, int]] = []  # (virtual finish, request) of the active apps' heads
    v = 0.0
    last = 0.0
    dep = math.inf
    for i in range(n_req + 1):
        t = arrival_ms[i] if i < n_req else math.inf
        while heads and dep <= t:
            v, req = heappop(heads)
            last = dep
            a = app[req]
            queue = waiting[a]
            if queue:
                nxt = queue.popleft()
                heappush(heads, (v + service_ms[nxt], nxt))
            else:
                active[a] = False
            if heads:
                remaining = heads[0][0] - v
                if remaining < 0.0:
                    remaining = 0.0
                dep = last + remaining * len(heads)
            else:
                dep = math.inf
                busy_e.append(last)
            done[req] = last
        if i == n_req:
            break
        a = app[i]
        if active[a]:
            waiting[a].append(i)
            continue
        active[a] = True
        k = len(heads)
        if k:
            v += (t - last) / k
        else:
            v = 0.0
            busy_s.append(t)
        last = t
        heappush(heads, (v + service_ms[i], i))
        remaining = heads[0][0] - v
        if remaining < 0.0:
            remaining = 0.0
        dep = t + remaining * len(heads)
    return np.array(done), busy_s, busy_e
