"""Service-time distributions (ms) with analytic moments and seeded sampling.

Every distribution exposes its analytic ``mean`` and ``var`` (and ``second_moment``); the tests check
samples against them. ``lattice(dt, n)`` gives the probability mass on a grid of step ``dt`` ms, used by
the tail estimator (numerical inversion of the Pollaczek-Khinchine transform).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    # numpy is imported where an array is made, not here: the cluster's state (a Device's kind, a workload's
    # service law) imports this module, and the CLI's client verbs (`edgemux get apps`) read that state
    # without drawing a sample (numpy is 0.1 to 0.15 s of start-up)
    import numpy as np


@runtime_checkable
class Distribution(Protocol):
    """A non-negative random service time in milliseconds.

    Implementations are immutable and hashable values (the ones here are frozen dataclasses): the estimators
    memoize per-distribution work on them (``perf.tails.support_ms``, ``perf.tailbounds.service_law``).
    """

    def __hash__(self) -> int: ...

    @property
    def mean(self) -> float: ...

    @property
    def var(self) -> float: ...

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray: ...

    def lattice(self, dt: float, n: int) -> np.ndarray: ...


LatticeMemo = dict["Distribution", "np.ndarray"]
"""Lattices already computed on one grid (one ``(dt, n)``), keyed by the distribution (a value)."""


def lattice(d: Distribution, dt: float, n: int, memo: LatticeMemo | None = None) -> np.ndarray:
    """``d.lattice(dt, n)``, each distinct distribution computed once per ``memo``: a mixture of many tenants'
    switch laws (``perf.edgetpu.service_mixture``) holds the same few models' laws many times, each a CDF
    evaluated on every grid point. ``memo`` belongs to the caller and to ONE grid ``(dt, n)``; its arrays are
    read-only. The result is the same array, to the bit, as without it: the same parts summed in the same
    order."""
    if memo is None:
        return d.lattice(dt, n)
    got = memo.get(d)
    if got is None:
        with_memo = getattr(d, "lattice_with", None)
        got = with_memo(dt, n, memo) if with_memo is not None else d.lattice(dt, n)
        got.flags.writeable = False
        memo[d] = got
    return got


def second_moment(d: Distribution) -> float:
    """E[S^2] in ms^2."""
    return d.var + d.mean * d.mean


def scv(d: Distribution) -> float:
    """Squared coefficient of variation Var/mean^2 (dimensionless)."""
    return d.var / (d.mean * d.mean) if d.mean > 0 else 0.0


def _point_mass(value: float, dt: float, n: int) -> np.ndarray:
    """Mass 1 at ``value`` on the grid, split linearly between the two nearest points (keeps the mean)."""
    import numpy as np
    out = np.zeros(n)
    x = value / dt
    i = int(math.floor(x))
    frac = x - i
    if i >= n - 1:
        out[n - 1] = 1.0
        return out
    out[i] += 1.0 - frac
    out[i + 1] += frac
    return out


@dataclass(frozen=True)
class Deterministic:
    """Always ``value`` ms."""

    value: float

    def __post_init__(self) -> None:
        if not (self.value >= 0 and math.isfinite(self.value)):
            raise ValueError(f"deterministic service time must be a finite number >= 0 ms, got {self.value}")

    @property
    def mean(self) -> float:
        return self.value

    @property
    def var(self) -> float:
        return 0.0

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        import numpy as np
        return np.full(n, self.value)

    def lattice(self, dt: float, n: int) -> np.ndarray:
        return _point_mass(self.value, dt, n)


@dataclass(frozen=True)
class Exponential:
    """Exponential with mean ``mean_ms``."""

    mean_ms: float

    def __post_init__(self) -> None:
        if not (self.mean_ms > 0 and math.isfinite(self.mean_ms)):
            raise ValueError(f"exponential mean must be a finite number > 0 ms, got {self.mean_ms}")

    @property
    def mean(self) -> float:
        return self.mean_ms

    @property
    def var(self) -> float:
        return self.mean_ms * self.mean_ms

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.exponential(self.mean_ms, n)

    def lattice(self, dt: float, n: int) -> np.ndarray:
        import numpy as np
        edges = np.exp(-np.arange(n + 1) * dt / self.mean_ms)
        mass = edges[:-1] - edges[1:]
        mass[-1] += edges[-1]
        # cell [k dt, (k+1) dt) is put at its centre-of-mass point; shifting by half a cell keeps the mean
        return _shift_half(mass)


def _shift_half(mass: np.ndarray) -> np.ndarray:
    """Move each cell's mass from its left edge to its midpoint by splitting it over two grid points."""
    out = 0.5 * mass
    out[1:] += 0.5 * mass[:-1]
    out[-1] += 0.5 * mass[-1]
    return out


@dataclass(frozen=True)
class Gamma:
    """Gamma with given mean (ms) and squared coefficient of variation ``scv`` (shape = 1/scv)."""

    mean_ms: float
    scv: float

    def __post_init__(self) -> None:
        if not (self.mean_ms > 0 and self.scv > 0):
            raise ValueError(f"gamma needs mean > 0 ms and scv > 0, got {self.mean_ms}, {self.scv}")

    @property
    def mean(self) -> float:
        return self.mean_ms

    @property
    def var(self) -> float:
        return self.scv * self.mean_ms * self.mean_ms

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        shape = 1.0 / self.scv
        return rng.gamma(shape, self.mean_ms / shape, n)

    def lattice(self, dt: float, n: int) -> np.ndarray:
        import numpy as np
        from scipy.stats import gamma as _g

        shape = 1.0 / self.scv
        cdf = _g.cdf(np.arange(n + 1) * dt, shape, scale=self.mean_ms / shape)
        mass = np.diff(cdf)
        mass[-1] += 1.0 - cdf[-1]
        return _shift_half(mass)


@dataclass(frozen=True)
class Mixture:
    """Finite mixture: with probability ``weights[i]`` the time is drawn from ``parts[i]``.

    A two-point ``Mixture`` of ``Deterministic`` parts is the bimodal distribution of the validation grid,
    and the Edge TPU's service time with model switches is a mixture too (Ibis Eq. 1).
    """

    parts: tuple[Distribution, ...]
    weights: tuple[float, ...]
    _cum: np.ndarray | None = field(init=False, repr=False, compare=False)  # for sampling, made on first use
    # computed once: a device's switch mixture has a part per tenant and is read (and hashed, as a memo key)
    # many times per estimate
    _mean: float = field(init=False, repr=False, compare=False)
    _var: float = field(init=False, repr=False, compare=False)
    _hash: int | None = field(init=False, repr=False, compare=False)  # on first use: a part may be unhashable

    def __post_init__(self) -> None:
        if len(self.parts) != len(self.weights) or not self.parts:
            raise ValueError("mixture needs as many weights as parts, at least one")
        # plain Python: an estimate builds a mixture per tenant, and numpy's per-call cost is most of it
        if any(not w >= 0 for w in self.weights) or not math.isclose(math.fsum(self.weights), 1.0, rel_tol=1e-9,
                                                                     abs_tol=1e-9):
            raise ValueError(f"mixture weights must be >= 0 and sum to 1, got {self.weights}")
        object.__setattr__(self, "_cum", None)
        mean = float(sum(w * p.mean for p, w in zip(self.parts, self.weights)))
        m2 = sum(w * second_moment(p) for p, w in zip(self.parts, self.weights))
        object.__setattr__(self, "_mean", mean)
        object.__setattr__(self, "_var", float(max(m2 - mean**2, 0.0)))
        object.__setattr__(self, "_hash", None)

    def __hash__(self) -> int:
        h = self._hash
        if h is None:
            h = hash((self.parts, self.weights))
            object.__setattr__(self, "_hash", h)
        return h

    def __reduce__(self) -> tuple[type, tuple[tuple[Distribution, ...], tuple[float, ...]]]:
        # rebuilt through __init__ in the receiving process: a hash is only valid in the process that made it
        return (Mixture, (self.parts, self.weights))

    @property
    def mean(self) -> float:
        return self._mean

    @property
    def var(self) -> float:
        return self._var

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        import numpy as np
        cum = self._cum
        if cum is None:
            w = np.asarray(self.weights, dtype=float)
            cum = np.cumsum(w / w.sum())
            object.__setattr__(self, "_cum", cum)
        which = np.searchsorted(cum, rng.random(n), side="right")
        which = np.minimum(which, len(self.parts) - 1)
        out = np.empty(n)
        for i, part in enumerate(self.parts):
            idx = np.flatnonzero(which == i)
            if idx.size:
                out[idx] = part.sample(rng, idx.size)
        return out

    def lattice(self, dt: float, n: int) -> np.ndarray:
        return self.lattice_with(dt, n, {})

    def lattice_with(self, dt: float, n: int, memo: LatticeMemo) -> np.ndarray:
        """:meth:`lattice` with each distinct part's lattice taken from ``memo`` (see :func:`lattice`)."""
        import numpy as np
        out = np.zeros(n)
        scaled = np.empty(n)  # one scratch array: a new one per part costs more than the product at 16k cells
        for p, w in zip(self.parts, self.weights):
            out += np.multiply(lattice(p, dt, n, memo), w, out=scaled)
        return out


def bimodal(low_ms: float, high_ms: float, p_high: float) -> Mixture:
    """Two-point distribution: ``high_ms`` with probability ``p_high``, else ``low_ms``."""
    return Mixture((Deterministic(low_ms), Deterministic(high_ms)), (1.0 - p_high, p_high))


@dataclass(frozen=True)
class Empirical:
    """Resamples measured service times (ms) uniformly with replacement."""

    samples: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.samples or min(self.samples) < 0:
            raise ValueError("empirical distribution needs at least one sample, all >= 0 ms")

    @property
    def mean(self) -> float:
        import numpy as np
        return float(np.mean(self.samples))

    @property
    def var(self) -> float:
        import numpy as np
        return float(np.var(self.samples))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        import numpy as np
        arr = np.asarray(self.samples, dtype=float)
        return arr[rng.integers(0, arr.size, n)]

    def lattice(self, dt: float, n: int) -> np.ndarray:
        import numpy as np
        out = np.zeros(n)
        for s in self.samples:
            out += _point_mass(s, dt, n)
        return out / len(self.samples)


@dataclass(frozen=True)
class Shifted:
    """``base`` plus a constant ``shift_ms``."""

    base: Distribution
    shift_ms: float

    @property
    def mean(self) -> float:
        return self.base.mean + self.shift_ms

    @property
    def var(self) -> float:
        return self.base.var

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.base.sample(rng, n) + self.shift_ms

    def lattice(self, dt: float, n: int) -> np.ndarray:
        return self.lattice_with(dt, n, {})

    def lattice_with(self, dt: float, n: int, memo: LatticeMemo) -> np.ndarray:
        """:meth:`lattice` with the base's lattice taken from ``memo`` (see :func:`lattice`)."""
        import numpy as np
        shift_cells = self.shift_ms / dt
        i = int(math.floor(shift_cells))
        frac = shift_cells - i
        base = lattice(self.base, dt, n, memo)
        out = np.zeros(n)
        if i < n:
            np.multiply(base[: n - i], 1 - frac, out=out[i:])  # onto zeros: the sum it was, one array fewer
        if i + 1 < n:
            out[i + 1 :] += frac * base[: n - i - 1]
        out[-1] += 1.0 - out.sum()  # mass pushed past the grid stays at its end
        return out


@dataclass(frozen=True)
class Scaled:
    """``base`` times a constant ``factor`` > 0: the same model run slower or faster (e.g. at a smaller share
    of a spatially shared device, ``perf.spatial.at_share``)."""

    base: Distribution
    factor: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.factor) and self.factor > 0):
            raise ValueError(f"scale factor must be a finite number > 0, got {self.factor}")

    @property
    def mean(self) -> float:
        return self.base.mean * self.factor

    @property
    def var(self) -> float:
        return self.base.var * self.factor * self.factor

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.base.sample(rng, n) * self.factor

    def lattice(self, dt: float, n: int) -> np.ndarray:
        # P(f X in cell k of width dt) = P(X in cell k of width dt / f)
        return self.base.lattice(dt / self.factor, n)


def from_moments(mean_ms: float, var_ms2: float) -> Distribution:
    """The distribution edgemux assumes when a profile gives only mean and variance.

    Deterministic when the variance is zero, otherwise a gamma with the same two moments.
    """
    if var_ms2 <= 0:
        return Deterministic(mean_ms)
    return Gamma(mean_ms, var_ms2 / (mean_ms * mean_ms))
