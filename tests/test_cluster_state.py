"""cluster.state: values validate their invariants and name the field that breaks one."""

from __future__ import annotations

import pytest

from edgemux.cluster.state import App, Cluster, Device, Node, Placement, Share, Slo, StateError
from edgemux.cluster.workload import Discipline
from edgemux.profiles.types import DeviceKind


def tpu(node: str = "n1", name: str = "tpu0") -> Device:
    return Device(node, name, DeviceKind.EDGETPU, Discipline.FCFS, memory_mb=6.9)


def test_cluster_indexes_devices_by_path():
    c = Cluster((Node("n1", 4, 4096, (tpu(), tpu(name="tpu1"))), Node("n2", 2, 2048, (tpu("n2"),))))
    assert list(c.devices) == ["n1/tpu0", "n1/tpu1", "n2/tpu0"]
    assert c.node("n2").cpu_cores == 2
    with pytest.raises(StateError, match="unknown node 'n9'"):
        c.node("n9")


@pytest.mark.parametrize("make, field", [
    (lambda: Node("n1", 4, 4096, (tpu(), tpu())), "n1.devices"),
    (lambda: Node("n1", 4, 4096, (tpu("n2"),)), "n1.devices"),
    (lambda: Node("n1", 0, 4096), "n1.cpu_cores"),
    (lambda: Cluster((Node("n1", 1, 1), Node("n1", 1, 1))), "nodes"),
    (lambda: Device("n1", "a/b", DeviceKind.EDGETPU, Discipline.FCFS, 1.0), "device"),
    (lambda: Device("n1", "t", DeviceKind.EDGETPU, Discipline.FCFS, -1.0), "n1/t.memory_mb"),
    (lambda: Slo(-5), "slo.latency_ms"),
    (lambda: Slo(5, "p42"), "slo.stat"),
    (lambda: App("a", "m", -1.0, Slo(10)), "a.rate_rps"),
    (lambda: App("a", "m", 1.0, Slo(10), cpu_cores=1.0), "a.cpu"),
    (lambda: App("a", "m", float("nan"), Slo(10)), "a.rate_rps"),
    (lambda: Share("n1/tpu0", 1.5, "p"), "share.weight"),
    (lambda: Placement("a", ()), "a.shares"),
    (lambda: Placement("a", (Share("d", 0.5, "p"), Share("e", 0.4, "p"))), "a.shares"),
    (lambda: Placement("a", (Share("d", 0.5, "p"), Share("d", 0.5, "p"))), "a.shares"),
])
def test_invariants_name_the_field(make, field):
    with pytest.raises(StateError) as e:
        make()
    assert e.value.field == field


def test_app_defaults_and_acceptable_variants():
    a = App("cam", "ssd_mobilenet_v2", 15.0, Slo(66.7, "p99"), periodic=True)
    assert a.acceptable == ("ssd_mobilenet_v2",)
    b = App("cls", "resnet50", 5.0, Slo(100), variants=("resnet50", "resnet18"))
    assert b.acceptable == ("resnet50", "resnet18")
    p = Placement("cam", (Share("n1/tpu0", 0.6, "x"), Share("n1/tpu1", 0.4, "x")))
    assert sum(s.weight for s in p.shares) == pytest.approx(1.0)
