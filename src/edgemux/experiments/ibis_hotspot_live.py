"""``ibis-hotspot-live``: Ibis Fig. 20's story on the local cluster (real processes, emulated Edge TPUs) beside
the cluster simulator on the same timeline.

The simulator's ``ibis-hotspot`` (``experiments.ibis_hotspot``) is replayed on a running edgemux cluster:
``engines.local.Engine`` starts a control plane (policy ``ibis``, the adapt loop on with the default
``AdaptSettings``), a gateway and one agent per node of the same two-node cluster (one emulated Edge TPU
each, driven by the ``ibis-edgetpu`` profiles). The same two apps are applied; the load generator
(``runtime.tools.load``, the simulator's arrival generator) sends both at their contracts through the
gateway, and from ``surge_at_s`` a second Poisson stream of 2x eff's contract (superposed: 3x in all).
The gateway polices (``adapt.police.Policing``, the simulator's rule; the agents take the tokens of what it
forwards without policing it again); the control plane sees the gateway's observations every window, detects,
plans and moves eff make before break.

What is compared (``story``, the same function for both): MobileNetV2's attainment, detection, the move,
the windows from detection until eff's p95 is back under its SLO, and the requests that failed (anything
but a policing refusal; the live run must have 0). The live rows are built from every request's send time
and outcome, by the same windows as the simulator's; detection on the live cluster is the control plane's
``finding`` event (emitted when a finding has been seen ``trigger_windows`` windows in a row) minus
``trigger_windows - 1`` windows, i.e. the end of the first window that saw it, as the simulator counts it.

Units: s, ms, req/s. The live run takes ``horizon_s`` of real time plus the cluster's start (about 10 s).
"""

from __future__ import annotations

import asyncio
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from edgemux.adapt.plan import TRANSITION_KINDS
from edgemux.adapt.settings import AdaptSettings
from edgemux.cluster.specs import apps_to_dict, cluster_to_dict
from edgemux.cluster.state import App
from edgemux.experiments.ibis_hotspot import (
    EFF,
    MOB,
    MODEL_LOAD_S,
    POLICING,
    SURGE_FACTOR,
    story,
    trace,
    two_tpus,
    window_rows,
)
from edgemux.experiments.registry import register
from edgemux.experiments.runner import ExperimentResult, SummaryRow, pyplot, save_figure
from edgemux.policies import get
from edgemux.sim.cluster import Action, AppTotals, ClusterRun, FindingRecord, WindowRow, simulate_cluster

__all__ = ["LiveRun", "live_rows", "run", "run_live"]

NAME = "ibis-hotspot-live"
SURGE_AT_S, HORIZON_S = 30.0, 100.0
QUICK_SURGE_AT_S, QUICK_HORIZON_S = 20.0, 60.0
SETTINGS = AdaptSettings()


@dataclass(frozen=True)
class LiveRun:
    """A live run as the simulator's :class:`ClusterRun` (``run``), plus what only a live run has: the
    requests that ``failed`` per app (an error other than a policing 429), the placement the policy chose at
    the start (``initial``: app -> devices), the control plane's ``events`` (JSON, times relative to the
    load's start in ``t_s``), the load reports (JSON), each app's ``described`` document (``edgemux describe``:
    its placement and predicted latency) ``before`` the load and ``after`` it, and every request of each app
    (``requests``: send times s, answered, latency ms (NaN when not answered), in send order)."""

    run: ClusterRun
    failed: dict[str, int]
    initial: dict[str, tuple[str, ...]]
    events: list[dict[str, Any]]
    reports: dict[str, dict[str, Any]]
    described: dict[str, dict[str, dict[str, Any]]]
    requests: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]

    def observed_ms(self, app: str, stat: str, start_s: float, end_s: float) -> float | None:
        """``app``'s ``stat`` ("mean", "p95", "p99") over the requests sent in ``[start_s, end_s)`` and
        answered (ms; None when none was)."""
        sends, ok, lat = self.requests[app]
        sel = lat[ok & (sends >= start_s) & (sends < end_s)]
        if not sel.size:
            return None
        return float(sel.mean()) if stat == "mean" else float(np.percentile(sel, float(stat[1:])))


def live_rows(app: App, sends_s: np.ndarray, ok: np.ndarray, latency_ms: np.ndarray, refused: np.ndarray,
              horizon_s: float, window_s: float, contract: Any, devices: Any, phase_s: float = 0.0) -> list[WindowRow]:
    """``app``'s rows over ``[0, horizon_s)`` in windows of ``window_s`` (s) whose bounds fall at ``phase_s``
    + k ``window_s`` (the control plane's own windows; the first and last may be shorter), by send time:
    every request's send time (s from the load's start), whether it was answered (``ok``), its latency (ms,
    NaN when not answered) and whether it was refused by policing. ``contract(t)`` and ``devices(t)`` give
    the contract (req/s) and devices in force at ``t`` (s). The same columns as the simulator's rows."""
    order = np.argsort(sends_s, kind="stable")
    sends_s, ok, latency_ms, refused = sends_s[order], ok[order], latency_ms[order], refused[order]
    rows = []
    phase = phase_s % window_s
    bounds = [0.0] + [b for b in np.arange(phase, horizon_s, window_s) if 1e-9 < b < horizon_s - 1e-9] + [horizon_s]
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        a, b = np.searchsorted(sends_s, [lo, hi])
        lat = latency_ms[a:b][ok[a:b]]
        answered = int(lat.size)
        p95 = p99 = mean = None
        if answered:
            p95, p99 = (float(v) for v in np.percentile(lat, [95, 99]))
            mean = float(lat.mean())
        rows.append(WindowRow(lo, hi, app.name, int(b - a), int(np.count_nonzero(refused[a:b])), answered,
                              int(np.count_nonzero(lat <= app.slo.latency_ms)), mean, p95, p99,
                              (b - a) / (hi - lo), float(contract(hi)), tuple(devices(hi))))
    return rows


def _write_inputs(workdir: Path) -> tuple[Path, Path]:
    cluster = workdir / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(cluster_to_dict(two_tpus(), "ibis-hotspot"), sort_keys=False))
    apps = workdir / "apps.yaml"
    apps.write_text(yaml.safe_dump(apps_to_dict([EFF, MOB], "ibis-hotspot"), sort_keys=False))
    return cluster, apps


async def _drive(gateway: str, horizon_s: float, surge_at_s: float, seed: int,
                 keys: dict[str, str | None]) -> dict[str, Any]:
    """Both apps at their contracts for ``horizon_s``; eff's extra stream from ``surge_at_s``; each request
    carries its app's key (``keys``)."""
    from edgemux.runtime.tools.load import run_load

    async def later(delay_s: float, coro: Any) -> Any:
        await asyncio.sleep(delay_s)
        return await coro

    def load(app: App, rate: float, duration: float, s: int) -> Any:
        return run_load(gateway, app.name, rate_rps=rate, duration_s=duration, seed=s, timeout_s=10.0,
                        slo_ms=app.slo.latency_ms, slo_stat=app.slo.stat, key=keys.get(app.name))

    extra = (SURGE_FACTOR - 1.0) * EFF.rate_rps
    mob, eff, surge = await asyncio.gather(
        load(MOB, MOB.rate_rps, horizon_s, seed), load(EFF, EFF.rate_rps, horizon_s, seed + 1),
        later(surge_at_s, load(EFF, extra, horizon_s - surge_at_s, seed + 2)))
    return {"mob": mob, "eff": eff, "surge": surge}


def run_live(seed: int = 0, horizon_s: float = HORIZON_S, surge_at_s: float = SURGE_AT_S,
             settings: AdaptSettings = SETTINGS, workdir: str | Path | None = None) -> LiveRun:
    """Bring up the local cluster, run the timeline (module doc) and return what happened. Raises
    ``EngineError`` (``EngineStartError`` naming the process) when the cluster cannot start or the apps
    are not served."""
    from edgemux.engines.local import Engine, EngineError
    from edgemux.runtime.process import run as run_loop

    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="edgemux-hotspot-")
        workdir = tmp.name
    try:
        work = Path(workdir)
        cluster_file, apps_file = _write_inputs(work)
        options = [f"{k}={getattr(settings, k)}" for k in AdaptSettings.names()]
        with Engine(cluster_file, policy="ibis", heartbeat_s=1.0, adapt_options=options,
                    workdir=work / "cluster") as eng:
            assert eng.controlplane_url is not None and eng.gateway_url is not None
            cp = eng.client(timeout_s=60.0)
            keys = {r.app: r.key for r in cp.apply(apps_file.read_bytes()).results}
            pending = cp.wait_ready([EFF.name, MOB.name], 60.0)
            if pending:
                raise EngineError(f"apps not ready 60 s after they were admitted: {', '.join(pending)}")
            before = {a: cp.describe(a) for a in (EFF.name, MOB.name)}
            initial = {a: tuple(p["device"] for p in d["placement"]["pieces"]) for a, d in before.items()}
            wall0, perf0 = time.time(), time.perf_counter()
            # the load on the serving processes' loop (uvloop when installed): the client's cost is not the cluster's
            reports = run_loop(_drive(eng.gateway_url, horizon_s, surge_at_s, seed, keys))
            events = cp.events()
            after = {a: cp.describe(a) for a in (EFF.name, MOB.name)}
        # the load's start on the wall clock, to put the control plane's events on the load's time axis
        t0_wall = wall0 + (reports["mob"].start_perf_s - perf0)
        return _assemble(reports, events, initial, t0_wall, horizon_s, settings, seed,
                         {"before": before, "after": after})
    finally:
        if tmp is not None:
            tmp.cleanup()


def _assemble(reports: dict[str, Any], events: list[Any], initial: dict[str, tuple[str, ...]], t0_wall: float,
              horizon_s: float, settings: AdaptSettings, seed: int,
              described: dict[str, dict[str, dict[str, Any]]]) -> LiveRun:
    t0_perf = reports["mob"].start_perf_s
    evs = [{**e.to_json(), "t_s": e.time_s - t0_wall} for e in events]
    actions, findings = [], []
    planned: dict[str, dict[str, Any]] = {}
    for e in evs:
        if e["kind"] == "finding":
            f = e["data"]["finding"]
            # the event comes when the finding is acted on, trigger_windows windows after it was first seen
            first = e["t_s"] - (settings.trigger_windows - 1) * settings.window_s
            findings.append(FindingRecord(first, f["kind"], f.get("app"), tuple(f["devices"]), True))
        elif e["kind"] == "move-planned":
            planned[e["app"]] = e
        elif e["kind"] in TRANSITION_KINDS and e["app"] in planned:  # a move, or a contract or weights changed
            p = planned.pop(e["app"])
            came_from = next((a.to_devices for a in reversed(actions) if a.app == e["app"]),
                             initial.get(e["app"], ()))
            actions.append(Action(p["t_s"], e["t_s"], e["app"], came_from,
                                  tuple(t["device"] for t in p["data"]["to"]), float(p["data"]["rate_rps"]),
                                  p["data"]["reason"]["kind"], p["data"]["reason"]["detail"], e["kind"]))

    def contract(app: App) -> Any:
        return lambda t: next((a.rate_rps for a in reversed(actions) if a.app == app.name and a.serve_s <= t),
                              app.rate_rps)

    def devices(app: App) -> Any:
        return lambda t: next((a.to_devices for a in reversed(actions) if a.app == app.name and a.serve_s <= t),
                              initial.get(app.name, ()))

    # the rows follow the control plane's windows (bounds at its events' times), so that "windows after the
    # detection" counts its windows
    phase = evs[0]["t_s"] if evs else 0.0
    rows: list[WindowRow] = []
    totals, failed = [], {}
    requests: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for app, parts in ((EFF, ("eff", "surge")), (MOB, ("mob",))):
        sends, ok, lat, refused = [], [], [], []
        fails = 0
        for part in parts:
            rep = reports[part]
            shift = rep.start_perf_s - t0_perf
            sends.append(rep.offsets_ms / 1000.0 + shift)
            ok.append(rep.ok_mask)
            full = np.full(rep.offsets_ms.size, np.nan)
            full[rep.ok_mask] = rep.latencies_ms
            lat.append(full)
            kinds = rep.kinds
            refused.append(kinds == "429")
            fails += int(np.count_nonzero((kinds != "429") & (kinds != "ok")))
        s, o, la, r = (np.concatenate(x) for x in (sends, ok, lat, refused))
        order = np.argsort(s, kind="stable")
        requests[app.name] = (s[order], o[order], la[order])
        rows += live_rows(app, s, o, la, r, horizon_s, settings.window_s, contract(app), devices(app), phase)
        # totals over the horizon, as the simulator's (the surge stream starts a little late and ends late too)
        h = s < horizon_s
        within = int(np.count_nonzero(h & o & (np.nan_to_num(la, nan=np.inf) <= app.slo.latency_ms)))
        totals.append(AppTotals(app.name, int(np.count_nonzero(h)), int(np.count_nonzero(h & r)),
                                int(np.count_nonzero(h & o)), within))
        failed[app.name] = fails
    run = ClusterRun(horizon_s, seed, settings.window_s, tuple(rows), tuple(actions), (), (), tuple(findings),
                     tuple(totals), (), 0)
    return LiveRun(run, failed, initial, evs, {k: v.to_dict() for k, v in reports.items()}, described, requests)


def _plot(sim: ClusterRun, live: ClusterRun, path: Path, marks: dict[str, dict[str, float]]) -> None:
    """Windowed p95 of both apps, live (solid) and simulated (dotted), the SLOs dashed, and the surge,
    detection and migration times of each run as vertical lines."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.8))
    colors = {EFF.name: "tab:red", MOB.name: "tab:blue"}
    labels = {EFF.name: "EfficientNet-S", MOB.name: "MobileNetV2"}
    for app in (EFF, MOB):
        for tag, res, style in (("live", live, {"lw": 1.6, "ls": "-"}), ("sim", sim, {"lw": 1.0, "ls": ":"})):
            sel = [r for r in res.rows(app.name) if r.p95_ms is not None]
            ax.step([r.start_s for r in sel], [r.p95_ms for r in sel], where="post", color=colors[app.name],
                    label=f"{labels[app.name]} ({tag})", **style)
        ax.axhline(app.slo.latency_ms, color=colors[app.name], lw=0.8, ls="--",
                   label=f"{labels[app.name]} SLO {app.slo.latency_ms:g} ms")
    for tag, ls in (("live", "-"), ("sim", ":")):
        for event, color in (("surge", "grey"), ("detection", "tab:orange"), ("migration", "tab:green")):
            t = marks[tag].get(event)
            if t is not None and math.isfinite(t):
                ax.axvline(t, color=color, lw=1.0, ls=ls, label=f"{event} {tag} ({t:.1f} s)")
    ax.set_yscale("log")
    ax.set_xlabel("time since the load started (s)")
    ax.set_ylabel(f"p95 response time per {SETTINGS.window_s:g} s window (ms)")
    ax.set_title("Hotspot mitigation, local cluster (emulated Edge TPUs) vs simulator", fontsize=10)
    ax.legend(fontsize=6, ncol=2, loc="center right")
    save_figure(fig, path)


@register(NAME)
def run(seed: int = 0, quick: bool = False) -> ExperimentResult:
    surge_at, horizon = (QUICK_SURGE_AT_S, QUICK_HORIZON_S) if quick else (SURGE_AT_S, HORIZON_S)
    sim = simulate_cluster(two_tpus(), get("ibis"), trace(surge_at), horizon_s=horizon, seed=seed,
                           settings=SETTINGS, model_load_s=MODEL_LOAD_S, policing=POLICING)
    live = run_live(seed, horizon, surge_at)
    stories = {"sim": story(sim, surge_at), "live": story(live.run, surge_at)}
    marks = {tag: {"surge": surge_at, "detection": s["detect_s"],
                   "migration": s["move"].serve_s if s["move"] else math.nan} for tag, s in stories.items()}

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.2f} %"

    def check(ok: bool) -> str:
        return "holds" if ok else "DOES NOT HOLD"

    def move_text(s: dict[str, Any]) -> str:
        m = s["move"]
        return (f"{m.time_s:.1f} s -> {m.serve_s:.1f} s, {' '.join(m.from_devices)} -> {' '.join(m.to_devices)} "
                f"at {m.rate_rps:.1f} req/s" if m else "none")

    mob = {tag: res.total(MOB.name) for tag, res in (("sim", sim), ("live", live.run))}
    recover = {tag: s["windows_to_recover"] for tag, s in stories.items()}
    failed = sum(live.failed.values())
    summary = [
        SummaryRow("placement at the start (policy ibis)", "both on one device",
                   f"live: eff {' '.join(live.initial[EFF.name])}, mob {' '.join(live.initial[MOB.name])}",
                   "the simulator: both on n1/tpu0"),
        SummaryRow("MobileNetV2 attainment (answered within 50 ms / all requests)", "not affected by the surge",
                   f"live {pct(mob['live'].attainment)}, sim {pct(mob['sim'].attainment)}",
                   f"{check(min(mob['live'].attainment or 0.0, mob['sim'].attainment or 0.0) >= 0.99)} (>= 99 %, "
                   f"both); live {mob['live'].requests} requests, {mob['live'].refused} refused"),
        SummaryRow("EfficientNet-S p95 during the surge, before the move serves", "exceeds the threshold",
                   f"live {stories['live']['surge_p95_ms']:.0f} ms, sim {stories['sim']['surge_p95_ms']:.0f} ms",
                   f"SLO {EFF.slo.latency_ms:g} ms"),
        SummaryRow("detection (end of the first window that saw the hotspot)", "-",
                   f"live {stories['live']['detect_s']:.1f} s, sim {stories['sim']['detect_s']:.1f} s",
                   f"surge at {surge_at:g} s; windows of {SETTINGS.window_s:g} s (live: the control plane's, "
                   "which do not start with the load; the live rows follow them)"),
        SummaryRow("migration (decided -> new placement serving)", "to a node with idle capacity",
                   f"live {move_text(stories['live'])}; sim {move_text(stories['sim'])}",
                   f"live: make before break through the agents; sim: model load {MODEL_LOAD_S:g} s"),
        SummaryRow("windows after detection until EfficientNet-S's p95 is back under its SLO", "falls below",
                   f"live {recover['live']:.1f}, sim {recover['sim']:.1f}",
                   f"{check(max(recover.values()) <= 3)} (<= 3, both); stays under: live "
                   f"{stories['live']['stays_recovered']}, sim {stories['sim']['stays_recovered']}"),
        SummaryRow("requests failed on the live cluster (not a policing 429)", "-", f"{failed}",
                   f"{check(failed == 0)} (0 during the migration and everywhere else)"),
    ]
    assumptions = [
        "live: engines.local.Engine on this machine (control plane with --policy ibis and the adapt loop, one "
        "gateway, one agent per node), emulated Edge TPUs timed by the ibis-edgetpu profiles; load through the "
        "gateway with runtime.tools.load (binary tensors), end-to-end latency (HTTP and policing waits included)",
        f"timeline: both apps at their contracts (10 req/s, Poisson) for {horizon:g} s; from {surge_at:g} s eff "
        f"gets a second Poisson stream of {(SURGE_FACTOR - 1) * EFF.rate_rps:g} req/s (3x in all)",
        "sim: the same cluster, policy, timeline, policing and AdaptSettings in sim.cluster "
        f"(model load {MODEL_LOAD_S:g} s)",
        "live detection = time of the control plane's finding event minus (trigger_windows - 1) windows",
        f"seed {seed} (arrivals; the live run's timing is real and varies from run to run)",
    ]
    rows = window_rows("live", live.run) + window_rows("sim", sim)
    extra: dict[str, list[dict[str, Any]]] = {
        "events": [{"t_s": round(e["t_s"], 3), "kind": e["kind"], "app": e["app"], "message": e["message"]}
                   for e in live.events],
        "totals": [{"config": tag, "app": t.app, "requests": t.requests, "refused": t.refused,
                    "answered": t.answered, "within_slo": t.within_slo, "attainment": t.attainment,
                    "failed": live.failed.get(t.app, 0) if tag == "live" else 0}
                   for tag, res in (("live", live.run), ("sim", sim)) for t in res.totals],
    }
    return ExperimentResult(name=NAME, title="Ibis Fig. 20 on the local cluster beside the simulator",
                            rows=rows, summary=summary, assumptions=assumptions,
                            plot=lambda rows, path: _plot(sim, live.run, path, marks), extra=extra)
