"""``edgemux up``: run a whole cluster, on this machine (the local engine, ``edgemux.engines.local``) or on a
Ray cluster (``--engine ray``, ``edgemux.engines.ray``).

    edgemux up [--cluster examples/local/cluster.yaml] [--engine local|ray] [--address ADDR]
               [--store FILE] [--policy edgemux] [--option K=V]
               [--no-adapt] [--adapt-option NAME=VALUE] [--consolidate] [--consolidate-option NAME=VALUE]
               [--no-auth] [--tls] [--grpc-port PORT]
               [--host 127.0.0.1] [--profiles DIR] [--no-auto-profile] [--cpu-models M,M]
               [--agent-arg NODE=ARG] [--workdir DIR | --ephemeral] [--ready-timeout-s 90]

Starts the control plane, the gateway and one agent per node of the cluster file as local processes
(``python -m edgemux controlplane|gateway|agent ... --port 0``), wires them, waits until every agent is
registered and ready, prints one summary (URLs, nodes, devices and which of them are emulated or real) and
runs until Ctrl-C or SIGTERM. It then stops the gateway, the agents (they drain requests in flight) and the
control plane, in that order, and exits 0.

With ``--engine ray`` the same processes run as Ray actors' children: each agent on the Ray node that offers
the resource ``edgemux-node-<node>``, the control plane and the gateway on this machine's Ray node.
``--address`` is the Ray cluster to join (``auto``: the one this machine belongs to; default: a new local
Ray). An edge node that no Ray node stands for is one line and exit 2, before anything starts. An agent
whose Ray node is lost is reported and ``up`` goes on serving (the control plane sees its heartbeats stop
and re-places its apps); the agent is started again, on its old port, when a Ray node offers its resource
again. A lost control plane or gateway is started again at once, on its port.

A ``cpu`` device is a real onnxruntime device. The built-in catalogs transcribe the papers' accelerators and
have no ``cpu`` profile, so unless ``--profiles DIR`` brings one (``edgemux profile ... --out DIR``), ``up``
first measures ``--cpu-models`` on this host (a few seconds) and gives that set to every process.

Exit codes: 0 stopped by Ctrl-C/SIGTERM; 1 a process died during start-up or while running (its name and
last stderr lines are printed, the others are stopped); 2 bad input (a bad cluster file, unknown policy),
one line on stderr.

State stays: the store (every admitted app, its placement and key digest), the admin token, measured CPU
profiles and the logs live in a working folder kept across runs, ``~/.edgemux/up/<cluster name>`` by default
(``$EDGEMUX_HOME`` for another folder than ``~/.edgemux``; ``--workdir DIR`` for any other), so ``edgemux up``
again on the same cluster file serves the same apps with the same token (a file of ``--store`` overrides the
folder's store). Two ``up`` runs cannot share a folder: the second is refused in one line, naming the first's
process. ``--ephemeral`` runs on a temporary folder removed at exit (nothing survives). On the local engine every
process of the cluster dies with ``up`` however it ends (a SIGKILL too: Linux's parent-death signal), so none
is left serving from a folder the next ``up`` owns.
While it runs, ``up`` is the CLI's context (``runtime.controlplane.context``: ``~/.edgemux/context.json``):
``edgemux apply``/``get``/... in another shell talk to this cluster with its token, and its CA with ``--tls``.

Unless ``--no-auth``, ``up`` writes the cluster's admin token to ``WORKDIR/token`` (mode 600) and hands it to
every process (``EDGEMUX_TOKEN`` in its environment); every API then needs it and each app created gets a key
for its inference (``runtime.auth``). The summary says where the file is; give it to the CLI with
``EDGEMUX_TOKEN_FILE`` or ``--token-file``. With ``--no-auth`` every process is started with ``--no-auth``
(a process on a non-loopback address, as on Ray, would otherwise refuse to start open: protected mode).

With ``--tls`` every process serves HTTPS with a certificate of the cluster's CA (``runtime.tls.ClusterCA``)
and trusts that CA (``SSL_CERT_FILE``): on the local engine one certificate for this host; on Ray one per
Ray node, for its address, issued when its first process starts (``engines.ray``), the CA's key held in
``up``'s memory only.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from edgemux.runtime.controlplane.context import remove_context, write_context
from edgemux.cli.controlplane_cmd import add_consolidate_options, adapt_settings, consolidate_settings
from edgemux.cli.place_cmd import make_policy, parse_options
from edgemux.errors import InputError

DEFAULT_CLUSTER = "examples/local/cluster.yaml"
# Repository root when running from a checkout (src/edgemux/cli/up_cmd.py -> parents[3]), so that the
# default cluster is found from any working directory.
_REPO = Path(__file__).resolve().parents[3]


def add_parser(sub: Any) -> None:
    """Register ``up`` on an argparse subparsers object."""
    p = sub.add_parser("up", help="run a cluster locally: control plane, gateway and one agent per node")
    p.add_argument("--cluster", default=None, help=f"cluster YAML file (kind: Cluster; default {DEFAULT_CLUSTER})")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="where the processes run: this machine (local, default) or a Ray cluster (ray)")
    p.add_argument("--address", default=None,
                   help="with --engine ray: the Ray cluster to join (auto, or HOST:PORT; default: start a local Ray)")
    p.add_argument("--store", help="SQLite store of the control plane (default: store.sqlite in the working folder, "
                                   "see --workdir)")
    p.add_argument("--policy", default="edgemux", help="admission policy (default edgemux)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="policy option (repeatable)")
    p.add_argument("--no-adapt", action="store_true",
                   help="the control plane does not adapt after placement (docs/adapt.md)")
    p.add_argument("--adapt-option", action="append", default=[], metavar="NAME=VALUE",
                   help="adapt setting for the control plane, e.g. window_s=2 (repeatable; docs/adapt.md)")
    add_consolidate_options(p)
    p.add_argument("--no-auth", action="store_true",
                   help="run every service open: no admin token, no app keys (default: up writes an admin token "
                        "to WORKDIR/token, mode 600, and every API needs it; docs/reference/http.md)")
    p.add_argument("--tls", action="store_true",
                   help="serve HTTPS everywhere: make the cluster's CA and a certificate for this host (WORKDIR/tls/; "
                        "with --engine ray, one for each Ray node, issued as its first process starts); clients "
                        "trust the CA with SSL_CERT_FILE=WORKDIR/tls/ca.pem")
    p.add_argument("--host", default=None,
                   help="address every process listens on (default 127.0.0.1; with --engine ray: each "
                        "process's Ray node address)")
    p.add_argument("--grpc-port", type=int, default=None, metavar="PORT",
                   help="the gateway also serves the Open Inference Protocol over gRPC on this port (a fixed port, "
                        "1-65535, which a restarted gateway takes again; default: no gRPC)")
    p.add_argument("--profiles", action="append", default=[], metavar="DIR",
                   help="measured profile-set directory given to every process (repeatable)")
    p.add_argument("--no-auto-profile", dest="auto_profile", action="store_false",
                   help="do not measure the cpu devices' models when no cpu profile is available")
    p.add_argument("--cpu-models", default=None, metavar="M[,M...]",
                   help="zoo models (and .tflite files, measured on LiteRT) measured for cpu devices (default: "
                        "squeezenet1_1@64,mobilenet_v2@96 and, where LiteRT is installed, the example TFLite "
                        "model of examples/models/coral)")
    p.add_argument("--agent-arg", action="append", default=[], metavar="NODE=ARG",
                   help="extra argument for the agent of NODE ('*': every agent), e.g. cpu-1=--threads=2; "
                        "repeatable")
    p.add_argument("--workdir", help="folder for the store, the admin token, measured profiles and logs, kept "
                                     "across runs (default ~/.edgemux/up/CLUSTER_NAME, under $EDGEMUX_HOME if set)")
    p.add_argument("--ephemeral", action="store_true",
                   help="run on a temporary folder removed at exit: no app, key or token survives")
    p.add_argument("--ready-timeout-s", type=float, default=90.0,
                   help="seconds each start-up step may take (default 90)")
    p.set_defaults(func=cmd_up)


def _cluster_path(arg: str | None) -> Path:
    if arg is not None:
        path = Path(arg)
    else:
        path = Path(DEFAULT_CLUSTER)
        if not path.is_file() and (_REPO / DEFAULT_CLUSTER).is_file():
            path = _REPO / DEFAULT_CLUSTER
    if not path.is_file():
        raise InputError("--cluster", f"cannot read {path}: no such file")
    return path


def _workdir(args: argparse.Namespace, cluster: Path) -> Path | None:
    """The working folder ``up`` keeps (module doc), None with ``--ephemeral`` (a temporary one)."""
    if args.ephemeral:
        if args.workdir is not None:
            raise InputError("--ephemeral", "a temporary folder, so not with --workdir")
        return None
    if args.workdir is not None:
        folder = Path(args.workdir)
    else:
        from edgemux.runtime.controlplane.context import edgemux_home

        folder = edgemux_home() / "up" / _cluster_name(cluster)
    if folder.exists() and not folder.is_dir():
        raise InputError("--workdir", f"{folder} is not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # no permission, a file on the way: one line, not a traceback
        raise InputError("--workdir", f"{folder}: {e.strerror or e}") from None
    return folder


def _cluster_name(cluster: Path) -> str:
    """The cluster file's ``metadata.name`` as a folder name (the file's stem when it has none)."""
    import re

    import yaml

    try:
        doc = yaml.safe_load(cluster.read_text(encoding="utf-8"))
        name = str(doc["metadata"]["name"])
    except Exception:  # a bad file is refused, naming the field, when the engine reads it
        name = cluster.stem
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name).lstrip(".") or "cluster"


class _WorkdirLock:
    """An exclusive lock on a working folder for as long as ``up`` runs (``flock``: released when the process
    ends, however it ends): two clusters on one store would each believe they own its apps."""

    def __init__(self, folder: Path) -> None:
        import fcntl
        import os

        path = folder / "up.lock"
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = path.read_text(encoding="utf-8").strip() or "another process"
            os.close(self.fd)
            raise InputError("--workdir", f"{folder} is in use by another edgemux up ({holder}); stop it, or give "
                             f"this one --workdir DIR or --ephemeral") from None
        os.ftruncate(self.fd, 0)
        os.write(self.fd, f"pid {os.getpid()}\n".encode())

    def release(self) -> None:
        import os

        os.close(self.fd)


def _agent_args(items: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for item in items:
        node, eq, arg = item.partition("=")
        if not eq or not node or not arg:
            raise InputError("--agent-arg", f"expected NODE=ARG, got {item!r}")
        out.setdefault(node, []).append(arg)
    return out


class _Stop(BaseException):
    """Raised in the main thread by SIGINT/SIGTERM, so that a start-up in progress is abandoned and the
    processes already started are stopped (``Engine.start`` stops them on any exception)."""


def cmd_up(args: argparse.Namespace) -> int:
    from edgemux.engines.local import Engine, EngineStartError, default_cpu_models
    from edgemux.runtime.controlplane.dashboard import dashboard_url

    cluster = _cluster_path(args.cluster)
    make_policy(args.policy, parse_options(args.option))  # unknown policy/option: one line, exit 2, now
    adapt_settings(args.adapt_option, args.no_adapt)  # a bad adapt setting too, before anything starts
    consolidate_settings(args.consolidate, args.consolidate_option, args.no_adapt)
    if not 0 < args.ready_timeout_s < float("inf"):
        raise InputError("--ready-timeout-s", f"must be a finite number > 0, got {args.ready_timeout_s:g}")
    for d in args.profiles:
        if not Path(d).is_dir():
            raise InputError("--profiles", f"{d}: no such directory")
    cpu_models = ([m.strip() for m in args.cpu_models.split(",") if m.strip()] if args.cpu_models
                  else default_cpu_models())
    if args.grpc_port is not None and not 1 <= args.grpc_port <= 65535:
        raise InputError("--grpc-port", f"must be a port in 1..65535 (a fixed one, kept across a gateway's "
                                        f"restart), got {args.grpc_port}")
    if args.address is not None and args.engine != "ray":
        raise InputError("--address", "only with --engine ray")
    workdir = _workdir(args, cluster)
    lock = _WorkdirLock(workdir) if workdir is not None else None  # before anything starts
    launcher: Any = None
    host = args.host or "127.0.0.1"
    if args.engine == "ray":
        from edgemux.cluster.specs import load_cluster
        from edgemux.engines.ray import NODE_HOST, RayLauncher
        from edgemux.profiles.catalog import use_profile_sets

        host = args.host or NODE_HOST
        with use_profile_sets(args.profiles):  # a bad cluster file is one line before Ray starts
            nodes = [n.name for n in load_cluster(cluster).nodes if n.devices]
        # EngineError (one line, exit 2) when Ray is missing or unreachable
        launcher = RayLauncher(args.address, local_nodes=nodes)
    # on the local engine the cluster's processes die with up, however up ends (a SIGKILL too): none is left
    # serving from a store that the next up on the same folder owns; with --ephemeral the engine makes (and
    # removes) a temporary folder of its own
    engine = Engine(cluster, store=args.store, policy=args.policy, policy_options=args.option, host=host,
                    profiles=args.profiles, auto_profile=args.auto_profile, cpu_models=cpu_models,
                    agent_args=_agent_args(args.agent_arg), workdir=workdir, die_with_parent=True,
                    listen_timeout_s=args.ready_timeout_s, ready_timeout_s=args.ready_timeout_s,
                    adapt=not args.no_adapt, adapt_options=args.adapt_option, consolidate=args.consolidate,
                    consolidate_options=args.consolidate_option, auth=not args.no_auth, tls=args.tls,
                    gateway_grpc_port=args.grpc_port, launcher=launcher)

    stopping = threading.Event()
    running = threading.Event()  # started: from then on a signal only sets ``stopping`` (the watch loop
    # sees it within 0.5 s), so that it never interrupts a call half-way (a Ray call inside its C code)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if not stopping.is_set():
            stopping.set()
            if not running.is_set():
                raise _Stop()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            print(f"edgemux up: starting {cluster} (policy {args.policy}) ...", flush=True)
            engine.start()
            running.set()
            print(engine.summary(), flush=True)
            print(f"state: {engine.workdir} " + ("(temporary: removed at exit, --ephemeral)" if workdir is None else
                  "(kept: the store, the admin token, profiles and logs; edgemux up again resumes its apps)"),
                  flush=True)
            if engine.ca is not None:
                print(f"TLS: every service serves HTTPS; its CA: {engine.ca} (export SSL_CERT_FILE={engine.ca})",
                      flush=True)
            assert engine.controlplane_url is not None
            context = write_context(engine.controlplane_url, str(engine.token_file) if engine.token_file else None,
                                    str(engine.ca) if engine.ca else None)
            print(f"dashboard: {dashboard_url(engine.controlplane_url, engine.token)}  (the token after # stays in "
                  f"the browser)", flush=True)
            print(f"CLI context: {context} (edgemux apply/get/describe use this cluster and its token "
                  f"unless --server or $EDGEMUX_SERVER says otherwise)", flush=True)
            if engine.token_file is not None:
                print(f"admin token: {engine.token_file} (mode 600; every API needs it, inference an app's key)\n"
                      f"next: edgemux apply -f examples/local/apps.yaml    (prints each new app's key once)\n"
                      f"      edgemux get agents\n"
                      f"      inference: POST {engine.gateway_url}/v2/models/APP/infer with "
                      f"'Authorization: Bearer <the app's key>'\n"
                      f"Ctrl-C stops everything.", flush=True)
            else:
                print(f"next: edgemux apply -f examples/local/apps.yaml\n"
                      f"      edgemux get agents\n"
                      f"      inference: POST {engine.gateway_url}/v2/models/APP/infer\n"
                      f"Ctrl-C stops everything.", flush=True)
            lost: set[str] = set()
            while True:  # watch: a process that dies while serving ends the cluster (exit 1)
                if stopping.wait(0.5):
                    break
                if args.engine == "ray":
                    _supervise(engine, launcher, lost)
                    continue
                dead = engine.dead()
                if dead:
                    name, code, tail = dead[0]
                    _report(name, f"exited with status {code} while running", tail)
                    return 1
        except _Stop:
            pass
        except EngineStartError as e:
            _report(e.process, e.problem, e.stderr_tail)
            return 1
        return 0
    finally:
        # no signal may interrupt the ordered stop; a second Ctrl-C is ignored until it is done
        for s in previous:
            signal.signal(s, signal.SIG_IGN)
        stopping.set()
        print("edgemux up: stopping gateway, agents, control plane ...", file=sys.stderr, flush=True)
        if engine.controlplane_url is not None:
            remove_context(engine.controlplane_url)
        engine.stop()
        if lock is not None:
            lock.release()
        for s, h in previous.items():
            signal.signal(s, h)


def _supervise(engine: Any, launcher: Any, lost: set[str]) -> None:
    """One pass of ``up``'s watch on a Ray cluster: a lost agent (its Ray node gone) is reported once and
    started again, on its old port, once a live Ray node offers its node's resource again (it re-registers
    and the control plane uses it again); a lost control plane or gateway is started again at once on its
    port (the control plane re-reads the store; the agents and the gateway re-register on their next
    heartbeat). A restart that fails ends ``up`` (EngineStartError, exit 1)."""
    for name, code, tail in engine.dead():
        if name not in lost:
            lost.add(name)
            print(f"edgemux up: {name} lost (status {code}): " + (tail[-1] if tail else ""), file=sys.stderr,
                  flush=True)
    for name in sorted(lost):
        node = name.partition(" ")[2] if name.startswith("agent ") else None
        if node is not None and not launcher.node_alive(node):
            continue
        handle = engine.restart(name)
        lost.discard(name)
        where = getattr(handle, "location", None)
        print(f"edgemux up: {name} restarted at {engine.url_of(name)}" + (f" on {where}" if where else ""),
              file=sys.stderr, flush=True)


def _report(process: str, problem: str, tail: list[str]) -> None:
    print(f"edgemux: error: {process} {problem}" + ("; its last stderr lines:" if tail else ""),
          file=sys.stderr, flush=True)
    for line in tail:
        print(f"  | {line}", file=sys.stderr)
