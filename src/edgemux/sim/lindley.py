"""Vectorized single-device FCFS simulation (numpy): the Lindley recursion without a Python loop.

For a non-preemptive FCFS server that starts empty, request ``n``'s waiting time obeys
``W_{n+1} = max(0, W_n + S_n - A_{n+1})`` (``A_{n+1}`` the gap between arrivals n and n+1). With the
partial sums ``P_n = sum_{k<=n} (S_{k-1} - A_k)`` (``P_0 = 0``) its solution is
``W_n = P_n - min(0, min_{k<=n} P_k)``: one ``cumsum`` and one ``np.minimum.accumulate``.

Model switches (Ibis §3.2, Eq. 1): request ``n`` pays its tenant's ``switch_ms`` when the request served
just before it (FCFS order = arrival order) ran a different model; tenants sharing a model string never
switch between each other. The loaded model stays loaded through idle periods. **Cold start**: the
device starts with no model loaded, so the very first request pays its switch (the warm-up discard
removes it from statistics; the event engine's FCFS device does the same, so both paths agree).

Units: ms throughout.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["lindley_waits", "switch_overheads", "FcfsRun", "fcfs_lindley"]

# Rows per block: the recursion is restarted from the carried waiting time at each block, which keeps the
# partial sums small (so float64 rounding stays ~1e-9 ms even for 10^8 requests) and the temporaries in
# cache.
_BLOCK = 1 << 16


def lindley_waits(arrival_ms: np.ndarray, service_ms: np.ndarray, *, block: int = _BLOCK) -> np.ndarray:
    """Waiting times (ms) in queue of FCFS requests on one server that starts empty.

    ``arrival_ms`` must be sorted (the FCFS order); ``service_ms`` is each request's total occupation of
    the server (ms, switch overhead included). Returns ``W`` with ``W[0] == 0``; request n starts at
    ``arrival_ms[n] + W[n]`` and leaves at that plus ``service_ms[n]``.
    """
    a = np.asarray(arrival_ms, dtype=float)
    s = np.asarray(service_ms, dtype=float)
    if a.shape != s.shape or a.ndim != 1:
        raise ValueError("arrival and service arrays must be one-dimensional and of the same length")
    n = a.size
    out = np.empty(n)
    if n == 0:
        return out
    if block < 2:
        raise ValueError("block must be >= 2")
    w0 = 0.0
    p = np.empty(min(block, n))
    for b0 in range(0, n, block):
        b1 = min(b0 + block, n)
        m = b1 - b0
        ab = a[b0:b1]
        sb = s[b0:b1]
        pb = p[:m]
        pb[0] = 0.0
        # P_k - P_{k-1} = S_{k-1} - (a_k - a_{k-1})
        np.subtract(sb[:-1], np.diff(ab), out=pb[1:])
        np.cumsum(pb[1:], out=pb[1:])
        wb = out[b0:b1]
        # W_k = max(w0 + P_k, max_{1<=j<=k} (P_k - P_j)) = P_k - min(-w0, min_{1<=j<=k} P_j):
        # replacing P_0 by -w0 folds the carried-in wait into the running minimum.
        pb[0] = -w0
        np.minimum.accumulate(pb, out=wb)
        pb[0] = 0.0
        np.subtract(pb, wb, out=wb)
        if b1 < n:
            w0 = max(0.0, float(wb[-1] + sb[-1] - (a[b1] - ab[-1])))
    return out


def switch_overheads(
    model_index: np.ndarray, switch_ms: np.ndarray, *, cold_start: bool = True
) -> np.ndarray:
    """Per-request model-switch overhead (ms) in FCFS order.

    ``model_index[n]`` identifies the model request n runs, ``switch_ms[n]`` the overhead it pays when the
    previous request ran another model. With ``cold_start`` the first request pays (no model loaded yet).
    """
    m = np.asarray(model_index)
    sw = np.asarray(switch_ms, dtype=float)
    out = np.zeros(m.size)
    if m.size == 0:
        return out
    changed = np.empty(m.size, dtype=bool)
    changed[0] = cold_start
    np.not_equal(m[1:], m[:-1], out=changed[1:])
    np.multiply(sw, changed, out=out)
    return out


@dataclass(frozen=True)
class FcfsRun:
    """One FCFS run: per request (in arrival order) its wait, occupation of the device and departure (ms)."""

    wait_ms: np.ndarray
    occupation_ms: np.ndarray
    """Service plus switch overhead: how long the request held the device."""
    start_ms: np.ndarray
    departure_ms: np.ndarray


def fcfs_lindley(
    arrival_ms: np.ndarray,
    tenant_index: np.ndarray,
    service_ms: np.ndarray,
    tenant_model: np.ndarray,
    tenant_switch_ms: np.ndarray,
    *,
    cold_start: bool = True,
) -> FcfsRun:
    """Simulate a FCFS device with model-switch overhead, vectorized.

    ``arrival_ms`` sorted arrival instants (ms); ``tenant_index[n]`` the tenant of request n;
    ``service_ms[n]`` its execution time alone (ms); ``tenant_model[i]`` an integer id of tenant i's model
    (equal ids never switch); ``tenant_switch_ms[i]`` tenant i's switch overhead (ms).
    """
    t = np.asarray(tenant_index, dtype=np.int64)
    switch = np.asarray(tenant_switch_ms, dtype=float)
    if not switch.any():  # no tenant pays a switch: skip two gathers and a pass that would add zeros
        occupation = np.array(service_ms, dtype=float)
    else:
        occupation = np.asarray(service_ms, dtype=float) + switch_overheads(
            np.asarray(tenant_model)[t], switch[t], cold_start=cold_start
        )
    w = lindley_waits(arrival_ms, occupation)
    start = np.asarray(arrival_ms, dtype=float) + w
    return FcfsRun(wait_ms=w, occupation_ms=occupation, start_ms=start, departure_ms=start + occupation)
