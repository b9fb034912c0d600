"""Spatial sharing on the REAL CPU backend (ONNX Runtime): knee curves, instances at the knee, shared weights,
and a share change under load with and without overlap (Dhakal et al., papers/002 §IV-B to §IV-E).

Everything runs for real on this host's CPU with onnxruntime; an instance's share is its intra-op threads over
the host's cores (``threads = max(1, round(share * cores))``). In one run it prints:

(a) the share curve (median ms of batch-1 requests alone at shares 0.25, 0.5, 1.0) of two zoo models and
    their knee (``perf.spatial.knee``), or why a measured curve is not a valid (non-increasing) curve;
(b) throughput (req/s) of 1 instance with every core's thread vs 1, 2 and 4 instances at 1 thread each
    (the knee of a 2-core host's smallest share). Method: closed-loop saturation with exactly one request
    outstanding per instance (every instance always busy, nothing queues), for ``--seconds`` per
    configuration; p95 is the request latency (ms) there. The SLO is ``--slo-x`` times the 1-instance,
    all-threads median, and each row says whether its p95 meets it. Instances beyond the cores oversubscribe
    the CPU (4 x 1 thread on 2 cores): labelled so;
(c) resident memory (MB, VmRSS in a fresh child process per configuration) of 1 and 4 instances of a model
    with large weights (resnet18) with and without one shared copy of the weights;
(d) a share change under open-loop Poisson load (``--rate`` req/s): 2 x 0.5 -> 1 x 1.0 -> 2 x 0.5, once with
    overlap (shadow instances built and warmed while the old serve) and once without (stop, drain, rebuild).
    Failed requests (must be 0), the pool's ``unavailable_ms`` (time no instance could take a request: the
    downtime; target <= 1 ms with overlap), and the longest gap between consecutive answers during each
    change vs the steady state's (at a rate r the answers' gaps are at least the arrivals', ~1000/r ms on
    average, so the answer gap shows a downtime only when it is much larger than the steady one).

    .venv/bin/python benchmarks/bench_spatial.py [--quick] [--seconds 3] [--rate 40] [--json]

Timings on a shared host are noisy; the host's other CPU use during the run is printed. Units: ms, req/s, MB.
"""

from __future__ import annotations

import argparse
import platform
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hostload import OthersMeter, exit_unless_positive, print_report  # benchmarks/hostload.py  # noqa: E402

from edgemux.perf.spatial import knee  # noqa: E402
from edgemux.runtime import zoo  # noqa: E402
from edgemux.runtime.dataplane.backends import ModelSource  # noqa: E402
from edgemux.runtime.dataplane.instances import (  # noqa: E402
    InstanceFactory,
    InstancePool,
    OrtInstances,
    cpu_cores,
    measure_memory,
)
from edgemux.runtime.tools.profiler import cpu_model, profile_share_curves  # noqa: E402


def _curves(models: list[tuple[str, int]], repeats: int, cores: int) -> list[dict[str, Any]]:
    sources = [ModelSource(zoo=m, input_size=s) for m, s in models]
    out = []
    for c in profile_share_curves(sources, [0.25, 0.5, 1.0], cores, warmup=3, repeats=repeats):
        row: dict[str, Any] = {"model": c.source, "points": [list(p) for p in c.points], "threads": list(c.threads)}
        row["knee"] = knee(c.curve) if c.curve is not None else None
        row["problem"] = c.problem
        out.append(row)
    return out


def closed_loop(pool: InstancePool, inputs: dict[str, np.ndarray], seconds: float) -> dict[str, Any]:
    """One outstanding request per instance for ``seconds`` (s): throughput (req/s) and latency percentiles
    (ms)."""
    lat: list[float] = []
    lock = threading.Lock()
    stop = time.perf_counter() + seconds

    def client() -> None:
        while time.perf_counter() < stop:
            r = pool.submit(inputs).result()
            with lock:
                lat.append(r.queue_ms + r.service_ms)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(pool.instances)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    span = time.perf_counter() - t0
    xs = np.asarray(lat)
    return {"rps": len(xs) / span, "p50_ms": float(np.percentile(xs, 50)), "p95_ms": float(np.percentile(xs, 95)),
            "requests": len(xs)}


def _throughput(model: str, size: int, cores: int, seconds: float, slo_x: float) -> dict[str, Any]:
    path = zoo.path(model, input_size=size)
    configs = [(1, cores, False), (1, 1, False), (2, 1, False), (4, 1, False), (2, 1, True), (4, 1, True)]
    factories = {False: OrtInstances(path, cores=cores, shared_weights=False),
                 True: OrtInstances(path, cores=cores, shared_weights=True)}
    inputs = factories[False].warm_inputs()
    rows = []
    for k, threads, shared in configs:
        f = factories[shared]
        pool = InstancePool(f, share=threads / cores, instances=k, name=f"bench-{k}x{threads}")
        closed_loop(pool, inputs, min(0.5, seconds / 4))  # warm caches and allocators, untimed
        r = closed_loop(pool, inputs, seconds)
        pool.close()
        r.update(instances=k, threads=threads, shared=shared, optimization=f.optimization,
                 oversubscribed=k * threads > cores)
        rows.append(r)
    base = rows[0]
    slo = slo_x * base["p50_ms"]
    for r in rows:
        r["vs_all_threads"] = r["rps"] / base["rps"]
        r["meets_slo"] = r["p95_ms"] <= slo
    return {"model": f"zoo:{model}@{size}", "slo_ms": slo, "rows": rows}


def _memory(model: str, size: int) -> list[dict[str, Any]]:
    path = zoo.path(model, input_size=size)
    out = []
    for k in (1, 4):
        for shared, opt in ((False, "all"), (False, "extended"), (True, "extended")):
            out.append(measure_memory(path, k, shared, optimization=opt).as_dict())
    return out


def share_change(f: InstanceFactory, rate: float, phase_s: float, overlap: bool, seed: int) -> dict[str, Any]:
    """Open-loop Poisson load (``rate`` req/s) on a 2 x 0.5 pool of ``f``'s instances; after ``phase_s`` (s)
    change to 1 x 1.0, after another ``phase_s`` back to 2 x 0.5; ``phase_s`` more of load after that. Failed and
    lost requests, and the longest gap between answers (ms) during each change and in the steady state before."""
    pool = InstancePool(f, share=0.5, instances=2, name="change")
    inputs = f.warm_inputs()
    rng = np.random.default_rng(seed)
    done: list[float] = []
    failed = [0]
    futures = []
    lock = threading.Lock()

    def answered(fut: Any) -> None:
        with lock:
            if fut.exception() is None:
                done.append(time.perf_counter())
            else:
                failed[0] += 1

    changes: list[tuple[float, float, Any]] = []

    def changer() -> None:
        for share, k in ((1.0, 1), (0.5, 2)):
            time.sleep(phase_s)
            a = time.perf_counter()
            rec = pool.reconfigure(share=share, instances=k, overlap=overlap)
            changes.append((a, time.perf_counter(), rec))

    t0 = time.perf_counter()
    end = t0 + 3 * phase_s + 1.0
    ch = threading.Thread(target=changer)
    ch.start()
    nxt = t0
    while nxt < end:
        nxt += rng.exponential(1.0 / rate)
        delay = nxt - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        fut = pool.submit(inputs)
        fut.add_done_callback(answered)
        futures.append(fut)
    ch.join()
    for fut in futures:
        try:
            fut.result(timeout=60)
        except Exception:  # counted by the callback
            pass
    pool.close()
    times = np.sort(np.asarray(done))
    gaps = np.diff(times) * 1e3

    def longest(lo: float, hi: float, *, overlapping: bool) -> float:
        # overlapping: every interval between consecutive answers that overlaps [lo, hi], so an outage that ends
        # after hi (a cold instance's first request) counts in full; else only the intervals inside [lo, hi]
        sel = ((times[1:] >= lo) & (times[:-1] <= hi)) if overlapping else ((times[:-1] >= lo) & (times[1:] <= hi))
        return float(gaps[sel].max()) if sel.any() else 0.0

    # each change plus 200 ms after it (cold starts); the steady state before the first change
    during = [longest(a, b + 0.2, overlapping=True) for a, b, _ in changes]
    steady = longest(t0 + 0.3, changes[0][0], overlapping=False) if changes else 0.0
    return {"overlap": overlap, "sent": len(futures), "answered": len(done), "failed": failed[0],
            "lost": len(futures) - len(done) - failed[0], "steady_gap_ms": steady, "change_gap_ms": during,
            "changes": [c[2].as_dict() for c in changes]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny counts and small inputs (for tests)")
    ap.add_argument("--seconds", type=float, default=3.0, help="closed-loop seconds per configuration (b)")
    ap.add_argument("--rate", type=float, default=40.0, help="open-loop Poisson rate in req/s (d)")
    ap.add_argument("--slo-x", type=float, default=3.0, help="p95 SLO as a multiple of the all-threads median")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="the JSON report alone on stdout, tables on stderr")
    args = ap.parse_args(argv)
    exit_unless_positive(ap, "bench_spatial.py", [("--seconds", args.seconds), ("--rate", args.rate),
                                                  ("--slo-x", args.slo_x)])
    return print_report(lambda: _run(args), args.json)


def _run(args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement of the module docstring, printed as tables; returns them as one JSON-able dict."""
    import onnxruntime as ort

    cores = cpu_cores()
    quick = args.quick
    seconds = 0.4 if quick else args.seconds
    size = 64 if quick else 224
    print(f"REAL CPU: onnxruntime {ort.__version__} (CPUExecutionProvider) on {platform.node()} / "
          f"{cpu_model() or 'unknown CPU'}, {cores} cores; a share runs max(1, round(share x {cores})) threads")
    others = OthersMeter()
    report: dict[str, Any] = {"onnxruntime": ort.__version__, "cores": cores}

    print("\n(a) share curves: median ms of batch-1 requests alone")
    report["curves"] = _curves([("squeezenet1_1", size), ("mobilenet_v2", size)] + ([] if quick else
                               [("resnet18", size)]), 5 if quick else 30, cores)
    for c in report["curves"]:
        pts = ", ".join(f"{s:g} ({t} thr) {ms:.2f} ms" for (s, ms), t in zip(c["points"], c["threads"]))
        verdict = f"knee {c['knee']:g}" if c["knee"] is not None else f"NOT A CURVE: {c['problem']}"
        print(f"  {c['model']}: {pts}; {verdict}")

    tp_model = ("squeezenet1_1", size)
    print(f"\n(b) throughput, closed loop, one request outstanding per instance, {seconds:g} s each "
          f"(zoo:{tp_model[0]}@{tp_model[1]})")
    tp = _throughput(tp_model[0], tp_model[1], cores, seconds, args.slo_x)
    report["throughput"] = tp
    print(f"  SLO: p95 <= {tp['slo_ms']:.2f} ms ({args.slo_x:g} x the 1-instance all-threads median)")
    print(f"  {'instances':>9} {'threads':>7} {'weights':>8} {'opt':>8} {'req/s':>8} {'x base':>6} {'p50 ms':>7} "
          f"{'p95 ms':>7}  SLO")
    for r in tp["rows"]:
        note = " OVERSUBSCRIBED (more threads than cores)" if r["oversubscribed"] else ""
        print(f"  {r['instances']:>9} {r['threads']:>7} {'shared' if r['shared'] else 'own':>8} "
              f"{r['optimization']:>8} {r['rps']:>8.1f} {r['vs_all_threads']:>6.2f} {r['p50_ms']:>7.2f} "
              f"{r['p95_ms']:>7.2f}  {'ok' if r['meets_slo'] else 'MISSED'}{note}")

    mem_model = ("resnet18", 64 if quick else 224)
    print(f"\n(c) resident memory (MB, RSS growth in a fresh child per row), zoo:{mem_model[0]}@{mem_model[1]}")
    report["memory"] = _memory(*mem_model)
    for m in report["memory"]:
        print(f"  {m['instances']} instance(s), {'shared weights' if m['shared'] else 'own weights   '} "
              f"(opt {m['optimization']:>8}): total {m['total_mb']:7.1f} MB = static {m['static_mb']:6.1f} + "
              f"runtime {m['runtime_mb']:6.1f} (weights {m['weights_mb']:.1f} MB)")
    by = {(m["instances"], m["shared"], m["optimization"]): m["total_mb"] for m in report["memory"]}
    own4, shared4 = by[(4, False, "extended")], by[(4, True, "extended")]
    own_add, shared_add = (own4 - by[(1, False, "extended")]) / 3, (shared4 - by[(1, True, "extended")]) / 3
    print(f"  4 instances at opt extended: shared/own = {shared4 / own4:.2f}; per added instance: own "
          f"{own_add:.1f} MB, shared {shared_add:.1f} MB")

    phase = 0.6 if quick else 2.0
    rate = min(args.rate, 20.0) if quick else args.rate
    ch_model = ("mobilenet_v2", 64 if quick else 160)
    print(f"\n(d) share change 2 x 0.5 -> 1 x 1.0 -> 2 x 0.5 under open-loop Poisson load, {rate:g} req/s, "
          f"zoo:{ch_model[0]}@{ch_model[1]}, shared weights")
    report["change"] = []
    for overlap in (True, False):
        f = OrtInstances(zoo.path(ch_model[0], input_size=ch_model[1]), cores=cores, shared_weights=True)
        r = share_change(f, rate, phase, overlap, args.seed)
        report["change"].append(r)
        unav = ", ".join(f"{c['unavailable_ms']:.3f}" for c in r["changes"])
        gaps = ", ".join(f"{g:.1f}" for g in r["change_gap_ms"])
        print(f"  {'with overlap   ' if overlap else 'without overlap'}: sent {r['sent']}, failed {r['failed']}, "
              f"lost {r['lost']}; unavailable {unav} ms; longest answer gap during changes {gaps} ms "
              f"(steady {r['steady_gap_ms']:.1f} ms); build+warm "
              + ", ".join(f"{c['build_ms'] + c['warm_ms']:.0f}" for c in r["changes"]) + " ms")

    used = others.cores()
    if used is not None:
        print(f"\nother processes used {used:.2f} of {cores} cores on average during this run")
        report["others_cores"] = used
    return report


if __name__ == "__main__":
    sys.exit(main())
