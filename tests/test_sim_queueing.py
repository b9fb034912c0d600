"""Statistical checks against closed forms: the analytic value must lie in the simulator's 99% confidence
interval from >= 10 independent replications (all seeded, so each run is reproducible).

Rates are in req/s in the Tenant API; the formulas below use per-ms rates (lam = rps / 1000).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgemux.cluster.workload import Arrival, CpuStage, DeviceSpec, Discipline, Tenant
from edgemux.profiles.distributions import Deterministic, Exponential, bimodal, second_moment
from edgemux.profiles.types import DeviceKind
from edgemux.sim.run import simulate_device, simulate_raw
from edgemux.sim.stats import CI, time_average_in_system

CONF = 0.99
REPS = 10


def dev(discipline: str, **kw: float) -> DeviceSpec:
    return DeviceSpec("dev0", DeviceKind.GPU_DISCRETE, Discipline.parse(discipline), **kw)  # type: ignore[arg-type]


def assert_in(ci: CI, analytic: float, max_rel_half_width: float = 0.05) -> None:
    assert ci.lo <= analytic <= ci.hi, f"analytic {analytic:.5g} outside 99% CI [{ci.lo:.5g}, {ci.hi:.5g}]"
    # and the interval is informative, not trivially wide
    assert ci.rel_half_width < max_rel_half_width, f"CI too wide: ±{100 * ci.rel_half_width:.1f}%"


def erlang_c(c: int, a: float) -> float:
    """Probability of waiting in M/M/c with offered load a = lam/mu (Erlang C)."""
    rho = a / c
    top = a**c / math.factorial(c) / (1 - rho)
    return top / (sum(a**k / math.factorial(k) for k in range(c)) + top)


# ----------------------------------------------------------------------------------------------- FCFS


def test_mm1_mean_and_percentiles() -> None:
    lam, mu = 0.7, 1.0
    r = simulate_device(
        dev("fcfs"), [Tenant("t", "m", Arrival.poisson(700.0), Exponential(1.0))],
        requests=200_000, replications=REPS, seed=1, confidence=CONF,
    )
    assert r.engine == "lindley"
    s = r.tenants["t"]
    assert_in(s.mean_ms, 1 / (mu - lam))
    # M/M/1 FCFS response time is exponential with rate mu - lam
    for p, ci in ((0.5, s.p50_ms), (0.95, s.p95_ms), (0.99, s.p99_ms)):
        assert_in(ci, -math.log(1 - p) / (mu - lam))
    assert_in(s.throughput_rps, 700.0, 0.01)
    assert_in(r.utilization, lam / mu, 0.01)
    assert s.completed == REPS * 180_000


def test_md1_pollaczek_khinchine() -> None:
    lam, svc = 0.8, 1.0
    rho = lam * svc
    r = simulate_device(
        dev("fcfs"), [Tenant("t", "m", Arrival.poisson(800.0), Deterministic(svc))],
        requests=200_000, replications=REPS, seed=2, confidence=CONF,
    )
    assert_in(r.tenants["t"].mean_ms, svc + rho * svc / (2 * (1 - rho)))


def test_mg1_pk_with_bimodal_service_two_tenants_same_model() -> None:
    # two tenants share one model (no switches): one M/G/1 queue with the rate-weighted service mixture
    s1, s2 = bimodal(1.0, 10.0, 0.1), Deterministic(1.5)
    l1, l2 = 0.2, 0.1  # per ms
    lam = l1 + l2
    es = (l1 * s1.mean + l2 * s2.mean) / lam
    es2 = (l1 * second_moment(s1) + l2 * second_moment(s2)) / lam
    rho = lam * es
    wq = lam * es2 / (2 * (1 - rho))
    r = simulate_device(
        dev("fcfs"),
        [
            Tenant("a", "shared", Arrival.poisson(1000 * l1), s1, switch_ms=5.0),
            Tenant("b", "shared", Arrival.poisson(1000 * l2), s2, switch_ms=5.0),
        ],
        requests=300_000, replications=REPS, seed=3, confidence=CONF,
    )
    assert_in(r.tenants["a"].mean_ms, wq + s1.mean)
    assert_in(r.tenants["b"].mean_ms, wq + s2.mean)
    assert_in(r.utilization, rho, 0.01)


def test_fcfs_switch_overhead_utilization_is_ibis_eq2() -> None:
    """Utilization counts switch overhead: lam * S with S_i = e_i + (1 - P(M_i)) o_i (Ibis Eq. 1-2), exact
    for Poisson tenants because the previous request's model is independent of the current one."""
    rates = [200.0, 100.0, 50.0]
    e = [1.0, 2.0, 0.5]
    o = [0.8, 1.2, 0.4]
    ten = [Tenant(f"t{i}", f"m{i}", Arrival.poisson(rates[i]), Exponential(e[i]), switch_ms=o[i]) for i in range(3)]
    lam = sum(rates) / 1000
    p = [x / sum(rates) for x in rates]
    s = sum(p[i] * (e[i] + (1 - p[i]) * o[i]) for i in range(3))
    r = simulate_device(dev("fcfs"), ten, requests=100_000, replications=REPS, seed=4, confidence=CONF)
    assert_in(r.utilization, lam * s, 0.01)


# ------------------------------------------------------------------------------------- sharing devices


def test_multiclass_ps_is_insensitive() -> None:
    """M/G/1-PS: E[R_i] = S_i / (1 - rho) for every class, whatever its service distribution."""
    classes = [(100.0, Exponential(2.0)), (200.0, Deterministic(1.0)), (100.0, bimodal(0.5, 5.0, 0.2))]
    rho = sum(rps / 1000 * d.mean for rps, d in classes)
    ten = [Tenant(f"c{i}", f"m{i}", Arrival.poisson(rps), d) for i, (rps, d) in enumerate(classes)]
    r = simulate_device(dev("ps"), ten, requests=50_000, replications=REPS, seed=5, confidence=CONF)
    assert r.engine == "sweep" and r.events == REPS * 2 * 50_000
    for i, (_, d) in enumerate(classes):
        assert_in(r.tenants[f"c{i}"].mean_ms, d.mean / (1 - rho))
    assert_in(r.utilization, rho, 0.02)


def test_mps_integer_c_is_erlang_c() -> None:
    """Limited PS with c = 2 and exponential service has M/M/2's birth-death chain: Erlang-C mean."""
    lam, mu, c = 1.4, 1.0, 2
    a = lam / mu
    analytic = erlang_c(c, a) / (c * mu - lam) + 1 / mu
    ten = [Tenant("a", "ma", Arrival.poisson(700.0), Exponential(1.0)), Tenant("b", "mb", Arrival.poisson(700.0), Exponential(1.0))]
    r = simulate_device(dev("mps", servers=2.0), ten, requests=50_000, replications=REPS, seed=6, confidence=CONF)
    assert_in(r.tenants["a"].mean_ms, analytic)
    assert_in(r.tenants["b"].mean_ms, analytic)


def test_mps_fractional_c_birth_death() -> None:
    """Fractional c = 1.65 (Ibis Fig. 11): with exponential service the number present is a birth-death
    chain with death rate mu * min(n, c); its mean by Little's law."""
    lam, mu, c = 1.2, 1.0, 1.65
    n = np.arange(0, 2000)
    death = mu * np.minimum(n[1:], c)
    logp = np.concatenate([[0.0], np.cumsum(np.log(lam / death))])
    p = np.exp(logp - logp.max())
    p /= p.sum()
    analytic = float((n * p).sum() / lam)
    ten = [Tenant("a", "ma", Arrival.poisson(1200.0), Exponential(1.0))]
    r = simulate_device(dev("mps", servers=c), ten, requests=60_000, replications=REPS, seed=7, confidence=CONF)
    assert_in(r.tenants["a"].mean_ms, analytic)


def test_gpu_timeshare_identical_exponential_apps_match_mm1() -> None:
    """Work-conserving, size-blind and exponential with one rate: the number present is M/M/1's, so the
    mean over all requests is 1/(mu - lam) (apps are symmetric, so each app's mean is too)."""
    lam, mu = 0.75, 1.0
    ten = [Tenant(f"app{i}", f"m{i}", Arrival.poisson(250.0), Exponential(1.0)) for i in range(3)]
    r = simulate_device(dev("gpu-timeshare"), ten, requests=50_000, replications=REPS, seed=8, confidence=CONF)
    for i in range(3):
        assert_in(r.tenants[f"app{i}"].mean_ms, 1 / (mu - lam), 0.08)


def test_cpu_stage_tandem_mean_is_sum_of_stage_means() -> None:
    """Jackson network: each app's c-core PS CPU stage (exponential) feeds a FCFS device (exponential, same
    rate for all apps); every stage is an independent M/M/c-type queue and means add, plus the network."""
    l1, l2 = 0.3, 0.2
    ten = [
        Tenant("one", "m1", Arrival.poisson(300.0), Exponential(1.0), cpu=CpuStage(1.0, Exponential(2.0)), network_ms=3.0),
        Tenant("two", "m2", Arrival.poisson(200.0), Exponential(1.0), cpu=CpuStage(2.0, Exponential(8.0))),
    ]
    device_mean = 1 / (1.0 - (l1 + l2))
    cpu_one = 1 / (1 / 2.0 - l1)  # M/M/1-PS
    cpu_two = erlang_c(2, l2 * 8.0) / (2 / 8.0 - l2) + 8.0  # M/M/2
    r = simulate_device(dev("fcfs"), ten, requests=60_000, replications=REPS, seed=9, confidence=CONF)
    assert r.engine == "event"
    assert_in(r.tenants["one"].mean_ms, cpu_one + device_mean + 3.0)
    assert_in(r.tenants["two"].mean_ms, cpu_two + device_mean, 0.06)


# ----------------------------------------------------------------------------------------- Little's law


@pytest.mark.parametrize(
    "device",
    [dev("fcfs"), dev("ps"), dev("gpu-timeshare"), dev("mps", servers=1.5), dev("batch", max_batch=4, batch_timeout_ms=2.0)],
    ids=lambda d: d.discipline.value,
)
def test_littles_law(device: DeviceSpec) -> None:
    """Time-average number present L equals observed arrival rate x mean response time, per discipline."""
    ten = [
        Tenant("a", "ma", Arrival.poisson(150.0), Exponential(2.0), switch_ms=0.3),
        Tenant("b", "mb", Arrival.periodic(100.0), Deterministic(1.5), switch_ms=0.3),
    ]
    run = simulate_raw(device, ten, requests=40_000, seed=10, engine="event")
    k0 = 4_000
    t0, t1 = run.arrival_ms[k0], run.arrival_ms[-1]
    L = time_average_in_system(run.arrival_ms, run.departure_ms, t0, t1)
    inside = run.arrival_ms >= t0
    lam = np.count_nonzero(inside) / (t1 - t0)
    mean_r = float(np.mean(run.departure_ms[inside] - run.arrival_ms[inside]))
    assert L == pytest.approx(lam * mean_r, rel=0.01)
    assert np.all(np.isfinite(run.departure_ms)) and np.all(run.departure_ms >= run.arrival_ms)
