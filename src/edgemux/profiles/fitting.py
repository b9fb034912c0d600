"""Fit the papers' service-time laws to measured points. Pure functions: no I/O, no clocks.

* Ibis Eq. 9, batching: the per-request service time at batch size ``b`` is ``S_b = k1 + k2/b`` (ms),
  so one batch of ``b`` requests takes ``b*k1 + k2`` ms: ``k1`` is the per-item cost, ``k2`` the fixed
  per-batch cost. (Ibis calls S_b the service time of the batch seen as one "logical request" with the
  faster rate mu_b = 1/S_b; edgemux reads it per request, as ``cluster.workload.BatchLaw`` does.)
* FPGA-GPU paper (Kim et al.) Eq. 1: the computation time of one batch on a worker is
  ``T = (alpha*bs + beta) * Q(C)`` (ms), where ``bs`` is the worker's batch size, ``C`` the number of
  concurrent workers on the accelerator and ``Q(C)`` the slowdown from their contention, ``Q(1) = 1``
  (FPGAs always run one worker).

Both fits are ordinary least squares and report R^2 and RMSE (ms) over the points they were given.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np


@dataclass(frozen=True)
class BatchFit:
    """Ibis Eq. 9 fitted: ``S_b = k1_ms + k2_ms / b`` ms per request at batch size ``b``.

    ``r2`` (dimensionless) and ``rmse_ms`` measure the fit on the ``n`` points it came from.
    """

    k1_ms: float
    k2_ms: float
    r2: float
    rmse_ms: float
    n: int

    def predict(self, b: float) -> float:
        """Per-request service time (ms) at batch size ``b`` (>= 1)."""
        _check_batch(b)
        return self.k1_ms + self.k2_ms / b

    def batch_ms(self, b: float) -> float:
        """Time to serve one whole batch of ``b`` requests (ms): ``b*k1 + k2``."""
        _check_batch(b)
        return b * self.k1_ms + self.k2_ms


@dataclass(frozen=True)
class FpgaGpuFit:
    """FPGA-GPU Eq. 1 fitted: ``T = (alpha_ms*b + beta_ms) * q[C]`` ms per batch.

    ``alpha_ms`` is ms per request in the batch, ``beta_ms`` ms per batch, ``q`` maps each concurrency
    level C (concurrent workers on the accelerator) to its slowdown ratio (dimensionless; 1 at the
    baseline). ``r2``/``rmse_ms`` cover all ``n`` points; ``base_r2``/``base_rmse_ms`` only the baseline
    points that determined alpha and beta.
    """

    alpha_ms: float
    beta_ms: float
    q: Mapping[int, float]
    r2: float
    rmse_ms: float
    base_r2: float
    base_rmse_ms: float
    n: int
    baseline: int = 1

    def predict(self, b: float, c: int | None = None) -> float:
        """Computation time (ms) of one batch of ``b`` requests on a worker when ``c`` workers share the
        accelerator (default: the baseline). ``ValueError`` for a concurrency level that was not fitted."""
        _check_batch(b)
        level = self.baseline if c is None else c
        if level not in self.q:
            raise ValueError(f"no slowdown fitted for concurrency {level} (fitted: {sorted(self.q)})")
        return (self.alpha_ms * b + self.beta_ms) * self.q[level]

    def throughput_rps(self, b: float, c: int | None = None) -> float:
        """Requests/s of the accelerator when each of its ``c`` workers runs batches of ``b`` (Eq. 2)."""
        level = self.baseline if c is None else c
        return level * b * 1000.0 / self.predict(b, level)


def _check_batch(b: float) -> None:
    if isinstance(b, bool) or not isinstance(b, numbers.Real) or not (math.isfinite(b) and b >= 1):
        raise ValueError(f"batch size must be a finite number >= 1, got {b!r}")


def _check_batches(b: np.ndarray) -> None:
    if np.any(b < 1):
        raise ValueError(f"batch sizes must be >= 1, got {float(b[b < 1][0])!r}")


def _as_positive(name: str, values: Sequence[float]) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a flat sequence of numbers")
    bad = ~np.isfinite(arr) | (arr <= 0)
    if bad.any():
        raise ValueError(f"{name} must be finite and > 0; got {arr[bad][0]!r} at index {int(np.flatnonzero(bad)[0])}")
    return arr


def _goodness(y: np.ndarray, y_hat: np.ndarray) -> tuple[float, float]:
    """R^2 and RMSE; R^2 is 1 for a perfect fit and 0 when y is constant but not matched."""
    resid = y - y_hat
    ss_res = float(resid @ resid)
    rmse = math.sqrt(ss_res / y.size)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    scale = max(float(np.abs(y).max()), 1.0)
    if ss_tot <= (1e-12 * scale) ** 2 * y.size:
        # y is constant: R^2 is undefined; call an exact match perfect rather than return NaN
        return (1.0 if rmse <= 1e-9 * scale else 0.0), rmse
    return 1.0 - ss_res / ss_tot, rmse


def _line_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares intercept and slope of y = a + s*x."""
    design = np.column_stack([np.ones_like(x), x])
    (a, s), *_ = np.linalg.lstsq(design, y, rcond=None)
    return float(a), float(s)


def fit_batching(batch_sizes: Sequence[float], per_request_ms: Sequence[float]) -> BatchFit:
    """Fit Ibis Eq. 9, ``S_b = k1 + k2/b``, to per-request service times (ms) measured at batch sizes.

    Least squares in ``1/b`` (the law is linear in it). Needs at least two distinct batch sizes, equal
    lengths, batch sizes >= 1 and times finite and > 0; ``ValueError`` says which rule was broken. Repeated batch sizes
    are fine (several measurements of one size). k1, k2 are not constrained to be >= 0: a negative value
    means the data do not follow the law, which ``r2`` will also show.
    """
    if len(batch_sizes) != len(per_request_ms):
        raise ValueError(f"batch_sizes and per_request_ms differ in length "
                         f"({len(batch_sizes)} vs {len(per_request_ms)})")
    b = _as_positive("batch_sizes", batch_sizes)
    _check_batches(b)
    y = _as_positive("per_request_ms", per_request_ms)
    if np.unique(b).size < 2:
        raise ValueError(f"need at least 2 distinct batch sizes to fit S_b = k1 + k2/b, got {sorted(set(b.tolist()))}")
    k1, k2 = _line_fit(1.0 / b, y)
    r2, rmse = _goodness(y, k1 + k2 / b)
    return BatchFit(k1_ms=k1, k2_ms=k2, r2=r2, rmse_ms=rmse, n=int(y.size))


def fit_fpga_gpu(batch_sizes: Sequence[float], concurrency: Sequence[int], batch_time_ms: Sequence[float],
                 baseline: int = 1) -> FpgaGpuFit:
    """Fit FPGA-GPU Eq. 1, ``T = (alpha*bs + beta) * Q(C)``, to measured batch computation times (ms).

    ``batch_sizes[i]`` is the batch size bs, ``concurrency[i]`` the number of concurrent workers C on the
    accelerator and ``batch_time_ms[i]`` the time one worker took for that batch. alpha (ms per request)
    and beta (ms per batch) are fitted by least squares on the points at C = ``baseline`` (where Q = 1 by
    definition; needs >= 2 distinct batch sizes there); then for every other C, Q(C) is the least-squares
    scale of the baseline line through that level's points: sum(T*m)/sum(m^2) with m = alpha*bs + beta.
    ``ValueError`` for unequal lengths, non-positive or non-finite values, non-integer C, or no usable
    baseline.
    """
    n = len(batch_time_ms)
    if not (len(batch_sizes) == len(concurrency) == n):
        raise ValueError(f"batch_sizes, concurrency and batch_time_ms differ in length "
                         f"({len(batch_sizes)}, {len(concurrency)}, {n})")
    b = _as_positive("batch_sizes", batch_sizes)
    _check_batches(b)
    t = _as_positive("batch_time_ms", batch_time_ms)
    c_arr = _as_positive("concurrency", concurrency)
    if np.any(c_arr != np.round(c_arr)):
        raise ValueError("concurrency must be whole numbers of workers")
    c = c_arr.astype(int)
    base = c == baseline
    if np.unique(b[base]).size < 2:
        raise ValueError(f"need at least 2 distinct batch sizes at the baseline concurrency C={baseline} "
                         f"to fit alpha and beta (got {sorted(set(b[base].tolist()))})")
    beta, alpha = _line_fit(b[base], t[base])
    base_r2, base_rmse = _goodness(t[base], alpha * b[base] + beta)

    m = alpha * b + beta
    if np.any(m <= 0):
        raise ValueError(f"fitted alpha={alpha:.4g} ms, beta={beta:.4g} ms give a non-positive time "
                         f"alpha*bs + beta at some batch size; the baseline points do not follow Eq. 1")
    q: dict[int, float] = {baseline: 1.0}
    for level in sorted(set(c.tolist()) - {baseline}):
        sel = c == level
        q[level] = float(t[sel] @ m[sel] / (m[sel] @ m[sel]))
    t_hat = m * np.array([q[int(level)] for level in c])
    r2, rmse = _goodness(t, t_hat)
    return FpgaGpuFit(alpha_ms=alpha, beta_ms=beta, q=MappingProxyType(q), r2=r2, rmse_ms=rmse,
                      base_r2=base_r2, base_rmse_ms=base_rmse, n=n, baseline=baseline)
