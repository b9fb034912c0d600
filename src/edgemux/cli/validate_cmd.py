"""``edgemux validate``: estimators vs simulator over a grid, or vs real measurements."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from edgemux.cli.jsonout import emit
from edgemux.cli.progress import progress_for
from edgemux.cli.table import render
from edgemux.errors import InputError

MAPE_LIMIT_PCT = 5.0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("validate", help="check estimators against the simulator, or against measurements")
    p.add_argument("--measurements", metavar="DIR", action="append", default=None,
                   help="directory of measurement CSVs (repeatable): Edge TPU files (ibis-edgetpu format; pass "
                        "if MAPE <= 5%%) and TensorRT files (ibis-trt format: the GPU check, reported)")
    p.add_argument("--size", type=float, default=1.0,
                   help="scale of the simulation runs (default 1.0; smaller is faster and noisier)")
    p.add_argument("--seed", type=int, default=0, help="root seed (default 0)")
    p.add_argument("--family", action="append", default=None,
                   help="only these case families (fcfs, edgetpu-switch, periodic, ps, mps, gpu-timeshare, cpu-tandem, batch, spatial)")
    p.add_argument("--workers", type=int, default=None, help="parallel processes (default: CPU count, at most 4)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_validate)


def cmd_validate(args: argparse.Namespace) -> int:
    """Exit 0 only if every check holds (grid), or MAPE <= 5 % (measurements); 1 otherwise."""
    if args.measurements:
        return _measurements(args)
    return _grid(args)


def _ms(v: Any) -> Any:
    """A predicted latency for JSON: rounded ms, "unstable", or None where none was predicted."""
    if v is None or isinstance(v, float):
        return None if v is None else round(v, 3)
    return "unstable"


def _cell(v: Any) -> str:
    return "-" if v is None else (f"{v:.1f}" if isinstance(v, float) else "unstable")


def _csv_files(dirs: list[str]) -> tuple[list[Path], list[Path]]:
    """The CSVs of ``dirs`` (each sorted by name): (Edge TPU files, TensorRT files), told apart by header."""
    from edgemux.experiments.gpucheck import is_trt_file

    tpu: list[Path] = []
    trt: list[Path] = []
    for d in dirs:
        path = Path(d)
        if not path.is_dir():
            raise InputError("--measurements", "not a directory", d)
        files = sorted(path.glob("*.csv"))
        if not files:
            raise InputError("--measurements", "no CSV files in directory", d)
        for f in files:
            (trt if is_trt_file(f) else tpu).append(f)
    return tpu, trt


def _measurements(args: argparse.Namespace) -> int:
    from edgemux.experiments.gpucheck import gpu_check

    tpu_files, trt_files = _csv_files(args.measurements)
    checks = [gpu_check(f) for f in trt_files]
    if not tpu_files:  # the GPU check alone: reported, nothing to pass or fail
        if args.json:
            emit({"gpu_checks": [_gpu_json(c) for c in checks]})
        else:
            _print_gpu(checks)
        return 0
    return _edgetpu(args, tpu_files, checks)


def _single_run_json(spread: Any, stat: str) -> dict[str, Any]:
    """What a perfect predictor scores against single runs (``SingleRun``), and the observed values' ranks."""
    import numpy as np

    mae, worst, ranks = spread.mae(stat), spread.worst_under(stat), spread.ranks[stat]
    return {"perfect_mae_pct": {k: round(float(v), 3) for k, v in zip(("p5", "median", "p95"),
                                                                     np.percentile(mae, [5, 50, 95]))},
            "perfect_worst_under_pct": {k: round(float(v), 3) for k, v in zip(("p5", "median"),
                                                                             np.percentile(worst, [5, 50]))},
            "outside_90pct_band": int(((ranks < 0.05) | (ranks > 0.95)).sum()), "runs": int(mae.size)}


def _gpu_json(check: Any) -> dict[str, Any]:
    from edgemux.experiments.gpucheck import LIMIT_PCT

    return {"file": check.file, "progress": round(check.progress, 4), "limit_pct": LIMIT_PCT,
            "models": [{"model": p.model, "isolated_n": p.isolated_n, "isolated_ms": round(p.isolated_ms, 3),
                        "concurrent_n": p.concurrent_n, "concurrent_ms": round(p.concurrent_ms, 3),
                        "ps_ms": round(p.ps_ms, 3), "ps_error_pct": round(p.error_pct("ps"), 3),
                        "fcfs_ms": round(p.fcfs_ms, 3), "fcfs_error_pct": round(p.error_pct("fcfs"), 3)}
                       for p in check.points],
            "within_limit": check.within_limit}


def _print_gpu(checks: list[Any]) -> None:
    from edgemux.experiments.gpucheck import LIMIT_PCT

    for c in checks:
        print(f"GPU check, {c.file}: each model's concurrent mean predicted from the isolated means (closed loop, "
              "one request in flight per model; perf.closedloop, exact MVA)")
        print(render(["model", "n alone", "alone ms", "n together", "together ms", "PS ms", "PS error %",
                      "FCFS ms", "FCFS error %"],
                     [[p.model, p.isolated_n, f"{p.isolated_ms:.1f}", p.concurrent_n, f"{p.concurrent_ms:.1f}",
                       f"{p.ps_ms:.1f}", f"{p.error_pct('ps'):+.1f}", f"{p.fcfs_ms:.1f}",
                       f"{p.error_pct('fcfs'):+.1f}"] for p in c.points]))
        print(f"within {LIMIT_PCT:g} % under processor sharing (gpu-timeshare): "
              f"{', '.join(c.within_limit) or 'none'} of {len(c.points)}")
        print(f"together the models progressed at {c.progress:.2f}x one model alone (sum of alone/together means)"
              + ("; above 1, the isolated times are not all GPU work that the models contend for, so no "
                 "discipline fed with isolated times alone predicts every model" if c.progress > 1.0 else ""))


def _edgetpu(args: argparse.Namespace, files: list[Path], checks: list[Any]) -> int:
    from dataclasses import fields

    from edgemux.experiments.measurements import MIN_SAMPLES, PointResult, mape, measure_files, tail_errors

    # a point's figures in ms, as its fields name them: the observed ones, then every prediction (None where
    # a basis does not apply, "unstable" for an overload)
    timed = [f.name for f in fields(PointResult) if f.name.endswith("_ms")]
    observed = [f for f in timed if f.startswith("observed")]
    predicted = [f for f in timed if not f.startswith("observed")]

    with progress_for(args, 0, "validate") as bar:
        results, spread = measure_files(files, progress=lambda done, total: bar(done, total, "single runs"))
    total = mape(results)
    by_file: dict[str, list[Any]] = {}
    for r in results:
        by_file.setdefault(r.file, []).append(r)
    ok = total <= MAPE_LIMIT_PCT
    bases = ("catalog", "e2e", "device", "law", "law-e2e")
    errors = {(stat, basis): tail_errors(results, stat, basis) for stat in ("mean", "p95", "p99") for basis in bases}
    if args.json:
        def summary(basis: str) -> dict[str, Any] | None:
            if any(math.isnan(errors[stat, basis][0]) for stat in ("mean", "p95", "p99")):
                return None  # no file had what this basis calibrates from
            return {stat: {"mean_abs_pct": round(errors[stat, basis][0], 3),
                           "min_pct": round(errors[stat, basis][1], 3), "max_pct": round(errors[stat, basis][2], 3)}
                    for stat in ("mean", "p95", "p99")}

        emit({
            "points": [{"file": r.file, "load_point": r.load_point, "model": r.model, "requests": r.requests,
                        "rate_rps": round(r.rate_rps, 4), "abs_pct_error": round(r.abs_pct_error, 3),
                        **{f: round(getattr(r, f), 3) for f in observed},
                        **{f: _ms(getattr(r, f)) for f in predicted},
                        "single_run_rank_p95": round(float(spread.ranks["p95"][i]), 3),
                        "single_run_rank_p99": round(float(spread.ranks["p99"][i]), 3)}
                       for i, r in enumerate(results)],
            "mape_pct": {"all": round(total, 3), **{f: round(mape(rs), 3) for f, rs in by_file.items()}},
            "paper_variance_mape_pct": round(mape(results, paper=True), 3),
            "errors_pct": {"catalog": summary("catalog"), "calibrated": summary("e2e"),
                           "device_calibrated": summary("device"), "law": summary("law"),
                           "law_calibrated": summary("law-e2e")},
            "single_run": {stat: _single_run_json(spread, stat) for stat in spread.stats},
            "calibration_min_samples": MIN_SAMPLES,
            "limit_pct": MAPE_LIMIT_PCT, "passed": ok, "gpu_checks": [_gpu_json(c) for c in checks]})
        return 0 if ok else 1
    print("Edge TPU measurements vs multi-tenant FCFS estimator with model-switch mixture (Ibis Eq. 1-5)")
    print("(observed = client response time; rates measured from the send times; profiles: ibis-edgetpu;")
    print(" calibrated = profiles re-calibrated from the end-to-end times of the file's other load points;")
    print(" device-calibrated = the same from their TPU-side times, where the file has them)")
    print(render(["file", "load", "model", "n", "rate/s", "observed ms", "predicted ms", "error %", "calibrated ms"],
                 [[r.file, r.load_point, r.model, r.requests, f"{r.rate_rps:.2f}", f"{r.observed_ms:.1f}",
                   _cell(r.predicted_ms), f"{r.abs_pct_error:.1f}", _cell(r.calibrated_ms)] for r in results]))
    print(render(["file", "load", "model", "p95 obs", "p95 pred", "p95 cal", "p99 obs", "p99 pred", "p99 cal"],
                 [[r.file, r.load_point, r.model, f"{r.observed_p95_ms:.1f}", _cell(r.predicted_p95_ms),
                   _cell(r.calibrated_p95_ms), f"{r.observed_p99_ms:.1f}", _cell(r.predicted_p99_ms),
                   _cell(r.calibrated_p99_ms)] for r in results]))
    for stat in ("mean", "p95", "p99"):
        (b, blo, bhi), (c, clo, chi), (d, dlo, dhi) = (errors[stat, basis] for basis in bases[:3])
        print(f"{stat:>4} error: catalog profiles mean |error| {b:.2f} % (from {blo:+.1f} to {bhi:+.1f} %); "
              f"calibrated {c:.2f} % (from {clo:+.1f} to {chi:+.1f} %)"
              + (f"; device-calibrated {d:.2f} % (from {dlo:+.1f} to {dhi:+.1f} %)" if not math.isnan(d) else ""))
    print("exact switch law (perf.switchlaw: the switch decided by the request served before), before and after "
          "calibration from end-to-end times:")
    print(render(["file", "load", "model", "p95 obs", "law", "law cal", "p99 obs", "law", "law cal"],
                 [[r.file, r.load_point, r.model, f"{r.observed_p95_ms:.1f}", _cell(r.law_p95_ms),
                   _cell(r.law_calibrated_p95_ms), f"{r.observed_p99_ms:.1f}", _cell(r.law_p99_ms),
                   _cell(r.law_calibrated_p99_ms)] for r in results]))
    for stat in ("mean", "p95", "p99"):
        (b, blo, bhi), (c, clo, chi) = errors[stat, "law"], errors[stat, "law-e2e"]
        print(f"{stat:>4} error, switch law: catalog profiles mean |error| {b:.2f} % (from {blo:+.1f} to {bhi:+.1f} %); "
              f"calibrated from end-to-end times {c:.2f} % (from {clo:+.1f} to {chi:+.1f} %)")
    for stat in spread.stats:
        j = _single_run_json(spread, stat)
        print(f"single runs, {stat}: a predictor that knew each point's stationary law (the calibrated switch law) "
              f"would score a mean |error| of {j['perfect_mae_pct']['median']:.2f} % against runs as long as "
              f"these (5-95 %: {j['perfect_mae_pct']['p5']:.2f}-{j['perfect_mae_pct']['p95']:.2f} %; worst "
              f"under-estimate median {j['perfect_worst_under_pct']['median']:+.1f} %); the observed {stat} is "
              f"outside its point's 90 % band of single runs at {j['outside_90pct_band']} of {len(results)} "
              f"points ({spread.errors[stat].shape[0]} simulated runs each)")
    for f, rs in by_file.items():
        print(f"MAPE {f}: {mape(rs):.2f} %")
    print(f"for comparison, Ibis Eq. 3 with Var[S] = variance of the tenants' mean service times: "
          f"MAPE {mape(results, paper=True):.2f} %")
    print(f"MAPE all {len(results)} points: {total:.2f} % (limit {MAPE_LIMIT_PCT:g} %) -> {'PASS' if ok else 'FAIL'}")
    if checks:
        print()
        _print_gpu(checks)
    return 0 if ok else 1


def _grid(args: argparse.Namespace) -> int:
    from edgemux.experiments.validation import FAMILIES, run_grid

    if not (0 < args.size <= 100):
        raise InputError("--size", f"must be in (0, 100], got {args.size:g}")
    if args.family:
        unknown = [f for f in args.family if f not in FAMILIES]
        if unknown:
            raise InputError("--family", f"unknown {unknown[0]!r} (known: {', '.join(FAMILIES)})")
    select = (lambda c: c.family in args.family) if args.family else None
    with progress_for(args, 0, "validate") as bar:
        rows = run_grid(size=args.size, seed=args.seed, workers=args.workers, select=select, progress=bar)
    checks = [r for r in rows if r.passed is not None]
    failed = [r for r in checks if not r.passed]
    if args.json:
        emit({"rows": [{**r.__dict__, "verdict": r.verdict} for r in rows],
              "checks": len(checks), "failed": len(failed)}, default=str)
        return 1 if failed else 0
    print(render(["check", "case", "kind", "predicted", "simulated ±95%CI", "error %", "tol %", "verdict"],
                 [[r.family, r.case, r.kind, r.predicted, f"{r.simulated:.2f} ± {r.half_width:.2f}",
                   f"{r.error_pct:+.2f}", "-" if r.tolerance_pct is None else f"{r.tolerance_pct:g}",
                   r.verdict] for r in rows]))
    notes = sorted({(r.family, r.note) for r in rows if r.note})
    for fam, note in notes:
        print(f"  {fam}: {note}")
    print(f"{len(checks) - len(failed)}/{len(checks)} checks hold"
          + ("" if not failed else f"; {len(failed)} FAIL") + f" (seed {args.seed}, size {args.size:g})")
    return 1 if failed else 0
