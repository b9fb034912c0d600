"""Admission onto a spatial device (Dhakal's Multi-Model and Param-Share inside the Ibis-family policies):
the share and instance count come from the knee and the rate, the shares never exceed the device, and
instances of one model share their weights in the memory check (Dhakal Table II)."""

from __future__ import annotations

import pytest

from edgemux.cluster.state import App, Cluster, Device, Node, Placement, Share, Slo
from edgemux.cluster.workload import Discipline
from edgemux.perf.device import predict_device
from edgemux.policies.base import Rejection, Snapshot, device_spec, model_memory_mb
from edgemux.policies.registry import get
from edgemux.profiles.catalog import Catalog, CatalogInfo, load_catalog
from edgemux.profiles.types import DeviceKind, ExecTime, Profile, Provenance

GPU = Device("n1", "gpu0", DeviceKind.GPU_DISCRETE, Discipline.SPATIAL, memory_mb=16384.0, profile_set="sp")


def _catalog(curve: tuple[tuple[float, float], ...]) -> Catalog:
    # ResNet-50's memory as Dhakal Table II gives it (100 MB of weights, 1400 MB of other GPU buffers)
    prof = Profile("sp/resnet50", "resnet50", "default", DeviceKind.GPU_DISCRETE, Provenance("test"),
                   exec={1: ExecTime(1, 10.0)}, memory_static_mb=100.0, memory_runtime_mb=1400.0, share_curve=curve)
    own = Catalog([prof], [], [CatalogInfo("sp", DeviceKind.GPU_DISCRETE, "-", "test", "test")], [])
    return load_catalog().merged(own)


def _snap(curve, placements=None, apps=None) -> Snapshot:
    return Snapshot(Cluster((Node("n1", 8.0, 16384.0, (GPU,)),)), apps or {}, placements or {}, _catalog(curve))


def _app(name: str, rate: float, slo: float = 30.0, stat: str = "mean") -> App:
    return App(name, "resnet50", rate, Slo(slo, stat))


KNEE = ((0.25, 16.0), (0.5, 10.5), (1.0, 10.0))


@pytest.mark.parametrize("policy", ["ibis", "edgemux"])
def test_instances_at_the_knee_then_the_device_is_full(policy):
    pol = get(policy)
    snap = _snap(KNEE)
    a = _app("a", 150.0)
    placed = pol.decide(a, snap)
    # one instance at the knee (0.5) cannot carry 150 req/s of 10.5 ms; two can, within a 30 ms mean
    assert isinstance(placed, Placement)
    assert [(s.device, s.fraction, s.instances) for s in placed.shares] == [("n1/gpu0", 0.5, 2)]
    snap = snap.with_placement(a, placed)
    est = predict_device(device_spec(GPU), list(snap.load(GPU).tenants))["a"]
    assert est.mean_ms <= 30.0 and "spatial shares" in est.method
    why = pol.decide(_app("b", 10.0), snap)
    assert isinstance(why, Rejection) and why.constraint == "spatial-share"
    assert "all held" in why.message


def test_a_small_app_takes_one_instance_and_leaves_room():
    pol = get("edgemux")
    snap = _snap(KNEE)
    a = _app("a", 40.0)
    placed = pol.decide(a, snap)
    assert isinstance(placed, Placement) and (placed.shares[0].fraction, placed.shares[0].instances) == (0.5, 1)
    snap = snap.with_placement(a, placed)
    b = pol.decide(_app("b", 40.0), snap)
    assert isinstance(b, Placement) and (b.shares[0].fraction, b.shares[0].instances) == (0.5, 1)


def test_an_slo_below_the_lone_latency_is_refused_with_the_reason():
    why = get("ibis").decide(_app("a", 10.0, slo=8.0), _snap(KNEE))
    assert isinstance(why, Rejection) and why.constraint == "spatial-share"
    assert "no share" in why.detail


def test_param_share_fits_dhakal_table_ii_count():
    """Dhakal Table II: on a 16 GB T4, 10 ResNet-50 instances fit without parameter sharing and 11 with it
    (100 MB of weights once + 1400 MB per instance <= 16384 MB). Here a flat curve down to 5 % makes the
    instance count follow the rate: 11 instances fit, 12 are refused for memory."""
    flat = ((0.05, 10.2), (1.0, 10.0))
    prof = _catalog(flat).get("sp/resnet50")
    assert model_memory_mb(prof, GPU, 11) == 100.0 + 11 * 1400.0 <= 16384.0 < model_memory_mb(prof, GPU, 12)
    assert 10 * (100.0 + 1400.0) <= 16384.0 < 11 * (100.0 + 1400.0)   # without sharing: 10
    pol = get("ibis")
    # at 10.2 ms and the policy's 0.9 utilization cap an instance carries 88.2 req/s: 930 req/s needs 11
    fits = pol.decide(_app("a", 930.0, slo=40.0), _snap(flat))
    assert isinstance(fits, Placement) and fits.shares[0].instances == 11
    why = pol.decide(_app("a", 1020.0, slo=40.0), _snap(flat))
    assert isinstance(why, Rejection) and why.constraint == "device-memory" and "sharing one copy" in why.detail


def test_placements_keep_fraction_and_instances_in_the_snapshot():
    snap = _snap(KNEE, {"a": Placement("a", (Share("n1/gpu0", 1.0, "sp/resnet50", 0.25, 2),))},
                 {"a": _app("a", 20.0)})
    (t,) = snap.load(GPU).tenants
    assert (t.share, t.instances) == (0.25, 2) and t.service.mean == pytest.approx(16.0)
    assert snap.load(GPU).memory_used_mb == 100.0 + 2 * 1400.0


def test_check_move_judges_the_asked_share_and_instances():
    from edgemux.policies.moves import check_move

    pol = get("edgemux")
    a = _app("a", 150.0)
    snap = _snap(KNEE)
    ok = Placement("a", (Share("n1/gpu0", 1.0, "sp/resnet50", 0.5, 2),))
    assert check_move(pol, a, snap, ok) is None
    # one instance at 0.5 cannot carry 150 req/s of 10.5 ms: unstable, an SLO rejection naming the app
    one = check_move(pol, a, snap, Placement("a", (Share("n1/gpu0", 1.0, "sp/resnet50", 0.5, 1),)))
    assert isinstance(one, Rejection) and one.constraint == "slo" and one.tenant == "a"
    over = check_move(pol, a, snap, Placement("a", (Share("n1/gpu0", 1.0, "sp/resnet50", 0.5, 3),)))
    assert isinstance(over, Rejection) and over.constraint == "spatial-share" and over.requested == 1.5


@pytest.mark.parametrize("policy", ["knapsack", "dedicated"])
def test_policies_that_plan_no_shares_take_a_spatial_device_whole(policy):
    pol = get(policy)
    snap = _snap(KNEE)
    a = _app("a", 20.0)
    placed = pol.decide(a, snap)
    assert isinstance(placed, Placement) and (placed.shares[0].fraction, placed.shares[0].instances) == (1.0, 1)
    why = pol.decide(_app("b", 20.0), snap.with_placement(a, placed))
    assert isinstance(why, Rejection) and why.constraint in ("spatial-share", "occupied")
