"""Seeded workloads: the Ibis mix's proportions, MicroEdge cameras, dynamic come-and-go streams."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from edgemux.cluster.state import App
from edgemux.sim.workloads import (
    AZURE_SIZE_MIX,
    BODYPIX,
    CORAL_PIE,
    FRAME_BUDGET_MS,
    SIZE_CLASSES,
    DynamicStreams,
    IbisMix,
    app_size_class,
    camera,
    cameras,
    dynamic_streams,
    ibis_apps,
    ibis_size_classes,
)

N = 20_000
Z = 4.5  # |z| beyond this has probability < 1e-5 per check


def _within_binomial(count: int, n: int, p: float) -> bool:
    return abs(count - n * p) <= Z * math.sqrt(n * p * (1 - p))


def test_size_classes_follow_the_printed_categories_and_the_time_rule() -> None:
    classes = {c: {p.model for p in ps} for c, ps in ibis_size_classes().items()}
    # Table 2 prints M for YOLO-tinyV4 and L for YoloV3/YoloV4; the time rule must agree
    assert "yolov4_tiny" in classes["medium"] and {"yolov3", "yolov4"} <= classes["large"]
    assert {"mobilenet_v2", "resnet18"} <= classes["small"] and {"vgg16", "vgg19"} <= classes["large"]
    assert sum(len(v) for v in classes.values()) == 21
    for c, ps in ibis_size_classes().items():
        for p in ps:
            t = p.service.mean
            assert (t < 20) if c == "small" else (t >= 60) if c == "large" else (20 <= t < 60)


def test_ibis_mix_proportions_within_binomial_ci() -> None:
    apps = ibis_apps(N, seed=7)
    mix = IbisMix()
    by_model = {p.model: c for c, ps in ibis_size_classes(mix).items() for p in ps}
    cls = Counter(by_model[a.model] for a in apps)
    for c, p in zip(SIZE_CLASSES, AZURE_SIZE_MIX):
        assert _within_binomial(cls[c], N, p), (c, cls[c])
    models = Counter(a.model for a in apps)
    for c, ps in ibis_size_classes(mix).items():   # evenly within a class
        for prof in ps:
            assert _within_binomial(models[prof.model], cls[c], 1 / len(ps)), (prof.model, models[prof.model])


def test_ibis_apps_rate_and_slo_follow_the_parameters() -> None:
    mix = IbisMix(utilization=(0.1, 0.2), slo_factor=4.0, slo_stat="p95")
    classes = {p.model: p for ps in ibis_size_classes(mix).values() for p in ps}
    for a in ibis_apps(500, seed=1, mix=mix):
        s = classes[a.model].service.mean
        assert 0.1 - 1e-12 <= a.rate_rps * s / 1000 <= 0.2 + 1e-12
        assert a.slo.latency_ms == pytest.approx(4.0 * s) and a.slo.stat == "p95"
        assert not a.periodic
    assert app_size_class(App("x", "vgg19", 1, ibis_apps(1, 0)[0].slo)) == "large"


def test_ibis_apps_deterministic_by_seed() -> None:
    assert ibis_apps(300, seed=3) == ibis_apps(300, seed=3)
    assert ibis_apps(300, seed=3) != ibis_apps(300, seed=4)
    assert [a.name for a in ibis_apps(3, 0)] == ["app-0", "app-1", "app-2"]
    with pytest.raises(ValueError):
        IbisMix(proportions=(0.5, 0.5, 0.5))


def test_camera_fields() -> None:
    c = camera("cam-1")
    assert (c.model, c.rate_rps, c.periodic) == (CORAL_PIE, 15.0, True)
    assert c.slo.stat == "p99" and c.slo.latency_ms == pytest.approx(66.6667, abs=1e-3) == FRAME_BUDGET_MS
    bp = cameras(BODYPIX, 3)
    assert [a.name for a in bp] == ["bodypix-0", "bodypix-1", "bodypix-2"]
    assert all(a.model == BODYPIX and a.rate_rps == 15 and a.periodic for a in bp)


def test_dynamic_streams_well_formed_and_seeded() -> None:
    params = DynamicStreams()
    ev = dynamic_streams(11, params)
    assert ev == dynamic_streams(11, params) and ev != dynamic_streams(12, params)
    times = [e.time_s for e in ev]
    assert times == sorted(times) and all(0 <= t < params.horizon_s for t in times)
    added: dict[str, float] = {}
    for e in ev:
        if e.action == "add":
            assert e.app.name not in added
            added[e.app.name] = e.time_s
        else:
            assert e.app.name in added and e.time_s >= added[e.app.name]
    kinds = Counter(e.kind for e in ev if e.action == "add")
    assert kinds["24x7"] == params.steady
    assert not any(e.kind == "24x7" and e.action == "remove" for e in ev)
    assert kinds["sparse"] > 0 and kinds["bursty"] > kinds["sparse"]
    assert all(e.app.periodic and e.app.rate_rps == 15 for e in ev)


def test_dynamic_streams_bursts_cluster_in_time() -> None:
    p = DynamicStreams(horizon_s=7 * 24 * 3600, sparse_per_hour=0, steady=0, burst_mean_extra=5)
    starts = [e.time_s for e in dynamic_streams(2, p) if e.action == "add"]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    # within a burst starts are <= 60 s apart; between bursts ~2 h: most gaps are short
    short = sum(g <= p.burst_spread_s for g in gaps)
    assert short / len(gaps) > 0.7
    assert max(gaps) > 3600
