"""An app split over several devices of one agent (pieces): routing by weight, one metadata, replacing
and removing pieces make-before-break, and the errors of bad piece specs."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from edgemux.cluster.state import Device, Node
from edgemux.cluster.workload import Discipline
from edgemux.profiles.types import DeviceKind
from edgemux.runtime.dataplane.agent import Agent, AgentError
from edgemux.runtime.dataplane.backends import EmulatedBackend
from edgemux.runtime.dataplane.protocol import DATATYPES

PROFILE = "ibis-edgetpu/mobilenet_v2"
MODEL = "zoo:mobilenet_v2@32"


def _agent() -> Agent:
    devices = tuple(Device("n1", f"tpu{i}", DeviceKind.EDGETPU, Discipline.FCFS, 8.0, "ibis-edgetpu")
                    for i in range(3))
    node = Node("n1", 4.0, 4096.0, devices)
    # no sleeping: the emulated timing is not what these tests look at
    return Agent(node, backends={d.name: EmulatedBackend(seed=i, sleep=lambda _s: None)
                                 for i, d in enumerate(devices)})


def _piece(device: str, weight: float, model: str = MODEL, profile: str = PROFILE) -> dict[str, object]:
    return {"device": device, "model": model, "profile": profile, "weight": weight}


@pytest.fixture
def agent():
    a = _agent()
    yield a
    a.close(drain=False, timeout_s=5)


def test_requests_follow_the_pieces_weights(agent: Agent) -> None:
    first, created = agent.register_app("cam", {"pieces": [_piece("tpu0", 0.75), _piece("tpu1", 0.25)]})
    assert created and first.device == "tpu0"
    assert [r.device for r in agent.pieces("cam")] == ["tpu0", "tpu1"]
    picks = Counter(agent.next_piece("cam").device for _ in range(400))
    assert picks == {"tpu0": 300, "tpu1": 100}  # smooth WRR is exact over whole cycles
    # interleaved, not in runs: no more than 3 tpu0 in a row at 3:1
    seq = "".join(agent.next_piece("cam").device[-1] for _ in range(40))
    assert "0000" not in seq
    x = np.zeros([1 if d < 1 else d for d in first.info.inputs[0].shape], DATATYPES[first.info.inputs[0].datatype])
    devices = Counter(agent.submit(agent.next_piece("cam"), {first.info.inputs[0].name: x}).result(10).device
                      for _ in range(8))
    assert devices == {"n1/tpu0": 6, "n1/tpu1": 2}


def test_a_split_app_reports_every_piece_and_one_metadata(agent: Agent) -> None:
    agent.register_app("cam", {"pieces": [_piece("tpu0", 0.5), _piece("tpu2", 0.25)]})
    d = agent.app_dict("cam")
    assert d["weight"] == pytest.approx(0.75)
    assert [p["device"] for p in d["pieces"]] == ["tpu0", "tpu2"]
    assert d["inputs"] == d["pieces"][0]["inputs"]
    assert [(r.app, r.device) for r in agent.registration().pieces] == [("cam", "tpu0"), ("cam", "tpu2")]
    json.dumps(d)  # plain values


def test_replacing_pieces_keeps_shared_models_and_releases_dropped_ones(agent: Agent) -> None:
    agent.register_app("cam", {"pieces": [_piece("tpu0", 0.5), _piece("tpu1", 0.5)]})
    _, created = agent.register_app("cam", {"pieces": [_piece("tpu1", 0.4), _piece("tpu2", 0.6)]})
    assert not created
    assert [(r.device, r.weight) for r in agent.pieces("cam")] == [("tpu1", 0.4), ("tpu2", 0.6)]
    assert agent.backends["tpu0"].loaded() == {}
    assert len(agent.backends["tpu1"].loaded()) == 1 and len(agent.backends["tpu2"].loaded()) == 1
    # the single form is one piece: the app moves to that device alone
    agent.register_app("cam", _piece("tpu2", 1.0))
    assert [r.device for r in agent.pieces("cam")] == ["tpu2"]
    assert agent.backends["tpu1"].loaded() == {}
    out = agent.unregister_app("cam")
    assert out["device"] == "tpu2" and out["unloaded"] is True


def test_unregistering_a_split_app_unloads_every_piece(agent: Agent) -> None:
    agent.register_app("cam", {"pieces": [_piece("tpu0", 0.5), _piece("tpu1", 0.5)]})
    out = agent.unregister_app("cam")
    assert [p["device"] for p in out["pieces"]] == ["tpu0", "tpu1"]
    assert all(p["unloaded"] for p in out["pieces"])
    with pytest.raises(AgentError) as e:
        agent.pieces("cam")
    assert e.value.status == 404


@pytest.mark.parametrize("spec, words", [
    ({"pieces": []}, "non-empty list"),
    ({"pieces": "tpu0"}, "non-empty list"),
    ({"pieces": [_piece("tpu0", 0.5)], "device": "tpu1"}, "beside 'pieces'"),
    ({"pieces": [_piece("tpu0", 0.5), _piece("tpu0", 0.5)]}, "two pieces on device tpu0"),
    ({"pieces": [_piece("tpu0", 0.5), 3]}, "pieces[1]: a piece must be a JSON object"),
    ({"pieces": [_piece("tpu0", 0.5), _piece("tpu9", 0.5)]}, "unknown device 'tpu9'"),
    ({"pieces": [_piece("tpu0", 0.5), _piece("tpu1", 1.5)]}, "pieces[1]: 'weight' must be a number in (0, 1]"),
    ({"pieces": [_piece("tpu0", 0.5), _piece("tpu1", 0.5, model="zoo:mobilenet_v2@64")]},
     "serve different tensors"),
])
def test_bad_piece_specs_are_refused_and_change_nothing(agent: Agent, spec: dict[str, object], words: str) -> None:
    agent.register_app("cam", _piece("tpu2", 1.0))
    before = {d: dict(b.loaded()) for d, b in agent.backends.items()}
    with pytest.raises(AgentError) as e:
        agent.register_app("cam", spec)
    assert words in e.value.message
    assert 400 <= e.value.status < 500
    assert [r.device for r in agent.pieces("cam")] == ["tpu2"]
    assert {d: dict(b.loaded()) for d, b in agent.backends.items()} == before


def test_over_http_a_split_app_is_one_model_served_by_both_devices() -> None:
    import urllib.request

    from support import LoopThread

    from edgemux.runtime.dataplane.agent import start_server
    from edgemux.runtime.ingress.client import AppRoute, Client

    a = _agent()
    lt = LoopThread()
    server = lt.run(start_server(a, "127.0.0.1", 0))
    try:
        req = urllib.request.Request(f"{server.url}/v1/apps/cam", method="PUT",
                                     data=json.dumps({"pieces": [_piece("tpu0", 0.5), _piece("tpu1", 0.5)]}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.status == 201
        with urllib.request.urlopen(f"{server.url}/v1/apps/cam", timeout=10) as r:
            assert [p["device"] for p in json.loads(r.read())["pieces"]] == ["tpu0", "tpu1"]
        with urllib.request.urlopen(f"{server.url}/v2/models/cam/ready", timeout=10) as r:
            assert r.status == 200
        spec = a.pieces("cam")[0].info.inputs[0]
        x = np.zeros([1 if d < 1 else d for d in spec.shape], DATATYPES[spec.datatype])
        c = Client(AppRoute("cam", "cam", {server.url: 1.0}, rate_rps=1e6, burst=1e6), timeout_s=30)
        try:
            for _ in range(6):
                c.infer("cam", {spec.name: x})
        finally:
            c.close()
        assert [a.workers[d].stats()["executions"] for d in ("tpu0", "tpu1", "tpu2")] == [3, 3, 0]
    finally:
        lt.run(server.stop())
        lt.stop()
