"""MVSP variants (``edgemux.policies.mvsp.Variant``) from profiles: one variant per (model, batch size or
precision) profile entry.

The MVSP paper's variants are batch sizes of one model ("instantiate them during loading various
model-variants by changing the batch size parameter, which affects the instance size and throughput",
§II-A, Fig. 2), measured on a GTX 1050 Ti with TensorFlow; it prints none of them. edgemux builds variants
from its own profiles instead:

* ``latency_ms`` (``L_mv``) is the execution time of one whole batch of ``b`` requests: a request waits
  for its batch, so the batch's time is what it sees;
* ``max_load_rps`` (``Load_mv``) is ``1000 * b / batch_ms``: one instance running back-to-back batches;
* ``memory_mb`` (``R_mv``) is the profile's memory per instance (static + runtime, ``memory_total_mb``),
  plus ``(b - 1)`` images' activations where a :class:`BatchScaling` gives them;
* ``interference`` (``alpha_mv``) is a parameter (the paper uses 0.1 for every variant, §III).

A profile that has measured the batch size asked for uses that measurement. Otherwise the batch time
follows Ibis Eq. 9 read per batch, ``batch_ms(b) = k2 + b * k1`` with ``k1`` the per-item cost from a
:class:`BatchScaling` and ``k2 = S_1 - k1`` the fixed per-batch cost so that batch 1 matches the profile.
:func:`roofline_scaling` derives ``k1`` as a compute floor: an image's FLOPs at the device's peak rate.

Pure: no I/O. Units: ms, req/s, MB, GFLOP/s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from edgemux.errors import InputError
from edgemux.policies.mvsp import Variant
from edgemux.profiles.types import Profile

__all__ = ["BatchScaling", "roofline_scaling", "variants_from_profiles"]


@dataclass(frozen=True)
class BatchScaling:
    """How a model's batch grows with its size ``b``: each extra request adds ``per_item_ms`` (Ibis Eq. 9's
    ``k1``, ms) of execution time and ``per_item_memory_mb`` (MB) of activation memory; ``source`` says where
    both came from."""

    per_item_ms: float
    per_item_memory_mb: float = 0.0
    source: str = ""

    def __post_init__(self) -> None:
        for what, x in (("per_item_ms", self.per_item_ms), ("per_item_memory_mb", self.per_item_memory_mb)):
            if not (math.isfinite(x) and x >= 0):
                raise InputError("scaling", f"{what} must be a finite number >= 0, got {x!r}")


def roofline_scaling(gmacs: float, peak_gflops: float, activation_mb: float = 0.0, source: str = "") -> BatchScaling:
    """The compute floor of one more image in a batch: ``k1 = 2 * gmacs / peak_gflops * 1000`` ms.

    ``gmacs`` is 1e9 multiply-accumulates per image (one MAC = 2 FLOPs), ``peak_gflops`` the device's peak
    rate (GFLOP/s) at the precision the model runs in, ``activation_mb`` an image's activation memory (MB).
    A real device never reaches its peak, so this ``k1`` is a lower bound and the batching gain it implies
    an upper bound."""
    if not (math.isfinite(gmacs) and gmacs > 0):
        raise InputError("gmacs", f"must be > 0 (1e9 multiply-accumulates per image), got {gmacs!r}")
    if not (math.isfinite(peak_gflops) and peak_gflops > 0):
        raise InputError("peak_gflops", f"must be > 0 GFLOP/s, got {peak_gflops!r}")
    return BatchScaling(per_item_ms=2.0 * gmacs / peak_gflops * 1000.0, per_item_memory_mb=activation_mb,
                        source=source)


def _check_batches(batches: Sequence[int]) -> list[int]:
    out = []
    for b in batches:
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise InputError("batches", f"batch sizes must be integers >= 1, got {b!r}")
        out.append(b)
    if len(set(out)) != len(out):
        raise InputError("batches", f"batch sizes must be distinct, got {list(batches)}")
    return out


def variants_from_profiles(profiles: Sequence[Profile], *, batches: Sequence[int] | None = None,
                           scaling: Mapping[str, BatchScaling] | None = None, interference: float = 0.1,
                           name: str = "{variant}-b{batch}") -> tuple[Variant, ...]:
    """One MVSP ``Variant`` per (profile, batch size): see the module docstring for the formulas.

    ``batches``: the batch sizes to make variants of (every profile gets all of them); ``None`` takes each
    profile's own measured batch sizes. A batch size a profile has not measured needs ``scaling[model]``
    (Ibis Eq. 9 from the batch-1 time). ``interference``: ``alpha_mv`` of every variant. ``name`` formats
    the variant name from the profile's ``variant`` (precision/engine) and the batch size, so that two
    profiles of one model (two precisions) give distinct variants.

    Raises ``InputError`` naming the profile when it has no memory figure, lacks the batch-1 time the
    scaling needs, or when ``k1`` exceeds its batch-1 time (a negative fixed cost: the law does not apply).
    """
    if not (math.isfinite(interference) and interference >= 0):
        raise InputError("interference", f"must be >= 0, got {interference!r}")
    wanted = None if batches is None else _check_batches(batches)
    scaling = scaling or {}
    out: list[Variant] = []
    for p in profiles:
        memory = p.memory_total_mb
        if memory is None or not (memory > 0):
            raise InputError("profiles", f"profile {p.name!r} has no memory figure (R_mv needs static + runtime MB)")
        sizes = sorted(p.exec) if wanted is None else wanted
        if not sizes:
            raise InputError("profiles", f"profile {p.name!r} has no execution time")
        law = scaling.get(p.model)
        for b in sizes:
            if b in p.exec:
                batch_ms = p.exec[b].mean_ms
                how = f"measured batch {b}: {batch_ms:.3f} ms ({p.provenance})"
            else:
                if law is None:
                    raise InputError("profiles", f"profile {p.name!r} has no batch-{b} time and no batch scaling "
                                                 f"for model {p.model!r} (measured: {sorted(p.exec)})")
                if 1 not in p.exec:
                    raise InputError("profiles", f"profile {p.name!r} has no batch-1 time to scale from "
                                                 f"(measured: {sorted(p.exec)})")
                s1 = p.exec[1].mean_ms
                k2 = s1 - law.per_item_ms
                if k2 < 0:
                    raise InputError("scaling", f"model {p.model!r}: per-item time {law.per_item_ms:.3f} ms exceeds "
                                                f"the batch-1 time {s1:.3f} ms of {p.name!r}")
                batch_ms = k2 + b * law.per_item_ms
                how = (f"Ibis Eq. 9: {k2:.3f} + {b} x {law.per_item_ms:.3f} ms (batch 1 from {p.provenance}; "
                       f"k1 from {law.source or 'the given scaling'})")
            if not (batch_ms > 0):
                raise InputError("profiles", f"profile {p.name!r}: batch-{b} time must be > 0 ms, got {batch_ms}")
            extra_mb = (b - 1) * law.per_item_memory_mb if law is not None else 0.0
            out.append(Variant(model=p.model, name=name.format(variant=p.variant, batch=b), latency_ms=batch_ms,
                               memory_mb=memory + extra_mb, max_load_rps=1000.0 * b / batch_ms,
                               interference=interference,
                               source=f"{how}; memory {memory:g} MB + {b - 1} x {extra_mb / max(b - 1, 1):.2f} MB"))
    keys = [v.key for v in out]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise InputError("profiles", f"two profiles give the same variant {dup[0]}/{dup[1]}; pass one profile "
                                     f"per (model, precision)")
    return tuple(out)
