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

- :class:`AdaptationManager`: the adaptation manager of the controller loop. Every window (``adapt.window_s``;
  5 s when adaptation is off, for ``describe``) it reads the gateways' observations, closes the window and,
  with adaptation on, runs one adapt step: re-calibrate the profiles from what the agents measured, let the
  power manager see which waking nodes serve now, gather the cycle's inputs in one place
  (:class:`CycleInputs`), run ``adapt.loop.step`` on them, record its findings, refusals and planned
  transitions as events and carry each transition out (make before break, through the transitions manager).
  What the step hands on (:class:`WindowOutcome`) is what the power manager's consolidation step reads, in the
  same pass of the controller loop.

Units: ``*_s`` seconds (control-plane clock for windows, Unix time for events), ``*_ms`` milliseconds.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgemux.adapt.calibrate import Observed, calibrated_catalog
from edgemux.adapt.loop import AdaptState, step
from edgemux.adapt.monitor import AppCounters, AppWindow
from edgemux.adapt.plan import Transition, transition_kind
from edgemux.adapt.settings import AdaptSettings
from edgemux.cluster.state import Placement
from edgemux.policies import Snapshot
from edgemux.profiles.catalog import Catalog
from edgemux.runtime.controlplane.common import ControlPlaneError, shares_text
from edgemux.runtime.messages import Observations, number, obj, text

if TYPE_CHECKING:
    from edgemux.runtime.controlplane.service import ControlPlane

__all__ = ["EVENT_KINDS", "AdaptationManager", "CycleInputs", "Event", "EventLog", "Observer", "WindowOutcome"]

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


# ------------------------------------------------------------------------------------------- the manager


@dataclass(frozen=True)
class CycleInputs:
    """Everything one adapt step reads, gathered at one instant (``AdaptationManager.gather``): the time
    ``now_s`` (control-plane clock), the store's ``snapshot`` (every node) and the ``live`` one (the nodes that
    are on), the closed ``windows`` of every app and the ``movable`` ones (apps no move holds), each live node's
    agent's last heartbeat (``last_seen_s``), the declared contracts (req/s), the apps a move holds (``busy``)
    and the ``settings``."""

    now_s: float
    snapshot: Snapshot
    live: Snapshot
    windows: dict[str, AppWindow]
    movable: dict[str, AppWindow]
    last_seen_s: dict[str, float]
    declared: dict[str, float]
    busy: frozenset[str]
    settings: AdaptSettings


@dataclass(frozen=True)
class WindowOutcome:
    """What a window's adapt step hands to the consolidation step: its ``inputs``, the apps it is ``moved``
    and whether it ``refused`` a move for want of room (a switched-off node may have it)."""

    inputs: CycleInputs
    moved: frozenset[str]
    refused: bool

    @property
    def snapshot(self) -> Snapshot:
        return self.inputs.snapshot

    @property
    def windows(self) -> dict[str, AppWindow]:
        return self.inputs.windows


class AdaptationManager:
    """Observations into windows, one adapt step per window, events (module doc), for the controller ``cp``.
    ``settings`` None: adaptation is off (windows still close, for ``describe``); ``catalog``: the profiles
    calibration starts from."""

    def __init__(self, cp: ControlPlane, settings: AdaptSettings | None, catalog: Catalog) -> None:
        self.cp = cp
        self.settings = settings
        self.base_catalog = catalog  # what calibration starts from
        self.catalog = catalog       # the profiles in force: the base, calibrated by what the agents measured
        self.observer = Observer()
        self.state = AdaptState()
        self.windows: dict[str, AppWindow] = {}  # the last closed window of each app that had requests
        self.pending: set[str] = set()  # apps a planned move is under way for
        self._window_start: float | None = None
        self._acted: set[tuple[str, str]] = set()  # keys of the findings acted on in the last window
        self._refused: set[tuple[str, tuple[str, str], str]] = set()  # the last step's refusals
        # the clock of the windows' cadence (s): the event loop's, as the controller loop's period (a test may
        # set another); the windows themselves are measured on cp.clock
        self.timer: Callable[[], float] = lambda: asyncio.get_running_loop().time()
        self._due_s = math.inf   # timer's time (s) when the next window closes
        self._reading = False    # the gateways' observations of a due window are being read
        self._ready = False      # ... and have been: the next pass closes the window
        self._outcome: WindowOutcome | None = None

    @property
    def window_s(self) -> float:
        """The window's length (s)."""
        return (self.settings or AdaptSettings()).window_s

    def start(self) -> None:
        """The first window opens now."""
        self._window_start = self.cp.clock()
        self._due_s = self.timer() + self.window_s

    # -- the controller loop's pass ----------------------------------------------------------------------

    def due_in_s(self) -> float:
        """Seconds until this manager's next pass has work (the controller loop waits no longer)."""
        if self._ready:
            return 0.0
        if self._reading:
            return math.inf  # the read wakes the loop when it is done
        return max(0.0, self._due_s - self.timer())

    def update(self) -> None:
        """One pass: when a window is due, read the gateways' observations (in the background; the read wakes
        the loop); once they are in, close the window and step (``step``), leaving the outcome to the power
        manager's update of the same pass."""
        if self._ready:
            self._ready = False
            try:
                self._outcome = self.step()
            finally:
                self._due_s = self.timer() + self.window_s
        elif not self._reading and self.timer() >= self._due_s:
            self._reading = True
            self.cp.spawn(self._read_window())

    async def _read_window(self) -> None:
        try:
            await self.observe_gateways()
        except asyncio.CancelledError:
            raise
        except Exception:  # never let one bad window stop the windows
            logger.exception("adapt window failed")
            self._due_s = self.timer() + self.window_s
        else:
            self._ready = True
            self.cp.wake()
        finally:
            self._reading = False

    def take_outcome(self) -> WindowOutcome | None:
        """What this pass's step handed on (None: no step ran); taken once."""
        outcome, self._outcome = self._outcome, None
        return outcome

    async def observe_gateways(self) -> None:
        """Read every gateway's cumulative observations (``GET /v1/observations``); one that does not answer
        is skipped this window."""
        for url, obs in await self.cp.routes.observations():
            self.observer.report(f"gateway:{url}", obs, gateway=True)

    # -- the adapt step ------------------------------------------------------------------------------------

    def step(self) -> WindowOutcome | None:
        """Close the open window and, with adaptation on: re-calibrate the profiles from what the agents
        measured, let waking nodes that are due serve, run ``adapt.loop.step`` on the gathered inputs (on the
        nodes that are on) and carry out its plan (each move make before break, at its new contract); every
        action is recorded as an event. Returns what the consolidation step reads (None: no step)."""
        cp = self.cp
        now = cp.clock()
        start = self._window_start if self._window_start is not None else now
        self._window_start = now
        if now <= start:
            return None
        self.windows = self.observer.close(list(cp.reconciler.apps), start, now)
        settings = self.settings
        if settings is None:
            return None
        self._calibrate(settings)
        cp.power.tick()
        inputs = self.gather(now, settings)
        result = step(self.state, cp.policy, inputs.live, inputs.movable, settings, now,
                      last_seen_s=inputs.last_seen_s, declared=inputs.declared, busy=inputs.busy)
        self.state = result.state
        # a finding is an event once, when it starts to count (not again every window it lasts)
        new = {f.key for f in result.acted} - self._acted
        self._acted = {f.key for f in result.acted}
        for f in result.acted:
            if f.key in new:
                cp.events.add("finding", f.app, f"{f.kind}: {f.detail}", {"finding": f.to_json()})
        plan = result.plan
        for f in plan.unexplained:
            if f.key in new:
                cp.events.add("unexplained", f.app, f"{f.kind} at contracted rates (profiles off? "
                              f"calibration needs {settings.calibration_samples} executions): {f.detail}",
                              {"finding": f.to_json()})
        refused = {(r.app, r.reason.key, r.rejection.constraint) for r in plan.refused}
        for r in plan.refused:
            # once while it lasts: an app a dead node's loss leaves without a home is refused every window
            if (r.app, r.reason.key, r.rejection.constraint) not in self._refused:
                cp.events.add("move-refused", r.app, f"no room at {r.rate_rps:.3g} req/s: {r.rejection.message}",
                              r.to_json())
        self._refused = refused
        for t in plan.transitions:
            self.carry(t)
        return WindowOutcome(inputs, frozenset(t.app for t in plan.transitions), bool(plan.refused))

    def gather(self, now: float, settings: AdaptSettings) -> CycleInputs:
        """The inputs of one adapt step, read from the managers that own them (``CycleInputs``)."""
        cp = self.cp
        full = cp.snapshot()
        live = cp.power.live(full)  # nothing is planned onto a switched-off or waking node
        busy = cp.transitions.busy()
        movable = {a: w for a, w in self.windows.items() if a not in busy}
        nodes = {x.name for x in live.cluster.nodes}
        seen = {n: a.last_seen for n, a in cp.reconciler.agents.items() if n in nodes}
        return CycleInputs(now, full, live, self.windows, movable, seen, cp.reconciler.declared, busy, settings)

    def _calibrate(self, settings: AdaptSettings) -> None:
        """``catalog`` := the base catalog with every profile the agents measured often enough replaced by what
        they measured; an event for each profile whose calibration is new."""
        observed = {n: o for n, o in self.observer.profiles().items() if n in self.base_catalog.profiles}
        before = {n: p.provenance for n, p in self.catalog.profiles.items()}
        catalog, changed = calibrated_catalog(self.base_catalog, observed, settings.calibration_samples)
        for p in changed:
            if before.get(p.name) is not None and before[p.name].source != p.provenance.source:
                self.cp.events.add("calibrated", None, f"profile {p.name}: {p.provenance.detail} "
                                   f"({p.provenance.note})", {"profile": p.name})
        self.catalog = catalog

    # -- carrying transitions out ----------------------------------------------------------------------

    def carry(self, t: Transition) -> None:
        """Record a planned transition as an event and carry it out in the background."""
        cp = self.cp
        kind = transition_kind(cp.reconciler.placements[t.app], t.placement)
        what = {"contract": f"contract {cp.reconciler.apps[t.app].rate_rps:.3g} -> {t.rate_rps:.3g} req/s in place",
                "repartitioned": f"new weights {shares_text(t.placement)} at {t.rate_rps:.3g} req/s",
                "reshared": f"new shares {shares_text(t.placement)} at {t.rate_rps:.3g} req/s (overlapped)",
                "moved": f"move to {shares_text(t.placement)} at {t.rate_rps:.3g} req/s"}[kind]
        cp.events.add("move-planned", t.app, f"{t.reason.kind} on {', '.join(t.reason.devices)}: {what}",
                      t.to_json())
        self.pending.add(t.app)
        cp.spawn(self._carry_out(t.app, t.placement, t.rate_rps, kind))

    async def _carry_out(self, app: str, placement: Placement, rate_rps: float, kind: str) -> None:
        """Carry out one planned transition (``kind`` from ``adapt.plan.transition_kind``) and record what
        happened as an event of that kind (or ``move-failed``)."""
        cp = self.cp
        apps = cp.reconciler.apps
        before = apps[app].rate_rps if app in apps else rate_rps  # deleted meanwhile: move-failed
        try:
            answer = await cp.transitions.transition(app, placement, rate_rps=rate_rps)
        except ControlPlaneError as e:
            cp.events.add("move-failed", app, e.message, dict(e.extra or {}))
            return
        finally:
            self.pending.discard(app)
        steps = {"steps_s": {k: round(v, 3) for k, v in answer.steps_s.items()}}
        # contract: same pieces, the agents re-police at the new rate; repartitioned: new weights over devices
        # it ran on, only routes change; moved: a model loaded elsewhere, make before break
        declared = cp.reconciler.declared.get(app, rate_rps)
        message = {"contract": f"contract {before:.3g} -> {rate_rps:.3g} req/s at {shares_text(placement)} "
                               f"(declared {declared:.3g})",
                   "repartitioned": f"now {shares_text(placement)}, contract {rate_rps:.3g} req/s",
                   "reshared": f"now {shares_text(placement)}, contract {rate_rps:.3g} req/s",
                   "moved": f"now at {shares_text(placement)}, contract {rate_rps:.3g} req/s"}[kind]
        cp.events.add(kind, app, message, steps)
