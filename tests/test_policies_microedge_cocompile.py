"""microedge without co-compiling (MicroEdge §6.3, Fig. 6): a TPU hosts apps of one model only.

Hand-checked cases on small clusters; the default (co-compiling on) is covered unchanged by
tests/test_policies_placement.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgemux.cluster.state import App, Cluster, Device, Node, Placement, Slo
from edgemux.cluster.workload import Discipline
from edgemux.policies import Rejection, Snapshot, get
from edgemux.policies.microedge import MicroEdge
from edgemux.profiles.types import DeviceKind


def tpu(node: str, name: str, mem: float, ps: str) -> Device:
    return Device(node, name, DeviceKind.EDGETPU, Discipline.FCFS, mem, profile_set=ps)


def ibis_tpus(n: int, mem: float = 8.0) -> Cluster:
    """``n`` TPUs with the ibis-edgetpu profiles (they carry on-chip parameter sizes)."""
    return Cluster(tuple(Node(f"n{i}", 4, 4096, (tpu(f"n{i}", "t0", mem, "ibis-edgetpu"),)) for i in range(n)))


def microedge_tpus(n: int) -> Cluster:
    return Cluster(tuple(Node(f"rpi{i}", 4, 4096, (tpu(f"rpi{i}", "tpu0", 6.9, "microedge"),))
                         for i in range(n)))


def cam(name: str, model: str, fps: float = 15.0) -> App:
    return App(name, model, fps, Slo(1000 / fps, "p99"), periodic=True)


def admit(policy: MicroEdge, cluster: Cluster, apps: list[App]) -> tuple[Snapshot, list[Placement | Rejection]]:
    s = Snapshot(cluster)
    out: list[Placement | Rejection] = []
    for a in apps:
        d = policy.decide(a, s)
        out.append(d)
        if isinstance(d, Placement):
            s = s.with_placement(a, d)
    return s, out


def devices(d: Placement | Rejection) -> list[str]:
    assert isinstance(d, Placement), getattr(d, "message", d)
    return [sh.device for sh in d.shares]


def test_default_is_co_compiling() -> None:
    assert get("microedge").co_compiling is True
    assert get("microedge", partitioning=True).co_compiling is True
    assert get("microedge", co_compiling=False).co_compiling is False


def test_two_models_share_a_tpu_only_with_co_compiling() -> None:
    # mobilenet_v1 4.21 MB + mobilenet_v2 3.75 MB = 7.96 MB <= 8 MB: co-compiled on one TPU when allowed
    apps = [cam("a", "mobilenet_v1"), cam("b", "mobilenet_v2"), cam("c", "mobilenet_v1")]
    _, on = admit(MicroEdge(co_compiling=True), ibis_tpus(2), apps)
    assert [devices(d) for d in on] == [["n0/t0"], ["n0/t0"], ["n0/t0"]]
    s, off = admit(MicroEdge(co_compiling=False), ibis_tpus(2), apps)
    # b goes to the next TPU; c (same model as a) still joins a's TPU
    assert [devices(d) for d in off] == [["n0/t0"], ["n1/t0"], ["n0/t0"]]
    assert {p for ld in s.device_loads.values() for p in ld.profiles} == \
        {"ibis-edgetpu/mobilenet_v1", "ibis-edgetpu/mobilenet_v2"}
    assert all(len(ld.profiles) <= 1 for ld in s.device_loads.values())


def test_single_model_rejection_is_data() -> None:
    s, _ = admit(MicroEdge(co_compiling=False), ibis_tpus(1), [cam("a", "mobilenet_v1")])
    r = MicroEdge(co_compiling=False).filter(cam("b", "mobilenet_v2"), s, s.cluster.devices["n0/t0"])
    assert isinstance(r, Rejection)
    assert (r.constraint, r.device, r.requested, r.used, r.capacity, r.unit) == \
        ("single-model", "n0/t0", 1.0, 1.0, 1.0, "models")
    assert "ibis-edgetpu/mobilenet_v1" in r.detail and "ibis-edgetpu/mobilenet_v2" in r.detail
    assert "single-model" in r.message
    # with co-compiling the same TPU takes it (7.96 <= 8 MB)
    assert MicroEdge().filter(cam("b", "mobilenet_v2"), s, s.cluster.devices["n0/t0"]) is None


def test_cluster_wide_rejection_counts_single_model() -> None:
    _, ds = admit(MicroEdge(co_compiling=False), ibis_tpus(2),
                  [cam("a", "mobilenet_v1"), cam("b", "mobilenet_v2"), cam("c", "efficientnet-S")])
    r = ds[2]
    assert isinstance(r, Rejection)
    assert r.constraint == "single-model" and dict(r.counts) == {"single-model": 2}
    assert (r.device, r.used) == ("n0/t0", 1.0)


def test_tpu_units_rule_still_applies_to_one_model() -> None:
    # Coral-Pie 0.35 units: still 2 per TPU without co-compiling (one model everywhere)
    apps = [cam(f"c{i}", "ssd_mobilenet_v2") for i in range(5)]
    _, ds = admit(MicroEdge(co_compiling=False), microedge_tpus(2), apps)
    assert [devices(d) for d in ds[:4]] == [["rpi0/tpu0"]] * 2 + [["rpi1/tpu0"]] * 2
    r = ds[4]
    assert isinstance(r, Rejection) and r.constraint == "tpu-units"
    assert (r.requested, r.used, r.capacity) == (pytest.approx(0.35), pytest.approx(0.7), 1.0)


def test_model_too_big_alone_is_model_size_in_both_modes() -> None:
    for cc in (True, False):
        r = MicroEdge(co_compiling=cc).decide(cam("a", "mobilenet_v1"), Snapshot(ibis_tpus(1, mem=4.0)))
        assert isinstance(r, Rejection)
        assert (r.constraint, r.requested, r.used, r.capacity) == ("model-size", 4.21, 0.0, 4.0)


def test_partitioning_skips_tpus_of_other_models() -> None:
    # one Coral-Pie camera (0.35) on rpi0, then a BodyPix camera (1.2 units) with workload partitioning
    first = [cam("c0", "ssd_mobilenet_v2")]
    body = cam("b0", "bodypix")
    s_on, _ = admit(MicroEdge(partitioning=True), microedge_tpus(3), first)
    d_on = MicroEdge(partitioning=True).decide(body, s_on)
    # co-compiled beside Coral-Pie: 0.65 on rpi0, 0.55 on rpi1
    assert devices(d_on) == ["rpi0/tpu0", "rpi1/tpu0"]
    assert [sh.weight for sh in d_on.shares] == pytest.approx([0.65 / 1.2, 0.55 / 1.2])
    s_off, _ = admit(MicroEdge(partitioning=True, co_compiling=False), microedge_tpus(3), first)
    d_off = MicroEdge(partitioning=True, co_compiling=False).decide(body, s_off)
    # rpi0 holds ssd_mobilenet_v2: skipped; 1.0 on rpi1, 0.2 on rpi2
    assert devices(d_off) == ["rpi1/tpu0", "rpi2/tpu0"]
    assert [sh.weight for sh in d_off.shares] == pytest.approx([1.0 / 1.2, 0.2 / 1.2])


def test_partitioning_rejection_when_only_other_models_have_room() -> None:
    # 2 TPUs: rpi0 holds a Coral-Pie camera (0.35 units, 0.65 free but the wrong model), rpi1 is empty
    s, ds = admit(MicroEdge(partitioning=True, co_compiling=False), microedge_tpus(2),
                  [cam("c0", "ssd_mobilenet_v2"), cam("b0", "bodypix")])
    assert isinstance(ds[1], Rejection)
    # rpi0 refuses the model; rpi1 alone has 1.0 < 1.2 units: rejected on units over the whole cluster
    assert ds[1].constraint == "tpu-units"
    assert ds[1].requested == pytest.approx(1.2) and ds[1].capacity == 2.0
    # and the Coral-Pie TPU still takes another Coral-Pie camera
    assert devices(MicroEdge(partitioning=True, co_compiling=False).decide(cam("c1", "ssd_mobilenet_v2"), s)) == \
        ["rpi0/tpu0"]


def test_removing_the_last_app_of_a_model_frees_the_tpu_for_another() -> None:
    pol = MicroEdge(co_compiling=False)
    s, _ = admit(pol, ibis_tpus(1), [cam("a", "mobilenet_v1"), cam("a2", "mobilenet_v1")])
    b = cam("b", "mobilenet_v2")
    assert isinstance(pol.decide(b, s), Rejection)
    assert isinstance(pol.decide(b, s.without("a")), Rejection)      # a2 still holds mobilenet_v1
    assert devices(pol.decide(b, s.without("a").without("a2"))) == ["n0/t0"]


@pytest.mark.parametrize("partitioning", [False, True])
def test_off_is_never_more_permissive_and_keeps_one_model_per_tpu(partitioning: bool) -> None:
    """Random seeded come-and-go sequences: on every snapshot the no-co-compiling policy admits only apps
    the co-compiling one admits too, and its own placements keep one model per TPU."""
    rng = np.random.default_rng(7)
    models = ["ssd_mobilenet_v2", "bodypix", "efficientnet_lite0"]
    on, off = MicroEdge(partitioning=partitioning), MicroEdge(partitioning=partitioning, co_compiling=False)
    s = Snapshot(microedge_tpus(4))
    for i in range(200):
        if s.apps and rng.random() < 0.4:
            s = s.without(str(rng.choice(sorted(s.apps))))
            continue
        a = cam(f"a{i}", models[int(rng.integers(3))], float(rng.choice([5.0, 10.0, 15.0])))
        d_off = off.decide(a, s)
        if isinstance(d_off, Placement):
            assert isinstance(on.decide(a, s), Placement)
            s = s.with_placement(a, d_off)
        for ld in s.device_loads.values():
            assert len(ld.profiles) <= 1
            assert ld.units_used <= 1 + 1e-9
