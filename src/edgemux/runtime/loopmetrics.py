"""Prometheus counters and histograms written from one event loop, for a server's per-request path.

prometheus_client's own metric objects take a lock on every ``inc()`` and ``observe()`` (they may be written
from any thread), ``labels()`` takes another and builds a key, and a histogram finds its bucket with a Python
loop over the bounds: about 10 µs of a request that the gateway otherwise forwards in a few dozen. A server
whose requests are all answered on its event loop needs none of that: these families are plain numbers in
dicts, written without a lock (every write is on the loop's thread), found by bisection, and turned into
Prometheus samples only when ``/metrics`` is scraped (:class:`LoopMetrics` is the registry's collector).

They expose exactly what prometheus_client's ``Counter`` and ``Histogram`` expose for the same name, labels
and buckets (``name_total``; ``name_bucket{le}``, ``name_count``, ``name_sum``), less the ``_created``
samples. Units: whatever the metric's name says (``_seconds``: seconds).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

__all__ = ["Buckets", "LoopCounter", "LoopHistogram", "LoopMetrics"]


class Buckets:
    """One histogram child: ``counts[i]`` observations at most ``bounds[i]`` and above ``bounds[i - 1]``
    (the last, above every bound: the ``+Inf`` bucket), their ``sum`` and their ``count``."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        """One observation of ``value`` (the metric's unit)."""
        # bisect_left: the first bound >= value, Prometheus's "le" (less than or equal)
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1


class LoopCounter:
    """A counter family: ``inc(labels)`` adds to the child of that tuple of label values."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        name = name.removesuffix("_total")
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.values: dict[tuple[str, ...], float] = {}

    def inc(self, labels: tuple[str, ...], amount: float = 1.0) -> None:
        """Add ``amount`` to the child ``labels`` (one value per label name, in order)."""
        self.values[labels] = self.values.get(labels, 0.0) + amount

    def value(self, labels: tuple[str, ...]) -> float:
        """The child's count so far (0 for one never written)."""
        return self.values.get(labels, 0.0)

    def family(self) -> Metric:
        metric = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, value in sorted(self.values.items()):
            metric.add_metric(list(labels), value)
        return metric


class LoopHistogram:
    """A histogram family with fixed ``buckets`` (upper bounds, ascending; ``+Inf`` is implied):
    ``child(labels)`` is the :class:`Buckets` to observe into (look it up once and keep it)."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]) -> None:
        bounds = tuple(float(b) for b in buckets)
        if list(bounds) != sorted(set(bounds)) or not bounds:
            raise ValueError(f"{name}: buckets must be distinct and ascending, got {list(buckets)}")
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.bounds = bounds
        self.children: dict[tuple[str, ...], Buckets] = {}

    def child(self, labels: tuple[str, ...]) -> Buckets:
        """The child of ``labels`` (made on first use)."""
        got = self.children.get(labels)
        if got is None:
            got = self.children[labels] = Buckets(self.bounds)
        return got

    def family(self) -> Metric:
        metric = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        les = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        for labels, child in sorted(self.children.items()):
            running, cumulative = 0, []
            for le, n in zip(les, child.counts):
                running += n
                cumulative.append((le, float(running)))
            metric.add_metric(list(labels), cumulative, child.sum)
        return metric


class LoopMetrics:
    """The families of one server, in a registry of their own (``registry``), as a collector: every scrape
    reads their numbers as they are (on the loop's thread, which scrapes happen on too)."""

    def __init__(self) -> None:
        self._families: list[LoopCounter | LoopHistogram] = []
        self.registry = CollectorRegistry()
        self.registry.register(self)

    def counter(self, name: str, documentation: str, labelnames: Sequence[str]) -> LoopCounter:
        """A new counter family in this registry."""
        family = LoopCounter(name, documentation, labelnames)
        self._families.append(family)
        return family

    def histogram(self, name: str, documentation: str, labelnames: Sequence[str],
                  buckets: Sequence[float]) -> LoopHistogram:
        """A new histogram family in this registry."""
        family = LoopHistogram(name, documentation, labelnames, buckets)
        self._families.append(family)
        return family

    def collect(self) -> Iterator[Metric]:
        """The families' samples now (prometheus_client's collector interface)."""
        for family in self._families:
            yield family.family()

    def describe(self) -> list[Metric]:
        """Nothing ahead of a scrape: registering does not call :meth:`collect` (which is cheap anyway)."""
        return []
