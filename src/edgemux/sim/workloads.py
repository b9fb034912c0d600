"""Seeded workloads for the experiments: the Ibis application mix, MicroEdge camera streams, and dynamic
come-and-go camera streams (MicroEdge §6.3).

Every generator is a pure function of its arguments and ``seed`` (``np.random.default_rng(seed)``): the same
arguments give the same apps in the same order. Units: rates in req/s (frames/s for cameras), times in ms,
event times in s.

Assumptions the papers leave open are parameters with documented defaults:

* **Ibis size classes.** Ibis §4.4.1 draws small/medium/large apps in 47/33/20 % (Azure VM sizes) and picks
  models evenly within a class, but Table 2 prints a size category only for the detection rows (YOLO-tinyV4
  M, YoloV3 L, YoloV4 L). Where the catalog has no ``size_category`` we classify by the model's bare
  Jetson Nano inference time: small < 20 ms, medium 20-60 ms, large >= 60 ms (``IbisMix.small_below_ms`` /
  ``large_from_ms``). The rule agrees with the three printed categories (23.79 ms -> M; 190, 408 ms -> L).
* **Ibis rates and SLOs.** The paper gives each app "a response time constraint R_i and a worst-case rate
  lambda" without values. We draw each app's standalone utilization (rate x bare service time) uniformly in
  ``utilization`` (default 5-25 % of one Jetson Nano), Poisson arrivals, and a mean-latency SLO of
  ``slo_factor`` (default 5) times the bare service time.
* **Cameras** (MicroEdge §6.1-6.2): 15 FPS periodic frames; the SLO is the frame budget, p99 <= 1000/15 ms.
* **Dynamic streams** (MicroEdge §6.3 derives three stream attributes from the Azure Functions trace, without
  numbers): a *24x7* class present for the whole horizon, a *sparse* class of rare, long-ish streams
  (Poisson starts, exponential lifetimes) and a *bursty* class whose streams start in groups (Poisson burst
  starts, a 1 + Poisson group size, starts spread over ``burst_spread_s``) and live briefly. Rates per
  hour and lifetimes are the ``DynamicStreams`` parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from edgemux.cluster.state import App, Slo
from edgemux.profiles.catalog import load_catalog
from edgemux.profiles.types import Profile

__all__ = [
    "SIZE_CLASSES", "AZURE_SIZE_MIX", "IbisMix", "ibis_size_classes", "ibis_apps",
    "CAMERA_FPS", "FRAME_BUDGET_MS", "CORAL_PIE", "BODYPIX", "camera", "cameras",
    "StreamEvent", "DynamicStreams", "dynamic_streams",
]

SIZE_CLASSES = ("small", "medium", "large")
AZURE_SIZE_MIX = (0.47, 0.33, 0.20)
"""Ibis §4.4.1: small (<2 GB), medium (2-8 GB), large (>8 GB) Azure VMs in 47/33/20 %."""

_CATEGORY = {"S": "small", "M": "medium", "L": "large"}


# ------------------------------------------------------------------------------------------ Ibis mix


@dataclass(frozen=True)
class IbisMix:
    """Parameters of the Ibis application mix (see the module docstring for why these defaults)."""

    profile_set: str = "ibis-jetson-nano"
    proportions: tuple[float, float, float] = AZURE_SIZE_MIX
    small_below_ms: float = 20.0
    large_from_ms: float = 60.0
    utilization: tuple[float, float] = (0.05, 0.25)
    slo_factor: float = 5.0
    slo_stat: str = "mean"
    shared: bool = False

    def __post_init__(self) -> None:
        if len(self.proportions) != 3 or any(p < 0 for p in self.proportions) or \
                not math.isclose(sum(self.proportions), 1.0, abs_tol=1e-9):
            raise ValueError(f"proportions must be 3 non-negative numbers summing to 1, got {self.proportions}")
        if not 0 < self.small_below_ms <= self.large_from_ms:
            raise ValueError("need 0 < small_below_ms <= large_from_ms")
        lo, hi = self.utilization
        if not 0 < lo <= hi:
            raise ValueError(f"utilization range must satisfy 0 < lo <= hi, got {self.utilization}")
        if not self.slo_factor > 1:
            raise ValueError(f"slo_factor must be > 1, got {self.slo_factor}")


def _size_class(p: Profile, mix: IbisMix) -> str:
    cat = p.extra.get("size_category")
    if isinstance(cat, str) and cat.upper() in _CATEGORY:
        return _CATEGORY[cat.upper()]
    t = p.service.mean
    return "small" if t < mix.small_below_ms else ("large" if t >= mix.large_from_ms else "medium")


def ibis_size_classes(mix: IbisMix = IbisMix()) -> dict[str, tuple[Profile, ...]]:
    """The catalog's profiles of ``mix.profile_set`` by size class (catalog order within a class)."""
    cat = load_catalog()
    out: dict[str, list[Profile]] = {c: [] for c in SIZE_CLASSES}
    for name, p in cat.profiles.items():
        if name.startswith(mix.profile_set + "/") and 1 in p.exec:
            out[_size_class(p, mix)].append(p)
    empty = [c for c, ps in out.items() if not ps]
    if empty:
        raise ValueError(f"no {', '.join(empty)} models in catalog {mix.profile_set!r}")
    return {c: tuple(ps) for c, ps in out.items()}


def ibis_apps(n: int, seed: int, mix: IbisMix = IbisMix(), prefix: str = "app") -> list[App]:
    """``n`` apps of the Ibis mix: class by ``mix.proportions``, model uniform within the class, rate from a
    uniform standalone utilization, mean-latency SLO ``slo_factor`` x the bare service time."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = np.random.default_rng(seed)
    classes = ibis_size_classes(mix)
    kinds = rng.choice(3, size=n, p=np.asarray(mix.proportions, dtype=float))
    picks = rng.random(n)
    utils = rng.uniform(mix.utilization[0], mix.utilization[1], size=n)
    apps = []
    for i in range(n):
        members = classes[SIZE_CLASSES[int(kinds[i])]]
        p = members[min(int(picks[i] * len(members)), len(members) - 1)]
        s = p.service.mean
        apps.append(App(name=f"{prefix}-{i}", model=p.model, rate_rps=float(utils[i]) * 1000.0 / s,
                        slo=Slo(mix.slo_factor * s, mix.slo_stat), shared=mix.shared))
    return apps


def app_size_class(app: App, mix: IbisMix = IbisMix()) -> str:
    """The size class of an app of the mix (by its model)."""
    for c, ps in ibis_size_classes(mix).items():
        if any(p.model == app.model for p in ps):
            return c
    raise ValueError(f"model {app.model!r} is not in catalog {mix.profile_set!r}")


# ------------------------------------------------------------------------------------------- cameras

CAMERA_FPS = 15.0
FRAME_BUDGET_MS = 1000.0 / CAMERA_FPS
CORAL_PIE = "ssd_mobilenet_v2"
"""Coral-Pie's detection model (MicroEdge §6.1)."""
BODYPIX = "bodypix"


def camera(name: str, model: str = CORAL_PIE, fps: float = CAMERA_FPS) -> App:
    """One camera stream: periodic frames at ``fps``, SLO p99 <= the frame budget 1000/fps ms."""
    return App(name=name, model=model, rate_rps=fps, slo=Slo(1000.0 / fps, "p99"), periodic=True, burst=1.0)


def cameras(model: str, n: int, fps: float = CAMERA_FPS, prefix: str | None = None) -> list[App]:
    """``n`` identical cameras named ``<prefix>-0 .. <prefix>-(n-1)`` (prefix defaults to the model)."""
    return [camera(f"{prefix or model}-{i}", model, fps) for i in range(n)]


# ----------------------------------------------------------------------------------- dynamic streams


@dataclass(frozen=True)
class StreamEvent:
    """At ``time_s`` the camera ``app`` is added or removed; ``kind`` is its stream class."""

    time_s: float
    action: Literal["add", "remove"]
    app: App
    kind: str


@dataclass(frozen=True)
class DynamicStreams:
    """Parameters of the come-and-go camera workload (defaults: a 24 h day). Models default to the
    MicroEdge catalog's (the §6.3 models MobileNet V1 / UNet V2 have no TPU-unit figures there)."""

    horizon_s: float = 24 * 3600.0
    steady: int = 4
    steady_model: str = CORAL_PIE
    sparse_per_hour: float = 1.0
    sparse_mean_life_s: float = 1800.0
    sparse_model: str = BODYPIX
    bursts_per_hour: float = 0.5
    burst_mean_extra: float = 4.0
    burst_spread_s: float = 60.0
    burst_mean_life_s: float = 300.0
    bursty_model: str = CORAL_PIE
    fps: float = CAMERA_FPS

    def __post_init__(self) -> None:
        for f in ("horizon_s", "sparse_mean_life_s", "burst_mean_life_s", "fps"):
            if not getattr(self, f) > 0:
                raise ValueError(f"{f} must be > 0")
        for f in ("sparse_per_hour", "bursts_per_hour", "burst_mean_extra", "burst_spread_s"):
            if getattr(self, f) < 0:
                raise ValueError(f"{f} must be >= 0")
        if self.steady < 0:
            raise ValueError("steady must be >= 0")


def _poisson_times(rng: np.random.Generator, per_hour: float, horizon_s: float) -> np.ndarray:
    n = rng.poisson(per_hour * horizon_s / 3600.0)
    return np.sort(rng.uniform(0.0, horizon_s, size=n))


def dynamic_streams(seed: int, params: DynamicStreams = DynamicStreams()) -> list[StreamEvent]:
    """A seeded event list sorted by time (removals before additions at the same instant). Streams whose
    lifetime runs past the horizon are not removed."""
    rng = np.random.default_rng(seed)
    ev: list[StreamEvent] = []
    H = params.horizon_s

    def stream(kind: str, i: int, model: str, start: float, life: float | None) -> None:
        app = camera(f"{kind}-{i}", model, params.fps)
        ev.append(StreamEvent(start, "add", app, kind))
        if life is not None and start + life < H:
            ev.append(StreamEvent(start + life, "remove", app, kind))

    for i in range(params.steady):
        stream("24x7", i, params.steady_model, 0.0, None)
    for i, t in enumerate(_poisson_times(rng, params.sparse_per_hour, H)):
        stream("sparse", i, params.sparse_model, float(t), float(rng.exponential(params.sparse_mean_life_s)))
    k = 0
    for t in _poisson_times(rng, params.bursts_per_hour, H):
        size = 1 + int(rng.poisson(params.burst_mean_extra))
        for s in np.sort(rng.uniform(0.0, params.burst_spread_s, size=size)):
            start = float(t + s)
            if start < H:
                stream("bursty", k, params.bursty_model, start,
                       float(rng.exponential(params.burst_mean_life_s)))
                k += 1
    ev.sort(key=lambda e: (e.time_s, 0 if e.action == "remove" else 1, e.app.name))
    return ev
