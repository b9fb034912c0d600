"""Device disciplines on small hand-computed cases, and exact equivalences between engines/disciplines."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgemux.cluster.workload import Arrival, BatchLaw, CpuStage, DeviceSpec, Discipline, Tenant
from edgemux.profiles.distributions import Deterministic, Exponential, Gamma, bimodal
from edgemux.profiles.types import DeviceKind
from edgemux.sim.devices import BatchStation, FcfsStation, GpuTimeshareStation, LimitedPsStation
from edgemux.sim.engine import PRIO_ARRIVAL, Engine
from edgemux.sim.run import Workload, run_workload, simulate_raw


def dev(discipline: str, **kw: float) -> DeviceSpec:
    return DeviceSpec("dev0", DeviceKind.GPU_EMBEDDED, Discipline.parse(discipline), **kw)  # type: ignore[arg-type]


def drive(station_factory, arrivals: list[float]) -> tuple[list[float], Engine, object]:
    """Feed arrivals at the given times (request i at arrivals[i]) and return departure times."""
    eng = Engine()
    done = [float("nan")] * len(arrivals)

    def sink(now: float, req: int) -> None:
        done[req] = now

    station = station_factory(eng, sink)
    for i, t in enumerate(arrivals):
        eng.schedule(t, PRIO_ARRIVAL, station.arrive, i)
    eng.run()
    return done, eng, station


# ---------------------------------------------------------------------------------------------- stations


def test_ps_two_jobs_share_the_server() -> None:
    # job0 size 4 at t=0, job1 size 2 at t=1: at t=1 job0 has 3 left; both at rate 1/2 until job1 ends at
    # t=5 (job0 has 1 left), then job0 alone ends at t=6.
    done, _, st = drive(lambda e, s: LimitedPsStation(e, s, [4.0, 2.0], capacity=1.0), [0.0, 1.0])
    assert done == pytest.approx([6.0, 5.0])
    assert st.busy_start == [0.0] and st.busy_end == [6.0]


def test_limited_ps_rate_min_one_c_over_n() -> None:
    # c = 1.5, three jobs of size 3 at t=0: rate 0.5 each until they all finish at t=6
    done, _, _ = drive(lambda e, s: LimitedPsStation(e, s, [3.0, 3.0, 3.0], capacity=1.5), [0.0, 0.0, 0.0])
    assert done == pytest.approx([6.0, 6.0, 6.0])
    # c = 2, two jobs: each at full speed
    done, _, _ = drive(lambda e, s: LimitedPsStation(e, s, [3.0, 1.0], capacity=2.0), [0.0, 0.5])
    assert done == pytest.approx([3.0, 1.5])
    # fractional CPU share c = 0.5: a lone job runs at half speed
    done, _, _ = drive(lambda e, s: LimitedPsStation(e, s, [3.0], capacity=0.5), [1.0])
    assert done == pytest.approx([7.0])
    with pytest.raises(ValueError, match="capacity"):
        LimitedPsStation(Engine(), lambda t, r: None, [], capacity=0.0)


def test_gpu_timeshare_fifo_within_app_ps_across_apps() -> None:
    # app0: req0 (size 2) at 0 and req1 (size 2) at 0; app1: req2 (size 1) at 0
    # heads req0 and req2 share: req2 done at t=2 (1 unit at 1/2); req0 has 1 left -> alone, done t=3;
    # req1 then alone, done t=5
    done, _, st = drive(
        lambda e, s: GpuTimeshareStation(e, s, [2.0, 2.0, 1.0], app=[0, 0, 1], n_apps=2), [0.0, 0.0, 0.0]
    )
    assert done == pytest.approx([3.0, 5.0, 2.0])
    assert st.busy_start == [0.0] and st.busy_end == [5.0]


def test_fcfs_station_switch_cost() -> None:
    done, _, st = drive(
        lambda e, s: FcfsStation(e, s, [1.0, 1.0, 1.0], model=[0, 1, 1], switch=[2.0, 3.0, 3.0]), [0.0, 0.0, 10.0]
    )
    assert done == [3.0, 7.0, 11.0]
    assert st.busy_start == [0.0, 10.0] and st.busy_end == [7.0, 11.0]
    assert st.occupation == 8.0


def test_batch_station_full_timeout_and_oldest_head() -> None:
    law = BatchLaw(k1_ms=1.0, k2_ms=2.0)  # batch of b takes b + 2 ms
    arrivals = [0.0, 0.1, 0.2, 0.3, 0.4, 20.0]
    models = [0, 0, 1, 0, 1, 0]

    def make(e: Engine, s):
        return BatchStation(
            e, s, arrival=arrivals, service=[9.0] * 6, model=models, switch=[0.0] * 6, law=[law] * 6,
            n_models=2, max_batch=3, timeout_ms=5.0,
        )

    done, _, st = drive(make, arrivals)
    # t=0.3: model 0 queue is full (0,1,3) -> batch of 3 runs until 5.3; meanwhile model 1 (2,4) timed out at
    # 5.2 -> starts at 5.3 with b=2, done 9.3; req5 at 20 waits its 5 ms timeout -> 25..28
    assert done == pytest.approx([5.3, 5.3, 9.3, 5.3, 9.3, 28.0])
    assert st.batches == 3
    assert st.busy_start == pytest.approx([0.3, 25.0]) and st.busy_end == pytest.approx([9.3, 28.0])


def test_batch_station_without_law_sums_service() -> None:
    def make(e: Engine, s):
        return BatchStation(
            e, s, arrival=[0.0, 0.0], service=[1.5, 2.5], model=[0, 0], switch=[4.0, 4.0], law=[None, None],
            n_models=1, max_batch=2, timeout_ms=0.0,
        )

    done, _, _ = drive(make, [0.0, 0.0])
    # req0 arrives first and starts alone (timeout 0): 1.5 + 4 (cold switch); then req1: 2.5
    assert done == [5.5, 8.0]


# ------------------------------------------------------------------------------------ exact equivalences


def tenants_fcfs(switch: float) -> list[Tenant]:
    return [
        Tenant("a", "m-a", Arrival.poisson(150.0), Exponential(2.0), switch_ms=switch),
        Tenant("b", "m-b", Arrival.poisson(80.0), bimodal(1.0, 6.0, 0.2), switch_ms=2 * switch),
        Tenant("c", "m-a", Arrival.periodic(30.0), Deterministic(3.0), switch_ms=switch),  # shares model m-a
    ]


@pytest.mark.parametrize("switch", [0.0, 0.7])
def test_lindley_and_event_engine_agree_on_fcfs(switch: float) -> None:
    ten = tenants_fcfs(switch)
    lin = simulate_raw(dev("fcfs"), ten, requests=40_000, seed=3, engine="lindley")
    evt = simulate_raw(dev("fcfs"), ten, requests=40_000, seed=3, engine="event")
    assert lin.engine == "lindley" and evt.engine == "event"
    np.testing.assert_array_equal(lin.arrival_ms, evt.arrival_ms)
    np.testing.assert_allclose(lin.departure_ms, evt.departure_ms, rtol=0, atol=1e-7)
    assert lin.events == evt.events == 2 * 40_000
    # busy time agrees too (Lindley reports per-request intervals, the event engine busy periods)
    lb = np.sum(lin.busy_end_ms - lin.busy_start_ms)
    eb = np.sum(evt.busy_end_ms - evt.busy_start_ms)
    assert lb == pytest.approx(eb, rel=1e-10)


def test_gpu_timeshare_with_one_app_is_fcfs() -> None:
    ten = [Tenant("solo", "m", Arrival.poisson(300.0), Gamma(2.5, 0.5))]
    a = simulate_raw(dev("gpu-timeshare"), ten, requests=20_000, seed=11)
    b = simulate_raw(dev("fcfs"), ten, requests=20_000, seed=11)
    np.testing.assert_allclose(a.departure_ms, b.departure_ms, rtol=0, atol=1e-7)


def test_batch_of_one_without_timeout_is_fcfs_with_batch_law_service() -> None:
    law = BatchLaw(k1_ms=1.2, k2_ms=0.8)
    batched = [
        Tenant("x", "mx", Arrival.poisson(200.0), Exponential(9.9), batch=law, switch_ms=0.5),
        Tenant("y", "my", Arrival.poisson(150.0), Exponential(9.9), batch=law, switch_ms=0.5),
    ]
    plain = [
        Tenant("x", "mx", Arrival.poisson(200.0), Deterministic(law.batch_ms(1)), switch_ms=0.5),
        Tenant("y", "my", Arrival.poisson(150.0), Deterministic(law.batch_ms(1)), switch_ms=0.5),
    ]
    a = simulate_raw(dev("batch", max_batch=1, batch_timeout_ms=0.0), batched, requests=20_000, seed=5)
    b = simulate_raw(dev("fcfs"), plain, requests=20_000, seed=5)
    np.testing.assert_array_equal(a.arrival_ms, b.arrival_ms)
    np.testing.assert_allclose(a.departure_ms, b.departure_ms, rtol=0, atol=1e-7)


def test_work_conserving_disciplines_share_busy_periods() -> None:
    """FCFS, PS and GPU time-sharing (no switch cost) are work conserving: same busy periods."""
    ten = [
        Tenant("a", "ma", Arrival.poisson(100.0), Exponential(3.0)),
        Tenant("b", "mb", Arrival.poisson(60.0), Deterministic(4.0)),
    ]
    runs = [simulate_raw(dev(d), ten, requests=10_000, seed=2, engine="event") for d in ("fcfs", "ps", "gpu-timeshare")]
    for r in runs[1:]:
        np.testing.assert_allclose(r.busy_start_ms, runs[0].busy_start_ms, atol=1e-7)
        np.testing.assert_allclose(r.busy_end_ms, runs[0].busy_end_ms, atol=1e-7)
    # departures differ (PS lets short jobs overtake), but the last departure of each busy period doesn't
    for r in runs[1:]:
        assert r.departure_ms.max() == pytest.approx(runs[0].departure_ms.max(), abs=1e-7)


def test_periodic_deterministic_single_tenant_never_waits() -> None:
    ten = [Tenant("cam", "yolo", Arrival.periodic(30.0), Deterministic(20.0), switch_ms=5.0)]
    for engine in ("lindley", "event"):
        r = simulate_raw(dev("fcfs"), ten, requests=2_000, seed=1, engine=engine)  # type: ignore[arg-type]
        # cold start: the first frame pays the model load, every later frame exactly its service
        assert r.latency_ms[0] == pytest.approx(25.0, abs=1e-9)
        # (t + 20) - t is 20 up to float rounding of t; a wait would be >= ms, not 1e-9 ms
        np.testing.assert_allclose(r.latency_ms[1:], 20.0, rtol=0, atol=1e-9)


def test_replay_hand_computed() -> None:
    ten = [Tenant("r", "m", Arrival.replay([100.0, 101.0, 150.0, 151.5]), Deterministic(2.0), network_ms=1.0)]
    r = simulate_raw(dev("fcfs"), ten, requests=1, seed=0)
    np.testing.assert_array_equal(r.arrival_ms, [0.0, 1.0, 50.0, 51.5])
    np.testing.assert_array_equal(r.departure_ms, [2.0, 4.0, 52.0, 54.0])
    np.testing.assert_array_equal(r.latency_ms, [3.0, 4.0, 3.0, 3.5])


def test_cpu_stage_feeds_device_and_network_adds() -> None:
    # cpu stage with 1 core: req0 at 0 takes 2 (done 2), req1 at 0 shares -> PS: both done at 4 (same size)
    w = Workload(
        arrival_ms=np.array([0.0, 0.0]),
        tenant=np.array([0, 0]),
        service_ms=np.array([1.0, 1.0]),
        cpu_ms=np.array([2.0, 2.0]),
    )
    ten = [Tenant("c", "m", Arrival.poisson(1.0), Deterministic(1.0), cpu=CpuStage(1.0, Deterministic(2.0)), network_ms=10.0)]
    r = run_workload(dev("fcfs"), ten, w)
    assert r.engine == "event"
    # both leave the CPU at t=4, device serves them FCFS: 5 and 6
    np.testing.assert_allclose(r.departure_ms, [5.0, 6.0])
    np.testing.assert_allclose(r.latency_ms, [15.0, 16.0])
    with pytest.raises(ValueError, match="Lindley"):
        run_workload(dev("fcfs"), ten, w, engine="lindley")


# ------------------------------------------------------------- virtual-time trick vs a naive reference


def naive_sharing(arrivals: list[float], sizes: list[float], c: float | None, app: list[int] | None) -> list[float]:
    """Reference: recompute every request's remaining work at each event (O(n^2), no virtual time).

    ``c`` given: limited PS, each present request at rate min(1, c/n). ``app`` given: GPU time-sharing,
    only each app's oldest request progresses, at rate 1/k for k apps with work.
    """
    order = sorted(range(len(arrivals)), key=lambda i: (arrivals[i], i))
    done = [0.0] * len(arrivals)
    present: list[int] = []  # in arrival order
    left = {i: sizes[i] for i in order}
    now, k = 0.0, 0
    while k < len(order) or present:
        if app is None:
            running = list(present)
            rate = (c / len(running) if len(running) > c else 1.0) if running else 0.0  # type: ignore[operator]
        else:
            heads: dict[int, int] = {}
            for i in present:
                heads.setdefault(app[i], i)
            running = list(heads.values())
            rate = 1.0 / len(running) if running else 0.0
        t_arr = arrivals[order[k]] if k < len(order) else math.inf
        t_dep = now + min(left[i] for i in running) / rate if running else math.inf
        t = min(t_arr, t_dep)
        for i in running:
            left[i] -= (t - now) * rate
        now = t
        if t_dep <= t_arr:
            for i in running:
                if left[i] <= 1e-9:
                    present.remove(i)
                    done[i] = now
        else:
            present.append(order[k])
            k += 1
    return done


job_lists = st.lists(st.tuples(st.integers(0, 40), st.integers(1, 12), st.integers(0, 2)), min_size=1, max_size=25)


@settings(max_examples=60, deadline=None)
@given(job_lists, st.sampled_from([1.0, 1.5, 2.0, 3.0, 0.5]))
def test_limited_ps_matches_naive(jobs: list[tuple[int, int, int]], c: float) -> None:
    jobs = sorted(jobs)
    arr = [float(t) / 4 for t, _, _ in jobs]
    size = [float(s) / 3 for _, s, _ in jobs]
    done, _, _ = drive(lambda e, s: LimitedPsStation(e, s, size, capacity=c), arr)
    np.testing.assert_allclose(done, naive_sharing(arr, size, c, None), rtol=0, atol=1e-7)


@settings(max_examples=60, deadline=None)
@given(job_lists)
def test_gpu_timeshare_matches_naive(jobs: list[tuple[int, int, int]]) -> None:
    jobs = sorted(jobs)
    arr = [float(t) / 4 for t, _, _ in jobs]
    size = [float(s) / 3 for _, s, _ in jobs]
    app = [a for _, _, a in jobs]
    done, _, _ = drive(lambda e, s: GpuTimeshareStation(e, s, size, app=app, n_apps=3), arr)
    np.testing.assert_allclose(done, naive_sharing(arr, size, None, app), rtol=0, atol=1e-7)
