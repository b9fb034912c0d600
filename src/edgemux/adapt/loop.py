"""One step of the adaptation loop: detect, damp, plan. The caller (the control plane every window, or the
simulator as one of its processes) keeps the returned state for the next step and carries out the plan.

Damping, so that a noisy load does not make apps oscillate:

- a finding is acted on only after it was seen in ``trigger_windows`` consecutive windows (a window without
  it starts the count again);
- an app moved less than ``min_dwell_s`` ago is not moved again (at most one move per app per dwell time);
- a moved app's new contract is its observed rate plus ``headroom``, so the noise around the rate that made it
  move does not make it over-contract again (hysteresis);
- at most ``max_moves_per_step`` moves per step (re-partitions of split apps included), and a re-partition
  only when it moves at least ``repartition_min_shift`` of the app's rate;
- a contract is lowered again (reclamation, in place) only when the app sends clearly less than it, and
  not within ``min_dwell_s`` of its last change either.

Evacuation comes first and is not damped: the apps of a node whose agent is dead (``agent-dead``, silent
for ``dead_after_s``) are re-placed on the live nodes at once, in the dwell time or not and beyond
``max_moves_per_step`` (``adapt.plan.evacuate_plan``); the other planners then plan on the live cluster
with the evacuations applied, so nothing is ever moved onto a dead node.

Pure: ``now_s`` is the caller's clock (virtual or real), in seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from edgemux.adapt.detect import Finding, detect
from edgemux.adapt.monitor import AppWindow
from edgemux.adapt.plan import Plan, evacuate_plan, ibis_plan, reclaim_plan, repartition_plan
from edgemux.adapt.settings import AdaptSettings
from edgemux.policies.base import Policy, Snapshot

__all__ = ["AdaptState", "StepResult", "step"]


@dataclass(frozen=True)
class AdaptState:
    """What the loop remembers between steps: for each finding's key the consecutive windows it has been
    seen in, and for each app the time (s) it was last moved."""

    streaks: Mapping[tuple[str, str], int] = field(default_factory=dict)
    last_move_s: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class StepResult:
    """A step's outcome: the ``state`` for the next step, every ``finding`` of this window, those that were
    ``acted`` on (seen long enough), the apps ``held`` by their dwell time, and the ``plan``."""

    state: AdaptState
    findings: tuple[Finding, ...]
    acted: tuple[Finding, ...]
    held: tuple[str, ...]
    plan: Plan


def step(state: AdaptState, policy: Policy, snapshot: Snapshot, windows: Mapping[str, AppWindow],
         settings: AdaptSettings, now_s: float, last_seen_s: Mapping[str, float] | None = None,
         declared: Mapping[str, float] | None = None, busy: frozenset[str] = frozenset()) -> StepResult:
    """Detect on this window's ``windows``, keep the findings seen for ``trigger_windows`` windows in a row,
    plan with the Ibis rule except for apps in their dwell time, then reclaim raised contracts (with
    ``declared``, app -> its declared contract in req/s; without it nothing is reclaimed), and record the
    planned transitions at ``now_s`` (s). The plan's transitions are to be carried out by the caller; the
    dwell counts from the plan, whether or not the move succeeds, so that a failing move is not retried
    every window either. Evacuation of dead nodes' apps comes first (module doc). ``busy``: apps with a
    move in flight (the caller's), which no planner touches: the snapshot still shows them where they were."""
    findings = detect(snapshot, windows, settings, now_s=now_s, last_seen_s=last_seen_s, declared=declared)
    streaks = {f.key: state.streaks.get(f.key, 0) + 1 for f in findings}
    # a dead agent is acted on at once: its finding already waited dead_after_s
    acted = tuple(f for f in findings if streaks[f.key] >= settings.trigger_windows or f.kind == "agent-dead")
    last = {a: t for a, t in state.last_move_s.items() if now_s - t < settings.min_dwell_s}  # still dwelling
    dwelling = frozenset(last)
    evacuation, live = evacuate_plan(policy, snapshot, acted, exclude=busy)
    evacuated = frozenset(t.app for t in evacuation.transitions) | {r.app for r in evacuation.refused}
    if live is not snapshot:  # a node is dead
        # the other planners see the live cluster, the evacuations applied, and leave the evacuated alone
        snapshot = live
        acted = tuple(f for f in acted if f.kind == "agent-dead" or (
            (f.app is None or f.app in live.placements) and set(f.devices) <= live.cluster.devices.keys()))
    held = dwelling | evacuated | busy
    plan = ibis_plan(policy, snapshot, acted, windows, settings, exclude=held)
    room = settings.max_moves_per_step - len(plan.transitions)
    if plan.unexplained and room > 0:  # a hotspot no over-contract tenant explains: re-weight a split app
        busy = held | {t.app for t in plan.transitions}
        after = snapshot
        for t in plan.transitions:
            after = t.applied(after)
        weights = repartition_plan(policy, after, plan.unexplained, settings, limit=room, exclude=busy)
        relieved = {t.reason.key for t in weights.transitions}
        plan = replace(plan, transitions=plan.transitions + weights.transitions,
                       unexplained=tuple(f for f in plan.unexplained if f.key not in relieved))
    if declared is not None:
        moving = held | {t.app for t in plan.transitions}
        reclaim = reclaim_plan(snapshot, acted, windows, declared, settings, exclude=moving, policy=policy)
        plan = replace(plan, transitions=plan.transitions + reclaim.transitions)
    plan = replace(plan, transitions=evacuation.transitions + plan.transitions,
                   refused=evacuation.refused + plan.refused)
    for t in plan.transitions:
        last[t.app] = now_s
        # its findings start over: the next window sees the app where it went
        streaks = {k: v for k, v in streaks.items() if k[1] != t.app}
    return StepResult(AdaptState(streaks, last), tuple(findings), acted,
                      tuple(sorted(dwelling & {f.app for f in acted if f.app is not None})), plan)
