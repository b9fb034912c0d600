"""The cluster simulator's results: per-window rows, per-app totals, what the controller did (its cycle's
actions as records), energy, delays and node failures, all in one :class:`ClusterRun`. Units: seconds
(``*_s``), ms (latencies), req/s (rates), J (energy). See ``sim.cluster``."""

from __future__ import annotations

import math
from dataclasses import dataclass

from edgemux.adapt.cycle import CycleAction
from edgemux.adapt.monitor import AppWindow
from edgemux.cluster.power import J_PER_KWH
from edgemux.cluster.state import Placement
from edgemux.policies.base import Rejection, Snapshot
from edgemux.sim.trace import TraceEvent

__all__ = ["Action", "AdmissionDelay", "AppTotals", "ClusterRun", "FindingRecord", "MoveRefused", "NodeEnergy",
           "NodeFailure", "PowerChange", "RejectionRecord", "TraceStep", "WindowRow"]


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
    and ``within_slo`` (answered within the SLO's latency); ``lost``: requests a node failure took (neither
    refused nor answered: :class:`NodeFailure`)."""

    app: str
    requests: int
    refused: int
    answered: int
    within_slo: int
    lost: int = 0

    @property
    def attainment(self) -> float | None:
        """Requests answered within the SLO latency / all requests, refused ones included (None: none sent)."""
        return self.within_slo / self.requests if self.requests else None


@dataclass(frozen=True)
class NodeFailure:
    """Node ``node`` failed at ``time_s`` (s, a ``Fail`` event): ``in_flight`` requests were on its devices or
    CPU stages then (queued or in service) and are lost; ``routed`` more were sent there afterwards, before
    their apps left it, and are lost too (a failed node answers nothing)."""

    node: str
    time_s: float
    in_flight: int
    routed: int


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
    failures: tuple[NodeFailure, ...] = ()
    """The nodes that failed, in time order, with the requests each failure lost."""
    decisions: tuple[tuple[float, CycleAction], ...] = ()
    """Every action of the controller's cycles (``adapt.cycle``) and of its arrival path, with its time (s), in
    the order carried out: what a control plane fed the same observations decides too."""
    monitored: tuple[tuple[float, tuple[AppWindow, ...]], ...] = ()
    """What the controller's monitor saw: per cycle, its window's end (s) and the ``AppWindow`` of every placed
    app (admission order), the cycle's input; what a control plane replaying the run is fed."""

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
