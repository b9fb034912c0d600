"""Cluster and app specs: Kubernetes-style YAML (``apiVersion: edgemux/v1alpha1``) turned into the state values
of ``cluster.state`` and back.

A cluster (``kind: Cluster``)::

    apiVersion: edgemux/v1alpha1
    kind: Cluster
    metadata: {name: lab}
    spec:
      nodes:
        - name: node-1
          cpuCores: 4
          memoryMb: 4096
          servingMs: 2.5            # optional: the serving path per request (below)
          devices:
            - {name: tpu0, kind: edgetpu, memoryMb: 6.9, profiles: microedge}
            - {name: gpu0, kind: gpu-embedded, memoryMb: 4096, profiles: ibis-jetson-nano}

A node's ``servingMs`` (default 0) is what a request served there spends outside the device's queue and
service: the gateway, the transport and the agent. The estimators add it to every prediction end to end;
a running control plane calibrates it every window from what the gateways and agents observed (``adapt.serving``).

Devices: ``name``, ``kind``, ``memoryMb`` (required), ``discipline`` (default per kind, as in scenarios),
``profiles`` (profile catalog), ``servers``, ``maxBatch``, ``batchTimeoutMs``.

Apps: one ``kind: App`` document, a ``kind: AppList`` whose ``spec.apps`` lists apps as flat mappings
(``name`` plus the App spec fields), or a YAML stream (``---``) of such documents::

    apiVersion: edgemux/v1alpha1
    kind: App
    metadata: {name: cam-1}
    spec:
      model: ssd_mobilenet_v2
      variants: [ssd_mobilenet_v2, ssd_mobilenet_v1]   # acceptable models, preferred first (optional)
      fps: 15                     # periodic frames; or `rate: 7.5` (req/s, Poisson): exactly one
      burst: 2                    # token-bucket depth in requests (default 1)
      slo: {latencyMs: 100, stat: p95}                 # required; stat mean (default), p50, p95, p99
      cpu: {cores: 1, serviceMs: 5}                    # optional CPU stage
      memoryMb: 256               # host memory (default 0)
      networkMs: 10               # network time added end to end (default 0)
      shared: false               # true: use a shared loaded model (AI as a Service)

Every model and variant must be in the profile catalog, and the SLO must be reachable: at least the
fastest batch-1 service time among the app's acceptable models (over every device kind that has a
profile), plus its CPU stage and network time. Every problem is an ``InputError`` naming the dotted field
and the file; a field a mapping does not have (``brust``) is one too (``UnknownFieldError``, with the closest
known field), so a typo never falls back to a default in silence. ``metadata`` takes ``name``, ``labels`` and
``annotations``. Units: times in ms, rates in req/s, memory in MB, CPU in cores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgemux.cluster.scenario import DEVICE_FIELDS, SCENARIO_SLO_FIELDS as SLO_FIELDS, read_device_config
from edgemux.cluster.state import App, Cluster, Device, Node, Slo, StateError
from edgemux.cluster.yamlread import API_VERSION, Reader, parse_yaml, parse_yaml_all, read_text
from edgemux.errors import InputError, UnknownNameError

__all__ = [
    "load_cluster", "parse_cluster", "cluster_to_dict",
    "load_apps", "parse_apps", "parse_app", "app_to_dict", "apps_to_dict",
]

# The fields of each mapping (docs/reference/formats.md lists the same); any other key is refused.
CLUSTER_SPEC_FIELDS = ("nodes",)
NODE_FIELDS = ("name", "cpuCores", "memoryMb", "servingMs", "devices")
CLUSTER_DEVICE_FIELDS = (*DEVICE_FIELDS, "memoryMb")
APP_SPEC_FIELDS = ("model", "variants", "rate", "fps", "burst", "slo", "cpu", "memoryMb", "networkMs", "shared")
APPLIST_SPEC_FIELDS = ("apps",)
APPLIST_ITEM_FIELDS = ("name", *APP_SPEC_FIELDS)
CPU_FIELDS = ("cores", "serviceMs")


# --------------------------------------------------------------------------------------------- helpers


def _state(where: str, source: str, build: Any) -> Any:
    """Run a state constructor, turning its ``StateError`` into an ``InputError`` at ``where``."""
    try:
        return build()
    except StateError as e:
        raise InputError(where or "document", e.problem, source) from None


# --------------------------------------------------------------------------------------------- cluster


def load_cluster(path: str | Path) -> Cluster:
    """Read and validate a ``kind: Cluster`` file; ``InputError`` (with the field) on any problem."""
    src = str(path)
    return parse_cluster(parse_yaml(read_text(path), src), src)


def parse_cluster(data: Any, source: str = "<cluster>") -> Cluster:
    """Validate a ``kind: Cluster`` document already parsed from YAML/JSON."""
    from edgemux.profiles.catalog import load_catalog

    root = Reader(data, "", source)
    root.header(("Cluster",))
    root.metadata(required=False)
    spec = root.sub("spec")
    assert spec is not None
    spec.only(*CLUSTER_SPEC_FIELDS)
    catalog = load_catalog()
    nodes: list[Node] = []
    seen_nodes: set[str] = set()
    for node in spec.list("nodes"):
        node.only(*NODE_FIELDS)
        name = _unique_name(node, seen_nodes, "node {!r}")
        cores = node.num("cpuCores", minimum=0.0, strictly=True, required=True) or 0.0
        mem = node.num("memoryMb", minimum=0.0, strictly=True, required=True) or 0.0
        serving = node.num("servingMs", 0.0) or 0.0
        devices: list[Device] = []
        seen_devs: set[str] = set()
        for dev in (node.list("devices") if node.has("devices") else []):
            devices.append(_parse_device(dev, name, seen_devs, catalog, source, serving))
        nodes.append(_state(node.path, source, lambda: Node(name, cores, mem, tuple(devices))))
    return _state(spec.field("nodes"), source, lambda: Cluster(tuple(nodes)))


def _unique_name(entry: Reader, seen: set[str], duplicate: str) -> str:
    """The entry's ``name``: non-empty, without '/', not seen before (``duplicate`` formats the message)."""
    name = entry.str("name") or ""
    if "/" in name:
        raise entry.fail("name", f"must not contain '/', got {name!r}")
    if name in seen:
        raise entry.fail("name", f"duplicate {duplicate.format(name)}")
    seen.add(name)
    return name


def _parse_device(dev: Reader, node: str, seen: set[str], catalog: Any, source: str, serving_ms: float) -> Device:
    dev.only(*CLUSTER_DEVICE_FIELDS)
    name = _unique_name(dev, seen, f"device {node}/{{!r}}")
    cfg = read_device_config(dev, catalog, source)
    mem = dev.num("memoryMb", minimum=0.0, strictly=True, required=True) or 0.0
    return _state(dev.path, source, lambda: Device(node, name, cfg.kind, cfg.discipline, mem, cfg.profile_set,
                                                   cfg.servers, cfg.max_batch, cfg.batch_timeout_ms, serving_ms))


def cluster_to_dict(cluster: Cluster, name: str = "cluster") -> dict[str, Any]:
    """The ``kind: Cluster`` document of ``cluster`` (``parse_cluster`` of it gives ``cluster`` back)."""
    nodes = []
    for n in cluster.nodes:
        devices = []
        for d in n.devices:
            dd: dict[str, Any] = {"name": d.name, "kind": d.kind.value, "discipline": d.discipline.value,
                                  "memoryMb": d.memory_mb}
            if d.profile_set is not None:
                dd["profiles"] = d.profile_set
            dd.update(servers=d.servers, maxBatch=d.max_batch, batchTimeoutMs=d.batch_timeout_ms)
            devices.append(dd)
        node: dict[str, Any] = {"name": n.name, "cpuCores": n.cpu_cores, "memoryMb": n.memory_mb}
        if n.serving_ms:
            node["servingMs"] = n.serving_ms
        nodes.append({**node, "devices": devices})
    return {"apiVersion": API_VERSION, "kind": "Cluster", "metadata": {"name": name}, "spec": {"nodes": nodes}}


# --------------------------------------------------------------------------------------------- apps


def load_apps(path: str | Path) -> list[App]:
    """Read and validate an app file (``App``, ``AppList`` or a ``---`` stream of them), in file order."""
    src = str(path)
    docs = parse_yaml_all(read_text(path), src)
    return parse_apps(docs, src)


def parse_apps(data: Any, source: str = "<apps>") -> list[App]:
    """Validate app documents already parsed: one document (a mapping), or a list of documents (a YAML
    stream; fields are then reported as ``documents[i].spec...``). App names must be unique."""
    docs = data if isinstance(data, list) else [data]
    if not docs:
        raise InputError("document", "no App or AppList document", source)
    apps: list[App] = []
    names: set[str] = set()
    for i, doc in enumerate(docs):
        root = Reader(doc, f"documents[{i}]" if isinstance(data, list) and len(docs) > 1 else "", source)
        kind = root.header(("App", "AppList"))
        if kind == "App":
            name = root.metadata() or ""
            name_field = f"{root.field('metadata')}.name"
            spec = root.sub("spec")
            assert spec is not None
            spec.only(*APP_SPEC_FIELDS)
            entries = [(name_field, name, spec)]
        else:
            root.metadata(required=False)
            spec = root.sub("spec")
            assert spec is not None
            spec.only(*APPLIST_SPEC_FIELDS)
            items = [item.only(*APPLIST_ITEM_FIELDS) for item in spec.list("apps")]
            entries = [(item.field("name"), item.str("name") or "", item) for item in items]
        for name_field, name, item in entries:
            if name in names:
                raise InputError(name_field, f"duplicate app {name!r}", source)
            names.add(name)
            apps.append(_parse_app_spec(name, item, source))
    return apps


def parse_app(data: Any, source: str = "<app>") -> App:
    """Validate one ``kind: App`` document."""
    Reader(data, "", source).header(("App",))
    (app,) = parse_apps(data, source)
    return app


def _parse_app_spec(name: str, spec: Reader, source: str) -> App:
    """An app from its spec mapping; the caller has declared the mapping's fields (``Reader.only``): they
    differ between an App's ``spec`` and an AppList's item, which adds ``name``."""
    from edgemux.profiles.catalog import load_catalog

    catalog = load_catalog()
    model = spec.str("model") or ""
    if not catalog.find_all(model):
        raise UnknownNameError(spec.field("model"), model, "model", catalog.models(), source)
    variants = spec.strs("variants")
    for i, v in enumerate(variants):
        if not catalog.find_all(v):
            raise UnknownNameError(f"{spec.field('variants')}[{i}]", v, "model", catalog.models(), source)

    has_rate, has_fps = spec.has("rate"), spec.has("fps")
    if has_rate == has_fps:
        raise spec.fail("rate", "give exactly one of 'rate' (req/s, Poisson) or 'fps' (periodic frames)")
    key = "rate" if has_rate else "fps"
    rate = spec.num(key, minimum=0.0, strictly=True) or 0.0
    burst = spec.num("burst", 1.0, minimum=0.0, strictly=True) or 1.0

    slo_r = spec.sub("slo")
    assert slo_r is not None
    slo_r.only(*SLO_FIELDS)
    latency = slo_r.num("latencyMs", minimum=0.0, strictly=True, required=True) or 0.0
    stat = slo_r.str("stat", default="mean") or "mean"
    slo = _state(slo_r.field("stat"), source, lambda: Slo(latency, stat))

    cpu_cores = cpu_ms = 0.0
    cpu_r = spec.sub("cpu", required=False)
    if cpu_r is not None:
        cpu_r.only(*CPU_FIELDS)
        cpu_cores = cpu_r.num("cores", minimum=0.0, strictly=True, required=True) or 0.0
        cpu_ms = cpu_r.num("serviceMs", minimum=0.0, strictly=True, required=True) or 0.0
    memory = spec.num("memoryMb", 0.0) or 0.0
    network = spec.num("networkMs", 0.0) or 0.0
    shared = spec.bool("shared", False)

    # the SLO must be reachable by the fastest acceptable model on some device kind, with nothing queued
    fastest: tuple[float, str] | None = None
    for m in variants or (model,):
        for p in catalog.find_all(m):
            if 1 in p.exec:
                s = p.service.mean
                if fastest is None or s < fastest[0]:
                    fastest = (s, p.name)
    if fastest is not None:
        floor = fastest[0] + cpu_ms + network
        if latency < floor:
            extra = f" + CPU {cpu_ms:g} ms + network {network:g} ms" if cpu_ms or network else ""
            raise slo_r.fail("latencyMs", f"SLO {latency:g} ms is below the bare latency {floor:g} ms of model "
                                          f"{model!r} on its fastest device kind (service {fastest[0]:g} ms, "
                                          f"profile {fastest[1]}{extra})")

    return _state(spec.path, source, lambda: App(
        name=name, model=model, rate_rps=rate, slo=slo, variants=variants, periodic=has_fps, burst=burst,
        cpu_cores=cpu_cores, cpu_ms=cpu_ms, memory_mb=memory, network_ms=network, shared=shared))


def _app_spec(app: App) -> dict[str, Any]:
    spec: dict[str, Any] = {"model": app.model}
    if app.variants:
        spec["variants"] = list(app.variants)
    spec["fps" if app.periodic else "rate"] = app.rate_rps
    spec["burst"] = app.burst
    spec["slo"] = {"latencyMs": app.slo.latency_ms, "stat": app.slo.stat}
    if app.cpu_cores > 0:
        spec["cpu"] = {"cores": app.cpu_cores, "serviceMs": app.cpu_ms}
    spec.update(memoryMb=app.memory_mb, networkMs=app.network_ms, shared=app.shared)
    return spec


def app_to_dict(app: App) -> dict[str, Any]:
    """The ``kind: App`` document of ``app`` (``parse_app`` of it gives ``app`` back)."""
    return {"apiVersion": API_VERSION, "kind": "App", "metadata": {"name": app.name}, "spec": _app_spec(app)}


def apps_to_dict(apps: list[App] | tuple[App, ...], name: str = "apps") -> dict[str, Any]:
    """The ``kind: AppList`` document of ``apps`` (``parse_apps`` of it gives ``apps`` back)."""
    return {"apiVersion": API_VERSION, "kind": "AppList", "metadata": {"name": name},
            "spec": {"apps": [{"name": a.name, **_app_spec(a)} for a in apps]}}
