"""ibis's shortcuts agree with the estimators and with a brute-force filter/score search."""

from __future__ import annotations

import pytest

from edgemux.cluster.state import App, Cluster, Device, Node, Placement, Share, Slo
from edgemux.cluster.workload import Discipline
from edgemux.perf.device import device_utilization, predict_device
from edgemux.perf.result import Unstable
from edgemux.policies import Rejection, Snapshot, get
from edgemux.policies.base import tenant_for, device_spec, resolve_profile
from edgemux.policies.feasibility import predict_means
from edgemux.profiles.types import DeviceKind

MODELS = {"ibis-edgetpu": ["mobilenet_v2", "mobilenet_v1", "efficientnet-S", "inception_v3"],
          "ibis-jetson-nano": ["mobilenet_v2", "alexnet", "googlenet", "resnet18"]}


def mixed_cluster() -> Cluster:
    nodes = []
    for k in range(3):
        devs = (Device(f"n{k}", "tpu0", DeviceKind.EDGETPU, Discipline.FCFS, 64, profile_set="ibis-edgetpu"),
                Device(f"n{k}", "gpu0", DeviceKind.GPU_EMBEDDED, Discipline.GPU_TIMESHARE, 8192,
                       profile_set="ibis-jetson-nano"),
                Device(f"n{k}", "gpu1", DeviceKind.GPU_EMBEDDED, Discipline.PS, 8192,
                       profile_set="ibis-jetson-nano"))
        nodes.append(Node(f"n{k}", 16, 1 << 16, devs))
    return Cluster(tuple(nodes))


def loaded_snapshot() -> Snapshot:
    s = Snapshot(mixed_cluster())
    kn = get("knapsack")
    i = 0
    for path, dev in s.cluster.devices.items():
        for j, m in enumerate(MODELS[dev.profile_set][: 1 + (i % 3)]):
            # some cameras too: periodic tenants pay their switch on every request beside another model
            a = App(f"a{i}-{j}", m, 3.0 + j, Slo(400), shared=(j == 2), cpu_cores=0.5 if j == 1 else 0,
                    cpu_ms=3 if j == 1 else 0, periodic=(j == 0 and i % 2 == 0))
            if kn.filter(a, s, dev) is None:
                profile = resolve_profile(a, dev, s.catalog)
                assert profile is not None
                s = s.with_placement(a, Placement(a.name, (Share(path, 1.0, profile.name),), cpu_node=dev.node))
        i += 1
    return s


def test_cached_utilization_and_means_match_the_estimators() -> None:
    s = loaded_snapshot()
    assert len(s.placements) > 10
    for path, dev in s.cluster.devices.items():
        load = s.load(path)
        spec = device_spec(dev)
        if dev.discipline is Discipline.FCFS:
            assert load.fcfs_utilization() == pytest.approx(device_utilization(spec, load.tenants), rel=1e-12)
            for extra in (tenant_for(App("cam", "mobilenet_v2", 7.0, Slo(400), periodic=True), p)
                          for p in s.catalog.find_all("mobilenet_v2", dev.kind, dev.profile_set)[:1]):
                assert load.fcfs_utilization(extra) == pytest.approx(
                    device_utilization(spec, [*load.tenants, extra]), rel=1e-12)
        else:
            assert load.work == pytest.approx(device_utilization(spec, load.tenants), rel=1e-12)
        if load.tenants:
            full = predict_device(spec, load.tenants)
            for name, mean in predict_means(spec, list(load.tenants)).items():
                ref = full[name].mean_ms
                if isinstance(ref, Unstable):
                    assert isinstance(mean, Unstable)
                else:
                    assert mean == pytest.approx(ref, rel=1e-12)


@pytest.mark.parametrize("opts", [{"choice": "tight"}, {"choice": "spread"},
                                  {"heterogeneous": True}, {"max_utilization": 0.3}])
def test_decide_equals_brute_force_filter_and_score(opts: dict[str, object]) -> None:
    s = loaded_snapshot()
    pol = get("ibis", **opts)
    outcomes = set()
    for k, (m, rate, slo) in enumerate([("mobilenet_v2", 20, 60), ("alexnet", 10, 100), ("googlenet", 30, 80),
                                         ("mobilenet_v1", 40, 40), ("resnet18", 5, 1000), ("alexnet", 50, 30)]):
        app = App(f"new{k}", m, rate, Slo(slo))
        d = pol.decide(app, s)
        ok = [(pol.score(app, s, dev), -i, path) for i, (path, dev) in enumerate(s.cluster.devices.items())
              if pol.filter(app, s, dev) is None]
        outcomes.add(type(d).__name__)
        if not ok:
            assert isinstance(d, Rejection)
            continue
        assert isinstance(d, Placement), d
        assert d.shares[0].device == max(ok)[2]
    assert "Placement" in outcomes
