"""What the runtime's HTTP servers (agent, control plane, gateway) and clients share, so that each is written
one way:

- **one server core**: :mod:`edgemux.runtime.httpserver` (HTTP/1.1 on asyncio and httptools) serves each of
  them; :func:`make_application` builds a server's application and :func:`start_site` binds it;
- **one handler pattern**: each server wraps its service object in a handlers class whose methods are the
  handlers (``async (Request) -> Response``) and whose ``routes()`` is the server's route table, a list of
  routes (``httpserver.get(path, handler)``...) that :func:`make_application` installs;
- **one error handler**: each server lists its own error types and the answer each gets as data, an
  :class:`ErrorTable` (first matching row wins), which answers whatever a handler or a middleware raises;
  the core's own refusals (no route, wrong method, a body over
  its limit, broken off or too slow), a client that went away and an unexpected exception are answered the
  same way by every server (an unexpected one is logged with its traceback and answered 500);
- **one JSON answer**: :func:`json_response` (compact JSON) and :func:`error_response` (``{"error": ...}``
  plus any extra fields);
- reading a request: the body with a size limit (:func:`read_body`), JSON parsed into a clear 4xx
  (:func:`parse_json`);
- text: :func:`quote` (a name as one URL path segment), :func:`clip` (a client-sent name cut to one readable
  line), :func:`describe_exc` (an exception as ``Type: message``).

The text helpers import nothing of the serving stack: the CLI and the control plane's client use them
without it installed; the server helpers import the server core when called. Units: bytes, seconds.
"""

from __future__ import annotations

import json
import logging
import math
import socket
import ssl
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the clients (CLI, control-plane client) use this module without the serving stack
    from edgemux.runtime.httpserver import Application, Limits, Request, Response, Route, Server

__all__ = ["Answer", "ErrorTable", "Site", "clip", "describe_exc", "error_response", "json_response",
           "make_application", "parse_json", "quote", "read_body", "retry_after_header", "start_site"]

ErrorFactory = Callable[[str, int], Exception]


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


def json_response(obj: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    """``obj`` as a compact JSON answer (``application/json``) with ``status`` and extra ``headers``."""
    from edgemux.runtime.httpserver import Response

    return Response(json.dumps(obj, separators=(",", ":")).encode("utf-8"), status, headers,
                    content_type="application/json")


def error_response(status: int, message: str, headers: Mapping[str, str] | None = None,
                   **extra: Any) -> Response:
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

    def response(self) -> Response:
        return error_response(self.status, self.message, self.headers, **self.extra)


ErrorRow = tuple["type[BaseException] | tuple[type[BaseException], ...]", Callable[[Any], Answer]]


class ErrorTable:
    """A server's own errors as HTTP answers: rows of (exception type or types, the answer to one), the
    first row whose types match wins. Before them, every table answers the server core's own refusals
    (``httpserver.HTTPError``: no route 404, wrong method 405 with its ``Allow``, a body over its limit 413,
    a body that broke off 400 or came too slowly 408) as they are; after them, a client that went away (400:
    nobody reads it) and anything else (500). Every 500 is logged with its traceback: a bug or a backend
    failure, never the client's mistake."""

    def __init__(self, rows: Sequence[ErrorRow], logger: logging.Logger) -> None:
        from edgemux.runtime.httpserver import HTTPError

        self.rows: tuple[ErrorRow, ...] = (
            (HTTPError, lambda e: Answer(e.status, e.message, headers=e.headers)),
            *rows,
            (ConnectionError, lambda e: Answer(400, f"client disconnected: {type(e).__name__}")),
        )
        self.logger = logger

    def answer(self, e: BaseException) -> Answer:
        """The answer to ``e`` (500 for an exception no row names)."""
        for kinds, answer in self.rows:
            if isinstance(e, kinds):
                return answer(e)
        return Answer(500, f"internal error: {describe_exc(e)}")

    def respond(self, request: Request, e: Exception) -> Response:
        """The answer to a request whose handler (or a middleware) raised ``e``: JSON (``{"error": ...}``)
        with its status; a 500 is logged with its traceback. The server core calls it (``Application``'s
        ``errors``): the one error handler of a server, around the middlewares and the handlers."""
        answer = self.answer(e)
        if answer.status == 500:  # a bug or a backend failure, never a client's mistake: keep the traceback
            self.logger.error("error in %s %s: %s", request.method, request.path, answer.message, exc_info=e)
        return answer.response()


def make_application(routes: Iterable[Route], errors: ErrorTable, *, auth: Any = None,
                     client_max_size: int = 1024**2) -> Application:
    """The application of one server: its error table answers whatever fails (``ErrorTable.respond``),
    authentication comes first (``auth``, a middleware from ``runtime.auth``: a request without the
    credential it needs never reaches a handler), then the route table. ``client_max_size`` bounds what
    ``request.read()`` accepts (bytes)."""
    from edgemux.runtime.httpserver import Application

    return Application(routes, middlewares=[auth] if auth is not None else [], errors=errors.respond,
                       client_max_size=client_max_size)


@dataclass
class Site:
    """A server listening: its ``server`` (``httpserver.Server``), ``url`` the address it bound
    (``http(s)://HOST:PORT``, a wildcard host as bound) and ``public_url`` where others reach it (the
    host's name for a wildcard host); :meth:`stop` stops it (in-flight requests get ``shutdown_timeout_s``
    seconds) and runs the application's cleanup."""

    server: Server
    url: str
    public_url: str
    shutdown_timeout_s: float = 60.0

    async def stop(self) -> None:
        await self.server.stop(self.shutdown_timeout_s)


async def start_site(app: Application, host: str, port: int, *, ssl_context: ssl.SSLContext | None = None,
                     shutdown_timeout_s: float | None = None, limits: Limits | None = None) -> Site:
    """Serve ``app`` on ``host``:``port`` (0: an ephemeral port), over TLS with ``ssl_context``; in-flight
    requests get ``shutdown_timeout_s`` seconds to finish when it stops (60 s when None); ``limits``: what
    the server allows a client (``httpserver.Limits``: sizes, timeouts). Raises ``OSError`` when the address
    cannot be bound (nothing is left running then)."""
    from edgemux.runtime.httpserver import Server

    server = Server(app, limits)
    await server.start(host, port, ssl_context)  # runs on_startup first
    bhost, bport = server.addresses[0]
    scheme = "https" if ssl_context is not None else "http"
    public = socket.gethostname() if bhost in ("0.0.0.0", "::") else bhost
    return Site(server, f"{scheme}://{_url_host(bhost)}:{bport}", f"{scheme}://{_url_host(public)}:{bport}",
                60.0 if shutdown_timeout_s is None else shutdown_timeout_s)


def _url_host(host: str) -> str:
    """A host as it is written in a URL: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


# --------------------------------------------------------------------------------------------- reading


async def read_body(request: Request, limit: int, error: ErrorFactory) -> bytes:
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
