"""Partition: cut an agent host's link under load, restore it, and measure what fencing promises.

Real processes on namespaced hosts (tests/nethosts.py: one network namespace per host, each with its own
address, joined by a bridge; needs root): the control plane and the gateway on host 0, one agent on each of
hosts 1..3 (``python -m edgemux controlplane|gateway|agent --host <its address>``), a cluster of three nodes
with one EMULATED Edge TPU each (ibis-edgetpu profiles), the admin token on every process. One app per agent
host (``a1`` on ``n1``, ...: applied, then moved there). Then:

1. open-loop load on every app through the gateway, from the test's own namespace (``--rate`` req/s each, each
   request answered or counted: ``answered`` 200, ``failed`` an explicit error status, ``lost`` no answer
   within 10 s); and, inside host 1, a client of its own agent (``a1`` at ``--rate`` req/s, as a camera on
   the same pole that can still reach its box when the pole's uplink drops);
2. after ``--before-s``, host 1's link is cut (its bridge port disabled: its processes run on, every frame
   dropped); after ``--partition-s`` it is restored; the load goes on for ``--after-s`` more.

Measured (seconds from the cut, wall clock of this machine, which every namespace shares):

* ``fenced_after_s``: the first ``503 fenced: ...`` host 1's agent gave its local client (expected: the lease
  less the time since its last acknowledged heartbeat was sent, within a heartbeat of ``--lease-s``);
* ``lost_after_s``: the control plane's ``GET /v1/agents`` says n1 not ready (expected: within a heartbeat of
  lease + margin, ``controlplane.reconciler.lost_after_s``), and ``unrouted_after_s``: n1 left a1's route at
  the gateway (expected: at once after, the route republished);
* ``served_again_after_s``: the first 200 for a1 through the gateway from another node (its answer). The bound this
  script checks: lease + margin (lost) + one adaptation window (``window_s``, the cycle that evacuates) + one
  reconcile period (1 s) + ``MOVE_S`` for the move (load on the new agent, ready, switch) on a busy 2-core
  machine;
* after the restore, ``removed_after_restore_s``: a1 gone from host 1's agent (the reconcile's DELETE, or
  the evacuation move's own once its call gets through);
* requests ``answered``/``failed``/``lost`` per second and in all; ``double_serving_s``: how long two
  placements of a1 may both have accepted its requests: host 1's last 200 for a1 (the answer's time, from its
  local client or through the gateway: it accepted the request before) minus the earliest the new placement
  can have accepted its first (not before that request was sent, nor before the control plane declared n1
  lost: the last monitor sample still calling n1 ready); 0 when the one came before the other, and
  ``single_serving_gap_s`` the time between them;
* the contract: every app's 200s (through the gateway and from the local client together) in every
  window of ``CONTRACT_WINDOW_S`` are at most its bucket's refill (1.1 x rate) x window + depth;
* the store's ``check()`` after the run.

    sudo python benchmarks/partition.py [--heartbeat-s 0.5] [--lease-s 1.5] [--rate 8] [--json]

Exit status: 0 when every check holds, 1 when one does not (the report says which), 2 on bad input or where
namespaced hosts cannot be made (not root). tests/test_partition.py runs the same scenario.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the namespaced hosts live beside the tests that use them

from nethosts import Host, NetHosts, unavailable  # noqa: E402

NODES = ("n1", "n2", "n3")
CP_PORT, GW_PORT, AGENT_PORT = 8470, 8000, 8001  # each host has its own ports: fixed ones are free
TIMEOUT_S = 10.0           # the load client's bound per request: a request without an answer by then is lost
GATEWAY_TRY_S = 1.0        # the gateway's bound per attempt at an agent
RECONCILE_PERIOD_S = 1.0   # the control plane's controller loop (its default)
MOVE_S = 4.0               # an evacuation's move (load, ready, switch) on a busy 2-core machine, bounded
CONTRACT_WINDOW_S = 2.0    # the contract check's sliding window
START_S = 90.0             # every process up, the apps ready (model builds included)


def cluster_yaml() -> str:
    nodes = "\n".join(f"    - {{name: {n}, cpuCores: 2, memoryMb: 4096, devices: [{{name: tpu0, kind: edgetpu, "
                      f"memoryMb: 64, profiles: ibis-edgetpu}}]}}" for n in NODES)
    return f"apiVersion: edgemux/v1alpha1\nkind: Cluster\nmetadata: {{name: partition}}\nspec:\n  nodes:\n{nodes}\n"


def apps_yaml(rate: float) -> str:
    return "---\n".join(f"apiVersion: edgemux/v1alpha1\nkind: App\nmetadata: {{name: a{i}}}\n"
                        f"spec: {{model: mobilenet_v2, rate: {rate:g}, burst: {rate:g}, "
                        f"slo: {{latencyMs: 500, stat: p95}}}}\n" for i in range(1, len(NODES) + 1))


# A client of host 1's own agent, run inside host 1: one request every 1/rate s (sequential, each bounded),
# every answer a JSON line (send and answer times, status, the error's text or the device that served it).
LOCAL_CLIENT = textwrap.dedent("""
    import http.client, json, sys, time
    host, port, app, rate, token, body_file, out_file, stop_file = sys.argv[1:9]
    body = open(body_file, "rb").read()
    hlen = json.loads(open(body_file + ".json").read())["header_length"]
    headers = {"Authorization": "Bearer " + token, "Inference-Header-Content-Length": str(hlen),
               "Content-Type": "application/octet-stream"}
    period, k, t_start = 1.0 / float(rate), 0, time.time()
    import os
    with open(out_file, "w") as out:
        while not os.path.exists(stop_file):
            k += 1
            t0 = time.time()
            rec = {"t0": t0}
            try:
                c = http.client.HTTPConnection(host, int(port), timeout=2.0)
                c.request("POST", f"/v2/models/{app}/infer", body=body, headers=headers)
                r = c.getresponse()
                data = r.read()
                rec["status"] = r.status
                if r.status == 200:
                    n = int(r.getheader("Inference-Header-Content-Length") or len(data))
                    rec["device"] = json.loads(data[:n]).get("parameters", {}).get("edgemux_device")
                else:
                    rec["error"] = json.loads(data).get("error", "")
                c.close()
            except Exception as e:
                rec["status"], rec["error"] = None, type(e).__name__
            rec["t1"] = time.time()
            out.write(json.dumps(rec) + "\\n")
            out.flush()
            time.sleep(max(0.0, t_start + k * period - time.time()))
""")


@dataclass
class Cluster:
    """The processes of one run on its hosts."""

    hosts: NetHosts
    workdir: Path
    token: str
    cp: Host
    agents: dict[str, Host]
    procs: dict[str, subprocess.Popen[Any]]

    @property
    def cp_url(self) -> str:
        return f"http://{self.cp.ip}:{CP_PORT}"

    @property
    def gw_url(self) -> str:
        return f"http://{self.cp.ip}:{GW_PORT}"

    def agent_url(self, node: str) -> str:
        return f"http://{self.agents[node].ip}:{AGENT_PORT}"

    def http(self, method: str, url: str, body: Any = None, timeout_s: float = 5.0) -> tuple[int, Any]:
        """One call with the admin token: (status, JSON body or None); (0, error text) when nothing answered."""
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        req = urllib.request.Request(url, data=data, method=method,
                                     headers={"Authorization": f"Bearer {self.token}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                raw, status = r.read(), r.status
        except urllib.error.HTTPError as e:
            raw, status = e.read(), e.code
        except (OSError, ValueError) as e:
            return 0, f"{type(e).__name__}: {e}"
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    def tails(self, lines: int = 15) -> str:
        out = []
        for name in self.procs:
            log = self.workdir / f"{name}.log"
            if log.exists():
                text = log.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {name} ---\n" + "\n".join(text))
        return "\n".join(out)


def _wait(what: str, probe: Any, timeout_s: float, cluster: Cluster | None = None, every_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except Exception as e:  # a probe that raises counts as not yet
            last = e
        if last and not isinstance(last, Exception):
            return last
        time.sleep(every_s)
    tails = f"\n{cluster.tails()}" if cluster is not None else ""
    raise RuntimeError(f"partition: {what}: not within {timeout_s:g} s (last: {last!r}){tails}")


def start(hosts: NetHosts, workdir: Path, heartbeat_s: float, lease_s: float | None, window_s: float) -> Cluster:
    """The control plane and the gateway on host 0, an agent per node on hosts 1..3, each process's output in
    ``workdir``/NAME.log; returns once every agent is registered and ready."""
    from edgemux.runtime.auth import write_token_file

    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "cluster.yaml").write_text(cluster_yaml())
    token_file = workdir / "token"
    token = write_token_file(token_file)
    cp, agent_hosts = hosts.hosts[0], dict(zip(NODES, hosts.hosts[1:]))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "PYTHONUNBUFFERED": "1",
           "EDGEMUX_CACHE": str(workdir / "cache"), "EDGEMUX_HOME": str(workdir / "home")}
    common = ["--token-file", str(token_file), "--log-level", "info"]
    cluster = Cluster(hosts, workdir, token, cp, agent_hosts, {})

    def launch(name: str, host: Host, args: list[str]) -> None:
        log = open(workdir / f"{name}.log", "w")
        cluster.procs[name] = hosts.popen(host, [sys.executable, "-m", "edgemux", *args], stdout=log,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        log.close()

    launch("controlplane", cp, ["controlplane", "--cluster", str(workdir / "cluster.yaml"), "--store",
                                str(workdir / "store.db"), "--host", cp.ip, "--port", str(CP_PORT),
                                "--adapt-option", f"window_s={window_s:g}", "--adapt-option", "dead_after_s=0.1",
                                "--reconcile-period-s", f"{RECONCILE_PERIOD_S:g}", *common])
    launch("gateway", cp, ["gateway", "--host", cp.ip, "--port", str(GW_PORT), "--controlplane", cluster.cp_url,
                           "--timeout-s", f"{GATEWAY_TRY_S:g}", *common])
    lease = [] if lease_s is None else ["--lease-s", f"{lease_s:g}"]
    for node, host in agent_hosts.items():
        launch(f"agent-{node}", host, ["agent", "--cluster", str(workdir / "cluster.yaml"), "--node", node,
                                       "--host", host.ip, "--port", str(AGENT_PORT), "--controlplane",
                                       cluster.cp_url, "--heartbeat-s", f"{heartbeat_s:g}", *lease,
                                       "--cache-dir", str(workdir / "cache" / "zoo"), *common])

    def registered() -> bool:
        for name, p in cluster.procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with status {p.returncode}")
        status, doc = cluster.http("GET", f"{cluster.cp_url}/v1/agents")
        return status == 200 and sorted(a["node"] for a in doc["agents"] if a["ready"]) == list(NODES)

    try:
        _wait("every agent registered", registered, START_S, cluster)
    except RuntimeError as e:
        raise RuntimeError(f"{e}\n{cluster.tails()}") from None
    return cluster


def place(cluster: Cluster, rate: float) -> dict[str, str]:
    """Apply the apps and move each onto its node (``a1`` on ``n1``, ...); returns app -> node."""
    from edgemux.runtime.controlplane.apiclient import ControlPlaneClient
    from edgemux.runtime.controlplane.messages import MoveRequest, MoveTarget

    client = ControlPlaneClient(cluster.cp_url, timeout_s=120.0, token=cluster.token)
    applied = client.apply(apps_yaml(rate).encode())
    if applied.rejected:
        raise RuntimeError(f"partition: rejected: {applied.rejected[0].rejection}")
    want = {f"a{i}": n for i, n in enumerate(NODES, start=1)}
    pending = client.wait_ready(sorted(want), START_S)
    if pending:
        raise RuntimeError(f"partition: not ready: {pending}\n{cluster.tails()}")
    for app, node in want.items():
        placed = {s.device for a in client.apps() if a.name == app and a.placement for s in a.placement.shares}
        if placed != {f"{node}/tpu0"}:
            client.move(app, MoveRequest((MoveTarget(f"{node}/tpu0", 1.0),), None))

    def routed() -> bool:
        status, doc = cluster.http("GET", f"{cluster.gw_url}/v1/routes")
        if status != 200:
            return False
        got = {a: {e["url"] for e in r.get("endpoints", [])} for a, r in doc["routes"].items()}
        return all(got.get(a) == {cluster.agent_url(n)} for a, n in want.items())

    _wait("every app routed to its node at the gateway", routed, 60.0, cluster)
    return want


def request_body(cluster: Cluster, app: str) -> tuple[bytes, int]:
    """A binary Open Inference Protocol request for ``app`` (zeros of its declared inputs): (body, header
    length)."""
    import numpy as np

    from edgemux.runtime.dataplane.protocol import DATATYPES

    status, meta = cluster.http("GET", f"{cluster.gw_url}/v2/models/{app}")
    if status != 200:
        raise RuntimeError(f"partition: metadata of {app}: HTTP {status}: {meta}")
    inputs, blobs = [], []
    for i in meta["inputs"]:
        arr = np.zeros([1 if d < 0 else d for d in i["shape"]], DATATYPES[i["datatype"]])
        blob = arr.tobytes()
        inputs.append({"name": i["name"], "datatype": i["datatype"], "shape": list(arr.shape),
                       "parameters": {"binary_data_size": len(blob)}})
        blobs.append(blob)
    header = json.dumps({"inputs": inputs, "parameters": {"binary_data_output": True}}).encode()
    return header + b"".join(blobs), len(header)


async def _load(cluster: Cluster, bodies: dict[str, tuple[bytes, int]], rate: float, duration_s: float,
                t_start: float) -> list[dict[str, Any]]:
    """Open-loop periodic load on every app through the gateway: one record per request."""
    import aiohttp

    records: list[dict[str, Any]] = []
    headers = {"Authorization": f"Bearer {cluster.token}", "Content-Type": "application/octet-stream"}

    async def one(session: aiohttp.ClientSession, app: str) -> None:
        body, hlen = bodies[app]
        rec: dict[str, Any] = {"app": app, "t0": time.time()}
        try:
            async with session.post(f"{cluster.gw_url}/v2/models/{app}/infer", data=body,
                                    headers={**headers, "Inference-Header-Content-Length": str(hlen)},
                                    timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as r:
                data = await r.read()
                rec["status"] = r.status
                if r.status == 200:
                    n = int(r.headers.get("Inference-Header-Content-Length") or len(data))
                    rec["device"] = json.loads(data[:n]).get("parameters", {}).get("edgemux_device")
                else:
                    try:
                        rec["error"] = str(json.loads(data).get("error", ""))[:300]
                    except ValueError:
                        rec["error"] = data[:300].decode(errors="replace")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            rec["status"], rec["error"] = None, type(e).__name__
        rec["t1"] = time.time()
        records.append(rec)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256)) as session:
        tasks = []
        n = int(duration_s * rate)
        for k in range(n):
            for j, app in enumerate(sorted(bodies)):
                at = t_start + (k + j / len(bodies)) / rate
                await asyncio.sleep(max(0.0, at - time.time()))
                tasks.append(asyncio.create_task(one(session, app)))
        await asyncio.gather(*tasks)
    return records


def _monitor(cluster: Cluster, stop: threading.Event, out: list[dict[str, Any]]) -> None:
    """Every 0.1 s: whether the control plane says n1 is ready, and a1's endpoints at the gateway and in the
    control plane's route."""
    while not stop.is_set():
        t = time.time()
        status, doc = cluster.http("GET", f"{cluster.cp_url}/v1/agents", timeout_s=1.0)
        ready = None
        if status == 200:
            ready = any(a["node"] == "n1" and a["ready"] for a in doc["agents"])
        status, doc = cluster.http("GET", f"{cluster.gw_url}/v1/routes", timeout_s=1.0)
        endpoints = None
        if status == 200 and "a1" in doc["routes"]:
            endpoints = sorted(e["url"] for e in doc["routes"]["a1"].get("endpoints", []))
        status, doc = cluster.http("GET", f"{cluster.cp_url}/v1/routes/a1", timeout_s=1.0)
        cp_endpoints = sorted(e["url"] for e in doc.get("endpoints", [])) if status == 200 else None
        out.append({"t": t, "n1_ready": ready, "a1_endpoints": endpoints, "a1_cp_endpoints": cp_endpoints})
        stop.wait(0.1)


def run(hosts: NetHosts, workdir: Path, *, heartbeat_s: float = 0.5, lease_s: float | None = None,
        window_s: float = 1.0, rate: float = 8.0, before_s: float = 3.0, partition_s: float = 8.0,
        after_s: float = 4.0, how: str = "drop") -> dict[str, Any]:
    """The scenario of the module doc on ``hosts`` (at least 4), its files in ``workdir``; the figures and
    checks as JSON-ready data. Stops every process it started (``hosts.close`` removes the rest)."""
    if len(hosts.hosts) < 1 + len(NODES):
        raise ValueError(f"needs {1 + len(NODES)} hosts, got {len(hosts.hosts)}")
    lease = lease_s if lease_s is not None else 3.0 * heartbeat_s
    lost_after = lease * 1.01 + heartbeat_s  # controlplane.reconciler.lost_after_s
    bound = lost_after + window_s + RECONCILE_PERIOD_S + MOVE_S
    t_begin = time.time()
    cluster = start(hosts, workdir, heartbeat_s, lease_s, window_s)
    try:
        t_started = time.time()
        want = place(cluster, rate * 2)  # contracts at twice the offered load: policing never refuses it
        t_placed = time.time()
        bodies = {app: request_body(cluster, app) for app in want}
        body_file = workdir / "a1.body"
        body_file.write_bytes(bodies["a1"][0])
        Path(f"{body_file}.json").write_text(json.dumps({"header_length": bodies["a1"][1]}))
        stop_file, local_out = workdir / "local-client.stop", workdir / "local-client.jsonl"
        local = hosts.popen(cluster.agents["n1"], [
            sys.executable, "-c", LOCAL_CLIENT, cluster.agents["n1"].ip, str(AGENT_PORT), "a1", f"{rate:g}",
            cluster.token, str(body_file), str(local_out), str(stop_file)], stdout=subprocess.DEVNULL,
            stderr=open(workdir / "local-client.log", "w"))
        watch: list[dict[str, Any]] = []
        stop = threading.Event()
        monitor = threading.Thread(target=_monitor, args=(cluster, stop, watch), daemon=True)
        monitor.start()
        duration = before_s + partition_s + after_s
        t_load = time.time() + 0.5
        cut_at: list[float] = []

        def chaos() -> None:
            time.sleep(max(0.0, t_load + before_s - time.time()))
            hosts.cut(cluster.agents["n1"], how)
            cut_at.append(time.time())
            time.sleep(max(0.0, cut_at[0] + partition_s - time.time()))
            hosts.restore(cluster.agents["n1"])
            cut_at.append(time.time())

        cutter = threading.Thread(target=chaos, daemon=True)
        cutter.start()
        records = asyncio.run(_load(cluster, bodies, rate, duration, t_load))
        (workdir / "load.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        cutter.join(30)
        t_cut, t_restore = cut_at
        # after the restore: a1 leaves host 1's agent (the reconcile's or the move's DELETE), bounded
        n1_url = cluster.agent_url("n1")

        def removed() -> bool:
            status, doc = cluster.http("GET", f"{n1_url}/v1/apps", timeout_s=2.0)
            return status == 200 and "a1" not in {a["app"] for a in doc["apps"]}

        t_removed = None
        try:
            _wait("a1 removed from host 1's agent", removed, 45.0, cluster, every_s=0.1)
            t_removed = time.time()
        except RuntimeError:
            pass
        stop_file.write_text("stop")
        hosts.stop(local)
        stop.set()
        monitor.join(10)
        status, metrics = cluster.http("GET", f"{n1_url}/metrics")
        status, apps = cluster.http("GET", f"{cluster.cp_url}/v1/apps")
        final_placement = {a["name"]: [s["device"] for s in a["shares"]] for a in apps["apps"]}
        local_records = [json.loads(line) for line in local_out.read_text().splitlines() if line.strip()]
    finally:  # agents first (they deregister), the control plane last
        for name, proc in reversed(list(cluster.procs.items())):
            if proc.poll() is None:
                hosts.stop(proc, 15.0)
    problems = _store_check(workdir / "store.db")
    return _report(records, local_records, watch, metrics if isinstance(metrics, str) else "", final_placement,
                   problems, t_begin=t_begin, t_started=t_started, t_placed=t_placed, t_cut=t_cut,
                   t_restore=t_restore, t_removed=t_removed, heartbeat_s=heartbeat_s, lease_s=lease,
                   lost_after_s=lost_after, bound_s=bound, window_s=window_s, rate=rate, duration_s=duration,
                   want=want)


def _store_check(path: Path) -> list[str]:
    from edgemux.cluster.store import Store

    with Store.open(str(path)) as store:
        return [str(p) for p in store.check()]


def _first(ts: list[float]) -> float | None:
    return min(ts) if ts else None


def _report(records: list[dict[str, Any]], local: list[dict[str, Any]], watch: list[dict[str, Any]], metrics: str,
            final_placement: dict[str, list[str]], problems: list[str], *, t_begin: float, t_started: float,
            t_placed: float, t_cut: float, t_restore: float, t_removed: float | None, heartbeat_s: float,
            lease_s: float, lost_after_s: float, bound_s: float, window_s: float, rate: float, duration_s: float,
            want: dict[str, str]) -> dict[str, Any]:
    def rel(t: float | None) -> float | None:
        return None if t is None else round(t - t_cut, 3)

    old = "n1/tpu0"
    fenced = [r["t1"] for r in local if r.get("status") == 503 and str(r.get("error", "")).startswith("fenced:")
              and r["t0"] >= t_cut]
    # host 1's agent no longer holds a1 (deleted by the reconcile after the restore): its local client's 404s
    gone = [r["t1"] for r in local if r.get("status") == 404 and r["t0"] >= t_restore]
    lost = [w["t"] for w in watch if w["t"] >= t_cut and w["n1_ready"] is False]
    n1_url = next((u for w in watch for u in (w["a1_endpoints"] or []) if w["t"] < t_cut), None)
    unrouted = [w["t"] for w in watch if w["t"] >= t_cut and w["a1_endpoints"] is not None
                and n1_url not in w["a1_endpoints"]]
    cp_unrouted = [w["t"] for w in watch if w["t"] >= t_cut and w["a1_cp_endpoints"] is not None
                   and n1_url not in w["a1_cp_endpoints"]]
    a1_ok = [r for r in records if r["app"] == "a1" and r.get("status") == 200]
    elsewhere = [r for r in a1_ok if r.get("device") != old and r["t1"] >= t_cut]
    # every 200 host 1 gave for a1, to its local client or through the gateway: its placement accepted each
    # before the answer came back (t1), so its last acceptance is at the latest the last such t1
    old_ok = [r["t1"] for r in local if r.get("status") == 200] + [r["t1"] for r in a1_ok if r.get("device") == old]
    last_old = max(old_ok) if old_ok else None
    # the new placement accepted its first a1 request no earlier than that request was sent, nor than the
    # control plane declared n1 lost (the evacuation starts then): its last sample still calling n1 ready
    first_lost = _first(lost)
    still_ready = [w["t"] for w in watch if t_cut <= w["t"] < (first_lost or math.inf) and w["n1_ready"] is True]
    new_from = max([min(r["t0"] for r in elsewhere)] + still_ready[-1:]) if elsewhere else None
    gap = None if last_old is None or new_from is None else new_from - last_old
    double = max(0.0, -gap) if gap is not None else 0.0
    first_elsewhere = _first([r["t1"] for r in elsewhere])
    old_after_cut = [t for t in old_ok if t > t_cut + lease_s + 0.05]  # a 200 from host 1 after its lease ran out
    # per second, from the cut's second back to the start of the load
    t0_load = min(r["t0"] for r in records)
    per_s: dict[int, Counter[str]] = defaultdict(Counter)
    for r in records:
        s = int(math.floor(r["t0"] - t0_load))
        kind = "answered" if r.get("status") == 200 else ("lost" if r.get("status") is None else "failed")
        per_s[s][kind] += 1
    totals: Counter[str] = Counter()
    for c in per_s.values():
        totals.update(c)
    kinds = Counter(str(r.get("status")) for r in records)
    local_kinds = Counter((str(r.get("status")) + (" fenced" if str(r.get("error", "")).startswith("fenced:") else ""))
                          for r in local)
    # the contract: 200s per app (gateway and local client together) in every window
    refill, depth = 1.1 * 2 * rate, max(4.0 * 1.1 * 2 * rate, 40.0, 2 * rate)
    worst: dict[str, float] = {}
    for app in want:
        ts = sorted([r["t1"] for r in records if r["app"] == app and r.get("status") == 200]
                    + ([r["t1"] for r in local if r.get("status") == 200] if app == "a1" else []))
        j, most = 0, 0
        for i, t in enumerate(ts):
            while ts[j] < t - CONTRACT_WINDOW_S:
                j += 1
            most = max(most, i - j + 1)
        worst[app] = most
    contract_limit = refill * CONTRACT_WINDOW_S + depth
    fenced_count = 0.0
    for line in metrics.splitlines():
        if line.startswith('edgemux_fenced_requests_total{app="a1"}'):
            fenced_count = float(line.rsplit(" ", 1)[1])
    served_again = rel(first_elsewhere)
    figures: dict[str, Any] = {
        "heartbeat_s": heartbeat_s, "lease_s": lease_s, "lost_after_s_rule": round(lost_after_s, 3),
        "window_s": window_s, "served_again_bound_s": round(bound_s, 3),
        "start_s": round(t_started - t_begin, 1), "place_s": round(t_placed - t_started, 1),
        "fenced_after_s": rel(_first(fenced)), "lost_after_s": rel(_first(lost)),
        "cp_unrouted_after_s": rel(_first(cp_unrouted)), "unrouted_after_s": rel(_first(unrouted)),
        "served_again_after_s": served_again,
        "partition_s": round(t_restore - t_cut, 3),
        "removed_after_restore_s": None if not gone else round(min(gone) - t_restore, 3),
        "double_serving_s": round(double, 3), "single_serving_gap_s": None if gap is None else round(gap, 3),
        "host1_200s_after_its_lease": len(old_after_cut),
        "requests": {"sent": len(records), **{k: totals.get(k, 0) for k in ("answered", "failed", "lost")},
                     "by_status": dict(sorted(kinds.items()))},
        "per_second": [{"s": s, **{k: per_s[s].get(k, 0) for k in ("answered", "failed", "lost")}}
                       for s in sorted(per_s)],
        "cut_at_s": int(math.floor(t_cut - t0_load)), "restored_at_s": int(math.floor(t_restore - t0_load)),
        "local_client": dict(sorted(local_kinds.items())), "host1_fenced_counter_a1": fenced_count,
        "contract_worst_window": worst, "contract_limit_per_window": round(contract_limit, 1),
        "final_placement": final_placement, "store_problems": problems,
    }
    checks = {
        "no request lost (every one answered or failed explicitly)": totals.get("lost", 0) == 0,
        "host 1 fenced after its lease (within a heartbeat, and the local client's period)":
        figures["fenced_after_s"] is not None
        and lease_s - heartbeat_s <= figures["fenced_after_s"] <= lease_s + 2.0 / rate + 0.1,
        "lost only after lease + margin - one heartbeat": figures["lost_after_s"] is not None
        and figures["lost_after_s"] >= lease_s * 1.01,
        "host 1 left a1's route when lost": figures["cp_unrouted_after_s"] is not None
        and figures["lost_after_s"] is not None
        and figures["cp_unrouted_after_s"] <= figures["lost_after_s"] + RECONCILE_PERIOD_S
        and figures["unrouted_after_s"] is not None,
        "a1 served elsewhere within the bound": served_again is not None and served_again <= bound_s,
        "double serving 0 s": double == 0.0 and not old_after_cut,
        "a1 removed from host 1 after the restore": t_removed is not None and bool(gone),
        "a1 placed elsewhere, the others where they were": final_placement.get("a1") not in (None, [old])
        and all(final_placement.get(a) == [f"{n}/tpu0"] for a, n in want.items() if a != "a1"),
        "every app's 200s within its contract": all(v <= contract_limit for v in worst.values()),
        "the store's check clean": problems == [],
    }
    return {"figures": figures, "checks": checks, "holds": all(checks.values())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heartbeat-s", type=float, default=0.5)
    ap.add_argument("--lease-s", type=float, default=None, help="the agents' lease (default 3 x heartbeat)")
    ap.add_argument("--window-s", type=float, default=1.0, help="the adaptation window (s)")
    ap.add_argument("--rate", type=float, default=8.0, help="req/s per app through the gateway, and host 1's "
                                                            "local client's (default 8)")
    ap.add_argument("--before-s", type=float, default=3.0)
    ap.add_argument("--partition-s", type=float, default=8.0)
    ap.add_argument("--after-s", type=float, default=4.0)
    ap.add_argument("--how", choices=("drop", "down"), default="drop", help="how the link is cut (tests/nethosts.py)")
    ap.add_argument("--workdir", help="keep the logs and the store here (default: a temporary folder)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = ap.parse_args(argv)
    for name, v, lo, hi in (("--heartbeat-s", args.heartbeat_s, 0.1, 10.0), ("--window-s", args.window_s, 0.1, 60.0),
                            ("--rate", args.rate, 0.5, 100.0), ("--before-s", args.before_s, 1.0, 600.0),
                            ("--partition-s", args.partition_s, 1.0, 600.0), ("--after-s", args.after_s, 0.0, 600.0)):
        if not lo <= v <= hi:
            print(f"partition: {name} must be in [{lo:g}, {hi:g}], got {v:g}", file=sys.stderr)
            return 2
    why = unavailable()
    if why is not None:
        print(f"partition: cannot make namespaced hosts: {why}", file=sys.stderr)
        return 2
    import tempfile

    with tempfile.TemporaryDirectory(prefix="edgemux-partition-") as tmp, NetHosts(1 + len(NODES)) as hosts:
        workdir = Path(args.workdir) if args.workdir else Path(tmp)
        r = run(hosts, workdir, heartbeat_s=args.heartbeat_s, lease_s=args.lease_s, window_s=args.window_s,
                rate=args.rate, before_s=args.before_s, partition_s=args.partition_s, after_s=args.after_s,
                how=args.how)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0 if r["holds"] else 1
    f = r["figures"]
    print(f"heartbeat {f['heartbeat_s']:g} s, lease {f['lease_s']:g} s: lost after {f['lost_after_s_rule']:g} s "
          f"(lease + 1 % + one heartbeat), window {f['window_s']:g} s; up in {f['start_s']} s, placed in "
          f"{f['place_s']} s")
    print(f"link of host 1 cut for {f['partition_s']} s; from the cut: host 1 fenced at {f['fenced_after_s']} s, "
          f"lost at {f['lost_after_s']} s, out of a1's route at {f['cp_unrouted_after_s']} s (at the gateway, "
          f"which keeps a dead endpoint until the app is re-placed: {f['unrouted_after_s']} s), a1 served elsewhere at "
          f"{f['served_again_after_s']} s (bound {f['served_again_bound_s']} s); a1 removed from host 1 "
          f"{f['removed_after_restore_s']} s after the restore")
    q = f["requests"]
    print(f"requests through the gateway: sent {q['sent']}, answered {q['answered']}, failed {q['failed']} "
          f"{q['by_status']}, lost {q['lost']}; host 1's local client: {f['local_client']} "
          f"(its agent counted {f['host1_fenced_counter_a1']:g} fenced)")
    print("per second (answered/failed/lost; cut at s=%d, restored at s=%d): %s" % (
        f["cut_at_s"], f["restored_at_s"],
        " ".join(f"{p['s']}:{p['answered']}/{p['failed']}/{p['lost']}" for p in f["per_second"])))
    print(f"double serving: {f['double_serving_s']} s (host 1's last 200 for a1 {f['single_serving_gap_s']} s "
          f"before the new placement could have accepted its first); worst {CONTRACT_WINDOW_S:g} s window of 200s per app "
          f"{f['contract_worst_window']} (limit {f['contract_limit_per_window']}); store problems "
          f"{f['store_problems']}")
    for name, ok in r["checks"].items():
        print(f"  {name}: {'holds' if ok else 'DOES NOT HOLD'}")
    print(f"holds: {r['holds']}")
    return 0 if r["holds"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
