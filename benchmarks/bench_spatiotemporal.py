"""Dhakal Table III on the REAL CPU backend: temporal round robin against spatio-temporal scheduling with
Batch-Latency (papers/002 §IV-F), planned by ``perf.batchlatency`` from latency laws MEASURED on this host and
then executed for real with ONNX Runtime (CPUExecutionProvider).

Three single-model apps of different cost (zoo ``resnet18``, ``mobilenet_v2``, ``squeezenet1_1`` at
``--size`` pixels), in rounds of ``--round-ms`` (default 30 ms, the paper's round and deadline) with a deadline
of ``--deadline-ms`` from each round's start. An instance's share is its intra-op threads over the host's cores
(``runtime.dataplane.instances.threads_for``: on 2 cores share 0.5 is 1 thread, 1.0 is 2 threads).

1. **Laws.** Each model's batch latency (ms) for batches 1, 2, 4, ... ``--max-batch`` at share ``--share`` and
   at 1.0, ``--repeats`` timed runs each after warm-up, back to back (``--gap-ms`` idles before each run).
   The share's latencies are taken beside a co-runner on the rest of the device (``--law corun``, the
   default: zoo:resnet18 batches of 1 back to back, the heaviest neighbour here), as in a spatio-temporal
   round, or alone (``--law alone``); those at 1.0 alone, as in a temporal round. A ``BatchLaw``
   ``k1 * b + k2`` (ms) is fitted per share by least squares to the ``--plan-q`` percentile of each batch's
   latencies (default 90: planning on the median would put a batch sized to the deadline over it about half
   the time); the fit's worst relative error is printed. ``perf.batchlatency`` models a share as the
   whole-device law times one batch-independent stretch (``slowdown``); the measured stretch does depend on
   the batch, so the script adapts: each share gets its own ``ModelLaw`` whose law is the one fitted at
   that share and whose share curve is flat (stretch 1 there). The error the module's single-law form
   would make is printed too.
2. **Plans** (``perf.batchlatency``, from the measured laws): *temporal* (``temporal_rounds``): one model at a
   time with every thread, round robin, a fixed batch ``--temporal-batch`` per app (Triton's fixed batches in
   Table III); *temporal, Batch-Latency batches* (``temporal-bl``): the same, but each app in turn (heaviest
   first) at the largest batch (``batch_latency`` at share 1.0, at least 1) whose whole-device run fits an
   equal part of the round's time still free (a batched baseline, so that the spatio-temporal gain shown is
   not only batching); *spatio-temporal* (``spatiotemporal_round``): apps placed heaviest first at
   share ``--share``, each at the largest batch that ends by the deadline where its share is free.
3. **Execution**, ``--rounds`` rounds of each plan, for real: a plan's slots are grouped into lanes (slots
   that never overlap in the plan), one Python thread per lane (ONNX Runtime releases the GIL, so lanes run
   concurrently). Round r starts at ``t0 + r * round_ms`` (its frames' arrival) or, when the previous round
   overran, once every lane has finished it (a barrier); each slot starts at its planned offset from the
   round's start or when its lane's previous slot ends, whichever is later. Inputs are real tensors of the
   planned batch size. Per batch: latency (end - start, ms) and whether it ended after its frames' arrival +
   deadline (a miss: a round that overruns delays the next ones, so an over-full plan keeps missing); also
   counted: batches over the deadline from their round's actual start (whether the plan's timing held within
   the round) and rounds that started late. Throughput (req/s) = requests served / the run's span (at least
   rounds * round_ms); on-time throughput counts only the batches that met the deadline. A run that keeps
   pace serves exactly what its plan does, so its throughput equals the planned one; what the real CPU
   decides is whether the batches end in time (latencies, misses, on-time throughput).

Sessions are ``OrtInstances.make``'s, whose idle intra-op threads sleep instead of spinning (onnxruntime's
default spins: with several all-thread sessions taking turns on the cores, the one that just ran would keep
a core busy while the next runs).

Printed: the laws and plans; per app the planned batch, measured req/s (served and on time), planned and
measured batch latency p50/p95 (ms) and misses; per run the late rounds and in-round misses; the total
throughput ratio spatio-temporal / temporal beside the simulator's (``edgemux experiment
dhakal-spatiotemporal``: Table III's laws, computed here with the same functions) and the paper's (3x in the
text, 356 / 97 = 3.67x from Table III's sums); and the CPU cores other processes used during each phase
(``benchmarks/hostload.py``). Everything measured is labelled REAL CPU.

    .venv/bin/python benchmarks/bench_spatiotemporal.py [--quick] [--rounds 150] [--round-ms 30] [--json]

``--json`` prints the JSON report alone on stdout (the tables go to stderr); a bad argument prints one line
and exits with code 2. Timings on a shared host are noisy. Units: ms, req/s, cores.
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hostload import OthersMeter, print_report, wait_quiet  # beside this script  # noqa: E402

from edgemux.cluster.workload import BatchLaw  # noqa: E402
from edgemux.perf.batchlatency import (  # noqa: E402
    ModelLaw,
    PipelineApp,
    Schedule,
    Slot,
    batch_latency,
    spatiotemporal_round,
    temporal_rounds,
)

MODELS = ("resnet18", "mobilenet_v2", "squeezenet1_1")  # heaviest first: the spatio-temporal placement order
PAPER_TEXT_X = 3.0  # papers/002 §IV-F: "increases the throughput of the system by 3x"
PAPER_TABLE3_RPS = (67 + 15 + 15, 266 + 60 + 30)  # papers/002 Table III, throughput columns (temporal, Batch-Lat.)


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line on stderr and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"bench_spatiotemporal.py: error: {message}\n")


# ------------------------------------------------------------------------------------------- the laws

def _inputs(factory: Any, batch: int) -> dict[str, np.ndarray]:
    """Real input tensors of ``batch`` requests (the factory's seeded warm-up input, repeated)."""
    return {k: np.ascontiguousarray(np.repeat(v, batch, axis=0)) for k, v in factory.warm_inputs().items()}


def fit_law(points: Sequence[tuple[int, float]]) -> tuple[BatchLaw, float]:
    """Least-squares ``k1 * b + k2`` (ms) through ``(batch, ms)`` points, both coefficients >= 0 (refitted
    through the origin, or flat, when the free fit gives a negative one), and its worst relative error over
    the points (a fraction)."""
    b = np.array([p[0] for p in points], dtype=float)
    y = np.array([p[1] for p in points], dtype=float)
    if len(set(b.tolist())) >= 2:
        k1, k2 = (float(v) for v in np.polyfit(b, y, 1))
    else:
        k1, k2 = 0.0, float(y.mean())
    if k2 < 0:
        k1, k2 = float((b * y).sum() / (b * b).sum()), 0.0
    if k1 < 0:
        k1, k2 = 0.0, float(y.mean())
    law = BatchLaw(k1, k2)
    err = max(abs(law.batch_ms(int(bi)) - yi) / yi for bi, yi in zip(b, y))
    return law, float(err)


class _CoRunner:
    """While open, a second session runs ``zoo:resnet18`` batches of 1 back to back at the rest of the
    device (``1 - share``): the heaviest neighbour a share has in a spatio-temporal round here (47 MB of
    weights against a 32 MB L3; it slowed mobilenet_v2 more than mobilenet_v2 or squeezenet1_1 neighbours did,
    docs/results.md)."""

    def __init__(self, size: int, cores: int, share: float) -> None:
        from edgemux.runtime import zoo
        from edgemux.runtime.dataplane.instances import OrtInstances

        f = OrtInstances(zoo.path("resnet18", input_size=size), cores=cores, shared_weights=False)
        self.inst, self.x = f.make(1.0 - share), _inputs(f, 1)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="co-runner")

    def _loop(self) -> None:
        while not self.stop.is_set():
            self.inst.run(self.x)

    def __enter__(self) -> _CoRunner:
        self.thread.start()
        time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def _time(inst: Any, x: dict[str, np.ndarray], repeats: int, gap_s: float = 0.0) -> list[float]:
    """``repeats`` latencies (ms) of ``inst`` on ``x``, each after ``gap_s`` seconds of idling."""
    for _ in range(2):
        inst.run(x)  # warm: allocators, caches
    ts = []
    for _ in range(repeats):
        if gap_s > 0:
            time.sleep(gap_s)
        t = time.perf_counter()
        inst.run(x)
        ts.append((time.perf_counter() - t) * 1e3)
    return ts


def measure_laws(models: Sequence[str], size: int, cores: int, shares: Sequence[float], batches: Sequence[int],
                 repeats: int, plan_q: float, corun: bool = True, gap_s: float = 0.0
                 ) -> tuple[list[dict[str, Any]], dict[tuple[str, float], Any]]:
    """Each model's batch latency (ms) per share and batch, alone and (shares < 1) beside a co-runner on the
    rest of the device (:class:`_CoRunner`); the law fitted per share (to the co-run latencies when
    ``corun``, else to those alone); and the ONNX Runtime instances (one per model and share) the execution
    reuses (``OrtInstances.make``'s sessions)."""
    from edgemux.runtime import zoo
    from edgemux.runtime.dataplane.instances import OrtInstances, threads_for

    rows, instances = [], {}
    for name in models:
        factory = OrtInstances(zoo.path(name, input_size=size), cores=cores, shared_weights=False)
        row: dict[str, Any] = {"model": f"zoo:{name}@{size}", "name": name, "optimization": factory.optimization,
                               "shares": []}
        for share in shares:
            inst = factory.make(share)
            instances[(name, share)] = (inst, factory)
            points: list[dict[str, Any]] = []
            for b in batches:
                x = _inputs(factory, b)
                alone = _time(inst, x, repeats, gap_s)
                pt = {"batch": b, "alone_p50_ms": float(np.percentile(alone, 50))}
                used = alone
                if share < 1.0:
                    with _CoRunner(size, cores, share):
                        co = _time(inst, x, repeats, gap_s)
                    pt["corun_p50_ms"] = float(np.percentile(co, 50))
                    used = co if corun else alone
                pt.update(p50_ms=float(np.percentile(used, 50)), plan_ms=float(np.percentile(used, plan_q)))
                points.append(pt)
            law, err = fit_law([(p["batch"], p["plan_ms"]) for p in points])
            row["shares"].append({"share": share, "threads": threads_for(share, cores), "points": points,
                                  "k1_ms": law.k1_ms, "k2_ms": law.k2_ms, "fit_max_rel_err": err})
        rows.append(row)
    return rows, instances


def _law(row: dict[str, Any], share: float) -> BatchLaw:
    s = next(x for x in row["shares"] if x["share"] == share)
    return BatchLaw(s["k1_ms"], s["k2_ms"])


def model_law_at(name: str, law: BatchLaw, share: float, max_batch: int) -> ModelLaw:
    """The adapter: a ``ModelLaw`` whose ``law`` is the one measured AT ``share`` and whose curve is flat
    there, so ``perf.batchlatency.batch_ms(m, b, share)`` is exactly the measured law at that share."""
    curve = () if share == 1.0 else ((share, 1.0), (1.0, 1.0))
    return ModelLaw(name, law, curve, share, max_batch)


def single_law_error(row: dict[str, Any], share: float) -> float:
    """How far (a fraction, signed) the module's own form, whole-device law x one stretch read at batch 1,
    is from the measured law at ``share`` at the largest batch (what the adapter avoids)."""
    full, part = _law(row, 1.0), _law(row, share)
    b = max(p["batch"] for p in row["shares"][0]["points"])
    stretch = part.batch_ms(1) / full.batch_ms(1)
    return full.batch_ms(b) * stretch / part.batch_ms(b) - 1.0


# ------------------------------------------------------------------------------------------- the plans

def plans(laws: list[dict[str, Any]], share: float, temporal_batch: int, max_batch: int, round_ms: float,
          deadline_ms: float, rounds: int) -> dict[str, Schedule]:
    """The three schedules of the module docstring, from the measured laws."""
    full = {r["name"]: model_law_at(r["name"], _law(r, 1.0), 1.0, max_batch) for r in laws}
    part = {r["name"]: model_law_at(r["name"], _law(r, share), share, max_batch) for r in laws}
    limit = min(round_ms, deadline_ms)
    t_apps = [PipelineApp.single(full[r["name"]], temporal_batch) for r in laws]
    bl, left = [], limit
    for i, r in enumerate(laws):  # each in turn: the largest batch within an equal part of the time still free
        m = full[r["name"]]
        b = max(1, batch_latency([m], 1.0, max(left / (len(laws) - i), 1e-6))[0])
        bl.append(b)
        left -= m.law.batch_ms(b)
    tb_apps = [PipelineApp.single(full[r["name"]], b) for r, b in zip(laws, bl)]
    st_apps = [PipelineApp.single(part[r["name"]]) for r in laws]
    return {"temporal": temporal_rounds(t_apps, rounds=rounds, round_ms=round_ms, deadline_ms=deadline_ms),
            "temporal-bl": temporal_rounds(tb_apps, rounds=rounds, round_ms=round_ms, deadline_ms=deadline_ms),
            "spatio-temporal": spatiotemporal_round(st_apps, round_ms=round_ms, deadline_ms=deadline_ms)}


def lanes(slots: Sequence[Slot]) -> list[list[Slot]]:
    """Slots of one round grouped so that a lane's slots never overlap (earliest start first, each into the
    first lane free by then): the threads that run the round."""
    out: list[list[Slot]] = []
    for s in sorted(slots, key=lambda s: (s.start_ms, s.end_ms)):
        lane = next((ln for ln in out if ln[-1].end_ms <= s.start_ms + 1e-6), None)
        if lane is None:
            out.append([s])
        else:
            lane.append(s)
    return out


# ------------------------------------------------------------------------------------------- execution

def execute(sched: Schedule, instances: dict[tuple[str, float], Any], rounds: int) -> dict[str, Any]:
    """Run ``rounds`` rounds of ``sched`` for real (see the module docstring): per app its batches' latency
    (ms), deadline misses, requests and throughput (req/s) over the run's span (s)."""
    per_round = [sched.rounds[r % len(sched.rounds)] for r in range(rounds)]
    # one lane layout for the whole run: every round's slots, lane by lane (a temporal plan is one lane)
    layouts = [lanes(slots) for slots in per_round]
    n_lanes = max((len(x) for x in layouts), default=0)
    inputs: dict[tuple[str, int], dict[str, np.ndarray]] = {}
    for slots in per_round:
        for s in slots:
            if (s.model, s.batch) not in inputs:
                inputs[(s.model, s.batch)] = _inputs(instances[(s.model, s.share)][1], s.batch)
    # app, round, batch, start, end, the round's scheduled start (its frames' arrival), its actual start
    records: list[tuple[str, int, int, float, float, float, float]] = []
    lock = threading.Lock()
    round_s, deadline_s = sched.round_ms / 1e3, sched.deadline_ms / 1e3
    t0 = time.perf_counter() + 0.05
    starts = [0.0] * rounds
    nxt = [0]

    def begin_round() -> None:  # run by one lane once every lane has finished the previous round
        r = nxt[0]
        starts[r] = max(t0 + r * round_s, time.perf_counter())
        nxt[0] = r + 1

    barrier = threading.Barrier(max(1, n_lanes), action=begin_round)

    def lane_worker(k: int) -> None:
        mine = []
        for r, layout in enumerate(layouts):
            barrier.wait()
            start = starts[r]
            for s in layout[k] if k < len(layout) else []:
                delay = start + s.start_ms / 1e3 - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                a = time.perf_counter()
                instances[(s.model, s.share)][0].run(inputs[(s.model, s.batch)])
                mine.append((s.app, r, s.batch, a, time.perf_counter(), t0 + r * round_s, start))
        with lock:
            records.extend(mine)

    threads = [threading.Thread(target=lane_worker, args=(k,), name=f"lane-{k}") for k in range(n_lanes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    last = max((r[4] for r in records), default=t0)
    span_s = max(rounds * round_s, last - t0)
    apps: list[dict[str, Any]] = []
    for a in sched.apps:
        mine = [r for r in records if r[0] == a.app]
        lat = np.array([(r[4] - r[3]) * 1e3 for r in mine]) if mine else np.zeros(0)
        reqs = sum(r[2] for r in mine)
        batches = sorted({r[2] for r in mine})
        on_time = sum(r[2] for r in mine if r[4] - r[5] <= deadline_s)
        planned = sorted({round(s.end_ms - s.start_ms, 3) for slots in per_round for s in slots if s.app == a.app})
        apps.append({
            "app": a.app, "planned_batch": batches[0] if len(batches) == 1 else batches,
            "planned_batch_per_round": a.batch_per_round, "planned_rps": a.throughput_rps,
            "planned_ms": planned[0] if len(planned) == 1 else planned,
            "batches_run": len(mine), "requests": reqs, "rps": reqs / span_s, "on_time_rps": on_time / span_s,
            "p50_ms": float(np.percentile(lat, 50)) if lat.size else None,
            "p95_ms": float(np.percentile(lat, 95)) if lat.size else None,
            "misses": sum(1 for r in mine if r[4] - r[5] > deadline_s),
            "in_round_misses": sum(1 for r in mine if r[4] - r[6] > deadline_s),
            "worst_finish_ms": max(((r[4] - r[5]) * 1e3 for r in mine), default=None)})
    total = sum(x["requests"] for x in apps)
    done: dict[int, int] = {}  # round -> batches run in it
    for rec in records:
        done[rec[1]] = done.get(rec[1], 0) + 1
    return {"kind": sched.kind, "rounds": rounds, "lanes": n_lanes, "span_s": span_s,
            "rounds_executed": sum(1 for r, slots in enumerate(per_round) if done.get(r, 0) == len(slots)),
            "batches_planned": sum(len(slots) for slots in per_round), "total_rps": total / span_s,
            "planned_total_rps": sched.total_rps, "misses": sum(x["misses"] for x in apps),
            "on_time_rps": sum(x["on_time_rps"] for x in apps),
            "in_round_misses": sum(x["in_round_misses"] for x in apps),
            "late_rounds": sum(1 for r in range(rounds) if starts[r] > t0 + r * round_s + 1e-3),
            "batches": len(records), "apps": apps}


def plan_json(sched: Schedule) -> dict[str, Any]:
    return {"kind": sched.kind, "round_ms": sched.round_ms, "deadline_ms": sched.deadline_ms,
            "planned_total_rps": sched.total_rps,
            "slots": [[{"app": s.app, "model": s.model, "batch": s.batch, "share": s.share, "start_ms": s.start_ms,
                        "end_ms": s.end_ms} for s in slots] for slots in sched.rounds[:2]],
            "apps": [{"app": a.app, "batch_per_round": a.batch_per_round, "planned_rps": a.throughput_rps,
                      "rounds_served": a.rounds_served} for a in sched.apps]}


def simulator_ratio() -> dict[str, float]:
    """What ``edgemux experiment dhakal-spatiotemporal`` computes: Table III's apps (laws fitted to the paper's
    cells) through the same two schedulers (req/s)."""
    from edgemux.experiments.dhakal import DEADLINE_MS, ROUND_MS, table3_apps

    apps, _ = table3_apps()
    t = temporal_rounds(apps, rounds=120, round_ms=ROUND_MS, deadline_ms=DEADLINE_MS)
    st = spatiotemporal_round(apps, round_ms=ROUND_MS, deadline_ms=DEADLINE_MS)
    return {"temporal_rps": t.total_rps, "spatiotemporal_rps": st.total_rps, "ratio": st.total_rps / t.total_rps}


# ------------------------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    ap = _Parser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small inputs, few repeats and rounds (for tests)")
    ap.add_argument("--rounds", type=int, default=150, help="rounds executed per schedule")
    ap.add_argument("--round-ms", type=float, default=30.0, help="round length (ms); the paper's 30")
    ap.add_argument("--deadline-ms", type=float, default=None, help="deadline from a round's start (ms); "
                    "default the round")
    ap.add_argument("--share", type=float, default=0.5, help="each model's share in spatio-temporal, in (0, 1)")
    ap.add_argument("--temporal-batch", type=int, default=1, help="the fixed batch of temporal round robin")
    ap.add_argument("--max-batch", type=int, default=8, help="largest batch measured and planned")
    ap.add_argument("--size", type=int, default=112, help="input size (pixels)")
    ap.add_argument("--repeats", type=int, default=15, help="timed runs per model, share and batch")
    ap.add_argument("--plan-q", type=float, default=90.0, help="percentile of the latencies the laws fit (50-100)")
    ap.add_argument("--law", choices=("corun", "alone"), default="corun",
                    help="fit a share's law to its latencies beside a co-runner (corun) or alone")
    ap.add_argument("--gap-ms", type=float, default=0.0, help="idle time (ms) before each timed run of a law")
    ap.add_argument("--wait-quiet", type=float, default=0.0, help="wait up to this many s for a lull first")
    ap.add_argument("--json", action="store_true", help="the JSON report alone on stdout, tables on stderr")
    args = ap.parse_args(argv)
    deadline = args.round_ms if args.deadline_ms is None else args.deadline_ms
    checks = [("--rounds", args.rounds >= 1, "an integer >= 1"),
              ("--round-ms", math.isfinite(args.round_ms) and args.round_ms > 0, "a number > 0"),
              ("--deadline-ms", math.isfinite(deadline) and 0 < deadline <= args.round_ms,
               "a number in (0, round-ms]"),
              ("--share", math.isfinite(args.share) and 0 < args.share < 1, "a number in (0, 1)"),
              ("--temporal-batch", args.temporal_batch >= 1, "an integer >= 1"),
              ("--max-batch", 1 <= args.max_batch <= 64, "an integer in [1, 64]"),
              ("--size", 32 <= args.size <= 512, "an integer in [32, 512] (pixels)"),
              ("--repeats", args.repeats >= 3, "an integer >= 3"),
              ("--plan-q", math.isfinite(args.plan_q) and 50 <= args.plan_q <= 100, "a number in [50, 100]"),
              ("--gap-ms", math.isfinite(args.gap_ms) and 0 <= args.gap_ms <= 1000, "a number in [0, 1000]"),
              ("--wait-quiet", math.isfinite(args.wait_quiet) and args.wait_quiet >= 0, "a number >= 0 (s)")]
    for name, ok, what in checks:
        if not ok:
            ap.error(f"{name} must be {what}, got {getattr(args, name[2:].replace('-', '_'))}")
    if args.quick:
        args.rounds, args.size, args.repeats, args.max_batch = min(args.rounds, 12), 64, 3, min(args.max_batch, 4)
    args.deadline_ms = deadline
    return print_report(lambda: _run(args), args.json)


def _div(a: float, b: float) -> float | None:
    """a / b, or None when b is under 1 req/s (a ratio to almost nothing says nothing)."""
    return a / b if b >= 1.0 else None


def _ratio(x: float | None) -> str:
    return "n/a (the baseline met almost no deadline)" if x is None else f"{x:.2f}x"


def _fmt_batch(b: Any) -> str:
    return "/".join(str(x) for x in b) if isinstance(b, list) else str(b)


def _run(args: argparse.Namespace) -> dict[str, Any]:
    import onnxruntime as ort

    from edgemux.runtime.dataplane.instances import cpu_cores
    from edgemux.runtime.tools.profiler import cpu_model

    cores = cpu_cores()
    waited = wait_quiet(args.wait_quiet) if args.wait_quiet > 0 else None
    print(f"REAL CPU: onnxruntime {ort.__version__} (CPUExecutionProvider) on {platform.node()} / "
          f"{cpu_model() or 'unknown CPU'}, {cores} cores; a share runs max(1, round(share x {cores})) threads")
    if waited is not None:
        print(f"waited {waited[0]:.1f} s for a lull (others then used {waited[1]} cores)")
    report: dict[str, Any] = {"onnxruntime": ort.__version__, "cores": cores, "cpu": cpu_model(),
                              "args": {k: v for k, v in vars(args).items() if k != "json"}, "load": {}}
    whole = OthersMeter()
    batches = sorted({b for b in (1, 2, 4, 8, 16, 32, 64) if b <= args.max_batch} | {args.max_batch})
    shares = [args.share, 1.0]

    print(f"\n(1) REAL CPU batch latency (ms), {args.repeats} runs each ({args.gap_ms:g} ms idle before each), "
          f"share {args.share:g} "
          f"{'beside a co-runner (zoo:resnet18 b1 on the rest)' if args.law == 'corun' else 'alone'}, share 1 "
          f"alone; law k1*b + k2 fitted to the p{args.plan_q:g} per share")
    load = OthersMeter()
    laws, instances = measure_laws(MODELS, args.size, cores, shares, batches, args.repeats, args.plan_q,
                                   corun=args.law == "corun", gap_s=args.gap_ms / 1e3)
    report["laws"] = laws
    report["load"]["laws"] = load.cores()
    for r in laws:
        for s in r["shares"]:
            pts = ", ".join(f"b{p['batch']} {p['p50_ms']:.2f}/{p['plan_ms']:.2f}" for p in s["points"])
            if s["share"] < 1.0:
                co = s["points"][-1]
                pts += (f" (b{co['batch']} p50 alone {co['alone_p50_ms']:.2f}, beside the co-runner "
                        f"{co['corun_p50_ms']:.2f})")
            print(f"  {r['model']} share {s['share']:g} ({s['threads']} thr): p50/p{args.plan_q:g} {pts}; "
                  f"law {s['k1_ms']:.3f}*b + {s['k2_ms']:.3f} ms, worst fit error {100 * s['fit_max_rel_err']:.1f} %")
        r["single_law_error"] = single_law_error(r, args.share)
        print(f"    perf.batchlatency's form (whole-device law x stretch at b=1) at share {args.share:g}, b="
              f"{batches[-1]}: {100 * r['single_law_error']:+.1f} % vs the law measured there")

    scheds = plans(laws, args.share, args.temporal_batch, args.max_batch, args.round_ms, args.deadline_ms,
                   args.rounds)
    report["plans"] = {k: plan_json(s) for k, s in scheds.items()}
    print(f"\n(2) plans (perf.batchlatency, measured laws): round {args.round_ms:g} ms, deadline "
          f"{args.deadline_ms:g} ms")
    for k, s in scheds.items():
        slots = "; ".join(f"{x.model} b{x.batch} @{x.share:g} {x.start_ms:.1f}-{x.end_ms:.1f}" for x in s.rounds[0])
        print(f"  {k:>15}: round 0: {slots}; planned {s.total_rps:.1f} req/s")

    print(f"\n(3) REAL CPU execution, {args.rounds} rounds each")
    report["runs"] = {}
    for k, s in scheds.items():
        load = OthersMeter()
        run = execute(s, instances, args.rounds)
        run["others_cores"] = load.cores()
        report["runs"][k] = run
        oc = run["others_cores"]
        print(f"  {k} ({run['lanes']} lane(s), {run['span_s']:.2f} s, other processes "
              f"{'?' if oc is None else f'{oc:.2f}'} cores):")
        print(f"    {'app':>14} {'batch':>7} {'plan req/s':>10} {'req/s':>8} {'on time':>8} {'plan ms':>8} "
              f"{'p50 ms':>7} {'p95 ms':>7} {'misses':>9} {'worst end ms':>12}")
        for a in run["apps"]:
            p50 = "-" if a["p50_ms"] is None else f"{a['p50_ms']:.2f}"
            p95 = "-" if a["p95_ms"] is None else f"{a['p95_ms']:.2f}"
            worst = "-" if a["worst_finish_ms"] is None else f"{a['worst_finish_ms']:.1f}"
            pms = _fmt_batch(a["planned_ms"]) if isinstance(a["planned_ms"], list) else f"{a['planned_ms']:.1f}"
            print(f"    {a['app']:>14} {_fmt_batch(a['planned_batch']):>7} {a['planned_rps']:>10.1f} "
                  f"{a['rps']:>8.1f} {a['on_time_rps']:>8.1f} {pms:>8} {p50:>7} {p95:>7} "
                  f"{a['misses']:>4}/{a['batches_run']:<4} {worst:>12}")
        print(f"    {'total':>14} {'':>7} {run['planned_total_rps']:>10.1f} {run['total_rps']:>8.1f} "
              f"{run['on_time_rps']:>8.1f}   misses {run['misses']}/{run['batches']}; rounds that started over 1 ms "
              f"late (the previous overran) {run['late_rounds']}/{run['rounds']}; batches over the deadline from "
              f"their round's actual start {run['in_round_misses']}")

    runs = report["runs"]
    sim = simulator_ratio()
    paper_t, paper_b = PAPER_TABLE3_RPS
    st_run = runs["spatio-temporal"]
    ratios = {"real_vs_temporal": st_run["total_rps"] / runs["temporal"]["total_rps"],
              "real_vs_temporal_bl": st_run["total_rps"] / runs["temporal-bl"]["total_rps"],
              "on_time_vs_temporal": _div(st_run["on_time_rps"], runs["temporal"]["on_time_rps"]),
              "on_time_vs_temporal_bl": _div(st_run["on_time_rps"], runs["temporal-bl"]["on_time_rps"]),
              "planned_vs_temporal": scheds["spatio-temporal"].total_rps / scheds["temporal"].total_rps,
              "planned_vs_temporal_bl": scheds["spatio-temporal"].total_rps / scheds["temporal-bl"].total_rps,
              "simulator": sim["ratio"], "paper_text": PAPER_TEXT_X, "paper_table3": paper_b / paper_t}
    report["ratios"] = ratios
    report["simulator"] = sim
    print("\n(4) total throughput, spatio-temporal / temporal")
    print(f"  REAL CPU, measured: {ratios['real_vs_temporal']:.2f}x vs temporal (batch {args.temporal_batch}); "
          f"{ratios['real_vs_temporal_bl']:.2f}x vs temporal with Batch-Latency batches")
    print(f"  REAL CPU, on time (batches that met the deadline): {_ratio(ratios['on_time_vs_temporal'])}; "
          f"{_ratio(ratios['on_time_vs_temporal_bl'])}")
    print(f"  REAL CPU laws, as planned: {ratios['planned_vs_temporal']:.2f}x; "
          f"{ratios['planned_vs_temporal_bl']:.2f}x")
    print(f"  simulator (Table III laws, edgemux experiment dhakal-spatiotemporal): {sim['spatiotemporal_rps']:.1f}"
          f" / {sim['temporal_rps']:.1f} = {sim['ratio']:.2f}x")
    print(f"  paper: {PAPER_TEXT_X:g}x (text, §IV-F); Table III sums {paper_b} / {paper_t} = "
          f"{ratios['paper_table3']:.2f}x (GPU)")
    report["load"]["whole"] = whole.cores()
    oc = report["load"]["whole"]
    print(f"\nother processes used {'?' if oc is None else f'{oc:.2f}'} of {cores} cores on average during this run")
    return report


if __name__ == "__main__":
    sys.exit(main())
