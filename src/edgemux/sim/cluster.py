"""A cluster simulator: every device of a ``Cluster`` in one virtual-time event simulation (one ``Engine``),
driven by a trace of apps that arrive, leave and change their sending rate, with the adaptation loop
(``adapt.loop.step``) as one more process.

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
- **Adaptation.** Every ``settings.window_s`` a controller builds each admitted app's ``AppWindow`` and calls
  ``adapt.loop.step``. Every planned transition is carried out make-before-break: the snapshot (admission's
  view, contracts included) changes at once, so that later admissions do not count on the room the app is
  taking; requests keep going to the old placement for ``model_load_s`` while the new device loads the
  model, then new requests go to the new placement and the bucket polices the new contract
  (``Transition.rate_rps``). Requests already sent finish where they were sent. A transition that keeps the
  placement (a contract raised in place, or reclaimed) takes effect at once. The loop is given each app's
  declared contract (the one it arrived with), below which reclamation never goes.
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from edgemux.adapt.consolidate import (ConsolidationSettings, PowerView, consolidate_plan, holding,
                                      observed_utilization, utilization_trend)
from edgemux.adapt.loop import AdaptState, step
from edgemux.adapt.monitor import AppWindow, LatencySummary
from edgemux.adapt.plan import Transition, live_snapshot, transition_kind
from edgemux.adapt.police import Bucket, Policing
from edgemux.adapt.settings import AdaptSettings
from edgemux.cluster.power import J_PER_KWH, EnergyMeter, NodePower, PowerState
from edgemux.cluster.state import App, Cluster, Placement
from edgemux.cluster.workload import Discipline
from edgemux.policies.base import Policy, Rejection, Snapshot, tenant_for
from edgemux.profiles.distributions import Distribution
from edgemux.sim.devices import LimitedPsStation, SpatialStation, Station, station_for
from edgemux.sim.engine import PRIO_ARRIVAL, PRIO_TIMER, Engine

__all__ = [
    "Action", "AdmissionDelay", "AppTotals", "Arrive", "ClusterRun", "FindingRecord", "Leave", "MoveRefused",
    "NodeEnergy", "Place", "Policing", "PowerChange", "Rate", "RejectionRecord", "TraceEvent", "TraceStep",
    "WindowRow", "replay_admission", "simulate_cluster",
]

# ------------------------------------------------------------------------------------------------ inputs


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


TraceEvent = Arrive | Leave | Rate | Place


# ----------------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class WindowRow:
    """One app over ``[start_s, end_s)``, by arrival time, with every request's final outcome: ``arrivals``
    (refused included), ``refused`` by policing, ``answered``, ``within_slo`` (answered with latency <= the
    SLO's latency), latency statistics in ms (None when none was answered), the observed rate and the
    contract in force at the window's end (req/s), and the devices serving it then."""

    start_s: float
    end_s: float
    app: str
    arrivals: int
    refused: int
    answered: int
    within_slo: int
    mean_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    rate_rps: float
    contract_rps: float
    devices: tuple[str, ...]


@dataclass(frozen=True)
class Action:
    """A transition carried out: decided at ``time_s``, the new placement serving from ``serve_s`` (s);
    ``app`` moved from ``from_devices`` to ``to_devices`` with ``rate_rps`` its new contract; ``reason`` the
    finding's kind and ``detail`` its line. A transition that loads no model (the same placement at another
    contract, or new weights over pieces the app already runs: a re-partition) serves at once and is not a
    migration (``moved`` False)."""

    time_s: float
    serve_s: float
    app: str
    from_devices: tuple[str, ...]
    to_devices: tuple[str, ...]
    rate_rps: float
    reason: str
    detail: str
    kind: str
    """What the transition took: ``adapt.plan.transition_kind`` of the old and new placement ("contract",
    "repartitioned", "reshared" or "moved")."""

    @property
    def moved(self) -> bool:
        """Whether a model had to be loaded where the app did not run it (a migration), not only its contract
        or its weights changed."""
        return self.kind == "moved"


@dataclass(frozen=True)
class MoveRefused:
    """A transition the planner wanted at ``time_s`` but found no room for (``message``: the policy's)."""

    time_s: float
    app: str
    rate_rps: float
    message: str


@dataclass(frozen=True)
class RejectionRecord:
    """An arrival the policy rejected at ``time_s``, with the rejection's ``constraint`` and ``message``."""

    time_s: float
    app: str
    constraint: str
    message: str


@dataclass(frozen=True)
class FindingRecord:
    """A finding of the controller's step at ``time_s``; ``acted`` when it was seen long enough to act on."""

    time_s: float
    kind: str
    app: str | None
    devices: tuple[str, ...]
    acted: bool


@dataclass(frozen=True)
class TraceStep:
    """A trace event as admission saw it: ``event`` at ``time_s`` (s), the policy's ``decision`` for an
    :class:`Arrive` (the planned placement when it carried one; None for every other event), and the
    ``snapshot`` right after it. ``changed``: whether the event changed the placements (an admission, a
    leave or a re-placement of an app that was placed; not a rejection, a :class:`Rate`, or an event for an
    app that was never admitted)."""

    time_s: float
    event: TraceEvent
    decision: Placement | Rejection | None
    snapshot: Snapshot
    changed: bool


@dataclass(frozen=True)
class PowerChange:
    """Node ``node`` went to ``state`` ("draining", "off", "waking", "on") at ``time_s`` (s); ``reason`` in
    words (the consolidation planner's)."""

    time_s: float
    node: str
    state: str
    reason: str


@dataclass(frozen=True)
class NodeEnergy:
    """A node's energy over the run (J; ``kwh``) and its seconds on, waking and off."""

    node: str
    joules: float
    on_s: float
    waking_s: float
    off_s: float

    @property
    def kwh(self) -> float:
        return self.joules / J_PER_KWH


@dataclass(frozen=True)
class AdmissionDelay:
    """An arrival the nodes on could not take while others were off: it waited from ``arrived_s`` for a node
    to wake and was admitted at ``admitted_s`` (None: never, rejected at the end), its rate meanwhile
    ``rate_rps`` (req/s): the requests it did not send are ``rate_rps`` x the wait."""

    app: str
    arrived_s: float
    admitted_s: float | None
    rate_rps: float


@dataclass(frozen=True)
class AppTotals:
    """An admitted app over the whole run: ``requests`` sent (refused included), ``refused``, ``answered``
    and ``within_slo`` (answered within the SLO's latency)."""

    app: str
    requests: int
    refused: int
    answered: int
    within_slo: int

    @property
    def attainment(self) -> float | None:
        """Requests answered within the SLO latency / all requests, refused ones included (None: none sent)."""
        return self.within_slo / self.requests if self.requests else None


@dataclass(frozen=True)
class ClusterRun:
    """A run's outcome: per-window per-app ``windows`` (app by app, in time order), the ``actions`` carried
    out, moves ``refused`` for lack of room, arrivals ``rejected``, the controller's ``findings``,
    ``totals`` per admitted app (in admission order), the requests each device was sent (``served``, in
    cluster order, devices that got none left out); ``events`` counts the engine's events. With ``power``:
    each node's ``energy``, the ``power_changes`` consolidation made, and the arrivals ``delayed`` while nodes
    were off."""

    horizon_s: float
    seed: int
    window_s: float
    windows: tuple[WindowRow, ...]
    actions: tuple[Action, ...]
    refused: tuple[MoveRefused, ...]
    rejected: tuple[RejectionRecord, ...]
    findings: tuple[FindingRecord, ...]
    totals: tuple[AppTotals, ...]
    served: tuple[tuple[str, int], ...]
    events: int
    energy: tuple[NodeEnergy, ...] = ()
    """Per node, with ``power`` given (cluster order)."""
    app_energy: tuple[tuple[str, float], ...] = ()
    """Per admitted app, the dynamic energy of its requests' service (J: a device's dynamic power x the service
    times of the app's requests there); the idle power is the nodes', not an app's."""
    power_changes: tuple[PowerChange, ...] = ()
    delayed: tuple[AdmissionDelay, ...] = ()

    @property
    def energy_kwh(self) -> float:
        """The cluster's energy over the run (kWh); 0 without ``power``."""
        return math.fsum(e.joules for e in self.energy) / J_PER_KWH

    def rows(self, app: str) -> list[WindowRow]:
        """``app``'s window rows, in time order."""
        return [w for w in self.windows if w.app == app]

    def total(self, app: str) -> AppTotals:
        """``app``'s totals; ``KeyError`` for an app that was never admitted."""
        for t in self.totals:
            if t.app == app:
                return t
        raise KeyError(f"app {app!r} was not admitted in this run")


# ------------------------------------------------------------------------------------------------ the run


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
    _check_trace(trace, horizon_s)
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
    _check_trace(trace, math.inf)
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


def _check_trace(trace: Sequence[TraceEvent], horizon_s: float) -> None:
    """Events sorted, within [0, horizon_s], each app arriving once and named by Rate/Leave only while
    present."""
    present: set[str] = set()
    seen: set[str] = set()
    last = 0.0
    for i, ev in enumerate(trace):
        where = f"trace[{i}]"
        if not isinstance(ev, (Arrive, Leave, Rate, Place)):
            raise ValueError(f"{where}: expected Arrive, Leave, Rate or Place, got {type(ev).__name__}")
        where = f"trace[{i}] ({type(ev).__name__} at {ev.time_s!r} s)"
        if not (isinstance(ev.time_s, (int, float)) and math.isfinite(ev.time_s) and 0 <= ev.time_s <= horizon_s):
            raise ValueError(f"{where}: time_s must be within [0, horizon_s={horizon_s:g}] s")
        if ev.time_s < last:
            raise ValueError(f"{where}: events out of order (after an event at {last:g} s)")
        last = ev.time_s
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


_BLOCK = 256  # random numbers drawn per call: one numpy call per block instead of one per request


class _Draws:
    """A block-buffered stream of floats from ``draw(n)``."""

    __slots__ = ("_buf", "_draw", "_pos")

    def __init__(self, draw: Callable[[int], np.ndarray]) -> None:
        self._draw = draw
        self._buf: list[float] = []
        self._pos = 0

    def next(self) -> float:
        if self._pos == len(self._buf):
            self._buf = self._draw(_BLOCK).tolist()
            self._pos = 0
        x = self._buf[self._pos]
        self._pos += 1
        return x


@dataclass
class _Route:
    """Where a share of an app's requests goes: up to cumulative weight ``upto``, the ``entry`` station
    (the CPU stage or the device) and what the request carries there."""

    upto: float
    path: str
    entry: Callable[[float, int], None]
    device: Callable[[float, int], None]
    model: int
    switch_ms: float
    service: _Draws
    network_ms: float
    cpu_ms: float


@dataclass
class _AppRun:
    """An admitted app's state during the run."""

    index: int
    app: App
    rate_rps: float  # what it actually sends
    arrivals: _Draws  # standard exponentials (Poisson) or uniforms (periodic phase)
    service_rng: np.random.Generator
    route_u: _Draws
    routes: list[_Route]
    bucket: Bucket | None
    admitted_s: float
    devices: list[tuple[float, tuple[str, ...]]]  # (time s, serving devices) from that time on
    contracts: list[tuple[float, float]]  # (time s, contract req/s) from that time on
    requests: list[int] = field(default_factory=list)
    left_s: float | None = None
    next_arrival: list[Any] | None = None
    generation: int = 0  # bumped by every transition and by leaving: a pending switch of an older one is void
    window_cursor: int = 0
    services: dict[str, _Draws] = field(default_factory=dict)


class _Sim:
    """One run's mutable state: the engine, the stations, per-request lists, the snapshot and the controller."""

    def __init__(self, cluster: Cluster, policy: Policy, trace: Sequence[TraceEvent], horizon_s: float, seed: int,
                 settings: AdaptSettings | None, model_load_s: float, policing: Policing, *, traffic: bool = True,
                 stop_at_rejection: bool = False, power: Mapping[str, NodePower] | None = None,
                 consolidation: ConsolidationSettings | None = None) -> None:
        self.cluster, self.policy, self.trace = cluster, policy, trace
        self.horizon_s, self.seed, self.settings = horizon_s, seed, settings
        self.model_load_s, self.policing = model_load_s, policing
        # without traffic only admission runs (replay_admission): no requests, no controller, every step kept
        self.traffic, self.stop_at_rejection = traffic, stop_at_rejection
        self.steps: list[TraceStep] | None = None if traffic else []
        self.engine = Engine()
        self.snapshot = Snapshot(cluster)
        n_apps = sum(isinstance(ev, Arrive) for ev in trace)
        self.n_apps = n_apps
        self.seeds = np.random.SeedSequence(seed).spawn(n_apps) if n_apps and traffic else []
        self.apps: dict[str, _AppRun] = {}
        self.runs: list[_AppRun | None] = [None] * n_apps  # by app index (None: rejected or not yet arrived)
        self.arrived = 0
        self.models: dict[str, int] = {}
        self.served: dict[str, int] = {}  # device path -> requests sent to it
        self.stations: dict[str, Station] = {}
        # per request, indexed by request id (stations read service/model/switch/app/cpu by id)
        self.r_app: list[int] = []
        self.r_arrive: list[float] = []  # ms
        self.r_done: list[float] = []  # ms, nan until answered (and for refused requests)
        self.r_refused: list[bool] = []
        self.r_service: list[float] = []
        self.r_model: list[int] = []
        self.r_switch: list[float] = []
        self.r_cpu: list[float] = []
        self.r_network: list[float] = []
        self.r_device: list[Callable[[float, int], None] | None] = []  # after a CPU stage: the device
        self.actions: list[Action] = []
        self.refused_moves: list[MoveRefused] = []
        self.rejected: list[RejectionRecord] = []
        self.findings: list[FindingRecord] = []
        self.state = AdaptState()
        self.order: list[str] = []  # admitted apps, in admission order
        # power (module doc): each node's state and meter, the devices' busy ms since the meters last moved
        self.power = power
        self.consolidation = consolidation
        self.node_of = {d.path: d.node for d in cluster.devices.values()}
        self.node_state = {n.name: PowerState.ON for n in cluster.nodes}
        self.draining: set[str] = set()
        self.meters = {n: EnergyMeter(p) for n, p in power.items()} if power is not None else {}
        self.busy_ms: dict[str, float] = {}
        self.app_energy: dict[str, float] = {}  # app -> the dynamic energy of its requests' service (J)
        self.meter_s = 0.0
        self.power_changes: list[PowerChange] = []
        self.pending: dict[str, tuple[int, Arrive, float]] = {}  # app -> (seed index, arrival, rate now)
        self.delayed: list[AdmissionDelay] = []
        self.starved = False
        self.util_hist: list[tuple[float, float]] = []  # (time s, observed mean utilization of the on devices)
        self.serving_from: dict[str, float] = {}  # app -> when its last transition serves (s)

    # ------------------------------------------------------------------------------------------ set-up

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
        if self.power is not None:
            self._meter(self.horizon_s)

    def _station(self, path: str) -> Station:
        st = self.stations.get(path)
        if st is not None:
            return st
        device = self.cluster.devices[path]
        if device.discipline is Discipline.BATCH:
            raise ValueError(f"device {path!r}: the cluster simulator does not simulate batch devices "
                             "(batching needs requests numbered in device-arrival order)")
        st = station_for(self.engine, self._done, device.discipline, servers=device.servers, service=self.r_service,
                         model=self.r_model, switch=self.r_switch, tenant=self.r_app, n_tenants=self.n_apps)
        self.stations[path] = st
        return st

    def _routes(self, run: _AppRun, placement: Placement) -> list[_Route]:
        """The routes of ``placement``: one per share, with the app's CPU stage (on the placement's node) in
        front of each device when it has one."""
        cpu: LimitedPsStation | None = None
        routes = []
        upto = 0.0
        for share in placement.shares:
            profile = self.snapshot.catalog.get(share.profile)
            tenant = tenant_for(run.app, profile, share.weight, share.fraction, share.instances)
            device = self._station(share.device)
            if isinstance(device, SpatialStation):
                # from now on the app's requests here run on its instances at their share; requests the
                # old instances hold finish there (Overlapped-Execution: they served until this switch)
                device.set_instances(run.index, share.instances)
            entry = device.arrive
            if tenant.cpu is not None:
                if cpu is None:  # one CPU stage for the app, whatever device a request goes to next
                    cpu = LimitedPsStation(self.engine, self._to_device, self.r_cpu, capacity=tenant.cpu.cores)
                entry = cpu.arrive
            upto += share.weight
            routes.append(_Route(upto, share.device, entry, device.arrive, self.models.setdefault(tenant.model, len(self.models)),
                                 tenant.switch_ms, self._service_draws(run, share.profile, tenant.service),
                                 tenant.network_ms, run.app.cpu_ms))
        routes[-1].upto = math.inf  # weights sum to 1 up to rounding: the last share takes the rest
        return routes

    def _service_draws(self, run: _AppRun, profile: str, dist: Distribution) -> _Draws:
        draws = run.services.get(profile)
        if draws is None:
            draws = run.services[profile] = _Draws(lambda n: dist.sample(run.service_rng, n))
        return draws

    # ---------------------------------------------------------------------------------------- the trace

    def _trace_event(self, now: float, ev: TraceEvent) -> None:
        now_s = now / 1000.0
        if isinstance(ev, Arrive):
            self._arrive(now_s, ev)
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
        run = self.apps.get(name)  # None when admission runs alone
        if isinstance(ev, Leave):
            self.snapshot = self.snapshot.without(name)
            if run is not None:
                run.left_s = now_s
                run.generation += 1
                self._cancel_next(run)
        elif isinstance(ev, Place):
            app = replace(self.snapshot.apps[name], rate_rps=float(ev.rate_rps))
            self.snapshot = self.snapshot.without(name).with_placement(app, ev.placement)
            if run is not None:
                run.generation += 1
                self._switch(now, (run, run.generation, app, ev.placement))
        elif run is not None:
            run.rate_rps = float(ev.rate_rps)
            # Poisson arrivals are memoryless: a fresh gap at the new rate from now is exact
            self._cancel_next(run)
            self._schedule_next(run, now)
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
        if isinstance(decision, Rejection) and self.consolidation is not None and self._asleep():
            # the nodes on cannot take it, switched-off ones could: it waits for one to wake, woken now (an
            # arrival is demand no trend foresees) unless one is waking already
            self.pending.setdefault(app.name, (index, ev, app.rate_rps))
            self.starved = True
            if not any(st is PowerState.WAKING for st in self.node_state.values()):
                self._wake_now(now_s)
            return
        if isinstance(decision, Rejection):
            self.rejected.append(RejectionRecord(now_s, app.name, decision.constraint, decision.message))
            self._step(now_s, ev, decision, False)
            if self.stop_at_rejection:
                self.engine.clear()
            return
        self.snapshot = self.snapshot.with_placement(app, decision)
        self._step(now_s, ev, decision, True)
        if not self.traffic:
            return
        arrival_rng, service_rng, route_rng = (np.random.default_rng(s) for s in self.seeds[index].spawn(3))
        periodic = app.periodic
        run = _AppRun(
            index=index, app=app, rate_rps=app.rate_rps,
            arrivals=_Draws(arrival_rng.random if periodic else arrival_rng.standard_exponential),
            service_rng=service_rng, route_u=_Draws(route_rng.random), routes=[],
            bucket=self._bucket(app, app.rate_rps, now_s, None), admitted_s=now_s,
            devices=[(now_s, _devices(decision))], contracts=[(now_s, app.rate_rps)])
        run.routes = self._routes(run, decision)
        self.apps[app.name] = run
        self.runs[index] = run
        self.order.append(app.name)
        now = now_s * 1000.0
        if periodic:  # a camera's first frame comes at a random phase within one period
            self._schedule_at(run, now + run.arrivals.next() * 1000.0 / app.rate_rps)
        else:
            self._schedule_next(run, now)

    def _bucket(self, app: App, contract_rps: float, now_s: float, old: Bucket | None) -> Bucket | None:
        if not self.policing.enabled:
            return None
        rate, burst = self.policing.contract(contract_rps, app.burst)
        return Bucket.full(rate, burst, now_s) if old is None else old.reconfigured(rate, burst, now_s)

    def _cancel_next(self, run: _AppRun) -> None:
        if run.next_arrival is not None:
            self.engine.cancel(run.next_arrival)
            run.next_arrival = None

    def _schedule_next(self, run: _AppRun, now: float) -> None:
        """The app's next request after ``now`` (ms), if it sends and it comes before the horizon."""
        rate = run.rate_rps
        if rate <= 0:
            return
        gap_ms = 1000.0 / rate if run.app.periodic else run.arrivals.next() * 1000.0 / rate
        self._schedule_at(run, now + gap_ms)

    def _schedule_at(self, run: _AppRun, t: float) -> None:
        """The app's next request at ``t`` (ms), unless that is past the horizon (arrivals stop there)."""
        if t < self.horizon_s * 1000.0:
            run.next_arrival = self.engine.schedule(t, PRIO_ARRIVAL, self._request, run)
        else:
            run.next_arrival = None

    # ------------------------------------------------------------------------------------- requests

    def _request(self, now: float, run: _AppRun) -> None:
        req = len(self.r_app)
        self.r_app.append(run.index)
        self.r_arrive.append(now)
        self.r_done.append(math.nan)
        self.r_service.append(0.0)
        self.r_model.append(0)
        self.r_switch.append(0.0)
        self.r_cpu.append(0.0)
        self.r_network.append(0.0)
        self.r_device.append(None)
        run.requests.append(req)
        self._schedule_next(run, now)
        wait_s = 0.0
        if run.bucket is not None:
            admission, run.bucket = run.bucket.admit(now / 1000.0, self.policing.max_wait_s)
            if not admission.admitted:
                self.r_refused.append(True)
                return
            wait_s = admission.wait_s
        self.r_refused.append(False)
        if wait_s > 0.0:
            self.engine.schedule(now + wait_s * 1000.0, PRIO_ARRIVAL, self._send, req)
        else:
            self._send(now, req)

    def _send(self, now: float, req: int) -> None:
        """Route ``req`` by the placement serving now and hand it to its first station."""
        run = self.runs[self.r_app[req]]
        assert run is not None  # only admitted apps send
        routes = run.routes
        route = routes[0]
        if len(routes) > 1:
            u = run.route_u.next()
            route = next(r for r in routes if u < r.upto)
        self.r_service[req] = route.service.next()
        self.r_model[req] = route.model
        self.r_switch[req] = route.switch_ms
        self.r_cpu[req] = route.cpu_ms
        self.r_network[req] = route.network_ms
        if route.entry is not route.device:
            self.r_device[req] = route.device
        self.served[route.path] = self.served.get(route.path, 0) + 1
        if self.power is not None:  # the device's busy time, counted in the meter interval the request is sent
            self.busy_ms[route.path] = self.busy_ms.get(route.path, 0.0) + self.r_service[req]
            dyn = self.power[self.node_of[route.path]].dynamic_w.get(route.path, 0.0)
            self.app_energy[run.app.name] = self.app_energy.get(run.app.name, 0.0) + dyn * self.r_service[req] / 1000.0
        route.entry(now, req)

    def _to_device(self, now: float, req: int) -> None:
        """A request leaving its app's CPU stage goes on to the device its route chose."""
        device = self.r_device[req]
        assert device is not None  # set by _send for every request that has a CPU stage
        device(now, req)

    def _done(self, now: float, req: int) -> None:
        self.r_done[req] = now

    # ------------------------------------------------------------------------------------ the controller

    def _control(self, now: float, start_s: float) -> None:
        """One step of the adaptation loop on the window ``[start_s, now)`` and the transitions it plans; then,
        with consolidation, one step of its planner."""
        settings = self.settings
        assert settings is not None  # ticks are scheduled only with settings
        now_s = now / 1000.0
        if self.power is not None:
            self._meter(now_s)
        windows = {name: self._window(self.apps[name], start_s, now_s, now) for name in self.snapshot.placements}
        # each app's declared contract, the one it arrived with: reclamation never goes below it
        declared = {name: self.apps[name].contracts[0][1] for name in self.snapshot.placements}
        # the loop plans on the nodes that are on: nothing is moved onto a switched-off or waking node
        res = step(self.state, self.policy, self._live(), windows, settings, now_s, declared=declared)
        self.state = res.state
        self.findings += [FindingRecord(now_s, f.kind, f.app, f.devices, f in res.acted) for f in res.findings]
        self.refused_moves += [MoveRefused(now_s, r.app, r.rate_rps, r.rejection.message) for r in res.plan.refused]
        if res.plan.refused:
            self.starved = True  # an app found no room: a switched-off node may have it
        for t in res.plan.transitions:
            self._carry(now, now_s, t)
        if self.consolidation is not None:
            self._consolidate(now, now_s, windows, frozenset(t.app for t in res.plan.transitions))

    def _carry(self, now: float, now_s: float, t: Transition) -> None:
        """Carry a planned transition out, make before break (module doc)."""
        run = self.apps[t.app]
        before = self.snapshot.placements[t.app]
        # admission's view changes at once, so that nothing else is admitted into the room it takes
        self.snapshot = t.applied(self.snapshot)
        faster = self.snapshot.apps[t.app]
        run.generation += 1
        # the same pieces at a new contract, or new weights over them (a re-partition), load nothing:
        # the bucket and the routing change at once; a piece on a new device waits for its model, and
        # a re-share's new instances load beside the old ones, which serve until then (overlapped)
        kind = transition_kind(before, t.placement)
        serve_s = now_s + (self.model_load_s if kind in ("moved", "reshared") else 0.0)
        self.serving_from[t.app] = serve_s
        self.actions.append(Action(now_s, serve_s, t.app, _devices(before), _devices(t.placement), t.rate_rps,
                                   t.reason.kind, t.reason.detail, kind))
        self.engine.schedule(serve_s * 1000.0, PRIO_ARRIVAL, self._switch,
                             (run, run.generation, faster, t.placement))

    # ------------------------------------------------------------------------------------------- power

    def _asleep(self) -> bool:
        """Whether a node is off or waking (a node that admission cannot use now but could later)."""
        return any(st is not PowerState.ON for st in self.node_state.values())

    def _live(self) -> Snapshot:
        """Admission's snapshot on the nodes that are on (switched-off and waking ones hold nothing)."""
        if not self._asleep():
            return self.snapshot
        asleep = frozenset(n for n, st in self.node_state.items() if st is not PowerState.ON)
        return live_snapshot(self.snapshot, asleep)[0]

    def _meter(self, now_s: float) -> None:
        """Close every node's energy interval up to ``now_s`` (s) in its current state."""
        dt = max(0.0, now_s - self.meter_s)
        by_node: dict[str, dict[str, float]] = {n: {} for n in self.meters}
        for path, ms in self.busy_ms.items():
            # a backlog sent in one interval is busy time of the next ones too: capped at the interval
            by_node[self.node_of[path]][path] = min(ms / 1000.0, dt)
        self.busy_ms.clear()
        for node, meter in self.meters.items():
            state = self.node_state[node]
            meter.advance(now_s, state, by_node[node] if state is PowerState.ON else None)
        self.meter_s = max(self.meter_s, now_s)

    def _set_state(self, now_s: float, node: str, state: PowerState | str, reason: str) -> None:
        if isinstance(state, PowerState):
            self._meter(now_s)
            self.node_state[node] = state
        self.power_changes.append(PowerChange(now_s, node, state.value if isinstance(state, PowerState) else state,
                                              reason))

    def _consolidate(self, now: float, now_s: float, windows: Mapping[str, AppWindow], moved: frozenset[str]) -> None:
        """One consolidation step: switch off the emptied nodes, wake ahead of demand, drain a node."""
        assert self.consolidation is not None and self.power is not None
        on = frozenset(n for n, st in self.node_state.items() if st is PowerState.ON)
        u = observed_utilization(self.snapshot, windows, on)
        self.util_hist.append((now_s, u))
        trend = utilization_trend(self.util_hist)
        busy = moved | frozenset(a for a, t in self.serving_from.items() if t > now_s)
        view = PowerView(off=frozenset(n for n, st in self.node_state.items() if st is PowerState.OFF),
                         waking=frozenset(n for n, st in self.node_state.items() if st is PowerState.WAKING),
                         draining=frozenset(self.draining), wake_s={n: p.wake_s for n, p in self.power.items()})
        plan = consolidate_plan(self.policy, self.snapshot, view, self.consolidation, trend_per_s=trend,
                                starved=self.starved, exclude=busy, observed_utilization=u)
        self.starved = False
        why = "; ".join(plan.reasons)
        for node in plan.switch_off:
            if holding(self.snapshot, node):  # the planner never lists one; a bug if it did
                raise RuntimeError(f"consolidation listed node {node} for switching off while it holds "
                                   f"{', '.join(holding(self.snapshot, node))}")
            self.draining.discard(node)
            self._set_state(now_s, node, PowerState.OFF, why)
        for node in plan.undrain:
            self.draining.discard(node)
            self._set_state(now_s, node, "on", why)
        for node in plan.wake:
            self._set_state(now_s, node, PowerState.WAKING, why)
            self.engine.schedule((now_s + self.power[node].wake_s) * 1000.0, PRIO_TIMER, self._woken, node)
        for t in plan.transitions:
            self._carry(now, now_s, t)
        for node in plan.draining:
            self.draining.add(node)
            self._set_state(now_s, node, "draining", why)

    def _wake_now(self, now_s: float) -> None:
        """Wake the node the consolidation planner picks for an app that found no room, at once."""
        assert self.consolidation is not None and self.power is not None
        view = PowerView(off=frozenset(n for n, st in self.node_state.items() if st is PowerState.OFF),
                         waking=frozenset(), draining=frozenset(self.draining),
                         wake_s={n: p.wake_s for n, p in self.power.items()})
        plan = consolidate_plan(self.policy, self.snapshot, view, self.consolidation, starved=True)
        for node in plan.undrain:
            self.draining.discard(node)
            self._set_state(now_s, node, "on", "; ".join(plan.reasons))
        for node in plan.wake:
            self._set_state(now_s, node, PowerState.WAKING, "; ".join(plan.reasons))
            self.engine.schedule((now_s + self.power[node].wake_s) * 1000.0, PRIO_TIMER, self._woken, node)

    def _woken(self, now: float, node: str) -> None:
        """``node`` finished waking: it serves from now, and the arrivals that waited are admitted again."""
        now_s = now / 1000.0
        if self.node_state[node] is not PowerState.WAKING:
            return
        self._set_state(now_s, node, PowerState.ON, f"{node} woke")
        for name, (index, ev, rate) in list(self.pending.items()):
            decision = self.policy.decide(ev.app, self._live())
            if isinstance(decision, Rejection):
                if not self._asleep():  # every node is on and it still does not fit: a rejection after all
                    del self.pending[name]
                    self.delayed.append(AdmissionDelay(name, ev.time_s, None, rate))
                    self.rejected.append(RejectionRecord(now_s, name, decision.constraint, decision.message))
                else:
                    self.starved = True
                continue
            del self.pending[name]
            self.delayed.append(AdmissionDelay(name, ev.time_s, now_s, rate))
            self._arrive(now_s, replace(ev, placement=decision), index)
            run = self.apps[name]
            if rate != run.rate_rps:  # it changed its rate while it waited
                run.rate_rps = rate
                self._cancel_next(run)
                self._schedule_next(run, now)

    def _window(self, run: _AppRun, start_s: float, end_s: float, now: float) -> AppWindow:
        """What the monitor sees of ``run`` at ``now`` (ms) for ``[start_s, end_s)``: arrivals, refusals, and
        the latencies of the requests answered by now (see the module doc)."""
        reqs = run.requests
        k = run.window_cursor
        end_ms = end_s * 1000.0
        arrivals = refused = 0
        lat: list[float] = []
        while k < len(reqs) and self.r_arrive[reqs[k]] < end_ms:
            r = reqs[k]
            arrivals += 1
            if self.r_refused[r]:
                refused += 1
            elif self.r_done[r] <= now:  # False for nan: not answered yet
                lat.append(self.r_done[r] - self.r_arrive[r] + self.r_network[r])
            k += 1
        run.window_cursor = k
        return AppWindow(run.app.name, start_s, end_s, arrivals, refused, 0, LatencySummary.of(lat))

    def _switch(self, now: float, data: tuple[_AppRun, int, App, Placement]) -> None:
        """The new placement of a transition serves from now (its model is loaded), at the new contract."""
        run, generation, app, placement = data
        if generation != run.generation:  # the app left or moved again meanwhile
            return
        now_s = now / 1000.0
        run.app = app
        run.routes = self._routes(run, placement)
        run.bucket = self._bucket(app, app.rate_rps, now_s, run.bucket)
        run.devices.append((now_s, _devices(placement)))
        run.contracts.append((now_s, app.rate_rps))

    # ---------------------------------------------------------------------------------------- results

    def result(self, window_s: float) -> ClusterRun:
        arrive = np.asarray(self.r_arrive) / 1000.0
        lat = np.asarray(self.r_done) - np.asarray(self.r_arrive) + np.asarray(self.r_network)  # ms, nan: none
        refused = np.asarray(self.r_refused, dtype=bool)
        rows: list[WindowRow] = []
        totals: list[AppTotals] = []
        for name in self.order:
            run = self.apps[name]
            idx = np.asarray(run.requests, dtype=np.intp)
            a, x, rf = arrive[idx], lat[idx], refused[idx]
            slo = run.app.slo.latency_ms
            answered = ~np.isnan(x)
            within = answered & (np.nan_to_num(x, nan=np.inf) <= slo)
            totals.append(AppTotals(name, int(idx.size), int(rf.sum()), int(answered.sum()), int(within.sum())))
            end_s = run.left_s if run.left_s is not None else self.horizon_s
            first = math.floor(run.admitted_s / window_s + 1e-9)
            last = max(first + 1, math.ceil(end_s / window_s - 1e-9))
            # an app's requests are recorded in arrival order, so each window is a slice of them
            which = np.floor(a / window_s + 1e-12).astype(np.int64)
            cuts = np.searchsorted(which, np.arange(first, last + 1), side="left")
            for k, lo, hi in zip(range(first, last), cuts[:-1], cuts[1:]):
                ok = answered[lo:hi]
                xs = x[lo:hi][ok]
                t0, t1 = k * window_s, (k + 1) * window_s
                stats = (float(xs.mean()), *(float(v) for v in np.percentile(xs, [95.0, 99.0]))) if xs.size \
                    else (None, None, None)
                rows.append(WindowRow(t0, t1, name, int(hi - lo), int(rf[lo:hi].sum()), int(xs.size),
                                      int(within[lo:hi].sum()), stats[0], stats[1], stats[2],
                                      float(hi - lo) / window_s, _at(run.contracts, t1), _at(run.devices, t1)))
        energy = tuple(NodeEnergy(n, m.joules, m.seconds["on"], m.seconds["waking"], m.seconds["off"])
                       for n, m in self.meters.items())
        delayed = self.delayed + [AdmissionDelay(name, ev.time_s, None, rate)
                                  for name, (_, ev, rate) in self.pending.items()]
        return ClusterRun(self.horizon_s, self.seed, window_s, tuple(rows), tuple(self.actions),
                          tuple(self.refused_moves), tuple(self.rejected), tuple(self.findings), tuple(totals),
                          tuple((p, self.served[p]) for p in self.cluster.devices if p in self.served),
                          self.engine.executed, energy=energy,
                          app_energy=tuple((a, self.app_energy[a]) for a in self.order if a in self.app_energy),
                          power_changes=tuple(self.power_changes), delayed=tuple(delayed))


def _devices(placement: Placement) -> tuple[str, ...]:
    return tuple(share.device for share in placement.shares)


def _at(history: list[tuple[float, Any]], t_s: float) -> Any:
    """The value of a step history ``[(from time s, value), ...]`` just before ``t_s`` (the first value
    before the history starts)."""
    value = history[0][1]
    for since, v in history:
        if since >= t_s:
            break
        value = v
    return value
