"""runtime.loopmetrics: the lock-free families expose what prometheus_client's own Counter and Histogram expose
for the same observations (less their ``_created`` samples)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from edgemux.runtime.loopmetrics import LoopMetrics

BUCKETS = (0.0, 0.001, 0.005, 0.1, 1.0, 2.5)
# on a bound, between bounds, below the first, above the last, repeated
VALUES = (0.0, 0.001, 0.0005, 0.004, 0.1, 0.10001, 2.5, 3.0, 100.0, 0.001)


def _exposition(registry: CollectorRegistry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


def test_a_histogram_and_a_counter_expose_what_prometheus_clients_own_do() -> None:
    theirs = CollectorRegistry()
    hist = Histogram("x_latency_seconds", "Latency", ["app"], buckets=BUCKETS, registry=theirs)
    count = Counter("x_requests_total", "Requests", ["app", "code"], registry=theirs)
    ours = LoopMetrics()
    our_hist = ours.histogram("x_latency_seconds", "Latency", ["app"], BUCKETS)
    our_count = ours.counter("x_requests_total", "Requests", ["app", "code"])
    for app in ("b", "a"):
        for v in VALUES:
            hist.labels(app).observe(v)
            our_hist.child((app,)).observe(v)
        for code in ("200", "429", "200"):
            count.labels(app, code).inc()
            our_count.inc((app, code))
    # prometheus_client lists children in insertion order, LoopMetrics sorted: compare as sets of lines within
    # each metric, and the metrics' order and headers exactly
    theirs_lines, ours_lines = _exposition(theirs), _exposition(ours.registry)
    assert sorted(theirs_lines) == sorted(ours_lines)
    assert [line for line in theirs_lines if line.startswith("#")] == [line for line in ours_lines if line.startswith("#")]
    assert our_count.value(("a", "200")) == 2.0 and our_count.value(("c", "200")) == 0.0
    child = our_hist.child(("a",))
    assert child.count == len(VALUES) and child.counts[0] == 1 and child.counts[-1] == 2  # 0.0; 3.0 and 100.0


def test_a_histogram_needs_distinct_ascending_buckets() -> None:
    metrics = LoopMetrics()
    for bad in ((1.0, 0.5), (0.1, 0.1), ()):
        with pytest.raises(ValueError, match="distinct and ascending"):
            metrics.histogram("x_seconds", "X", ["app"], bad)
