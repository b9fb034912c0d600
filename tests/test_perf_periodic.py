"""The worst-case bound for periodic streams on an FCFS device (perf.periodic), and how periodic streams
pay model switches (perf.edgetpu.same_model_probabilities)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgemux.cluster.workload import Arrival, DeviceSpec, Discipline, Tenant
from edgemux.perf.device import predict_device
from edgemux.perf.edgetpu import edgetpu_utilization, same_model_probabilities
from edgemux.perf.periodic import cap, largest_ms, periodic_fcfs_bound
from edgemux.perf.result import Unstable
from edgemux.profiles.distributions import Deterministic, Empirical, Exponential, Gamma, Shifted, bimodal
from edgemux.profiles.types import DeviceKind
from edgemux.sim.run import simulate_raw

TPU = DeviceSpec("rpi0/tpu0", DeviceKind.EDGETPU, Discipline.FCFS)


def cam(name: str, ms: float, fps: float = 15.0, model: str | None = None, switch: float = 0.0) -> Tenant:
    return Tenant(name, model or name, Arrival.periodic(fps), Deterministic(ms), switch_ms=switch)


def test_largest_value_of_each_distribution() -> None:
    assert largest_ms(Deterministic(4.0)) == 4.0
    assert largest_ms(Empirical((1.0, 7.5, 3.0))) == 7.5
    assert largest_ms(Shifted(Deterministic(2.0), 1.5)) == 3.5
    assert largest_ms(bimodal(1.0, 9.0, 0.1)) == 9.0
    assert largest_ms(bimodal(1.0, 9.0, 0.0)) == 1.0          # a part of weight 0 is never drawn
    assert largest_ms(Exponential(3.0)) is None
    assert largest_ms(Gamma(2.0, 1.0)) is None


def test_bound_is_one_request_of_every_tenant() -> None:
    assert periodic_fcfs_bound([cam("a", 23.3)]) == pytest.approx(23.3)
    assert periodic_fcfs_bound([cam("a", 23.3), cam("b", 20.0)]) == pytest.approx(43.3)
    # switches count only when another model shares the device
    same = [cam("a", 10.0, model="m", switch=4.0), cam("b", 10.0, model="m", switch=4.0)]
    assert periodic_fcfs_bound(same) == pytest.approx(20.0)
    assert periodic_fcfs_bound([cam("a", 10.0, switch=4.0), cam("b", 10.0, switch=4.0)]) == pytest.approx(28.0)


def test_bound_does_not_apply() -> None:
    assert periodic_fcfs_bound([]) is None
    poisson = Tenant("p", "m", Arrival.poisson(5.0), Deterministic(3.0))
    assert periodic_fcfs_bound([cam("a", 10.0), poisson]) is None
    assert periodic_fcfs_bound([Tenant("e", "m", Arrival.periodic(5.0), Exponential(3.0))]) is None
    # worst-case load 3 x 30 ms x 15 fps = 1.35 > 1
    assert periodic_fcfs_bound([cam("a", 30.0), cam("b", 30.0), cam("c", 30.0)]) is None


def test_cap_takes_the_smaller_and_replaces_unstable() -> None:
    assert cap([10.0, 50.0], 20.0) == [10.0, 20.0]
    assert cap([Unstable("d", 1.2)], 20.0) == [20.0]
    assert cap([10.0], None) == [10.0]


def test_one_camera_meets_its_frame_budget() -> None:
    """examples/one-camera.yaml: the Poisson p99 alone (74.6 ms) would exceed the 66.7 ms budget."""
    e = predict_device(TPU, [cam("coral-pie", 1000 * 0.35 / 15)])["coral-pie"]
    assert e.p99_ms == pytest.approx(23.333, abs=1e-3) and e.mean_ms == pytest.approx(23.333, abs=1e-3)


def test_periodic_streams_of_other_models_pay_every_switch() -> None:
    ts = [cam("a", 10.0, switch=6.0), cam("b", 15.0, switch=9.0)]
    assert same_model_probabilities(ts) == [0.0, 0.0]
    assert edgetpu_utilization(ts) == pytest.approx(15.0 * (16.0 + 24.0) / 1000.0)
    alone = [cam("a", 10.0, model="m", switch=6.0), cam("b", 15.0, model="m", switch=9.0)]
    assert same_model_probabilities(alone) == [1.0, 1.0]
    mixed = [cam("a", 10.0, switch=6.0), Tenant("p", "m", Arrival.poisson(15.0), Deterministic(5.0), switch_ms=2.0)]
    assert same_model_probabilities(mixed) == [0.0, 0.5]


def test_switching_periodic_streams_are_really_overloaded() -> None:
    """Three equal-rate cameras of three models interleave in a fixed order: the simulated queue grows
    without bound although the rate-share switch probability would put utilization at 0.9. The estimate
    (every frame pays its switch) says unstable."""
    ts = [cam(f"c{j}", m, fps=1000 * 0.9 / 63, switch=0.6 * m) for j, m in enumerate((10.0, 15.0, 20.0))]
    est = predict_device(TPU, ts)
    assert all(isinstance(e.mean_ms, Unstable) for e in est.values())
    raw = simulate_raw(TPU, ts, requests=30_000, seed=1)
    lat = raw.latency_ms
    assert lat[-1000:].mean() > 10 * lat[:1000].mean()


@settings(max_examples=25, deadline=None)
@given(ms=st.lists(st.floats(1.0, 30.0), min_size=1, max_size=5),
       fps=st.lists(st.sampled_from([5.0, 7.5, 10.0, 15.0, 30.0]), min_size=5, max_size=5),
       switch=st.floats(0.0, 5.0), seed=st.integers(0, 2**31 - 1))
def test_no_simulated_frame_exceeds_the_bound(ms: list[float], fps: list[float], switch: float, seed: int) -> None:
    """The bound is a worst case over phases: no request may exceed it (after the first 1 %: the simulated
    device starts with no model loaded, so its very first request pays a load the bound leaves out)."""
    ts = [cam(f"c{j}", m, fps=f, switch=switch) for j, (m, f) in enumerate(zip(ms, fps))]
    bound = periodic_fcfs_bound(ts)
    if bound is None:
        return
    raw = simulate_raw(TPU, ts, requests=5_000, seed=seed)
    est = predict_device(TPU, ts)
    for t in ts:
        mine = raw.latencies_of(t.name, warmup=0.01)
        assert float(np.max(mine)) <= bound + 1e-6
        assert est[t.name].p99_ms <= bound + 1e-9
        # not asserted: sample p99 <= the estimate's p99. Below the bound the estimate is the Poisson tail,
        # which phase-locked frames can exceed (cameras of 1, 1 and 3 ms at 5, 7.5 and 5 fps collide on a
        # fixed pattern: 2.47 ms at p99 against 2.06 ms estimated, found by this test); only the bound is a
        # theorem.
