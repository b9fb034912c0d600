"""One adaptation cycle: everything a controller decides in one window, as one pure function, and the order
in which its actions are to be carried out.

Two drivers run it: the cluster simulator (``sim.cluster``, in virtual time) and the control plane (through
its agents, in real time). Each builds the inputs from what it observed, calls :func:`cycle` once per window
(``AdaptSettings.window_s``), keeps the returned :class:`CycleState` for the next window and carries out the
returned actions in order; neither decides anything itself. The order, written down once:

1. **Power tick** (with power states): a ``Woke`` for every waking node whose wake-up time came during the
   window (``PowerView.ready_s`` < now; name order). It serves: the rest of the cycle plans with it. A node
   ready exactly at the window's end serves from that instant on, after the window's decisions (the window
   is ``[start, end)``): the simulator sets it on right after them, at its exact wake time, and a control
   plane does the same by calling :func:`power_tick` once the window's actions are carried out.
2. **Calibrate** (with observations and the base catalog): the catalog with every profile measured often
   enough replaced by what was measured (``adapt.calibrate``) and, with ``AdaptSettings.fit_windows``, every
   other profile of an app with enough answers fitted to the apps' end-to-end windows (``adapt.fit``; a
   profile fitted before keeps its fit through a window too thin to fit), as one ``Recalibrated`` when it is
   not the snapshot's; the rest of the cycle, and admission after it, use it.
3. **Detect, damp, plan** (``adapt.loop.step``) on the nodes that are on (off and waking ones left out, as
   ``adapt.plan.live_snapshot`` leaves them), apps with a move in flight (``busy``) left alone and their
   windows unread: a ``Found`` for every finding of the window (detect's order) saying whether it was acted
   on and whether that is new (acted on now, not in the last window: *once when it starts to count*); an
   ``Unexplained`` for every unexplained hotspot that starts to count; a ``Refused`` for every move that found
   no room, saying whether it is new (*once while it lasts*: the same app, finding and constraint were not
   refused in the last window); a ``Move`` for every transition, in the plan's order (evacuations first),
   with what it takes (``adapt.plan.transition_kind``).
4. **Consolidate** (with ``ConsolidationSettings`` and power states; ``adapt.consolidate``), on the snapshot
   with this window's moves applied and the nodes whose agent is dead left out (a node that does not answer
   can be neither drained nor switched through its agent), in the planner's own order: ``SwitchOff`` (a
   draining node that holds nothing; the cycle stops with an error if one held a tenant: a planner bug),
   ``Undrain``, ``Wake``, a ``Move`` for each app leaving the node being drained (reason ``consolidate``),
   and ``Drain``. The wake rule's input is the on devices' observed utilization (``observed_utilization``)
   and its trend over the last windows (kept in the state); an app that found no room since the last
   consolidation (a refused move, or an arrival: :func:`wake_for_arrival`) wakes a node (``starved``).

The state carries what lies between windows: the loop's ``AdaptState``, the utilization samples of the trend,
``starved``, and the keys of the findings acted on and of the moves refused in the last window.

Between windows, two small functions of the same rules: :func:`power_tick` (the nodes whose wake-up time has
come, at or before now: the simulator calls it at a node's exact wake time, a control plane after a window's
actions and before an apply) and
:func:`wake_for_arrival` (an arriving app found no room on the nodes that are on while others are off: wake
the node the consolidation planner picks, unless one is waking already).

Carrying out (both drivers): a ``Move`` make before break, at ``transition.rate_rps`` (the new contract);
``Woke``/``Undrain`` set the node on, ``Wake`` waking (it serves ``wake_s`` later), ``Drain`` draining,
``SwitchOff`` off (the control plane through the agent, which may refuse: the node then stays draining and a
later cycle tries again); ``Found``/``Unexplained``/``Refused`` are recorded (the control plane's events are
the new ones). Every action has a ``key()`` (kind, subject, devices, reason...) and ``to_json()``, the same
from either driver, so that two runs of one trace can be compared action by action.

Pure: the clock (``now_s``, s) and every observation come in as arguments.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from edgemux.adapt.calibrate import Observed, calibrated_catalog
from edgemux.adapt.fit import FITTED, fit_windows
from edgemux.adapt.consolidate import (TREND_WINDOWS, ConsolidationSettings, PowerView, consolidate_plan, holding,
                                      observed_utilization, utilization_trend)
from edgemux.adapt.detect import Finding
from edgemux.adapt.loop import AdaptState, step
from edgemux.adapt.monitor import AppWindow
from edgemux.adapt.plan import Refusal, Transition, live_snapshot, transition_kind
from edgemux.adapt.settings import AdaptSettings
from edgemux.cluster.state import Placement
from edgemux.policies.base import Policy, Snapshot
from edgemux.profiles.catalog import Catalog
from edgemux.profiles.types import Profile

__all__ = ["ACTION_KINDS", "Cycle", "CycleAction", "CycleState", "Drain", "Found", "Move", "Recalibrated",
           "Refused", "SwitchOff", "Undrain", "Unexplained", "Wake", "Woke", "cycle", "power_tick",
           "wake_for_arrival"]

ActionKey = tuple[object, ...]


@dataclass(frozen=True)
class CycleState:
    """What the cycle keeps between windows: the loop's state (``adapt``), the last ``TREND_WINDOWS + 1``
    samples (time s, observed mean utilization of the on devices) of the wake rule's trend, whether an app
    found no room since the last consolidation (``starved``), and the keys of the findings acted on
    (``acted``) and of the moves refused (``refused``: app, finding key, constraint) in the last window."""

    adapt: AdaptState = field(default_factory=AdaptState)
    utilization: tuple[tuple[float, float], ...] = ()
    starved: bool = False
    acted: frozenset[tuple[str, str]] = frozenset()
    refused: frozenset[tuple[str, tuple[str, str], str]] = frozenset()


# ----------------------------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class Woke:
    """Waking node ``node`` serves from now (its wake-up time has come)."""

    node: str
    kind = "woke"

    def key(self) -> ActionKey:
        return (self.kind, self.node)

    def to_json(self) -> dict[str, object]:
        return {"action": self.kind, "node": self.node}


@dataclass(frozen=True)
class Recalibrated:
    """The catalog to use from now on: the base catalog with the ``profiles`` calibrated from what the devices
    measured (all of them, every window: the moments grow); ``first``: the names calibrated for the first
    time (the control plane's ``calibrated`` events)."""

    catalog: Catalog
    profiles: tuple[Profile, ...]
    first: tuple[str, ...]
    kind = "recalibrated"

    def key(self) -> ActionKey:
        return (self.kind, None, tuple(p.name for p in self.profiles), self.first)

    def to_json(self) -> dict[str, object]:
        return {"action": self.kind, "profiles": [p.name for p in self.profiles], "first": list(self.first)}


@dataclass(frozen=True)
class Found:
    """A finding of this window; ``acted``: seen for ``trigger_windows`` windows (or a dead agent) and acted
    on; ``first``: acted on now and not in the last window (the one event a finding gives while it lasts)."""

    finding: Finding
    acted: bool
    first: bool
    kind = "finding"

    def key(self) -> ActionKey:
        f = self.finding
        return (self.kind, f.app if f.app is not None else f.node, f.devices, f.kind, self.acted, self.first)

    def to_json(self) -> dict[str, object]:
        return {"action": self.kind, "finding": self.finding.to_json(), "acted": self.acted, "first": self.first}


@dataclass(frozen=True)
class Unexplained:
    """A hotspot no over-contract tenant explains (the profiles are off, not the load), reported when it
    starts to count."""

    finding: Finding
    kind = "unexplained"

    def key(self) -> ActionKey:
        f = self.finding
        return (self.kind, f.app if f.app is not None else f.node, f.devices, f.kind)

    def to_json(self) -> dict[str, object]:
        return {"action": self.kind, "finding": self.finding.to_json()}


@dataclass(frozen=True)
class Refused:
    """A move the planner wanted but found no room for; ``first``: not refused (same app, finding and
    constraint) in the last window (the one event a refusal gives while it lasts)."""

    refusal: Refusal
    first: bool
    kind = "refused"

    def key(self) -> ActionKey:
        r = self.refusal
        return (self.kind, r.app, r.reason.devices, r.reason.kind, r.rejection.constraint, self.first)

    def to_json(self) -> dict[str, object]:
        return {"action": self.kind, **self.refusal.to_json(), "first": self.first}


@dataclass(frozen=True)
class Move:
    """Carry ``transition`` out, make before break: the app leaves ``old`` (at contract ``old_rate_rps``,
    req/s) for ``transition.placement`` at ``transition.rate_rps``; ``what`` it takes is
    ``adapt.plan.transition_kind`` ("contract", "repartitioned", "reshared" or "moved")."""

    transition: Transition
    what: str
    old: Placement
    old_rate_rps: float
    kind = "move"

    @property
    def app(self) -> str:
        return self.transition.app

    def key(self) -> ActionKey:
        t = self.transition
        return (self.kind, t.app, tuple(s.device for s in t.placement.shares), t.reason.kind, self.what)

    def to_json(self) -> dict[str, object]:
        return {"action": self.kind, "what": self.what, **self.transition.to_json(),
                "from": [{"device": s.device, "weight": s.weight} for s in self.old.shares],
                "from_rate_rps": self.old_rate_rps}


@dataclass(frozen=True)
class _NodeChange:
    """A power action on ``node`` that carries nothing but the planner's ``reason``, in words."""

    node: str
    reason: str
    kind = ""

    def key(self) -> ActionKey:
        return (self.kind, self.node)

    def to_json(self) -> dict[str, object]:
        return {"action": self.kind, "node": self.node, "reason": self.reason}


@dataclass(frozen=True)
class SwitchOff(_NodeChange):
    """Switch ``node`` off: it is draining and holds no tenant."""

    kind = "switch-off"


@dataclass(frozen=True)
class Undrain(_NodeChange):
    """``node`` stops draining and is on (its drain cannot finish, or a node is woken)."""

    kind = "undrain"


@dataclass(frozen=True)
class Wake:
    """Switch ``node`` on: it is waking and serves ``wake_s`` (s) later."""

    node: str
    wake_s: float
    reason: str
    kind = "wake"

    def key(self) -> ActionKey:
        return (self.kind, self.node)

    def to_json(self) -> dict[str, object]:
        return {"action": self.kind, "node": self.node, "wake_s": self.wake_s, "reason": self.reason}


@dataclass(frozen=True)
class Drain:
    """``node`` starts draining: ``apps`` move off it (the ``Move``\\ s before this action)."""

    node: str
    apps: tuple[str, ...]
    reason: str
    kind = "drain"

    def key(self) -> ActionKey:
        return (self.kind, self.node, self.apps)

    def to_json(self) -> dict[str, object]:
        return {"action": self.kind, "node": self.node, "apps": list(self.apps), "reason": self.reason}


CycleAction = Woke | Recalibrated | Found | Unexplained | Refused | Move | SwitchOff | Undrain | Wake | Drain
ACTION_KINDS = tuple(c.kind for c in (Woke, Recalibrated, Found, Unexplained, Refused, Move, SwitchOff, Undrain,
                                      Wake, Drain))


@dataclass(frozen=True)
class Cycle:
    """A cycle's outcome: the ``state`` for the next window and the ``actions`` to carry out, in order."""

    state: CycleState
    actions: tuple[CycleAction, ...]


# -------------------------------------------------------------------------------------------------- cycle


def cycle(state: CycleState, policy: Policy, snapshot: Snapshot, windows: Mapping[str, AppWindow],
          settings: AdaptSettings, now_s: float, *, consolidation: ConsolidationSettings | None = None,
          power: PowerView | None = None, last_seen_s: Mapping[str, float] | None = None,
          declared: Mapping[str, float] | None = None, busy: frozenset[str] = frozenset(),
          observed: Mapping[str, Observed] | None = None, base_catalog: Catalog | None = None) -> Cycle:
    """One window's decisions, in the module doc's order. ``snapshot``: admission's, every node of the
    cluster in it (switched-off and waking ones hold nothing), with the catalog in force; ``windows``: this
    window's ``AppWindow`` per app that was observed; ``now_s``: the window's end (s, the driver's clock).
    ``power``: the nodes' power states (None: every node on and no consolidation); ``consolidation`` (needs
    ``power``): run its planner; ``last_seen_s``: node -> when its agent was last heard from (s, same clock),
    for ``agent-dead``; ``declared``: app -> its declared contract (req/s), for reclamation; ``busy``: the apps
    with a move planned or in flight (no planner touches them, their windows are not read); ``observed``
    (profile name -> its measured service-time moments) with ``base_catalog`` (what calibration starts
    from): re-calibrate."""
    if consolidation is not None and power is None:
        raise ValueError("consolidation needs the nodes' power states")
    actions: list[CycleAction] = []
    # 1. the power tick: a node whose wake-up time came in the window serves, and the window plans with it
    if power is not None:
        woke = tuple(w for w in power_tick(power, now_s) if power.ready_s[w.node] < now_s)
        actions += woke
        power = _woken(power, woke)
    # 2. calibration: the rest of the cycle reads the calibrated figures
    if base_catalog is not None and (observed is not None or settings.fit_windows):
        fit_on = {a: w for a, w in windows.items() if a not in busy} if settings.fit_windows else None
        recal = _recalibrate(snapshot, base_catalog, observed or {}, settings, fit_on)
        if recal is not None:
            actions.append(recal)
            snapshot = Snapshot(snapshot.cluster, snapshot.apps, snapshot.placements, recal.catalog)
    # 3. detect, damp, plan on the nodes that are on
    asleep = power.asleep if power is not None else frozenset()
    live = live_snapshot(snapshot, asleep)[0] if asleep else snapshot
    read = {a: w for a, w in windows.items() if a not in busy} if busy else windows
    res = step(state.adapt, policy, live, read, settings, now_s, last_seen_s=last_seen_s, declared=declared,
               busy=busy)
    acted = frozenset(f.key for f in res.acted)
    new = acted - state.acted
    acted_now = {id(f) for f in res.acted}  # the acted findings are among the findings, the same objects
    for f in res.findings:
        counts = id(f) in acted_now
        actions.append(Found(f, counts, counts and f.key in new))
    actions += [Unexplained(f) for f in res.plan.unexplained if f.key in new]
    refused = frozenset((r.app, r.reason.key, r.rejection.constraint) for r in res.plan.refused)
    actions += [Refused(r, (r.app, r.reason.key, r.rejection.constraint) not in state.refused)
                for r in res.plan.refused]
    # an app found no room: a switched-off node may have it
    starved = state.starved or (consolidation is not None and bool(res.plan.refused))
    current = snapshot
    for t in res.plan.transitions:
        actions.append(_move(current, t))
        current = t.applied(current)
    out = CycleState(res.state, state.utilization, starved, acted, refused)
    # 4. consolidation, on the snapshot with this window's moves applied
    if consolidation is not None and power is not None:
        moved = frozenset(t.app for t in res.plan.transitions)
        out, more = _consolidate(out, policy, current, windows, power, consolidation, now_s,
                                 _dead(snapshot, last_seen_s, settings, now_s), busy | moved)
        actions += more
    return Cycle(out, tuple(actions))


def power_tick(power: PowerView, now_s: float) -> tuple[Woke, ...]:
    """A ``Woke`` for every waking node whose ready time (``power.ready_s``) is at or before ``now_s`` (s),
    in name order: what a driver calls between windows (the cycle's own tick takes those ready before the
    window's end, module doc)."""
    return tuple(Woke(n) for n in sorted(power.waking) if n in power.ready_s and power.ready_s[n] <= now_s)


def wake_for_arrival(state: CycleState, policy: Policy, snapshot: Snapshot, power: PowerView,
                     consolidation: ConsolidationSettings) -> tuple[CycleState, tuple[CycleAction, ...]]:
    """An arriving app found no room on the nodes that are on (admission rejected it on them): with a node off
    or waking, the state is ``starved`` (the next consolidation wakes a node if none is waking then), and
    unless a node is waking already the node the consolidation planner picks is woken now (``Undrain`` for
    the draining nodes, then ``Wake``): an arrival is demand no trend foresees. With every node on nothing
    changes (the rejection stands). ``snapshot``: admission's, every node in it."""
    if not power.asleep:
        return state, ()
    state = replace(state, starved=True)
    if power.waking:
        return state, ()
    plan = consolidate_plan(policy, snapshot, power, consolidation, starved=True)
    why = "; ".join(plan.reasons)
    actions: list[CycleAction] = [Undrain(n, why) for n in plan.undrain]
    actions += [Wake(n, power.wake_s.get(n, 0.0), why) for n in plan.wake]
    return state, tuple(actions)


# ------------------------------------------------------------------------------------------------ helpers


def _woken(power: PowerView, woke: tuple[Woke, ...]) -> PowerView:
    """``power`` with the nodes of ``woke`` on."""
    if not woke:
        return power
    on = {w.node for w in woke}
    return replace(power, waking=power.waking - on, ready_s={n: t for n, t in power.ready_s.items() if n not in on})


def _recalibrate(snapshot: Snapshot, base: Catalog, observed: Mapping[str, Observed], settings: AdaptSettings,
                 windows: Mapping[str, AppWindow] | None) -> Recalibrated | None:
    """The catalog calibrated from ``observed`` (profiles the base catalog has) and, with ``windows``, the
    profiles no device measured ``calibration_samples`` times fitted to the apps' end-to-end windows
    (``adapt.fit``, at least ``min_samples`` answers each); None when it is the snapshot's already (nothing
    calibrated, none before)."""
    current = snapshot.catalog
    catalog, changed = calibrated_catalog(base, {n: o for n, o in observed.items() if n in base.profiles},
                                          settings.calibration_samples)
    if windows is not None:
        measured = frozenset(p.name for p in changed)
        fits = {n: f.profile for n, f in fit_windows(snapshot, windows, catalog, min_samples=settings.min_samples,
                                                      skip=measured).items()}
        # a profile fitted before and not this window (too few answers now) keeps its last fit
        fits.update({n: p for n, p in current.profiles.items()
                     if p.provenance.source == FITTED and n not in fits and n not in measured and n in base.profiles})
        if fits:
            fitted = tuple(fits[n] for n in sorted(fits))
            catalog, changed = catalog.with_profiles(list(fitted)), changed + fitted
    if catalog is current:
        return None
    before = current.profiles
    first = tuple(p.name for p in changed
                  if p.name in before and before[p.name].provenance.source != p.provenance.source)
    return Recalibrated(catalog, changed, first)


def _move(snapshot: Snapshot, t: Transition) -> Move:
    old = snapshot.placements[t.app]
    return Move(t, transition_kind(old, t.placement), old, snapshot.apps[t.app].rate_rps)


def _dead(snapshot: Snapshot, last_seen_s: Mapping[str, float] | None, settings: AdaptSettings,
          now_s: float) -> frozenset[str]:
    """The nodes whose agent was not heard from for ``dead_after_s`` (``adapt.detect``'s rule)."""
    if not last_seen_s:
        return frozenset()
    return frozenset(n.name for n in snapshot.cluster.nodes
                     if n.name in last_seen_s and now_s - last_seen_s[n.name] > settings.dead_after_s)


def _consolidate(state: CycleState, policy: Policy, snapshot: Snapshot, windows: Mapping[str, AppWindow],
                 power: PowerView, settings: ConsolidationSettings, now_s: float, dead: frozenset[str],
                 exclude: frozenset[str]) -> tuple[CycleState, list[CycleAction]]:
    """Step 4 of the module doc on ``snapshot`` (this window's moves applied)."""
    on = frozenset(n.name for n in snapshot.cluster.nodes) - power.asleep - dead
    u = observed_utilization(snapshot, windows, on)
    history = (state.utilization + ((now_s, u),))[-(TREND_WINDOWS + 1):]
    if dead:  # a node that does not answer is neither drained, nor woken, nor switched
        snapshot, stranded = live_snapshot(snapshot, dead)
        exclude = exclude | frozenset(stranded)  # evacuation's (at their whole contract), not a drain's
        power = replace(power, off=power.off - dead, waking=power.waking - dead, draining=power.draining - dead)
    plan = consolidate_plan(policy, snapshot, power, settings, trend_per_s=utilization_trend(history),
                            starved=state.starved, exclude=exclude, observed_utilization=u)
    why = "; ".join(plan.reasons)
    actions: list[CycleAction] = []
    for node in plan.switch_off:
        if holding(snapshot, node):  # the planner never lists one; a bug if it did
            raise RuntimeError(f"consolidation listed node {node} for switching off while it holds "
                               f"{', '.join(holding(snapshot, node))}")
        actions.append(SwitchOff(node, why))
    actions += [Undrain(n, why) for n in plan.undrain]
    actions += [Wake(n, power.wake_s.get(n, 0.0), why) for n in plan.wake]
    for t in plan.transitions:
        actions.append(_move(snapshot, t))
        snapshot = t.applied(snapshot)
    actions += [Drain(n, tuple(t.app for t in plan.transitions), why) for n in plan.draining]
    return replace(state, utilization=history, starved=False), actions
