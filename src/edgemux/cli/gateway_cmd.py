"""``edgemux gateway``: run the Open Inference Protocol gateway (``edgemux.runtime.ingress.gateway``) as a process.

    edgemux gateway [--host 127.0.0.1] [--port 0] [--controlplane URL] [--advertise URL]
                    [--timeout-s 5] [--max-wait-s 0.5] [--max-body-mb 16] [--token-file FILE | --no-auth]

It serves ``runtime.ingress.gateway.make_app(Gateway(...))`` on ``--host``/``--port`` (port 0: an ephemeral one) and
prints its bound address as one line on stdout, ``gateway listening on http://HOST:PORT``, so that a script
or an engine (``edgemux up``) can read where it is. It starts with no routes: the control plane pushes them
(``PUT /v1/routes/{app}``).

With ``--controlplane URL`` it registers itself (``POST {URL}/v1/gateways {"url": ...}``, which makes the
control plane push every route), retrying with a delay doubling from 0.5 s up to 10 s until the control
plane answers: never fatal, since the gateway and the control plane may start in any order. Once
registered it checks every ``REREGISTER_CHECK_S`` seconds that the control plane still lists it
(``GET {URL}/v1/gateways``) and registers again when not, because a restarted control plane forgets its
gateways (they are not in its store) and would otherwise never push routes here again.

Ctrl-C or SIGTERM stops it gracefully (stops listening, lets in-flight requests finish) and exits 0. Bad
arguments (bad numbers, a malformed URL, an address already in use) are one line on stderr and exit code
2. Logs go to stderr. Units: ``*_s`` seconds, ``*_mb`` MB (10**6 bytes).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import sys
import urllib.parse
from typing import Any

from edgemux.adapt.police import Policing
from edgemux.cli.serving import add_grpc_option, add_shm_option, add_tls_options, add_token_option, check_grpc_port, \
    listen, service_token, shm_limit_bytes, stop_on_signals, warn_if_open
from edgemux.errors import InputError
from edgemux.runtime import process
from edgemux.runtime.tls import server_options

logger = logging.getLogger("edgemux.gateway")

# Registration retry delays (seconds): start small so that a gateway started just before its control plane
# registers within a second of it; cap at 10 s so that a long outage costs few requests.
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 10.0
# How often a registered gateway checks that the control plane still knows it (seconds).
REREGISTER_CHECK_S = 10.0
# Bound on each call to the control plane (seconds): registration makes it push every route to us. The call
# runs on a worker thread, which a stopping gateway waits for, so the bound is also how long a call to an
# unresponsive control plane can delay a stop.
CALL_TIMEOUT_S = 10.0


def add_parser(sub: Any) -> None:
    """Register ``gateway`` on an argparse subparsers object."""
    p = sub.add_parser("gateway", help="run the gateway: police and route inference requests by app name")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="port to listen on (default 0: an ephemeral port)")
    add_grpc_option(p)
    add_shm_option(p)
    p.add_argument("--controlplane", metavar="URL", help="control plane to register with (it pushes the routes)")
    p.add_argument("--advertise", metavar="URL", help="address given to the control plane (default: the bound one)")
    p.add_argument("--timeout-s", type=float, default=5.0,
                   help="bound on each attempt at an agent in seconds (default 5)")
    p.add_argument("--max-wait-s", type=float, default=Policing().max_wait_s,
                   help="longest wait for a policing token in seconds before a 429 (default 0.5)")
    p.add_argument("--max-body-mb", type=float, default=16.0,
                   help="largest inference request body in MB of 10**6 bytes (default 16); larger is 413")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    add_token_option(p, server=True)
    add_tls_options(p)
    p.set_defaults(func=cmd_gateway)


def _check_url(value: str | None, option: str) -> str | None:
    if value is None:
        return None
    parsed = urllib.parse.urlsplit(value)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise InputError(option, f"expected http://HOST:PORT, got {value!r}")
    return value.rstrip("/")


def _check(args: argparse.Namespace) -> None:
    """Reject bad numbers and URLs before anything starts (one line, exit code 2 via InputError)."""
    if not 0 <= args.port <= 65535:
        raise InputError("--port", f"must be in 0..65535, got {args.port}")
    check_grpc_port(args)
    shm_limit_bytes(args)
    if not (math.isfinite(args.timeout_s) and args.timeout_s > 0):
        raise InputError("--timeout-s", f"must be a finite number > 0, got {args.timeout_s:g}")
    if not (math.isfinite(args.max_wait_s) and args.max_wait_s >= 0):
        raise InputError("--max-wait-s", f"must be a finite number >= 0, got {args.max_wait_s:g}")
    if not (math.isfinite(args.max_body_mb) and args.max_body_mb > 0):
        raise InputError("--max-body-mb", f"must be a finite number > 0, got {args.max_body_mb:g}")
    server_options(args.tls_cert, args.tls_key)  # a missing or unusable file: one line, before anything starts
    args.controlplane = _check_url(args.controlplane, "--controlplane")
    args.advertise = _check_url(args.advertise, "--advertise")


def cmd_gateway(args: argparse.Namespace) -> int:
    from edgemux.runtime.ingress.gateway import Gateway

    _check(args)
    token = service_token(args)  # protected mode: refused before anything binds
    if not logging.getLogger().handlers:
        logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    warn_if_open(args, token, "edgemux.gateway")
    try:
        gateway = Gateway({}, timeout_s=args.timeout_s, max_wait_s=args.max_wait_s,
                          max_body_bytes=max(1, int(args.max_body_mb * 10**6)),
                          token=token, shm_limit_bytes=shm_limit_bytes(args))
    except ValueError as e:  # the checks above should have caught it; still one line, not a traceback
        raise InputError("gateway", str(e)) from None
    return process.run(_serve(gateway, args))


async def _serve(gateway: Any, args: argparse.Namespace) -> int:
    from edgemux.runtime.httputil import start_site
    from edgemux.runtime.ingress.gateway import make_app

    stop = stop_on_signals()
    # shutdown_timeout: how long in-flight requests may finish after a stop (seconds): an attempt at an agent
    # is bounded by --timeout-s, and a request makes at most a few attempts plus its policing wait.
    site = await listen(start_site(make_app(gateway), args.host, args.port,
                                   ssl_context=server_options(args.tls_cert, args.tls_key),
                                   shutdown_timeout_s=args.timeout_s + args.max_wait_s + 1.0), args.host, args.port)
    url = site.url
    advertise = args.advertise or site.public_url
    grpc_site = None
    if args.grpc_port is not None:
        from edgemux.runtime.ingress.grpcservice import start_gateway_grpc

        try:
            grpc_site = await listen(start_gateway_grpc(gateway, args.host, args.grpc_port, tls=(
                (args.tls_cert, args.tls_key) if args.tls_cert else None)), args.host, args.grpc_port)
        except BaseException:
            await site.stop()
            raise
    print(f"gateway listening on {url}", flush=True)
    if grpc_site is not None:
        print(f"gateway gRPC on {grpc_site.address}", flush=True)
    link = None
    if args.controlplane:
        link = asyncio.create_task(_register_loop(args.controlplane, advertise, stop, gateway.token))
    try:
        await stop.wait()
    finally:
        logger.info("stopping: letting in-flight requests finish")
        if link is not None:
            link.cancel()
            try:
                await link
            except asyncio.CancelledError:
                pass
        if grpc_site is not None:
            await grpc_site.stop(args.timeout_s + args.max_wait_s + 1.0)
        await site.stop()
    return 0


async def _register_loop(controlplane: str, advertise: str, stop: asyncio.Event, token: str | None = None) -> None:
    """Register with the control plane until it answers, then re-register whenever it forgets us."""
    from edgemux.runtime.controlplane.apiclient import ControlPlaneClient

    cp = ControlPlaneClient(controlplane, CALL_TIMEOUT_S, token)  # a call every few seconds: off the loop, on a thread
    delay = RETRY_FIRST_S
    registered = False
    outage = False  # log an outage once when it starts and once when it ends, not on every retry
    while not stop.is_set():
        try:
            if registered:
                registered = advertise in await asyncio.to_thread(cp.gateways)
                if not registered:
                    logger.info("the control plane at %s no longer lists this gateway: registering again",
                                controlplane)
            if not registered:
                await asyncio.to_thread(cp.register_gateway, advertise)
                registered = True
                logger.info("registered with the control plane at %s as %s", controlplane, advertise)
            if outage:
                logger.info("the control plane at %s answers again", controlplane)
            outage = False
            delay = RETRY_FIRST_S
            wait = REREGISTER_CHECK_S
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - never fatal: the gateway serves the routes it has
            if not outage:
                logger.warning("cannot register with the control plane at %s: %s (retrying)",
                               controlplane, str(e) or type(e).__name__)
            outage = True
            registered = False
            wait, delay = delay, min(delay * 2, RETRY_MAX_S)
        try:
            await asyncio.wait_for(stop.wait(), timeout=wait)
        except asyncio.TimeoutError:
            pass
