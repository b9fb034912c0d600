"""Dhakal's Batch-Latency primitive (papers/002 §IV-F) and a round scheduler that uses it: pure temporal
round robin (what Triton does) against spatio-temporal sharing.

**The law.** A model's latency for a batch of ``b`` at share ``s`` of a device is

    L(b, s) = (k1 * b + k2) * slowdown(curve, s)        (ms)

``k1 * b + k2`` is the batch law with the whole device (``cluster.workload.BatchLaw``: ``k1`` per item,
``k2`` per batch) and ``perf.spatial.slowdown`` stretches it to a share (without a curve, as ``1 / s``).
The stretch is assumed not to depend on the batch (Dhakal Fig. 2a profiles one batch size, 8; Fig. 9 says
larger batches feel a small share more, which this law ignores).

**Batch-Latency** (:func:`batch_latency`): given the models, the share available now and the interval until
an a-priori scheduled model needs the device, the largest batch of each model that finishes within the
interval at that share (0 when not even one request does).

**Rounds.** Apps come in rounds of ``round_ms``; every batch must finish by ``deadline_ms`` after the round
starts (Dhakal: 30 ms and 30 ms, object detection at 30 frames/s). An app is a pipeline of stages, each a set
of models that may run concurrently (DNN-Recog: MobileNet, then VGG-Face and ResNet-Car together); a request
of the app passes every stage, so one batch size holds for all its models in a round.

* :func:`temporal_rounds`: one model at a time with the whole device, each app at its fixed batch. Each round
  the apps are offered a turn least recently served first (ties in list order); an app is served only when
  the round has time left for its whole turn, else it waits for a later round. Its stages run one model
  after another.
* :func:`spatiotemporal_round`: models run concurrently at their shares (the shares running at any instant
  sum to at most 1). Apps are placed in list order; each takes the largest batch that finishes by the
  deadline at the earliest start where its shares are free for long enough (a single-model app through
  :func:`batch_latency` with the free window as the interval). The round is the same every round.

Units: ms, req/s; shares are fractions of one device in (0, 1]. Pure functions: no clocks, I/O or randomness.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from edgemux.cluster.workload import BatchLaw
from edgemux.perf.spatial import ShareCurve, check_curve, slowdown

__all__ = ["ModelLaw", "PipelineApp", "Slot", "AppRate", "Schedule", "batch_ms", "largest_batch",
           "batch_latency", "check_concurrent", "temporal_ms", "temporal_rounds", "spatiotemporal_round",
           "saturating_curve"]

_EPS = 1e-9  # a batch that ends within this (ms) of its limit still fits: float sums of the law


def _check_share(share: float, where: str = "share") -> float:
    if not (isinstance(share, (int, float)) and math.isfinite(share) and 0.0 < share <= 1.0):
        raise ValueError(f"{where} must be in (0, 1] of the device, got {share!r}")
    return float(share)


def _check_ms(x: float, what: str) -> float:
    if not (isinstance(x, (int, float)) and math.isfinite(x) and x > 0.0):
        raise ValueError(f"{what} must be a finite number > 0 ms, got {x!r}")
    return float(x)


def saturating_curve(knee: float, full_ms: float = 1.0) -> ShareCurve:
    """A share curve for a model that can use at most ``knee`` of the device: latency ``full_ms * knee / s``
    below the knee (the work stretches as 1 / share) and ``full_ms`` at and above it. Points every 0.01 of
    share and at the knee, so :func:`perf.spatial.latency_at` is exact at any share of two decimals."""
    k = _check_share(knee, "knee")
    shares = sorted({round(i / 100, 2) for i in range(1, 101)} | {k})
    return check_curve([(s, full_ms * max(1.0, k / s)) for s in shares], where=f"saturating curve (knee {k:g})")


@dataclass(frozen=True)
class ModelLaw:
    """One model's latency law: ``law`` with the whole device (``BatchLaw``: a batch of b takes
    ``k1 * b + k2`` ms), ``curve`` its share curve (empty: work stretches as 1 / share), ``share`` the share
    it holds when it runs concurrently with others, ``max_batch`` the largest batch it may take."""

    name: str
    law: BatchLaw
    curve: ShareCurve = ()
    share: float = 1.0
    max_batch: int = 64

    def __post_init__(self) -> None:
        k1, k2 = self.law.k1_ms, self.law.k2_ms
        if not (math.isfinite(k1) and math.isfinite(k2) and k1 >= 0 and k2 >= 0 and k1 + k2 > 0):
            raise ValueError(f"model {self.name!r}: batch law needs finite k1, k2 >= 0 ms, not both 0; "
                             f"got k1={k1!r}, k2={k2!r}")
        _check_share(self.share, f"model {self.name!r}: share")
        if isinstance(self.max_batch, bool) or not isinstance(self.max_batch, int) or self.max_batch < 1:
            raise ValueError(f"model {self.name!r}: max_batch must be an integer >= 1, got {self.max_batch!r}")
        if self.curve:
            object.__setattr__(self, "curve", check_curve(self.curve, where=f"model {self.name!r}: share curve"))


def batch_ms(model: ModelLaw, batch: int, share: float) -> float:
    """L(b, s): how long (ms) a batch of ``batch`` requests of ``model`` takes at ``share`` of the device."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an integer >= 1, got {batch!r}")
    s = _check_share(share)
    return model.law.batch_ms(batch) * slowdown(model.curve, s)


def largest_batch(model: ModelLaw, share: float, interval_ms: float) -> int:
    """The largest batch (<= ``model.max_batch``) of ``model`` that finishes within ``interval_ms`` at
    ``share``; 0 when even one request does not. ``ValueError`` for a share outside (0, 1] or an interval
    that is not a finite number > 0 ms."""
    s = _check_share(share, "available share")
    limit = _check_ms(interval_ms, "interval")
    f = slowdown(model.curve, s)
    k1, k2 = model.law.k1_ms * f, model.law.k2_ms * f
    if k1 == 0.0:
        return model.max_batch if k2 <= limit + _EPS else 0
    # closed form, then a step either way for the float rounding of the law
    b = int(max(0.0, min(float(model.max_batch), math.floor((limit - k2) / k1))))
    while b > 0 and batch_ms(model, b, s) > limit + _EPS:
        b -= 1
    while b < model.max_batch and batch_ms(model, b + 1, s) <= limit + _EPS:
        b += 1
    return b


def batch_latency(models: Sequence[ModelLaw], available_share: float, interval_ms: float) -> list[int]:
    """Dhakal's ``Batch-Latency(DNN-Models[], GPU%, interval)``: for each model, the largest batch that
    finishes within ``interval_ms`` (ms) when it runs at ``available_share`` of the device (0: none fits).
    ``ValueError`` naming the problem for a share outside (0, 1] or an interval <= 0 ms."""
    _check_share(available_share, "available share")
    _check_ms(interval_ms, "interval")
    return [largest_batch(m, available_share, interval_ms) for m in models]


def check_concurrent(models: Sequence[ModelLaw], *, where: str = "stage") -> None:
    """``ValueError`` when models meant to run at the same time hold more than the whole device."""
    used = math.fsum(m.share for m in models)
    if used > 1.0 + 1e-6:
        parts = ", ".join(f"{m.name} {m.share:g}" for m in models)
        raise ValueError(f"{where}: concurrent shares sum to {used:.3g}, above 1 (the whole device): {parts}")


@dataclass(frozen=True)
class PipelineApp:
    """An app as the round scheduler sees it: ``stages`` run one after another, the models of a stage
    concurrently (each at its share); ``temporal_batch`` its fixed batch under temporal round robin."""

    name: str
    stages: tuple[tuple[ModelLaw, ...], ...]
    temporal_batch: int = 1

    def __post_init__(self) -> None:
        if not self.stages or any(not st for st in self.stages):
            raise ValueError(f"app {self.name!r}: needs at least one stage, each with at least one model")
        for i, st in enumerate(self.stages):
            check_concurrent(st, where=f"app {self.name!r} stage {i}")
        tb = self.temporal_batch
        if isinstance(tb, bool) or not isinstance(tb, int) or tb < 1:
            raise ValueError(f"app {self.name!r}: temporal_batch must be an integer >= 1, got {tb!r}")

    @property
    def models(self) -> tuple[ModelLaw, ...]:
        return tuple(m for st in self.stages for m in st)

    @property
    def max_batch(self) -> int:
        return min(m.max_batch for m in self.models)

    @staticmethod
    def single(model: ModelLaw, temporal_batch: int = 1) -> "PipelineApp":
        """An app of one model."""
        return PipelineApp(model.name, ((model,),), temporal_batch)


@dataclass(frozen=True)
class Slot:
    """One model's batch in a round: ``start_ms``/``end_ms`` from the round's start, at ``share``."""

    app: str
    model: str
    batch: int
    share: float
    start_ms: float
    end_ms: float


@dataclass(frozen=True)
class AppRate:
    """An app over a schedule: mean batch per round (rounds it was not served count as 0), throughput
    (req/s), mean latency of its batch when served (ms, first model's start to last model's end: Dhakal
    Table III's latency), mean finish from the round's start (ms) and the rounds it was served in."""

    app: str
    batch_per_round: float
    throughput_rps: float
    latency_ms: float
    finish_ms: float
    rounds_served: int


@dataclass(frozen=True)
class Schedule:
    """What a scheduler decided: the slots of each round and per-app figures (``apps``, in input order)."""

    kind: str
    round_ms: float
    deadline_ms: float
    rounds: tuple[tuple[Slot, ...], ...]
    apps: tuple[AppRate, ...]

    @property
    def total_rps(self) -> float:
        """All apps' throughput together (req/s)."""
        return math.fsum(a.throughput_rps for a in self.apps)

    def app(self, name: str) -> AppRate:
        return next(a for a in self.apps if a.app == name)


def _check_round(apps: Sequence[PipelineApp], round_ms: float, deadline_ms: float) -> None:
    if not apps:
        raise ValueError("a round needs at least one app")
    names = [a.name for a in apps]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"app names must be unique, repeated: {', '.join(dup)}")
    _check_ms(round_ms, "round")
    _check_ms(deadline_ms, "deadline")


def _rates(kind: str, apps: Sequence[PipelineApp], rounds: list[tuple[Slot, ...]], round_ms: float,
           deadline_ms: float) -> Schedule:
    out = []
    n = len(rounds)
    for a in apps:
        batches, lat, fin = 0, [], []
        for slots in rounds:
            mine = [s for s in slots if s.app == a.name]
            if mine:
                batches += mine[0].batch
                lat.append(max(s.end_ms for s in mine) - min(s.start_ms for s in mine))
                fin.append(max(s.end_ms for s in mine))
        out.append(AppRate(a.name, batches / n, batches / (n * round_ms) * 1000.0,
                           math.fsum(lat) / len(lat) if lat else math.nan,
                           math.fsum(fin) / len(fin) if fin else math.nan, len(lat)))
    return Schedule(kind, round_ms, deadline_ms, tuple(rounds), tuple(out))


def temporal_ms(app: PipelineApp, batch: int) -> float:
    """How long (ms) ``app``'s turn takes with the whole device: its models one after another at ``batch``."""
    return math.fsum(batch_ms(m, batch, 1.0) for m in app.models)


def temporal_rounds(apps: Sequence[PipelineApp], *, rounds: int = 60, round_ms: float = 30.0,
                    deadline_ms: float = 30.0) -> Schedule:
    """Pure temporal round robin over ``rounds`` rounds: each app's turn uses the whole device for
    :func:`temporal_ms` at its ``temporal_batch``; apps are offered turns least recently served first
    (ties in list order) and served when the turn ends by ``min(round_ms, deadline_ms)``."""
    _check_round(apps, round_ms, deadline_ms)
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
    limit = min(round_ms, deadline_ms)
    last = {a.name: -1 for a in apps}
    order = {a.name: i for i, a in enumerate(apps)}
    out: list[tuple[Slot, ...]] = []
    for r in range(rounds):
        t, slots = 0.0, []
        for a in sorted(apps, key=lambda a: (last[a.name], order[a.name])):
            if t + temporal_ms(a, a.temporal_batch) > limit + _EPS:
                continue  # no time left in this round for its whole turn: a later round
            for m in a.models:
                d = batch_ms(m, a.temporal_batch, 1.0)
                slots.append(Slot(a.name, m.name, a.temporal_batch, 1.0, t, t + d))
                t += d
            last[a.name] = r
        out.append(tuple(slots))
    return _rates("temporal", apps, out, round_ms, deadline_ms)


def _used(slots: Sequence[Slot], t: float) -> float:
    return math.fsum(s.share for s in slots if s.start_ms <= t + _EPS and t < s.end_ms - _EPS)


def _fits(slots: Sequence[Slot], start: float, end: float, share: float) -> bool:
    """Whether ``share`` is free throughout [start, end): the shares in use only rise where a slot starts."""
    points = [start] + [s.start_ms for s in slots if start < s.start_ms < end - _EPS]
    return all(_used(slots, p) + share <= 1.0 + 1e-6 for p in points)


def _free_window(slots: Sequence[Slot], start: float, share: float, limit: float) -> float:
    """How long (ms) from ``start`` ``share`` stays free, at most until ``limit``."""
    if _used(slots, start) + share > 1.0 + 1e-6:
        return 0.0
    for p in sorted(s.start_ms for s in slots if start < s.start_ms < limit):
        if _used(slots, p) + share > 1.0 + 1e-6:
            return p - start
    return limit - start


def _place_pipeline(app: PipelineApp, batch: int, start: float, slots: list[Slot],
                    limit: float) -> list[Slot] | None:
    """The app's slots for ``batch`` from ``start``, or None when a stage's shares are not free or it ends
    after ``limit``."""
    placed: list[Slot] = []
    t = start
    for st in app.stages:
        end = t
        for m in st:
            d = batch_ms(m, batch, m.share)
            if t + d > limit + _EPS or not _fits(slots + placed, t, t + d, m.share):
                return None
            placed.append(Slot(app.name, m.name, batch, m.share, t, t + d))
            end = max(end, t + d)
        t = end
    return placed


def spatiotemporal_round(apps: Sequence[PipelineApp], *, round_ms: float = 30.0,
                         deadline_ms: float = 30.0) -> Schedule:
    """One spatio-temporal round (the same every round): apps placed in list order, each at the largest
    batch that ends by ``min(round_ms, deadline_ms)``, at the earliest start (0 or when a placed slot ends)
    where its models' shares are free. An app with no batch that fits is not served."""
    _check_round(apps, round_ms, deadline_ms)
    limit = min(round_ms, deadline_ms)
    slots: list[Slot] = []
    for a in apps:
        starts = sorted({0.0} | {s.end_ms for s in slots if s.end_ms < limit})
        if len(a.models) == 1:
            m = a.models[0]
            best: tuple[int, float] = (0, 0.0)
            for t in starts:
                window = _free_window(slots, t, m.share, limit)
                if window > 0:
                    (b,) = batch_latency([m], m.share, window)
                    if b > best[0]:
                        best = (b, t)
            if best[0] > 0:
                slots.append(Slot(a.name, m.name, best[0], m.share, best[1],
                                  best[1] + batch_ms(m, best[0], m.share)))
            continue
        for b in range(a.max_batch, 0, -1):
            placed = next((p for t in starts if (p := _place_pipeline(a, b, t, slots, limit)) is not None), None)
            if placed is not None:
                slots += placed
                break
    return _rates("spatio-temporal", apps, [tuple(slots)], round_ms, deadline_ms)
