"""A node agent's Prometheus metrics (docs/reference/http.md, "Agent", ``GET /metrics``): per app and device
the requests, their latency and queue wait, the rejections by reason; per device, read from the workers when
scraped, utilization, loaded models, queue, in-flight executions and modelled power. Units: seconds, W, J.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from edgemux.runtime.dataplane.worker import DeviceWorker

if TYPE_CHECKING:
    from edgemux.runtime.dataplane.lease import Lease

__all__ = ["AgentMetrics"]

# Latency buckets (s): an Edge TPU request takes a few ms, a CPU-bound one up to seconds.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class AgentMetrics:
    """The agent's Prometheus metrics, in a registry of its own (several agents may share a process).

    Per app: ``edgemux_requests_total{app,device,code}``, ``edgemux_request_latency_seconds{app,device}``
    (from the request's arrival at the agent to its response, s), ``edgemux_queue_wait_seconds{app,device}``
    (from submission to the start of execution, s), ``edgemux_rejections_total{app,reason}`` (reason:
    ``queue_full``, ``timeout``, ``closed``, ``too_large``, ``bad_request``, ``not_loaded``, ``fenced``).
    Requests for apps that do not exist count in ``edgemux_unknown_app_requests_total`` (no app label:
    arbitrary names must not grow the label space). Fencing (``dataplane.lease``):
    ``edgemux_fenced_requests_total{app}`` the requests refused because the agent was fenced,
    ``edgemux_agent_fenced`` 1 while its lease has lapsed, ``edgemux_agent_lease_silence_seconds`` the time
    since its last acknowledged heartbeat was sent (-1 before the first). Per device, read at scrape time: ``edgemux_device_utilization``,
    ``edgemux_device_loaded_models``, ``edgemux_device_queue_depth``, ``edgemux_device_inflight`` and
    ``edgemux_device_info{device,kind,discipline,backend,emulated}`` (always 1).
    """

    def __init__(self, workers: Mapping[str, DeviceWorker]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("edgemux_requests", "Inference requests by app, device and HTTP status code.",
                                ("app", "device", "code"), registry=self.registry)
        self.latency = Histogram("edgemux_request_latency_seconds",
                                 "Time from a request's arrival at the agent to its response (s).",
                                 ("app", "device"), buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.queue_wait = Histogram("edgemux_queue_wait_seconds",
                                    "Time a request waited in its device's queue before executing (s).",
                                    ("app", "device"), buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.rejections = Counter("edgemux_rejections", "Requests refused or failed by the agent, by reason.",
                                  ("app", "reason"), registry=self.registry)
        self.unknown_app = Counter("edgemux_unknown_app_requests", "Inference requests naming no registered app.",
                                   registry=self.registry)
        self.fenced = Counter("edgemux_fenced_requests", "Inference requests refused (503) because the agent was "
                              "fenced: its lease from the control plane lapsed, or the app is no longer placed "
                              "here.", ("app",), registry=self.registry)
        self.lease_fenced = Gauge("edgemux_agent_fenced", "1 while the agent's lease from the control plane has "
                                  "lapsed (every app answered 503), else 0.", registry=self.registry)
        self.lease_silence = Gauge("edgemux_agent_lease_silence_seconds", "Seconds since the agent sent its last "
                                   "heartbeat the control plane acknowledged (-1: none yet).",
                                   registry=self.registry)
        self.registry.register(_DeviceCollector(workers))
        # the children of a served request's series, by (app, device): ``labels()`` takes a lock and builds a
        # key on every call, a few µs of every request. Children survive an app's removal (series are never
        # dropped here), so this grows only with the (app, device) pairs ever served.
        self._served: dict[tuple[str, str], tuple[Any, Any, Any]] = {}

    def served(self, app: str, device_path: str) -> tuple[Any, Any, Any]:
        """The 200 counter, the latency and the queue-wait histograms of (app, device), looked up once."""
        key = (app, device_path)
        series = self._served.get(key)
        if series is None:
            series = self._served[key] = (self.requests.labels(app, device_path, "200"),
                                          self.latency.labels(app, device_path),
                                          self.queue_wait.labels(app, device_path))
        return series

    def watch_lease(self, lease: Lease) -> None:
        """Read the fencing gauges from ``lease`` when scraped."""
        self.lease_fenced.set_function(lambda: 1.0 if lease.lapsed() else 0.0)
        self.lease_silence.set_function(lambda: -1.0 if (s := lease.silent_s()) is None else s)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


class _DeviceCollector(Collector):
    """Device gauges computed from the workers' statistics when Prometheus scrapes."""

    def __init__(self, workers: Mapping[str, DeviceWorker]) -> None:
        self.workers = workers

    def describe(self) -> list[Any]:
        return []  # computed at scrape time; nothing to check for duplicates at registration

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        util = GaugeMetricFamily("edgemux_device_utilization",
                                 "Fraction of the last window with at least one execution in flight.",
                                 labels=("device", "emulated"))
        loaded = GaugeMetricFamily("edgemux_device_loaded_models", "Models loaded on the device.", labels=("device",))
        depth = GaugeMetricFamily("edgemux_device_queue_depth", "Requests waiting in the device's queue.",
                                  labels=("device",))
        inflight = GaugeMetricFamily("edgemux_device_inflight", "Executions in flight on the device.",
                                     labels=("device",))
        info = GaugeMetricFamily("edgemux_device_info", "The device's kind, discipline and backend (always 1).",
                                 labels=("device", "kind", "discipline", "backend", "emulated"))
        power = GaugeMetricFamily("edgemux_device_power_watts",
                                  "Modelled power of the device (W): idle + (active - idle) x utilization, 0 when "
                                  "switched off; only devices with power figures.", labels=("device", "state"))
        energy = CounterMetricFamily("edgemux_device_energy_joules",
                                     "Modelled energy of the device since the agent started (J).", labels=("device",))
        app_energy = CounterMetricFamily("edgemux_app_energy_joules",
                                         "An app's share of the device's dynamic energy: (active - idle) x its "
                                         "service time (J).", labels=("app", "device"))
        for name, w in self.workers.items():
            st = w.stats()
            path = st["device"]
            emulated = "true" if st["emulated"] else "false"
            util.add_metric((path, emulated), st["utilization"])
            loaded.add_metric((path,), len(st["loaded_models"]))
            depth.add_metric((path,), st["queued"])
            inflight.add_metric((path,), st["inflight"])
            info.add_metric((path, st["kind"], st["discipline"], st["backend"], emulated), 1.0)
            if "power_w" in st:
                power.add_metric((path, st["power_state"]), st["power_w"])
                energy.add_metric((path,), st["energy_j"])
                for a, j in st["app_energy_j"].items():
                    app_energy.add_metric((a, path), j)
        yield from (util, loaded, depth, inflight, info, power, energy, app_energy)
