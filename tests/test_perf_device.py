"""perf.device: predict_device dispatch per discipline, and perf.paper_forms."""

from __future__ import annotations

import pytest

from edgemux.cluster.workload import Arrival, BatchLaw, CpuStage, DeviceSpec, Discipline, Tenant
from edgemux.perf.device import TenantEstimate, device_utilization, predict_device
from edgemux.perf.edgetpu import edgetpu_responses
from edgemux.perf.gpu import (
    batch_single_model,
    gpu_fcfs_responses,
    gpu_ps_responses,
    mps_responses,
    timeshare_responses,
)
from edgemux.perf.paper_forms import for_discipline
from edgemux.perf.result import Unstable
from edgemux.profiles.distributions import Deterministic, Exponential
from edgemux.profiles.types import DeviceKind


def dev(d: str, **kw) -> DeviceSpec:
    return DeviceSpec("node-1/acc0", DeviceKind.GPU_EMBEDDED, Discipline.parse(d), **kw)


def tenants(scale: float = 1.0) -> list[Tenant]:
    return [Tenant("cam", "ssd", Arrival.poisson(15.0 * scale), Deterministic(20.0), switch_ms=10.0, network_ms=3.0),
            Tenant("kiosk", "mnet", Arrival.poisson(30.0 * scale), Exponential(5.0), switch_ms=4.0,
                   batch=BatchLaw(1.0, 4.0))]


def test_fcfs_edgetpu() -> None:
    ts = tenants()
    est = predict_device(dev("fcfs"), ts)
    assert set(est) == {"cam", "kiosk"}
    e = est["cam"]
    assert isinstance(e, TenantEstimate)
    assert e.device_ms == pytest.approx(edgetpu_responses(ts)[0])
    assert e.mean_ms == pytest.approx(e.device_ms + 3.0) and e.cpu_ms == 0.0 and e.network_ms == 3.0
    assert e.p95_ms is not None and e.p99_ms is not None and e.p95_ms < e.p99_ms
    assert e.p95_ms > e.network_ms + 20.0
    assert "Ibis Eq. 1-5" in e.method and e.bounds_ms is None
    assert e.rho == pytest.approx(device_utilization(dev("fcfs"), ts))


def test_fcfs_without_switching_says_plain_pk() -> None:
    ts = [Tenant("a", "m", Arrival.poisson(40.0), Exponential(10.0), switch_ms=5.0)]
    e = predict_device(dev("fcfs"), ts)["a"]
    assert "switch" not in e.method and "Eq. 3, 5" in e.method
    assert e.mean_ms == pytest.approx(10.0 / 0.6)


def test_ps_mps_timeshare_batch() -> None:
    ts = tenants()
    ps = predict_device(dev("ps"), ts)
    assert [ps[t.name].device_ms for t in ts] == pytest.approx(gpu_ps_responses(ts))
    assert "exact" in ps["cam"].method and "PS sojourn law" in ps["cam"].method
    assert ps["cam"].p99_ms > ps["cam"].p95_ms > ps["cam"].mean_ms      # tails from perf.sojourn
    only = predict_device(dev("ps"), ts, tails=["kiosk"])                 # admission asks for some only
    assert only["cam"].p95_ms is None and only["kiosk"].p95_ms == pytest.approx(ps["kiosk"].p95_ms)
    mps = predict_device(dev("mps", servers=1.65), ts)
    assert [mps[t.name].device_ms for t in ts] == pytest.approx(mps_responses(ts, 1.65))
    assert mps["cam"].rho == pytest.approx((0.015 * 20 + 0.03 * 5) / 1.65)
    g = predict_device(dev("gpu-timeshare"), ts)
    for t, f, p, m in zip(ts, gpu_fcfs_responses(ts), gpu_ps_responses(ts), timeshare_responses(ts)):
        assert g[t.name].bounds_ms == pytest.approx((f, p))
        assert g[t.name].device_ms == pytest.approx(m)
    b = predict_device(dev("batch", max_batch=4, batch_timeout_ms=5.0), [ts[1]])
    one = batch_single_model(30.0, BatchLaw(1.0, 4.0), 4, 5.0)
    assert b["kiosk"].device_ms == pytest.approx(one.response_ms)
    assert b["kiosk"].rho == pytest.approx(one.utilization)
    assert "Eq. 9" in b["kiosk"].method


def test_cpu_stage_and_tails() -> None:
    ts = tenants()
    ts[0] = Tenant("cam", "ssd", Arrival.poisson(15.0), Deterministic(20.0), switch_ms=10.0,
                   cpu=CpuStage(1.0, Exponential(10.0)), network_ms=3.0)
    est = predict_device(dev("fcfs"), ts)
    e = est["cam"]
    assert e.cpu_ms == pytest.approx(10.0 / 0.85)
    assert e.mean_ms == pytest.approx(e.cpu_ms + e.device_ms + 3.0)
    # the CPU stage's law convolved with the device's: the tail lies beyond both stages' means
    assert isinstance(e.p95_ms, float) and e.p95_ms > e.mean_ms and "CPU stage convolved in" in e.method
    assert est["kiosk"].p95_ms is not None


def test_unstable_device_and_cpu() -> None:
    est = predict_device(dev("fcfs"), tenants(scale=3.0))
    for e in est.values():
        assert isinstance(e.mean_ms, Unstable) and isinstance(e.p99_ms, Unstable) and e.rho >= 1.0
        assert e.mean_ms.where == "node-1/acc0"
    hot_cpu = [Tenant("a", "m", Arrival.poisson(10.0), Deterministic(5.0), cpu=CpuStage(0.5, Exponential(60.0)))]
    e = predict_device(dev("ps"), hot_cpu)["a"]
    assert isinstance(e.mean_ms, Unstable) and isinstance(e.cpu_ms, Unstable) and not isinstance(e.device_ms, Unstable)


def test_periodic_arrivals_noted_and_edge_cases() -> None:
    ts = [Tenant("cam", "ssd", Arrival.periodic(15.0), Deterministic(20.0))]
    assert "Poisson arrivals assumed" in predict_device(dev("ps"), ts)["cam"].method
    e = predict_device(dev("fcfs"), ts)["cam"]        # D/D/1: the worst-case bound is exact
    assert "worst-case FIFO bound" in e.method and e.mean_ms == e.p99_ms == 20.0
    poisson = [Tenant("cam", "ssd", Arrival.poisson(15.0), Deterministic(20.0))]
    assert predict_device(dev("fcfs"), poisson)["cam"].p99_ms > 20.0
    assert predict_device(dev("fcfs"), []) == {}
    assert device_utilization(dev("mps", servers=2.0), []) == 0.0
    with pytest.raises(ValueError):
        predict_device(dev("ps"), [ts[0], ts[0]])


def test_paper_forms() -> None:
    ts = tenants()
    for d, n in (("ps", 1), ("mps", 1), ("gpu-timeshare", 1), ("fcfs", 1), ("batch", 0)):
        forms = for_discipline(Discipline.parse(d))
        assert len(forms) == n
        for name, fn in forms:
            vals = fn(dev(d, servers=1.65), ts)
            assert len(vals) == 2 and all(isinstance(v, float) for v in vals) and name
    # Eq. 10 overestimates the exact MPS mean for c > 1
    (_, eq10), = for_discipline(Discipline.MPS)
    assert all(p > e for p, e in zip(eq10(dev("mps", servers=1.65), ts), mps_responses(ts, 1.65)))
