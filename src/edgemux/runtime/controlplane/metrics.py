"""The control plane's Prometheus metrics (``GET /metrics``), in a registry of its own (several control planes
may share a process, as the tests' do).

- ``edgemux_controlplane_update_seconds{manager}`` (histogram): one manager's ``update()`` in a pass of the
  controller loop (s); ``manager`` is ``placement``, ``routes``, ``transitions``, ``adaptation`` or ``power``
  (the loop's order). The adaptation manager's pass that closes a window includes its whole cycle
  (``adapt.cycle``: the adapt step and consolidation) and carrying its actions out; the power manager's pass
  is the power tick.
- ``edgemux_controlplane_passes_total``: passes of the controller loop.
- ``edgemux_controlplane_admission_seconds`` (histogram): one app's admission, the policy's decision and its
  commit on the store thread (s).
- ``edgemux_controlplane_adaptation_actions_total{kind}``: the adaptation cycle's actions carried out, by kind
  (a move by what it takes: ``moved``, ``reshared``, ``repartitioned``, ``contract``; ``switch-off``, ``wake``,
  ``drain``, ``undrain``, ``woke``, ``recalibrated``, ``finding``, ``unexplained``, ``refused``).
- read when scraped: ``edgemux_controlplane_apps{status}`` (``ready``/``pending``),
  ``edgemux_controlplane_agents{ready}`` (``true``/``false``), ``edgemux_controlplane_moves`` (moves under
  way) and, with ``--consolidate``, ``edgemux_controlplane_nodes{state}`` (nodes by power state).
- read when scraped, from ``overview`` (predicted beside observed, what the Grafana dashboard in
  ``deploy/grafana/edgemux.json`` plots): per app ``edgemux_app_slo_seconds{app,stat}``,
  ``edgemux_app_predicted_latency_seconds{app,stat}`` (end to end, for mean, p50, p95 and p99),
  ``edgemux_app_observed_latency_seconds{app,stat}`` and ``edgemux_app_observed_requests_per_second{app}``
  (the last closed window; the gateways' and agents' own histograms hold every request); per device
  ``edgemux_device_predicted_utilization{node,device,kind}`` and
  ``edgemux_device_observed_utilization{node,device,kind}`` (its agent's last heartbeat).

Units: seconds (latencies in Prometheus' base unit), requests/s, utilization dimensionless.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["ACTION_KINDS", "CONTENT_TYPE", "ControlPlaneMetrics"]

# the adaptation actions' kinds (adapt.cycle's action kinds, a move by adapt.plan.transition_kind): each counted
# from 0 so that a dashboard's series exist before the first action (tests/test_controlplane_overview.py checks
# the list against adapt)
ACTION_KINDS = ("moved", "reshared", "repartitioned", "contract", "switch-off", "wake", "drain", "undrain", "woke",
                "recalibrated", "finding", "unexplained", "refused")
# text format 0.0.4, which generate_latest writes and every Prometheus understands (as the agent says it)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# a manager's pass costs from microseconds (nothing to do) to seconds (a window's cycle over many apps)
_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ControlPlaneMetrics:
    """The metrics of the module doc. ``gauges`` is called when Prometheus scrapes and returns, per gauge name
    (``apps``, ``agents``, ``moves``, ``nodes``), its values by label value (``moves``: by ``""``);
    ``cluster`` returns the app and device views of ``overview`` (``app_views``, ``device_views``)."""

    def __init__(self, gauges: Callable[[], Mapping[str, Mapping[str, float]]],
                 cluster: Callable[[], tuple[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]]]] | None = None,
                 ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.update = Histogram("edgemux_controlplane_update_seconds",
                                "One manager's update in a pass of the controller loop (s).", ("manager",),
                                buckets=_BUCKETS, registry=self.registry)
        self.passes = Counter("edgemux_controlplane_passes", "Passes of the controller loop.",
                              registry=self.registry)
        self.admission = Histogram("edgemux_controlplane_admission_seconds",
                                   "One app's admission: the policy's decision and its commit (s).",
                                   buckets=_BUCKETS, registry=self.registry)
        self.actions = Counter("edgemux_controlplane_adaptation_actions",
                               "Adaptation actions carried out, by kind.", ("kind",), registry=self.registry)
        for kind in ACTION_KINDS:
            self.actions.labels(kind)
        self.registry.register(_StateCollector(gauges))
        if cluster is not None:
            self.registry.register(_ClusterCollector(cluster))

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


class _StateCollector(Collector):
    """The gauges read from the managers' state when Prometheus scrapes."""

    def __init__(self, gauges: Callable[[], Mapping[str, Mapping[str, float]]]) -> None:
        self.gauges = gauges

    def describe(self) -> list[GaugeMetricFamily]:
        return []  # computed at scrape time; nothing to check for duplicates at registration

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = self.gauges()
        labelled = (("apps", "Apps by status (ready: every piece loaded on a live agent).", "status"),
                    ("agents", "Registered agents by readiness (a heartbeat within 3 periods).", "ready"),
                    ("nodes", "Nodes by power state (with --consolidate).", "state"))
        for name, doc, label in labelled:
            if name in now:
                g = GaugeMetricFamily(f"edgemux_controlplane_{name}", doc, labels=(label,))
                for value, n in sorted(now[name].items()):
                    g.add_metric((value,), n)
                yield g
        yield GaugeMetricFamily("edgemux_controlplane_moves", "Moves under way (make before break).",
                                value=sum(now.get("moves", {}).values()))


def _seconds(ms: Any) -> float | None:
    """A latency in ms as seconds; None for none or an unstable queue (no sample is better than a fake one)."""
    return ms / 1000.0 if isinstance(ms, (int, float)) and not isinstance(ms, bool) else None


class _ClusterCollector(Collector):
    """Predicted beside observed, per app and per device, read from the overview when Prometheus scrapes."""

    def __init__(self, cluster: Callable[[], tuple[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]]]]) -> None:
        self.cluster = cluster

    def describe(self) -> list[GaugeMetricFamily]:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        apps, devices = self.cluster()
        slo = GaugeMetricFamily("edgemux_app_slo_seconds", "The app's latency SLO at its statistic (s).",
                                labels=("app", "stat"))
        pred = GaugeMetricFamily("edgemux_app_predicted_latency_seconds",
                                 "Predicted latency end to end, weighted over the app's pieces (s).",
                                 labels=("app", "stat"))
        obs = GaugeMetricFamily("edgemux_app_observed_latency_seconds",
                                "Observed latency in the last closed window (s).", labels=("app", "stat"))
        rate = GaugeMetricFamily("edgemux_app_observed_requests_per_second",
                                 "Requests per second in the last closed window.", labels=("app",))
        for a in apps:
            name = str(a["name"])
            slo.add_metric((name, a["slo"]["stat"]), a["slo"]["latency_ms"] / 1000.0)
            seen = a.get("observed") or {}
            for stat in ("mean", "p50", "p95", "p99"):
                v = _seconds(a["predicted"].get(f"{stat}_ms"))
                if v is not None:
                    pred.add_metric((name, stat), v)
                v = _seconds(seen.get(f"{stat}_ms"))
                if v is not None:
                    obs.add_metric((name, stat), v)
            if seen:
                rate.add_metric((name,), float(seen.get("rate_rps") or 0.0))
        util_p = GaugeMetricFamily("edgemux_device_predicted_utilization",
                                   "Device utilization the estimators predict from its tenants.",
                                   labels=("node", "device", "kind"))
        util_o = GaugeMetricFamily("edgemux_device_observed_utilization",
                                   "Device utilization its agent reported in its last heartbeat.",
                                   labels=("node", "device", "kind"))
        for d in devices:
            labels = (str(d["node"]), str(d["name"]), str(d["kind"]))
            for family, value in ((util_p, d["utilization"]["predicted"]), (util_o, d["utilization"]["observed"])):
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    family.add_metric(labels, float(value))
        yield from (slo, pred, obs, rate, util_p, util_o)
