"""The HTTP/1.1 server under edgemux's three servers (agent, gateway, control plane): an asyncio Protocol that
parses requests with ``httptools`` (llhttp, the parser Node.js and uvicorn use) and writes answers itself.

Why not aiohttp's server: a request through it costs about 0.1 ms of CPU before a handler runs (its request
and response objects, middlewares by partial, payload streams, access-log plumbing), as much as the gateway's
whole target; the same request here is a few dozen Python operations. aiohttp stays as the HTTP client.

What a request meets, in order:

- the **connection** (:class:`_Connection`) parses bytes into :class:`Request` objects: the head (request
  line, headers, bounded by :class:`Limits`), then the body, which is handed to the handler as it arrives
  (:class:`BodyStream`, with flow control: reading pauses while more than ``Limits.high_water_bytes`` wait);
- the **application** (:class:`Application`) resolves the route (:class:`Router`: 404 ``no such endpoint``,
  405 with ``Allow``, as :class:`HTTPError`) and calls the route's handler through the middlewares, outermost
  first (``runtime.httputil.make_application`` puts authentication there); whatever they raise is answered by
  the application's error handler (a server's ``ErrorTable``);
- the handler returns a :class:`Response`, written with ``Content-Length`` in one write.

HTTP/1.1 as clients use it: keep-alive, ``Connection: close`` and HTTP/1.0 (closed unless it asks for
keep-alive); pipelined requests answered in order (reading pauses while one waits its turn); ``Expect:
100-continue`` (the ``100 Continue`` goes out when the handler first reads the body, so that a refusal from
the head alone costs the client no upload); chunked request bodies; HEAD on every GET route (the head without
the body). A malformed request is answered 400 (414, 431 for a request line or head over the limits) with a
JSON error and the connection closes. Slow clients are timed out: an idle keep-alive connection, a head that
does not complete, a body whose next bytes do not come while the handler waits for them (408), an answer the
client does not read. A client that goes away is *told*, not cancelled: its body stream raises
:class:`ClientDisconnected` and ``request.disconnected`` turns true, so that a handler with side effects (the
control plane's) is never interrupted halfway; its answer is dropped. An answer written before the body was
all read closes the connection after reading (and dropping) the rest for at most ``Limits.linger_s``, so that
the client reads the answer rather than a reset.

:class:`Server` listens (TLS with an ``ssl.SSLContext``) and stops gracefully: it stops accepting, closes
idle connections, lets in-flight requests finish within a timeout (their answers close the connection), then
aborts what is left and runs the application's cleanup.

Units: bytes, seconds (``*_s``).
"""

from __future__ import annotations

import asyncio
import collections
import email.utils
import http
import json
import logging
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import httptools
from multidict import CIMultiDict, MultiDict, MultiDictProxy

from edgemux.runtime.httputil import clip

__all__ = ["Application", "BodyStream", "ClientDisconnected", "HTTPError", "Handler", "Limits", "Middleware",
           "Request", "Response", "Route", "Router", "Server", "delete", "get", "post", "put"]

logger = logging.getLogger("edgemux.http")

Handler = Callable[["Request"], Awaitable["Response"]]
Middleware = Callable[["Request", Handler], Awaitable["Response"]]

_REASONS = {int(s): s.phrase.encode("latin-1") for s in http.HTTPStatus}
# Headers the server writes itself: a handler's own are dropped rather than sent twice.
_OWN_HEADERS = frozenset(("content-length", "connection", "date", "transfer-encoding", "keep-alive"))
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# How much of a request's path an error message quotes (characters): a scanner's long paths stay one line.
_PATH_CLIP = 120


# --------------------------------------------------------------------------------------------- messages


class HTTPError(Exception):
    """A request the server refuses: ``status``, ``message`` (the JSON error's text) and ``headers`` (e.g.
    ``Allow``). Raised by the router (404, 405), by a body over its limit (413), by a body that breaks off or
    times out (400, 408); the error table answers it as it is."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers: Mapping[str, str] = headers or {}


class ClientDisconnected(ConnectionResetError):
    """The client closed its connection before its request body had all arrived."""


@dataclass(frozen=True)
class Limits:
    """What a server allows a client (bytes, seconds). ``max_line_bytes``: the request line (414 above);
    ``max_head_bytes`` and ``max_headers``: the header lines (431 above); ``keepalive_timeout_s``: an idle
    connection (between requests, and before the first); ``head_timeout_s``: from a request's first byte to
    the end of its head (a slowloris); ``body_timeout_s``: a handler waiting for a body's next bytes (408);
    ``write_timeout_s``: an answer waiting for a client that does not read it (the connection is dropped);
    ``linger_s``: reading and dropping the rest of a body after its answer, before closing;
    ``high_water_bytes``: body bytes buffered before reading pauses."""

    max_line_bytes: int = 8190
    max_head_bytes: int = 65536
    max_headers: int = 128
    keepalive_timeout_s: float = 75.0
    head_timeout_s: float = 30.0
    body_timeout_s: float = 60.0
    write_timeout_s: float = 60.0
    linger_s: float = 2.0
    high_water_bytes: int = 1 << 20


class BodyStream:
    """A request's body as it arrives: :meth:`readany` returns what is there (waiting for the next bytes
    while there is none), ``b""`` at the end. It raises :class:`ClientDisconnected` when the client goes
    away first, :class:`HTTPError` 400 when the chunked coding is malformed and 408 when no byte comes for
    ``Limits.body_timeout_s``. ``total_bytes``: bytes received so far."""

    __slots__ = ("_conn", "_chunks", "_buffered", "total_bytes", "_eof", "_error", "_waiter", "_expect", "_dropping")

    def __init__(self, conn: _Connection | None, has_body: bool, expect_continue: bool) -> None:
        self._conn = conn
        self._chunks: list[bytes] = []
        self._buffered = 0
        self.total_bytes = 0
        self._eof = not has_body
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._expect = expect_continue and has_body
        self._dropping = False

    @property
    def at_eof(self) -> bool:
        """Whether the whole body has arrived and been read."""
        return self._eof and not self._chunks

    @property
    def complete(self) -> bool:
        """Whether the whole body has arrived (read or not)."""
        return self._eof

    # -- the connection's side -------------------------------------------------------------------------

    def feed(self, data: bytes) -> bool:
        """Bytes of the body arrived; True when reading should pause (the buffer is over its high water)."""
        if self._dropping:
            return False
        self._chunks.append(data)
        self._buffered += len(data)
        self.total_bytes += len(data)
        self._wake()
        return self._conn is not None and self._buffered > self._conn.limits.high_water_bytes

    def finish(self) -> None:
        self._eof = True
        self._wake()

    def fail(self, error: BaseException) -> None:
        if not self._eof and self._error is None:
            self._error = error
            self._wake()

    def drop(self) -> None:
        """Nobody will read the rest: what arrives from now on is dropped."""
        self._dropping = True
        self._chunks.clear()
        self._buffered = 0

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- the handler's side ----------------------------------------------------------------------------

    def read_nowait(self) -> bytes:
        """What has arrived and not been read (all of the body once ``complete``), without waiting."""
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        if self._conn is not None:
            self._conn.body_drained()
        return data

    async def readany(self) -> bytes:
        """The bytes that have arrived (at least one, waiting for them), ``b""`` once the body has ended."""
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self._eof:
                return b""
            await self._wait()
        return self.read_nowait()

    async def read(self, limit: int) -> bytes:
        """The whole body; :class:`HTTPError` 413 once it exceeds ``limit`` bytes."""
        parts: list[bytes] = []
        size = 0
        while chunk := await self.readany():
            size += len(chunk)
            if size > limit:
                raise HTTPError(413, f"request body exceeds the limit of {limit} bytes")
            parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def _wait(self) -> None:
        conn = self._conn
        assert conn is not None  # a stream without a connection is complete from the start
        if self._expect:  # the client waits for this before it sends the body
            self._expect = False
            conn.write_raw(_CONTINUE)
        loop = conn.loop
        self._waiter = waiter = loop.create_future()
        timer = loop.call_later(conn.limits.body_timeout_s, _expire, waiter)
        try:
            await waiter
        except TimeoutError:
            error = HTTPError(408, f"request body timed out: no bytes for {conn.limits.body_timeout_s:g} s")
            self.fail(error)
            raise error from None
        finally:
            timer.cancel()
            self._waiter = None


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class Request:
    """One request: ``method``, ``path`` (decoded), ``raw_path`` (as sent), ``query_string``, ``version``
    (``"1.1"``), ``headers`` (case-insensitive), ``match_info`` (the route's ``{placeholders}``, decoded),
    ``content`` (the body, a :class:`BodyStream`) and ``keep_alive`` (whether the client keeps the
    connection). ``max_body_bytes``: what :meth:`read` accepts (413 above). ``raw_headers``: the header
    lines as they came, (name, value) bytes pairs in order (a proxy passes some on without decoding them)."""

    __slots__ = ("method", "raw_path", "query_string", "version", "headers", "match_info", "content",
                 "keep_alive", "max_body_bytes", "raw_headers", "_conn", "_path", "_query")

    def __init__(self, method: str, raw_path: str, query_string: str, version: str,
                 headers: CIMultiDict[str], content: BodyStream, keep_alive: bool,
                 conn: _Connection | None = None, max_body_bytes: int = 1024**2,
                 raw_headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self.method = method
        self.raw_path = raw_path
        self.query_string = query_string
        self.version = version
        self.headers = headers
        self.match_info: dict[str, str] = {}
        self.content = content
        self.keep_alive = keep_alive
        self.max_body_bytes = max_body_bytes
        self.raw_headers = raw_headers if raw_headers is not None else [
            (k.encode("latin-1"), v.encode("utf-8", "surrogateescape")) for k, v in headers.items()]
        self._conn = conn
        self._path: str | None = None
        self._query: MultiDictProxy[str] | None = None

    @property
    def path(self) -> str:
        """The path, percent-decoded."""
        if self._path is None:
            self._path = urllib.parse.unquote(self.raw_path) if "%" in self.raw_path else self.raw_path
        return self._path

    @property
    def query(self) -> MultiDictProxy[str]:
        """The query string's parameters (the first of a repeated one for ``get``)."""
        if self._query is None:
            self._query = MultiDictProxy(MultiDict(urllib.parse.parse_qsl(self.query_string, keep_blank_values=True)))
        return self._query

    @property
    def content_type(self) -> str:
        """The body's media type, lowercase, without parameters (``application/octet-stream`` when absent)."""
        raw = self.headers.get("Content-Type")
        if not raw:
            return "application/octet-stream"
        return raw.partition(";")[0].strip().lower()

    @property
    def content_length(self) -> int | None:
        """The declared Content-Length (bytes); None for a chunked body or none declared."""
        raw = self.headers.get("Content-Length")
        return int(raw) if raw is not None and raw.isdigit() else None

    @property
    def can_read_body(self) -> bool:
        """Whether a body remains to be read."""
        return not self.content.at_eof

    @property
    def disconnected(self) -> bool:
        """Whether the client has gone away (its answer will be dropped)."""
        return self._conn is not None and self._conn.closed

    async def read(self) -> bytes:
        """The whole body; :class:`HTTPError` 413 above ``max_body_bytes``."""
        return await self.content.read(self.max_body_bytes)

    async def json(self) -> Any:
        """The body parsed as JSON (``ValueError`` when it is not)."""
        return json.loads(await self.read())


class Response:
    """An answer: ``status``, ``body`` (bytes), ``headers`` and ``content_type`` (its ``Content-Type``
    unless ``headers`` has one; ``application/octet-stream`` for a body with neither). The server adds
    ``Content-Length``, ``Date`` and ``Connection``."""

    __slots__ = ("status", "body", "headers", "content_type")

    def __init__(self, body: bytes = b"", status: int = 200, headers: Mapping[str, str] | None = None,
                 content_type: str | None = None) -> None:
        self.status = status
        self.body = body
        self.headers = headers
        self.content_type = content_type

    def encode(self, keep_alive: bool, http10: bool, head_only: bool, date: bytes) -> bytes:
        """The answer as bytes on the wire (its head and, unless ``head_only``, its body). ``ValueError``
        for a header name or value that would break the head (a line break)."""
        status = self.status
        reason = _REASONS.get(status, b"Unknown")
        lines = []
        content_type = self.content_type
        typed = False
        if self.headers:
            for name, value in self.headers.items():
                if "\n" in value or "\r" in value or "\n" in name or "\r" in name or ":" in name:
                    raise ValueError(f"header {name!r} has a line break or colon")
                low = name.lower()
                if low in _OWN_HEADERS:
                    continue
                typed = typed or low == "content-type"
                lines.append(f"{name}: {value}\r\n")
        body = self.body
        if not typed and (content_type is not None or body):
            lines.append(f"Content-Type: {content_type or 'application/octet-stream'}\r\n")
        bodiless = status < 200 or status in (204, 304)
        if not bodiless:
            lines.append(f"Content-Length: {len(body)}\r\n")
        if not keep_alive:
            lines.append("Connection: close\r\n")
        elif http10:
            lines.append("Connection: keep-alive\r\n")
        head = b"HTTP/1.1 %d %s\r\n%sDate: %s\r\n\r\n" % (status, reason, "".join(lines).encode("utf-8"), date)
        return head if head_only or bodiless or not body else head + body


# ---------------------------------------------------------------------------------------------- routing


@dataclass(frozen=True)
class Route:
    """One row of a server's route table: ``method``, ``path`` (``/v1/apps/{name}``: a ``{placeholder}`` is
    one non-empty path segment) and the ``handler``."""

    method: str
    path: str
    handler: Handler


def get(path: str, handler: Handler) -> Route:
    """A GET route (HEAD too: the same answer without its body)."""
    return Route("GET", path, handler)


def post(path: str, handler: Handler) -> Route:
    """A POST route."""
    return Route("POST", path, handler)


def put(path: str, handler: Handler) -> Route:
    """A PUT route."""
    return Route("PUT", path, handler)


def delete(path: str, handler: Handler) -> Route:
    """A DELETE route."""
    return Route("DELETE", path, handler)


class _Chain:
    """A handler behind one middleware: calling it calls ``middleware(request, inner)``."""

    __slots__ = ("middleware", "inner")

    def __init__(self, middleware: Middleware, inner: Handler) -> None:
        self.middleware = middleware
        self.inner = inner

    def __call__(self, request: Request) -> Awaitable[Response]:
        return self.middleware(request, self.inner)


def _chain(handler: Handler, middlewares: Iterable[Middleware]) -> Handler:
    for middleware in reversed(list(middlewares)):
        handler = _Chain(middleware, handler)
    return handler


def _segments(raw_path: str) -> tuple[str, ...]:
    """A path's segments, each percent-decoded on its own (so that ``%2F`` stays inside its segment)."""
    parts = raw_path.split("/")
    if "%" in raw_path:
        parts = [urllib.parse.unquote(p) if "%" in p else p for p in parts]
    return tuple(parts)


class Router:
    """A route table resolved: exact paths by lookup, paths with placeholders in the table's order among
    those with as many segments. The handlers it returns are wrapped in ``middlewares``, outermost first."""

    def __init__(self, routes: Iterable[Route], middlewares: Iterable[Middleware] = ()) -> None:
        self._middlewares = list(middlewares)
        # (method, raw path) -> what resolve() found: a server sees the same few paths again and again
        self._cache: dict[tuple[str, str], tuple[Handler, dict[str, str]]] = {}
        self._static: dict[tuple[str, ...], dict[str, Handler]] = {}
        # by segment count: (pattern, its placeholders' positions and names, method -> handler)
        self._dynamic: dict[int, list[tuple[tuple[str | None, ...], tuple[tuple[int, str], ...], dict[str, Handler]]]] = {}
        for route in routes:
            handler = _chain(route.handler, self._middlewares)
            methods = (route.method, "HEAD") if route.method == "GET" else (route.method,)
            parts = tuple(route.path.split("/"))
            names = tuple((i, p[1:-1]) for i, p in enumerate(parts) if p.startswith("{") and p.endswith("}"))
            if not names:
                table = self._static.setdefault(parts, {})
            else:
                pattern = tuple(None if (i, p[1:-1]) in names else p for i, p in enumerate(parts))
                rows = self._dynamic.setdefault(len(parts), [])
                row = next((r for r in rows if r[0] == pattern), None)
                if row is None:
                    row = (pattern, names, {})
                    rows.append(row)
                table = row[2]
            for method in methods:
                table.setdefault(method, handler)

    def resolve(self, method: str, raw_path: str) -> tuple[Handler, dict[str, str]]:
        """The handler (behind the middlewares) for ``method`` on ``raw_path`` and the placeholders' values;
        for a path no route matches, or a method it does not take, a handler that raises :class:`HTTPError`
        404 (``no such endpoint``) or 405 (with ``Allow``), behind the same middlewares."""
        found = self._cache.get((method, raw_path))
        if found is not None:
            return found[0], dict(found[1]) if found[1] else {}
        segments = _segments(raw_path)
        allowed: set[str] = set()
        table = self._static.get(segments)
        if table is not None:
            handler = table.get(method)
            if handler is not None:
                return self._found(method, raw_path, handler, {})
            allowed.update(table)
        for pattern, names, table in self._dynamic.get(len(segments), ()):
            for want, got in zip(pattern, segments):
                if (want is None and not got) or (want is not None and want != got):
                    break
            else:
                handler = table.get(method)
                if handler is not None:
                    return self._found(method, raw_path, handler, {name: segments[i] for i, name in names})
                allowed.update(table)
        path = "/".join(segments)
        if allowed:
            error = HTTPError(405, f"method {method} is not allowed on {clip(path, _PATH_CLIP)}",
                              {"Allow": ",".join(sorted(allowed))})
        else:
            error = HTTPError(404, f"no such endpoint: {method} {clip(path, _PATH_CLIP)}")
        return _chain(_Raise(error), self._middlewares), {}

    def _found(self, method: str, raw_path: str, handler: Handler, match: dict[str, str]) -> tuple[Handler, dict[str, str]]:
        if len(self._cache) >= 4096:  # a bound: clients may send many distinct paths (app names, versions)
            self._cache.clear()
        self._cache[(method, raw_path)] = (handler, match)
        return handler, dict(match) if match else {}


class _Raise:
    """A handler that refuses every request with one error (no route, wrong method)."""

    def __init__(self, error: HTTPError) -> None:
        self.error = error

    async def __call__(self, request: Request) -> Response:
        raise self.error


class Application:
    """A server's route table, middlewares (outermost first), its error handler (``errors``: the answer to a
    request whose handler or middleware raised; without one, the core answers its own :class:`HTTPError`
    and a 500 for anything else) and lifecycle hooks (``on_startup`` before it listens, ``on_cleanup`` after
    it has stopped: coroutine functions without arguments). ``client_max_size`` bounds what
    ``request.read()`` accepts (bytes, 413 above); handlers that stream a body set their own bound."""

    def __init__(self, routes: Iterable[Route] = (), *, middlewares: Iterable[Middleware] = (),
                 errors: Callable[[Request, Exception], Response] | None = None,
                 client_max_size: int = 1024**2) -> None:
        self.routes = list(routes)
        self.middlewares: list[Middleware] = list(middlewares)
        self.errors = errors
        self.on_startup: list[Callable[[], Awaitable[None]]] = []
        self.on_cleanup: list[Callable[[], Awaitable[None]]] = []
        self.client_max_size = client_max_size

    def router(self) -> Router:
        """The route table resolved, with the middlewares as they are now."""
        return Router(self.routes, self.middlewares)


# ------------------------------------------------------------------------------------------ the connection


_IDLE, _HEAD, _LINGER = "idle", "head", "linger"


class _Connection(asyncio.Protocol):
    """One client connection: parses its requests, runs their handlers one at a time in arrival order and
    writes their answers (see the module docstring)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.loop = server.loop
        self.limits = server.limits
        self._router = server.router
        self._errors = server.app.errors
        self._max_body = server.app.client_max_size
        self._parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        # the message being parsed
        self._url = b""
        self._raw_headers: list[tuple[bytes, bytes]] = []
        self._head_bytes = 0
        self._in_head = False
        self._head_timed = False
        self._head_seen = 0
        self._error: HTTPError | None = None    # raised in a parser callback
        self._current: Request | None = None    # its head is parsed, its body is arriving
        # the requests whose heads are parsed: the one being answered, then those waiting their turn
        self._active: Request | None = None
        self._task: asyncio.Task[None] | None = None     # answers the requests, one after the other
        self._waiter: asyncio.Future[Request | None] | None = None  # the task waiting for the next request
        self._pending: collections.deque[Request] = collections.deque()
        self._refusal: HTTPError | None = None  # the answer to a malformed request, due after the others
        self._broken = False                    # nothing more can be parsed: close after the answers due
        self._stopping = False                  # the server stops: close after the answer in flight
        self._closing = False                   # closed, or closing: parse nothing more
        self._eof = False
        self._reading_paused = False
        self._body_full = False
        self._writing_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._deadline: float | None = None
        self._deadline_kind = _IDLE
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    # -- asyncio.Protocol ------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP or TLS transport
        self.server.connections.add(self)
        if self.server.stopping:
            self.transport.close()  # type: ignore[union-attr]
            return
        self._set_deadline(_IDLE, self.limits.keepalive_timeout_s)

    def data_received(self, data: bytes) -> None:
        if self._broken or self._closing:
            return  # lingering, or past a request that could not be parsed: dropped
        was_in_head = self._in_head
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._broken = True  # no other protocol is spoken here: the connection ends after the answers
            return
        except httptools.HttpParserCallbackError:
            if self._closing:
                return  # stopped at a request behind the last one answered
            self._fail_input(self._error or HTTPError(400, "malformed HTTP request"))
            return
        except httptools.HttpParserError as e:
            self._fail_input(HTTPError(400, f"malformed HTTP request: {e}"))
            return
        if self._in_head:
            if was_in_head:  # a head that does not end: httptools buffers a header line whole
                self._head_seen += len(data)
                if self._head_seen > self.limits.max_head_bytes + self.limits.max_line_bytes:
                    self._fail_input(HTTPError(431, f"request head over {self.limits.max_head_bytes} bytes"))
                    return
            if not self._head_timed and self._active is None:
                # the head began in this read and is not whole: its timeout runs from now (a head that comes
                # whole in one read, the usual request, never needs one)
                self._head_timed = True
                self._set_deadline(_HEAD, self.limits.head_timeout_s)

    def eof_received(self) -> bool:
        self._eof = True
        if self._current is not None:
            self._current.content.fail(ClientDisconnected("the client closed the connection mid-body"))
        # keep the transport to write the answers still due (a client may half-close after its request)
        return self._active is not None or bool(self._pending)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._deadline = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        gone = ClientDisconnected("the client closed the connection")
        for request in (self._current, self._active, *self._pending):
            if request is not None:
                request.content.fail(gone)
        self._pending.clear()
        self._wake_writer()
        self._no_more_requests()
        self.server.forget(self)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._wake_writer()

    # -- httptools callbacks ---------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._closing:
            raise ConnectionAbortedError("closing")  # stops the parser: nothing behind the last answer is read
        self._url = b""
        self._raw_headers = []
        self._head_bytes = 0
        self._head_seen = 0
        self._in_head = True
        self._head_timed = False  # data_received starts the head's timeout if the head is not whole in its read

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > self.limits.max_line_bytes:
            self._error = HTTPError(414, f"request target over {self.limits.max_line_bytes} bytes")
            raise self._error

    def on_header(self, name: bytes, value: bytes) -> None:
        # checked as a whole at the end of the head (within one read; across reads data_received bounds it)
        self._raw_headers.append((name, value))
        self._head_bytes += len(name) + len(value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        parser = self._parser
        raw = self._raw_headers
        limits = self.limits
        if len(raw) > limits.max_headers or self._head_bytes + 4 * len(raw) > limits.max_head_bytes:
            self._error = HTTPError(431, f"request head over {limits.max_head_bytes} bytes or "
                                         f"{limits.max_headers} header lines")
            raise self._error
        headers = CIMultiDict([(n.decode("latin-1"), v.decode("utf-8", "surrogateescape")) for n, v in raw])
        version = parser.get_http_version()
        url = self._url
        if url[:1] == b"/":
            path, _, query = url.partition(b"?")
            path = path.partition(b"#")[0]
        else:  # absolute form (a proxy's), or "*"
            try:
                parsed = httptools.parse_url(url)
            except httptools.HttpParserInvalidURLError:
                self._error = HTTPError(400, "malformed HTTP request: invalid request target")
                raise self._error from None
            path, query = parsed.path or b"/", parsed.query or b""
        if version == "1.1" and "Host" not in headers:
            self._error = HTTPError(400, "malformed HTTP request: an HTTP/1.1 request needs a Host header")
            raise self._error
        has_body = "Transfer-Encoding" in headers or headers.get("Content-Length", "0") != "0"
        expect = version == "1.1" and headers.get("Expect", "").lower() == "100-continue"
        request = Request(parser.get_method().decode("ascii"), path.decode("latin-1"), query.decode("latin-1"),
                          version, headers, BodyStream(self, has_body, expect), parser.should_keep_alive(),
                          self, self._max_body, raw)
        self._current = request
        if self._active is None and not self._stopping:
            self._start(request)
        else:
            self._pending.append(request)
            self._pause_reading()  # one request waits its turn: read no more until it is answered

    def on_body(self, body: bytes) -> None:
        if self._current is not None and self._current.content.feed(body):
            self._body_full = True
            self._pause_reading()

    def on_message_complete(self) -> None:
        request = self._current
        self._current = None
        if request is None:
            return
        request.content.finish()

    # -- answering -------------------------------------------------------------------------------------

    def _start(self, request: Request) -> None:
        """Answer ``request`` now: hand it to the connection's task, which waits for it, or start one."""
        self._active = request
        self._deadline = None
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            waiter.set_result(request)
        else:
            self._task = self.loop.create_task(self._serve(request))

    async def _serve(self, request: Request | None) -> None:
        """The connection's task: answers its requests one after the other, and waits between them (one task
        per connection rather than one per request)."""
        while request is not None and await self._answer(request):
            request = self._next()
            if request is None and not self._closing:
                self._waiter = self.loop.create_future()
                request = await self._waiter
        self._task = None

    async def _answer(self, request: Request) -> bool:
        """Run ``request``'s handler and write its answer; whether the connection goes on."""
        handler, request.match_info = self._router.resolve(request.method, request.raw_path)
        try:
            response = await handler(request)
            if not isinstance(response, Response):
                raise TypeError(f"a handler answered {type(response).__name__}, not a Response")
        except Exception as e:  # noqa: BLE001 - the server's error handler answers; the core, without one
            response = self._failed(request, e)
        if self.closed:
            self._active = None
            return False  # the client went away: nobody reads the answer
        keep = request.keep_alive and request.content.complete and not self._stopping
        try:
            data = response.encode(keep, request.version == "1.0", request.method == "HEAD", _date())
        except ValueError as e:
            logger.error("error in %s %s: %s", request.method, request.path, e)
            data = _error_response(500, "internal error: a malformed answer").encode(False, False, False, _date())
            keep = False
        self.write_raw(data)
        if self._writing_paused:
            await self._drained()
        self._active = None
        if not keep:
            self._close_after(request)
        return keep and not self._closing

    def _failed(self, request: Request, e: Exception) -> Response:
        """The answer to a request whose handler raised ``e``: the application's error handler's, else the
        core's own (its :class:`HTTPError` as it is, anything else a logged 500)."""
        if self._errors is not None:
            try:
                return self._errors(request, e)
            except Exception as again:  # noqa: BLE001 - a bug in the error handler itself: still an answer
                e = again
        if isinstance(e, HTTPError):
            return _error_response(e.status, e.message, e.headers)
        logger.error("error in %s %s", request.method, request.path, exc_info=e)
        return _error_response(500, f"internal error: {type(e).__name__}")

    def _next(self) -> Request | None:
        """The answer is out on a kept connection: the next request to answer, if one waits; else None, and
        the connection waits for one (or closes, when none can come)."""
        if self._pending:
            request = self._active = self._pending.popleft()
            if not self._pending:
                self._resume_reading()
            return request
        if self._refusal is not None:
            self._refuse(self._refusal)
            return None
        if self._eof:  # no further request can come
            self._close()
            return None
        if self._broken:  # past a request the server does not go on from (an upgrade)
            self._linger()
            return None
        if self._in_head:
            self._head_timed = True
            self._set_deadline(_HEAD, self.limits.head_timeout_s)
        else:
            self._set_deadline(_IDLE, self.limits.keepalive_timeout_s)
        self._resume_reading()
        return None

    def _close_after(self, request: Request) -> None:
        """Close once the answer is out (see :meth:`_linger`)."""
        request.content.drop()
        self._linger()

    def _linger(self) -> None:
        """Close after an answer: the sending side at once (the client reads the answer, then the end), the
        receiving side once the client has closed its own or after ``linger_s``, dropping what it still sends
        meanwhile. Closing both at once on unread bytes (the rest of a body, a request pipelined behind) would
        reset the connection, and the client could lose the answer."""
        if self.closed or self._eof or self.transport is None:
            self._close()
            return
        self._broken = True  # nothing more is parsed: what comes is dropped
        self._pending.clear()
        if self._current is not None:
            self._current.content.drop()
        self._body_full = False
        self._resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._set_deadline(_LINGER, self.limits.linger_s)

    def _fail_input(self, error: HTTPError) -> None:
        """The input cannot be parsed any further: the request whose body broke is told (its answer closes
        the connection); a head that broke is answered ``error`` after the answers due before it."""
        self._broken = True
        self._in_head = False
        request = self._current
        if request is not None and not request.content.complete:
            request.content.fail(error)
            return
        if self._active is None and not self._pending:
            self._refuse(error)
        else:
            self._refusal = error

    def _refuse(self, error: HTTPError) -> None:
        """Answer a request that could not be parsed (or came too slowly) with its JSON error, and close."""
        self._pending.clear()
        if not self.closed and self.transport is not None:
            self.write_raw(_error_response(error.status, error.message).encode(False, False, False, _date()))
        self._linger()

    def write_raw(self, data: bytes) -> None:
        if self.transport is not None and not self._closing:
            self.transport.write(data)

    async def _drained(self) -> None:
        """Wait until the client has read enough of what was written; drop it after ``write_timeout_s``."""
        self._drain = self.loop.create_future()
        timer = self.loop.call_later(self.limits.write_timeout_s, _expire, self._drain)
        try:
            await self._drain
        except TimeoutError:
            self.abort()
        finally:
            timer.cancel()
            self._drain = None

    def _wake_writer(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    # -- flow control ----------------------------------------------------------------------------------

    def _pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None and not self.closed:
            self._reading_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._reading_paused and not self._pending and not self._body_full and not self.closed:
            self._reading_paused = False
            assert self.transport is not None
            self.transport.resume_reading()

    def body_drained(self) -> None:
        """A handler read the buffered body: read on."""
        if self._body_full:
            self._body_full = False
            self._resume_reading()

    # -- timeouts and closing --------------------------------------------------------------------------

    def _set_deadline(self, kind: str, seconds: float) -> None:
        """From now, ``kind``'s timeout runs out in ``seconds``. One timer per connection, re-armed lazily:
        most deadlines are replaced before they run out, at the cost of a float each."""
        at = self.loop.time() + seconds
        self._deadline, self._deadline_kind = at, kind
        if self._timer is None or at < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = at
            self._timer = self.loop.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self._deadline is None or self.closed:
            return
        if self.loop.time() < self._deadline:
            self._timer_at = self._deadline
            self._timer = self.loop.call_at(self._deadline, self._on_timer)
            return
        kind, self._deadline = self._deadline_kind, None
        if kind == _HEAD and self._active is None and not self._pending:
            self._broken = True
            self._refuse(HTTPError(408, f"request head timed out after {self.limits.head_timeout_s:g} s"))
        elif kind in (_IDLE, _LINGER, _HEAD):
            self._close()

    def _close(self) -> None:
        self._closing = True
        self._deadline = None
        self._no_more_requests()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def _no_more_requests(self) -> None:
        """The task waiting for the next request ends: none will come."""
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def shutdown(self) -> None:
        """The server stops: close now when idle, else after the answer in flight."""
        self._stopping = True
        self._pending.clear()
        if self._active is None:
            self._close()

    def abort(self) -> None:
        """Drop the connection at once (its handler, if any, is cancelled)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self.transport is not None:
            self.transport.abort()


def _error_response(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    """The server's own JSON error (the error tables' shape), for what no handler answers."""
    return Response(json.dumps({"error": message}, separators=(",", ":")).encode("utf-8"), status, headers,
                    content_type="application/json")


class _DateCache:
    """The ``Date`` header's value, formatted once a second."""

    second = 0
    value = b""


def _date() -> bytes:
    """The ``Date`` header's value now (formatted once a second)."""
    now = int(time.time())
    if now != _DateCache.second:
        _DateCache.second, _DateCache.value = now, email.utils.formatdate(now, usegmt=True).encode("ascii")
    return _DateCache.value


# ---------------------------------------------------------------------------------------------- the server


class Server:
    """An :class:`Application` listening (see the module docstring): :meth:`start` runs its ``on_startup``
    hooks and binds; :meth:`stop` stops it gracefully and runs its ``on_cleanup`` hooks."""

    def __init__(self, app: Application, limits: Limits | None = None) -> None:
        self.app = app
        self.limits = limits or Limits()
        self.loop = asyncio.get_running_loop()
        self.router = app.router()
        self.connections: set[_Connection] = set()
        self.stopping = False
        self.addresses: list[tuple[str, int]] = []
        self._listener: asyncio.AbstractServer | None = None
        self._gone: asyncio.Event | None = None

    async def start(self, host: str, port: int, ssl_context: Any = None) -> None:
        """Run the startup hooks and listen on ``host``:``port`` (0: an ephemeral port), over TLS with
        ``ssl_context``. ``OSError`` when the address cannot be bound (the cleanup hooks have run then)."""
        for hook in self.app.on_startup:
            await hook()
        self.router = self.app.router()  # the middlewares as they are now
        try:
            self._listener = await self.loop.create_server(lambda: _Connection(self), host, port, ssl=ssl_context)
        except BaseException:
            await self._cleanup()
            raise
        self.addresses = [(str(s.getsockname()[0]), int(s.getsockname()[1])) for s in self._listener.sockets]

    async def stop(self, timeout_s: float = 60.0) -> None:
        """Stop accepting, close idle connections, give in-flight requests ``timeout_s`` seconds to be
        answered, drop what is left, then run the cleanup hooks."""
        self.stopping = True
        if self._listener is not None:
            self._listener.close()
        for conn in list(self.connections):
            conn.shutdown()
        if self.connections:
            self._gone = asyncio.Event()
            try:
                await asyncio.wait_for(self._gone.wait(), timeout_s)
            except TimeoutError:
                tasks = [c._task for c in self.connections if c._task is not None]
                for conn in list(self.connections):
                    conn.abort()
                if tasks:
                    await asyncio.wait(tasks, timeout=1.0)
        await self._cleanup()

    async def _cleanup(self) -> None:
        for hook in self.app.on_cleanup:
            await hook()

    def forget(self, conn: _Connection) -> None:
        self.connections.discard(conn)
        if not self.connections and self._gone is not None:
            self._gone.set()
