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

Re-partitioning: an app split over several devices can take load off one of them by changing its weights
alone, with nothing to load (each piece's model is already there). ``repartition`` finds, per device the
app runs on, the most of the app's rate the policy lets that device take with every tenant there within its
SLO (bisection on the piece's rate through ``policy.filter``, the admission check), and weights the pieces
in proportion: every device keeps the same fraction of its room free. A piece whose device takes nothing is
dropped. Two uses: an over-contract split app is first re-partitioned over its own devices at its new rate
(Ibis re-admission, which may load models elsewhere, only when they cannot take it), and a hotspot with no
over-contract tenant but a split app on it is relieved by re-partitioning that app at its contract (with
the calibrated profiles, the hot device's room is smaller than its share). A re-partition that would move
less than ``repartition_min_shift`` of the app's rate is not planned (hysteresis).

Evacuation: a node whose agent is dead (an ``agent-dead`` finding: not heard from for ``dead_after_s``, its
machine gone) serves nothing, and its apps' pieces there are lost. ``evacuate_plan`` re-admits each app with
a piece there on the *live* cluster (the dead nodes and their devices left out, as a Kubernetes scheduler
leaves out a NotReady node): a split app first on its own live devices with new weights (nothing to load),
else wherever the policy finds room for it at its contract, every tenant there within its SLO. An app
that fits nowhere stays where it was, with the rejection in the plan; when its node comes back, the
reconciler loads it there again. Evacuation is not damped (the finding already waited ``dead_after_s``) nor
limited to ``max_moves_per_step``: every app of a dead node needs a home now.

Spatial devices (Dhakal's Multi-Model as rates move): the policy plans an app's share and instance count on
a spatial device at its rate, so the Ibis rule's re-admission of an over-contract app there usually keeps the
device and gives it more instances (a ``reshared`` transition, ``transition_kind``), and reclamation re-plans
its pieces there for the lower rate (fewer instances, share given back). A re-share's new instances start
beside the old ones, which serve until they are ready (Overlapped-Execution).

Pure: a plan is computed from a snapshot, findings and windows; the control plane or the simulator carries
it out (``transition`` with make before break; an evacuated app's old pieces are already gone, so only the
make half serves, and the agent that comes back drops them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from edgemux.adapt.detect import Finding
from edgemux.adapt.monitor import AppWindow
from edgemux.adapt.settings import AdaptSettings
from edgemux.cluster.disciplines import traits
from edgemux.cluster.state import App, Cluster, Placement, Share
from edgemux.policies.base import Policy, Rejection, Snapshot, largest_feasible, spatial_fit, tenant_for
from edgemux.policies.moves import check_move

__all__ = ["HOTSPOT_KINDS", "TRANSITION_KINDS", "Plan", "Refusal", "Transition", "evacuate_plan", "ibis_plan",
           "live_snapshot", "reclaim_plan", "relief", "repartition", "repartition_plan", "shift", "transition_kind"]

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

    def applied(self, snapshot: Snapshot) -> Snapshot:
        """``snapshot`` with the app at its new placement and contract: what admission counts on once the
        transition is decided (planners plan the next one on it, the simulator's admission sees it). The app
        keeps its place in admission order (a move is not an admission; the control plane's store keeps it
        there too), so that the detectors, which read apps in that order, read them alike in both drivers."""
        app = replace(snapshot.apps[self.app], rate_rps=self.rate_rps)
        apps = {n: app if n == self.app else a for n, a in snapshot.apps.items()}
        placements = {n: self.placement if n == self.app else p for n, p in snapshot.placements.items()}
        return Snapshot(snapshot.cluster, apps, placements, snapshot.catalog)


TRANSITION_KINDS = ("contract", "repartitioned", "reshared", "moved")


def transition_kind(old: Placement, new: Placement) -> str:
    """What carrying a transition from ``old`` to ``new`` takes: "contract" (the same placement: only the
    contract changes), "repartitioned" (new weights over devices and models the app already runs: nothing
    to load), "reshared" (the same devices and models, but a piece on a spatial device changes its share or
    instance count: new instances start beside the old ones, which serve until they are ready, Dhakal's
    Overlapped-Execution) or "moved" (a model to load on a device: a migration, make before break)."""
    if new == old:
        return "contract"
    loaded = {(s.device, s.profile): (s.fraction, s.instances) for s in old.shares}
    if not all((s.device, s.profile) in loaded for s in new.shares):
        return "moved"
    if any(loaded[s.device, s.profile] != (s.fraction, s.instances) for s in new.shares):
        return "reshared"
    return "repartitioned"


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
        placement = current.placements[name]
        # a split app first tries its own devices at the new rate: new weights load nothing
        decision = repartition(policy, current, faster, placement) if len(placement.shares) > 1 else None
        if not isinstance(decision, Placement):
            decision = policy.decide(faster, rest)
        if isinstance(decision, Rejection):
            refused.append(Refusal(name, rate, decision, finding))
            continue
        transitions.append(Transition(name, decision, rate, finding))
        current = transitions[-1].applied(current)
    return Plan(tuple(transitions), tuple(refused), unexplained)


def reclaim_plan(snapshot: Snapshot, findings: Sequence[Finding], windows: Mapping[str, AppWindow],
                 declared: Mapping[str, float], settings: AdaptSettings, *,
                 exclude: frozenset[str] = frozenset(), policy: Policy | None = None) -> Plan:
    """Lower the raised contract of every app with an ``under-contract`` finding (not in ``exclude``) to
    ``max(declared, upper rate bound * (1 + headroom))`` req/s, keeping its devices (see the module doc);
    with ``policy``, its pieces on spatial devices are re-planned for the lower rate (fewer instances)."""
    out: list[Transition] = []
    for f in findings:
        if f.kind != "under-contract" or f.app is None or f.app in exclude or f.app not in snapshot.placements:
            continue
        w, own = windows.get(f.app), declared.get(f.app)
        if w is None or own is None:
            continue
        rate = max(own, w.rate_upper_rps() * (1.0 + settings.headroom))
        if rate < snapshot.apps[f.app].rate_rps:
            placement = snapshot.placements[f.app]
            if policy is not None:
                placement = _reshared(policy, snapshot, f.app, placement, rate)
            out.append(Transition(f.app, placement, rate, f))
    return Plan(tuple(out))


def _reshared(policy: Policy, snapshot: Snapshot, name: str, placement: Placement, rate_rps: float) -> Placement:
    """``placement`` with each piece on a spatial device re-planned for ``rate_rps`` (Multi-Model at the
    lower rate, ``policies.base.spatial_fit``, the room the app holds there counted as free): fewer
    instances where fewer carry the rate, so the share they free can be admitted into. A piece whose re-plan
    fails keeps what it has (it carried more)."""
    rest = snapshot.without(name)
    app = replace(snapshot.apps[name], rate_rps=rate_rps)
    shares = []
    for s in placement.shares:
        device = snapshot.cluster.devices[s.device]
        if traits(device.discipline).spatial:
            profile = snapshot.catalog.get(s.profile)
            base = tenant_for(app, profile, s.weight, serving_ms=device.serving_ms)
            cap = getattr(policy, "max_utilization", 1.0)  # an Ibis-family policy's cap; none elsewhere
            t = spatial_fit(replace(app, rate_rps=rate_rps * s.weight), profile, rest.load(device), base, cap)
            if not isinstance(t, Rejection):
                s = replace(s, fraction=t.share, instances=t.instances)
        shares.append(s)
    return replace(placement, shares=tuple(shares))


def _most_rate(policy: Policy, app: App, rest: Snapshot, device: str, rounds: int) -> float:
    """The most of ``app.rate_rps`` (req/s) the policy admits ``app`` at on ``device`` of ``rest`` (which
    does not hold the app): bisection, ``rounds`` halvings (the answer is within rate / 2^rounds below the
    exact one, and always admitted). 0 when even that little is refused."""
    dev = rest.cluster.devices[device]

    def fits(rate: float) -> bool:
        return policy.filter(replace(app, rate_rps=rate), rest, dev) is None

    return app.rate_rps if fits(app.rate_rps) else largest_feasible(fits, 0.0, app.rate_rps, rounds)


def repartition(policy: Policy, snapshot: Snapshot, app: App, placement: Placement, *, rounds: int = 20
                ) -> Placement | Rejection:
    """``app`` at its ``rate_rps`` (req/s) over ``placement``'s devices and profiles with new weights, each
    device's weight in proportion to the most of the rate it admits (see the module doc); a device that
    admits nothing loses its piece. A ``Rejection`` (constraint "repartition", naming the shortfall) when
    the devices together admit less than the rate. The placement returned passes ``check_move``."""
    rest = snapshot.without(app.name)
    room = [_most_rate(policy, app, rest, s.device, rounds) for s in placement.shares]
    total = sum(room)
    if total < app.rate_rps or total <= 0.0:
        return Rejection(app.name, "repartition",
                         detail=f"its devices {', '.join(s.device for s in placement.shares)} admit "
                                f"{total:.4g} of the {app.rate_rps:.4g} req/s it needs")
    kept = [(s, r) for s, r in zip(placement.shares, room) if r > 0.0]
    new = Placement(placement.app, _normalized([s for s, _ in kept], [r for _, r in kept]), placement.cpu_node)
    why = check_move(policy, app, snapshot, new)
    return new if why is None else why


def _normalized(shares: Sequence[Share], amounts: Sequence[float]) -> tuple[Share, ...]:
    """``shares`` weighted in proportion to ``amounts`` (positive), the weights summing to 1 exactly enough
    for ``Placement``: the largest takes the rounding."""
    total = math.fsum(amounts)
    out = [replace(s, weight=a / total) for s, a in zip(shares, amounts)]
    big = max(range(len(out)), key=lambda i: out[i].weight)
    out[big] = replace(out[big], weight=1.0 - math.fsum(sh.weight for i, sh in enumerate(out) if i != big))
    return tuple(out)


def shift(old: Placement, new: Placement) -> float:
    """The fraction of an app's rate that goes to another device from ``old`` to ``new``: half the sum of the
    weights' absolute changes over all devices (0: same weights, 1: entirely elsewhere)."""
    a = {s.device: s.weight for s in old.shares}
    b = {s.device: s.weight for s in new.shares}
    return sum(abs(a.get(d, 0.0) - b.get(d, 0.0)) for d in a.keys() | b.keys()) / 2.0


def repartition_plan(policy: Policy, snapshot: Snapshot, findings: Sequence[Finding], settings: AdaptSettings,
                     *, limit: int, exclude: frozenset[str] = frozenset()) -> Plan:
    """Relieve the hotspots in ``findings`` that no over-contract tenant explains (``ibis_plan``'s
    ``unexplained``) by re-partitioning a split app with a piece on the hot device at its contract (see the
    module doc): at most ``limit`` transitions, apps in ``exclude`` left alone, only re-partitions that move
    at least ``settings.repartition_min_shift`` of the app's rate and take weight off the hot device."""
    out: list[Transition] = []
    current = snapshot
    split: tuple[dict[str, list[str]], dict[str, int]] | None = None   # _split_apps(current)
    for f in findings:
        if f.kind not in HOTSPOT_KINDS or len(out) >= limit:
            continue
        hot = set(f.devices)
        if split is None:
            split = _split_apps(current)
        on, rank = split
        # the split apps with a piece on a hot device, in admission order: what a pass over every placement
        # would find (one pass per hotspot made this O(hotspots x apps): seconds at 10,000 apps)
        for name in sorted({a for d in hot for a in on.get(d, ())}, key=rank.__getitem__):
            if name in exclude or any(t.app == name for t in out):  # split apps only (_split_apps)
                continue
            t = relief(policy, current, name, f, settings)
            if t is not None:
                out.append(t)
                current = t.applied(current)
                split = None
                break
    return Plan(tuple(out))


def relief(policy: Policy, snapshot: Snapshot, name: str, finding: Finding, settings: AdaptSettings
           ) -> Transition | None:
    """App ``name`` re-partitioned at its contract to relieve the hotspot ``finding`` (``repartition_plan``'s
    step for one app): the transition when the new weights move at least ``settings.repartition_min_shift``
    of its rate and take weight off every hot device it has a piece on, else None."""
    placement = snapshot.placements[name]
    hot = set(finding.devices)
    before = {s.device: s.weight for s in placement.shares}
    if not hot & before.keys():
        return None
    app = snapshot.apps[name]
    new = repartition(policy, snapshot, app, placement)
    if not isinstance(new, Placement) or shift(placement, new) < settings.repartition_min_shift:
        return None
    after = {s.device: s.weight for s in new.shares}
    if all(after.get(d, 0.0) < before[d] for d in hot & before.keys()):
        return Transition(name, new, app.rate_rps, finding)
    return None


def _split_apps(snapshot: Snapshot) -> tuple[dict[str, list[str]], dict[str, int]]:
    """The apps split over two devices or more: by device, and each app's rank in admission order."""
    on: dict[str, list[str]] = {}
    rank: dict[str, int] = {}
    for k, (name, placement) in enumerate(snapshot.placements.items()):
        if len(placement.shares) >= 2:
            rank[name] = k
            for s in placement.shares:
                on.setdefault(s.device, []).append(name)
    return on, rank


def live_snapshot(snapshot: Snapshot, dead: frozenset[str]) -> tuple[Snapshot, tuple[str, ...]]:
    """``snapshot`` without the nodes in ``dead`` (node names) and their devices, and the names of the apps
    that had a piece there (sorted). In the live snapshot an app that ran only there is gone; one that ran
    there in part keeps its live pieces, each carrying the same req/s as before (the app's rate scaled by
    the live weights' sum, the weights renormalized), so every live device's load is what it was; one whose
    CPU stage ran on a dead node is gone too (its placement names that node). Admission on it never picks a
    dead device."""
    if not dead:
        return snapshot, ()
    cluster = Cluster(tuple(n for n in snapshot.cluster.nodes if n.name not in dead))
    apps: dict[str, App] = {}
    placements: dict[str, Placement] = {}
    affected: list[str] = []
    for name, placement in snapshot.placements.items():
        app = snapshot.apps[name]
        live = [s for s in placement.shares if s.device in cluster.devices]
        if len(live) == len(placement.shares) and placement.cpu_node not in dead:
            apps[name], placements[name] = app, placement
            continue
        affected.append(name)
        if not live or placement.cpu_node in dead:
            continue
        apps[name] = replace(app, rate_rps=app.rate_rps * math.fsum(s.weight for s in live))
        placements[name] = Placement(name, _normalized(live, [s.weight for s in live]), placement.cpu_node)
    return Snapshot(cluster, apps, placements, snapshot.catalog), tuple(sorted(affected))


def evacuate_plan(policy: Policy, snapshot: Snapshot, findings: Sequence[Finding], *,
                  exclude: frozenset[str] = frozenset()) -> tuple[Plan, Snapshot]:
    """Re-place the apps of the nodes that ``agent-dead`` findings name (see the module doc), each at its
    contract (req/s), planned one after the other on the live snapshot with the earlier ones applied; apps
    in ``exclude`` (a move already in flight) are left alone.
    Returns the plan (transitions, and a refusal for each app no live device takes) and the live snapshot
    after it: what the other planners may plan on (no dead device in it)."""
    reasons = {f.node: f for f in findings if f.kind == "agent-dead" and f.node is not None}
    if not reasons:
        return Plan(), snapshot
    dead = frozenset(reasons)
    current, affected = live_snapshot(snapshot, dead)
    transitions: list[Transition] = []
    refused: list[Refusal] = []
    for name in affected:
        if name in exclude:
            continue
        app, old = snapshot.apps[name], snapshot.placements[name]
        lost = [snapshot.cluster.devices[s.device].node for s in old.shares] + [old.cpu_node]
        reason = reasons[next(n for n in lost if n in dead)]
        decision: Placement | Rejection | None = None
        if name in current.placements and len(old.shares) > 1:
            # a split app's live pieces: new weights at its full rate load nothing
            decision = repartition(policy, current, app, current.placements[name])
        if not isinstance(decision, Placement):
            decision = policy.decide(app, current.without(name))
        if isinstance(decision, Rejection):
            refused.append(Refusal(name, app.rate_rps, decision, reason))
            continue
        transitions.append(Transition(name, decision, app.rate_rps, reason))
        current = current.without(name).with_placement(app, decision)
    return Plan(tuple(transitions), tuple(refused)), current
