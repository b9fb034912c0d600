"""profiles.power: the testbed of Kim et al. read from power.yaml (laws derived as the module says, every card
with its sources), the linear utilization power model, and a broken file refused with the entry named."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from edgemux.perf.energy import utilization_power_w
from edgemux.profiles import power
from edgemux.profiles.power import FALLBACK_NODE_TYPE, PowerDataError, edge_node, kim_testbed, node_wake_s


def test_laws_are_derived_as_documented() -> None:
    _, cards, _ = kim_testbed()
    by = {c.name: c for c in cards}
    # GeForce: the measured shape T(1) = 2.38, T(32) = 8.82 ms scaled to T(1) = 3.35 ms
    a, b = (8.82 - 2.38) / 31, 2.38 - (8.82 - 2.38) / 31
    k = 3.35 / 2.38
    assert by["rtx3080"].alpha_ms == pytest.approx(k * a) and by["rtx3080"].beta_ms == pytest.approx(k * b)
    assert by["rtx3080"].alpha_ms + by["rtx3080"].beta_ms == pytest.approx(3.35)
    # the 2080 Super at the assumed 0.6 of the 3080's speed, overridable
    assert by["rtx2080super"].alpha_ms + by["rtx2080super"].beta_ms == pytest.approx(3.35 / 0.6)
    slower = {c.name: c for c in kim_testbed(speed={"rtx2080super": 0.45})[1]}
    assert slower["rtx2080super"].alpha_ms + slower["rtx2080super"].beta_ms == pytest.approx(3.35 / 0.45)
    # FPGA: alpha = 1000 / 561.3 req/s, beta = 2.13 ms - alpha
    assert by["alveo_u200"].alpha_ms == pytest.approx(1000 / 561.3)
    assert by["alveo_u200"].beta_ms == pytest.approx(2.13 - 1000 / 561.3)
    assert by["rtx3080"].slowdown == {1: 1.0, 2: 1.131} and by["alveo_u200"].slowdown == {1: 1.0}
    assert all(any("source" in key for key in c.sources) for c in cards)


def test_utilization_power() -> None:
    assert utilization_power_w(17.0, 320.0, 0.0) == 17.0
    assert utilization_power_w(17.0, 320.0, 1.0) == 320.0
    assert utilization_power_w(20.0, 120.0, 0.25) == pytest.approx(45.0)
    with pytest.raises(ValueError, match="need 0 <= idle <= max power"):
        utilization_power_w(50.0, 20.0, 0.5)
    with pytest.raises(ValueError, match=r"utilization must be in \[0, 1\]"):
        utilization_power_w(5.0, 20.0, 1.5)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d["kim_testbed"]["accelerators"][0].update(max_w=-320), r"kim_testbed.rtx3080.max_w: expected a finite "
                                                                          r"number > 0, got -320"),
    (lambda d: d["kim_testbed"]["accelerators"][0].pop("idle_w"), r"kim_testbed.rtx3080: missing 'idle_w'"),
    (lambda d: d["kim_testbed"]["accelerators"][2].update(kind="asic"), r"kim_testbed.alveo_u200.kind: expected gpu "
                                                                           r"or fpga, got 'asic'"),
    (lambda d: d["kim_testbed"]["accelerators"][1].update(count=0), r"kim_testbed.rtx2080super.count: expected an "
                                                                       r"integer >= 1, got 0"),
    (lambda d: d["kim_testbed"]["gpu_batch_law"].update(batch32_ms=1.0), r"batch 32 \(1.0 ms\) must take longer"),
])
def test_a_broken_file_is_refused_naming_the_entry(monkeypatch: pytest.MonkeyPatch, edit: Any, message: str) -> None:
    data = copy.deepcopy(power._raw())
    edit(data)
    monkeypatch.setattr(power, "_raw", lambda: data)
    with pytest.raises(PowerDataError, match=message):
        kim_testbed()


def test_edge_node_figures() -> None:
    from edgemux.cluster.power import NodePower
    from edgemux.profiles.power import edge_node

    tpu = edge_node("edgetpu-rpi4")
    assert tpu.idle_w == pytest.approx(1.9) and tpu.dynamic_w == pytest.approx(1.7) and tpu.wake_s == 60.0
    assert all(k in tpu.sources for k in ("host_idle_source", "device_active_source", "wake_source"))
    NodePower("n0", tpu.idle_w, {"n0/tpu0": tpu.dynamic_w}, tpu.wake_s, tpu.off_w)  # valid as a node's power
    with pytest.raises(PowerDataError, match=r"unknown edge node type 'pi5' \(known: edgetpu-rpi4, jetson-nano\)"):
        edge_node("pi5")


def test_a_bad_edge_node_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from edgemux.profiles.power import edge_node

    data = copy.deepcopy(power._raw())
    data["edge_nodes"]["edgetpu-rpi4"]["wake_s"] = -1.0
    monkeypatch.setattr(power, "_raw", lambda: data)
    with pytest.raises(PowerDataError, match=r"edge_nodes.edgetpu-rpi4.wake_s: expected a finite number >= 0, got -1.0"):
        edge_node("edgetpu-rpi4")
    data["edge_nodes"]["edgetpu-rpi4"]["wake_s"] = 60.0
    data["edge_nodes"]["edgetpu-rpi4"]["device_active_w"] = 0.1
    with pytest.raises(PowerDataError, match=r"device_active_w \(0.1 W\) is below device_idle_w \(0.3 W\)"):
        edge_node("edgetpu-rpi4")


def test_a_nodes_wake_up_time_comes_from_its_device_kinds() -> None:
    tpu = edge_node("edgetpu-rpi4")
    assert node_wake_s(["edgetpu", "cpu"]) == (tpu.wake_s, f"power.yaml edge_nodes.edgetpu-rpi4.wake_s "
                                                           f"({tpu.sources['wake_source']})")
    w, src = node_wake_s(["gpu-embedded"])
    assert w == edge_node("jetson-nano").wake_s and src.startswith("power.yaml edge_nodes.jetson-nano.wake_s")
    # no kind with a node type of its own: the fallback's figure, and the source says it was taken
    w, src = node_wake_s(["gpu-discrete", "cpu"])
    assert w == edge_node(FALLBACK_NODE_TYPE).wake_s and "taken for a node with no figure of its own" in src
    assert node_wake_s([])[0] == w
