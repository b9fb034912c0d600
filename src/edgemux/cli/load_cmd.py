"""``edgemux load``: offer an app open-loop load and put the observed latency beside the predicted one.

::

    edgemux load --app NAME --duration D [--rate R] [--arrivals poisson|periodic]
                 [--gateway URL | --server CONTROLPLANE_URL] [--seed S] [--timeout-s T]
                 [--slo-ms MS] [--slo-stat mean|p50|p95|p99] [--concurrency-limit N] [--json]

With a control plane (``--server URL``, else ``$EDGEMUX_SERVER``, else ``http://127.0.0.1:8470``, unless only
``--gateway`` is given) the command reads the app's describe (``GET /v1/apps/{app}``: SLO, contracted
rate, the placement's pieces with their predicted latency and whether their device is emulated) and its
route (``GET /v1/routes/{app}``), then sends to ``--gateway`` or else the first gateway the control plane
knows (``GET /v1/gateways``). The rate, arrival process (``fps`` in the spec: periodic) and SLO default to
the app's. The predicted mean/p95/p99 are the pieces' predictions weighted by the pieces' weights: exact
for the mean of the mixture, an approximation for its percentiles (which lie between the pieces'). The
prediction is end to end: the device's queueing + service time (``perf.device``) plus the node's serving
path (the gateway, the transport and the agent: ``adapt.serving``, declared as the node's ``servingMs`` and
calibrated every window from what the gateways and agents observed) plus the app's network time. The
observed latency also carries the client's own time; the agents' ``queue``/``service`` averages are shown
beside it.

With only ``--gateway URL`` nothing is predicted: the observed table alone (``--rate`` is then required;
``--slo-ms`` scores an SLO of your own).

Output: a table (the run, the request counts with errors by kind, the client's send lateness, then rows
metric / observed / predicted, and per device); ``--json`` prints one JSON object instead: ``{"app",
"mode" ("controlplane" or "gateway"), "control_plane", "gateway", "report" (:meth:`LoadReport.to_dict`),
"predicted" ({mean_ms, p50_ms, p95_ms, p99_ms, at_slo_stat_ms, slo_met} or null), "devices" (per piece: device,
kind, weight, emulated, predicted, observed), "route", "notes"}``.

Exit codes: 0 the run completed (whatever its SLO attainment: this is a measurement, not a check);
2 bad input (a negative rate, a zero duration, unknown arrivals, an unreachable server or gateway, an
unknown app), one line on stderr.

Units: ``*_ms`` milliseconds, ``*_s`` seconds, rates in req/s (fps for periodic arrivals).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import urllib.parse
from typing import Any

from edgemux.cli.serving import add_token_option
from edgemux.cli.jsonout import emit
from edgemux.cli.table import fmt_ms, render
from edgemux.errors import EdgemuxError, InputError
from edgemux.runtime.auth import resolve_token
from edgemux.runtime.controlplane.apiclient import DEFAULT_SERVER, ControlPlaneClient
from edgemux.runtime.controlplane.context import client_settings
from edgemux.runtime.process import run as run_loop
CONTROL_PLANE_TIMEOUT_S = 30.0  # each control-plane read (s)
ARRIVALS = ("poisson", "periodic")
SLO_STATS = ("mean", "p50", "p95", "p99")


def add_parser(sub: Any) -> None:
    """Register ``edgemux load`` on an ``add_subparsers()`` object."""
    p = sub.add_parser("load", help="offer an app open-loop load; observed latency beside the predicted")
    p.add_argument("--app", required=True, help="app name (the Open Inference Protocol model name at the gateway)")
    p.add_argument("--rate", type=float, default=None,
                   help="offered rate in req/s (fps for periodic); default with a control plane: the app's")
    p.add_argument("--duration", type=float, required=True, help="how long to send, in s")
    p.add_argument("--arrivals", default=None, metavar="poisson|periodic",
                   help="arrival process (default: the app's with a control plane, else poisson)")
    p.add_argument("--gateway", default=None, metavar="URL", help="gateway to send to (default: the control plane's)")
    p.add_argument("--server", default=None, metavar="CONTROLPLANE_URL",
                   help=f"control plane for the route and predictions (default $EDGEMUX_SERVER, else the context "
                        f"`edgemux up` wrote, else {DEFAULT_SERVER}, unless only --gateway is given)")
    p.add_argument("--seed", type=int, default=0, help="seed of the arrival times and the default inputs (default 0)")
    p.add_argument("--timeout-s", type=float, default=5.0, help="per-request timeout in s (default 5)")
    p.add_argument("--slo-ms", type=float, default=None, help="SLO latency in ms (default: the app's)")
    p.add_argument("--slo-stat", default=None, metavar="mean|p50|p95|p99",
                   help="SLO statistic (default: the app's, else mean)")
    p.add_argument("--concurrency-limit", type=int, default=1000,
                   help="most requests outstanding; one scheduled beyond it is counted as client_limit (default 1000)")
    p.add_argument("--no-shm", dest="shm", action="store_false", default=None,
                   help="never hand tensors over in shared memory (default: when the gateway is on this host and "
                        "a request's tensors are at least 256 KiB)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--key", default=None, metavar="KEY",
                   help="the app's key, sent with every request (default $EDGEMUX_APP_KEY, else the admin token)")
    add_token_option(p, server=False)
    p.set_defaults(func=cmd_load)


def cmd_load(args: argparse.Namespace) -> int:
    """Run ``edgemux load``; bad input is one line on stderr and exit code 2 (also when not run by main)."""
    try:
        _check_args(args)
        result = run_loop(_load(args))  # uvloop when installed: the generator's own cost is not the server's
    except EdgemuxError as e:
        # One line even if a quoted server message had line breaks in it.
        print(f"edgemux: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    if args.json:
        emit(result)
    else:
        print(format_result(result))
    return 0


# ------------------------------------------------------------------------------------------- arguments


def _check_args(args: argparse.Namespace) -> None:
    """Refuse bad arguments before any network call, naming the option."""
    if args.rate is not None and not (math.isfinite(args.rate) and args.rate > 0):
        raise InputError("--rate", f"must be a number > 0 req/s, got {args.rate:g}")
    if not (math.isfinite(args.duration) and args.duration > 0):
        raise InputError("--duration", f"must be a number > 0 s, got {args.duration:g}")
    if args.arrivals is not None and args.arrivals not in ARRIVALS:
        raise InputError("--arrivals", f"expected one of {', '.join(ARRIVALS)}, got {args.arrivals!r}")
    if not (math.isfinite(args.timeout_s) and args.timeout_s > 0):
        raise InputError("--timeout-s", f"must be a number > 0 s, got {args.timeout_s:g}")
    if args.seed < 0:
        raise InputError("--seed", f"must be an integer >= 0, got {args.seed}")
    if args.slo_ms is not None and not (math.isfinite(args.slo_ms) and args.slo_ms > 0):
        raise InputError("--slo-ms", f"must be a number > 0 ms, got {args.slo_ms:g}")
    if args.slo_stat is not None and args.slo_stat not in SLO_STATS:
        raise InputError("--slo-stat", f"expected one of {', '.join(SLO_STATS)}, got {args.slo_stat!r}")
    if args.concurrency_limit < 1:
        raise InputError("--concurrency-limit", f"must be an integer >= 1, got {args.concurrency_limit}")
    for opt in ("gateway", "server"):
        url = getattr(args, opt)
        if url is not None:
            parts = urllib.parse.urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise InputError(f"--{opt}", f"must be http(s)://HOST:PORT, got {url!r}")
    if not args.app:
        raise InputError("--app", "must not be empty")
    if args.gateway is not None and args.server is None and args.rate is None:
        raise InputError("--rate", "is required without a control plane (only --gateway given)")


# ------------------------------------------------------------------------------------------------- run


async def _load(args: argparse.Namespace) -> dict[str, Any]:
    from edgemux.runtime.tools.load import run_load

    settings = client_settings(args.server, args.token_file) if args.server is not None or args.gateway is None \
        else None
    token = settings.token if settings is not None else resolve_token(args.token_file)
    # inference: the app's key when given, else the admin token (which opens every app)
    key = args.key or os.environ.get("EDGEMUX_APP_KEY") or token
    server = settings.server if settings is not None else None
    describe = route = None
    gateway = args.gateway.rstrip("/") if args.gateway else None
    notes: list[str] = []
    if server is not None:
        # a few calls before the load starts: the one (synchronous) client, off the event loop
        assert settings is not None
        cp = ControlPlaneClient(server, CONTROL_PLANE_TIMEOUT_S, token, settings.context)
        describe = await asyncio.to_thread(cp.describe, args.app)
        route = await asyncio.to_thread(cp.route, args.app)
        if gateway is None:
            urls = await asyncio.to_thread(cp.gateways)
            if not urls:
                raise EdgemuxError(f"the control plane at {server} knows no gateway: pass --gateway URL")
            gateway = urls[0].rstrip("/")
            if len(urls) > 1:
                notes.append(f"the control plane knows {len(urls)} gateways; sending to the first, {gateway}")
    assert gateway is not None

    spec = describe.get("spec", {}).get("spec", {}) if describe else {}
    slo = (describe or {}).get("slo") or {}
    rate = args.rate
    if rate is None:
        rate = spec.get("fps", spec.get("rate"))
        if not isinstance(rate, (int, float)) or not rate > 0:
            raise InputError("--rate", f"app '{args.app}' has no positive contracted rate: give --rate")
        rate = float(rate)
    arrivals = args.arrivals or ("periodic" if "fps" in spec else "poisson")
    slo_ms = args.slo_ms if args.slo_ms is not None else slo.get("latency_ms")
    slo_stat = args.slo_stat or slo.get("stat") or "mean"
    if route is not None and not route.endpoints:
        notes.append(f"no endpoint has app '{args.app}' loaded yet ({len(route.pending)} pending): "
                     "requests are expected to fail")

    report = await run_load(gateway, args.app, rate_rps=rate, duration_s=args.duration, arrivals=arrivals,
                            seed=args.seed, timeout_s=args.timeout_s, slo_ms=slo_ms, slo_stat=slo_stat,
                            concurrency_limit=args.concurrency_limit, key=key, shm=args.shm)
    if report.send_lateness_mean_ms > 0.1 * report.mean_ms:
        notes.append(f"sends left {report.send_lateness_mean_ms:.2f} ms late on average: the client is a "
                     "noticeable part of the measurement")
    if report.errors.get("client_limit"):
        notes.append(f"{report.errors['client_limit']} requests were not sent: {args.concurrency_limit} were "
                     "already outstanding (--concurrency-limit)")

    predicted = devices = None
    if describe is not None:
        predicted = predicted_summary(describe, slo_stat, slo_ms)
        devices = device_rows(describe, report)
        notes.append("predicted = end to end: device queueing + service (perf.device, current snapshot) + the "
                     "node's serving path (adapt.serving) + network; observed adds the client's own time; "
                     "compare the server queue + service rows too")
        if any(d["emulated"] is not False for d in devices):
            notes.append("emulated devices time requests from their profile, not a physical accelerator")
    return {"app": args.app, "mode": "controlplane" if describe is not None else "gateway",
            "control_plane": server, "gateway": gateway, "report": report.to_dict(), "predicted": predicted,
            "devices": devices, "route": route.to_json() if route is not None else None, "notes": notes}


# ------------------------------------------------------------------------------------------ predictions


def predicted_summary(describe: dict[str, Any], slo_stat: str, slo_ms: float | None) -> dict[str, Any]:
    """The app's predicted mean/p50/p95/p99 (ms) from a control-plane describe, weighted by piece weights
    (``runtime.controlplane.prediction``: exact for the mean, an approximation for percentiles), the one at
    ``slo_stat`` and whether it meets ``slo_ms`` (None when unknown)."""
    from edgemux.runtime.controlplane.prediction import meets_slo, weighted_prediction

    pieces = describe.get("placement", {}).get("pieces", [])
    out: dict[str, Any] = weighted_prediction((float(p.get("weight") or 0.0), p.get("predicted")) for p in pieces)
    out["at_slo_stat_ms"] = out.get(f"{slo_stat}_ms")
    out["slo_met"] = meets_slo(out["at_slo_stat_ms"], slo_ms)
    out["method"] = "weighted by piece weights (percentiles: weighted average, an approximation)"
    return out


def device_rows(describe: dict[str, Any], report: Any) -> list[dict[str, Any]]:
    """Per piece: where it runs, whether emulated, its prediction and what its agent's answers said."""
    out = []
    for p in describe.get("placement", {}).get("pieces", []):
        seen = report.by_device.get(p.get("device"))
        emulated = p.get("emulated")
        if seen is not None and seen.emulated is not None:
            emulated = seen.emulated  # the agent that answered knows best
        pred = p.get("predicted") or {}
        out.append({
            "device": p.get("device"), "kind": p.get("kind"), "weight": p.get("weight"), "emulated": emulated,
            "status": p.get("status"), "model_source": p.get("model_source"),
            "predicted": {k: pred.get(k) for k in ("mean_ms", "p50_ms", "p95_ms", "p99_ms", "device_ms", "serving_ms",
                                                   "utilization")},
            "observed": None if seen is None else {
                "ok": seen.ok, "mean_ms": _num(seen.mean_ms), "queue_ms": seen.queue_ms, "service_ms": seen.service_ms},
        })
    return out


# --------------------------------------------------------------------------------------------- output


def _num(x: Any) -> Any:
    return None if isinstance(x, float) and not math.isfinite(x) else x


def _backend(emulated: Any) -> str:
    return {True: "emulated", False: "real"}.get(emulated, "unknown") if isinstance(emulated, bool) else "unknown"


# how a load's tensors travelled (LoadReport.transport), in words
TRANSPORTS = {"shm": "shared memory", "binary": "binary HTTP", "json": "JSON HTTP"}


def format_result(result: dict[str, Any]) -> str:
    """The human-readable report: header lines, the metric table (observed beside predicted), devices."""
    r = result["report"]
    pred = result.get("predicted")
    unit = "fps" if r["arrivals"] == "periodic" else "req/s"
    lines = [f"edgemux load: app {result['app']} via {result['gateway']}, {r['arrivals']} {r['offered_rps']:g} "
             f"{unit} for {r['duration_s']:g} s, seed {r['seed']}, timeout {r['timeout_s']:g} s, tensors as "
             f"{TRANSPORTS.get(r['transport'], r['transport'])}"]
    errs = ", ".join(f"{k}: {v}" for k, v in r["errors"].items())
    failed = sum(r["errors"].values())
    lines.append(f"requests: scheduled {r['scheduled']}, sent {r['sent']}, ok {r['ok']}, failed {failed}"
                 + (f" ({errs})" if errs else ""))
    lines.append(f"client: send lateness mean {fmt_ms(r['send_lateness_mean_ms'], 2)} ms, "
                 f"max {fmt_ms(r['send_lateness_max_ms'], 2)} ms")
    if result.get("devices"):
        lines.append("devices: " + ", ".join(
            f"{d['device']} ({d['kind']}, {_backend(d['emulated'])}, weight {d['weight']:.3g})"
            for d in result["devices"]))
    lines.append("")

    def p(key: str) -> str:
        return fmt_ms(pred.get(key)) if pred else "-"

    ci = r["mean_ci_ms"]
    mean_obs = fmt_ms(r["mean_ms"]) + (f" (95% CI {ci[0]:.1f}..{ci[1]:.1f})" if ci else "")
    rows = [
        ["mean ms", mean_obs, p("mean_ms")],
        ["p50 ms", fmt_ms(r["p50_ms"]), p("p50_ms")],
        ["p95 ms", fmt_ms(r["p95_ms"]), p("p95_ms")],
        ["p99 ms", fmt_ms(r["p99_ms"]), p("p99_ms")],
        ["throughput req/s", fmt_ms(r["throughput_rps"], 2), f"{r['offered_rps']:g} offered"],
        ["server queue ms", fmt_ms(r["server"]["queue_ms"], 2), "-"],
        ["server service ms", fmt_ms(r["server"]["service_ms"], 2), "-"],
    ]
    slo = r.get("slo")
    if slo:
        met = {True: "met", False: "missed", None: "-"}[slo["met"]]
        att = "-" if slo["attainment"] is None else f"{100.0 * slo['attainment']:.1f} % of ok within"
        obs = f"{met} ({fmt_ms(slo['observed_ms'])} ms; {att})"
        pmet = "-"
        if pred and pred.get("slo_met") is not None:
            pmet = f"{'met' if pred['slo_met'] else 'missed'} ({fmt_ms(pred.get('at_slo_stat_ms'))} ms)"
        rows.append([f"SLO {slo['stat']} <= {slo['latency_ms']:g} ms", obs, pmet])
    lines.append(render(["metric", "observed", "predicted"], rows))
    if result.get("devices"):
        drows = []
        for d in result["devices"]:
            o = d["observed"] or {}
            drows.append([d["device"], _backend(d["emulated"]), f"{d['weight']:.3g}", o.get("ok", 0),
                          fmt_ms(o.get("mean_ms")), fmt_ms(o.get("queue_ms"), 2), fmt_ms(o.get("service_ms"), 2),
                          fmt_ms(d["predicted"].get("mean_ms")), fmt_ms(d["predicted"].get("p95_ms"))])
        lines.append("")
        lines.append(render(["device", "backend", "weight", "ok", "mean ms", "queue ms", "service ms",
                             "pred mean ms", "pred p95 ms"], drows))
    for n in result.get("notes", []):
        lines.append(f"note: {n}")
    return "\n".join(lines)
