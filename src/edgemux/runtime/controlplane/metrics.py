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
- read when scraped: ``edgemux_controlplane_apps{status}`` (``ready``/``pending``),
  ``edgemux_controlplane_agents{ready}`` (``true``/``false``), ``edgemux_controlplane_moves`` (moves under
  way) and, with ``--consolidate``, ``edgemux_controlplane_nodes{state}`` (nodes by power state).

Units: seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE", "ControlPlaneMetrics"]

# text format 0.0.4, which generate_latest writes and every Prometheus understands (as the agent says it)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# a manager's pass costs from microseconds (nothing to do) to seconds (a window's cycle over many apps)
_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ControlPlaneMetrics:
    """The metrics of the module doc. ``gauges`` is called when Prometheus scrapes and returns, per gauge name
    (``apps``, ``agents``, ``moves``, ``nodes``), its values by label value (``moves``: by ``""``)."""

    def __init__(self, gauges: Callable[[], Mapping[str, Mapping[str, float]]]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.update = Histogram("edgemux_controlplane_update_seconds",
                                "One manager's update in a pass of the controller loop (s).", ("manager",),
                                buckets=_BUCKETS, registry=self.registry)
        self.passes = Counter("edgemux_controlplane_passes", "Passes of the controller loop.",
                              registry=self.registry)
        self.admission = Histogram("edgemux_controlplane_admission_seconds",
                                   "One app's admission: the policy's decision and its commit (s).",
                                   buckets=_BUCKETS, registry=self.registry)
        self.registry.register(_StateCollector(gauges))

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
