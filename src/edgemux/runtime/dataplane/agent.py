"""The node agent: the process on a node that owns its devices and executes inference.

Its HTTP API (the Open Inference Protocol data plane, the control API the control plane calls, metrics) and
its contract with the control plane (register, heartbeat, deregister) are described in
docs/reference/http.md ("Agent"); keep that page true when they change.

An :class:`Agent` holds one :class:`~edgemux.runtime.dataplane.worker.DeviceWorker` per device of its
:class:`~edgemux.cluster.state.Node`, each on a :class:`~edgemux.runtime.dataplane.backends.Backend`: real onnxruntime
for a device of kind ``cpu`` (and CUDA for ``gpu-discrete`` where onnxruntime offers it), emulated from
profiles for ``edgetpu``, ``gpu-embedded``, ``fpga`` (and ``gpu-discrete`` without CUDA), unless the
``backends`` argument says otherwise. :func:`make_app` puts it behind HTTP (aiohttp); :func:`start_server`
binds it to an address. An app is served by one *piece* per device it is routed to (model, profile,
weight); the Open Inference Protocol model name is the app name. A model is loaded once per (source,
profile) and device and unloaded when the last app using it is removed.

With ``controlplane_url`` set, the agent registers (:meth:`Agent.registration`), heartbeats every
``heartbeat_s`` and deregisters on a graceful stop; failures to reach the control plane are retried, never
fatal. Graceful stop: :meth:`Agent.close` (``drain=True``) stops accepting requests and lets the device
workers execute what is queued; :func:`make_app` runs it from aiohttp's ``on_cleanup``, after the server has
stopped listening and the in-flight handlers have finished.

Units: ``*_s`` seconds, ``*_ms`` milliseconds, ``*_bytes`` bytes, ``*_mb`` MB (10**6 bytes).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import itertools
import json
import logging
import math
import os
import re
import socket
import ssl
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
import numpy as np
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from edgemux import __version__
from edgemux.adapt.police import Policing
from edgemux.cluster.state import Device, Node
from edgemux.cluster.workload import Discipline
from edgemux.errors import EdgemuxError, InputError
from edgemux.profiles.catalog import Catalog, load_catalog
from edgemux.profiles.types import DeviceKind, Profile
from edgemux.runtime.auth import Guard, auth_headers, auth_middleware, inference_need, is_digest
from edgemux.runtime.dataplane.backends import (
    Backend,
    BackendError,
    EmulatedBackend,
    ModelInfo,
    ModelNotFound,
    ModelSource,
    OnnxRuntimeBackend,
    make_backend,
)
from edgemux.runtime.dataplane.messages import RUNS_ON_ENV, AgentReport, PieceReport
from edgemux.runtime.httputil import parse_json, read_body
from edgemux.runtime.dataplane.protocol import (
    HEADER_LENGTH_HEADER,
    InferRequest,
    ProtocolError,
    check_content_length,
    decode_infer_request,
    encode_infer_response,
    error_body,
    json_type,
    model_metadata_body,
    server_metadata_body,
    short_repr,
    validate_request,
)
from edgemux.runtime.dataplane.instances import SpatialConfigError
from edgemux.runtime.dataplane.worker import DEFAULT_MAX_QUEUE, DeviceWorker, Overloaded, Result, WorkerClosed
from edgemux.runtime.policing import TokenBucket
from edgemux.runtime.tally import Tally

__all__ = [
    "AGENT_KEY",
    "Agent",
    "AgentError",
    "AgentServer",
    "AppRoute",
    "ControlPlaneLink",
    "DEFAULT_MAX_BODY_BYTES",
    "SERVER_NAME",
    "make_app",
    "start_server",
]

logger = logging.getLogger("edgemux.agent")

SERVER_NAME = "edgemux-agent"
MODEL_VERSION = "1"  # one version per app: re-registering an app replaces its model in place
EXTENSIONS = ("binary_tensor_data",)
DEFAULT_MAX_BODY_BYTES = 16 * 10**6   # 16 MB: a 1080p RGB FP32 frame is ~25 MB, edge models take far less
CONTROL_MAX_BODY_BYTES = 10**6        # control bodies are a few hundred bytes
DEFAULT_REQUEST_TIMEOUT_S = 30.0
DEFAULT_HEARTBEAT_S = 5.0
DEFAULT_UNLOAD_DRAIN_S = 10.0
# Bodies and outputs above this size are decoded/encoded on a thread: parsing megabytes of JSON on the event
# loop would stall every other request (health checks included) for tens of milliseconds.
_OFFLOAD_BYTES = 1 << 20
# App names become URL path segments and Prometheus label values: keep them to one safe, bounded token.
_APP_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:+-]{0,127}$")
_PUT_FIELDS = ("device", "model", "profile", "weight", "rate_rps", "burst", "fraction", "instances", "key_sha256")
# Latency buckets (s): an Edge TPU request takes a few ms, a CPU-bound one up to seconds.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_RETRY_FIRST_S = 0.5

class AgentError(EdgemuxError):
    """A request the agent refuses: ``status`` is the HTTP status (400, 404, 409, 504...)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class OverContract(AgentError):
    """The app's token bucket on this agent has no token within ``policing.max_wait_s``: 429, with
    ``retry_after_s`` (s) until one comes."""

    def __init__(self, app: str, retry_after_s: float) -> None:
        super().__init__(f"app '{_clip(app)}' is over its contract on this agent: rate limited (its next token "
                         f"in {retry_after_s:.3f} s)", 429)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class AppRoute:
    """Where one app's requests go on this agent: ``device`` (name on the node) and ``model`` (the backend's
    model key: the normalized source string, plus ``#profile`` when loaded with a profile), loaded with
    ``profile`` (catalog name, or None); ``weight`` is the app's routing share here (0, 1], as the control
    plane placed it; ``info`` the loaded model; ``source`` the normalized source string (what is reported
    as the app's model); ``rate_rps`` (req/s) and ``burst`` (requests) this piece's part of the app's
    contract (None: not policed here); on a spatial device ``instances`` instances each holding ``fraction``
    of it (1 and 1 elsewhere); ``key_sha256`` the digest of the app's key (``runtime.auth``), which opens the
    app's inference here when the agent takes app keys (None: only the admin token does)."""

    app: str
    device: str
    model: str
    profile: str | None
    weight: float
    info: ModelInfo
    created_at: float = field(default_factory=time.time)  # Unix s
    source: str = ""
    rate_rps: float | None = None
    burst: float | None = None
    fraction: float = 1.0
    instances: int = 1
    key_sha256: str | None = None

    def as_dict(self, node: str) -> dict[str, Any]:
        """Plain values for ``GET /v1/apps`` and the control-plane messages."""
        return {
            "app": self.app, "device": self.device, "device_path": f"{node}/{self.device}",
            "model": self.source or self.model,
            "profile": self.profile, "weight": self.weight, "rate_rps": self.rate_rps, "burst": self.burst,
            "fraction": self.fraction, "instances": self.instances, "key_sha256": self.key_sha256,
            "emulated": self.info.emulated,
            "backend": self.info.backend, "inputs": self.info.as_dict()["inputs"],
            "outputs": self.info.as_dict()["outputs"], "provenance": self.info.provenance,
            "created_at": self.created_at,
        }


class _Wanted(NamedTuple):
    """One piece of a ``PUT /v1/apps/{app}`` body, checked: its device, the backend's load key, profile name,
    source and normalized source text, weight, contract (req/s, requests; None: not policed) and, on a
    spatial device, its share per instance and instance count."""

    device: Device
    key: str
    profile: str | None
    source: ModelSource
    text: str
    weight: float
    rate: float | None
    burst: float | None
    fraction: float
    instances: int
    key_sha256: str | None


# ------------------------------------------------------------------------------------------------ agent


class _Pieces:
    """An app's pieces on this agent and the order requests take over them: smooth weighted round robin
    (nginx's), unrolled once into a cycle so that picking is one ``next`` (atomic under the GIL, no lock
    on the inference path). Weights are compared in thousandths, so the cycle is at most 1000 long."""

    def __init__(self, pieces: tuple[AppRoute, ...]) -> None:
        self.pieces = pieces
        if len(pieces) == 1:
            self._order: Iterator[AppRoute] = itertools.repeat(pieces[0])
            return
        units = [max(1, round(r.weight * 1000)) for r in pieces]
        g = functools.reduce(math.gcd, units)
        units = [u // g for u in units]
        current = [0] * len(pieces)
        seq = []
        for _ in range(sum(units)):
            for i, u in enumerate(units):
                current[i] += u
            best = max(range(len(pieces)), key=lambda i: (current[i], -i))
            current[best] -= sum(units)
            seq.append(pieces[best])
        self._order = itertools.cycle(seq)

    def next(self) -> AppRoute:
        return next(self._order)


def _check_same_tensors(app: str, pieces: list[AppRoute]) -> None:
    """A split app answers with one model metadata: every piece must take and return the same tensors."""
    first = pieces[0]
    want = first.info.as_dict()
    for r in pieces[1:]:
        got = r.info.as_dict()
        for side in ("inputs", "outputs"):
            if got[side] != want[side]:
                raise AgentError(f"the pieces of app '{_clip(app)}' serve different tensors: on device {first.device} "
                                 f"its model's {side} are {_tensors(want[side])}, on device {r.device} "
                                 f"{_tensors(got[side])}")


def _tensors(items: list[dict[str, Any]]) -> str:
    return "[" + ", ".join(f"{t.get('name')} {t.get('datatype')} {t.get('shape')}" for t in items) + "]"


def default_backend(device: Device, *, threads: int = 1, seed: int = 0) -> Backend:
    """The backend a device gets unless configured: onnxruntime for ``cpu``; CUDA for ``gpu-discrete`` when
    this onnxruntime offers it; emulated from profiles otherwise (``edgetpu``, ``gpu-embedded``, ``fpga``)."""
    if device.kind is DeviceKind.CPU:
        return OnnxRuntimeBackend(threads)
    if device.kind is DeviceKind.GPU_DISCRETE:
        try:
            return make_backend("cuda", threads=threads)
        except BackendError as e:
            logger.info("device %s: %s; emulating it from profiles", device.path, e.message)
    return EmulatedBackend(seed=seed)


class Agent:
    """The devices of one node, their workers and the apps routed to them (see the module docstring).

    ``backends`` maps device names to a :class:`Backend` or a ``make_backend`` kind (``onnxruntime``,
    ``emulated``, ``cuda``); the others get :func:`default_backend` (``threads`` intra-op threads per
    onnxruntime session, emulation seeded with ``seed`` + the device's index). ``max_queue`` bounds each
    device's waiting requests (an int for every device, or a mapping by device name). ``request_timeout_s``
    bounds the wait for a result (504 beyond); ``max_body_bytes`` an inference body (413 above);
    ``cache_dir`` is where zoo models are built; ``unload_drain_s`` how long removing an app waits for its
    in-flight requests before unloading its model. ``controlplane_url`` and ``heartbeat_s`` (s) set up the
    contract of docs/reference/http.md once :meth:`start_link` is called (``start_server`` does).
    ``policing`` turns an app's contract (the ``rate_rps`` and ``burst`` of its pieces here) into the
    app's token bucket on this agent (``adapt.police.Policing``, the gateway's rule): a client that bypasses
    the gateway is held to the contract too. ``token``: the cluster's admin token (``runtime.auth``): its
    control API and metrics need it, its heartbeats carry it, and inference needs it or, with ``app_keys``,
    the app's key (None: an open agent). ``model_dirs``: the directories an ONNX file it is told to load must
    be in (resolved, links followed; zoo models are always allowed); None: any path (an embedded agent; the
    ``edgemux agent`` command always passes a list, empty without ``--model-dir``).
    """

    def __init__(
        self,
        node: Node,
        *,
        catalog: Catalog | None = None,
        backends: Mapping[str, Backend | str] | None = None,
        threads: int = 1,
        seed: int = 0,
        max_queue: int | Mapping[str, int] = DEFAULT_MAX_QUEUE,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        cache_dir: str | None = None,
        unload_drain_s: float = DEFAULT_UNLOAD_DRAIN_S,
        controlplane_url: str | None = None,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        policing: Policing = Policing(),
        token: str | None = None,
        app_keys: bool = True,
        model_dirs: Sequence[str] | None = None,
    ) -> None:
        if not (isinstance(request_timeout_s, (int, float)) and request_timeout_s > 0
                and math.isfinite(request_timeout_s)):
            raise InputError("request_timeout_s", f"must be a finite number > 0 s, got {request_timeout_s!r}")
        if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes < 1:
            raise InputError("max_body_bytes", f"must be a positive int, got {max_body_bytes!r}")
        if not (isinstance(heartbeat_s, (int, float)) and heartbeat_s > 0 and math.isfinite(heartbeat_s)):
            raise InputError("heartbeat_s", f"must be a finite number > 0 s, got {heartbeat_s!r}")
        if controlplane_url is not None:
            parsed = urllib.parse.urlsplit(controlplane_url)
            if parsed.scheme not in ("http", "https") or not parsed.netloc:
                raise InputError("controlplane_url", f"expected http://HOST:PORT, got {controlplane_url!r}")
        self.node = node
        self.token = token
        self.guard = Guard(token, self._key_of, self._key_owner, app_keys=app_keys)
        self.model_dirs = None if model_dirs is None else tuple(Path(d).resolve() for d in model_dirs)
        self.catalog = catalog if catalog is not None else load_catalog()
        self.devices: dict[str, Device] = {d.name: d for d in node.devices}
        self.request_timeout_s = float(request_timeout_s)
        self.max_body_bytes = max_body_bytes
        self.cache_dir = cache_dir
        self.unload_drain_s = float(unload_drain_s)
        self.controlplane_url = controlplane_url.rstrip("/") if controlplane_url else None
        self.heartbeat_s = float(heartbeat_s)
        self.incarnation = uuid.uuid4().hex
        # where this process runs, for every registration: what the engine that started it says (the Ray
        # engine names the Ray node), else this host's name
        self.runs_on = os.environ.get(RUNS_ON_ENV) or socket.gethostname()
        # what this process saw of its apps and profiles, cumulative: sent with every heartbeat (adapt reads it)
        self.tally = Tally(self.incarnation)
        self.started_at = time.time()
        self.url: str | None = None  # where clients reach this agent; set by start_server
        self.link: ControlPlaneLink | None = None
        # app -> its pieces (one per device, sorted by device name) and the round-robin order over them
        self._apps: dict[str, _Pieces] = {}
        # Serializes control operations (register/unregister, each possibly loading a model for seconds).
        # Inference only reads ``_apps`` (one dict lookup, atomic under the GIL) and never takes this lock.
        self._control = threading.RLock()
        # Futures submitted per (device, model), so that unloading a model waits for its in-flight requests.
        self._pending: dict[tuple[str, str], set[concurrent.futures.Future[Result]]] = {}
        self._pending_lock = threading.Lock()
        # app -> its token bucket here (apps whose pieces carry a contract); read on the inference path
        self.policing = policing
        self._buckets: dict[str, TokenBucket] = {}
        self._closing = False
        self._closed = False

        configured = dict(backends or {})
        unknown = sorted(set(configured) - set(self.devices))
        if unknown:
            raise InputError("backends", f"unknown device {unknown[0]!r} on node {node.name} "
                                         f"(devices: {_listing(self.devices)})")
        queues = max_queue if isinstance(max_queue, Mapping) else {d: max_queue for d in self.devices}
        self.backends: dict[str, Backend] = {}
        self.workers: dict[str, DeviceWorker] = {}
        for i, (name, dev) in enumerate(self.devices.items()):
            b = configured.get(name)
            if b is None:
                backend = default_backend(dev, threads=threads, seed=seed + i)
            elif isinstance(b, Backend):
                backend = b
            else:
                try:
                    backend = make_backend(b, **({"seed": seed + i} if b == "emulated" else {"threads": threads}))
                except BackendError as e:
                    raise InputError(f"backends.{name}", e.message) from None
            self.backends[name] = backend
        try:
            for name, dev in self.devices.items():
                self.workers[name] = DeviceWorker(dev, self.backends[name],
                                                  max_queue=int(queues.get(name, DEFAULT_MAX_QUEUE)))
        except ValueError as e:
            self.close(drain=False)
            raise InputError("max_queue", str(e)) from None

        self.metrics = AgentMetrics(self)

    # -- lookups ---------------------------------------------------------------------------------------

    def route(self, app: str) -> AppRoute:
        """The piece of ``app`` the next request goes to (smooth weighted round robin over its pieces; the
        only one for an app on one device); ``AgentError`` 404 naming the known apps otherwise."""
        return self._pieces_of(app).next()

    def pieces(self, app: str) -> tuple[AppRoute, ...]:
        """Every piece of ``app``, by device name; ``AgentError`` 404 naming the known apps otherwise."""
        return self._pieces_of(app).pieces

    def _pieces_of(self, app: str) -> _Pieces:
        p = self._apps.get(app)
        if p is None:
            raise AgentError(f"unknown app '{_clip(app)}' on node {self.node.name} (apps: {_listing(self._apps)})", 404)
        return p

    def routes(self) -> list[AppRoute]:
        """Every piece of every app, by app and device name."""
        # a snapshot first: control threads may change the table meanwhile
        return [r for _, p in sorted(list(self._apps.items())) for r in p.pieces]

    def app_dict(self, app: str) -> dict[str, Any]:
        """``GET /v1/apps/{app}``: the piece's fields, or for a split app its pieces under ``pieces``."""
        pieces = self.pieces(app)
        if len(pieces) == 1:
            return pieces[0].as_dict(self.node.name)
        items = [r.as_dict(self.node.name) for r in pieces]
        return {"app": app, "weight": sum(r.weight for r in pieces), "pieces": items,
                "emulated": all(r.info.emulated for r in pieces),
                "inputs": items[0]["inputs"], "outputs": items[0]["outputs"]}

    def device(self, name: str) -> Device:
        """The device ``name`` (or ``node/name``); ``AgentError`` 404 listing the devices otherwise."""
        if not isinstance(name, str):
            raise AgentError(f"'device' must be a string, got {json_type(name)}")
        local = name
        prefix = self.node.name + "/"
        if name.startswith(prefix):
            local = name[len(prefix):]
        dev = self.devices.get(local)
        if dev is None:
            raise AgentError(f"unknown device '{_clip(name)}' on node {self.node.name} "
                             f"(devices: {_listing(self.devices)})", 404)
        return dev

    @property
    def ready(self) -> bool:
        """True while every device worker runs (none closed) and the agent is not stopping."""
        return not self._closing and all(not w.closed for w in self.workers.values())

    # -- control ---------------------------------------------------------------------------------------

    def register_app(self, app: str, spec: Any) -> tuple[AppRoute, bool]:
        """Route ``app`` per ``spec`` (the ``PUT /v1/apps/{app}`` body, already parsed from JSON: one piece,
        or ``{"pieces": [...]}``), loading models when needed. Returns (the app's first piece, created).
        Blocking (a load may take seconds): the HTTP layer calls it on a thread. Raises
        ``AgentError``/``BackendError`` with the HTTP status; nothing changes when it raises."""
        _check_app_name(app)
        if not isinstance(spec, dict):
            raise AgentError(f"app spec must be a JSON object, got {json_type(spec)}")
        if "pieces" in spec:
            extra = sorted(k for k in spec if k != "pieces")
            if extra:
                raise AgentError(f"unknown field '{_clip(str(extra[0]))}' beside 'pieces' in the app spec "
                                 "(a split app's fields go in each piece)")
            items = spec["pieces"]
            if not isinstance(items, list) or not items:
                raise AgentError(f"'pieces' must be a non-empty list of piece objects, got {short_repr(items)}")
            where = [f"pieces[{i}]: " for i in range(len(items))]
        else:
            items, where = [spec], [""]
        wanted = [self._piece_spec(item, w) for item, w in zip(items, where)]
        devices = [w.device.name for w in wanted]
        dup = sorted({d for d in devices if devices.count(d) > 1})
        if dup:
            raise AgentError(f"two pieces on device {dup[0]}: an app has at most one piece per device")

        with self._control:
            if self._closing:
                raise AgentError(f"agent of node {self.node.name} is stopping", 503)
            off = [d for d in devices if self.workers[d].power_state == "off"]
            if off:
                raise AgentError(f"device {self.workers[off[0]].device.path} is switched off: switch it on "
                                 f"(PUT /v1/devices/{off[0]}/power) before placing an app there", 409)
            old = self._apps.get(app)
            old_by_device = {r.device: r for r in old.pieces} if old is not None else {}
            loaded: list[AppRoute] = []  # models this call loaded, released again if it fails
            pieces = []
            configured: list[AppRoute] = []  # spatial instances this call set up, removed again if it fails
            reshare: list[tuple[AppRoute, AppRoute]] = []  # (old, new) pieces whose instances change
            done: list[tuple[AppRoute, AppRoute]] = []
            try:
                for w in wanted:
                    dev, key = w.device, w.key
                    prev = old_by_device.get(dev.name)
                    if prev is not None and prev.model == key:
                        # same model: the weight and the contract change, and on a spatial device the
                        # instances are re-shared with overlap (the old ones serve until the new are warm)
                        route = dataclasses.replace(prev, weight=w.weight, rate_rps=w.rate, burst=w.burst,
                                                    fraction=w.fraction, instances=w.instances,
                                                    key_sha256=w.key_sha256)
                        if (prev.fraction, prev.instances) != (w.fraction, w.instances):
                            reshare.append((prev, route))
                        pieces.append(route)
                        continue
                    info = self._load(self.backends[dev.name], dev, key, w.source)
                    route = AppRoute(app, dev.name, key, w.profile, w.weight, info, source=w.text, rate_rps=w.rate,
                                     burst=w.burst, fraction=w.fraction, instances=w.instances,
                                     key_sha256=w.key_sha256)
                    loaded.append(route)
                    if self.workers[dev.name].discipline is Discipline.SPATIAL:
                        # a worker keeps one set of instances per app: another model for the app here
                        # replaces its old instances (break before make, unlike a re-share)
                        if prev is not None:
                            self._remove_instances(prev)
                        self._configure(route)
                        configured.append(route)
                    pieces.append(route)
                _check_same_tensors(app, pieces)
                for prev, route in reshare:  # last: only when everything else is in place
                    self._configure(route)
                    done.append((prev, route))
            except BaseException:
                for prev, _ in reversed(done):
                    self._configure(prev)  # back to the instances it had (overlapped again)
                for r in configured:
                    self._remove_instances(r)
                for r in loaded:
                    self._release(r)
                raise
            self._apps[app] = _Pieces(tuple(sorted(pieces, key=lambda r: r.device)))
            self._police(app, pieces)
            kept = {(r.device, r.model) for r in pieces}
            for r in old.pieces if old is not None else ():
                if (r.device, r.model) not in kept:
                    # make before break: the new models are loaded and routed before the old ones go
                    if r.device not in {p.device for p in pieces}:
                        self._remove_instances(r)
                    self._release(r)
            for r in loaded:
                logger.info("app %s -> %s model %s%s", app, self.devices[r.device].path, r.model,
                            " (emulated)" if r.info.emulated else "")
            return self._apps[app].pieces[0], old is None

    def _configure(self, route: AppRoute) -> None:
        """Set up or re-share ``route``'s instances on its spatial device (``DeviceWorker.configure_app``: a
        change is made with overlap)."""
        try:
            self.workers[route.device].configure_app(route.app, route.model, share=route.fraction,
                                                     instances=route.instances)
        except SpatialConfigError as e:
            raise AgentError(f"device {self.devices[route.device].path}: {e.message}", e.status) from None

    def _remove_instances(self, route: AppRoute) -> None:
        """Release ``route``'s instances when its device is spatial (its queued requests run first)."""
        worker = self.workers[route.device]
        if worker.discipline is Discipline.SPATIAL:
            try:
                worker.remove_app(route.app)
            except BackendError:
                pass  # none there (its set-up failed): nothing to release

    def _police(self, app: str, pieces: list[AppRoute]) -> None:
        """Set ``app``'s bucket from its pieces' contracts (summed over its pieces here), keeping the tokens of
        the bucket it had; no contract on any piece: not policed here. Called under ``_control``."""
        contracted = [(r.rate_rps, r.burst) for r in pieces if r.rate_rps is not None and r.burst is not None]
        if not contracted:
            self._buckets.pop(app, None)
            return
        rate, burst = self.policing.contract(math.fsum(c[0] for c in contracted),
                                             math.fsum(c[1] for c in contracted))
        bucket = self._buckets.get(app)
        if bucket is None:
            self._buckets[app] = TokenBucket(rate, burst)
        else:
            bucket.reconfigure(rate, burst)

    def police(self, app: str) -> float:
        """Take a token of ``app``'s bucket on this agent: the wait (s) before its request may go to the device
        (0.0: now, or the app is not policed here). ``AgentError`` 429 when the token would come later than
        ``policing.max_wait_s``, with the seconds until one would come."""
        bucket = self._buckets.get(app)
        if bucket is None:
            return 0.0
        admission = bucket.admit(self.policing.max_wait_s)
        if not admission.admitted:
            raise OverContract(app, admission.retry_after_s)
        return admission.wait_s

    def _piece_spec(self, spec: Any, where: str) -> _Wanted:
        """What one piece's spec asks for."""
        if not isinstance(spec, dict):
            raise AgentError(f"{where}a piece must be a JSON object, got {json_type(spec)}")
        extra = sorted(k for k in spec if k not in _PUT_FIELDS)
        if extra:
            raise AgentError(f"{where}unknown field '{_clip(str(extra[0]))}' in the app spec (known: "
                             f"{', '.join(_PUT_FIELDS)}{', pieces' if not where else ''})")
        if "device" not in spec:
            raise AgentError(f"{where}missing field 'device' in the app spec")
        dev = self.device(spec["device"])
        model_text = spec.get("model")
        if not isinstance(model_text, str) or not model_text.strip():
            raise AgentError(f"{where}'model' must be a non-empty string (zoo:NAME[@SIZE] or an ONNX file path), "
                             f"got {short_repr(model_text)}")
        weight = spec.get("weight", 1.0)
        if (isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight)
                or not 0 < weight <= 1):
            raise AgentError(f"{where}'weight' must be a number in (0, 1], got {short_repr(weight)}")
        rate, burst = spec.get("rate_rps"), spec.get("burst")
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float))
                                 or not math.isfinite(rate) or rate <= 0):
            raise AgentError(f"{where}'rate_rps' must be a number > 0 (req/s), got {short_repr(rate)}")
        if burst is not None and (isinstance(burst, bool) or not isinstance(burst, (int, float))
                                  or not math.isfinite(burst) or burst < 1):
            raise AgentError(f"{where}'burst' must be a number >= 1 (requests), got {short_repr(burst)}")
        if burst is not None and rate is None:
            raise AgentError(f"{where}'burst' without 'rate_rps': a contract needs its rate")
        fraction, instances = spec.get("fraction", 1.0), spec.get("instances", 1)
        if (isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not math.isfinite(fraction)
                or not 0 < fraction <= 1):
            raise AgentError(f"{where}'fraction' must be a number in (0, 1] (the share of the device each "
                             f"instance holds), got {short_repr(fraction)}")
        if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
            raise AgentError(f"{where}'instances' must be an integer >= 1, got {short_repr(instances)}")
        if (fraction, instances) != (1.0, 1) and dev.discipline is not Discipline.SPATIAL:
            raise AgentError(f"{where}'fraction' and 'instances' apply to spatial devices; device {dev.path} is "
                             f"{dev.discipline.value}")
        key_sha256 = spec.get("key_sha256")
        if key_sha256 is not None and not is_digest(key_sha256):
            raise AgentError(f"{where}'key_sha256' must be 64 lowercase hex digits (an app key's SHA-256), got "
                             f"{short_repr(key_sha256)}")
        backend = self.backends[dev.name]
        profile = self._profile(spec.get("profile"), dev, backend, model_text)
        source = self._source(model_text.strip(), profile)
        src = source.describe()
        pname = profile.name if profile is not None else None
        # one loaded copy per (source, profile): two catalog models sharing a graph (a stand-in) are two
        # models on the device, each with its own timing and switch cost
        key = src if pname is None else f"{src}#{pname}"
        return _Wanted(dev, key, pname, source, src, float(weight), None if rate is None else float(rate),
                       None if rate is None else float(burst if burst is not None else 1.0), float(fraction),
                       instances, key_sha256)

    def unregister_app(self, app: str) -> dict[str, Any]:
        """Unroute ``app`` and unload its model when no other app on its device uses it (after its in-flight
        requests finish, at most ``unload_drain_s``). Returns what happened; ``AgentError`` 404 if unknown."""
        with self._control:
            pieces = self.pieces(app)
            del self._apps[app]
            self._buckets.pop(app, None)
            for r in pieces:
                self._remove_instances(r)
            unloaded = [self._release(r) for r in pieces]
        for r, u in zip(pieces, unloaded):
            logger.info("app %s removed from %s%s", app, r.device, f"; model {r.model} unloaded" if u else "")
        if len(pieces) == 1:
            r = pieces[0]
            return {"app": app, "device": r.device, "model": r.source or r.model, "unloaded": unloaded[0]}
        return {"app": app, "pieces": [{"device": r.device, "model": r.source or r.model, "unloaded": u}
                                       for r, u in zip(pieces, unloaded)]}

    def _profile(self, name: Any, dev: Device, backend: Backend, model: str) -> Profile | None:
        if name is None:
            if backend.emulated:
                hint = ""
                if model.startswith("zoo:"):
                    found = self.catalog.find_all(model[4:].partition("@")[0], dev.kind)
                    if found:
                        hint = f", e.g. {', '.join(p.name for p in found[:3])}"
                raise AgentError(f"device {dev.path} is emulated: the app spec needs a 'profile' "
                                 f"({dev.kind.value} profiles drive its service times{hint})")
            return None
        if not isinstance(name, str):
            raise AgentError(f"'profile' must be a string, got {json_type(name)}")
        try:
            profile = self.catalog.get(name)
        except InputError as e:
            raise AgentError(e.problem, 404) from None
        if profile.device_kind is not dev.kind:
            raise AgentError(f"profile {profile.name} is for {profile.device_kind.value} devices, but device "
                             f"{dev.path} is {dev.kind.value}")
        return profile

    def _source(self, text: str, profile: Profile | None) -> ModelSource:
        source = ModelSource.parse(text, profile=profile)  # BackendError (400) for a bad size
        if source.zoo is not None:
            from edgemux.runtime import zoo

            if source.zoo not in zoo.MODELS:
                raise AgentError(f"unknown zoo model '{_clip(source.zoo)}' (known: {', '.join(zoo.MODELS)})", 404)
            source = dataclasses.replace(source, cache_dir=self.cache_dir)
        elif source.path is not None and self.model_dirs is not None:
            where = Path(source.path).resolve()
            if not any(where.is_relative_to(d) for d in self.model_dirs):
                allowed = ", ".join(str(d) for d in self.model_dirs) or "none: start the agent with --model-dir DIR"
                raise AgentError(f"model path {_clip(source.path)} is outside the directories this agent loads ONNX "
                                 f"files from ({allowed}); zoo models (zoo:NAME) are always allowed", 403)
        return source

    def _key_of(self, app: str) -> str | None:
        """The digest of ``app``'s key here (None: unknown app, or no key)."""
        pieces = self._apps.get(app)
        return pieces.pieces[0].key_sha256 if pieces is not None else None

    def _key_owner(self, key_sha256: str) -> str | None:
        """The app here whose key has this digest (None: none)."""
        return next((a for a, p in list(self._apps.items()) if p.pieces[0].key_sha256 == key_sha256), None)

    def _load(self, backend: Backend, dev: Device, key: str, source: ModelSource) -> ModelInfo:
        try:
            return backend.load(key, source)
        except BackendError as e:
            raise BackendError(f"cannot load model '{key}' on device {dev.path}: {e.message}", e.status) from None
        except EdgemuxError as e:  # e.g. a zoo size below the network's stride
            raise AgentError(f"cannot load model '{key}' on device {dev.path}: {e}") from None
        except Exception as e:  # a file that is not a model (protobuf errors...): the request's fault
            logger.warning("loading %s on %s failed: %r", key, dev.path, e)
            raise AgentError(f"cannot load model '{key}' on device {dev.path}: {e}") from None

    def _release(self, route: AppRoute) -> bool:
        """Unload ``route``'s model when no app uses it on its device any more; True when unloaded."""
        if any(r.device == route.device and r.model == route.model for p in self._apps.values() for r in p.pieces):
            return False
        with self._pending_lock:
            pending = list(self._pending.get((route.device, route.model), ()))
        if pending:
            # let requests already accepted finish instead of failing them with "not loaded"
            concurrent.futures.wait(pending, timeout=self.unload_drain_s)
        try:
            self.backends[route.device].unload(route.model)
        except ModelNotFound:
            return False
        return True

    # -- inference -------------------------------------------------------------------------------------

    def submit(self, route: AppRoute, inputs: Mapping[str, np.ndarray]) -> concurrent.futures.Future[Result]:
        """Queue one request of ``route`` on its device worker (raises at once: ``Overloaded``,
        ``InvalidInput``, ``WorkerClosed``, ``ModelNotFound`` when the app was removed meanwhile)."""
        key = (route.device, route.model)
        fut = self.workers[route.device].submit(route.app, route.model, inputs)
        with self._pending_lock:
            self._pending.setdefault(key, set()).add(fut)
        fut.add_done_callback(lambda f: self._done(key, f))
        return fut

    def _done(self, key: tuple[str, str], fut: concurrent.futures.Future[Result]) -> None:
        with self._pending_lock:
            s = self._pending.get(key)
            if s is not None:
                s.discard(fut)
                if not s:
                    del self._pending[key]

    # -- status ----------------------------------------------------------------------------------------

    def set_power(self, device: str, state: str) -> dict[str, Any]:
        """``PUT /v1/devices/{device}/power``: switch ``device`` (its name on this node) ``on`` or ``off``
        (``DeviceWorker.set_power``: refused, 409, while it holds a model); ``AgentError`` 404 for an unknown
        device. Returns the device's name and state."""
        worker = self.workers.get(device)
        if worker is None:
            raise AgentError(f"node {self.node.name} has no device {_clip(device)!r} "
                             f"(it has {', '.join(sorted(self.workers))})", 404)
        return {"device": device, "path": worker.device.path, "state": worker.set_power(state)}

    def status(self) -> dict[str, Any]:
        """``GET /v1/node``: the node and each device's backend, loaded models, queue and utilization."""
        devices = []
        for name, dev in self.devices.items():
            st = self.workers[name].stats()
            loaded = self.backends[name].loaded()
            users: dict[str, list[str]] = {}
            shown: dict[str, tuple[str, str | None]] = {}   # load key -> (source, profile)
            for r in self.routes():
                if r.device == name:
                    users.setdefault(r.model, []).append(r.app)
                    shown[r.model] = (r.source or r.model, r.profile)
            devices.append({
                "name": name, "path": dev.path, "kind": dev.kind.value, "discipline": st["discipline"],
                "backend": st["backend"], "emulated": st["emulated"], "memory_mb": dev.memory_mb,
                "profile_set": dev.profile_set, "servers": st["servers"], "max_queue": st["max_queue"],
                "queue_depth": st["queued"], "inflight": st["inflight"], "executions": st["executions"],
                "utilization": st["utilization"], "window_s": st["window_s"], "closed": st["closed"],
                "power_state": st["power_state"],
                **({k: st[k] for k in ("power_w", "energy_j", "app_energy_j")} if "power_w" in st else {}),
                "loaded_models": [{"model": shown.get(m, (m, None))[0], "profile": shown.get(m, (m, None))[1],
                                   "memory_mb": i.memory_mb, "apps": sorted(users.get(m, [])),
                                   "provenance": i.provenance} for m, i in sorted(loaded.items())],
                "loaded_memory_mb": sum(i.memory_mb for i in loaded.values()),
            })
        return {"node": self.node.name, "cpu_cores": self.node.cpu_cores, "memory_mb": self.node.memory_mb,
                "ready": self.ready, "devices": devices}

    def registration(self) -> AgentReport:
        """The register/heartbeat message to the control plane (see the module docstring)."""
        status = self.status()
        return AgentReport(
            self.node.name, self.url or "", self.incarnation, self.heartbeat_s, __version__,
            {d["name"]: d for d in status.pop("devices")},
            tuple(PieceReport.from_json(r.as_dict(self.node.name)) for r in self.routes()),
            {**{k: v for k, v in status.items() if k != "node"}, "started_at": self.started_at, "time": time.time()},
            self.tally.observations(), self.runs_on)

    # -- lifecycle -------------------------------------------------------------------------------------

    def start_link(self) -> ControlPlaneLink | None:
        """Start registering and heartbeating with the control plane (needs a running event loop and
        ``url``); None without ``controlplane_url``. Idempotent."""
        if self.controlplane_url is None:
            return None
        if self.link is None:
            self.link = ControlPlaneLink(self, self.controlplane_url, heartbeat_s=self.heartbeat_s)
            self.link.start()
        return self.link

    def close(self, drain: bool = True, timeout_s: float = 30.0) -> bool:
        """Stop accepting requests and stop the device workers: ``drain=True`` executes what is queued
        first. True when every worker ended within ``timeout_s`` (s, shared by all). Idempotent."""
        with self._control:
            self._closing = True
            if self._closed:
                return True
            self._closed = True
        deadline = time.monotonic() + max(0.0, timeout_s)
        ok = True
        for w in self.workers.values():
            ok = w.close(drain=drain, timeout_s=max(0.0, deadline - time.monotonic())) and ok
        return ok

    async def aclose(self, drain: bool = True, timeout_s: float = 30.0) -> bool:
        """``close`` from the event loop: stop the control-plane link (deregistering), then drain the workers
        on a thread so that the loop keeps answering meanwhile."""
        self._closing = True  # readiness turns false at once
        if self.link is not None:
            await self.link.stop(deregister=True)
        return await asyncio.get_running_loop().run_in_executor(None, self.close, drain, timeout_s)


AGENT_KEY: web.AppKey[Agent] = web.AppKey("edgemux_agent", Agent)  # the agent behind an Application


# ---------------------------------------------------------------------------------------------- metrics


class AgentMetrics:
    """The agent's Prometheus metrics, in a registry of its own (several agents may share a process).

    Per app: ``edgemux_requests_total{app,device,code}``, ``edgemux_request_latency_seconds{app,device}``
    (from the request's arrival at the agent to its response, s), ``edgemux_queue_wait_seconds{app,device}``
    (from submission to the start of execution, s), ``edgemux_rejections_total{app,reason}`` (reason:
    ``queue_full``, ``timeout``, ``closed``, ``too_large``, ``bad_request``, ``not_loaded``). Requests for
    apps that do not exist count in ``edgemux_unknown_app_requests_total`` (no app label: arbitrary names
    must not grow the label space). Per device, read at scrape time: ``edgemux_device_utilization``,
    ``edgemux_device_loaded_models``, ``edgemux_device_queue_depth``, ``edgemux_device_inflight`` and
    ``edgemux_device_info{device,kind,discipline,backend,emulated}`` (always 1).
    """

    def __init__(self, agent: Agent) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("edgemux_requests", "Inference requests by app, device and HTTP status code.",
                                ("app", "device", "code"), registry=self.registry)
        self.latency = Histogram("edgemux_request_latency_seconds",
                                 "Time from a request's arrival at the agent to its response (s).",
                                 ("app", "device"), buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.queue_wait = Histogram("edgemux_queue_wait_seconds",
                                    "Time a request waited in its device's queue before executing (s).",
                                    ("app", "device"), buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.rejections = Counter("edgemux_rejections", "Requests refused or failed by the agent, by reason.",
                                  ("app", "reason"), registry=self.registry)
        self.unknown_app = Counter("edgemux_unknown_app_requests", "Inference requests naming no registered app.",
                                   registry=self.registry)
        self.registry.register(_DeviceCollector(agent))

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


class _DeviceCollector(Collector):
    """Device gauges computed from the workers' statistics when Prometheus scrapes."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def describe(self) -> list[Any]:
        return []  # computed at scrape time; nothing to check for duplicates at registration

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        util = GaugeMetricFamily("edgemux_device_utilization",
                                 "Fraction of the last window with at least one execution in flight.",
                                 labels=("device", "emulated"))
        loaded = GaugeMetricFamily("edgemux_device_loaded_models", "Models loaded on the device.", labels=("device",))
        depth = GaugeMetricFamily("edgemux_device_queue_depth", "Requests waiting in the device's queue.",
                                  labels=("device",))
        inflight = GaugeMetricFamily("edgemux_device_inflight", "Executions in flight on the device.",
                                     labels=("device",))
        info = GaugeMetricFamily("edgemux_device_info", "The device's kind, discipline and backend (always 1).",
                                 labels=("device", "kind", "discipline", "backend", "emulated"))
        power = GaugeMetricFamily("edgemux_device_power_watts",
                                  "Modelled power of the device (W): idle + (active - idle) x utilization, 0 when "
                                  "switched off; only devices with power figures.", labels=("device", "state"))
        energy = CounterMetricFamily("edgemux_device_energy_joules",
                                     "Modelled energy of the device since the agent started (J).", labels=("device",))
        app_energy = CounterMetricFamily("edgemux_app_energy_joules",
                                         "An app's share of the device's dynamic energy: (active - idle) x its "
                                         "service time (J).", labels=("app", "device"))
        for name, w in self.agent.workers.items():
            st = w.stats()
            path = st["device"]
            emulated = "true" if st["emulated"] else "false"
            util.add_metric((path, emulated), st["utilization"])
            loaded.add_metric((path,), len(st["loaded_models"]))
            depth.add_metric((path,), st["queued"])
            inflight.add_metric((path,), st["inflight"])
            info.add_metric((path, st["kind"], st["discipline"], st["backend"], emulated), 1.0)
            if "power_w" in st:
                power.add_metric((path, st["power_state"]), st["power_w"])
                energy.add_metric((path,), st["energy_j"])
                for a, j in st["app_energy_j"].items():
                    app_energy.add_metric((a, path), j)
        yield from (util, loaded, depth, inflight, info, power, energy, app_energy)


# ----------------------------------------------------------------------------------------- control plane


class ControlPlaneLink:
    """Registers the agent with the control plane and heartbeats (the contract of the module docstring).

    Never fatal: every failure is logged and retried. ``registered`` says whether the last exchange
    succeeded; ``last_error`` holds the latest failure (None after a success); ``sent`` counts the messages
    the control plane accepted. ``timeout_s`` bounds one exchange (s).
    """

    def __init__(self, agent: Agent, base_url: str, *, heartbeat_s: float, timeout_s: float = 5.0) -> None:
        self.agent = agent
        self.url = f"{base_url.rstrip('/')}/v1/agents/{urllib.parse.quote(agent.node.name, safe='')}"
        self.heartbeat_s = heartbeat_s
        self.timeout_s = min(timeout_s, max(heartbeat_s, 0.5))
        self.registered = False
        self.last_error: str | None = None
        self.sent = 0
        self._task: asyncio.Task[None] | None = None
        self._down = False  # in an outage: warn once when it starts, not at every retry

    def start(self) -> None:
        """Start the background task on the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"edgemux-link-{self.agent.node.name}")

    async def stop(self, deregister: bool = True) -> None:
        """Stop heartbeating and, when registered, tell the control plane this agent is leaving (2 s)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        if deregister and self.registered:
            try:
                async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0),
                                                 headers=auth_headers(self.agent.token)) as s:
                    async with s.delete(self.url) as resp:
                        await resp.read()
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                logger.info("could not deregister from the control plane at %s: %s", self.url, _describe(e))
            self.registered = False

    async def _run(self) -> None:
        delay = min(_RETRY_FIRST_S, self.heartbeat_s)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                                         headers=auth_headers(self.agent.token)) as session:
            while True:
                ok = False
                again_now = False
                try:
                    method = "PUT" if self.registered else "POST"
                    async with session.request(method, self.url, json=self.agent.registration().to_json()) as resp:
                        await resp.read()
                        status = resp.status
                    if 200 <= status < 300:
                        ok = True
                        self.registered = True
                        self.sent += 1
                    elif method == "PUT" and status in (404, 410):
                        # the control plane forgot us (restarted without its store): register again now
                        logger.info("control plane at %s does not know node %s: registering again",
                                    self.url, self.agent.node.name)
                        self.registered = False
                        again_now = True
                    else:
                        self._failed(f"{method} answered HTTP {status}")
                except asyncio.CancelledError:
                    raise
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                    self._failed(_describe(e))
                except Exception as e:  # never let a bug here stop the agent from serving
                    logger.exception("control-plane link failed")
                    self._failed(_describe(e))
                if ok:
                    if self._down:
                        logger.info("control plane at %s reachable again", self.url)
                    self._down = False
                    self.last_error = None
                    delay = min(_RETRY_FIRST_S, self.heartbeat_s)
                    await asyncio.sleep(self.heartbeat_s)
                elif not again_now:
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self.heartbeat_s)

    def _failed(self, reason: str) -> None:
        self.last_error = reason
        if not self._down:
            logger.warning("control plane at %s unreachable (%s); serving on, retrying", self.url, reason)
        else:
            logger.debug("control plane at %s still unreachable: %s", self.url, reason)
        self._down = True


# ------------------------------------------------------------------------------------------------- HTTP


def make_app(agent: Agent) -> web.Application:
    """The aiohttp application of ``agent`` (routes in the module docstring). Its ``on_cleanup`` stops the
    control-plane link and drains the agent's workers."""
    # authentication first: a request without the credential it needs never reaches a handler
    app = web.Application(middlewares=[auth_middleware(agent.guard, inference_need), _errors_middleware])
    app[AGENT_KEY] = agent
    h = _Handlers(agent)
    r = app.router
    r.add_get("/v2/health/live", h.live)
    r.add_get("/v2/health/ready", h.ready)
    r.add_get("/v2", h.server_metadata)
    for base in ("/v2/models/{app}", "/v2/models/{app}/versions/{version}"):
        r.add_get(base, h.model_metadata)
        r.add_get(base + "/ready", h.model_ready)
        r.add_post(base + "/infer", h.infer)
    r.add_get("/v1/apps", h.list_apps)
    r.add_get("/v1/apps/{app}", h.get_app)
    r.add_put("/v1/apps/{app}", h.put_app)
    r.add_delete("/v1/apps/{app}", h.delete_app)
    r.add_get("/v1/node", h.node)
    r.add_put("/v1/devices/{device}/power", h.put_power)
    r.add_get("/metrics", h.metrics)

    async def _cleanup(_: web.Application) -> None:
        await agent.aclose(drain=True)

    app.on_cleanup.append(_cleanup)
    return app


@dataclass
class AgentServer:
    """A running agent server: ``url`` is the bound address (``http://HOST:PORT``). ``stop`` stops
    listening, lets in-flight requests finish and drains the agent (its ``on_cleanup``)."""

    agent: Agent
    runner: web.AppRunner
    url: str

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start_server(agent: Agent, host: str = "127.0.0.1", port: int = 0, *, advertise_url: str | None = None,
                       shutdown_timeout_s: float | None = None,
                       ssl_context: ssl.SSLContext | None = None) -> AgentServer:
    """Serve ``agent`` on ``host``:``port`` (0: an ephemeral port) and start its control-plane link.

    ``advertise_url`` is the address given to the control plane (default: the bound one, with the host name
    for a wildcard host). ``shutdown_timeout_s`` bounds the wait for in-flight requests when stopping
    (default: the agent's request timeout + 5 s). ``ssl_context``: serve HTTPS (``runtime.tls``). Raises
    ``OSError`` when the address cannot be bound."""
    timeout = shutdown_timeout_s if shutdown_timeout_s is not None else agent.request_timeout_s + 5.0
    runner = web.AppRunner(make_app(agent), access_log=None, shutdown_timeout=timeout)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound = runner.addresses[0]
    bhost, bport = str(bound[0]), int(bound[1])
    scheme = "https" if ssl_context is not None else "http"
    url = f"{scheme}://{_url_host(bhost)}:{bport}"
    if advertise_url is None:
        advertise_url = url if bhost not in ("0.0.0.0", "::") else f"{scheme}://{_url_host(socket.gethostname())}:{bport}"
    agent.url = advertise_url
    agent.start_link()
    return AgentServer(agent, runner, url)


class _Handlers:
    """Request handlers; every client mistake becomes an exception the middleware turns into JSON."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.server_meta = server_metadata_body(SERVER_NAME, __version__, EXTENSIONS)
        # metric children survive an app's removal (Prometheus series are never dropped here), so this cache
        # grows only with the (app, device) pairs ever served
        self._ok_series: dict[tuple[str, str], tuple[Any, Any, Any]] = {}

    # -- health and metadata ---------------------------------------------------------------------------

    async def live(self, request: web.Request) -> web.Response:
        return _json({"live": True})

    async def ready(self, request: web.Request) -> web.Response:
        ok = self.agent.ready
        return _json({"ready": ok}, 200 if ok else 503)

    async def server_metadata(self, request: web.Request) -> web.Response:
        return web.Response(body=self.server_meta, content_type="application/json")

    def _route(self, request: web.Request) -> AppRoute:
        # a split app's pieces take the same tensors, so any piece answers for the app's metadata
        route = self.agent.route(request.match_info["app"])
        version = request.match_info.get("version")
        if version is not None and version != MODEL_VERSION:
            raise AgentError(f"model '{route.app}' has no version '{_clip(version)}' (versions: {MODEL_VERSION})", 404)
        return route

    async def model_metadata(self, request: web.Request) -> web.Response:
        route = self._route(request)
        info = route.info
        body = model_metadata_body(route.app, [MODEL_VERSION], "emulated" if info.emulated else "onnxruntime",
                                   info.inputs, info.outputs)
        return web.Response(body=body, content_type="application/json")

    async def model_ready(self, request: web.Request) -> web.Response:
        route = self._route(request)
        ok = self.agent.ready and all(not self.agent.workers[r.device].closed
                                      and r.model in self.agent.backends[r.device].loaded()
                                      for r in self.agent.pieces(route.app))
        return _json({"name": route.app, "ready": ok}, 200 if ok else 503)

    # -- inference -------------------------------------------------------------------------------------

    async def infer(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        agent = self.agent
        if request.match_info["app"] not in agent._apps:
            agent.metrics.unknown_app.inc()
        route = self._route(request)
        device_path = agent.devices[route.device].path
        try:
            wait_s = agent.police(route.app)
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            response, result = await self._infer(request, route)
        except Exception as e:
            status, reason = _rejection(e)
            agent.metrics.requests.labels(route.app, device_path, str(status)).inc()
            if reason is not None:
                agent.metrics.rejections.labels(route.app, reason).inc()
            if status in (429, 503):
                agent.tally.refused(route.app)
            elif status >= 500:
                agent.tally.failed(route.app)
            # other 4xx: the request was malformed, not served badly; it is the client's, not the app's load
            raise
        elapsed_s = time.perf_counter() - started
        ok, latency, queue_wait = self._series(route.app, device_path)
        ok.inc()
        latency.observe(elapsed_s)
        queue_wait.observe(result.queue_ms / 1000.0)
        agent.tally.answered(route.app, elapsed_s * 1000.0)
        agent.tally.served(route.profile or route.model, result.service_ms, result.switch_ms > 0)
        return response

    def _series(self, app: str, device_path: str) -> tuple[Any, Any, Any]:
        """The success counter and the two histograms of (app, device), looked up once: ``labels()`` takes a
        lock and builds a key on every call, a few µs of every request."""
        key = (app, device_path)
        series = self._ok_series.get(key)
        if series is None:
            m = self.agent.metrics
            series = self._ok_series[key] = (m.requests.labels(app, device_path, "200"),
                                             m.latency.labels(app, device_path),
                                             m.queue_wait.labels(app, device_path))
        return series

    async def _infer(self, request: web.Request, route: AppRoute) -> tuple[web.Response, Result]:
        agent = self.agent
        loop = asyncio.get_running_loop()
        body = await _read_body(request, agent.max_body_bytes)
        header_length = request.headers.get(HEADER_LENGTH_HEADER)
        if len(body) > _OFFLOAD_BYTES:
            req = await loop.run_in_executor(None, _decode, body, header_length, agent.max_body_bytes)
        else:
            req = _decode(body, header_length, agent.max_body_bytes)
        validate_request(req, route.app, route.info.inputs, route.info.outputs)
        timeout_s = _timeout_s(req, agent.request_timeout_s)
        try:
            fut = agent.submit(route, {t.name: t.data for t in req.inputs})
        except ModelNotFound:
            raise AgentError(f"app '{route.app}' was removed from device {route.device} while the request "
                             f"arrived", 404) from None
        try:
            result = await _result_within(fut, timeout_s)
        except TimeoutError:
            fut.cancel()  # still queued: the worker drops it; already executing: its result is discarded
            raise AgentError(f"app '{route.app}': no result within {timeout_s:g} s on device "
                             f"{agent.devices[route.device].path} (request timeout)", 504) from None
        params = {"edgemux_device": result.device, "edgemux_emulated": result.emulated,
                  "edgemux_queue_ms": round(result.queue_ms, 3), "edgemux_service_ms": round(result.service_ms, 3),
                  "edgemux_batch_size": result.batch_size}
        out_bytes = sum(np.asarray(a).nbytes for a in result.outputs.values())
        if out_bytes > _OFFLOAD_BYTES:
            payload, headers = await loop.run_in_executor(
                None, lambda: encode_infer_response(route.app, MODEL_VERSION, result.outputs, req, parameters=params))
        else:
            payload, headers = encode_infer_response(route.app, MODEL_VERSION, result.outputs, req, parameters=params)
        return web.Response(body=payload, headers=headers), result

    # -- control ---------------------------------------------------------------------------------------

    async def list_apps(self, request: web.Request) -> web.Response:
        return _json({"node": self.agent.node.name, "apps": [r.as_dict(self.agent.node.name) for r in self.agent.routes()]})

    async def get_app(self, request: web.Request) -> web.Response:
        return _json(self.agent.app_dict(request.match_info["app"]))

    async def put_app(self, request: web.Request) -> web.Response:
        app = request.match_info["app"]
        _check_app_name(app)
        spec = _parse_json(await _read_body(request, CONTROL_MAX_BODY_BYTES), "app spec")
        # a load may build a model and create a session (seconds): keep the event loop serving meanwhile
        route, created = await asyncio.get_running_loop().run_in_executor(None, self.agent.register_app, app, spec)
        return _json(route.as_dict(self.agent.node.name), 201 if created else 200)

    async def delete_app(self, request: web.Request) -> web.Response:
        app = request.match_info["app"]
        self.agent.pieces(app)  # 404 early, without a thread hop
        result = await asyncio.get_running_loop().run_in_executor(None, self.agent.unregister_app, app)
        return _json(result)

    async def put_power(self, request: web.Request) -> web.Response:
        spec = _parse_json(await _read_body(request, CONTROL_MAX_BODY_BYTES), "power spec")
        if not isinstance(spec, dict) or set(spec) != {"state"}:
            raise AgentError('a power spec is {"state": "on"} or {"state": "off"}, got '
                             f"{_clip(json.dumps(spec), 120)}", 400)
        return _json(self.agent.set_power(request.match_info["device"], spec["state"]))

    async def node(self, request: web.Request) -> web.Response:
        body = self.agent.status()
        body.update(url=self.agent.url, incarnation=self.agent.incarnation, version=__version__,
                    controlplane={"url": self.agent.controlplane_url,
                                  "registered": self.agent.link.registered if self.agent.link else False,
                                  "last_error": self.agent.link.last_error if self.agent.link else None})
        return _json(body)

    async def metrics(self, request: web.Request) -> web.Response:
        # text format 0.0.4, which generate_latest writes and every Prometheus understands
        return web.Response(body=self.agent.metrics.render(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


@web.middleware
async def _errors_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """Turn every failure into a JSON error with the right status; an unexpected one is logged and a 500."""
    try:
        return await handler(request)
    except web.HTTPException as e:  # aiohttp's own: no route (404), wrong method (405)...
        if e.status < 400:
            raise
        message = e.reason if e.status != 405 else f"method {request.method} is not allowed on {request.path}"
        if e.status == 404:
            message = f"no such endpoint: {request.method} {_clip(request.path, 120)}"
        headers = {k: v for k, v in e.headers.items() if k.lower() == "allow"}
        return _error(e.status, message, headers)
    except asyncio.CancelledError:
        raise
    except Exception as e:
        status, message, headers = _classify(e)
        if status == 500:  # a bug or a backend failure, never a client's mistake: keep the traceback
            logger.error("error in %s %s: %s", request.method, request.path, message, exc_info=e)
        return _error(status, message, headers)


def _classify(e: BaseException) -> tuple[int, str, dict[str, str]]:
    """(HTTP status, message, extra headers) of an exception raised while handling a request."""
    if isinstance(e, (Overloaded, OverContract)):  # 503 and 429, each with when to come back
        return e.status, e.message, {"Retry-After": str(max(1, math.ceil(e.retry_after_s)))}
    if isinstance(e, (ProtocolError, BackendError, AgentError)):
        return e.status, e.message, {}
    if isinstance(e, EdgemuxError):  # InputError and friends: the request's fault
        return 400, str(e), {}
    if isinstance(e, HttpProcessingError):  # a body the HTTP parser refused (bad chunking, short body)
        return (e.code if 400 <= e.code < 500 else 400), f"malformed HTTP request: {e.message}", {}
    if isinstance(e, ConnectionError):  # the client went away mid-request; nobody reads the answer
        return 400, f"client disconnected: {type(e).__name__}", {}
    return 500, f"internal error: {type(e).__name__}: {e}", {}


def _rejection(e: BaseException) -> tuple[int, str | None]:
    """The status a failed inference gets, and its rejection reason for the metrics (None: a 500)."""
    status = _classify(e)[0]
    if isinstance(e, Overloaded):
        return status, "queue_full"
    if isinstance(e, OverContract):
        return status, "rate_limited"
    if isinstance(e, WorkerClosed):
        return status, "closed"
    reasons = {504: "timeout", 413: "too_large", 404: "not_loaded", 503: "closed"}
    if status in reasons:
        return status, reasons[status]
    if 400 <= status < 500:
        return status, "bad_request"
    return status, None


async def _result_within(fut: concurrent.futures.Future[Result], timeout_s: float) -> Result:
    """The worker's result, awaited on the event loop; ``TimeoutError`` after ``timeout_s`` seconds. A cancelled wait (the client went away) cancels ``fut``, so a queued request is dropped.

    ``asyncio.wait_for(asyncio.wrap_future(fut))`` does the same with two more futures and their chained
    callbacks; on the agent's hot path one waiter and one timer are enough."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def wake(_: concurrent.futures.Future[Result]) -> None:  # on the worker's thread
        try:
            loop.call_soon_threadsafe(_settle, waiter)
        except RuntimeError:  # the loop closed meanwhile: nobody waits any more
            pass

    fut.add_done_callback(wake)
    timer = loop.call_later(timeout_s, _expire, waiter)
    try:
        await waiter
    except asyncio.CancelledError:
        fut.cancel()
        raise
    finally:
        timer.cancel()
    return fut.result()


def _settle(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


def _decode(body: bytes, header_length: str | None, limit: int) -> InferRequest:
    return decode_infer_request(body, header_length, max_body_bytes=limit)


def _timeout_s(req: InferRequest, limit_s: float) -> float:
    """The request's wait bound (s): the agent's, or less when the request's ``timeout`` parameter (µs, as
    tritonclient sends it) asks for less; 0 means "no request-level bound"."""
    raw = req.parameters.get("timeout")
    if raw is None:
        return limit_s
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise ProtocolError(f"request parameter 'timeout' must be a non-negative integer (microseconds), "
                            f"got {short_repr(raw)}")
    return limit_s if raw == 0 else min(limit_s, raw / 1e6)


async def _read_body(request: web.Request, limit: int) -> bytes:
    """The request body, refusing (413) one above ``limit`` bytes (the protocol's message for a declared
    length, so that clients read the same words from every server)."""
    check_content_length(request.headers.get("Content-Length"), limit)
    return await read_body(request, limit, ProtocolError)


def _parse_json(raw: bytes, what: str) -> Any:
    return parse_json(raw, what, AgentError)


def _check_app_name(app: str) -> None:
    if not _APP_NAME_RE.match(app):
        raise AgentError(f"bad app name '{_clip(app)}': use 1 to 128 letters, digits and _ . : + - "
                         f"(starting with a letter or digit)")


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(obj, separators=(",", ":")).encode("utf-8"), status=status,
                        content_type="application/json")


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(body=error_body(message), status=status, content_type="application/json",
                        headers=dict(headers or {}))


def _listing(names: Mapping[str, Any] | list[str]) -> str:
    items = sorted(list(names))
    shown = ", ".join(items[:12]) + (", ..." if len(items) > 12 else "")
    return shown or "none"


def _clip(text: str, limit: int = 60) -> str:
    """A client-sent name cut so that an error message stays one readable line."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _describe(e: BaseException) -> str:
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
