"""The Ray engine (``edgemux up --engine ray``): bring-up, losing a node under load, and its serving cost.

Everything runs on this machine: a Ray cluster of a head and N worker nodes (``ray.cluster_utils.Cluster``,
each a raylet of its own declaring ``edgemux-node-edge-K``), and ``edgemux up`` as a child process, as a user
runs it, with ``--no-auth`` for both engines (what is measured is the engines; authentication's own test on Ray
is ``tests/test_engine_ray.py``). In one run it prints:

1. **bring-up**: seconds from starting ``edgemux up --engine ray --address ...`` to its "Ctrl-C stops
   everything" line (control plane, gateway and N agents started by Ray actors on their nodes, every agent
   registered and ready), for N = 3, 6, 9 edge nodes of one emulated Edge TPU each; beside it the local
   engine on the same cluster file. (The Ray cluster itself is started before the clock starts: it is the
   user's, already running.)
2. **losing a node**: on the N = 3 cluster two apps (SSD-MobileNetV2 at 30 req/s each, so on two nodes),
   open-loop Poisson requests for one of them at ``--rate`` req/s through the gateway (seeded), then the Ray
   node of that app's agent removed: the time from the removal to the first request sent after it that is
   answered 200 after the first failure (the app re-placed on the third node), and every request sent from
   the removal to then counted as answered,
   failed with an error status, or without an answer within the client's timeout (a hang: must be 0).
   The control plane finds the agent dead after ``--dead-after-s`` of silence; that setting is printed too.
3. **serving overhead**: the same app (``squeezenet1_1@64`` on a REAL onnxruntime CPU device) through the
   gateway of a local-engine cluster and of a Ray-engine cluster, both up at once, sequential requests in
   interleaved blocks: p50 and p99 of each and their difference, the Ray engine's cost per request (the
   processes are the same; only who started them differs).

    .venv/bin/python benchmarks/bench_ray_engine.py [--sizes 3,6,9] [--rate 20] [--seed 0] [--requests 400]

Needs the ``ray`` extra. Units: s (bring-up, recovery), ms (latency), req/s (rate).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import tempfile
import threading
import time
import urllib.error
from pathlib import Path
from typing import Any

import numpy as np

from upchild import CLIENT_TIMEOUT_S, Up, app_yaml, cluster_yaml, get_json, http, until  # beside this script

START_S = 300.0


def ray_cluster(nodes: list[str], cpu_node: bool = False) -> tuple[Any, dict[str, Any]]:
    from ray.cluster_utils import Cluster

    from edgemux.engines.ray import node_resource

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    names = nodes + (["cpu-1"] if cpu_node else [])
    handles = {n: cluster.add_node(num_cpus=1, resources={node_resource(n): 1}) for n in names}
    cluster.wait_for_nodes()
    return cluster, handles


def request_for(app: str, spec_from: str) -> tuple[bytes, dict[str, str]]:
    """A binary request of zeros of ``app``'s declared input (read from ``spec_from``, an agent URL)."""
    from edgemux.runtime.dataplane.protocol import DATATYPES, encode_infer_request

    spec = get_json(f"{spec_from}/v2/models/{app}")["inputs"][0]
    x = np.zeros([1 if d == -1 else d for d in spec["shape"]], DATATYPES[spec["datatype"]])
    return encode_infer_request({spec["name"]: x})


# ---------------------------------------------------------------------------------------------- bring-up


def bring_up(sizes: list[int], workdir: Path) -> list[tuple[int, float, float]]:
    """(N, Ray engine s, local engine s) for each size."""
    out = []
    for n in sizes:
        nodes = [f"edge-{k}" for k in range(1, n + 1)]
        path = workdir / f"cluster-{n}.yaml"
        path.write_text(cluster_yaml(nodes))
        cluster, _ = ray_cluster(nodes)
        try:
            up = Up(["--engine", "ray", "--address", cluster.address, "--cluster", str(path), "--no-auto-profile",
                     "--no-auth"])
            try:
                t_ray = up.wait_for("Ctrl-C stops everything.", START_S)
            finally:
                up.stop()
        finally:
            cluster.shutdown()
        up = Up(["--cluster", str(path), "--no-auto-profile", "--no-auth"])
        try:
            t_local = up.wait_for("Ctrl-C stops everything.", START_S)
        finally:
            up.stop()
        print(f"  N={n}: ray engine {t_ray:.1f} s, local engine {t_local:.1f} s", flush=True)
        out.append((n, t_ray, t_local))
    return out


# ------------------------------------------------------------------------------------------ losing a node


def lose_a_node(rate: float, seed: int, dead_after_s: float, workdir: Path) -> dict[str, Any]:
    nodes = ["edge-1", "edge-2", "edge-3"]
    path = workdir / "cluster-lose.yaml"
    path.write_text(cluster_yaml(nodes))
    cluster, handles = ray_cluster(nodes)
    up = Up(["--engine", "ray", "--address", cluster.address, "--cluster", str(path), "--no-auto-profile", "--no-auth",
             "--adapt-option", f"dead_after_s={dead_after_s:g}", "--adapt-option", "window_s=1"])
    try:
        up.wait_for("Ctrl-C stops everything.", START_S)
        cp, gw = up.field("controlplane"), up.field("gateway")
        agent_url = {n: up.field(f"agent {n} ", 2) for n in nodes}
        status, body = http("POST", f"{cp}/v1/apps", (app_yaml("cam-a", "ssd_mobilenet_v2", 30) + "---\n"
                                                       + app_yaml("cam-b", "ssd_mobilenet_v2", 30)).encode(),
                            {"Content-Type": "application/yaml"})
        if status >= 300:
            raise RuntimeError(f"apply: HTTP {status}: {body[:200]!r}")
        until("both apps ready", lambda: (lambda a: a and len(a["apps"]) == 2 and all(
            x["status"] == "ready" for x in a["apps"]))(get_json(f"{cp}/v1/apps")), 60.0)
        where = {e["url"] for e in get_json(f"{cp}/v1/routes/cam-b")["endpoints"]}
        victim = next(n for n, u in agent_url.items() if u in where)
        body, headers = request_for("cam-b", next(iter(where)))

        # open loop: Poisson arrivals at ``rate``, each request on its own worker, whatever the others do
        rng = np.random.default_rng(seed)
        log: list[tuple[float, float, int | str]] = []  # (sent, ended, status or the exception's name)
        lock = threading.Lock()
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=64)

        def send() -> None:
            t = time.monotonic()
            try:
                got: int | str = http("POST", f"{gw}/v2/models/cam-b/infer", body, headers)[0]
            except (urllib.error.URLError, OSError) as e:
                got = type(getattr(e, "reason", e)).__name__
            with lock:
                log.append((t, time.monotonic(), got))

        stop = threading.Event()

        def arrivals() -> None:
            nxt = time.monotonic()
            while not stop.is_set():
                nxt += float(rng.exponential(1.0 / rate))
                time.sleep(max(0.0, nxt - time.monotonic()))
                pool.submit(send)

        gen = threading.Thread(target=arrivals, daemon=True)
        gen.start()
        time.sleep(3.0)
        t_kill = time.monotonic()
        cluster.remove_node(handles[victim], allow_graceful=False)
        try:
            # the agent dies a moment after its Ray node (the worker notices its raylet is gone): the outage
            # starts at the first request after the removal that is not answered 200
            first_fail = until("the first failure after the removal", lambda: min(
                (s for s, _, o in list(log) if s > t_kill and o != 200), default=None), 120.0)
            recovered = until("cam-b answered again", lambda: min(
                (s for s, _, o in list(log) if s > first_fail and o == 200), default=None), 120.0)
        finally:
            time.sleep(3.0)  # a tail after the recovery, then stop sending
            stop.set()
            gen.join(5)
            pool.shutdown(wait=True)
        window = [(s, e, o) for s, e, o in log if t_kill <= s < recovered]
        before = [o for s, _, o in log if s < t_kill]
        return {
            "victim": victim, "dead_after_s": dead_after_s, "rate": rate,
            "recovery_s": recovered - t_kill, "first_fail_s": first_fail - t_kill,
            "sent_before": len(before), "failed_before": sum(o != 200 for o in before),
            "window": len(window),
            "window_errors": sum(isinstance(o, int) and o != 200 for _, _, o in window),
            "window_no_answer": sum(not isinstance(o, int) for _, _, o in window),
            "window_statuses": sorted({str(o) for _, _, o in window}),
            "longest_s": max((e - s for s, e, _ in window), default=0.0),
            "sent_after": sum(s >= recovered for s, _, _ in log),
            "failed_after": sum(s >= recovered and o != 200 for s, _, o in log),
        }
    finally:
        up.stop()
        cluster.shutdown()


# ------------------------------------------------------------------------------------------ the overhead


def overhead(requests: int, workdir: Path) -> dict[str, np.ndarray]:
    """Sequential requests for app ``sq`` (squeezenet1_1@64, REAL cpu device) through each engine's gateway,
    both clusters up at once, interleaved in blocks of 20: latencies (ms) by engine."""
    path = workdir / "cluster-cpu.yaml"
    path.write_text(cluster_yaml([], cpu_node=True))
    cluster, _ = ray_cluster([], cpu_node=True)
    ups = {"local": Up(["--cluster", str(path), "--cpu-models", "squeezenet1_1@64", "--no-auth"]),
           "ray": Up(["--engine", "ray", "--address", cluster.address, "--cluster", str(path), "--no-auth",
                      "--cpu-models", "squeezenet1_1@64"])}
    try:
        reqs = {}
        for name, up in ups.items():
            up.wait_for("Ctrl-C stops everything.", START_S)
            cp, gw = up.field("controlplane"), up.field("gateway")
            status, body = http("POST", f"{cp}/v1/apps", app_yaml("sq", "squeezenet1_1", 50).encode(),
                                {"Content-Type": "application/yaml"})
            if status >= 300:
                raise RuntimeError(f"{name}: apply: HTTP {status}: {body[:200]!r}")
            until(f"{name}: sq ready", lambda cp=cp: (lambda a: a and a["apps"] and all(
                x["status"] == "ready" for x in a["apps"]))(get_json(f"{cp}/v1/apps")), 60.0)
            agent = next(iter(e["url"] for e in get_json(f"{cp}/v1/routes/sq")["endpoints"]))
            reqs[name] = (gw, *request_for("sq", agent))
        lat: dict[str, list[float]] = {k: [] for k in ups}
        block = 20
        for _ in range(max(1, requests // block)):
            for name, (gw, body, headers) in reqs.items():
                for _ in range(block):
                    t = time.perf_counter()
                    status, _ = http("POST", f"{gw}/v2/models/sq/infer", body, headers)
                    lat[name].append((time.perf_counter() - t) * 1000.0)
                    if status != 200:
                        raise RuntimeError(f"{name}: HTTP {status}")
                    time.sleep(0.02)  # 50 req/s at most: the app's contract (policing would refuse more)
        return {k: np.asarray(v) for k, v in lat.items()}
    finally:
        for up in ups.values():
            up.stop()
        cluster.shutdown()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="3,6,9", help="edge nodes per bring-up (default 3,6,9)")
    ap.add_argument("--rate", type=float, default=20.0, help="open-loop req/s while a node is lost (default 20)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the arrivals (default 0)")
    ap.add_argument("--dead-after-s", type=float, default=6.0,
                    help="the control plane's dead_after_s (s; default 6: three of up's 2 s heartbeats)")
    ap.add_argument("--requests", type=int, default=400, help="sequential requests per engine (default 400)")
    args = ap.parse_args(argv)
    try:
        sizes = [int(k) for k in args.sizes.split(",")]
    except ValueError:
        ap.exit(2, f"bench_ray_engine: --sizes must be comma-separated integers, got {args.sizes!r}\n")
    if any(k < 1 for k in sizes) or not args.rate > 0 or args.requests < 20 or not args.dead_after_s > 0:
        ap.exit(2, "bench_ray_engine: --sizes >= 1, --rate > 0, --requests >= 20 and --dead-after-s > 0\n")
    try:
        import ray
    except ImportError:
        ap.exit(2, "bench_ray_engine: needs Ray: pip install 'edgemux[ray]'\n")
    print(f"Ray engine: ray {ray.__version__}, local Ray clusters (cluster_utils) on this host "
          f"({os.cpu_count()} cores); every edge device an emulated Edge TPU (ibis-edgetpu)")
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        workdir = Path(tmp)
        print("1. bring-up, seconds to 'Ctrl-C stops everything.' (all agents registered and ready):", flush=True)
        bring_up(sizes, workdir)
        print(f"2. losing a node: N=3, cam-a and cam-b (ssd_mobilenet_v2, 30 req/s each), open-loop Poisson "
              f"{args.rate:g} req/s for cam-b through the gateway (seed {args.seed}), dead_after_s "
              f"{args.dead_after_s:g} s, adapt window 1 s", flush=True)
        r = lose_a_node(args.rate, args.seed, args.dead_after_s, workdir)
        print(f"  removed the Ray node of {r['victim']} (cam-b's agent): the first failure {r['first_fail_s']:.1f} s "
              f"later, served again {r['recovery_s']:.1f} s after the removal (the first 200 after that failure)")
        print(f"  window: {r['window']} requests sent, {r['window_errors']} answered with an error status "
              f"({', '.join(s for s in r['window_statuses'] if s != '200') or 'none'}), "
              f"{r['window_no_answer']} without an answer within {CLIENT_TIMEOUT_S:g} s; longest wait "
              f"{r['longest_s']:.2f} s")
        print(f"  before: {r['sent_before']} sent, {r['failed_before']} failed; after: {r['sent_after']} sent, "
              f"{r['failed_after']} failed")
        print(f"3. serving overhead: {args.requests} sequential requests per engine through its gateway, "
              "squeezenet1_1@64 on a REAL onnxruntime cpu device, both clusters up, interleaved blocks",
              flush=True)
        lat = overhead(args.requests, workdir)
        for name, v in lat.items():
            print(f"  {name:<6} engine: p50 {np.percentile(v, 50):.3f} ms, p99 {np.percentile(v, 99):.3f} ms")
        d50 = np.percentile(lat["ray"], 50) - np.percentile(lat["local"], 50)
        d99 = np.percentile(lat["ray"], 99) - np.percentile(lat["local"], 99)
        print(f"  the Ray engine's cost: p50 {d50:+.3f} ms, p99 {d99:+.3f} ms (ray - local)")
    return 0 if r["window_no_answer"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
