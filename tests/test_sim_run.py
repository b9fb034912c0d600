"""simulate_device / simulate_raw: determinism, seeding, engine choice, statistics plumbing, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from edgemux.cluster.workload import Arrival, CpuStage, DeviceSpec, Discipline, Tenant
from edgemux.profiles.distributions import Deterministic, Exponential
from edgemux.profiles.types import DeviceKind
from edgemux.sim.run import choose_engine, simulate_device, simulate_raw
from edgemux.sim.stats import CI, busy_fraction, confidence_interval


def dev(discipline: str = "fcfs", **kw: float) -> DeviceSpec:
    return DeviceSpec("tpu0", DeviceKind.EDGETPU, Discipline.parse(discipline), **kw)  # type: ignore[arg-type]


TEN = [
    Tenant("a", "ma", Arrival.poisson(200.0), Exponential(1.5), switch_ms=0.4),
    Tenant("b", "mb", Arrival.periodic(60.0), Deterministic(2.0), switch_ms=0.6),
]


@pytest.mark.parametrize("discipline", ["fcfs", "ps", "gpu-timeshare", "mps", "batch"])
def test_same_seed_identical_different_seed_differs(discipline: str) -> None:
    kw = {"servers": 1.5} if discipline == "mps" else {"max_batch": 3, "batch_timeout_ms": 1.0} if discipline == "batch" else {}
    d = dev(discipline, **kw)
    r1 = simulate_device(d, TEN, requests=3_000, replications=3, seed=42)
    r2 = simulate_device(d, TEN, requests=3_000, replications=3, seed=42)
    r3 = simulate_device(d, TEN, requests=3_000, replications=3, seed=43)
    assert r1 == r2  # bit-identical, dataclass equality compares every float
    assert r1 != r3
    assert r1.tenants["a"].mean_ms.value != r3.tenants["a"].mean_ms.value


def test_replication_r_is_simulate_raw_with_spawned_seed() -> None:
    children = np.random.SeedSequence(7).spawn(4)
    raws = [simulate_raw(dev(), TEN, requests=2_000, seed=children[r]) for r in range(4)]
    means = [float(np.mean(x.latencies_of("a", warmup=0.25))) for x in raws]
    res = simulate_device(dev(), TEN, requests=2_000, replications=4, seed=7, warmup=0.25)
    assert res.tenants["a"].mean_ms.value == pytest.approx(np.mean(means), rel=1e-12)
    # replications are independent streams
    assert len({round(m, 9) for m in means}) == 4


def test_engines_agree_through_simulate_device() -> None:
    lin = simulate_device(dev(), TEN, requests=20_000, replications=3, seed=1, engine="lindley")
    evt = simulate_device(dev(), TEN, requests=20_000, replications=3, seed=1, engine="event")
    assert (lin.engine, evt.engine) == ("lindley", "event")
    for name in ("a", "b"):
        for f in ("mean_ms", "p50_ms", "p95_ms", "p99_ms", "throughput_rps"):
            x, y = getattr(lin.tenants[name], f), getattr(evt.tenants[name], f)
            assert x.value == pytest.approx(y.value, rel=1e-9, abs=1e-9)
    assert lin.utilization.value == pytest.approx(evt.utilization.value, rel=1e-9)
    assert lin.events == evt.events == 3 * 2 * 20_000


def test_engine_choice() -> None:
    assert choose_engine(dev("fcfs"), TEN) == "lindley"
    assert choose_engine(dev("ps"), TEN) == "sweep"
    assert choose_engine(dev("gpu-timeshare"), TEN) == "sweep"
    assert choose_engine(dev("ps"), TEN, "event") == "event"
    with_cpu = [Tenant("c", "m", Arrival.poisson(1.0), Exponential(1.0), cpu=CpuStage(1.0, Exponential(1.0)))]
    assert choose_engine(dev("fcfs"), with_cpu) == "event"
    with pytest.raises(ValueError, match="only FCFS"):
        choose_engine(dev("ps"), TEN, "lindley")
    with pytest.raises(ValueError, match="sweep simulates only"):
        choose_engine(dev("fcfs"), TEN, "sweep")
    with pytest.raises(ValueError, match="a tenant has a CPU stage"):
        choose_engine(dev("ps"), with_cpu, "sweep")
    with pytest.raises(ValueError, match="engine must be"):
        choose_engine(dev(), TEN, "warp")  # type: ignore[arg-type]


def test_network_latency_shifts_every_latency() -> None:
    base = simulate_raw(dev(), TEN, requests=5_000, seed=3)
    shifted = [TEN[0], Tenant("b", "mb", Arrival.periodic(60.0), Deterministic(2.0), switch_ms=0.6, network_ms=12.5)]
    r = simulate_raw(dev(), shifted, requests=5_000, seed=3)
    np.testing.assert_array_equal(r.departure_ms, base.departure_ms)
    np.testing.assert_allclose(r.latency_ms - base.latency_ms, np.where(r.tenant == 1, 12.5, 0.0), atol=1e-12)


def test_replay_ignores_requests_and_repeats_trace_each_replication() -> None:
    ts = [0.0, 5.0, 10.0, 15.0, 20.0, 21.0, 22.0, 40.0]
    ten = [Tenant("r", "m", Arrival.replay(ts), Deterministic(3.0))]
    r = simulate_device(dev(), ten, requests=1_000, replications=3, seed=0, warmup=0.0)
    # latencies: 3,3,3,3, then 20->23, 21 waits to 26, 22 waits to 29, 40->43: mean (3*5+5+7+3)/8
    assert r.tenants["r"].mean_ms.value == pytest.approx((3 * 5 + 5 + 7 + 3) / 8)
    assert r.tenants["r"].completed == 3 * len(ts)
    assert r.tenants["r"].mean_ms.half_width == 0.0  # deterministic trace and service


def test_throughput_and_zero_rate_tenant() -> None:
    ten = TEN + [Tenant("idle", "mi", Arrival.poisson(0.0), Exponential(1.0))]
    r = simulate_device(dev(), ten, requests=50_000, replications=5, seed=2, confidence=0.99)
    # periodic: the count in a window of length T is T*fps give or take one frame
    assert abs(r.tenants["b"].throughput_rps.value - 60.0) < 0.1
    assert r.tenants["a"].throughput_rps.lo < 200.0 < r.tenants["a"].throughput_rps.hi
    idle = r.tenants["idle"]
    assert idle.completed == 0 and math.isnan(idle.mean_ms.value) and idle.throughput_rps.value == 0.0


def test_confidence_interval_matches_student_t() -> None:
    x = np.array([1.0, 2.0, 4.0, 3.5, 2.2])
    ci = confidence_interval(x, 0.95)
    half = st.t.ppf(0.975, 4) * x.std(ddof=1) / math.sqrt(5)
    assert ci.value == pytest.approx(x.mean())
    assert ci.half_width == pytest.approx(half)
    assert ci.rel_half_width == pytest.approx(half / x.mean())
    one = confidence_interval([2.0])
    assert one.value == 2.0 and one.lo == -math.inf and one.hi == math.inf
    assert math.isnan(confidence_interval([1.0, math.nan]).value)
    assert CI(0.0, -1.0, 1.0).rel_half_width == math.inf
    with pytest.raises(ValueError, match="confidence"):
        confidence_interval(x, 1.0)


def test_busy_fraction_clips_to_window() -> None:
    assert busy_fraction(np.array([0.0, 5.0]), np.array([2.0, 7.0]), 1.0, 6.0) == pytest.approx(2.0 / 5.0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"requests": -5}, "requests must be >= 1"),
        ({"requests": 0}, "requests must be >= 1"),
        ({"requests": 2.5}, "requests must be an integer"),
        ({"replications": 0}, "replications"),
        ({"warmup": 1.0}, "warmup"),
        ({"warmup": -0.1}, "warmup"),
        ({"confidence": 0.0}, "confidence"),
        ({"engine": "quantum"}, "engine must be"),
    ],
)
def test_invalid_arguments_raise(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        simulate_device(dev(), TEN, **kwargs)


def test_invalid_tenants_and_devices_raise() -> None:
    with pytest.raises(ValueError, match="at least one tenant, got zero"):
        simulate_device(dev(), [])
    with pytest.raises(ValueError, match="unique"):
        simulate_device(dev(), [TEN[0], TEN[0]])
    with pytest.raises(ValueError, match="switch_ms"):
        simulate_device(dev(), [Tenant("x", "m", Arrival.poisson(1.0), Exponential(1.0), switch_ms=-1.0)])
    with pytest.raises(ValueError, match="CPU cores"):
        simulate_device(dev(), [Tenant("x", "m", Arrival.poisson(1.0), Exponential(1.0), cpu=CpuStage(0.0, Exponential(1.0)))])
    with pytest.raises(ValueError, match="only to the mps"):
        simulate_device(dev("fcfs", servers=2.0), TEN)
    with pytest.raises(ValueError, match="rate 0"):
        simulate_device(dev(), [Tenant("x", "m", Arrival.poisson(0.0), Exponential(1.0))])
    with pytest.raises(ValueError, match="at least one tenant"):
        simulate_raw(dev(), [])


class _Bad:
    """A service-time law that draws ``value`` every time (to show what a broken distribution does)."""

    def __init__(self, value: float) -> None:
        self.value = value

    def __hash__(self) -> int:
        return hash(self.value)

    mean = 1.0
    var = 0.0

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.value)


@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf])
def test_a_distribution_drawing_negative_or_non_finite_times_is_refused(value: float) -> None:
    from edgemux.sim.run import sample_workload

    good = Tenant("a", "m", Arrival.poisson(10.0), Exponential(1.0))
    bad = Tenant("b", "m", Arrival.poisson(10.0), _Bad(value))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="negative or non-finite"):
        sample_workload([good, bad], 100, seed=0)
    cpu_bad = Tenant("c", "m", Arrival.poisson(10.0), Exponential(1.0),
                     cpu=CpuStage(1.0, _Bad(value)))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="negative or non-finite"):
        sample_workload([good, cpu_bad], 100, seed=0)
    assert len(sample_workload([good], 100, seed=0)) == 100
