"""``edgemux up`` as a child process, and the small HTTP helpers around it: what bench_ray_engine.py and
tests/test_engine_ray.py share (the test imports it from here, as other tests import the benchmarks'
generators). Units: s."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
CLIENT_TIMEOUT_S = 10.0  # each HTTP call's timeout


def cluster_yaml(nodes: list[str] | tuple[str, ...], cpu_node: bool = False) -> str:
    """A cluster file: ``nodes`` with one emulated Edge TPU each (profiles ibis-edgetpu), and with
    ``cpu_node`` a node ``cpu-1`` with a REAL onnxruntime cpu device."""
    text = "apiVersion: edgemux/v1alpha1\nkind: Cluster\nmetadata: {name: up-child}\nspec:\n  nodes:\n"
    for n in nodes:
        text += (f"    - name: {n}\n      cpuCores: 4\n      memoryMb: 4096\n      devices:\n"
                 f"        - {{name: tpu0, kind: edgetpu, memoryMb: 6.9, profiles: ibis-edgetpu}}\n")
    if cpu_node:
        text += ("    - name: cpu-1\n      cpuCores: 2\n      memoryMb: 8192\n      devices:\n"
                 "        - {name: cpu0, kind: cpu, discipline: fcfs, memoryMb: 2048}\n")
    return text


def app_yaml(name: str, model: str, rate: float) -> str:
    """One app at ``rate`` req/s (burst as many), mean latency within 200 ms."""
    return (f"apiVersion: edgemux/v1alpha1\nkind: App\nmetadata: {{name: {name}}}\n"
            f"spec: {{model: {model}, rate: {rate:g}, burst: {rate:g}, slo: {{latencyMs: 200}}}}\n")


def http(method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None,
         timeout_s: float = CLIENT_TIMEOUT_S) -> tuple[int, bytes]:
    """(status, body) of one HTTP call; an error status is an answer, no answer an OSError."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def get_json(url: str) -> Any:
    """The JSON of a 200 answer to ``GET url``; None otherwise."""
    status, body = http("GET", url)
    return json.loads(body) if status == 200 else None


def until(what: str, probe: Callable[[], T], timeout_s: float, every_s: float = 0.1) -> T:
    """``probe()``'s first true value, polled every ``every_s``; RuntimeError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(every_s)
    raise RuntimeError(f"timed out after {timeout_s:g} s waiting for {what}")


class Up:
    """``python -m edgemux up ARGS`` as a child in its own process group; its output lines kept, read by a
    thread."""

    def __init__(self, args: list[str]) -> None:
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, "-m", "edgemux", "up", "--ephemeral", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[str] = []
        self._new: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            self._new.put(line)
        self._new.put(None)

    def wait_for(self, prefix: str, timeout_s: float) -> float:
        """Seconds since the start until a line starting with ``prefix`` came; RuntimeError with the last
        lines when it does not come within ``timeout_s`` or ``up`` exits first."""
        deadline = time.monotonic() + timeout_s
        while not any(line.startswith(prefix) for line in self.lines):
            left = deadline - time.monotonic()
            if left <= 0 or (self.proc.poll() is not None and self._new.empty()):
                raise RuntimeError(f"up never printed {prefix!r}:\n" + "\n".join(self.lines[-40:]))
            try:
                self._new.get(timeout=min(left, 0.5))
            except queue.Empty:
                pass
        return time.perf_counter() - self.t0

    def line(self, prefix: str) -> str:
        """The first output line starting with ``prefix``."""
        return next(line for line in self.lines if line.startswith(prefix))

    def field(self, prefix: str, index: int = 1) -> str:
        """Word ``index`` of that line (``controlplane URL ...``: 1; ``agent NODE URL ...``: 2)."""
        return self.line(prefix).split()[index]

    def stop(self, timeout_s: float = 90.0) -> int | None:
        """Ctrl-C, then its exit status; SIGKILL to the group (and None) when it does not exit in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
            return None
