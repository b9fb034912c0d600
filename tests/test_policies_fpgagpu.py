"""policies.fpgagpu: Kim et al.'s time-slot scheduler (Alg. 1) and the Nexus-style baseline on the paper's model
(Eq. 1-7): the accounting against hand-computed slots, the activation against a brute force over every
activation set, and bad input."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest

from edgemux.policies.fpgagpu import (
    Accelerator,
    Config,
    KimScheduler,
    NexusScheduler,
    ScheduleError,
    best_config,
    nexus_config,
    plan_slot,
)


def _gpu(name: str = "g", alpha: float = 2.0, beta: float = 10.0, max_batch: int = 64, q2: float = 1.2,
         p1: float = 200.0, p2: float = 240.0, idle: float = 30.0) -> Accelerator:
    return Accelerator(name, "gpu", alpha, beta, max_batch, {1: 1.0, 2: q2}, {1: p1, 2: p2}, idle)


def _fpga(name: str = "f", alpha: float = 3.0, beta: float = 1.0, max_batch: int = 8, p: float = 50.0,
          idle: float = 20.0) -> Accelerator:
    return Accelerator(name, "fpga", alpha, beta, max_batch, {1: 1.0}, {1: p}, idle)


# ------------------------------------------------------------------------------------- the model, by hand


def test_eq1_to_eq3_by_hand() -> None:
    g = _gpu()
    assert g.batch_ms(1, 8) == pytest.approx(2.0 * 8 + 10.0)
    assert g.batch_ms(2, 8) == pytest.approx((2.0 * 8 + 10.0) * 1.2)
    assert g.throughput_rps(2, 8) == pytest.approx(2 * 8 * 1000.0 / 31.2)
    assert g.energy_j(2, 8) == pytest.approx(240.0 / (16000.0 / 31.2))


def test_best_and_nexus_configurations_by_hand() -> None:
    g = _gpu(max_batch=64)
    # Eq. 2 grows with the batch; two workers each take at most 32: H(2, 32) = 64000/(74*1.2) = 720.7 req/s
    # against H(1, 64) = 64000/138 = 463.8 req/s
    assert best_config(g, 5.0) == Config(2, 32)
    assert nexus_config(g, 5.0) == Config(1, 64)
    # an SLO of 50 ms takes batches of at most 20 for one worker (2*20 + 10 = 50 ms) and 15 for two
    # (1.2 * (2*15 + 10) = 48 ms; 16 would take 50.4 ms); H(2, 15) = 30000/48 = 625 > H(1, 20) = 400 req/s
    assert nexus_config(g, 0.05) == Config(1, 20)
    assert best_config(g, 0.05) == Config(2, 15)


def test_a_slot_by_hand() -> None:
    """Two accelerators, 1000 requests: split 2:1 by throughput, whole batches, energy = active + idle tail."""
    a = Accelerator("a", "gpu", 1.0, 0.0, 10, {1: 1.0}, {1: 100.0}, 10.0)  # 10 ms per batch of 10: 1000 req/s
    b = Accelerator("b", "fpga", 2.0, 0.0, 10, {1: 1.0}, {1: 40.0}, 5.0)  # 20 ms per batch of 10: 500 req/s
    p = plan_slot([a, b], {"a": Config(1, 10), "b": Config(1, 10)}, ["a", "b"], 1000, 1.0)
    assert [x.requests for x in p.plans] == [667, 333]
    # a: ceil(667/10) = 67 batches x 10 ms = 0.67 s; b: ceil(333/10) = 34 x 20 ms = 0.68 s
    assert [x.busy_s for x in p.plans] == pytest.approx([0.67, 0.68])
    assert p.processing_s == pytest.approx(0.68) and p.meets_slo
    assert p.t_avg_s == pytest.approx(1000 / 1500)  # Eq. 7
    assert p.energy_j == pytest.approx(100.0 * 0.67 + 10.0 * 0.01 + 40.0 * 0.68)
    assert p.throughput_rps == pytest.approx(1500.0)
    late = plan_slot([a, b], {"a": Config(1, 10), "b": Config(1, 10)}, ["a", "b"], 1000, 0.6)
    assert not late.meets_slo


def test_a_deactivated_accelerator_draws_its_idle_power_or_nothing() -> None:
    a = Accelerator("a", "gpu", 1.0, 0.0, 10, {1: 1.0}, {1: 100.0}, 10.0)
    b = Accelerator("b", "fpga", 2.0, 0.0, 10, {1: 1.0}, {1: 40.0}, 5.0)
    cfg = {"a": Config(1, 10), "b": Config(1, 10)}
    idle = plan_slot([a, b], cfg, ["a"], 1000, 2.0)  # a alone: 100 batches x 10 ms = 1 s
    assert idle.processing_s == pytest.approx(1.0) and idle.deactivated_j == pytest.approx(5.0)
    assert idle.energy_j == pytest.approx(100.0 + 5.0)
    off = plan_slot([a, b], cfg, ["a"], 1000, 2.0, deactivated="off")
    assert off.deactivated_j == 0.0 and off.energy_j == pytest.approx(100.0)
    with pytest.raises(ScheduleError, match="deactivated: expected one of idle, off, got 'sleep'"):
        plan_slot([a, b], cfg, ["a"], 1000, 2.0, deactivated="sleep")
    with pytest.raises(ScheduleError, match="deactivated: expected one of idle, off"):
        KimScheduler([a, b], deactivated="asleep")


def test_two_workers_share_an_accelerators_requests() -> None:
    g = _gpu(alpha=1.0, beta=0.0, q2=1.5)
    p = plan_slot([g], {"g": Config(2, 10)}, ["g"], 101, 10.0)
    # 51 and 50 requests: the slower worker runs ceil(51/10) = 6 batches of 15 ms
    assert p.processing_s == pytest.approx(6 * 0.015)
    assert p.energy_j == pytest.approx(240.0 * 0.09)


def test_nothing_to_do_costs_nothing() -> None:
    g = _gpu()
    p = plan_slot([g], {"g": Config(1, 8)}, ["g"], 0, 1.0)
    assert p.processing_s == 0.0 and p.energy_j == 0.0 and p.meets_slo


# ----------------------------------------------------------------------------------------- Alg. 1


def _cluster() -> list[Accelerator]:
    return [_gpu("g1"), _gpu("g2", alpha=2.5, beta=12.0, p1=220.0, p2=260.0, idle=25.0), _fpga("f1"),
            _fpga("f2", alpha=2.5, p=70.0)]


def test_slot_one_activates_everything_then_a_loose_slot_deactivates_the_least_efficient() -> None:
    s = KimScheduler(_cluster())
    first = s.step(2000, 5.0)
    assert first.active == ("g1", "g2", "f1", "f2")
    second = s.step(2000, 5.0)
    assert second.meets_slo and len(second.active) < 4
    off = [n for n in ("g1", "g2", "f1", "f2") if n not in second.active]
    # what was switched off ranks lowest by Eq. 4's H/E among the four
    rank = {n: s._rank[n] for n in s._rank}
    assert all(rank[o] <= min(rank[a] for a in second.active) for o in off)


def test_a_tight_slot_activates_the_most_efficient_first() -> None:
    s = KimScheduler(_cluster())
    s.step(100, 5.0)
    s.step(100, 5.0)  # loose: down to few accelerators
    few = list(s.active)
    p = s.step(6000, 5.0)  # tight now
    assert len(p.active) > len(few) and p.meets_slo
    added = [n.removeprefix("activated ") for n in p.notes if n.startswith("activated")]
    off = [n for n in ("g1", "g2", "f1", "f2") if n not in few]
    assert added == sorted(off, key=lambda n: -s._rank[n])[: len(added)]  # the highest H/E first


def _brute_force(accs: list[Accelerator], configs: dict[str, Config], requests: int, slo_s: float,
                 deactivated: str = "idle") -> tuple[float, tuple[str, ...]] | None:
    """The least energy over every activation set that meets the SLO, costed by the plan of each set."""
    best = None
    for r in range(1, len(accs) + 1):
        for subset in itertools.combinations([a.name for a in accs], r):
            p = plan_slot(accs, configs, subset, requests, slo_s, deactivated=deactivated)
            if p.meets_slo and (best is None or p.energy_j < best[0] - 1e-9):
                best = (p.energy_j, subset)
    return best


def _random_cluster(rng: np.random.Generator, n: int) -> list[Accelerator]:
    out = []
    for i in range(n):
        if rng.random() < 0.5:
            p1 = float(rng.uniform(80, 300))
            out.append(Accelerator(f"g{i}", "gpu", float(rng.uniform(0.5, 4)), float(rng.uniform(1, 20)),
                                   int(rng.integers(8, 65)), {1: 1.0, 2: float(rng.uniform(1.05, 1.9))},
                                   {1: p1, 2: p1 * float(rng.uniform(1.0, 1.3))}, float(rng.uniform(5, 40))))
        else:
            out.append(Accelerator(f"f{i}", "fpga", float(rng.uniform(0.5, 4)), float(rng.uniform(0.5, 5)),
                                   int(rng.integers(1, 17)), {1: 1.0}, {1: float(rng.uniform(20, 100))},
                                   float(rng.uniform(5, 20))))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_the_activation_against_a_brute_force(seed: int) -> None:
    """On random small clusters: ``exact`` finds the brute force's least energy; Alg. 1 meets the SLO whenever
    some set does and never beats the brute force (which would mean the brute force is wrong). (Alg. 1 can use
    more energy than keeping everything on: it ranks by H/E = H^2/P, not by energy per request, so it may switch
    off a slow but frugal FPGA; seed 35 is such a case.)"""
    rng = np.random.default_rng(seed)
    accs = _random_cluster(rng, int(rng.integers(2, 6)))
    slo = float(rng.choice([0.5, 1.0, 2.0, 5.0]))
    alg1, exact = KimScheduler(accs), KimScheduler(accs, activation="exact")
    d0 = int(rng.integers(100, 5000))
    alg1.step(d0, slo)
    exact.step(d0, slo)
    for _ in range(3):
        d = int(rng.integers(100, 20000))
        pa, pe = alg1.step(d, slo), exact.step(d, slo)
        bf = _brute_force(accs, alg1.configs, d, slo)
        everything = plan_slot(accs, alg1.configs, [a.name for a in accs], d, slo)
        if bf is None:
            assert not pa.meets_slo and not pe.meets_slo
            assert pa.active == pe.active == tuple(a.name for a in accs)
            continue
        assert pe.meets_slo and pe.energy_j == pytest.approx(bf[0])
        assert pa.meets_slo
        assert pa.energy_j >= bf[0] - 1e-6
        assert pe.energy_j <= everything.energy_j + 1e-6


def test_identical_switched_off_accelerators_alg1_is_optimal() -> None:
    """With identical accelerators that are switched off when deactivated, every set of the same size costs the
    same and fewer cost less (no idle tails), and Alg. 1 stops at the fewest that meet the SLO: the brute
    force's answer. (With deactivated ones drawing idle power, more accelerators can cost less: they shorten
    the time the others idle, which is why ``exact`` exists.)"""
    accs = [_gpu(f"g{i}") for i in range(5)]
    s = KimScheduler(accs, deactivated="off")
    s.step(1000, 2.0)
    for d in (500, 3000, 6000, 1000):
        p = s.step(d, 2.0)
        bf = _brute_force(accs, s.configs, d, 2.0, deactivated="off")
        assert bf is not None and p.energy_j == pytest.approx(bf[0]) and len(p.active) == len(bf[1])


def test_the_baseline_keeps_everything_on_with_one_worker_at_the_largest_batch() -> None:
    accs = _cluster()
    p = NexusScheduler(accs).step(5000, 5.0)
    assert p.active == ("g1", "g2", "f1", "f2")
    assert all(x.config.workers == 1 for x in p.plans)
    assert [x.config.batch for x in p.plans] == [64, 64, 8, 8]


def test_an_accelerator_that_cannot_meet_the_slo_sits_out_with_a_note() -> None:
    slow = Accelerator("slow", "fpga", 100.0, 0.0, 4, {1: 1.0}, {1: 10.0}, 1.0)  # 100 ms per request
    p = KimScheduler([_gpu(), slow]).step(10, 0.05)
    assert p.active == ("g",) and any("'slow' cannot finish even one request within 0.05 s" in n for n in p.notes)
    q = NexusScheduler([_gpu(), slow]).step(10, 0.05)
    assert q.active == ("g",)


# --------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(("kw", "message"), [
    ({"power_w": {1: -5.0, 2: 240.0}}, r"P\(1\) must be a finite number > 0 W, got -5.0"),
    ({"power_w": {1: 200.0}}, r"no active power for \[2\] worker\(s\)"),
    ({"idle_w": -1.0}, r"idle_w: expected a finite number >= 0, got -1.0"),
    ({"idle_w": 500.0}, r"P\(1\) = 200.0 W is below the idle power 500.0 W"),
    ({"alpha_ms": float("nan")}, r"alpha_ms: expected a finite number >= 0, got nan"),
    ({"alpha_ms": 0.0, "beta_ms": 0.0}, r"alpha_ms \+ beta_ms must be > 0"),
    ({"max_batch": 0}, r"max_batch: expected an integer >= 1, got 0"),
    ({"slowdown": {1: 1.5, 2: 2.0}}, r"needs Q\(1\) = 1"),
    ({"slowdown": {1: 1.0, 2: 0.0}}, r"Q\(2\) must be a finite number > 0, got 0.0"),
    ({"kind": "tpu"}, r"kind: expected one of gpu, fpga, cpu, got 'tpu'"),
])
def test_bad_accelerators_are_refused(kw: dict[str, Any], message: str) -> None:
    base: dict[str, Any] = {"name": "g", "kind": "gpu", "alpha_ms": 2.0, "beta_ms": 10.0, "max_batch": 64,
                            "slowdown": {1: 1.0, 2: 1.2}, "power_w": {1: 200.0, 2: 240.0}, "idle_w": 30.0}
    base.update(kw)
    with pytest.raises(ScheduleError, match=message):
        Accelerator(**base)


def test_an_fpga_runs_one_worker() -> None:
    with pytest.raises(ScheduleError, match=r"an FPGA runs one worker \(C = 1"):
        Accelerator("f", "fpga", 1.0, 1.0, 8, {1: 1.0, 2: 1.1}, {1: 50.0, 2: 60.0}, 10.0)


def test_an_slo_no_accelerator_can_meet_is_refused() -> None:
    with pytest.raises(ScheduleError, match=r"slo_s: no accelerator can finish even one request within 0.001 s "
                                            r"\(the fastest takes 4.000 ms\)"):
        KimScheduler([_gpu(alpha=1.0, beta=3.0), _fpga(alpha=5.0)]).step(10, 0.001)
    with pytest.raises(ScheduleError, match="slo_s: no accelerator can finish"):
        NexusScheduler([_gpu()]).step(10, 0.001)


@pytest.mark.parametrize(("requests", "slo", "message"), [
    (-1, 1.0, r"requests: expected an integer >= 0, got -1"),
    (1.5, 1.0, r"requests: expected an integer >= 0, got 1.5"),
    (10, 0.0, r"slo_s: expected a latency SLO > 0 s, got 0.0"),
    (10, math.inf, r"slo_s: expected a latency SLO > 0 s, got inf"),
])
def test_bad_slots_are_refused(requests: Any, slo: Any, message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        KimScheduler([_gpu()]).step(requests, slo)


def test_bad_scheduler_arguments_are_refused() -> None:
    with pytest.raises(ScheduleError, match="at least one accelerator"):
        KimScheduler([])
    with pytest.raises(ScheduleError, match="names must be unique, repeated: g"):
        NexusScheduler([_gpu(), _gpu()])
    with pytest.raises(ScheduleError, match="activation: expected one of alg1, exact, got 'best'"):
        KimScheduler([_gpu()], activation="best")
