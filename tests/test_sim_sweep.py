"""sim.sweep: the heap-free sweep gives the event engine's departures bit for bit (PS, MPS, GPU time-sharing),
and run_workload picks it where it applies."""

from __future__ import annotations

import numpy as np
import pytest

from edgemux.cluster.workload import Arrival, CpuStage, DeviceSpec, Discipline, Tenant
from edgemux.profiles.distributions import Deterministic, Exponential, bimodal
from edgemux.profiles.types import DeviceKind
from edgemux.sim.run import choose_engine, run_workload, sample_workload

TENANTS = [Tenant("a", "m1", Arrival.poisson(120.0), Exponential(2.0)),
           Tenant("b", "m2", Arrival.poisson(60.0), Deterministic(3.0)),
           Tenant("c", "m3", Arrival.periodic(30.0), bimodal(1.0, 9.0, 0.3))]


def _dev(d: Discipline, servers: float = 1.0) -> DeviceSpec:
    return DeviceSpec("d", DeviceKind.GPU_EMBEDDED, d, servers=servers)


@pytest.mark.parametrize("device", [_dev(Discipline.PS), _dev(Discipline.MPS, 1.65), _dev(Discipline.MPS, 3.0),
                                    _dev(Discipline.GPU_TIMESHARE)], ids=lambda d: f"{d.discipline.value}-{d.servers:g}")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sweep_equals_event_engine_bit_for_bit(device: DeviceSpec, seed: int) -> None:
    w = sample_workload(TENANTS, 20_000, seed)
    sweep = run_workload(device, TENANTS, w, engine="sweep")
    event = run_workload(device, TENANTS, w, engine="event")
    assert sweep.engine == "sweep" and event.engine == "event"
    assert np.array_equal(sweep.departure_ms, event.departure_ms)
    assert np.array_equal(sweep.busy_start_ms, event.busy_start_ms)
    assert np.array_equal(sweep.busy_end_ms, event.busy_end_ms)
    assert not np.isnan(sweep.departure_ms).any()


def test_ties_a_departure_at_an_arrivals_instant_goes_first() -> None:
    """Two requests of 1 ms of work, the second arriving exactly when the first is done: no sharing."""
    ten = [Tenant("a", "m", Arrival.poisson(1.0), Deterministic(1.0))]
    w = sample_workload(ten, 2, 0)
    w = type(w)(np.array([0.0, 1.0]), w.tenant, np.array([1.0, 1.0]), w.cpu_ms)
    for engine in ("sweep", "event"):
        r = run_workload(_dev(Discipline.PS), ten, w, engine=engine)
        np.testing.assert_array_equal(r.departure_ms, [1.0, 2.0])
        np.testing.assert_array_equal(r.busy_start_ms, [0.0, 1.0])


def test_auto_picks_the_sweep_only_where_it_applies() -> None:
    assert choose_engine(_dev(Discipline.PS), TENANTS) == "sweep"
    assert choose_engine(_dev(Discipline.GPU_TIMESHARE), TENANTS) == "sweep"
    assert choose_engine(_dev(Discipline.FCFS), TENANTS) == "lindley"
    cpu = [Tenant("a", "m", Arrival.poisson(10.0), Exponential(1.0), cpu=CpuStage(1.0, Exponential(1.0)))]
    assert choose_engine(_dev(Discipline.PS), cpu) == "event"
    with pytest.raises(ValueError, match="sweep simulates only ps, mps and gpu-timeshare devices without CPU stages"):
        choose_engine(_dev(Discipline.PS), cpu, "sweep")
    with pytest.raises(ValueError, match="device 'd' is fcfs"):
        choose_engine(_dev(Discipline.FCFS), TENANTS, "sweep")
