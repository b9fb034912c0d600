"""Scenario files: a Kubernetes-style YAML description of nodes, devices and apps, turned into the
``DeviceSpec``/``Tenant`` workload that estimators and the simulator read.

    apiVersion: edgemux/v1alpha1
    kind: Scenario
    metadata: {name: edge-node}
    spec:
      nodes:
        - name: node-1
          devices:
            - {name: tpu0, kind: edgetpu, discipline: fcfs, profiles: ibis-edgetpu}
      apps:
        - name: cam-1
          model: ssd_mobilenet_v2
          device: node-1/tpu0
          fps: 15                      # periodic camera frames; or `rate: 7.5` (req/s, Poisson)
          slo: {latencyMs: 100, stat: p95}

Every problem is reported as an ``InputError`` naming the field (``spec.apps[1].rate``), a key that a
mapping does not have too (``UnknownFieldError``: ``spec.apps[0].latencyMS: unknown field, did you mean
'latencyMs'?``). Units: times in ms, rates in req/s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from edgemux.cluster.yamlread import parse_yaml, read_text
from edgemux.cluster.yamlread import Reader as _Reader
from edgemux.cluster.disciplines import DEFAULT_DISCIPLINE, traits
from edgemux.cluster.workload import Arrival, BatchLaw, CpuStage, DeviceSpec, Discipline, Tenant, check_shares
from edgemux.errors import InputError, UnknownNameError
from edgemux.profiles.distributions import Distribution, from_moments
from edgemux.profiles.types import DeviceKind, Profile

SLO_STATS = ("mean", "p50", "p95", "p99")

# The fields of each mapping (docs/reference/formats.md lists the same); any other key is refused.
SCENARIO_SPEC_FIELDS = ("nodes", "apps")
SCENARIO_NODE_FIELDS = ("name", "devices")
# a device entry as scenario and cluster files share it (a cluster's adds memoryMb)
DEVICE_FIELDS = ("name", "kind", "discipline", "profiles", "servers", "maxBatch", "batchTimeoutMs")
SCENARIO_APP_FIELDS = ("name", "model", "device", "rate", "fps", "slo", "cpu", "networkMs", "profile",
                       "serviceMs", "varianceMs2", "switchMs", "batchLaw", "sharedModel")
SCENARIO_SLO_FIELDS = ("latencyMs", "stat")
SCENARIO_CPU_FIELDS = ("cores", "serviceMs", "varianceMs2")
BATCH_LAW_FIELDS = ("k1Ms", "k2Ms")


@dataclass(frozen=True)
class Slo:
    """A latency target: ``stat`` (mean, p50, p95, p99) of the end-to-end latency must be <= ``latency_ms``."""

    latency_ms: float
    stat: str = "mean"


@dataclass(frozen=True)
class AppPlan:
    """One app of a scenario: the tenant it puts on its device, its SLO and where its numbers came from."""

    tenant: Tenant
    device: str  # "node/device"
    slo: Slo | None
    profile: str  # profile name, or "inline" for service times given in the file


@dataclass
class DevicePlan:
    """One device of a scenario with the apps placed on it."""

    node: str
    spec: DeviceSpec
    profile_set: str | None
    apps: list[AppPlan] = field(default_factory=list)

    @property
    def path(self) -> str:
        return f"{self.node}/{self.spec.name}"

    @property
    def tenants(self) -> list[Tenant]:
        return [a.tenant for a in self.apps]


@dataclass
class Scenario:
    """A parsed scenario: devices (keyed "node/device") with their apps, in file order."""

    name: str
    devices: dict[str, DevicePlan]
    source: str = ""

    @property
    def apps(self) -> list[AppPlan]:
        return [a for d in self.devices.values() for a in d.apps]


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file; ``InputError`` (with the field) on any problem."""
    src = str(path)
    data = parse_yaml(read_text(path), src)
    return parse_scenario(data, src)


def parse_scenario(data: Any, source: str = "<scenario>") -> Scenario:
    """Validate a scenario document already parsed from YAML/JSON."""
    from edgemux.profiles.catalog import load_catalog

    root = _Reader(data, "", source)
    root.header(("Scenario",))
    name = root.metadata(required=False) or Path(source).stem
    spec = root.sub("spec")
    assert spec is not None
    spec.only(*SCENARIO_SPEC_FIELDS)
    catalog = load_catalog()

    devices: dict[str, DevicePlan] = {}
    for node in spec.list("nodes"):
        node.only(*SCENARIO_NODE_FIELDS)
        node_name = node.str("name")
        for dev in node.list("devices"):
            dev.only(*DEVICE_FIELDS)
            dev_name = dev.str("name")
            key = f"{node_name}/{dev_name}"
            if key in devices:
                raise dev.fail("name", f"duplicate device {key!r}")
            cfg = read_device_config(dev, catalog, source)
            devices[key] = DevicePlan(
                node=node_name or "",
                spec=DeviceSpec(dev_name or "", cfg.kind, cfg.discipline, servers=cfg.servers,
                                max_batch=cfg.max_batch, batch_timeout_ms=cfg.batch_timeout_ms),
                profile_set=cfg.profile_set,
            )
    if not devices:
        raise spec.fail("nodes", "no devices defined")

    seen: set[str] = set()
    for app in spec.list("apps"):
        plan = _parse_app(app, devices, catalog, source)
        if plan.tenant.name in seen:
            raise app.fail("name", f"duplicate app {plan.tenant.name!r}")
        seen.add(plan.tenant.name)
        devices[plan.device].apps.append(plan)
    for key, dplan in devices.items():
        if traits(dplan.spec.discipline).spatial:
            # a scenario pins apps to devices without planning shares: each holds the whole device, so a
            # spatial device takes one app here (admission plans shares: edgemux place, apply)
            try:
                check_shares([a.tenant for a in dplan.apps], where=f"device {key}")
            except ValueError as e:
                raise spec.fail("apps", f"{e}; a scenario gives each app a whole spatial device (shares are "
                                        "planned by admission: edgemux place)") from None
    return Scenario(name=name, devices=devices, source=source)


class DeviceConfig(NamedTuple):
    """The fields of a device entry that scenario and cluster files share."""

    kind: DeviceKind
    discipline: Discipline
    profile_set: str | None
    servers: float
    max_batch: int
    batch_timeout_ms: float


def read_device_config(dev: _Reader, catalog: Any, source: str) -> DeviceConfig:
    """Read and check a device entry's kind, discipline (default by kind), profile set and discipline
    parameters; ``InputError`` naming the field otherwise. The caller declares the entry's fields first
    (``DEVICE_FIELDS``, plus a cluster's ``memoryMb``)."""
    try:
        kind = DeviceKind.parse(dev.str("kind") or "")
    except ValueError as e:
        raise dev.fail("kind", str(e)) from None
    try:
        disc = Discipline.parse(dev.str("discipline", default=DEFAULT_DISCIPLINE[kind].value) or "")
    except ValueError as e:
        raise dev.fail("discipline", str(e)) from None
    profile_set = dev.str("profiles", required=False)
    if profile_set is not None and profile_set not in catalog.catalogs():
        raise UnknownNameError(dev.field("profiles"), profile_set, "profile set", catalog.catalogs(), source)
    servers = dev.num("servers", 1.0, minimum=1.0) or 1.0
    max_batch = dev.num("maxBatch", 1.0, minimum=1.0) or 1.0
    if max_batch != int(max_batch):
        raise dev.fail("maxBatch", f"must be a whole number, got {max_batch:g}")
    timeout = dev.num("batchTimeoutMs", 0.0) or 0.0
    return DeviceConfig(kind, disc, profile_set, servers, int(max_batch), timeout)


def _parse_app(app: _Reader, devices: dict[str, DevicePlan], catalog: Any, source: str) -> AppPlan:
    app.only(*SCENARIO_APP_FIELDS)
    name = app.str("name") or ""
    dev_key = app.str("device") or ""
    if dev_key not in devices:
        raise UnknownNameError(app._f("device"), dev_key, "device", list(devices), source)
    dplan = devices[dev_key]
    model = app.str("model") or ""

    has_rate, has_fps = app.has("rate"), app.has("fps")
    if has_rate == has_fps:
        raise app.fail("rate", "give exactly one of 'rate' (req/s, Poisson) or 'fps' (periodic frames)")
    if has_rate:
        arrival = Arrival.poisson(app.num("rate", minimum=0.0, strictly=True) or 0.0)
    else:
        arrival = Arrival.periodic(app.num("fps", minimum=0.0, strictly=True) or 0.0)

    service, switch_ms, profile_name, batch = _service_for(app, model, dplan, catalog, source)

    cpu = None
    cpu_r = app.sub("cpu", required=False)
    if cpu_r is not None:
        cpu_r.only(*SCENARIO_CPU_FIELDS)
        cores = cpu_r.num("cores", minimum=0.0, strictly=True, required=True) or 1.0
        cpu_ms = cpu_r.num("serviceMs", minimum=0.0, strictly=True, required=True) or 0.0
        cpu = CpuStage(cores, from_moments(cpu_ms, cpu_r.num("varianceMs2", 0.0) or 0.0))

    slo = None
    slo_r = app.sub("slo", required=False)
    if slo_r is not None:
        slo_r.only(*SCENARIO_SLO_FIELDS)
        lat = slo_r.num("latencyMs", minimum=0.0, strictly=True, required=True) or 0.0
        stat = slo_r.str("stat", default="mean") or "mean"
        if stat not in SLO_STATS:
            raise slo_r.fail("stat", f"expected one of {', '.join(SLO_STATS)}, got {stat!r}")
        slo = Slo(lat, stat)

    tenant = Tenant(name=name, model=app.str("sharedModel", default=model) or model, arrival=arrival,
                    service=service, switch_ms=switch_ms, batch=batch, cpu=cpu,
                    network_ms=app.num("networkMs", 0.0) or 0.0)
    return AppPlan(tenant=tenant, device=dev_key, slo=slo, profile=profile_name)


def _service_for(app: _Reader, model: str, dplan: DevicePlan, catalog: Any,
                 source: str) -> tuple[Distribution, float, str, BatchLaw | None]:
    """Service time, switch overhead, profile name and batch law of an app on its device.

    An inline ``serviceMs`` in the file wins over the catalog (for models edgemux has no profile of);
    otherwise the profile comes from ``profile:`` or from the catalog by (model, device kind, profile set).
    """
    batch = None
    batch_r = app.sub("batchLaw", required=False)
    if batch_r is not None:
        batch_r.only(*BATCH_LAW_FIELDS)
        batch = BatchLaw(batch_r.num("k1Ms", required=True) or 0.0, batch_r.num("k2Ms", required=True) or 0.0)
    if app.has("serviceMs"):
        mean = app.num("serviceMs", minimum=0.0, strictly=True) or 0.0
        var = app.num("varianceMs2", 0.0) or 0.0
        return from_moments(mean, var), app.num("switchMs", 0.0) or 0.0, "inline", batch
    profile: Profile
    if app.has("profile"):
        pname = app.str("profile") or ""
        try:
            profile = catalog.get(pname)
        except InputError:
            raise UnknownNameError(app._f("profile"), pname, "profile", list(catalog.profiles), source) from None
        if profile.device_kind is not dplan.spec.kind:
            raise app.fail("profile", f"profile {pname!r} is for {profile.device_kind.value}, "
                                      f"but device {dplan.path} is {dplan.spec.kind.value}")
    else:
        try:
            profile = catalog.find(model, dplan.spec.kind, dplan.profile_set)
        except InputError as e:
            raise InputError(app._f("model"), e.problem, source) from None
    if 1 not in profile.exec:
        raise app.fail("model", f"profile {profile.name!r} has no execution time at batch 1 (it has batches "
                                f"{sorted(profile.exec)}); give serviceMs for this app")
    switch = app.num("switchMs", profile.switch_ms) or 0.0
    return profile.service, switch, profile.name, batch
