"""Serving overhead of the agent and the gateway over a direct ONNX Runtime call, and one agent's throughput.

Latency (sequential requests, batch 1, real model ``zoo:squeezenet1_1@64`` on onnxruntime's CPU provider,
1 intra-op thread; not emulated):

(a) direct:  ``OnnxRuntimeBackend.run`` in-process, on the very session the agent serves;
(b) agent:   ``edgemux.runtime.ingress.client.Client`` -> agent over HTTP on 127.0.0.1 (Open Inference Protocol,
             binary tensor data, keep-alive connection) -> DeviceWorker(fcfs) -> the same session;
(c) gateway: ``Client`` -> gateway (server-side policing + weighted routing, body forwarded) -> agent.

The agent (``agent.start_server``) and the gateway (``gateway.make_app`` served by ``httputil.start_site``) run
in this process as in-process servers on 127.0.0.1, each on its own asyncio event loop in its own thread,
as separate processes would have their own loops; the client calls from the main thread. After a warm-up,
the paths are measured in interleaved blocks (a, b, c, ..., a, b, c, ...) so that a slow moment of the
host hits all of them alike. Overheads are differences of percentiles: b - a and c - a at p50 and p99.
Targets at p50: agent <= 0.5 ms, gateway (c - a) <= 1 ms. Two more paths split and cross-check the
agent's figure: the agent's own ``DeviceWorker.infer`` without HTTP (w: w - a is the worker hand-off,
b - w the HTTP stack and codecs) and ``tritonclient.http`` -> agent (t: our client's cost vs Triton's).

Throughput: closed loop against one agent with k concurrent clients (k = 1, 2, 4, ... until throughput
stops growing), each sending its next request when the previous one answered. The device is EMULATED
with zero service time (an ``EmulatedBackend`` whose sleep is disabled), so the figure is the agent's own
ceiling (HTTP parsing, validation, worker hand-off, encoding), not a model's. The load generator is
``closedloop.py``, a separate process (asyncio + aiohttp, pre-encoded binary body), so that it does not
share the agent's GIL; on a small host it shares the CPU cores, so the figure is a lower bound of what the
agent sustains alone.

    .venv/bin/python benchmarks/bench_serving.py [--quick] [--requests N] [--no-triton] [--quiet-wait S]

Units: ms (latency), req/s (throughput).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np

from edgemux.runtime.process import event_loop_name, new_event_loop
from closedloop import run_level  # benchmarks/closedloop.py, beside this script
from hostload import host_busy_s, own_cpu_s, wait_quiet  # benchmarks/hostload.py, beside this script

T = TypeVar("T")

MODEL = "zoo:squeezenet1_1@64"
EMU_MODEL = "zoo:mobilenet_v2@32"           # only its tensor shapes matter on the emulated device
EMU_PROFILE = "ibis-edgetpu/mobilenet_v2"   # required by an emulated device; its times are not slept
AGENT_TARGET_MS = 0.5
GATEWAY_TARGET_MS = 1.0
BLOCK = 20          # requests per path per interleaved block
GROWTH = 1.05       # throughput "still grows" while a level beats the best so far by 5 %


class LoopThread:
    """An asyncio event loop running in a daemon thread; ``call`` runs a coroutine there and waits."""

    def __init__(self, name: str) -> None:
        self.loop = new_event_loop()  # the serving processes' loop (uvloop when installed)
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5.0)


# ------------------------------------------------------------------------------------------- servers


@dataclass
class Servers:
    """The in-process servers: the agent (real cpu0 + emulated zero-time tpu0) on its loop thread and a
    gateway routing app ``sq`` to it on another. URLs are ``http://127.0.0.1:PORT``."""

    agent: Any
    agent_loop: LoopThread
    gw_loop: LoopThread
    agent_server: Any
    gw_site: Any
    agent_url: str
    gw_url: str

    def stop(self) -> None:
        """Stop listening (in-flight requests finish) and drain the agent's workers."""
        self.gw_loop.call(self.gw_site.stop())
        self.agent_loop.call(self.agent_server.stop())
        self.gw_loop.stop()
        self.agent_loop.stop()


def start_servers() -> Servers:
    """Start the agent and the gateway (see :class:`Servers`)."""
    from edgemux.cluster.state import Device, Node
    from edgemux.cluster.workload import Discipline
    from edgemux.profiles.types import DeviceKind
    from edgemux.runtime.dataplane.agent import Agent, start_server
    from edgemux.runtime.dataplane.backends import EmulatedBackend, OnnxRuntimeBackend
    from edgemux.runtime.ingress.client import AppRoute
    from edgemux.runtime.httputil import start_site
    from edgemux.runtime.ingress.gateway import Gateway, make_app

    node = Node("bench", 2.0, 4096.0, (
        Device("bench", "cpu0", DeviceKind.CPU, Discipline.FCFS, 4096.0),
        Device("bench", "tpu0", DeviceKind.EDGETPU, Discipline.FCFS, 8.0, "ibis-edgetpu"),
    ))
    # Zero service time on the emulated device: its sleep is a no-op, so only the agent's own work remains.
    agent = Agent(node, backends={"cpu0": OnnxRuntimeBackend(threads=1),
                                  "tpu0": EmulatedBackend(seed=0, sleep=lambda _s: None)})
    agent.register_app("sq", {"device": "cpu0", "model": MODEL})
    agent.register_app("emu", {"device": "tpu0", "model": EMU_MODEL, "profile": EMU_PROFILE})

    agent_loop = LoopThread("agent-loop")
    server = agent_loop.call(start_server(agent, "127.0.0.1", 0))

    gw_loop = LoopThread("gateway-loop")
    # A contract far above anything sent here: policing is exercised but never makes a request wait.
    gw = Gateway({"sq": AppRoute("sq", "sq", {server.url: 1.0}, rate_rps=1e9, burst=1e9)}, timeout_s=30.0)

    async def serve_gateway() -> tuple[Any, str]:
        site = await start_site(make_app(gw), "127.0.0.1", 0, shutdown_timeout_s=2.0)
        return site, site.url

    gw_site, gw_url = gw_loop.call(serve_gateway())
    return Servers(agent, agent_loop, gw_loop, server, gw_site, server.url, gw_url)


# ------------------------------------------------------------------------------------------- latency


def timed(fn: Callable[[], Any], n: int) -> list[float]:
    """``n`` sequential calls of ``fn``; each one's wall time in ms."""
    out = []
    for _ in range(n):
        s = time.perf_counter()
        fn()
        out.append((time.perf_counter() - s) * 1000.0)
    return out


def measure_latency(agent: Any, agent_url: str, gw_url: str, requests: int, warmup: int,
                    triton: bool = True) -> dict[str, np.ndarray]:
    """Per-request wall times (ms) of each path, keyed a (direct), b (agent), c (gateway) and, with
    ``triton``, t (tritonclient.http -> agent, a cross-check of our client's own cost)."""
    from edgemux.runtime.ingress.client import AppRoute, Client

    route = agent.next_piece("sq")
    backend = agent.backends[route.device]
    spec = route.info.inputs[0]
    out_name = route.info.outputs[0].name
    x = np.random.default_rng(0).standard_normal([1 if d < 1 else d for d in spec.shape]).astype(np.float32)
    inputs = {spec.name: x}
    contract = {"rate_rps": 1e9, "burst": 1e9}  # never limits: the figure is the path, not the policing
    direct_client = Client(AppRoute("sq", "sq", {agent_url: 1.0}, **contract), timeout_s=30.0)
    gw_client = Client(AppRoute("sq", "sq", {gw_url: 1.0}, **contract), timeout_s=30.0)
    paths: dict[str, Callable[[], Any]] = {
        "a": lambda: backend.run(route.model, inputs),
        "b": lambda: direct_client.infer("sq", inputs, binary=True),
        "c": lambda: gw_client.infer("sq", inputs, binary=True),
        # the agent's own DeviceWorker without HTTP: splits the agent's overhead into worker hand-off and HTTP
        "w": lambda: agent.workers[route.device].infer("sq", route.model, inputs, 30.0),
    }
    tc: Any = None
    if triton:
        import tritonclient.http as httpclient

        tc = httpclient.InferenceServerClient(url=agent_url.removeprefix("http://"), connection_timeout=30,
                                              network_timeout=30)

        def via_triton() -> Any:
            # built per request, as a tritonclient user would: part of that client's cost
            inp = httpclient.InferInput(spec.name, list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=True)
            return tc.infer("sq", [inp], outputs=[httpclient.InferRequestedOutput(out_name, binary_data=True)])

        paths["t"] = via_triton
    try:
        # the paths must compute the same thing, or the comparison is meaningless
        want = paths["a"]()[out_name]
        for k in ("b", "c"):
            if not np.allclose(paths[k]().outputs[out_name], want, atol=1e-4):
                raise RuntimeError(f"path {k} answered other outputs than the direct call")
        for fn in paths.values():
            timed(fn, warmup)
        samples: dict[str, list[float]] = {k: [] for k in paths}
        blocks = max(1, requests // BLOCK)
        for _ in range(blocks):
            for k, fn in paths.items():
                samples[k].extend(timed(fn, BLOCK))
    finally:
        direct_client.close()
        gw_client.close()
        if tc is not None:
            tc.close()
    return {k: np.asarray(v) for k, v in samples.items()}


# ---------------------------------------------------------------------------------------- throughput


def sweep_throughput(agent: Any, agent_url: str, seconds: float, warm_s: float, max_k: int) -> list[dict[str, Any]]:
    """Closed-loop levels k = 1, 2, 4, ... until throughput stops growing (two levels without beating the
    best by ``GROWTH``) or ``max_k``. Each level is one run of the load generator ``closedloop.py``, a
    separate process sending a pre-encoded binary body."""
    from edgemux.runtime.dataplane.protocol import encode_infer_request
    from edgemux.runtime.tools.load import default_inputs

    # the load generator's own tensors for the declared input (the emulated Edge TPU's is uint8 pixels)
    spec = agent.next_piece("emu").info.inputs[0]
    spec = replace(spec, shape=tuple(1 if d < 1 else d for d in spec.shape))
    body, headers = encode_infer_request(default_inputs([spec]), binary=True)
    levels: list[dict[str, Any]] = []
    best = 0.0
    flat = 0
    k = 1
    with tempfile.NamedTemporaryFile(suffix=".body") as f:
        f.write(body)
        f.flush()
        while k <= max_k:
            level = run_level(f"{agent_url}/v2/models/emu/infer", f.name, headers, k, seconds, warm_s)
            levels.append(level)
            print(f"  k={k:>3}: {level['rps']:>8.0f} req/s, p50 {level['p50_ms']:.3f} ms, errors {level['errors']}")
            if level["rps"] > best * GROWTH:
                flat = 0
            else:
                flat += 1
            best = max(best, level["rps"])
            if flat >= 2:
                break
            k *= 2
    return levels


# ---------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small counts (smoke test)")
    ap.add_argument("--no-triton", action="store_true", help="skip the tritonclient.http cross-check path")
    ap.add_argument("--quiet-wait", type=float, default=0.0, metavar="S",
                    help="before the latency and the throughput parts, wait up to S seconds for a lull in other "
                         "processes' CPU use (for shared hosts; default 0: do not wait)")
    ap.add_argument("--requests", type=int, default=None,
                    help="timed sequential requests per path (default 3000; 120 with --quick)")
    args = ap.parse_args(argv)

    requests = args.requests or (120 if args.quick else 3000)
    warmup = 20 if args.quick else 200
    seconds, warm_s, max_k = (0.5, 0.2, 4) if args.quick else (3.0, 0.5, 128)
    # Short GIL switch interval: the client, agent and gateway threads hand off to each other on every
    # request; the default 5 ms interval would let a busy thread delay another's wake-up.
    sys.setswitchinterval(0.0005)

    import onnxruntime as ort

    servers = start_servers()
    agent, agent_url, gw_url = servers.agent, servers.agent_url, servers.gw_url
    try:
        print("Serving overhead: agent and gateway over a direct onnxruntime call")
        print(f"model {MODEL}, batch 1, REAL onnxruntime {ort.__version__} CPUExecutionProvider, 1 intra-op "
              f"thread; host {platform.node()} ({platform.machine()}, {os.cpu_count()} cores, "
              f"python {platform.python_version()})")
        print("servers: agent (agent.start_server) and gateway (gateway.make_app on httputil.start_site) IN-PROCESS "
              f"on 127.0.0.1, each on its own event-loop thread ({event_loop_name()}, as the CLI runs them); client: edgemux Client (http.client, keep-alive, "
              "binary tensor data) from the main thread")
        print(f"{requests} sequential timed requests per path after {warmup} warm-up, interleaved in blocks of "
              f"{BLOCK}")
        print()
        waited, _ = wait_quiet(args.quiet_wait)
        if args.quiet_wait > 0:
            print(f"waited {waited:.0f} s for a lull in other processes' CPU use")
        busy0, own0, t0 = host_busy_s(), own_cpu_s(), time.perf_counter()
        lat = measure_latency(agent, agent_url, gw_url, requests, warmup, triton=not args.no_triton)
        busy1, own1, t1 = host_busy_s(), own_cpu_s(), time.perf_counter()
        # Other processes on a shared host delay every thread wake-up a request needs: say how busy it was.
        others = (None if busy0 is None or busy1 is None
                  else max(0.0, (busy1 - busy0) - (own1 - own0)) / (t1 - t0))
        names = {"a": "(a) direct OnnxRuntimeBackend.run", "b": "(b) client -> agent (HTTP)",
                 "c": "(c) client -> gateway -> agent", "t": "    tritonclient.http -> agent (check)",
                 "w": "    agent's DeviceWorker.infer, no HTTP"}
        header = f"{'path':<36} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8} {'n':>6}"
        print(header)
        print("-" * len(header))
        pct = {k: (float(np.percentile(v, 50)), float(np.percentile(v, 99))) for k, v in lat.items()}
        for k, v in lat.items():
            print(f"{names[k]:<36} {pct[k][0]:>8.3f} {pct[k][1]:>8.3f} {float(np.mean(v)):>8.3f} {len(v):>6}")
        print()
        oa50, oa99 = pct["b"][0] - pct["a"][0], pct["b"][1] - pct["a"][1]
        og50, og99 = pct["c"][0] - pct["a"][0], pct["c"][1] - pct["a"][1]
        print(f"{'overhead':<36} {'p50 ms':>8} {'p99 ms':>8} {'target p50':>11} {'ratio':>6} {'meets?':>7}")
        print(f"{'agent   (b - a)':<36} {oa50:>8.3f} {oa99:>8.3f} {'<= 0.5 ms':>11} {oa50 / AGENT_TARGET_MS:>6.2f} "
              f"{'yes' if oa50 <= AGENT_TARGET_MS else 'NO':>7}")
        print(f"{'gateway (c - a)':<36} {og50:>8.3f} {og99:>8.3f} {'<= 1 ms':>11} {og50 / GATEWAY_TARGET_MS:>6.2f} "
              f"{'yes' if og50 <= GATEWAY_TARGET_MS else 'NO':>7}")
        print(f"{'gateway hop alone (c - b)':<36} {pct['c'][0] - pct['b'][0]:>8.3f} {pct['c'][1] - pct['b'][1]:>8.3f}")
        print(f"{'  of which worker hand-off (w - a)':<36} {pct['w'][0] - pct['a'][0]:>8.3f} "
              f"{pct['w'][1] - pct['a'][1]:>8.3f}")
        print(f"{'  of which HTTP + codecs (b - w)':<36} {pct['b'][0] - pct['w'][0]:>8.3f} "
              f"{pct['b'][1] - pct['w'][1]:>8.3f}")
        print(f"ratio agent overhead / target = {oa50 / AGENT_TARGET_MS:.2f}; "
              f"ratio gateway overhead / target = {og50 / GATEWAY_TARGET_MS:.2f} (p50)")
        print("(overheads are differences of each path's own percentiles; at p99 the host's noise can make them "
              "negative)")
        print("other processes used " + (f"{others:.2f}" if others is not None else "n/a")
              + f" of {os.cpu_count()} cores during the latency measurement ({t1 - t0:.1f} s); every request "
              "needs several thread wake-ups, each delayed when the cores are busy")
        print()
        print("Throughput of one agent, closed loop, k concurrent clients: device EMULATED with zero service time "
              "(sleep disabled), load generator in a separate process (asyncio + aiohttp) on the same host")
        if args.quiet_wait > 0:
            print(f"  waited {wait_quiet(args.quiet_wait)[0]:.0f} s for a lull in other processes' CPU use")
        levels = sweep_throughput(agent, agent_url, seconds, warm_s, max_k)
        top = max(levels, key=lambda lv: lv["rps"])
        print(f"highest sustained throughput: {top['rps']:.0f} req/s at k={top['k']} "
              f"(p50 {top['p50_ms']:.3f} ms); load generator shares the host's {os.cpu_count()} cores, so this is "
              "a lower bound for the agent alone")
        # For scale: the real model's own ceiling on one core, 1 / mean direct service time.
        print(f"for comparison, the real model alone sustains at most 1000 / {float(np.mean(lat['a'])):.3f} ms = "
              f"{1000.0 / float(np.mean(lat['a'])):.0f} req/s on its 1 intra-op thread")
    finally:
        servers.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
