"""gRPC listeners: the Open Inference Protocol's gRPC service (``dataplane.grpcwire``) served by an agent or a
gateway beside its HTTP listener, with the same handlers' logic, errors and credentials.

A service is a table of rpc name -> handler (``async (request message, call) -> response message``). A
handler fails the way an HTTP handler does, by raising; the server's own ``ErrorTable`` (the one its HTTP side
uses) gives the HTTP status and message, and :data:`CODES` the gRPC status code, so that both protocols say the
same thing about the same request. A ``Retry-After`` becomes the trailing metadata ``retry-after`` (seconds).
Credentials travel in the call metadata as on HTTP, ``authorization: Bearer <secret>`` (``runtime.auth``);
TLS uses the listener's ``--tls-cert``/``--tls-key``. grpcio is imported by this module only, and this module
only by the gRPC services (``edgemux agent --grpc-port``, ``edgemux gateway --grpc-port``).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# gRPC's C core writes its own errors to stderr (a port it cannot bind, twice: its line and ours); edgemux
# reports each failure once, as its own line. GRPC_VERBOSITY=debug (or ERROR) set by the user still wins.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

import grpc  # noqa: E402

from edgemux.runtime.auth import AuthError
from edgemux.runtime.httputil import Answer, ErrorTable

__all__ = ["CODES", "BindError", "GrpcSite", "Handler", "authorization", "code_of", "metadata", "start_grpc"]

Handler = Callable[[Any, Any], Awaitable[Any]]

# An HTTP status as the gRPC status code that says the same (gRPC's own HTTP mapping, read backwards, and
# Triton's choices: a policed request is RESOURCE_EXHAUSTED, no endpoint serving is UNAVAILABLE)
CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    405: grpc.StatusCode.UNIMPLEMENTED,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    409: grpc.StatusCode.ALREADY_EXISTS,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    500: grpc.StatusCode.INTERNAL,
    501: grpc.StatusCode.UNIMPLEMENTED,
    502: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def code_of(status: int) -> grpc.StatusCode:
    """The gRPC status code of an HTTP ``status`` (another 4xx: FAILED_PRECONDITION; another 5xx: INTERNAL)."""
    code = CODES.get(status)
    if code is not None:
        return code
    return grpc.StatusCode.FAILED_PRECONDITION if 400 <= status < 500 else grpc.StatusCode.INTERNAL


def metadata(call: Any, key: str) -> str | None:
    """The first value of call metadata ``key`` (lowercase, as gRPC sends keys), None without one."""
    for k, v in call.invocation_metadata() or ():
        if k == key:
            return v if isinstance(v, str) else v.decode("latin-1")
    return None


def authorization(call: Any) -> str | None:
    """The call's ``authorization`` metadata: what an HTTP request's ``Authorization`` header carries."""
    return metadata(call, "authorization")


class BindError(OSError):
    """A gRPC address that cannot be bound; ``option`` names the command-line option that gave it."""

    option = "--grpc-port"


@dataclass
class GrpcSite:
    """A running gRPC listener: ``address`` is ``HOST:PORT`` as a gRPC client dials it (``port`` the bound
    one); ``tls`` whether it serves TLS."""

    server: Any
    host: str
    port: int
    tls: bool

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop listening; calls in flight get ``grace_s`` seconds to finish (None: none are waited for)."""
        await self.server.stop(grace_s)


async def start_grpc(service: str, handlers: Mapping[str, tuple[Handler, Any, Any]], errors: ErrorTable,
                     host: str, port: int, *, tls: tuple[str, str] | None = None,
                     max_message_bytes: int = 64 * 1024 * 1024) -> GrpcSite:
    """Serve ``handlers`` (rpc name -> (handler, request class, response class)) as gRPC service ``service``
    on ``host``:``port`` (0: an ephemeral port), over TLS with ``tls`` = (certificate file, key file), taking
    messages of at most ``max_message_bytes`` bytes. Raises ``OSError`` when the address cannot be bound
    (also when another process holds it: the port is not shared)."""
    table = {name: grpc.unary_unary_rpc_method_handler(_guarded(fn, errors), request_deserializer=_reader(req),
                                                       response_serializer=resp.SerializeToString)
             for name, (fn, req, resp) in handlers.items()}
    server = grpc.aio.server(options=[
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", -1),
        ("grpc.so_reuseport", 0),  # a port another listener holds is an error, as on HTTP
    ])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, table),))
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        if tls is None:
            bound = server.add_insecure_port(target)
        else:
            cert, key = (Path(p).read_bytes() for p in tls)
            bound = server.add_secure_port(target, grpc.ssl_server_credentials([(key, cert)]))
    except RuntimeError as e:  # grpcio's "failed to bind"
        raise BindError(f"cannot listen on {target} (gRPC): {e}") from None
    if not bound:
        raise BindError(f"cannot listen on {target} (gRPC)")
    await server.start()
    return GrpcSite(server, host, bound, tls is not None)



class _Unreadable:
    """A request whose bytes are not its message: the call answers INVALID_ARGUMENT (grpcio's own answer to a
    deserializer that raises is INTERNAL, which would call the client's garbage the server's fault)."""

    def __init__(self, kind: str, size: int, problem: str) -> None:
        self.message = f"the request is not a {kind} message ({size} bytes): {problem}"


def _reader(cls: Any) -> Callable[[bytes], Any]:
    def read(data: bytes) -> Any:
        try:
            return cls.FromString(data)
        except Exception as e:  # noqa: BLE001 - protobuf's DecodeError, or anything else a parser raises
            return _Unreadable(cls.DESCRIPTOR.name, len(data), str(e) or type(e).__name__)

    return read


def _guarded(fn: Handler, errors: ErrorTable) -> Handler:
    """``fn`` whose exceptions end the call with the status code and message its HTTP twin would answer."""

    async def call(request: Any, context: Any) -> Any:
        if type(request) is _Unreadable:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        try:
            return await fn(request, context)
        except Exception as e:  # noqa: BLE001 - every failure is an answer, as on HTTP
            answer = Answer(e.status, e.message) if isinstance(e, AuthError) else errors.answer(e)
            if answer.status == 500:
                errors.logger.error("error in gRPC %s: %s", getattr(fn, "__name__", fn), answer.message, exc_info=e)
            retry = answer.headers.get("Retry-After")
            if retry is not None:
                context.set_trailing_metadata((("retry-after", str(retry)),))
            await context.abort(code_of(answer.status), answer.message)

    return call
