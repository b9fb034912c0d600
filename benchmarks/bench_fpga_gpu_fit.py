"""Kim et al.'s computation-time law (papers/004 Eq. 1, ``T = (alpha*bs + beta) * Q(C)``) measured on the REAL
CPU backend: alpha, beta and Q(C) are not printed in the paper, so this measures them where they can be measured.

For one zoo model, C concurrent ONNX Runtime sessions (one intra-op thread each, every session busy: one batch
outstanding per session) run batches of bs in {1, 2, 4, 8}; a sample is one batch's time (ms) on one worker.
``profiles.fitting.fit_fpga_gpu`` fits alpha and beta at C = 1 and Q(C) for each other C, and the script prints
them with R^2 of the whole fit, the throughput C*bs/T (req/s) the law predicts beside the measured one, and the
host's other CPU use (a busy host bends Q). Where the measurements do not follow the law at all (on a busy host
the fitted per-batch time can come out negative) it says so and prints the measurements alone (``--json``:
``"fit": null`` and the ``problem``).

    .venv/bin/python benchmarks/bench_fpga_gpu_fit.py [--model squeezenet1_1] [--size 96] [--workers 1,2]
                                                      [--repeats 20] [--json]

Units: ms, req/s.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hostload import OthersMeter, print_report  # noqa: E402

from edgemux.profiles.fitting import fit_fpga_gpu  # noqa: E402
from edgemux.runtime import zoo  # noqa: E402
from edgemux.runtime.dataplane.instances import OrtInstances, cpu_cores  # noqa: E402

BATCHES = (1, 2, 4, 8)


def _measure(path: Path, workers: int, batch: int, repeats: int) -> list[float]:
    """Per-batch times (ms) of ``workers`` sessions running batches of ``batch`` at once, ``repeats`` each."""
    f = OrtInstances(path, cores=1, shared_weights=False)
    x = {k: np.repeat(v, batch, axis=0) for k, v in f.warm_inputs().items()}
    insts = [f.make(1.0) for _ in range(workers)]
    for inst in insts:
        inst.run(x)  # warm
    times: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(workers)

    def worker(inst: Any) -> None:
        barrier.wait()
        for _ in range(repeats):
            t0 = time.perf_counter()
            inst.run(x)
            dt = (time.perf_counter() - t0) * 1e3
            with lock:
                times.append(dt)

    threads = [threading.Thread(target=worker, args=(i,)) for i in insts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for inst in insts:
        inst.close()
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="squeezenet1_1", help="zoo model (default squeezenet1_1)")
    ap.add_argument("--size", type=int, default=96, help="input size in pixels (default 96)")
    ap.add_argument("--workers", default="1,2", help="concurrent sessions C to measure, comma-separated (default 1,2)")
    ap.add_argument("--repeats", type=int, default=20, help="timed batches per worker and point (default 20)")
    ap.add_argument("--json", action="store_true", help="the JSON report alone on stdout, tables on stderr")
    args = ap.parse_args(argv)
    try:
        workers = sorted({int(w) for w in args.workers.split(",")})
    except ValueError:
        ap.exit(2, f"bench_fpga_gpu_fit.py: error: --workers must be comma-separated integers, "
                   f"got {args.workers!r}\n")
    if workers[0] > 1:
        ap.exit(2, "bench_fpga_gpu_fit.py: error: --workers must include 1 (Q(1) = 1 by definition), "
                   f"got {args.workers!r}\n")
    if args.repeats < 2:
        ap.exit(2, f"bench_fpga_gpu_fit.py: error: --repeats must be >= 2, got {args.repeats}\n")
    if args.model not in zoo.MODELS:
        ap.exit(2, f"bench_fpga_gpu_fit.py: error: unknown zoo model {args.model!r} (known: {', '.join(zoo.MODELS)})\n")
    try:
        zoo.resolve_size(args.model, args.size)  # the zoo's own check: a size the network cannot take
    except zoo.ZooError as e:
        ap.exit(2, f"bench_fpga_gpu_fit.py: error: --size: {e}\n")
    if workers[0] < 1:
        ap.exit(2, f"bench_fpga_gpu_fit.py: error: --workers must be integers >= 1, got {args.workers!r}\n")
    return print_report(lambda: _run(args, workers), args.json)


def _run(args: argparse.Namespace, workers: list[int]) -> dict[str, Any]:
    import onnxruntime as ort

    path = zoo.path(args.model, input_size=args.size)
    print(f"REAL CPU: onnxruntime {ort.__version__} on {cpu_cores()} cores; zoo:{args.model}@{args.size}, "
          f"one intra-op thread per worker")
    meter = OthersMeter()
    b, c, t = [], [], []
    rows = []
    for w in workers:
        for bs in BATCHES:
            xs = _measure(path, w, bs, args.repeats)
            med = float(np.median(xs))
            rows.append({"workers": w, "batch": bs, "median_ms": med, "measured_rps": w * bs * 1000.0 / med})
            b += [bs] * len(xs)
            c += [w] * len(xs)
            t += xs
    report: dict[str, Any] = {"model": f"zoo:{args.model}@{args.size}", "rows": rows, "fit": None, "problem": None}
    try:
        fit = fit_fpga_gpu(b, c, t)
    except ValueError as e:
        # a busy host can bend the measurements off the law (e.g. a fitted beta < 0): say so, keep the rows
        report["problem"] = str(e)
        print(f"Eq. 1 does not fit these measurements: {e}")
        for r in rows:
            print(f"  C {r['workers']} bs {r['batch']}: median {r['median_ms']:.2f} ms, {r['measured_rps']:.1f} req/s")
    else:
        print(f"fit: alpha {fit.alpha_ms:.3f} ms/request, beta {fit.beta_ms:.3f} ms/batch, "
              + ", ".join(f"Q({k}) {v:.3f}" for k, v in sorted(fit.q.items()))
              + f"; R^2 {fit.r2:.3f} over {fit.n} batches (C = 1 alone: {fit.base_r2:.3f})")
        print(f"  {'C':>2} {'bs':>3} {'median ms':>9} {'law ms':>7} {'req/s':>8} {'law req/s':>9}")
        for r in rows:
            law = fit.predict(r["batch"], r["workers"])
            r["law_ms"] = law
            print(f"  {r['workers']:>2} {r['batch']:>3} {r['median_ms']:>9.2f} {law:>7.2f} {r['measured_rps']:>8.1f} "
                  f"{r['workers'] * r['batch'] * 1000.0 / law:>9.1f}")
        report["fit"] = {"alpha_ms": fit.alpha_ms, "beta_ms": fit.beta_ms, "q": {str(k): v for k, v in fit.q.items()},
                         "r2": fit.r2, "base_r2": fit.base_r2}
    used = meter.cores()
    if used is not None:
        print(f"other processes used {used:.2f} of {cpu_cores()} cores on average during this run")
        report["others_cores"] = used
    return report


if __name__ == "__main__":
    sys.exit(main())
