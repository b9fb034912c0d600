"""One app, one interface, whatever device serves it (``runtime.dataplane.interface``): a variant's tensors are
converted to and from the app's, an unconvertible pair is refused naming both, and an app moved between an
Edge TPU variant and a CPU variant keeps answering an unmodified tritonclient that sends the same bytes."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import pytest

from edgemux.cluster.state import Device, Node
from edgemux.cluster.workload import Discipline
from edgemux.profiles.types import DeviceKind
from edgemux.runtime.dataplane.agent import Agent, start_server
from edgemux.runtime.dataplane.backends import EmulatedBackend, ModelInfo, Quantization
from edgemux.runtime.dataplane.interface import Converter, Interface, InterfaceError
from edgemux.runtime.dataplane.preprocess import to_model_input
from edgemux.runtime.dataplane.protocol import TensorSpec
from support import put_json

TPU_IN = TensorSpec("input", "UINT8", (-1, 224, 224, 3))
CPU_IN = TensorSpec("input", "FP32", (-1, 3, 96, 96))
OUT = TensorSpec("output", "FP32", (-1, 1000))


def info(inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...],
         quant: tuple[tuple[str, Quantization], ...] = ()) -> ModelInfo:
    return ModelInfo("m", "test", False, "test", inputs, outputs, True, 1.0, 0.0, "test", quant)


def test_an_edge_tpu_interface_feeds_a_cpu_variant_as_the_client_would() -> None:
    conv = Converter(Interface((TPU_IN,), (OUT,)), info((CPU_IN,), (OUT,)))
    assert not conv.identity
    frame = np.random.default_rng(0).integers(0, 256, (1, 224, 224, 3), dtype=np.uint8)
    got = conv.inputs({"input": frame})["input"]
    want = to_model_input(frame[0], TensorSpec("input", "FP32", (1, 3, 96, 96)))  # what a client's pre-processing does
    assert got.dtype == np.float32 and got.shape == (1, 3, 96, 96)
    np.testing.assert_allclose(got, want, atol=1e-6)
    two = conv.inputs({"input": np.concatenate([frame, frame])})["input"]
    assert two.shape == (2, 3, 96, 96)
    scores = np.ones((1, 1000), np.float32)
    assert conv.outputs({"output": scores})["output"] is scores  # same tensor: passed as it is
    # and the other way: a CPU interface on an Edge TPU variant (pixels from [0, 1] floats)
    back = Converter(Interface((CPU_IN,), (OUT,)), info((TPU_IN,), (OUT,)))
    pixels = back.inputs({"input": np.full((1, 3, 96, 96), 0.5, np.float32)})["input"]
    assert pixels.dtype == np.uint8 and pixels.shape == (1, 224, 224, 3) and (pixels == 128).all()
    assert Converter(Interface((TPU_IN,), (OUT,)), info((TPU_IN,), (OUT,))).identity


def test_quantized_outputs_are_dequantized_and_quantized_with_each_sides_parameters() -> None:
    q8 = TensorSpec("output", "UINT8", (1, 1000))
    f32 = TensorSpec("output", "FP32", (1, 1000))
    conv = Converter(Interface((TPU_IN,), (f32,)), info((TPU_IN,), (q8,), (("output", Quantization(0.5, 10)),)))
    out = conv.outputs({"output": np.full((1, 1000), 14, np.uint8)})["output"]
    assert out.dtype == np.float32 and (out == 2.0).all()  # 0.5 * (14 - 10)
    requant = Converter(Interface((TPU_IN,), (q8,), (("output", Quantization(0.25, 0)),)), info((TPU_IN,), (f32,)))
    out = requant.outputs({"output": np.array([[1.0, 100.0] + [0.0] * 998], np.float32)})["output"]
    assert out.dtype == np.uint8 and out[0, :2].tolist() == [4, 255]  # clipped to the type's range


@pytest.mark.parametrize("mine, theirs, words", [
    ((TPU_IN,), (TensorSpec("input", "FP32", (-1, 1000)),), r"cannot be fed to the variant's 'input' FP32 \[-1,1000\]"),
    ((TensorSpec("input", "UINT8", (-1, 224, 224, 3)),), (TensorSpec("input", "FP32", (-1, 1, 96, 96)),),
     "cannot be fed"),  # 3 channels to 1
    ((TPU_IN, TensorSpec("extra", "FP32", (1,))), (CPU_IN,), "neither share their names nor their number"),
])
def test_an_input_that_cannot_be_converted_is_refused_naming_both(mine, theirs, words) -> None:
    with pytest.raises(InterfaceError, match=words):
        Converter(Interface(mine, (OUT,)), info(theirs, (OUT,)))


def test_outputs_of_another_shape_are_refused() -> None:
    with pytest.raises(InterfaceError, match=r"variant's output 'output' FP32 \[-1,1001\] cannot be answered as "
                                             r"the app's 'output' FP32 \[-1,1000\]"):
        Converter(Interface((TPU_IN,), (OUT,)), info((TPU_IN,), (TensorSpec("output", "FP32", (-1, 1001)),)))


@pytest.mark.parametrize("doc, words", [
    ([], "expected an object"),
    ({"inputs": [], "outputs": []}, "interface.inputs: expected a non-empty list"),
    ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}], "outputs": [{"name": "y", "datatype": "FP33",
                                                                                  "shape": [1]}]}, "FP33"),
    ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "shpae": 1}], "outputs": []}, "unknown field 'shpae'"),
    ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}], "outputs": [{"name": "y", "datatype": "UINT8",
      "shape": [1], "parameters": {"quantization": {"scale": 0}}}]}, "quantization"),
    ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}], "outputs": [{"name": "y", "datatype": "FP32",
      "shape": [1]}], "extra": 1}, "unknown field 'extra'"),
])
def test_a_malformed_interface_is_one_line_naming_the_field(doc: Any, words: str) -> None:
    with pytest.raises(InterfaceError, match=words):
        Interface.parse(doc)


def test_interface_round_trips_through_its_json() -> None:
    iface = Interface((TPU_IN,), (TensorSpec("output", "UINT8", (1, 1001)),), (("output", Quantization(0.25, 3)),))
    assert Interface.parse(json.loads(json.dumps(iface.as_dict()))) == iface


# ----------------------------------------------------------------------------------------------- a move


def test_an_app_moved_between_an_edge_tpu_and_a_cpu_variant_keeps_answering_the_same_bytes() -> None:
    """An unmodified tritonclient sends one UINT8 [1,224,224,3] request again and again while the app moves from
    an (emulated) Edge TPU variant to a real CPU variant that takes FP32 [1,3,96,96], and back: every answer is
    200 with the interface's FP32 [1,1000] output, and the metadata stays the app's."""
    import tritonclient.http as th
    from support import LoopThread

    devices = (Device("n1", "tpu0", DeviceKind.EDGETPU, Discipline.FCFS, 8.0, "ibis-edgetpu"),
               Device("n1", "cpu0", DeviceKind.CPU, Discipline.FCFS, 2048.0))
    agent = Agent(Node("n1", 2.0, 4096.0, devices), backends={"tpu0": EmulatedBackend(seed=0, sleep=lambda _s: None)})
    lt = LoopThread()
    server = lt.run(start_server(agent, "127.0.0.1", 0))
    tpu = {"device": "tpu0", "model": "zoo:mobilenet_v2@224", "profile": "ibis-edgetpu/mobilenet_v2"}
    cpu = {"device": "cpu0", "model": "zoo:mobilenet_v2@96"}
    url = f"{server.url}/v1/apps/classify"
    try:
        status, first = put_json(url, tpu)
        assert status == 201, first
        iface = {"inputs": first["inputs"], "outputs": first["outputs"]}  # inherited from the first variant
        assert [(t["datatype"], t["shape"]) for t in iface["inputs"]] == [("UINT8", [-1, 224, 224, 3])]
        x = np.random.default_rng(1).integers(0, 256, (1, 224, 224, 3), dtype=np.uint8)
        answers: list[tuple[int, str, tuple[int, ...]]] = []
        failures: list[str] = []
        stop = threading.Event()

        def send() -> None:
            tc = th.InferenceServerClient(server.url.removeprefix("http://"))
            try:
                inp = th.InferInput(iface["inputs"][0]["name"], list(x.shape), "UINT8")
                inp.set_data_from_numpy(x, binary_data=True)
                while not stop.is_set():
                    try:
                        res = tc.infer("classify", [inp])
                        out = res.as_numpy(iface["outputs"][0]["name"])
                        answers.append((200, str(out.dtype), tuple(out.shape)))
                    except Exception as e:  # noqa: BLE001 - every failure is the test's finding
                        failures.append(f"{type(e).__name__}: {e}")
            finally:
                tc.close()

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        try:
            for spec in (cpu, tpu, cpu):
                status, doc = put_json(url, {**spec, "interface": iface})
                assert status == 200, doc
                assert doc["device"] == spec["device"] and doc["interface"] == iface
                with urllib.request.urlopen(f"{server.url}/v2/models/classify", timeout=10) as r:
                    meta = json.loads(r.read())
                assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
                    (t["name"], t["datatype"], t["shape"]) for t in iface["inputs"]]
                # counted from the move's answer, on the new variant's device: the old variant's answers while
                # the new one loaded (seconds on a busy host) must not stand in for the new one's
                worker = agent.workers[spec["device"]]
                moved_at = worker.stats()["executions"]
                deadline = time.monotonic() + 120  # only so that a broken move fails instead of hanging
                while worker.stats()["executions"] < moved_at + 5 and not failures and time.monotonic() < deadline:
                    threading.Event().wait(0.05)
                assert worker.stats()["executions"] >= moved_at + 5, (spec, failures[:3])
        finally:
            stop.set()
            sender.join(60)
        assert not failures, failures[:3]
        assert len(answers) >= 15 and set(answers) == {(200, "float32", (1, 1000))}
        executed = {d: agent.workers[d].stats()["executions"] for d in ("tpu0", "cpu0")}
        assert executed["tpu0"] > 0 and executed["cpu0"] > 0, executed
        # an interface the variant cannot take: refused in one line, and the app stays where it was
        status, doc = put_json(url, {**tpu, "interface": {**iface, "outputs": [{"name": "output", "datatype": "FP32",
                                                                          "shape": [-1, 1001]}]}})
        assert status == 400 and "cannot be answered as the app's 'output' FP32 [-1,1001]" in doc["error"], doc
        assert [p.device for p in agent.pieces("classify")] == ["cpu0"]
    finally:
        lt.run(server.stop())
        agent.close(drain=False, timeout_s=5)
        lt.stop()


def test_a_request_that_picked_the_piece_an_app_just_left_is_served_by_its_new_one(monkeypatch) -> None:
    """Make before break within one agent: a request that picked the app's piece just before a re-PUT moved the
    app elsewhere (and released the old model) is served by the new piece, not answered 404."""
    import tritonclient.http as th
    from support import LoopThread

    devices = (Device("n1", "tpu0", DeviceKind.EDGETPU, Discipline.FCFS, 8.0, "ibis-edgetpu"),
               Device("n1", "tpu1", DeviceKind.EDGETPU, Discipline.FCFS, 8.0, "ibis-edgetpu"))
    agent = Agent(Node("n1", 2.0, 4096.0, devices), backends={d.name: EmulatedBackend(seed=0, sleep=lambda _s: None)
                                                              for d in devices})
    lt = LoopThread()
    server = lt.run(start_server(agent, "127.0.0.1", 0))
    spec = {"model": "zoo:mobilenet_v2@32", "profile": "ibis-edgetpu/mobilenet_v2"}
    try:
        assert put_json(f"{server.url}/v1/apps/cam", {"device": "tpu0", **spec})[0] == 201
        stale = agent.next_piece("cam")
        assert put_json(f"{server.url}/v1/apps/cam", {"device": "tpu1", **spec})[0] == 200  # tpu0's model released
        real_next = agent.next_piece
        handed = []

        def once_stale(app: str):  # the first pick is the one made before the move
            if not handed:
                handed.append(app)
                return stale
            return real_next(app)

        monkeypatch.setattr(agent, "next_piece", once_stale)
        tc = th.InferenceServerClient(server.url.removeprefix("http://"))
        try:
            t = stale.info.inputs[0]
            inp = th.InferInput(t.name, [1 if d < 1 else d for d in t.shape], t.datatype)
            inp.set_data_from_numpy(np.zeros([1 if d < 1 else d for d in t.shape], np.uint8), binary_data=True)
            res = tc.infer("cam", [inp])
        finally:
            tc.close()
        assert handed == ["cam"] and res.get_response()["parameters"]["edgemux_device"] == "n1/tpu1"
    finally:
        lt.run(server.stop())
        agent.close(drain=False, timeout_s=5)
        lt.stop()
