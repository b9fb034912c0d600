"""Power states of edge nodes and the energy they draw.

A node (an edge server and its accelerators) is in one :class:`PowerState`:

* ``on``: serving; it draws its idle power plus, per device, the device's dynamic power times its
  utilization (the linear model of ``perf.energy.utilization_power_w``, per device);
* ``waking``: switched on and booting, for its ``wake_s`` seconds; it draws its idle power and serves nothing;
* ``off``: switched off; it draws ``off_w`` (a standby draw, 0 by default) and serves nothing.

A node is switched off only when it holds no tenant (the consolidation planner, ``adapt.consolidate``, empties
it first, make before break), and a switched-off node takes no placement until it is on again.

:class:`EnergyMeter` integrates a node's power over piecewise-constant intervals: the simulator calls it at
every state change and every window, the runtime at every report. Pure: no clocks; times are the caller's.

Units: W, s, J (kWh where a name says so).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType

__all__ = ["J_PER_KWH", "EnergyMeter", "NodePower", "PowerError", "PowerState", "node_power_w"]

J_PER_KWH = 3.6e6


class PowerError(ValueError):
    """A bad power figure or state change; the message names the node and the field."""


class PowerState(str, Enum):
    ON = "on"
    WAKING = "waking"
    OFF = "off"


def _watts(value: object, where: str, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 \
            or (positive and value == 0):
        raise PowerError(f"{where}: expected a finite power {'> 0' if positive else '>= 0'} W, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class NodePower:
    """A node's power figures: ``idle_w`` on and doing nothing (host and devices idle), ``dynamic_w`` per device
    path the extra power at full utilization, ``wake_s`` from switched on to serving, ``off_w`` switched off,
    and ``source`` where the figures come from."""

    node: str
    idle_w: float
    dynamic_w: Mapping[str, float]
    wake_s: float
    off_w: float = 0.0
    source: str = ""

    def __post_init__(self) -> None:
        where = f"node {self.node!r}"
        _watts(self.idle_w, f"{where}.idle_w", positive=True)
        _watts(self.off_w, f"{where}.off_w")
        if self.off_w > self.idle_w:
            raise PowerError(f"{where}.off_w: switched off ({self.off_w} W) cannot draw more than idle "
                             f"({self.idle_w} W)")
        if isinstance(self.wake_s, bool) or not isinstance(self.wake_s, (int, float)) \
                or not math.isfinite(self.wake_s) or self.wake_s < 0:
            raise PowerError(f"{where}.wake_s: expected a wake-up time >= 0 s, got {self.wake_s!r}")
        for path, w in self.dynamic_w.items():
            _watts(w, f"{where}.dynamic_w[{path!r}]")
        object.__setattr__(self, "dynamic_w", MappingProxyType(dict(self.dynamic_w)))

    @property
    def peak_w(self) -> float:
        """Power (W) with every device fully busy."""
        return self.idle_w + math.fsum(self.dynamic_w.values())


def node_power_w(power: NodePower, state: PowerState, utilization: Mapping[str, float] | None = None) -> float:
    """The power (W) ``power``'s node draws in ``state``; ``utilization`` (device path -> busy fraction in
    [0, 1], missing devices idle) matters only when it is on. ``PowerError`` for a utilization outside [0, 1]
    or a device the node does not have."""
    if state is PowerState.OFF:
        return power.off_w
    if state is PowerState.WAKING:
        return power.idle_w
    total = power.idle_w
    for path, u in (utilization or {}).items():
        if path not in power.dynamic_w:
            raise PowerError(f"node {power.node!r} has no device {path!r} (it has {', '.join(power.dynamic_w)})")
        if not (isinstance(u, (int, float)) and 0.0 <= u <= 1.0 + 1e-9):
            raise PowerError(f"node {power.node!r}, device {path!r}: utilization must be in [0, 1], got {u!r}")
        total += power.dynamic_w[path] * min(float(u), 1.0)
    return total


@dataclass
class EnergyMeter:
    """Energy (J) of one node, integrated over the intervals it is told of: ``advance(t_s, state, busy_s)``
    closes the interval from the last call to ``t_s`` (s) in ``state`` with ``busy_s`` (device path -> seconds
    each device was busy in it). ``joules`` is the total, ``by_state`` its split, ``seconds`` the time in each
    state. Times must not go back."""

    power: NodePower
    start_s: float = 0.0
    joules: float = 0.0
    by_state: dict[str, float] = field(default_factory=lambda: {s.value: 0.0 for s in PowerState})
    seconds: dict[str, float] = field(default_factory=lambda: {s.value: 0.0 for s in PowerState})

    def __post_init__(self) -> None:
        self._last = float(self.start_s)

    def advance(self, t_s: float, state: PowerState, busy_s: Mapping[str, float] | None = None) -> float:
        """Close the interval ``[last, t_s)`` spent in ``state``; returns its energy (J)."""
        dt = t_s - self._last
        if dt < -1e-9:
            raise PowerError(f"node {self.power.node!r}: time went back from {self._last} s to {t_s} s")
        dt = max(dt, 0.0)
        if state is PowerState.ON:
            busy = busy_s or {}
            for path, b in busy.items():
                if b < -1e-9 or b > dt + 1e-6:
                    raise PowerError(f"node {self.power.node!r}, device {path!r}: busy {b} s in an interval of "
                                     f"{dt} s")
            e = self.power.idle_w * dt + math.fsum(self.power.dynamic_w.get(p, 0.0) * min(max(b, 0.0), dt)
                                                   for p, b in busy.items())
        else:
            if busy_s and any(b > 1e-9 for b in busy_s.values()):
                raise PowerError(f"node {self.power.node!r} was {state.value} and cannot have been busy")
            e = node_power_w(self.power, state) * dt
        self.joules += e
        self.by_state[state.value] += e
        self.seconds[state.value] += dt
        self._last = t_s
        return e

    @property
    def kwh(self) -> float:
        return self.joules / J_PER_KWH
