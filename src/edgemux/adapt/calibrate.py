"""Online re-calibration: the service times a device observed replace the catalog's profile of that model.

A profile measured back to back, or copied from a paper, can be off once requests are spaced and mixed with
other tenants' (the CPU's caches, a real Edge TPU's USB transfers). What the device itself measured is the
better figure, once there are enough samples. Per profile (a model variant on a device kind) the devices
keep two sets of service-time moments (``monitor.ServiceMoments``):

- ``exec``: requests that ran without a model switch: the execution time;
- ``switched``: requests that paid a switch (the device last ran another model, or none): execution plus the
  switch overhead (Ibis Eq. 1), so the overhead is the difference of the two means.

``calibrate`` replaces the batch-1 execution time with the observed mean and variance (gamma-shaped, as
``profiles.distributions.from_moments`` does for any profile given by two moments) once enough requests
were seen, and the switch overhead once enough of both kinds were (see ``calibrate``); the provenance says what was observed
and what the catalog had said. ``calibrated_catalog`` does it for every observed profile, keeping profile
names, so placements that name a profile read the calibrated one: admission, the detectors and ``describe``
then use the calibrated figures.

Where the device cannot time its own service (the Ibis Edge TPU data: a send and a receive time per
request), ``fcfs_service_times`` recovers it on an FCFS device from submit and completion times: a request's
service starts when it was submitted or when the previous one finished, whichever is later.

Pure: the moments come in, a profile or catalog goes out. Units: ms (times), s (``*_s`` timestamps).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from edgemux.adapt.monitor import ServiceMoments
from edgemux.profiles.catalog import Catalog
from edgemux.profiles.types import ExecTime, Profile, Provenance

__all__ = ["Observed", "calibrate", "calibrated_catalog", "fcfs_service_times", "observed_from_fcfs"]

CALIBRATED = "calibrated"  # provenance source of a calibrated profile


@dataclass(frozen=True)
class Observed:
    """Service-time moments one profile showed on its devices: ``exec`` without a model switch, ``switched``
    for requests that paid one (ms)."""

    exec: ServiceMoments = field(default_factory=ServiceMoments)
    switched: ServiceMoments = field(default_factory=ServiceMoments)

    def merge(self, other: Observed) -> Observed:
        """Both observations together (exact: the moments merge pairwise)."""
        return Observed(self.exec.merge(other.exec), self.switched.merge(other.switched))

    def to_json(self) -> dict[str, list[float]]:
        """``{"exec": [n, mean_ms, m2, max_ms], "switched": [...]}``: what an agent reports."""
        return {k: [m.n, m.mean_ms, m.m2, m.max_ms] for k, m in (("exec", self.exec), ("switched", self.switched))}

    @classmethod
    def from_json(cls, data: object) -> Observed:
        """The inverse of ``to_json``; ``ValueError`` naming the part that is malformed."""
        if not isinstance(data, Mapping):
            raise ValueError(f"observed service times: expected an object, got {type(data).__name__}")
        parts: dict[str, ServiceMoments] = {}
        for key in ("exec", "switched"):
            v = data.get(key, [0, 0.0, 0.0, 0.0])
            # [n, mean_ms, m2] from an agent before the maximum was reported: its maximum is not known (0)
            if (not isinstance(v, (list, tuple)) or len(v) not in (3, 4)
                    or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)):
                raise ValueError(f"observed service times: {key!r} must be [n, mean_ms, m2, max_ms], got {v!r}")
            n, mean, m2, top = (*v, 0.0) if len(v) == 3 else v
            if (n < 0 or n != int(n) or not (np.isfinite(mean) and np.isfinite(m2) and np.isfinite(top))
                    or mean < 0 or m2 < 0 or top < 0):
                raise ValueError(f"observed service times: {key!r} needs n >= 0 whole, mean_ms >= 0, m2 >= 0, "
                                 f"max_ms >= 0; got {v!r}")
            parts[key] = ServiceMoments(int(n), float(mean), float(m2), float(top))
        return cls(parts["exec"], parts["switched"])


def calibrate(profile: Profile, observed: Observed, min_samples: int) -> Profile:
    """``profile`` with its batch-1 execution time (and switch overhead) replaced by what was observed;
    unchanged below ``min_samples`` observations. The provenance names the counts and what the catalog said.

    - ``exec`` has ``min_samples``: its mean and variance are the execution time; the switch overhead is the
      difference of the means once ``switched`` has ``min_samples`` too, else the catalog's stays;
    - only ``switched`` has ``min_samples`` (nearly every request switched: tenants that alternate): the
      execution time is the mean and variance of all of them, switches included, and the switch overhead 0,
      because it is inside that mean (right for the mix that was observed, as an as-served profile is);
    - neither has ``min_samples`` alone: unchanged, even when both together would. Pooling a mix of
      switched and unswitched requests would price every execution at the mix's switch rate, and a move
      that changes the mix (an app going to a device of its own, where nothing switches) would be planned
      with that price: the live ibis-hotspot run refused such a move for it before this rule."""
    if min_samples < 2:
        raise ValueError(f"min_samples must be >= 2 (a variance needs two samples), got {min_samples}")
    ex, sw = observed.exec, observed.switched
    old = profile.exec.get(1)
    said = f"catalog: {old.mean_ms:.3g} ms" if old is not None else "catalog: no batch-1 time"
    if ex.n >= min_samples:
        basis, switch_ms = ex, profile.switch_ms
        detail = f"execution {ex.mean_ms:.3g} ms (sd {ex.variance_ms2 ** 0.5:.2g}) from {ex.n} requests"
        if sw.n >= min_samples:
            switch_ms = max(sw.mean_ms - ex.mean_ms, 0.0)
            detail += f"; switch {switch_ms:.3g} ms from {sw.n} switched requests"
            said += f", switch {profile.switch_ms:.3g} ms"
    elif sw.n >= min_samples:
        basis, switch_ms = ex.merge(sw), 0.0
        detail = (f"execution {basis.mean_ms:.3g} ms (sd {basis.variance_ms2 ** 0.5:.2g}) from {basis.n} requests, "
                  f"{sw.n} of them after a switch (its cost included)")
        said += f", switch {profile.switch_ms:.3g} ms"
    else:
        return profile
    exec_ = dict(profile.exec)
    # the largest execution seen bounds the law (a periodic stream's worst case needs a bounded support);
    # with switches inside the basis it is not an execution time alone: no bound then
    top = basis.max_ms if basis is ex and basis.max_ms >= basis.mean_ms > 0 else None
    exec_[1] = ExecTime(1, basis.mean_ms, max(basis.variance_ms2, 0.0), max_ms=top)
    prov = Provenance(CALIBRATED, detail, f"{said}, {profile.provenance.source}")
    return replace(profile, exec=exec_, switch_ms=switch_ms, provenance=prov)


def calibrated_catalog(catalog: Catalog, observed: Mapping[str, Observed],
                       min_samples: int) -> tuple[Catalog, tuple[Profile, ...]]:
    """``catalog`` with every profile named in ``observed`` (profile name -> its observations) calibrated,
    and the profiles that changed. Names stay, so placements naming a profile read the calibrated one.
    An observed name the catalog does not have raises ``UnknownNameError`` (from ``Catalog.get``)."""
    changed = []
    for name in sorted(observed):
        old = catalog.get(name)
        new = calibrate(old, observed[name], min_samples)
        if new is not old:
            changed.append(new)
    if not changed:
        return catalog, ()
    return catalog.with_profiles(changed), tuple(changed)


def fcfs_service_times(submit_s: Sequence[float] | np.ndarray, end_s: Sequence[float] | np.ndarray) -> np.ndarray:
    """Service time (ms) of each request of an FCFS device, from when it was handed to the device
    (``submit_s``) and when it finished (``end_s``), both s on one clock: service starts at the later of its
    submission and the previous completion. Returned in the input order; ``ValueError`` for a request that
    finished before it was submitted."""
    sub = np.asarray(submit_s, dtype=float)
    end = np.asarray(end_s, dtype=float)
    if sub.shape != end.shape or sub.ndim != 1:
        raise ValueError(f"submit and end times must be two equal 1-d sequences, got {sub.shape} and {end.shape}")
    if np.any(end < sub):
        i = int(np.argmax(end < sub))
        raise ValueError(f"request {i} ends ({end[i]} s) before it was submitted ({sub[i]} s)")
    order = np.argsort(end, kind="stable")
    prev_end = np.concatenate(([-np.inf], end[order][:-1]))
    out = np.empty_like(end)
    out[order] = 1000.0 * (end[order] - np.maximum(sub[order], prev_end))
    return out


def observed_from_fcfs(models: Sequence[str], submit_s: Sequence[float] | np.ndarray,
                       end_s: Sequence[float] | np.ndarray) -> dict[str, Observed]:
    """Per model, the ``Observed`` moments of an FCFS device's requests (``fcfs_service_times``); a request
    counts as switched when the request that finished before it ran another model (or none: a cold start)."""
    service = fcfs_service_times(submit_s, end_s)
    order = np.argsort(np.asarray(end_s, dtype=float), kind="stable")
    groups: dict[tuple[str, bool], list[float]] = {}
    prev: str | None = None
    for i in order:
        m = models[int(i)]
        groups.setdefault((m, prev != m), []).append(float(service[i]))
        prev = m
    out: dict[str, Observed] = {}
    for m in sorted(set(models)):
        out[m] = Observed(ServiceMoments.of(groups.get((m, False), [])),
                          ServiceMoments.of(groups.get((m, True), [])))
    return out
