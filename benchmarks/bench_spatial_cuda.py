"""Spatial sharing on a REAL NVIDIA GPU (ONNX Runtime's CUDA provider, shares through NVIDIA MPS): knee curves,
instances at the knee, GPU memory per instance, and a share change under load with and without overlap
(Dhakal et al., papers/002 §IV-A, §IV-B). The GPU counterpart of ``bench_spatial.py``.

Where there is no CUDA path (onnxruntime without its CUDA provider, no NVIDIA driver or GPU) it prints
``SKIPPED: <why>`` and exits 0 (``--json``: ``{"skipped": "<why>"}``); ``make test`` never needs a GPU.

An instance's share is MPS's active-thread percentage ``max(1, round(share * 100))``, one process per instance
(``runtime.dataplane.gpushare``). With ``--start-mps`` (the default) the script starts an MPS control daemon when
none runs (pipes in a temporary directory) and stops it at the end; where MPS cannot start, the instances run as
CUDA streams in one process, the shares are NOT enforced, (a) is skipped and every table says so. In one run:

(a) share curves: median ms of requests alone, timed in the instance's process, at shares 0.05 to 1.0, of
    resnet50 and mobilenet_v2 at 224 pixels, batch 1 and batch 32, and the knee (``perf.spatial.knee``);
(b) throughput (req/s) of 1 instance at share 1.0 vs 1, 2 and 4 instances at the batch-1 knee of resnet50 and 2 x
    0.5, 4 x 0.25; closed loop, one request outstanding per instance, ``--seconds`` per row; p95 latency (ms)
    against an SLO of ``--slo-x`` times the 1 x 1.0 median;
(c) GPU memory (MiB, ``nvidia-smi`` memory.used of the whole GPU) of 1 and 4 instances of resnet50;
(d) a share change 2 x 0.5 -> 1 x 1.0 -> 2 x 0.5 under open-loop Poisson load (``--rate`` req/s) with overlap
    (shadow instances started and warmed while the old serve) and without; failed requests, the time no
    instance could take a request, and the longest gap between answers.

    python benchmarks/bench_spatial_cuda.py [--quick] [--seconds 3] [--rate 200] [--json] [--no-start-mps]

Units: ms, req/s, MiB.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_spatial import closed_loop, share_change  # benchmarks/bench_spatial.py, beside this script  # noqa: E402
from hostload import exit_unless_positive, print_report  # noqa: E402

from edgemux.perf.spatial import check_curve, knee  # noqa: E402
from edgemux.runtime import zoo  # noqa: E402
from edgemux.runtime.dataplane.gpushare import (  # noqa: E402
    CudaInstances,
    check_gpu,
    mps_percentage,
    mps_running,
    start_mps,
    stop_mps,
    time_instance,
)
from edgemux.runtime.dataplane.instances import InstancePool  # noqa: E402

SHARES = (0.05, 0.1, 0.25, 0.5, 1.0)


def _gpu_memory_mib() -> float | None:
    """memory.used of GPU 0 (MiB) from nvidia-smi; None when it cannot say."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
        return float(out.splitlines()[0])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


def _curve(f: CudaInstances, batch: int, shares: tuple[float, ...], warmup: int, repeats: int) -> dict[str, Any]:
    """Median ms (timed in the instance's process) of ``repeats`` requests alone at each share."""
    x = {k: np.repeat(v, batch, axis=0) for k, v in f.warm_inputs().items()}
    points = []
    for sh in shares:
        points.append((sh, float(np.median(time_instance(f, sh, x, warmup, repeats)))))
    row: dict[str, Any] = {"batch": batch, "points": points, "percent": [mps_percentage(s) for s in shares]}
    try:
        row["knee"], row["problem"] = knee(check_curve(points, where="GPU share curve")), None
    except ValueError as e:
        row["knee"], row["problem"] = None, str(e)
    return row


def _throughput(f: CudaInstances, knee_share: float, seconds: float, slo_x: float) -> dict[str, Any]:
    inputs = f.warm_inputs()
    configs = [(1, 1.0), (1, knee_share), (2, knee_share), (4, knee_share), (2, 0.5), (4, 0.25)]
    rows = []
    for k, share in configs:
        pool = InstancePool(f, share=share, instances=k, name=f"bench-{k}x{share:g}")
        closed_loop(pool, inputs, min(1.0, seconds / 3))  # warm: CUDA graphs of cuDNN, allocators; untimed
        r = closed_loop(pool, inputs, seconds)
        pool.close()
        r.update(instances=k, share=share, held=k * share)
        rows.append(r)
    base = rows[0]
    slo = slo_x * base["p50_ms"]
    for r in rows:
        r["vs_whole_gpu"] = r["rps"] / base["rps"]
        r["meets_slo"] = r["p95_ms"] <= slo
    return {"slo_ms": slo, "rows": rows}


def _memory(f: CudaInstances) -> list[dict[str, Any]]:
    out = []
    for k in (1, 4):
        before = _gpu_memory_mib()
        pool = InstancePool(f, share=1.0 / k, instances=k, name=f"mem-{k}")
        pool.run(f.warm_inputs())
        after = _gpu_memory_mib()
        pool.close()
        out.append({"instances": k, "used_mib": None if before is None or after is None else after - before})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small counts and one model (a smoke run)")
    ap.add_argument("--seconds", type=float, default=3.0, help="closed-loop seconds per configuration (b)")
    ap.add_argument("--rate", type=float, default=200.0, help="open-loop Poisson rate in req/s (d)")
    ap.add_argument("--slo-x", type=float, default=3.0, help="p95 SLO as a multiple of the whole-GPU median")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-start-mps", dest="start_mps", action="store_false",
                    help="do not start an MPS daemon when none runs (instances then run as CUDA streams)")
    ap.add_argument("--json", action="store_true", help="the JSON report alone on stdout, tables on stderr")
    args = ap.parse_args(argv)
    exit_unless_positive(ap, "bench_spatial_cuda.py", [("--seconds", args.seconds), ("--rate", args.rate),
                                                       ("--slo-x", args.slo_x)])
    return print_report(lambda: _run(args), args.json)


def _run(args: argparse.Namespace) -> dict[str, Any]:
    gpu = check_gpu()
    if not gpu.ok:
        print(f"SKIPPED: no CUDA path here: {gpu.reason}")
        return {"skipped": gpu.reason}
    started: str | None = None
    mps_problem = None
    if args.start_mps and not mps_running():
        pipe = tempfile.mkdtemp(prefix="edgemux-mps-")
        mps_problem = start_mps(Path(pipe) / "pipe", Path(pipe) / "log")
        started = None if mps_problem else str(Path(pipe) / "pipe")
    try:
        return _measure(args, gpu.as_dict(), mps_problem)
    finally:
        if started is not None:
            stop_mps(started)


def _measure(args: argparse.Namespace, gpu: dict[str, Any], mps_problem: str | None) -> dict[str, Any]:
    quick = args.quick
    seconds = 1.0 if quick else args.seconds
    report: dict[str, Any] = {"gpu": gpu, "host": platform.node(), "mps_problem": mps_problem}
    big = CudaInstances(zoo.path("resnet50", input_size=224), seed=args.seed)
    report["mechanism"] = big.mechanism
    print(f"REAL GPU: {big.describe()}")
    if mps_problem:
        print(f"  MPS could not start ({mps_problem}): shares are NOT enforced")

    if big.enforced:
        print("\n(a) share curves: median ms of requests alone, timed in the instance's process")
        models = [("resnet50", big)] + ([] if quick else
                                        [("mobilenet_v2", CudaInstances(zoo.path("mobilenet_v2", input_size=224)))])
        report["curves"] = []
        for name, f in models:
            for batch in (1, 32):
                row = _curve(f, batch, SHARES, 3 if quick else 10, 10 if quick else 100)
                row["model"] = f"zoo:{name}@224"
                report["curves"].append(row)
                pts = ", ".join(f"{s:g} ({p} %) {ms:.2f}" for (s, ms), p in zip(row["points"], row["percent"]))
                verdict = f"knee {row['knee']:g}" if row["knee"] is not None else f"NOT A CURVE: {row['problem']}"
                print(f"  {row['model']} batch {batch}: {pts} ms; {verdict}")
        k1 = report["curves"][0]["knee"]
        knee_share = float(k1) if k1 is not None else 0.25
    else:
        print("\n(a) share curves: skipped, a share is not enforced without MPS")
        knee_share = 0.25

    print(f"\n(b) throughput of zoo:resnet50@224 batch 1, closed loop, one request outstanding per instance, "
          f"{seconds:g} s each; knee share {knee_share:g}")
    tp = _throughput(big, knee_share, seconds, args.slo_x)
    report["throughput"] = tp
    print(f"  SLO: p95 <= {tp['slo_ms']:.2f} ms ({args.slo_x:g} x the 1 x 1.0 median)")
    print(f"  {'instances':>9} {'share':>6} {'held':>5} {'req/s':>8} {'x 1x1.0':>7} {'p50 ms':>7} {'p95 ms':>7}  SLO")
    for r in tp["rows"]:
        over = " (shares held > 1: MPS caps, it does not reserve)" if r["held"] > 1 + 1e-9 else ""
        print(f"  {r['instances']:>9} {r['share']:>6g} {r['held']:>5.2f} {r['rps']:>8.1f} {r['vs_whole_gpu']:>7.2f} "
              f"{r['p50_ms']:>7.2f} {r['p95_ms']:>7.2f}  {'ok' if r['meets_slo'] else 'MISSED'}{over}")

    print("\n(c) GPU memory (MiB, nvidia-smi memory.used growth), zoo:resnet50@224")
    report["memory"] = _memory(big)
    for m in report["memory"]:
        used = "unknown" if m["used_mib"] is None else f"{m['used_mib']:.0f} MiB"
        print(f"  {m['instances']} instance(s), a copy of the weights each: {used}")

    print(f"\n(d) share change 2 x 0.5 -> 1 x 1.0 -> 2 x 0.5 under open-loop Poisson load, {args.rate:g} req/s, "
          f"zoo:resnet50@224")
    report["change"] = []
    for overlap in (True, False):
        r = share_change(big, args.rate, 1.0 if quick else 2.0, overlap, args.seed)
        report["change"].append(r)
        unav = ", ".join(f"{c['unavailable_ms']:.3f}" for c in r["changes"])
        gaps = ", ".join(f"{g:.1f}" for g in r["change_gap_ms"])
        print(f"  {'with overlap   ' if overlap else 'without overlap'}: sent {r['sent']}, failed {r['failed']}, "
              f"lost {r['lost']}; unavailable {unav} ms; longest answer gap during changes {gaps} ms "
              f"(steady {r['steady_gap_ms']:.1f} ms); build+warm "
              + ", ".join(f"{c['build_ms'] + c['warm_ms']:.0f}" for c in r["changes"]) + " ms")
    return report


if __name__ == "__main__":
    sys.exit(main())
