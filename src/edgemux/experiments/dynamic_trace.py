"""``dynamic-trace``: a day of tenants that come and go, with a daily load curve, on a 10-node Edge TPU
cluster: static placement, edgemux with adaptation, and a re-place-from-scratch-every-period oracle.

The trace is :func:`edgemux.sim.diurnal.daily_apps` (its module doc gives the generator and every default):
apps declare an off-peak contract and send up to ``peak_ratio`` (0.6-1.8) times it at the afternoon peak.
Each configuration replays it in the cluster simulator (``sim.cluster``, same seed, so the same requests):

- **static**: the Ibis policy admits each app at its declared contract and never moves it; the token bucket
  polices the contract (an app above it waits, then is refused).
- **adapt**: the same, with the adaptation loop (``adapt.loop.step``) every ``SETTINGS.window_s``: the Ibis
  rule re-admits an app whose bucket refuses at its observed rate (in place when it still fits, else on
  another device: a migration, make before break with ``MODEL_LOAD_S``), and reclamation lowers a raised
  contract when the load falls, never below the declared one.
- **oracle**: knows the trace. At every period start (``PERIOD_S``) it places from scratch every app present
  in the period, at its peak rate in the period plus the loop's headroom, with the offline optimum
  (``policies.offline``: the most apps whose every tenant meets its SLO by the estimators, verified by the
  policy check), already-admitted apps first (a prefix), arrivals in order after them; its moves are free
  and instant (``sim.cluster.Place``). An app admitted in an earlier period that the optimum cannot keep
  stays where it was (counted as ``kept``).

Attainment = requests answered within the SLO's latency / all requests of admitted apps (refused ones
count as misses). A migration is a transition that changes an app's devices; a contract changed in place
is not one. Units: s, ms, req/s.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from edgemux.adapt.plan import transition_kind
from edgemux.adapt.settings import AdaptSettings
from edgemux.cluster.state import App, Cluster, Device, Node, Placement, Share
from edgemux.cluster.workload import Discipline
from edgemux.experiments.ibis_capacity import TPU_MEMORY_MB
from edgemux.experiments.registry import register
from edgemux.experiments.runner import ExperimentResult, Progress, SummaryRow, pyplot, save_figure
from edgemux.policies import get
from edgemux.policies.base import Snapshot
from edgemux.policies.moves import share_on
from edgemux.policies.offline import offline_optimum
from edgemux.profiles.types import DeviceKind
from edgemux.sim.cluster import Arrive, ClusterRun, Leave, Place, Rate, TraceEvent, simulate_cluster
from edgemux.sim.diurnal import DailyApps, daily_apps, daily_level

__all__ = ["CONFIGS", "Comparison", "OracleTrace", "app_lives", "compare", "oracle_trace", "peak_rate", "run", "tpus"]

NAME = "dynamic-trace"
CONFIGS = ("static", "adapt", "oracle")
NODES = 10
TRACE = DailyApps()
QUICK_TRACE = replace(TRACE, horizon_s=4 * 3600.0, start_hour=10.0, initial=16)
"""--quick: four hours of the afternoon ramp (10:00-14:00), where loads rise past their contracts."""
SETTINGS = AdaptSettings(window_s=60.0)
"""One-minute windows: a day has 1440 of them, and a minute of a slow app (0.2 req/s) still holds a dozen
requests to judge."""
PERIOD_S = 3600.0
MODEL_LOAD_S = 1.0
ORACLE_NODE_LIMIT = 5000
ORACLE_ROUNDS = 300
"""HiGHS branch-and-bound nodes per solve and cut rounds per period: limits on work, not time, so the oracle
is the same on any host (on the full trace one period needs 195 rounds to prove its optimum)."""


def tpus(n: int = NODES) -> Cluster:
    """``n`` nodes with one Edge TPU each (FCFS, Ibis's Edge TPU profiles; memory no limit, as in
    ``ibis-capacity``: parameters beyond the 8 MB on chip are reloaded at a switch, priced by switch_ms)."""
    return Cluster(tuple(Node(f"n{i}", 4, 4096, (Device(f"n{i}", "tpu0", DeviceKind.EDGETPU, Discipline.FCFS,
                                                        TPU_MEMORY_MB, profile_set="ibis-edgetpu"),))
                         for i in range(n)))


# ------------------------------------------------------------------------------------------- the oracle


@dataclass(frozen=True)
class OracleTrace:
    """The oracle's replay: ``events`` (the trace with its placements: ``Arrive`` with a placement,
    ``Place`` at period starts; apps it never admits left out), the apps it ``rejected``, per period the
    solver's ``statuses``, and ``kept``: admitted apps a period's optimum could not hold (they stayed)."""

    events: tuple[TraceEvent, ...]
    rejected: tuple[str, ...]
    statuses: tuple[str, ...]
    kept: int


def app_lives(trace: Sequence[TraceEvent]) -> tuple[dict[str, App], dict[str, float], dict[str, float],
                                                 dict[str, list[tuple[float, float]]]]:
    """Per app: its declared App, arrival and leave times (s; inf: stays) and its rate steps (s, req/s)."""
    apps: dict[str, App] = {}
    start: dict[str, float] = {}
    end: dict[str, float] = {}
    steps: dict[str, list[tuple[float, float]]] = {}
    for ev in trace:
        if isinstance(ev, Arrive):
            apps[ev.app.name], start[ev.app.name] = ev.app, ev.time_s
            end[ev.app.name] = math.inf
            steps[ev.app.name] = [(ev.time_s, ev.app.rate_rps)]
        elif isinstance(ev, Leave):
            end[ev.app_name] = ev.time_s
        elif isinstance(ev, Rate):
            steps[ev.app_name].append((ev.time_s, ev.rate_rps))
    return apps, start, end, steps


def peak_rate(steps: list[tuple[float, float]], t0: float, t1: float) -> float:
    """The highest rate (req/s) a step history takes in ``[t0, t1)``."""
    now = steps[0][1]
    best = 0.0
    for t, r in steps:
        if t <= t0:
            now = r
        elif t < t1:
            best = max(best, r)
    return max(best, now)


def oracle_trace(trace: Sequence[TraceEvent], cluster: Cluster, horizon_s: float, *, period_s: float = PERIOD_S,
                 headroom: float = SETTINGS.headroom, node_limit: int = ORACLE_NODE_LIMIT,
                 rounds: int = ORACLE_ROUNDS) -> OracleTrace:
    """The oracle's replay of ``trace`` (see the module doc): per period of ``period_s`` (s), the offline
    optimum at each app's peak rate in the period times ``1 + headroom``."""
    apps, start, end, steps = app_lives(trace)
    empty = Snapshot(cluster)  # what share_on resolves profiles on
    where: dict[str, Placement] = {}
    contract: dict[str, float] = {}
    admitted: list[str] = []
    out: list[tuple[float, int, int, TraceEvent]] = []
    rejected: list[str] = []
    statuses: list[str] = []
    kept = 0
    order = {name: i for i, name in enumerate(apps)}
    k = 0
    while k * period_s < horizon_s:
        t0, t1 = k * period_s, min((k + 1) * period_s, horizon_s)
        k += 1
        carried = [n for n in admitted if end[n] > t0]
        coming = [n for n in apps if t0 <= start[n] < t1]
        names = carried + coming
        if not names:
            continue
        rated = [replace(apps[n], rate_rps=max(peak_rate(steps[n], max(t0, start[n]), t1), 1e-3) * (1.0 + headroom))
                 for n in names]
        res = offline_optimum(rated, cluster, criterion="slo", prefix=True, time_limit_s=3600.0,
                              max_nodes=node_limit, max_rounds=rounds,
                              start={n: where[n].shares[0].device for n in carried})
        statuses.append("optimal" if res.optimal else res.status)  # a count at its proven bound is optimal
        for app in rated:
            n = app.name
            pieces = res.assignment.get(n)
            if pieces is None:
                if n in where:
                    kept += 1  # it stays where it was, at its old contract
                else:
                    rejected.append(n)
                continue
            shares = tuple(share_on(app, empty, path, w) for path, w in pieces)
            assert all(isinstance(sh, Share) for sh in shares)  # the optimum places an app only where it runs
            placement = Placement(n, shares, cpu_node=cluster.devices[pieces[0][0]].node)  # type: ignore[arg-type]
            if n in where:
                if placement != where[n] or app.rate_rps != contract[n]:
                    out.append((t0, 1, order[n], Place(t0, n, placement, app.rate_rps)))
            else:
                out.append((start[n], 2, order[n], Arrive(start[n], app, placement)))
                admitted.append(n)
            where[n], contract[n] = placement, app.rate_rps
    keep = set(admitted)
    for ev in trace:
        if isinstance(ev, Rate) and ev.app_name in keep:
            out.append((ev.time_s, 3, order[ev.app_name], ev))
        elif isinstance(ev, Leave) and ev.app_name in keep:
            out.append((ev.time_s, 0, order[ev.app_name], ev))
    out.sort(key=lambda x: (x[0], x[1], x[2]))
    return OracleTrace(tuple(e for *_, e in out), tuple(rejected), tuple(statuses), kept)


# ---------------------------------------------------------------------------------------- the comparison


@dataclass(frozen=True)
class Comparison:
    """The three runs of one trace (``runs[config]``), the apps that arrived, and the oracle's replay."""

    runs: dict[str, ClusterRun]
    arrived: int
    oracle: OracleTrace


def compare(trace: Sequence[TraceEvent], cluster: Cluster, horizon_s: float, *, seed: int = 0,
            settings: AdaptSettings = SETTINGS, period_s: float = PERIOD_S, model_load_s: float = MODEL_LOAD_S,
            progress: Progress | None = None) -> Comparison:
    """Replay ``trace`` (s) on ``cluster`` as static, adapt and oracle (see the module doc), same seed."""
    policy = get("ibis")
    runs: dict[str, ClusterRun] = {}
    runs["static"] = simulate_cluster(cluster, policy, trace, horizon_s=horizon_s, seed=seed, settings=None,
                                      model_load_s=model_load_s, window_s=settings.window_s)
    if progress is not None:
        progress.step()
    runs["adapt"] = simulate_cluster(cluster, policy, trace, horizon_s=horizon_s, seed=seed, settings=settings,
                                     model_load_s=model_load_s)
    if progress is not None:
        progress.step()
    oracle = oracle_trace(trace, cluster, horizon_s, period_s=period_s, headroom=settings.headroom)
    # the oracle's replay numbers its apps' generators in its own arrival order: the admitted apps are the
    # same as in the trace when it admits them all, so the requests are the same too
    runs["oracle"] = simulate_cluster(cluster, policy, oracle.events, horizon_s=horizon_s, seed=seed, settings=None,
                                      model_load_s=model_load_s, window_s=settings.window_s)
    if progress is not None:
        progress.step()
    arrived = sum(isinstance(ev, Arrive) for ev in trace)
    return Comparison(runs, arrived, oracle)


def migrations(run: ClusterRun, oracle: OracleTrace | None = None) -> list[tuple[float, str]]:
    """(time s, app) of every migration: a transition that loaded a model where the app did not run it
    (``Action.moved``, by ``adapt.plan.transition_kind``). For the oracle's run (``oracle`` given) its
    ``Place`` events that did so, by the same function."""
    if oracle is None:
        return [(a.time_s, a.app) for a in run.actions if a.moved]
    before: dict[str, Placement] = {}
    out = []
    for ev in oracle.events:
        if isinstance(ev, Arrive) and ev.placement is not None:
            before[ev.app.name] = ev.placement
        elif isinstance(ev, Place):
            if transition_kind(before[ev.app_name], ev.placement) == "moved":
                out.append((ev.time_s, ev.app_name))
            before[ev.app_name] = ev.placement
    return out


def figures(cmp: Comparison, horizon_s: float) -> dict[str, dict[str, Any]]:
    """Per configuration: attainment, requests, refused, apps admitted, migrations (total, per hour, the most
    any app made within one clock hour), contract changes in place, and the worst hour's attainment."""
    out: dict[str, dict[str, Any]] = {}
    hours = horizon_s / 3600.0
    for tag, run in cmp.runs.items():
        req = sum(t.requests for t in run.totals)
        within = sum(t.within_slo for t in run.totals)
        moves = migrations(run, cmp.oracle if tag == "oracle" else None)
        per_app_hour = Counter((app, int(t // 3600.0)) for t, app in moves)
        in_place = sum(1 for a in run.actions if not a.moved)
        by_hour = _hourly(run)
        worst = min((r["attainment"] for r in by_hour if r["attainment"] is not None), default=None)
        out[tag] = {"attainment": within / req if req else None, "requests": req,
                    "refused": sum(t.refused for t in run.totals), "admitted": len(run.totals),
                    "migrations": len(moves), "migrations_per_hour": len(moves) / hours,
                    "max_per_app_hour": max(per_app_hour.values(), default=0), "in_place": in_place,
                    "reclaims": sum(1 for a in run.actions if a.reason == "under-contract"),
                    "worst_hour": worst}
    return out


def _hourly(run: ClusterRun) -> list[dict[str, Any]]:
    """Per clock hour of the run: requests, refused, within SLO, attainment (None: no request)."""
    acc: dict[int, list[int]] = {}
    for w in run.windows:
        a = acc.setdefault(int(w.start_s // 3600.0), [0, 0, 0])
        a[0] += w.arrivals
        a[1] += w.refused
        a[2] += w.within_slo
    return [{"hour": h, "requests": a[0], "refused": a[1], "within_slo": a[2],
             "attainment": a[2] / a[0] if a[0] else None} for h, a in sorted(acc.items())]


def _plot(rows: list[dict[str, Any]], path: Path, params: DailyApps) -> None:
    """Attainment per hour for each configuration, with the daily curve."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.5))
    styles = {"static": ("tab:red", ":"), "adapt": ("tab:green", "-"), "oracle": ("tab:blue", "--")}
    for tag in CONFIGS:
        sel = [r for r in rows if r["config"] == tag and r["attainment"] is not None]
        color, ls = styles[tag]
        ax.step([params.start_hour + r["hour"] for r in sel], [100 * r["attainment"] for r in sel], where="post",
                color=color, ls=ls, label=tag)
    ax.axhline(99.0, color="grey", lw=0.8, ls="--", label="99 %")
    ax.set_xlabel("clock hour")
    ax.set_ylabel("SLO attainment in the hour (%)")
    ax2 = ax.twinx()
    hs = [h / 4 for h in range(int(params.horizon_s / 900) + 1)]
    ax2.plot([params.start_hour + h for h in hs], [daily_level(params, h * 3600.0) for h in hs], color="black",
             lw=0.6, alpha=0.5)
    ax2.set_ylabel("daily load curve (1 = peak)")
    ax2.set_ylim(0, 1.05)
    ax.set_title(f"dynamic-trace: {NODES} Edge TPUs, apps come and go; their load follows the day", fontsize=10)
    ax.legend(fontsize=8, loc="lower left")
    save_figure(fig, path)


@register(NAME)
def run(seed: int = 0, quick: bool = False) -> ExperimentResult:
    params = QUICK_TRACE if quick else TRACE
    horizon = params.horizon_s
    trace = daily_apps(seed, params)
    progress = Progress(3, NAME)
    cmp = compare(trace, tpus(), horizon, seed=seed, progress=progress)
    progress.close()
    fig = figures(cmp, horizon)
    rows = [{"config": tag, **r} for tag in CONFIGS for r in _hourly(cmp.runs[tag])]
    s, a, o = fig["static"], fig["adapt"], fig["oracle"]

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.2f} %"

    def check(ok: bool) -> str:
        return "holds" if ok else "DOES NOT HOLD"

    gap = (o["attainment"] or 0.0) - (a["attainment"] or 0.0)
    summary = [
        SummaryRow("SLO attainment (requests within SLO / all requests of admitted apps)",
                   "adapt >= 99 % where static is not",
                   f"static {pct(s['attainment'])}, adapt {pct(a['attainment'])}, oracle {pct(o['attainment'])}",
                   f"{check((a['attainment'] or 0) >= 0.99 and (s['attainment'] or 1) < 0.99)}; refused by policing: "
                   f"static {s['refused']}, adapt {a['refused']}, oracle {o['refused']} of {s['requests']}"),
        SummaryRow("worst clock hour's attainment", "-",
                   f"static {pct(s['worst_hour'])}, adapt {pct(a['worst_hour'])}, oracle {pct(o['worst_hour'])}",
                   "static loses most at the afternoon peak, when apps send up to 1.8x their contracts"),
        SummaryRow("apps admitted", "-",
                   f"static {s['admitted']}, adapt {a['admitted']}, oracle {o['admitted']} of {cmp.arrived}",
                   f"oracle: {cmp.oracle.kept} time(s) an admitted app stayed put because a period's optimum "
                   f"could not hold it; solver status per period: {dict(Counter(cmp.oracle.statuses))}"),
        SummaryRow("migrations (devices changed)", "at most 1 per app per hour (no oscillation)",
                   f"adapt {a['migrations']} ({a['migrations_per_hour']:.2f}/h, at most {a['max_per_app_hour']} "
                   f"per app in any hour), oracle {o['migrations']} ({o['migrations_per_hour']:.2f}/h, at most "
                   f"{o['max_per_app_hour']})",
                   f"{check(a['max_per_app_hour'] <= 1)} for adapt; contracts changed in place: "
                   f"{a['in_place']} ({a['reclaims']} of them reclaimed as the load fell)"),
        SummaryRow("distance to the oracle", "within a stated distance",
                   f"{100 * gap:+.2f} points of attainment, {o['admitted'] - a['admitted']:+d} apps admitted, "
                   f"{a['migrations'] - o['migrations']:+d} migrations",
                   "oracle minus adapt; the oracle knows each period's peak rates and moves for free"),
    ]
    assumptions = [
        f"cluster: {NODES} nodes x 1 Edge TPU (FCFS with model switches, Ibis's Edge TPU profiles), policy ibis",
        f"trace: sim.diurnal.DailyApps defaults{' with ' + _diff(params) if params != TRACE else ''}: "
        f"{params.initial} apps at t = 0 (mean life {params.initial_mean_life_s / 3600:g} h), arrivals up to "
        f"{params.arrivals_per_hour:g}/h following the daily curve (mean life {params.mean_life_s / 3600:g} h), "
        f"models {', '.join(params.models)}; contract = {params.utilization[0]:g}-{params.utilization[1]:g} of a "
        f"TPU by exec + switch time; {params.slo_stat} SLO = {params.slo_factor[0]:g}-{params.slo_factor[1]:g}x "
        f"that time; actual rate = contract x U({params.peak_ratio[0]:g}, {params.peak_ratio[1]:g}) x daily "
        f"curve ({params.night_level:g} at night, 1 at {params.peak_hour:g}:00), in {params.step_s / 60:g}-min "
        "steps; Poisson requests. No paper gives such a trace: every figure is the generator's parameter",
        f"adapt: AdaptSettings with window_s={SETTINGS.window_s:g} (others default: trigger_windows "
        f"{SETTINGS.trigger_windows}, min_dwell {SETTINGS.min_dwell_s:g} s, headroom {SETTINGS.headroom:g}); "
        f"a migration's model load {MODEL_LOAD_S:g} s, make before break",
        "policing: adapt.police.Policing defaults (1.1x the contract, 4 s or 40 requests deep, 0.5 s longest "
        "wait) in every configuration",
        f"oracle: every {PERIOD_S / 3600:g} h the offline optimum (policies.offline, criterion slo, prefix: "
        f"admitted apps first) at each app's peak rate in the period x {1 + SETTINGS.headroom:g}; "
        f"HiGHS node limit {ORACLE_NODE_LIMIT} per solve, {ORACLE_ROUNDS} cut rounds per period; moves instant "
        "and free",
        f"horizon {horizon / 3600:g} h from {params.start_hour:g}:00 (full: 24 h; --quick: 4 h of the afternoon "
        f"ramp), seed {seed} (trace and requests)",
    ]
    extra: dict[str, list[dict[str, Any]]] = {
        "figures": [{"config": tag, **fig[tag]} for tag in CONFIGS],
        "migrations": [{"config": tag, "time_s": t, "app": app} for tag in ("adapt", "oracle")
                       for t, app in migrations(cmp.runs[tag], cmp.oracle if tag == "oracle" else None)],
        "actions": [{"time_s": x.time_s, "app": x.app, "from": " ".join(x.from_devices),
                     "to": " ".join(x.to_devices), "rate_rps": x.rate_rps, "reason": x.reason, "moved": x.moved}
                    for x in cmp.runs["adapt"].actions],
    }
    return ExperimentResult(name=NAME, title=f"dynamic-trace: a day of come-and-go tenants on {NODES} Edge TPUs",
                            rows=rows, summary=summary, assumptions=assumptions,
                            plot=lambda rows, path: _plot(rows, path, params), extra=extra)


def _diff(params: DailyApps) -> str:
    return ", ".join(f"{k}={getattr(params, k)!r}" for k in ("horizon_s", "start_hour", "initial")
                     if getattr(params, k) != getattr(TRACE, k))
