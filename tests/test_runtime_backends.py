"""runtime.dataplane.backends: onnxruntime matches a direct session, Triton-style validation, emulation from profiles."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edgemux.errors import EdgemuxError
from edgemux.profiles.types import DeviceKind, ExecTime, Profile, Provenance
from edgemux.runtime import zoo
from edgemux.runtime.dataplane.backends import (
    BackendError,
    EmulatedBackend,
    InvalidInput,
    ModelNotFound,
    ModelSource,
    OnnxRuntimeBackend,
    make_backend,
)
from edgemux.runtime.dataplane.protocol import TensorSpec

SIZE = 64  # squeezenet at 64x64 pixels: a real network that runs in a few ms


def _profile(exec_ms: dict[int, tuple[float, float]], switch_ms: float = 0.0,
             kind: DeviceKind = DeviceKind.EDGETPU) -> Profile:
    """A profile with (mean ms, variance ms^2) per batch size."""
    return Profile(
        name="test-profile", model="squeezenet1_1", variant="squeezenet1_1-64", device_kind=kind,
        provenance=Provenance("unit test", "hand-written"),
        exec={b: ExecTime(b, m, v) for b, (m, v) in exec_ms.items()}, switch_ms=switch_ms)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("zoo")


@pytest.fixture(scope="module")
def ort_backend(cache: Path) -> OnnxRuntimeBackend:
    b = OnnxRuntimeBackend(threads=1)
    b.load("sq", ModelSource(zoo="squeezenet1_1", input_size=SIZE, cache_dir=str(cache)))
    return b


def _x(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 3, SIZE, SIZE), dtype=np.float32)


# ------------------------------------------------------------------------------------------- onnxruntime


def test_onnxruntime_matches_a_direct_session(ort_backend: OnnxRuntimeBackend, cache: Path) -> None:
    path = zoo.path("squeezenet1_1", input_size=SIZE, cache_dir=cache)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    direct = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    x = _x(2)
    (want,) = direct.run(None, {"input": x})
    got = ort_backend.run("sq", {"input": x})
    assert set(got) == {"logits"}
    assert got["logits"].shape == (2, 1000)
    np.testing.assert_allclose(got["logits"], want, rtol=1e-5, atol=1e-6)


def test_onnxruntime_metadata(ort_backend: OnnxRuntimeBackend) -> None:
    info = ort_backend.info("sq")
    assert info.inputs == (TensorSpec("input", "FP32", (-1, 3, SIZE, SIZE)),)
    assert info.outputs == (TensorSpec("logits", "FP32", (-1, 1000)),)
    assert info.batchable and not info.emulated and info.backend == "onnxruntime"
    assert info.memory_mb > 1.0  # 1.2M FP32 weights ~ 5 MB
    assert info.switch_ms == 0.0
    assert info.source == f"zoo:squeezenet1_1@{SIZE}x{SIZE}"
    assert "measured" in info.provenance
    assert info.as_dict()["inputs"][0]["shape"] == [-1, 3, SIZE, SIZE]
    assert ort_backend.name == "onnxruntime" and ort_backend.emulated is False
    assert set(ort_backend.loaded()) == {"sq"}


def test_run_batch_concatenates_and_splits_back(ort_backend: OnnxRuntimeBackend) -> None:
    requests = [{"input": _x(n, seed=i)} for i, n in enumerate((1, 2, 1))]
    outs = ort_backend.run_batch("sq", requests)
    assert [o["logits"].shape for o in outs] == [(1, 1000), (2, 1000), (1, 1000)]
    for r, o in zip(requests, outs):
        np.testing.assert_allclose(o["logits"], ort_backend.run("sq", r)["logits"], rtol=1e-4, atol=1e-5)
    assert ort_backend.run_batch("sq", []) == []


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"input": np.zeros((3, SIZE, SIZE), np.float32)},
         f"unexpected shape for input 'input': expected [-1,3,{SIZE},{SIZE}], got [3,{SIZE},{SIZE}]"),
        ({"input": np.zeros((1, 3, 32, 32), np.float32)},
         f"unexpected shape for input 'input': expected [-1,3,{SIZE},{SIZE}], got [1,3,32,32]"),
        ({"input": np.zeros((1, 3, SIZE, SIZE), np.float64)},
         "unexpected datatype for input 'input': expected FP32, got FP64"),
        ({"image": np.zeros((1, 3, SIZE, SIZE), np.float32)},
         "unexpected input 'image': model 'sq' expects 'input'"),
        ({}, "missing input 'input' for model 'sq'"),
    ],
    ids=["rank", "dims", "dtype", "name", "missing"],
)
def test_bad_inputs_have_triton_messages(ort_backend: OnnxRuntimeBackend, inputs: dict, message: str) -> None:
    with pytest.raises(InvalidInput) as e:
        ort_backend.run("sq", inputs)
    assert str(e.value) == message
    assert e.value.status == 400
    assert isinstance(e.value, BackendError) and isinstance(e.value, EdgemuxError)


def test_fixed_batch_model_message_and_no_concatenation(cache: Path) -> None:
    path = zoo.path("squeezenet1_1", input_size=SIZE, batch=1, cache_dir=cache)
    b = OnnxRuntimeBackend(threads=1)
    info = b.load("fixed", ModelSource(path=str(path)))
    assert info.inputs[0].shape == (1, 3, SIZE, SIZE) and not info.batchable
    with pytest.raises(InvalidInput, match=r"^unexpected shape for input 'input': expected \[1,3,64,64\], "
                                           r"got \[3,64,64\]$"):
        b.run("fixed", {"input": np.zeros((3, SIZE, SIZE), np.float32)})
    # not batchable: run_batch executes the requests one by one, results still per request
    outs = b.run_batch("fixed", [{"input": _x(1, 1)}, {"input": _x(1, 2)}])
    assert [o["logits"].shape for o in outs] == [(1, 1000), (1, 1000)]


def test_load_is_idempotent_per_name_and_unload(cache: Path) -> None:
    b = OnnxRuntimeBackend(threads=1)
    src = ModelSource(zoo="squeezenet1_1", input_size=SIZE, cache_dir=str(cache))
    first = b.load("m", src)
    assert b.load("m", ModelSource(zoo="squeezenet1_1", input_size=SIZE, cache_dir=str(cache))) is first
    with pytest.raises(BackendError, match="already loaded from zoo:squeezenet1_1@64x64") as e:
        b.load("m", ModelSource(zoo="squeezenet1_1", input_size=96, cache_dir=str(cache)))
    assert e.value.status == 409
    b.unload("m")
    assert b.loaded() == {}
    with pytest.raises(ModelNotFound, match="model 'm' is not loaded") as e2:
        b.run("m", {"input": _x(1)})
    assert e2.value.status == 404
    with pytest.raises(ModelNotFound):
        b.unload("m")


def test_missing_file_and_bad_graph(tmp_path: Path) -> None:
    b = OnnxRuntimeBackend(threads=1)
    with pytest.raises(ModelNotFound, match="does not exist"):
        b.load("x", ModelSource(path=str(tmp_path / "nope.onnx")))
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(BackendError, match="cannot load model 'x'"):
        b.load("x", ModelSource(path=str(bad)))
    assert b.loaded() == {}


def test_model_source_parse() -> None:
    assert ModelSource.parse("zoo:mobilenet_v2") == ModelSource(zoo="mobilenet_v2")
    assert ModelSource.parse("zoo:squeezenet1_1@64").input_size == (64, 64)
    assert ModelSource.parse("zoo:squeezenet1_1@320x240").describe() == "zoo:squeezenet1_1@320x240"
    assert ModelSource.parse("/models/a.onnx") == ModelSource(path="/models/a.onnx")
    with pytest.raises(BackendError, match="bad input size"):
        ModelSource.parse("zoo:squeezenet1_1@big")
    with pytest.raises(BackendError, match="not both"):
        ModelSource(zoo="squeezenet1_1", path="/a.onnx")


def test_make_backend_kinds() -> None:
    b = make_backend("onnxruntime", threads=2)
    assert isinstance(b, OnnxRuntimeBackend) and b.threads == 2 and b.providers == ("CPUExecutionProvider",)
    assert isinstance(make_backend("emulated", seed=3), EmulatedBackend)
    if "CUDAExecutionProvider" in ort.get_available_providers():
        cuda = make_backend("cuda")
        assert cuda.name == "cuda" and isinstance(cuda, OnnxRuntimeBackend)
    else:
        with pytest.raises(BackendError, match=r"^CUDA not available: onnxruntime ") as e:
            make_backend("cuda")
        assert e.value.status == 503
    with pytest.raises(BackendError, match="unknown backend 'tpu'"):
        make_backend("tpu")
    with pytest.raises(BackendError, match="threads must be a positive int"):
        OnnxRuntimeBackend(threads=0)


def test_importing_backends_imports_no_inference_runtime() -> None:
    """An emulated-only agent never loads onnxruntime (nor any CUDA library through it)."""
    code = "import sys, edgemux.runtime.dataplane.backends, edgemux.runtime.dataplane.worker; print('onnxruntime' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------------------------------------- emulated


def test_an_emulated_model_takes_the_zoo_graphs_input_off_the_edge_tpu() -> None:
    """Only an Edge TPU profile turns the input into quantized NHWC pixels; any other device kind is sent
    the zoo graph's own FP32 NCHW tensor."""
    b = EmulatedBackend(seed=7, sleep=lambda s: None)
    info = b.load("sq", ModelSource(zoo="squeezenet1_1", input_size=SIZE, profile=_profile({1: (4.0, 1.0)},
                                                                                            kind=DeviceKind.GPU_DISCRETE)))
    assert info.inputs == (TensorSpec("input", "FP32", (-1, 3, SIZE, SIZE)),)


def test_emulated_service_times_follow_the_profile() -> None:
    """30 runs of a gamma service time (mean 4 ms, sd 2 ms): the sampled mean lies within 3 standard errors
    of the profile's mean; each measured sleep is at least its sample (time.sleep never returns early) and
    the typical (median) overshoot stays below 20 ms: a generous allowance for scheduler latency on a shared,
    loaded machine (a mean would let one preemption fail the test)."""
    mean, var, n = 4.0, 4.0, 30
    b = EmulatedBackend(seed=7)
    info = b.load("sq", ModelSource(zoo="squeezenet1_1", input_size=SIZE, profile=_profile({1: (mean, var)})))
    for _ in range(n):
        out = b.run("sq", {"input": np.zeros((1, SIZE, SIZE, 3), np.uint8)})
    sampled = np.array([s[0] for s in b.samples])
    measured = np.array([s[1] for s in b.samples])
    assert len(sampled) == n and np.all(sampled > 0) and np.std(sampled) > 0  # really drawn from a gamma
    assert abs(sampled.mean() - mean) <= 3 * math.sqrt(var / n)
    assert np.all(measured >= sampled - 0.5)  # perf_counter vs sleep's clock: sub-ms slack
    assert np.median(measured - sampled) <= 20.0
    # outputs: zeros of the zoo graph's declared shapes, batch dimension filled in
    assert set(out) == {"logits"} and out["logits"].shape == (1, 1000) and out["logits"].dtype == np.float32
    assert not out["logits"].any()
    assert info.outputs == (TensorSpec("logits", "FP32", (-1, 1000)),)
    # an Edge TPU runs 8-bit quantized models: the image goes in as uint8 pixels, NHWC
    assert info.inputs == (TensorSpec("input", "UINT8", (-1, SIZE, SIZE, 3)),)
    assert info.emulated and b.emulated and b.name == "emulated"
    assert b.provenance("sq").startswith("emulated from profile test-profile (edgetpu): unit test, hand-written")


def _fast(seed: int = 0) -> EmulatedBackend:
    return EmulatedBackend(seed=seed, sleep=lambda s: None)


def test_emulated_batches_use_the_batch_entry_or_sum_batch_one() -> None:
    b = _fast()
    specs = dict(inputs=(TensorSpec("x", "FP32", (-1, 4)),), outputs=(TensorSpec("y", "INT64", (-1, 2, -1)),))
    b.load("m", ModelSource(profile=_profile({1: (2.0, 0.0), 4: (5.0, 0.0)}), **specs))
    reqs = [{"x": np.ones((1, 4), np.float32)} for _ in range(4)]
    outs = b.run_batch("m", reqs)
    assert b.samples[-1][0] == 5.0 and b.samples[-1][3] == 4  # one execution of batch 4
    assert [o["y"].shape for o in outs] == [(1, 2, 1)] * 4 and outs[0]["y"].dtype == np.int64
    b.run_batch("m", reqs[:3])
    assert b.samples[-1][0] == 6.0 and b.samples[-1][3] == 3  # no entry for 3: three batch-1 draws


def test_emulated_is_seeded() -> None:
    def draws(seed: int) -> list[float]:
        b = _fast(seed)
        b.load("m", ModelSource(profile=_profile({1: (3.0, 2.0)}), inputs=(TensorSpec("x", "FP32", (-1,)),),
                                outputs=(TensorSpec("y", "FP32", (-1,)),)))
        for _ in range(5):
            b.run("m", {"x": np.zeros(1, np.float32)})
        return [s[0] for s in b.samples]

    assert draws(1) == draws(1)
    assert draws(1) != draws(2)


def test_emulated_from_an_onnx_file_and_its_errors(cache: Path) -> None:
    path = zoo.path("squeezenet1_1", input_size=SIZE, batch=1, cache_dir=cache)
    b = _fast()
    info = b.load("f", ModelSource(path=str(path), profile=_profile({1: (1.0, 0.0)}, switch_ms=12.0)))
    assert info.inputs == (TensorSpec("input", "FP32", (1, 3, SIZE, SIZE)),) and not info.batchable
    assert info.switch_ms == 12.0 and info.memory_mb > 1.0
    assert b.run("f", {"input": np.zeros((1, 3, SIZE, SIZE), np.float32)})["logits"].shape == (1, 1000)
    with pytest.raises(BackendError, match="needs a profile"):
        b.load("g", ModelSource(path=str(path)))
    with pytest.raises(BackendError, match="declares no inputs"):
        b.load("h", ModelSource(profile=_profile({1: (1.0, 0.0)})))
    with pytest.raises(BackendError, match="no batch-1 execution time"):
        b.load("i", ModelSource(zoo="squeezenet1_1", profile=_profile({4: (1.0, 0.0)})))
    with pytest.raises(ModelNotFound, match="unknown model 'nope'"):
        b.load("j", ModelSource(zoo="nope", profile=_profile({1: (1.0, 0.0)})))
    with pytest.raises(InvalidInput, match=r"^unexpected shape for input 'input': expected \[1,3,64,64\], "
                                           r"got \[2,3,64,64\]$"):
        b.run("f", {"input": np.zeros((2, 3, SIZE, SIZE), np.float32)})
