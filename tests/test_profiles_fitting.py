"""Fitting Ibis Eq. 9 (batching) and FPGA-GPU Eq. 1 (batch x concurrency) to measured points."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgemux.profiles.fitting import fit_batching, fit_fpga_gpu

POSITIVE = st.floats(min_value=0.01, max_value=1000.0, allow_nan=False, allow_infinity=False)
BATCH_SETS = st.lists(st.integers(min_value=1, max_value=128), min_size=2, max_size=10, unique=True)


# ------------------------------------------------------------------------------------ Ibis Eq. 9


def test_batching_exact_recovery() -> None:
    bs = [1, 2, 4, 8, 16, 32]
    fit = fit_batching(bs, [3.0 + 5.0 / b for b in bs])
    assert fit.k1_ms == pytest.approx(3.0, rel=1e-12) and fit.k2_ms == pytest.approx(5.0, rel=1e-12)
    assert fit.r2 == pytest.approx(1.0) and fit.rmse_ms < 1e-12 and fit.n == 6
    assert fit.predict(4) == pytest.approx(4.25)
    assert fit.batch_ms(4) == pytest.approx(4 * 3.0 + 5.0)  # b*k1 + k2


@settings(max_examples=200, deadline=None)
@given(k1=POSITIVE, k2=POSITIVE, bs=BATCH_SETS)
def test_batching_recovers_random_parameters(k1: float, k2: float, bs: list[int]) -> None:
    fit = fit_batching(bs, [k1 + k2 / b for b in bs])
    scale = k1 + k2  # the per-request time at b = 1 bounds the numbers involved
    assert fit.k1_ms == pytest.approx(k1, abs=1e-7 * scale)
    assert fit.k2_ms == pytest.approx(k2, abs=1e-6 * scale)
    assert fit.rmse_ms <= 1e-8 * scale
    assert fit.r2 > 1 - 1e-9


@settings(max_examples=100, deadline=None)
@given(k1=POSITIVE, k2=POSITIVE, seed=st.integers(0, 2**32 - 1))
def test_batching_recovers_random_parameters_with_noise(k1: float, k2: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    bs = np.repeat([1, 2, 4, 8, 16, 32], 20)
    truth = k1 + k2 / bs
    noisy = truth * (1 + 0.01 * rng.standard_normal(bs.size))  # 1% measurement noise
    fit = fit_batching(bs.tolist(), noisy.tolist())
    scale = k1 + k2
    assert fit.k1_ms == pytest.approx(k1, abs=0.01 * scale)
    assert fit.k2_ms == pytest.approx(k2, abs=0.02 * scale)
    assert fit.rmse_ms <= 0.03 * scale


def test_batching_noise_goodness_of_fit() -> None:
    rng = np.random.default_rng(7)
    bs = np.repeat([1, 2, 4, 8, 16], 50)
    y = 2.0 + 30.0 / bs + rng.normal(0, 0.3, bs.size)
    fit = fit_batching(bs.tolist(), y.tolist())
    assert fit.k1_ms == pytest.approx(2.0, abs=0.1) and fit.k2_ms == pytest.approx(30.0, abs=0.3)
    assert 0.99 < fit.r2 < 1.0
    assert fit.rmse_ms == pytest.approx(0.3, rel=0.15)


def test_batching_constant_times_is_a_perfect_fit() -> None:
    fit = fit_batching([1, 2, 4], [5.0, 5.0, 5.0])
    assert fit.k1_ms == pytest.approx(5.0) and fit.k2_ms == pytest.approx(0.0, abs=1e-12)
    assert fit.r2 == 1.0


@pytest.mark.parametrize(("bs", "ys", "match"), [
    ([4, 4, 4], [1.0, 1.1, 0.9], "2 distinct batch sizes"),
    ([2], [1.0], "2 distinct batch sizes"),
    ([1, 2, 4], [1.0, 2.0], "length"),
    ([1, 2, 4], [1.0, 0.0, 2.0], "per_request_ms must be finite and > 0"),
    ([1, 2, 4], [1.0, -1.0, 2.0], "per_request_ms"),
    ([1, 2, 4], [1.0, math.nan, 2.0], "per_request_ms"),
    ([0, 2, 4], [1.0, 1.0, 2.0], "batch_sizes must be finite and > 0"),
    ([0.5, 2, 4], [1.0, 1.0, 2.0], "batch sizes must be >= 1"),
    ([1, math.inf], [1.0, 1.0], "batch_sizes"),
])
def test_batching_rejects_bad_input(bs: list[float], ys: list[float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        fit_batching(bs, ys)


def test_batching_predict_rejects_bad_batch() -> None:
    fit = fit_batching([1, 2], [3.0, 2.0])
    for bad in (0, -1, math.nan, True):
        with pytest.raises(ValueError):
            fit.predict(bad)  # type: ignore[arg-type]
    assert fit.predict(np.int64(2)) == pytest.approx(2.0)


# ------------------------------------------------------------------------------ FPGA-GPU Eq. 1


def _grid(alpha: float, beta: float, q: dict[int, float], bs: list[int]) -> tuple[list[int], list[int], list[float]]:
    b_out, c_out, t_out = [], [], []
    for c, qc in q.items():
        for b in bs:
            b_out.append(b)
            c_out.append(c)
            t_out.append((alpha * b + beta) * qc)
    return b_out, c_out, t_out


def test_fpga_gpu_exact_recovery() -> None:
    b, c, t = _grid(0.8, 4.0, {1: 1.0, 2: 1.35, 4: 2.1}, [1, 2, 4, 8, 16])
    fit = fit_fpga_gpu(b, c, t)
    assert fit.alpha_ms == pytest.approx(0.8) and fit.beta_ms == pytest.approx(4.0)
    assert dict(fit.q) == pytest.approx({1: 1.0, 2: 1.35, 4: 2.1})
    assert fit.r2 == pytest.approx(1.0) and fit.rmse_ms < 1e-9 and fit.n == 15
    assert fit.base_r2 == pytest.approx(1.0)
    assert fit.predict(8, 2) == pytest.approx((0.8 * 8 + 4.0) * 1.35)
    assert fit.predict(8) == pytest.approx(0.8 * 8 + 4.0)  # baseline C=1
    # Eq. 2: C workers each serving b requests per T ms
    assert fit.throughput_rps(8, 4) == pytest.approx(4 * 8 * 1000 / ((0.8 * 8 + 4.0) * 2.1))


@settings(max_examples=100, deadline=None)
@given(alpha=POSITIVE, beta=POSITIVE, q2=st.floats(1.0, 4.0), q3=st.floats(1.0, 6.0), bs=BATCH_SETS)
def test_fpga_gpu_recovers_random_parameters(alpha: float, beta: float, q2: float, q3: float,
                                             bs: list[int]) -> None:
    b, c, t = _grid(alpha, beta, {1: 1.0, 2: q2, 3: q3}, bs)
    fit = fit_fpga_gpu(b, c, t)
    scale = alpha * max(bs) + beta
    assert fit.alpha_ms == pytest.approx(alpha, abs=1e-7 * scale)
    assert fit.beta_ms == pytest.approx(beta, abs=1e-6 * scale)
    assert fit.q[2] == pytest.approx(q2, rel=1e-6) and fit.q[3] == pytest.approx(q3, rel=1e-6)


def test_fpga_gpu_with_noise() -> None:
    rng = np.random.default_rng(3)
    b, c, t = _grid(1.5, 10.0, {1: 1.0, 2: 1.4, 3: 1.9}, [1, 2, 4, 8, 16, 32] * 10)
    noisy = (np.array(t) * (1 + 0.02 * rng.standard_normal(len(t)))).tolist()
    fit = fit_fpga_gpu(b, c, noisy)
    assert fit.alpha_ms == pytest.approx(1.5, rel=0.05) and fit.beta_ms == pytest.approx(10.0, rel=0.1)
    assert fit.q[2] == pytest.approx(1.4, rel=0.03) and fit.q[3] == pytest.approx(1.9, rel=0.03)
    assert 0.98 < fit.r2 < 1.0 and fit.rmse_ms > 0


def test_fpga_gpu_other_baseline_and_unknown_level() -> None:
    b, c, t = _grid(2.0, 1.0, {2: 1.0, 4: 1.5}, [1, 4, 8])
    fit = fit_fpga_gpu(b, c, t, baseline=2)
    assert fit.q[2] == 1.0 and fit.q[4] == pytest.approx(1.5)
    assert fit.predict(4) == pytest.approx(9.0)
    with pytest.raises(ValueError, match="concurrency 3"):
        fit.predict(4, 3)


@pytest.mark.parametrize(("b", "c", "t", "match"), [
    ([1, 2], [1, 1], [1.0], "length"),
    ([4, 4, 1], [1, 1, 2], [1.0, 1.0, 1.0], "2 distinct batch sizes at the baseline"),
    ([1, 2, 4], [2, 2, 2], [1.0, 2.0, 3.0], "baseline"),
    ([1, 2, 4], [1, 1.5, 1], [1.0, 2.0, 3.0], "whole numbers"),
    ([1, 2, 4], [1, 1, 1], [1.0, -2.0, 3.0], "batch_time_ms"),
    ([1, 2, 4], [1, 0, 1], [1.0, 2.0, 3.0], "concurrency"),
    ([1, 2, 3], [1, 1, 2], [10.0, 1.0, 1.0], "non-positive time"),
])
def test_fpga_gpu_rejects_bad_input(b: list[float], c: list[float], t: list[float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        fit_fpga_gpu(b, c, t)  # type: ignore[arg-type]
