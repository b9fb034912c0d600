"""knapsack, dedicated, ibis and microedge on small hand-built clusters with hand-checked outcomes."""

from __future__ import annotations

import math

import pytest

from edgemux.cluster.state import App, Cluster, Device, Node, Placement, Slo
from edgemux.cluster.workload import Discipline
from edgemux.perf.device import device_utilization, predict_device
from edgemux.policies import Rejection, Snapshot, get
from edgemux.policies.base import device_spec
from edgemux.profiles.types import DeviceKind


def tpu(node: str, name: str, mem: float = 8.0, ps: str = "ibis-edgetpu") -> Device:
    return Device(node, name, DeviceKind.EDGETPU, Discipline.FCFS, mem, profile_set=ps)


def jetson(node: str, name: str, mem: float = 4096.0) -> Device:
    return Device(node, name, DeviceKind.GPU_EMBEDDED, Discipline.GPU_TIMESHARE, mem,
                  profile_set="ibis-jetson-nano")


def admit_all(policy: str, cluster: Cluster, apps: list[App], **opts: object) -> tuple[Snapshot, list[object]]:
    s = Snapshot(cluster)
    pol = get(policy, **opts)
    out = []
    for a in apps:
        d = pol.decide(a, s)
        out.append(d)
        if isinstance(d, Placement):
            s = s.with_placement(a, d)
    return s, out


def devices_of(d: object) -> list[str]:
    assert isinstance(d, Placement), getattr(d, "message", d)
    return [sh.device for sh in d.shares]


# --------------------------------------------------------------------------------------------- knapsack


def test_knapsack_first_fit_and_resource_rejections() -> None:
    cl = Cluster((Node("n1", 4, 1000, (tpu("n1", "t0", mem=6.9),)),
                  Node("n2", 4, 1000, (tpu("n2", "t0", mem=6.9),))))
    a = App("a", "mobilenet_v2", 10, Slo(50), cpu_cores=2, cpu_ms=1)
    b = App("b", "mobilenet_v1", 10, Slo(50))        # 3.75 + 4.21 MB > 6.9 MB: not beside a
    c = App("c", "mobilenet_v2", 10, Slo(50), cpu_cores=3, cpu_ms=1)
    s, (da, db, dc) = admit_all("knapsack", cl, [a, b, c])
    assert devices_of(da) == ["n1/t0"] and devices_of(db) == ["n2/t0"]
    assert isinstance(dc, Rejection)
    # n1: CPU 2 + 3 > 4 cores; n2: 4.21 + 3.75 MB > 6.9 MB
    assert dict(dc.counts) == {"cpu": 1, "device-memory": 1}
    one = get("knapsack").filter(c, s, cl.devices["n1/t0"])
    assert one == Rejection("c", "cpu", device="n1/t0", node="n1", requested=3, used=2, capacity=4, unit="cores")
    # the closest device leads: 3.75 MB needed > 2.69 MB free (x1.39) before 3 cores needed > 2 free (x1.5)
    assert (dc.constraint, dc.device) == ("device-memory", "n2/t0")
    assert dc.message.startswith("app 'c' rejected: device-memory: 3.75 MB needed > 2.69 MB free on n2/t0; "
                                 "0/2 devices fit (1 cpu, 1 device-memory)")
    two = get("knapsack").filter(c, s, cl.devices["n2/t0"])
    assert (two.constraint, two.device, two.requested, two.used, two.capacity) == \
        ("device-memory", "n2/t0", 3.75, 4.21, 6.9)


# ------------------------------------------------------------------------------------ ibis vs knapsack


def slo_case() -> tuple[Cluster, App, App]:
    cl = Cluster((Node("n1", 4, 4096, (tpu("n1", "t0"), tpu("n1", "t1"))),))
    a = App("a", "mobilenet_v2", 50, Slo(12))         # alone: mean 5.71 ms
    b = App("b", "mobilenet_v1", 20, Slo(50))         # beside a: switches push a's mean to 24.4 ms
    return cl, a, b


def test_ibis_protects_existing_tenant_where_knapsack_does_not() -> None:
    cl, a, b = slo_case()
    sk, dk = admit_all("knapsack", cl, [a, b])
    si, di = admit_all("ibis", cl, [a, b], choice="tight")
    assert devices_of(dk[1]) == ["n1/t0"]             # knapsack: first fit, beside a
    assert devices_of(di[1]) == ["n1/t1"]             # ibis: t0 would break a's SLO
    est = predict_device(device_spec(cl.devices["n1/t0"]), sk.tenants("n1/t0"))
    assert est["a"].mean_ms > a.slo.latency_ms        # the knapsack placement really breaks a
    for dev in cl.devices:
        for name, e in predict_device(device_spec(cl.devices[dev]), si.tenants(dev)).items():
            assert e.mean_ms <= si.apps[name].slo.latency_ms


def test_ibis_rejection_names_the_tenant_that_would_break() -> None:
    cl, a, b = slo_case()
    one = Cluster((Node("n1", 4, 4096, (cl.devices["n1/t0"],)),))
    s, _ = admit_all("ibis", one, [a])
    r = get("ibis").decide(b, s)
    assert isinstance(r, Rejection)
    assert (r.constraint, r.device, r.tenant, r.stat, r.slo_ms) == ("slo", "n1/t0", "a", "mean", 12)
    assert r.predicted_ms == pytest.approx(24.42, abs=0.01)
    assert "slo: a would see mean 24.4 ms > 12 ms on n1/t0" in r.message


def test_ibis_utilization_cap_and_every_statistic_estimated() -> None:
    cl = Cluster((Node("n1", 4, 4096, (tpu("n1", "t0"),)),))
    a = App("a", "mobilenet_v2", 50, Slo(1000))
    s, _ = admit_all("ibis", cl, [a])
    b = App("b", "mobilenet_v2", 60, Slo(1000))
    r = get("ibis", max_utilization=0.5).decide(b, s)
    assert isinstance(r, Rejection) and r.constraint == "utilization"
    spec = device_spec(cl.devices["n1/t0"])
    before = device_utilization(spec, s.tenants("n1/t0"))
    assert r.used == pytest.approx(before) and r.capacity == 0.5
    assert before + r.requested > 0.5
    # a p99 SLO on a time-shared GPU: the time-sharing bound's law gives it (perf.sojourn), and it decides
    g = Cluster((Node("n1", 4, 4096, (jetson("n1", "g0"),)),))
    ok_gpu = get("ibis").decide(App("c", "mobilenet_v2", 5, Slo(500, "p99")), Snapshot(g))
    assert isinstance(ok_gpu, Placement)
    r = get("ibis").decide(App("c", "mobilenet_v2", 5, Slo(1, "p99")), Snapshot(g))
    assert isinstance(r, Rejection) and (r.constraint, r.tenant, r.stat) == ("slo", "c", "p99")
    assert r.predicted_ms > 1
    # a p50 SLO too: the median of the same law, below the p99 and the mean of a right-skewed law
    assert isinstance(get("ibis").decide(App("c", "mobilenet_v2", 5, Slo(500, "p50")), Snapshot(g)), Placement)
    r = get("ibis").decide(App("c", "mobilenet_v2", 5, Slo(1, "p50")), Snapshot(g))
    assert isinstance(r, Rejection) and (r.constraint, r.tenant, r.stat) == ("slo", "c", "p50")
    spec_g = device_spec(g.devices["n1/g0"])
    from edgemux.policies.base import tenant_for
    t = tenant_for(App("c", "mobilenet_v2", 5, Slo(1)), Snapshot(g).catalog.get("ibis-jetson-nano/mobilenet_v2"))
    est = predict_device(spec_g, [t])["c"]
    assert isinstance(est.p50_ms, float) and est.p50_ms < est.p95_ms < est.p99_ms and est.p50_ms <= est.mean_ms
    ok = get("ibis").decide(App("c", "mobilenet_v2", 5, Slo(500, "p99")),
                            Snapshot(Cluster((Node("n1", 4, 4096, (tpu("n1", "t0"),)),))))
    assert isinstance(ok, Placement)                  # an Edge TPU gives p99 by P-K inversion


def test_ibis_tight_and_spread_choose_differently() -> None:
    cl = Cluster((Node("n1", 4, 8192, (jetson("n1", "g0"), jetson("n1", "g1"))),))
    apps = [App("a", "mobilenet_v2", 10, Slo(200)), App("b", "alexnet", 10, Slo(200)),
            App("c", "googlenet", 5, Slo(200))]
    _, tight = admit_all("ibis", cl, apps, choice="tight")
    _, spread = admit_all("ibis", cl, apps, choice="spread")
    assert [devices_of(d)[0] for d in tight] == ["n1/g0", "n1/g0", "n1/g0"]
    # rho after placement: b on g0 0.130 + 0.142 vs g1 0.142 -> g1; c on g0 0.130 + 0.067 = 0.197 vs g1 0.209 -> g0
    assert [devices_of(d)[0] for d in spread] == ["n1/g0", "n1/g1", "n1/g0"]


def test_ibis_heterogeneous_picks_lowest_latency_kind() -> None:
    cl = Cluster((Node("n1", 4, 4096, (jetson("n1", "g0"),)), Node("n2", 4, 4096, (tpu("n2", "t0"),))))
    app = App("a", "mobilenet_v2", 10, Slo(100))     # Jetson 13.02 ms, Edge TPU 4.91 ms
    assert devices_of(get("ibis").decide(app, Snapshot(cl))) == ["n1/g0"]   # tight: higher utilization
    assert devices_of(get("ibis", heterogeneous=True).decide(app, Snapshot(cl))) == ["n2/t0"]


def test_ibis_ai_as_a_service_shares_one_copy() -> None:
    cl = Cluster((Node("n1", 8, 8192, (jetson("n1", "g0", mem=2000), jetson("n1", "g1", mem=2000))),))
    shared = [App(f"s{i}", "alexnet", 5, Slo(300), shared=True) for i in range(3)]
    s, ds = admit_all("ibis", cl, shared, choice="spread")
    assert [devices_of(d) for d in ds] == [["n1/g0"]] * 3       # grouped despite spread
    load = s.load("n1/g0")
    assert len(load.models) == 1 and load.memory_used_mb == pytest.approx(1130)
    assert len({t.model for t in load.tenants}) == 1
    est = predict_device(device_spec(cl.devices["n1/g0"]), load.tenants)
    assert est["s0"].rho == pytest.approx(3 * 5 * 14.18 / 1000)  # rates aggregate on one copy
    # private copies: 2 x 1130 MB > 2000 MB, so each own-model app needs its own GPU
    own = [App(f"o{i}", "alexnet", 5, Slo(300)) for i in range(3)]
    _, do = admit_all("ibis", cl, own)
    assert devices_of(do[0]) == ["n1/g0"] and devices_of(do[1]) == ["n1/g1"]
    assert isinstance(do[2], Rejection) and do[2].constraint == "device-memory"


# -------------------------------------------------------------------------------- microedge, dedicated


def six_tpus() -> Cluster:
    return Cluster(tuple(Node(f"rpi{i}", 4, 4096, (tpu(f"rpi{i}", "tpu0", mem=6.9, ps="microedge"),))
                         for i in range(6)))


def cameras(model: str, n: int) -> list[App]:
    return [App(f"{model}-{i}", model, 15, Slo(1000), periodic=True) for i in range(n)]


@pytest.mark.parametrize(("model", "units", "no_part", "part", "dedicated"), [
    # Coral-Pie 0.35 units: 2 per TPU whole -> 12; partitioned floor(6/0.35) = 17; dedicated 1 TPU each -> 6
    ("ssd_mobilenet_v2", 0.35, 12, 17, 6),
    # BodyPix 1.2 units: never fits one TPU -> 0; partitioned floor(6/1.2) = 5; dedicated 2 TPUs each -> 3
    ("bodypix", 1.2, 0, 5, 3),
])
def test_microedge_cameras(model: str, units: float, no_part: int, part: int, dedicated: int) -> None:
    assert math.floor(6 / units) == part
    apps = cameras(model, 25)
    for policy, opts, expect in [("microedge", {"partitioning": False}, no_part),
                                 ("microedge", {"partitioning": True}, part),
                                 ("dedicated", {}, dedicated)]:
        s, ds = admit_all(policy, six_tpus(), apps, **opts)
        placed = [d for d in ds if isinstance(d, Placement)]
        assert len(placed) == expect, (policy, opts)
        assert all(isinstance(d, Rejection) for d in ds[expect:])   # once full, nothing more fits
        for load in s.device_loads.values():
            assert load.units_used <= 1 + 1e-9
        if policy == "microedge" and opts["partitioning"]:
            total = sum(load.units_used for load in s.device_loads.values())
            assert total == pytest.approx(part * units, rel=1e-6)
            for d in placed:                           # weights = each piece's share of the app's units
                assert sum(sh.weight for sh in d.shares) == pytest.approx(1.0)
        if policy == "dedicated":
            assert all(len(d.shares) == math.ceil(units) for d in placed)
            used = [sh.device for d in placed for sh in d.shares]
            assert len(used) == len(set(used))        # no TPU is shared


def test_microedge_partition_weights_by_hand() -> None:
    apps = cameras("ssd_mobilenet_v2", 13)
    _, ds = admit_all("microedge", six_tpus(), apps, partitioning=True)
    thirteenth = ds[12]
    # every TPU holds 0.7 units; 0.3 units free on rpi0, 0.05 taken from rpi1
    assert devices_of(thirteenth) == ["rpi0/tpu0", "rpi1/tpu0"]
    assert [sh.weight for sh in thirteenth.shares] == pytest.approx([0.3 / 0.35, 0.05 / 0.35])
    r = get("microedge").decide(apps[0].__class__("x", "ssd_mobilenet_v2", 15, Slo(1000), periodic=True),
                                admit_all("microedge", six_tpus(), apps[:12])[0])
    assert isinstance(r, Rejection) and r.constraint == "tpu-units"
    assert (r.requested, r.used, r.capacity) == (pytest.approx(0.35), pytest.approx(0.7), 1.0)


def test_microedge_model_size_rule() -> None:
    cl = Cluster((Node("n1", 4, 4096, (tpu("n1", "t0", mem=6.9), tpu("n1", "t1", mem=6.9))),))
    a = App("a", "efficientnet-S", 15, Slo(1000), periodic=True)   # 6.56 MB on chip
    b = App("b", "mobilenet_v2", 15, Slo(1000), periodic=True)     # 3.75 MB: cannot co-compile with a
    c = App("c", "efficientnet-S", 15, Slo(1000), periodic=True)   # same model as a: already loaded
    s, ds = admit_all("microedge", cl, [a, b, c])
    assert [devices_of(d) for d in ds] == [["n1/t0"], ["n1/t1"], ["n1/t0"]]
    r = get("microedge").filter(App("d", "mobilenet_v1", 15, Slo(1000)), s, cl.devices["n1/t0"])
    assert (r.constraint, r.requested, r.used, r.capacity) == ("model-size", 4.21, 6.56, 6.9)


def test_dedicated_uses_ceil_units_tpus() -> None:
    # EfficientNet-Lite0: 69 ms at 15 FPS = 1.035 units -> 2 TPUs, each half the frames (MicroEdge §1)
    d = get("dedicated").decide(App("e", "efficientnet_lite0", 15, Slo(1000), periodic=True), Snapshot(six_tpus()))
    assert devices_of(d) == ["rpi0/tpu0", "rpi1/tpu0"] and [sh.weight for sh in d.shares] == [0.5, 0.5]
    g = Cluster((Node("n1", 4, 4096, (jetson("n1", "g0"), jetson("n1", "g1"))),))
    s, ds = admit_all("dedicated", g, [App(f"a{i}", "alexnet", 1, Slo(500)) for i in range(3)])
    assert [devices_of(x) for x in ds[:2]] == [["n1/g0"], ["n1/g1"]]
    assert isinstance(ds[2], Rejection) and ds[2].constraint == "occupied"
