"""The control plane's side of consolidation: each node's power state on the running cluster.

The decisions are ``adapt.consolidate``'s (pure; the simulator runs the same ones). This module keeps what they
need between windows, as the control plane knows it:

- a node is ``on``, ``draining`` (its tenants are being moved off, make before break, to switch it off),
  ``off`` (its devices switched off through its agent, ``PUT /v1/devices/{device}/power``) or ``waking``
  (switched on, not serving until ``wake_s`` seconds later: the node's boot time, emulated for an emulated
  device);
- each node's wake-up time (``profiles.power.node_wake_s`` from its device kinds, or one time for every node
  given by the operator) and where it comes from;
- while a node is waking, when it serves (``ready_at_s``), which the cycle's power tick reads
  (``PowerView.ready_s``).

What lies between windows for the decisions themselves (the wake rule's utilization trend, whether an app found
no room) is the cycle's state (``adapt.cycle.CycleState``), which the adaptation manager keeps.

Admission and the adapt loop plan on the nodes that are on (``asleep``: off and waking nodes are left out, as
``adapt.plan.live_snapshot`` leaves out dead ones). The power states are not in the store: an agent reports its
devices' states in every registration and heartbeat, so a restarted control plane takes a node whose devices
all report ``off`` as off, and any other as on (see ``power.PowerManager.agent_restarted``).

Units: seconds on the control plane's clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from edgemux.adapt.consolidate import ConsolidationSettings, PowerView
from edgemux.cluster.state import Cluster
from edgemux.errors import InputError
from edgemux.profiles.power import node_wake_s

__all__ = ["NODE_STATES", "NodePowerState", "PowerStates"]

NODE_STATES = ("on", "draining", "off", "waking")


@dataclass
class NodePowerState:
    """One node: its ``state`` (one of ``NODE_STATES``) since ``since_s``; its wake-up time ``wake_s`` and its
    source; while waking, ``ready_at_s`` (when it serves)."""

    state: str
    since_s: float
    wake_s: float
    wake_source: str
    ready_at_s: float | None = None

    def to_json(self, now_s: float) -> dict[str, object]:
        out: dict[str, object] = {"state": self.state, "for_s": round(max(0.0, now_s - self.since_s), 3),
                                  "wake_s": self.wake_s, "wake_source": self.wake_source}
        if self.ready_at_s is not None:
            out["ready_in_s"] = round(max(0.0, self.ready_at_s - now_s), 3)
        return out


class PowerStates:
    """The nodes' power states (module doc). ``wake_s``: one wake-up time (s) for every node, or None for each
    node's own from its device kinds."""

    def __init__(self, cluster: Cluster, settings: ConsolidationSettings, now_s: float,
                 wake_s: float | None = None) -> None:
        if wake_s is not None and (isinstance(wake_s, bool) or not isinstance(wake_s, (int, float))
                                   or not math.isfinite(wake_s) or wake_s < 0):
            raise InputError("wake_s", f"must be a wake-up time >= 0 s, got {wake_s!r}")
        self.settings = settings
        self.nodes: dict[str, NodePowerState] = {}
        for node in cluster.nodes:
            if wake_s is not None:
                w, src = float(wake_s), "set by the operator (--consolidate-option wake_s=...)"
            else:
                w, src = node_wake_s(d.kind.value for d in node.devices)
            self.nodes[node.name] = NodePowerState("on", now_s, w, src)

    def state(self, node: str) -> str:
        return self.nodes[node].state

    def set(self, node: str, state: str, now_s: float) -> None:
        """``node`` goes to ``state`` at ``now_s``; a node set ``waking`` serves from ``now_s + wake_s``."""
        assert state in NODE_STATES, state
        n = self.nodes[node]
        n.state, n.since_s = state, now_s
        n.ready_at_s = now_s + n.wake_s if state == "waking" else None

    def in_state(self, *states: str) -> frozenset[str]:
        return frozenset(name for name, n in self.nodes.items() if n.state in states)

    def asleep(self) -> frozenset[str]:
        """Nodes that serve nothing now but could later: off and waking ones."""
        return self.in_state("off", "waking")

    def ready_in_s(self, now_s: float) -> float | None:
        """Seconds until the first waking node serves (None when none is waking)."""
        times = [n.ready_at_s for n in self.nodes.values() if n.state == "waking" and n.ready_at_s is not None]
        return max(0.0, min(times) - now_s) if times else None

    def view(self) -> PowerView:
        """These states as the cycle reads them (``adapt.cycle``), each waking node with when it serves."""
        return PowerView(off=self.in_state("off"), waking=self.in_state("waking"),
                         draining=self.in_state("draining"),
                         wake_s={name: n.wake_s for name, n in self.nodes.items()},
                         ready_s={name: n.ready_at_s for name, n in self.nodes.items()
                                  if n.state == "waking" and n.ready_at_s is not None})

    def to_json(self, now_s: float, nodes: Iterable[str] | None = None) -> dict[str, dict[str, object]]:
        return {name: self.nodes[name].to_json(now_s) for name in (nodes if nodes is not None else self.nodes)}
