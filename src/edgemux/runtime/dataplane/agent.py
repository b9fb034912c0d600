"""The node agent: the process on a node that owns its devices and executes inference.

Its HTTP API (the Open Inference Protocol data plane, the control API the control plane calls, metrics) and
its contract with the control plane (register, heartbeat, deregister) are described in
docs/reference/http.md ("Agent"); keep that page true when they change.

An :class:`Agent` is made of parts that each own their state:

- :class:`~edgemux.runtime.dataplane.devices.DeviceSet`: the node's devices, each with its backend and its
  :class:`~edgemux.runtime.dataplane.worker.DeviceWorker`, the requests in flight, power and status;
- :class:`~edgemux.runtime.dataplane.pieces.PieceTable`: the apps routed here, one *piece* per device an
  app is routed to (model, profile, weight, contract), models loaded once per (source, profile) and device
  and unloaded when the last app using them is removed; the Open Inference Protocol model name is the app;
- :class:`~edgemux.runtime.dataplane.pieces.Contracts`: each app's token bucket here;
- :class:`~edgemux.runtime.tally.Tally` and :class:`~edgemux.runtime.dataplane.agentmetrics.AgentMetrics`:
  what it observed (sent with every heartbeat) and its Prometheus metrics;
- :class:`~edgemux.runtime.dataplane.link.ControlPlaneLink`: with ``controlplane_url`` set, it registers,
  heartbeats every ``heartbeat_s`` and deregisters on a graceful stop; failures are retried, never fatal;
- :class:`~edgemux.runtime.dataplane.lease.Lease`: each acknowledged heartbeat renews the agent's lease;
  once it lapses (a partition), the agent is *fenced*: its apps are answered 503 until the control plane
  answers again, and then only those it still places here are served (docs/multihost.md).

:func:`make_app` puts it behind HTTP (the server core ``runtime.httpserver``, with the handler pattern and
error table of ``runtime.httputil``);
:func:`start_server` binds it to an address. Graceful stop: :meth:`Agent.close` (``drain=True``) stops
accepting requests and lets the device workers execute what is queued; :func:`make_app` runs it from
the application's ``on_cleanup``, after the server has stopped listening and the in-flight handlers have finished.

Policing and counting happen once per request: a request a gateway forwards carries the gateway's mark
(``runtime.auth.POLICED_HEADER``, believed only with the admin token) and was policed and counted there, so
here it only takes its token (``Contracts.charge``) and its execution is measured (``Tally.served``); a
request that arrives any other way (a client calling the agent directly, with an app key or the admin token)
is policed with the app's bucket here and counted in the agent's observations.

Units: ``*_s`` seconds, ``*_ms`` milliseconds, ``*_bytes`` bytes, ``*_mb`` MB (10**6 bytes).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import math
import os
import socket
import ssl
import threading
import time
import urllib.parse
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgemux import __version__
from edgemux.adapt.police import Policing
from edgemux.cluster.state import Device, Node
from edgemux.errors import InputError
from edgemux.profiles.catalog import Catalog, load_catalog
from edgemux.runtime.auth import POLICED_HEADER, Guard, auth_middleware, inference_need, mark_believed, \
    policed_upstream
from edgemux.runtime.dataplane.agentmetrics import AgentMetrics
from edgemux.runtime.dataplane.backends import Backend
from edgemux.runtime.dataplane.devices import DeviceSet
from edgemux.runtime.dataplane.errors import AgentError, OverContract
from edgemux.runtime.dataplane.lease import DEFAULT_LEASE_HEARTBEATS, Lease, check_lease_s
from edgemux.runtime.dataplane.link import ControlPlaneLink
from edgemux.runtime.dataplane.messages import RUNS_ON_ENV, AgentReport, PieceReport
from edgemux.runtime.dataplane.modelstats import StatsTable
from edgemux.runtime.dataplane.pieces import Contracts, Piece, PieceTable, check_app_name
from edgemux.runtime.dataplane.protocol import (
    HEADER_LENGTH_HEADER,
    InferRequest,
    ProtocolError,
    check_content_length,
    decode_infer_request,
    encode_infer_response,
    model_metadata_body,
    server_metadata_body,
    short_repr,
)
from edgemux.runtime.dataplane.worker import DEFAULT_MAX_QUEUE, Result
from edgemux.runtime.httpserver import Application, Request, Response, Route, delete, get, post, put
from edgemux.runtime.httputil import (
    clip,
    json_response,
    make_application,
    parse_json,
    read_body,
    Site,
    start_site,
)
from edgemux.runtime.dataplane.shmapi import ShmApi
from edgemux.runtime.dataplane.requestpath import ERRORS, MODEL_VERSION, RequestPath, raw_request, result_within
from edgemux.runtime.dataplane.shm import DEFAULT_LIMIT_BYTES as DEFAULT_SHM_LIMIT_BYTES
from edgemux.runtime.dataplane.shm import (
    FORWARDED_PRINCIPAL,
    GATEWAY_PRINCIPAL,
    PASSED_ON_HEADER,
    RegionTable,
    principal,
)
from edgemux.runtime.tally import Tally

if TYPE_CHECKING:
    from edgemux.runtime.grpcserver import GrpcSite

__all__ = [
    "Agent",
    "AgentError",
    "AgentServer",
    "DEFAULT_MAX_BODY_BYTES",
    "OverContract",
    "Piece",
    "SERVER_NAME",
    "make_app",
    "result_within",
    "start_server",
]

logger = logging.getLogger("edgemux.agent")

SERVER_NAME = "edgemux-agent"
EXTENSIONS = ("binary_tensor_data", "statistics", "system_shared_memory")  # the repository index alone: no load/unload, so not advertised
DEFAULT_MAX_BODY_BYTES = 16 * 10**6   # 16 MB: a 1080p RGB FP32 frame is ~25 MB, edge models take far less
CONTROL_MAX_BODY_BYTES = 10**6        # control bodies are a few hundred bytes
DEFAULT_REQUEST_TIMEOUT_S = 30.0
DEFAULT_HEARTBEAT_S = 5.0
DEFAULT_UNLOAD_DRAIN_S = 10.0
# Bodies and outputs above this size are decoded/encoded on a thread: parsing megabytes of JSON on the event
# loop would stall every other request (health checks included) for tens of milliseconds.
_OFFLOAD_BYTES = 1 << 20


class Agent:
    """The devices of one node, their workers and the apps routed to them (see the module docstring).

    ``backends`` maps device names to a :class:`Backend` or a ``make_backend`` kind (``onnxruntime``,
    ``emulated``, ``cuda``); the others get ``devices.default_backend`` (``threads`` intra-op threads per
    onnxruntime session, emulation seeded with ``seed`` + the device's index). ``max_queue`` bounds each
    device's waiting requests (an int for every device, or a mapping by device name). ``request_timeout_s``
    bounds the wait for a result (504 beyond); ``max_body_bytes`` an inference body (413 above);
    ``cache_dir`` is where zoo models are built; ``unload_drain_s`` how long removing an app waits for its
    in-flight requests before unloading its model. ``controlplane_url`` and ``heartbeat_s`` (s) set up the
    contract of docs/reference/http.md once :meth:`start_link` is called (``start_server`` does);
    ``lease_s`` (s) is the lease it asks the control plane for (``dataplane.lease``: fenced when no
    heartbeat was acknowledged for longer; default ``DEFAULT_LEASE_HEARTBEATS`` x ``heartbeat_s``; 0: never
    fenced).
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
        shm_limit_bytes: int = DEFAULT_SHM_LIMIT_BYTES,
        lease_s: float | None = None,
    ) -> None:
        if not (isinstance(request_timeout_s, (int, float)) and request_timeout_s > 0
                and math.isfinite(request_timeout_s)):
            raise InputError("request_timeout_s", f"must be a finite number > 0 s, got {request_timeout_s!r}")
        if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes < 1:
            raise InputError("max_body_bytes", f"must be a positive int, got {max_body_bytes!r}")
        if not (isinstance(heartbeat_s, (int, float)) and heartbeat_s > 0 and math.isfinite(heartbeat_s)):
            raise InputError("heartbeat_s", f"must be a finite number > 0 s, got {heartbeat_s!r}")
        if lease_s is None:
            lease_s = DEFAULT_LEASE_HEARTBEATS * float(heartbeat_s)
        why = check_lease_s(lease_s, float(heartbeat_s))
        if why is not None:
            raise InputError("lease_s", why)
        if controlplane_url is not None:
            parsed = urllib.parse.urlsplit(controlplane_url)
            if parsed.scheme not in ("http", "https") or not parsed.netloc:
                raise InputError("controlplane_url", f"expected http://HOST:PORT, got {controlplane_url!r}")
        self.node = node
        self.token = token
        self.request_timeout_s = float(request_timeout_s)
        self.max_body_bytes = max_body_bytes
        self.controlplane_url = controlplane_url.rstrip("/") if controlplane_url else None
        self.heartbeat_s = float(heartbeat_s)
        self.lease = Lease(float(lease_s))  # granted by the control plane's answers (never without one)
        self.incarnation = uuid.uuid4().hex
        # where this process runs, for every registration: what the engine that started it says (the Ray
        # engine names the Ray node), else this host's name
        self.runs_on = os.environ.get(RUNS_ON_ENV) or socket.gethostname()
        # what this process saw of its apps and profiles, cumulative: sent with every heartbeat (adapt reads it)
        self.tally = Tally(self.incarnation)
        self.started_at = time.time()
        self.url: str | None = None  # where clients reach this agent; set by start_server
        self.link: ControlPlaneLink | None = None
        self._closing = False
        self._closed = False
        self._close_lock = threading.Lock()

        self.device_set = DeviceSet(node, backends, threads=threads, seed=seed, max_queue=max_queue)
        self.devices: dict[str, Device] = self.device_set.devices
        self.backends: dict[str, Backend] = self.device_set.backends
        self.workers = self.device_set.workers
        self.contracts = Contracts(policing)
        self.table = PieceTable(node, self.device_set, self.contracts,
                                catalog=catalog if catalog is not None else load_catalog(), cache_dir=cache_dir,
                                model_dirs=None if model_dirs is None else tuple(Path(d).resolve() for d in model_dirs),
                                unload_drain_s=float(unload_drain_s))
        self.guard = Guard(token, self.table.key_of, self.table.key_owner, app_keys=app_keys)
        self.stats = StatsTable()  # Triton's statistics extension, per app
        self.regions = RegionTable(shm_limit_bytes)  # Triton's system shared memory extension, per credential
        self.metrics = AgentMetrics(self.workers)
        self.metrics.watch_lease(self.lease)

    # -- the apps (PieceTable) -------------------------------------------------------------------------

    def next_piece(self, app: str) -> Piece:
        """The piece of ``app`` the next request goes to (smooth weighted round robin over its pieces);
        ``AgentError`` 404 naming the known apps otherwise."""
        return self.table.next_piece(app)

    def pieces(self, app: str) -> tuple[Piece, ...]:
        """Every piece of ``app``, by device name; ``AgentError`` 404 naming the known apps otherwise."""
        return self.table.pieces(app)

    def all_pieces(self) -> list[Piece]:
        """Every piece of every app, by app and device name."""
        return self.table.all_pieces()

    def app_dict(self, app: str) -> dict[str, Any]:
        """``GET /v1/apps/{app}``: the piece's fields, or for a split app its pieces under ``pieces``."""
        return self.table.app_dict(app)

    def register_app(self, app: str, spec: Any) -> tuple[Piece, bool]:
        """Route ``app`` per ``spec`` (the parsed ``PUT /v1/apps/{app}`` body): ``PieceTable.register``.
        Blocking (a load may take seconds): the HTTP layer calls it on a thread. A control-plane PUT places
        the app here: it is no longer fenced as an app the control plane moved away (``Lease.placed``)."""
        at = self.lease.clock()  # when the control plane decided it, not when the load ended
        result = self.table.register(app, spec)
        self.lease.placed(app, at)
        return result

    def unregister_app(self, app: str) -> dict[str, Any]:
        """Unroute ``app`` (``PieceTable.unregister``) and unmap the shared-memory regions its key registered;
        ``AgentError`` 404 if unknown."""
        result = self.table.unregister(app)
        self.regions.release(app)
        self.lease.removed(app)
        return result

    def device(self, name: str) -> Device:
        """The device ``name`` (or ``node/name``); ``AgentError`` 404 listing the devices otherwise."""
        return self.device_set.device(name)

    # -- inference -------------------------------------------------------------------------------------

    def submit(self, piece: Piece, inputs: Mapping[str, np.ndarray]) -> concurrent.futures.Future[Result]:
        """Queue one request of ``piece`` on its device worker (raises at once: ``Overloaded``,
        ``InvalidInput``, ``WorkerClosed``, ``ModelNotFound`` when the app was removed meanwhile)."""
        return self.device_set.submit(piece.device, piece.app, piece.model, inputs)

    # -- status ----------------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """True while every device worker runs (none closed) and the agent is not stopping."""
        return not self._closing and self.device_set.running

    def set_power(self, device: str, state: str) -> dict[str, Any]:
        """``PUT /v1/devices/{device}/power`` (``DeviceSet.set_power``)."""
        return self.device_set.set_power(device, state)

    def status(self) -> dict[str, Any]:
        """``GET /v1/node``: the node and each device's backend, loaded models, queue and utilization."""
        return {"node": self.node.name, "cpu_cores": self.node.cpu_cores, "memory_mb": self.node.memory_mb,
                "ready": self.ready, "devices": self.device_set.status(self.all_pieces())}

    def registration(self) -> AgentReport:
        """The register/heartbeat message to the control plane (see the module docstring)."""
        status = self.status()
        return AgentReport(
            self.node.name, self.url or "", self.incarnation, self.heartbeat_s, __version__,
            {d["name"]: d for d in status.pop("devices")},
            tuple(PieceReport.from_json(r.as_dict(self.node.name)) for r in self.all_pieces()),
            {**{k: v for k, v in status.items() if k != "node"}, "started_at": self.started_at, "time": time.time()},
            self.tally.observations(), self.runs_on, self.lease.lease_s)

    # -- lifecycle -------------------------------------------------------------------------------------

    def start_link(self) -> ControlPlaneLink | None:
        """Start registering and heartbeating with the control plane (needs a running event loop and
        ``url``); None without ``controlplane_url``. Idempotent."""
        if self.controlplane_url is None:
            return None
        if self.link is None:
            self.link = ControlPlaneLink(self.node.name, self.registration, self.controlplane_url,
                                         heartbeat_s=self.heartbeat_s, token=self.token,
                                         on_answer=self._answered, clock=lambda: self.lease.clock())
            self.link.start()
        return self.link

    def _answered(self, sent_at: float, answer: Any) -> None:
        """The control plane acknowledged a register/heartbeat sent at ``sent_at``: renew the lease."""
        self.lease.acknowledged(sent_at, answer, {p.app for p in self.all_pieces()})

    def close(self, drain: bool = True, timeout_s: float = 30.0) -> bool:
        """Stop accepting requests and stop the device workers: ``drain=True`` executes what is queued
        first. True when every worker ended within ``timeout_s`` (s, shared by all). Idempotent."""
        self._closing = True
        self.table.close()
        with self._close_lock:
            if self._closed:
                return True
            self._closed = True
        ended = self.device_set.close(drain=drain, timeout_s=timeout_s)
        self.regions.close()
        return ended

    async def aclose(self, drain: bool = True, timeout_s: float = 30.0) -> bool:
        """``close`` from the event loop: stop the control-plane link (deregistering), then drain the workers
        on a thread so that the loop keeps answering meanwhile."""
        self._closing = True  # readiness turns false at once, and registrations are refused
        self.table.close()
        if self.link is not None:
            await self.link.stop(deregister=True)
        return await asyncio.get_running_loop().run_in_executor(None, self.close, drain, timeout_s)


# ------------------------------------------------------------------------------------------------- HTTP


def make_app(agent: Agent) -> Application:
    """The application of ``agent`` (routes in docs/reference/http.md; ``runtime.httputil.start_site`` serves
    it). Its ``on_cleanup`` stops the control-plane link and drains the agent's workers."""
    app = make_application(_Handlers(agent).routes(), ERRORS, auth=auth_middleware(agent.guard, inference_need))

    async def _cleanup() -> None:
        await agent.aclose(drain=True)

    app.on_cleanup.append(_cleanup)
    return app


@dataclass
class AgentServer:
    """A running agent server: ``url`` is the bound address (``http://HOST:PORT``); ``grpc`` its gRPC listener
    when it has one (``grpc.address`` is ``HOST:PORT``). ``stop`` stops listening, lets in-flight requests
    finish and drains the agent (its ``on_cleanup``)."""

    agent: Agent
    site: Site
    url: str
    grpc: GrpcSite | None = None

    async def stop(self) -> None:
        if self.grpc is not None:
            await self.grpc.stop(self.agent.request_timeout_s + 5.0)
        await self.site.stop()


async def start_server(agent: Agent, host: str = "127.0.0.1", port: int = 0, *, advertise_url: str | None = None,
                       shutdown_timeout_s: float | None = None,
                       ssl_context: ssl.SSLContext | None = None, grpc_port: int | None = None,
                       tls_files: tuple[str, str] | None = None) -> AgentServer:
    """Serve ``agent`` on ``host``:``port`` (0: an ephemeral port) and start its control-plane link.

    ``advertise_url`` is the address given to the control plane (default: the bound one, with the host name
    for a wildcard host). ``shutdown_timeout_s`` bounds the wait for in-flight requests when stopping
    (default: the agent's request timeout + 5 s). ``ssl_context``: serve HTTPS (``runtime.tls``).
    ``grpc_port``: serve the Open Inference Protocol over gRPC too, on this port of ``host`` (0: ephemeral;
    None: no gRPC), over TLS when ``tls_files`` (certificate file, key file) are given. Raises ``OSError``
    when an address cannot be bound."""
    timeout = shutdown_timeout_s if shutdown_timeout_s is not None else agent.request_timeout_s + 5.0
    site = await start_site(make_app(agent), host, port, ssl_context=ssl_context, shutdown_timeout_s=timeout)
    grpc_site = None
    if grpc_port is not None:
        from edgemux.runtime.dataplane.grpcservice import start_agent_grpc  # grpcio: only for a gRPC listener

        try:
            grpc_site = await start_agent_grpc(agent, host, grpc_port, extensions=EXTENSIONS,
                                               server_name=SERVER_NAME, tls=tls_files)
        except BaseException:
            await site.stop()
            raise
    agent.url = advertise_url if advertise_url is not None else site.public_url
    agent.start_link()
    return AgentServer(agent, site, site.url, grpc_site)


class _Handlers:
    """The agent's request handlers (``runtime.httputil``'s pattern): each failure is an exception that the
    error table answers."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.path = RequestPath(agent)
        self.server_meta = server_metadata_body(SERVER_NAME, __version__, EXTENSIONS)

    def routes(self) -> list[Route]:
        """The route table (docs/reference/http.md, "Agent")."""
        table = [get("/v2/health/live", self.live), get("/v2/health/ready", self.ready),
                 get("/v2", self.server_metadata)]
        table += [get("/v2/models/stats", self.all_stats), post("/v2/repository/index", self.repository_index)]
        table += ShmApi(self.agent.regions, self.agent.guard).routes()
        for base in ("/v2/models/{app}", "/v2/models/{app}/versions/{version}"):
            table += [get(base, self.model_metadata), get(base + "/ready", self.model_ready),
                      post(base + "/infer", self.infer), get(base + "/stats", self.app_stats)]
        return table + [
            get("/v1/apps", self.list_apps),
            get("/v1/apps/{app}", self.get_app),
            put("/v1/apps/{app}", self.put_app),
            delete("/v1/apps/{app}", self.delete_app),
            get("/v1/node", self.node),
            put("/v1/devices/{device}/power", self.put_power),
            get("/metrics", self.metrics),
        ]

    # -- health and metadata ---------------------------------------------------------------------------

    async def live(self, request: Request) -> Response:
        return json_response({"live": True})

    async def ready(self, request: Request) -> Response:
        ok = self.agent.ready
        return json_response({"ready": ok}, 200 if ok else 503)

    async def server_metadata(self, request: Request) -> Response:
        return Response(body=self.server_meta, content_type="application/json")

    def _piece(self, request: Request) -> Piece:
        return self.path.piece(request.match_info["app"], request.match_info.get("version"))

    async def model_metadata(self, request: Request) -> Response:
        piece = self._piece(request)
        served = piece.interface  # the app's interface when it has one, else the variant's own tensors
        body = model_metadata_body(piece.app, [MODEL_VERSION], piece.info.platform, served.inputs, served.outputs,
                                   {n: {"quantization": q.as_dict()} for n, q in served.quantization})
        return Response(body=body, content_type="application/json")

    async def app_stats(self, request: Request) -> Response:
        """``GET /v2/models/{app}/stats``: Triton's statistics extension for one app."""
        piece = self._piece(request)
        return json_response(self.agent.stats.view([piece.app], MODEL_VERSION))

    async def all_stats(self, request: Request) -> Response:
        """``GET /v2/models/stats``: every app served here (the admin token's)."""
        apps = sorted({p.app for p in self.agent.all_pieces()})
        return json_response(self.agent.stats.view(apps, MODEL_VERSION))

    async def repository_index(self, request: Request) -> Response:
        """``POST /v2/repository/index`` (Triton's model repository extension, read-only): the apps served here
        as models, each ``READY`` when its model is loaded and its devices run, else ``UNAVAILABLE`` with the
        reason; a body ``{"ready": true}`` lists the ready ones only."""
        raw = await _read_body(request, CONTROL_MAX_BODY_BYTES)
        doc = _parse_json(raw, "repository index request") if raw.strip() else {}
        if not isinstance(doc, dict) or not set(doc) <= {"ready"} or not isinstance(doc.get("ready", False), bool):
            raise AgentError(f"repository index request: expected {{}} or {{\"ready\": true|false}}, got {short_repr(doc)}")
        return json_response(self.path.index(bool(doc.get("ready"))))

    def _owner(self, request: Request) -> str:
        """Whose regions an inference request may use: its credential's, or a gateway's passing its caller's
        slots on."""
        credential = request.headers.get("Authorization")
        if POLICED_HEADER in request.headers and mark_believed(True, credential, self.agent.guard):
            # a gateway's: its own shared-memory pass-through, or a caller's body forwarded as it came
            return GATEWAY_PRINCIPAL if PASSED_ON_HEADER in request.headers else FORWARDED_PRINCIPAL
        return principal(self.agent.guard, credential)

    async def model_ready(self, request: Request) -> Response:
        piece = self._piece(request)
        ok = not self.path.not_serving(piece.app)
        return json_response({"name": piece.app, "ready": ok}, 200 if ok else 503)

    # -- inference -------------------------------------------------------------------------------------

    async def infer(self, request: Request) -> Response:
        """``POST /v2/models/{app}/infer``: the agent's request path (``requestpath.RequestPath.serve``),
        decoding the body and encoding the answer as HTTP does."""
        # policed and counted at a gateway: here it only takes its token, and only its execution is measured
        upstream = policed_upstream(request, self.agent.guard)

        async def decode(piece: Piece) -> tuple[InferRequest, float]:
            limit = self.agent.max_body_bytes
            body = await _read_body(request, limit)
            t_in = time.perf_counter()
            header_length = request.headers.get(HEADER_LENGTH_HEADER)
            if header_length is not None and header_length.strip() == "0":
                return raw_request(body, piece), t_in  # the binary extension's header-less request
            if len(body) > _OFFLOAD_BYTES:
                return await asyncio.get_running_loop().run_in_executor(
                    None, lambda: decode_infer_request(body, header_length, max_body_bytes=limit)), t_in
            return decode_infer_request(body, header_length, max_body_bytes=limit), t_in

        return await self.path.serve(request.match_info["app"], request.match_info.get("version"), upstream,
                                     decode, _encode, lambda: self._owner(request))

    # -- control ---------------------------------------------------------------------------------------

    async def list_apps(self, request: Request) -> Response:
        node = self.agent.node.name
        return json_response({"node": node, "apps": [r.as_dict(node) for r in self.agent.all_pieces()]})

    async def get_app(self, request: Request) -> Response:
        return json_response(self.agent.app_dict(request.match_info["app"]))

    async def put_app(self, request: Request) -> Response:
        app = request.match_info["app"]
        check_app_name(app)
        spec = _parse_json(await _read_body(request, CONTROL_MAX_BODY_BYTES), "app spec")
        # a load may build a model and create a session (seconds): keep the event loop serving meanwhile
        piece, created = await asyncio.get_running_loop().run_in_executor(None, self.agent.register_app, app, spec)
        return json_response(piece.as_dict(self.agent.node.name), 201 if created else 200)

    async def delete_app(self, request: Request) -> Response:
        app = request.match_info["app"]
        self.agent.pieces(app)  # 404 early, without a thread hop
        result = await asyncio.get_running_loop().run_in_executor(None, self.agent.unregister_app, app)
        self.agent.stats.forget(app)  # an app created again under this name counts afresh
        return json_response(result)

    async def put_power(self, request: Request) -> Response:
        spec = _parse_json(await _read_body(request, CONTROL_MAX_BODY_BYTES), "power spec")
        if not isinstance(spec, dict) or set(spec) != {"state"}:
            raise AgentError('a power spec is {"state": "on"} or {"state": "off"}, got '
                             f"{clip(json.dumps(spec), 120)}", 400)
        return json_response(self.agent.set_power(request.match_info["device"], spec["state"]))

    async def node(self, request: Request) -> Response:
        agent = self.agent
        body = agent.status()
        body.update(url=agent.url, incarnation=agent.incarnation, version=__version__,
                    controlplane={"url": agent.controlplane_url,
                                  "registered": agent.link.registered if agent.link else False,
                                  "last_error": agent.link.last_error if agent.link else None,
                                  "lease": agent.lease.to_json()})
        return json_response(body)

    async def metrics(self, request: Request) -> Response:
        # text format 0.0.4, which generate_latest writes and every Prometheus understands
        return Response(body=self.agent.metrics.render(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


async def _encode(piece: Piece, req: InferRequest, outputs: Mapping[str, np.ndarray],
                  params: dict[str, Any]) -> Response:
    """The answer's HTTP body (JSON, and binary tensors where the request asked): big outputs encoded on a
    thread, off the event loop."""
    out_bytes = sum(np.asarray(a).nbytes for a in outputs.values())
    if out_bytes > _OFFLOAD_BYTES:
        payload, headers = await asyncio.get_running_loop().run_in_executor(
            None, lambda: encode_infer_response(piece.app, MODEL_VERSION, outputs, req, parameters=params))
    else:
        payload, headers = encode_infer_response(piece.app, MODEL_VERSION, outputs, req, parameters=params)
    return Response(body=payload, headers=headers)


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing (413) one above ``limit`` bytes (the protocol's message for a declared
    length, so that clients read the same words from every server)."""
    check_content_length(request.headers.get("Content-Length"), limit)
    return await read_body(request, limit, ProtocolError)


def _parse_json(raw: bytes, what: str) -> Any:
    return parse_json(raw, what, AgentError)
