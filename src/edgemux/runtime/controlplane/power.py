"""The power manager (``--consolidate``): the nodes' power states (``consolidation.PowerStates``), switching a
node's devices on and off through its agent, waking a node, and the consolidation step that follows each
window's adapt step.

The decisions are ``adapt.consolidate``'s (pure; the simulator runs the same ones). A waking node serves once its
wake-up time has passed, seen at the next apply or window (:meth:`PowerManager.tick`); admission and the adapt
loop plan on the nodes that are on (:meth:`PowerManager.live`). After a window's adapt step (the controller
loop's pass after the adaptation manager's, :meth:`PowerManager.update`) one consolidation step runs on the same
snapshot: nodes stop draining, wake ahead of demand, a node starts draining (its tenants moved off make before
break) and an emptied draining node is switched off, under the apply lock and only when the store places nothing
there. An app that finds no room while a node is off wakes one (:meth:`PowerManager.wake_for_room`, which
admission turns into a ``Retry-After``). The states are not in the store: a new agent process reports its
devices' states, which :meth:`PowerManager.agent_restarted` takes as the truth for on and off. Without
consolidation every node is on and nothing here acts.

Units: ``*_s`` seconds on the control plane's clock.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from edgemux.adapt.consolidate import ConsolidationSettings, consolidate_plan, holding, observed_utilization, \
    utilization_trend
from edgemux.adapt.plan import live_snapshot
from edgemux.cluster.state import App
from edgemux.policies import Rejection, Snapshot
from edgemux.runtime.controlplane.agentdriver import AgentCallError
from edgemux.runtime.controlplane.consolidation import PowerStates
from edgemux.runtime.dataplane.messages import AgentReport

if TYPE_CHECKING:
    from edgemux.runtime.controlplane.adaptation import WindowOutcome
    from edgemux.runtime.controlplane.service import ControlPlane

__all__ = ["PowerManager"]

logger = logging.getLogger("edgemux.controlplane")


class PowerManager:
    """Power states and consolidation (module doc) for the controller ``cp``; ``settings`` None: consolidation
    is off. ``wake_s``: one wake-up time (s) for every node instead of each node's own."""

    def __init__(self, cp: ControlPlane, settings: ConsolidationSettings | None, wake_s: float | None) -> None:
        self.cp = cp
        self.settings = settings
        self.states = PowerStates(cp.cluster, settings, cp.clock(), wake_s) if settings is not None else None

    @property
    def enabled(self) -> bool:
        """Consolidation is on."""
        return self.states is not None

    def state(self, node: str) -> str:
        """The node's power state (``on`` when consolidation is off)."""
        return self.states.state(node) if self.states is not None else "on"

    def to_json(self, now_s: float) -> dict[str, dict[str, object]]:
        """Every node's power state, as ``GET /v1/agents`` shows it."""
        return self.states.to_json(now_s) if self.states is not None else {}

    def asleep(self) -> frozenset[str]:
        """The nodes off or waking (they take no placement)."""
        return self.states.asleep() if self.states is not None else frozenset()

    def live(self, snap: Snapshot) -> Snapshot:
        """``snap`` on the nodes that are on: switched-off and waking nodes (which hold nothing) left out."""
        asleep = self.asleep()
        return live_snapshot(snap, asleep)[0] if asleep else snap

    def tick(self) -> None:
        """Waking nodes whose wake-up time has passed serve from now."""
        if self.states is None:
            return
        now = self.cp.clock()
        for node in self.states.ready(now):
            self.states.set(node, "on", now)
            self._event(node, "on", "is on: it woke and takes placements again")

    def _event(self, node: str, state: str, message: str, **data: Any) -> None:
        self.cp.events.add("power", None, f"node {node} {message}", {"node": node, "state": state, **data})

    # -- the controller loop's pass ----------------------------------------------------------------------

    def update(self) -> None:
        """One pass: when the adaptation manager's update of this pass closed a window and stepped, the
        consolidation step that follows it."""
        outcome = self.cp.adaptation.take_outcome()
        if outcome is not None:
            self.after_window(outcome)

    def after_window(self, outcome: WindowOutcome) -> None:
        """The consolidation step after a window's adapt step (nothing without consolidation)."""
        if self.states is None:
            return
        if outcome.refused:
            self.states.starved = True  # an app found no room: a switched-off node may have it
        self.consolidate(outcome)

    def consolidate(self, outcome: WindowOutcome) -> None:
        """One step of the consolidation planner (``adapt.consolidate``, the simulator's too) on the window's
        snapshot of the store: switch off the emptied draining nodes, wake ahead of demand, drain a node. The
        apps the window's adapt step is moving stay where they are."""
        assert self.states is not None and self.settings is not None
        cp, power = self.cp, self.states
        now = cp.clock()
        full = outcome.snapshot
        on = power.in_state("on", "draining")
        u = observed_utilization(full, outcome.windows, on)
        power.observe(now, u)
        busy = outcome.moved | cp.transitions.busy() | cp.adaptation.pending
        plan = consolidate_plan(cp.policy, full, power.view(), self.settings,
                                trend_per_s=utilization_trend(power.util_hist), starved=power.starved,
                                exclude=busy, observed_utilization=u)
        power.starved = False
        why = "; ".join(plan.reasons)
        for node in plan.undrain:
            power.set(node, "on", now)
            self._event(node, "on", f"stops draining: {why}")
        for node in plan.wake:
            self._wake_node(node, why)
        for t in plan.transitions:
            cp.adaptation.carry(t)
        for node in plan.draining:
            power.set(node, "draining", now)
            self._event(node, "draining", f"is draining: {why}", apps=[t.app for t in plan.transitions])
        for node in plan.switch_off:
            cp.spawn(self._switch_off(node, why))

    # -- waking --------------------------------------------------------------------------------------------

    def wake_for_room(self, app: App, full: Snapshot, rejection: Rejection) -> tuple[float, str] | None:
        """An app found no room on the nodes that are on: with a node off or waking, wake the one the
        consolidation planner picks (unless one is waking already) and say when to apply again: (seconds,
        words). None when every node is on (the rejection stands)."""
        power = self.states
        if power is None or self.settings is None or not power.asleep():
            return None
        power.starved = True
        if not power.in_state("waking"):
            view = replace(power.view(), waking=frozenset())
            plan = consolidate_plan(self.cp.policy, full, view, self.settings, starved=True)
            why = f"app {app.name} found no room ({rejection.constraint})"
            for node in plan.undrain:
                power.set(node, "on", self.cp.clock())
                self._event(node, "on", f"stops draining: {why}")
            for node in plan.wake:
                self._wake_node(node, why)
        ready = power.ready_in_s(self.cp.clock())
        if ready is None:  # a wake failed at once: nothing is coming
            return None
        waking = ", ".join(sorted(power.in_state("waking")))
        return ready, (f"node {waking} is waking to make room (it serves in about {math.ceil(ready):.0f} s): "
                       f"apply again then")

    def _wake_node(self, node: str, why: str) -> None:
        """Switch ``node`` on (waking: it serves ``wake_s`` later) and its agent's devices on."""
        assert self.states is not None
        self.states.set(node, "waking", self.cp.clock())
        n = self.states.nodes[node]
        self._event(node, "waking", f"is waking (serves in {n.wake_s:g} s): {why}", wake_s=n.wake_s)
        self.cp.spawn(self._wake_devices(node))

    async def _wake_devices(self, node: str) -> None:
        """The devices half of a wake; when the agent cannot switch them on, the node is off again (admission
        must not count on it) and a later step or arrival wakes it again."""
        assert self.states is not None
        err = await self.switch_devices(node, "on")
        if err is not None and self.states.state(node) == "waking":
            self.states.set(node, "off", self.cp.clock())
            self._event(node, "off", f"could not be woken: {err}", error=err)

    # -- switching -------------------------------------------------------------------------------------

    async def switch_devices(self, node: str, state: str) -> str | None:
        """Switch every device of ``node`` ``on`` or ``off`` through its agent; None when done, else one line
        naming what failed (an agent that is not registered, or its refusal: a device that holds a model is
        never switched off). A failed switch-off switches the devices it got back on."""
        cp = self.cp
        agent = cp.reconciler.agents.get(node)
        if agent is None or not cp.reconciler.alive(node):
            return f"the agent of node {node} is not {'registered' if agent is None else 'answering'}"
        done: list[str] = []
        for device in cp.cluster.node(node).devices:
            try:
                await cp.driver.set_power(agent.url, device.name, state)
            except AgentCallError as e:
                if state == "off":
                    for d in done:  # a node is off whole or not at all
                        try:
                            await cp.driver.set_power(agent.url, d, "on")
                        except AgentCallError:
                            pass
                return e.message
            done.append(device.name)
        return None

    async def _switch_off(self, node: str, why: str) -> None:
        """Switch a drained node off: under the apply lock, so that nothing is admitted onto it meanwhile, and
        only when the store places nothing there and no move touches it (a node never goes off under a
        tenant; its agent refuses too). A node that cannot be switched off stays draining: the next step
        tries again, or stops the drain when a tenant stays."""
        assert self.states is not None
        cp = self.cp
        async with cp.apply_lock:
            if self.states.state(node) not in ("on", "draining"):  # an empty node goes off without a drain
                return
            held = holding(cp.snapshot(), node)
            agent = cp.reconciler.agents.get(node)
            reported = sorted(agent.reported) if agent is not None else []
            if held or reported:
                logger.info("node %s not switched off yet: it holds %s", node, ", ".join(held or reported))
                return
            err = await self.switch_devices(node, "off")
            if err is not None:
                self._event(node, "draining", f"could not be switched off: {err}", error=err)
                return
            self.states.set(node, "off", cp.clock())
            self._event(node, "off", f"is off: {why}")

    def agent_restarted(self, node: str, msg: AgentReport) -> None:
        """A new agent process (or the first report to this process): its devices' states are the truth for
        on and off. Every device off: the node is off (a restarted control plane finds the nodes it switched
        off); a device on where the node was off: the node came back on by itself (it serves now)."""
        if self.states is None:
            return
        cp = self.cp
        states = {str(d.get("power_state", "on")) for d in msg.devices.values()}
        current = self.states.state(node)
        placed = cp.reconciler.node_pieces(node)
        if states == {"off"} and current != "off" and not placed:
            self.states.set(node, "off", cp.clock())
            self._event(node, "off", "is off: its agent reports every device switched off")
        elif "on" in states and current == "off":
            self.states.set(node, "on", cp.clock())
            self._event(node, "on", "is on: its agent reports devices switched on")
        elif "off" in states and placed:
            # the store places apps there: the node must serve (an agent must never hold a tenant's device off)
            self.states.set(node, "on", cp.clock())
            self._event(node, "on", "is switched on: its agent reports devices off where the store places "
                        f"{', '.join(sorted(placed))}")
            cp.spawn(self.switch_devices(node, "on"))
