"""Detectors: what is wrong after placement, each finding with its numbers as data.

``detect`` looks at one monitoring window of every app (``monitor.AppWindow``) beside the admitted state
(a ``policies.Snapshot``) and reports:

- ``slo-violated``: the app's observed latency at its SLO statistic is above the SLO (with at least
  ``min_samples`` answered requests in the window);
- ``dropping``: more than ``loss_tolerance`` of the app's requests were refused or failed;
- ``slo-at-risk``: the queueing models, fed with the rates the window proves (its rate's lower 95 % bound,
  never below the contracts: ``observed_rates``), predict an SLO miss for the app, though it may not show yet;
- ``over-contract``: the app sends more than its contract, ``rate_rps * (1 + rate_tolerance)``, with 95 %
  confidence (the window rate's lower bound, ``AppWindow.rate_lower_rps``, is above it), or its own bucket
  refuses more than ``loss_tolerance`` of its requests while λ̂ is above the contract (a bucket refills at
  1.1x the contract and holds 40 requests or more, so it refuses only an app that sends more than it may:
  the evidence comes sooner than the rate's bound, which in a short window needs λ̂ well above the limit);
- ``under-contract``: an app whose contract adaptation raised above the one it declared now sends clearly
  less: the window rate's upper bound plus ``headroom`` is below ``contract / (1 + rate_tolerance)`` (the
  band between this and ``over-contract`` is the hysteresis that keeps a contract from see-sawing);
- ``idle-capacity``: a device that carries apps but whose utilization at those same rates is below
  ``idle_utilization`` (what consolidation could free);
- ``agent-dead``: a node's agent was not heard from for ``dead_after_s``.

Pure: the time and the observations come in as arguments.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from edgemux.adapt.monitor import AppWindow
from edgemux.adapt.settings import AdaptSettings
from edgemux.perf.device import device_utilization, predict_device
from edgemux.perf.result import Unstable
from edgemux.policies.base import Snapshot, device_spec
from edgemux.policies.feasibility import slo_value

__all__ = ["FINDING_KINDS", "Finding", "detect", "observed_rates"]

FINDING_KINDS = ("slo-violated", "dropping", "slo-at-risk", "over-contract", "under-contract", "idle-capacity",
                 "agent-dead", "consolidate")
"""The last is not detected here: it is the reason ``adapt.consolidate`` gives a move off a node it drains."""


@dataclass(frozen=True)
class Finding:
    """One thing wrong: ``kind`` (one of ``FINDING_KINDS``), the app (None for a node's finding), the
    devices it concerns, what was ``observed`` against what is allowed (``limit``, both in ``unit``), and a
    one-line ``detail``."""

    kind: str
    app: str | None
    devices: tuple[str, ...]
    observed: float
    limit: float
    unit: str
    detail: str
    node: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        """What the finding is about, the same from window to window (for damping)."""
        if self.app is not None:
            return (self.kind, self.app)
        return (self.kind, (self.node or "") if self.kind == "agent-dead" else ",".join(self.devices))

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"kind": self.kind, "observed": self.observed, "limit": self.limit,
                                  "unit": self.unit, "detail": self.detail, "devices": list(self.devices)}
        if self.app is not None:
            out["app"] = self.app
        if self.node is not None:
            out["node"] = self.node
        return out


def observed_rates(snapshot: Snapshot, windows: Mapping[str, AppWindow]) -> Snapshot:
    """``snapshot`` with every observed app at ``max(proven rate, contract)`` (req/s), the proven rate being
    the window rate's lower 95 % bound (``AppWindow.rate_lower_rps``): the load the devices face if what the
    window proves goes on. Not the raw count: an app sending exactly its contract counts more than it in about
    half of its windows, and on a device admitted close to an SLO that noise alone predicted misses (5,950
    findings over four windows at 1,000 nodes, ``benchmarks/bench_scale.py``, before this). Apps without a
    window keep their contract. When no app proves more than its contract this is ``snapshot`` itself (its
    cached device loads included)."""
    apps = dict(snapshot.apps)
    for name, w in windows.items():
        app = apps.get(name)
        if app is None:
            continue
        proven = w.rate_lower_rps()
        if proven > app.rate_rps:
            apps[name] = replace(app, rate_rps=proven)
    if all(apps[n] is snapshot.apps[n] for n in apps):
        return snapshot
    return Snapshot(snapshot.cluster, apps, snapshot.placements, snapshot.catalog)


def detect(snapshot: Snapshot, windows: Mapping[str, AppWindow], settings: AdaptSettings, *,
           now_s: float | None = None, last_seen_s: Mapping[str, float] | None = None,
           declared: Mapping[str, float] | None = None) -> list[Finding]:
    """Every finding of one window, in a stable order (apps in admission order, then devices, then nodes).
    ``now_s`` and ``last_seen_s`` (node -> time of its agent's last report, s, the same clock) are needed
    only for ``agent-dead``; ``declared`` (app -> the contract it declared, req/s) only for
    ``under-contract``."""
    out: list[Finding] = []
    for name, app in snapshot.apps.items():
        placement = snapshot.placements.get(name)
        w = windows.get(name)
        if placement is None or w is None:
            continue
        devices = tuple(s.device for s in placement.shares)
        lat = w.latency
        if lat is not None and lat.count >= settings.min_samples:
            seen = lat.at(app.slo.stat)
            if seen > app.slo.latency_ms:
                out.append(Finding("slo-violated", name, devices, seen, app.slo.latency_ms, "ms",
                                   f"observed {app.slo.stat} {seen:.1f} ms > SLO {app.slo.latency_ms:g} ms "
                                   f"over {lat.count} requests"))
        if w.arrivals and w.lost / w.arrivals > settings.loss_tolerance:
            out.append(Finding("dropping", name, devices, w.lost / w.arrivals, settings.loss_tolerance, "fraction",
                               f"{w.refused} refused and {w.failed} failed of {w.arrivals} requests"))
        limit = app.rate_rps * (1.0 + settings.rate_tolerance)
        # the rate's lower 95 % bound, not λ̂ itself: a short window's count at the contract often exceeds it
        refusing = w.arrivals > 0 and w.refused / w.arrivals > settings.loss_tolerance
        if w.rate_lower_rps() > limit or (refusing and w.rate_rps > app.rate_rps):
            out.append(Finding("over-contract", name, devices, w.rate_rps, app.rate_rps, "req/s",
                               f"sends {w.rate_rps:.2f} req/s against a contract of {app.rate_rps:g} req/s"))
        own = declared.get(name) if declared is not None else None
        if own is not None and app.rate_rps > own * (1.0 + settings.rate_tolerance):
            needs = w.rate_upper_rps() * (1.0 + settings.headroom)
            if needs < app.rate_rps / (1.0 + settings.rate_tolerance):
                out.append(Finding("under-contract", name, devices, w.rate_rps, app.rate_rps, "req/s",
                                   f"sends {w.rate_rps:.2f} req/s against a raised contract of "
                                   f"{app.rate_rps:.3g} req/s (declared {own:g})"))
    rated = observed_rates(snapshot, windows)  # once: both below predict at the rates the window proves
    out += _at_risk(snapshot, rated)
    out += _idle(rated, settings)
    if now_s is not None and last_seen_s is not None:
        for node in snapshot.cluster.nodes:
            heard = last_seen_s.get(node.name)
            if heard is not None and now_s - heard > settings.dead_after_s:
                devs = tuple(d.path for d in node.devices)
                out.append(Finding("agent-dead", None, devs, now_s - heard, settings.dead_after_s, "s",
                                   f"agent of {node.name} silent for {now_s - heard:.1f} s", node=node.name))
    return out


def _at_risk(snapshot: Snapshot, rated: Snapshot) -> list[Finding]:
    """``slo-at-risk`` findings: the prediction on ``rated`` (``snapshot`` at the proven rates), per device
    that carries an app whose proven rate is above its contract (elsewhere the prediction is the
    admission's own)."""
    faster = {n for n in snapshot.apps if rated.apps[n] is not snapshot.apps[n]}
    if not faster:
        return []
    hit: dict[str, tuple[float, str]] = {}  # app -> worst predicted value and device
    for path, load in rated.device_loads.items():
        if not faster & set(load.apps):
            continue
        percentile = [n for n in load.apps if rated.apps[n].slo.stat != "mean"]
        est = predict_device(device_spec(rated.cluster.devices[path]), list(load.tenants), tails=percentile)
        for name in load.apps:
            app = rated.apps[name]
            value = slo_value(est[name], app.slo.stat)
            if value is None:  # no estimate at this statistic: nothing to predict a miss from
                continue
            worst = float("inf") if isinstance(value, Unstable) else float(value)
            if worst > app.slo.latency_ms and worst > hit.get(name, (-1.0, ""))[0]:
                hit[name] = (worst, path)
    out = []
    for name in snapshot.apps:
        if name in hit:
            worst, path = hit[name]
            app = snapshot.apps[name]
            shown = "unstable (no steady state)" if worst == float("inf") else f"{worst:.1f} ms"
            out.append(Finding("slo-at-risk", name, (path,), worst, app.slo.latency_ms, "ms",
                               f"predicted {app.slo.stat} {shown} on {path} at the observed rates > SLO "
                               f"{app.slo.latency_ms:g} ms"))
    return out


def _idle(rated: Snapshot, settings: AdaptSettings) -> list[Finding]:
    """``idle-capacity`` findings: devices with apps whose utilization on ``rated`` (the snapshot at the
    proven rates, never below the contracts: ``observed_rates``) is under ``settings.idle_utilization``."""
    if settings.idle_utilization <= 0:
        return []
    out = []
    for path, load in rated.device_loads.items():
        if load.empty:
            continue
        rho = device_utilization(device_spec(load.device), list(load.tenants))
        if rho < settings.idle_utilization:
            out.append(Finding("idle-capacity", None, (path,), rho, settings.idle_utilization, "utilization",
                               f"{path} is {100 * rho:.1f} % busy with {len(load.apps)} app(s) at the observed "
                               "rates", node=load.device.node))
    return out
