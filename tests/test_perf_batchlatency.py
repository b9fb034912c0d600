"""perf.batchlatency: Batch-Latency against a brute force over batches, the temporal round robin against a
hand-computed round, the spatio-temporal round against hand-computed placements, and bad inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgemux.cluster.workload import BatchLaw
from edgemux.perf.batchlatency import (ModelLaw, PipelineApp, batch_latency, batch_ms, largest_batch,
                                       saturating_curve, spatiotemporal_round, temporal_ms, temporal_rounds)
from edgemux.perf.spatial import slowdown


def _brute(m: ModelLaw, share: float, interval: float) -> int:
    fits = [b for b in range(1, m.max_batch + 1) if batch_ms(m, b, share) <= interval + 1e-9]
    return max(fits, default=0)


def test_batch_latency_matches_brute_force_over_batches() -> None:
    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(300):
        k1, k2 = (float(x) for x in np.round(rng.uniform(0.0, 5.0, 2), 2))
        if k1 + k2 == 0:
            continue
        curve = saturating_curve(float(np.round(rng.uniform(0.1, 1.0), 2)), 1.0) if rng.random() < 0.7 else ()
        m = ModelLaw("m", BatchLaw(k1, k2), curve, max_batch=int(rng.integers(1, 20)))
        share = float(np.round(rng.uniform(0.05, 1.0), 2))
        interval = float(np.round(rng.uniform(0.5, 60.0), 1))
        assert largest_batch(m, share, interval) == _brute(m, share, interval), (k1, k2, curve[:1], share, interval)
        checked += 1
    assert checked > 250


def test_batch_latency_exact_edges_and_per_model() -> None:
    a = ModelLaw("a", BatchLaw(1.0, 4.0))          # b + 4 ms with the whole device
    b = ModelLaw("b", BatchLaw(0.0, 5.0), max_batch=7)  # constant per batch: the largest allowed
    # at share 0.5 without a curve the work doubles: 2b + 8 <= 20 -> b = 6; b: 10 ms <= 20 -> max_batch
    assert batch_latency([a, b], 0.5, 20.0) == [6, 7]
    assert batch_latency([a], 1.0, 9.0) == [5]      # ends exactly at the interval: fits
    assert batch_latency([a], 1.0, 4.99) == [0]     # not even one request
    assert batch_latency([b], 1.0, 4.9) == [0]


def test_law_is_batch_law_stretched_by_slowdown() -> None:
    curve = saturating_curve(0.5)
    m = ModelLaw("m", BatchLaw(2.0, 3.0), curve, share=0.25)
    assert slowdown(curve, 0.25) == pytest.approx(2.0)
    assert slowdown(curve, 0.8) == pytest.approx(1.0)
    assert batch_ms(m, 4, 0.25) == pytest.approx((2.0 * 4 + 3.0) * 2.0)
    assert batch_ms(m, 4, 0.6) == pytest.approx(11.0)


@pytest.mark.parametrize("share", [0.0, -0.1, 1.5, math.nan, math.inf])
def test_bad_share_raises(share: float) -> None:
    m = ModelLaw("m", BatchLaw(1.0, 1.0))
    with pytest.raises(ValueError, match="share"):
        batch_latency([m], share, 10.0)
    with pytest.raises(ValueError, match="share"):
        ModelLaw("m", BatchLaw(1.0, 1.0), share=share)


@pytest.mark.parametrize("interval", [0.0, -5.0, math.nan, math.inf])
def test_bad_interval_raises(interval: float) -> None:
    with pytest.raises(ValueError, match="interval"):
        batch_latency([ModelLaw("m", BatchLaw(1.0, 1.0))], 0.5, interval)


def test_shares_summing_above_one_raise() -> None:
    x = ModelLaw("x", BatchLaw(1.0, 1.0), share=0.6)
    y = ModelLaw("y", BatchLaw(1.0, 1.0), share=0.5)
    with pytest.raises(ValueError, match=r"above 1.*x 0.6, y 0.5"):
        PipelineApp("app", ((x, y),))
    PipelineApp("ok", ((x,), (y,)))  # one after the other: fine


def test_other_bad_inputs_raise() -> None:
    with pytest.raises(ValueError, match="batch law"):
        ModelLaw("m", BatchLaw(0.0, 0.0))
    with pytest.raises(ValueError, match="batch"):
        batch_ms(ModelLaw("m", BatchLaw(1.0, 1.0)), 0, 1.0)
    with pytest.raises(ValueError, match="unique"):
        temporal_rounds([PipelineApp.single(ModelLaw("m", BatchLaw(1.0, 1.0)))] * 2)
    with pytest.raises(ValueError, match="round"):
        spatiotemporal_round([PipelineApp.single(ModelLaw("m", BatchLaw(1.0, 1.0)))], round_ms=0.0)


def _app(name: str, ms: float) -> PipelineApp:
    return PipelineApp.single(ModelLaw(name, BatchLaw(0.0, ms)))


def test_temporal_round_robin_by_hand() -> None:
    # turns of 20, 8 and 6 ms in 30 ms rounds. Round 0: A [0, 20), B [20, 28); C does not fit (34 ms).
    # Round 1 offers C first (never served): C [0, 6), A [6, 26); B would end at 34. Round 2: B, A; C waits.
    s = temporal_rounds([_app("A", 20.0), _app("B", 8.0), _app("C", 6.0)], rounds=4)
    spans = [[(x.app, x.start_ms, x.end_ms) for x in r] for r in s.rounds]
    assert spans[0] == [("A", 0.0, 20.0), ("B", 20.0, 28.0)]
    assert spans[1] == [("C", 0.0, 6.0), ("A", 6.0, 26.0)]
    assert spans[2] == [("B", 0.0, 8.0), ("A", 8.0, 28.0)]
    assert spans[3] == [("C", 0.0, 6.0), ("A", 6.0, 26.0)]
    a, b, c = s.apps
    assert (a.batch_per_round, b.batch_per_round, c.batch_per_round) == (1.0, 0.5, 0.5)
    assert a.throughput_rps == pytest.approx(1000 / 30) and b.throughput_rps == pytest.approx(500 / 30)
    assert (a.latency_ms, b.latency_ms, c.latency_ms) == (20.0, 8.0, 6.0)
    assert a.finish_ms == pytest.approx((20 + 26 + 28 + 26) / 4)
    assert s.total_rps == pytest.approx(2000 / 30)


def test_temporal_pipeline_runs_its_models_one_after_another() -> None:
    p = PipelineApp("p", ((ModelLaw("m1", BatchLaw(1.0, 2.0), share=0.5),),
                          (ModelLaw("m2", BatchLaw(2.0, 0.0), share=0.3),
                           ModelLaw("m3", BatchLaw(1.0, 1.0), share=0.4))),
                    temporal_batch=3)
    assert temporal_ms(p, 3) == pytest.approx(5.0 + 6.0 + 4.0)
    (r,) = temporal_rounds([p], rounds=1).rounds
    assert [(x.model, x.start_ms, x.end_ms, x.share) for x in r] == [
        ("m1", 0.0, 5.0, 1.0), ("m2", 5.0, 11.0, 1.0), ("m3", 11.0, 15.0, 1.0)]


def test_spatiotemporal_round_by_hand() -> None:
    flat = saturating_curve(0.4)  # no slowdown at any share used here (all >= 0.4)
    a = ModelLaw("a", BatchLaw(1.0, 4.0), flat, share=0.6, max_batch=10)   # 10 + 4 = 14 ms
    b = ModelLaw("b", BatchLaw(2.0, 0.0), flat, share=0.5)                 # waits for a: 16 ms left -> 8
    c = ModelLaw("c", BatchLaw(1.0, 1.0), flat, share=0.4)                 # beside a, then b: 29 in 30 ms
    s = spatiotemporal_round([PipelineApp.single(a), PipelineApp.single(b), PipelineApp.single(c)])
    got = {x.model: (x.batch, x.start_ms, x.end_ms) for x in s.rounds[0]}
    assert got["a"] == (10, 0.0, 14.0)
    assert got["b"] == (8, 14.0, 30.0)
    # c: 0.4 + a's 0.6 = 1 from 0, 0.4 + b's 0.5 from 14: free the whole round, b + 1 <= 30 -> 29
    assert got["c"] == (29, 0.0, 30.0)
    assert s.app("c").throughput_rps == pytest.approx(29 / 0.030)


def test_spatiotemporal_shares_never_exceed_one_and_batches_are_largest() -> None:
    rng = np.random.default_rng(3)
    for _ in range(30):
        apps = [PipelineApp.single(ModelLaw(f"m{i}", BatchLaw(float(rng.uniform(0.2, 3)), float(rng.uniform(0, 6))),
                                            saturating_curve(0.5), share=float(np.round(rng.uniform(0.1, 0.9), 2)),
                                            max_batch=12)) for i in range(4)]
        s = spatiotemporal_round(apps)
        slots = s.rounds[0]
        for x in slots:
            assert 0.0 <= x.start_ms < x.end_ms <= 30.0 + 1e-9
            used = sum(y.share for y in slots if y.start_ms <= x.start_ms + 1e-9 and x.start_ms < y.end_ms - 1e-9)
            assert used <= 1.0 + 1e-6
        # the first app is alone: its batch is Batch-Latency over the whole round
        assert s.apps[0].batch_per_round == batch_latency([apps[0].models[0]], apps[0].models[0].share, 30.0)[0]
