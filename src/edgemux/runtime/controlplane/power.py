"""The power manager (``--consolidate``): the nodes' power states (``consolidation.PowerStates``), and the power
actions of the adaptation cycle carried out: switching a node's devices on and off through its agent, waking,
draining.

It plans nothing: the decisions are the cycle's (``adapt.cycle``, which the simulator drives too), and the
adaptation manager hands it the power actions in the cycle's order (:meth:`PowerManager.carry_out`): ``Woke``
and ``Undrain`` set a node on, ``Wake`` sets it waking and switches its devices on, ``Drain`` sets it
draining, ``SwitchOff`` switches an emptied node off, under the apply lock and only when the store places
nothing there (its agent may refuse: the node stays draining and a later cycle tries again). Every change is a
``power`` event. Admission and the cycle plan on the nodes that are on (:meth:`PowerManager.live`). A waking
node serves once its wake-up time has come: the power tick (``adapt.cycle.power_tick``) runs at the controller
loop's pass, which wakes at that time (:meth:`PowerManager.due_in_s`), after each window's actions and before
each admission decision (:meth:`PowerManager.tick`). An app that finds no room while a node sleeps takes the
cycle's arrival path and is told when to apply again (:meth:`PowerManager.wake_for_room`, which admission turns
into a ``Retry-After``). The states are not in the store: a new agent process reports its devices' states,
which :meth:`PowerManager.agent_restarted` takes as the truth for on and off. Without consolidation every node
is on and nothing here acts.

Units: ``*_s`` seconds on the control plane's clock.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from edgemux.adapt.consolidate import ConsolidationSettings, PowerView, holding
from edgemux.adapt.cycle import Drain, SwitchOff, Undrain, Wake, Woke, power_tick
from edgemux.adapt.plan import live_snapshot
from edgemux.cluster.state import App
from edgemux.policies import Rejection, Snapshot
from edgemux.runtime.controlplane.agentdriver import AgentCallError
from edgemux.runtime.controlplane.consolidation import PowerStates
from edgemux.runtime.dataplane.messages import AgentReport

if TYPE_CHECKING:
    from edgemux.runtime.controlplane.service import ControlPlane

__all__ = ["PowerManager"]

logger = logging.getLogger("edgemux.controlplane")


class PowerManager:
    """Power states and the cycle's power actions (module doc) for the controller ``cp``; ``settings`` None:
    consolidation is off. ``wake_s``: one wake-up time (s) for every node instead of each node's own."""

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

    def view(self) -> PowerView | None:
        """The power states as the cycle reads them (None without consolidation: every node on)."""
        return self.states.view() if self.states is not None else None

    # -- the controller loop's pass ----------------------------------------------------------------------

    def due_in_s(self) -> float:
        """Seconds until the first waking node serves (the controller loop wakes then); inf when none wakes."""
        if self.states is None:
            return math.inf
        ready = self.states.ready_in_s(self.cp.clock())
        return math.inf if ready is None else ready

    def update(self) -> None:
        """One pass: the power tick."""
        self.tick()

    def tick(self) -> None:
        """The waking nodes whose wake-up time has come serve from now (``adapt.cycle.power_tick``), carried out
        and recorded by the adaptation manager as every action of the cycle."""
        if self.states is not None:
            self.cp.adaptation.carry_out(power_tick(self.states.view(), self.cp.clock()))

    # -- the cycle's power actions ---------------------------------------------------------------------------

    def carry_out(self, a: Woke | SwitchOff | Undrain | Wake | Drain, why: str | None = None) -> None:
        """Carry out one power action of the cycle (module doc); ``why``: the reason the event gives instead of
        the action's own (an arrival's)."""
        assert self.states is not None, "power actions come only with consolidation"
        now = self.cp.clock()
        if isinstance(a, Woke):
            self.states.set(a.node, "on", now)
            self._event(a.node, "on", "is on: it woke and takes placements again")
            return
        reason = why or a.reason
        if isinstance(a, SwitchOff):
            self.cp.spawn(self._switch_off(a.node, reason))
        elif isinstance(a, Undrain):
            self.states.set(a.node, "on", now)
            self._event(a.node, "on", f"stops draining: {reason}")
        elif isinstance(a, Wake):
            self._wake_node(a.node, reason)
        else:
            self.states.set(a.node, "draining", now)
            self._event(a.node, "draining", f"is draining: {reason}", apps=list(a.apps))

    def _event(self, node: str, state: str, message: str, **data: Any) -> None:
        self.cp.events.add("power", None, f"node {node} {message}", {"node": node, "state": state, **data})

    # -- waking --------------------------------------------------------------------------------------------

    def wake_for_room(self, app: App, full: Snapshot, rejection: Rejection) -> tuple[float, str] | None:
        """An app found no room on the nodes that are on (``full``: admission's snapshot, every node): the
        cycle's arrival path (``adapt.cycle.wake_for_arrival``: a node woken unless one is waking already), and
        when to apply again: (seconds, words). None when no node is waking now (every node is on, or a wake
        failed at once): the rejection stands."""
        if self.states is None:
            return None
        self.cp.adaptation.arrival_without_room(full, f"app {app.name} found no room ({rejection.constraint})")
        ready = self.states.ready_in_s(self.cp.clock())
        if ready is None:
            return None
        waking = ", ".join(sorted(self.states.in_state("waking")))
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
