"""runtime.zoo: built-in-code ONNX models match their published size and cost, run, and cache safely."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from edgemux.errors import InputError
from edgemux.runtime import zoo

TOLERANCE = 0.05  # the brief: within 5 % of the published figure


@pytest.fixture(scope="module")
def models() -> dict[str, onnx.ModelProto]:
    """Each model built once (default size, seed 0) and shared by the tests of this module."""
    return {}


def _model(cache: dict[str, onnx.ModelProto], name: str) -> onnx.ModelProto:
    if name not in cache:
        cache[name] = zoo.build(name, seed=0)
    return cache[name]


def _run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1  # others share this machine; one thread is plenty for batch 2
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {"input": x})


def _weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def test_every_model_has_a_cited_published_figure() -> None:
    assert set(zoo.PUBLISHED) == set(zoo.MODELS) == set(zoo.STANDARD_INPUT)
    for name, pub in zoo.PUBLISHED.items():
        assert pub.params > 0 and pub.gflops > 0, name
        assert "Table" in pub.source or "table" in pub.source, f"{name}: source must name its table"


@pytest.mark.parametrize("name", zoo.MODELS)
def test_size_and_cost_match_published(name: str) -> None:
    stats = zoo.model_stats(name)
    pub = zoo.PUBLISHED[name]
    # like with like: params count BatchNorm's gamma and beta as the published counts do; GFLOPs are 1e9 MACs
    assert stats.params == pytest.approx(pub.params, rel=TOLERANCE), (stats.params, pub.source)
    assert stats.gflops == pytest.approx(pub.gflops, rel=TOLERANCE), (stats.gflops, pub.source)
    assert stats.input_size == pub.input_size
    assert stats.input_shape == ("batch", 3, *pub.input_size)
    assert stats.gflops == stats.macs / 1e9


def test_exact_torchvision_counts() -> None:
    """Where torchvision gives an exact count, the faithful architecture reproduces it to the unit."""
    assert zoo.model_stats("resnet18").params == 11_689_512
    assert zoo.model_stats("resnet50").params == 25_557_032
    assert zoo.model_stats("squeezenet1_1").params == 1_235_496
    assert zoo.model_stats("mobilenet_v2").params == 3_504_872  # torchvision's count; the paper rounds to 3.4M
    assert zoo.model_stats("efficientnet_b0").params == 5_288_548  # torchvision's count; the paper: 5.3M


def test_folded_batchnorm_convention() -> None:
    """The folded graph stores one value less per BatchNorm channel than the published convention counts."""
    squeeze = zoo.model_stats("squeezenet1_1")  # no BatchNorm at all
    assert squeeze.params == squeeze.graph_params
    r18 = zoo.model_stats("resnet18")
    # ResNet-18's BatchNorm channels: stem 64, 2x2x64, 2x2x128 + 128, 2x2x256 + 256, 2x2x512 + 512 (shortcuts)
    assert r18.params - r18.graph_params == 64 + 4 * 64 + 5 * 128 + 5 * 256 + 5 * 512


@pytest.mark.parametrize("name", zoo.MODELS)
def test_checker_and_onnxruntime(models: dict[str, onnx.ModelProto], name: str) -> None:
    model = _model(models, name)
    onnx.checker.check_model(model)
    stats = zoo.model_stats(name)
    # the random-weight graph is the graph the statistics were counted on
    assert zoo.graph_stats(model) == (stats.params, stats.graph_params, stats.macs)
    h, w = stats.input_size
    x = np.random.default_rng(7).standard_normal((2, 3, h, w), dtype=np.float32)
    outs = _run(model, x)
    assert [o.name for o in model.graph.output] == list(stats.output_names)
    for out, (_, shape) in zip(outs, stats.outputs):
        assert out.shape == tuple(2 if d == "batch" else d for d in shape)
        assert np.isfinite(out).all()
        assert out.std() > 0  # the weights are not all zero
    if name != "ssdlite_mobilenet_v2":
        assert outs[0].shape == (2, 1000)
        assert not np.allclose(outs[0][0], outs[0][1])  # different images, different logits


def test_detector_outputs_match_the_tf_api_anchor_count() -> None:
    # 320x320: 20^2*3 + (10^2 + 5^2 + 3^2 + 2^2 + 1) * 6 anchors; at 300x300 the well-known 1917
    stats = zoo.model_stats("ssdlite_mobilenet_v2")
    assert dict(stats.outputs) == {"boxes": ("batch", 2034, 4), "scores": ("batch", 2034, 91)}
    assert dict(zoo.model_stats("ssdlite_mobilenet_v2", 300).outputs)["boxes"] == ("batch", 1917, 4)


def test_same_seed_same_bytes_other_seed_other_weights() -> None:
    a = zoo.build("squeezenet1_1", seed=3).SerializeToString()
    assert a == zoo.build("squeezenet1_1", seed=3).SerializeToString()
    wa, wb = _weights(zoo.build("squeezenet1_1", seed=3)), _weights(zoo.build("squeezenet1_1", seed=4))
    assert wa.keys() == wb.keys()
    big = [k for k in wa if wa[k].size > 1000]
    assert big and all(wa[k].shape == wb[k].shape and not np.array_equal(wa[k], wb[k]) for k in big)


def test_non_default_input_size(models: dict[str, onnx.ModelProto]) -> None:
    base = zoo.model_stats("mobilenet_v2")
    small = zoo.model_stats("mobilenet_v2", 160)
    assert small.input_shape == ("batch", 3, 160, 160)
    assert small.params == base.params  # the weights do not depend on the input size
    # convolution cost scales with area; only the 1.28 M-MAC classifier does not
    assert small.gflops / base.gflops == pytest.approx((160 / 224) ** 2, rel=0.02)
    model = zoo.build("mobilenet_v2", input_size=160, seed=0)
    (logits,) = _run(model, np.ones((1, 3, 160, 160), np.float32))
    assert logits.shape == (1, 1000) and np.isfinite(logits).all()
    # rectangular sizes are (height, width)
    assert zoo.model_stats("resnet18", (192, 256)).input_shape == ("batch", 3, 192, 256)


def test_fixed_batch() -> None:
    model = zoo.build("squeezenet1_1", batch=4)
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [4, 3, 224, 224]
    (logits,) = _run(model, np.zeros((4, 3, 224, 224), np.float32))
    assert logits.shape == (4, 1000)


def test_cache_builds_once_and_reuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = zoo.path("squeezenet1_1", seed=1, cache_dir=tmp_path)
    assert p.parent == tmp_path and p.suffix == ".onnx"
    assert "squeezenet1_1" in p.name and "224x224" in p.name and "s1" in p.name and zoo.BUILDER_HASH in p.name
    assert p.read_bytes() == zoo.build("squeezenet1_1", seed=1).SerializeToString()
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]  # no temp file left behind

    def no_build(*args: object, **kwargs: object) -> onnx.ModelProto:
        raise AssertionError("rebuilt a cached model")

    monkeypatch.setattr(zoo, "build", no_build)
    assert zoo.path("squeezenet1_1", seed=1, cache_dir=tmp_path) == p


def test_corrupt_cache_file_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = zoo.path("squeezenet1_1", cache_dir=tmp_path)
    good = p.read_bytes()
    p.write_bytes(good[: len(good) // 2])  # truncated, as by a crash mid-copy
    calls = []
    real = zoo.build
    monkeypatch.setattr(zoo, "build", lambda *a, **k: calls.append(a) or real(*a, **k))
    assert zoo.path("squeezenet1_1", cache_dir=tmp_path) == p
    assert calls and p.read_bytes() == good
    onnx.checker.check_model(onnx.load(p))


def test_cache_key_and_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEMUX_CACHE", str(tmp_path))
    p = zoo.path("squeezenet1_1", input_size=96)
    assert p.parent == tmp_path / "zoo" and "96x96" in p.name
    assert zoo.path("squeezenet1_1", input_size=96, seed=2) != p
    assert zoo.path("squeezenet1_1", input_size=96, batch=8) != p
    monkeypatch.setattr(zoo, "BUILDER_HASH", "changed000")  # a changed builder does not reuse old files
    assert zoo.path("squeezenet1_1", input_size=96) != p
    monkeypatch.delenv("EDGEMUX_CACHE")
    assert zoo.default_cache_dir() == Path.home() / ".cache" / "edgemux" / "zoo"


@pytest.mark.parametrize("call", [
    lambda: zoo.build("foo"),
    lambda: zoo.model_stats("foo"),
    lambda: zoo.path("foo"),
])
def test_unknown_model_names_the_known_ones(call) -> None:
    with pytest.raises(ValueError, match=r"unknown model 'foo': expected one of .*resnet50") as err:
        call()
    assert isinstance(err.value, InputError) and err.value.field == "model"


@pytest.mark.parametrize("size, problem", [
    (0, "must be positive"),
    ((224, -1), "must be positive"),
    (16, "too small for resnet18"),
    ((224, 31), "too small"),
    ((224,), "height, width"),
    (224.0, "height, width"),
])
def test_bad_input_size(size: object, problem: str) -> None:
    with pytest.raises(ValueError, match=problem) as err:
        zoo.build("resnet18", input_size=size)  # type: ignore[arg-type]
    assert err.value.field == "input_size"


@pytest.mark.parametrize("kwargs", [{"seed": -1}, {"seed": 1.5}, {"batch": 0}, {"batch": True}])
def test_bad_seed_or_batch(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="seed|batch"):
        zoo.build("squeezenet1_1", **kwargs)  # type: ignore[arg-type]
