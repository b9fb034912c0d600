"""TFLite models on LiteRT (``runtime.dataplane.litert``): real Coral models run on the CPU through the
backend, the agent and an unmodified tritonclient with LiteRT's own outputs; an Edge TPU build serves on an
emulated Edge TPU with the signature read from its file; a model compiled for the Edge TPU on a CPU, a broken
model and a missing libedgetpu each give one clear error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ai_edge_litert")

from ai_edge_litert.interpreter import Interpreter  # noqa: E402

from edgemux.cluster.state import Device, Node  # noqa: E402
from edgemux.cluster.workload import Discipline  # noqa: E402
from edgemux.profiles.types import DeviceKind  # noqa: E402
from edgemux.runtime.dataplane import litert  # noqa: E402
from edgemux.runtime.dataplane.agent import Agent, start_server  # noqa: E402
from edgemux.runtime.dataplane.backends import (  # noqa: E402
    BackendError,
    EmulatedBackend,
    FormatBackend,
    ModelSource,
    OnnxRuntimeBackend,
    Quantization,
    make_backend,
)
from edgemux.runtime.dataplane.devices import default_backend  # noqa: E402
from edgemux.runtime.dataplane.instances import cpu_cores, threads_for  # noqa: E402
from edgemux.profiles.catalog import load_catalog  # noqa: E402

from support import put_json  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "examples" / "models" / "coral"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "models" / "coral"
SMALL = DATA / "mobilenet_v1_0.25_128_quant.tflite"
SMALL_TPU = DATA / "mobilenet_v1_0.25_128_quant_edgetpu.tflite"


def shared(name: str) -> Path:
    """A model of ../shared/models/coral (CI has ../shared beside the checkout); skipped where it is absent."""
    path = SHARED / name
    if not path.is_file():
        pytest.skip(f"{path} is not here (../shared beside the checkout)")
    return path


def own_run(path: Path, x: np.ndarray) -> list[np.ndarray]:
    """LiteRT's own run of ``path`` on ``x``: the reference every answer is compared with."""
    it = Interpreter(model_path=str(path), num_threads=1)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return [np.array(it.get_tensor(d["index"])) for d in it.get_output_details()]


def image(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)


# ------------------------------------------------------------------------------------------- backend


def test_the_signature_is_read_from_the_file_with_its_quantization() -> None:
    inputs, outputs, quant = litert.signature(ModelSource(path=str(SMALL)))
    assert [(s.name, s.datatype, s.shape) for s in inputs] == [("input", "UINT8", (1, 128, 128, 3))]
    assert [(s.name, s.datatype, s.shape) for s in outputs] == [("MobilenetV1/Predictions/Reshape_1", "UINT8", (1, 1001))]
    assert quant == {"input": Quantization(0.0078125, 128),
                     "MobilenetV1/Predictions/Reshape_1": Quantization(0.00390625, 0)}
    # the Edge TPU build: same signature, read on a host without libedgetpu
    assert litert.signature(ModelSource(path=str(SMALL_TPU)))[:2] == (inputs, outputs)
    assert litert.compiled_for_edgetpu(SMALL_TPU) and not litert.compiled_for_edgetpu(SMALL)


@pytest.mark.parametrize("name", ["mobilenet_v1_0.25_128_quant.tflite", "movenet_single_pose_lightning_ptq.tflite",
                                  "mobilenet_v2_1.0_224_quant.tflite"])
def test_real_models_run_on_the_cpu_as_litert_runs_them(name: str) -> None:
    path = SMALL if name == SMALL.name else shared(name)
    backend = make_backend("litert", threads=1)
    info = backend.load("m", ModelSource(path=str(path)))
    assert info.backend == "litert" and not info.emulated and "LiteRT (CPU, 1 threads)" in info.provenance
    spec = info.inputs[0]
    x = image(spec.shape, seed=3)
    got = backend.run("m", {spec.name: x})
    want = own_run(path, x)
    assert list(got) == [s.name for s in info.outputs]
    for g, w in zip(got.values(), want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)
    # Triton-style refusals of a wrong input
    with pytest.raises(BackendError, match=r"unexpected datatype for input '.*': expected UINT8, got FP32"):
        backend.run("m", {spec.name: x.astype(np.float32)})
    with pytest.raises(BackendError, match="unexpected shape"):
        backend.run("m", {spec.name: x[0]})


def test_a_cpu_device_runs_onnx_and_tflite_each_on_its_runtime() -> None:
    backend = default_backend(Device("n", "cpu0", DeviceKind.CPU, Discipline.FCFS, 1000.0))
    assert isinstance(backend, FormatBackend) and backend.name == "onnxruntime"
    tflite = backend.load("t", ModelSource(path=str(SMALL)))
    onnx = backend.load("o", ModelSource(zoo="squeezenet1_1", input_size=32))
    assert (tflite.backend, onnx.backend) == ("litert", "onnxruntime")
    assert isinstance(backend.for_model("o"), OnnxRuntimeBackend) and backend.for_model("t").name == "litert"
    x = image((1, 128, 128, 3))
    np.testing.assert_array_equal(backend.run("t", {"input": x})["MobilenetV1/Predictions/Reshape_1"],
                                  own_run(SMALL, x)[0])
    assert tflite.as_dict()["quantization"]["input"] == {"scale": 0.0078125, "zero_point": 128}
    assert "quantization" not in onnx.as_dict()


def test_an_edgetpu_build_on_a_cpu_the_broken_model_and_a_missing_delegate_are_one_line_each() -> None:
    backend = make_backend("litert")
    with pytest.raises(BackendError, match="compiled for the Edge TPU .*edgetpu-custom-op.*serve its CPU build") as e:
        backend.load("tpu", ModelSource(path=str(SMALL_TPU)))
    assert e.value.status == 400 and "\n" not in e.value.message
    with pytest.raises(BackendError, match="does not exist") as e:
        backend.load("gone", ModelSource(path=str(DATA / "nothing.tflite")))
    assert e.value.status == 404
    broken = shared("model_invoking_error.tflite")
    with pytest.raises(BackendError, match="cannot prepare model 'broken' .*fake-op-double") as e:
        backend.load("broken", ModelSource(path=str(broken)))
    assert e.value.status == 400 and "\n" not in e.value.message
    if litert.edgetpu_delegate_available()[0]:
        pytest.skip("libedgetpu loads on this host: the missing-delegate error cannot be shown")
    with pytest.raises(BackendError, match="the Edge TPU runtime libedgetpu.so.1 does not load on this host") as e:
        make_backend("litert", delegate="edgetpu")
    assert e.value.status == 503 and "\n" not in e.value.message


def test_an_emulated_edge_tpu_serves_an_edgetpu_build_with_the_signature_of_its_file() -> None:
    if litert.edgetpu_delegate_available()[0]:
        pytest.skip("libedgetpu loads on this host: its Edge TPU is real, not emulated")
    device = Device("n", "tpu0", DeviceKind.EDGETPU, Discipline.FCFS, 8.0, "ibis-edgetpu")
    backend = default_backend(device)
    assert isinstance(backend, EmulatedBackend)
    profile = load_catalog().get("ibis-edgetpu/mobilenet_v1")
    info = backend.load("m", ModelSource(path=str(SMALL_TPU), profile=profile))
    assert info.emulated and "emulated from profile ibis-edgetpu/mobilenet_v1" in info.provenance
    assert [(s.name, s.datatype, s.shape) for s in info.inputs] == [("input", "UINT8", (1, 128, 128, 3))]
    out = backend.run("m", {"input": image((1, 128, 128, 3))})
    assert out["MobilenetV1/Predictions/Reshape_1"].shape == (1, 1001)
    assert out["MobilenetV1/Predictions/Reshape_1"].dtype == np.uint8


# ------------------------------------------------------------------------------------------- served


def test_served_by_the_agent_to_an_unmodified_tritonclient() -> None:
    import tritonclient.http as th
    from support import LoopThread

    devices = (Device("n1", "cpu0", DeviceKind.CPU, Discipline.FCFS, 1000.0),
               Device("n1", "tpu0", DeviceKind.EDGETPU, Discipline.FCFS, 8.0, "ibis-edgetpu"))
    agent = Agent(Node("n1", 2.0, 4096.0, devices), model_dirs=[str(DATA)],
                  backends={"tpu0": EmulatedBackend(seed=0, sleep=lambda _s: None)})
    lt = LoopThread()
    server = lt.run(start_server(agent, "127.0.0.1", 0))
    try:
        status, doc = put_json(f"{server.url}/v1/apps/cls", {"device": "cpu0", "model": str(SMALL)})
        assert status == 201, doc
        tc = th.InferenceServerClient(server.url.removeprefix("http://"))
        try:
            meta = tc.get_model_metadata("cls")
            assert meta["platform"] == "litert"
            assert meta["inputs"] == [{"name": "input", "datatype": "UINT8", "shape": [1, 128, 128, 3],
                                       "parameters": {"quantization": {"scale": 0.0078125, "zero_point": 128}}}]
            assert meta["outputs"][0]["parameters"] == {"quantization": {"scale": 0.00390625, "zero_point": 0}}
            for seed, binary in ((1, True), (2, False)):
                x = image((1, 128, 128, 3), seed)
                inp = th.InferInput("input", list(x.shape), "UINT8")
                inp.set_data_from_numpy(x, binary_data=binary)
                res = tc.infer("cls", [inp])
                got = res.as_numpy("MobilenetV1/Predictions/Reshape_1")
                np.testing.assert_array_equal(got, own_run(SMALL, x)[0])
            # edgemux's client with a bare camera frame: resized to the model's 128x128 UINT8 input from the
            # metadata, and the quantized scores read back with the metadata's scale and zero point
            from edgemux.runtime.dataplane.preprocess import dequantize, to_model_input
            from edgemux.runtime.dataplane.protocol import TensorSpec
            from edgemux.runtime.ingress.client import AppRoute, Client

            frame = image((240, 320, 3), 7)
            with Client(AppRoute("cls", "cls", {server.url: 1.0}, rate_rps=1e6, burst=1e6), timeout_s=30) as c:
                res = c.infer("cls", frame)
            want = own_run(SMALL, to_model_input(frame, TensorSpec("input", "UINT8", (1, 128, 128, 3))))[0]
            np.testing.assert_array_equal(res.outputs["MobilenetV1/Predictions/Reshape_1"], want)
            probs = dequantize(res.outputs["MobilenetV1/Predictions/Reshape_1"], 0.00390625, 0)
            # softmax scores in steps of 1/256: those under half a step read 0, so the sum falls short of 1
            assert probs.dtype == np.float32 and 0.0 <= probs.min() and probs.max() <= 1.0
            assert 0.5 < float(probs.sum()) <= 1.0 + 1e-6
            # the Edge TPU build asked of the CPU: 4xx naming it, and the app is not created
            status, doc = put_json(f"{server.url}/v1/apps/tpu-on-cpu", {"device": "cpu0", "model": str(SMALL_TPU)})
            assert status == 400 and "compiled for the Edge TPU" in doc["error"], doc
            # the same file on the emulated Edge TPU, with its profile: served with the file's signature
            status, doc = put_json(f"{server.url}/v1/apps/cls-tpu", {"device": "tpu0", "model": str(SMALL_TPU),
                                                                   "profile": "ibis-edgetpu/mobilenet_v1"})
            assert status == 201, doc
            x = image((1, 128, 128, 3))
            inp = th.InferInput("input", list(x.shape), "UINT8")
            inp.set_data_from_numpy(x, binary_data=True)
            out = tc.infer("cls-tpu", [inp]).as_numpy("MobilenetV1/Predictions/Reshape_1")
            assert out.shape == (1, 1001) and out.dtype == np.uint8
            # a model file outside --model-dir is refused before it is read
            status, doc = put_json(f"{server.url}/v1/apps/other", {"device": "cpu0", "model": str(SHARED / "x.tflite")})
            assert status == 403 and "outside the directories" in doc["error"]
        finally:
            tc.close()
    finally:
        lt.run(server.stop())
        agent.close(drain=False, timeout_s=5)
        lt.stop()


def test_spatial_shares_apply_to_a_tflite_model_on_the_cpu() -> None:
    """Under the spatial discipline a .tflite app's instances are LiteRT interpreters, each with its share of
    the cores in threads, re-shared without losing a request; the answers are LiteRT's own."""
    cpu = Device("n1", "cpu0", DeviceKind.CPU, Discipline.SPATIAL, 1000.0)
    agent = Agent(Node("n1", 2.0, 4096.0, (cpu,)), model_dirs=[str(DATA)])
    try:
        agent.register_app("cls", {"device": "cpu0", "model": str(SMALL), "fraction": 0.5, "instances": 2})
        worker = agent.workers["cpu0"]
        cores = worker.spatial_config()["cls"]
        assert (cores["share"], cores["instances"]) == (0.5, 2)
        assert cores["threads"] == threads_for(0.5, cpu_cores())  # each interpreter's threads
        assert "LiteRT interpreters" in worker._queue._pools["cls"].factory.describe()  # type: ignore[attr-defined]
        x = image((1, 128, 128, 3), 5)
        route = agent.next_piece("cls")
        got = agent.submit(route, {"input": x}).result(30).outputs["MobilenetV1/Predictions/Reshape_1"]
        np.testing.assert_array_equal(got, own_run(SMALL, x)[0])
        agent.register_app("cls", {"device": "cpu0", "model": str(SMALL), "fraction": 1.0, "instances": 1})
        assert worker.spatial_config()["cls"]["instances"] == 1
        got = agent.submit(agent.next_piece("cls"), {"input": x}).result(30).outputs["MobilenetV1/Predictions/Reshape_1"]
        np.testing.assert_array_equal(got, own_run(SMALL, x)[0])
    finally:
        agent.close(drain=False, timeout_s=5)
