"""perf.cpu, perf.tandem, perf.interference, perf.dutycycle, perf.energy: the smaller estimators."""

from __future__ import annotations

import math

import pytest

from edgemux.cluster.workload import Arrival, CpuStage, Tenant
from edgemux.perf.cpu import cpu_response, cpu_utilization, ibis_cpu_response
from edgemux.perf.dutycycle import dedicated_tpus, dedicated_utilization, fits_one_tpu, tpu_units
from edgemux.perf.energy import (
    computation_time_ms,
    efficiency,
    energy_per_request_j,
    expected_computing_time_s,
    paper_eq3_expansion_j,
    throughput_rps,
)
from edgemux.perf.interference import (
    average_latency,
    colocated_latency,
    path_latency,
    replicated_latency,
    shortest_path_latency,
)
from edgemux.perf.queueing import limited_ps_response
from edgemux.perf.result import Unstable
from edgemux.perf.tandem import end_to_end, tenant_cpu_ms, tenant_end_to_end
from edgemux.profiles.distributions import Deterministic, Exponential


# ------------------------------------------------------------------ CPU stage (Ibis Eq. 11)
def test_cpu_stage_exact_and_paper() -> None:
    stage = CpuStage(2.0, Exponential(8.0))
    # lam = 125 req/s: a = 1, rho = 0.5: M/M/2 mean 8 / 0.75
    assert cpu_utilization(stage, 125.0) == pytest.approx(0.5)
    assert cpu_response(stage, 125.0) == pytest.approx(8.0 / 0.75)
    assert ibis_cpu_response(stage, 125.0) == pytest.approx(16.0)
    assert cpu_response(CpuStage(1.5, Deterministic(8.0)), 100.0) == pytest.approx(limited_ps_response(100.0, 8.0, 1.5))
    r = cpu_response(stage, 300.0)
    assert isinstance(r, Unstable) and r.where == "cpu"
    with pytest.raises(ValueError):
        cpu_response(CpuStage(0.0, Exponential(8.0)), 1.0)


# ------------------------------------------------------------------ tandem (Ibis §3.6)
def test_tandem_adds_means_and_keeps_unstable() -> None:
    assert end_to_end(3.0, 10.0, 2.5) == pytest.approx(15.5)
    u = Unstable(1.2, "tpu0")
    assert end_to_end(3.0, u, 2.0) is u
    t = Tenant("a", "m", Arrival.poisson(125.0), Deterministic(5.0), cpu=CpuStage(2.0, Exponential(8.0)),
               network_ms=4.0)
    assert tenant_cpu_ms(t) == pytest.approx(8.0 / 0.75)
    assert tenant_end_to_end(t, 6.0) == pytest.approx(8.0 / 0.75 + 6.0 + 4.0)
    assert tenant_cpu_ms(Tenant("b", "m", Arrival.poisson(5.0), Deterministic(5.0))) == 0.0


# ------------------------------------------------------------------ MVSP (Eq. 2, 3, 14)
def test_mvsp_interference() -> None:
    # Eq. 14: 20 + 0.1*30 + 0.2*10
    assert colocated_latency(20.0, [(0.1, 30.0), (0.2, 10.0)]) == pytest.approx(25.0)
    assert colocated_latency(20.0, []) == 20.0
    # Eq. 3: 20 + 0.1*20*(3-1) + 0.1*30*2 = 30
    assert replicated_latency(20.0, 0.1, 3, [(0.1, 30.0, 2)]) == pytest.approx(30.0)
    assert replicated_latency(20.0, 0.1, 1) == 20.0
    with pytest.raises(ValueError):
        replicated_latency(20.0, 0.1, 0)


def test_mvsp_network() -> None:
    assert path_latency([12.23, 12.23, 5.0]) == pytest.approx(29.46)
    links = {("iot", "r1"): 5.0, ("r1", "edge"): 7.0, ("iot", "r2"): 2.0, ("r2", "edge"): 20.0, ("r1", "r2"): 1.0}
    assert shortest_path_latency(links, "iot", "edge", round_trip=False) == pytest.approx(10.0)  # iot-r2-r1-edge
    assert shortest_path_latency(links, "iot", "edge") == pytest.approx(20.0)
    assert shortest_path_latency(links, "iot", "nowhere") == math.inf
    assert shortest_path_latency(links, "iot", "iot") == 0.0
    directed = {("a", "b"): 3.0, ("b", "a"): 5.0}
    assert shortest_path_latency(directed, "a", "b", directed=True) == pytest.approx(8.0)
    assert average_latency([1.0, 3.0], [10.0, 30.0]) == pytest.approx(25.0)
    assert average_latency([], []) == 0.0


# ------------------------------------------------------------------ MicroEdge TPU units
def test_tpu_units_paper_examples() -> None:
    assert tpu_units(30.0, 10.0) == pytest.approx(0.3)          # §4.1 example
    u = tpu_units(69.0, 15.0)                                    # EfficientNet-Lite0 at 15 FPS, §1
    assert u == pytest.approx(1.035)
    assert dedicated_tpus(u) == 2
    assert dedicated_utilization(u) == pytest.approx(0.5175)     # "only 52 %"
    assert 2 - u == pytest.approx(0.965)                         # "a cumulative 96 %" wasted
    assert fits_one_tpu([0.3, 0.7]) and fits_one_tpu([0.35, 0.35, 0.3])
    assert not fits_one_tpu([0.6, 0.6])
    assert dedicated_tpus(0.35) == 1 and dedicated_tpus(1.0) == 1 and dedicated_tpus(1.2) == 2
    assert dedicated_tpus(0.0) == 1
    with pytest.raises(ValueError):
        tpu_units(-1.0, 10.0)


# ------------------------------------------------------------------ FPGA-GPU energy
def test_energy_model() -> None:
    assert computation_time_ms(2.0, 10.0, 8) == pytest.approx(26.0)
    assert computation_time_ms(2.0, 10.0, 8, slowdown=1.5) == pytest.approx(39.0)
    h1 = throughput_rps(2.0, 10.0, [8])
    assert h1 == pytest.approx(8 * 1000 / 26.0)
    h3 = throughput_rps(2.0, 10.0, [8, 8, 8], slowdown=1.5)
    assert h3 == pytest.approx(3 * 8 * 1000 / 39.0)
    assert energy_per_request_j(200.0, h1) == pytest.approx(200.0 / h1)
    # the paper's expansion of Eq. 3 equals P/H for one worker only; C^2 times larger for C workers
    assert paper_eq3_expansion_j(2.0, 10.0, [8], 200.0) == pytest.approx(energy_per_request_j(200.0, h1))
    assert paper_eq3_expansion_j(2.0, 10.0, [8] * 3, 200.0, 1.5) == pytest.approx(9 * energy_per_request_j(200.0, h3))
    assert energy_per_request_j(100.0, 0.0) == math.inf
    assert efficiency(h1, 0.5) == pytest.approx(2 * h1)
    assert expected_computing_time_s(20000, [4000.0, 1000.0]) == pytest.approx(4.0)
    assert expected_computing_time_s(10, []) == math.inf
    assert throughput_rps(2.0, 10.0, []) == 0.0
