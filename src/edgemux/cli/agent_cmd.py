"""``edgemux agent``: run the node agent of one node of a cluster file (``edgemux.runtime.dataplane.agent``).

It serves the Open Inference Protocol and the control API on ``--host``/``--port`` (port 0: an ephemeral
one) and prints its bound address as one line on stdout, ``agent NODE listening on http://HOST:PORT``, so
that a script or a distributed engine can read where it is. With ``--controlplane URL`` it registers with
the control plane and heartbeats (never fatal when the control plane is down). Ctrl-C or SIGTERM stops it
gracefully: it stops listening, lets in-flight requests finish, drains the device queues and exits 0.
Bad arguments (missing cluster file, unknown node, bad numbers, an address already in use) are one line on
stderr and exit code 2. Logs go to stderr.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from edgemux.cli.profile_cmd import add_profiles_option, with_profile_sets
from edgemux.cli.serving import add_grpc_option, add_shm_option, add_tls_options, add_token_option, check_grpc_port, \
    listen, service_token, shm_limit_bytes, stop_on_signals, warn_if_open
from edgemux.cluster.specs import load_cluster
from edgemux.cluster.state import StateError
from edgemux.errors import InputError, UnknownNameError
from edgemux.runtime import process
from edgemux.runtime.tls import server_options


def add_parser(sub: Any) -> None:
    p = sub.add_parser("agent", help="run a node agent: serve inference on one node's devices")
    p.add_argument("--cluster", required=True, help="cluster YAML file (kind: Cluster)")
    p.add_argument("--node", required=True, help="the node of the cluster file this agent runs")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="port to listen on (default 0: an ephemeral port)")
    add_grpc_option(p)
    add_shm_option(p)
    p.add_argument("--controlplane", metavar="URL", help="control plane to register with and heartbeat to")
    p.add_argument("--advertise", metavar="URL", help="address given to the control plane (default: the bound one)")
    p.add_argument("--heartbeat-s", type=float, default=5.0, help="seconds between heartbeats (default 5)")
    p.add_argument("--lease-s", type=float, default=None, metavar="S",
                   help="fencing: with no heartbeat acknowledged by the control plane for this long (a "
                        "partition), answer every app 503 until it answers again, so that an app the control "
                        "plane moved elsewhere is never served twice (default 3 x --heartbeat-s; 0: never "
                        "fence; docs/multihost.md)")
    p.add_argument("--max-body-mb", type=float, default=16.0,
                   help="largest inference request body in MB of 10**6 bytes (default 16); larger is 413")
    p.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads per model (default 1)")
    p.add_argument("--max-queue", type=int, default=1024,
                   help="requests waiting per device before 503 with Retry-After (default 1024)")
    p.add_argument("--timeout-s", type=float, default=30.0, help="per-request timeout in seconds (default 30); 504")
    p.add_argument("--cache-dir", help="where zoo models are built (default $EDGEMUX_CACHE/zoo or ~/.cache/edgemux/zoo)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    add_token_option(p, server=True)
    add_tls_options(p)
    p.add_argument("--no-app-keys", action="store_true",
                   help="take inference only with the admin token (from gateways), not with an app's key")
    p.add_argument("--model-dir", action="append", default=[], metavar="DIR",
                   help="a directory this agent may load model files from, .onnx or .tflite (repeatable; zoo "
                        "models are always allowed; default: none, zoo models only)")
    p.add_argument("--backend", action="append", default=[], metavar="DEVICE=KIND",
                   help="the backend of one device (repeatable), instead of its kind's default: edgetpu (a real "
                        "Coral Edge TPU through libedgetpu: refused in one line where it does not load), litert, "
                        "onnxruntime, cuda or emulated. Default: a cpu device real (onnxruntime, LiteRT for "
                        ".tflite), an edgetpu real where libedgetpu loads, a gpu-discrete real where onnxruntime "
                        "has CUDA, everything else emulated from profiles")
    add_profiles_option(p)   # measured profile sets (edgemux profile), e.g. for a real cpu device
    p.set_defaults(func=with_profile_sets(cmd_agent))


def _check(args: argparse.Namespace) -> None:
    """Reject bad numbers before anything starts (one line, exit code 2 via InputError)."""
    if not 0 <= args.port <= 65535:
        raise InputError("--port", f"must be in 0..65535, got {args.port}")
    check_grpc_port(args)
    shm_limit_bytes(args)
    if not args.max_body_mb > 0:
        raise InputError("--max-body-mb", f"must be > 0, got {args.max_body_mb:g}")
    if args.threads < 1:
        raise InputError("--threads", f"must be >= 1, got {args.threads}")
    if args.max_queue < 1:
        raise InputError("--max-queue", f"must be >= 1, got {args.max_queue}")
    if not 0 < args.timeout_s < float("inf"):
        raise InputError("--timeout-s", f"must be a finite number > 0, got {args.timeout_s:g}")
    if not 0 < args.heartbeat_s < float("inf"):
        raise InputError("--heartbeat-s", f"must be a finite number > 0, got {args.heartbeat_s:g}")
    if args.lease_s is not None:
        from edgemux.runtime.dataplane.lease import check_lease_s

        why = check_lease_s(args.lease_s, args.heartbeat_s)
        if why is not None:
            raise InputError("--lease-s", why)


BACKEND_KINDS = ("edgetpu", "litert", "onnxruntime", "cuda", "emulated")


def parse_backends(items: list[str]) -> dict[str, str]:
    """``--backend DEVICE=KIND`` items as {device: kind}; ``InputError`` for a malformed item, an unknown
    kind or a device named twice (the devices themselves are checked against the node by the agent)."""
    out: dict[str, str] = {}
    for item in items:
        device, eq, kind = item.partition("=")
        if not eq or not device or not kind:
            raise InputError("--backend", f"expected DEVICE=KIND, got {item!r}")
        if kind not in BACKEND_KINDS:
            raise UnknownNameError("--backend", kind, "backend", list(BACKEND_KINDS))
        if device in out:
            raise InputError("--backend", f"device {device!r} is given twice")
        out[device] = kind
    return out


def cmd_agent(args: argparse.Namespace) -> int:
    from edgemux.runtime.dataplane.agent import Agent

    _check(args)
    token = service_token(args)  # protected mode: refused before anything loads or binds
    cluster = load_cluster(args.cluster)
    try:
        node = cluster.node(args.node)
    except StateError as e:
        raise InputError("--node", e.problem) from None
    if not node.devices:
        raise InputError("--node", f"node {node.name!r} has no devices to serve")
    if not logging.getLogger().handlers:
        logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for d in args.model_dir:
        if not Path(d).is_dir():
            raise InputError("--model-dir", f"{d}: no such directory")
    backends = parse_backends(args.backend)
    warn_if_open(args, token, "edgemux.agent")
    server_options(args.tls_cert, args.tls_key)  # a missing or unusable file: one line, before anything starts
    try:
        agent = Agent(node, threads=args.threads, max_queue=args.max_queue, request_timeout_s=args.timeout_s,
                      max_body_bytes=max(1, int(args.max_body_mb * 10**6)), cache_dir=args.cache_dir,
                      controlplane_url=args.controlplane, heartbeat_s=args.heartbeat_s, token=token,
                      app_keys=not args.no_app_keys, model_dirs=args.model_dir, backends=backends,
                      shm_limit_bytes=shm_limit_bytes(args), lease_s=args.lease_s)
    except InputError as e:
        if e.field.startswith("backends"):  # an unknown device, or a backend that cannot run here
            device = e.field.partition(".")[2]
            raise InputError("--backend", f"{device}: {e.problem}" if device else e.problem) from None
        raise
    try:
        return process.run(_serve(agent, args))
    finally:
        agent.close(drain=False, timeout_s=1.0)  # no-op after a graceful stop; frees threads after an error


async def _serve(agent: Any, args: argparse.Namespace) -> int:
    from edgemux.runtime.dataplane.agent import start_server

    stop = stop_on_signals()
    tls_files = (args.tls_cert, args.tls_key) if args.tls_cert else None
    server = await listen(start_server(agent, args.host, args.port, advertise_url=args.advertise,
                                       ssl_context=server_options(args.tls_cert, args.tls_key),
                                       grpc_port=args.grpc_port, tls_files=tls_files),
                          args.host, args.port)
    print(f"agent {agent.node.name} listening on {server.url}", flush=True)
    if server.grpc is not None:
        print(f"agent {agent.node.name} gRPC on {server.grpc.address}", flush=True)
    try:
        await stop.wait()
    finally:
        logging.getLogger("edgemux.agent").info("stopping: draining in-flight requests")
        await server.stop()
    return 0
