"""Cluster state: nodes, devices, apps and placements (the vocabulary of docs/concepts.md), validated on construction.

These are plain values: the store persists them, policies read them, the runtime and simulator carry out
placements. Units: times in ms, rates in req/s, memory in MB, CPU in cores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from edgemux.cluster.workload import Discipline
from edgemux.profiles.types import DeviceKind

SLO_STATS = ("mean", "p50", "p95", "p99")


class StateError(ValueError):
    """A state value that breaks an invariant; ``field`` names it."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


def _positive(value: float, field: str, *, allow_zero: bool = False) -> None:
    ok = math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        raise StateError(field, f"must be a finite number {'>=' if allow_zero else '>'} 0, got {value!r}")


@dataclass(frozen=True)
class Device:
    """One accelerator: ``path`` is ``node/name``. ``memory_mb`` is the device memory for models (GPU memory;
    for an Edge TPU the on-chip parameter memory, e.g. MicroEdge's 6.9 MB of 8 MB); ``profile_set`` the
    catalog its profiles come from; ``servers``/``max_batch``/``batch_timeout_ms`` configure the discipline;
    ``serving_ms`` the serving path's time per request on its node (ms: gateway, transport and agent, what a
    client waits beyond queueing and service; ``Node.serving_ms``, set on each of the node's devices)."""

    node: str
    name: str
    kind: DeviceKind
    discipline: Discipline
    memory_mb: float
    profile_set: str | None = None
    servers: float = 1.0
    max_batch: int = 1
    batch_timeout_ms: float = 0.0
    serving_ms: float = 0.0

    def __post_init__(self) -> None:
        if not self.node or not self.name or "/" in self.name or "/" in self.node:
            raise StateError("device", f"node and name must be non-empty without '/', got {self.node!r}/{self.name!r}")
        _positive(self.memory_mb, f"{self.path}.memory_mb")
        _positive(self.serving_ms, f"{self.path}.serving_ms", allow_zero=True)
        if not (self.servers >= 1 and math.isfinite(self.servers)):
            raise StateError(f"{self.path}.servers", f"must be >= 1, got {self.servers!r}")

    @property
    def path(self) -> str:
        return f"{self.node}/{self.name}"


@dataclass(frozen=True)
class Node:
    """A host with CPU cores and memory (MB) for apps' CPU stages, and its devices.

    Its serving path (``serving_ms``: what a request served here spends outside queueing and service, ms) is
    kept on each device (``Device.serving_ms``), where the estimators read it; :meth:`serving_ms` reads it
    back and :meth:`with_serving` sets it on every device."""

    name: str
    cpu_cores: float
    memory_mb: float
    devices: tuple[Device, ...] = ()

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise StateError("node.name", f"must be non-empty without '/', got {self.name!r}")
        _positive(self.cpu_cores, f"{self.name}.cpu_cores")
        _positive(self.memory_mb, f"{self.name}.memory_mb")
        names = [d.name for d in self.devices]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise StateError(f"{self.name}.devices", f"duplicate device {dup[0]!r}")
        if any(d.node != self.name for d in self.devices):
            raise StateError(f"{self.name}.devices", "every device must name this node")
        if len({d.serving_ms for d in self.devices}) > 1:
            raise StateError(f"{self.name}.devices", "every device of a node has the node's serving_ms")

    @property
    def serving_ms(self) -> float:
        """The node's serving path per request (ms; 0 without devices)."""
        return self.devices[0].serving_ms if self.devices else 0.0

    def with_serving(self, serving_ms: float) -> Node:
        """This node with ``serving_ms`` (ms) on every device."""
        return replace(self, devices=tuple(replace(d, serving_ms=serving_ms) for d in self.devices))


@dataclass(frozen=True)
class Slo:
    """``stat`` (mean, p50, p95, p99) of end-to-end latency must stay <= ``latency_ms``."""

    latency_ms: float
    stat: str = "mean"

    def __post_init__(self) -> None:
        _positive(self.latency_ms, "slo.latency_ms")
        if self.stat not in SLO_STATS:
            raise StateError("slo.stat", f"expected one of {', '.join(SLO_STATS)}, got {self.stat!r}")


@dataclass(frozen=True)
class App:
    """A tenant's inference application.

    ``variants`` lists acceptable models/variants in order of preference (``model`` alone means just it);
    ``rate_rps`` is the contracted mean rate (for cameras the FPS, with ``periodic=True``); ``burst`` the
    token-bucket depth in requests; ``cpu_cores``/``cpu_ms`` its CPU stage (0 for none); ``memory_mb`` its
    host memory; ``shared`` True when it uses a shared loaded model (AI as a Service) instead of its own copy.
    """

    name: str
    model: str
    rate_rps: float
    slo: Slo
    variants: tuple[str, ...] = ()
    periodic: bool = False
    burst: float = 1.0
    cpu_cores: float = 0.0
    cpu_ms: float = 0.0
    memory_mb: float = 0.0
    network_ms: float = 0.0
    shared: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            raise StateError("app.name", "must be non-empty")
        if not self.model:
            raise StateError(f"{self.name}.model", "must be non-empty")
        _positive(self.rate_rps, f"{self.name}.rate_rps")
        _positive(self.burst, f"{self.name}.burst")
        for f in ("cpu_cores", "cpu_ms", "memory_mb", "network_ms"):
            _positive(getattr(self, f), f"{self.name}.{f}", allow_zero=True)
        if (self.cpu_cores > 0) != (self.cpu_ms > 0):
            raise StateError(f"{self.name}.cpu", "cpu_cores and cpu_ms go together (both > 0 or both 0)")

    @property
    def acceptable(self) -> tuple[str, ...]:
        """Acceptable model variants, preferred first (at least the app's own model)."""
        return self.variants or (self.model,)


@dataclass(frozen=True)
class Share:
    """One part of a placement: ``weight`` of the app's requests go to ``device`` (path) running ``profile``.
    On a ``spatial`` device the part runs ``instances`` instances of the model, each holding ``fraction`` of
    the device (Dhakal's Multi-Model: share and instance count); elsewhere both stay 1."""

    device: str
    weight: float
    profile: str
    fraction: float = 1.0
    instances: int = 1

    def __post_init__(self) -> None:
        if not (0 < self.weight <= 1 and math.isfinite(self.weight)):
            raise StateError("share.weight", f"must be in (0, 1], got {self.weight!r}")
        if not (isinstance(self.fraction, int | float) and math.isfinite(self.fraction) and 0 < self.fraction <= 1):
            raise StateError("share.fraction", f"must be in (0, 1] of the device, got {self.fraction!r}")
        if isinstance(self.instances, bool) or not isinstance(self.instances, int) or self.instances < 1:
            raise StateError("share.instances", f"must be an integer >= 1, got {self.instances!r}")


@dataclass(frozen=True)
class Placement:
    """Where an app runs: shares over one or more devices (weights sum to 1; more than one share is workload
    partitioning, routed by weighted round robin) and the node whose CPU runs its CPU stage."""

    app: str
    shares: tuple[Share, ...]
    cpu_node: str | None = None

    def __post_init__(self) -> None:
        if not self.shares:
            raise StateError(f"{self.app}.shares", "a placement needs at least one share")
        total = math.fsum(s.weight for s in self.shares)
        if not math.isclose(total, 1.0, abs_tol=1e-9):
            raise StateError(f"{self.app}.shares", f"weights must sum to 1, got {total:.6f}")
        devs = [s.device for s in self.shares]
        if len(set(devs)) != len(devs):
            raise StateError(f"{self.app}.shares", "a device appears twice")


@dataclass(frozen=True)
class Cluster:
    """The nodes and their devices (the static part of the state)."""

    nodes: tuple[Node, ...]
    devices: dict[str, Device] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [n.name for n in self.nodes]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise StateError("nodes", f"duplicate node {dup[0]!r}")
        object.__setattr__(self, "devices", {d.path: d for n in self.nodes for d in n.devices})

    def with_serving(self, serving_ms: dict[str, float]) -> Cluster:
        """This cluster with each named node's serving path (ms) set (``Node.with_serving``); the others as
        they are. Itself when nothing changes."""
        if all(self.node(n).serving_ms == v for n, v in serving_ms.items()):
            return self
        return Cluster(tuple(n.with_serving(serving_ms[n.name]) if n.name in serving_ms else n for n in self.nodes))

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise StateError("node", f"unknown node {name!r} (known: {', '.join(x.name for x in self.nodes)})")
