"""The GPU path, proven in one run on a machine with one NVIDIA GPU (ONNX Runtime's CUDA provider), in at most
``--budget-s`` seconds (default 480: 8 minutes).

Without a GPU (no NVIDIA driver or GPU, or an onnxruntime without its CUDA provider) it says so in one line on
stderr and exits 2: nothing here is emulated. In one run it measures and prints:

(1) profiles: the zoo models on ONNX Runtime CUDA, batch 1 and 8 (``runtime.tools.profiler.profile_models``):
    mean, p95 and CV of the execution time (ms);
(2) a share curve under MPS's per-process active-thread percentage, one process per instance, and
(3) Table IV-style throughput of several instances at the knee, and
(4) an overlapped share change's service gap (with and without overlap): ``bench_spatial_cuda.py``'s
    measurements (a), (b) and (d), run here with their counts cut to fit the budget;
(5) predicted vs observed mean latency of 2 and 3 co-located models under time sharing (``gpu-timeshare``: one
    process, the device's requests interleaved) and under MPS (``mps``: c = ``--mps-servers`` concurrent
    servers, Ibis §3.4.3), open-loop Poisson at ``--rho`` of the device, the predictions from the
    profiles of (1) by ``perf.device.predict_device``, the observations from a ``DeviceWorker`` on the same
    CUDA backend (``bench_predicted_vs_observed.drive``).

    python benchmarks/bench_gpu.py [--quick] [--json] [--budget-s 480] [--rho 0.5] [--mps-servers 1.65]
        [--requests 2000] [--seed 0]

Units: ms, req/s; rho and shares dimensionless. ``--json``: the figures alone, as JSON, on stdout.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

MODELS = ("zoo:mobilenet_v2@224", "zoo:resnet18@224", "zoo:resnet50@224", "zoo:squeezenet1_1@224",
          "zoo:efficientnet_b0@224")
COLOCATED = (("zoo:mobilenet_v2@224", "zoo:resnet50@224"),
             ("zoo:mobilenet_v2@224", "zoo:resnet18@224", "zoo:resnet50@224"))
TARGET = 0.15  # |predicted - observed| / observed, as on the CPU


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]  # one line, no usage block
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments; bad values are one line on stderr and exit 2 (argparse's own, and ``_check``'s)."""
    ap = _Parser(prog="bench_gpu.py", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small counts (a smoke run of every section)")
    ap.add_argument("--json", action="store_true", help="the figures alone, as JSON, on stdout")
    ap.add_argument("--budget-s", type=float, default=480.0, help="wall-clock budget in s (default 480)")
    ap.add_argument("--rho", type=float, default=0.5, help="offered utilization of (5), in (0, 1) (default 0.5)")
    ap.add_argument("--mps-servers", type=float, default=1.65,
                    help="c of the mps discipline in (5), >= 1 (default 1.65: Ibis Fig. 11)")
    ap.add_argument("--requests", type=int, default=2000, help="requests per configuration of (5) (default 2000)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the inputs and arrivals (default 0)")
    args = ap.parse_args(argv)
    problem = _check(args)
    if problem is not None:
        ap.exit(2, f"bench_gpu.py: error: {problem}\n")
    return args


def _check(args: argparse.Namespace) -> str | None:
    if not (args.budget_s > 0 and math.isfinite(args.budget_s)):
        return f"--budget-s must be a number > 0, got {args.budget_s:g}"
    if not 0 < args.rho < 1:
        return f"--rho must be in (0, 1), got {args.rho:g}"
    if not (args.mps_servers >= 1 and math.isfinite(args.mps_servers)):
        return f"--mps-servers must be a number >= 1, got {args.mps_servers:g}"
    if args.requests < 100:
        return f"--requests must be >= 100, got {args.requests}"
    if args.seed < 0:
        return f"--seed must be >= 0, got {args.seed}"
    return None


def render(report: dict[str, Any]) -> str:
    """The report's tables, as printed (tested on the CPU with a made-up report)."""
    lines = [f"REAL GPU: {report['gpu']}", "", "(1) ONNX Runtime CUDA profiles (ms)",
             f"  {'model':<24} {'batch':>5} {'mean':>8} {'p95':>8} {'cv':>6}"]
    for p in report["profiles"]:
        lines.append(f"  {p['model']:<24} {p['batch']:>5} {p['mean_ms']:>8.3f} {p['p95_ms']:>8.3f} {p['cv']:>6.3f}")
    spatial = report.get("spatial") or {}
    lines += ["", f"(2)-(4) share curve, throughput at the knee, share change: {spatial.get('summary', 'not run')}"]
    lines += ["", f"(5) predicted vs observed mean latency, rho {report['rho']:g}, target within {TARGET:.0%}",
              f"  {'discipline':<14} {'models':<52} {'app':<5} {'pred ms':>8} {'obs ms':>8} {'error':>7}  within?"]
    for row in report["colocated"]:
        lines.append(f"  {row['discipline']:<14} {row['models']:<52} {row['app']:<5} {row['predicted_ms']:>8.3f} "
                     f"{row['observed_ms']:>8.3f} {100 * row['error']:>+6.1f}%  {'yes' if row['ok'] else 'NO'}")
    ok = sum(r["ok"] for r in report["colocated"])
    lines.append(f"  within {TARGET:.0%}: {ok}/{len(report['colocated'])}")
    lines.append(f"wall {report['wall_s']:.0f} s of a {report['budget_s']:.0f} s budget")
    return "\n".join(lines)


def _profiles(sources: list[Any], quick: bool, seed: int) -> tuple[Any, list[dict[str, Any]], dict[str, Any]]:
    from edgemux.runtime.dataplane.backends import make_backend
    from edgemux.runtime.tools.profiler import profile_models

    backend = make_backend("cuda", threads=1)
    measured = profile_models(backend, sources, [1, 8], 3 if quick else 10, 20 if quick else 100, seed=seed)
    rows = [{"model": m.source, "batch": m.batch, "mean_ms": m.mean_ms, "p95_ms": m.p95_ms, "cv": m.cv}
            for m in measured]
    samples = {m.source: m.samples_ms for m in measured if m.batch == 1}
    return backend, rows, samples


def _colocated(backend: Any, samples: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    import numpy as np

    from bench_predicted_vs_observed import batch_means_ci, drive, tenants_for
    from edgemux.cluster.state import Device
    from edgemux.cluster.workload import DeviceSpec, Discipline
    from edgemux.perf.device import predict_device
    from edgemux.profiles.distributions import Empirical
    from edgemux.profiles.types import DeviceKind
    from edgemux.runtime.dataplane.backends import ModelSource
    from edgemux.runtime.dataplane.worker import DeviceWorker

    rows = []
    rng = np.random.default_rng(args.seed)
    for discipline, servers in ((Discipline.GPU_TIMESHARE, 1.0), (Discipline.MPS, args.mps_servers)):
        for group in COLOCATED:
            names = [f"app{i + 1}" for i in range(len(group))]
            keys = [f"colocated:{s}" for s in group]
            infos = [backend.load(k, ModelSource.parse(s)) for k, s in zip(keys, group)]
            inputs = [{t.name: rng.standard_normal([1 if d < 1 else d for d in t.shape]).astype(np.float32)
                       for t in info.inputs} for info in infos]
            services = [Empirical(tuple(samples[ModelSource.parse(s).describe()])) for s in group]
            tenants = tenants_for(args.rho, names, keys, services)
            spec = DeviceSpec("gpu0", DeviceKind.GPU_DISCRETE, discipline, servers=servers)
            pred = predict_device(spec, tenants)
            worker = DeviceWorker(Device("bench", "gpu0", DeviceKind.GPU_DISCRETE, discipline, 16384.0,
                                         servers=servers), backend, clock=time.perf_counter, max_queue=1_000_000)
            try:
                run = drive(worker, names, keys, inputs, tenants, args.requests // (4 if args.quick else 1),
                            args.seed)
            finally:
                worker.close()
            for t, r in zip(tenants, run.apps):
                obs, _ = batch_means_ci(r.latencies_ms)
                p = float(pred[t.name].mean_ms)
                rows.append({"discipline": discipline.value, "models": "+".join(s.split(":")[1] for s in group),
                             "app": t.name, "predicted_ms": p, "observed_ms": obs, "error": (p - obs) / obs,
                             "ok": abs(p - obs) / obs <= TARGET})
            for k in keys:
                backend.unload(k)
    return rows


def _spatial(args: argparse.Namespace, deadline: float) -> dict[str, Any]:
    """``bench_spatial_cuda.py``'s (a), (b), (d) with small counts, while the budget lasts."""
    import bench_spatial_cuda

    left = deadline - time.monotonic()
    if left < 60:
        return {"summary": f"skipped: {left:.0f} s of the budget left"}
    sub = argparse.Namespace(quick=args.quick or left < 240, seconds=1.0, rate=200.0, slo_x=3.0, seed=args.seed,
                             start_mps=True, json=False)
    report = bench_spatial_cuda._run(sub)
    knee = (report.get("curves") or [{}])[0].get("knee")
    rows = (report.get("throughput") or {}).get("rows", [])
    best = max((r["vs_whole_gpu"] for r in rows), default=None)
    gaps = [c.get("change_gap_ms") for c in report.get("change", [])]
    report["summary"] = (f"knee {knee}; best throughput x{best:.2f} of one whole-GPU instance; "
                         f"answer gaps during share changes with/without overlap {gaps} ms"
                         if best is not None else "see the tables above")
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from edgemux.runtime.dataplane.backends import ModelSource
    from edgemux.runtime.dataplane.gpushare import check_gpu

    gpu = check_gpu()
    if not gpu.ok:
        print(f"bench_gpu.py: no GPU here: {gpu.reason}", file=sys.stderr)
        return 2
    started = time.monotonic()
    deadline = started + args.budget_s
    out = sys.stderr if args.json else sys.stdout
    sources = [ModelSource.parse(m) for m in MODELS[: 2 if args.quick else None]]
    print(f"REAL GPU: {gpu.reason}", file=out, flush=True)
    backend, profiles, samples = _profiles(sources, args.quick, args.seed)
    wanted = {ModelSource.parse(m).describe(): m for g in COLOCATED for m in g}
    for key in sorted(set(wanted) - {src.describe() for src in sources}):  # models (5) needs too
        _, more, extra = _profiles([ModelSource.parse(wanted[key])], True, args.seed)
        profiles += more
        samples.update(extra)
    report: dict[str, Any] = {"gpu": gpu.reason, "rho": args.rho, "budget_s": args.budget_s, "profiles": profiles}
    report["colocated"] = _colocated(backend, samples, args)
    report["spatial"] = _spatial(args, deadline)
    report["wall_s"] = time.monotonic() - started
    text = render(report)
    if args.json:
        import json

        print(text, file=sys.stderr)
        print(json.dumps(report, default=str))
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
