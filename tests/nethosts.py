"""Test hosts made of Linux network namespaces: N "hosts", each with its own network stack and address,
joined by a bridge, whose links a test can cut and restore while their processes keep running.

Used by the tests (the ``net_hosts`` fixture: ``from nethosts import net_hosts``; tests/ is on sys.path) and by
benchmarks/partition.py (which puts tests/ on its path). Needs root (``ip netns add``) and iproute2; where
that is not permitted the fixture skips, naming why (:func:`unavailable`).

What :class:`NetHosts` makes, named from a random tag of 5 characters (interface names are limited to 15):

- a bridge ``emx<tag>br`` in the root namespace, with the address ``10.213.X.254/24`` (X picked so that no
  address or route of this machine is in that /24, under a lock shared by concurrent test processes), so
  that the root namespace (the test itself) reaches every host;
- per host i: a namespace ``emx-<tag>-<i>`` with loopback up and ``eth0`` at ``10.213.X.(i+1)/24``, the other
  end of its veth pair ``emx<tag>v<i>`` enslaved to the bridge.

Cutting a host's link (:meth:`NetHosts.cut`): ``how="drop"`` (default) disables its bridge port: its link
stays up on both ends and every frame is silently dropped, as when a link fails further upstream (the
processes see no error, only timeouts); ``how="down"`` sets the root end of its veth down (the host sees
carrier loss). :meth:`NetHosts.restore` undoes either. (``tc`` actions and ``netem`` are not available on
every kernel; these two need only the bridge and veth drivers.)

Cleanup (:meth:`NetHosts.close`, idempotent, run by the fixture's finalizer whether the test passed or not,
and by ``atexit`` for whatever is still open when the interpreter exits): every process started in a host
(its process group, then anything else left in the namespace, by pid) is terminated, then killed; the veths,
the bridge and the namespaces are deleted, and the deletion is checked. A run killed outright (SIGKILL) leaves
a record in ``STATE_DIR``; the next :class:`NetHosts` removes what such a dead run made.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import ipaddress
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Host", "NetHosts", "STATE_DIR", "leftovers", "net_hosts", "unavailable"]

PREFIX = "emx"                     # every name made here starts with it
SUBNET_BASE = "10.213"             # hosts live in SUBNET_BASE.X.0/24, X in 1..250
STATE_DIR = Path(tempfile.gettempdir()) / "edgemux-nethosts"
IP_TIMEOUT_S = 20.0                # one `ip` command
STOP_TIMEOUT_S = 5.0               # a process's grace after SIGTERM before SIGKILL

_open: set[NetHosts] = set()
_open_lock = threading.Lock()


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=check)


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=check)


def unavailable() -> str | None:
    """Why network-namespace hosts cannot be made here (None: they can): not Linux, no iproute2, not root, or
    ``ip netns add`` refused (e.g. a container without CAP_SYS_ADMIN)."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux's (this is {sys.platform})"
    if shutil.which("ip") is None:
        return "iproute2's ip is not installed"
    if os.geteuid() != 0:
        return "making network namespaces needs root (ip netns add); run as root, as CI does"
    probe = f"{PREFIX}-probe-{os.getpid()}"
    try:
        done = _ip("netns", "add", probe, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"ip netns add failed: {e}"
    if done.returncode != 0:
        return f"ip netns add is not permitted here: {done.stderr.strip() or done.returncode}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass(frozen=True)
class Host:
    """One namespaced host: its namespace ``name``, index ``i``, address ``ip`` and the root end of its veth
    pair (``veth``: what :meth:`NetHosts.cut` acts on)."""

    name: str
    i: int
    ip: str
    veth: str


def leftovers(tag: str) -> list[str]:
    """What of run ``tag`` still exists: its namespaces (``ip netns list``) and links (``ip link``)."""
    out = []
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(f"{PREFIX}-{tag}-"):
            out.append(f"netns {name}")
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) > 1:
            name = parts[1].strip().split("@")[0]
            if name.startswith(f"{PREFIX}{tag}"):
                out.append(f"link {name}")
    return out


class NetHosts:
    """``n`` namespaced hosts (module doc). ``start()`` makes them (a failure part-way removes what it made and
    raises); ``close()`` removes everything. A context manager."""

    def __init__(self, n: int) -> None:
        if not 1 <= n <= 200:
            raise ValueError(f"n must be in 1..200 hosts, got {n}")
        self.n = n
        self.tag = secrets.token_hex(3)[:5]
        self.bridge = f"{PREFIX}{self.tag}br"
        self.subnet: ipaddress.IPv4Network | None = None
        self.bridge_ip = ""
        self.hosts: list[Host] = []
        self.procs: list[tuple[Host, subprocess.Popen[Any]]] = []
        self.cut_hosts: dict[str, str] = {}  # host name -> how it was cut
        self._made: list[tuple[str, str]] = []  # ("netns"|"link", name), in creation order
        self._closed = False
        self._state = STATE_DIR / f"{self.tag}.json"

    # -- making -----------------------------------------------------------------------------------------

    def start(self) -> NetHosts:
        with _open_lock:
            _open.add(self)
        try:
            STATE_DIR.mkdir(parents=True, exist_ok=True)
            with _locked():
                _sweep_dead_runs()
                x = _free_subnet()
                self.subnet = ipaddress.IPv4Network(f"{SUBNET_BASE}.{x}.0/24")
                self._record(x)
                _ip("link", "add", self.bridge, "type", "bridge")
                self._made.append(("link", self.bridge))
                _ip("addr", "add", f"{SUBNET_BASE}.{x}.254/24", "dev", self.bridge)
                _ip("link", "set", self.bridge, "up")
            self.bridge_ip = f"{SUBNET_BASE}.{x}.254"
            for i in range(self.n):
                self.hosts.append(self._host(i, x))
        except BaseException:
            self.close()
            raise
        return self

    def _record(self, x: int) -> None:
        self._state.write_text(json.dumps({"pid": os.getpid(), "tag": self.tag, "x": x}))

    def _host(self, i: int, x: int) -> Host:
        name, veth = f"{PREFIX}-{self.tag}-{i}", f"{PREFIX}{self.tag}v{i}"
        _ip("netns", "add", name)
        self._made.append(("netns", name))
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name)
        self._made.append(("link", veth))
        _ip("link", "set", veth, "master", self.bridge, "up")
        ip = f"{SUBNET_BASE}.{x}.{i + 1}"
        _ip("-n", name, "addr", "add", f"{ip}/24", "dev", "eth0")
        _ip("-n", name, "link", "set", "eth0", "up")
        _ip("-n", name, "link", "set", "lo", "up")
        return Host(name, i, ip, veth)

    # -- using ------------------------------------------------------------------------------------------

    def popen(self, host: Host, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside ``host`` (``ip netns exec``), in a process group of its own; returned, and
        stopped by :meth:`close` (or earlier by :meth:`stop`). ``kwargs`` go to ``subprocess.Popen``."""
        if self._closed:
            raise RuntimeError("these hosts are closed")
        proc = subprocess.Popen(["ip", "netns", "exec", host.name, *argv], start_new_session=True, **kwargs)
        self.procs.append((host, proc))
        return proc

    def cut(self, host: Host, how: str = "drop") -> None:
        """Cut ``host``'s link, its processes running on: ``drop`` (its bridge port disabled: frames silently
        dropped, the link up) or ``down`` (the root end of its veth down: carrier lost)."""
        if how == "drop":
            _run("bridge", "link", "set", "dev", host.veth, "state", "0")
        elif how == "down":
            _ip("link", "set", host.veth, "down")
        else:
            raise ValueError(f"how: 'drop' or 'down', got {how!r}")
        self.cut_hosts[host.name] = how

    def restore(self, host: Host) -> None:
        """Restore ``host``'s link as it was before :meth:`cut`."""
        how = self.cut_hosts.pop(host.name, None)
        if how == "drop":
            _run("bridge", "link", "set", "dev", host.veth, "state", "3")  # forwarding
        elif how == "down":
            _ip("link", "set", host.veth, "up")

    def stop(self, proc: subprocess.Popen[Any], timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM ``proc``'s process group, SIGKILL after ``timeout_s``; its exit status."""
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            try:
                return proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                return None

    # -- cleaning up ------------------------------------------------------------------------------------

    def close(self) -> list[str]:
        """Remove everything these hosts made (module doc); returns what could not be removed ([] normally).
        Idempotent; never raises for a cleanup step that fails (it tries the others and reports)."""
        if self._closed:
            return []
        self._closed = True
        problems: list[str] = []
        # every process told at once, then waited for on one deadline: one at a time, a few Ray nodes that
        # take their grace each had made the teardown 20 s
        running = [proc for _, proc in self.procs if proc.poll() is None]
        for proc in running:
            _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in running:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in running:
            if proc.poll() is None:
                try:
                    _signal_group(proc.pid, signal.SIGKILL)
                    proc.wait(STOP_TIMEOUT_S)
                except Exception as e:  # pragma: no cover - reported
                    problems.append(f"process {proc.pid}: {e!r}")
        for h in self.hosts:  # anything else still in a host (a child that left its group): by pid
            _kill_netns_pids(h.name)
        for kind, name in reversed(self._made):
            if kind == "link":
                _ip("link", "del", name, check=False)  # a veth's peer goes with it
            else:
                _ip("netns", "del", name, check=False)
        deadline = time.monotonic() + 10.0  # namespace teardown is asynchronous in the kernel
        left = leftovers(self.tag)
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = leftovers(self.tag)
        problems += left
        with contextlib.suppress(OSError):
            self._state.unlink()
        with _open_lock:
            _open.discard(self)
        return problems

    def __enter__(self) -> NetHosts:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_netns_pids(netns: str) -> None:
    """Kill every process still in namespace ``netns`` (ours: nothing else runs in a namespace we made)."""
    for _ in range(2):
        pids = [int(p) for p in _ip("netns", "pids", netns, check=False).stdout.split() if p.isdigit()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """Serialize subnet picking and sweeping among concurrent test processes (pytest-xdist workers)."""
    with open(STATE_DIR / "lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _free_subnet() -> int:
    """An X such that nothing on this machine (an address, a route, a live run's record) is in
    SUBNET_BASE.X.0/24; a random one, so that concurrent runs rarely even compare."""
    used = _ip("-4", "-o", "addr", "show", check=False).stdout + _ip("-4", "route", "show", check=False).stdout
    taken = set()
    for rec in STATE_DIR.glob("*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            taken.add(int(json.loads(rec.read_text())["x"]))
    candidates = [x for x in range(1, 251) if x not in taken and f"{SUBNET_BASE}.{x}." not in used]
    if not candidates:
        raise RuntimeError(f"no free {SUBNET_BASE}.X.0/24 subnet on this machine")
    return candidates[secrets.randbelow(len(candidates))]


def _sweep_dead_runs() -> None:
    """Remove what a run killed outright left (its record names a process that no longer exists)."""
    for rec in STATE_DIR.glob("*.json"):
        try:
            doc = json.loads(rec.read_text())
            pid, tag = int(doc["pid"]), str(doc["tag"])
        except (OSError, ValueError, KeyError):
            continue
        if _alive(pid):
            continue
        for what in leftovers(tag):
            kind, name = what.split(" ", 1)
            if kind == "netns":
                _kill_netns_pids(name)
                _ip("netns", "del", name, check=False)
            else:
                _ip("link", "del", name, check=False)
        with contextlib.suppress(OSError):
            rec.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@atexit.register
def _close_all() -> None:
    with _open_lock:
        left = list(_open)
    for hosts in left:
        hosts.close()


try:
    import pytest
except ImportError:  # pragma: no cover - the benchmark runs without pytest
    pytest = None  # type: ignore[assignment]

if pytest is not None:
    @pytest.fixture
    def net_hosts() -> Iterator[Callable[[int], NetHosts]]:
        """A factory ``make(n) -> NetHosts`` of started namespaced hosts; every set made is closed when the
        test ends, passed or failed (the check that nothing is left is the test's: ``leftovers``). Skips
        when namespaces cannot be made here (:func:`unavailable`)."""
        why = unavailable()
        if why is not None:
            pytest.skip(f"namespaced test hosts: {why}")
        made: list[NetHosts] = []

        def make(n: int) -> NetHosts:
            hosts = NetHosts(n)
            made.append(hosts)
            return hosts.start()

        try:
            yield make
        finally:
            problems = [p for hosts in made for p in hosts.close()]
            if problems:
                raise AssertionError(f"namespaced hosts not cleaned up: {problems}")
