"""Online re-calibration (``adapt.calibrate``): service times recovered from an FCFS device's timestamps,
profiles replaced by what was observed (with provenance), admission reading the calibrated catalog, and the
check on the real Edge TPU measurements."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import VALIDATION
from edgemux.adapt.calibrate import (
    CALIBRATED,
    Observed,
    calibrate,
    calibrated_catalog,
    fcfs_service_times,
    observed_from_fcfs,
)
from edgemux.adapt.monitor import ServiceMoments
from edgemux.cluster.state import App, Cluster, Device, Node, Slo
from edgemux.cluster.workload import Discipline
from edgemux.errors import UnknownNameError
from edgemux.policies import Rejection, Snapshot, get
from edgemux.profiles.catalog import load_catalog
from edgemux.profiles.types import DeviceKind

MOB = "ibis-edgetpu/mobilenet_v2"


def test_fcfs_service_times_by_hand():
    # request 1 waits for request 0 (submitted at 0.005 s, but the device is busy until 0.010 s)
    sub = [0.000, 0.005, 0.030]
    end = [0.010, 0.018, 0.034]
    np.testing.assert_allclose(fcfs_service_times(sub, end), [10.0, 8.0, 4.0])
    # the input order is kept even when the rows are not in completion order
    np.testing.assert_allclose(fcfs_service_times(sub[::-1], end[::-1]), [4.0, 8.0, 10.0])


def test_fcfs_service_times_recovers_a_simulated_queue():
    """On a Lindley-simulated FCFS queue at rho 0.8 (where most requests wait), the recovered service times
    are the sampled ones."""
    rng = np.random.default_rng(3)
    arrivals = np.cumsum(rng.exponential(10.0, 2000))
    service = rng.gamma(4.0, 2.0, 2000)
    end = np.empty_like(arrivals)
    free = 0.0
    for i, (a, s) in enumerate(zip(arrivals, service)):
        free = max(free, a) + s
        end[i] = free
    got = fcfs_service_times(arrivals / 1000.0, end / 1000.0)
    np.testing.assert_allclose(got, service, atol=1e-6)


def test_fcfs_service_times_bad_input():
    with pytest.raises(ValueError, match="request 1 ends"):
        fcfs_service_times([0.0, 2.0], [1.0, 1.5])
    with pytest.raises(ValueError, match="two equal 1-d"):
        fcfs_service_times([0.0, 1.0], [1.0])


def test_observed_from_fcfs_splits_switched_requests():
    # a b b a: the first a is a cold start (switched), the first b and the last a switch, the second b does not
    models = ["a", "b", "b", "a"]
    sub = [0.0, 0.010, 0.020, 0.030]
    end = [0.005, 0.016, 0.024, 0.041]
    obs = observed_from_fcfs(models, sub, end)
    assert obs["a"].exec.n == 0 and obs["a"].switched.n == 2
    assert obs["a"].switched.mean_ms == pytest.approx(8.0)  # (5 + 11) / 2
    assert obs["b"].exec.n == 1 and obs["b"].exec.mean_ms == pytest.approx(4.0)
    assert obs["b"].switched.mean_ms == pytest.approx(6.0)


def observed(exec_ms: float, sd_ms: float, n: int, switched_ms: float | None = None, m: int = 0) -> Observed:
    rng = np.random.default_rng(0)
    ex = ServiceMoments.of(rng.normal(exec_ms, sd_ms, n).clip(0))
    sw = ServiceMoments.of(rng.normal(switched_ms, sd_ms, m).clip(0)) if switched_ms is not None else ServiceMoments()
    return Observed(ex, sw)


def test_calibrate_replaces_exec_and_switch_with_provenance():
    prof = load_catalog().get(MOB)
    new = calibrate(prof, observed(6.0, 1.0, 500, 20.0, 100), min_samples=20)
    e = new.exec_time(1)
    assert e.mean_ms == pytest.approx(6.0, abs=0.15)
    assert math.sqrt(e.var_ms2) == pytest.approx(1.0, abs=0.1)
    assert new.switch_ms == pytest.approx(14.0, abs=0.4)
    assert new.service.mean == pytest.approx(e.mean_ms) and new.service.var == pytest.approx(e.var_ms2)
    assert new.name == prof.name and new.provenance.source == CALIBRATED
    text = str(new.provenance)
    assert "500 requests" in text and "100 switched" in text and f"{prof.exec_time(1).mean_ms:.3g} ms" in text


def test_calibrate_waits_for_enough_samples():
    prof = load_catalog().get(MOB)
    assert calibrate(prof, observed(6.0, 1.0, 19), min_samples=20) is prof
    assert calibrate(prof, observed(6.0, 1.0, 10, 20.0, 9), min_samples=20) is prof
    # enough together but neither alone: not pooled, since the pool would price every execution at this
    # window's switch rate, and a move to a device of its own (no switches) would be planned with it
    assert calibrate(prof, observed(6.0, 1.0, 15, 20.0, 15), min_samples=20) is prof
    # few plain executions, many switched ones (alternating tenants): all of them, switch cost inside
    mixed = calibrate(prof, observed(6.0, 1.0, 10, 20.0, 30), min_samples=20)
    assert mixed.switch_ms == 0.0 and 6.0 < mixed.exec_time(1).mean_ms < 20.0
    assert "after a switch (its cost included)" in str(mixed.provenance)
    # enough executions but too few switches: the catalog's switch overhead stays
    new = calibrate(prof, observed(6.0, 1.0, 50, 20.0, 5), min_samples=20)
    assert new.switch_ms == prof.switch_ms and new.exec_time(1).mean_ms != prof.exec_time(1).mean_ms
    with pytest.raises(ValueError, match="min_samples must be >= 2"):
        calibrate(prof, observed(6.0, 1.0, 50), min_samples=1)


def test_a_calibrated_profile_keeps_its_largest_execution_and_a_camera_its_worst_case():
    """The largest execution observed stays with the calibrated profile (``ExecTime.max_ms``, the law is a
    gamma of the observed moments as before) and reaches the tenant (``Tenant.service_max_ms``): a periodic
    camera's worst-case bound (``perf.periodic``) still applies after calibration, where the gamma alone
    would send its FCFS estimate back to Poisson arrivals."""
    from edgemux.cluster.state import Placement, Share
    from edgemux.perf.device import predict_device
    from edgemux.perf.periodic import largest_ms
    from edgemux.policies.base import device_spec

    rng = np.random.default_rng(1)
    cam_ms = rng.normal(23.9, 0.18, 400)
    obs = Observed(ServiceMoments.of(cam_ms))
    assert obs.exec.max_ms == pytest.approx(cam_ms.max())
    prof = load_catalog().get("microedge/ssd_mobilenet_v2")
    cal = calibrate(prof, obs, min_samples=200)
    assert cal.exec_time(1).max_ms == pytest.approx(cam_ms.max()) and largest_ms(cal.service) is None
    tpu = Device("n1", "tpu0", DeviceKind.EDGETPU, Discipline.FCFS, 6.9, "microedge")
    cluster = Cluster((Node("n1", 4, 4096, (tpu,)),))
    cam = App("cam", "ssd_mobilenet_v2", 15, Slo(66.7, "p99"), periodic=True)
    place = {"cam": Placement("cam", (Share("n1/tpu0", 1.0, prof.name),))}

    def device_ms(o: Observed) -> tuple[float, str]:
        snap = Snapshot(cluster, {"cam": cam}, place, load_catalog().with_profiles([calibrate(prof, o, 200)]))
        est = predict_device(device_spec(tpu), snap.tenants(tpu))["cam"]
        return est.device_ms, est.method

    ms, method = device_ms(obs)
    assert ms <= cam_ms.max() + 1e-9 and "worst-case FIFO bound" in method   # one camera alone: its largest frame
    # without the maximum (an older agent's three-element report): Poisson P-K, far above any frame
    old = Observed.from_json({"exec": [obs.exec.n, obs.exec.mean_ms, obs.exec.m2]})
    assert old.exec.max_ms == 0.0
    ms, method = device_ms(old)
    assert ms > cam_ms.max() + 3.0 and "worst-case FIFO bound" not in method


def test_observed_json_round_trip_and_errors():
    o = observed(6.0, 1.0, 30, 18.0, 25)
    back = Observed.from_json(o.to_json())
    assert back == o
    assert Observed.from_json({}) == Observed()
    for bad, needle in [([], "expected an object"), ({"exec": [1, 2]}, "'exec' must be"),
                        ({"exec": [2, 1.0, 0.5, -1.0]}, "max_ms >= 0"), ({"exec": [2, 1.0, 0.5, 1.0, 9]}, "'exec' must be"),
                        ({"switched": [1, "x", 0]}, "'switched' must be"), ({"exec": [-1, 2.0, 0.0]}, "n >= 0"),
                        ({"exec": [2, 1.0, -3.0]}, "m2 >= 0")]:
        with pytest.raises(ValueError, match=needle):
            Observed.from_json(bad)


def test_admission_reads_the_calibrated_catalog():
    """Observed MobileNetV2 executions 4x slower than the catalog's: the same app is admitted on the
    catalog's figures and refused on the calibrated ones; the placement names the same profile."""
    dev = Device("n1", "tpu0", DeviceKind.EDGETPU, Discipline.FCFS, 12.0, profile_set="ibis-edgetpu")
    cluster = Cluster((Node("n1", 4, 4096, (dev,)),))
    app = App("cam", "mobilenet_v2", 100.0, Slo(30.0, "p95"))
    policy = get("ibis")
    catalog = load_catalog()
    before = policy.decide(app, Snapshot(cluster, catalog=catalog))
    assert not isinstance(before, Rejection) and before.shares[0].profile == MOB
    slow, changed = calibrated_catalog(catalog, {MOB: observed(4 * 4.91, 2.0, 200)}, min_samples=20)
    assert [p.name for p in changed] == [MOB] and slow.get(MOB).provenance.source == CALIBRATED
    assert list(slow.profiles) == list(catalog.profiles)  # replaced in place, nothing added
    assert isinstance(policy.decide(app, Snapshot(cluster, catalog=slow)), Rejection)
    # too few samples: the catalog comes back as it was
    same, none = calibrated_catalog(catalog, {MOB: observed(20.0, 2.0, 3)}, min_samples=20)
    assert same is catalog and none == ()
    with pytest.raises(UnknownNameError, match="nope"):
        calibrated_catalog(catalog, {"ibis-edgetpu/nope": observed(5.0, 1.0, 50)}, min_samples=20)


needs_data = pytest.mark.skipif(not VALIDATION.is_dir(), reason="../shared/validation not beside the checkout")


@needs_data
def test_calibration_on_the_real_edge_tpu_measurements():
    """Profiles calibrated from the other load points' end-to-end times (as any client has them), and from
    their TPU-side times, predict the mean and the tails of the real Edge TPU better than the catalog's
    (leave one load point out; figures in docs/adapt.md)."""
    from edgemux.experiments.measurements import tail_errors, validate_measurements

    results = validate_measurements(VALIDATION)
    assert all(r.calibrated_ms is not None and r.device_calibrated_ms is not None for r in results)
    for stat in ("mean", "p95", "p99"):
        before, _, _ = tail_errors(results, stat)
        for basis in ("e2e", "device"):
            after, _, _ = tail_errors(results, stat, basis)
            assert after < before, (stat, basis)
    # the catalog alone under-estimates the tails (the baseline: p99 down to -26 %)
    assert tail_errors(results, "p99")[1] < -20.0
