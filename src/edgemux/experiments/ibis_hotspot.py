"""``ibis-hotspot``: Ibis Fig. 20 (§4.4.6, police-and-migrate of §4.2) in the cluster simulator.

Two Raspberry Pi nodes with one Edge TPU each. EfficientNet-S ("eff", 10 req/s, p95 <= 100 ms) and
MobileNetV2 ("mob", 10 req/s, p95 <= 50 ms) arrive at t = 0 and the Ibis policy packs both on n1/tpu0 (its
default "tight" bin packing: the admission's models predict p95 44 and 34 ms there, so it fits; a spreading
policy would put them apart and there would be no hotspot to show). At ``SURGE_AT_S`` eff starts sending 3x
its contract. Each app's token bucket queues (and, past its longest wait, refuses) eff's excess, so mob keeps
its SLO while eff's own response time rises past its own; the adaptation loop (``adapt.loop.step``, default
``AdaptSettings``) sees the violation, and after two windows (``trigger_windows``) moves eff, re-admitted at
1.1x its observed rate, to the idle n2/tpu0. The same trace without the loop (static placement) is run
beside it.

Rows: per configuration (adapt, static), window and app: the window's start (s), p95/p99/mean response time
(ms), arrivals, refused, answered, answered within the SLO, the devices serving and the contract (req/s).
Units: s, ms, req/s.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from edgemux.adapt.plan import HOTSPOT_KINDS
from edgemux.adapt.settings import AdaptSettings
from edgemux.cluster.state import App, Cluster, Device, Node, Slo
from edgemux.cluster.workload import Discipline
from edgemux.experiments.registry import register
from edgemux.experiments.runner import ExperimentResult, SummaryRow, pyplot, save_figure
from edgemux.policies import get
from edgemux.profiles.types import DeviceKind
from edgemux.sim.cluster import Arrive, ClusterRun, Policing, Rate, simulate_cluster

__all__ = ["EFF", "MOB", "MODEL_LOAD_S", "POLICING", "SURGE_AT_S", "SURGE_FACTOR", "run", "story", "trace", "two_tpus",
           "window_rows"]

NAME = "ibis-hotspot"
EFF = App("eff", "efficientnet-S", 10.0, Slo(100.0, "p95"))
MOB = App("mob", "mobilenet_v2", 10.0, Slo(50.0, "p95"))
SURGE_AT_S = 60.0
SURGE_FACTOR = 3.0
HORIZON_S, QUICK_HORIZON_S = 600.0, 180.0
MODEL_LOAD_S = 1.0
SETTINGS = AdaptSettings()
POLICING = Policing()


def two_tpus() -> Cluster:
    """Two nodes with one Edge TPU each: FCFS, Ibis's profiles, 12 MB of parameter memory (both models fit
    one device at once, 6.56 + 3.75 MB: the experiment is about load, not memory)."""
    def tpu(node: str) -> Device:
        return Device(node, "tpu0", DeviceKind.EDGETPU, Discipline.FCFS, 12.0, profile_set="ibis-edgetpu")

    return Cluster((Node("n1", 4, 4096, (tpu("n1"),)), Node("n2", 4, 4096, (tpu("n2"),))))


def trace(surge_at_s: float = SURGE_AT_S) -> list[Arrive | Rate]:
    """Both apps at t = 0 at their contracts; eff at ``SURGE_FACTOR`` x its contract from ``surge_at_s`` (s)."""
    return [Arrive(0.0, EFF), Arrive(0.0, MOB), Rate(surge_at_s, EFF.name, SURGE_FACTOR * EFF.rate_rps)]


def window_rows(tag: str, res: ClusterRun) -> list[dict[str, Any]]:
    """The CSV rows of a run (simulated or live) tagged ``config=tag``: one per window and app."""
    return [{"config": tag, "t_s": w.start_s, "app": w.app, "p95_ms": _r(w.p95_ms), "p99_ms": _r(w.p99_ms),
             "mean_ms": _r(w.mean_ms), "arrivals": w.arrivals, "refused": w.refused, "answered": w.answered,
             "within_slo": w.within_slo, "devices": " ".join(w.devices), "contract_rps": round(w.contract_rps, 3)}
            for w in res.windows]


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def _over(p95: float | None, slo_ms: float) -> bool:
    return p95 is None or p95 > slo_ms


def story(res: ClusterRun, surge_at_s: float = SURGE_AT_S) -> dict[str, Any]:
    """The figures of an adaptive run (simulated or live): detection (the end of the first window in which
    a hotspot finding on n1/tpu0 was seen), the first migration of eff (a transition that changed its
    devices; ``moves`` counts them, ``in_place`` the contract changes that kept the placement), the windows
    from detection until eff's p95 is back under its SLO, whether it stays there, and eff's worst p95
    between the surge and the move (times in s, latencies in ms)."""
    hot = [f.time_s for f in res.findings
           if f.kind in HOTSPOT_KINDS and f.time_s > surge_at_s and "n1/tpu0" in f.devices]
    detect_s = min(hot) if hot else math.nan
    moves = [a for a in res.actions if a.app == EFF.name and a.moved]
    move = moves[0] if moves else None
    eff = res.rows(EFF.name)
    w = res.window_s
    back = next((r for r in eff if r.start_s >= detect_s and not _over(r.p95_ms, EFF.slo.latency_ms)), None)
    windows_to_recover = (back.end_s - detect_s) / w if back is not None else math.inf
    stays = back is not None and all(not _over(r.p95_ms, EFF.slo.latency_ms) for r in eff if r.start_s >= back.start_s)
    surge = [r.p95_ms for r in eff if r.start_s >= surge_at_s and (move is None or r.end_s <= move.serve_s)]
    return {"detect_s": detect_s, "move": move, "moves": sum(a.moved for a in res.actions),
            "in_place": sum(not a.moved for a in res.actions), "windows_to_recover": windows_to_recover,
            "recovered_s": back.end_s if back is not None else math.nan, "stays_recovered": stays,
            "surge_p95_ms": max((p for p in surge if p is not None), default=math.nan)}


def _plot(rows: list[dict[str, Any]], path: Path, marks: dict[str, float]) -> None:
    """Windowed p95 of both apps (adapt solid, static dotted) on a log scale, the SLOs dashed, and the
    surge, detection and migration (new placement serving) times as vertical lines."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.8))
    colors = {EFF.name: "tab:red", MOB.name: "tab:blue"}
    labels = {EFF.name: "EfficientNet-S", MOB.name: "MobileNetV2"}
    for app in (EFF, MOB):
        for tag, style in (("adapt", {"lw": 1.6, "ls": "-"}), ("static", {"lw": 0.9, "ls": ":"})):
            sel = [r for r in rows if r["config"] == tag and r["app"] == app.name and r["p95_ms"] is not None]
            ax.step([r["t_s"] for r in sel], [r["p95_ms"] for r in sel], where="post", color=colors[app.name],
                    label=f"{labels[app.name]} ({tag})", **style)
        ax.axhline(app.slo.latency_ms, color=colors[app.name], lw=0.8, ls="--",
                   label=f"{labels[app.name]} SLO {app.slo.latency_ms:g} ms")
    for event, color in (("surge", "grey"), ("detection", "tab:orange"), ("migration", "tab:green")):
        if event in marks:
            ax.axvline(marks[event], color=color, lw=1.0, label=f"{event} ({marks[event]:g} s)")
    ax.set_yscale("log")
    ax.set_xlabel("time (s)")
    ax.set_ylabel(f"p95 response time per {SETTINGS.window_s:g} s window (ms)")
    ax.set_title("Hotspot mitigation with token bucket (Ibis Fig. 20): eff at 3x its contract from "
                 f"{SURGE_AT_S:g} s", fontsize=10)
    ax.legend(fontsize=7, ncol=2, loc="center right")
    save_figure(fig, path)


@register(NAME)
def run(seed: int = 0, quick: bool = False) -> ExperimentResult:
    horizon = QUICK_HORIZON_S if quick else HORIZON_S
    cluster, policy = two_tpus(), get("ibis")
    adapt = simulate_cluster(cluster, policy, trace(), horizon_s=horizon, seed=seed, settings=SETTINGS,
                             model_load_s=MODEL_LOAD_S, policing=POLICING)
    static = simulate_cluster(cluster, policy, trace(), horizon_s=horizon, seed=seed, settings=None,
                              model_load_s=MODEL_LOAD_S, policing=POLICING)
    s = story(adapt)
    move = s["move"]
    rows = window_rows("adapt", adapt) + window_rows("static", static)
    marks = {e: t for e, t in (("surge", SURGE_AT_S), ("detection", s["detect_s"]),
                                ("migration", move.serve_s if move else math.nan)) if math.isfinite(t)}

    mob_a, mob_s = adapt.total(MOB.name), static.total(MOB.name)
    eff_a, eff_s = adapt.total(EFF.name), static.total(EFF.name)
    static_eff_after = [r for r in static.rows(EFF.name) if r.start_s >= SURGE_AT_S]
    static_over = sum(_over(r.p95_ms, EFF.slo.latency_ms) for r in static_eff_after)

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.2f} %"

    def check(ok: bool) -> str:
        return "holds" if ok else "DOES NOT HOLD"

    summary = [
        SummaryRow("MobileNetV2 attainment over the run (answered within 50 ms / all requests)",
                   "not affected by the surge (token bucket)",
                   f"adapt {pct(mob_a.attainment)}, static {pct(mob_s.attainment)}",
                   f"{check(min(mob_a.attainment or 0.0, mob_s.attainment or 0.0) >= 0.99)} (>= 99 %); "
                   f"{mob_a.requests} requests, {mob_a.refused} refused"),
        SummaryRow("EfficientNet-S p95 during the surge, before the move serves", "exceeds the latency threshold",
                   f"{s['surge_p95_ms']:.0f} ms (SLO {EFF.slo.latency_ms:g} ms)",
                   f"{check(s['surge_p95_ms'] > EFF.slo.latency_ms)}; its excess waits up to "
                   f"{POLICING.max_wait_s:g} s in its own bucket, then is refused (429)"),
        SummaryRow("detection (first hotspot finding after the surge)", "violations observed by monitoring",
                   f"{s['detect_s']:g} s", f"surge at {SURGE_AT_S:g} s; the first {SETTINGS.window_s:g} s window "
                   "with the surge in it"),
        SummaryRow("migration (decided -> new placement serving)", "to a new node with idle capacity",
                   (f"{move.time_s:g} s -> {move.serve_s:g} s, {' '.join(move.from_devices)} -> "
                    f"{' '.join(move.to_devices)} at {move.rate_rps:.1f} req/s" if move else "none"),
                   f"{s['moves']} move(s), {s['in_place']} contract change(s) in place; acted after "
                   f"trigger_windows={SETTINGS.trigger_windows} windows, "
                   f"model load {MODEL_LOAD_S:g} s; reason {move.reason if move else '-'}"),
        SummaryRow("windows after detection until EfficientNet-S's p95 is back under its SLO",
                   "response time falls below the threshold",
                   f"{s['windows_to_recover']:g} (at {s['recovered_s']:g} s)",
                   f"{check(s['windows_to_recover'] <= 3)} (<= 3); "
                   + ("stays under for the rest of the run" if s["stays_recovered"] else "does NOT stay under")),
        SummaryRow("EfficientNet-S attainment over the run", "-",
                   f"adapt {pct(eff_a.attainment)}, static {pct(eff_s.attainment)}",
                   f"static: {static_over}/{len(static_eff_after)} windows after the surge over its SLO, "
                   f"{eff_s.refused} of {eff_s.requests} requests refused"),
    ]
    rate, burst = POLICING.contract(EFF.rate_rps, EFF.burst)
    assumptions = [
        "cluster: 2 nodes x 1 Edge TPU (FCFS, Ibis Edge TPU profiles: EfficientNet-S 9.83 ms + 17.33 ms switch, "
        "MobileNetV2 4.91 ms + 10.43 ms switch, deterministic), 12 MB parameter memory so both fit one TPU",
        "placement: the Ibis policy (tight bin packing, its default) puts both apps on n1/tpu0 at their "
        "contracts (predicted p95 44 and 34 ms); this co-location is what makes a hotspot possible",
        f"load: Poisson at the contract (10 req/s each); from {SURGE_AT_S:g} s eff sends {SURGE_FACTOR:g}x "
        "(30 req/s). The paper does not give its rates or surge factor",
        f"policing: each app's bucket refills at contract x {1 + POLICING.rate_margin:g} ({rate:g} req/s for "
        f"eff), depth {POLICING.burst_s:g} s of that ({burst:g} requests), requests wait up to "
        f"{POLICING.max_wait_s:g} s for a token, else are refused (429); after the move the bucket polices "
        "the new contract",
        f"adaptation: AdaptSettings defaults (window {SETTINGS.window_s:g} s, trigger_windows "
        f"{SETTINGS.trigger_windows}, min_dwell {SETTINGS.min_dwell_s:g} s, headroom {SETTINGS.headroom:g}, "
        f"min_samples {SETTINGS.min_samples}); a move's model load takes {MODEL_LOAD_S:g} s (make before break: "
        "the old placement serves meanwhile)",
        "the controller judges a window on the requests that arrived in it, with the latencies of those "
        "answered by its end; the rows are recomputed afterwards from every request's final latency",
        f"horizon {horizon:g} s (full run {HORIZON_S:g} s, quick {QUICK_HORIZON_S:g} s), seed {seed}; "
        "static = the same trace without the adaptation loop",
        "Fig. 20 has no numbers in the text: the paper's column is its qualitative claim",
    ]
    extra: dict[str, list[dict[str, Any]]] = {
        "actions": [{"time_s": a.time_s, "serve_s": a.serve_s, "app": a.app, "from": " ".join(a.from_devices),
                     "to": " ".join(a.to_devices), "rate_rps": a.rate_rps, "reason": a.reason, "detail": a.detail}
                    for a in adapt.actions],
        "findings": [{"time_s": f.time_s, "kind": f.kind, "app": f.app, "devices": " ".join(f.devices),
                      "acted": f.acted} for f in adapt.findings if f.time_s >= SURGE_AT_S],
        "totals": [{"config": tag, "app": t.app, "requests": t.requests, "refused": t.refused,
                    "answered": t.answered, "within_slo": t.within_slo, "attainment": t.attainment}
                   for tag, res in (("adapt", adapt), ("static", static)) for t in res.totals],
    }
    return ExperimentResult(name=NAME, title="Ibis Fig. 20: hotspot mitigation with token bucket (2 Edge TPUs)",
                            rows=rows, summary=summary, assumptions=assumptions,
                            plot=lambda rows, path: _plot(rows, path, marks), extra=extra)
