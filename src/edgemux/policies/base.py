"""The policy interface: a snapshot of the cluster in, a placement or an explained rejection out.

A policy is a pure function of (app, :class:`Snapshot`): no I/O, no clocks, no randomness. As in the
Kubernetes scheduler framework, deciding has two separate steps per device: ``filter`` (can the app go
there? ``None`` or a :class:`Rejection` that says why not, as data) and ``score`` (how good is it; higher
wins, ties go to the earlier device in cluster order).

The snapshot caches per-device aggregates (tenants as the estimators see them, device memory and TPU units
used, loaded models) and per-node aggregates (CPU cores and memory used), computed once per snapshot, so a
feasibility test costs one device's worth of work.

Units: ms, req/s, MB, CPU cores, TPU units (dimensionless duty cycle).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache

import numpy as np

from edgemux.cluster.state import App, Cluster, Device, Node, Placement, Share
from edgemux.cluster.disciplines import capacity, traits
from edgemux.cluster.workload import Arrival, ArrivalKind, CpuStage, DeviceSpec, Tenant, shares_used
from edgemux.perf.dutycycle import EPS, tpu_units
from edgemux.perf.spatial import at_share, multi_model
from edgemux.perf.tandem import tenant_cpu_ms
from edgemux.profiles.catalog import Catalog, load_catalog
from edgemux.profiles.distributions import Deterministic
from edgemux.profiles.types import DeviceKind, Profile

__all__ = [
    "Reason", "Rejection", "Decision", "Snapshot", "closest", "ranked", "DeviceLoad", "NodeLoad", "Policy",
    "count_constraints", "model_key", "memory_key", "model_memory_mb", "app_units", "tenant_for", "spatial_fit",
    "device_spec", "resolve_profile", "DeviceArrays",
]


# ------------------------------------------------------------------------------------------ rejection


NODE_KINDS = frozenset({"cpu", "node-memory"})
"""Constraints of a device's node rather than of the device: a reason names the node where they broke."""

LATENCY_KINDS = frozenset({"slo", "no-estimate"})
"""Constraints on a tenant's latency: a reason names the tenant, its statistic and its SLO (ms)."""


def _over(x: float, limit: float, digits: int) -> str:
    """``x`` with ``digits`` decimals, more where fewer would print it no larger than ``limit`` (a predicted
    value just over its limit must not read as equal to it)."""
    for d in range(digits, digits + 5):
        text = f"{x:.{d}f}"
        if float(text) > float(f"{limit:.{d}f}"):
            return text
    return f"{x:.{digits + 4}f}"


@dataclass(frozen=True, slots=True)
class Reason:
    """What broke on one device, as data: a structured record in the manner of the Kubernetes scheduler's
    per-node statuses, which a cluster-wide :class:`Rejection` carries for every device it tried.

    ``kind`` is the constraint (as :attr:`Rejection.constraint`). ``predicted`` against ``limit``, in
    ``unit``: for ``slo`` the predicted latency of ``tenant`` at ``stat`` against its SLO (ms; ``inf`` for an
    unstable queue); for ``utilization`` the device's utilization after placement against the cap
    (dimensionless); for an additive resource (``device-memory``, ``node-memory``, ``cpu``, ``tpu-units``,
    ``model-size``, ...) what the app needs against what is free (MB, cores, TPU units). Both ``None`` where
    the constraint has no numbers (``no-profile``, ``occupied``, ...)."""

    kind: str
    device: str | None = None
    node: str | None = None
    tenant: str | None = None
    stat: str | None = None
    predicted: float | None = None
    limit: float | None = None
    unit: str = ""

    @property
    def ratio(self) -> float | None:
        """``predicted / limit``, the relative violation (above 1 for a failed constraint; ``inf`` when
        nothing is free or the queue is unstable); ``None`` without numbers."""
        if self.predicted is None or self.limit is None:
            return None
        if self.limit <= 0.0:
            return math.inf
        return self.predicted / self.limit

    def closeness(self) -> tuple[int, float]:
        """The sort key of "how close the app came to fitting here" (smaller is closer): a failure with
        numbers by its relative violation first, then one without numbers, then a device with no profile
        for the model (the least informative: nothing was tried there)."""
        if self.kind == "no-profile":
            return (2, 0.0)
        r = self.ratio
        return (1, 0.0) if r is None or math.isnan(r) else (0, r)

    @property
    def where(self) -> str | None:
        """The place it broke: the node for a node's constraint, else the device."""
        if self.kind in NODE_KINDS and self.node is not None:
            return f"node {self.node}"
        return self.device or (f"node {self.node}" if self.node is not None else None)

    @property
    def what(self) -> str:
        """What broke and its numbers, without where (``utilization 1.17 > 0.90``; ``slo: cam-3 would see
        p95 142.1 ms > 100 ms``; ``device-memory: 5.2 MB needed > 1.3 MB free``)."""
        p, lim = self.predicted, self.limit
        if self.kind in LATENCY_KINDS and self.tenant is not None:
            if self.kind == "no-estimate" or lim is None:
                return f"{self.kind}: no {self.stat} estimate for {self.tenant}"
            if p is None:
                return f"{self.kind}: {self.tenant} would miss its {self.stat} SLO of {lim:g} ms"
            if not math.isfinite(p):
                return f"{self.kind}: {self.tenant} would see an unstable queue ({self.stat} unbounded > {lim:g} ms)"
            return f"{self.kind}: {self.tenant} would see {self.stat} {_over(p, lim, 1)} ms > {lim:g} ms"
        if p is None or lim is None:
            return self.kind
        if self.kind == "utilization":
            cap = f"{lim:.2f}" if float(f"{lim:.2f}") == lim else f"{lim:g}"
            return f"utilization {_over(p, lim, 2)} > {cap}"
        u = f" {self.unit}" if self.unit else ""
        return f"{self.kind}: {p:.4g}{u} needed > {lim:.4g}{u} free"

    @property
    def text(self) -> str:
        """:attr:`what` and where: ``utilization 1.17 > 0.90 on edge-1/tpu0``."""
        return self.what + (f" on {self.where}" if self.where else "")

    def to_json(self) -> dict[str, object]:
        """The fields that are set (an unstable queue's latency as ``"unstable"``), with ``ratio`` where finite."""
        out: dict[str, object] = {"kind": self.kind}
        for k in ("device", "node", "tenant", "stat"):
            v = getattr(self, k)
            if v is not None:
                out[k] = v
        if self.predicted is not None and self.limit is not None:
            out["predicted"] = self.predicted if math.isfinite(self.predicted) else "unstable"
            out["limit"] = self.limit
            out["unit"] = self.unit
            r = self.ratio
            if r is not None and math.isfinite(r):
                out["ratio"] = r
        return out


def closest(reasons: "Sequence[Reason]") -> int:
    """The index of the reason whose device came closest to fitting (:meth:`Reason.closeness`; ties: the
    earlier one)."""
    return min(range(len(reasons)), key=lambda k: (reasons[k].closeness(), k))


def ranked(reasons: "Sequence[Reason]") -> list[Reason]:
    """``reasons`` closest first (ties keep their order)."""
    return [reasons[k] for k in sorted(range(len(reasons)), key=lambda k: (reasons[k].closeness(), k))]


@dataclass(frozen=True)
class Rejection:
    """Why an app cannot go somewhere (or anywhere), as data.

    ``constraint`` names the rule ("memory", "cpu", "node-memory", "device-memory", "slo", "no-estimate",
    "utilization", "tpu-units", "model-size", "single-model", "occupied", "no-profile", "no-device",
    "spatial-share": no share of a spatial device's free part meets the SLO at the rate); ``requested``,
    ``used`` and ``capacity`` are in ``unit``. For an SLO, ``tenant`` is the app that would break, with its
    ``predicted_ms`` against ``slo_ms`` at ``stat``. A cluster-wide rejection (no device fits) is the one of
    the device that came closest (:func:`closest`: the smallest relative violation; a device without a
    profile for the model last), with ``counts`` of every constraint over the devices tried and every
    device's :class:`Reason` in ``reasons`` (in the order tried). ``reasons`` is left out of equality: a
    policy that screens devices in bulk finds the same reasons as one that checks them one by one, with
    numbers equal up to rounding, and the same closest device.
    """

    app: str
    constraint: str
    device: str | None = None
    node: str | None = None
    requested: float | None = None
    used: float | None = None
    capacity: float | None = None
    unit: str = ""
    tenant: str | None = None
    predicted_ms: float | None = None
    slo_ms: float | None = None
    stat: str | None = None
    detail: str = ""
    counts: tuple[tuple[str, int], ...] = ()
    reasons: tuple[Reason, ...] = field(default=(), compare=False)

    @property
    def reason(self) -> Reason:
        """This rejection's own reason (a cluster-wide one's: its closest device's)."""
        c = self.constraint
        if c in LATENCY_KINDS and self.tenant is not None:
            return Reason(c, self.device, self.node, self.tenant, self.stat, self.predicted_ms, self.slo_ms, "ms")
        if self.requested is not None and self.capacity is not None:
            if c == "utilization":   # the device's utilization after placement against the cap
                return Reason(c, self.device, self.node, predicted=(self.used or 0.0) + self.requested,
                              limit=self.capacity, unit=self.unit)
            # an additive resource: what the app needs against what is free
            return Reason(c, self.device, self.node, predicted=self.requested,
                          limit=self.capacity - (self.used or 0.0), unit=self.unit)
        return Reason(c, self.device, self.node, self.tenant, self.stat)

    @property
    def message(self) -> str:
        """One line a person can act on, the deciding constraint first: what broke where the app came
        closest, with its numbers (the tenant whose SLO would break, predicted against target; utilization
        against the cap; what is needed against what is free), then how many devices failed on what."""
        parts = [f"app {self.app!r} rejected: {self.reason.text}"]
        if self.counts:
            total = sum(n for _, n in self.counts)
            parts.append(f"0/{total} devices fit (" + ", ".join(f"{n} {c}" for c, n in self.counts) + ")")
        if self.constraint == "utilization" and self.requested is not None:
            parts.append(f"the app adds {self.requested:.4g} to {self.used or 0.0:.4g} in use")
        if self.detail:
            parts.append(self.detail)
        return "; ".join(parts)


Decision = Placement | Rejection


# ------------------------------------------------------------------------------------ profile helpers


def resolve_profile(app: App, device: Device, catalog: Catalog) -> Profile | None:
    """The profile of the app's first acceptable variant that runs on ``device`` (its kind, and its
    ``profile_set`` catalog when set); ``None`` when there is none."""
    return _resolve_memo(catalog, app.acceptable, device.kind, device.profile_set)


def _resolve(catalog: Catalog, acceptable: tuple[str, ...], kind: DeviceKind,
             profile_set: str | None) -> Profile | None:
    for variant in acceptable:
        found = catalog.find_all(variant, kind, profile_set)
        if found:
            with_batch1 = [p for p in found if 1 in p.exec]
            return (with_batch1 or found)[0]
    return None


@lru_cache(maxsize=4096)
def _resolve_memo(catalog: Catalog, acceptable: tuple[str, ...], kind: DeviceKind,
                  profile_set: str | None) -> Profile | None:
    # keyed by the catalog object (identity): a catalog never changes once read, and a process that adds
    # measured profile sets (--profiles) gets another catalog object, so no lookup is stale
    return _resolve(catalog, acceptable, kind, profile_set)


def model_key(app: App, profile: Profile) -> str:
    """The loaded-model identity: shared (AI-as-a-Service) apps of one profile share one copy and pay no
    switch between each other; an app with its own model gets a private copy."""
    return profile.name if app.shared else f"{profile.name}@{app.name}"


def memory_key(app: App, profile: Profile) -> str:
    """What one loaded copy in device memory is: a co-compiled set as a whole (loaded once on a TPU for
    every app of any of its members: ``cocompiled:<set>``), else the model (``model_key``)."""
    return profile.params_key or model_key(app, profile)


def model_memory_mb(profile: Profile, device: Device, instances: int = 1) -> float:
    """Device memory one loaded copy needs (MB). Edge TPU: on-chip parameter data (``params_onchip_mb``;
    0 where the catalog does not say, e.g. the MicroEdge profiles), and for a co-compiled set's member the
    whole set's (``cocompiled_params_mb``: the set is one copy, ``memory_key``); other kinds: static +
    runtime memory (0 where unknown). ``instances`` of one model share their weights (Dhakal's Param-Share,
    Table II): static memory once, runtime memory (activations, buffers) per instance."""
    if device.kind is DeviceKind.EDGETPU:
        key = "cocompiled_params_mb" if profile.cocompiled is not None else "params_onchip_mb"
        v = profile.extra.get(key, profile.extra.get("params_onchip_mb"))
        return float(v) if isinstance(v, int | float) else 0.0
    if profile.memory_static_mb is None:
        return 0.0
    return profile.memory_static_mb + instances * (profile.memory_runtime_mb or 0.0)


def app_units(profile: Profile, rate_rps: float) -> float:
    """MicroEdge TPU units of ``rate_rps`` requests/s of ``profile`` (exec ms x fps / 1000)."""
    return tpu_units(profile.service.mean, rate_rps)


def tenant_for(app: App, profile: Profile, weight: float = 1.0, fraction: float = 1.0, instances: int = 1, *,
               serving_ms: float = 0.0) -> Tenant:
    """The tenant a device sees for ``weight`` of ``app``'s requests running ``profile``; on a spatial device,
    as ``instances`` instances each holding ``fraction`` of it (the service stretched along the profile's
    share curve, ``perf.spatial.at_share``). ``serving_ms``: the device's serving path (``Device.serving_ms``,
    ms), added to the app's network time: both are constant delays outside the device, so every estimator
    and the simulator carry it end to end."""
    rate = app.rate_rps * weight
    arrival = Arrival.periodic(rate) if app.periodic else Arrival.poisson(rate)
    cpu = CpuStage(app.cpu_cores, Deterministic(app.cpu_ms)) if app.cpu_cores > 0 else None
    t = Tenant(name=app.name, model=model_key(app, profile), arrival=arrival, service=profile.service,
               switch_ms=profile.switch_ms, cpu=cpu, network_ms=app.network_ms + serving_ms,
               params=profile.params_key, service_max_ms=profile.exec_time(1).max_ms)
    if fraction != 1.0 or instances != 1:
        return at_share(t, profile.share_curve, fraction, instances)
    return t


def device_spec(device: Device) -> DeviceSpec:
    return DeviceSpec(name=device.path, kind=device.kind, discipline=device.discipline,
                      servers=device.servers, max_batch=device.max_batch,
                      batch_timeout_ms=device.batch_timeout_ms)


# ------------------------------------------------------------------------------------------ snapshot


@dataclass(frozen=True)
class DeviceLoad:
    """Aggregates of one device: its tenants (estimator view) and apps, the loaded models with their
    memory (MB), the device memory used (MB), TPU units used, and the profiles loaded."""

    device: Device
    tenants: tuple[Tenant, ...] = ()
    apps: tuple[str, ...] = ()
    models: Mapping[str, float] = field(default_factory=dict)
    memory_used_mb: float = 0.0
    units_used: float = 0.0
    profiles: frozenset[str] = frozenset()
    profiles_memory_mb: float = 0.0
    """Device memory with one copy per distinct profile (MicroEdge: the TPU service loads a model once)."""
    work: float = 0.0
    """Sum of rate x mean service over the tenants (req/ms x ms): the utilization of additive disciplines."""
    rate_rps: float = 0.0
    switch_work: Mapping[str, tuple[float, float, float]] = field(default_factory=dict)
    """Per loaded model: (sum of its tenants' rates, sum of rate x switch ms over its Poisson-like tenants,
    the same over its periodic tenants, which pay the switch whenever another model is loaded)."""

    @property
    def empty(self) -> bool:
        return not self.apps

    def fcfs_utilization(self, extra: Tenant | None = None) -> float:
        """``perf.edgetpu.edgetpu_utilization`` of the tenants (plus ``extra``) from the cached aggregates:
        ``rho = sum_i lam_i (e_i + (1 - q_i) o_i)``, with ``q_i`` the rate share of tenant i's model
        (Ibis Eq. 1-2; 0 for a periodic tenant beside another model, see
        ``perf.edgetpu.same_model_probabilities``), in O(models) instead of a pass over every tenant."""
        work, total, by_model = self.work, self.rate_rps, self.switch_work
        if extra is not None:
            work += extra.rate_rps / 1000.0 * extra.service.mean
            total += extra.rate_rps
            by_model = {**by_model, extra.model: _add_switch(by_model.get(extra.model, (0.0, 0.0, 0.0)), extra)}
        if total <= 0.0:
            return 0.0
        many = len(by_model) > 1
        sw = math.fsum(lo * (1.0 - min(1.0, lam / total)) + (lp if many else 0.0)
                       for lam, lo, lp in by_model.values())
        return work + sw / 1000.0


@dataclass(frozen=True)
class NodeLoad:
    """CPU cores and host memory (MB) used on a node by the CPU stages of the apps placed there."""

    cpu_used: float = 0.0
    memory_used_mb: float = 0.0


@dataclass(frozen=True)
class Snapshot:
    """The cluster, the admitted apps and their placements, and the profile catalog their placements name:
    everything a policy may look at. ``catalog`` defaults to the catalog in use when the snapshot is made
    (``profiles.catalog.load_catalog``: the built-in one plus active profile sets); a snapshot derived from
    this one (``with_placement``, ``without``) keeps it."""

    cluster: Cluster
    apps: Mapping[str, App] = field(default_factory=dict)
    placements: Mapping[str, Placement] = field(default_factory=dict)
    catalog: Catalog = field(default_factory=load_catalog, compare=False, repr=False)

    @cached_property
    def device_loads(self) -> dict[str, DeviceLoad]:
        """Per-device aggregates, keyed by device path (every device of the cluster, in cluster order)."""
        acc: dict[str, list[tuple[App, Profile, Share]]] = {p: [] for p in self.cluster.devices}
        for name, placement in self.placements.items():
            app = self.apps[name]
            for share in placement.shares:
                acc[share.device].append((app, self.catalog.get(share.profile), share))
        return {path: _load(self.cluster.devices[path], items) for path, items in acc.items()}

    @cached_property
    def nodes(self) -> dict[str, Node]:
        return {n.name: n for n in self.cluster.nodes}

    @cached_property
    def node_loads(self) -> dict[str, NodeLoad]:
        cpu: dict[str, float] = {n.name: 0.0 for n in self.cluster.nodes}
        mem: dict[str, float] = dict(cpu)
        for name, placement in self.placements.items():
            if placement.cpu_node is not None:
                app = self.apps[name]
                cpu[placement.cpu_node] += app.cpu_cores
                mem[placement.cpu_node] += app.memory_mb
        return {n: NodeLoad(cpu[n], mem[n]) for n in cpu}

    @cached_property
    def arrays(self) -> "DeviceArrays":
        """The per-device and per-node aggregates as numpy arrays in cluster device order, for policies that
        screen every device at once (built once per snapshot)."""
        return DeviceArrays.build(self)

    def load(self, device: Device | str) -> DeviceLoad:
        return self.device_loads[device if isinstance(device, str) else device.path]

    def tenants(self, device: Device | str) -> list[Tenant]:
        """The device's current tenants as ``predict_device`` takes them."""
        return list(self.load(device).tenants)

    def with_placement(self, app: App, placement: Placement) -> "Snapshot":
        """A new snapshot with ``app`` admitted at ``placement``; the cached aggregates are carried over
        and only the devices and node it touches are recomputed."""
        apps = dict(self.apps)
        apps[app.name] = app
        placements = dict(self.placements)
        placements[app.name] = placement
        new = Snapshot(self.cluster, apps, placements, self.catalog)
        if "device_loads" in self.__dict__:
            loads = dict(self.device_loads)
            for share in placement.shares:
                old = loads[share.device]
                items = [(apps[a], self.catalog.get(theirs.profile), theirs)
                         for a in old.apps for theirs in [_share_on(placements[a], share.device)]]
                items.append((app, self.catalog.get(share.profile), share))
                loads[share.device] = _load(old.device, items)
            new.__dict__["device_loads"] = loads
        if "node_loads" in self.__dict__:
            nodes = dict(self.node_loads)
            if placement.cpu_node is not None:
                old_n = nodes[placement.cpu_node]
                nodes[placement.cpu_node] = NodeLoad(old_n.cpu_used + app.cpu_cores,
                                                     old_n.memory_used_mb + app.memory_mb)
            new.__dict__["node_loads"] = nodes
        self._carry_arrays(new, placement)
        return new

    def _carry_arrays(self, new: "Snapshot", placement: Placement | None) -> None:
        """``new`` (this snapshot with ``placement``'s app added or removed, its aggregates carried over) gets
        these arrays updated where that app is or was (``DeviceArrays.updated``) instead of a new build."""
        if "arrays" in self.__dict__ and "device_loads" in new.__dict__ and "node_loads" in new.__dict__:
            devices = tuple(s.device for s in placement.shares) if placement is not None else ()
            nodes = (placement.cpu_node,) if placement is not None and placement.cpu_node is not None else ()
            new.__dict__["arrays"] = self.arrays.updated(new, devices, nodes)

    def without(self, app_name: str) -> "Snapshot":
        """A new snapshot with ``app_name`` removed (its share freed, its model unloaded when no other
        app uses it); as ``with_placement``, the cached aggregates are carried over and only the devices and
        node it leaves are recomputed (each the same as from scratch: the others' items in the same order)."""
        apps = {k: v for k, v in self.apps.items() if k != app_name}
        placements = {k: v for k, v in self.placements.items() if k != app_name}
        new = Snapshot(self.cluster, apps, placements, self.catalog)
        gone = self.placements.get(app_name)
        if "device_loads" in self.__dict__:
            loads = dict(self.device_loads)
            for share in gone.shares if gone is not None else ():
                old = loads[share.device]
                loads[share.device] = _load(old.device, [(apps[a], self.catalog.get(theirs.profile), theirs)
                                                         for a in old.apps if a != app_name
                                                         for theirs in [_share_on(placements[a], share.device)]])
            new.__dict__["device_loads"] = loads
        if "node_loads" in self.__dict__:
            nodes = dict(self.node_loads)
            node = gone.cpu_node if gone is not None else None
            if node is not None:  # summed again in admission order, as node_loads does
                cpu = mem = 0.0
                for name, p in placements.items():
                    if p.cpu_node == node:
                        cpu += apps[name].cpu_cores
                        mem += apps[name].memory_mb
                nodes[node] = NodeLoad(cpu, mem)
            new.__dict__["node_loads"] = nodes
        self._carry_arrays(new, gone)
        return new


def segments(start: np.ndarray, stop: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows ``start[j]:stop[j]`` of every segment j, concatenated: ``(rows, segment of each row, offsets)``,
    offsets having one more entry than segments (segment j is ``offsets[j]:offsets[j+1]`` of the result)."""
    counts = stop - start
    offset = np.zeros(start.size + 1, dtype=np.intp)
    np.cumsum(counts, out=offset[1:])
    seg = np.repeat(np.arange(start.size, dtype=np.intp), counts)
    return np.arange(offset[-1], dtype=np.intp) - offset[seg] + start[seg], seg, offset


@dataclass(frozen=True, eq=False)
class DeviceArrays:
    """Every device's cached aggregates as arrays (index = position in ``cluster.devices``): its node's CPU
    cores and host memory used and capacity, device memory used and capacity, additive work (sum of rate x
    mean service), total rate, the ``servers`` divisor of additive disciplines (``cluster.disciplines.capacity``:
    c for MPS, else 1), which devices are FCFS (trait ``one_queue``) / additive (trait ``shares``), the device
    indices of each (kind, profile set) and of each loaded model."""

    devices: tuple[Device, ...]
    loads: tuple[DeviceLoad, ...]
    node_cpu_used: np.ndarray
    node_cpu: np.ndarray
    node_mem_used: np.ndarray
    node_mem: np.ndarray
    mem_used: np.ndarray
    mem: np.ndarray
    work: np.ndarray
    rate: np.ndarray
    divisor: np.ndarray
    fcfs: np.ndarray
    additive: np.ndarray
    groups: dict[tuple[DeviceKind, str | None], np.ndarray]
    model_devices: dict[str, np.ndarray]
    # per (FCFS device, loaded model): ``DeviceLoad.switch_work`` flattened, a device's entries contiguous
    sw_start: np.ndarray               # per device: its first entry
    sw_stop: np.ndarray                # per device: one past its last entry
    sw_lam: np.ndarray                 # per entry: the model's tenants' rate sum (req/s)
    sw_lo: np.ndarray                  # ... sum of rate x switch over its Poisson-like tenants
    sw_lp: np.ndarray                  # ... the same over its periodic tenants
    sw_index: tuple[dict[str, int], ...]   # per device: model -> its entry
    index: Mapping[str, int] = field(default_factory=dict)           # device path -> its index
    node_rows: Mapping[str, np.ndarray] = field(default_factory=dict)  # node -> its devices' indices

    def fcfs_utilizations(self, new: Tenant, idx: np.ndarray) -> np.ndarray:
        """``self.loads[i].fcfs_utilization(new)`` for the FCFS devices ``idx``, all at once (the same
        formula over the flattened per-model aggregates; numpy sums instead of ``math.fsum``, so equal up to
        rounding, a relative 1e-15 or so)."""
        r = new.rate_rps
        periodic = new.arrival.kind is ArrivalKind.PERIODIC
        add_lo, add_lp = (0.0, r * new.switch_ms) if periodic else (r * new.switch_ms, 0.0)
        m = idx.size
        total = self.rate[idx] + r
        ent = np.fromiter((self.sw_index[i].get(new.model, -1) for i in idx.tolist()), dtype=np.intp, count=m)
        rows, cand, offset = segments(self.sw_start[idx], self.sw_stop[idx])
        counts = offset[1:] - offset[:-1]
        same = rows == ent[cand]
        lam = self.sw_lam[rows] + np.where(same, r, 0.0)
        sw_lo = self.sw_lo[rows] + np.where(same, add_lo, 0.0)
        sw_lp = self.sw_lp[rows] + np.where(same, add_lp, 0.0)
        absent = ent < 0
        many = (counts + absent) > 1
        with np.errstate(divide="ignore", invalid="ignore"):
            term = sw_lo * (1.0 - np.minimum(1.0, lam / total[cand])) + np.where(many[cand], sw_lp, 0.0)
            own = add_lo * (1.0 - np.minimum(1.0, r / total)) + np.where(many, add_lp, 0.0)
        sw = np.bincount(cand, weights=term, minlength=m) + np.where(absent, own, 0.0)
        work = self.work[idx] + r / 1000.0 * new.service.mean
        return np.where(total <= 0.0, 0.0, work + sw / 1000.0)

    @staticmethod
    def build(snapshot: "Snapshot") -> "DeviceArrays":
        devices = tuple(snapshot.cluster.devices.values())
        loads = tuple(snapshot.device_loads[d.path] for d in devices)
        nodes, nl = snapshot.nodes, snapshot.node_loads
        groups: dict[tuple[DeviceKind, str | None], list[int]] = {}
        models: dict[str, list[int]] = {}
        for i, (d, ld) in enumerate(zip(devices, loads)):
            groups.setdefault((d.kind, d.profile_set), []).append(i)
            for key in ld.models:
                models.setdefault(key, []).append(i)
        rows = [traits(d.discipline) for d in devices]
        f = np.array
        sw_rows: list[tuple[float, float, float]] = []
        sw_start, sw_stop, sw_index = [], [], []
        for tr, ld in zip(rows, loads):
            sw_start.append(len(sw_rows))
            index: dict[str, int] = {}
            if tr.one_queue:
                for model, acc in ld.switch_work.items():
                    index[model] = len(sw_rows)
                    sw_rows.append(acc)
            sw_stop.append(len(sw_rows))
            sw_index.append(index)
        sw = f(sw_rows, dtype=float).reshape(len(sw_rows), 3)
        return DeviceArrays(
            devices=devices, loads=loads,
            node_cpu_used=f([nl[d.node].cpu_used for d in devices], dtype=float),
            node_cpu=f([nodes[d.node].cpu_cores for d in devices], dtype=float),
            node_mem_used=f([nl[d.node].memory_used_mb for d in devices], dtype=float),
            node_mem=f([nodes[d.node].memory_mb for d in devices], dtype=float),
            mem_used=f([ld.memory_used_mb for ld in loads], dtype=float),
            mem=f([d.memory_mb for d in devices], dtype=float),
            work=f([ld.work for ld in loads], dtype=float),
            rate=f([ld.rate_rps for ld in loads], dtype=float),
            divisor=f([capacity(d) for d in devices], dtype=float),
            fcfs=f([tr.one_queue for tr in rows], dtype=bool),
            additive=f([tr.shares for tr in rows], dtype=bool),
            groups={k: f(v, dtype=np.intp) for k, v in groups.items()},
            model_devices={k: f(v, dtype=np.intp) for k, v in models.items()},
            sw_start=f(sw_start, dtype=np.intp), sw_stop=f(sw_stop, dtype=np.intp),
            sw_lam=np.ascontiguousarray(sw[:, 0]), sw_lo=np.ascontiguousarray(sw[:, 1]),
            sw_lp=np.ascontiguousarray(sw[:, 2]), sw_index=tuple(sw_index),
            index={d.path: i for i, d in enumerate(devices)},
            node_rows={n: f(rows, dtype=np.intp) for n, rows in _rows_by_node(devices).items()},
        )

    def updated(self, snapshot: "Snapshot", devices: tuple[str, ...], nodes: tuple[str, ...]) -> "DeviceArrays":
        """These arrays read again from ``snapshot`` at the rows of ``devices`` (paths) and of the devices of
        ``nodes`` (names), for a snapshot that differs from the one these were built from only there (an app
        added or removed: ``Snapshot.with_placement``, ``Snapshot.without``): what ``build`` gives on
        ``snapshot``, in O(changed rows) rather than a pass over every device, except where the per-model
        switch entries sit in the flattened ``sw_*`` arrays (a changed device's entries are appended anew,
        the ones it leaves behind referenced by no device, until they outnumber the live ones and the arrays
        are packed again into ``build``'s layout). Every value read through a device's ``sw_start``,
        ``sw_stop`` and ``sw_index`` is the same."""
        rows = sorted({self.index[p] for p in devices})
        loads = list(self.loads)
        mem_used, work, rate = self.mem_used.copy(), self.work.copy(), self.rate.copy()
        sw_start, sw_stop, sw_index = self.sw_start.copy(), self.sw_stop.copy(), list(self.sw_index)
        model_devices = dict(self.model_devices)
        extra: list[tuple[float, float, float]] = []
        base = self.sw_lam.size
        for i in rows:
            old, ld = self.loads[i], snapshot.device_loads[self.devices[i].path]
            loads[i] = ld
            mem_used[i], work[i], rate[i] = ld.memory_used_mb, ld.work, ld.rate_rps
            for key in [k for k in old.models if k not in ld.models]:
                left = model_devices[key][model_devices[key] != i]
                if left.size:
                    model_devices[key] = left
                else:
                    del model_devices[key]
            for key in [k for k in ld.models if k not in old.models]:
                have = model_devices.get(key)
                model_devices[key] = (np.array([i], dtype=np.intp) if have is None
                                      else np.insert(have, np.searchsorted(have, i), i))
            if self.fcfs[i]:
                entries: dict[str, int] = {}
                sw_start[i] = base + len(extra)
                for model, acc in ld.switch_work.items():
                    entries[model] = base + len(extra)
                    extra.append(acc)
                sw_stop[i] = base + len(extra)
                sw_index[i] = entries
        node_cpu_used, node_mem_used = self.node_cpu_used, self.node_mem_used
        touched = [n for n in nodes if n in self.node_rows]
        if touched:
            node_cpu_used, node_mem_used = node_cpu_used.copy(), node_mem_used.copy()
            for n in touched:
                nl = snapshot.node_loads[n]
                node_cpu_used[self.node_rows[n]] = nl.cpu_used
                node_mem_used[self.node_rows[n]] = nl.memory_used_mb
        sw_lam, sw_lo, sw_lp = self.sw_lam, self.sw_lo, self.sw_lp
        if extra:
            more = np.array(extra, dtype=float).reshape(len(extra), 3)
            sw_lam = np.concatenate((sw_lam, more[:, 0]))
            sw_lo = np.concatenate((sw_lo, more[:, 1]))
            sw_lp = np.concatenate((sw_lp, more[:, 2]))
            live = int((sw_stop - sw_start).sum())
            if sw_lam.size > 2 * live + 1024:  # pack: each device's entries in device order, as build lays them
                keep, _, offset = segments(sw_start, sw_stop)
                sw_lam, sw_lo, sw_lp = sw_lam[keep], sw_lo[keep], sw_lp[keep]
                shift = (offset[:-1] - sw_start).tolist()
                sw_index = [{m: e + d for m, e in ix.items()} if ix and d else ix for ix, d in zip(sw_index, shift)]
                sw_start, sw_stop = offset[:-1].copy(), offset[1:].copy()
        return replace(self, loads=tuple(loads), node_cpu_used=node_cpu_used, node_mem_used=node_mem_used,
                       mem_used=mem_used, work=work, rate=rate, model_devices=model_devices, sw_start=sw_start,
                       sw_stop=sw_stop, sw_lam=sw_lam, sw_lo=sw_lo, sw_lp=sw_lp, sw_index=tuple(sw_index))


def _rows_by_node(devices: tuple[Device, ...]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i, d in enumerate(devices):
        out.setdefault(d.node, []).append(i)
    return out


def _share_on(p: Placement, device: str) -> Share:
    return next(s for s in p.shares if s.device == device)


def _load(device: Device, items: list[tuple[App, Profile, Share]]) -> DeviceLoad:
    models: dict[str, float] = {}
    tenants = []
    units = 0.0
    for app, profile, share in items:
        tenants.append(tenant_for(app, profile, share.weight, share.fraction, share.instances,
                                  serving_ms=device.serving_ms))
        models.setdefault(memory_key(app, profile), model_memory_mb(profile, device, share.instances))
        units += app_units(profile, app.rate_rps * share.weight)
    return DeviceLoad(device=device, tenants=tuple(tenants), apps=tuple(a.name for a, _, _ in items),
                      models=models, memory_used_mb=math.fsum(models.values()), units_used=units,
                      profiles=frozenset(p.name for _, p, _ in items),
                      profiles_memory_mb=math.fsum({p.name: model_memory_mb(p, device)
                                                    for _, p, _ in items}.values()),
                      work=math.fsum(t.rate_rps / 1000.0 * t.service.mean for t in tenants),
                      rate_rps=math.fsum(t.rate_rps for t in tenants), switch_work=_switch_work(tenants))


def _add_switch(acc: tuple[float, float, float], t: Tenant) -> tuple[float, float, float]:
    lam, lo, lp = acc
    if t.arrival.kind is ArrivalKind.PERIODIC:
        return lam + t.rate_rps, lo, lp + t.rate_rps * t.switch_ms
    return lam + t.rate_rps, lo + t.rate_rps * t.switch_ms, lp


def _switch_work(tenants: list[Tenant]) -> dict[str, tuple[float, float, float]]:
    out: dict[str, tuple[float, float, float]] = {}
    for t in tenants:
        out[t.model] = _add_switch(out.get(t.model, (0.0, 0.0, 0.0)), t)
    return out


# ---------------------------------------------------------------------------------------- the policy


class Policy(ABC):
    """An admission + placement strategy, made of named extension points in the manner of the Kubernetes
    scheduler framework. :meth:`decide` is the framework and runs them in order:

    1. ``pre_filter``: checks of the app alone, before any device (default: a name already placed);
    2. ``place``: the filter and score stage: ``filter`` each of the ``candidates`` (None, or the reason as a
       :class:`Rejection`), ``score`` those that pass (higher wins), place the app on the best; by default a
       loop in cluster order, which a policy may implement over every device at once (Ibis does) or to take
       several devices (dedicated TPUs);
    3. ``post_filter``: only when ``place`` rejected the app; may still place it another way (edgemux and
       MicroEdge split it over several devices) or give a better reason; by default it keeps the rejection.

    Subclasses implement ``filter`` and override the other points they need, never ``decide``."""

    name: str = ""

    def candidates(self, app: App, snapshot: Snapshot) -> list[Device]:
        """The devices ``place`` considers, in the order it considers them (default: cluster order)."""
        return list(snapshot.cluster.devices.values())

    def pre_filter(self, app: App, snapshot: Snapshot) -> Rejection | None:
        """A rejection that no device can change (default: an app of this name is already placed)."""
        if app.name in snapshot.placements:
            return Rejection(app.name, "duplicate", detail="an app of this name is already placed")
        return None

    @abstractmethod
    def filter(self, app: App, snapshot: Snapshot, device: Device) -> Rejection | None:
        """``None`` when ``app`` may go on ``device``; the reason as a :class:`Rejection` otherwise."""

    def score(self, app: App, snapshot: Snapshot, device: Device) -> float:
        """How good ``device`` is for ``app`` (higher wins); only called on devices that pass ``filter``."""
        return 0.0

    def first_fit(self) -> bool:
        """True when the first feasible device wins without scoring the rest."""
        return False

    def post_filter(self, app: App, snapshot: Snapshot, rejection: Rejection) -> Decision:
        """Called when ``place`` rejected the app with ``rejection``: a placement found another way, or the
        rejection to report (default: ``rejection`` itself)."""
        return rejection

    def decide(self, app: App, snapshot: Snapshot) -> Decision:
        """The framework: ``pre_filter``, then ``place``, then ``post_filter`` if ``place`` rejected."""
        why = self.pre_filter(app, snapshot)
        if why is not None:
            return why
        decision = self.place(app, snapshot)
        if isinstance(decision, Rejection):
            return self.post_filter(app, snapshot, decision)
        return decision

    def place(self, app: App, snapshot: Snapshot) -> Decision:
        """The filter and score stage: the app whole on the best-scoring candidate that passes ``filter``
        (ties: the earlier one; ``first_fit``: the first), or a summary of the rejections."""
        rejections: list[Rejection] = []
        best: tuple[float, Device] | None = None
        for device in self.candidates(app, snapshot):
            why = self.filter(app, snapshot, device)
            if why is not None:
                rejections.append(why)
                continue
            if self.first_fit():
                best = (0.0, device)
                break
            s = self.score(app, snapshot, device)
            if best is None or s > best[0]:
                best = (s, device)
        if best is None:
            return summarize(app, rejections)
        device = best[1]
        profile = resolve_profile(app, device, snapshot.catalog)
        assert profile is not None
        return Placement(app.name, (Share(device.path, 1.0, profile.name),), cpu_node=device.node)


def largest_feasible(fits: Callable[[float], bool], lo: float, hi: float, steps: int) -> float:
    """The largest value in ``[lo, hi]`` that ``fits``, by ``steps`` halvings, for a check that holds up to
    some point and not beyond (utilization and the queueing estimates grow with a tenant's rate, so
    admission is monotone in it): the answer is within ``(hi - lo) / 2^steps`` below that point and always
    on the side that fits, or ``lo`` when nothing above it does (whether ``lo`` itself fits is the caller's
    to know). Used for the largest piece of a partition and the room a device has for a re-partition."""
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def summarize(app: App, rejections: list[Rejection]) -> Rejection:
    """One cluster-wide rejection from the per-device ones (in the order tried): the rejection of the device
    that came closest (:func:`closest`), with counts of every constraint and every device's reason."""
    if not rejections:
        return Rejection(app.name, "no-device", detail="the cluster has no candidate device")
    reasons = tuple(r.reason for r in rejections)
    return replace(rejections[closest(reasons)], counts=count_constraints(r.constraint for r in rejections),
                   reasons=reasons)


def count_constraints(constraints: "Iterable[str]") -> tuple[tuple[str, int], ...]:
    """How many devices failed on each constraint, the most common first (ties by name)."""
    return tuple(sorted(Counter(constraints).items(), key=lambda kv: (-kv[1], kv[0])))


# ---------------------------------------------------------------------------------- resource checks


def check_node(app: App, snapshot: Snapshot, device: Device) -> Rejection | None:
    """The app's CPU stage and host memory fit on the device's node."""
    node = snapshot.nodes[device.node]
    nl = snapshot.node_loads[node.name]
    if app.cpu_cores > 0 and nl.cpu_used + app.cpu_cores > node.cpu_cores + EPS:
        return Rejection(app.name, "cpu", device=device.path, node=node.name, requested=app.cpu_cores, used=nl.cpu_used,
                         capacity=node.cpu_cores, unit="cores")
    if app.memory_mb > 0 and nl.memory_used_mb + app.memory_mb > node.memory_mb + EPS:
        return Rejection(app.name, "node-memory", device=device.path, node=node.name, requested=app.memory_mb,
                         used=nl.memory_used_mb, capacity=node.memory_mb, unit="MB")
    return None


def check_profile(app: App, snapshot: Snapshot, device: Device) -> Profile | Rejection:
    profile = resolve_profile(app, device, snapshot.catalog)
    if profile is None:
        return Rejection(app.name, "no-profile", device=device.path,
                         detail=f"no {device.kind.value} profile of {', '.join(app.acceptable)}"
                                + (f" in catalog {device.profile_set!r}" if device.profile_set else ""))
    return profile


def fit_resources(app: App, snapshot: Snapshot, device: Device) -> Profile | Rejection:
    """The additive resource test every policy starts from: a profile for the app on this device, its CPU
    stage and host memory on the node, free share on a spatial device, its model copy in the device's free
    memory. Returns the profile the app would run, or the first failed constraint."""
    profile = check_profile(app, snapshot, device)
    if isinstance(profile, Rejection):
        return profile
    return (check_node(app, snapshot, device) or check_free_share(app, snapshot.load(device))
            or check_device_memory(app, profile, snapshot.load(device)) or profile)


def check_free_share(app: App, load: DeviceLoad) -> Rejection | None:
    """On a spatial device, some share is still free (a policy that plans no shares places an app on the
    whole device, so it never puts two apps' whole-device instances on one; ``spatial_fit`` plans the share
    for the Ibis-family policies)."""
    if not traits(load.device.discipline).spatial:
        return None
    used = shares_used(load.tenants)
    if used >= 1.0 - EPS:
        return Rejection(app.name, "spatial-share", device=load.device.path, used=used, capacity=1.0,
                         unit="(share)", detail="the device's shares are all held")
    return None


def spatial_fit(app: App, profile: Profile, load: DeviceLoad, base: Tenant,
                max_utilization: float = 1.0) -> Tenant | Rejection:
    """On a spatial device: ``base`` (the app's tenant with the whole device) as Multi-Model plans it
    (``perf.spatial.multi_model``): the smallest share at or above the profile's knee at which the app's SLO
    holds, then the fewest instances that carry its rate, within the part of the device the other tenants
    leave free, no instance busier than ``max_utilization``; their instances share one copy of the weights,
    so each instance past the first needs only runtime memory. The SLO budget for the device is the SLO less the app's network and CPU time; a p50 SLO
    is planned on the mean (Multi-Model searches on the mean, p95 or p99; the mean is above the median of
    the right-skewed M/G/k response law, so the plan is conservative for it)."""
    full = check_free_share(app, load)
    if full is not None:
        return full
    free = 1.0 - shares_used(load.tenants)
    path = load.device.path
    cpu = tenant_cpu_ms(base)
    budget = app.slo.latency_ms - base.network_ms - (cpu if isinstance(cpu, float) else math.inf)
    if budget <= 0:
        return Rejection(app.name, "slo", device=path, tenant=app.name, predicted_ms=app.slo.latency_ms - budget,
                         slo_ms=app.slo.latency_ms, stat=app.slo.stat, detail="network and CPU stage alone")
    stat = "mean" if app.slo.stat in ("mean", "p50") else app.slo.stat
    plan = multi_model(base, profile.share_curve, slo_ms=budget, stat=stat, available=min(1.0, free),
                       max_utilization=max_utilization)
    if isinstance(plan, str):
        return Rejection(app.name, "spatial-share", device=path, used=1.0 - free, capacity=1.0, unit="(share)",
                         detail=plan)
    one = 0.0 if memory_key(app, profile) in load.models else model_memory_mb(profile, load.device)
    extra = model_memory_mb(profile, load.device, plan.instances) - model_memory_mb(profile, load.device)
    if extra > 0 and load.memory_used_mb + one + extra > load.device.memory_mb + EPS:
        return Rejection(app.name, "device-memory", device=path, requested=one + extra, used=load.memory_used_mb,
                         capacity=load.device.memory_mb, unit="MB",
                         detail=f"{plan.instances} instances sharing one copy of the weights")
    return at_share(base, profile.share_curve, plan.share, plan.instances)


def check_device_memory(app: App, profile: Profile, load: DeviceLoad) -> Rejection | None:
    """One more loaded copy fits in device memory (nothing to load when a shared copy, or the co-compiled
    set the model belongs to, is there)."""
    key = memory_key(app, profile)
    if key in load.models:
        return None
    need = model_memory_mb(profile, load.device)
    if load.memory_used_mb + need > load.device.memory_mb + EPS:
        return Rejection(app.name, "device-memory", device=load.device.path, requested=need,
                         used=load.memory_used_mb, capacity=load.device.memory_mb, unit="MB")
    return None
