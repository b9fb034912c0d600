"""Verdicts of a latency estimate against an SLO. Pure: no I/O."""

from __future__ import annotations

from edgemux.perf.result import Unstable

MEETS = "meets"
VIOLATES = "VIOLATES"
BORDERLINE = "borderline"
UNKNOWN = "no estimate"


def verdict_point(value: float | Unstable | None, slo_ms: float) -> str:
    """Verdict for a point estimate (ms) against ``slo_ms``: meets, VIOLATES, or 'no estimate'."""
    if value is None:
        return UNKNOWN
    if isinstance(value, Unstable):
        return VIOLATES
    return MEETS if value <= slo_ms else VIOLATES


def verdict_interval(lo: float, hi: float, slo_ms: float) -> str:
    """Verdict for a confidence interval [lo, hi] (ms): meets if all of it is within the SLO, VIOLATES if
    none of it is, borderline otherwise (the simulation cannot tell at this confidence)."""
    if hi <= slo_ms:
        return MEETS
    if lo > slo_ms:
        return VIOLATES
    return BORDERLINE
