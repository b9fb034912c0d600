"""SLO-aware time-slot scheduling of FPGA-GPU accelerators (Kim et al., papers/004, §3, Eq. 1-7, Alg. 1).

A *slot* k brings a request set of ``requests`` = |D_k| inputs that must all be processed within the latency SLO
``slo_s`` = L_k (the paper's SLO is on the whole set, §3: "the required time for processing a given request
set"). Each :class:`Accelerator` runs C concurrent workers, each on batches of ``bs`` requests; Eq. 1 gives one
batch's time ``T = (alpha*bs + beta) * Q(C)``, Eq. 2 the accelerator's throughput ``H = C*bs/T``, Eq. 3 its
energy per request ``E = P(C)/H``.

Two schedulers, each a pure object whose :meth:`step` takes one slot and returns its :class:`SlotPlan`:

* :class:`KimScheduler` (Alg. 1). At the first slot every accelerator is active, each at the configuration
  (C*, bs*) that maximizes its throughput (Eq. 2; the batch's time within the SLO, the batch within memory).
  At each later slot it computes T_avg = |D_k| / sum of the active accelerators' H (Eq. 7) and, when the set is
  too slow (T_avg > L_k, "tight"), activates the inactive accelerator with the highest H/E (Eq. 4's term) until
  it is fast enough; otherwise ("loose") it deactivates the active one with the lowest H/E while the rest still
  meet L_k. It then splits the requests in proportion to throughput (line 24).
  **Readings of Alg. 1**: its loop conditions are printed as ``while |D_k| / sum H <= L_k`` in both branches,
  which would add accelerators while the SLO already holds and never stop removing them; the text says the
  opposite ("increases the allocated accelerators ... until the latency SLO is met"; "reduces ... one by one"
  while "the task can be completed within the SLO"), and that is what is implemented: add while
  ``|D|/sum H > L``; remove the least efficient while ``|D|/(sum H - H_z) <= L``. Eq. 5's
  ``T * D <= L`` (a batch time times a request count) is read as the time a worker takes for its requests,
  ``ceil(D_j / bs_j) * T_j <= L``.
* :class:`NexusScheduler`, the baseline of §4: every accelerator active, one worker each, the largest batch that
  memory takes and whose time meets the SLO, requests split in proportion to throughput.

``activation="exact"`` in :class:`KimScheduler` replaces Alg. 1's greedy add/remove by the activation set with the
least energy among those that meet the SLO (enumerated; 2**N sets, meant for the paper's 8 accelerators).

**Accounting** (:func:`plan_slot`): requests are split in proportion to throughput (largest remainders), each
accelerator's workers share its requests evenly, and a worker runs ``ceil(requests / bs)`` batches of time T.
An accelerator is busy until its slowest worker ends; the slot's *processing time* is the largest busy time, and
its *energy* is each active accelerator's active power P(C) over its busy time plus its idle power until the slot
ends (the processing time). A deactivated accelerator ("no DL jobs allocated", §3.2) draws its idle power for the
whole processing time with ``deactivated="idle"`` (the default: the paper's testbed keeps every card powered) and
nothing with ``deactivated="off"`` (switched off). T_avg (Eq. 7) is reported beside the processing time: the
processing time with fluid batches.

Units: ms for batch times, s for slots and SLOs, req/s, W, J. Pure: no I/O, no clocks.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from edgemux.perf.energy import computation_time_ms, efficiency, energy_per_request_j, expected_computing_time_s

KINDS = ("gpu", "fpga", "cpu")
ACTIVATIONS = ("alg1", "exact")
DEACTIVATED = ("idle", "off")


class ScheduleError(ValueError):
    """A bad accelerator, slot or SLO (``field`` names it): a ``ValueError`` with a message that says what was
    expected and what came."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


@dataclass(frozen=True)
class Accelerator:
    """One accelerator of the paper's model.

    ``alpha_ms`` per request and ``beta_ms`` per batch (Eq. 1); ``max_batch`` the most requests one worker's batch
    may hold with one worker (memory); with C workers each holds at most ``max_batch // C``; ``slowdown`` Q(C)
    for each allowed worker count (Q(1) = 1; an FPGA allows C = 1 only, §3.1); ``power_w`` the active power P(C)
    (W) for each of them; ``idle_w`` the power (W) of an active accelerator that has finished its work."""

    name: str
    kind: str
    alpha_ms: float
    beta_ms: float
    max_batch: int
    slowdown: Mapping[int, float]
    power_w: Mapping[int, float]
    idle_w: float

    def __post_init__(self) -> None:
        n = f"accelerator {self.name!r}"
        if not self.name:
            raise ScheduleError("name", "an accelerator needs a name")
        if self.kind not in KINDS:
            raise ScheduleError(f"{n}.kind", f"expected one of {', '.join(KINDS)}, got {self.kind!r}")
        for attr in ("alpha_ms", "beta_ms", "idle_w"):
            v = getattr(self, attr)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ScheduleError(f"{n}.{attr}", f"expected a finite number >= 0, got {v!r}")
        if self.alpha_ms + self.beta_ms <= 0:
            raise ScheduleError(f"{n}.alpha_ms", "alpha_ms + beta_ms must be > 0 (a batch takes time)")
        if isinstance(self.max_batch, bool) or not isinstance(self.max_batch, int) or self.max_batch < 1:
            raise ScheduleError(f"{n}.max_batch", f"expected an integer >= 1, got {self.max_batch!r}")
        if not self.slowdown or 1 not in self.slowdown or self.slowdown[1] != 1.0:
            raise ScheduleError(f"{n}.slowdown",
                                f"needs Q(1) = 1 (a lone worker is not slowed), got {dict(self.slowdown)}")
        if self.kind == "fpga" and set(self.slowdown) != {1}:
            raise ScheduleError(f"{n}.slowdown", "an FPGA runs one worker (C = 1, Kim §3.1)")
        for c, q in self.slowdown.items():
            if isinstance(c, bool) or not isinstance(c, int) or c < 1:
                raise ScheduleError(f"{n}.slowdown", f"worker counts must be integers >= 1, got {c!r}")
            if not (isinstance(q, (int, float)) and math.isfinite(q) and q > 0):
                raise ScheduleError(f"{n}.slowdown", f"Q({c}) must be a finite number > 0, got {q!r}")
            if c > self.max_batch:
                raise ScheduleError(f"{n}.slowdown", f"{c} workers need a batch of at least 1 each, but max_batch "
                                                     f"is {self.max_batch}")
        missing = sorted(set(self.slowdown) - set(self.power_w))
        if missing:
            raise ScheduleError(f"{n}.power_w", f"no active power for {missing} worker(s); every worker count "
                                                f"with a slowdown needs one")
        for c, p in self.power_w.items():
            if not (isinstance(p, (int, float)) and not isinstance(p, bool) and math.isfinite(p) and p > 0):
                raise ScheduleError(f"{n}.power_w", f"P({c}) must be a finite number > 0 W, got {p!r}")
            if p < self.idle_w:
                raise ScheduleError(f"{n}.power_w", f"P({c}) = {p} W is below the idle power {self.idle_w} W")
        object.__setattr__(self, "slowdown", MappingProxyType(dict(self.slowdown)))
        object.__setattr__(self, "power_w", MappingProxyType(dict(self.power_w)))

    @property
    def workers(self) -> tuple[int, ...]:
        """The allowed worker counts C, ascending."""
        return tuple(sorted(self.slowdown))

    def batch_ms(self, workers: int, batch: int) -> float:
        """Eq. 1: one worker's time (ms) for a batch of ``batch`` requests with ``workers`` concurrent workers."""
        return computation_time_ms(self.alpha_ms, self.beta_ms, batch, self.slowdown[workers])

    def throughput_rps(self, workers: int, batch: int) -> float:
        """Eq. 2 with every worker at ``batch``: ``workers * batch / T`` (req/s)."""
        return workers * batch * 1000.0 / self.batch_ms(workers, batch)

    def energy_j(self, workers: int, batch: int) -> float:
        """Eq. 3: ``P(C) / H`` (J per request)."""
        return energy_per_request_j(self.power_w[workers], self.throughput_rps(workers, batch))


@dataclass(frozen=True)
class Config:
    """An accelerator's scheduling configuration: ``workers`` (C) each running batches of ``batch`` requests."""

    workers: int
    batch: int


def _configs(acc: Accelerator, slo_s: float) -> list[Config]:
    """Every (C, bs) of ``acc`` whose batch fits memory and whose one batch ends within the SLO."""
    out = []
    for c in acc.workers:
        for bs in range(1, acc.max_batch // c + 1):
            if acc.batch_ms(c, bs) <= slo_s * 1000.0:
                out.append(Config(c, bs))
    return out


def best_config(acc: Accelerator, slo_s: float) -> Config:
    """Alg. 1 line 4: the (C, bs) maximizing Eq. 2 within memory and the SLO (ties: fewer workers, then the
    smaller batch). ``ScheduleError`` (field ``slo_s``) when not even one request meets the SLO."""
    configs = _configs(acc, slo_s)
    if not configs:
        raise ScheduleError("slo_s", f"accelerator {acc.name!r} cannot finish even one request within "
                                     f"{slo_s:g} s (one takes {acc.batch_ms(1, 1):.3f} ms)")
    return max(configs, key=lambda k: (acc.throughput_rps(k.workers, k.batch), -k.workers, -k.batch))


def nexus_config(acc: Accelerator, slo_s: float) -> Config:
    """The baseline's configuration: one worker at the largest batch within memory and the SLO."""
    ones = [k for k in _configs(acc, slo_s) if k.workers == 1]
    if not ones:
        raise ScheduleError("slo_s", f"accelerator {acc.name!r} cannot finish even one request within "
                                     f"{slo_s:g} s (one takes {acc.batch_ms(1, 1):.3f} ms)")
    return max(ones, key=lambda k: k.batch)


def usable_configs(accelerators: Sequence[Accelerator], slo_s: float, choose: Callable[[Accelerator, float], Config],
                   notes: list[str]) -> dict[str, Config]:
    """``choose(acc, slo_s)`` for every accelerator that can meet the SLO at all; one note per one that cannot.
    ``ScheduleError`` (field ``slo_s``) when none can: an SLO no accelerator meets."""
    out: dict[str, Config] = {}
    for a in accelerators:
        try:
            out[a.name] = choose(a, slo_s)
        except ScheduleError as e:
            notes.append(str(e).removeprefix("slo_s: "))
    if not out:
        fastest = min(a.batch_ms(1, 1) for a in accelerators)
        raise ScheduleError("slo_s", f"no accelerator can finish even one request within {slo_s:g} s (the fastest "
                                     f"takes {fastest:.3f} ms)")
    return out


# ----------------------------------------------------------------------------------------------- a slot


@dataclass(frozen=True)
class AcceleratorPlan:
    """One active accelerator in a slot: its configuration, its requests, when it is done (s) and the energy
    (J) it used (active power while busy, idle power after, until the slot's processing time)."""

    name: str
    config: Config
    requests: int
    throughput_rps: float
    busy_s: float
    energy_j: float


@dataclass(frozen=True)
class SlotPlan:
    """What a scheduler decided for one slot and what it costs: ``active`` accelerators (in the order given),
    ``processing_s`` (the slowest accelerator's busy time), ``t_avg_s`` (Eq. 7: requests / total throughput),
    ``energy_j`` (all of it, ``deactivated_j`` of it drawn by the deactivated accelerators), total
    ``throughput_rps`` of the active set, and ``meets_slo`` (processing within the SLO)."""

    slot: int
    requests: int
    slo_s: float
    plans: tuple[AcceleratorPlan, ...]
    processing_s: float
    t_avg_s: float
    energy_j: float
    throughput_rps: float
    meets_slo: bool
    notes: tuple[str, ...] = field(default=())
    deactivated_j: float = 0.0

    @property
    def active(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.plans)


def check_slot(requests: int, slo_s: float) -> None:
    """``ScheduleError`` unless ``requests`` is an integer >= 0 and ``slo_s`` a finite number > 0 (s)."""
    if isinstance(requests, bool) or not isinstance(requests, int) or requests < 0:
        raise ScheduleError("requests", f"expected an integer >= 0, got {requests!r}")
    if isinstance(slo_s, bool) or not isinstance(slo_s, (int, float)) or not math.isfinite(slo_s) or slo_s <= 0:
        raise ScheduleError("slo_s", f"expected a latency SLO > 0 s, got {slo_s!r}")


def check_deactivated(deactivated: str) -> str:
    """``deactivated`` if it is ``idle`` or ``off``; ``ScheduleError`` otherwise."""
    if deactivated not in DEACTIVATED:
        raise ScheduleError("deactivated", f"expected one of {', '.join(DEACTIVATED)}, got {deactivated!r}")
    return deactivated


def _split(requests: int, weights: Sequence[float]) -> list[int]:
    """``requests`` split in proportion to ``weights`` (largest remainders; ties to the earlier one)."""
    total = math.fsum(weights)
    raw = [requests * w / total for w in weights]
    out = [math.floor(r) for r in raw]
    order = sorted(range(len(raw)), key=lambda i: (-(raw[i] - out[i]), i))
    for i in order[: requests - sum(out)]:
        out[i] += 1
    return out


def plan_slot(accelerators: Sequence[Accelerator], configs: Mapping[str, Config], active: Sequence[str],
              requests: int, slo_s: float, slot: int = 1, notes: Sequence[str] = (),
              deactivated: str = "idle") -> SlotPlan:
    """Cost of running ``requests`` on the ``active`` accelerators at ``configs`` (see the module docstring):
    requests split in proportion to throughput, each accelerator's workers sharing its part evenly; the others
    draw their idle power meanwhile (``deactivated="idle"``) or nothing (``"off"``)."""
    check_slot(requests, slo_s)
    check_deactivated(deactivated)
    by_name = {a.name: a for a in accelerators}
    names = [a.name for a in accelerators if a.name in set(active)]
    if not names:
        return SlotPlan(slot, requests, slo_s, (), math.inf if requests else 0.0, math.inf if requests else 0.0,
                        0.0, 0.0, requests == 0, tuple(notes))
    h = [by_name[n].throughput_rps(configs[n].workers, configs[n].batch) for n in names]
    parts = _split(requests, h)
    busy: list[float] = []
    for n, d in zip(names, parts):
        a, k = by_name[n], configs[n]
        per_worker = _split(d, [1.0] * k.workers)
        busy.append(max(math.ceil(x / k.batch) for x in per_worker) * a.batch_ms(k.workers, k.batch) / 1000.0)
    processing = max(busy)
    plans = []
    for n, d, hi, b in zip(names, parts, h, busy):
        a, k = by_name[n], configs[n]
        e = a.power_w[k.workers] * b + a.idle_w * (processing - b)
        plans.append(AcceleratorPlan(n, k, d, hi, b, e))
    total_h = math.fsum(h)
    idle = 0.0
    if deactivated == "idle":
        idle = math.fsum(a.idle_w * processing for a in accelerators if a.name not in set(names))
    return SlotPlan(slot, requests, slo_s, tuple(plans), processing, expected_computing_time_s(requests, h),
                    math.fsum(p.energy_j for p in plans) + idle, total_h, processing <= slo_s + 1e-12, tuple(notes),
                    idle)


# ------------------------------------------------------------------------------------------- schedulers


def _check_accelerators(accelerators: Sequence[Accelerator]) -> tuple[Accelerator, ...]:
    accs = tuple(accelerators)
    if not accs:
        raise ScheduleError("accelerators", "a scheduler needs at least one accelerator")
    names = [a.name for a in accs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ScheduleError("accelerators", f"names must be unique, repeated: {', '.join(dup)}")
    return accs


class NexusScheduler:
    """The baseline (Kim §4, after Nexus): every accelerator, one worker, the largest batch within memory and the
    SLO, requests in proportion to throughput. ``step`` is pure given the slot."""

    name = "nexus"

    def __init__(self, accelerators: Sequence[Accelerator], *, deactivated: str = "idle") -> None:
        self.accelerators = _check_accelerators(accelerators)
        self.deactivated = check_deactivated(deactivated)
        self.slot = 0

    def step(self, requests: int, slo_s: float) -> SlotPlan:
        """Plan the next slot: ``requests`` inputs within ``slo_s`` (s)."""
        check_slot(requests, slo_s)
        self.slot += 1
        notes: list[str] = []
        configs = usable_configs(self.accelerators, slo_s, nexus_config, notes)
        return plan_slot(self.accelerators, configs, list(configs), requests, slo_s, self.slot, notes,
                         self.deactivated)


class KimScheduler:
    """Alg. 1 (see the module docstring). State between slots: the active set and the configurations chosen
    at the first slot (Alg. 1 keeps them: lines 12 and 19 rank by the slot-1 H/E). ``activation``: ``alg1``
    (the paper's greedy add/remove) or ``exact`` (the least-energy activation set that meets the SLO);
    ``deactivated``: what a deactivated accelerator draws (``idle`` or ``off``, see the accounting)."""

    name = "kim"

    def __init__(self, accelerators: Sequence[Accelerator], *, activation: str = "alg1",
                 deactivated: str = "idle") -> None:
        if activation not in ACTIVATIONS:
            raise ScheduleError("activation", f"expected one of {', '.join(ACTIVATIONS)}, got {activation!r}")
        self.accelerators = _check_accelerators(accelerators)
        self.deactivated = check_deactivated(deactivated)
        self.activation = activation
        self.slot = 0
        self.configs: dict[str, Config] = {}
        self.active: list[str] = []
        self._rank: dict[str, float] = {}
        self._slo_s: float | None = None

    def _h(self, name: str) -> float:  # throughput (req/s) of an accelerator at its configuration
        a = next(x for x in self.accelerators if x.name == name)
        k = self.configs[name]
        return a.throughput_rps(k.workers, k.batch)

    def _init(self, slo_s: float, notes: list[str]) -> None:
        # lines 3-6: every accelerator at its throughput-maximizing configuration, all active
        self.configs = usable_configs(self.accelerators, slo_s, best_config, notes)
        by_name = {a.name: a for a in self.accelerators}
        self._rank = {n: efficiency(by_name[n].throughput_rps(k.workers, k.batch),
                                    by_name[n].energy_j(k.workers, k.batch)) for n, k in self.configs.items()}
        self.active = list(self.configs)
        self._slo_s = slo_s

    def step(self, requests: int, slo_s: float) -> SlotPlan:
        """Plan the next slot: ``requests`` inputs within ``slo_s`` (s)."""
        check_slot(requests, slo_s)
        self.slot += 1
        notes: list[str] = []
        if self.slot == 1 or self._slo_s != slo_s:
            # a new SLO can change which batches fit: the configurations are chosen again (Alg. 1 assumes one L)
            if self.slot > 1:
                notes.append(f"SLO changed to {slo_s:g} s: configurations chosen again")
            kept = list(self.active) if self.slot > 1 else None
            self._init(slo_s, notes)
            if kept is not None:
                self.active = [n for n in kept if n in self.configs] or list(self.configs)
            if self.slot == 1:
                return plan_slot(self.accelerators, self.configs, self.active, requests, slo_s, self.slot,
                                 notes + ["slot 1: every accelerator active (Alg. 1 initialisation)"],
                                 self.deactivated)
        if self.activation == "exact":
            self.active = self._exact(requests, slo_s)
        else:
            self._greedy(requests, slo_s, notes)
        return plan_slot(self.accelerators, self.configs, self.active, requests, slo_s, self.slot, notes,
                         self.deactivated)

    def _fits(self, names: Sequence[str], requests: int, slo_s: float) -> bool:
        return plan_slot(self.accelerators, self.configs, names, requests, slo_s, self.slot).meets_slo

    def _greedy(self, requests: int, slo_s: float, notes: list[str]) -> None:
        total = math.fsum(self._h(n) for n in self.active)
        t_avg = expected_computing_time_s(requests, [total])  # Eq. 7 with the previous slot's set
        order = list(self.configs)  # the accelerators' order, those that can meet the SLO
        if t_avg >= slo_s or not self._fits(self.active, requests, slo_s):
            # tight (line 9): add the most efficient inactive accelerators until the SLO holds
            while not self._fits(self.active, requests, slo_s):
                off = [n for n in order if n not in self.active]
                if not off:
                    notes.append("every accelerator is active and the SLO still does not hold")
                    break
                z = max(off, key=lambda n: (self._rank[n], -order.index(n)))
                self.active.append(z)
                notes.append(f"activated {z}")
        else:  # loose (line 16): remove the least efficient while the rest still meet the SLO
            while len(self.active) > 1:
                z = min(self.active, key=lambda n: (self._rank[n], -order.index(n)))
                rest = [n for n in self.active if n != z]
                if not self._fits(rest, requests, slo_s):
                    break
                self.active = rest
                notes.append(f"deactivated {z}")
        self.active.sort(key=order.index)

    def _exact(self, requests: int, slo_s: float) -> list[str]:
        names = [a.name for a in self.accelerators if a.name in self.configs]
        best: tuple[float, int, list[str]] | None = None
        for r in range(1, len(names) + 1):
            for subset in itertools.combinations(names, r):
                p = plan_slot(self.accelerators, self.configs, subset, requests, slo_s, self.slot,
                              deactivated=self.deactivated)
                if p.meets_slo and (best is None or (p.energy_j, r) < best[:2]):
                    best = (p.energy_j, r, list(subset))
        if best is None:  # nothing meets the SLO: everything on is the fastest there is
            return names
        return best[2]
