"""Profile types: what edgemux knows about running a model variant on a kind of device.

Units: times in ms, memory in MB, power in W, rates in req/s.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TypeVar

from edgemux.profiles.distributions import Distribution, from_moments

E = TypeVar("E", bound=enum.Enum)


def parse_enum(cls: type[E], text: str, what: str) -> E:
    """The member of ``cls`` whose value is ``text``; ``ValueError`` naming the known values otherwise."""
    for member in cls:
        if member.value == text:
            return member
    raise ValueError(f"unknown {what} {text!r} (known: {', '.join(str(m.value) for m in cls)})")


class DeviceKind(str, enum.Enum):
    """Kinds of accelerator edgemux can place work on (the vocabulary of docs/concepts.md)."""

    EDGETPU = "edgetpu"
    GPU_EMBEDDED = "gpu-embedded"
    GPU_DISCRETE = "gpu-discrete"
    FPGA = "fpga"
    CPU = "cpu"

    @classmethod
    def parse(cls, text: str) -> "DeviceKind":
        """The kind named ``text``; ``ValueError`` naming the known kinds otherwise."""
        return parse_enum(cls, text, "device kind")


@dataclass(frozen=True)
class Provenance:
    """Where a number came from: a paper's table/figure or a measurement (backend, host, date)."""

    source: str
    detail: str = ""
    note: str = ""

    def __str__(self) -> str:
        parts = [self.source]
        if self.detail:
            parts.append(self.detail)
        if self.note:
            parts.append(f"({self.note})")
        return ", ".join(parts)


@dataclass(frozen=True)
class Model:
    """A DNN (never an analytic formula)."""

    name: str
    task: str = "classification"
    params_m: float | None = None  # millions of parameters
    gflops: float | None = None


@dataclass(frozen=True)
class Variant:
    """One deployable form of a model: precision, input size, the device kind it is compiled for, max batch."""

    model: str
    name: str
    precision: str = "fp32"
    max_batch: int = 1
    input_shape: tuple[int, ...] | None = None


@dataclass(frozen=True)
class ExecTime:
    """Execution time of one batch of ``batch`` requests: mean and variance (ms, ms^2), or samples (ms);
    ``max_ms``: the largest execution known (ms; a calibration saw it), None when the support is not
    known to be bounded."""

    batch: int
    mean_ms: float
    var_ms2: float = 0.0
    samples: tuple[float, ...] | None = None
    max_ms: float | None = None

    def distribution(self) -> Distribution:
        """The service-time distribution this entry stands for (empirical when samples exist). ``max_ms``
        does not change it: a gamma of the observed moments keeps the tails' shape, and the largest
        execution is read where a worst case needs it (``Tenant.service_max_ms``, ``perf.periodic``)."""
        if self.samples:
            from edgemux.profiles.distributions import Empirical

            return Empirical(self.samples)
        return from_moments(self.mean_ms, self.var_ms2)


@dataclass(frozen=True)
class Profile:
    """Measured or imported facts about one (variant, device kind).

    ``exec`` maps batch size to execution time; ``switch_ms`` is the model-switch overhead paid when the
    device last ran another model (Edge TPU parameter reload); ``share_curve`` lists (resource share in
    (0, 1], latency ms) points where known (GSLICE-style spatial sharing, the "knee");
    ``extra`` holds paper-specific facts kept with their meaning in the key (e.g. ``tpu_units_15fps``).
    """

    name: str
    model: str
    variant: str
    device_kind: DeviceKind
    provenance: Provenance
    exec: dict[int, ExecTime] = field(default_factory=dict)
    memory_static_mb: float | None = None
    memory_runtime_mb: float | None = None
    switch_ms: float = 0.0
    power_w: float | None = None
    share_curve: tuple[tuple[float, float], ...] = ()
    extra: dict[str, float | str] = field(default_factory=dict)

    def exec_time(self, batch: int = 1) -> ExecTime:
        """Execution time entry for ``batch``; ``KeyError`` naming the known batch sizes otherwise."""
        if batch not in self.exec:
            raise KeyError(f"profile {self.name!r} has no execution time for batch {batch} "
                           f"(known: {sorted(self.exec)})")
        return self.exec[batch]

    @property
    def service(self) -> Distribution:
        """Service-time distribution of one request at batch size 1 (ms)."""
        return self.exec_time(1).distribution()

    @property
    def cocompiled(self) -> str | None:
        """The co-compiled set this model's Edge TPU build belongs to (``extra["cocompiled"]``): models
        compiled together for one Edge TPU, their parameters cached together (a switch between them reloads
        nothing), loaded as one unit whose on-chip parameter memory is ``extra["cocompiled_params_mb"]``.
        None for a model compiled alone."""
        v = self.extra.get("cocompiled")
        return v if isinstance(v, str) and v else None

    @property
    def params_key(self) -> str | None:
        """What a sequential device keeps loaded for this model when it is a co-compiled set's member, the set
        (``cocompiled:<set>``: ``Tenant.params``, ``ModelInfo.params``; one loaded copy in device memory);
        None for a model compiled alone."""
        return None if self.cocompiled is None else f"cocompiled:{self.cocompiled}"

    @property
    def memory_total_mb(self) -> float | None:
        """Static plus runtime memory, where both are known (MB)."""
        if self.memory_static_mb is None:
            return None
        return self.memory_static_mb + (self.memory_runtime_mb or 0.0)
