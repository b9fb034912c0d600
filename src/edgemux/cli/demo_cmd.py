"""``edgemux demo``: the main job on the embedded default, end to end, in about 45 s.

It brings up the local cluster (``engines.local.Engine``: a control plane, a gateway and one agent per node
of ``examples/local/cluster.yaml``, emulated Edge TPUs and a Jetson-class GPU beside one real CPU device,
running ONNX Runtime and, for a ``.tflite`` model, LiteRT), applies the example apps (``examples/local/apps.yaml``: some are admitted, one is rejected and
the reason is printed), drives every admitted app through the gateway at its contracted rate with the
open-loop load generator (``runtime.tools.load``), prints each app's predicted latency (the control plane's
estimate for its pieces) beside the observed one and which devices were emulated, and shuts the cluster
down.

Then, unless ``--no-surge``, a second act shows adaptation (``experiments.ibis_hotspot_live.run_live``, Ibis
Fig. 20 on a second local cluster: two nodes with one emulated Edge TPU each). The ibis policy packs
EfficientNet-S and MobileNetV2 on one TPU; from ``SURGE_AT_S`` EfficientNet-S sends 3x its contract; the
control plane's adapt loop (``window_s`` 2 s) detects the hotspot and moves it to the idle TPU make before
break. The demo prints the control plane's events (detection, planned move, move done) and, per app,
predicted beside observed before the surge, during it and after the move.

Exit code 0 when every step ran (a missed SLO is reported, not an error); bad arguments are one line and
exit code 2.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from edgemux.cli.load_cmd import TRANSPORTS, device_rows, predicted_summary
from edgemux.cli.table import fmt_ms, render
from edgemux.errors import InputError
from edgemux.runtime.controlplane.apiclient import ControlPlaneClient
from edgemux.runtime.process import run as run_loop

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "local"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="bring up the local cluster, admit example apps, drive load, "
                                    "print predicted vs observed, shut down")
    p.add_argument("--cluster", default=str(EXAMPLES / "cluster.yaml"), help="cluster YAML (kind: Cluster)")
    p.add_argument("--apps", default=str(EXAMPLES / "apps.yaml"), help="apps YAML (App or AppList)")
    p.add_argument("--duration", type=float, default=4.0, help="seconds of load per app (default 4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the arrival processes (default 0)")
    p.add_argument("--policy", default="edgemux", help="admission policy (default edgemux)")
    p.add_argument("--no-surge", dest="surge", action="store_false",
                   help="skip the second act (a tenant's load surges; detection and migration)")
    p.set_defaults(func=cmd_demo)


async def _drive(cp: ControlPlaneClient, gateway: str, apps: list[str], duration_s: float,
                 seed: int, keys: dict[str, str | None]) -> list[dict[str, Any]]:
    """Load every app at once at its contracted rate (its own seeded arrival process), each request carrying
    the app's key (``keys``), then report."""
    from edgemux.runtime.tools.load import run_load

    described = {a: cp.describe(a) for a in apps}
    jobs = []
    for i, a in enumerate(apps):
        spec = described[a].get("spec", {}).get("spec", {})
        slo = described[a].get("slo") or {}
        periodic = "fps" in spec
        rate = float(spec["fps"] if periodic else spec["rate"])
        jobs.append(run_load(gateway, a, rate_rps=rate, duration_s=duration_s,
                             arrivals="periodic" if periodic else "poisson", seed=seed + i,
                             slo_ms=slo.get("latency_ms"), slo_stat=slo.get("stat") or "mean", key=keys.get(a)))
    reports = await asyncio.gather(*jobs)
    out = []
    for a, rep in zip(apps, reports):
        slo = described[a].get("slo") or {}
        stat = slo.get("stat") or "mean"
        out.append({"app": a, "slo": slo, "report": rep,
                    "predicted": predicted_summary(described[a], stat, slo.get("latency_ms")),
                    "devices": device_rows(described[a], rep)})
    return out


def _what(piece: dict[str, Any]) -> str:
    """How a piece runs: emulated, or REAL (on LiteRT for a .tflite model, which a real device's backend runs
    on LiteRT: ``runtime.dataplane.backends.FormatBackend``)."""
    if piece["emulated"]:
        return "emulated"
    return "REAL, LiteRT" if str(piece.get("model_source") or "").lower().endswith(".tflite") else "REAL"


def _row(r: dict[str, Any]) -> list[str]:
    rep, pred, slo = r["report"], r["predicted"], r["slo"]
    stat = slo.get("stat") or "mean"
    observed = {"mean": rep.mean_ms, "p95": rep.p95_ms, "p99": rep.p99_ms}.get(stat)
    where = ", ".join(f"{d['device']} ({_what(d)})" for d in r["devices"])
    met = "-" if observed is None or slo.get("latency_ms") is None else (
        "meets" if observed <= slo["latency_ms"] else "MISSES")
    at_device = (None if rep.server_queue_ms is None or rep.server_service_ms is None
                 else rep.server_queue_ms + rep.server_service_ms)
    return [r["app"], where, f"{stat}<={slo.get('latency_ms', 0):g}", fmt_ms(pred.get("mean_ms")),
            fmt_ms(at_device), fmt_ms(rep.mean_ms), fmt_ms(None if at_device is None else rep.mean_ms - at_device),
            fmt_ms(pred.get(f"{stat}_ms") if stat != "mean" else pred.get("mean_ms")),
            fmt_ms(observed), f"{rep.ok}/{rep.sent}", met, TRANSPORTS.get(rep.transport, rep.transport)]


def cmd_demo(args: argparse.Namespace) -> int:
    from edgemux.engines.local import Engine

    if not args.duration > 0:
        raise InputError("--duration", f"must be > 0 s, got {args.duration:g}")
    for what, path in (("--cluster", args.cluster), ("--apps", args.apps)):
        if not Path(path).is_file():
            raise InputError(what, f"no such file: {path}")
    print("edgemux demo: bringing up the local cluster (control plane, gateway, one agent per node)", flush=True)
    with Engine(args.cluster, policy=args.policy, heartbeat_s=1.0) as eng:
        print(eng.summary(), flush=True)
        assert eng.controlplane_url is not None and eng.gateway_url is not None
        cp, gw = eng.client(timeout_s=60.0), eng.gateway_url
        answer = cp.apply(Path(args.apps).read_bytes())
        keys = {r.app: r.key for r in answer.results}
        print(f"\napplied {args.apps} with policy {args.policy}:")
        admitted = []
        for r in answer.results:
            if r.rejection is not None:
                print(f"  {r.app}: REJECTED, {r.rejection.message}")
                continue
            shares = ", ".join(f"{s.device} x{s.weight:.3g}" for s in r.placement.shares) if r.placement else "-"
            keyed = " (its key issued: the load sends it)" if r.key else ""
            print(f"  {r.app}: {r.result} on {shares}{keyed}")
            admitted.append(r.app)
        pending = cp.wait_ready(admitted, 60.0)
        if pending:
            print(f"  not ready after 60 s (models still loading): {', '.join(pending)}; left out of the load")
        ready = [a for a in admitted if a not in pending]
        print(f"\ndriving {len(ready)} apps through the gateway for {args.duration:g} s each, at their contracted "
              "rates (open loop: Poisson, periodic for cameras)", flush=True)
        # on the serving processes' loop (uvloop when installed): the client's own cost is not the servers'
        results = run_loop(_drive(cp, gw, ready, args.duration, args.seed, keys))
    head = ["app", "devices", "SLO", "pred mean", "device mean", "end-to-end mean", "e2e - device", "pred @SLO",
            "obs @SLO", "ok/sent", "observed", "transport"]
    print()
    print(render(head, [_row(r) for r in results]))
    emulated = sorted({d["device"] for r in results for d in r["devices"] if d["emulated"]})
    real = sorted({d["device"] for r in results for d in r["devices"] if d["emulated"] is False})
    print(f"\nemulated devices (timing from their profiles, no accelerator attached): {', '.join(emulated) or '-'}")
    print(f"real devices: {', '.join(real) or '-'}")
    print("pred = end to end from the estimators: device queueing + service + the node's serving path "
          "(declared servingMs or a start-up probe, calibrated each window from the gateways' and agents' "
          "observations) (p95/p99 weighted over pieces, an approximation when split); device mean = queueing + "
          "service as the agents measured them; end-to-end and obs @SLO = "
          "through the gateway, HTTP, decoding and client included; e2e - device = what delivering the request "
          "and its answer cost; transport = how the tensors travelled (shared memory from 256 KiB of tensors: "
          "the load runs on the cluster's host; smaller ones as binary HTTP)")
    print("cluster stopped.")
    if args.surge:
        _surge_act(args.seed)
    return 0


# the second act's timeline (s) and windows: short, so that the demo stays about a minute
SURGE_AT_S, SURGE_HORIZON_S, SURGE_WINDOW_S = 10.0, 30.0, 2.0


def _surge_act(seed: int) -> None:
    """Run the hotspot story on a second local cluster and print what the control plane saw and did, and
    predicted vs observed per app before the surge, during it and after the move."""
    from edgemux.adapt.settings import AdaptSettings
    from edgemux.experiments.ibis_hotspot_live import run_live

    print(f"\nact 2: adaptation. A second local cluster, two nodes with one emulated Edge TPU each (Ibis Fig. 20): "
          f"policy ibis packs eff (EfficientNet-S, 10 req/s, p95<=100 ms) and mob (MobileNetV2, 10 req/s, "
          f"p95<=50 ms) on n1/tpu0; from {SURGE_AT_S:g} s eff sends 3x its contract; the adapt loop looks every "
          f"{SURGE_WINDOW_S:g} s ({SURGE_HORIZON_S:g} s of load)", flush=True)
    live = run_live(seed, SURGE_HORIZON_S, SURGE_AT_S, AdaptSettings(window_s=SURGE_WINDOW_S))
    print("\ncontrol plane events (s since the load started):")
    for e in live.events:
        if e["kind"] != "calibrated":
            print(f"  {e['t_s']:5.1f}  {e['kind']:<13} {e['app'] or '-'}: {e['message']}")
    calibrated = [e for e in live.events if e["kind"] == "calibrated"]
    if calibrated:
        print(f"  (and {len(calibrated)} profile(s) re-calibrated from the agents' measurements)")
    move = next((a for a in live.run.actions if a.app == "eff"), None)
    serve = move.serve_s if move is not None else SURGE_HORIZON_S
    rows = []
    for app in ("eff", "mob"):
        before, after = (live.described[k][app] for k in ("before", "after"))
        stat, slo = before["slo"]["stat"], before["slo"]["latency_ms"]
        phases = [("before the surge", before, 0.0, SURGE_AT_S),
                  ("surge, before the move", before, SURGE_AT_S, serve),
                  ("after the move", after, serve + SURGE_WINDOW_S, SURGE_HORIZON_S)]
        for name, doc, lo, hi in phases:
            if hi <= lo:
                continue
            pieces = doc["placement"]["pieces"]
            pred = pieces[0]["predicted"].get("at_slo_stat_ms") if len(pieces) == 1 else None
            spec = doc["spec"]["spec"]
            obs = live.observed_ms(app, stat, lo, hi)
            rows.append([app, name, " ".join(p["device"] for p in pieces), f"{spec.get('rate', 0):.3g}",
                         f"{stat}<={slo:g}", fmt_ms(pred), fmt_ms(obs),
                         "-" if obs is None else "meets" if obs <= slo else "MISSES"])
    print()
    print(render(["app", "phase", "devices", "contract req/s", "SLO", "pred @SLO", "obs @SLO", "observed"], rows))
    failed = sum(live.failed.values())
    print(f"\nrequests failed (not a policing 429): {failed}; emulated devices: n1/tpu0, n2/tpu0 (timing from "
          "the ibis-edgetpu profiles); pred = the control plane's estimate for the placement and contract of "
          "that phase (during the surge the contract is still the old one: eff's excess waits in its bucket); "
          "obs = end to end through the gateway")
    print("second cluster stopped.")
