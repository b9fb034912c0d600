"""An app's prediction from its pieces' (``describe``'s and the overview's), for the control plane and the
client verbs alike (light: no estimator is imported here).

Units: latencies in ms.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["STATS", "meets_slo", "weighted_prediction"]

STATS = ("mean", "p50", "p95", "p99")


def weighted_prediction(pieces: Iterable[tuple[float, Mapping[str, Any] | None]]) -> dict[str, float | str | None]:
    """An app's predicted ``mean_ms``/``p50_ms``/``p95_ms``/``p99_ms`` (ms) from its pieces'
    ``(weight, prediction)``: the predictions weighted by the weights of the pieces with traffic (exact for the
    mean, an approximation for a percentile); "unstable" when a piece's queue is, None when a piece has no
    prediction."""
    live = [(float(w), p or {}) for w, p in pieces if w > 0]  # a piece with no traffic does not shape the latency
    out: dict[str, float | str | None] = {}
    for stat in STATS:
        key = f"{stat}_ms"
        values = [p.get(key) for _, p in live]
        numbers = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if "unstable" in values:
            out[key] = "unstable"
        elif not live or len(numbers) < len(values):
            out[key] = None
        else:
            out[key] = sum(w * v for (w, _), v in zip(live, numbers)) / sum(w for w, _ in live)
    return out


def meets_slo(value: Any, slo_ms: float | None) -> bool | None:
    """Whether a latency (ms) meets ``slo_ms``: None when either is unknown, False when unstable."""
    if value == "unstable":
        return False
    return bool(value <= slo_ms) if isinstance(value, (int, float)) and slo_ms is not None else None
