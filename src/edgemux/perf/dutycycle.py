"""MicroEdge TPU units (Cao et al., paper 003, §4.1-4.3): the duty cycle ``t / T`` of an app's requests.

An app whose inference takes ``t`` ms (model switching included) and whose requests come every
``T = 1000 / fps`` ms needs ``t / T = t * fps / 1000`` TPU units. Apps can share one TPU as long as their
units sum to at most 1 (the TPU Units Rule, Eq. 2); a dedicated-TPU baseline gives each app
``ceil(units)`` TPUs (e.g. 69 ms at 15 FPS: 1.035 units, 2 TPUs, each 52 % used, §1).

Units: ms, frames (requests) per second. Pure functions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["tpu_units", "fits_one_tpu", "dedicated_tpus", "dedicated_utilization", "EPS"]

EPS = 1e-9
"""Tolerance on unit sums (floating-point sums of decimal units such as 0.3 + 0.7)."""


def tpu_units(exec_ms: float, fps: float) -> float:
    """MicroEdge §4.1: TPU units ``t / T = exec_ms * fps / 1000`` (dimensionless duty cycle)."""
    if not (exec_ms >= 0 and math.isfinite(exec_ms)):
        raise ValueError(f"execution time must be a finite number >= 0 ms, got {exec_ms}")
    if not (fps >= 0 and math.isfinite(fps)):
        raise ValueError(f"frame rate must be a finite number >= 0, got {fps}")
    return exec_ms * fps / 1000.0


def fits_one_tpu(units: Iterable[float]) -> bool:
    """MicroEdge TPU Units Rule (Eq. 2): apps can share one TPU iff their units sum to <= 1."""
    return math.fsum(units) <= 1.0 + EPS


def dedicated_tpus(units: float) -> int:
    """TPUs a dedicated baseline gives an app: ``ceil(units)``, at least 1 (an app gets its own TPU even
    when idle). 1.035 units -> 2 TPUs."""
    if units < 0:
        raise ValueError(f"TPU units must be >= 0, got {units}")
    return max(1, math.ceil(units - EPS))


def dedicated_utilization(units: float) -> float:
    """Utilization of each of an app's dedicated TPUs when its frames are split evenly over
    ``dedicated_tpus(units)`` of them: ``units / ceil(units)`` (1.035 -> 0.5175, MicroEdge §1)."""
    return units / dedicated_tpus(units)
