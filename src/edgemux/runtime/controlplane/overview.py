"""The cluster at a glance (``GET /v1/nodes``, ``GET /v1/devices``, ``GET /v1/overview``, the dashboard and the
scrape-time gauges of ``/metrics``): every node and device with what the estimators predict beside what the
agents report, every app with its predicted latency beside the last windows' observed one. Read from the
managers that own each part, changing nothing (``describe`` does the same for one app).

Predicted figures are end to end (device queueing + service, CPU stage, network, the node's serving path) from
the current snapshot; an app split over several devices gets its pieces' predictions weighted by their shares
(exact for the mean, an approximation for a percentile, as ``edgemux load`` says). Observed figures are the
agents' last heartbeats (device utilization: the fraction of the agent's window with an execution in flight;
queue depth) and the last closed adaptation window (app latency, rate).

:class:`Timeline` keeps, per app, one point per closed window (predicted and observed at the app's SLO
statistic, the mean, the rate), so predicted beside observed over time is at hand without a Prometheus.

Units: ``*_ms`` milliseconds, ``*_rps`` requests/s, ``*_s`` seconds, ``*_mb`` MB; ``time_s``: Unix time (s).
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgemux.perf.device import predict_device
from edgemux.policies.base import Snapshot, device_spec
from edgemux.runtime.controlplane.common import describe_exc, num
from edgemux.runtime.controlplane.prediction import meets_slo, weighted_prediction

if TYPE_CHECKING:
    from edgemux.cluster.state import Device, Placement
    from edgemux.perf.device import TenantEstimate
    from edgemux.policies.base import DeviceLoad
    from edgemux.runtime.controlplane.service import ControlPlane

__all__ = ["Timeline", "TimelinePoint", "app_views", "device_predictions", "device_views", "node_views",
           "observed_view", "overview", "predicted_view"]
TIMELINE_POINTS = 360  # per app: 6 hours of 60 s windows, an hour of 10 s ones


# --------------------------------------------------------------------------------------------- predictions


@dataclass(frozen=True)
class DevicePrediction:
    """One device's estimate: its utilization from all its tenants (dimensionless; None when the estimator
    failed) and each tenant's estimate by app name (empty on failure, with ``error`` saying why)."""

    utilization: float | None
    tenants: Mapping[str, TenantEstimate]
    error: str | None = None


def device_predictions(cp: ControlPlane, snap: Snapshot | None = None) -> dict[str, DevicePrediction]:
    """Every device's prediction from the current snapshot, one estimator call per device (by device path).
    A device whose aggregates are the very object of the last call (the control plane's snapshot carries an
    unchanged device's over from change to change: ``reconciler.Reconciler.snapshot``) on the same device
    keeps its prediction: the estimators are pure, so it is what they would give again (every window's
    ``record_window`` and every scrape pay only for the devices that changed)."""
    snap = cp.snapshot() if snap is None else snap
    memo = _PREDICTIONS.setdefault(cp, {})
    out: dict[str, DevicePrediction] = {}
    for path, dev in cp.cluster.devices.items():
        load = snap.load(path)
        if not load.tenants:
            out[path] = DevicePrediction(0.0, {})
            continue
        hit = memo.get(path)
        if hit is not None and hit[0] is load and hit[1] is dev:
            out[path] = hit[2]
            continue
        spec = device_spec(dev)
        tenants = list(load.tenants)
        try:
            ests = predict_device(spec, tenants)
            # every tenant's estimate carries the device's utilization from all its tenants (rho)
            out[path] = DevicePrediction(next(iter(ests.values())).rho, ests)
        except Exception as e:  # an estimator that cannot say: report it, never fail a view
            out[path] = DevicePrediction(None, {}, describe_exc(e))
        memo[path] = (load, dev, out[path])
    return out


# control plane -> device path -> (its aggregates, the device, their prediction): device_predictions' memo
_PREDICTIONS: weakref.WeakKeyDictionary[ControlPlane, dict[str, tuple[DeviceLoad, Device, DevicePrediction]]] = \
    weakref.WeakKeyDictionary()


def estimate_json(est: TenantEstimate) -> dict[str, Any]:
    """One tenant's estimate for JSON (ms)."""
    return {"mean_ms": num(est.mean_ms), "p50_ms": num(est.p50_ms), "p95_ms": num(est.p95_ms),
            "p99_ms": num(est.p99_ms), "device_ms": num(est.device_ms)}


# ---------------------------------------------------------------------------------------------- timeline


@dataclass(frozen=True)
class TimelinePoint:
    """One app at one window's close (``time_s``: Unix time, s): predicted and observed latency at its SLO
    statistic and their means (ms; None unknown, "unstable" predicted), the observed rate (req/s) and the
    requests refused or failed in the window."""

    time_s: float
    predicted_ms: float | str | None
    observed_ms: float | None
    predicted_mean_ms: float | str | None
    observed_mean_ms: float | None
    rate_rps: float
    lost: int

    def to_json(self) -> dict[str, Any]:
        return {"time_s": self.time_s, "predicted_ms": self.predicted_ms, "observed_ms": self.observed_ms,
                "predicted_mean_ms": self.predicted_mean_ms, "observed_mean_ms": self.observed_mean_ms,
                "rate_rps": round(self.rate_rps, 3), "lost": self.lost}


class Timeline:
    """The last ``points`` closed windows of each app (:class:`TimelinePoint`), oldest first."""

    def __init__(self, points: int = TIMELINE_POINTS) -> None:
        self.points = points
        self.series: dict[str, deque[TimelinePoint]] = {}

    def record(self, app: str, point: TimelinePoint) -> None:
        """Add ``point`` to the app's series (the oldest goes beyond ``points``)."""
        self.series.setdefault(app, deque(maxlen=self.points)).append(point)

    def keep(self, apps: Iterable[str]) -> None:
        """Forget the apps not in ``apps`` (deleted)."""
        keep = set(apps)
        for name in [a for a in self.series if a not in keep]:
            del self.series[name]

    def of(self, app: str, since_s: float = 0.0) -> list[TimelinePoint]:
        """The app's points after ``since_s`` (Unix time, s)."""
        return [p for p in self.series.get(app, ()) if p.time_s > since_s]

    def attainment(self, app: str, slo_ms: float) -> float | None:
        """The fraction of the app's recorded windows whose observed latency met ``slo_ms`` (None: no window
        with an answered request)."""
        seen = [p.observed_ms for p in self.series.get(app, ()) if p.observed_ms is not None]
        return sum(1 for v in seen if v <= slo_ms) / len(seen) if seen else None


def record_window(cp: ControlPlane, time_s: float) -> None:
    """Add the window that just closed (at ``time_s``, Unix time, s) to ``cp.adaptation.timeline``: per app
    its prediction now and what was observed."""
    # the numbers app_views shows, without building its views (10,000 apps at 1,000 nodes: most of a cycle)
    preds = device_predictions(cp)
    rec = cp.reconciler
    timeline = cp.adaptation.timeline
    timeline.keep(rec.apps)
    for name, app in rec.apps.items():
        pred = predicted_view(cp, preds, name, rec.placements[name], app.slo.stat)
        obs = observed_view(cp, name) or {}
        timeline.record(name, TimelinePoint(
            # the time as JSON shows it, so that ?since= a shown time excludes that point
            round(time_s, 3), pred["at_slo_stat_ms"], obs.get("at_slo_stat_ms"), pred["mean_ms"], obs.get("mean_ms"),
            float(obs.get("rate_rps") or 0.0), int(obs.get("refused") or 0) + int(obs.get("failed") or 0)))
    kept = _APP_PREDICTIONS.get(cp, {})
    for gone in kept.keys() - rec.apps.keys():   # deleted apps' kept predictions
        del kept[gone]


def predicted_view(cp: ControlPlane, preds: Mapping[str, DevicePrediction], name: str, placement: Placement,
                   stat: str) -> dict[str, Any]:
    """The app's predicted latency end to end (ms), weighted over its pieces (``weighted_prediction``), with
    ``at_slo_stat_ms``: the value at its SLO statistic. Kept per app while its placement and its devices'
    predictions are the very objects of the last call (``device_predictions`` keeps those of unchanged
    devices), as the estimators are pure: a window's ``record_window`` then recomputes only the apps on
    changed devices."""
    memo = _APP_PREDICTIONS.setdefault(cp, {})
    inputs = tuple(preds[s.device] for s in placement.shares)
    hit = memo.get(name)
    if hit is not None and hit[0] is placement and hit[1] == stat and all(
            a is b for a, b in zip(hit[2], inputs)):
        return dict(hit[3])
    pred = _predicted(preds, name, placement, stat)
    memo[name] = (placement, stat, inputs, pred)
    return dict(pred)


# control plane -> app -> (its placement, SLO statistic, its devices' predictions, its prediction): predicted_view's
_APP_PREDICTIONS: weakref.WeakKeyDictionary[
    ControlPlane, dict[str, tuple[Placement, str, tuple[DevicePrediction, ...], dict[str, Any]]]] = \
    weakref.WeakKeyDictionary()


def _predicted(preds: Mapping[str, DevicePrediction], name: str, placement: Placement, stat: str
               ) -> dict[str, Any]:
    pieces = []
    for share in placement.shares:
        est = preds[share.device].tenants.get(name)
        pieces.append((share.weight, None if est is None else estimate_json(est)))
    pred: dict[str, Any] = dict(weighted_prediction(pieces))
    pred["at_slo_stat_ms"] = pred.get(f"{stat}_ms")
    return pred


def observed_view(cp: ControlPlane, name: str) -> dict[str, Any] | None:
    """The app's last closed window (rate, losses, latency statistics; ms, req/s), None before one."""
    w = cp.adaptation.windows.get(name)
    if w is None:
        return None
    lat = w.latency
    stat = None if lat is None else lat.at(cp.reconciler.apps[name].slo.stat)
    return {"window_s": round(w.duration_s, 3), "rate_rps": round(w.rate_rps, 3), "arrivals": w.arrivals,
            "refused": w.refused, "failed": w.failed, "answered": lat.count if lat else 0,
            "mean_ms": num(lat.mean_ms) if lat else None, "p50_ms": num(lat.p50_ms) if lat else None,
            "p95_ms": num(lat.p95_ms) if lat else None,
            "p99_ms": num(lat.p99_ms) if lat else None, "at_slo_stat_ms": num(stat)}



# ----------------------------------------------------------------------------------------------- views


def device_views(cp: ControlPlane, preds: Mapping[str, DevicePrediction] | None = None,
                 snap: Snapshot | None = None) -> list[dict[str, Any]]:
    """Every device in cluster order: kind, discipline, real or emulated (as its agent reports; None before
    it registers), power, tenants with their shares, utilization predicted and observed, queue."""
    snap = cp.snapshot() if snap is None else snap
    preds = device_predictions(cp, snap) if preds is None else preds
    tenants: dict[str, list[dict[str, Any]]] = {p: [] for p in cp.cluster.devices}
    for app, placement in cp.reconciler.placements.items():
        for share in placement.shares:
            tenants[share.device].append({"app": app, "weight": share.weight, "profile": share.profile})
    now = cp.clock()
    out = []
    for path, dev in cp.cluster.devices.items():
        agent = cp.reconciler.agents.get(dev.node)
        seen = agent.devices.get(dev.name) if agent is not None else None
        seen = seen if isinstance(seen, dict) else None
        pred = preds[path]
        node_power = cp.power.state(dev.node)
        out.append({
            "path": path, "node": dev.node, "name": dev.name, "kind": dev.kind.value,
            "discipline": dev.discipline.value, "memory_mb": dev.memory_mb,
            "memory_used_mb": round(snap.load(path).memory_used_mb, 3),
            "backend": seen.get("backend") if seen else None,
            "emulated": seen.get("emulated") if seen and isinstance(seen.get("emulated"), bool) else None,
            # the node's power state (consolidation), or the device's own as its agent reports it
            "power": node_power if node_power != "on" or not seen else str(seen.get("power_state") or "on"),
            "tenants": tenants[path],
            "utilization": {"predicted": num(pred.utilization) if pred.utilization is not None else None,
                            "observed": num(seen.get("utilization")) if seen else None},
            "queue_depth": seen.get("queue_depth") if seen else None,
            "inflight": seen.get("inflight") if seen else None,
            "reported_age_s": round(max(0.0, now - agent.last_seen), 3) if agent is not None else None,
            **({"error": pred.error} if pred.error else {}),
        })
    return out


def node_views(cp: ControlPlane, devices: Sequence[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every node: its agent (URL, ready, version), power state, serving path (ms, and where it comes from),
    apps and devices (``device_views``)."""
    devices = device_views(cp) if devices is None else devices
    rec = cp.reconciler
    out = []
    for node in cp.cluster.nodes:
        agent = rec.agents.get(node.name)
        mine = [d for d in devices if d["node"] == node.name]
        serving = cp.adaptation.serving.get(node.name)
        apps = sorted({t["app"] for d in mine for t in d["tenants"]}
                      | {a for a, p in rec.placements.items() if p.cpu_node == node.name})
        out.append({
            "name": node.name, "cpu_cores": node.cpu_cores, "memory_mb": node.memory_mb,
            "agent": None if agent is None else {"url": agent.url, "ready": rec.alive(node.name),
                                                  "version": agent.version, "runs_on": agent.runs_on},
            "power": cp.power.state(node.name),
            "serving_ms": num(node.serving_ms),
            "serving_from": serving.provenance() if serving is not None else None,
            "apps": apps, "devices": mine,
        })
    return out


def app_views(cp: ControlPlane, preds: Mapping[str, DevicePrediction] | None = None, *,
              with_series: bool = True, since_s: float = 0.0) -> list[dict[str, Any]]:
    """Every app (admission order): SLO, status, placement, predicted latency end to end (weighted over its
    pieces), the last window's observed one, whether each meets the SLO, the attainment over the recorded
    windows and (``with_series``) its timeline after ``since_s``."""
    preds = device_predictions(cp) if preds is None else preds
    rec = cp.reconciler
    out = []
    for name, app in rec.apps.items():
        placement = rec.placements[name]
        stat, slo_ms = app.slo.stat, app.slo.latency_ms
        pred = predicted_view(cp, preds, name, placement, stat)
        obs = observed_view(cp, name)
        view: dict[str, Any] = {
            "name": name, "model": app.model, "rate_rps": app.rate_rps, "periodic": app.periodic,
            "slo": {"stat": stat, "latency_ms": slo_ms}, "status": rec.status(name),
            "placement": [{"device": s.device, "weight": s.weight} for s in placement.shares],
            "cpu_node": placement.cpu_node,
            "predicted": pred, "predicted_meets_slo": meets_slo(pred["at_slo_stat_ms"], slo_ms),
            "observed": obs,
            "observed_meets_slo": meets_slo(obs.get("at_slo_stat_ms"), slo_ms) if obs else None,
            "attainment": cp.adaptation.timeline.attainment(name, slo_ms),
        }
        if with_series:
            view["series"] = [p.to_json() for p in cp.adaptation.timeline.of(name, since_s)]
        out.append(view)
    return out


def overview(cp: ControlPlane, since_s: float = 0.0) -> dict[str, Any]:
    """``GET /v1/overview``: nodes (with their devices), apps (with their timelines after ``since_s``), the
    policy, whether adaptation and consolidation are on, and the newest event's sequence number (the
    dashboard asks ``/v1/events?since=`` from it). One snapshot and one estimator call per device serve all."""
    snap = cp.snapshot()
    preds = device_predictions(cp, snap)
    devices = device_views(cp, preds, snap)
    return {"time_s": round(cp.adaptation.wall(), 3), "policy": cp.policy_name,
            "adapt": cp.adaptation.settings is not None, "consolidate": cp.power.enabled,
            "window_s": cp.adaptation.window_s if cp.adaptation.settings is not None else None,
            "nodes": node_views(cp, devices), "apps": app_views(cp, preds, since_s=since_s),
            "last_event": cp.events.last_seq}
