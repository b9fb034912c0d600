"""Fault injection with real processes on loopback (issue 4).

Every process here is a real ``python -m edgemux ...`` child: a control plane on a store file and one agent
per node of a two-node cluster (one emulated Edge TPU each, profiles ``ibis-edgetpu``), bound with
``--port 0`` and found from their ``... listening on http://HOST:PORT`` lines. Faults are SIGKILLs, so
nothing gets to clean up. The tests check the failure semantics that docs/concepts.md promises ("no silent
loss", "every admitted app survives a restart") and that runtime/ingress/client.py documents:

1. the control plane killed while apps are served: inference goes on (the client needs only its routes),
   an ``edgemux apply`` against the dead server is exit code 2 and one line, and a control plane restarted
   on the same store lists the same apps and placements; the agents re-register and the apps are ready
   again;
2. an agent killed: requests for a partitioned app fail over to the live agent (the dead endpoint is named
   in ``InferResult.failures``), an app only the dead agent served raises ``Unavailable`` naming it;
3. ``edgemux apply`` against a control plane that is not running: exit code 2, one line on stderr.

Nothing may hang: every wait is bounded (``STEP_S``), every client call runs on the harness's
:class:`Caller` under a bound, and every child is killed in the harness's teardown. No latency is compared
with a wall-clock threshold: the machine may be shared and slow; only events are awaited, each within a
generous bound.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from edgemux.runtime.ingress.client import AppRoute, Client, InferResult, Unavailable
from edgemux.runtime.dataplane.protocol import DATATYPES
from support import TWO_TPUS_YAML

ROOT = Path(__file__).resolve().parent.parent
STEP_S = 20.0          # bound on every single wait (a process start, a registration, an HTTP call)
CLIENT_TIMEOUT_S = 10.0  # the inference client's per-exchange timeout
HEARTBEAT_S = 1.0      # agents heartbeat every second: ready (3 heartbeats) and re-registration come fast
N_REQUESTS = 10        # requests per app and phase

T = TypeVar("T")

# Two nodes with one emulated Edge TPU each. A shared mobilenet_v2 app at 200 req/s fits on neither TPU
# alone, so the edgemux policy partitions it over both (about 0.92 / 0.08); a 10 req/s one fits on one.
CLUSTER_YAML = TWO_TPUS_YAML
NODES = ("n1", "n2")


def app_yaml(name: str, rate: float) -> str:
    # shared: both apps use one loaded mobilenet_v2 per TPU (6.9 MB holds one copy only)
    return (f"apiVersion: edgemux/v1alpha1\nkind: App\nmetadata: {{name: {name}}}\n"
            f"spec: {{model: mobilenet_v2, rate: {rate}, burst: 2, slo: {{latencyMs: 50}}, shared: true}}\n")


APPS_YAML = app_yaml("big", 200) + "---\n" + app_yaml("small", 10)
APPS = ("big", "small")


# --------------------------------------------------------------------------------------------- helpers


def http(method: str, url: str, body: bytes | str | None = None,
         content_type: str = "application/json") -> tuple[int, Any]:
    """One bounded HTTP call; (status, parsed JSON body)."""
    data = body.encode() if isinstance(body, str) else body
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, timeout=STEP_S) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    return status, (json.loads(raw) if raw else None)


def wait_until(what: str, probe: Callable[[], T], timeout_s: float = STEP_S, every_s: float = 0.1) -> T:
    """Poll ``probe`` until it returns something truthy (returned); fail after ``timeout_s`` seconds. A probe
    that raises counts as not yet (e.g. the server is not up); the last value or error is in the message."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        try:
            value = probe()
            if value:
                return value
            last = value
        except (OSError, urllib.error.URLError, ValueError, KeyError, TypeError) as e:
            last = e
        if time.monotonic() >= deadline:
            pytest.fail(f"{what}: not within {timeout_s:g} s (last: {last!r})")
        time.sleep(every_s)


class Caller:
    """Runs calls on one daemon thread of its own and fails the test when one does not return (or raise)
    within its bound: a hang is a test failure, not a stuck run (pytest-timeout is not installed). One
    thread for all calls, because the client keeps its keep-alive connections per thread: connections made
    before a fault are the ones reused after it, as in a real caller."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[Callable[[], Any], dict[str, Any], threading.Event] | None] = queue.Queue()
        threading.Thread(target=self._run, name="test caller", daemon=True).start()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, box, done = job
            try:
                box["value"] = fn()
            except BaseException as e:  # handed to the caller
                box["error"] = e
            done.set()

    def __call__(self, what: str, fn: Callable[[], T], timeout_s: float) -> T:
        box: dict[str, Any] = {}
        done = threading.Event()
        self._jobs.put((fn, box, done))
        if not done.wait(timeout_s):
            pytest.fail(f"{what}: did not return within {timeout_s:g} s (hangs)")
        if "error" in box:
            raise box["error"]
        return box["value"]

    def close(self) -> None:
        self._jobs.put(None)


# A client call tries each endpoint at most once, and each try may be one stale keep-alive retry plus a
# fresh exchange, each bounded by the client's timeout: beyond this bound the call hangs.
CALL_BOUND_S = 2 * 2 * CLIENT_TIMEOUT_S + STEP_S


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Child:
    """One ``python -m edgemux ARGS`` child: stdout lines go to a queue (a reader thread drains the pipe),
    stderr (the logs) to a file, so that the child never blocks on a full pipe."""

    def __init__(self, name: str, args: list[str], log: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log = log
        self._log_file = open(log, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "edgemux", *args], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=self._log_file, text=True, env=env)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name=f"stdout of {name}", daemon=True)
        self._reader.start()
        self.url = ""

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)  # EOF: the child exited (or closed stdout)

    def wait_listening(self, prefix: str) -> str:
        """The URL of the child's ``PREFIX listening on URL`` line, within ``STEP_S`` seconds."""
        deadline = time.monotonic() + STEP_S
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"{self.name}: no '{prefix} listening on' line within {STEP_S:g} s\n{self.tail()}")
            if line is None:
                pytest.fail(f"{self.name}: exited with code {self.proc.poll()} before listening\n{self.tail()}")
            if line.startswith(f"{prefix} listening on http://"):
                self.url = line.rsplit(" ", 1)[1]
                return self.url

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def kill9(self) -> None:
        """SIGKILL, and reap it (bounded)."""
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(timeout=STEP_S) == -signal.SIGKILL

    def stop(self) -> None:
        """Teardown: kill if still running, reap, close the log."""
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=STEP_S)
        finally:
            self._log_file.close()

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return f"--- last lines of {self.log.name} ---\n" + "\n".join(text[-lines:])


class Harness:
    """Starts the children of one test and kills every one of them at teardown."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.cluster = tmp / "cluster.yaml"
        self.cluster.write_text(CLUSTER_YAML)
        self.apps_file = tmp / "apps.yaml"
        self.apps_file.write_text(APPS_YAML)
        self.store = tmp / "store.db"
        self.env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "EDGEMUX_CACHE": str(tmp / "cache"),
                    "PYTHONUNBUFFERED": "1"}
        self.children: list[Child] = []
        self.call = Caller()

    def _start(self, name: str, args: list[str]) -> Child:
        child = Child(name, args, self.tmp / f"{name}.log", self.env)
        self.children.append(child)
        return child

    def controlplane(self, port: int = 0) -> Child:
        cp = self._start("controlplane", ["controlplane", "--cluster", str(self.cluster), "--store", str(self.store),
                                          "--port", str(port), "--log-level", "info"])
        cp.wait_listening("controlplane")
        return cp

    def agents(self, controlplane_url: str) -> dict[str, Child]:
        """One agent per node, started together (they import in parallel), each within ``STEP_S``."""
        started = {n: self._start(f"agent-{n}", [
            "agent", "--cluster", str(self.cluster), "--node", n, "--port", "0", "--controlplane", controlplane_url,
            "--heartbeat-s", str(HEARTBEAT_S), "--timeout-s", str(CLIENT_TIMEOUT_S),
            "--cache-dir", str(self.tmp / "zoo"), "--log-level", "info"]) for n in NODES}
        for n, a in started.items():
            a.wait_listening(f"agent {n}")
        return started

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``edgemux ARGS`` as a child process, bounded (``subprocess.run`` kills it on timeout)."""
        return subprocess.run([sys.executable, "-m", "edgemux", *args], capture_output=True, text=True,
                              env=self.env, timeout=3 * STEP_S, stdin=subprocess.DEVNULL)

    def tails(self) -> str:
        return "\n".join(c.tail() for c in self.children)

    def close(self) -> None:
        self.call.close()
        errors = []
        for c in self.children:  # every child, even when reaping one of them fails
            try:
                c.stop()
            except Exception as e:
                errors.append(f"{c.name}: {e!r}")
        assert not errors, errors


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path)
    try:
        yield h
    finally:
        h.close()


# ------------------------------------------------------------------------------------------- cluster steps


def agents_ready(cp_url: str, urls: dict[str, str]) -> bool:
    """Every node's agent registered at its URL and heartbeating (the control plane's ``ready``)."""
    status, body = http("GET", f"{cp_url}/v1/agents")
    if status != 200 or body["unregistered_nodes"]:
        return False
    got = {a["node"]: (a["url"], a["ready"]) for a in body["agents"]}
    return got == {n: (u, True) for n, u in urls.items()}


def apps_ready(cp_url: str) -> list[dict[str, Any]] | None:
    """The app listing once every app in ``APPS`` is ``ready`` (loaded on all its agents), else None."""
    status, body = http("GET", f"{cp_url}/v1/apps")
    if status != 200:
        return None
    apps = body["apps"]
    if sorted(a["name"] for a in apps) != sorted(APPS) or any(a["status"] != "ready" for a in apps):
        return None
    return apps


def routes(cp_url: str, agents: dict[str, Child]) -> dict[str, AppRoute]:
    """Each app's :class:`AppRoute` from the control plane's ``GET /v1/routes/{app}``."""
    out = {}
    for app in APPS:
        status, r = http("GET", f"{cp_url}/v1/routes/{app}")
        assert status == 200 and r["endpoints"] and r["pending"] == [], r
        assert {e["url"] for e in r["endpoints"]} <= {a.url for a in agents.values()}, r
        out[app] = AppRoute(app, r["model"], [(e["url"], e["weight"]) for e in r["endpoints"]],
                            r["rate_rps"], r["burst"])
    return out


def inputs_for(route: AppRoute) -> dict[str, np.ndarray]:
    """Zero tensors of the model's declared inputs (variable dimensions as 1)."""
    url = route.endpoints[0][0].url
    status, meta = http("GET", f"{url}/v2/models/{route.model}")
    assert status == 200, meta
    return {i["name"]: np.zeros([1 if d == -1 else d for d in i["shape"]], DATATYPES[i["datatype"]])
            for i in meta["inputs"]}


def serve(h: Harness, client: Client, app: str, inputs: dict[str, np.ndarray],
          n: int = N_REQUESTS) -> list[InferResult]:
    """``n`` requests, each bounded; every one must succeed."""
    results = []
    for i in range(n):
        r = h.call(f"request {i} of app {app}", lambda: client.infer(app, inputs), CALL_BOUND_S)
        assert r.outputs and all(v.size > 0 for v in r.outputs.values())
        results.append(r)
    return results


def held(agent: Child) -> dict[str, Any]:
    """What an agent holds (``GET /v1/apps``): app -> (model, weight, created_at); a reload changes it."""
    status, body = http("GET", f"{agent.url}/v1/apps")
    assert status == 200, body
    return {a["app"]: (a["model"], a["weight"], a["created_at"]) for a in body["apps"]}


def endpoints(listing_or_route: Any) -> dict[str, float]:
    return {e["url"]: e["weight"] for e in listing_or_route["endpoints"]}


def bring_up(h: Harness, apply_with_cli: bool) -> tuple[Child, dict[str, Child], list[dict[str, Any]]]:
    """Control plane, two registered agents, both apps applied and ready; returns the app listing."""
    cp = h.controlplane()
    agents = h.agents(cp.url)
    urls = {n: a.url for n, a in agents.items()}
    wait_until("both agents registered and ready", lambda: agents_ready(cp.url, urls))
    if apply_with_cli:
        done = h.cli("apply", "-f", str(h.apps_file), "--server", cp.url)
        assert done.returncode == 0, (done.stdout, done.stderr, h.tails())
        assert "created" in done.stdout and "big" in done.stdout and "small" in done.stdout, done.stdout
    else:
        status, body = http("POST", f"{cp.url}/v1/apps", APPS_YAML, "application/yaml")
        assert status == 201, body
    listing = wait_until("both apps ready on their agents", lambda: apps_ready(cp.url))
    return cp, agents, listing


# ---------------------------------------------------------------------------------------------- scenarios


def test_controlplane_killed_serving_goes_on_and_restart_keeps_state(harness: Harness) -> None:
    h = harness
    cp, agents, listing = bring_up(h, apply_with_cli=True)
    big = next(a for a in listing if a["name"] == "big")
    assert len(big["shares"]) == 2, big  # partitioned over both TPUs
    before_routes = {app: endpoints(http("GET", f"{cp.url}/v1/routes/{app}")[1]) for app in APPS}
    table = routes(cp.url, agents)
    inputs = {app: inputs_for(table[app]) for app in APPS}
    held_before = {n: held(a) for n, a in agents.items()}
    for n, a in agents.items():  # each agent holds exactly the apps routed to it
        assert sorted(held_before[n]) == sorted(app for app in APPS if a.url in before_routes[app])

    with Client(table, timeout_s=CLIENT_TIMEOUT_S, max_wait_s=STEP_S) as client:
        for app in APPS:
            serve(h, client, app, inputs[app])

        cp.kill9()
        # the data plane does not need the control plane: every request still succeeds, first try
        for app in APPS:
            for r in serve(h, client, app, inputs[app]):
                assert r.failures == {} and r.endpoint in before_routes[app]
        for a in agents.values():
            assert a.proc.poll() is None, a.tail()
            assert http("GET", f"{a.url}/v2/health/ready")[0] == 200

        # control plane down at apply time: exit code 2 and one line naming the server
        done = h.cli("apply", "-f", str(h.apps_file), "--server", cp.url)
        assert done.returncode == 2, (done.stdout, done.stderr)
        assert done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith("edgemux: error: cannot reach the control plane at") and cp.url in done.stderr

        # restart on the same store and the same port (where the agents keep heartbeating)
        cp2 = h.controlplane(port=cp.port)
        assert cp2.url == cp.url
        status, body = http("GET", f"{cp2.url}/v1/apps")
        assert status == 200

        def strip(apps: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return sorted(({k: v for k, v in a.items() if k != "status"} for a in apps), key=lambda a: a["name"])

        assert strip(body["apps"]) == strip(listing)  # same apps, specs and placements, read from the store
        urls = {n: a.url for n, a in agents.items()}
        wait_until("agents re-registered with the restarted control plane", lambda: agents_ready(cp2.url, urls))
        again = wait_until("apps ready again after the restart", lambda: apps_ready(cp2.url))
        assert strip(again) == strip(listing)
        for app in APPS:
            status, r = http("GET", f"{cp2.url}/v1/routes/{app}")
            assert status == 200 and endpoints(r) == before_routes[app] and r["pending"] == [], r
            assert serve(h, client, app, inputs[app], n=2)
    # the agents were not restarted, and the reconcile after the restart reloaded nothing
    assert {n: held(a) for n, a in agents.items()} == held_before


def test_agent_killed_client_fails_over_or_says_unavailable(harness: Harness) -> None:
    h = harness
    cp, agents, _ = bring_up(h, apply_with_cli=False)
    table = routes(cp.url, agents)
    inputs = {app: inputs_for(table[app]) for app in APPS}
    big_urls = {ep.url for ep, _ in table["big"].endpoints}
    assert big_urls == {a.url for a in agents.values()}, table["big"]  # the partitioned app is on both agents
    (small_ep,) = [ep.url for ep, _ in table["small"].endpoints]
    # kill the agent that serves the small app alone (and one piece of the big one)
    victim = next(a for a in agents.values() if a.url == small_ep)
    (survivor,) = [a for a in agents.values() if a is not victim]

    with Client(table, timeout_s=CLIENT_TIMEOUT_S, max_wait_s=STEP_S) as client:
        # both endpoints used (so the client holds keep-alive connections to the victim too)
        warm = serve(h, client, "big", inputs["big"], n=30)
        assert {r.endpoint for r in warm} == big_urls
        serve(h, client, "small", inputs["small"], n=2)

        victim.kill9()

        # the partitioned app: every request succeeds; the one routed to the dead agent fails over
        results: list[InferResult] = []
        for i in range(200):  # the victim's share may be small: go on until the router has picked it
            r = h.call(f"request {i} of app big after the kill",
                       lambda: client.infer("big", inputs["big"]), CALL_BOUND_S)
            results.append(r)
            if victim.url in r.failures:
                break
        failed_over = [r for r in results if r.failures]
        assert failed_over, f"no request was routed to the dead agent in {len(results)} requests"
        for r in results:
            assert r.endpoint == survivor.url, r
        r = failed_over[0]
        assert set(r.failures) == {victim.url} and r.attempts == 2, r
        assert r.failures[victim.url], r  # an explicit reason (e.g. "connection refused")

        # the app only the dead agent served: Unavailable naming the endpoint, within the bound
        with pytest.raises(Unavailable) as e:
            h.call("request of app small after the kill", lambda: client.infer("small", inputs["small"]),
                   CALL_BOUND_S)
        assert e.value.app == "small" and victim.url in e.value.failures and victim.url in str(e.value)
        # at once again: the endpoint is in its cooldown, and still named (with why it was skipped)
        with pytest.raises(Unavailable) as e:
            h.call("second request of app small", lambda: client.infer("small", inputs["small"]), CALL_BOUND_S)
        assert victim.url in e.value.failures and "cooldown" in e.value.failures[victim.url], e.value

        # the survivor still serves the big app
        assert all(r.endpoint == survivor.url for r in serve(h, client, "big", inputs["big"], n=5))

    # the control plane notices: the dead agent stops being ready (3 missed heartbeats)
    (victim_node,) = [n for n, c in agents.items() if c is victim]

    def victim_not_ready() -> bool:
        body = http("GET", f"{cp.url}/v1/agents")[1]
        return any(a["node"] == victim_node and not a["ready"] for a in body["agents"])

    wait_until("the control plane marks the dead agent not ready", victim_not_ready)
    assert survivor.proc.poll() is None and cp.proc.poll() is None, h.tails()
    # ... and takes it out of the routes: the apps it served are pending, with why
    small = http("GET", f"{cp.url}/v1/routes/small")[1]
    assert small["endpoints"] == [] and "missed its heartbeats" in small["pending"][0]["error"], small
    big = http("GET", f"{cp.url}/v1/routes/big")[1]
    assert [e["url"] for e in big["endpoints"]] == [survivor.url], big
    status = {a["name"]: a["status"] for a in http("GET", f"{cp.url}/v1/apps")[1]["apps"]}
    assert status["small"] == "pending" and status["big"] == "pending", status


def test_apply_with_controlplane_down_is_exit_2_and_one_line(harness: Harness) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    done = harness.call("edgemux apply against a dead server",
                        lambda: harness.cli("apply", "-f", str(harness.apps_file), "--server", url), 4 * STEP_S)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("edgemux: error: cannot reach the control plane")
    assert url in done.stderr and "Traceback" not in done.stderr
