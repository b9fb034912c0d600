"""Policy interface: snapshot aggregates, rejections as data, registry, purity."""

from __future__ import annotations

import pytest

from edgemux.cluster.state import App, Cluster, Device, Node, Placement, Share, Slo
from edgemux.cluster.workload import ArrivalKind, Discipline
from edgemux.errors import UnknownNameError
from edgemux.policies import Rejection, Snapshot, get, names
from edgemux.policies.base import Policy
from edgemux.policies.registry import register
from edgemux.profiles.types import DeviceKind


def tpu(node: str, name: str, mem: float = 8.0, ps: str = "ibis-edgetpu") -> Device:
    return Device(node, name, DeviceKind.EDGETPU, Discipline.FCFS, mem, profile_set=ps)


def test_registry_names_and_unknown() -> None:
    assert {"knapsack", "dedicated", "ibis", "microedge", "edgemux"} <= set(names())
    with pytest.raises(UnknownNameError) as e:
        get("no-such-policy")
    assert "no-such-policy" in str(e.value) and "ibis" in str(e.value)
    assert get("ibis", choice="spread").choice == "spread"


def test_register_twice_is_refused() -> None:
    with pytest.raises(ValueError):
        @register("knapsack")
        class Other(Policy):  # noqa: F841
            def filter(self, app, snapshot, device):  # type: ignore[no-untyped-def]
                return None


def test_snapshot_tenants_and_aggregates() -> None:
    cl = Cluster((Node("n1", 4, 4096, (tpu("n1", "t0"), tpu("n1", "t1"))),))
    apps = {
        "a": App("a", "mobilenet_v2", 10, Slo(50), cpu_cores=1, cpu_ms=2, memory_mb=100),
        "b": App("b", "mobilenet_v2", 30, Slo(50), shared=True, periodic=True),
        "c": App("c", "mobilenet_v2", 20, Slo(50), shared=True),
    }
    p = "ibis-edgetpu/mobilenet_v2"
    placements = {
        "a": Placement("a", (Share("n1/t0", 1.0, p),), cpu_node="n1"),
        "b": Placement("b", (Share("n1/t0", 0.5, p), Share("n1/t1", 0.5, p)), cpu_node="n1"),
        "c": Placement("c", (Share("n1/t0", 1.0, p),), cpu_node="n1"),
    }
    s = Snapshot(cl, apps, placements)
    ts = {t.name: t for t in s.tenants("n1/t0")}
    assert set(ts) == {"a", "b", "c"}
    assert ts["b"].rate_rps == pytest.approx(15.0) and ts["b"].arrival.kind is ArrivalKind.PERIODIC
    assert ts["b"].model == ts["c"].model != ts["a"].model      # shared apps: one copy, no switch between them
    assert ts["a"].cpu is not None and ts["a"].cpu.cores == 1 and ts["a"].cpu.service.mean == 2
    assert ts["a"].service.mean == pytest.approx(4.91) and ts["a"].switch_ms == pytest.approx(10.43)
    load = s.load("n1/t0")
    assert len(load.models) == 2 and load.memory_used_mb == pytest.approx(2 * 3.75)
    assert load.units_used == pytest.approx(4.91 * (10 + 15 + 20) / 1000)
    assert s.node_loads["n1"].cpu_used == 1 and s.node_loads["n1"].memory_used_mb == 100
    # incremental update equals a fresh build; removal frees the share and the copy
    d = App("d", "mobilenet_v1", 5, Slo(50))
    pl = Placement("d", (Share("n1/t1", 1.0, "ibis-edgetpu/mobilenet_v1"),), cpu_node="n1")
    inc = s.with_placement(d, pl)
    fresh = Snapshot(cl, inc.apps, inc.placements)
    assert inc.device_loads == fresh.device_loads and inc.node_loads == fresh.node_loads
    gone = inc.without("b").without("c")
    assert gone.load("n1/t0").apps == ("a",) and gone.load("n1/t0").memory_used_mb == pytest.approx(3.75)


def test_rejection_message_is_one_line() -> None:
    r = Rejection("x", "slo", device="n1/t0", tenant="a", predicted_ms=24.4, slo_ms=12, stat="mean")
    # the constraint first, then the tenant that would break with its prediction against its SLO
    assert r.message == "app 'x' rejected: slo: a would see mean 24.4 ms > 12 ms on n1/t0"
    r = Rejection("x", "cpu", device="n1/t0", node="n1", requested=3, used=2, capacity=4, unit="cores")
    assert "\n" not in r.message and r.message == "app 'x' rejected: cpu: 3 cores needed > 2 cores free on node n1"
    # a value just over its limit is printed with the digits that show it
    r = Rejection("x", "slo", device="n1/t0", tenant="a", predicted_ms=50.04, slo_ms=50, stat="p95")
    assert "would see p95 50.04 ms > 50 ms" in r.message


@pytest.mark.parametrize("name", ["knapsack", "dedicated", "ibis", "microedge", "edgemux"])
def test_same_input_same_decision(name: str) -> None:
    cl = Cluster((Node("n1", 4, 4096, tuple(tpu("n1", f"t{i}") for i in range(3))),))
    apps = [App(f"a{i}", m, r, Slo(80)) for i, (m, r) in
            enumerate([("mobilenet_v2", 20), ("mobilenet_v1", 10), ("mobilenet_v2", 30), ("efficientnet-S", 5)])]

    def run() -> list[object]:
        s = Snapshot(cl)
        out = []
        for a in apps:
            d = get(name).decide(a, s)
            out.append(d)
            if isinstance(d, Placement):
                s = s.with_placement(a, d)
        return out

    assert run() == run()


def test_duplicate_app_is_rejected() -> None:
    cl = Cluster((Node("n1", 4, 4096, (tpu("n1", "t0"),)),))
    a = App("a", "mobilenet_v2", 10, Slo(50))
    s = Snapshot(cl)
    s = s.with_placement(a, get("knapsack").decide(a, s))
    for name in ("knapsack", "dedicated", "ibis", "microedge", "edgemux"):
        r = get(name).decide(a, s)
        assert isinstance(r, Rejection) and r.constraint == "duplicate"
