"""What the runtime's HTTP servers (agent, control plane, gateway) and clients share, so that each is written
one way:

- **one handler pattern**: each server wraps its service object in a handlers class whose methods are the
  aiohttp handlers and whose ``routes()`` is the server's route table, a list of aiohttp route definitions
  (``web.get(path, handler)``...) that :func:`make_application` installs;
- **one error middleware**: each server lists its own error types and the answer each gets as data, an
  :class:`ErrorTable` (first matching row wins); aiohttp's own errors (no route, wrong method), a request the
  HTTP parser refused, a client that went away and an unexpected exception are answered the same way by
  every server (an unexpected one is logged with its traceback and answered 500);
- **one JSON answer**: :func:`json_response` (compact JSON) and :func:`error_response` (``{"error": ...}``
  plus any extra fields);
- reading a request: the body with a size limit (:func:`read_body`), JSON parsed into a clear 4xx
  (:func:`parse_json`);
- text: :func:`quote` (a name as one URL path segment), :func:`clip` (a client-sent name cut to one readable
  line), :func:`describe_exc` (an exception as ``Type: message``).

The text helpers import nothing of the serving stack: the CLI and the control plane's client use them
without aiohttp installed; the server helpers import aiohttp when called. Units: bytes.
"""

from __future__ import annotations

import json
import logging
import math
import socket
import ssl
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the clients (CLI, control-plane client) use this module without the serving stack
    from aiohttp import web

__all__ = ["Answer", "ErrorTable", "Site", "clip", "describe_exc", "error_response", "json_response",
           "make_application", "parse_json", "quote", "read_body", "retry_after_header", "start_site"]

ErrorFactory = Callable[[str, int], Exception]
Handler = Callable[["web.Request"], Awaitable["web.StreamResponse"]]
# How much of a request's path an error message quotes (characters): a scanner's long paths stay one line.
_PATH_CLIP = 120


# ------------------------------------------------------------------------------------------------- text


def quote(name: str) -> str:
    """``name`` as one URL path segment (or query value): every reserved character percent-encoded, ``/``
    included, so that an app, node or device name can never address another path."""
    return urllib.parse.quote(name, safe="")


def clip(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters (the last three ``...``) so that an error message quoting a
    client-sent name stays one readable line."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_exc(e: BaseException) -> str:
    """An exception as ``Type: message`` (just ``Type`` when it has no message), for one-line errors."""
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def retry_after_header(seconds: float) -> str:
    """A ``Retry-After`` value for a wait of ``seconds`` (s): whole seconds rounded up (HTTP has no fractions),
    at least 1 so that a client does not retry in a busy loop."""
    return str(max(1, math.ceil(seconds - 1e-9)))


# ------------------------------------------------------------------------------------------- answering


def json_response(obj: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    """``obj`` as a compact JSON answer (``application/json``) with ``status`` and extra ``headers``."""
    from aiohttp import web

    return web.Response(body=json.dumps(obj, separators=(",", ":")).encode("utf-8"), status=status,
                        content_type="application/json", headers=dict(headers) if headers else None)


def error_response(status: int, message: str, headers: Mapping[str, str] | None = None,
                   **extra: Any) -> web.Response:
    """The error answer every server gives: ``{"error": message, **extra}`` with ``status``."""
    return json_response({"error": message, **extra}, status, headers)


@dataclass(frozen=True)
class Answer:
    """An error's HTTP answer: ``status``, ``message`` (the body's ``error``), ``extra`` JSON fields beside it
    and ``headers`` (e.g. ``Retry-After``)."""

    status: int
    message: str
    extra: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)

    def response(self) -> web.Response:
        return error_response(self.status, self.message, self.headers, **self.extra)


ErrorRow = tuple["type[BaseException] | tuple[type[BaseException], ...]", Callable[[Any], Answer]]


class ErrorTable:
    """A server's own errors as HTTP answers: rows of (exception type or types, the answer to one), the
    first row whose types match wins. Beside them, every table answers what every server meets alike: a body
    the HTTP parser refused (400, or its 4xx), a client that went away (400: nobody reads it) and anything
    else (500). Every 500 is logged with its traceback: a bug or a backend failure, never the client's mistake."""

    def __init__(self, rows: Sequence[ErrorRow], logger: logging.Logger) -> None:
        from aiohttp.http_exceptions import HttpProcessingError

        def malformed(e: HttpProcessingError) -> Answer:
            return Answer(e.code if 400 <= e.code < 500 else 400, f"malformed HTTP request: {e.message}")

        self.rows: tuple[ErrorRow, ...] = (
            *rows,
            (HttpProcessingError, malformed),
            (ConnectionError, lambda e: Answer(400, f"client disconnected: {type(e).__name__}")),
        )
        self.logger = logger

    def answer(self, e: BaseException) -> Answer:
        """The answer to ``e`` (500 for an exception no row names)."""
        for kinds, answer in self.rows:
            if isinstance(e, kinds):
                return answer(e)
        return Answer(500, f"internal error: {describe_exc(e)}")

    def middleware(self) -> Any:
        """The aiohttp middleware answering every failure of a handler as JSON (``{"error": ...}``) with its
        status: this table's errors, and aiohttp's own (404 no route, 405 wrong method with its ``Allow``)."""
        from aiohttp import web

        @web.middleware
        async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
            try:
                return await handler(request)
            except web.HTTPException as e:  # aiohttp's own: no route (404), wrong method (405)...
                if e.status < 400:
                    raise
                message = e.reason
                if e.status == 404:
                    message = f"no such endpoint: {request.method} {clip(request.path, _PATH_CLIP)}"
                elif e.status == 405:
                    message = f"method {request.method} is not allowed on {clip(request.path, _PATH_CLIP)}"
                kept = {k: v for k, v in e.headers.items() if k.lower() in ("allow", "retry-after")}
                return error_response(e.status, message, kept)
            except Exception as e:
                answer = self.answer(e)
                if answer.status == 500:  # a bug or a backend failure, never a client's mistake: keep the traceback
                    self.logger.error("error in %s %s: %s", request.method, request.path, answer.message, exc_info=e)
                return answer.response()

        return errors


def make_application(routes: Iterable[web.RouteDef], errors: ErrorTable, *, auth: Any = None,
                     client_max_size: int = 1024**2) -> web.Application:
    """The aiohttp application of one server: authentication first (``auth``, a middleware from
    ``runtime.auth``: a request without the credential it needs never reaches a handler), then the error
    table's middleware, then the route table. ``client_max_size`` bounds what aiohttp itself buffers (bytes)."""
    from aiohttp import web

    middlewares = [m for m in (auth, errors.middleware()) if m is not None]
    app = web.Application(middlewares=middlewares, client_max_size=client_max_size)
    app.router.add_routes(list(routes))
    return app


@dataclass
class Site:
    """A server listening: its ``runner`` (``runner.cleanup()`` stops it), ``url`` the address it bound
    (``http(s)://HOST:PORT``, a wildcard host as bound) and ``public_url`` where others reach it (the
    host's name for a wildcard host)."""

    runner: web.AppRunner
    url: str
    public_url: str


async def start_site(app: web.Application, host: str, port: int, *, ssl_context: ssl.SSLContext | None = None,
                     shutdown_timeout_s: float | None = None) -> Site:
    """Serve ``app`` on ``host``:``port`` (0: an ephemeral port), over TLS with ``ssl_context``; in-flight
    requests get ``shutdown_timeout_s`` seconds to finish when it stops (aiohttp's default when None).
    Raises ``OSError`` when the address cannot be bound (nothing is left running then)."""
    from aiohttp import web

    runner = (web.AppRunner(app, access_log=None) if shutdown_timeout_s is None else
              web.AppRunner(app, access_log=None, shutdown_timeout=shutdown_timeout_s))
    await runner.setup()  # runs on_startup
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bhost, bport = str(runner.addresses[0][0]), int(runner.addresses[0][1])
    scheme = "https" if ssl_context is not None else "http"
    public = socket.gethostname() if bhost in ("0.0.0.0", "::") else bhost
    return Site(runner, f"{scheme}://{_url_host(bhost)}:{bport}", f"{scheme}://{_url_host(public)}:{bport}")


def _url_host(host: str) -> str:
    """A host as it is written in a URL: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


# --------------------------------------------------------------------------------------------- reading


async def read_body(request: web.Request, limit: int, error: ErrorFactory) -> bytes:
    """The request body, refusing (413) one above ``limit`` bytes: from Content-Length before reading
    anything, and while reading when the length is not declared (chunked). ``error`` is the server's own
    error type, a callable ``(message, status) -> Exception``."""
    length = request.content_length
    if length is not None and length > limit:
        raise error(f"request body of {length} bytes exceeds the limit of {limit} bytes", 413)
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await request.content.readany()
        if not chunk:
            break
        size += len(chunk)
        if size > limit:
            raise error(f"request body exceeds the limit of {limit} bytes", 413)
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json(raw: bytes, what: str, error: ErrorFactory) -> Any:
    """Parse JSON bytes; every failure is ``error(message, 400)`` saying where it went wrong."""
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise error(f"malformed {what} JSON: invalid UTF-8 at byte {e.start}", 400) from None
    except json.JSONDecodeError as e:
        raise error(f"malformed {what} JSON at line {e.lineno} column {e.colno}: {e.msg}", 400) from None
    except RecursionError:
        raise error(f"malformed {what} JSON: nested too deeply", 400) from None
    except ValueError as e:  # e.g. an integer literal longer than Python's int-conversion limit
        raise error(f"malformed {what} JSON: {e}", 400) from None
