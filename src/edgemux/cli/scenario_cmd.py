"""``edgemux predict`` and ``edgemux simulate``: a scenario file in, a verdict per app out."""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING, Any

from edgemux.cli.jsonout import emit
from edgemux.cli.profile_cmd import add_profiles_option, with_profile_sets
from edgemux.cli.progress import progress_for
from edgemux.cli.table import fmt_ms, render
from edgemux.errors import InputError

if TYPE_CHECKING:
    # the estimators (numpy, scipy: about 0.5 s) and the scenario reader are imported by the commands that run
    # them, so that `edgemux predict --help` or a usage error answers at once
    from edgemux.cluster.scenario import Scenario
    from edgemux.perf.device import TenantEstimate
    from edgemux.perf.result import Unstable


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("predict", help="predict every app's latency on a scenario with the estimators")
    p.add_argument("scenario", help="scenario YAML file (see examples/)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_profiles_option(p)
    p.set_defaults(func=with_profile_sets(cmd_predict))

    s = sub.add_parser("simulate", help="simulate a scenario (discrete events, virtual time) next to the prediction")
    s.add_argument("scenario", help="scenario YAML file (see examples/)")
    s.add_argument("--requests", type=int, default=100_000,
                   help="arrivals per device per replication (default 100000)")
    s.add_argument("--replications", type=int, default=10, help="independent seeded replications (default 10)")
    s.add_argument("--seed", type=int, default=0, help="root seed (default 0)")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    add_profiles_option(s)
    s.set_defaults(func=with_profile_sets(cmd_simulate))


def _num(x: float | Unstable | None) -> float | str | None:
    """A latency for JSON: number, the string 'unstable', or null."""
    from edgemux.perf.result import Unstable

    if isinstance(x, Unstable):
        return "unstable"
    return None if x is None else round(float(x), 4)


def _stat(est: TenantEstimate, stat: str) -> float | Unstable | None:
    return {"mean": est.mean_ms, "p95": est.p95_ms, "p99": est.p99_ms}.get(stat)


def _predict_all(sc: Scenario) -> dict[str, TenantEstimate]:
    from edgemux.perf.device import predict_device

    out: dict[str, TenantEstimate] = {}
    for dev in sc.devices.values():
        if dev.apps:
            out.update(predict_device(dev.spec, dev.tenants))
    return out


def _emulated_line(sc: Scenario) -> str:
    devs = ", ".join(f"{d.path} ({d.spec.kind.value}, {d.spec.discipline.value})" for d in sc.devices.values())
    return f"devices (all modelled from their profiles; none is physically present, i.e. emulated): {devs}"


def cmd_predict(args: argparse.Namespace) -> int:
    """Print predicted mean/p95/p99 latency (ms) per app and its verdict against the SLO."""
    from edgemux.cluster.scenario import load_scenario
    from edgemux.perf.slo import verdict_point

    sc = load_scenario(args.scenario)
    preds = _predict_all(sc)
    rows: list[dict[str, Any]] = []
    for app in sc.apps:
        t = app.tenant
        e = preds[t.name]
        verdict = verdict_point(_stat(e, app.slo.stat), app.slo.latency_ms) if app.slo else "-"
        rows.append({
            "app": t.name, "device": app.device, "model": t.model, "profile": app.profile,
            "rate_rps": t.rate_rps, "arrival": t.arrival.kind.value, "rho": round(e.rho, 4),
            "mean_ms": _num(e.mean_ms), "p95_ms": _num(e.p95_ms), "p99_ms": _num(e.p99_ms),
            "bounds_ms": [_num(b) for b in e.bounds_ms] if e.bounds_ms else None,
            "slo": {"latency_ms": app.slo.latency_ms, "stat": app.slo.stat} if app.slo else None,
            "verdict": verdict, "method": e.method,
        })
    if args.json:
        emit({"scenario": sc.name, "emulated_devices": list(sc.devices), "apps": rows})
        return 0
    print(f"scenario {sc.name}: predicted latency per app (estimators, ms)")
    print(render(
        ["app", "device", "model", "rate/s", "rho", "mean", "p95", "p99", "SLO", "verdict"],
        [[r["app"], r["device"], r["model"], f"{r['rate_rps']:g}", f"{r['rho']:.2f}",
          fmt_ms(preds[r["app"]].mean_ms), fmt_ms(preds[r["app"]].p95_ms), fmt_ms(preds[r["app"]].p99_ms),
          _slo_text(r["slo"]), r["verdict"]] for r in rows]))
    print()
    for r in rows:
        print(f"  {r['app']}: {r['method']}")
    print(_emulated_line(sc))
    return 0


def _slo_text(slo: dict[str, Any] | None) -> str:
    return "-" if not slo else f"{slo['stat']}<={slo['latency_ms']:g}"


def cmd_simulate(args: argparse.Namespace) -> int:
    """Simulate every device; print simulated mean/p95/p99 with confidence intervals beside the prediction."""
    from edgemux.cluster.scenario import load_scenario
    from edgemux.perf.slo import verdict_interval
    from edgemux.sim.run import simulate_device

    if args.requests < 100:
        raise InputError("--requests", f"must be >= 100, got {args.requests}")
    if args.replications < 2:
        raise InputError("--replications", f"must be >= 2 (confidence intervals need two), got {args.replications}")
    sc = load_scenario(args.scenario)
    preds = _predict_all(sc)
    rows: list[dict[str, Any]] = []
    busy = [dev for dev in sc.devices.values() if dev.apps]
    results = []
    with progress_for(args, len(busy) * args.replications, "simulate") as bar:
        for k, dev in enumerate(busy):  # one count over every device's replications
            base = k * args.replications
            bar(base, detail=dev.path)
            results.append(simulate_device(dev.spec, dev.tenants, requests=args.requests,
                                           replications=args.replications, seed=args.seed,
                                           progress=lambda r, _n, base=base: bar(base + r)))
    for dev, res in zip(busy, results):
        for app in dev.apps:
            st = res.tenants[app.tenant.name]
            ci = {"mean": st.mean_ms, "p50": st.p50_ms, "p95": st.p95_ms, "p99": st.p99_ms}
            verdict = "-"
            if app.slo:
                c = ci[app.slo.stat]
                verdict = verdict_interval(c.lo, c.hi, app.slo.latency_ms)
            e = preds[app.tenant.name]
            rows.append({
                "app": app.tenant.name, "device": dev.path, "model": app.tenant.model,
                "rate_rps": app.tenant.rate_rps, "utilization": _ci(res.utilization),
                "sim": {k: _ci(v) for k, v in ci.items()}, "throughput_rps": _ci(st.throughput_rps),
                "predicted": {"mean_ms": _num(e.mean_ms), "p95_ms": _num(e.p95_ms), "p99_ms": _num(e.p99_ms)},
                "slo": {"latency_ms": app.slo.latency_ms, "stat": app.slo.stat} if app.slo else None,
                "verdict": verdict, "engine": res.engine,
            })
    meta = {"scenario": sc.name, "requests_per_replication": args.requests, "replications": args.replications,
            "seed": args.seed, "emulated_devices": list(sc.devices)}
    if args.json:
        emit({**meta, "apps": rows})
        return 0
    print(f"scenario {sc.name}: simulated vs predicted latency per app (ms; simulated values are means over "
          f"{args.replications} replications of {args.requests} arrivals per device, ± 95% CI half-width)")
    print(render(
        ["app", "device", "util", "sim mean", "pred mean", "sim p95", "pred p95", "sim p99", "pred p99",
         "SLO", "verdict"],
        [[r["app"], r["device"], f"{r['utilization']['value']:.2f}",
          _pm(r["sim"]["mean"]), fmt_ms(preds[r["app"]].mean_ms), _pm(r["sim"]["p95"]),
          fmt_ms(preds[r["app"]].p95_ms), _pm(r["sim"]["p99"]), fmt_ms(preds[r["app"]].p99_ms),
          _slo_text(r["slo"]), r["verdict"]] for r in rows]))
    print(f"seed {args.seed}; " + _emulated_line(sc))
    return 0


def _ci(c: Any) -> dict[str, float]:
    return {"value": round(c.value, 4), "lo": round(c.lo, 4), "hi": round(c.hi, 4)}


def _pm(c: dict[str, float]) -> str:
    half = (c["hi"] - c["lo"]) / 2
    if not math.isfinite(half):
        return f"{c['value']:.1f}"
    return f"{c['value']:.1f}±{half:.1f}"
