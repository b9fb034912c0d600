"""``edgemux``: ibis's decisions where ibis places; latency-aware partitioning where no device takes the app."""

from __future__ import annotations

import pytest

from edgemux.cluster.state import App, Cluster, Device, Node, Placement, Slo
from edgemux.cluster.workload import Discipline
from edgemux.perf.device import predict_device
from edgemux.policies import Rejection, Snapshot, get, names
from edgemux.policies.base import device_spec
from edgemux.profiles.types import DeviceKind


def tpus(n: int) -> Cluster:
    devs = tuple(Device("n1", f"t{i}", DeviceKind.EDGETPU, Discipline.FCFS, 8, profile_set="ibis-edgetpu")
                 for i in range(n))
    return Cluster((Node("n1", 8, 4096, devs),))


def all_slos_met(s: Snapshot) -> None:
    for path, dev in s.cluster.devices.items():
        for name, e in predict_device(device_spec(dev), s.tenants(path)).items():
            assert isinstance(e.mean_ms, float) and e.mean_ms <= s.apps[name].slo.latency_ms
            assert e.rho <= 0.9 + 1e-9


def test_registered() -> None:
    assert "edgemux" in names()


def test_partitions_what_no_single_device_takes() -> None:
    # 300 req/s of a 4.91 ms model: rho 1.47 on one TPU, above the 0.9 cap everywhere
    a = App("a", "mobilenet_v2", 300, Slo(30))
    s = Snapshot(tpus(3))
    r = get("ibis").decide(a, s)
    assert isinstance(r, Rejection) and r.constraint == "utilization" and dict(r.counts) == {"utilization": 3}
    d = get("edgemux").decide(a, s)
    assert isinstance(d, Placement) and len(d.shares) == 2
    assert sum(sh.weight for sh in d.shares) == pytest.approx(1.0)
    all_slos_met(s.with_placement(a, d))
    # without partitioning it is ibis
    assert get("edgemux", partitioning=False).decide(a, s) == r


def test_rejects_when_even_pieces_do_not_fit() -> None:
    a = App("a", "mobilenet_v2", 300, Slo(30))
    d = get("edgemux").decide(a, Snapshot(tpus(1)))
    assert isinstance(d, Rejection) and d.constraint == "utilization"
    d = get("edgemux", max_parts=1).decide(a, Snapshot(tpus(3)))
    assert isinstance(d, Rejection)


def test_same_as_ibis_where_ibis_places_and_never_breaks_an_slo() -> None:
    apps = [App(f"a{i}", m, r, Slo(slo)) for i, (m, r, slo) in enumerate(
        [("mobilenet_v2", 40, 15), ("mobilenet_v1", 30, 40), ("mobilenet_v2", 250, 40), ("efficientnet-S", 20, 60),
         ("mobilenet_v1", 60, 40), ("mobilenet_v2", 120, 25), ("mobilenet_v2", 30, 20)])]
    s_i, s_e = Snapshot(tpus(4)), Snapshot(tpus(4))
    ibis, ours = get("ibis"), get("edgemux")
    placed_i = placed_e = 0
    for a in apps:
        di, de = ibis.decide(a, s_e), ours.decide(a, s_e)
        if isinstance(di, Placement):
            assert de == di                          # same state, same answer
        if isinstance(de, Placement):
            s_e = s_e.with_placement(a, de)
            placed_e += 1
        dii = ibis.decide(a, s_i)
        if isinstance(dii, Placement):
            s_i = s_i.with_placement(a, dii)
            placed_i += 1
    all_slos_met(s_e)
    all_slos_met(s_i)
    assert placed_e >= placed_i
    assert any(len(p.shares) > 1 for p in s_e.placements.values())
