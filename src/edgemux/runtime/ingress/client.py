"""The edgemux inference client: policing, weighted routing with failover, Open Inference Protocol over HTTP.

This is the request flow (docs/concepts.md, "Request") on the client side: the caller's frame is pre-processed
(:mod:`edgemux.runtime.dataplane.preprocess`), the request is policed with a token bucket at the app's contracted
rate and burst (:class:`~edgemux.runtime.policing.TokenBucket`), an endpoint is picked by smooth weighted
round robin over the app's placement shares (:class:`~edgemux.runtime.ingress.routing.WeightedRouter`), and the
request goes to that agent as ``POST {url}/v2/models/{model}/infer`` (KServe v2 / Open Inference Protocol,
with Triton's binary tensor extension). What decides (what to refuse, when to fail over, what to tell the
caller) is the ingress core :mod:`edgemux.runtime.ingress.dispatch`, which the gateway runs too: this module adds
the synchronous HTTP transport, pre-processing and the route lookup.

Failure semantics (a request always ends in a result or one of these errors, and never hangs):

* :class:`RateLimited` - the app is over its contract: refused locally without sending anything when its
  token would come later than ``max_wait_s``, or answered 429 by the server. Carries ``retry_after_s``.
* :class:`RequestError` - the server answered 4xx: the request itself is bad, so it is not retried.
* :class:`Unavailable` - every endpoint failed (connection error, timeout, 5xx, malformed reply) or is in
  its cooldown after a failure. Names the app and each endpoint's failure.
* :class:`ValueError` - the inputs cannot be encoded at all (nothing is sent, no token is taken).

A failed endpoint is marked down for ``cooldown_s`` (or the server's ``Retry-After`` on a 503) and the
request is retried on another one: at most one attempt per endpoint. Inference requests have no side
effects, so retrying one that may have reached a dead agent is safe.

Times: ``*_s`` are seconds, ``*_ms`` milliseconds. Policing and cooldowns use the injected ``clock`` and
``sleep`` (tests use fake ones); socket timeouts and measured latencies are real time.
"""

from __future__ import annotations

import http.client
import json
import math
import numbers
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np

from edgemux.adapt.police import Policing
from edgemux.errors import UnknownNameError
from edgemux.runtime.auth import auth_headers
from edgemux.runtime.ingress.dispatch import (
    AppState,
    Attempts,
    RateLimited,
    Reply,
    RequestError,
    RouteTable,
    Unavailable,
    police,
    reply_retry_after,
    server_message,
    verdict,
)
from edgemux.runtime.dataplane.preprocess import to_model_input
from edgemux.runtime.dataplane.shm import SHM_DIR, SHM_MIN_BYTES, OwnRegion, on_this_host
from edgemux.runtime.dataplane.protocol import (
    HEADER_LENGTH_HEADER,
    ProtocolError,
    TensorSpec,
    decode_infer_response,
    datatype_of,
    decode_model_metadata,
    encode_infer_request,
    tensor_bytes,
)
from edgemux.runtime.ingress.routing import DEFAULT_COOLDOWN_S, AppRoute, Target, parse_endpoint_url

# The client's public face: a user imports what a request needs and what it may raise from here, though the
# route, the errors and the bucket are defined by the ingress core beside it.
__all__ = ["AppRoute", "Client", "InferResult", "RateLimited", "RequestError", "Unavailable", "TensorSpec",
           "MAX_RESPONSE_BYTES"]

# Largest response body read from an agent (bytes): a bound, so that a broken server cannot exhaust the
# client's memory; edge models' outputs are far smaller (a 1000-class FP32 score vector is 4 KB).
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
# Read size for response bodies (bytes): each read is one recv, so the deadline is checked between them.
_READ_CHUNK = 64 * 1024


# ------------------------------------------------------------------------------------------------- routes


RoutesSource = Union[Callable[[str], "AppRoute | None"], Mapping[str, AppRoute], Iterable[AppRoute], AppRoute]


# ------------------------------------------------------------------------------------------------ results


@dataclass
class InferResult:
    """The answer to one request.

    ``outputs``: output name → array; ``endpoint``: URL of the agent that answered; ``latency_ms``: round
    trip of that answering attempt (send to last byte, milliseconds, real time); ``queue_wait_ms``: time the
    token bucket made the request wait before sending (milliseconds); ``total_ms``: the whole call, waits
    and failed attempts included (milliseconds, real time); ``attempts``: endpoints tried (1 = no failover).
    """

    outputs: dict[str, np.ndarray]
    endpoint: str
    latency_ms: float
    queue_wait_ms: float
    attempts: int
    total_ms: float = 0.0
    model_name: str = ""
    model_version: str = ""
    id: str | None = None
    failures: dict[str, str] = field(default_factory=dict)  # endpoints that failed before this one answered

    def as_numpy(self, name: str) -> np.ndarray:
        """Output ``name`` (as ``tritonclient``'s ``InferResult.as_numpy``, but KeyError when absent)."""
        return self.outputs[name]


# ------------------------------------------------------------------------------------------------ transport


class _TransportError(Exception):
    """The endpoint could not be reached or did not answer in time (``reason`` says how)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# A server may close an idle keep-alive connection at any time; the next request on it then fails before
# any reply byte arrives with one of these. That says nothing about the endpoint's health, so such a
# request is retried once on a fresh connection before it counts as the endpoint's failure.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


class _Transport:
    """HTTP/1.1 keep-alive connections, one per endpoint per thread (``http.client`` connections are not
    thread-safe), every operation bounded by ``timeout_s`` seconds of real time."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: set[http.client.HTTPConnection] = set()  # every live connection, for close()

    def post(self, target: Target, path: str, body: bytes, headers: Mapping[str, str]) -> Reply:
        """POST ``body`` to ``target``; returns the reply (any status) or raises :class:`_TransportError`."""
        return self.request("POST", target, path, body, headers)

    def request(self, method: str, target: Target, path: str, body: bytes | None = None,
                headers: Mapping[str, str] | None = None) -> Reply:
        """One exchange with ``target``; returns the reply (any status) or raises :class:`_TransportError`."""
        headers = headers or {}
        conn, reused = self._connection(target)
        try:
            return self._exchange(conn, method, target.prefix + path, body, headers)
        except _STALE as e:
            self._discard(target, conn)
            if not reused:
                raise _TransportError(_describe(e, self.timeout_s)) from None
        except (OSError, http.client.HTTPException, _TransportError) as e:
            self._discard(target, conn)
            raise e if isinstance(e, _TransportError) else _TransportError(_describe(e, self.timeout_s)) from None
        conn, _ = self._connection(target)  # the stale keep-alive retry, on a fresh connection
        try:
            return self._exchange(conn, method, target.prefix + path, body, headers)
        except (OSError, http.client.HTTPException, _TransportError) as e:
            self._discard(target, conn)
            raise e if isinstance(e, _TransportError) else _TransportError(_describe(e, self.timeout_s)) from None

    def close(self) -> None:
        """Close every connection of every thread."""
        with self._lock:
            conns, self._open = list(self._open), set()
        for c in conns:
            c.close()

    def _connection(self, target: Target) -> tuple[http.client.HTTPConnection, bool]:
        conns: dict[Target, http.client.HTTPConnection] | None = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = {}
        key = Target(target.scheme, target.host, target.port, "")  # one connection per host:port
        conn = conns.get(key)
        if conn is not None:
            if conn.sock is not None:
                return conn, True
            # Closed after a "Connection: close" reply or by close(): http.client reopens it on the next
            # request (a fresh connection, not a reused one); register it again so that close() sees it.
            with self._lock:
                self._open.add(conn)
            return conn, False
        # http.client sets TCP_NODELAY on connect; _OneWrite* send the headers and a bytes body in one write.
        cls = _OneWriteHTTPSConnection if target.scheme == "https" else _OneWriteHTTPConnection
        conn = cls(target.host, target.port, timeout=self.timeout_s)
        conns[key] = conn
        with self._lock:
            self._open.add(conn)
        return conn, False

    def _discard(self, target: Target, conn: http.client.HTTPConnection) -> None:
        conn.close()
        key = Target(target.scheme, target.host, target.port, "")
        conns = getattr(self._local, "conns", {})
        if conns.get(key) is conn:
            del conns[key]
        with self._lock:
            self._open.discard(conn)

    def _exchange(
        self, conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None,
        headers: Mapping[str, str]
    ) -> Reply:
        # One deadline for the whole exchange: a per-operation socket timeout alone would let a server that
        # trickles its reply byte by byte hold the caller forever.
        deadline = time.monotonic() + self.timeout_s
        if conn.sock is not None:
            conn.sock.settimeout(self.timeout_s)  # a reused socket still has the last exchange's remainder
        conn.request(method, path, body=body, headers=dict(headers))
        sock = conn.sock
        _set_remaining(sock, deadline)
        resp = conn.getresponse()
        chunks: list[bytes] = []
        size = 0
        # read1 (one recv per call) rather than read(), so that the deadline is checked between receives.
        while resp.length is None or resp.length > 0:  # length: bytes still due (None: chunked or until EOF)
            _set_remaining(sock, deadline)
            chunk = resp.read1(_READ_CHUNK)
            if not chunk:
                if resp.length:  # EOF before Content-Length bytes came
                    raise http.client.IncompleteRead(b"".join(chunks), resp.length)
                break
            size += len(chunk)
            if size > MAX_RESPONSE_BYTES:
                raise _TransportError(f"response larger than {MAX_RESPONSE_BYTES} bytes")
            chunks.append(chunk)
        # Unlike read(), read1() does not mark a complete response closed; http.client refuses the next
        # request on this connection until it is.
        resp.close()
        if resp.will_close:
            conn.close()  # the server said Connection: close; the next request reconnects
        return Reply(resp.status, resp.headers, b"".join(chunks))


class _OneWrite:
    """Send the request head and a bytes body in one ``send``.

    ``http.client`` writes them separately. With TCP_NODELAY that is two segments, and the server may wake
    for the head, parse it and sleep again until the body comes. On loopback the difference is within
    noise (``benchmarks/bench_agent_breakdown.py`` measured 0.011 ms at the agent); it is one syscall and
    one segment fewer per request on a real network."""

    _buffer: list[bytes]

    def _send_output(self, message_body: Any = None, encode_chunked: bool = False) -> None:
        if not isinstance(message_body, (bytes, bytearray)) or encode_chunked:
            super()._send_output(message_body, encode_chunked)  # type: ignore[misc]
            return
        self._buffer.extend((b"", b""))
        head = b"\r\n".join(self._buffer)
        del self._buffer[:]
        self.send(head + message_body)  # type: ignore[attr-defined]


class _OneWriteHTTPConnection(_OneWrite, http.client.HTTPConnection):
    pass


class _OneWriteHTTPSConnection(_OneWrite, http.client.HTTPSConnection):
    pass


def _set_remaining(sock: socket.socket | None, deadline: float) -> None:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("deadline passed")
    if sock is not None:
        try:
            sock.settimeout(remaining)
        except OSError:  # already handed over to the response and closed by http.client; the read will tell
            pass


def _describe(e: BaseException, timeout_s: float) -> str:
    """One line saying how a transport call failed."""
    if isinstance(e, (TimeoutError, socket.timeout)):
        return f"no answer within the {timeout_s:g} s timeout"
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, http.client.RemoteDisconnected):
        return "connection closed by the server without an answer"
    if isinstance(e, ConnectionResetError):
        return "connection reset by the server"
    text = str(e) or type(e).__name__
    return f"{type(e).__name__}: {text}" if type(e).__name__ not in text else text


# --------------------------------------------------------------------------------------------------- client


class Client:
    """Inference client for edgemux apps: policing, weighted routing with failover, OIP over HTTP.

    ``routes`` is where each app's :class:`AppRoute` comes from: a callable ``app -> AppRoute | None``
    (asked on the app's first request, and again when an endpoint answers 404, or 401 with authentication on,
    because it no longer serves the app: the app moved, and the route is asked anew and the request tried on the new endpoints; None or
    KeyError = unknown app), a mapping from app to
    route, an iterable of routes, or one route. ``timeout_s`` bounds every HTTP exchange (seconds);
    ``policing`` turns each route's contract into the app's token bucket (``adapt.police.Policing``, the
    rule the gateway and the simulator run); ``max_wait_s`` is the longest a request may wait for its
    policing token before it is refused with :class:`RateLimited` (seconds; default
    ``policing.max_wait_s``, 0.5 s); ``cooldown_s`` is how long a failed endpoint is skipped (seconds);
    ``clock`` (seconds) and ``sleep`` (seconds) drive policing and cooldowns. ``keys``: the credential each
    request carries (``runtime.auth``): one secret for every app (the cluster's admin token) or a mapping from
    app to its key (an app missing from it sends none); None: none, for an open cluster. ``shm``: hand the
    inputs over in system shared memory to an endpoint on this host (``dataplane.shm``: each thread a
    region per endpoint, made, registered with the app's credential and written by the client; the outputs
    come back in the answer); None: for requests of at least ``SHM_MIN_BYTES`` of tensors; False: never. An
    endpoint that does not take the registration gets binary HTTP. :meth:`close` unregisters and removes
    the regions.

    Thread-safe: threads share buckets and routers (so the app's contract holds across them) and each keep
    their own keep-alive connection per endpoint.
    """

    def __init__(
        self,
        routes: RoutesSource,
        *,
        timeout_s: float = 5.0,
        max_wait_s: float | None = None,
        policing: Policing = Policing(),
        cooldown_s: float = DEFAULT_COOLDOWN_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        keys: Mapping[str, str | None] | str | None = None,
        shm: bool | None = None,
    ) -> None:
        if max_wait_s is None:  # the policing rule's own longest wait
            max_wait_s = policing.max_wait_s
        for name, value in (("timeout_s", timeout_s), ("max_wait_s", max_wait_s), ("cooldown_s", cooldown_s)):
            ok = not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
            if not (ok and value >= 0):
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
        self.timeout_s = float(timeout_s)
        self.max_wait_s = float(max_wait_s)
        self.cooldown_s = float(cooldown_s)
        self._clock = clock
        self._sleep = sleep
        self._keys = keys
        self._table = RouteTable(clock, self.cooldown_s, policing)
        # Parsed endpoint URLs (connection key and path prefix), shared by every app: a republished route
        # parses only the URLs it has not seen.
        self._targets: dict[str, Target] = {}
        self._lookup: Callable[[str], AppRoute | None] | None = None
        if isinstance(routes, AppRoute):
            routes = [routes]
        if callable(routes) and not isinstance(routes, Mapping):
            self._lookup = routes
        else:
            items = routes.items() if isinstance(routes, Mapping) else ((r.app, r) for r in routes)
            for app, route in items:
                self.update_routes(app, route)
        self._transport = _Transport(self.timeout_s)
        self._shm = _ShmLanes(self._transport) if shm is not False and SHM_DIR.is_dir() else None
        self._shm_always = shm is True

    # ------------------------------------------------------------------------------------------ routes

    def update_routes(self, app: str, route: AppRoute) -> None:
        """Install or replace ``app``'s route (the control plane republished it: weights changed, an
        endpoint came or went, the contract changed). The token bucket keeps its tokens (capped at the new
        burst) and the router keeps its round-robin position and down marks for endpoints that stay, so a
        republish neither grants a fresh burst nor jolts the interleaving."""
        if not isinstance(route, AppRoute):
            raise ValueError(f"app '{app}': route must be an AppRoute, got {type(route).__name__}")
        for ep, _ in route.endpoints:
            if ep.url not in self._targets:
                self._targets[ep.url] = parse_endpoint_url(ep.url, app)
        self._table.update(app, route)

    def route(self, app: str) -> AppRoute:
        """The route the client uses for ``app`` (looked up if not known yet)."""
        return self._state(app).route

    def apps(self) -> list[str]:
        """Apps with a route installed."""
        return list(self._table.routes())

    def _state(self, app: str) -> AppState:
        state = self._table.get(app)
        if state is not None:
            return state
        if self._lookup is None:
            raise UnknownNameError("app", app, "app", self.apps())
        try:
            route = self._lookup(app)  # the lookup may ask the control plane over the network
        except KeyError:
            route = None
        if route is None:
            raise UnknownNameError("app", app, "app", self.apps())
        if self._table.get(app) is None:  # else another thread installed it meanwhile: keep that one
            self.update_routes(app, route)
        state = self._table.get(app)
        assert state is not None
        return state

    def _relookup(self, app: str) -> AppRoute | None:
        """Ask the route source for ``app``'s route again and install it; None when it has none."""
        assert self._lookup is not None
        try:
            route = self._lookup(app)
        except KeyError:
            return None
        if route is not None:
            self.update_routes(app, route)
        return route

    # ------------------------------------------------------------------------------------------- infer

    def infer(
        self,
        app: str,
        inputs: Mapping[str, np.ndarray] | np.ndarray,
        *,
        binary: bool = True,
        request_id: str | None = None,
        outputs: Sequence[str] = (),
    ) -> InferResult:
        """Run one inference for ``app`` and return its outputs.

        ``inputs`` maps input names to arrays, sent as they are; or is one bare array for the route's
        declared ``input`` (when the route declares none, the model's one input as its metadata on an
        endpoint declares it, asked once): sent as it is when its shape already matches that spec, else taken as an image
        (H, W, C) and pre-processed with :func:`~edgemux.runtime.dataplane.preprocess.to_model_input`. ``binary``
        sends tensors (and asks for outputs) in the binary extension instead of JSON; ``outputs`` names the
        outputs wanted (empty: all).

        Raises :class:`RateLimited`, :class:`RequestError`, :class:`Unavailable` (see the module doc),
        :class:`~edgemux.errors.UnknownNameError` for an app without route, ValueError for unencodable inputs.
        """
        started = time.perf_counter()
        state = self._state(app)
        route = state.route
        # Encode before policing: an input that cannot be encoded must not cost the app a token.
        route, named, body, headers, shared = self._encode(app, route, inputs, binary, request_id, outputs)

        wait_s = police(app, state, self.max_wait_s)
        if wait_s > 0:
            self._sleep(wait_s)

        # One token per request, however many endpoints it is tried on: failover must not eat the contract.
        attempts = Attempts(app, state, self._clock)
        refreshed = False
        while (ep := attempts.next()) is not None:
            # Routes may have been republished between the pick and here: parse the URL if it is new.
            target = self._targets.get(ep.url) or parse_endpoint_url(ep.url, app)
            sent = time.perf_counter()
            lane = None
            if shared and on_this_host(ep.url):
                assert self._shm is not None
                lane = self._shm.request(target, ep.url, named, request_id, outputs, binary, self._auth(app))
            try:
                reply = self._transport.post(target, route.infer_path, *(lane or (body(), headers)))
                if lane is not None and reply.status == 400 and "shared memory" in server_message(reply):
                    self._shm.forget(ep.url)  # type: ignore[union-attr]  # the region went (the app was re-created)
                    reply = self._transport.post(target, route.infer_path, body(), headers)
            except _TransportError as e:
                attempts.failed(ep, e.reason)
                continue
            latency_ms = (time.perf_counter() - sent) * 1e3
            what = verdict(reply.status)
            if what == "ok":
                try:
                    decoded = decode_infer_response(reply.body, reply.headers.get(HEADER_LENGTH_HEADER))
                except ProtocolError as e:
                    attempts.failed(ep, e.message)  # a malformed 200 is the endpoint's failure
                    continue
                attempts.succeeded(ep)
                return InferResult(
                    outputs=decoded.outputs,
                    endpoint=ep.url,
                    latency_ms=latency_ms,
                    queue_wait_ms=wait_s * 1e3,
                    attempts=len(attempts.tried),
                    total_ms=(time.perf_counter() - started) * 1e3,
                    model_name=decoded.model_name,
                    model_version=decoded.model_version,
                    id=decoded.id,
                    failures=attempts.failures,
                )
            message = server_message(reply)
            if what == "retry":
                attempts.failed(ep, f"HTTP {reply.status}: {message}", reply_retry_after(reply))
                continue
            if what == "rate-limited":
                raise RateLimited(app, reply_retry_after(reply) or 0.0, source=ep.url, detail=message)
            if reply.status in (404, 401) and self._lookup is not None and not refreshed:
                # the endpoint no longer has the app: it moved (make before break keeps the old endpoint
                # serving until the routes switched, so a 404 means this route is stale; with authentication
                # on, an agent that no longer has the app does not know its key either: 401): ask again, once
                refreshed = True
                fresh = self._relookup(app)
                if fresh is not None and fresh.endpoints != route.endpoints:
                    attempts.failures[ep.url] = f"HTTP {reply.status}: {message} (route looked up again)"
                    route = state.route
                    if not isinstance(inputs, Mapping):  # a bare frame: the new model may want another size
                        route, named, body, headers, shared = self._encode(app, route, inputs, binary, request_id,
                                                                           outputs)
                    continue
            raise RequestError(app, ep.url, reply.status, message)
        raise attempts.unavailable()

    def _encode(self, app: str, route: AppRoute, inputs: Mapping[str, np.ndarray] | np.ndarray, binary: bool,
                request_id: str | None, outputs: Sequence[str]
                ) -> tuple[AppRoute, dict[str, np.ndarray], Callable[[], bytes], dict[str, str], bool]:
        """For ``route`` (which comes back with the input it learnt, if any): the inputs by name, the request
        body and its headers, and whether the request goes in shared memory to an endpoint on this host (then
        the body is encoded only if such an endpoint refuses it). Everything that can refuse the inputs
        (ValueError) runs now, before the request is policed: an input that cannot be sent costs no token."""
        if route.input is None and not isinstance(inputs, Mapping):
            route = self._learn_input(app, route)
        named = _named_inputs(route, inputs)
        shared = self._shm is not None and (self._shm_always or sum(a.nbytes for a in named.values()) >= SHM_MIN_BYTES)
        encoded: list[bytes] = []
        headers = {"Content-Type": "application/octet-stream" if binary else "application/json"}

        def body() -> bytes:
            if not encoded:
                data, hdrs = encode_infer_request(named, binary=binary, request_id=request_id, outputs=outputs)
                encoded.append(data)
                headers.pop(HEADER_LENGTH_HEADER, None)
                headers.update(hdrs)
            return encoded[0]

        if shared:  # its tensors' bytes (tensor_bytes) need a datatype for each, and nothing else
            for name, array in named.items():
                try:
                    datatype_of(array.dtype, name)
                except ProtocolError:
                    raise ValueError(f"input '{name}': numpy dtype {array.dtype} has no Open Inference Protocol "
                                     "datatype") from None
        else:
            body()
        headers.update(self._auth(app))
        return route, named, body, headers, shared

    def _auth(self, app: str) -> dict[str, str]:
        """The Authorization header of ``app``'s requests (none without a credential for it)."""
        keys = self._keys
        return auth_headers(keys if isinstance(keys, str) or keys is None else keys.get(app))

    def _learn_input(self, app: str, route: AppRoute) -> AppRoute:
        """``route`` with its model's one declared input, read from the model metadata of the first endpoint
        that answers (``GET .../v2/models/{model}``, as Triton's clients do), and installed; ``route``
        unchanged when none answers or the model declares several inputs (:func:`_named_inputs` then says
        what to pass); ``RequestError`` (401/403) when an endpoint refused the credential and none answered.
        Not policed: metadata is not inference."""
        path = route.infer_path.removesuffix("/infer")
        refused: RequestError | None = None
        for ep, weight in route.endpoints:
            if weight <= 0:
                continue
            try:
                reply = self._transport.request("GET", self._targets.get(ep.url) or parse_endpoint_url(ep.url, app),
                                                path, headers=self._auth(app))
                meta = decode_model_metadata(reply.body) if reply.status == 200 else None
            except (_TransportError, ProtocolError):
                continue
            if reply.status in (401, 403):
                # no key, or another app's: say so, rather than let the missing metadata blame the model
                refused = RequestError(app, ep.url, reply.status, server_message(reply) + (
                    "; this client has no key for the app (Client(keys={app: key}) or $EDGEMUX_APP_KEY)"
                    if not self._auth(app) else "; the key given for the app is not its key"))
                continue
            if meta is None or len(meta.inputs) != 1:
                continue
            # Installed with the route, so it lasts until the route is republished: after a move the new
            # device's model may want another size (a CPU variant at 96x96 where the Edge TPU's took 224).
            route = _with_input(route, meta.inputs[0])
            self.update_routes(app, route)
            return route
        if refused is not None:
            raise refused
        return route

    # ------------------------------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Unregister and remove the shared-memory regions and close all keep-alive connections (the client
        stays usable: later requests make them again)."""
        if self._shm is not None:
            self._shm.close()
        self._transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _with_input(route: AppRoute, spec: TensorSpec) -> AppRoute:
    return AppRoute(route.app, route.model, route.endpoints, route.rate_rps, route.burst, spec, route.model_version)


def _named_inputs(route: AppRoute, inputs: Mapping[str, np.ndarray] | np.ndarray) -> dict[str, np.ndarray]:
    """The request's inputs by name (see :meth:`Client.infer` for the bare-array rule)."""
    if isinstance(inputs, Mapping):
        if not inputs:
            raise ValueError(f"app '{route.app}': no inputs given")
        return {str(k): np.asarray(v) for k, v in inputs.items()}
    array = np.asarray(inputs)
    spec = route.input
    if spec is None:
        raise ValueError(
            f"app '{route.app}': no endpoint's model metadata declares exactly one input, so a bare array "
            f"cannot be named; pass {{input_name: array}}"
        )
    fits = len(array.shape) == len(spec.shape) and all(d == -1 or d == g for g, d in zip(array.shape, spec.shape))
    if fits:
        return {spec.name: array}
    return {spec.name: to_model_input(array, spec)}


class _ShmLanes:
    """The client's shared memory: per thread and endpoint, one region (made by :class:`OwnRegion`, grown
    when a request needs more, registered at the endpoint with the app's credential) that the thread writes
    its inputs into before each request. Per thread, since a thread waits for its answer before it writes
    the next request's inputs: no request's inputs are overwritten while it is served."""

    def __init__(self, transport: _Transport) -> None:
        self._transport = transport
        self._local = threading.local()
        self._lock = threading.Lock()
        self._made: list[tuple[Target, str, OwnRegion, dict[str, str]]] = []  # for close()
        self._refused: set[str] = set()  # endpoints that did not take a registration

    def request(self, target: Target, url: str, named: Mapping[str, np.ndarray], request_id: str | None,
                outputs: Sequence[str], binary: bool, auth: dict[str, str]) -> tuple[bytes, dict[str, str]] | None:
        """The body and headers of a request whose inputs lie in this thread's region at ``url`` (written
        now); None when the endpoint does not take shared memory (then binary HTTP)."""
        if url in self._refused:
            return None
        blobs = {n: tensor_bytes(a, datatype_of(a.dtype, n)) for n, a in named.items()}
        need = sum(len(b) for b in blobs.values())
        lanes: dict[str, tuple[OwnRegion, str]] = self._local.__dict__.setdefault("lanes", {})
        lane = lanes.get(url)
        if lane is None or lane[0].size < need:
            if lane is not None:
                self.forget(url)
            lane = self._make(target, url, need, auth)
            if lane is None:
                return None
            lanes[url] = lane
        region, name = lane
        entries, offset = [], 0
        for n, a in named.items():
            region.write(offset, blobs[n])
            entries.append({"name": n, "datatype": datatype_of(a.dtype, n), "shape": list(a.shape), "parameters": {
                "shared_memory_region": name, "shared_memory_offset": offset, "shared_memory_byte_size": len(blobs[n])}})
            offset += len(blobs[n])
        header: dict[str, Any] = {"inputs": entries, "parameters": {"binary_data_output": binary}}
        if request_id:
            header["id"] = request_id
        if outputs:
            header["outputs"] = [{"name": o, "parameters": {"binary_data": binary}} for o in outputs]
        return json.dumps(header, separators=(",", ":")).encode("utf-8"), {"Content-Type": "application/json", **auth}

    def _make(self, target: Target, url: str, size: int, auth: dict[str, str]) -> tuple[OwnRegion, str] | None:
        region = OwnRegion(max(size, 4096), prefix="edgemux-client")
        name = f"client-{region.key[1:]}"
        doc = json.dumps({"key": region.key, "offset": 0, "byte_size": region.size}).encode()
        try:
            reply = self._transport.request("POST", target, f"/v2/systemsharedmemory/region/{name}/register", doc,
                                            {"Content-Type": "application/json", **auth})
        except _TransportError:
            reply = None
        if reply is None or reply.status != 200:
            region.close()
            if reply is not None and 400 <= reply.status < 500:
                self._refused.add(url)  # it does not serve the extension (or not to this credential)
            return None
        with self._lock:
            self._made.append((target, name, region, auth))
        return region, name

    def forget(self, url: str) -> None:
        """Drop this thread's region at ``url`` (unregistered and removed)."""
        lane = self._local.__dict__.get("lanes", {}).pop(url, None)
        if lane is not None:
            self._release(lane[0])

    def _release(self, region: OwnRegion) -> None:
        with self._lock:
            mine = [m for m in self._made if m[2] is region]
            self._made = [m for m in self._made if m[2] is not region]
        for target, name, _, auth in mine:
            try:
                self._transport.request("POST", target, f"/v2/systemsharedmemory/region/{name}/unregister",
                                        b"", auth)
            except _TransportError:
                pass  # the endpoint forgets it with the app; the object itself is removed below
        region.close()

    def close(self) -> None:
        """Unregister and remove every thread's regions."""
        with self._lock:
            made = list(self._made)
        for _, _, region, _ in made:
            self._release(region)
        self._local = threading.local()
