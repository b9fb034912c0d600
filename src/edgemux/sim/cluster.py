"""A cluster simulator: every device of a ``Cluster`` in one virtual-time event simulation (one ``Engine``),
driven by a trace of apps that arrive, leave and change their sending rate and of nodes that fail, with the
adaptation cycle (``adapt.cycle``) as one more process. The run's parts each own their state: the requests
and stations (``sim.traffic``), the nodes' power, energy and failures (``sim.nodes``), the trace
(``sim.trace``) and the results (``sim.outcome``); this module holds admission and the controller.

- **Admission.** At an :class:`Arrive` the policy decides on the current snapshot; an admitted app gets its
  placement (a split placement sends each request to a share drawn by weight), a rejected one is recorded
  with the rejection's message and sends nothing (its later ``Rate`` and ``Leave`` events are ignored).
- **Requests.** Each admitted app sends Poisson arrivals (periodic ones, random phase, for ``App.periodic``)
  at its *actual* rate: its contract ``App.rate_rps`` until a :class:`Rate` event says otherwise. Each
  request is policed by the app's token bucket (the pure ``adapt.police.Bucket`` the runtime runs): it waits
  for its token, or is refused when it would wait more than ``Policing.max_wait_s``. It is then routed to a
  share of the placement in force *when it is sent*, passes the app's CPU stage if it has one, and is served
  by the device's station (``sim.devices``) with a service time drawn from the placed profile. Latency =
  bucket wait + CPU stage + device response + the app's ``network_ms``.
- **The controller.** Every ``settings.window_s`` it builds each admitted app's ``AppWindow`` and runs one
  adaptation cycle (``adapt.cycle.cycle``: power tick, detect/damp/plan, then consolidation), and carries out
  the cycle's actions in their order; it decides nothing itself, so the control plane, which runs the same
  cycle, takes the same decisions on the same observations (``ClusterRun.decisions`` lists them, and
  ``ClusterRun.monitored`` the windows they were taken on). It passes
  each app's declared contract (the one it arrived with), below which reclamation never goes; as ``busy`` the
  apps whose last move does not serve yet; each node's last report (now, or when it failed); and no profile
  observations (service times are drawn from the catalog's profiles, so there is nothing to calibrate).
  A planned move is carried out make-before-break: the snapshot (admission's view, contracts included)
  changes at once, so that later admissions do not count on the room the app is taking; requests keep going
  to the old placement for ``model_load_s`` while the new device loads the model, then new requests go to the
  new placement and the bucket polices the new contract (``Transition.rate_rps``). Requests already sent
  finish where they were sent. A transition that keeps the placement (a contract raised in place, or
  reclaimed) takes effect at once.
- **Power** (``sim.nodes``). With ``power`` every node's energy is metered; with ``consolidation`` the cycle's
  power actions switch nodes off, wake them (a waking node serves from its exact wake-up time, an event of
  its own: after the decisions of a window ending at that same time) and drain them. An arrival the nodes on cannot take
  while others are off or waking waits, and the cycle's arrival path (``adapt.cycle.wake_for_arrival``)
  wakes a node for it unless one is waking; when a node is up the waiting arrivals are decided again (one
  that still finds no room wakes the next), and rejected once every node is on.
- **Node failure.** A :class:`Fail` event fails a node for the rest of the run. Its agent is silent from then
  on: the controller passes its last report, so the cycle finds it ``agent-dead`` after ``dead_after_s``
  and evacuates its apps (as the control plane does). Its devices and CPU stages serve nothing: the requests
  there at the failure are lost, and so is every request routed there afterwards (until its app's
  evacuation serves: this simulator does not model the gateways' earlier failover). A lost request is
  neither answered nor refused: the monitor counts it as failed in its window (the ``dropping`` detector
  sees it), ``AppTotals.lost`` per app and ``ClusterRun.failures`` per node (in flight, routed after).
  Admission does not know of the failure (neither does the control plane's before ``agent-dead``), and a
  failed node is left out of consolidation. A failed node stays metered in its power state.
- **Admission alone.** :func:`replay_admission` runs the same trace events through the same admission
  (arrivals decided on the current snapshot, leaves freeing their placement, offline plans applied) with no
  traffic and no controller, and returns the state after every event: what the capacity and trace
  experiments need, at the cost of the decisions alone.
- **Offline plans.** An :class:`Arrive` may carry its placement, and a :class:`Place` event re-places an app
  at once at a new contract: how an oracle that knows the trace (``experiments.dynamic_trace``) is replayed
  through the same requests, stations and policing.

What the controller sees in a window ``[t - window_s, t)`` at time ``t``: every request that *arrived* in
it (so λ̂ is what the app sent), the refused ones, and the latencies of those answered by ``t``. A request
still waiting for its token or its device at ``t`` counts as an arrival, but its latency, not known yet, is
not judged (in that window or later): a real monitor cannot know it either. The result's per-window rows are
recomputed after the run from every request's final latency, by arrival window (arrivals stop at the
horizon; requests in flight then are run to completion).

Assumptions (each a parameter): a migration's model load takes ``model_load_s`` (default 1 s, a small
Edge TPU model's load plus container start; Ibis does not give the figure); policing as :class:`Policing`
says. Batching devices are not simulated (their stations need requests numbered in device-arrival order,
which bucket waits and routing do not keep). Deterministic for a seed: every app has its own generators
(arrivals, service times, routing) spawned from the seed in the order apps arrive in the trace.

Units: trace and results in seconds (``*_s``), latencies in ms, rates in req/s; the engine runs in ms.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from edgemux.adapt.consolidate import ConsolidationSettings
from edgemux.adapt.cycle import (CycleAction, CycleState, Drain, Found, Move, Recalibrated, Refused, SwitchOff,
                                 Undrain, Wake, Woke, cycle, power_tick, wake_for_arrival)
from edgemux.adapt.monitor import AppWindow
from edgemux.adapt.plan import live_snapshot
from edgemux.adapt.police import Policing
from edgemux.adapt.settings import AdaptSettings
from edgemux.cluster.power import NodePower, PowerState
from edgemux.cluster.state import Cluster, Placement
from edgemux.policies.base import Policy, Rejection, Snapshot
from edgemux.sim.engine import PRIO_ARRIVAL, PRIO_TIMER, Engine
from edgemux.sim.nodes import Nodes
from edgemux.sim.outcome import (Action, AdmissionDelay, AppTotals, ClusterRun, FindingRecord, MoveRefused,
                                 NodeEnergy, NodeFailure, PowerChange, RejectionRecord, TraceStep, WindowRow)
from edgemux.sim.traffic import Traffic, devices_of
from edgemux.sim.trace import Arrive, Fail, Leave, Place, Rate, TraceEvent, check_trace

__all__ = [
    "Action", "AdmissionDelay", "AppTotals", "Arrive", "ClusterRun", "Fail", "FindingRecord", "Leave", "MoveRefused",
    "NodeEnergy", "NodeFailure", "Place", "Policing", "PowerChange", "Rate", "RejectionRecord", "TraceEvent",
    "TraceStep", "WindowRow", "replay_admission", "simulate_cluster",
]


def simulate_cluster(cluster: Cluster, policy: Policy, trace: Sequence[TraceEvent], *, horizon_s: float,
                     seed: int = 0, settings: AdaptSettings | None = None, model_load_s: float = 1.0,
                     policing: Policing = Policing(), window_s: float | None = None,
                     power: Mapping[str, NodePower] | None = None,
                     consolidation: ConsolidationSettings | None = None) -> ClusterRun:
    """Simulate ``cluster`` under ``policy`` for ``horizon_s`` seconds of ``trace`` (events sorted by time,
    all within the horizon); see the module doc. ``settings`` None: static placement (no controller acts).
    ``model_load_s``: seconds between a transition's decision and its new placement serving. ``window_s``:
    the result rows' window (s; default ``settings.window_s``, or 5 s for a static run). ``power`` (node
    name -> its figures, every node): account each node's energy; ``consolidation`` (needs ``power`` and
    ``settings``): run the consolidation planner after every adaptation step (module doc). Same arguments,
    same result; bad arguments raise ``ValueError`` naming the problem."""
    _check_args(horizon_s, seed, model_load_s, window_s)
    check_trace(trace, horizon_s, [n.name for n in cluster.nodes])
    _check_power(cluster, power, consolidation, settings)
    rows_w = float(window_s if window_s is not None else (settings or AdaptSettings()).window_s)
    sim = _Sim(cluster, policy, trace, float(horizon_s), int(seed), settings, float(model_load_s), policing,
               power=power, consolidation=consolidation)
    sim.run()
    return sim.result(rows_w)


def replay_admission(cluster: Cluster, policy: Policy, trace: Sequence[TraceEvent], *,
                     stop_at_rejection: bool = False) -> tuple[TraceStep, ...]:
    """Admission alone along ``trace`` (events sorted by time, s): the same event handling as
    :func:`simulate_cluster` with no requests sent and no controller, so ``Rate`` events change nothing.
    Returns one :class:`TraceStep` per event run; with ``stop_at_rejection`` the replay ends at the first
    arrival the policy rejects (that step is the last): an arrival order's capacity. Deterministic (no
    random draw is made); a malformed trace raises ``ValueError`` naming the event."""
    check_trace(trace, math.inf, [n.name for n in cluster.nodes])
    sim = _Sim(cluster, policy, trace, math.inf, 0, None, 0.0, Policing(), traffic=False,
               stop_at_rejection=stop_at_rejection)
    sim.run()
    assert sim.steps is not None
    return tuple(sim.steps)


def _check_args(horizon_s: float, seed: int, model_load_s: float, window_s: float | None) -> None:
    if not (isinstance(horizon_s, (int, float)) and math.isfinite(horizon_s) and horizon_s > 0):
        raise ValueError(f"horizon_s must be a finite number of seconds > 0, got {horizon_s!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    if not (isinstance(model_load_s, (int, float)) and math.isfinite(model_load_s) and model_load_s >= 0):
        raise ValueError(f"model_load_s must be a finite number of seconds >= 0, got {model_load_s!r}")
    if window_s is not None and not (math.isfinite(window_s) and window_s > 0):
        raise ValueError(f"window_s must be a finite number of seconds > 0, got {window_s!r}")


def _check_power(cluster: Cluster, power: Mapping[str, NodePower] | None,
                 consolidation: ConsolidationSettings | None, settings: AdaptSettings | None) -> None:
    if power is not None:
        names = {n.name for n in cluster.nodes}
        missing, extra = sorted(names - set(power)), sorted(set(power) - names)
        if missing or extra:
            raise ValueError(f"power must give every node of the cluster and no other: "
                             f"{'missing ' + ', '.join(missing) if missing else ''}"
                             f"{'; ' if missing and extra else ''}{'unknown ' + ', '.join(extra) if extra else ''}")
        for n in cluster.nodes:
            p = power[n.name]
            if p.node != n.name:
                raise ValueError(f"power[{n.name!r}] is node {p.node!r}'s")
            devices = {d.path for d in n.devices}
            if set(p.dynamic_w) - devices:
                raise ValueError(f"power[{n.name!r}] names devices node {n.name!r} does not have: "
                                 f"{', '.join(sorted(set(p.dynamic_w) - devices))}")
    if consolidation is not None and (power is None or settings is None):
        raise ValueError("consolidation needs power (each node's figures) and settings (the controller's window)")


class _Sim:
    """One run: admission along the trace and the controller, over the requests (``sim.traffic``) and the
    nodes (``sim.nodes``), each of which owns its state; the controller's decisions are ``adapt.cycle``'s,
    carried out here in virtual time."""

    def __init__(self, cluster: Cluster, policy: Policy, trace: Sequence[TraceEvent], horizon_s: float, seed: int,
                 settings: AdaptSettings | None, model_load_s: float, policing: Policing, *, traffic: bool = True,
                 stop_at_rejection: bool = False, power: Mapping[str, NodePower] | None = None,
                 consolidation: ConsolidationSettings | None = None) -> None:
        self.cluster, self.policy, self.trace = cluster, policy, trace
        self.horizon_s, self.seed, self.settings = horizon_s, seed, settings
        self.model_load_s, self.consolidation = model_load_s, consolidation
        # without traffic only admission runs (replay_admission): no requests, no controller, every step kept
        self.sends, self.stop_at_rejection = traffic, stop_at_rejection
        self.steps: list[TraceStep] | None = None if traffic else []
        self.engine = Engine()
        self.snapshot = Snapshot(cluster)
        self.base_catalog = self.snapshot.catalog  # what calibration from windows starts from (fit_windows)
        n_apps = sum(isinstance(ev, Arrive) for ev in trace)
        seeds = np.random.SeedSequence(seed).spawn(n_apps) if n_apps and traffic else []
        self.nodes = Nodes(cluster, power)
        self.traffic = Traffic(self.engine, cluster, policing, horizon_s, seeds, self.nodes)
        self.arrived = 0
        self.rejected: list[RejectionRecord] = []
        self.pending: dict[str, tuple[int, Arrive, float]] = {}  # app -> (seed index, arrival, rate now)
        self.delayed: list[AdmissionDelay] = []
        # the controller: the cycle's state, and the records of what it decided
        self.state = CycleState()
        self.decisions: list[tuple[float, CycleAction]] = []
        self.monitored: list[tuple[float, tuple[AppWindow, ...]]] = []
        self.actions: list[Action] = []
        self.refused_moves: list[MoveRefused] = []
        self.findings: list[FindingRecord] = []
        self.serving_from: dict[str, float] = {}  # app -> when its last transition serves (s)

    def run(self) -> None:
        eng = self.engine
        for ev in self.trace:
            eng.schedule(ev.time_s * 1000.0, PRIO_ARRIVAL, self._trace_event, ev)
        if self.settings is not None:
            w = self.settings.window_s
            k = 1
            while k * w <= self.horizon_s + 1e-9:
                eng.schedule(k * w * 1000.0, PRIO_TIMER, self._control, (k - 1) * w)
                k += 1
        eng.run()  # arrivals stop at the horizon; what is in flight then runs to completion
        self.nodes.meter(self.horizon_s)

    # ---------------------------------------------------------------------------------------- the trace

    def _trace_event(self, now: float, ev: TraceEvent) -> None:
        now_s = now / 1000.0
        if isinstance(ev, Arrive):
            self._arrive(now_s, ev)
            return
        if isinstance(ev, Fail):  # its agent is silent from now on, and its devices serve nothing
            self.nodes.failed[ev.node] = now_s
            self.traffic.fail(ev.node, now)
            self._step(now_s, ev, None, False)
            return
        name = ev.app_name
        if name in self.pending:  # waiting for a node to wake: keep its rate, or let it go
            index, arrival, _ = self.pending[name]
            if isinstance(ev, Rate):
                self.pending[name] = (index, arrival, float(ev.rate_rps))
            elif isinstance(ev, Leave):
                del self.pending[name]
                self.delayed.append(AdmissionDelay(name, arrival.time_s, None, arrival.app.rate_rps))
            return
        if name not in self.snapshot.placements:  # rejected (or gone): it sends nothing
            self._step(now_s, ev, None, False)
            return
        if isinstance(ev, Leave):
            self.snapshot = self.snapshot.without(name)
            self.traffic.leave(name, now_s)
        elif isinstance(ev, Place):
            app = replace(self.snapshot.apps[name], rate_rps=float(ev.rate_rps))
            self.snapshot = self.snapshot.without(name).with_placement(app, ev.placement)
            self.traffic.place_now(now, app, ev.placement, self.snapshot.catalog)
        else:
            self.traffic.set_rate(name, float(ev.rate_rps), now)
        self._step(now_s, ev, None, not isinstance(ev, Rate))

    def _step(self, now_s: float, ev: TraceEvent, decision: Placement | Rejection | None, changed: bool) -> None:
        """Keep the state after ``ev`` when admission runs alone."""
        if self.steps is not None:
            self.steps.append(TraceStep(now_s, ev, decision, self.snapshot, changed))

    def _arrive(self, now_s: float, ev: Arrive, index: int | None = None) -> None:
        if index is None:
            index = self.arrived  # this app's place among the trace's arrivals: its seeds
            self.arrived += 1
        app = ev.app
        decision = ev.placement if ev.placement is not None else self.policy.decide(app, self._live())
        if isinstance(decision, Rejection) and self.consolidation is not None and self.nodes.asleep():
            # the nodes on cannot take it, switched-off ones could: it waits for one to wake
            self.pending.setdefault(app.name, (index, ev, app.rate_rps))
            self._no_room(now_s)
            return
        if isinstance(decision, Rejection):
            self.rejected.append(RejectionRecord(now_s, app.name, decision.constraint, decision.message))
            self._step(now_s, ev, decision, False)
            if self.stop_at_rejection:
                self.engine.clear()
            return
        self.snapshot = self.snapshot.with_placement(app, decision)
        self._step(now_s, ev, decision, True)
        if self.sends:
            self.traffic.admit(index, app, decision, now_s, self.snapshot.catalog)

    def _live(self) -> Snapshot:
        """Admission's snapshot on the nodes that are on (switched-off and waking ones hold nothing)."""
        asleep = self.nodes.asleep()
        return live_snapshot(self.snapshot, asleep)[0] if asleep else self.snapshot

    def _no_room(self, now_s: float) -> None:
        """An arrival found no room on the nodes that are on while others are off or waking: the cycle's
        arrival path (``adapt.cycle.wake_for_arrival``)."""
        assert self.consolidation is not None
        self.state, actions = wake_for_arrival(self.state, self.policy, self.snapshot, self.nodes.view(),
                                               self.consolidation)
        self._carry_all(now_s * 1000.0, now_s, actions)

    def _woken(self, now: float, node: str) -> None:
        """``node``'s wake-up time has come (an event at that exact time, after a window ending then): it serves
        from now (``adapt.cycle.power_tick``)."""
        now_s = now / 1000.0
        self._carry_all(now, now_s, power_tick(self.nodes.view(), now_s))

    def _readmit(self, now: float, now_s: float) -> None:
        """A node is on again: the arrivals that waited are decided again, in arrival order."""
        for name, (index, ev, rate) in list(self.pending.items()):
            decision = self.policy.decide(ev.app, self._live())
            if isinstance(decision, Rejection):
                if not self.nodes.asleep():  # every node is on and it still does not fit: a rejection after all
                    del self.pending[name]
                    self.delayed.append(AdmissionDelay(name, ev.time_s, None, rate))
                    self.rejected.append(RejectionRecord(now_s, name, decision.constraint, decision.message))
                else:
                    self._no_room(now_s)
                continue
            del self.pending[name]
            self.delayed.append(AdmissionDelay(name, ev.time_s, now_s, rate))
            self._arrive(now_s, replace(ev, placement=decision), index)
            if rate != ev.app.rate_rps:  # it changed its rate while it waited
                self.traffic.set_rate(name, rate, now)

    # ------------------------------------------------------------------------------------ the controller

    def _control(self, now: float, start_s: float) -> None:
        """One adaptation cycle (``adapt.cycle.cycle``) on the window ``[start_s, now)``, and its actions
        carried out in their order."""
        settings = self.settings
        assert settings is not None  # ticks are scheduled only with settings
        now_s = now / 1000.0
        self.nodes.meter(now_s)
        placed = self.snapshot.placements
        windows = {name: self.traffic.window(name, start_s, now_s, now) for name in placed}
        self.monitored.append((now_s, tuple(windows.values())))
        # each app's declared contract, the one it arrived with: reclamation never goes below it
        declared = {name: self.traffic.apps[name].contracts[0][1] for name in placed}
        # a move whose new placement does not serve yet is in flight: no planner touches the app
        busy = frozenset(a for a, t in self.serving_from.items() if t > now_s and a in placed)
        power = self.nodes.view() if self.nodes.power is not None else None
        out = cycle(self.state, self.policy, self.snapshot, windows, settings, now_s,
                    consolidation=self.consolidation, power=power, last_seen_s=self.nodes.last_seen(now_s),
                    declared=declared, busy=busy,
                    base_catalog=self.base_catalog if settings.fit_windows else None)
        self.state = out.state
        self._carry_all(now, now_s, out.actions)

    def _carry_all(self, now: float, now_s: float, actions: Sequence[CycleAction]) -> None:
        """Carry ``actions`` out in order; when a node woke, the arrivals that waited for one are decided
        again after them all (on the snapshot the cycle's moves have changed)."""
        for a in actions:
            self._carry_out(now, now_s, a)
        if self.pending and any(isinstance(a, Woke) for a in actions):
            self._readmit(now, now_s)

    def _carry_out(self, now: float, now_s: float, a: CycleAction) -> None:
        """Carry out one action of the cycle at ``now`` (ms; ``now_s`` in s) and record it."""
        self.decisions.append((now_s, a))
        nodes = self.nodes
        if isinstance(a, Found):
            f = a.finding
            self.findings.append(FindingRecord(now_s, f.kind, f.app, f.devices, a.acted))
        elif isinstance(a, Refused):
            r = a.refusal
            self.refused_moves.append(MoveRefused(now_s, r.app, r.rate_rps, r.rejection.message))
        elif isinstance(a, Move):
            self._move(now_s, a)
        elif isinstance(a, Woke):
            nodes.set(now_s, a.node, PowerState.ON, f"{a.node} woke")
        elif isinstance(a, SwitchOff):
            nodes.draining.discard(a.node)
            nodes.set(now_s, a.node, PowerState.OFF, a.reason)
        elif isinstance(a, Undrain):
            nodes.draining.discard(a.node)
            nodes.set(now_s, a.node, "on", a.reason)
        elif isinstance(a, Wake):
            ready_ms = (now_s + a.wake_s) * 1000.0
            nodes.set(now_s, a.node, PowerState.WAKING, a.reason)
            nodes.ready_s[a.node] = ready_ms / 1000.0  # the event's own time, so that the tick there finds it
            self.engine.schedule(ready_ms, PRIO_TIMER, self._woken, a.node)
        elif isinstance(a, Drain):
            nodes.draining.add(a.node)
            nodes.set(now_s, a.node, "draining", a.reason)
        elif isinstance(a, Recalibrated):  # (no device-side observations here: only a fit to windows)
            self.snapshot = Snapshot(self.snapshot.cluster, self.snapshot.apps, self.snapshot.placements, a.catalog)
        # an Unexplained finding is a record only (the simulator keeps every Found)

    def _move(self, now_s: float, move: Move) -> None:
        """Carry a transition out, make before break (module doc)."""
        t = move.transition
        # admission's view changes at once, so that nothing else is admitted into the room it takes
        self.snapshot = t.applied(self.snapshot)
        # the same pieces at a new contract, or new weights over them (a re-partition), load nothing: the
        # bucket and the routing change at once; a piece on a new device waits for its model, and a
        # re-share's new instances load beside the old ones, which serve until then (overlapped)
        serve_s = now_s + (self.model_load_s if move.what in ("moved", "reshared") else 0.0)
        self.serving_from[t.app] = serve_s
        self.actions.append(Action(now_s, serve_s, t.app, devices_of(move.old), devices_of(t.placement), t.rate_rps,
                                   t.reason.kind, t.reason.detail, move.what))
        self.traffic.switch_at(serve_s, self.snapshot.apps[t.app], t.placement, self.snapshot.catalog)

    # ---------------------------------------------------------------------------------------- results

    def result(self, window_s: float) -> ClusterRun:
        rows, totals = self.traffic.outcome(window_s, self.horizon_s)
        delayed = self.delayed + [AdmissionDelay(name, ev.time_s, None, rate)
                                  for name, (_, ev, rate) in self.pending.items()]
        traffic, nodes = self.traffic, self.nodes
        return ClusterRun(self.horizon_s, self.seed, window_s, tuple(rows), tuple(self.actions),
                          tuple(self.refused_moves), tuple(self.rejected), tuple(self.findings), tuple(totals),
                          tuple((p, traffic.served[p]) for p in self.cluster.devices if p in traffic.served),
                          self.engine.executed, energy=nodes.energy(),
                          app_energy=tuple((a, nodes.app_energy[a]) for a in traffic.order if a in nodes.app_energy),
                          power_changes=tuple(nodes.changes), delayed=tuple(delayed), failures=traffic.failures(),
                          decisions=tuple(self.decisions), monitored=tuple(self.monitored))
