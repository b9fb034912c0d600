"""Run an edgemux cluster's processes on an existing Ray cluster (``edgemux up --engine ray``).

edgemux keeps its own placement: Ray is used only to start each process on the machine it belongs to and
to notice when that machine goes away. Every process is the same ``python -m edgemux VERB ...`` the local
engine runs, started by a small Ray actor (:class:`_ProcessActor`, one per process) on the Ray node chosen
for it; the engine (:class:`~edgemux.engines.local.Engine`) is unchanged, it is only given a
:class:`RayLauncher` instead of the :class:`~edgemux.engines.local.LocalLauncher`.

Which Ray node runs what:

* an agent of edge node ``N`` (and the one-shot CPU profiler of that node) runs on the Ray node that
  offers the custom resource ``edgemux-node-N`` (declared when the node joins:
  ``ray start --address ... --resources '{"edgemux-node-N": 1}'``); each actor asks for a thousandth of
  it, so the resource marks the machine without limiting what runs there;
* the control plane and the gateway run on the driver's own Ray node (where ``edgemux up`` runs), so the
  control plane's store is a path on that machine.

:meth:`RayLauncher.node_map` checks before anything starts that every edge node with devices has a live
Ray node offering its resource, and names the first that has none.

The actor copies what the process reads from files onto its own machine first (the cluster file, the
profile sets and, with TLS, the CA's certificate and its node's certificate and key, sent by value with the
actor's arguments; every file it writes is its owner's only, mode 600), and starts the process with
``PR_SET_PDEATHSIG`` (Linux): when the Ray node dies, its worker processes die with it and so does the
edgemux process each of them started, as a process on a machine that lost power would. The handle on the
driver's side then reads the actor as gone: :meth:`_RayHandle.poll` returns :data:`LOST` and
:meth:`_RayHandle.stderr_tail` says that the Ray node was lost.

TLS (``up --engine ray --tls``): the engine hands the launcher the cluster's CA (:meth:`RayLauncher.use_ca`),
and each Ray node gets a certificate of its own, issued when the first process starts there for that node's
address and host name (Ray's ``NodeManagerAddress``/``NodeManagerHostname``, the address the actor's
process listens on), with loopback names beside them; the processes of one node share it. A node that
joins later (a machine that came back is a new Ray node) gets one when its first process starts: the CA's
key stays in the driver's memory for as long as the launcher lives, never in a file. The CA's certificate
goes to every actor as well, and the process's ``SSL_CERT_FILE`` is rewritten to that local copy, so that
every process trusts the CA. The certificates and keys travel with the actor's arguments, over Ray's own
connections (encrypted only where Ray's TLS is set up: ``RAY_USE_TLS``), as the admin token does.

Units: ``*_s`` seconds. Ray is an optional dependency (``pip install 'edgemux[ray]'``); nothing outside
this module imports it, and this module imports it only when a launcher is made.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from edgemux.engines.local import STDERR_TAIL_LINES, EngineError, EngineStartError, LocalLauncher, ProcessSpec
from edgemux.runtime.dataplane.messages import RUNS_ON_ENV
from edgemux.runtime.tls import CA_ENV, ClusterCA, write_private

__all__ = ["LOST", "NODE_HOST", "NODE_RESOURCE_PREFIX", "RayLauncher", "check_address", "node_resource"]

NODE_RESOURCE_PREFIX = "edgemux-node-"
# A ``--host`` value the actor replaces with its Ray node's IP address: each process listens where the
# others (on other machines) reach it, and prints that address (``up --engine ray``'s default).
NODE_HOST = "ray-node"
# The exit status a handle reports for a process whose Ray actor (and so, whose Ray node) is gone: that of a
# SIGKILLed process, which is what PR_SET_PDEATHSIG delivers to it.
LOST = -9
# Share of its node's marker resource each actor asks for: enough to pin it there, small enough that any
# number of processes fit on one node.
_PIN = 0.001
# Bound on one call to an actor (seconds) beyond the call's own timeout: the actor answers at once unless
# its node is gone.
_CALL_SLACK_S = 10.0


def node_resource(node: str) -> str:
    """The custom Ray resource that marks the Ray node of edge node ``node``: ``edgemux-node-<node>``."""
    return f"{NODE_RESOURCE_PREFIX}{node}"


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise EngineError("the ray engine needs Ray: pip install 'edgemux[ray]'") from None
    return ray


class _ProcessActor:
    """Runs one edgemux process on the Ray node it was scheduled on (a Ray actor; see :func:`_actor_class`).

    ``files`` maps each path the process's arguments (or its ``SSL_CERT_FILE``) name on the driver's machine
    to its contents (a file's bytes, or a folder's {relative path: bytes}); they are written under a
    temporary folder here (a file mode 600: a private key among them) and the arguments and that variable
    rewritten to point there."""

    def __init__(self, spec: ProcessSpec, files: dict[str, Any]) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="edgemux-ray-"))
        moved: dict[str, str] = {}
        for i, (path, content) in enumerate(files.items()):
            target = self.workdir / "files" / str(i) / Path(path).name
            if isinstance(content, dict):
                _write_tree(target, content)
            else:
                write_private(target, content)
            moved[path] = str(target)
        import ray

        self.node_id, self.ip = ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()
        args = [moved.get(a, a) for a in spec.args]
        for i in range(1, len(args)):
            if args[i - 1] == "--host" and args[i] == NODE_HOST:
                args[i] = self.ip
        env = tuple((k, moved.get(v, v) if k == CA_ENV else v) for k, v in spec.env)
        spec = replace(spec, args=tuple(args), profiles=tuple(moved.get(p, p) for p in spec.profiles), env=env)
        # the agent's registration says which Ray node it runs on
        self.launcher = LocalLauncher(self.workdir / "logs", die_with_parent=True,
                                      env={RUNS_ON_ENV: f"ray node {self.node_id} at {self.ip}"})
        self.handle = self.launcher.launch(spec)

    def where(self) -> dict[str, Any]:
        """The process's pid and the Ray node it runs on (id and IP address)."""
        return {"pid": self.handle.pid, "node_id": self.node_id, "ip": self.ip}

    def wait_listening(self, timeout_s: float) -> tuple[str | None, str | None, int | None, list[str]]:
        """(url, None, None, []) or (None, problem, exit status, stderr tail): errors travel as data."""
        try:
            return self.handle.wait_listening(timeout_s), None, None, []
        except EngineStartError as e:
            return None, e.problem, e.returncode, e.stderr_tail

    def poll(self) -> int | None:
        return self.handle.poll()

    def terminate(self) -> None:
        self.handle.terminate()

    def kill(self) -> None:
        self.handle.kill()

    def wait(self, timeout_s: float) -> int | None:
        return self.handle.wait(timeout_s)

    def stderr_tail(self, lines: int) -> list[str]:
        return self.handle.stderr_tail(lines)

    def read_tree(self, path: str) -> dict[str, bytes]:
        """The files under ``path`` on this machine (what a profiler wrote): ``_read_tree``."""
        return _read_tree(Path(path))


def _read_tree(root: Path) -> dict[str, bytes]:
    """The files under folder ``root``, {path relative to it: bytes}: a folder sent by value to or from an actor."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _write_tree(root: Path, tree: dict[str, bytes]) -> None:
    """Write what ``_read_tree`` read under folder ``root`` (made even when empty)."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, data in tree.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


_ACTOR: Any = None


def _actor_class() -> Any:
    """``_ProcessActor`` as a Ray actor class (made once, when Ray is first needed). No CPU is reserved:
    the process it starts is edgemux's, whose share of the machine edgemux's own admission decides."""
    global _ACTOR
    if _ACTOR is None:
        ray = _import_ray()
        _ACTOR = ray.remote(num_cpus=0, max_restarts=0)(_ProcessActor)
    return _ACTOR


class _RayHandle:
    """The driver's side of one process started by a :class:`_ProcessActor` (a ``ProcessHandle``)."""

    def __init__(self, spec: ProcessSpec, actor: Any, ray: Any, on_lost: Callable[[], None] = lambda: None) -> None:
        self.spec = spec
        self._actor = actor
        self._ray = ray
        self._on_lost = on_lost
        self._lost: str | None = None  # why the actor is gone, once it is
        self._code: int | None = None
        # the process's pid and Ray node, once its actor is up: asked for when the engine first waits on the
        # process, with that wait's timeout (a loaded host takes seconds to start a Ray worker)
        self.where: dict[str, Any] = {}

    def _ensure_where(self, timeout_s: float) -> None:
        if not self.where:
            self.where = self._call("where", timeout_s=timeout_s, default={}) or {}

    @property
    def location(self) -> str:
        """For the engine's summary: the Ray node (the first 8 hex digits of its id) and its address."""
        self._ensure_where(0.0)
        return f"ray node {str(self.where.get('node_id', '?'))[:8]} at {self.where.get('ip', '?')}"

    @property
    def pid(self) -> int | None:
        self._ensure_where(0.0)
        return self.where.get("pid")

    def _call(self, method: str, *args: Any, timeout_s: float = 0.0, default: Any = None) -> Any:
        if self._lost is not None:
            return default
        ray = self._ray
        try:
            return ray.get(getattr(self._actor, method).remote(*args), timeout=timeout_s + _CALL_SLACK_S)
        except ray.exceptions.GetTimeoutError:
            return default
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as e:
            # the actor died with its node (or is unreachable and will be declared dead): the process it
            # started is gone with it (PR_SET_PDEATHSIG)
            self._lost = f"Ray actor lost ({type(e).__name__}): its Ray node is gone or unreachable"
            self._code = LOST
            self._on_lost()
            return default

    def poll(self) -> int | None:
        if self._code is not None:
            return self._code
        code = self._call("poll")
        if code is not None:
            self._code = code
        return self._code

    def wait_listening(self, timeout_s: float) -> str:
        self._ensure_where(timeout_s)
        got = self._call("wait_listening", timeout_s, timeout_s=timeout_s)
        if got is None:
            raise EngineStartError(self.spec.name, self._lost or f"did not answer within {timeout_s:g} s",
                                   self._code, [])
        url, problem, code, tail = got
        if url is None:
            raise EngineStartError(self.spec.name, problem, code, tail)
        return str(url)

    def terminate(self) -> None:
        self._call("terminate")

    def kill(self) -> None:
        self._call("kill")

    def wait(self, timeout_s: float) -> int | None:
        if self._code is not None:
            return self._code
        self._ensure_where(timeout_s)
        code = self._call("wait", timeout_s, timeout_s=timeout_s)
        if code == 0 and self.spec.role == "profile":
            self._fetch_output()
        if code is not None:
            self._code = code
        return self._code

    def _fetch_output(self) -> None:
        """Bring what a profiler wrote on its node (``--out DIR``) to the same folder on the driver's machine,
        where the engine reads it and hands it to every process."""
        args = list(self.spec.args)
        if "--out" not in args[:-1]:
            return
        out = Path(args[args.index("--out") + 1])
        _write_tree(out, self._call("read_tree", str(out), default={}) or {})

    def stderr_tail(self, lines: int = STDERR_TAIL_LINES) -> list[str]:
        tail = self._call("stderr_tail", lines, default=[])
        return list(tail) + ([self._lost] if self._lost else [])

    def release(self) -> None:
        """Kill the actor (its process has been stopped, or is gone with its node)."""
        try:
            self._ray.kill(self._actor)
        except Exception:  # noqa: BLE001 - already gone: nothing to release
            pass


class RayLauncher:
    """Starts :class:`~edgemux.engines.local.ProcessSpec` processes on a Ray cluster (module docstring).

    ``address``: the Ray cluster to join (``auto``: the one this machine belongs to; ``host:port``: its
    GCS; None: start a local single-node Ray that stands for every edge node in ``local_nodes``, for trying
    things out on one machine). A launcher made while Ray is already
    initialized in this process (a test's ``ray.init``) uses that connection and leaves it open on
    :meth:`close`; otherwise it connects and disconnects itself."""

    def __init__(self, address: str | None = None, *, namespace: str = "edgemux",
                 local_nodes: Sequence[str] = ()) -> None:
        ray = _import_ray()
        self._ray = ray
        self._own_connection = not ray.is_initialized()
        if self._own_connection:
            if address not in (None, "auto"):
                check_address(address)
            try:
                local = {"include_dashboard": False, "resources": {node_resource(n): 1 for n in local_nodes}}
                ray.init(address=address, namespace=namespace, log_to_driver=False, logging_level=logging.ERROR,
                         **(local if address is None else {}))
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise EngineError(f"cannot join the Ray cluster at {address or 'a new local one'}: "
                                  f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
        self.head_node_id: str = ray.get_runtime_context().get_node_id()
        self.handles: list[_RayHandle] = []
        self.lost_node_ids: set[str] = set()  # Ray nodes whose actors this launcher saw die
        self._ca: ClusterCA | None = None
        self.certificates: dict[str, tuple[bytes, bytes]] = {}  # Ray node id -> its (certificate, key), PEM

    def use_ca(self, ca: ClusterCA) -> None:
        """Issue each Ray node's processes a certificate of their own from ``ca`` (module docstring, TLS): a
        process whose arguments carry ``--tls-cert``/``--tls-key`` is given its node's instead of the
        driver's. The launcher holds the CA (and its key, in memory) until :meth:`close`, which forgets it."""
        self._ca = ca

    def _certificate(self, node_id: str) -> tuple[bytes, bytes]:
        """The (certificate, key) of the Ray node ``node_id``, issued on first use for its address and host
        name (and loopback), kept for its other processes."""
        if node_id not in self.certificates:
            assert self._ca is not None
            node: dict[str, Any] = next((n for n in self._ray.nodes() if n.get("NodeID") == node_id), {})
            names = [x for x in (node.get("NodeManagerAddress"), node.get("NodeManagerHostname")) if x]
            if not names:
                raise EngineError(f"Ray node {node_id[:8]}: its address is not known, so no certificate can name it")
            self.certificates[node_id] = self._ca.issue([*names, "localhost", "127.0.0.1", "::1"])
        return self.certificates[node_id]

    def _live(self) -> list[dict[str, Any]]:
        """The Ray nodes that are alive and not known to this launcher as lost. A node whose actor was lost
        may still be listed alive until Ray's health checks give up on it; a machine that comes back joins
        as a new Ray node, with a new id."""
        return [n for n in self._ray.nodes() if n.get("Alive") and n.get("NodeID") not in self.lost_node_ids]

    def node_alive(self, node: str) -> bool:
        """Whether a live Ray node (``_live``) offers edge node ``node``'s resource: a lost node came back."""
        key = node_resource(node)
        return any(n.get("Resources", {}).get(key, 0) > 0 for n in self._live())

    def check_nodes(self, nodes: Sequence[str]) -> None:
        """EngineError naming the first edge node in ``nodes`` no live Ray node stands for (``node_map``)."""
        self.node_map(nodes)

    def node_map(self, nodes: Sequence[str]) -> dict[str, str]:
        """Edge node -> the id of the live Ray node offering ``edgemux-node-<name>``; EngineError naming the
        first edge node that none offers (with the resources the live nodes do offer)."""
        live = self._live()
        out: dict[str, str] = {}
        for node in nodes:
            key = node_resource(node)
            match = [n["NodeID"] for n in live if n.get("Resources", {}).get(key, 0) > 0]
            if not match:
                offered = sorted({r for n in live for r in n.get("Resources", {}) if r.startswith(NODE_RESOURCE_PREFIX)})
                raise EngineError(
                    f"edge node {node!r}: no live Ray node offers the resource {key!r} (start one with "
                    f"ray start --address ... --resources '{{\"{key}\": 1}}'; offered now: "
                    f"{', '.join(offered) or 'none'})")
            out[node] = match[0]
        return out

    def launch(self, spec: ProcessSpec) -> _RayHandle:
        """Start ``spec`` on its node's Ray node (an agent or a profiler) or on the driver's (the rest)."""
        ray = self._ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if spec.node is not None and spec.role in ("agent", "profile"):
            # the live node that offers its resource (a clear error now rather than an actor that never
            # schedules), named by id: never a lost node that Ray still lists
            target = self.node_map([spec.node])[spec.node]
            options: dict[str, Any] = {"resources": {node_resource(spec.node): _PIN}}
        else:
            target, options = self.head_node_id, {}
        strategy = NodeAffinitySchedulingStrategy(target, soft=False)
        tls = self._certificate(target) if self._ca is not None and "--tls-cert" in spec.args else None
        actor = _actor_class().options(scheduling_strategy=strategy, **options).remote(spec, _files_of(spec, tls))
        handle = _RayHandle(spec, actor, ray, on_lost=lambda: self.lost_node_ids.add(target))
        self.handles.append(handle)
        return handle

    def close(self) -> None:
        """Kill the actors (the engine has stopped their processes) and leave Ray if this launcher joined."""
        for h in self.handles:
            h.release()
        self.handles.clear()
        if self._ca is not None:
            self._ca.forget()
            self._ca = None
        self.certificates.clear()
        if self._own_connection and self._ray.is_initialized():
            self._ray.shutdown()


def check_address(address: str, timeout_s: float = 5.0) -> None:
    """EngineError unless ``address`` (``HOST:PORT`` of a Ray cluster's GCS) accepts a TCP connection within
    ``timeout_s`` seconds: Ray itself retries an unreachable address for minutes. A Ray Client address
    (``ray://``) is refused: the engine's driver must run on a node of the cluster (its control plane
    runs there)."""
    import socket

    if address.startswith("ray://"):
        raise EngineError(f"--address {address}: Ray Client addresses are not supported; run edgemux up on a "
                          "node of the Ray cluster and give --address auto or HOST:PORT")
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise EngineError(f"--address {address!r}: expected auto or HOST:PORT (e.g. 10.0.0.1:6379)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise EngineError(f"cannot reach the Ray cluster at {address}: {e.strerror or e}") from None


def _files_of(spec: ProcessSpec, tls: tuple[bytes, bytes] | None = None) -> dict[str, Any]:
    """What the process reads from the driver's files, by value: the ``--cluster`` file, the profile sets and
    the CA its ``SSL_CERT_FILE`` names; with ``tls`` (its node's certificate and key, PEM) those in place of
    the files its ``--tls-cert``/``--tls-key`` name (without, the named files themselves)."""
    files: dict[str, Any] = {}
    args = list(spec.args)
    for i, a in enumerate(args[:-1]):
        if a in ("--cluster", "--tls-cert", "--tls-key"):
            path = args[i + 1]
            if tls is not None and a != "--cluster":
                files[path] = tls[0] if a == "--tls-cert" else tls[1]
            else:
                files[path] = Path(path).read_bytes()
    for d in spec.profiles:
        files[d] = _read_tree(Path(d))
    for key, value in spec.env:
        if key == CA_ENV and Path(value).is_file():
            files[value] = Path(value).read_bytes()
    return files



