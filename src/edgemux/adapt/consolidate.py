"""Consolidation: switch edge nodes off at low load and wake them ahead of demand, every SLO kept.

Edge load is diurnal; a node that serves little at night still draws its idle power. The consolidation planner
empties one lightly loaded node at a time, make before break, onto the other nodes that are on, and lists it
for switching off once it holds nothing; it wakes a switched-off node when the load is about to need it.

One step (:func:`consolidate_plan`), on the snapshot of admission (contracts: what the apps may send, kept
close to what they do send by the Ibis rule and reclamation) and the nodes' :class:`PowerView`:

1. **Switch off** every draining node that holds no tenant any more (no share of any app on its devices and
   no app's CPU stage): the only way a node is ever listed for switching off. A node that still holds a
   tenant is never listed, whatever else holds. A draining node that holds a tenant whose move is not in
   flight (not in ``exclude``) stops draining (``undrain``): its drain failed, or an arrival or a move of the
   adapt loop landed there, and a drain that can no longer finish must not block the next one.
2. **Wake ahead of demand.** The on nodes' mean device utilization, extrapolated by the load's trend over the
   longest wake-up time among the switched-off nodes (``trend_per_s``: utilization per second, from the
   caller's last steps), above ``wake_above``, or an app the policy could not place for lack of room
   (``starved``): wake the switched-off node that is ready soonest (fewest ``wake_s``, then name), and stop
   draining (the draining nodes stay on). One node per step.
3. **Drain** (only with no node waking or draining, more than ``min_on`` nodes on, and the on nodes' mean
   utilization below ``switch_off_below``): the on node with the fewest tenants (then the least work, then
   name) whose every app the policy re-admits on the other on nodes at its contract, every tenant there within
   its SLO, and after which the others' mean utilization stays below ``wake_above`` (so the drain does not
   trigger a wake). Its apps' transitions are planned one after the other on the snapshot with the earlier ones
   applied; a node with no tenant is listed to switch off at once. An app in ``exclude`` (a move in flight,
   its dwell time) makes its node no candidate.

Utilization is the estimators' (``perf.device.device_utilization`` of each device's tenants at their
contracts); :func:`observed_utilization` is the same formula at the rates the apps sent in the window, and
:func:`utilization_trend` the slope the wake rule extrapolates (both callers, the simulator and the control
plane, compute them here). The thresholds are :class:`ConsolidationSettings` and have hysteresis (``switch_off_below`` <
``wake_above``). Pure: the caller (the simulator, the control plane) keeps the power states and the trend,
carries the transitions out, and switches a node off or on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from collections.abc import Sequence
from dataclasses import replace

from edgemux.adapt.detect import Finding
from edgemux.adapt.monitor import AppWindow
from edgemux.adapt.plan import Refusal, Transition, live_snapshot
from edgemux.cluster.workload import Tenant
from edgemux.perf.device import device_utilization
from edgemux.policies.base import Policy, Rejection, Snapshot, device_spec, tenant_for

__all__ = ["TREND_WINDOWS", "ConsolidationPlan", "ConsolidationSettings", "PowerView", "consolidate_plan", "holding",
           "mean_utilization", "observed_utilization", "utilization_trend"]

TREND_WINDOWS = 3
"""The wake rule's trend is the slope over this many windows (the last ``TREND_WINDOWS + 1`` samples): one
window's noise must not wake a node."""


@dataclass(frozen=True)
class ConsolidationSettings:
    """``switch_off_below``: the on nodes' mean device utilization under which a node is drained;
    ``wake_above``: the predicted mean utilization above which a node is woken (> ``switch_off_below``);
    ``min_on``: nodes that always stay on (>= 1)."""

    switch_off_below: float = 0.3
    wake_above: float = 0.6
    min_on: int = 1

    def __post_init__(self) -> None:
        for name in ("switch_off_below", "wake_above"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0.0 < v < 1.0):
                raise ValueError(f"{name} must be a utilization in (0, 1), got {v!r}")
        if self.switch_off_below >= self.wake_above:
            raise ValueError(f"switch_off_below ({self.switch_off_below}) must be below wake_above "
                             f"({self.wake_above}): without the gap a drain would wake a node at once")
        if isinstance(self.min_on, bool) or not isinstance(self.min_on, int) or self.min_on < 1:
            raise ValueError(f"min_on must be an integer >= 1, got {self.min_on!r}")


@dataclass(frozen=True)
class PowerView:
    """The nodes' power states as the caller keeps them: switched ``off``, ``waking`` (switched on, not serving
    yet), ``draining`` (being emptied to be switched off); the rest are on. ``wake_s``: each node's wake-up
    time (s); ``ready_s``: when each waking node serves (s, the caller's clock; ``adapt.cycle.power_tick``
    sets a node on once its time has come, and a waking node without one stays waking)."""

    off: frozenset[str] = frozenset()
    waking: frozenset[str] = frozenset()
    draining: frozenset[str] = frozenset()
    wake_s: Mapping[str, float] = field(default_factory=dict)
    ready_s: Mapping[str, float] = field(default_factory=dict)

    @property
    def asleep(self) -> frozenset[str]:
        """The nodes that serve nothing now but could later: off and waking ones."""
        return self.off | self.waking


@dataclass(frozen=True)
class ConsolidationPlan:
    """A step's decisions: ``transitions`` (moves off the node being drained), nodes to start ``draining``,
    nodes to ``switch_off`` now (each holds no tenant), nodes to ``wake``, nodes to stop draining
    (``undrain``), ``refused`` moves, and ``reasons`` in words."""

    transitions: tuple[Transition, ...] = ()
    draining: tuple[str, ...] = ()
    switch_off: tuple[str, ...] = ()
    wake: tuple[str, ...] = ()
    undrain: tuple[str, ...] = ()
    refused: tuple[Refusal, ...] = ()
    reasons: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.transitions or self.draining or self.switch_off or self.wake or self.undrain)


def holding(snapshot: Snapshot, node: str) -> tuple[str, ...]:
    """The apps with a share on one of ``node``'s devices or their CPU stage on it (sorted)."""
    devices = {d.path for d in snapshot.cluster.devices.values() if d.node == node}
    return tuple(sorted(name for name, p in snapshot.placements.items()
                        if p.cpu_node == node or devices & {s.device for s in p.shares}))


def mean_utilization(snapshot: Snapshot, nodes: frozenset[str] | None = None) -> float:
    """Mean estimated utilization of the devices of ``nodes`` (default: all) at the apps' contracts; 0 with no
    device."""
    loads = snapshot.device_loads
    us = [min(1.0, device_utilization(device_spec(d), loads[p].tenants) if loads[p].tenants else 0.0)
          for p, d in snapshot.cluster.devices.items() if nodes is None or d.node in nodes]
    return math.fsum(us) / len(us) if us else 0.0


def observed_utilization(snapshot: Snapshot, windows: Mapping[str, AppWindow], nodes: frozenset[str]) -> float:
    """Mean utilization of the devices of ``nodes`` at the rates the apps sent in their ``windows`` (req/s:
    arrivals over the window's length; an app without a window, or one that sent nothing, adds no load): the
    estimators' formula of :func:`mean_utilization` with observed rates instead of contracts. 0 with no
    device."""
    tenants: dict[str, list[Tenant]] = {p: [] for p, d in snapshot.cluster.devices.items() if d.node in nodes}
    for name, placement in snapshot.placements.items():
        w = windows.get(name)
        if w is None or w.end_s <= w.start_s or w.arrivals == 0:
            continue
        app = replace(snapshot.apps[name], rate_rps=w.arrivals / (w.end_s - w.start_s))
        for share in placement.shares:
            if share.device in tenants:
                tenants[share.device].append(tenant_for(app, snapshot.catalog.get(share.profile), share.weight,
                                                        share.fraction, share.instances,
                                                        serving_ms=snapshot.cluster.devices[share.device].serving_ms))
    us = [min(1.0, device_utilization(device_spec(snapshot.cluster.devices[p]), ts)) if ts else 0.0
          for p, ts in tenants.items()]
    return math.fsum(us) / len(us) if us else 0.0


def utilization_trend(history: Sequence[tuple[float, float]]) -> float:
    """The change of the mean utilization per second over the last ``TREND_WINDOWS`` windows of ``history``
    ((time s, utilization) samples, oldest first); 0 with fewer than two samples."""
    if len(history) < 2:
        return 0.0
    (t0, u0), (t1, u1) = history[max(0, len(history) - 1 - TREND_WINDOWS)], history[-1]
    return (u1 - u0) / (t1 - t0) if t1 > t0 else 0.0


def _node_work(snapshot: Snapshot, node: str) -> float:
    loads = snapshot.device_loads
    return math.fsum(loads[p].work for p, d in snapshot.cluster.devices.items() if d.node == node)


def consolidate_plan(policy: Policy, snapshot: Snapshot, power: PowerView, settings: ConsolidationSettings, *,
                     trend_per_s: float = 0.0, starved: bool = False, exclude: frozenset[str] = frozenset(),
                     observed_utilization: float | None = None) -> ConsolidationPlan:
    """One consolidation step (see the module doc). ``snapshot`` is admission's, every node in it (those off
    hold nothing); ``trend_per_s`` the change of the mean utilization per second; ``starved`` whether an app
    found no room in this window; ``observed_utilization`` the on devices' mean utilization at the rates the
    apps sent (the caller's monitor): the wake rule takes the larger of it and the contracts', and a node is
    drained only when both are below ``switch_off_below``."""
    names = [n.name for n in snapshot.cluster.nodes]
    unknown = (power.off | power.waking | power.draining) - set(names)
    if unknown:
        raise ValueError(f"power view names nodes the cluster does not have: {', '.join(sorted(unknown))}")
    reasons: list[str] = []
    # 1. a draining node that holds nothing is switched off; one that still holds a tenant never is, and
    # stops draining when no move off it is in flight any more
    switch_off = tuple(n for n in names if n in power.draining and not holding(snapshot, n))
    for n in switch_off:
        reasons.append(f"{n} holds no tenant: switch it off")
    stuck = tuple(n for n in names if n in power.draining and set(holding(snapshot, n)) - exclude)
    for n in stuck:
        reasons.append(f"{n} still holds {', '.join(sorted(set(holding(snapshot, n)) - exclude))} with no move "
                       f"in flight: it stops draining")
    on = frozenset(n for n in names if n not in power.off and n not in power.waking and n not in switch_off)
    util = mean_utilization(snapshot, on)
    if observed_utilization is not None:
        util = max(util, observed_utilization)
    # 2. wake ahead of demand
    if power.off:
        horizon = max(power.wake_s.get(n, 0.0) for n in power.off)
        predicted = util + max(trend_per_s, 0.0) * horizon
        if predicted > settings.wake_above or starved:
            first = min(power.off, key=lambda n: (power.wake_s.get(n, 0.0), n))
            why = "an app found no room" if starved else (
                f"utilization {util:.2f} + trend {trend_per_s:.2e}/s x {horizon:g} s = {predicted:.2f} > "
                f"{settings.wake_above:g}")
            reasons.append(f"wake {first}: {why}")
            undrain = tuple(n for n in names if n in power.draining and n not in switch_off)
            return ConsolidationPlan(switch_off=switch_off, wake=(first,), undrain=undrain, reasons=tuple(reasons))
    # 3. drain one lightly loaded node
    if stuck:
        return ConsolidationPlan(switch_off=switch_off, undrain=stuck, reasons=tuple(reasons))
    still_draining = [n for n in names if n in power.draining and n not in switch_off]
    if power.waking or still_draining or len(on) <= settings.min_on or util >= settings.switch_off_below:
        return ConsolidationPlan(switch_off=switch_off, reasons=tuple(reasons))
    live, _ = live_snapshot(snapshot, frozenset(names) - on)
    candidates = sorted(on, key=lambda n: (len(holding(live, n)), _node_work(live, n), n))
    for node in candidates:
        apps = holding(live, node)
        if exclude & set(apps):
            continue
        rest, _ = live_snapshot(live, frozenset({node}))
        transitions: list[Transition] = []
        refused: list[Refusal] = []
        current = rest
        for name in apps:
            app = snapshot.apps[name]
            decision = policy.decide(app, current.without(name))
            if isinstance(decision, Rejection):
                refused.append(Refusal(name, app.rate_rps, decision, _reason(snapshot, name, node, util)))
                break
            reason = _reason(snapshot, name, node, util)
            transitions.append(Transition(name, decision, app.rate_rps, reason))
            current = current.without(name).with_placement(app, decision)
        if refused:
            continue
        after = mean_utilization(current, on - {node})
        if after >= settings.wake_above:
            continue
        reasons.append(f"drain {node}: its {len(apps)} app(s) fit on the other {len(on) - 1} node(s) on "
                       f"(mean utilization {util:.2f} -> {after:.2f})")
        if not apps:
            return ConsolidationPlan(switch_off=switch_off + (node,), reasons=tuple(reasons))
        return ConsolidationPlan(tuple(transitions), draining=(node,), switch_off=switch_off,
                                 reasons=tuple(reasons))
    return ConsolidationPlan(switch_off=switch_off, reasons=tuple(reasons))


def _reason(snapshot: Snapshot, app: str, node: str, util: float) -> Finding:
    """The finding a drain's transition carries: the on nodes' mean utilization against the threshold."""
    return Finding("consolidate", app, tuple(s.device for s in snapshot.placements[app].shares), util, 1.0,
                   "utilization", f"draining {node} to switch it off (mean utilization {util:.2f})", node=node)
