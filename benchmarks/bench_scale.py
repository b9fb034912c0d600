"""The control plane at scale: one control plane against 10, 100 and 1,000 nodes of 4 Edge TPUs each and up to
10,000 apps, each figure printed with its growth exponent between sizes (issue 38, item 3).

Per size, in a fresh process (so that its memory is its own):

- **the cluster**: ``N`` nodes (``n00000``...), each 4 cores, 4 GB and 4 Edge TPUs of 6.9 MB with the
  ``ibis-edgetpu`` profiles (tests/support.py's ``TWO_TPUS_YAML``, scaled);
- **the control plane**: ``ControlPlane`` behind its HTTP API (``api.start_server``, 127.0.0.1, ephemeral
  port), policy ``edgemux`` (defaults), a SQLite store in a temporary folder, adaptation on (a window of 3600 s
  on the event loop's clock, so that no window closes by itself: the benchmark closes them with
  ``adaptation.step()``), the controller loop running (``reconcile_period_s`` 3600 s: it runs passes on events,
  i.e. registrations and heartbeats that need a reconcile), a fake clock (s) that the benchmark moves;
- **the agents** (``--agents``): ``http`` (default): light fake agents speaking the real HTTP API, all of them
  in ONE other process (``--agent-farm``): the control plane calls ``PUT``/``DELETE /v1/apps/{app}`` etc. at
  ``http://127.0.0.1:PORT/a/<node>`` and the farm keeps what each node holds; the farm sends the
  registrations (``POST /v1/agents/{node}``) and heartbeats (``PUT``) with the body an agent sends
  (``AgentReport``: url, incarnation, devices, one entry per piece held, cumulative ``observations``).
  ``driver``: the same fake agents in the control plane's process behind the ``AgentDriver`` interface (no HTTP
  for the control plane's calls to agents), registrations and heartbeats still through HTTP;
- **the apps**: ``--apps-per-device`` (2.5: 10 per node, 10,000 at 1,000 nodes) seeded random apps, shared (AI
  as a Service) so that apps of one model share its copy in a TPU's 6.9 MB: mobilenet_v1 / mobilenet_v2 /
  efficientnet-S, 2-12 req/s Poisson, burst 2, SLO p95 (mean for a fifth) of 80-200 ms.

Measured, per size:

- ``apply p50/p99`` (ms): each app applied alone (``PUT /v1/apps/{name}``, one app per call, sequentially),
  timed by the client from request to answer: the policy's decision over every device, the store's commit
  (fsync), the agent's ``PUT`` and the route's publication;
- ``heartbeat`` (ms per heartbeat): the control plane's handling of one heartbeat (``register_agent``, timed
  inside the server), mean over two rounds of every node (each heartbeat carries the node's pieces and its
  cumulative observations); the HTTP round trip's p50 seen by the farm is printed beside;
- ``reconcile pass`` (ms): one pass of the controller loop (``ControlPlane.run_pass``: every manager's
  ``update()``; ``reconciler.update`` checks every agent's liveness and actual against its target) with every
  agent up to date; the median of 5;
- ``adapt cycle`` (ms): one adaptation cycle (``cp.adaptation.step()``: close the window, calibrate the serving
  paths, gather the inputs, ``adapt.cycle.cycle``, carry its actions out), on windows the agents' heartbeats
  filled (each piece a Poisson count at its contract over 60 s, so that about half the apps send a little
  more than their contract, every answer at 10 ms); the median of the 3 windows after the first (the first
  only sees the findings, the later ones may act: ``trigger_windows`` 2; each its own ``adapt_cycles_ms``
  with ``--json``) and the first beside;
- ``store`` (MB): the SQLite file with its WAL; ``RSS`` (MB): the control plane's process (``/proc/self/
  status`` VmRSS; peak VmHWM beside), which in ``driver`` mode holds the fake agents too.

Exponent: ``log(v2/v1) / log(n2/n1)`` between consecutive sizes (n: nodes; apps grow with them): 1 is linear.

    .venv/bin/python benchmarks/bench_scale.py [--quick] [--sizes 10,100,1000] [--agents http|driver]
                                               [--apps-per-device 2.5] [--seed 0] [--profile DIR] [--json]

``--quick``: 10 and 100 nodes only. ``--profile DIR``: a cProfile of each phase per size
(``DIR/<nodes>-<phase>.prof``, and its top functions printed). Figures are printed, never asserted.

Units: ms, MB, s, req/s.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import math
import os
import platform
import pstats
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from edgemux.adapt.monitor import AppCounters, LatencyHistogram
from edgemux.adapt.settings import AdaptSettings
from edgemux.cluster.specs import parse_cluster
from edgemux.runtime.controlplane.agentdriver import AgentDriver
from edgemux.runtime.messages import Observations

DEVICES_PER_NODE = 4
TPU_MB = 6.9
MODELS = ("mobilenet_v1", "mobilenet_v2", "efficientnet-S")
WINDOW_S = 60.0          # the windows the heartbeats fill (fake clock, s)
ANSWER_MS = 10.0         # every answer's latency in the observations (ms): within every SLO
PASSES = 5
ADAPT_WINDOWS = 3        # cycles timed after the first window's (the median is printed)
CONCURRENCY = 32         # registrations and heartbeats in flight at once, from the farm
SIZES = (10, 100, 1000)
QUICK_SIZES = (10, 100)
FIGURES = (("apply_p50_ms", "apply p50 ms"), ("apply_p99_ms", "apply p99 ms"), ("pass_ms", "reconcile pass ms"),
           ("adapt_ms", "adapt cycle ms"), ("heartbeat_ms", "heartbeat ms"), ("store_mb", "store MB"),
           ("rss_mb", "RSS MB"))


# ------------------------------------------------------------------------------------------- the workload


def cluster_doc(nodes: int) -> dict[str, Any]:
    """``nodes`` nodes of 4 Edge TPUs each (6.9 MB, ibis-edgetpu), as the cluster file would say."""
    return {"apiVersion": "edgemux/v1alpha1", "kind": "Cluster", "metadata": {"name": f"scale-{nodes}"},
            "spec": {"nodes": [{"name": node_name(i), "cpuCores": 4, "memoryMb": 4096,
                                "devices": [{"name": f"tpu{j}", "kind": "edgetpu", "memoryMb": TPU_MB,
                                             "profiles": "ibis-edgetpu"} for j in range(DEVICES_PER_NODE)]}
                               for i in range(nodes)]}}


def node_name(i: int) -> str:
    return f"n{i:05d}"


def app_docs(count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` seeded app documents (module doc)."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        stat = "mean" if rng.random() < 0.2 else "p95"
        out.append({"apiVersion": "edgemux/v1alpha1", "kind": "App", "metadata": {"name": f"app{i:05d}"},
                    "spec": {"model": rng.choice(MODELS), "rate": round(rng.uniform(2.0, 12.0), 2), "burst": 2,
                             "shared": True, "slo": {"latencyMs": rng.choice((80, 100, 150, 200)), "stat": stat}}})
    return out


# ------------------------------------------------------------------------------------------- fake agents


class Farm:
    """Every node's fake agent: what each holds (app -> the ``PUT`` body), and its reports."""

    def __init__(self, nodes: list[str], base_url: str) -> None:
        self.nodes = nodes
        self.base_url = base_url
        self.held: dict[str, dict[str, dict[str, Any]]] = {n: {} for n in nodes}
        self.power: dict[tuple[str, str], str] = {}

    def url(self, node: str) -> str:
        return f"{self.base_url}/a/{node}"

    def node_of(self, url: str) -> str:
        return url.rsplit("/", 1)[1]

    def put(self, node: str, app: str, body: dict[str, Any]) -> None:
        self.held[node][app] = body

    def delete(self, node: str, app: str) -> None:
        self.held[node].pop(app, None)

    def arrivals(self, app: str, piece: int, rate_rps: float, t_s: float) -> int:
        """Requests of one piece since the agents started, at ``t_s`` (s): a Poisson count per window of
        ``WINDOW_S`` at the piece's contract (seeded by app, piece and window), so that about half the apps
        send a little more than their contract in a window, as real clients do."""
        total, k = 0, 0
        while (k + 1) * WINDOW_S <= t_s + 1e-9:
            k += 1
            seed = [int.from_bytes(app.encode(), "little") % (2**63), piece, k]
            total += int(np.random.default_rng(seed).poisson(rate_rps * WINDOW_S))
        return total

    def report(self, node: str, t_s: float | None) -> dict[str, Any]:
        """The node's registration or heartbeat body; ``t_s`` (s since the agents started, fake clock): its
        cumulative observations then (``arrivals``), every answer at ``ANSWER_MS``."""
        held = self.held[node]
        pieces = [{**piece, "app": a} for a, body in held.items()
                  for piece in body.get("pieces", [{k: v for k, v in body.items() if k != "app"}])]
        out: dict[str, Any] = {"node": node, "url": self.url(node), "incarnation": "bench", "heartbeat_s": 5.0,
                               "devices": [{"name": f"tpu{j}", "emulated": True,
                                            "power_state": self.power.get((node, f"tpu{j}"), "on")}
                                           for j in range(DEVICES_PER_NODE)], "apps": pieces}
        if t_s is not None:
            counts: dict[str, AppCounters] = {}
            for p in pieces:
                n = self.arrivals(p["app"], int(p["device"][3:]), float(p["rate_rps"]), t_s)
                c = AppCounters(n, 0, 0, LatencyHistogram({LatencyHistogram.index(ANSWER_MS): n} if n else {},
                                                          n * ANSWER_MS))
                counts[p["app"]] = counts[p["app"]].merge(c) if p["app"] in counts else c
            out["observations"] = Observations("bench", counts, {}).to_json()
        return out

    async def send(self, session: aiohttp.ClientSession, cp_url: str, method: str, t_s: float | None) -> list[float]:
        """Every node's registration (``POST``) or heartbeat (``PUT``), ``CONCURRENCY`` at once; the round
        trips (ms). An answer other than 200 stops the benchmark."""
        sem = asyncio.Semaphore(CONCURRENCY)
        took: list[float] = []

        async def one(node: str) -> None:
            body = json.dumps(self.report(node, t_s)).encode()
            async with sem:
                t0 = time.perf_counter()
                async with session.request(method, f"{cp_url}/v1/agents/{node}", data=body,
                                           headers={"Content-Type": "application/json"}) as resp:
                    text = await resp.read()
                    if resp.status != 200:
                        raise SystemExit(f"bench_scale: {method} /v1/agents/{node}: HTTP {resp.status}: {text[:300]!r}")
                took.append((time.perf_counter() - t0) * 1000.0)

        await asyncio.gather(*(one(n) for n in self.nodes))
        return took


class FarmDriver(AgentDriver):
    """``--agents driver``: the farm behind the ``AgentDriver`` interface, in the control plane's process."""

    def __init__(self, farm: Farm) -> None:
        self.farm = farm

    async def put_app(self, url: str, app: str, body: dict[str, Any]) -> None:
        self.farm.put(self.farm.node_of(url), app, body)

    async def delete_app(self, url: str, app: str) -> None:
        self.farm.delete(self.farm.node_of(url), app)

    async def app_ready(self, url: str, app: str) -> bool:
        return app in self.farm.held[self.farm.node_of(url)]

    async def set_power(self, url: str, device: str, state: str) -> None:
        self.farm.power[(self.farm.node_of(url), device)] = state


async def serve_farm(nodes: int) -> None:
    """``--agent-farm``: every node's fake agent on one port (its URL printed on the first line of stdout);
    the benchmark drives it with ``POST /bench/send`` (registrations or a heartbeat round) and stops it by
    closing its stdin."""
    from edgemux.runtime.httpserver import Application, Request, Response, delete, get, post, put
    from edgemux.runtime.httputil import json_response, start_site

    farm = Farm([node_name(i) for i in range(nodes)], "")
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONCURRENCY))

    async def put_app(request: Request) -> Response:
        farm.put(request.match_info["node"], request.match_info["app"], await request.json())
        return json_response({"ok": True})

    async def delete_app(request: Request) -> Response:
        farm.delete(request.match_info["node"], request.match_info["app"])
        return json_response({"ok": True})

    async def ready(request: Request) -> Response:
        ok = request.match_info["app"] in farm.held[request.match_info["node"]]
        return json_response({"ready": ok}, 200 if ok else 404)

    async def power(request: Request) -> Response:
        farm.power[(request.match_info["node"], request.match_info["device"])] = (await request.json())["state"]
        return json_response({"ok": True})

    async def live(request: Request) -> Response:
        return json_response({"live": True})

    async def send(request: Request) -> Response:
        doc = await request.json()
        took = await farm.send(session, doc["cp"], doc["method"], doc.get("t_s"))
        return json_response({"took_ms": took})

    app = Application([put("/a/{node}/v1/apps/{app}", put_app), delete("/a/{node}/v1/apps/{app}", delete_app),
                       get("/a/{node}/v2/models/{app}/ready", ready),
                       put("/a/{node}/v1/devices/{device}/power", power), get("/a/{node}/v2/health/live", live),
                       post("/bench/send", send)], client_max_size=64 << 20)
    site = await start_site(app, "127.0.0.1", 0, shutdown_timeout_s=1.0)
    farm.base_url = site.url.rstrip("/")
    print(farm.base_url, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the benchmark closes it
    await session.close()
    await site.stop()


# ------------------------------------------------------------------------------------------- one size


class FakeClock:
    """The control plane's clock (s), moved by the benchmark."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _rss_mb() -> tuple[float, float]:
    """(VmRSS, VmHWM) of this process (MB)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":", 1)
                out[key] = float(value.split()[0]) / 1024.0
    return out.get("VmRSS", math.nan), out.get("VmHWM", math.nan)


class Profiler:
    """cProfile of named phases into ``folder`` (None: nothing)."""

    def __init__(self, folder: str | None, nodes: int) -> None:
        self.folder, self.nodes = folder, nodes
        self.prof: cProfile.Profile | None = None
        self.store_prof = cProfile.Profile()

    def start(self) -> None:
        if self.folder is not None:
            self.prof = cProfile.Profile()
            self.store_prof = cProfile.Profile()
            self.prof.enable()

    def pause(self) -> None:
        """Stop collecting until :meth:`resume` (what happens between the timed steps of one phase)."""
        if self.prof is not None:
            self.prof.disable()

    def resume(self) -> None:
        if self.prof is not None:
            self.prof.enable()

    def on_store_thread(self, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``fn`` (run on the store thread: decisions and commits) profiled too, in a profile of its own."""
        def run(store: Any) -> Any:
            prof = self.store_prof if self.prof is not None else None
            if prof is None:
                return fn(store)
            prof.enable()
            try:
                return fn(store)
            finally:
                prof.disable()
        return run

    def stop(self, phase: str) -> None:
        if self.prof is None or self.folder is None:
            return
        self.prof.disable()
        for prof, name in ((self.prof, phase), (self.store_prof, f"{phase}-store-thread")):
            if not prof.getstats():
                continue
            path = Path(self.folder) / f"{self.nodes}-{name}.prof"
            prof.dump_stats(str(path))
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(18)
            print(f"--- profile {self.nodes} nodes, {name} ({path})\n" + s.getvalue(), file=sys.stderr)
        self.prof = None


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else math.nan


async def one_size(nodes: int, args: argparse.Namespace) -> dict[str, Any]:
    """Every figure of one size (module doc), as a dict."""
    from edgemux.runtime.controlplane.api import start_server
    from edgemux.runtime.controlplane.service import ControlPlane

    prof = Profiler(args.profile, nodes)
    apps = app_docs(int(round(nodes * DEVICES_PER_NODE * args.apps_per_device)), args.seed)
    farm_proc: subprocess.Popen[str] | None = None
    farm: Farm | None = None
    with tempfile.TemporaryDirectory(prefix="edgemux-scale-") as tmp:
        store = os.path.join(tmp, "store.db")
        clock = FakeClock()
        if args.agents == "http":
            farm_proc = subprocess.Popen([sys.executable, __file__, "--agent-farm", str(nodes)], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True)
            assert farm_proc.stdout is not None
            farm_url = farm_proc.stdout.readline().strip()
            if not farm_url.startswith("http"):
                raise SystemExit("bench_scale: the agent farm did not start")
            driver: AgentDriver | None = None
        else:
            farm = Farm([node_name(i) for i in range(nodes)], "http://agents.bench")
            driver = FarmDriver(farm)
            farm_url = ""
        cp = ControlPlane(store, parse_cluster(cluster_doc(nodes)), agent_driver=driver, clock=clock,
                          reconcile_period_s=3600.0,
                          adapt=AdaptSettings(window_s=3600.0, trigger_windows=2, min_samples=20))
        server = await start_server(cp, "127.0.0.1", 0)
        cp_url = server.url.rstrip("/")
        handled: list[float] = []
        register = cp.register_agent

        def timed_register(node: str, body: Any, *, heartbeat: bool) -> dict[str, Any]:
            t0 = time.perf_counter()
            try:
                return register(node, body, heartbeat=heartbeat)
            finally:
                handled.append((time.perf_counter() - t0) * 1000.0)

        cp.register_agent = timed_register  # type: ignore[method-assign]
        if args.profile:
            db_run = cp.db.run
            cp.db.run = lambda fn: db_run(prof.on_store_thread(fn))  # type: ignore[method-assign]
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONCURRENCY),
                                        timeout=aiohttp.ClientTimeout(total=600))
        try:
            async def send(method: str, t_s: float | None) -> list[float]:
                if farm is not None:
                    return await farm.send(session, cp_url, method, t_s)
                async with session.post(f"{farm_url}/bench/send",
                                        json={"cp": cp_url, "method": method, "t_s": t_s}) as resp:
                    return list((await resp.json())["took_ms"])

            # registrations
            await send("POST", None)
            await cp.wait_idle(600)

            # applies: one app per call, sequentially
            latencies: list[float] = []
            results: dict[str, int] = {}
            prof.start()
            t_apply = time.perf_counter()
            for doc in apps:
                name = doc["metadata"]["name"]
                t0 = time.perf_counter()
                async with session.put(f"{cp_url}/v1/apps/{name}", json=doc) as resp:
                    body = await resp.json()
                latencies.append((time.perf_counter() - t0) * 1000.0)
                result = body["results"][0]["result"] if resp.status in (200, 201, 409) else f"http-{resp.status}"
                results[result] = results.get(result, 0) + 1
                if len(latencies) % max(1, len(apps) // 10) == 0:
                    recent = latencies[-max(1, len(apps) // 10):]
                    print(f"  {nodes} nodes: {len(latencies)}/{len(apps)} applied, the last {len(recent)}: p50 "
                          f"{_pct(recent, 50):.1f} p99 {_pct(recent, 99):.1f} ms", file=sys.stderr, flush=True)
            apply_s = time.perf_counter() - t_apply
            prof.stop("apply")
            await cp.wait_idle(600)

            # heartbeats: a baseline round, then a window's worth (fake clock), twice
            handled.clear()
            prof.start()
            rtt = await send("PUT", 0.0)
            await cp.wait_idle(600)
            clock.t += WINDOW_S
            rtt += await send("PUT", WINDOW_S)
            prof.stop("heartbeat")
            await cp.wait_idle(600)
            heartbeat_ms = statistics.fmean(handled) if handled else math.nan
            heartbeat_max = max(handled) if handled else math.nan
            heartbeats = len(handled)

            # the first window's cycle (its findings count from the second)
            t0 = time.perf_counter()
            first = cp.adaptation.step()
            adapt_first_ms = (time.perf_counter() - t0) * 1000.0
            await cp.wait_idle(600)
            # the windows after it (each may act: trigger_windows 2), each on a new window's heartbeats
            outcomes = [first]
            cycles: list[float] = []
            prof.start()
            for k in range(ADAPT_WINDOWS):
                clock.t += WINDOW_S
                prof.pause()
                rtt += await send("PUT", (2 + k) * WINDOW_S)
                await cp.wait_idle(600)
                prof.resume()
                t0 = time.perf_counter()
                outcomes.append(cp.adaptation.step())
                cycles.append((time.perf_counter() - t0) * 1000.0)
            prof.stop("adapt")
            adapt_ms = statistics.median(cycles)
            actions: dict[str, int] = {}
            for outcome in outcomes:
                for a in outcome.actions if outcome is not None else ():
                    k = getattr(a, "what", None) or a.kind
                    actions[k] = actions.get(k, 0) + 1
            await cp.wait_idle(600)

            # reconcile passes, every agent up to date
            passes: list[float] = []
            update: list[float] = []
            prof.start()
            for _ in range(PASSES):
                t0 = time.perf_counter()
                cp.run_pass()
                passes.append((time.perf_counter() - t0) * 1000.0)
                t0 = time.perf_counter()
                cp.reconciler.update()
                update.append((time.perf_counter() - t0) * 1000.0)
                await cp.wait_idle(600)
            prof.stop("pass")

            ready = sum(1 for a in cp.apps if cp.reconciler.status(a) == "ready")
            store_mb = sum(os.path.getsize(p) for p in (store, store + "-wal") if os.path.exists(p)) / 2**20
            rss, hwm = _rss_mb()
            return {"nodes": nodes, "devices": nodes * DEVICES_PER_NODE, "apps": len(apps), "agents": args.agents,
                    "results": results, "placed": len(cp.apps), "ready": ready,
                    "used_devices": sum(1 for ld in cp.snapshot().device_loads.values() if ld.apps),
                    "apply_p50_ms": _pct(latencies, 50), "apply_p99_ms": _pct(latencies, 99),
                    "apply_max_ms": max(latencies) if latencies else math.nan, "apply_total_s": apply_s,
                    "pass_ms": statistics.median(passes), "pass_max_ms": max(passes),
                    "reconciler_update_ms": statistics.median(update),
                    "adapt_ms": adapt_ms, "adapt_cycles_ms": cycles, "adapt_first_ms": adapt_first_ms,
                    "actions": actions,
                    "heartbeat_ms": heartbeat_ms, "heartbeat_max_ms": heartbeat_max,
                    "heartbeat_rtt_p50_ms": _pct(rtt, 50), "heartbeats": heartbeats,
                    "store_mb": store_mb, "rss_mb": rss, "rss_peak_mb": hwm}
        finally:
            await session.close()
            await server.stop()
            if farm_proc is not None:
                assert farm_proc.stdin is not None
                farm_proc.stdin.close()
                farm_proc.wait(30)


# ------------------------------------------------------------------------------------------- the table


def exponents(rows: list[dict[str, Any]], key: str) -> list[float | None]:
    """``log(v2/v1) / log(n2/n1)`` between consecutive rows (None for the first, or where undefined)."""
    out: list[float | None] = [None]
    for a, b in zip(rows, rows[1:]):
        v1, v2 = a[key], b[key]
        ok = all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in (v1, v2))
        out.append(math.log(v2 / v1) / math.log(b["nodes"] / a["nodes"]) if ok else None)
    return out


def table(rows: list[dict[str, Any]]) -> str:
    head = ["nodes", "devices", "apps"] + [label for _, label in FIGURES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    exps = {key: exponents(rows, key) for key, _ in FIGURES}
    for i, r in enumerate(rows):
        cells = [f"{r['nodes']:,}", f"{r['devices']:,}", f"{r['apps']:,}"]
        for key, _ in FIGURES:
            v = r[key]
            text = f"{v:.3g}" if v < 100 else f"{v:,.0f}"
            e = exps[key][i]
            cells.append(text + (f" (x^{e:.2f})" if e is not None else ""))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()} {platform.release()}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="10 and 100 nodes only")
    p.add_argument("--sizes", default=None, help="comma-separated node counts (default 10,100,1000)")
    p.add_argument("--agents", choices=("http", "driver"), default="http",
                   help="http: fake agents in one other process, real HTTP both ways (default); driver: in-process "
                        "AgentDriver for the control plane's calls, heartbeats still through HTTP")
    p.add_argument("--apps-per-device", type=float, default=2.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", default=None, metavar="DIR", help="cProfile each phase into DIR")
    p.add_argument("--json", action="store_true",
                   help="print every figure as one JSON document on stdout, and nothing else there (the table "
                        "and the progress go to stderr)")
    p.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)        # one size, in this process
    p.add_argument("--agent-farm", type=int, default=None, help=argparse.SUPPRESS)  # the fake agents' process
    args = p.parse_args(argv)
    if args.agent_farm is not None:
        asyncio.run(serve_farm(args.agent_farm))
        return 0
    if args.one is not None:
        from edgemux.runtime.process import space_full_collections, tune_allocator
        tune_allocator()  # as `edgemux controlplane` does
        space_full_collections()
        if args.profile:
            os.makedirs(args.profile, exist_ok=True)
        row = asyncio.run(one_size(args.one, args))
        print(json.dumps(row))
        return 0
    try:
        sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else list(QUICK_SIZES if args.quick else SIZES)
    except ValueError:
        p.error(f"--sizes must be comma-separated node counts, e.g. 10,100,1000; got {args.sizes!r}")
    if any(n < 1 for n in sizes):
        p.error(f"--sizes: every node count must be at least 1, got {args.sizes}")
    if not (math.isfinite(args.apps_per_device) and args.apps_per_device > 0):
        p.error(f"--apps-per-device must be a number > 0, got {args.apps_per_device}")
    text = sys.stderr if args.json else sys.stdout  # --json: stdout is the JSON document alone
    rows = []
    for n in sizes:
        cmd = [sys.executable, __file__, "--one", str(n), "--agents", args.agents, "--apps-per-device",
               str(args.apps_per_device), "--seed", str(args.seed)] + (["--profile", args.profile] if args.profile else [])
        t0 = time.perf_counter()
        out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f"{n} nodes: {row['apps']} apps ({row['results']}), {row['ready']} ready on {row['used_devices']} "
              f"devices; apply p50 {row['apply_p50_ms']:.2f} p99 {row['apply_p99_ms']:.2f} max "
              f"{row['apply_max_ms']:.1f} ms ({row['apply_total_s']:.1f} s in all); pass {row['pass_ms']:.2f} ms "
              f"(max {row['pass_max_ms']:.2f}, reconciler {row['reconciler_update_ms']:.2f}); adapt "
              f"{row['adapt_ms']:.1f} ms (median of {', '.join(f'{c:.0f}' for c in row['adapt_cycles_ms'])}; "
              f"first window {row['adapt_first_ms']:.1f}; actions {row['actions']}); "
              f"heartbeat {row['heartbeat_ms']:.3f} ms (max {row['heartbeat_max_ms']:.2f}, HTTP round trip p50 "
              f"{row['heartbeat_rtt_p50_ms']:.2f}, {row['heartbeats']} heartbeats); store {row['store_mb']:.2f} MB; "
              f"RSS {row['rss_mb']:.0f} MB (peak {row['rss_peak_mb']:.0f}) [{time.perf_counter() - t0:.0f} s]",
              file=text, flush=True)
    agents = ("fake agents speaking the real HTTP API, all in one other process" if args.agents == "http" else
              "fake agents behind the AgentDriver interface in the control plane's process; heartbeats through HTTP")
    print(f"\nbench_scale: one control plane (policy edgemux, SQLite store, adaptation on), {agents}; "
          f"{args.apps_per_device:g} apps per device, 4 Edge TPUs per node", file=text)
    print(f"machine: {machine()}", file=text)
    print(table(rows), file=text)
    print("(x^e): growth exponent from the size above, log(v2/v1)/log(n2/n1); 1 is linear", file=text)
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
