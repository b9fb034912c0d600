"""The control plane's side of adaptation: observations in, windows out, and the record of what was done.

The decisions are ``edgemux.adapt``'s (pure); this module keeps what they need between windows on the
running cluster and what an operator reads afterwards:

- :class:`Observer`: agents (in every heartbeat) and gateways (``GET /v1/observations``) report cumulative
  counts per app; two reports of one process subtract to what happened between them, which is added to
  the window that is open. A window closes into ``adapt.monitor.AppWindow``\\ s, one per placed app (an
  empty one for an app nobody reported requests of, as the simulator's monitor gives). A request is counted
  once, where it entered the cluster: by the gateway that policed it (what clients send and the latency they
  get, end to end, policing refusals included), or by the agent a client called directly (an agent does not
  count what a gateway forwards it). An app's window is therefore the sum of every gateway's and every
  agent's view. The first report of a process the control plane has not heard before is a baseline only
  (after a control-plane restart the counts since the process started are not this window's); a new
  incarnation of a known process (it restarted) counts from zero.
- The profiles' service-time moments, from the latest report of each agent, merged: what calibration reads.
- :class:`Event`: every action and finding acted on, with its reason, kept in a bounded log
  (``GET /v1/events``, ``edgemux get events``) and written to the control plane's log.

- :class:`AdaptationManager`: the adaptation manager of the controller loop, the control plane's driver of the
  adaptation cycle (``adapt.cycle``, which the simulator drives too). Every window (``adapt.window_s``; 5 s when
  adaptation is off, for ``describe``) it reads the gateways' observations and closes the window; with
  adaptation on it gathers the cycle's inputs in one place (:class:`CycleInputs`), calls ``adapt.cycle.cycle``
  once, keeps the returned ``CycleState`` and carries the returned actions out in their order, deciding
  nothing itself (:meth:`AdaptationManager.carry_out`): ``Woke``, ``SwitchOff``, ``Undrain``, ``Wake`` and
  ``Drain`` through the power manager, ``Move`` make before break through the transitions manager (a
  ``move-planned`` event, then one of the move's kind or ``move-failed``), ``Recalibrated`` the catalog in
  force (a ``calibrated`` event per profile calibrated for the first time), ``Found``, ``Unexplained`` and
  ``Refused`` an event when they are new (a ``finding`` once when it starts to count, a ``move-refused`` once
  while it lasts). After the window's actions the power tick runs (``adapt.cycle.power_tick``: a node ready
  exactly at the window's end serves after the window's decisions); an arrival without room takes the
  cycle's arrival path (:meth:`AdaptationManager.arrival_without_room`). Every action carried out is kept,
  with its time, in ``decisions`` (the latest ``MAX_EVENTS``), as the simulator keeps
  ``ClusterRun.decisions``, and counted by kind (``edgemux_controlplane_adaptation_actions_total``). At every
  window's close, before the cycle acts, each app's prediction and what was observed join its timeline
  (``overview.Timeline``: the dashboard's predicted-beside-observed charts).

Units: ``*_s`` seconds (control-plane clock for windows, Unix time for events), ``*_ms`` milliseconds.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from edgemux.adapt.calibrate import Observed
from edgemux.adapt.consolidate import PowerView
from edgemux.adapt.cycle import (CycleAction, CycleState, Drain, Found, Move, Recalibrated, Refused, SwitchOff,
                                 Undrain, Unexplained, Wake, Woke, cycle, wake_for_arrival)
from edgemux.adapt.monitor import AppCounters, AppWindow
from edgemux.adapt.serving import DeviceTime, ServingPath, node_samples, update_serving
from edgemux.adapt.settings import AdaptSettings
from edgemux.cluster.state import Cluster, Placement
from edgemux.policies import Snapshot
from edgemux.profiles.catalog import Catalog
from edgemux.runtime.controlplane.common import ControlPlaneError, shares_text
from edgemux.runtime.controlplane.messages import Event
from edgemux.runtime.controlplane.overview import Timeline, record_window
from edgemux.runtime.messages import Observations

if TYPE_CHECKING:
    from edgemux.runtime.controlplane.service import ControlPlane

__all__ = ["EVENT_KINDS", "OPERATOR_EVENTS", "AdaptationManager", "CycleInputs", "Event", "EventLog", "Observer",
           "WindowOutcome"]

logger = logging.getLogger("edgemux.controlplane")

# the operator's requests (admission and the move API; each with data["by"] == "operator"), so the timeline
# shows what was asked beside what the cluster did on its own: the adaptation's and power's kinds
OPERATOR_EVENTS = ("admitted", "updated", "rejected", "deleted", "operator-move")
EVENT_KINDS = (*OPERATOR_EVENTS, "finding", "move-planned", "moved", "contract", "repartitioned", "reshared",
               "move-failed", "move-refused", "unexplained", "calibrated", "power")
MAX_EVENTS = 1000  # the log keeps the latest; the control plane's log file keeps them all


class Observer:
    """Windows from cumulative reports (see the module docstring)."""

    def __init__(self) -> None:
        self._last: dict[str, Observations] = {}  # source -> its latest report
        self._open: dict[str, AppCounters] = {}  # app -> what the open window counted of it
        self._open_device: dict[str, DeviceTime] = {}  # app -> the agents' device time in the open window
        self.device: dict[str, DeviceTime] = {}  # app -> the agents' device time in the last closed window

    def report(self, source: str, obs: Observations, *, gateway: bool) -> None:
        """Add what ``source`` (``agent:<node>`` or ``gateway:<url>``; ``gateway`` says which) counted since
        its previous report. Both kinds add to the same window: they count disjoint requests."""
        last = self._last.get(source)
        self._last[source] = obs
        if last is None:
            return  # a baseline: what it counted before we heard from it is not this window's
        same = last.incarnation == obs.incarnation
        _add_since(self._open, obs.apps, last.apps if same else {})
        _add_since(self._open_device, obs.device, last.device if same else {})

    def forget(self, source: str) -> None:
        """A source that left (an agent deregistered): its latest moments no longer count."""
        self._last.pop(source, None)

    def close(self, apps: Iterable[str], start_s: float, end_s: float) -> dict[str, AppWindow]:
        """The windows ``[start_s, end_s)`` of ``apps``, and a new empty window opens. An app nobody reported
        requests of gets an empty window (it sent nothing: no load, and a raised contract it does not use is
        reclaimed), as the simulator's monitor gives one to every placed app."""
        out: dict[str, AppWindow] = {}
        for app in apps:
            counts = self._open.get(app)
            out[app] = (counts or AppCounters()).window(app, start_s, end_s)
        self._open = {}
        self.device, self._open_device = self._open_device, {}
        return out

    def profiles(self) -> dict[str, Observed]:
        """Per profile, the service-time moments of every agent's latest report, merged."""
        out: dict[str, Observed] = {}
        for source, obs in self._last.items():
            for name, o in obs.profiles.items():
                out[name] = out[name].merge(o) if name in out else o
        return out


def _add_since(into: dict[str, Any], now: Mapping[str, Any], before: Mapping[str, Any]) -> None:
    """Add to ``into`` each app's cumulative counts ``now`` (``AppCounters`` or ``DeviceTime``) less its
    counts ``before`` (the same process's previous report); a count that went down is not the same counting
    any more, so it is taken from zero."""
    for app, cur in now.items():
        was = before.get(app)
        try:
            delta = cur.minus(was) if was is not None else cur
        except ValueError:
            delta = cur
        into[app] = into[app].merge(delta) if app in into else delta


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
        logger.log(level, "%s %s%s: %s", "event" if kind in OPERATOR_EVENTS else "adapt", kind,
                   f" {app}" if app else "", message)
        return ev

    @property
    def last_seq(self) -> int:
        """The newest event's sequence number (0 before the first)."""
        return self._seq

    def since(self, seq: int = 0, app: str | None = None) -> list[Event]:
        """Events after ``seq``, of ``app`` when given, oldest first."""
        return [e for e in self._events if e.seq > seq and (app is None or e.app == app)]


# ------------------------------------------------------------------------------------------- the manager


@dataclass(frozen=True)
class CycleInputs:
    """Everything one window's cycle reads, gathered at one instant (``AdaptationManager.gather``): the time
    ``now_s`` (control-plane clock), the store's ``snapshot`` (every node, the catalog in force), the closed
    ``windows`` (one per placed app, empty for an app that sent nothing), the nodes' ``power`` states (None
    without consolidation), each agent's last heartbeat (``last_seen_s``), the declared contracts (req/s), the
    apps a move holds (``busy``: moves in flight and planned), the profiles' measured service-time moments
    (``observed``) and the ``settings``."""

    now_s: float
    snapshot: Snapshot
    windows: dict[str, AppWindow]
    power: PowerView | None
    last_seen_s: dict[str, float]
    declared: dict[str, float]
    busy: frozenset[str]
    observed: dict[str, Observed]
    settings: AdaptSettings


@dataclass(frozen=True)
class WindowOutcome:
    """One window's cycle: what it read (``inputs``) and the ``actions`` it returned, carried out in order."""

    inputs: CycleInputs
    actions: tuple[CycleAction, ...]


class AdaptationManager:
    """Observations into windows, one cycle per window and its actions carried out, events (module doc), for
    the controller ``cp``. ``settings`` None: adaptation is off (windows still close, for ``describe``);
    ``catalog``: the profiles calibration starts from."""

    def __init__(self, cp: ControlPlane, settings: AdaptSettings | None, catalog: Catalog) -> None:
        self.cp = cp
        self.settings = settings
        self.base_catalog = catalog  # what calibration starts from
        self.catalog = catalog       # the profiles in force: the base, calibrated by what the agents measured
        self.observer = Observer()
        # each node's serving path (adapt.serving): the cluster's declared figure, calibrated every window
        self.declared_cluster: Cluster = cp.cluster
        self.serving: dict[str, ServingPath] = {n.name: ServingPath(n.serving_ms) for n in cp.cluster.nodes}
        self.state = CycleState()    # what the cycle keeps between windows
        self.windows: dict[str, AppWindow] = {}  # the last closed window of each placed app
        self.timeline = Timeline()  # per app, predicted beside observed at each window's close (overview)
        # the latest actions carried out (control-plane clock s, action), oldest first: what the simulator
        # records as ClusterRun.decisions, for comparing the two drivers
        self.decisions: deque[tuple[float, CycleAction]] = deque(maxlen=MAX_EVENTS)
        self.pending: set[str] = set()  # apps a planned move is under way for
        self._window_start: float | None = None
        # the clock of the windows' cadence (s): the event loop's, as the controller loop's period (a test may
        # set another); the windows themselves are measured on cp.clock
        self.timer: Callable[[], float] = lambda: asyncio.get_running_loop().time()
        self.wall: Callable[[], float] = time.time  # Unix time (s) of the timeline's points (a test may set another)
        self._due_s = math.inf   # timer's time (s) when the next window closes
        self._reading = False    # the gateways' observations of a due window are being read
        self._ready = False      # ... and have been: the next pass closes the window

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
        the loop); once they are in, close the window and run its cycle (``step``)."""
        if self._ready:
            self._ready = False
            try:
                self.step()
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

    async def observe_gateways(self) -> None:
        """Read every gateway's cumulative observations (``GET /v1/observations``); one that does not answer
        is skipped this window."""
        for url, obs in await self.cp.routes.observations():
            self.observer.report(f"gateway:{url}", obs, gateway=True)

    # -- the window's cycle --------------------------------------------------------------------------------

    def step(self) -> WindowOutcome | None:
        """Close the open window and, with adaptation on, run its cycle (``adapt.cycle.cycle``) on the gathered
        inputs, keep its state and carry out its actions in order; then the power tick (a node ready exactly
        at the window's end serves after the window's decisions). Returns the window's inputs and actions
        (None: no cycle ran)."""
        cp = self.cp
        now = cp.clock()
        start = self._window_start if self._window_start is not None else now
        self._window_start = now
        if now <= start:
            return None
        self.windows = self.observer.close(list(cp.reconciler.apps), start, now)
        self.calibrate_serving()
        # the prediction this window is judged against is the one before the cycle acts on it
        record_window(cp, self.wall())
        settings = self.settings
        if settings is None:
            return None
        inputs = self.gather(now, settings)
        out = cycle(self.state, cp.policy, inputs.snapshot, inputs.windows, inputs.settings, now,
                    consolidation=cp.power.settings, power=inputs.power, last_seen_s=inputs.last_seen_s,
                    declared=inputs.declared, busy=inputs.busy, observed=inputs.observed,
                    base_catalog=self.base_catalog)
        self.state = out.state
        self.carry_out(out.actions)
        cp.power.tick()
        return WindowOutcome(inputs, out.actions)

    def probed(self, node: str, probe_ms: float) -> None:
        """The start-up probe of ``node``'s agent: its round trip (ms) is the node's prior serving path unless
        the cluster declared one (``ServingPath.probed``)."""
        path = self.serving.get(node)
        if path is None:
            return
        self.serving[node] = path.probed(probe_ms)
        self._apply_serving()

    def _apply_serving(self) -> None:
        # the same cluster object when nothing changed (Cluster.with_serving): what was computed on it stays
        self.cp.cluster = self.cp.cluster.with_serving({n: round(p.ms, 3) for n, p in self.serving.items()})

    def calibrate_serving(self) -> None:
        """Each node's serving path after the window just closed (``adapt.serving``: the entry's end-to-end
        mean less the agents' queueing + service, per app placed on one node), set on the cluster the
        estimators read (``ControlPlane.cluster``): admission, the detectors and ``describe`` then predict
        end to end with it. Runs with adaptation off too: it is a measurement, not a decision."""
        cp = self.cp
        samples = node_samples(cp.snapshot(), self.windows, self.observer.device)
        if not samples:
            return
        self.serving = update_serving(self.serving, samples)
        self._apply_serving()

    def gather(self, now: float, settings: AdaptSettings) -> CycleInputs:
        """The inputs of one window's cycle, read from the managers that own them (``CycleInputs``). Its
        ``dead_after_s`` is at least every agent's lease + margin (``Reconciler.dead_after_s``): the cycle
        never evacuates a node whose agent may still be serving under its lease (docs/multihost.md)."""
        cp = self.cp
        busy = cp.transitions.busy() | frozenset(self.pending)
        seen = {n: a.last_seen for n, a in cp.reconciler.agents.items()}
        dead_after_s = cp.reconciler.dead_after_s(settings.dead_after_s)
        if dead_after_s != settings.dead_after_s:
            settings = replace(settings, dead_after_s=dead_after_s)
        return CycleInputs(now, cp.snapshot(), self.windows, cp.power.view(), seen, dict(cp.reconciler.declared),
                           busy, self.observer.profiles(), settings)

    def arrival_without_room(self, full: Snapshot, why: str) -> None:
        """An arriving app found no room on the nodes that are on (``full``: admission's snapshot, every node):
        the cycle's arrival path (``adapt.cycle.wake_for_arrival``), its actions carried out (``why`` says
        which app in the power events)."""
        cp = self.cp
        view = cp.power.view()
        if view is None or cp.power.settings is None:
            return
        self.state, actions = wake_for_arrival(self.state, cp.policy, full, view, cp.power.settings)
        self.carry_out(actions, why=why)

    # -- carrying the cycle's actions out ------------------------------------------------------------------

    def carry_out(self, actions: Iterable[CycleAction], *, why: str | None = None) -> None:
        """Carry out the cycle's ``actions`` in their order, each recorded in ``decisions``: a power action
        through the power manager (``why``: the reason its event gives instead of the planner's), a move make
        before break, a new catalog in force; findings, unexplained hotspots and refusals are events when
        they are new (``first``: once when a finding starts to count, once while a refusal lasts)."""
        cp = self.cp
        now = cp.clock()
        for a in actions:
            self.decisions.append((now, a))
            cp.metrics.actions.labels(a.what if isinstance(a, Move) else a.kind).inc()
            if isinstance(a, (Woke, SwitchOff, Undrain, Wake, Drain)):
                cp.power.carry_out(a, why)
            elif isinstance(a, Move):
                self.carry(a)
            elif isinstance(a, Recalibrated):
                self.catalog = a.catalog
                for p in a.profiles:
                    if p.name in a.first:
                        cp.events.add("calibrated", None, f"profile {p.name}: {p.provenance.detail} "
                                      f"({p.provenance.note})", {"profile": p.name})
            elif isinstance(a, Found):
                if a.first:
                    f = a.finding
                    cp.events.add("finding", f.app, f"{f.kind}: {f.detail}", {"finding": f.to_json()})
            elif isinstance(a, Unexplained):
                f = a.finding
                samples = (self.settings or AdaptSettings()).calibration_samples
                cp.events.add("unexplained", f.app, f"{f.kind} at contracted rates (profiles off? "
                              f"calibration needs {samples} executions): {f.detail}", {"finding": f.to_json()})
            elif isinstance(a, Refused):
                if a.first:
                    r = a.refusal
                    cp.events.add("move-refused", r.app, f"no room at {r.rate_rps:.3g} req/s: "
                                  f"{r.rejection.message}", r.to_json())

    def carry(self, move: Move) -> None:
        """Record a planned transition as an event and carry it out in the background, make before break."""
        cp = self.cp
        t, kind = move.transition, move.what
        what = {"contract": f"contract {move.old_rate_rps:.3g} -> {t.rate_rps:.3g} req/s in place",
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
