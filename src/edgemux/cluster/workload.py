"""What a device does and what its tenants send it: the one description that ``perf`` (estimators),
``sim`` (virtual time) and later the runtime's emulated devices all read, so they agree.

Units: times in ms, rates in req/s.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

from edgemux.profiles.distributions import Distribution
from edgemux.profiles.types import DeviceKind, parse_enum


class Discipline(str, enum.Enum):
    """How a device shares itself among the requests of its tenants."""

    FCFS = "fcfs"
    """Non-preemptive first-come-first-served; a model-switch cost when the previous request ran another
    model (Edge TPU, Ibis §3.2)."""
    PS = "ps"
    """Egalitarian processor sharing: n requests in service each progress at rate 1/n."""
    GPU_TIMESHARE = "gpu-timeshare"
    """Embedded GPU (Ibis §3.3): FIFO within one app (one CUDA context), time-sharing across apps that
    have work."""
    MPS = "mps"
    """Request parallelism (Ibis §3.4.3): c servers, possibly fractional; n requests each progress at rate
    min(1, c/n) (limited processor sharing)."""
    BATCH = "batch"
    """Batching server: a batch of one model's queued requests, up to ``max_batch``, starts when the device is
    free and either the batch is full or the oldest request has waited ``batch_timeout_ms``."""
    SPATIAL = "spatial"
    """Controlled spatial sharing (Dhakal et al. §IV, GSLICE): the device is split into isolated shares. Each
    tenant runs ``instances`` instances of its model, each holding ``share`` of the device and serving one
    request at a time at the model's latency at that share (its share curve); the tenant's instances take
    its requests from one FIFO queue (M/G/k per tenant), and tenants do not slow each other down. The
    shares on one device sum to at most 1."""

    @classmethod
    def parse(cls, text: str) -> "Discipline":
        """The discipline named ``text``; ``ValueError`` naming the known ones otherwise."""
        return parse_enum(cls, text, "discipline")


class ArrivalKind(str, enum.Enum):
    POISSON = "poisson"
    PERIODIC = "periodic"  # camera frames at an FPS, random phase
    REPLAY = "replay"      # given timestamps


@dataclass(frozen=True)
class Arrival:
    """An app's arrival process. ``rate_rps`` is the mean rate (the FPS for periodic arrivals)."""

    kind: ArrivalKind
    rate_rps: float
    timestamps_ms: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate_rps) and self.rate_rps >= 0):
            raise ValueError(f"arrival rate must be a finite number >= 0 req/s, got {self.rate_rps}")
        if self.kind is ArrivalKind.REPLAY and not self.timestamps_ms:
            raise ValueError("replay arrivals need timestamps")

    @staticmethod
    def poisson(rate_rps: float) -> "Arrival":
        return Arrival(ArrivalKind.POISSON, rate_rps)

    @staticmethod
    def periodic(fps: float) -> "Arrival":
        return Arrival(ArrivalKind.PERIODIC, fps)

    @staticmethod
    def replay(timestamps_ms: list[float] | tuple[float, ...]) -> "Arrival":
        ts = tuple(sorted(float(t) for t in timestamps_ms))
        span_ms = ts[-1] - ts[0] if len(ts) > 1 else 0.0
        rate = (len(ts) - 1) / (span_ms / 1000.0) if span_ms > 0 else 0.0
        return Arrival(ArrivalKind.REPLAY, rate, ts)


@dataclass(frozen=True)
class BatchLaw:
    """Ibis Eq. 9: the per-request service time at batch size b is ``S_b = k1 + k2/b`` (ms), so a batch of
    b requests takes ``b*k1 + k2`` ms (``k2`` is the fixed cost per batch, ``k1`` the cost per item)."""

    k1_ms: float
    k2_ms: float

    def per_request_ms(self, b: int) -> float:
        return self.k1_ms + self.k2_ms / b

    def batch_ms(self, b: int) -> float:
        return b * self.k1_ms + self.k2_ms


@dataclass(frozen=True)
class CpuStage:
    """An app's own CPU stage before the accelerator (Ibis §3.5): ``cores`` (may be fractional) shared by
    processor sharing among the app's requests, each needing ``service`` ms of one core."""

    cores: float
    service: Distribution


@dataclass(frozen=True)
class Tenant:
    """One app as a device sees it.

    ``service`` is the execution time of one request alone at batch 1 (ms); ``switch_ms`` the model-switch
    overhead paid when the previous request on the device ran another model; ``batch`` the Eq. 9 law used by
    batching devices; ``cpu`` an optional CPU stage in tandem before the device; ``network_ms`` a constant
    network latency added end to end. ``model`` identifies the loaded model: tenants sharing a model (AI as a
    Service) pay no switch between each other. ``params`` names the parameter set the model's weights are
    cached in on an Edge TPU when several models were co-compiled into one (None: its own): tenants of one
    co-compiled set reload nothing between each other, so they pay no switch either (``cache_key``).
    ``service_max_ms``: the largest execution known where ``service``'s support is not bounded (a profile
    calibrated from observed times keeps its observed maximum; None: none known), for worst-case bounds.
    """

    name: str
    model: str
    arrival: Arrival
    service: Distribution
    switch_ms: float = 0.0
    batch: BatchLaw | None = None
    cpu: CpuStage | None = None
    network_ms: float = 0.0
    share: float = 1.0
    instances: int = 1
    params: str | None = None
    service_max_ms: float | None = None

    @property
    def cache_key(self) -> str:
        """What a sequential device keeps loaded for this tenant: its co-compiled parameter set, else its
        model. A request pays its switch when the previous one ran another cache key."""
        return self.params if self.params is not None else self.model

    def __post_init__(self) -> None:
        if not (math.isfinite(self.share) and 0.0 < self.share <= 1.0):
            raise ValueError(f"tenant {self.name!r}: share must be in (0, 1] of the device, got {self.share}")
        if isinstance(self.instances, bool) or not isinstance(self.instances, int) or self.instances < 1:
            raise ValueError(f"tenant {self.name!r}: instances must be an integer >= 1, got {self.instances!r}")

    @property
    def rate_rps(self) -> float:
        return self.arrival.rate_rps


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator instance: its kind and sharing discipline with the discipline's parameters.

    ``servers`` is c for ``mps`` (may be fractional, e.g. 1.65 measured in Ibis Fig. 11); ``max_batch`` and
    ``batch_timeout_ms`` configure ``batch``.
    """

    name: str
    kind: DeviceKind
    discipline: Discipline
    servers: float = 1.0
    max_batch: int = 1
    batch_timeout_ms: float = 0.0

    def __post_init__(self) -> None:
        if not (self.servers >= 1.0 and math.isfinite(self.servers)):
            raise ValueError(f"servers must be a finite number >= 1, got {self.servers}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.batch_timeout_ms < 0:
            raise ValueError(f"batch_timeout_ms must be >= 0 ms, got {self.batch_timeout_ms}")


def shares_used(tenants: Sequence[Tenant]) -> float:
    """The fraction of a ``spatial`` device the tenants' instances hold: sum of ``share * instances``."""
    return math.fsum(t.share * t.instances for t in tenants)


def check_shares(tenants: Sequence[Tenant], *, where: str = "device") -> None:
    """``ValueError`` when the tenants' instances hold more than the whole device (naming each holding).
    Here, below both the estimators and the simulator, so that both refuse the same configurations."""
    used = shares_used(tenants)
    if used > 1.0 + 1e-6:
        parts = ", ".join(f"{t.name} {t.instances} x {t.share:g}" for t in tenants)
        raise ValueError(f"{where}: the instances hold {used:.3g} of the device, more than all of it ({parts})")
