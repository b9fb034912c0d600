"""``perf.sojourn``: the response-time laws behind the p95/p99 of every discipline without an exact law
(PS, limited PS, the time-sharing bound, batching, a CPU stage in tandem). Their means are exact where the
discipline's mean is; their shapes are checked against the simulator here (small, seeded) and on the whole
grid by ``edgemux validate`` (``approx-tail`` rows)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from edgemux.cluster.workload import Arrival, BatchLaw, CpuStage, DeviceSpec, Discipline, Tenant
from edgemux.experiments.validation import tenants_at
from edgemux.perf.device import predict_device
from edgemux.perf.gpu import batch_estimates, gpu_ps_responses, lowest_priority_bound, mps_responses
from edgemux.perf.queueing import limited_ps_at_most
from edgemux.perf.result import Unstable
from edgemux.perf.sojourn import (
    batch_laws,
    capped,
    cpu_stage_law,
    limited_ps_laws,
    ps_laws,
    tandem,
    timeshare_laws,
)
from edgemux.perf.tails import LatticeDistribution
from edgemux.profiles.distributions import Deterministic, Exponential
from edgemux.profiles.types import DeviceKind
from edgemux.sim.run import simulate_device

LAW = BatchLaw(k1_ms=2.0, k2_ms=8.0)

# one device per discipline: a test fails when a discipline is added without a tail
DEVICES: dict[Discipline, DeviceSpec] = {
    Discipline.FCFS: DeviceSpec("d", DeviceKind.EDGETPU, Discipline.FCFS),
    Discipline.PS: DeviceSpec("d", DeviceKind.GPU_EMBEDDED, Discipline.PS),
    Discipline.GPU_TIMESHARE: DeviceSpec("d", DeviceKind.GPU_EMBEDDED, Discipline.GPU_TIMESHARE),
    Discipline.MPS: DeviceSpec("d", DeviceKind.GPU_EMBEDDED, Discipline.MPS, servers=1.65),
    Discipline.BATCH: DeviceSpec("d", DeviceKind.GPU_EMBEDDED, Discipline.BATCH, max_batch=4, batch_timeout_ms=5.0),
    Discipline.SPATIAL: DeviceSpec("d", DeviceKind.GPU_EMBEDDED, Discipline.SPATIAL),
}


def _tenants(disc: Discipline) -> list[Tenant]:
    ts = tenants_at(0.5, 2, "exp")
    if disc is Discipline.BATCH:
        ts = [replace(t, batch=LAW, service=Deterministic(LAW.per_request_ms(1))) for t in ts]
    if disc is Discipline.SPATIAL:
        ts = [replace(t, share=0.5) for t in ts]
    # the second tenant has a CPU stage: its tail is the two stages convolved
    return [ts[0], replace(ts[1], cpu=CpuStage(1.0, Exponential(2.0)), network_ms=3.0)]


def test_every_discipline_has_a_device_here() -> None:
    assert set(DEVICES) == set(Discipline)


@pytest.mark.parametrize("disc", list(Discipline))
def test_every_discipline_gives_p50_p95_and_p99_end_to_end(disc: Discipline) -> None:
    est = predict_device(DEVICES[disc], _tenants(disc))
    for e in est.values():
        assert all(isinstance(x, float) for x in (e.p50_ms, e.p95_ms, e.p99_ms)), (disc, e)
        assert e.p99_ms > e.p95_ms > e.p50_ms > e.network_ms
        assert "p50" in e.method and "p95/p99" in e.method
    # asked for one tenant only: the others get none (admission asks only for the percentile SLOs)
    some = predict_device(DEVICES[disc], _tenants(disc), tails=["t1"])
    assert some["t1"].p50_ms == est["t1"].p50_ms
    assert all(e.p50_ms is None and e.p99_ms is None for n, e in some.items() if n != "t1")
    # the CPU stage and the network lengthen the tail beside the device's own
    staged = est["t1"]
    assert staged.p95_ms > staged.network_ms + staged.cpu_ms


@pytest.mark.parametrize("dist", ["det", "exp", "bimodal"])
@pytest.mark.parametrize("rho", [0.2, 0.6, 0.9])
def test_law_means_are_the_exact_means(dist: str, rho: float) -> None:
    ts = tenants_at(rho, 3, dist)
    for laws, means in ((ps_laws(ts), gpu_ps_responses(ts)), (limited_ps_laws(ts, 1.65), mps_responses(ts, 1.65)),
                        (timeshare_laws(ts), lowest_priority_bound(ts))):
        assert not isinstance(laws, Unstable)
        for law, m in zip(laws, means):
            assert law.mean == pytest.approx(m, rel=0.01), (dist, rho)


def test_overload_is_unstable_not_a_number() -> None:
    ts = tenants_at(1.05, 2, "exp")
    for laws in (ps_laws(ts), limited_ps_laws(ts, 1.0), timeshare_laws(ts)):
        assert isinstance(laws, Unstable)
    est = predict_device(DEVICES[Discipline.PS], ts)
    assert all(isinstance(e.p95_ms, Unstable) for e in est.values())


def test_a_deterministic_request_alone_takes_its_size() -> None:
    # the atom: at light load most requests find the device idle and run alone, exactly their size
    ts = tenants_at(0.05, 1, "det")
    law = ps_laws(ts)
    assert not isinstance(law, Unstable)
    assert law[0].cdf(10.0)[0] > 0.9 and law[0].cdf(9.99)[0] == 0.0
    assert law[0].quantile(0.5) == pytest.approx(10.0)


def test_limited_ps_probability_of_few_present() -> None:
    # c = 1: P(N = 0) = 1 - rho; c = 2 (M/M/2, a = lam E[S]): pi_0 = (1 - rho) / (1 + rho), pi_1 = a pi_0
    assert limited_ps_at_most(50.0, 10.0, 1.0, 0) == pytest.approx(0.5)
    a, rho = 1.0, 0.5
    pi0 = (1 - rho) / (1 + rho)
    assert limited_ps_at_most(100.0, 10.0, 2.0, 0) == pytest.approx(pi0)
    assert limited_ps_at_most(100.0, 10.0, 2.0, 1) == pytest.approx(pi0 * (1 + a))


def test_capped_moves_the_tail_onto_the_bound() -> None:
    law = LatticeDistribution(1.0, np.full(100, 0.01))
    c = capped(law, 40.0)
    assert c.quantile(0.99) <= 40.5 and c.pmf.sum() == pytest.approx(1.0)
    assert capped(law, 1000.0) is law


def test_gamma_mixture_quantiles_invert_its_cdf_and_match_its_lattice() -> None:
    law = ps_laws(tenants_at(0.6, 2, "bimodal"))
    assert not isinstance(law, Unstable)
    for q in (0.5, 0.95, 0.99):
        t = law[1].quantile(q)
        assert law[1].cdf(t)[0] == pytest.approx(q, abs=1e-9)
        lat = law[1].lattice()
        assert lat.quantile(q) == pytest.approx(t, rel=0.01)
    assert law[1].lattice().mean == pytest.approx(law[1].mean, rel=0.01)


def test_tandem_adds_means_and_lengthens_tails() -> None:
    cpu = cpu_stage_law(CpuStage(1.0, Exponential(2.0)), 200.0)
    dev = ps_laws(tenants_at(0.5, 1, "det"))
    assert not isinstance(cpu, Unstable) and not isinstance(dev, Unstable)
    both = tandem(cpu, dev[0])
    assert both.mean == pytest.approx(cpu.mean + dev[0].mean, rel=0.01)
    assert both.quantile(0.95) > max(cpu.quantile(0.95), dev[0].quantile(0.95))
    assert isinstance(cpu_stage_law(CpuStage(1.0, Exponential(2.0)), 600.0), Unstable)


def test_batch_envelope_is_no_lighter_than_the_chain() -> None:
    ts = [Tenant("t0", "m", Arrival.poisson(1000.0 * 0.6 / LAW.per_request_ms(4)), Deterministic(10.0), batch=LAW)]
    est, _ = batch_estimates(ts, 4, 10.0)
    laws = batch_laws(ts, 4, 10.0)
    assert not isinstance(est, Unstable) and not isinstance(laws, Unstable)
    law = laws[0]
    assert isinstance(law, LatticeDistribution)
    # the envelope takes the larger quantile of two laws, one of which has the chain's exact mean
    assert law.mean >= est["m"].response_ms - law.dt_ms
    assert law.quantile(0.01) >= LAW.batch_ms(1) - law.dt_ms   # no request is faster than a batch of one


# ------------------------------------------------------------------ against the simulator (small, seeded)
@pytest.mark.parametrize("disc, band", [
    (Discipline.PS, (-10.0, 25.0)),
    (Discipline.MPS, (-10.0, 35.0)),
    (Discipline.GPU_TIMESHARE, (-10.0, math.inf)),   # the law of a proven upper bound
])
def test_tails_against_a_seeded_simulation(disc: Discipline, band: tuple[float, float]) -> None:
    """p95/p99 within the validation grid's band of 8 seeded replications' average; the test would catch
    a law that forgot the queueing (the means alone are 20-50 % below these quantiles)."""
    ts = tenants_at(0.5, 2, "det")
    dev = DEVICES[disc]
    est = predict_device(dev, ts)
    sim = simulate_device(dev, ts, requests=40_000, replications=8, seed=7).tenants
    for t in ts:
        for stat in ("p95", "p99"):
            pred = getattr(est[t.name], f"{stat}_ms")
            ci = getattr(sim[t.name], f"{stat}_ms")
            err = 100.0 * (pred - ci.value) / ci.value
            assert band[0] - 100.0 * ci.half_width / ci.value <= err <= band[1], (disc, t.name, stat, err)
            assert pred > est[t.name].mean_ms * 1.2
