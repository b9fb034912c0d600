"""The placement manager: per app, the **target** (the store's placement: the pieces each node's agent should
hold) beside the **actual** (what each agent acknowledged or reported, and whether it is alive), the agents'
registry and heartbeats, and the reconcile pass that acts on the difference.

The targets are the in-memory mirror of the store's apps, placements and declared contracts: admission and
transitions commit to the store first and then set them here, so reads and heartbeats never wait on the disk.
An agent registers (``POST /v1/agents/{node}``) and heartbeats (``PUT``) with what it holds; a new incarnation
(the agent restarted) holds nothing this process loaded. Each pass of the controller loop (:meth:`Reconciler.
update`) republishes the routes of an agent's apps when it goes silent or comes back, and reconciles every
live node whose actual differs from its target: ``PUT`` the missing or different pieces, ``DELETE`` the extra,
then republish the routes whose endpoints changed. A call that fails is recorded (the piece stays pending with
its error) and retried at the next pass; nothing here raises into an API call.

Units: ``*_s`` seconds on the control plane's clock.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgemux.cluster.state import App, Placement
from edgemux.policies import Snapshot
from edgemux.profiles.catalog import Catalog
from edgemux.runtime.controlplane.agentdriver import AgentCallError
from edgemux.runtime.controlplane.common import ControlPlaneError, check_url, clip, listing
from edgemux.runtime.controlplane.messages import AgentView
from edgemux.runtime.controlplane.pieces import Group, Piece, group_body, group_matches, groups_of, pieces_of
from edgemux.runtime.dataplane.messages import AgentReport, PieceReport
from edgemux.runtime.messages import MessageError

if TYPE_CHECKING:
    from edgemux.runtime.controlplane.service import ControlPlane

__all__ = ["LEASE_DRIFT", "READY_HEARTBEATS", "AgentState", "NodeState", "Reconciler", "lost_after_s"]

logger = logging.getLogger("edgemux.controlplane")

READY_HEARTBEATS = 3  # an agent without a lease is ready while its last heartbeat is within 3 x heartbeat_s
# Fencing (runtime.dataplane.lease, docs/multihost.md): an agent that holds a lease of L s fences itself L s
# after *sending* its last acknowledged heartbeat, on its own monotonic clock; this side counts from *receiving*
# it, on its own. The node is lost here only after L + margin, the margin being one heartbeat period (the
# control loop's granularity and a heartbeat in flight: a node one heartbeat late is not lost yet) plus
# LEASE_DRIFT x L for the two clocks' rates (crystals drift ~1e-4; 1e-2 covers a VM's clock under load), so
# that the agent's lease has surely run out before its apps are routed or placed elsewhere.
LEASE_DRIFT = 0.01


def lost_after_s(agent: AgentState) -> float:
    """Seconds without a heartbeat after which ``agent``'s node is lost (not ready: its endpoints leave the
    routes, and the adapt loop evacuates it): its lease + one heartbeat period + ``LEASE_DRIFT`` of the lease
    for an agent that fences itself (see above); ``READY_HEARTBEATS`` heartbeat periods for one that holds no
    lease (an older agent, or ``--lease-s 0``), as before fencing."""
    if agent.lease_s > 0:
        return agent.lease_s * (1.0 + LEASE_DRIFT) + agent.heartbeat_s
    return READY_HEARTBEATS * agent.heartbeat_s


@dataclass
class AgentState:
    """A registered agent: where it is, which process (``incarnation``), its heartbeat period (s), when it
    was last heard from (control-plane clock, s), its devices and the pieces it reported (by app name: one
    entry per device the app runs on there), and the lease granted to it (s; 0: none, it never fences)."""

    node: str
    url: str
    incarnation: str
    heartbeat_s: float
    last_seen: float
    registered_at: float
    version: str | None = None
    devices: dict[str, dict[str, Any]] = field(default_factory=dict)
    reported: dict[str, list[PieceReport]] = field(default_factory=dict)
    runs_on: str | None = None
    lease_s: float = 0.0


@dataclass(frozen=True)
class NodeState:
    """One node of one app: the pieces the store places there (``target``) beside those its agent acknowledged
    or reported (``actual``; None: none yet), whether that agent is registered (``url``) and alive, and the
    last failure to load them (``error``)."""

    node: str
    target: Group
    actual: Group | None
    url: str | None
    alive: bool
    error: str | None

    @property
    def loaded(self) -> bool:
        """The agent holds exactly the target."""
        return self.actual == self.target

    @property
    def serving(self) -> bool:
        """The target is loaded on a live agent: the node is one of the app's endpoints."""
        return self.url is not None and self.loaded and self.alive


class Reconciler:
    """Targets beside actuals, the agents and the reconcile pass (module doc), for the controller ``cp``."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.apps: dict[str, App] = {}              # in admission order: the contract in force
        self.placements: dict[str, Placement] = {}
        # app -> the contract it was applied with (req/s); self.apps holds the one in force, which the adapt
        # loop may raise above it (an over-contract move) and lower again towards it (a reclaim)
        self.declared: dict[str, float] = {}
        self.agents: dict[str, AgentState] = {}
        self.actual: dict[tuple[str, str], Group] = {}  # (app, node) -> what the agent acknowledged or reported
        self.errors: dict[tuple[str, str], str] = {}    # (app, node) -> the last failure there
        self._node_locks: dict[str, asyncio.Lock] = {}
        self._was_alive: dict[str, bool] = {}
        # app -> its interface (the agent's 'interface' field), learned from its first variant's report
        self.interfaces: dict[str, dict[str, Any]] = {}
        # the targets indexed by node (node -> the apps placed there), each app with its rank in admission
        # order, so that a node's pieces cost what the node holds, not every app (a heartbeat, a pass)
        self._on_node: dict[str, set[str]] = {}
        self._rank: dict[str, int] = {}
        self._ranks = itertools.count()
        # the snapshot of the targets the policies read (``snapshot``), kept between changes
        self._snapshot: Snapshot | None = None
        # app -> (placement, contract, key digest, interface, catalog, its groups): ``groups``, kept
        self._groups: dict[str, tuple[Placement, App, str | None, dict[str, Any] | None, Catalog,
                                      dict[str, Group]]] = {}

    # -- targets ---------------------------------------------------------------------------------------

    def load(self, apps: dict[str, App], placements: dict[str, Placement], declared: dict[str, float]) -> None:
        """The targets as the store holds them at start."""
        self.apps, self.placements, self.declared = apps, placements, declared
        self._on_node, self._rank, self._snapshot = {}, {}, None
        for name in placements:
            self._index(name)

    # -- the targets' index by node and their snapshot --------------------------------------------------

    def _nodes(self, placement: Placement) -> set[str]:
        return {path.split("/", 1)[0] for path in (s.device for s in placement.shares)}  # a path is node/name

    def _index(self, name: str) -> None:
        """Index app ``name`` (just placed, last in admission order) by the nodes of its placement."""
        self._rank[name] = next(self._ranks)
        for node in self._nodes(self.placements[name]):
            self._on_node.setdefault(node, set()).add(name)

    def _unindex(self, name: str, placement: Placement) -> None:
        self._rank.pop(name, None)
        for node in self._nodes(placement):
            apps = self._on_node.get(node)
            if apps is not None:
                apps.discard(name)

    def snapshot(self) -> Snapshot:
        """The targets as the policies read them (``ControlPlane.snapshot``): every app in force at its
        placement, on ``cp.cluster`` with ``cp.catalog``. Kept between changes of the targets and updated with
        each (an admitted app added to it, a deleted one taken out, device by device: ``Snapshot.
        with_placement``, ``Snapshot.without``), so that a decision does not rebuild every device's
        aggregates; a new cluster or catalog, a move's switch or a load starts a new one. Its mappings are
        its own (a later change of the targets does not show in a snapshot already taken)."""
        cp = self.cp
        snap = self._snapshot
        if snap is None or snap.cluster is not cp.cluster or snap.catalog is not cp.catalog:
            snap = Snapshot(cp.cluster, dict(self.apps), dict(self.placements), cp.catalog)
            self._snapshot = snap
        return snap

    def app(self, name: str) -> App:
        """The app in force; ``ControlPlaneError`` 404 for an unknown app."""
        a = self.apps.get(name)
        if a is None:
            raise ControlPlaneError(f"unknown app '{clip(name)}' (apps: {listing(self.apps)})", 404)
        return a

    def set_target(self, app: App, placement: Placement) -> tuple[dict[str, Group], dict[str, Group]]:
        """An admitted (or re-admitted) app's target, as just committed: the app goes last in admission order,
        its declared contract is its rate, and the pieces its agents held that differ from the new target no
        longer count as loaded. Returns (the old target's groups, the new one's), by node."""
        name = app.name
        replaced = name in self.apps
        old_groups = self.groups(name) if replaced else {}
        if replaced:
            self._unindex(name, self.placements[name])
        self.apps[name] = app
        self.placements[name] = placement
        self.declared[name] = app.rate_rps
        if replaced:  # admission order: a replaced app goes last
            self.apps[name] = self.apps.pop(name)
            self.placements[name] = self.placements.pop(name)
        self._index(name)
        snap = self._snapshot
        if snap is not None:
            self._snapshot = (snap.without(name) if replaced else snap).with_placement(app, placement)
        new_groups = self.groups(name)
        for node in old_groups:
            if self.actual.get((name, node)) != new_groups.get(node):
                self.actual.pop((name, node), None)
        self.errors = {k: v for k, v in self.errors.items() if k[0] != name}
        return old_groups, new_groups

    def drop(self, name: str) -> list[str]:
        """Forget a deleted app's target and actual; returns the nodes it was placed on."""
        nodes = list(self.groups(name))
        self._unindex(name, self.placements[name])
        del self.apps[name]
        del self.placements[name]
        if self._snapshot is not None:
            self._snapshot = self._snapshot.without(name)
        self.declared.pop(name, None)
        self.interfaces.pop(name, None)  # an app applied again under this name starts afresh
        for node in nodes:
            self.actual.pop((name, node), None)
            self.errors.pop((name, node), None)
        return nodes

    def switch(self, name: str, app: App, placement: Placement, groups: dict[str, Group]) -> None:
        """A move's switch, as just committed: ``placement`` at contract ``app`` is the target, and the
        agents of ``groups`` (which the move loaded and found ready) hold it."""
        rank = self._rank[name]
        self._unindex(name, self.placements[name])
        self.placements[name] = placement
        self.apps[name] = app  # its contract (the route's policing rate) changes with the switch
        self._index(name)
        self._rank[name] = rank  # it keeps its place in admission order
        self._snapshot = None
        for n, g in groups.items():
            self.actual[(name, n)] = g
            self.errors.pop((name, n), None)
            agent = self.agents.get(n)
            if agent is not None:
                agent.reported[name] = [p.report(name) for p in g]

    def pieces(self, app: str) -> list[Piece]:
        """The app's target as agent pieces, in placement order."""
        return self.pieces_of(self.placements[app], self.apps[app])

    def pieces_of(self, placement: Placement, contract: App) -> list[Piece]:
        """``placement``'s shares as agent pieces at ``contract`` (``pieces.pieces_of``), with the app's key."""
        cp = self.cp
        return pieces_of(cp.cluster, cp.catalog, cp.model_sources, placement, contract,
                         cp.routes.keys.get(placement.app), self.interfaces.get(placement.app))

    def learn_interface(self, app: str, reported: list[PieceReport]) -> None:
        """An app with no interface yet takes the one its agent reports: the interface it serves, else its
        variant's own tensors. So the first variant an app runs on fixes what its clients see, and every later
        variant (after a move, a re-share, a re-admission elsewhere) is served through it. Not stored: the
        agents hold it, and a restarted control plane learns it again from their reports."""
        if app in self.interfaces or app not in self.placements:
            return
        for r in reported:
            doc = r.extra.get("interface")
            if doc is None and isinstance(r.extra.get("inputs"), list) and isinstance(r.extra.get("outputs"), list):
                doc = {"inputs": r.extra["inputs"], "outputs": r.extra["outputs"]}
            if isinstance(doc, dict):
                self.interfaces[app] = doc
                return

    def groups(self, app: str) -> dict[str, Group]:
        """The app's target by node (nodes in placement order, pieces by device name). Kept per app while
        what makes its pieces is the same objects (its placement, its contract, its key, its interface, the
        catalog in force): a heartbeat or a pass reads it for every app of a node."""
        cp = self.cp
        placement, contract = self.placements[app], self.apps[app]
        key, interface = cp.routes.keys.get(app), self.interfaces.get(app)
        hit = self._groups.get(app)
        if hit is not None and hit[0] is placement and hit[1] is contract and hit[2] == key \
                and hit[3] is interface and hit[4] is cp.catalog:
            return dict(hit[5])
        out = groups_of(self.pieces_of(placement, contract))
        if len(self._groups) > 2 * len(self.placements) + 64:  # deleted apps' entries
            self._groups = {a: g for a, g in self._groups.items() if a in self.placements}
        self._groups[app] = (placement, contract, key, interface, cp.catalog, out)
        return dict(out)

    def groups_of(self, placement: Placement, contract: App) -> dict[str, Group]:
        """A placement's pieces (at ``contract``) by node."""
        return groups_of(self.pieces_of(placement, contract))

    def node_pieces(self, node: str) -> dict[str, Group]:
        """The pieces the targets place on ``node``, by app (in admission order)."""
        rank = self._rank
        return {app: self.groups(app)[node] for app in sorted(self._on_node.get(node, ()), key=rank.__getitem__)}

    # -- actual ----------------------------------------------------------------------------------------

    def alive(self, node: str) -> bool:
        """The node's agent is registered and heartbeating (its last heartbeat within ``lost_after_s``): a
        silent agent's endpoints leave the routes. Every decision that a node is dead goes through here or
        ``lost_after_s`` (the adapt loop's through ``dead_after_s``)."""
        a = self.agents.get(node)
        return a is not None and self.cp.clock() - a.last_seen <= lost_after_s(a)

    def dead_after_s(self, floor_s: float) -> float:
        """The adapt loop's ``dead_after_s`` (s): its setting ``floor_s``, raised to the longest
        ``lost_after_s`` of the registered agents, so that it never evacuates a node whose agent may still
        hold its lease (the cycle's one threshold serves every node: a longer lease elsewhere delays it). An
        agent without a lease fences nothing, so it leaves the setting alone, as before fencing (and as the
        simulator, which has no leases, decides)."""
        return max([floor_s] + [lost_after_s(a) for a in self.agents.values() if a.lease_s > 0])

    def state(self, app: str) -> list[NodeState]:
        """The app's target beside its actual, node by node (placement order)."""
        out = []
        for node, g in self.groups(app).items():
            agent = self.agents.get(node)
            out.append(NodeState(node, g, self.actual.get((app, node)), agent.url if agent else None,
                                 self.alive(node), self.errors.get((app, node))))
        return out

    def status(self, app: str) -> str:
        """``ready`` when every piece is loaded on a live agent, else ``pending``."""
        return "ready" if all(n.loaded and n.alive for n in self.state(app)) else "pending"

    # -- agents ----------------------------------------------------------------------------------------

    def register_agent(self, node: str, body: Any, *, heartbeat: bool) -> dict[str, Any]:
        """Record a registration (``heartbeat=False``) or heartbeat; schedules a reconcile when needed."""
        cp = self.cp
        try:
            cp.cluster.node(node)
        except ValueError:
            raise ControlPlaneError(f"unknown node '{clip(node)}' (nodes: "
                                    f"{listing([n.name for n in cp.cluster.nodes])})", 404) from None
        old = self.agents.get(node)
        if heartbeat and old is None:
            raise ControlPlaneError(f"agent of node {node} is not registered: register with POST", 404)
        try:
            msg = AgentReport.from_json(body, node)
        except MessageError as e:
            raise ControlPlaneError(str(e)) from None
        url = check_url(msg.url, "url", ControlPlaneError)
        if msg.observations is not None:
            cp.adaptation.observer.report(f"agent:{node}", msg.observations, gateway=False)
        now = cp.clock()
        restarted = old is None or old.incarnation != msg.incarnation or old.url != url
        state = AgentState(node, url, msg.incarnation, msg.heartbeat_s, now,
                           now if restarted or old is None else old.registered_at, msg.version,
                           msg.devices, msg.by_app(), msg.runs_on, msg.lease_s or 0.0)
        self.agents[node] = state
        for app, reported in state.reported.items():
            self.learn_interface(app, reported)
        if restarted:
            if cp.probe_serving:
                cp.spawn(self._probe(node, url))
            cp.power.agent_restarted(node, msg)
            # a new process holds nothing we loaded before: forget the marks, reload from the report
            for key in [k for k in self.actual if k[1] == node]:
                del self.actual[key]
            logger.info("agent %s registered at %s (incarnation %s)", node, state.url, state.incarnation[:12])
        if restarted or self.needs_reconcile(node):
            lock = self._node_locks.setdefault(node, asyncio.Lock())
            if restarted or not lock.locked():  # a running reconcile already covers a plain heartbeat
                cp.spawn(self.reconcile(node))
            cp.wake()
        # the answer renews the agent's lease (granted: the lease it asked for); "apps", the store's target for
        # the node and what a move is loading onto it, is what a returning agent unfences
        # (runtime.dataplane.lease). A stray app it still holds is deleted by the reconcile spawned above.
        loading = {a for a, nodes in cp.transitions.loading.items() if node in nodes}
        return {"node": node, "registered": True, "incarnation": state.incarnation,
                "apps": sorted(set(self.node_pieces(node)) | loading),
                **({"lease_s": state.lease_s} if state.lease_s > 0 else {})}

    async def _probe(self, node: str, url: str) -> None:
        """Time a new agent's round trip: the node's serving path until its requests say more
        (``AdaptationManager.probed``)."""
        ms = await self.cp.driver.probe_ms(url)
        if ms is not None:
            self.cp.adaptation.probed(node, ms)

    def deregister_agent(self, node: str) -> dict[str, Any]:
        """``DELETE /v1/agents/{node}``: forget the agent; its endpoints leave the routes."""
        if self.agents.pop(node, None) is None:
            raise ControlPlaneError(f"agent of node '{clip(node)}' is not registered", 404)
        self.cp.adaptation.observer.forget(f"agent:{node}")
        gone = [k[0] for k in self.actual if k[1] == node]
        for app in gone:
            del self.actual[(app, node)]
            self.errors[(app, node)] = f"agent of node {node} deregistered"
            self.cp.spawn(self.cp.routes.publish(app))  # its endpoint leaves the route
        logger.info("agent %s deregistered", node)
        return {"node": node, "registered": False}

    def list_agents(self) -> dict[str, Any]:
        """``GET /v1/agents``: the agents (heartbeat age in s), the nodes without one, the nodes' power."""
        now = self.cp.clock()
        power = self.cp.power
        agents = []
        for node, a in self.agents.items():
            age = max(0.0, now - a.last_seen)
            agents.append(AgentView(node, a.url, a.incarnation, a.version, a.heartbeat_s, age,
                                    age <= lost_after_s(a), tuple(sorted(a.reported)),
                                    tuple(sorted(a.devices)), a.runs_on,
                                    power.state(node) if power.enabled else None).to_json())
        missing = [n.name for n in self.cp.cluster.nodes if n.name not in self.agents]
        out: dict[str, Any] = {"agents": agents, "unregistered_nodes": missing}
        if power.enabled:
            out["power"] = power.to_json(now)
        return out

    # -- the reconcile pass ----------------------------------------------------------------------------

    def update(self) -> None:
        """One pass: republish the routes of the apps of an agent that went silent or came back (so that
        gateways stop sending to a dead agent without waiting for a request to fail there), and reconcile each
        live node whose actual differs from its target (in the background, one reconcile per node at a
        time)."""
        for node in list(self.agents):
            alive = self.alive(node)
            if self._was_alive.get(node, alive) != alive:
                logger.warning("agent %s %s", node, "is back" if alive else "missed its heartbeats")
                for app in sorted(self.node_pieces(node)):
                    self.cp.spawn(self.cp.routes.publish(app))
            self._was_alive[node] = alive
            lock = self._node_locks.setdefault(node, asyncio.Lock())
            if alive and not lock.locked() and self.needs_reconcile(node):
                self.cp.spawn(self.reconcile(node))

    def needs_reconcile(self, node: str) -> bool:
        """The node's agent reports, or acknowledged, other than its target (pieces a move owns aside)."""
        agent = self.agents[node]
        want = self.node_pieces(node)
        moves = self.cp.transitions
        if any(not moves.hands_off(a) and (not group_matches(g, agent.reported.get(a)) or
                                           self.actual.get((a, node)) != g) for a, g in want.items()):
            return True
        return any(a not in want and not moves.keeps_extra(a) for a in agent.reported)

    async def reconcile(self, node: str) -> None:
        """Bring the node's agent to its target: PUT the missing or different, DELETE the extra, then
        republish the routes of the apps whose endpoints changed."""
        lock = self._node_locks.setdefault(node, asyncio.Lock())
        async with lock:
            agent = self.agents.get(node)
            if agent is None:
                return
            want = self.node_pieces(node)
            moves = self.cp.transitions
            touched: list[str] = []
            for app, group in want.items():
                if moves.hands_off(app):
                    continue
                if group_matches(group, agent.reported.get(app)):
                    if self.actual.get((app, node)) != group:
                        self.actual[(app, node)] = group
                        self.errors.pop((app, node), None)
                        touched.append(app)
                    continue
                ok, _ = await self.put_group(app, node, group)
                if ok:
                    touched.append(app)
            for app in [a for a in agent.reported if a not in want and not moves.keeps_extra(a)]:
                await self.delete_piece(app, node)
            for app in touched:
                if app in self.apps:
                    await self.cp.routes.publish(app)

    async def put_group(self, app: str, node: str, group: Group) -> tuple[bool, str | None]:
        """Load the app's pieces ``group`` on the node's agent; (done, error). Done only while ``group`` is
        still the target there (a later apply may have changed it meanwhile)."""
        agent = self.agents.get(node)
        key = (app, node)
        if agent is None:
            self.errors[key] = f"agent of node {node} is not registered"
            return False, self.errors[key]
        try:
            await self.cp.driver.put_app(agent.url, app, group_body(group))
            err = None
        except AgentCallError as e:
            err = e.message
        if err is None and app in self.placements and self.groups(app).get(node) == group:
            self.actual[key] = group
            self.errors.pop(key, None)
            agent.reported[app] = [p.report(app) for p in group]
            return True, None
        if err is not None:
            if self.errors.get(key) != err:
                logger.warning("app %s on %s: %s (retried at the agent's next heartbeat)", app,
                               ", ".join(p.device_path for p in group), err)
            self.errors[key] = err
        return False, err

    async def delete_piece(self, app: str, node: str) -> tuple[bool, str | None]:
        """Unload the app at the node's agent; (done, error)."""
        agent = self.agents.get(node)
        if agent is None:
            return False, f"agent of node {node} is not registered (it drops the app when it registers)"
        try:
            await self.cp.driver.delete_app(agent.url, app)
        except AgentCallError as e:
            err = e.message
        else:
            agent.reported.pop(app, None)
            self.actual.pop((app, node), None)
            return True, None
        logger.warning("removing app %s from node %s: %s (retried at its next heartbeat)", app, node, err)
        return False, err
