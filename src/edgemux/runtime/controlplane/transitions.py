"""The transitions manager: an admitted app moved, re-weighted or re-shared while it serves, make before break
(``POST /v1/apps/{name}/move``, and every move the adapt loop and consolidation plan), its roll-back, and the
recovery of the moves a previous process left in the store.

A move is recorded in the store before anything loads (phase ``loading``), switched in one store transaction
(phase ``draining``: the placement is the new one) and forgotten once the old pieces unloaded. While this
process moves an app it owns the app's pieces: the reconciler neither loads nor unloads them then, and the
routes sync leaves its route to the move. A move found in the store at start is finished from there
(:meth:`Transitions.recover`): one still ``loading`` never switched, so it is forgotten and the reconcile pass
takes its new pieces away; one ``draining`` had switched, so its old pieces unload once every gateway holds
the new route, ``drain_grace_s`` after the start at the earliest (:meth:`Transitions.update`, each pass).

Units: ``*_s`` seconds on the control plane's clock; ``rate_rps`` req/s.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from edgemux.cluster.state import Placement
from edgemux.cluster.store import TransitionRecord
from edgemux.policies import Rejection
from edgemux.policies.moves import check_move, share_on
from edgemux.runtime.controlplane.agentdriver import AgentCallError
from edgemux.runtime.controlplane.common import ControlPlaneError, clip, listing, rejection_json, shares_text
from edgemux.runtime.controlplane.messages import MoveAnswer, MoveRequest, placement_to_json
from edgemux.runtime.controlplane.pieces import Group, group_body
from edgemux.runtime.messages import MessageError

if TYPE_CHECKING:
    from edgemux.runtime.controlplane.service import ControlPlane

__all__ = ["READY_TIMEOUT_S", "RECOVERY_GATEWAY_WAIT_S", "Transitions"]

logger = logging.getLogger("edgemux.controlplane")

READY_TIMEOUT_S = 30.0            # a move waits this long (s) for its new pieces to say they are ready
RECOVERY_GATEWAY_WAIT_S = 30.0    # after a restart, how long (s) an interrupted move waits for a gateway


class Transitions:
    """Moves under way and their recovery (module doc), for the controller ``cp``."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.records: dict[str, TransitionRecord] = {}  # moves under way, by app (as in the store)
        self._drain_until: dict[str, float] = {}  # a recovered switched move's old pieces unload after this
        self._moving: set[str] = set()  # apps a transition() of this process is moving: the loop leaves them be
        # app -> the nodes a move of this process is loading it onto (until the move ends): placed there too as
        # far as a returning agent is concerned (the reconciler's answer to a heartbeat; runtime.dataplane.lease)
        self.loading: dict[str, frozenset[str]] = {}

    # -- what the other managers ask -------------------------------------------------------------------

    def hands_off(self, app: str) -> bool:
        """True while a move of this process owns the app's pieces: the reconciler neither loads nor unloads
        them then, and the routes sync leaves its route to the move."""
        return app in self._moving

    def keeps_extra(self, app: str) -> bool:
        """True when an agent may hold ``app`` beyond its placement: a move owns it, or an interrupted move's
        old pieces are still draining."""
        return app in self._moving or app in self._drain_until

    def busy(self) -> frozenset[str]:
        """The apps a move holds: moved by this process or recorded in the store."""
        return frozenset(self._moving) | frozenset(self.records)

    def phase(self, app: str) -> dict[str, Any] | None:
        """The move under way as ``describe`` shows it (None: none)."""
        rec = self.records.get(app)
        if rec is not None:
            return {"phase": rec.phase, "from": placement_to_json(rec.old), "to": placement_to_json(rec.new)}
        return {"phase": "moving"} if app in self._moving else None

    # -- recovery --------------------------------------------------------------------------------------

    async def recover(self, records: dict[str, TransitionRecord]) -> None:
        """Finish the moves a previous process left in the store (module doc)."""
        for app, rec in records.items():
            if rec.phase == "loading":
                await self.cp.db.call("end_transition", app)
                logger.warning("app %s: a move to %s was interrupted before its switch; it stays at %s", app,
                               shares_text(rec.new), shares_text(rec.old))
            else:
                self.records[app] = rec
                self._drain_until[app] = self.cp.clock() + self.cp.drain_grace_s
                logger.warning("app %s: finishing an interrupted move to %s (old pieces unload after the "
                               "routes moved)", app, shares_text(rec.new))

    def update(self) -> None:
        """One pass: finish the recovered moves whose old pieces may go (in the background)."""
        for app in list(self._drain_until):
            if app not in self._moving and self._drained(app):
                self.cp.spawn(self._finish_drain(app))

    def _drained(self, app: str) -> bool:
        """(recovery) A switched move's old pieces may go: its grace has passed and every gateway holds the new
        route; with no gateway registered yet, wait ``RECOVERY_GATEWAY_WAIT_S`` more for one to come back
        (a gateway re-registers with a restarted control plane within its check period)."""
        now, until = self.cp.clock(), self._drain_until[app]
        if now < until:
            return False
        if not self.cp.routes.gateways:
            return now >= until + RECOVERY_GATEWAY_WAIT_S
        if app not in self.cp.reconciler.apps:
            return True
        return self.cp.routes.everywhere(app)

    async def _finish_drain(self, app: str) -> None:
        """(recovery) Unload a switched move's old pieces on the nodes the app left, then forget the move."""
        rec = self.records.get(app)
        self._drain_until.pop(app, None)
        if rec is None:
            return
        reconciler = self.cp.reconciler
        if app in reconciler.placements:
            new_nodes = set(reconciler.groups(app))
            for node in sorted({self.cp.cluster.devices[s.device].node for s in rec.old.shares} - new_nodes):
                await reconciler.delete_piece(app, node)
        await self.cp.db.call("end_transition", app)
        self.records.pop(app, None)
        logger.info("app %s: interrupted move finished at %s", app, shares_text(rec.new))

    # -- moves -----------------------------------------------------------------------------------------

    def plan_move(self, name: str, body: Any) -> Placement:
        """The placement a ``POST /v1/apps/{name}/move`` body asks for: ``{"to": [{"device": "node/dev",
        "weight": w}, ...], "cpu_node": optional}`` (a device may also be a bare ``"node/dev"`` string; weights
        default to equal parts and must sum to 1). Profiles are the catalog's for each device's kind.
        ``ControlPlaneError`` 400 for a bad body, 404 for an unknown app or device."""
        cp = self.cp
        app = cp.reconciler.app(name)
        try:
            req = MoveRequest.from_json(body)
        except MessageError as e:
            raise ControlPlaneError(str(e)) from None
        for t in req.to:
            if t.device not in cp.cluster.devices:
                raise ControlPlaneError(f"unknown device '{clip(t.device)}' (devices: "
                                        f"{listing(cp.cluster.devices)})", 404)
        devices = [t.device for t in req.to]
        given = [t.weight for t in req.to if t.weight is not None]
        weights = given or [1.0 / len(devices)] * len(devices)
        if not math.isclose(math.fsum(weights), 1.0, abs_tol=1e-6):
            raise ControlPlaneError(f"'to': weights must sum to 1, got {math.fsum(weights):.6g}")
        weights[-1] = 1.0 - math.fsum(weights[:-1])  # exactly 1, as a placement requires
        snap = cp.snapshot()
        shares = []
        for device, w in zip(devices, weights):
            share = share_on(app, snap, device, w)
            if isinstance(share, Rejection):
                raise ControlPlaneError(share.message, 409, {"rejection": rejection_json(share)})
            shares.append(share)
        cpu_node = req.cpu_node if req.cpu_node is not None else (
            cp.cluster.devices[devices[0]].node if cp.reconciler.placements[name].cpu_node is not None else None)
        if cpu_node is not None and cpu_node not in {n.name for n in cp.cluster.nodes}:
            raise ControlPlaneError(f"unknown node '{clip(str(cpu_node))}' for 'cpu_node'", 404)
        return Placement(name, tuple(shares), cpu_node)

    async def transition(self, name: str, new: Placement, *, rate_rps: float | None = None) -> MoveAnswer:
        """Move app ``name`` to ``new`` without dropping a request (make before break); with ``rate_rps``
        (req/s) the app's contract becomes that rate at the switch (the adapt loop re-admits an app that sends
        more than its contract at its observed rate):

        1. check that every tenant of the devices it goes to stays within its SLO (the policy's filter;
           ``ControlPlaneError`` 409 with the rejection otherwise) and record the move in the store;
        2. load the app on the agents of the new pieces and wait until each says it is ready;
        3. switch: one store transaction makes ``new`` the placement; every gateway gets the new route;
        4. drain: ``drain_grace_s`` for requests already sent to the old pieces, then unload those;
        5. forget the move.

        A failure in 2 rolls back (the new pieces unload, the old ones stay; ``ControlPlaneError`` 502 naming
        the agent's error); a crash anywhere is finished from the store by the next start (see ``recover``).
        Returns the :class:`MoveAnswer` (``moved`` or ``unchanged``, with each step's duration in s).
        """
        cp = self.cp
        reconciler = cp.reconciler
        async with cp.apply_lock:
            app = reconciler.app(name)
            if rate_rps is not None:
                app = replace(app, rate_rps=float(rate_rps))
            old = reconciler.placements[name]
            if new == old and app == reconciler.apps[name]:
                return MoveAnswer(name, "unchanged", old, new)
            if name in self.records:
                raise ControlPlaneError(f"app '{name}' is still finishing a move", 409)
            asleep = sorted({cp.cluster.devices[sh.device].node for sh in new.shares} & cp.power.asleep())
            if asleep:
                raise ControlPlaneError(f"node {asleep[0]} is {cp.power.state(asleep[0])}: it takes no "
                                        f"placement until it is on", 409)
            # at the new contract: every tenant where it goes must stay within its SLO at that rate
            why = check_move(cp.policy, app, cp.snapshot(), new)
            if why is not None:
                raise ControlPlaneError(why.message, 409, {"rejection": rejection_json(why)})
            t0 = cp.clock()
            steps: dict[str, float] = {}
            await cp.db.call("begin_transition", old, new)
            self._moving.add(name)
            try:
                old_groups, new_groups = reconciler.groups(name), reconciler.groups_of(new, app)
                changed = {n: g for n, g in new_groups.items() if old_groups.get(n) != g}
                self.loading[name] = frozenset(changed)
                try:
                    await self._load(name, changed)
                except BaseException as e:
                    await self._roll_back(name, changed, old_groups)
                    await cp.db.call("end_transition", name)
                    if isinstance(e, AgentCallError):
                        raise ControlPlaneError(f"move of app '{name}' rolled back: {e.message}", 502) from None
                    raise
                steps["load_s"] = cp.clock() - t0
                # the switch: the store, then what the agents hold and the routes every gateway gets
                await cp.db.call("switch_transition", name, rate_rps)
                reconciler.switch(name, app, new, new_groups)
                await cp.routes.publish(name)
                steps["switch_s"] = cp.clock() - t0 - steps["load_s"]
                # drain: requests already on their way to the agents the app leaves finish there (an agent
                # that keeps the app moved it between its devices itself, make before break)
                left = [n for n in old_groups if n not in new_groups]
                if left:
                    await asyncio.sleep(cp.drain_grace_s)
                for n in left:
                    if not reconciler.alive(n):
                        # a lost node (an evacuation): no call gets through, and its agent is fenced; the
                        # reconcile deletes the app there when it comes back (runtime.dataplane.lease), instead
                        # of this move holding the app until a call to it times out
                        continue
                    await reconciler.delete_piece(name, n)
                    reconciler.errors.pop((name, n), None)
                steps["drain_s"] = cp.clock() - t0 - steps["load_s"] - steps["switch_s"]
                await cp.db.call("end_transition", name)
            finally:
                self._moving.discard(name)
                self.loading.pop(name, None)
                cp.wake()
        logger.info("app %s moved: %s -> %s (%.2f s)", name, shares_text(old), shares_text(new), cp.clock() - t0)
        return MoveAnswer(name, "moved", old, new, steps)

    async def _load(self, name: str, changed: Mapping[str, Group]) -> None:
        """Put the app's new pieces on their agents (together) and wait until each agent says the app is ready
        (``READY_TIMEOUT_S``). ``AgentCallError`` naming the first failure."""
        cp = self.cp
        agents = cp.reconciler.agents
        for node in changed:
            if node not in agents or not cp.reconciler.alive(node):
                raise AgentCallError(f"agent of node {node} is not registered or missed its heartbeats")
        results = await asyncio.gather(*(cp.driver.put_app(agents[n].url, name, group_body(g))
                                         for n, g in changed.items()), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        deadline = cp.clock() + READY_TIMEOUT_S
        for node in changed:
            while not await cp.driver.app_ready(agents[node].url, name):
                if cp.clock() > deadline:
                    raise AgentCallError(f"app {name} on node {node}: not ready within {READY_TIMEOUT_S:g} s")
                await asyncio.sleep(0.05)

    async def _roll_back(self, name: str, changed: Mapping[str, Group], old_groups: Mapping[str, Group]) -> None:
        """Undo ``_load``: a node the app did not run on drops it; one it ran on gets its old pieces back.
        Failures are left to the reconcile pass, which brings the agents to the store (the old placement)."""
        for node in changed:
            agent = self.cp.reconciler.agents.get(node)
            if agent is None:
                continue
            try:
                if node in old_groups:
                    await self.cp.driver.put_app(agent.url, name, group_body(old_groups[node]))
                else:
                    await self.cp.driver.delete_app(agent.url, name)
                    agent.reported.pop(name, None)
            except AgentCallError as e:
                logger.warning("app %s: rolling back a move on node %s: %s (the reconcile loop retries)",
                               name, node, e.message)
