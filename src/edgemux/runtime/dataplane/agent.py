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
  heartbeats every ``heartbeat_s`` and deregisters on a graceful stop; failures are retried, never fatal.

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
from typing import Any

import numpy as np

from edgemux import __version__
from edgemux.adapt.police import Policing
from edgemux.cluster.state import Device, Node
from edgemux.errors import EdgemuxError, InputError
from edgemux.profiles.catalog import Catalog, load_catalog
from edgemux.runtime.auth import Guard, auth_middleware, inference_need, policed_upstream
from edgemux.runtime.dataplane.agentmetrics import AgentMetrics
from edgemux.runtime.dataplane.backends import Backend, BackendError, ModelNotFound
from edgemux.runtime.dataplane.devices import DeviceSet
from edgemux.runtime.dataplane.errors import AgentError, OverContract
from edgemux.runtime.dataplane.link import ControlPlaneLink
from edgemux.runtime.dataplane.messages import RUNS_ON_ENV, AgentReport, PieceReport
from edgemux.runtime.dataplane.modelstats import StatsTable
from edgemux.runtime.dataplane.pieces import Contracts, Piece, PieceTable, check_app_name
from edgemux.runtime.dataplane.protocol import (
    DATATYPES,
    HEADER_LENGTH_HEADER,
    InferRequest,
    InputTensor,
    ProtocolError,
    check_content_length,
    decode_infer_request,
    encode_infer_response,
    model_metadata_body,
    server_metadata_body,
    short_repr,
    validate_request,
)
from edgemux.runtime.dataplane.worker import DEFAULT_MAX_QUEUE, Overloaded, Result, WorkerClosed
from edgemux.runtime.httpserver import Application, Request, Response, Route, delete, get, post, put
from edgemux.runtime.httputil import (
    Answer,
    ErrorTable,
    clip,
    json_response,
    make_application,
    parse_json,
    read_body,
    retry_after_header,
    Site,
    start_site,
)
from edgemux.runtime.tally import Tally

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
MODEL_VERSION = "1"  # one version per app: re-registering an app replaces its model in place
EXTENSIONS = ("binary_tensor_data", "statistics")  # the repository index alone: no load/unload, so not advertised
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
        self.request_timeout_s = float(request_timeout_s)
        self.max_body_bytes = max_body_bytes
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
        self.metrics = AgentMetrics(self.workers)

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
        Blocking (a load may take seconds): the HTTP layer calls it on a thread."""
        return self.table.register(app, spec)

    def unregister_app(self, app: str) -> dict[str, Any]:
        """Unroute ``app`` (``PieceTable.unregister``); ``AgentError`` 404 if unknown."""
        return self.table.unregister(app)

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
            self.tally.observations(), self.runs_on)

    # -- lifecycle -------------------------------------------------------------------------------------

    def start_link(self) -> ControlPlaneLink | None:
        """Start registering and heartbeating with the control plane (needs a running event loop and
        ``url``); None without ``controlplane_url``. Idempotent."""
        if self.controlplane_url is None:
            return None
        if self.link is None:
            self.link = ControlPlaneLink(self.node.name, self.registration, self.controlplane_url,
                                         heartbeat_s=self.heartbeat_s, token=self.token)
            self.link.start()
        return self.link

    def close(self, drain: bool = True, timeout_s: float = 30.0) -> bool:
        """Stop accepting requests and stop the device workers: ``drain=True`` executes what is queued
        first. True when every worker ended within ``timeout_s`` (s, shared by all). Idempotent."""
        self._closing = True
        self.table.close()
        with self._close_lock:
            if self._closed:
                return True
            self._closed = True
        return self.device_set.close(drain=drain, timeout_s=timeout_s)

    async def aclose(self, drain: bool = True, timeout_s: float = 30.0) -> bool:
        """``close`` from the event loop: stop the control-plane link (deregistering), then drain the workers
        on a thread so that the loop keeps answering meanwhile."""
        self._closing = True  # readiness turns false at once, and registrations are refused
        self.table.close()
        if self.link is not None:
            await self.link.stop(deregister=True)
        return await asyncio.get_running_loop().run_in_executor(None, self.close, drain, timeout_s)


# ------------------------------------------------------------------------------------------------- HTTP


# The agent's errors as answers (runtime.httputil.ErrorTable: the first matching row wins): a full queue
# (503) and policing (429) say when to come back.
ERRORS = ErrorTable((
    ((Overloaded, OverContract), lambda e: Answer(e.status, e.message,
                                                  headers={"Retry-After": retry_after_header(e.retry_after_s)})),
    ((ProtocolError, BackendError, AgentError), lambda e: Answer(e.status, e.message)),
    (EdgemuxError, lambda e: Answer(400, str(e))),  # InputError and friends: the request's fault
), logger)


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
    """A running agent server: ``url`` is the bound address (``http://HOST:PORT``). ``stop`` stops
    listening, lets in-flight requests finish and drains the agent (its ``on_cleanup``)."""

    agent: Agent
    site: Site
    url: str

    async def stop(self) -> None:
        await self.site.stop()


async def start_server(agent: Agent, host: str = "127.0.0.1", port: int = 0, *, advertise_url: str | None = None,
                       shutdown_timeout_s: float | None = None,
                       ssl_context: ssl.SSLContext | None = None) -> AgentServer:
    """Serve ``agent`` on ``host``:``port`` (0: an ephemeral port) and start its control-plane link.

    ``advertise_url`` is the address given to the control plane (default: the bound one, with the host name
    for a wildcard host). ``shutdown_timeout_s`` bounds the wait for in-flight requests when stopping
    (default: the agent's request timeout + 5 s). ``ssl_context``: serve HTTPS (``runtime.tls``). Raises
    ``OSError`` when the address cannot be bound."""
    timeout = shutdown_timeout_s if shutdown_timeout_s is not None else agent.request_timeout_s + 5.0
    site = await start_site(make_app(agent), host, port, ssl_context=ssl_context, shutdown_timeout_s=timeout)
    agent.url = advertise_url if advertise_url is not None else site.public_url
    agent.start_link()
    return AgentServer(agent, site, site.url)


class _Handlers:
    """The agent's request handlers (``runtime.httputil``'s pattern): each failure is an exception that the
    error table answers."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.server_meta = server_metadata_body(SERVER_NAME, __version__, EXTENSIONS)

    def routes(self) -> list[Route]:
        """The route table (docs/reference/http.md, "Agent")."""
        table = [get("/v2/health/live", self.live), get("/v2/health/ready", self.ready),
                 get("/v2", self.server_metadata)]
        table += [get("/v2/models/stats", self.all_stats), post("/v2/repository/index", self.repository_index)]
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
        # a split app's pieces take the same tensors, so any piece answers for the app's metadata
        piece = self.agent.next_piece(request.match_info["app"])
        version = request.match_info.get("version")
        if version is not None and version != MODEL_VERSION:
            raise AgentError(f"model '{piece.app}' has no version '{clip(version)}' (versions: {MODEL_VERSION})", 404)
        return piece

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
        agent = self.agent
        out = []
        for app in sorted({p.app for p in agent.all_pieces()}):
            why = self._not_serving(app)
            if doc.get("ready") and why:
                continue
            out.append({"name": app, "version": MODEL_VERSION, "state": "UNAVAILABLE" if why else "READY",
                        "reason": why})
        return json_response(out)

    def _not_serving(self, app: str) -> str:
        """Why ``app`` is not served here now ("" when it is: the agent is ready, and every piece's model is
        loaded on a device that runs)."""
        agent = self.agent
        if not agent.ready:
            return "agent not ready"
        down = [r.device for r in agent.pieces(app)
                if agent.workers[r.device].closed or r.model not in agent.backends[r.device].loaded()]
        return f"device {down[0]} does not serve it" if down else ""

    async def model_ready(self, request: Request) -> Response:
        piece = self._piece(request)
        ok = not self._not_serving(piece.app)
        return json_response({"name": piece.app, "ready": ok}, 200 if ok else 503)

    # -- inference -------------------------------------------------------------------------------------

    async def infer(self, request: Request) -> Response:
        """``POST /v2/models/{app}/infer``: police (unless a gateway did), run, answer, count (see the module
        docstring)."""
        started = time.perf_counter()
        agent = self.agent
        if request.match_info["app"] not in agent.table:
            agent.metrics.unknown_app.inc()
        piece = self._piece(request)
        device_path = agent.devices[piece.device].path
        # policed and counted at a gateway: here it only takes its token, and only its execution is measured
        upstream = policed_upstream(request, agent.guard)
        try:
            if upstream:
                agent.contracts.charge(piece.app)
            else:
                wait_s = agent.contracts.police(piece.app)
                if wait_s > 0:
                    await asyncio.sleep(wait_s)
            response, result, input_ms, output_ms = await self._infer(request, piece)
        except Exception as e:
            agent.stats.failed(piece.app, (time.perf_counter() - started) * 1000.0)
            status, reason = _rejection(e)
            agent.metrics.requests.labels(piece.app, device_path, str(status)).inc()
            if reason is not None:
                agent.metrics.rejections.labels(piece.app, reason).inc()
            if not upstream:
                if status in (429, 503):
                    agent.tally.refused(piece.app)
                elif status >= 500:
                    agent.tally.failed(piece.app)
                # other 4xx: the request was malformed, not served badly; it is the client's, not the app's load
            raise
        elapsed_s = time.perf_counter() - started
        agent.stats.succeeded(piece.app, result.batch_size, elapsed_s * 1000.0, input_ms, result.queue_ms,
                              result.service_ms, output_ms)
        ok, latency, queue_wait = agent.metrics.served(piece.app, device_path)
        ok.inc()
        latency.observe(elapsed_s)
        queue_wait.observe(result.queue_ms / 1000.0)
        if not upstream:
            agent.tally.answered(piece.app, elapsed_s * 1000.0)
        agent.tally.served(piece.profile or piece.model, result.service_ms, result.switch_ms > 0)
        return response

    async def _infer(self, request: Request, piece: Piece) -> tuple[Response, Result, float, float]:
        """Run one request on ``piece``: (the answer, the worker's result, ms spent decoding and converting the
        request, ms spent converting and encoding the answer)."""
        agent = self.agent
        loop = asyncio.get_running_loop()
        body = await _read_body(request, agent.max_body_bytes)
        t_in = time.perf_counter()
        header_length = request.headers.get(HEADER_LENGTH_HEADER)
        if header_length is not None and header_length.strip() == "0":
            req = _raw_request(body, piece)  # the binary extension's header-less request: one input, raw bytes
        elif len(body) > _OFFLOAD_BYTES:
            req = await loop.run_in_executor(None, _decode, body, header_length, agent.max_body_bytes)
        else:
            req = _decode(body, header_length, agent.max_body_bytes)
        for moved in (False, True):
            converter = piece.converter
            served = piece.info if converter is None else converter.interface
            validate_request(req, piece.app, served.inputs, served.outputs)
            timeout_s = _timeout_s(req, agent.request_timeout_s)  # after the inputs: their errors come first
            arrays = {t.name: t.data for t in req.inputs}
            if converter is not None and not converter.identity:  # resizing a picture takes ms: off the loop
                arrays = await loop.run_in_executor(None, converter.inputs, arrays)
            try:
                t_submit = time.perf_counter()
                fut = agent.submit(piece, arrays)
                break
            except ModelNotFound:
                # the app moved off this piece between its pick and now (a re-PUT elsewhere released it): make
                # before break means its new piece is in place, so the request goes there, once
                if moved or piece.app not in agent.table:
                    raise AgentError(f"app '{piece.app}' was removed from device {piece.device} while the "
                                     f"request arrived", 404) from None
                piece = agent.next_piece(piece.app)
        try:
            result = await result_within(fut, timeout_s)
        except TimeoutError:
            fut.cancel()  # still queued: the worker drops it; already executing: its result is discarded
            raise AgentError(f"app '{piece.app}': no result within {timeout_s:g} s on device "
                             f"{agent.devices[piece.device].path} (request timeout)", 504) from None
        t_out = time.perf_counter()
        params = {"edgemux_device": result.device, "edgemux_emulated": result.emulated,
                  "edgemux_queue_ms": round(result.queue_ms, 3), "edgemux_service_ms": round(result.service_ms, 3),
                  "edgemux_batch_size": result.batch_size}
        outputs = (result.outputs if converter is None or converter.identity
                   else await loop.run_in_executor(None, converter.outputs, result.outputs))
        out_bytes = sum(np.asarray(a).nbytes for a in outputs.values())
        if out_bytes > _OFFLOAD_BYTES:
            payload, headers = await loop.run_in_executor(
                None, lambda: encode_infer_response(piece.app, MODEL_VERSION, outputs, req, parameters=params))
        else:
            payload, headers = encode_infer_response(piece.app, MODEL_VERSION, outputs, req, parameters=params)
        return (Response(body=payload, headers=headers), result, (t_submit - t_in) * 1000.0,
                (time.perf_counter() - t_out) * 1000.0)

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
                                  "last_error": agent.link.last_error if agent.link else None})
        return json_response(body)

    async def metrics(self, request: Request) -> Response:
        # text format 0.0.4, which generate_latest writes and every Prometheus understands
        return Response(body=self.agent.metrics.render(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


def _rejection(e: BaseException) -> tuple[int, str | None]:
    """The status a failed inference gets, and its rejection reason for the metrics (None: a 500)."""
    status = ERRORS.answer(e).status
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


async def result_within(fut: concurrent.futures.Future[Result], timeout_s: float) -> Result:
    """The worker's result, awaited on the event loop; ``TimeoutError`` after ``timeout_s`` seconds. A
    cancelled wait (the client went away) cancels ``fut``, so a queued request is dropped.

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


def _raw_request(body: bytes, piece: Piece) -> InferRequest:
    """A raw binary request (``Inference-Header-Content-Length: 0``: the body is the bytes of the app's one
    input, no JSON): its input from the app's served tensors, a variable leading dimension deduced from the
    body's size, every output asked for as binary. ``AgentError`` 400 naming what was expected and what came."""
    inputs = piece.interface.inputs
    app = piece.app
    if len(inputs) != 1:
        raise AgentError(f"a raw binary request (Inference-Header-Content-Length: 0) needs a model with one input; "
                         f"app '{app}' takes {len(inputs)} ({', '.join(t.name for t in inputs)})")
    (spec,) = inputs
    if spec.datatype == "BYTES":
        raise AgentError(f"a raw binary request cannot carry input '{spec.name}' of datatype BYTES (its elements "
                         "have no fixed size): send it with a JSON header")
    dtype = np.dtype(DATATYPES[spec.datatype])
    fixed = math.prod(d for d in spec.shape if d >= 0) * dtype.itemsize
    variable = [i for i, d in enumerate(spec.shape) if d < 0]
    shape = list(spec.shape)
    want = "[" + ",".join(str(d) for d in spec.shape) + "]"
    if len(variable) > 1:
        raise AgentError(f"a raw binary request cannot say the shape of input '{spec.name}' {spec.datatype} {want}: "
                         "more than one variable dimension; send it with a JSON header")
    if variable:
        if fixed == 0 or len(body) % fixed or not body:
            raise AgentError(f"unexpected size of raw binary input '{spec.name}': expected a multiple of {fixed} "
                             f"bytes ({spec.datatype} {want}), got {len(body)}")
        shape[variable[0]] = len(body) // fixed
    elif len(body) != fixed:
        raise AgentError(f"unexpected size of raw binary input '{spec.name}': expected {fixed} bytes "
                         f"({spec.datatype} {want}), got {len(body)}")
    data = np.frombuffer(body, dtype=dtype.newbyteorder("<")).reshape(shape)
    return InferRequest(id=None, parameters={}, inputs=[InputTensor(spec.name, spec.datatype, tuple(shape), data)],
                        outputs=[], binary_data_output=True)


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


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing (413) one above ``limit`` bytes (the protocol's message for a declared
    length, so that clients read the same words from every server)."""
    check_content_length(request.headers.get("Content-Length"), limit)
    return await read_body(request, limit, ProtocolError)


def _parse_json(raw: bytes, what: str) -> Any:
    return parse_json(raw, what, AgentError)
