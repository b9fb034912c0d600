"""Planners: what to do about the findings, as a plan of transitions, each with its reason as data.

The Ibis rule (Ibis §4.2, papers/000): on a node whose apps miss their SLOs or drop requests, the tenants whose
observed rate λ̂ exceeds their contract λ are the cause (their token buckets keep the excess from the
neighbours, but not forever: a bucket that keeps refusing is itself a drop). Each such tenant is re-admitted
at its higher rate, ``λ̂ * (1 + headroom)``, with the cluster's own policy on the cluster without it: where the
queueing models say it fits at that rate is where it goes, and that rate becomes its contract. λ̂ is the
window's upper 95 % confidence bound (``AppWindow.rate_upper_rps``), not its point estimate. A tenant the
policy finds no room for stays, with the rejection in the plan. A hotspot without an over-contract tenant
is not a load problem (the profiles are off; re-calibration is the answer) and is reported as such.

Reclamation: adaptation raises contracts when load rises; when it falls again, the room they hold is room
no one else can be admitted into. An app with an ``under-contract`` finding gets its contract lowered, in
place (same placement, nothing to load), to its window's upper rate bound plus headroom, never below the
contract it declared: what it declared is its reservation (as a Kubernetes pod's resource request is),
what adaptation added on top is lent. Lowering a contract only lowers the load admission counts on, so no
SLO check is needed.

Pure: a plan is computed from a snapshot, findings and windows; the control plane or the simulator carries
it out (``transition`` with make before break).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from edgemux.adapt.detect import Finding
from edgemux.adapt.monitor import AppWindow
from edgemux.adapt.settings import AdaptSettings
from edgemux.cluster.state import Placement
from edgemux.policies.base import Policy, Rejection, Snapshot

__all__ = ["HOTSPOT_KINDS", "Plan", "Refusal", "Transition", "ibis_plan", "reclaim_plan"]

# findings that make the app's devices a hotspot
HOTSPOT_KINDS = ("slo-violated", "dropping", "slo-at-risk")


@dataclass(frozen=True)
class Transition:
    """Move ``app`` to ``placement`` (make before break) with ``rate_rps`` as its new contract (req/s);
    ``reason`` is the finding that caused it."""

    app: str
    placement: Placement
    rate_rps: float
    reason: Finding

    def to_json(self) -> dict[str, object]:
        return {"app": self.app, "to": [{"device": s.device, "weight": s.weight} for s in self.placement.shares],
                "rate_rps": self.rate_rps, "reason": self.reason.to_json()}


@dataclass(frozen=True)
class Refusal:
    """A transition that was wanted but not found: ``app`` could not be re-admitted at ``rate_rps``
    (req/s); ``rejection`` says why, as admission's rejections do."""

    app: str
    rate_rps: float
    rejection: Rejection
    reason: Finding

    def to_json(self) -> dict[str, object]:
        return {"app": self.app, "rate_rps": self.rate_rps, "rejection": self.rejection.message,
                "constraint": self.rejection.constraint, "reason": self.reason.to_json()}


@dataclass(frozen=True)
class Plan:
    """What one step decided: ``transitions`` to carry out, ``refused`` ones (no room), and ``unexplained``
    hotspot findings (no over-contract tenant on those devices: a profile problem, not a load problem)."""

    transitions: tuple[Transition, ...] = ()
    refused: tuple[Refusal, ...] = ()
    unexplained: tuple[Finding, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.transitions or self.refused or self.unexplained)

    def to_json(self) -> dict[str, object]:
        return {"transitions": [t.to_json() for t in self.transitions],
                "refused": [r.to_json() for r in self.refused],
                "unexplained": [f.to_json() for f in self.unexplained]}


def ibis_plan(policy: Policy, snapshot: Snapshot, findings: Sequence[Finding], windows: Mapping[str, AppWindow],
              settings: AdaptSettings, *, limit: int | None = None, exclude: frozenset[str] = frozenset()) -> Plan:
    """The Ibis rule over ``findings`` (see the module doc). At most ``limit`` transitions (default
    ``settings.max_moves_per_step``), the largest excess over contract first; apps in ``exclude`` (e.g.
    still in their dwell time) are not moved. Each transition is planned on the snapshot with the earlier
    ones applied, so two never count on the same room."""
    limit = settings.max_moves_per_step if limit is None else limit
    hot: set[str] = set()
    for f in findings:
        if f.kind in HOTSPOT_KINDS:
            hot.update(f.devices)
    if not hot:
        return Plan()
    over = {f.app: f for f in findings if f.kind == "over-contract" and f.app is not None}
    culprits = []
    for name, f in over.items():
        placement = snapshot.placements.get(name)
        if placement is not None and hot & {s.device for s in placement.shares}:
            culprits.append((f.observed / f.limit, name, f))
    culprits.sort(key=lambda c: (-c[0], c[1]))
    explained = {s.device for _, name, _ in culprits for s in snapshot.placements[name].shares}
    unexplained = tuple(f for f in findings if f.kind in HOTSPOT_KINDS and not explained & set(f.devices))

    transitions: list[Transition] = []
    refused: list[Refusal] = []
    current = snapshot
    for _, name, finding in culprits:
        if len(transitions) >= limit:
            break
        if name in exclude:
            continue
        app = current.apps[name]
        # the window's upper 95 % bound, not its point estimate: a contract set at a low draw of a noisy
        # count would be exceeded again at once, and the dwell time would keep the app there
        rate = windows[name].rate_upper_rps() * (1.0 + settings.headroom)
        faster = replace(app, rate_rps=rate)
        rest = current.without(name)
        decision = policy.decide(faster, rest)
        if isinstance(decision, Rejection):
            refused.append(Refusal(name, rate, decision, finding))
            continue
        transitions.append(Transition(name, decision, rate, finding))
        current = rest.with_placement(faster, decision)
    return Plan(tuple(transitions), tuple(refused), unexplained)


def reclaim_plan(snapshot: Snapshot, findings: Sequence[Finding], windows: Mapping[str, AppWindow],
                 declared: Mapping[str, float], settings: AdaptSettings, *,
                 exclude: frozenset[str] = frozenset()) -> Plan:
    """Lower the raised contract of every app with an ``under-contract`` finding (not in ``exclude``) to
    ``max(declared, upper rate bound * (1 + headroom))`` req/s, keeping its placement (see the module doc)."""
    out: list[Transition] = []
    for f in findings:
        if f.kind != "under-contract" or f.app is None or f.app in exclude or f.app not in snapshot.placements:
            continue
        w, own = windows.get(f.app), declared.get(f.app)
        if w is None or own is None:
            continue
        rate = max(own, w.rate_upper_rps() * (1.0 + settings.headroom))
        if rate < snapshot.apps[f.app].rate_rps:
            out.append(Transition(f.app, snapshot.placements[f.app], rate, f))
    return Plan(tuple(out))
