"""The admission manager: apps applied (``POST /v1/apps``, ``PUT /v1/apps/{name}``) and deleted, the policy's
decision and its commit to the store, and the answer to an app that finds no room while a node sleeps (the node
woken, and the ``Retry-After`` that says when to apply again).

Apps are applied one at a time under the controller's apply lock (so that every decision sees the commits before
it). An app is decided by the policy on a snapshot of the targets (on the nodes that are on, without the app's
own old placement when it changes), and the decision is committed on the store thread in one go: a changed app
is delete + admit, and if the admit fails the old app is admitted back. Only then are the targets set, and the
app's pieces loaded make before break: its new pieces loaded, its route published, and only then the pieces it
left unloaded. Admission acts on requests, so it has no pass of the controller loop: each decision and commit
is timed by ``edgemux_controlplane_admission_seconds``.

Units: ``*_s`` seconds; ``rate_rps`` req/s.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from edgemux.cluster.state import App, Placement
from edgemux.cluster.store import Store
from edgemux.policies import Rejection, Snapshot
from edgemux.runtime.auth import digest, new_app_key
from edgemux.runtime.controlplane.common import rejection_view, shares_text
from edgemux.runtime.controlplane.messages import ApplyAnswer, ApplyResult, RejectionView

if TYPE_CHECKING:
    from edgemux.runtime.controlplane.service import ControlPlane

__all__ = ["Admission"]

logger = logging.getLogger("edgemux.controlplane")


def _rejection_view(r: Rejection) -> RejectionView:
    """A policy's rejection as the apply answer carries it: the closest device's constraint and numbers, its
    headline, and every device's reason as a record (``RejectionView``)."""
    return replace(rejection_view(r), headline=r.reason.text, reasons=tuple(x.to_json() for x in r.reasons))


class Admission:
    """Apply and delete (module doc), for the controller ``cp``."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp

    async def apply(self, apps: list[App]) -> tuple[int, dict[str, Any]]:
        """Apply apps in order (``POST /v1/apps`` in docs/reference/http.md); returns (HTTP status, body)."""
        results = []
        for app in apps:
            async with self.cp.apply_lock:
                results.append(await self._apply_one(app))
            self._event(results[-1])
        answer = ApplyAnswer(tuple(results))
        status = 409 if answer.rejected else 201 if any(r.result == "created" for r in results) else 200
        return status, answer.to_json()

    def _event(self, r: ApplyResult) -> None:
        """The timeline's entry of one applied app (none when it was unchanged; ``adaptation.OPERATOR_EVENTS``)."""
        if r.result in ("created", "updated") and r.placement is not None:
            kind = "admitted" if r.result == "created" else "updated"
            self.cp.events.add(kind, r.app, f"{kind} at {shares_text(r.placement)}",
                               {"by": "operator", "placement": [s.device for s in r.placement.shares]})
        elif r.result == "rejected" and r.rejection is not None:
            self.cp.events.add("rejected", r.app, r.rejection.message, {"by": "operator",
                                                                        "rejection": r.rejection.to_json()})

    @staticmethod
    def retry_after(body: Mapping[str, Any]) -> str | None:
        """The ``Retry-After`` header (whole seconds) of an apply answer whose rejected apps wait for a node
        to wake; None otherwise."""
        waits = [r["retry_after_s"] for r in body.get("results", []) if r.get("retry_after_s") is not None]
        return str(max(1, math.ceil(max(waits)))) if waits else None

    async def _apply_one(self, app: App) -> ApplyResult:
        cp = self.cp
        targets = cp.reconciler
        old = targets.apps.get(app.name)
        if old is not None and replace(old, rate_rps=targets.declared.get(app.name, old.rate_rps)) == app:
            # the spec as applied: unchanged, whatever contract adaptation has put in force since
            return ApplyResult(app.name, "unchanged", targets.status(app.name), targets.placements[app.name])
        cp.power.tick()
        full = cp.snapshot()
        snap = cp.power.live(full)  # switched-off and waking nodes take no placement
        if old is not None:
            snap = snap.without(app.name)
        # a new app gets a key when authentication is on (shown once, in this answer); a changed one keeps its own
        key = new_app_key() if old is None and cp.guard.enabled else None
        key_sha256 = digest(key) if key is not None else cp.routes.keys.get(app.name)
        # decide and commit on the store thread: a policy may bisect for a while, a commit fsyncs
        decision = await cp.db.run(lambda store: self._decide_commit(store, app, snap, old, key_sha256))
        if isinstance(decision, Rejection):
            wait = cp.power.wake_for_room(app, full, decision)
            view = _rejection_view(decision)
            if wait is not None:
                view = replace(view, message=f"{view.message}; {wait[1]}")
                return ApplyResult(app.name, "rejected", rejection=view, retry_after_s=wait[0])
            return ApplyResult(app.name, "rejected", rejection=view)
        if key_sha256 is not None:
            cp.routes.keys[app.name] = key_sha256
        old_groups, new_groups = targets.set_target(app, decision)
        # make before break: load the new pieces, move the route, then unload the dropped pieces
        await asyncio.gather(*(targets.put_group(app.name, n, g) for n, g in new_groups.items()))
        await cp.routes.publish(app.name)
        await asyncio.gather(*(targets.delete_piece(app.name, n) for n in old_groups if n not in new_groups))
        logger.info("app %s %s: %s", app.name, "updated" if old else "admitted",
                    ", ".join(f"{s.device} x{s.weight:.3g}" for s in decision.shares))
        pending = tuple({"node": p.node, "device": p.device, "weight": p.weight, "error": p.error}
                        for p in cp.routes.route(app.name).pending)
        return ApplyResult(app.name, "updated" if old is not None else "created", targets.status(app.name),
                           decision, pending=pending, key=key)

    def _decide_commit(self, store: Store, app: App, snap: Snapshot, old: App | None,
                       key_sha256: str | None) -> Placement | Rejection:
        """(store thread) The policy's decision; a placement is committed (delete + admit for a change) with
        the app's key digest. Timed by the admission metric."""
        t0 = time.perf_counter()
        try:
            decision = self.cp.policy.decide(app, snap)
            if isinstance(decision, Rejection):
                return decision
            if old is not None:
                targets = self.cp.reconciler
                old_placement = targets.placements[app.name]
                store.remove(app.name)
                try:
                    store.admit(app, decision, key_sha256=key_sha256)
                except BaseException:
                    # put the old app back, its declared contract and key too: the change did not happen
                    store.admit(old, old_placement, declared_rps=targets.declared.get(app.name),
                                key_sha256=self.cp.routes.keys.get(app.name))
                    raise
            else:
                store.admit(app, decision, key_sha256=key_sha256)
            return decision
        finally:
            self.cp.metrics.admission.observe(time.perf_counter() - t0)

    async def delete(self, name: str) -> dict[str, Any]:
        """Remove an app: store, agents, gateways; ``ControlPlaneError`` 404 for an unknown app."""
        cp = self.cp
        async with cp.apply_lock:
            cp.reconciler.app(name)
            await cp.db.call("remove", name)
            nodes = cp.reconciler.drop(name)
            cp.routes.keys.pop(name, None)
            # routes first: clients stop being sent there before the agents drop the app
            await cp.routes.unpublish(name)
            done = await asyncio.gather(*(cp.reconciler.delete_piece(name, node) for node in nodes))
        logger.info("app %s deleted", name)
        cp.events.add("deleted", name, "deleted", {"by": "operator"})
        return {"app": name, "deleted": True,
                "agents": {node: ("deleted" if ok else err) for node, (ok, err) in zip(nodes, done)}}
