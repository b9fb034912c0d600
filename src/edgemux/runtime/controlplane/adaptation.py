"""The control plane's side of adaptation: observations in, windows out, and the record of what was done.

The decisions are ``edgemux.adapt``'s (pure); this module keeps what they need between windows on the
running cluster and what an operator reads afterwards:

- :class:`Observer`: agents (in every heartbeat) and gateways (``GET /v1/observations``) report cumulative
  counts per app; two reports of one process subtract to what happened between them, which is added to
  the window that is open. A window closes into ``adapt.monitor.AppWindow``\\ s. A request is counted once,
  where it entered the cluster: by the gateway that policed it (what clients send and the latency they get,
  end to end, policing refusals included), or by the agent a client called directly (an agent does not
  count what a gateway forwards it). An app's window is therefore the sum of every gateway's and every
  agent's view. The first report of a process the control plane has not heard before is a baseline only
  (after a control-plane restart the counts since the process started are not this window's); a new
  incarnation of a known process (it restarted) counts from zero.
- The profiles' service-time moments, from the latest report of each agent, merged: what calibration reads.
- :class:`Event`: every action and finding acted on, with its reason, kept in a bounded log
  (``GET /v1/events``, ``edgemux get events``) and written to the control plane's log.

Units: ``*_s`` seconds (control-plane clock for windows, Unix time for events), ``*_ms`` milliseconds.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from edgemux.adapt.calibrate import Observed
from edgemux.adapt.monitor import AppCounters, AppWindow
from edgemux.runtime.messages import Observations, number, obj, text

__all__ = ["EVENT_KINDS", "Event", "EventLog", "Observer"]

logger = logging.getLogger("edgemux.controlplane")

EVENT_KINDS = ("finding", "move-planned", "moved", "contract", "repartitioned", "reshared", "move-failed",
               "move-refused", "unexplained", "calibrated", "power")
MAX_EVENTS = 1000  # the log keeps the latest; the control plane's log file keeps them all


class Observer:
    """Windows from cumulative reports (see the module docstring)."""

    def __init__(self) -> None:
        self._last: dict[str, Observations] = {}  # source -> its latest report
        self._open: dict[str, AppCounters] = {}  # app -> what the open window counted of it

    def report(self, source: str, obs: Observations, *, gateway: bool) -> None:
        """Add what ``source`` (``agent:<node>`` or ``gateway:<url>``; ``gateway`` says which) counted since
        its previous report. Both kinds add to the same window: they count disjoint requests."""
        last = self._last.get(source)
        self._last[source] = obs
        if last is None:
            return  # a baseline: what it counted before we heard from it is not this window's
        same = last.incarnation == obs.incarnation
        into = self._open
        for app, now in obs.apps.items():
            before = last.apps.get(app) if same else None
            try:
                delta = now.minus(before) if before is not None else now
            except ValueError:  # a count went down: not the same counting any more; take it from zero
                delta = now
            into[app] = into[app].merge(delta) if app in into else delta

    def forget(self, source: str) -> None:
        """A source that left (an agent deregistered): its latest moments no longer count."""
        self._last.pop(source, None)

    def close(self, apps: Iterable[str], start_s: float, end_s: float) -> dict[str, AppWindow]:
        """The windows ``[start_s, end_s)`` of ``apps`` that had requests, and a new empty window opens."""
        out: dict[str, AppWindow] = {}
        for app in apps:
            counts = self._open.get(app)
            if counts is not None and counts.arrivals > 0:
                out[app] = counts.window(app, start_s, end_s)
        self._open = {}
        return out

    def profiles(self) -> dict[str, Observed]:
        """Per profile, the service-time moments of every agent's latest report, merged."""
        out: dict[str, Observed] = {}
        for source, obs in self._last.items():
            for name, o in obs.profiles.items():
                out[name] = out[name].merge(o) if name in out else o
        return out


@dataclass(frozen=True)
class Event:
    """One thing the adapt loop saw or did: ``seq`` (increasing), ``time_s`` (Unix s), ``kind`` (one of
    ``EVENT_KINDS``), the ``app`` concerned (None for a node's or a profile's: ``power``, ``calibrated``), a
    one-line ``message``, and the reason and figures as ``data`` (a finding's JSON, a rejection, a move's
    step durations...)."""

    seq: int
    time_s: float
    kind: str
    app: str | None
    message: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "time_s": self.time_s, "kind": self.kind, "app": self.app,
                "message": self.message, "data": self.data}

    @classmethod
    def from_json(cls, doc: Any, where: str = "event") -> Event:
        d = obj(doc, where)
        seq = number(d, "seq", where)
        data = d.get("data", {})
        return cls(int(seq), number(d, "time_s", where), text(d, "kind", where), text(d, "app", where, None),
                   text(d, "message", where), dict(obj(data, f"{where}.data")))


class EventLog:
    """The latest ``MAX_EVENTS`` events, each also logged (``edgemux.controlplane``) as it is added."""

    def __init__(self, wall: Any = time.time) -> None:
        self._events: deque[Event] = deque(maxlen=MAX_EVENTS)
        self._seq = 0
        self._wall = wall

    def add(self, kind: str, app: str | None, message: str, data: dict[str, Any] | None = None) -> Event:
        """Record (and log) one event; ``data`` holds its reason and figures as JSON values."""
        assert kind in EVENT_KINDS, kind
        self._seq += 1
        ev = Event(self._seq, self._wall(), kind, app, message, dict(data or {}))
        self._events.append(ev)
        level = logging.WARNING if kind in ("move-failed", "move-refused", "unexplained") or "error" in (data or {}) \
            else logging.INFO
        logger.log(level, "adapt %s%s: %s", kind, f" {app}" if app else "", message)
        return ev

    def since(self, seq: int = 0, app: str | None = None) -> list[Event]:
        """Events after ``seq``, of ``app`` when given, oldest first."""
        return [e for e in self._events if e.seq > seq and (app is None or e.app == app)]
