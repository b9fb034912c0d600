"""The edgemux gateway: an Open Inference Protocol endpoint that polices and routes by app name, server-side.

Its endpoints, the answers to an inference request and the route contract (``PUT /v1/routes/{app}``) are
described in docs/reference/http.md ("Gateway"); keep that page true when they change.

The gateway runs the client's decisions, the ingress core :mod:`edgemux.runtime.ingress.dispatch` (route table,
policing, attempts), asynchronously (aiohttp) where the client is threaded: police the app at its
contracted rate and burst, pick an endpoint by smooth weighted round robin, forward the body unchanged, and
fail over (at most one attempt per endpoint) on a connection error, timeout, 5xx or malformed reply.

The request body is not parsed here: the agent validates it against the model it serves, and validating it
twice cost the JSON path a second parse of the whole body (the Open Inference Protocol's JSON tensors make
that most of the request's cost). A malformed request is the agent's 400, passed on, and it counts against
the app's contract at both, as every request does. A body with a Content-Length is streamed to the first
endpoint as it arrives, so that the two transfers overlap instead of following each other; it is kept as it
streams, and a failover sends it whole. A chunked body is read (bounded by ``max_body_bytes``) before policing.
The control endpoints are not authenticated:
``make_app(gateway, control=False)`` builds the public listener without them.

Times: ``*_s`` are seconds. Policing and cooldowns run on the injected ``clock`` (tests use a fake one);
timeouts, metadata expiry and measured latencies are real time.
"""

from __future__ import annotations

import asyncio
import json
import math
import numbers
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Union

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

from edgemux import __version__
from edgemux.adapt.police import Policing
from edgemux.runtime.auth import Guard, Need, auth_headers, auth_middleware, inference_need
from edgemux.runtime.ingress.client import MAX_RESPONSE_BYTES

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
from edgemux.runtime.dataplane.protocol import (
    DEFAULT_MAX_BODY_BYTES,
    HEADER_LENGTH_HEADER,
    ProtocolError,
    check_content_length,
    decode_infer_response,
    error_body,
    server_metadata_body,
)
from edgemux.runtime.ingress.routing import DEFAULT_COOLDOWN_S, AppRoute, RouteError, route_from_json, route_to_json
from edgemux.runtime.tally import Tally

# How long a model's metadata is served from the cache (seconds, real time): metadata changes only when a
# model is redeployed, which republishes the route and empties the cache anyway.
DEFAULT_METADATA_TTL_S = 60.0
# Request headers passed on to the agent: what the protocol needs (binary extension, a compressed body),
# plus tracing ids; hop-by-hop and Host headers are the gateway's own.
_FORWARD_REQUEST = ("Content-Type", "Content-Encoding", HEADER_LENGTH_HEADER, "traceparent", "tracestate", "X-Request-Id")
# Response headers passed back to the caller with an agent's answer.
_FORWARD_RESPONSE = ("Content-Type", "Content-Encoding", HEADER_LENGTH_HEADER, "Retry-After")
# Read size for bodies (bytes): requests and replies are read in chunks so that a bound is enforced early.
_READ_CHUNK = 64 * 1024
# Label of requests for apps without a route: one label, so that scanning random names cannot grow the
# metrics without bound.
_UNKNOWN_APP = "(unknown)"
# Histogram buckets (seconds): edge inference runs from ~1 ms (small CNN on a GPU) to seconds (queued).
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_WAIT_BUCKETS = (0.0, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

RoutesArg = Union[Callable[[str], "AppRoute | None"], Mapping[str, AppRoute]]


# ------------------------------------------------------------------------------------------------- state


class _AttemptFailed(Exception):
    """One attempt at one endpoint failed in a way that says the endpoint is unhealthy (``reason``), and the
    endpoint asked to be left alone for ``retry_after_s`` seconds (None: the gateway's cooldown)."""

    def __init__(self, reason: str, retry_after_s: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s


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

    def response(self) -> web.Response:
        return _error(self.status, str(self), {"Retry-After": "1"} if self.status == 503 else None)


# ------------------------------------------------------------------------------------------------ gateway

class _Body:
    """A request body on its way to the agents, read from the caller once.

    ``stream()`` hands it to the first attempt chunk by chunk as it arrives, keeping each chunk; ``whole()``
    reads what is left and returns all of it, for a chunked body (bounded by ``limit`` bytes: 413 above) and
    for every attempt after the first. ``length`` is the declared Content-Length (bytes), None for a chunked
    body. When the caller's side breaks off, ``error`` says so (the attempt that was streaming it fails, and
    that is not the endpoint's fault) and ``whole()`` raises it."""

    def __init__(self, content: aiohttp.StreamReader, length: int | None, limit: int) -> None:
        self.length = length
        self.error: ProtocolError | None = None
        self._content = content
        self._limit = limit
        self._chunks: list[bytes] = []
        self._size = 0
        self._done = False

    @property
    def streamable(self) -> bool:
        """Whether nothing has been read yet and the length is declared: the first attempt streams."""
        return self.length is not None and self._size == 0 and not self._done

    async def _next(self) -> bytes:
        """The next chunk, kept (b"" at the end). No await between the read and the keeping: an attempt
        cancelled while streaming loses no byte of the body."""
        if self._done:
            return b""
        if self.error is not None:
            raise self.error
        try:
            chunk = await self._content.readany()
        except (aiohttp.ClientError, OSError, asyncio.IncompleteReadError) as e:
            self.error = ProtocolError(f"the request body broke off after {self._size} bytes ({type(e).__name__})")
            raise self.error from None
        if not chunk:
            self._done = True
            return b""
        self._size += len(chunk)
        if self._size > self._limit:
            self.error = ProtocolError(f"request body exceeds the limit of {self._limit} bytes", 413)
            raise self.error
        self._chunks.append(chunk)
        return chunk

    async def stream(self) -> AsyncIterator[bytes]:
        """The body as it arrives (for aiohttp's client to send with the declared Content-Length)."""
        while chunk := await self._next():
            yield chunk

    async def whole(self) -> bytes:
        """All of the body: what was streamed already and the rest, read now."""
        while await self._next():
            pass
        if len(self._chunks) > 1:  # joined once, then kept whole for further attempts
            self._chunks = [b"".join(self._chunks)]
        return self._chunks[0] if self._chunks else b""


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
    ``max_body_bytes`` bounds request bodies (bytes, 413 above); ``clock`` (seconds) drives policing and
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
        self._session: aiohttp.ClientSession | None = None
        # per-app counts since this process started, under an incarnation of its own (a restart is visible)
        self.tally = Tally(uuid.uuid4().hex)
        self.registry = CollectorRegistry()
        self._requests = Counter(
            "edgemux_gateway_requests_total", "Inference requests by app and answer status",
            ["app", "code"], registry=self.registry,
        )
        self._latency = Histogram(
            "edgemux_gateway_latency_seconds", "Inference request latency at the gateway, policing wait included",
            ["app"], buckets=_LATENCY_BUCKETS, registry=self.registry,
        )
        self._wait = Histogram(
            "edgemux_gateway_policing_wait_seconds", "Time admitted requests waited for their policing token",
            ["app"], buckets=_WAIT_BUCKETS, registry=self.registry,
        )
        self._failovers = Counter(
            "edgemux_gateway_failovers_total", "Attempts on another endpoint after one failed",
            ["app"], registry=self.registry,
        )

    # ------------------------------------------------------------------------------------------ routes

    def update_routes(self, app: str, route: AppRoute) -> None:
        """Install or replace ``app``'s route. The token bucket keeps its tokens (capped at the new burst)
        and the router its round-robin position and down marks for endpoints that stay; the metadata cache
        is emptied, since the model may have changed. Raises ValueError for a route of another app."""
        if not isinstance(route, AppRoute):
            raise ValueError(f"app '{app}': route must be an AppRoute, got {type(route).__name__}")
        self._table.update(app, route)

    def remove_route(self, app: str) -> bool:
        """Forget ``app``'s route (and its bucket); True if it had one. With a route lookup, the app's next
        request asks the lookup again."""
        return self._table.remove(app)

    def routes(self) -> dict[str, AppRoute]:
        """The routes installed now, by app."""
        return self._table.routes()

    def _key_of(self, app: str) -> str | None:
        state = self._table.get(app)
        return state.route.key_sha256 if state is not None else None

    def _key_owner(self, key_sha256: str) -> str | None:
        return next((a for a, r in self.routes().items() if r.key_sha256 == key_sha256), None)

    async def _known(self, need: Need) -> None:
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

    async def start(self) -> None:
        """Open the connection pool to the agents (inside the running event loop)."""
        if self._session is None or self._session.closed:
            # One pool for all agents: keep-alive connections are reused across requests and apps. No
            # per-host limit (agents queue on their own devices); a total bound protects the gateway's sockets.
            connector = aiohttp.TCPConnector(limit=1024, limit_per_host=0)
            self._session = aiohttp.ClientSession(
                connector=connector,
                # Bodies travel as they are: no decompression, no compression, no redirects followed.
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                # the agents take inference from gateways on the admin token (the client's key stays here)
                headers=auth_headers(self.token),
            )

    async def close(self) -> None:
        """Close the connection pool (a later request opens a new one)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ------------------------------------------------------------------------------------------- infer

    async def infer(self, app: str, version: str, request: web.Request) -> web.Response:
        """Answer ``POST /v2/models/{app}[/versions/{version}]/infer`` (see the module doc)."""
        started = time.perf_counter()
        label = _UNKNOWN_APP
        status = 500
        try:
            try:
                state = await self._state(app)
            except _NoRoute as e:
                return e.response()
            label = app
            response = await self._infer(state, app, version, request)
            status = response.status
            return response
        finally:
            self._requests.labels(label, str(status)).inc()
            if label != _UNKNOWN_APP:
                elapsed_s = time.perf_counter() - started
                self._latency.labels(label).observe(elapsed_s)
                # what the control plane's adapt loop reads: the app's offered load and end-to-end latency
                if status == 200:
                    self.tally.answered(label, elapsed_s * 1000.0)
                elif status in (429, 503):
                    self.tally.refused(label)
                elif status >= 500:
                    self.tally.failed(label)

    async def _infer(self, state: AppState, app: str, version: str, request: web.Request) -> web.Response:
        try:
            length = check_content_length(request.headers.get("Content-Length"), self.max_body_bytes)
            body = _Body(request.content, length, self.max_body_bytes)
            if length is None:  # chunked: no length to check beforehand, so read it before the token
                await body.whole()
        except ProtocolError as e:
            return _error(e.status, e.message)

        try:
            wait_s = police(app, state, self.max_wait_s, source="gateway")
        except RateLimited as limited:
            return _error(429, str(limited), {"Retry-After": _seconds_header(limited.retry_after_s)})
        self._wait.labels(app).observe(wait_s)
        if wait_s > 0:
            await self._sleep(wait_s)  # never time.sleep: other apps' requests go on meanwhile

        route = state.route
        headers = _forwarded_headers(request.headers)
        # One token per request, however many endpoints it is tried on: failover must not eat the contract.
        attempts = Attempts(app, state, self._clock)
        while (ep := attempts.next()) is not None:
            if len(attempts.tried) > 1:
                self._failovers.labels(app).inc()
            url = ep.url.rstrip("/") + _model_path(route, version, "infer")
            try:
                reply = await self._exchange("POST", url, body, headers)
            except _AttemptFailed as e:
                if body.error is not None:  # the caller's body broke off: nothing to say about the endpoint
                    return _error(body.error.status, body.error.message)
                attempts.failed(ep, e.reason, e.retry_after_s)
                continue
            except ProtocolError as e:  # reading the rest of the body for a failover
                return _error(e.status, e.message)
            what = verdict(reply.status)
            if what == "retry":
                attempts.failed(ep, f"HTTP {reply.status}: {server_message(reply)}", reply_retry_after(reply))
                continue
            if what == "ok" and not _encoded(reply):
                try:  # a malformed 200 is the endpoint's failure (as in the client), not the caller's answer
                    decode_infer_response(reply.body, reply.headers.get(HEADER_LENGTH_HEADER))
                except ProtocolError as e:
                    attempts.failed(ep, e.message)
                    continue
            if what == "ok":
                attempts.succeeded(ep)
            # 200, or a 4xx (429 included): the agent's answer about this request, passed on unchanged.
            return _passed_on(reply)
        return self._unavailable(attempts)

    def _unavailable(self, attempts: Attempts) -> web.Response:
        """503 naming every endpoint, with Retry-After: when the first cooldown ends, else the cooldown."""
        e = attempts.unavailable()
        wait = e.retry_after_s if e.retry_after_s is not None else self.cooldown_s
        return _error(503, str(e), {"Retry-After": _seconds_header(wait)}, app=e.app, failures=e.failures)

    async def _exchange(self, method: str, url: str, body: _Body | None, headers: Mapping[str, str]) -> Reply:
        """One attempt at an agent: the reply (any status), or :class:`_AttemptFailed` on a transport failure
        (check ``body.error``: the caller's body may be what failed). ``body`` is streamed when nothing of it
        was read yet, sent whole otherwise; reading its rest may raise its ``ProtocolError``."""
        if self._session is None or self._session.closed:
            await self.start()
        assert self._session is not None
        for fresh in (False, True):
            data: bytes | AsyncIterator[bytes] | None = None
            sent = headers
            if body is not None and body.streamable:
                assert body.length is not None
                data, sent = body.stream(), {**headers, "Content-Length": str(body.length)}
            elif body is not None:
                data = await body.whole()
            try:
                async with self._session.request(
                    method, url, data=data, headers=sent, allow_redirects=False
                ) as resp:
                    # aiohttp's headers stand in for http.client's: both answer .get(name) case-insensitively.
                    return Reply(resp.status, resp.headers, await _read_reply(resp))
            except aiohttp.ServerDisconnectedError:
                # A keep-alive connection the agent closed while idle fails before any reply byte: that says
                # nothing about the agent, so retry once (aiohttp retries only idempotent methods itself,
                # and inference has no side effects). A second hang-up is the agent's failure.
                if fresh or (body is not None and body.error is not None):
                    raise _AttemptFailed("connection closed by the server without an answer") from None
            except asyncio.TimeoutError:
                raise _AttemptFailed(f"no answer within the {self.timeout_s:g} s timeout") from None
            except aiohttp.ClientConnectorError as e:
                raise _AttemptFailed(_connect_failure(e)) from None
            except (aiohttp.ClientError, OSError) as e:
                raise _AttemptFailed(f"{type(e).__name__}: {e}") from None
        raise AssertionError("unreachable")

    # --------------------------------------------------------------------------- metadata and readiness

    async def model_metadata(self, app: str, version: str) -> web.Response:
        """Answer ``GET /v2/models/{app}[/versions/{version}]``: the agent's metadata with ``name`` = app."""
        try:
            state = await self._state(app)
        except _NoRoute as e:
            return e.response()
        cached = state.metadata.get(version)
        if cached is not None and cached[0] > time.monotonic():
            return web.Response(status=200, body=cached[1], headers=cached[2])

        def accept(reply: Reply) -> bool:
            return reply.status != 200 or _metadata_doc(reply.body) is not None

        result = await self._probe(state, app, _model_path(state.route, version, ""), accept)
        if isinstance(result, web.Response):
            return result
        if result.status != 200:
            return _passed_on(result)  # e.g. the agent's 404 for a model it does not have
        doc = _metadata_doc(result.body)
        assert doc is not None
        # The caller addresses the app, not the agent's model: it gets the metadata under the name it used.
        doc["name"] = app
        body = json.dumps(doc, separators=(",", ":")).encode("utf-8")
        headers = {"Content-Type": "application/json"}
        state.metadata[version] = (time.monotonic() + self.metadata_ttl_s, body, headers)
        return web.Response(status=200, body=body, headers=headers)

    async def model_ready(self, app: str, version: str) -> web.Response:
        """Answer ``GET /v2/models/{app}[/versions/{version}]/ready``: 200 when an endpoint says its model
        is ready; 400 when the endpoints answer that it is not (as Triton); 503 when none answers."""
        try:
            state = await self._state(app)
        except _NoRoute as e:
            return e.response()
        result = await self._probe(state, app, _model_path(state.route, version, "ready"), lambda r: r.status == 200)
        if isinstance(result, web.Response):
            return result
        return web.Response(status=200) if result.status == 200 else _passed_on(result)

    async def _probe(
        self, state: AppState, app: str, path: str, accept: Callable[[Reply], bool]
    ) -> Reply | web.Response:
        """GET ``path`` from the app's endpoints in declaration order (not round robin: the inference
        interleaving stays exact), skipping those in cooldown, until one gives an accepted reply. Transport
        failures, 5xx and unreadable metadata mark the endpoint down as for inference. Returns the accepted
        reply, else the last non-accepted 4xx, else a 503 response naming every endpoint."""
        attempts = Attempts(app, state, self._clock)
        refusal: Reply | None = None
        now = self._clock()
        for ep, weight in state.route.endpoints:
            if weight <= 0 or state.router.is_down(ep, now):
                continue
            attempts.tried.add(ep)
            try:
                reply = await self._exchange("GET", ep.url.rstrip("/") + path, None, {"Accept-Encoding": "identity"})
            except _AttemptFailed as e:
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
        return generate_latest(self.registry)


# -------------------------------------------------------------------------------------------- route JSON


# --------------------------------------------------------------------------------------------- HTTP app


GATEWAY_KEY = web.AppKey("edgemux_gateway", Gateway)


def make_app(gateway: Gateway, *, control: bool = True) -> web.Application:
    """The aiohttp application serving ``gateway`` (endpoints in the module doc). ``control=False`` leaves
    out the unauthenticated ``/v1/routes`` control API, for a listener that clients can reach."""
    # client_max_size bounds what aiohttp itself would buffer; the infer handler streams and counts anyway.
    # authentication first: a request without the credential it needs never reaches a handler
    auth = auth_middleware(gateway.guard, inference_need, gateway._known)
    app = web.Application(middlewares=[auth, _errors_as_json], client_max_size=gateway.max_body_bytes)
    app[GATEWAY_KEY] = gateway

    async def lifecycle(_: web.Application) -> AsyncIterator[None]:
        await gateway.start()
        yield
        await gateway.close()

    app.cleanup_ctx.append(lifecycle)
    r = app.router
    r.add_get("/v2/health/live", _live)
    r.add_get("/v2/health/ready", _ready)
    r.add_get("/v2", _server_metadata)
    for prefix in ("/v2/models/{app}", "/v2/models/{app}/versions/{version}"):
        r.add_get(prefix, _model_metadata)
        r.add_get(prefix + "/ready", _model_ready)
        r.add_post(prefix + "/infer", _infer)
    r.add_get("/metrics", _metrics)
    if control:
        r.add_get("/v1/routes", _list_routes)
        r.add_get("/v1/observations", _observations)
        r.add_put("/v1/routes/{app}", _put_route)
        r.add_delete("/v1/routes/{app}", _delete_route)
    return app


@web.middleware
async def _errors_as_json(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """Every error answer is a JSON ``{"error": ...}`` (as tritonclient reads them), and a bug is a 500 that
    says so rather than a dropped connection."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        keep = {k: v for k, v in e.headers.items() if k.lower() in ("allow", "retry-after")}
        return _error(e.status, f"{e.reason}: {request.method} {request.path}", keep)
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - the last line of defence: answer, do not drop the connection
        return _error(500, f"internal gateway error: {type(e).__name__}: {e}")


async def _live(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _ready(request: web.Request) -> web.Response:
    if request.app[GATEWAY_KEY].ready:
        return web.Response(status=200)
    return _error(503, "the gateway has no routes yet")


async def _server_metadata(request: web.Request) -> web.Response:
    body = server_metadata_body("edgemux-gateway", __version__, ("binary_tensor_data",))
    return web.Response(body=body, content_type="application/json")


async def _model_metadata(request: web.Request) -> web.Response:
    return await request.app[GATEWAY_KEY].model_metadata(request.match_info["app"], request.match_info.get("version", ""))


async def _model_ready(request: web.Request) -> web.Response:
    return await request.app[GATEWAY_KEY].model_ready(request.match_info["app"], request.match_info.get("version", ""))


async def _infer(request: web.Request) -> web.Response:
    return await request.app[GATEWAY_KEY].infer(request.match_info["app"], request.match_info.get("version", ""), request)


async def _metrics(request: web.Request) -> web.Response:
    body = request.app[GATEWAY_KEY].metrics_text()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _observations(request: web.Request) -> web.Response:
    """``GET /v1/observations``: what this gateway saw of each app since it started (cumulative counts and
    latency histogram, ``runtime.messages.Observations``), read by the control plane's adapt loop."""
    return web.json_response(request.app[GATEWAY_KEY].tally.observations().to_json())


async def _list_routes(request: web.Request) -> web.Response:
    routes = request.app[GATEWAY_KEY].routes()
    return web.json_response({"routes": {app: route_to_json(r) for app, r in routes.items()}})


async def _put_route(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    app = request.match_info["app"]
    raw = await request.read()  # bounded by client_max_size
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        return _error(400, f"invalid route for app '{app}': body is not JSON: {e}", reasons=[f"body: not JSON: {e}"])
    try:
        route = route_from_json(app, doc)
    except RouteError as e:
        return _error(400, str(e), reasons=e.reasons)
    gateway.update_routes(app, route)
    return web.json_response({"app": app, **route_to_json(route)})


async def _delete_route(request: web.Request) -> web.Response:
    app = request.match_info["app"]
    if not request.app[GATEWAY_KEY].remove_route(app):
        return _error(404, f"no route for app '{app}'")
    return web.json_response({"removed": app})


# ---------------------------------------------------------------------------------------------- helpers


def _model_path(route: AppRoute, version: str, leaf: str) -> str:
    """Path at the agent: the route's model (the caller named the app), the caller's version if it gave one
    else the route's, then ``leaf`` (``infer``, ``ready`` or "" for metadata)."""
    path = "/v2/models/" + urllib.parse.quote(route.model, safe="")
    version = version or route.model_version
    if version:
        path += "/versions/" + urllib.parse.quote(version, safe="")
    return path + ("/" + leaf if leaf else "")


def _forwarded_headers(headers: Mapping[str, str]) -> CIMultiDict[str]:
    out: CIMultiDict[str] = CIMultiDict()
    for name in _FORWARD_REQUEST:
        value = headers.get(name)
        if value is not None:
            out[name] = value
    # Replies come back as the agent sends them and are checked before being passed on: ask for them plain.
    out["Accept-Encoding"] = "identity"
    return out


def _passed_on(reply: Reply) -> web.Response:
    headers = {k: reply.headers[k] for k in _FORWARD_RESPONSE if k in reply.headers}
    return web.Response(status=reply.status, body=reply.body, headers=headers)


async def _read_reply(resp: aiohttp.ClientResponse) -> bytes:
    """The reply body, bounded so that a broken agent cannot exhaust the gateway's memory."""
    body = await _read_bounded(resp.content, MAX_RESPONSE_BYTES)
    if body is None:
        raise _AttemptFailed(f"response larger than {MAX_RESPONSE_BYTES} bytes")
    return body


async def _read_bounded(content: aiohttp.StreamReader, limit: int) -> bytes | None:
    """A stream read to its end, or None as soon as it passes ``limit`` bytes (the rest is not read)."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await content.read(_READ_CHUNK):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _encoded(reply: Reply) -> bool:
    return reply.headers.get("Content-Encoding", "identity").strip().lower() not in ("", "identity")


def _metadata_doc(body: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def _connect_failure(e: aiohttp.ClientConnectorError) -> str:
    if isinstance(e.os_error, ConnectionRefusedError):
        return "connection refused"
    return f"cannot connect: {e.os_error or e}"


def _seconds_header(seconds: float) -> str:
    """Retry-After value: whole seconds rounded up (HTTP has no fractions), at least 1 so that a client
    does not retry in a busy loop."""
    return str(max(1, math.ceil(seconds - 1e-9)))


def _error(status: int, message: str, headers: Mapping[str, str] | None = None, **extra: Any) -> web.Response:
    body = error_body(message) if not extra else json.dumps({"error": message, **extra}).encode("utf-8")
    return web.Response(status=status, body=body, headers={**(headers or {}), "Content-Type": "application/json"})
