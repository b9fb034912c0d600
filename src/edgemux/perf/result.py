"""Results of estimators: a number, or an explicit ``Unstable`` that says why there is none."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Unstable:
    """The queue has no steady state: offered load ``rho`` >= 1 at ``where``.

    Estimators return this instead of a negative or infinite latency, so a caller must handle it.
    """

    rho: float
    where: str = "device"

    def __str__(self) -> str:
        return f"unstable (rho={self.rho:.3f} >= 1 at {self.where})"


Latency = float | Unstable
"""A latency in ms, or ``Unstable``."""


def add(*parts: Latency) -> Latency:
    """Sum of latencies (ms); the first ``Unstable`` part wins, so instability is never summed away."""
    total = 0.0
    for p in parts:
        if isinstance(p, Unstable):
            return p
        total += p
    return total
