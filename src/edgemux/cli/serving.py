"""What the long-running commands (``agent``, ``controlplane``, ``gateway``) share: stop on SIGINT/SIGTERM,
an address that cannot be bound reported as one line (exit code 2), never a traceback, the admin token
option (which the control plane's client verbs take too) and, for the servers, ``--no-auth`` and protected
mode (``runtime.auth.server_token``: no token on a non-loopback ``--host`` is a refusal, not an open
service)."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable
from typing import TYPE_CHECKING, TypeVar

from edgemux.errors import InputError

if TYPE_CHECKING:  # the servers' helpers import it when called: the client verbs take --token-file from here
    import asyncio

T = TypeVar("T")


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM (call from the running event loop): the command then stops
    gracefully, letting in-flight requests finish."""
    import asyncio
    import signal

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def listen(start: Awaitable[T], host: str, port: int) -> T:
    """``await start`` (a server binding ``host``:``port``, and maybe a gRPC port too), an address that
    cannot be bound becoming an ``InputError`` on ``--port`` (on ``--grpc-port`` for the gRPC listener's,
    whose error says so with its ``option``)."""
    try:
        return await start
    except OSError as e:
        option = getattr(e, "option", "--port")
        if option != "--port":
            raise InputError(option, str(e)) from None
        raise InputError("--port", f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def add_token_option(p: argparse.ArgumentParser, *, server: bool) -> None:
    """``--token-file``: the cluster's admin token (``runtime.auth``), for a server or a client; a server gets
    ``--no-auth`` too (:func:`service_token`)."""
    p.add_argument("--token-file", default=None, metavar="FILE",
                   help=("file holding the cluster's admin token (mode 600): every call to this service must "
                         "carry it, and its calls to the others do (default $EDGEMUX_TOKEN_FILE or "
                         "$EDGEMUX_TOKEN; none: open on a loopback --host, refused on any other unless "
                         "--no-auth)") if server else
                   ("file holding the cluster's admin token (default $EDGEMUX_TOKEN_FILE or $EDGEMUX_TOKEN; "
                    "edgemux up writes one and prints where)"))
    if server:
        p.add_argument("--no-auth", action="store_true",
                       help="run open, without an admin token, even on a --host other hosts can reach (without "
                            "it such a service refuses to start with no token); a token in the environment is "
                            "ignored")


def service_token(args: argparse.Namespace) -> str | None:
    """The admin token a server runs with (``--token-file``, ``$EDGEMUX_TOKEN_FILE``, ``$EDGEMUX_TOKEN``),
    None to run open; ``InputError`` (one line, exit 2, before anything binds) for protected mode's refusal:
    no token on a ``--host`` reachable from other hosts without ``--no-auth`` (``runtime.auth.server_token``)."""
    from edgemux.runtime.auth import server_token

    return server_token(args.token_file, args.no_auth, args.host)


def warn_if_open(args: argparse.Namespace, token: str | None, logger_name: str) -> None:
    """Log a warning when a server runs open (``--no-auth``) on a ``--host`` other hosts can reach."""
    import logging

    from edgemux.runtime.auth import is_loopback

    if token is None and not is_loopback(args.host):
        logging.getLogger(logger_name).warning(
            "running open on %s (--no-auth): anyone who can reach it may call every API", args.host or "every address")


def add_tls_options(p: argparse.ArgumentParser) -> None:
    """``--tls-cert`` and ``--tls-key``: serve HTTPS (``runtime.tls``)."""
    p.add_argument("--tls-cert", default=None, metavar="FILE",
                   help="serve HTTPS with this certificate (PEM, with its chain); needs --tls-key. Clients "
                        "verify it against the CA that $SSL_CERT_FILE names")
    p.add_argument("--tls-key", default=None, metavar="FILE", help="the certificate's private key (PEM)")


def add_grpc_option(p: argparse.ArgumentParser) -> None:
    """``--grpc-port``: serve the Open Inference Protocol over gRPC too (``runtime.grpcserver``)."""
    p.add_argument("--grpc-port", type=int, default=None, metavar="PORT",
                   help="also serve the Open Inference Protocol over gRPC on this port of --host (0: an ephemeral "
                        "port; default: no gRPC), with the same credentials and, with --tls-cert, TLS")


def check_grpc_port(args: argparse.Namespace) -> None:
    """``--grpc-port`` in 0..65535 and not ``--port`` itself (one line, exit code 2 via ``InputError``)."""
    if args.grpc_port is None:
        return
    if not 0 <= args.grpc_port <= 65535:
        raise InputError("--grpc-port", f"must be in 0..65535, got {args.grpc_port}")
    if args.grpc_port and args.grpc_port == args.port:
        raise InputError("--grpc-port", f"must differ from --port ({args.port}): HTTP listens there")


def add_shm_option(p: argparse.ArgumentParser) -> None:
    """``--shm-max-mb``: how much shared memory one credential may register (``dataplane.shm``)."""
    p.add_argument("--shm-max-mb", type=float, default=256.0, metavar="MB",
                   help="system shared memory one credential (an app's key, the admin token) may register, in MB "
                        "of 2**20 bytes (default 256); more is 413")


def shm_limit_bytes(args: argparse.Namespace) -> int:
    """``--shm-max-mb`` in bytes; ``InputError`` for a value that is not a finite number >= 0."""
    mb = args.shm_max_mb
    if not (mb >= 0 and mb != float("inf")):
        raise InputError("--shm-max-mb", f"must be a finite number >= 0, got {mb:g}")
    return int(mb * 2**20)
