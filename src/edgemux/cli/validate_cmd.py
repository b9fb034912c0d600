"""``edgemux validate``: estimators vs simulator over a grid, or vs real measurements."""

from __future__ import annotations

import argparse
from typing import Any

from edgemux.cli.jsonout import emit
from edgemux.cli.table import render
from edgemux.errors import InputError

MAPE_LIMIT_PCT = 5.0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("validate", help="check estimators against the simulator, or against measurements")
    p.add_argument("--measurements", metavar="DIR",
                   help="directory of Edge TPU measurement CSVs (ibis-edgetpu format); pass if MAPE <= 5%%")
    p.add_argument("--size", type=float, default=1.0,
                   help="scale of the simulation runs (default 1.0; smaller is faster and noisier)")
    p.add_argument("--seed", type=int, default=0, help="root seed (default 0)")
    p.add_argument("--family", action="append", default=None,
                   help="only these case families (fcfs, edgetpu-switch, ps, mps, gpu-timeshare, cpu-tandem, batch)")
    p.add_argument("--workers", type=int, default=None, help="parallel processes (default: CPU count, at most 4)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_validate)


def cmd_validate(args: argparse.Namespace) -> int:
    """Exit 0 only if every check holds (grid), or MAPE <= 5 % (measurements); 1 otherwise."""
    if args.measurements:
        return _measurements(args)
    return _grid(args)


def _measurements(args: argparse.Namespace) -> int:
    from edgemux.experiments.measurements import mape, validate_measurements

    results = validate_measurements(args.measurements)
    total = mape(results)
    by_file: dict[str, list[Any]] = {}
    for r in results:
        by_file.setdefault(r.file, []).append(r)
    ok = total <= MAPE_LIMIT_PCT
    if args.json:
        emit({
            "points": [{"file": r.file, "load_point": r.load_point, "model": r.model, "requests": r.requests,
                        "rate_rps": round(r.rate_rps, 4), "observed_ms": round(r.observed_ms, 3),
                        "predicted_ms": r.predicted_ms if isinstance(r.predicted_ms, float) else "unstable",
                        "abs_pct_error": round(r.abs_pct_error, 3)} for r in results],
            "mape_pct": {"all": round(total, 3), **{f: round(mape(rs), 3) for f, rs in by_file.items()}},
            "paper_variance_mape_pct": round(mape(results, paper=True), 3),
            "limit_pct": MAPE_LIMIT_PCT, "passed": ok})
        return 0 if ok else 1
    print("Edge TPU measurements vs multi-tenant FCFS estimator with model-switch mixture (Ibis Eq. 1-5)")
    print("(observed = mean client response time; rates measured from the send times; profiles: ibis-edgetpu)")
    print(render(["file", "load", "model", "n", "rate/s", "observed ms", "predicted ms", "error %"],
                 [[r.file, r.load_point, r.model, r.requests, f"{r.rate_rps:.2f}", f"{r.observed_ms:.1f}",
                   f"{r.predicted_ms:.1f}" if isinstance(r.predicted_ms, float) else "unstable",
                   f"{r.abs_pct_error:.1f}"] for r in results]))
    for f, rs in by_file.items():
        print(f"MAPE {f}: {mape(rs):.2f} %")
    print(f"for comparison, Ibis Eq. 3 with Var[S] = variance of the tenants' mean service times: "
          f"MAPE {mape(results, paper=True):.2f} %")
    print(f"MAPE all {len(results)} points: {total:.2f} % (limit {MAPE_LIMIT_PCT:g} %) -> {'PASS' if ok else 'FAIL'}")
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
    rows = run_grid(size=args.size, seed=args.seed, workers=args.workers, select=select)
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
