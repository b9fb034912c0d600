"""The engine: start, wire, watch and stop the processes of an edgemux cluster (``edgemux up``).

An edgemux cluster is a set of ordinary processes that find each other over HTTP: one control plane
(``edgemux controlplane``), one gateway (``edgemux gateway``) and one node agent per node
(``edgemux agent --node N``). :class:`Engine` starts them from a cluster file, wires them (every agent and
the gateway get ``--controlplane URL``), waits until the cluster is ready, and stops them in order.

Where the processes run is the :class:`Launcher`'s business, not the engine's: the engine only describes
each process as a :class:`ProcessSpec` (its ``edgemux`` arguments, the node it belongs to, the measured
profile sets it needs) and reads back a :class:`ProcessHandle` (pid, "listening on" URL, exit status,
stderr tail). :class:`LocalLauncher` runs them as local subprocesses (``sys.executable -m edgemux ...``)
with ``--port 0``; a distributed engine supplies a launcher that starts the same specs on the machine of
``spec.node`` (over SSH, a job scheduler, ...) and the rest of the engine is unchanged, because every URL
the engine hands out comes from what the processes themselves print.

Start-up, in order (:meth:`Engine.start`):

1. read the cluster file (with the ``profiles`` sets active, so that devices may name measured catalogs);
2. when a ``cpu`` device has no profile to admit anything with (the built-in catalogs transcribe the papers'
   accelerators only: none is of kind ``cpu``) and ``auto_profile`` is on, measure ``cpu_models`` on the
   device's node: the zoo models with ``edgemux profile --backend onnxruntime`` into ``WORKDIR/profiles/cpu``,
   the ``.tflite`` files with ``--backend litert`` into ``WORKDIR/profiles/cpu-litert``, and use those sets
   like ``--profiles`` ones (every agent may then load the ``.tflite`` files: ``--model-dir`` their folders);
3. start the control plane (``--port 0``) and read its URL from its first stdout line;
4. start every agent (nodes without devices have nothing to serve and get none) and the gateway, all at
   once, each with ``--controlplane URL``, and read their URLs;
5. wait until the control plane lists every agent as ready (``GET /v1/agents``) and knows the gateway
   (``GET /v1/gateways``), every agent answers ``/v2/health/ready`` and the gateway ``/v2/health/live``.

If a process exits during start-up (or a step times out), the others are stopped and
:class:`EngineStartError` names the process, its exit status and the last lines of its stderr.

Stop (:meth:`Engine.stop`, also on leaving a ``with`` block): SIGTERM to the gateway, then to the agents
(they stop listening and drain the requests in flight and queued), then to the control plane, each waited
for up to ``stop_timeout_s`` before SIGKILL; the temporary working folder is removed.

Units: ``*_s`` seconds.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Protocol

from edgemux.cluster.specs import load_cluster
from edgemux.cluster.state import Cluster
from edgemux.errors import EdgemuxError
from edgemux.profiles.catalog import load_catalog, use_profile_sets
from edgemux.profiles.types import DeviceKind
from edgemux.runtime.auth import TOKEN_ENV, read_token_file, write_token_file
from edgemux.runtime.tls import CA_ENV, ClusterCA, client_context, local_names
from edgemux.runtime.controlplane.apiclient import ControlPlaneClient, call, probe

__all__ = ["DEFAULT_CPU_MODELS", "EXAMPLE_TFLITE", "Engine", "EngineError", "EngineStartError", "LocalLauncher", "Launcher",
           "ProcessHandle", "ProcessSpec", "cpu_profiles_needed"]

logger = logging.getLogger("edgemux.engine")

# Zoo models measured for a cpu device that has no profile (``edgemux profile --models``): small inputs, so
# that measuring takes seconds on a laptop core, and one model (squeezenet1_1) that no built-in catalog
# has, so that an app on it can only go to the real CPU device.
DEFAULT_CPU_MODELS: tuple[str, ...] = ("squeezenet1_1@64", "mobilenet_v2@96")
# A real TFLite model measured beside them where LiteRT is installed and the repository's examples are here
# (examples/models/coral: Coral's quantized MobileNet v1, 0.5 ms a frame on one core), so that an app on it
# runs on the real CPU with LiteRT (the demo's classify-lite).
EXAMPLE_TFLITE = Path(__file__).resolve().parents[3] / "examples" / "models" / "coral" / "mobilenet_v1_0.25_128_quant.tflite"


def default_cpu_models() -> list[str]:
    """``DEFAULT_CPU_MODELS``, and ``EXAMPLE_TFLITE`` where LiteRT is installed and the file is here."""
    import importlib.util

    extra = [str(EXAMPLE_TFLITE)] if EXAMPLE_TFLITE.is_file() and importlib.util.find_spec("ai_edge_litert") else []
    return [*DEFAULT_CPU_MODELS, *extra]
# Timed and untimed runs per measured model (the profiler's --repeats/--warmup): enough for a mean and a
# variance an FCFS estimator can use, few enough to keep ``up`` quick.
_PROFILE_REPEATS = 20
_PROFILE_WARMUP = 3
# Lines of a failed process's stderr kept for the error message.
STDERR_TAIL_LINES = 20
# Poll period while waiting for readiness (seconds): short, since each poll is a few local HTTP calls.
_POLL_S = 0.2
# Bound on each readiness/summary HTTP call (seconds).
_HTTP_TIMEOUT_S = 5.0


class EngineError(EdgemuxError):
    """The engine cannot do what was asked (a bad cluster file, a launcher failure)."""


class EngineStartError(EngineError):
    """A process failed during start-up. ``process`` is its name (``agent node-1``), ``returncode`` its
    exit status (None: still running but not ready in time), ``stderr_tail`` its last stderr lines."""

    def __init__(self, process: str, problem: str, returncode: int | None = None,
                 stderr_tail: Sequence[str] = ()) -> None:
        self.process = process
        self.problem = problem
        self.returncode = returncode
        self.stderr_tail = list(stderr_tail)
        super().__init__(f"{process}: {problem}")


# ------------------------------------------------------------------------------------------- launcher


@dataclass(frozen=True)
class ProcessSpec:
    """One process of the cluster, as any launcher can start it.

    ``name`` is unique and human-readable (``controlplane``, ``gateway``, ``agent node-1``); ``role`` is
    ``controlplane``, ``gateway``, ``agent`` or ``profile``; ``args`` are the ``edgemux`` command-line
    arguments, verb first; ``node`` is the cluster node it must run on (None: anywhere); ``profiles`` are
    profile-set folders the process must have in its catalog (a launcher copies them where it runs the
    process and passes them on); ``listens`` says whether it prints ``... listening on URL`` and serves
    (False: a one-shot command, e.g. the profiler); ``env`` are variables the launcher sets for it (the admin
    token, ``EDGEMUX_TOKEN``: kept out of the command line, which every user of the host can read, and out
    of the spec's repr)."""

    name: str
    role: str
    args: tuple[str, ...]
    node: str | None = None
    profiles: tuple[str, ...] = ()
    listens: bool = True
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)


class ProcessHandle(Protocol):
    """A started process, whatever started it."""

    spec: ProcessSpec

    @property
    def pid(self) -> int | None:
        """The process id where it runs (local launcher: on this host)."""

    def poll(self) -> int | None:
        """The exit status once it has exited, else None."""

    def wait_listening(self, timeout_s: float) -> str:
        """The URL of its ``... listening on URL`` line; ``EngineStartError`` if it exits first or takes
        longer than ``timeout_s`` seconds."""

    def terminate(self) -> None:
        """Ask it to stop gracefully (SIGTERM)."""

    def kill(self) -> None:
        """Stop it now (SIGKILL)."""

    def wait(self, timeout_s: float) -> int | None:
        """Wait up to ``timeout_s`` seconds for it to exit; its exit status, or None if it still runs."""

    def stderr_tail(self, lines: int = STDERR_TAIL_LINES) -> list[str]:
        """Its last ``lines`` lines of stderr (logs and error messages)."""


class Launcher(Protocol):
    """Starts processes described by :class:`ProcessSpec` (locally, or on the node they name)."""

    def launch(self, spec: ProcessSpec) -> ProcessHandle:
        """Start ``spec``; raises ``EngineError`` when it cannot even be started."""

    def check_nodes(self, nodes: Sequence[str]) -> None:
        """Raise ``EngineError`` naming the first of the cluster's ``nodes`` the launcher has nowhere to run
        (called before anything starts)."""

    def close(self) -> None:
        """Release what the launcher holds (log files); processes are stopped by the engine first."""


class _LocalHandle:
    """A local subprocess: stdout read by a thread (so that the pipe never fills and blocks the child),
    stderr written to a log file (kept after exit for the error message)."""

    def __init__(self, spec: ProcessSpec, proc: subprocess.Popen[str], stderr_path: Path, stderr_file: IO[str]) -> None:
        self.spec = spec
        self.proc = proc
        self.stderr_path = stderr_path
        self._stderr_file = stderr_file
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.stdout_lines: collections.deque[str] = collections.deque(maxlen=200)
        self.url: str | None = None
        threading.Thread(target=self._read_stdout, name=f"stdout {spec.name}", daemon=True).start()

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.stdout_lines.append(line)
            self._lines.put(line)
        self._lines.put(None)  # EOF: the process closed stdout (it exited)

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait_listening(self, timeout_s: float) -> str:
        if self.url is not None:
            return self.url
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise EngineStartError(self.spec.name, f"did not say where it listens within {timeout_s:g} s",
                                       self.poll(), self.stderr_tail())
            try:
                line = self._lines.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if line is None:
                code = self.wait(5.0)
                raise EngineStartError(self.spec.name, f"exited with status {code} during start-up", code,
                                       self.stderr_tail())
            head, sep, url = line.partition(" listening on ")
            if sep and url.startswith(("http://", "https://")):
                self.url = url.strip()
                return self.url

    def terminate(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass

    def wait(self, timeout_s: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stderr_tail(self, lines: int = STDERR_TAIL_LINES) -> list[str]:
        try:
            self._stderr_file.flush()
            with open(self.stderr_path, encoding="utf-8", errors="replace") as f:
                return [ln.rstrip("\n") for ln in collections.deque(f, maxlen=lines)]
        except OSError:
            return []

    def close(self) -> None:
        try:
            self._stderr_file.close()
        except OSError:
            pass
        if self.proc.stdout is not None:
            try:
                self.proc.stdout.close()
            except OSError:
                pass


class LocalLauncher:
    """Runs every process on this host: ``python -m edgemux ARGS`` (``python`` is ``sys.executable`` unless
    given), stderr into ``log_dir/<name>.stderr``.

    Each child gets a session of its own, so that a Ctrl-C typed at the terminal reaches only the engine,
    which then stops the children in order (gateway, agents, control plane) instead of all at once.
    ``env`` adds to (not replaces) this process's environment; ``PYTHONUNBUFFERED`` is set so that the
    "listening on" line and logs arrive at once. ``die_with_parent`` (Linux): each child is SIGKILLed when
    the thread that started it dies (``PR_SET_PDEATHSIG``), for a launcher that runs inside another
    system's worker (the Ray engine's actors), whose death must take the process with it."""

    # Verbs whose parser has ``--profiles DIR`` (the processes that read profiles)
    native_profiles_verbs: frozenset[str] = frozenset({"controlplane", "agent"})

    def __init__(self, log_dir: str | os.PathLike[str], *, python: str | None = None,
                 env: Mapping[str, str] | None = None, die_with_parent: bool = False) -> None:
        self.die_with_parent = die_with_parent
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.python = python or sys.executable
        self.env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        self.handles: list[_LocalHandle] = []

    def command(self, spec: ProcessSpec) -> list[str]:
        """The command line that runs ``spec`` here."""
        verb = spec.args[0] if spec.args else ""
        if not spec.profiles:
            return [self.python, "-m", "edgemux", *spec.args]
        if verb not in self.native_profiles_verbs:
            raise EngineError(f"'{verb}' takes no profile sets (only {', '.join(sorted(self.native_profiles_verbs))})")
        extra = [a for d in spec.profiles for a in ("--profiles", d)]
        return [self.python, "-m", "edgemux", *spec.args, *extra]

    def launch(self, spec: ProcessSpec) -> _LocalHandle:
        slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in spec.name)
        stderr_path = self.log_dir / f"{slug}.stderr"
        stderr_file = open(stderr_path, "w", encoding="utf-8")  # noqa: SIM115 - owned by the handle
        try:
            proc = subprocess.Popen(self.command(spec), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=stderr_file, env={**self.env, **dict(spec.env)}, text=True, bufsize=1,
                                    start_new_session=True,
                                    preexec_fn=_die_with_parent if self.die_with_parent else None)
        except OSError as e:
            stderr_file.close()
            raise EngineError(f"{spec.name}: cannot start {self.python}: {e.strerror or e}") from None
        handle = _LocalHandle(spec, proc, stderr_path, stderr_file)
        self.handles.append(handle)
        return handle

    def check_nodes(self, nodes: Sequence[str]) -> None:
        """Every node runs here: nothing to check."""

    def close(self) -> None:
        for h in self.handles:
            h.close()


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux for SIGKILL when the parent thread dies (prctl
    PR_SET_PDEATHSIG = 1). Elsewhere there is no such call and the child outlives its parent."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


# ----------------------------------------------------------------------------------------------- engine


def cpu_profiles_needed(cluster: Cluster) -> list[str]:
    """Paths of the ``cpu`` devices that no profile in the current catalog can describe: a device naming a
    profile set needs profiles in it; one naming none needs any ``cpu`` profile. Without one, the policy
    can place nothing on the device."""
    catalog = load_catalog()
    has_cpu = bool(catalog.models(DeviceKind.CPU))
    out = []
    for node in cluster.nodes:
        for d in node.devices:
            if d.kind is not DeviceKind.CPU:
                continue
            if d.profile_set is None and not has_cpu:
                out.append(d.path)
    return out


@dataclass
class AgentInfo:
    """An agent the engine started: its node, URL and the devices it reported (``GET /v1/node``)."""

    node: str
    url: str
    pid: int | None
    devices: list[dict[str, Any]] = field(default_factory=list)


class Engine:
    """Start, wire and stop one cluster's processes (see the module docstring).

    ``cluster_file``: the ``kind: Cluster`` YAML. ``store``: the control plane's SQLite store (default: a
    file in the temporary working folder, gone after :meth:`stop`). ``policy`` and ``policy_options``
    (``KEY=VALUE`` strings): the admission policy. ``host``: the address every process listens on.
    ``profiles``: measured profile-set folders (``edgemux profile --out``) given to every process.
    ``auto_profile``: measure ``cpu_models`` when a ``cpu`` device has no profile (see
    :func:`cpu_profiles_needed`). ``agent_args``: extra ``edgemux agent`` arguments by node name (``*``:
    every node), e.g. ``{"cpu-1": ["--threads", "2"]}``. ``launcher``: where processes run (default
    :class:`LocalLauncher` with logs in the working folder). ``workdir``: the working folder (default: a new
    temporary one, removed by :meth:`stop`; a given one is kept). Timeouts, in seconds:
    ``listen_timeout_s`` for each process to print its URL, ``ready_timeout_s`` for the whole cluster to be
    ready after that, ``profile_timeout_s`` for the CPU measurement, ``stop_timeout_s`` for each process
    to exit after SIGTERM before SIGKILL. ``heartbeat_s``: the agents' heartbeat period (a pending model
    load is retried on a heartbeat, so a short one makes a local cluster settle quickly). ``adapt``: run
    the control plane's adapt loop (``False``: ``--no-adapt``); ``adapt_options``: its settings as
    ``NAME=VALUE`` (``--adapt-option``, docs/adapt.md). ``consolidate``: switch nodes off at low load
    (``--consolidate``), with ``consolidate_options`` as ``NAME=VALUE`` (``--consolidate-option``).
    ``auth``: generate the cluster's admin token (``runtime.auth``) into ``token_file`` (the working folder's
    ``token``, mode 600), hand it to every process it starts and use it for its own calls (``token``;
    :meth:`client`); False: every service is open (and given ``--no-auth``). ``tls``: make the cluster's CA
    and a certificate for this host in the working folder's ``tls/`` (:func:`_make_tls`): every process serves
    HTTPS and trusts the CA (``SSL_CERT_FILE``), and so do the engine's own calls (``ca``).

    Use it as a context manager (``with Engine(...) as eng: eng.controlplane_url``) or call :meth:`start`
    and :meth:`stop`.
    """

    def __init__(
        self,
        cluster_file: str | os.PathLike[str],
        *,
        store: str | os.PathLike[str] | None = None,
        policy: str = "edgemux",
        policy_options: Sequence[str] = (),
        host: str = "127.0.0.1",
        profiles: Sequence[str | os.PathLike[str]] = (),
        auto_profile: bool = True,
        cpu_models: Sequence[str] | None = None,
        agent_args: Mapping[str, Sequence[str]] | None = None,
        launcher: Launcher | None = None,
        die_with_parent: bool = False,
        workdir: str | os.PathLike[str] | None = None,
        listen_timeout_s: float = 90.0,
        ready_timeout_s: float = 90.0,
        profile_timeout_s: float = 300.0,
        stop_timeout_s: float = 40.0,
        heartbeat_s: float = 2.0,
        adapt: bool = True,
        adapt_options: Sequence[str] = (),
        consolidate: bool = False,
        consolidate_options: Sequence[str] = (),
        auth: bool = True,
        tls: bool = False,
        gateway_grpc_port: int | None = None,
    ) -> None:
        self.cluster_file = str(cluster_file)
        self.policy = policy
        self.policy_options = list(policy_options)
        self.host = host
        self.profiles = [str(Path(p).resolve()) for p in profiles]
        self.auto_profile = auto_profile
        self.cpu_models = list(cpu_models) if cpu_models is not None else default_cpu_models()
        self.agent_args = {k: list(v) for k, v in (agent_args or {}).items()}
        self.listen_timeout_s = listen_timeout_s
        self.ready_timeout_s = ready_timeout_s
        self.profile_timeout_s = profile_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.heartbeat_s = heartbeat_s
        self.adapt = adapt
        self.adapt_options = list(adapt_options)
        self.consolidate = consolidate
        self.consolidate_options = list(consolidate_options)
        self.auth = auth
        self.token: str | None = None
        self.token_file: Path | None = None
        self.tls = tls
        # a fixed port, given by the user: a restarted gateway takes it again with the rest of its arguments
        self.gateway_grpc_port = gateway_grpc_port
        self.ca: Path | None = None
        self._tls_args: tuple[str, ...] = ()
        self._context: ssl.SSLContext | None = None
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="edgemux-up-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        # absolute: a launcher may start processes in another working folder (or on another machine)
        self.store = str(Path(store).resolve()) if store is not None else str(self.workdir / "store.sqlite")
        self.launcher: Launcher = (launcher if launcher is not None
                                   else LocalLauncher(self.workdir / "logs", die_with_parent=die_with_parent))
        self.cluster: Cluster | None = None
        self.measured_profiles: str | None = None  # the set measured for cpu devices, if any
        self.measured_litert: str | None = None    # the set of .tflite models measured on LiteRT, if any
        self.unprofiled: list[str] = []  # cpu devices left without a profile (auto_profile off)
        self.controlplane_url: str | None = None
        self.gateway_url: str | None = None
        self.agents: dict[str, AgentInfo] = {}
        self._handles: dict[str, ProcessHandle] = {}  # by process name, in start order
        self._started = False
        self._stopped = False

    # -- public views ----------------------------------------------------------------------------------

    @property
    def agent_urls(self) -> dict[str, str]:
        """Each node's agent URL, by node name."""
        return {n: a.url for n, a in self.agents.items()}

    @property
    def gateway_grpc_address(self) -> str | None:
        """``HOST:PORT`` of the gateway's gRPC listener (``gateway_grpc_port``, on the host of its HTTP URL),
        the target ``tritonclient.grpc`` takes; None without one (or before the gateway listens)."""
        if self.gateway_grpc_port is None or self.gateway_url is None:
            return None
        host = urllib.parse.urlsplit(self.gateway_url).hostname or self.host
        return f"[{host}]:{self.gateway_grpc_port}" if ":" in host else f"{host}:{self.gateway_grpc_port}"

    @property
    def pids(self) -> dict[str, int | None]:
        """Each started process's pid, by process name (``controlplane``, ``gateway``, ``agent NODE``)."""
        return {name: h.pid for name, h in self._handles.items()}

    @property
    def all_profiles(self) -> list[str]:
        """The profile-set folders every process gets: the given ones, then the measured one."""
        return self.profiles + [p for p in (self.measured_profiles, self.measured_litert) if p]

    def dead(self) -> list[tuple[str, int, list[str]]]:
        """The started processes that have exited: (name, exit status, last stderr lines)."""
        out = []
        for name, h in self._handles.items():
            code = h.poll()
            if code is not None:
                out.append((name, code, h.stderr_tail()))
        return out

    def url_of(self, name: str) -> str | None:
        """The URL the process ``name`` listens on (None: not known yet, or a process that does not listen)."""
        spec = self._handles[name].spec
        if spec.role == "controlplane":
            return self.controlplane_url
        if spec.role == "gateway":
            return self.gateway_url
        info = self.agents.get(spec.node) if spec.role == "agent" and spec.node is not None else None
        return info.url if info is not None else None

    def stderr_tail(self, name: str, lines: int = STDERR_TAIL_LINES) -> list[str]:
        """The last stderr lines of the process ``name``."""
        return self._handles[name].stderr_tail(lines)

    # -- lifecycle -------------------------------------------------------------------------------------

    def __enter__(self) -> Engine:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> Engine:
        """Start and wire every process and wait until the cluster is ready (module docstring). On any
        failure everything started is stopped again and the error raised (``EngineStartError`` naming the
        process for a process that died or was not ready in time, ``EdgemuxError`` for a bad cluster)."""
        if self._started:
            raise EngineError("this engine was already started")
        self._started = True
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        for d in self.profiles:
            if not Path(d).is_dir():
                raise EngineError(f"profile set {d}: no such folder")
        with use_profile_sets(self.profiles):
            self.cluster = load_cluster(self.cluster_file)  # InputError naming the field of a bad file
            missing = cpu_profiles_needed(self.cluster)
        nodes = [n for n in self.cluster.nodes if n.devices]
        if not nodes:
            raise EngineError(f"{self.cluster_file}: no node has a device to serve")
        unknown = sorted(set(self.agent_args) - {n.name for n in self.cluster.nodes} - {"*"})
        if unknown:
            raise EngineError(f"agent arguments for unknown node {unknown[0]!r}")
        cluster_file = str(Path(self.cluster_file).resolve())  # children may run elsewhere (cwd)
        self.launcher.check_nodes([n.name for n in nodes])  # before anything starts
        if self.auth:
            self.token_file = self.workdir / "token"
            # a kept working folder keeps its token: clients holding it still reach the restarted cluster (the
            # apps' keys live in the store and survive with it)
            self.token = (read_token_file(self.token_file, "--workdir") if self.token_file.is_file() and not self._own_workdir
                          else write_token_file(self.token_file))
        if self.tls:
            self.ca, self._tls_args = _make_tls(self.workdir / "tls", self.host, self.launcher)
            self._context = client_context(self.ca)

        if missing and self.auto_profile:
            self._measure_cpu(missing)
        elif missing:
            self.unprofiled = missing
            logger.warning("no cpu profile for %s: the policy can place nothing there", ", ".join(missing))

        cp_args = ["controlplane", "--cluster", cluster_file, "--store", self.store, "--policy", self.policy,
                   "--host", self.host, "--port", "0"]
        for opt in self.policy_options:
            cp_args += ["--option", opt]
        if not self.adapt:
            cp_args.append("--no-adapt")
        for opt in self.adapt_options:
            cp_args += ["--adapt-option", opt]
        if self.consolidate:
            cp_args.append("--consolidate")
        for opt in self.consolidate_options:
            cp_args += ["--consolidate-option", opt]
        cp = self._launch(ProcessSpec("controlplane", "controlplane", tuple(cp_args), profiles=tuple(self.all_profiles)))
        self.controlplane_url = cp.wait_listening(self.listen_timeout_s)

        # Agents and the gateway start together: they only need the control plane's URL, and importing
        # onnxruntime/numpy dominates their start-up, which overlaps on several cores.
        model_dirs = sorted({str(Path(m).resolve().parent) for m in self._tflite_models()})
        for n in nodes:
            args = ["agent", "--cluster", cluster_file, "--node", n.name, "--host", self.host, "--port", "0",
                    "--controlplane", self.controlplane_url, "--heartbeat-s", f"{self.heartbeat_s:g}",
                    *(a for d in model_dirs for a in ("--model-dir", d)),
                    *self.agent_args.get("*", []), *self.agent_args.get(n.name, [])]
            self._launch(ProcessSpec(f"agent {n.name}", "agent", tuple(args), node=n.name,
                                     profiles=tuple(self.all_profiles)))
        gw_args: tuple[str, ...] = ("gateway", "--host", self.host, "--port", "0", "--controlplane",
                                    self.controlplane_url)
        if self.gateway_grpc_port is not None:
            gw_args += ("--grpc-port", str(self.gateway_grpc_port))
        gw = self._launch(ProcessSpec("gateway", "gateway", gw_args))
        deadline = time.monotonic() + self.listen_timeout_s
        for n in nodes:
            h = self._handles[f"agent {n.name}"]
            url = h.wait_listening(max(0.1, deadline - time.monotonic()))
            self.agents[n.name] = AgentInfo(n.name, url, h.pid)
            self._check_alive()
        self.gateway_url = gw.wait_listening(max(0.1, deadline - time.monotonic()))
        self._wait_ready()

    def restart(self, name: str) -> ProcessHandle:
        """Start the exited process ``name`` again, with the same arguments and on the port it had (the other
        processes, the gateways' routes and the clients keep its URL; if that port cannot be had, on a new
        one, and it announces the new URL when it registers). Returns the new handle once it listens;
        ``EngineStartError`` naming the process when it does not come up. Used by a supervisor (``up``
        with a distributed engine) to bring back a lost process; the old one must have exited."""
        old = self._handles[name]
        if old.poll() is None:
            raise EngineError(f"{name} is still running")
        url, args = self.url_of(name), old.spec.args
        attempts = [args]
        if url is not None and "--port" in args[:-1]:  # its old port first
            i = args.index("--port") + 1
            attempts.insert(0, (*args[:i], url.rsplit(":", 1)[-1], *args[i + 1:]))
        for k, attempt in enumerate(attempts):
            logger.info("restarting %s", name)
            h = self.launcher.launch(replace(old.spec, args=attempt))
            self._handles[name] = h
            try:
                new_url = h.wait_listening(self.listen_timeout_s)
            except EngineStartError:
                if k + 1 < len(attempts):
                    continue  # its old port is taken (e.g. on another machine): any port
                raise
            if old.spec.role == "controlplane":
                self.controlplane_url = new_url
            elif old.spec.role == "gateway":
                self.gateway_url = new_url
            elif old.spec.node in self.agents:
                info = self.agents[old.spec.node]
                info.url, info.pid = new_url, h.pid
            return h
        raise AssertionError("unreachable")  # the last attempt returns or raises

    def kill(self, name: str) -> int | None:
        """SIGKILL the process ``name`` and wait (10 s) for it to exit; its exit status (None: not reaped).
        For a chaos run or a test that kills on purpose; :meth:`restart` brings it back."""
        handle = self._handles[name]
        handle.kill()
        return handle.wait(10.0)

    def client(self, timeout_s: float = _HTTP_TIMEOUT_S) -> ControlPlaneClient:
        """A client of this cluster's control plane, carrying its admin token."""
        assert self.controlplane_url is not None, "start() first"
        return ControlPlaneClient(self.controlplane_url, timeout_s=timeout_s, token=self.token,
                                  context=self._context)

    def _launch(self, spec: ProcessSpec) -> ProcessHandle:
        if spec.name in self._handles:
            raise EngineError(f"two processes named {spec.name!r}")
        spec = _with_credentials(spec, self.token, self.ca, self._tls_args)
        logger.info("starting %s", spec.name)
        h = self.launcher.launch(spec)
        self._handles[spec.name] = h
        return h

    def _tflite_models(self) -> list[str]:
        return [m for m in self.cpu_models if m.lower().endswith(".tflite")]

    def _measure_cpu(self, devices: list[str]) -> None:
        """Measure ``cpu_models`` for the ``cpu`` devices that have no profile (on their node: a distributed
        launcher runs it there), zoo models on onnxruntime and ``.tflite`` files on LiteRT, and make the sets
        part of every process's catalog."""
        node = devices[0].partition("/")[0]
        # the LiteRT set's catalog, beside the onnxruntime one ("cpu-<host>", the profiler's default)
        litert_catalog = "cpu-" + (re.sub(r"[^a-z0-9]+", "-", node.lower()).strip("-") or "node") + "-litert"
        tflite = self._tflite_models()
        onnx = [m for m in self.cpu_models if m not in tflite]
        for backend, models, folder in (("onnxruntime", onnx, "cpu"), ("litert", tflite, "cpu-litert")):
            if not models:
                continue
            out = self.workdir / "profiles" / folder
            args = ("profile", "--backend", backend, "--models", ",".join(models), "--warmup", str(_PROFILE_WARMUP),
                    "--repeats", str(_PROFILE_REPEATS), "--out", str(out), "--force",
                    *(("--catalog", litert_catalog) if backend == "litert" else ()))
            logger.info("measuring %s on %s for %s", ", ".join(models), backend, ", ".join(devices))
            h = self._launch(ProcessSpec(f"profile {node}", "profile", args, node=node, listens=False))
            code = h.wait(self.profile_timeout_s)
            if code is None:
                h.kill()
                h.wait(5.0)
                raise EngineStartError(h.spec.name, f"did not finish measuring within {self.profile_timeout_s:g} s",
                                       None, h.stderr_tail())
            if code != 0:
                raise EngineStartError(h.spec.name, f"exited with status {code}", code, h.stderr_tail())
            self._handles.pop(h.spec.name)  # done: not a process to watch or stop
            if backend == "litert":
                self.measured_litert = str(out)
            else:
                self.measured_profiles = str(out)

    def _check_alive(self) -> None:
        for name, code, tail in self.dead():
            raise EngineStartError(name, f"exited with status {code} during start-up", code, tail)

    def _wait_ready(self) -> None:
        """Poll until the cluster is ready (module docstring, step 5); the first failure is raised."""
        assert self.controlplane_url and self.gateway_url
        deadline = time.monotonic() + self.ready_timeout_s
        waiting: str | None = "nothing yet"
        while True:
            self._check_alive()
            waiting = self._not_ready()
            if waiting is None:
                break
            if time.monotonic() > deadline:
                name = waiting.partition(":")[0]
                tail = self._handles[name].stderr_tail() if name in self._handles else []
                raise EngineStartError(name, f"not ready within {self.ready_timeout_s:g} s ({waiting})", None, tail)
            time.sleep(_POLL_S)
        for info in self.agents.values():
            node = _get_json(info.url + "/v1/node", self.token, self._context) or {}
            info.devices = list(node.get("devices", []))

    def _not_ready(self) -> str | None:
        """What the cluster still waits for, as ``PROCESS: what``; None when everything is ready."""
        assert self.controlplane_url and self.gateway_url
        if _get_status(self.gateway_url + "/v2/health/live", self._context) != 200:
            return "gateway: /v2/health/live"
        for node, info in self.agents.items():
            if _get_status(info.url + "/v2/health/ready", self._context) != 200:
                return f"agent {node}: /v2/health/ready"
        cp = self.client()
        try:
            ready = {a.node for a in cp.agents() if a.ready}
            gateways = cp.gateways()
        except EdgemuxError:  # not answering yet, or answering an error while it starts
            return "controlplane: GET /v1/agents and /v1/gateways"
        for node in self.agents:
            if node not in ready:
                return f"agent {node}: registration with the control plane"
        # by port: a gateway on a wildcard host advertises the host name, not the address it printed
        port = self.gateway_url.rsplit(":", 1)[-1]
        if not any(url.rsplit(":", 1)[-1] == port for url in gateways):
            return "gateway: registration with the control plane"
        return None

    def stop(self) -> dict[str, int | None]:
        """Stop every process in order: gateway, agents (all signalled, then waited for: they drain in
        parallel), control plane; SIGKILL after ``stop_timeout_s``. Idempotent. Returns each process's
        exit status by name (None: could not be reaped)."""
        if self._stopped:
            return {}
        self._stopped = True
        codes: dict[str, int | None] = {}
        groups = [[n for n in self._handles if self._handles[n].spec.role == role]
                  for role in ("gateway", "profile", "agent", "controlplane")]
        for names in groups:
            for n in names:
                self._handles[n].terminate()
            for n in names:
                h = self._handles[n]
                code = h.wait(self.stop_timeout_s)
                if code is None:
                    logger.warning("%s did not stop within %g s: killing it", n, self.stop_timeout_s)
                    h.kill()
                    code = h.wait(5.0)
                codes[n] = code
        self.launcher.close()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return codes

    # -- views for a summary ---------------------------------------------------------------------------

    def devices(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """(node, device as in the agent's ``GET /v1/node``) for every device the agents serve."""
        for node, info in self.agents.items():
            for d in info.devices:
                yield node, d

    def summary(self) -> str:
        """A few lines for humans: the URLs, the nodes and their devices, which are emulated and which real."""
        return _summary_text(self)


def _make_tls(folder: Path, host: str, launcher: Launcher) -> tuple[Path, tuple[str, ...]]:
    """The cluster's CA (``runtime.tls.ClusterCA``) in ``folder`` and a certificate for this host (and
    ``host``): the CA's path and the ``--tls-cert``/``--tls-key`` arguments every server gets. A launcher that
    runs processes on other machines (``use_ca``: the Ray launcher) keeps the CA, to issue each machine a
    certificate of its own when its first process starts there; otherwise the CA's key is dropped now."""
    ca = ClusterCA(folder)
    cert, key = ca.write(folder, "server", local_names([host] if host not in ("0.0.0.0", "::", "") else []))
    use_ca = getattr(launcher, "use_ca", None)
    if use_ca is not None:
        use_ca(ca)
    else:
        ca.forget()
    return ca.path, ("--tls-cert", str(cert), "--tls-key", str(key))


def _with_credentials(spec: ProcessSpec, token: str | None, ca: Path | None, tls_args: tuple[str, ...]) -> ProcessSpec:
    """``spec`` with the cluster's credentials: the admin token in its environment, or, for a server of an open
    cluster, ``--no-auth`` (said explicitly, so that a server listening beyond loopback, on a Ray node's
    address, starts instead of refusing in protected mode, and a token in the environment does not guard it
    while the engine calls it without one); with TLS, ``SSL_CERT_FILE`` (every client in the process, the
    CLI's, aiohttp's, http.client's, verifies against the CA) and a server's certificate arguments."""
    server = spec.role in ("controlplane", "gateway", "agent")
    if token is not None:
        spec = replace(spec, env=spec.env + ((TOKEN_ENV, token),))
    elif server:
        spec = replace(spec, args=spec.args + ("--no-auth",))
    if ca is not None:
        spec = replace(spec, env=spec.env + ((CA_ENV, str(ca)),), args=spec.args + (tls_args if server else ()))
    return spec


def _summary_text(engine: Engine) -> str:
    """``Engine.summary``: the URLs, the nodes and their devices, which are emulated and which real."""
    pids = engine.pids

    def at(name: str) -> str:  # where a distributed launcher ran it (a handle's ``location``), if it says
        where = getattr(engine._handles.get(name), "location", None)
        return f" on {where}" if where else ""

    lines = [f"controlplane  {engine.controlplane_url}  (pid {pids.get('controlplane')}{at('controlplane')}; "
             f"policy {engine.policy}, store {engine.store})",
             f"gateway       {engine.gateway_url}  (pid {pids.get('gateway')}{at('gateway')})"]
    if engine.gateway_grpc_port is not None:
        lines.append(f"gateway gRPC  {engine.gateway_grpc_address}  (Open Inference Protocol)")
    width = max((len(n) for n in engine.agents), default=0)
    real = emulated = 0
    for node, info in engine.agents.items():
        lines.append(f"agent {node:<{width}}  {info.url}  (pid {info.pid}{at('agent ' + node)})")
        for d in info.devices:
            is_emulated = bool(d.get("emulated"))
            real += not is_emulated
            emulated += is_emulated
            what = "emulated from profiles" if is_emulated else f"REAL ({d.get('backend')})"
            pset = d.get("profile_set") or ("measured on this host" if not is_emulated and engine.measured_profiles
                                            else "-")
            lines.append(f"  {d.get('path')}: {d.get('kind')}, {d.get('discipline')}, {what}; profiles {pset}")
    lines.append(f"{len(engine.agents)} nodes, {real + emulated} devices: {real} real, {emulated} emulated")
    if engine.measured_profiles or engine.measured_litert:
        where = ", ".join(p for p in (engine.measured_profiles, engine.measured_litert) if p)
        names = ", ".join(Path(m).name if m.lower().endswith(".tflite") else m for m in engine.cpu_models)
        lines.append(f"cpu profiles measured into {where} ({names})")
    if engine.unprofiled:
        lines.append(f"warning: no cpu profile for {', '.join(engine.unprofiled)}: nothing can be placed there "
                     "(give --profiles DIR from 'edgemux profile', or leave auto-profiling on)")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ http


def _get_status(url: str, context: ssl.SSLContext | None = None) -> int | None:
    """The HTTP status of ``GET url`` (None when it cannot be reached)."""
    return probe(url, _HTTP_TIMEOUT_S, context)


def _get_json(url: str, token: str | None = None, context: ssl.SSLContext | None = None) -> Any:
    """The JSON body of a 200 answer to ``GET url`` (with the admin ``token``); None otherwise."""
    try:
        answer = call("GET", url, timeout_s=_HTTP_TIMEOUT_S, token=token, context=context)
    except EdgemuxError:
        return None
    return answer.body if answer.status == 200 else None
