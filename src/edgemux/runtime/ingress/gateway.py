"""The edgemux gateway: an Open Inference Protocol endpoint that polices and routes by app name, server-side.

Its endpoints, the answers to an inference request and the route contract (``PUT /v1/routes/{app}``) are
described in docs/reference/http.md ("Gateway"); keep that page true when they change.

The gateway runs the client's decisions, the ingress core :mod:`edgemux.runtime.ingress.dispatch` (route table,
policing, attempts), asynchronously (asyncio) where the client is threaded: police the app at its
contracted rate and burst, pick an endpoint by smooth weighted round robin, forward the body unchanged, and
fail over (at most one attempt per endpoint) on a connection error, timeout, 5xx or malformed reply.

Each thing is done once per request. The gateway polices the request and counts it in its observations; the
agent it forwards to sees the gateway's mark (``runtime.auth.POLICED_HEADER``, sent with the admin token)
and does neither again (it only takes the request's token from its own bucket). The request body is not
parsed here: the agent validates it against the model it serves (a malformed request is the agent's 400,
passed on, and it costs the app its token). The reply is not decoded either: a 200 is passed on when its
framing holds (``forward.framing_problem``), so that an agent answering garbage is failed over like one that
hangs up. A body with a Content-Length that has more than ``forward._STREAM_MIN_BYTES`` still to come is
streamed to the first endpoint as it arrives, so that the two transfers overlap; it is kept as it streams,
and a failover sends it whole (a smaller rest is awaited, then sent in one piece). A
chunked body is read (bounded by ``max_body_bytes``) before policing. ``make_app(gateway, control=False)``
builds a listener without the control endpoints (``/v1/...``), for one that clients can reach.

Times: ``*_s`` are seconds. Policing and cooldowns run on the injected ``clock`` (tests use a fake one);
timeouts, metadata expiry and measured latencies are real time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import numbers
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Union

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from edgemux import __version__
from edgemux.adapt.police import Policing
from edgemux.runtime.auth import Guard, Need, auth_middleware, inference_need
from edgemux.runtime.dataplane.protocol import (
    DEFAULT_MAX_BODY_BYTES,
    ProtocolError,
    check_content_length,
    server_metadata_body,
)
from edgemux.runtime.dataplane.shm import DEFAULT_LIMIT_BYTES as DEFAULT_SHM_LIMIT_BYTES
from edgemux.runtime.dataplane.shm import RegionTable, ShmError, principal
from edgemux.runtime.dataplane.shmapi import ShmApi
from edgemux.runtime.httpserver import Application, Request, Response, Route, delete, get, post, put
from edgemux.runtime.httputil import Answer, ErrorTable, error_response, json_response, make_application, \
    retry_after_header

# the client's reading of an agent's reply (status, headers, body; its error message; its Retry-After in s):
# shared so that both sides judge agents alike
from edgemux.runtime.ingress.dispatch import (
    AppState,
    Attempts,
    RateLimited,
    Reply,
    RouteTable,
    police,
    reply_retry_after,
    server_message,
    verdict,
)
from edgemux.runtime.ingress.decoded import infer_http
from edgemux.runtime.ingress.forward import (
    AgentCalls,
    AttemptFailed,
    RequestBody,
    WholeBody,
    forwarded_headers,
    on_this_host,
    framing_problem,
    passed_on,
)
from edgemux.runtime.ingress.routing import DEFAULT_COOLDOWN_S, AppRoute, RouteError, route_from_json, route_to_json
from edgemux.runtime.loopmetrics import LoopMetrics
from edgemux.runtime.tally import Tally

__all__ = ["Gateway", "RouteError", "WholeBody", "make_app", "route_from_json", "route_to_json"]

logger = logging.getLogger("edgemux.gateway")

# How long a model's metadata is served from the cache (seconds, real time): metadata changes only when a
# model is redeployed, which republishes the route and empties the cache anyway.
DEFAULT_METADATA_TTL_S = 60.0
EXTENSIONS = ("binary_tensor_data", "system_shared_memory")
# Label of requests for apps without a route: one label, so that scanning random names cannot grow the
# metrics without bound.
_UNKNOWN_APP = "(unknown)"
# Histogram buckets (seconds): edge inference runs from ~1 ms (small CNN on a GPU) to seconds (queued).
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_WAIT_BUCKETS = (0.0, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

RoutesArg = Union[Callable[[str], "AppRoute | None"], Mapping[str, AppRoute]]


# ------------------------------------------------------------------------------------------------- state


class _NoRoute(Exception):
    """No route for the app: 404 when it is unknown, 503 when the route lookup itself failed (the control
    plane may be restarting; the caller should retry). Unlike the client's UnknownNameError, the message does
    not list the known apps: the gateway is shared by tenants, who need not learn each other's app names."""

    def __init__(self, app: str, status: int = 404, detail: str = "") -> None:
        message = f"unknown app '{app}': the gateway has no route for it" if status == 404 else (
            f"app '{app}': route lookup failed: {detail}"
        )
        super().__init__(message)
        self.app = app
        self.status = status

    def answer(self) -> Answer:
        return Answer(self.status, str(self), headers={"Retry-After": "1"} if self.status == 503 else {})


# ------------------------------------------------------------------------------------------------ gateway

class Gateway:
    """Server-side policing, weighted routing and failover for edgemux apps, over Open Inference Protocol.

    ``routes`` is where each app's :class:`~edgemux.runtime.ingress.routing.AppRoute` comes from: a mapping from app
    to route, or a callable ``app -> AppRoute | None`` asked (in a worker thread, since it may ask the
    control plane over the network) on an app's first request; routes pushed with :meth:`update_routes`
    (``PUT /v1/routes/{app}``) take precedence. ``timeout_s`` bounds each attempt at an agent (seconds,
    connect to last byte); ``policing`` turns each route's contract into the app's token bucket
    (``adapt.police.Policing``: by default 1.1x the contract, 4 s deep, the rule the simulator runs);
    ``max_wait_s`` is the longest a request waits for its policing token before it is refused with 429
    (seconds; default ``policing.max_wait_s``, 0.5 s); ``cooldown_s`` is how long a failed endpoint is
    skipped (seconds);
    ``max_body_bytes`` bounds request bodies (bytes, 413 above); ``shm_limit_bytes`` the shared memory one
    credential may register here (``dataplane.shm``), and ``shm_pass_through`` whether a request whose
    tensors lie in the caller's shared memory goes to an agent on this host as it is, the agent reading and
    writing that memory itself (``ingress.decoded``; False: the gateway always carries the bytes); ``clock`` (seconds) drives policing and
    cooldowns and ``sleep`` (seconds, awaited) the policing waits; ``metadata_ttl_s`` is how long model
    metadata is cached (seconds, real time). ``token``: the cluster's admin token (``runtime.auth``): the
    control API and metrics need it, an app's inference needs it or the app's key (the digest its route
    carries), and every call to an agent carries it (None: an open gateway that sends none).

    Metrics, in a registry of its own (so that several gateways in one process do not collide):
    ``edgemux_gateway_requests_total{app,code}`` inference requests by answer status;
    ``edgemux_gateway_latency_seconds{app}`` whole inference requests, policing wait included (real time);
    ``edgemux_gateway_policing_wait_seconds{app}`` time admitted requests waited for their token;
    ``edgemux_gateway_failovers_total{app}`` attempts made on another endpoint after one failed.
    """

    def __init__(
        self,
        routes: RoutesArg,
        *,
        timeout_s: float = 5.0,
        max_wait_s: float | None = None,
        policing: Policing = Policing(),
        cooldown_s: float = DEFAULT_COOLDOWN_S,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        metadata_ttl_s: float = DEFAULT_METADATA_TTL_S,
        token: str | None = None,
        shm_limit_bytes: int = DEFAULT_SHM_LIMIT_BYTES,
        shm_pass_through: bool = True,
    ) -> None:
        if max_wait_s is None:  # the policing rule's own longest wait
            max_wait_s = policing.max_wait_s
        for name, value in (
            ("timeout_s", timeout_s),
            ("max_wait_s", max_wait_s),
            ("cooldown_s", cooldown_s),
            ("metadata_ttl_s", metadata_ttl_s),
        ):
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
        if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be a positive integer, got {max_body_bytes!r}")
        self.timeout_s = float(timeout_s)
        self.max_wait_s = float(max_wait_s)
        self.cooldown_s = float(cooldown_s)
        self.max_body_bytes = max_body_bytes
        self.metadata_ttl_s = float(metadata_ttl_s)
        self._clock = clock
        self._sleep = sleep
        self.token = token
        self.guard = Guard(token, self._key_of, self._key_owner)
        # Routes are pushed from the control API on the event loop, but also from other threads (an
        # embedding process, tests): the table keeps itself and each app's state consistent.
        self._table = RouteTable(clock, self.cooldown_s, policing)
        self._lookup: Callable[[str], AppRoute | None] | None = None
        if callable(routes) and not isinstance(routes, Mapping):
            self._lookup = routes
        else:
            for app, route in routes.items():
                self.update_routes(app, route)
        self.calls = AgentCalls(self.timeout_s, token)
        self._serving: asyncio.AbstractEventLoop | None = None  # the loop serving it, known from start()
        # per-app counts since this process started, under an incarnation of its own (a restart is visible)
        self.tally = Tally(uuid.uuid4().hex)
        self.metrics = GatewayMetrics()
        # callers' shared-memory regions on this host (ingress.decoded), each credential its own
        self.regions = RegionTable(shm_limit_bytes)
        self.shm_pass_through = shm_pass_through

    # ------------------------------------------------------------------------------------------ routes

    def update_routes(self, app: str, route: AppRoute) -> None:
        """Install or replace ``app``'s route. The token bucket keeps its tokens (capped at the new burst)
        and the router its round-robin position and down marks for endpoints that stay; the metadata cache
        is emptied, since the model may have changed. Raises ValueError for a route of another app."""
        if not isinstance(route, AppRoute):
            raise ValueError(f"app '{app}': route must be an AppRoute, got {type(route).__name__}")
        self._table.update(app, route)

    def remove_route(self, app: str) -> bool:
        """Forget ``app``'s route (and its bucket) and unmap the shared-memory regions its key registered here;
        True if it had a route. With a route lookup, the app's next request asks the lookup again."""
        self.regions.release(app)
        return self._table.remove(app)

    def routes(self) -> dict[str, AppRoute]:
        """The routes installed now, by app."""
        return self._table.routes()

    def all_on_this_host(self, app: str) -> bool:
        """Whether every endpoint of ``app``'s route is an agent on this host (``forward.on_this_host``)."""
        state = self._table.get(app)
        return (self.shm_pass_through and state is not None
                and all(on_this_host(ep.url) for ep, _ in state.route.endpoints))

    def _key_of(self, app: str) -> str | None:
        state = self._table.get(app)
        return state.route.key_sha256 if state is not None else None

    def _key_owner(self, key_sha256: str) -> str | None:
        return next((a for a, r in self.routes().items() if r.key_sha256 == key_sha256), None)

    async def known(self, need: Need) -> None:
        """Before an app's credentials are checked: look its route up (a gateway with a route lookup learns
        the app's key digest with it). An app without a route has no key: only the admin token opens it."""
        if need.app is not None:
            try:
                await self._state(need.app)
            except _NoRoute:
                pass

    @property
    def ready(self) -> bool:
        """Whether the gateway can route anything: it has a route, or a lookup that may supply one."""
        return len(self._table) > 0 or self._lookup is not None

    async def _state(self, app: str) -> AppState:
        """The app's state; raises :class:`_NoRoute` for an app without route."""
        state = self._table.get(app)
        if state is not None:
            return state
        if self._lookup is None:
            raise _NoRoute(app)
        try:
            # In a worker thread: the lookup may ask the control plane over the network.
            route = await asyncio.get_running_loop().run_in_executor(None, self._lookup, app)
        except KeyError:
            route = None
        except Exception as e:  # noqa: BLE001 - any failure of the lookup is "try again later", not a bug here
            raise _NoRoute(app, 503, f"{type(e).__name__}: {e}") from None
        if route is None:
            raise _NoRoute(app)
        try:  # a push or another request may have installed a route meanwhile: that one (and its bucket) stays
            return self._table.install(app, route)
        except ValueError as e:  # e.g. the lookup answered with another app's route
            raise _NoRoute(app, 503, str(e)) from None

    # --------------------------------------------------------------------------------------- lifecycle

    @property
    def _loop(self) -> asyncio.AbstractEventLoop:
        """The event loop serving this gateway (asked once: every ask is a system call in Python 3.11)."""
        loop = self._serving
        if loop is None:
            loop = self._serving = asyncio.get_running_loop()
        return loop

    async def start(self) -> None:
        """Open the connection pool to the agents (inside the running event loop)."""
        self._serving = asyncio.get_running_loop()
        await self.calls.start()

    async def close(self) -> None:
        """Close the connection pool (a later request opens a new one) and unmap the callers' regions."""
        await self.calls.close()
        self.regions.close()

    # ------------------------------------------------------------------------------------------- infer

    async def infer(self, app: str, version: str, request: Request | WholeBody) -> Response:
        """Answer ``POST /v2/models/{app}[/versions/{version}]/infer`` (see the module doc): policed and
        counted here, once, for the agents too. ``request``: the HTTP request, or a :class:`WholeBody` (an
        inference that came by gRPC, as the HTTP body and headers that carry it to an agent)."""
        started = time.perf_counter()
        state = self._table.get(app)
        if state is None:  # not installed yet: ask the route lookup
            try:
                state = await self._state(app)
            except _NoRoute as e:
                self.metrics.unknown(e.status)
                return e.answer().response()
        series = self.metrics.of(app)
        status = 500
        waited = [-1.0]  # its policing wait (s) once admitted (-1: not admitted); 0 is observed in _count
        try:
            response = await self._infer(state, app, version, request, series, waited)
            status = response.status
            return response
        finally:
            # counted once the answer is on its way (the callback runs after the server has written it, before
            # the loop reads another request): bookkeeping is not on the request's path
            self._loop.call_soon(self._count, app, series, status, time.perf_counter() - started, waited[0])

    def _count(self, app: str, series: _AppSeries, status: int, elapsed_s: float, waited_s: float = -1.0) -> None:
        """One inference request of ``app`` answered with ``status`` after ``elapsed_s`` seconds: its metrics
        (a policing wait ``waited_s`` of 0 s is observed here; -1: not admitted), and what the control plane's
        adapt loop reads (the app's offered load, end-to-end latency and policing wait)."""
        if waited_s == 0.0:
            series.wait.observe(0.0)
        series.answered(status, elapsed_s)
        if status == 200:
            self.tally.answered(app, elapsed_s * 1000.0, max(waited_s, 0.0) * 1000.0)
        elif status in (429, 503):
            self.tally.refused(app)
        elif status >= 500:
            self.tally.failed(app)

    async def _infer(self, state: AppState, app: str, version: str, request: Request | WholeBody,
                     series: _AppSeries, waited: list[float]) -> Response:
        if type(request) is WholeBody:
            body = RequestBody.complete(request.body)
        else:
            assert isinstance(request, Request)
            try:
                length = check_content_length(request.headers.get("Content-Length"), self.max_body_bytes)
                body = RequestBody(request.content, length, self.max_body_bytes)
                if length is None:  # chunked: no length to check beforehand, so read it before the token
                    await body.whole()
            except ProtocolError as e:
                return error_response(e.status, e.message)

        try:
            wait_s = police(app, state, self.max_wait_s, source="gateway")
        except RateLimited as limited:
            return error_response(429, str(limited), {"Retry-After": retry_after_header(limited.retry_after_s)})
        if wait_s > 0:
            # observed now, while it waits (a gauge of who is waiting), off the request's path; a request
            # that waits for nothing is observed with its answer, in _count
            self._loop.call_soon(series.wait.observe, wait_s)
            await self._sleep(wait_s)  # never time.sleep: other apps' requests go on meanwhile
        waited[0] = max(wait_s, 0.0)

        path = state.route.model_path("infer", version) if version else state.route.infer_path
        local = None
        if type(request) is WholeBody:
            local, headers = request.local, request.head()
        else:
            headers = forwarded_headers(request.raw_headers, inference=True)
        # One token per request, however many endpoints it is tried on: failover must not eat the contract.
        attempts = Attempts(app, state, self._clock)
        while (ep := attempts.next()) is not None:
            if len(attempts.tried) > 1:
                series.failed_over()
            sent, sent_headers = body, headers
            if local is not None and self.shm_pass_through and on_this_host(ep.url):  # the agent shares it
                sent, sent_headers = RequestBody.complete(local.body), local.head()
            try:
                reply = await self.calls.exchange("POST", ep.url.rstrip("/") + path, sent, sent_headers)
            except AttemptFailed as e:
                if body.error is not None:  # the caller's body broke off: nothing to say about the endpoint
                    return error_response(body.error.status, body.error.message)
                attempts.failed(ep, e.reason, e.retry_after_s)
                continue
            except ProtocolError as e:  # reading the rest of the body for a failover
                return error_response(e.status, e.message)
            what = verdict(reply.status)
            if what == "retry":
                attempts.failed(ep, f"HTTP {reply.status}: {server_message(reply)}", reply_retry_after(reply))
                continue
            if what == "ok":
                problem = framing_problem(reply)
                if problem is not None:  # a malformed 200 is the endpoint's failure (as in the client)
                    attempts.failed(ep, problem)
                    continue
                attempts.succeeded(ep)
            # 200, or a 4xx (429 included): the agent's answer about this request, passed on unchanged.
            return passed_on(reply)
        return self._unavailable(attempts)

    def _unavailable(self, attempts: Attempts) -> Response:
        """503 naming every endpoint, with Retry-After: when the first cooldown ends, else the cooldown."""
        e = attempts.unavailable()
        wait = e.retry_after_s if e.retry_after_s is not None else self.cooldown_s
        return error_response(503, str(e), {"Retry-After": retry_after_header(wait)}, app=e.app, failures=e.failures)

    # --------------------------------------------------------------------------- metadata and readiness

    async def model_metadata(self, app: str, version: str) -> Response:
        """Answer ``GET /v2/models/{app}[/versions/{version}]``: the agent's metadata with ``name`` = app."""
        try:
            state = await self._state(app)
        except _NoRoute as e:
            return e.answer().response()
        cached = state.metadata.get(version)
        if cached is not None and cached[0] > time.monotonic():
            return Response(status=200, body=cached[1], headers=cached[2])

        def accept(reply: Reply) -> bool:
            return reply.status != 200 or _metadata_doc(reply.body) is not None

        result = await self._probe(state, app, state.route.model_path("", version), accept)
        if isinstance(result, Response):
            return result
        if result.status != 200:
            return passed_on(result)  # e.g. the agent's 404 for a model it does not have
        doc = _metadata_doc(result.body)
        assert doc is not None
        # The caller addresses the app, not the agent's model: it gets the metadata under the name it used.
        doc["name"] = app
        body = json.dumps(doc, separators=(",", ":")).encode("utf-8")
        headers = {"Content-Type": "application/json"}
        state.metadata[version] = (time.monotonic() + self.metadata_ttl_s, body, headers)
        return Response(status=200, body=body, headers=headers)

    async def model_ready(self, app: str, version: str) -> Response:
        """Answer ``GET /v2/models/{app}[/versions/{version}]/ready``: 200 when an endpoint says its model
        is ready; 400 when the endpoints answer that it is not (as Triton); 503 when none answers."""
        try:
            state = await self._state(app)
        except _NoRoute as e:
            return e.answer().response()
        result = await self._probe(state, app, state.route.model_path("ready", version), lambda r: r.status == 200)
        if isinstance(result, Response):
            return result
        return Response(status=200) if result.status == 200 else passed_on(result)

    async def _probe(
        self, state: AppState, app: str, path: str, accept: Callable[[Reply], bool]
    ) -> Reply | Response:
        """GET ``path`` from the app's endpoints in declaration order (not round robin: the inference
        interleaving stays exact), skipping those in cooldown, until one gives an accepted reply. Transport
        failures, 5xx and unreadable metadata mark the endpoint down as for inference. Returns the accepted
        reply, else the last non-accepted 4xx, else a 503 response naming every endpoint."""
        attempts = Attempts(app, state, self._clock)
        refusal: Reply | None = None
        now = self._clock()
        headers = forwarded_headers((), inference=False)
        for ep, weight in state.route.endpoints:
            if weight <= 0 or state.router.is_down(ep, now):
                continue
            attempts.tried.add(ep)
            try:
                reply = await self.calls.exchange("GET", ep.url.rstrip("/") + path, None, headers)
            except AttemptFailed as e:
                attempts.failed(ep, e.reason, e.retry_after_s)
                continue
            if verdict(reply.status) == "retry":
                attempts.failed(ep, f"HTTP {reply.status}: {server_message(reply)}", reply_retry_after(reply))
                continue
            if reply.status == 200 and not accept(reply):
                attempts.failed(ep, "malformed reply: not a JSON object")
                continue
            if accept(reply):
                attempts.succeeded(ep)
                return reply
            refusal = reply
        if refusal is not None:
            return refusal
        attempts.next()  # every endpoint is tried or cooling down: this learns when the first cooldown ends
        return self._unavailable(attempts)

    # ------------------------------------------------------------------------------------------ metrics

    def metrics_text(self) -> bytes:
        """The gateway's metrics in Prometheus text format."""
        return generate_latest(self.metrics.registry)


class _AppSeries:
    """One app's metric children, looked up once: its requests by answer status, latency, policing wait and
    failovers (``runtime.loopmetrics``: plain numbers, written on the gateway's loop without a lock)."""

    def __init__(self, metrics: GatewayMetrics, app: str) -> None:
        self._requests = metrics.requests
        self._by_status: dict[int, tuple[str, str]] = {}
        self.app = app
        self.latency = metrics.latency.child((app,))
        self.wait = metrics.wait.child((app,))
        self._failovers = metrics.failovers
        self._app_labels = (app,)

    def answered(self, status: int, elapsed_s: float) -> None:
        """One inference request answered with ``status`` after ``elapsed_s`` seconds."""
        labels = self._by_status.get(status)
        if labels is None:
            labels = self._by_status[status] = (self.app, str(status))
        self._requests.inc(labels)
        self.latency.observe(elapsed_s)

    def failed_over(self) -> None:
        """One attempt made on another endpoint after one failed."""
        self._failovers.inc(self._app_labels)


class GatewayMetrics:
    """The gateway's Prometheus metrics, in a registry of its own (so that several gateways in one process do
    not collide): ``edgemux_gateway_requests_total{app,code}`` inference requests by answer status (apps
    without a route under one label, so that scanning random names cannot grow the metrics);
    ``edgemux_gateway_latency_seconds{app}`` whole inference requests, policing wait included (real time);
    ``edgemux_gateway_policing_wait_seconds{app}`` time admitted requests waited for their token;
    ``edgemux_gateway_failovers_total{app}`` attempts made on another endpoint after one failed."""

    def __init__(self) -> None:
        families = LoopMetrics()
        self.registry = families.registry
        self.requests = families.counter("edgemux_gateway_requests_total",
                                         "Inference requests by app and answer status", ("app", "code"))
        self.latency = families.histogram("edgemux_gateway_latency_seconds",
                                          "Inference request latency at the gateway, policing wait included",
                                          ("app",), _LATENCY_BUCKETS)
        self.wait = families.histogram("edgemux_gateway_policing_wait_seconds",
                                       "Time admitted requests waited for their policing token", ("app",), _WAIT_BUCKETS)
        self.failovers = families.counter("edgemux_gateway_failovers_total",
                                          "Attempts on another endpoint after one failed", ("app",))
        self._apps: dict[str, _AppSeries] = {}

    def of(self, app: str) -> _AppSeries:
        """``app``'s series (an app with a route: the names are bounded by the routes ever installed)."""
        series = self._apps.get(app)
        if series is None:
            series = self._apps[app] = _AppSeries(self, app)
        return series

    def unknown(self, status: int) -> None:
        """One request for an app without a route, answered ``status``."""
        self.requests.inc((_UNKNOWN_APP, str(status)))


# --------------------------------------------------------------------------------------------- HTTP app


# The gateway's errors as answers (runtime.httputil.ErrorTable): most answers are built by the handlers, a
# route push's problems are listed field by field.
ERRORS = ErrorTable((
    (RouteError, lambda e: Answer(400, str(e), {"reasons": e.reasons})),
    ((ProtocolError, ShmError), lambda e: Answer(e.status, e.message)),
), logger)


def make_app(gateway: Gateway, *, control: bool = True) -> Application:
    """The application serving ``gateway`` (endpoints in the module doc; ``runtime.httputil.start_site``
    serves it). ``control=False`` leaves out the control API (``/v1/...``), for a listener that clients can
    reach. Its startup opens the gateway's connection pool and its cleanup closes it."""
    # client_max_size bounds request.read() (a route push); the infer handler streams and counts anyway.
    app = make_application(_Handlers(gateway).routes(control=control), ERRORS,
                           auth=auth_middleware(gateway.guard, inference_need, gateway.known),
                           client_max_size=gateway.max_body_bytes)
    app.on_startup.append(gateway.start)
    app.on_cleanup.append(gateway.close)
    return app


class _Handlers:
    """The gateway's request handlers (``runtime.httputil``'s pattern)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.server_meta = server_metadata_body("edgemux-gateway", __version__, EXTENSIONS)

    def routes(self, *, control: bool) -> list[Route]:
        """The route table (docs/reference/http.md, "Gateway"); ``control``: with the control API."""
        table = [get("/v2/health/live", self.live), get("/v2/health/ready", self.ready),
                 get("/v2", self.server_metadata)]
        for prefix in ("/v2/models/{app}", "/v2/models/{app}/versions/{version}"):
            table += [get(prefix, self.model_metadata), get(prefix + "/ready", self.model_ready),
                      post(prefix + "/infer", self.infer)]
        table += ShmApi(self.gateway.regions, self.gateway.guard).routes()
        table.append(get("/metrics", self.metrics))
        if control:
            table += [get("/v1/routes", self.list_routes), get("/v1/observations", self.observations),
                      put("/v1/routes/{app}", self.put_route), delete("/v1/routes/{app}", self.delete_route)]
        return table

    async def live(self, request: Request) -> Response:
        return Response(status=200)

    async def ready(self, request: Request) -> Response:
        if self.gateway.ready:
            return Response(status=200)
        return error_response(503, "the gateway has no routes yet")

    async def server_metadata(self, request: Request) -> Response:
        return Response(body=self.server_meta, content_type="application/json")

    async def model_metadata(self, request: Request) -> Response:
        return await self.gateway.model_metadata(request.match_info["app"], request.match_info.get("version", ""))

    async def model_ready(self, request: Request) -> Response:
        return await self.gateway.model_ready(request.match_info["app"], request.match_info.get("version", ""))

    def infer(self, request: Request) -> Awaitable[Response]:
        gateway = self.gateway
        app, version = request.match_info["app"], request.match_info.get("version", "")
        if gateway.regions:
            owner = principal(gateway.guard, request.headers.get("Authorization"))
            if gateway.regions.holds(owner):  # its tensors may be in the caller's shared memory: decoded
                return infer_http(gateway, app, version, request, owner)
        # the gateway's own coroutine, returned as it is: one frame less on every inference request
        return gateway.infer(app, version, request)

    async def metrics(self, request: Request) -> Response:
        return Response(body=self.gateway.metrics_text(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def observations(self, request: Request) -> Response:
        """``GET /v1/observations``: what this gateway saw of each app since it started (cumulative counts and
        latency histogram, ``runtime.messages.Observations``), read by the control plane's adapt loop."""
        return json_response(self.gateway.tally.observations().to_json())

    async def list_routes(self, request: Request) -> Response:
        routes = self.gateway.routes()
        return json_response({"routes": {app: route_to_json(r) for app, r in routes.items()}})

    async def put_route(self, request: Request) -> Response:
        app = request.match_info["app"]
        raw = await request.read()  # bounded by client_max_size
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            return error_response(400, f"invalid route for app '{app}': body is not JSON: {e}",
                                  reasons=[f"body: not JSON: {e}"])
        route = route_from_json(app, doc)  # RouteError: 400 listing every problem
        self.gateway.update_routes(app, route)
        return json_response({"app": app, **route_to_json(route)})

    async def delete_route(self, request: Request) -> Response:
        app = request.match_info["app"]
        if not self.gateway.remove_route(app):
            return error_response(404, f"no route for app '{app}'")
        return json_response({"removed": app})


def _metadata_doc(body: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None
