"""The cluster simulator's nodes: each node's power state and energy meter, and which nodes have failed.

One part of ``sim.cluster`` (see its module doc for what it models), owning that state: a node is on
(draining is on too, and listed in ``draining``), waking (until its ``ready_s``) or off; with power figures
(``cluster.power.NodePower``) every node's energy is metered over the intervals it spends in each state (on:
idle power plus each device's dynamic power over its busy time, counted in the interval its requests were
sent in and capped at it). A failed node's agent is last heard from when it failed; every other node's is
heard from now. Units: seconds, J.
"""

from __future__ import annotations

from collections.abc import Mapping

from edgemux.adapt.consolidate import PowerView
from edgemux.cluster.power import EnergyMeter, NodePower, PowerState
from edgemux.cluster.state import Cluster
from edgemux.sim.outcome import NodeEnergy, PowerChange

__all__ = ["Nodes"]


class Nodes:
    """The nodes of one run (module doc); ``power`` None: every node stays on and nothing is metered."""

    def __init__(self, cluster: Cluster, power: Mapping[str, NodePower] | None) -> None:
        self.power = power
        self.node_of = {d.path: d.node for d in cluster.devices.values()}
        self.state = {n.name: PowerState.ON for n in cluster.nodes}
        self.draining: set[str] = set()
        self.ready_s: dict[str, float] = {}  # waking node -> when it serves (s)
        self.meters = {n: EnergyMeter(p) for n, p in power.items()} if power is not None else {}
        self.busy_ms: dict[str, float] = {}  # device path -> its requests' service time since the last meter
        self.app_energy: dict[str, float] = {}  # app -> the dynamic energy of its requests' service (J)
        self.meter_s = 0.0
        self.changes: list[PowerChange] = []
        self.failed: dict[str, float] = {}  # node -> when it failed (s)

    def busy(self, path: str, app: str, service_ms: float) -> None:
        """A request of ``app`` sent to device ``path`` that will keep it busy ``service_ms`` (ms)."""
        if self.power is None:
            return
        self.busy_ms[path] = self.busy_ms.get(path, 0.0) + service_ms
        dyn = self.power[self.node_of[path]].dynamic_w.get(path, 0.0)
        self.app_energy[app] = self.app_energy.get(app, 0.0) + dyn * service_ms / 1000.0

    def meter(self, now_s: float) -> None:
        """Close every node's energy interval up to ``now_s`` (s) in its current state."""
        if self.power is None:
            return
        dt = max(0.0, now_s - self.meter_s)
        by_node: dict[str, dict[str, float]] = {n: {} for n in self.meters}
        for path, ms in self.busy_ms.items():
            # a backlog sent in one interval is busy time of the next ones too: capped at the interval
            by_node[self.node_of[path]][path] = min(ms / 1000.0, dt)
        self.busy_ms.clear()
        for node, meter in self.meters.items():
            state = self.state[node]
            meter.advance(now_s, state, by_node[node] if state is PowerState.ON else None)
        self.meter_s = max(self.meter_s, now_s)

    def set(self, now_s: float, node: str, state: PowerState | str, reason: str) -> None:
        """Record ``node``'s change at ``now_s`` (s) with ``reason``; a ``PowerState`` also changes what it
        draws from now (a string, "draining" or "on" for a drain that stops, is a record only: the node is on
        either way)."""
        if isinstance(state, PowerState):
            self.meter(now_s)
            self.state[node] = state
        if state is not PowerState.WAKING:
            self.ready_s.pop(node, None)
        self.changes.append(PowerChange(now_s, node, state.value if isinstance(state, PowerState) else state,
                                        reason))

    def asleep(self) -> frozenset[str]:
        """The nodes off or waking: admission cannot use them now but could later."""
        return frozenset(n for n, st in self.state.items() if st is not PowerState.ON)

    def view(self) -> PowerView:
        """The power states as ``adapt.consolidate`` and ``adapt.cycle`` read them."""
        return PowerView(off=frozenset(n for n, st in self.state.items() if st is PowerState.OFF),
                         waking=frozenset(n for n, st in self.state.items() if st is PowerState.WAKING),
                         draining=frozenset(self.draining),
                         wake_s={n: p.wake_s for n, p in (self.power or {}).items()}, ready_s=dict(self.ready_s))

    def last_seen(self, now_s: float) -> dict[str, float]:
        """When each node's agent was last heard from (s): a failed node's when it failed, the others' now."""
        return {n: self.failed.get(n, now_s) for n in self.state}

    def energy(self) -> tuple[NodeEnergy, ...]:
        """Each metered node's energy and time in each state (cluster order)."""
        return tuple(NodeEnergy(n, m.joules, m.seconds["on"], m.seconds["waking"], m.seconds["off"])
                     for n, m in self.meters.items())
