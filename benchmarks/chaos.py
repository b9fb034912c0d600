"""Chaos: kill -9 edgemux's processes under load, restart them as the engine would, and account for everything.

A local cluster (``edgemux.engines.local``, authentication on) of ``--nodes`` nodes, each with one EMULATED Edge
TPU (ibis-edgetpu profiles); ``--apps`` apps admitted with their keys. Open-loop Poisson load on every app through
the gateway for the whole run. Every ``--every-s`` seconds for ``--chaos-s`` seconds a process drawn with the seed
(the control plane, the gateway or an agent) is killed with SIGKILL and started again on its port, as
``edgemux up``'s supervisor does (``Engine.restart``); then ``--tail-s`` seconds without kills.

At the end it checks what the issue asks:

* every admitted app is in the store exactly once, and the store is sound (``Store.check``);
* every app is served: an inference through the gateway answers 200 (within ``--settle-s``);
* every request sent is accounted for as **answered** (200 with a valid inference response), **failed
  explicitly** (an HTTP error status, or a connection refused or reset: the client knows at once and may retry),
  or **lost** (no answer within the client's timeout, or a 200 that is not a valid response). Lost must be 0.

    python benchmarks/chaos.py [--seed 0] [--chaos-s 30] [--every-s 3] [--tail-s 8] [--apps 4] [--nodes 3] [--json]

Exit status: 0 when every check holds, 1 when one does not (the report says which), 2 on bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from edgemux.cluster.store import Store
from edgemux.engines.local import Engine
from edgemux.runtime.auth import auth_headers
from edgemux.runtime.tools.load import LoadError, LoadReport, default_inputs, fetch_model_inputs, run_load

LOST_KINDS = ("timeout", "malformed")  # no answer in time, or an answer that is not one
MODELS = ("mobilenet_v2", "efficientnet-S", "inception_v3", "mobilenet_v1")
TIMEOUT_S = 10.0  # the client's total per request: a request without an outcome by then is lost


def _cluster(nodes: int) -> str:
    lines = ["apiVersion: edgemux/v1alpha1", "kind: Cluster", "metadata: {name: chaos}", "spec:", "  nodes:"]
    for i in range(1, nodes + 1):
        lines.append(f"    - {{name: n{i}, cpuCores: 2, memoryMb: 4096, devices: [{{name: tpu0, kind: edgetpu, "
                     f"memoryMb: 64, profiles: ibis-edgetpu}}]}}")
    return "\n".join(lines) + "\n"


def _apps(n: int) -> list[tuple[str, str, float]]:
    """(name, model, rate req/s) of ``n`` apps."""
    return [(f"app{i}", MODELS[i % len(MODELS)], 5.0) for i in range(n)]


def _apps_yaml(apps: list[tuple[str, str, float]]) -> str:
    return "---\n".join(f"apiVersion: edgemux/v1alpha1\nkind: App\nmetadata: {{name: {n}}}\n"
                        f"spec: {{model: {m}, rate: {r:g}, burst: {2 * r:g}, slo: {{latencyMs: 500, stat: p95}}}}\n"
                        for n, m, r in apps)


async def _inputs(gateway: str, app: str, key: str | None, deadline_s: float) -> dict[str, np.ndarray]:
    """The app's request tensors, from its model metadata at the gateway (``fetch_model_inputs``, asked until
    it answers or ``deadline_s``, monotonic s, passes)."""
    async with aiohttp.ClientSession(headers=auth_headers(key)) as session:
        while True:
            try:
                return default_inputs(await fetch_model_inputs(session, gateway, app, TIMEOUT_S))
            except LoadError as e:
                if time.monotonic() > deadline_s:
                    raise SystemExit(f"chaos: {e}") from None
            await asyncio.sleep(0.2)


def _chaos(eng: Engine, rng: np.random.Generator, chaos_s: float, every_s: float) -> list[dict[str, Any]]:
    """Kill a drawn process every ``every_s`` for ``chaos_s`` and start it again (in a thread: blocking)."""
    kills: list[dict[str, Any]] = []
    names = sorted(eng.pids)
    end = time.monotonic() + chaos_s
    while time.monotonic() + every_s <= end:
        time.sleep(every_s)
        name = names[int(rng.integers(len(names)))]
        t0 = time.monotonic()
        code = eng.kill(name)
        restarted = eng.restart(name)
        kills.append({"at_s": round(t0 - (end - chaos_s), 3), "process": name, "exit": code,
                      "down_s": round(time.monotonic() - t0, 3), "pid": restarted.pid})
    return kills


async def _run(eng: Engine, apps: list[tuple[str, str, float]], keys: dict[str, str | None], seed: int,
               chaos_s: float, every_s: float, tail_s: float) -> tuple[dict[str, LoadReport], list[dict[str, Any]]]:
    assert eng.gateway_url is not None
    deadline = time.monotonic() + 60.0
    inputs = {a: await _inputs(eng.gateway_url, a, keys.get(a), deadline) for a, _, _ in apps}
    duration = chaos_s + tail_s
    loads = [run_load(eng.gateway_url, a, rate_rps=r, duration_s=duration, seed=seed + i, timeout_s=TIMEOUT_S,
                      inputs=inputs[a], key=keys.get(a)) for i, (a, _, r) in enumerate(apps)]
    chaos = asyncio.to_thread(_chaos, eng, np.random.default_rng(seed), chaos_s, every_s)
    *reports, kills = await asyncio.gather(*loads, chaos)
    return {a: rep for (a, _, _), rep in zip(apps, reports)}, kills


def _served(eng: Engine, apps: list[tuple[str, str, float]], keys: dict[str, str | None],
            settle_s: float) -> dict[str, bool]:
    """Whether each app answers an inference through the gateway within ``settle_s`` (s)."""
    assert eng.gateway_url is not None
    out = {}
    deadline = time.monotonic() + settle_s
    for a, _, _ in apps:
        inputs = asyncio.run(_inputs(eng.gateway_url, a, keys.get(a), deadline))
        ok = False
        while not ok and time.monotonic() < deadline:
            rep = asyncio.run(run_load(eng.gateway_url, a, rate_rps=5.0, duration_s=0.2, inputs=inputs,
                                       key=keys.get(a), timeout_s=TIMEOUT_S))
            ok = rep.ok > 0
            if not ok:
                time.sleep(0.5)
        out[a] = ok
    return out


def run(seed: int, chaos_s: float, every_s: float, tail_s: float, n_apps: int, nodes: int,
        settle_s: float) -> dict[str, Any]:
    """The run (module docstring) as JSON-ready data."""
    apps = _apps(n_apps)
    with tempfile.TemporaryDirectory(prefix="edgemux-chaos-") as tmp:
        cluster = Path(tmp) / "cluster.yaml"
        cluster.write_text(_cluster(nodes))
        with Engine(cluster, heartbeat_s=0.5, workdir=Path(tmp) / "cluster") as eng:
            cp = eng.client(timeout_s=120.0)
            applied = cp.apply(_apps_yaml(apps).encode())
            if applied.rejected:
                raise SystemExit(f"chaos: rejected: {applied.rejected[0].rejection}")
            keys = {r.app: r.key for r in applied.results}
            pending = cp.wait_ready([a for a, _, _ in apps], 120.0)
            if pending:
                raise SystemExit(f"chaos: not ready after 120 s: {', '.join(pending)}")
            reports, kills = asyncio.run(_run(eng, apps, keys, seed, chaos_s, every_s, tail_s))
            served = _served(eng, apps, keys, settle_s)
            with Store.open(eng.store) as store:
                stored = [row[0] for row in store.dump()["apps"]]
                problems = store.check()
    per_app = {}
    totals: Counter[str] = Counter()
    for a, rep in reports.items():
        kinds = Counter(str(k) for k in rep.kinds)
        per_app[a] = dict(sorted(kinds.items()))
        totals.update(kinds)
    answered = totals.pop("ok", 0)
    lost = sum(totals.pop(k, 0) for k in LOST_KINDS)
    failed = dict(sorted(totals.items()))
    admitted = sorted(a for a, _, _ in apps)
    checks = {
        "lost == 0": lost == 0,
        "every admitted app in the store exactly once": sorted(stored) == admitted,
        "store sound": problems == [],
        "every app served at the end": all(served.values()),
    }
    return {"seed": seed, "chaos_s": chaos_s, "every_s": every_s, "tail_s": tail_s, "nodes": nodes,
            "apps": [list(a) for a in apps], "kills": kills,
            "requests": {"sent": answered + lost + sum(failed.values()), "answered": answered,
                         "failed_explicitly": failed, "lost": lost},
            "per_app": per_app, "store_apps": sorted(stored), "store_problems": problems, "served": served,
            "checks": checks, "holds": all(checks.values())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chaos-s", type=float, default=30.0, help="how long processes are killed (s; default 30)")
    ap.add_argument("--every-s", type=float, default=3.0, help="seconds between kills (default 3)")
    ap.add_argument("--tail-s", type=float, default=8.0, help="load after the last kill (s; default 8)")
    ap.add_argument("--settle-s", type=float, default=60.0, help="how long every app may take to serve again (s)")
    ap.add_argument("--apps", type=int, default=4)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = ap.parse_args(argv)
    for name, v, lo in (("--chaos-s", args.chaos_s, 1.0), ("--every-s", args.every_s, 0.5),
                        ("--tail-s", args.tail_s, 0.0), ("--settle-s", args.settle_s, 1.0)):
        if not (lo <= v <= 3600.0):
            print(f"chaos: {name} must be in [{lo:g}, 3600] s, got {v:g}", file=sys.stderr)
            return 2
    if args.every_s > args.chaos_s:
        print(f"chaos: --every-s ({args.every_s:g}) must not exceed --chaos-s ({args.chaos_s:g})", file=sys.stderr)
        return 2
    if not (1 <= args.apps <= 32 and 1 <= args.nodes <= 16):
        print("chaos: --apps must be in 1..32 and --nodes in 1..16", file=sys.stderr)
        return 2
    r = run(args.seed, args.chaos_s, args.every_s, args.tail_s, args.apps, args.nodes, args.settle_s)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0 if r["holds"] else 1
    print(f"{len(r['kills'])} kills in {args.chaos_s:g} s (seed {args.seed}): "
          + ", ".join(f"{k['process']} at {k['at_s']:.1f} s (back in {k['down_s']:.2f} s)" for k in r["kills"]))
    q = r["requests"]
    print(f"requests sent {q['sent']}: answered {q['answered']}, failed explicitly "
          f"{sum(q['failed_explicitly'].values())} {q['failed_explicitly']}, lost {q['lost']}")
    for name, ok in r["checks"].items():
        print(f"  {name}: {'holds' if ok else 'DOES NOT HOLD'}")
    print(f"holds: {r['holds']}")
    return 0 if r["holds"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
