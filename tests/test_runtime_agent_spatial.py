"""An agent's spatial device: a piece's ``fraction`` and ``instances`` set up the app's instances on the
device worker, a re-PUT with other values re-shares them with overlap while requests keep being answered,
and the bad specs are refused with a message naming the field."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from edgemux.cluster.state import Device, Node
from edgemux.cluster.workload import Discipline
from edgemux.profiles.types import DeviceKind
from edgemux.runtime.dataplane.agent import Agent, AgentError
from edgemux.runtime.dataplane.backends import BackendError, EmulatedBackend
from edgemux.runtime.dataplane.messages import PieceReport
from edgemux.runtime.dataplane.protocol import DATATYPES

PROFILE = "dhakal-v100/mobilenet"    # 1.023 ms with the whole V100, 1.003 ms at 15 % (papers/002 line 88)
TPU_PROFILE = "ibis-edgetpu/mobilenet_v2"
MODEL = "zoo:mobilenet_v2@32"


@pytest.fixture
def agent():
    gpu = Device("n1", "gpu0", DeviceKind.GPU_DISCRETE, Discipline.SPATIAL, 16384.0, "dhakal-v100")
    tpu = Device("n1", "tpu0", DeviceKind.EDGETPU, Discipline.FCFS, 8.0, "ibis-edgetpu")
    a = Agent(Node("n1", 4.0, 4096.0, (gpu, tpu)),
              backends={"gpu0": EmulatedBackend(seed=0), "tpu0": EmulatedBackend(seed=1, sleep=lambda _s: None)})
    yield a
    a.close(drain=False, timeout_s=5)


def _spec(fraction: float, instances: int, **kw: object) -> dict[str, object]:
    return {"device": "gpu0", "model": MODEL, "profile": PROFILE, "fraction": fraction, "instances": instances,
            **kw}


def _infer(agent: Agent, app: str) -> str:
    route = agent.next_piece(app)
    spec = route.info.inputs[0]
    x = np.zeros([1 if d < 1 else d for d in spec.shape], DATATYPES[spec.datatype])
    return agent.submit(route, {spec.name: x}).result(10).device


def test_fraction_and_instances_set_up_and_reshare_the_instances(agent: Agent) -> None:
    route, created = agent.register_app("cam", _spec(0.25, 2))
    assert created and (route.fraction, route.instances) == (0.25, 2)
    worker = agent.workers["gpu0"]
    assert {k: worker.spatial_config()["cam"][k] for k in ("share", "instances")} == {"share": 0.25, "instances": 2}
    # what the agent reports carries them, so the control plane can tell a re-shared piece from the old one
    report = PieceReport.from_json(route.as_dict("n1"))
    assert (report.fraction, report.instances) == (0.25, 2)
    assert _infer(agent, "cam") == "n1/gpu0"

    # re-share under load: every request sent meanwhile is answered
    answers, errors, stop = [], [], threading.Event()

    def send() -> None:
        while not stop.is_set():
            try:
                answers.append(_infer(agent, "cam"))
            except Exception as e:  # pragma: no cover - the assertion below reports it
                errors.append(e)

    t = threading.Thread(target=send)
    t.start()
    try:
        route, created = agent.register_app("cam", _spec(0.5, 1))
    finally:
        stop.set()
        t.join(10)
    assert not created and (route.fraction, route.instances) == (0.5, 1)
    assert {k: worker.spatial_config()["cam"][k] for k in ("share", "instances")} == {"share": 0.5, "instances": 1}
    assert answers and not errors
    agent.unregister_app("cam")
    assert "cam" not in worker.spatial_config()


def test_shares_beyond_the_device_are_refused_and_change_nothing(agent: Agent) -> None:
    agent.register_app("a", _spec(0.5, 1))
    with pytest.raises((AgentError, BackendError), match=r"hold 1.25 of the device"):
        agent.register_app("b", _spec(0.25, 3))
    assert "b" not in agent.workers["gpu0"].spatial_config()
    with pytest.raises((AgentError, BackendError), match=r"hold"):
        agent.register_app("a", _spec(0.5, 3))   # a re-share that does not fit keeps what a had
    assert agent.workers["gpu0"].spatial_config()["a"]["instances"] == 1
    assert _infer(agent, "a") == "n1/gpu0"


@pytest.mark.parametrize("field, value, needle", [
    ("fraction", 0.0, "'fraction' must be a number in (0, 1]"),
    ("fraction", 1.5, "'fraction' must be a number in (0, 1]"),
    ("fraction", "half", "'fraction' must be a number in (0, 1]"),
    ("instances", 0, "'instances' must be an integer >= 1"),
    ("instances", 1.5, "'instances' must be an integer >= 1"),
    ("instances", True, "'instances' must be an integer >= 1"),
])
def test_bad_fraction_or_instances(agent: Agent, field: str, value: object, needle: str) -> None:
    with pytest.raises(AgentError, match=None) as e:
        agent.register_app("cam", {**_spec(0.5, 1), field: value})
    assert needle in e.value.message and e.value.status == 400


def test_fraction_on_a_device_that_is_not_spatial(agent: Agent) -> None:
    with pytest.raises(AgentError) as e:
        agent.register_app("cam", {"device": "tpu0", "model": MODEL, "profile": TPU_PROFILE, "fraction": 0.5})
    assert "apply to spatial devices" in e.value.message and "fcfs" in e.value.message
