"""Moving an app under load without losing a request: make-before-break through the gateway.

A local cluster (``examples/move/cluster.yaml``: two nodes with two EMULATED Edge TPUs each, service times from
the Ibis Edge TPU profiles) runs as ordinary processes (control plane, gateway, one agent per node: the local
engine). One app (mobilenet_v2, a camera: periodic frames at its contracted frame rate) is admitted and offered
open-loop load through the gateway while it is moved twice with ``POST /v1/apps/{app}/move`` (what ``edgemux move`` sends):

1. between the two devices of its node (same agent: it loads the model on the new device before it releases
   the old one),
2. to a device of the other node (the new agent loads and says ready, the routes switch in the gateway, the
   old agent keeps serving for the drain grace and then unloads).

It prints, for the windows before the first move, during each move (from the call to its answer), between
them and after the second: requests sent, failed, p50/p99 latency (ms); the longest gap between two answers
(ms) in each window and overall; and the number of failed requests, the figure that must be 0.

    .venv/bin/python benchmarks/bench_move.py [--rate 30] [--phase-s 4] [--seed 0] [--quick] [--json]

Periodic frames, not Poisson: offered at exactly its contracted rate, a Poisson stream keeps the gateway's
token bucket critically loaded, so its policing waits grow through the run whether or not the app moves, and
some requests are refused 429 (contract policing doing its job); a camera's frames fit its contract.

Units: ms, s, req/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from edgemux.engines.local import Engine
from edgemux.errors import EdgemuxError
from edgemux.runtime.controlplane.apiclient import ControlPlaneClient, call
from edgemux.runtime.controlplane.messages import MoveRequest, MoveTarget
from edgemux.runtime.tools.load import LoadReport, run_load

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "examples" / "move" / "cluster.yaml"
APP = "moving-cam"
SLO_MS = 50.0


def _wait(cond: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench_move: {what} not reached within {timeout_s:g} s")
        time.sleep(0.05)


def _stats(rep: LoadReport, lo_ms: float, hi_ms: float) -> dict[str, Any]:
    """Requests sent in [lo_ms, hi_ms) of the run: counts, p50/p99 of the ok ones, and the longest gap (ms)
    between two consecutive answers that arrived in that window."""
    sent = (rep.offsets_ms >= lo_ms) & (rep.offsets_ms < hi_ms)
    ok_idx = np.flatnonzero(rep.ok_mask)
    ok_sent = (rep.offsets_ms[ok_idx] >= lo_ms) & (rep.offsets_ms[ok_idx] < hi_ms)
    lat = rep.latencies_ms[ok_sent]
    done = np.sort(rep.done_ms[(rep.done_ms >= lo_ms) & (rep.done_ms < hi_ms)])
    return {"sent": int(sent.sum()), "failed": int(sent.sum() - ok_sent.sum()),
            "p50_ms": float(np.percentile(lat, 50)) if lat.size else None,
            "p99_ms": float(np.percentile(lat, 99)) if lat.size else None,
            "longest_gap_ms": float(np.diff(done).max()) if done.size > 1 else None}


async def _drive(gateway: str, cp: ControlPlaneClient, rate: float, phase_s: float, seed: int, targets: list[str],
                 key: str | None) -> tuple[LoadReport, list[dict[str, Any]]]:
    """The load and, concurrently, the two moves: each ``phase_s`` after the previous one ended."""
    move_allowance_s = 8.0  # what the two moves may take (load, switch, 1 s drain each); the load outlasts them
    duration = 3 * phase_s + move_allowance_s
    load = asyncio.create_task(run_load(gateway, APP, rate_rps=rate, duration_s=duration, seed=seed,
                                        arrivals="periodic", slo_ms=SLO_MS, slo_stat="p99", timeout_s=10.0,
                                        key=key))
    moves = []
    loop = asyncio.get_running_loop()
    start = time.perf_counter()
    for target in targets:
        await asyncio.sleep(max(0.0, start + phase_s - time.perf_counter()))
        t0 = time.perf_counter()
        try:
            moved = await loop.run_in_executor(None, cp.move, APP, MoveRequest((MoveTarget(target),)))
        except EdgemuxError as e:
            load.cancel()
            raise SystemExit(f"bench_move: move to {target}: {e}") from None
        t1 = time.perf_counter()
        moves.append({"to": target, "t0": t0, "t1": t1, "steps_s": moved.steps_s})
        start = t1
    rep = await load
    if start + phase_s > rep.start_perf_s + duration:
        raise SystemExit("bench_move: the moves took longer than the load lasted; raise move_allowance_s")
    return rep, moves


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=30.0, help="the app's frame rate, contracted and offered (fps)")
    ap.add_argument("--phase-s", type=float, default=4.0, help="load before, between and after the moves (s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="short phases (1.5 s): a smoke run")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    args = ap.parse_args(argv)
    phase_s = 1.5 if args.quick else args.phase_s
    out: dict[str, Any] = {"cluster": str(CLUSTER.relative_to(ROOT)), "app": APP, "rate_rps": args.rate,
                           "devices": "emulated Edge TPUs (profiles ibis-edgetpu)"}
    with Engine(CLUSTER, auto_profile=False, heartbeat_s=0.5) as eng:
        assert eng.controlplane_url and eng.gateway_url
        cp, gw = eng.client(timeout_s=120.0), eng.gateway_url
        spec = (f"apiVersion: edgemux/v1alpha1\nkind: App\nmetadata: {{name: {APP}}}\n"
                f"spec: {{model: mobilenet_v2, fps: {args.rate:g}, burst: 5, slo: {{latencyMs: {SLO_MS:g}, "
                f"stat: p99}}}}\n")
        applied = cp.apply(spec.encode())
        if applied.rejected or applied.http_status != 201:
            raise SystemExit(f"bench_move: apply answered {applied.http_status}: {applied.to_json()}")
        if cp.wait_ready([APP], 60.0, poll_s=0.05):
            raise SystemExit("bench_move: app ready not reached within 60 s")
        _wait(lambda: APP in call("GET", f"{gw}/v1/routes", token=eng.token).body.get("routes", {}), 30,
              "route at the gateway")
        (first,) = cp.describe(APP)["placement"]["pieces"]
        node, dev = first["device"].split("/")
        other_dev = "tpu1" if dev == "tpu0" else "tpu0"
        other_node = "edge-2" if node == "edge-1" else "edge-1"
        targets = [f"{node}/{other_dev}", f"{other_node}/tpu0"]
        out["placements"] = [first["device"], *targets]
        rep, moves = asyncio.run(_drive(gw, cp, args.rate, phase_s, args.seed, targets, applied.results[0].key))
        final = cp.describe(APP)["placement"]["pieces"]
        out["final_placement"] = [p["device"] for p in final]
    t = [(m["t0"] - rep.start_perf_s) * 1000.0 for m in moves] + [(m["t1"] - rep.start_perf_s) * 1000.0 for m in moves]
    m1a, m2a, m1b, m2b = t[0], t[1], t[2], t[3]
    end = float(rep.offsets_ms.max()) + 1.0 if rep.offsets_ms.size else 0.0
    windows = [("before", 0.0, m1a), ("move 1 (same node)", m1a, m1b), ("between", m1b, m2a),
               ("move 2 (other node)", m2a, m2b), ("after", m2b, end)]
    out["windows"] = [{"window": name, "from_ms": round(lo, 1), "to_ms": round(hi, 1), **_stats(rep, lo, hi)}
                      for name, lo, hi in windows]
    out["moves"] = [{"to": m["to"], "took_s": round(m["t1"] - m["t0"], 3), "steps_s": m["steps_s"]} for m in moves]
    done = np.sort(rep.done_ms)
    out["requests"] = rep.sent
    out["failed"] = rep.failed
    out["errors"] = dict(rep.errors)
    out["longest_gap_ms"] = float(np.diff(done).max()) if done.size > 1 else None
    out["mean_interarrival_ms"] = 1000.0 / args.rate
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"bench_move: app {APP} (mobilenet_v2, {args.rate:g} fps periodic, SLO p99 {SLO_MS:g} ms) on "
              f"{out['devices']}; load through the gateway")
        print(f"placements: {' -> '.join(out['placements'])} (final: {', '.join(out['final_placement'])})")
        print(f"{'window':<22}{'sent':>7}{'failed':>8}{'p50 ms':>9}{'p99 ms':>9}{'longest gap ms':>16}")
        for w in out["windows"]:
            f = (lambda x: "-" if x is None else f"{x:.1f}")
            print(f"{w['window']:<22}{w['sent']:>7}{w['failed']:>8}{f(w['p50_ms']):>9}{f(w['p99_ms']):>9}"
                  f"{f(w['longest_gap_ms']):>16}")
        for m in out["moves"]:
            steps = ", ".join(f"{k} {v:.3f}" for k, v in m["steps_s"].items())
            print(f"move to {m['to']}: {m['took_s']:.3f} s ({steps})")
        print(f"longest gap between two answers: {out['longest_gap_ms']:.1f} ms (frame interval "
              f"{out['mean_interarrival_ms']:.1f} ms)")
        print(f"failed requests: {rep.failed} of {rep.sent} {dict(rep.errors) or ''}".rstrip())
    return 0 if rep.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
