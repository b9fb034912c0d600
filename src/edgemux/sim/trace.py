"""The cluster simulator's input: a trace of apps that arrive, leave, change their sending rate or are
re-placed by an offline plan, and of nodes that fail; and its checks (a malformed trace is a ``ValueError``
naming the event). Times in seconds, rates in req/s. See ``sim.cluster``."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from edgemux.cluster.state import App, Placement

__all__ = ["Arrive", "Fail", "Leave", "Place", "Rate", "TraceEvent", "check_trace"]


@dataclass(frozen=True)
class Arrive:
    """``app`` asks for admission at ``time_s`` (s); its contract ``app.rate_rps`` is also the rate it sends
    at until a :class:`Rate` event. With ``placement`` the app is placed there without asking the policy
    (an offline plan, e.g. an oracle's, decided it)."""

    time_s: float
    app: App
    placement: Placement | None = None


@dataclass(frozen=True)
class Leave:
    """App ``app_name`` stops sending at ``time_s`` (s) and frees its placement."""

    time_s: float
    app_name: str


@dataclass(frozen=True)
class Rate:
    """From ``time_s`` (s) on, app ``app_name`` actually sends ``rate_rps`` requests per second (0: silent),
    whatever its contract."""

    time_s: float
    app_name: str
    rate_rps: float


@dataclass(frozen=True)
class Place:
    """At ``time_s`` (s) app ``app_name`` is served at ``placement`` with ``rate_rps`` its contract (req/s),
    at once: an offline plan's re-placement (the oracle's), which pays no model load and asks no policy."""

    time_s: float
    app_name: str
    placement: Placement
    rate_rps: float


@dataclass(frozen=True)
class Fail:
    """Node ``node`` fails at ``time_s`` (s), for the rest of the run: its agent stops reporting (the controller
    finds it ``agent-dead`` ``dead_after_s`` later and evacuates its apps) and its devices and CPU stages serve
    nothing from then on: the requests there are lost, and so is every request routed there afterwards
    (``sim.cluster``'s module doc)."""

    time_s: float
    node: str


TraceEvent = Arrive | Leave | Rate | Place | Fail


def check_trace(trace: Sequence[TraceEvent], horizon_s: float, nodes: Collection[str]) -> None:
    """``ValueError`` naming the first bad event unless the events are sorted, within [0, ``horizon_s``] (s),
    each app arriving once and named by Rate/Leave/Place only while present, and each :class:`Fail` names one
    of ``nodes`` that has not failed already."""
    present: set[str] = set()
    seen: set[str] = set()
    failed: set[str] = set()
    last = 0.0
    for i, ev in enumerate(trace):
        where = f"trace[{i}]"
        if not isinstance(ev, (Arrive, Leave, Rate, Place, Fail)):
            raise ValueError(f"{where}: expected Arrive, Leave, Rate, Place or Fail, got {type(ev).__name__}")
        where = f"trace[{i}] ({type(ev).__name__} at {ev.time_s!r} s)"
        if not (isinstance(ev.time_s, (int, float)) and math.isfinite(ev.time_s) and 0 <= ev.time_s <= horizon_s):
            raise ValueError(f"{where}: time_s must be within [0, horizon_s={horizon_s:g}] s")
        if ev.time_s < last:
            raise ValueError(f"{where}: events out of order (after an event at {last:g} s)")
        last = ev.time_s
        if isinstance(ev, Fail):
            if ev.node not in nodes:
                raise ValueError(f"{where}: unknown node {ev.node!r} (the cluster has {', '.join(sorted(nodes))})")
            if ev.node in failed:
                raise ValueError(f"{where}: node {ev.node!r} fails twice (a failed node stays failed)")
            failed.add(ev.node)
            continue
        if isinstance(ev, Arrive):
            if ev.app.name in seen:
                raise ValueError(f"{where}: app {ev.app.name!r} arrives twice (app names must be unique in a trace)")
            seen.add(ev.app.name)
            present.add(ev.app.name)
            if ev.placement is not None and ev.placement.app != ev.app.name:
                raise ValueError(f"{where}: the placement is for app {ev.placement.app!r}, not {ev.app.name!r}")
            continue
        if ev.app_name not in present:
            state = "has left" if ev.app_name in seen else "never arrived"
            raise ValueError(f"{where}: unknown app {ev.app_name!r} ({state} before this event)")
        if isinstance(ev, Leave):
            present.discard(ev.app_name)
        elif isinstance(ev, Place):
            if ev.placement.app != ev.app_name:
                raise ValueError(f"{where}: the placement is for app {ev.placement.app!r}, not {ev.app_name!r}")
            if not (isinstance(ev.rate_rps, (int, float)) and math.isfinite(ev.rate_rps) and ev.rate_rps > 0):
                raise ValueError(f"{where}: rate_rps must be a finite number > 0 req/s, got {ev.rate_rps!r}")
        elif not (isinstance(ev.rate_rps, (int, float)) and math.isfinite(ev.rate_rps) and ev.rate_rps >= 0):
            raise ValueError(f"{where}: rate_rps must be a finite number >= 0 req/s, got {ev.rate_rps!r}")
