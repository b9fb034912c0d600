"""``edgemux up --engine ray`` on a local three-node Ray cluster (issue 14), and what losing a node does.

A real Ray cluster on this machine (``ray.cluster_utils.Cluster``: a head and three worker nodes, each a
raylet of its own, declaring ``edgemux-node-edge-N``), and ``edgemux up --engine ray --address`` as a child
process. The test reads where each process runs from ``up``'s summary, applies two apps, serves them
through the gateway, then removes the Ray node of one app's agent (its raylet and workers are killed, and
with them the agent, as a machine losing power would) and checks:

* ``up`` reports the agent lost and keeps running; the control plane marks the node's agent not ready;
* no admitted app is lost from the store (``GET /v1/apps`` lists both);
* a request to the lost agent fails explicitly, within the client's timeout (it never hangs); the app
  served by the surviving nodes only is still served through the gateway;
* Ctrl-C stops the rest with exit status 0.

Re-placing the lost node's apps on the survivors is not built yet (issue 14 stays open). Every wait is
bounded; nothing compares a latency with a wall-clock threshold.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ray = pytest.importorskip("ray")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))  # upchild: shared with the bench
from ray.cluster_utils import Cluster  # noqa: E402

from edgemux.engines.ray import node_resource  # noqa: E402
from edgemux.runtime.dataplane.protocol import DATATYPES, encode_infer_request  # noqa: E402
from upchild import CLIENT_TIMEOUT_S, Up, app_yaml, cluster_yaml, http, until  # noqa: E402

pytestmark = pytest.mark.slow

NODES = ("edge-1", "edge-2", "edge-3")


CLUSTER_YAML = cluster_yaml(NODES)
# Two apps that cannot share a TPU: an SSD-MobileNetV2 frame takes 19-23 ms on an Edge TPU (ibis-edgetpu), so
# 30 req/s needs 0.57-0.69 of one and two such streams exceed the 0.9 utilization cap: two different nodes.
APPS_YAML = app_yaml("cam-a", "ssd_mobilenet_v2", 30) + "---\n" + app_yaml("cam-b", "ssd_mobilenet_v2", 30)
START_S = 240.0   # bound on up's start-up (three raylets' workers import edgemux and onnxruntime)
# the control plane's adapt setting: an agent silent this long is dead (s): three of up's 2 s heartbeats, so
# that a heartbeat late on a busy host is not a death
DEAD_AFTER_S = 6.0
# the stated bound from losing a node to its app served again: dead_after_s, then a 1 s window, the move
# (load on the new node, switch the routes) and the gateway's next route: seconds; 30 s on a busy host
REPLACED_S = 30.0
STEP_S = 30.0     # bound on every other wait


TOKEN: dict[str, str] = {}  # the Authorization header of the cluster's admin token, read from up's output


def _json(method: str, url: str, body: bytes | None = None) -> Any:
    status, raw = http(method, url, body, {**TOKEN, **({"Content-Type": "application/yaml"} if body else {})})
    assert status < 300, (status, raw[:300])
    return json.loads(raw)


def _until(what: str, probe: Callable[[], Any], timeout_s: float = STEP_S) -> Any:
    return until(what, probe, timeout_s, every_s=0.2)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[tuple[Cluster, dict[str, Any]]]:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        nodes = {n: cluster.add_node(num_cpus=1, resources={node_resource(n): 1}) for n in NODES}
        cluster.wait_for_nodes()
        yield cluster, nodes
    finally:
        cluster.shutdown()


class Load:
    """Requests for one app through the gateway from a thread, back to back, until stopped: each one's
    outcome (HTTP status, or the exception's name when none came within the client's timeout)."""

    def __init__(self, send: Callable[[], int]) -> None:
        self.outcomes: list[tuple[float, int | str]] = []  # (monotonic time it ended, status or exception)
        self._send = send
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                got: int | str = self._send()
            except (urllib.error.URLError, OSError) as e:  # a timeout is an OSError: a hang, if it came
                got = type(getattr(e, "reason", e)).__name__
            self.outcomes.append((time.monotonic(), got))
            time.sleep(0.05)

    def stop(self) -> list[tuple[float, int | str]]:
        self._stop.set()
        self._thread.join(CLIENT_TIMEOUT_S * 2)
        return self.outcomes


def test_up_on_ray_places_agents_on_their_nodes_and_survives_losing_one(
        ray_cluster: tuple[Cluster, dict[str, Any]], tmp_path: Path) -> None:
    cluster, nodes = ray_cluster
    (tmp_path / "cluster.yaml").write_text(CLUSTER_YAML)
    up = Up(["--engine", "ray", "--address", cluster.address, "--cluster", str(tmp_path / "cluster.yaml"),
             "--no-auto-profile",
             "--adapt-option", f"dead_after_s={DEAD_AFTER_S:g}", "--adapt-option", "window_s=1"])
    load: Load | None = None
    try:
        up.wait_for("Ctrl-C stops everything.", START_S)
        cp, gw = up.field("controlplane"), up.field("gateway")
        # authentication is on: the processes Ray started on other nodes got the token too (they registered)
        token_file = Path(up.field("admin token:", 2))
        assert token_file.stat().st_mode & 0o777 == 0o600
        TOKEN["Authorization"] = "Bearer " + token_file.read_text().strip()
        assert http("GET", f"{cp}/v1/agents")[0] == 401
        # every agent runs on the Ray node of its edge node, and says so
        agent_url = {}
        for n in NODES:
            line = up.line(f"agent {n} ")
            assert f"on ray node {nodes[n].node_id[:8]}" in line, line
            agent_url[n] = up.field(f"agent {n} ", 2)
        # and every agent's registration says so (GET /v1/agents: runs_on)
        runs_on = {a["node"]: a["runs_on"] for a in _json("GET", f"{up.field('controlplane')}/v1/agents")["agents"]}
        assert all(runs_on[n].startswith(f"ray node {nodes[n].node_id} at ") for n in NODES), runs_on
        head = cluster.head_node.node_id[:8]
        cp_line = up.line("controlplane")
        assert f"on ray node {head}" in cp_line, up.lines

        keys = {r["app"]: r["key"] for r in _json("POST", f"{cp}/v1/apps", APPS_YAML.encode())["results"]}
        apps = _until("both apps ready", lambda: (lambda a: a if len(a) == 2 and all(
            x["status"] == "ready" for x in a) else None)(_json("GET", f"{cp}/v1/apps")["apps"]))

        def endpoints(app: str) -> set[str]:
            return {e["url"] for e in _json("GET", f"{cp}/v1/routes/{app}")["endpoints"]}

        where = {a["name"]: endpoints(a["name"]) for a in apps}
        node_of = {url: n for n, url in agent_url.items()}
        assert all(len(urls) == 1 for urls in where.values()) and where["cam-a"] != where["cam-b"], where
        lost_node = node_of[next(iter(where["cam-b"]))]
        specs = {app: json.loads(http("GET", f"{next(iter(urls))}/v2/models/{app}", None, TOKEN)[1])["inputs"][0]
                 for app, urls in where.items()}

        def infer(app: str) -> int:
            """One request for ``app`` through the gateway; its HTTP status."""
            spec = specs[app]
            x = np.zeros([1 if d == -1 else d for d in spec["shape"]], DATATYPES[spec["datatype"]])
            body, headers = encode_infer_request({spec["name"]: x})
            return http("POST", f"{gw}/v2/models/{app}/infer", body,
                        {**headers, "Authorization": f"Bearer {keys[app]}"})[0]

        for app in ("cam-a", "cam-b"):
            assert [infer(app) for _ in range(3)] == [200] * 3

        # lose the Ray node of cam-b's agent (its raylet and workers die, and the agent with them) while
        # requests for cam-b keep coming
        load = Load(lambda: infer("cam-b"))
        time.sleep(0.5)
        cluster.remove_node(nodes[lost_node], allow_graceful=False)
        up.wait_for(f"edgemux up: agent {lost_node} lost", STEP_S)
        assert up.proc.poll() is None, "\n".join(up.lines[-30:])
        # the lost agent refuses at once or times out: an explicit failure, never a hang
        with pytest.raises(OSError):
            urllib.request.urlopen(f"{agent_url[lost_node]}/v2/health/live", timeout=CLIENT_TIMEOUT_S)
        # cam-b is re-placed on the node without an app and served again, within the stated bound
        # (the node without an app: two such streams do not fit on one TPU)
        _until("cam-b re-placed on a live node", lambda: endpoints("cam-b") and endpoints("cam-b") <= {
            agent_url[n] for n in NODES if n != lost_node}, REPLACED_S)
        # served again by the new placement: a 200 for a request sent after the route changed (on a busy host
        # the dying agent may still answer a request sent just after the kill)
        t_replaced = time.monotonic()
        _until("cam-b served again", lambda: any(t > t_replaced and o == 200 for t, o in load.outcomes),
               REPLACED_S)
        outcomes = load.stop()
        load = None
        # every request in the window ended with an answer: 200, or an explicit error status (no hang)
        assert all(isinstance(o, int) and (o == 200 or o >= 500) for _, o in outcomes), sorted(set(o for _, o in outcomes if o != 200), key=str)
        assert [infer("cam-a") for _ in range(3)] == [200] * 3 and [infer("cam-b") for _ in range(3)] == [200] * 3
        # no admitted app lost from the store
        assert sorted(a["name"] for a in _json("GET", f"{cp}/v1/apps")["apps"]) == ["cam-a", "cam-b"]
        events = _json("GET", f"{cp}/v1/events")["events"]
        assert any(e["kind"] == "move-planned" and e["app"] == "cam-b" and e["message"].startswith("agent-dead")
                   for e in events), events

        # the node comes back (a new Ray node offering its resource): up starts its agent there again, on its
        # old port, and the control plane uses it again
        cluster.add_node(num_cpus=1, resources={node_resource(lost_node): 1})
        up.wait_for(f"edgemux up: agent {lost_node} restarted at {agent_url[lost_node]}", STEP_S * 2)
        _until(f"agent {lost_node} ready again", lambda: any(
            a["node"] == lost_node and a["ready"] for a in _json("GET", f"{cp}/v1/agents")["agents"]))

        # the control plane killed: up starts it again on its port and store, with both apps
        cp_pid = int(cp_line.split("(pid ")[1].split()[0])
        os.kill(cp_pid, signal.SIGKILL)
        up.wait_for(f"edgemux up: controlplane restarted at {cp}", STEP_S * 2)
        assert _until("the apps from the store", lambda: sorted(
            a["name"] for a in _json("GET", f"{cp}/v1/apps")["apps"]) == ["cam-a", "cam-b"])
        _until("every agent ready with the new control plane", lambda: sum(
            a["ready"] for a in _json("GET", f"{cp}/v1/agents")["agents"]) == len(NODES))
        assert [infer("cam-a") for _ in range(3)] == [200] * 3 and [infer("cam-b") for _ in range(3)] == [200] * 3
    finally:
        if load is not None:
            load.stop()
        code = up.stop()
    assert code == 0, "\n".join(up.lines[-40:])


def test_an_edge_node_no_ray_node_stands_for_is_one_line_and_exit_2(
        ray_cluster: tuple[Cluster, dict[str, Any]], tmp_path: Path) -> None:
    cluster, _ = ray_cluster
    (tmp_path / "cluster.yaml").write_text(cluster_yaml(("edge-9",)))
    done = subprocess.run([sys.executable, "-m", "edgemux", "up", "--engine", "ray", "--address", cluster.address,
                           "--cluster", str(tmp_path / "cluster.yaml"), "--no-auto-profile"],
                          capture_output=True, text=True, timeout=STEP_S * 4, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("edgemux: error")]
    assert len(errors) == 1 and "edge node 'edge-9'" in errors[0] and node_resource("edge-9") in errors[0], done.stderr


_WITHOUT_RAY = """
import importlib.abc, sys
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "ray":
            raise ImportError("No module named 'ray'")
sys.meta_path.insert(0, Blocker())
from edgemux.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _up(*args: str, without_ray: bool = False) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", _WITHOUT_RAY] if without_ray else [sys.executable, "-m", "edgemux"]
    return subprocess.run([*cmd, "up", *args], capture_output=True, text=True, timeout=STEP_S * 2, check=False)


@pytest.mark.parametrize("args, without_ray, message", [
    (("--address", "auto"), False, "--address: only with --engine ray"),
    (("--engine", "ray"), True, "the ray engine needs Ray: pip install 'edgemux[ray]'"),
    (("--engine", "ray", "--address", "127.0.0.1:1"), False, "cannot reach the Ray cluster at 127.0.0.1:1"),
    (("--engine", "ray", "--address", "head-node"), False, "expected auto or HOST:PORT"),
    (("--engine", "ray", "--address", "ray://head:10001"), False, "Ray Client addresses are not supported"),
    (("--engine", "ray", "--cluster", "no/such.yaml"), False, "cannot read no/such.yaml"),
])
def test_bad_input_is_one_line_and_exit_2_before_anything_starts(args: tuple[str, ...], without_ray: bool,
                                                                 message: str) -> None:
    done = _up(*args, without_ray=without_ray)
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert done.stdout == ""
