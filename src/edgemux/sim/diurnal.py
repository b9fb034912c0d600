"""A day of tenants that come and go and whose load follows a daily curve: the trace of ``dynamic-trace``.

Each app declares a contract (the rate it asks admission for) at an off-peak level, and actually sends
``contract x peak_ratio x daily(t)``: ``daily`` is 1 at ``peak_hour`` and ``night_level`` twelve hours
away (a raised cosine), ``peak_ratio`` is drawn per app, so that some apps stay below their contract all
day and others exceed it in the afternoon (the case the issue names: a tenant sends more than its
contract). Rates change in steps of ``step_s``.

Population: ``initial`` apps present at t = 0 (their lifetime exponential with mean
``initial_mean_life_s``) and arrivals, a Poisson process whose intensity follows the daily curve too
(``arrivals_per_hour`` at the peak), each staying an exponential ``mean_life_s``. Models are drawn
uniformly from ``models`` (Ibis's Edge TPU catalog); an app's contract is ``utilization`` of one device by
its model's execution plus switch time (so a big model gets a low rate), its SLO a ``slo_stat`` of
``slo_factor`` times the same time.

The papers give no such trace (MicroEdge §6.3 derives come-and-go from the Azure Functions trace without
numbers; Ibis states worst-case rates only); every figure is a parameter with its default here.

Pure and seeded: ``daily_apps(seed, params)`` returns the same events for the same arguments. Units:
seconds (times), hours (clock), req/s (rates), ms (SLOs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from edgemux.cluster.state import App, Slo
from edgemux.profiles.catalog import load_catalog
from edgemux.profiles.types import DeviceKind
from edgemux.sim.cluster import Arrive, Leave, Rate, TraceEvent

__all__ = ["DailyApps", "daily_apps", "daily_level"]

EDGETPU_MODELS = ("efficientnet-S", "efficientnet-M", "efficientnet-L", "mobilenet_v1", "mobilenet_v2",
                  "inception_v3", "inception_v4")
"""The Ibis Edge TPU models with memory figures (the two SSD models have none)."""


@dataclass(frozen=True)
class DailyApps:
    """The trace's parameters (see the module doc); times in s unless named ``_hour``."""

    horizon_s: float = 24 * 3600.0
    start_hour: float = 0.0
    initial: int = 24
    initial_mean_life_s: float = 16 * 3600.0
    arrivals_per_hour: float = 3.0
    mean_life_s: float = 4 * 3600.0
    models: tuple[str, ...] = EDGETPU_MODELS
    profile_set: str = "ibis-edgetpu"
    utilization: tuple[float, float] = (0.03, 0.08)
    slo_factor: tuple[float, float] = (5.0, 10.0)
    slo_stat: str = "p99"
    peak_ratio: tuple[float, float] = (0.6, 1.8)
    night_level: float = 0.3
    peak_hour: float = 15.0
    step_s: float = 900.0

    def __post_init__(self) -> None:
        for f in ("horizon_s", "initial_mean_life_s", "mean_life_s", "step_s"):
            v = getattr(self, f)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{f} must be a finite number of seconds > 0, got {v!r}")
        if self.initial < 0 or self.arrivals_per_hour < 0:
            raise ValueError("initial and arrivals_per_hour must be >= 0")
        if not 0 < self.night_level <= 1:
            raise ValueError(f"night_level must be in (0, 1], got {self.night_level!r}")
        for f in ("utilization", "slo_factor", "peak_ratio"):
            lo, hi = getattr(self, f)
            if not 0 < lo <= hi:
                raise ValueError(f"{f} must be a range 0 < low <= high, got {(lo, hi)!r}")
        if not self.models:
            raise ValueError("models must name at least one model")


def daily_level(params: DailyApps, t_s: float) -> float:
    """The daily curve at trace time ``t_s`` (s): 1 at ``peak_hour``, ``night_level`` 12 h away."""
    hour = params.start_hour + t_s / 3600.0
    phase = 2.0 * math.pi * (hour - params.peak_hour) / 24.0
    return params.night_level + (1.0 - params.night_level) * (1.0 + math.cos(phase)) / 2.0


def daily_apps(seed: int, params: DailyApps = DailyApps()) -> list[TraceEvent]:
    """The trace (see the module doc), sorted by time; at one instant an app's arrival comes before its first
    rate, and leaving apps before arriving ones. Apps are named ``app-<i>`` in order of arrival."""
    rng = np.random.default_rng(seed)
    catalog = load_catalog()
    cost = {}  # model -> execution + switch time (ms): what one request of it takes on a shared device
    for m in params.models:
        p = catalog.find(m, DeviceKind.EDGETPU, params.profile_set)
        cost[m] = p.service.mean + p.switch_ms
    H, step = params.horizon_s, params.step_s
    starts: list[tuple[float, float]] = []  # (arrival s, lifetime s)
    for _ in range(params.initial):
        starts.append((0.0, float(rng.exponential(params.initial_mean_life_s))))
    # a Poisson process with the daily curve as intensity: thinning of one at the peak intensity
    t = 0.0
    peak = params.arrivals_per_hour / 3600.0
    while peak > 0:
        t += float(rng.exponential(1.0 / peak))
        if t >= H:
            break
        if rng.random() < daily_level(params, t):
            starts.append((t, float(rng.exponential(params.mean_life_s))))
    keyed: list[tuple[float, int, int, TraceEvent]] = []
    for i, (t0, life) in enumerate(starts):
        model = params.models[int(rng.integers(len(params.models)))]
        c = cost[model]
        contract = float(rng.uniform(*params.utilization)) * 1000.0 / c
        slo = Slo(round(float(rng.uniform(*params.slo_factor)) * c, 1), params.slo_stat)
        ratio = float(rng.uniform(*params.peak_ratio))
        app = App(f"app-{i}", model, round(contract, 3), slo)
        end = t0 + life
        keyed.append((t0, 1, i, Arrive(t0, app)))
        k = math.floor(t0 / step)
        at = t0
        while at < min(end, H):
            mid = min(at + step / 2.0, H)  # each step's rate is the curve at its middle
            keyed.append((at, 2, i, Rate(at, app.name, round(contract * ratio * daily_level(params, mid), 4))))
            k += 1
            at = k * step
        if end < H:
            keyed.append((end, 0, i, Leave(end, app.name)))
    keyed.sort(key=lambda x: (x[0], x[1], x[2]))
    return [e for *_, e in keyed]
