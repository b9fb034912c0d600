"""Arrival-time generation for the simulator (virtual time in ms, rates in req/s).

Every generator returns a sorted ``float64`` numpy array of arrival instants in ms, starting from virtual
time 0. Randomness comes only from the ``numpy.random.Generator`` passed in, so a seed fixes the stream.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from edgemux.cluster.workload import Arrival, ArrivalKind

__all__ = ["arrival_times", "merge_streams", "generate_arrivals"]


def _check_count_or_horizon(n: int | None, horizon_ms: float | None) -> None:
    if (n is None) == (horizon_ms is None):
        raise ValueError("give exactly one of n (number of arrivals) or horizon_ms")
    if n is not None and n < 0:
        raise ValueError(f"number of arrivals must be >= 0, got {n}")
    if horizon_ms is not None and not (horizon_ms >= 0 and math.isfinite(horizon_ms)):
        raise ValueError(f"horizon must be a finite number >= 0 ms, got {horizon_ms}")


def _poisson_horizon(rate_rps: float, horizon_ms: float, rng: np.random.Generator) -> np.ndarray:
    mean_gap = 1000.0 / rate_rps
    expected = horizon_ms / mean_gap
    # Draw in chunks sized to the expected count plus a generous margin, so one chunk almost always suffices.
    chunk = int(expected + 6.0 * math.sqrt(expected) + 16)
    parts: list[np.ndarray] = []
    last = 0.0
    while last < horizon_ms:
        t = last + np.cumsum(rng.exponential(mean_gap, chunk))
        parts.append(t)
        last = float(t[-1])
    times = np.concatenate(parts) if parts else np.empty(0)
    return times[times < horizon_ms]


def arrival_times(
    arrival: Arrival,
    rng: np.random.Generator,
    *,
    n: int | None = None,
    horizon_ms: float | None = None,
    jitter_ms: float = 0.0,
) -> np.ndarray:
    """Arrival instants (ms, sorted) of one app: the first ``n`` of them, or all in ``[0, horizon_ms)``.

    * Poisson at ``arrival.rate_rps`` req/s: exponential gaps of mean ``1000/rate`` ms from time 0.
    * Periodic at FPS ``rate_rps``: ``phase + k * 1000/fps`` ms with ``phase`` uniform in ``[0, 1000/fps)``;
      ``jitter_ms`` > 0 moves each frame by an independent uniform offset in ``[-jitter_ms, +jitter_ms]``
      (clipped at 0 and re-sorted, since a camera frame can't arrive before the run starts).
    * Replay: the given timestamps shifted so the first is at 0; ``n`` larger than the trace returns the
      whole trace (a trace is finite).

    A Poisson or periodic process with rate 0 has no arrivals: horizon mode returns an empty array, count
    mode with ``n > 0`` raises ``ValueError``.
    """
    _check_count_or_horizon(n, horizon_ms)
    if jitter_ms < 0 or not math.isfinite(jitter_ms):
        raise ValueError(f"jitter must be a finite number >= 0 ms, got {jitter_ms}")
    # Exactly one of n and horizon_ms is given (checked above); `until_ms` is read only in horizon mode
    # (n is None), where it equals horizon_ms. It is a plain float so no branch handles a None horizon.
    until_ms = math.inf if horizon_ms is None else horizon_ms

    if arrival.kind is ArrivalKind.REPLAY:
        ts = np.asarray(arrival.timestamps_ms, dtype=float)
        ts = np.sort(ts - ts[0])
        if n is not None:
            return ts[:n].copy()
        return ts[ts < until_ms]

    rate = arrival.rate_rps
    if rate == 0:
        if n:
            raise ValueError(f"an arrival process with rate 0 req/s cannot produce {n} arrivals")
        return np.empty(0)

    if arrival.kind is ArrivalKind.POISSON:
        if n is not None:
            return np.cumsum(rng.exponential(1000.0 / rate, n))
        return _poisson_horizon(rate, until_ms, rng)

    if arrival.kind is ArrivalKind.PERIODIC:
        period = 1000.0 / rate
        phase = float(rng.uniform(0.0, period))
        if n is None:
            count = 0 if phase >= until_ms else int(math.floor((until_ms - phase) / period)) + 1
        else:
            count = n
        # phase + k*period (not a running sum) keeps frame k exact however long the run.
        times = phase + np.arange(count, dtype=float) * period
        if n is None:
            times = times[times < until_ms]
        if jitter_ms > 0 and times.size:
            times = np.sort(np.maximum(times + rng.uniform(-jitter_ms, jitter_ms, times.size), 0.0))
            if n is None:
                times = times[times < until_ms]
        return times

    raise ValueError(f"unsupported arrival kind {arrival.kind!r}")  # pragma: no cover


def merge_streams(streams: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-app arrival streams (ms) into one: ``(times_ms, app_index)``, sorted by time.

    Ties are broken by app index, then by position within the app's stream (a stable sort), so the merged
    order is a deterministic function of the inputs.
    """
    if not streams:
        return np.empty(0), np.empty(0, dtype=np.int64)
    times = np.concatenate([np.asarray(s, dtype=float) for s in streams])
    idx = np.repeat(np.arange(len(streams), dtype=np.int64), [len(s) for s in streams])
    if len(streams) == 1 and not np.any(times[1:] < times[:-1]):  # one sorted stream: nothing to merge
        return times, idx
    order = np.argsort(times, kind="stable")
    return times[order], idx[order]


def generate_arrivals(
    arrivals: Sequence[Arrival],
    rngs: Sequence[np.random.Generator],
    total: int,
    *,
    jitter_ms: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """One merged arrival stream for several apps: ``(times_ms, app_index)``.

    Without replay apps the stream holds exactly ``total`` arrivals: the first ``total`` instants of the
    superposition of all apps' processes (each app is generated past the cut, so none is truncated early).
    With at least one replay app the run covers the replayed traces instead and ``total`` is ignored:
    replay apps keep their timestamps, shifted together by the earliest replayed timestamp so traces
    recorded on one clock stay aligned, and the other apps are generated over ``[0, end of the last trace]``.
    ``rngs[i]`` drives app ``i`` only, so adding an app does not change the others' arrivals.
    """
    if len(arrivals) != len(rngs):
        raise ValueError("need one random generator per arrival process")
    if not arrivals:
        raise ValueError("need at least one arrival process")
    if total < 0:
        raise ValueError(f"total number of arrivals must be >= 0, got {total}")

    replays = [a for a in arrivals if a.kind is ArrivalKind.REPLAY]
    if replays:
        # Arrival.__post_init__ guarantees every replay carries timestamps; the filter only narrows the
        # Optional field for the type checker.
        traces = [a.timestamps_ms for a in replays if a.timestamps_ms is not None]
        origin = min(min(ts) for ts in traces)
        end = max(max(ts) for ts in traces) - origin
        streams = []
        for a, rng in zip(arrivals, rngs):
            if a.kind is ArrivalKind.REPLAY:
                streams.append(np.sort(np.asarray(a.timestamps_ms, dtype=float) - origin))
            else:
                # end is inclusive for the trace, so generated apps get [0, end] too (nextafter makes it so)
                streams.append(arrival_times(a, rng, horizon_ms=float(np.nextafter(end, np.inf)), jitter_ms=jitter_ms))
        return merge_streams(streams)

    rates = np.array([a.rate_rps for a in arrivals], dtype=float)
    lam = float(rates.sum())
    if lam <= 0:
        raise ValueError("all apps have arrival rate 0 req/s: nothing to simulate")
    if total == 0:
        return np.empty(0), np.empty(0, dtype=np.int64)

    margin = 6.0
    while True:
        streams = []
        cut = math.inf
        for a, rng, r in zip(arrivals, rngs, rates):
            if r == 0:
                streams.append(np.empty(0))
                continue
            expect = total * r / lam
            # Jitter can reorder frames near the end of the stream, so generate a few extra periods past it.
            k = int(math.ceil(expect + margin * math.sqrt(expect) + 16 + (4 * jitter_ms * r / 1000.0)))
            s = arrival_times(a, rng, n=k, jitter_ms=jitter_ms)
            streams.append(s)
            # Only arrivals no later than every app's last generated one are a complete superposition. A
            # jittered frame not generated lands after (last base frame - jitter) >= s[-1] - 2 jitter.
            cut = min(cut, float(s[-1]) - (2.0 * jitter_ms if a.kind is ArrivalKind.PERIODIC else 0.0))
        times, idx = merge_streams(streams)
        keep = int(np.searchsorted(times, cut, side="right"))
        if keep >= total:
            return times[:total], idx[:total]
        margin *= 4.0  # practically never: a Poisson stream fell > 6 sigma short; draw again, deterministically
