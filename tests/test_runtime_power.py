"""Device power on the running agent: an emulated Edge TPU reports its modelled power and energy (per device
and per app, Prometheus and GET /v1/node), refuses to be switched off while it holds a model, refuses work
while it is off (503, nothing lost: the request is refused, not dropped), and serves again when switched on.
A device kind without power figures (the real CPU) reports none. Bad power specs are 4xx with a reason. The
control plane's driver switches a real agent's device as consolidation does."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from edgemux.cluster.state import Device
from edgemux.cluster.workload import Discipline
from edgemux.profiles.catalog import load_catalog
from edgemux.profiles.power import device_power, edge_node
from edgemux.profiles.types import DeviceKind
from edgemux.runtime.controlplane.agentdriver import AgentCallError, HttpAgentDriver
from edgemux.runtime.dataplane.agent import Agent
from edgemux.runtime.dataplane.backends import BackendError, ModelSource, make_backend
from edgemux.runtime.dataplane.worker import DeviceOff, DeviceWorker
from test_runtime_agent import TPU_MODEL, TPU_PROFILE, Served, _infer_binary, _metrics, _node, _tpu_x


def test_modelled_device_power_by_hand() -> None:
    tpu = device_power("edgetpu")
    spec = edge_node("edgetpu-rpi4")
    assert tpu is not None and (tpu.idle_w, tpu.active_w) == (spec.device_idle_w, spec.device_active_w)
    assert tpu.at(0.0) == 0.3 and tpu.at(1.0) == 2.0 and tpu.at(0.5) == pytest.approx(1.15)
    gpu, fpga = device_power("gpu-discrete"), device_power("fpga")
    assert gpu is not None and (gpu.idle_w, gpu.active_w) == (17.0, 320.0)  # the RTX 3080's figures
    assert fpga is not None and (fpga.idle_w, fpga.active_w) == (17.0, 225.0)  # the Alveo U200's
    assert device_power("cpu") is None


def test_a_worker_meters_energy_and_refuses_work_while_off(tmp_path: Path) -> None:
    clock = [0.0]
    backend = make_backend("emulated", seed=1, sleep=lambda s: clock.__setitem__(0, clock[0] + s),
                           timer=lambda: clock[0])
    dev = Device("n1", "tpu0", DeviceKind.EDGETPU, Discipline.FCFS, 8.0, "ibis-edgetpu")
    with DeviceWorker(dev, backend, clock=lambda: clock[0], sleep=lambda s: clock.__setitem__(0, clock[0] + s)) as w:
        st = w.stats()
        assert st["power_state"] == "on" and st["energy_j"] == 0.0 and st["power_w"] == pytest.approx(0.3)
        clock[0] = 100.0
        assert w.stats()["energy_j"] == pytest.approx(0.3 * 100.0)  # idle on for 100 s
        assert w.set_power("off") == "off"
        clock[0] = 200.0
        st = w.stats()
        assert st["power_w"] == 0.0 and st["energy_j"] == pytest.approx(30.0)  # nothing drawn while off
        with pytest.raises(DeviceOff, match="device n1/tpu0 is switched off") as e:
            w.submit("a", "m", {})
        assert e.value.status == 503 and w.stats()["apps"]["a"]["rejected"] == 1
        assert w.set_power("on") == "on"
        clock[0] = 250.0
        assert w.stats()["energy_j"] == pytest.approx(30.0 + 0.3 * 50.0)
        backend.load("m", ModelSource(zoo="mobilenet_v2", input_size=32, cache_dir=str(tmp_path),
                                      profile=load_catalog().get(TPU_PROFILE)))
        with pytest.raises(BackendError, match="device n1/tpu0 still holds models m: move its tenants off") as e:
            w.set_power("off")
        assert e.value.status == 409 and w.stats()["power_state"] == "on"
        with pytest.raises(BackendError, match="power state must be 'on' or 'off', got 'sleep'"):
            w.set_power("sleep")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Any:
    s = Served(Agent(_node(), cache_dir=str(tmp_path_factory.mktemp("zoo"))))
    yield s
    s.stop()


def test_the_agent_reports_power_and_switches_devices(served: Served) -> None:
    status, body = served.json("PUT", "/v1/apps/cam", {"device": "tpu0", "model": TPU_MODEL, "profile": TPU_PROFILE})
    assert status == 201, body
    body_b, hdrs = _infer_binary(_tpu_x(1))
    for _ in range(3):
        assert served.call("POST", "/v2/models/cam/infer", body_b, hdrs)[0] == 200
    m = _metrics(served.call("GET", "/metrics")[2].decode())
    assert 0.3 <= m[("edgemux_device_power_watts", (("device", "n1/tpu0"), ("state", "on")))] <= 2.0
    assert m[("edgemux_device_energy_joules_total", (("device", "n1/tpu0"),))] > 0
    assert m[("edgemux_app_energy_joules_total", (("app", "cam"), ("device", "n1/tpu0")))] > 0
    assert not any(k[0] == "edgemux_device_power_watts" and ("device", "n1/cpu0") in k[1] for k in m)
    status, node = served.json("GET", "/v1/node")
    tpu = next(d for d in node["devices"] if d["name"] == "tpu0")
    cpu = next(d for d in node["devices"] if d["name"] == "cpu0")
    assert tpu["power_state"] == "on" and tpu["energy_j"] > 0 and "cam" in tpu["app_energy_j"]
    assert cpu["power_state"] == "on" and "power_w" not in cpu
    # holding the app's model: refused, with the reason
    status, err = served.json("PUT", "/v1/devices/tpu0/power", {"state": "off"})
    assert status == 409 and "still holds models" in err["error"]
    assert served.json("DELETE", "/v1/apps/cam")[0] == 200
    status, body = served.json("PUT", "/v1/devices/tpu0/power", {"state": "off"})
    assert status == 200 and body == {"device": "tpu0", "path": "n1/tpu0", "state": "off"}
    m = _metrics(served.call("GET", "/metrics")[2].decode())
    assert m[("edgemux_device_power_watts", (("device", "n1/tpu0"), ("state", "off")))] == 0.0
    # nothing is placed on a switched-off device
    status, err = served.json("PUT", "/v1/apps/cam", {"device": "tpu0", "model": TPU_MODEL, "profile": TPU_PROFILE})
    assert status == 409 and "device n1/tpu0 is switched off: switch it on" in err["error"]
    assert served.json("PUT", "/v1/devices/tpu0/power", {"state": "on"}) == (200, {"device": "tpu0",
                                                                                  "path": "n1/tpu0", "state": "on"})


@pytest.mark.parametrize(("path", "body", "status", "words"), [
    ("/v1/devices/gpu9/power", {"state": "off"}, 404, "node n1 has no device 'gpu9' (it has cpu0, tpu0)"),
    ("/v1/devices/tpu0/power", {"state": "asleep"}, 400, "power state must be 'on' or 'off', got 'asleep'"),
    ("/v1/devices/tpu0/power", {"state": "off", "now": True}, 400, 'a power spec is {"state": "on"}'),
    ("/v1/devices/tpu0/power", ["off"], 400, 'a power spec is {"state": "on"}'),
    ("/v1/devices/tpu0/power", "{", 400, "power spec"),
])
def test_bad_power_requests(served: Served, path: str, body: Any, status: int, words: str) -> None:
    got, err = served.json("PUT", path, body)
    assert got == status and words in err["error"], err


def test_the_control_planes_driver_switches_a_real_agents_device(served: Served) -> None:
    """``HttpAgentDriver.set_power``, the call consolidation makes, against the agent's real endpoint: refused
    (409, with the agent's reason) while the device holds a model, done once it holds none."""
    assert served.json("PUT", "/v1/apps/cam", {"device": "tpu0", "model": TPU_MODEL,
                                               "profile": TPU_PROFILE})[0] in (200, 201)
    url = served.server.url

    async def switch(state: str) -> str | None:
        driver = HttpAgentDriver(10.0)
        await driver.start()
        try:
            await driver.set_power(url, "tpu0", state)
        except AgentCallError as e:
            return f"{e.status} {e.message}"
        finally:
            await driver.close()
        return None

    refused = asyncio.run(switch("off"))
    assert refused is not None and refused.startswith("409 PUT ") and "still holds models" in refused
    assert served.json("DELETE", "/v1/apps/cam")[0] == 200
    assert asyncio.run(switch("off")) is None
    status, node = served.json("GET", "/v1/node")
    assert next(d for d in node["devices"] if d["name"] == "tpu0")["power_state"] == "off"
    assert asyncio.run(switch("on")) is None
