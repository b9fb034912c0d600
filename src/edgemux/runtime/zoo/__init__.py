"""Model zoo: ONNX graphs of standard vision architectures, built in code with seeded random weights.

Nothing is downloaded. Each builder writes the published architecture layer by layer with ``onnx.helper``
so that the runtime, the profiler and the tests have real models of the right size and cost to execute.
The weights are random (He-style, seeded), so outputs are meaningless as predictions but the compute,
memory and latency are those of the real network.

Conventions (the same for every model, so our figures compare like with like with the published ones):

* **BatchNorm is folded** into the preceding convolution's weight and bias, as deployment graphs are.
  The published parameter counts (torchvision, the papers) count BatchNorm's gamma and beta, so
  ``params`` adds back one extra value per output channel of every folded convolution:
  a folded conv stores ``weight + bias`` and stands for ``weight + gamma + beta``. ``graph_params`` is
  the number of values actually stored in the graph.
* **GFLOPs = 1e9 multiply-accumulates** (MACs, "multiply-adds") per image, counting convolutions and
  fully connected layers only (``Cout * Cin/groups * kh * kw * Hout * Wout`` and ``K * N``), as the papers'
  "FLOPs"/"MAdds" do. Pooling, activations, residual additions and the squeeze-excitation product are
  not counted.
* Sizes are in pixels, ``(height, width)``; the batch dimension is symbolic (``"batch"``) unless a
  fixed ``batch`` is given.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgemux.errors import InputError

OPSET = 17
IR_VERSION = 8  # the IR version that goes with opset 17: loadable by older edge runtimes too
BUILDER_VERSION = 1
# The cache key hashes this file's source, so any change to a builder invalidates cached models.
BUILDER_HASH = hashlib.sha256(Path(__file__).read_bytes() + str(BUILDER_VERSION).encode()).hexdigest()[:10]
_BN_FOLDED = "BatchNorm folded"  # node doc_string marker: the conv stands for conv + BatchNorm (see params)

Size = tuple[int, int]
Shape = tuple[int | str, ...]


class ZooError(InputError, ValueError):
    """A bad model name or input size. A ``ValueError`` and an ``InputError`` (the CLI prints it as one line)."""


@dataclass(frozen=True)
class Published:
    """A published figure: ``params`` (count, BatchNorm included) and ``gflops`` (1e9 MACs per image)."""

    params: float
    gflops: float
    input_size: Size
    source: str


# Every figure we compare against, with where it comes from. torchvision's "GFLOPS" column counts
# multiply-accumulates (it gives ResNet-50 4.09, the same convention as He et al.'s 3.8e9 "FLOPs").
PUBLISHED: dict[str, Published] = {
    "mobilenet_v2": Published(
        3.4e6, 0.300, (224, 224),
        "Sandler et al. 2018, MobileNetV2: Inverted Residuals and Linear Bottlenecks, Table 4 "
        "(MobileNetV2: 300M MAdds, 3.4M params)"),
    "resnet18": Published(
        11_689_512, 1.81, (224, 224),
        "torchvision models table, resnet18 IMAGENET1K_V1 (num_params 11,689,512, GFLOPS 1.81); "
        "agrees with He et al. 2016, Deep Residual Learning, Table 1 (1.8e9 FLOPs)"),
    "resnet50": Published(
        25_557_032, 4.09, (224, 224),
        "torchvision models table, resnet50 IMAGENET1K_V1 (num_params 25,557,032, GFLOPS 4.09). This is "
        "ResNet v1.5 (stride in the 3x3 conv), the form deployed today; He et al. 2016 Table 1's 3.8e9 "
        "is v1 (stride in the first 1x1 conv) and is not compared"),
    "efficientnet_b0": Published(
        5.3e6, 0.39, (224, 224),
        "Tan & Le 2019, EfficientNet: Rethinking Model Scaling for CNNs, Table 2 (B0: 5.3M params, 0.39B FLOPs)"),
    "squeezenet1_1": Published(
        1_235_496, 0.35, (224, 224),
        "torchvision models table, squeezenet1_1 IMAGENET1K_V1 (num_params 1,235,496, GFLOPS 0.35); "
        "cf. the SqueezeNet v1.1 release notes (forresti/SqueezeNet, SqueezeNet_v1.1/README.md: "
        "0.72 GFLOPS/image = 2 FLOPs per MAC at 227x227, '2.4x less computation than v1.0')"),
    "ssdlite_mobilenet_v2": Published(
        4.3e6, 0.8, (320, 320),
        "Sandler et al. 2018, MobileNetV2, Table 6 (MNet V2 + SSDLite, COCO, 320x320: 4.3M params, 0.8B MAdds). "
        "Built as the TF Object Detection API's ssdlite_mobilenet_v2 (1917 anchors at 300x300); it counts "
        "4.50M (4.45M without BatchNorm), +4.7%: the paper does not say what its 4.3M leaves out"),
}

STANDARD_INPUT: dict[str, Size] = {name: p.input_size for name, p in PUBLISHED.items()}
MIN_INPUT = 32  # every network here has output stride 32: a smaller input leaves no spatial extent
NUM_CLASSES = 1000  # ImageNet
COCO_CLASSES = 91  # SSDLite on COCO: 90 classes + background, as in the TF Object Detection API


class _T(NamedTuple):
    """A tensor being built: its graph name and its (channels, height, width)."""

    name: str
    c: int
    h: int
    w: int


class _Graph:
    """Collects nodes and initializers; the layer helpers below all go through it.

    With ``rng=None`` the weights are zeros: the structure (and hence the statistics) is identical and
    building is much cheaper.
    """

    def __init__(self, model: str, rng: np.random.Generator | None) -> None:
        self.model = model
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[TensorProto] = []
        self._count: dict[str, int] = {}
        self._consts: dict[tuple[str, bytes], str] = {}

    def uid(self, prefix: str) -> str:
        n = self._count.get(prefix, 0)
        self._count[prefix] = n + 1
        return f"{prefix}_{n}"

    def node(self, op: str, inputs: list[str], doc: str = "", **attrs: Any) -> str:
        out = self.uid(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, doc_string=doc, **attrs))
        return out

    def const(self, value: np.ndarray) -> str:
        """A non-parameter constant (clip bounds, reshape targets), shared by every use."""
        key = (str(value.dtype), value.tobytes() + str(value.shape).encode())
        if key not in self._consts:
            name = self.uid("const")
            self.inits.append(numpy_helper.from_array(value, name))
            self._consts[key] = name
        return self._consts[key]

    def param(self, shape: tuple[int, ...], std: float, prefix: str) -> str:
        name = self.uid(prefix)
        if self.rng is None:
            arr = np.zeros(shape, np.float32)
        else:
            arr = (self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def check(self, h: int, w: int, where: str) -> None:
        if h < 1 or w < 1:
            raise ZooError("input_size", f"too small for {self.model}: the feature map vanishes at {where}")


def _act(g: _Graph, x: str, act: str | None) -> str:
    if act is None:
        return x
    if act == "relu":
        return g.node("Relu", [x])
    if act == "relu6":
        # ReLU6 as Clip(0, 6): what exporters emit, and what edge compilers fuse into the conv
        return g.node("Clip", [x, g.const(np.array(0.0, np.float32)), g.const(np.array(6.0, np.float32))])
    if act == "swish":  # opset 17 has no Swish/SiLU op: x * sigmoid(x), which runtimes fuse
        return g.node("Mul", [x, g.node("Sigmoid", [x])])
    if act == "sigmoid":
        return g.node("Sigmoid", [x])
    raise AssertionError(act)


def conv(g: _Graph, x: _T, cout: int, k: int, stride: int = 1, groups: int = 1, act: str | None = "relu",
         bn: bool = True, pad: int | None = None, gain: float = 1.0) -> _T:
    """Conv (+ folded BatchNorm) + activation. ``gain`` scales the He init (residual branches use < 1)."""
    pad = (k - 1) // 2 if pad is None else pad
    h = (x.h + 2 * pad - k) // stride + 1
    w = (x.w + 2 * pad - k) // stride + 1
    g.check(h, w, f"a {k}x{k} stride-{stride} conv on {x.h}x{x.w}")
    fan_in = x.c // groups * k * k
    # He init keeps the activation variance about constant through ReLU layers; linear layers get 1/fan_in
    std = gain * np.sqrt((2.0 if act in ("relu", "relu6", "swish") else 1.0) / fan_in)
    wname = g.param((cout, x.c // groups, k, k), std, "w")
    # a folded BatchNorm leaves a bias; a conv without BN (SqueezeNet, SE, heads) has its own bias
    bname = g.param((cout,), 0.01, "b")
    y = g.node("Conv", [x.name, wname, bname], doc=_BN_FOLDED if bn else "",
               kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, group=groups)
    return _T(_act(g, y, act), cout, h, w)


def maxpool(g: _Graph, x: _T, k: int, stride: int, pad: int = 0, ceil: bool = False) -> _T:
    def out(n: int) -> int:
        span = n + 2 * pad - k
        return (-(-span // stride) if ceil else span // stride) + 1
    h, w = out(x.h), out(x.w)
    g.check(h, w, f"a {k}x{k} max-pool on {x.h}x{x.w}")
    y = g.node("MaxPool", [x.name], kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4,
               ceil_mode=int(ceil))
    return _T(y, x.c, h, w)


def add(g: _Graph, a: _T, b: _T) -> _T:
    return _T(g.node("Add", [a.name, b.name]), a.c, a.h, a.w)


def classifier(g: _Graph, x: _T, classes: int = NUM_CLASSES) -> str:
    """Global average pool, flatten, fully connected layer: logits [batch, classes]."""
    flat = g.node("Flatten", [g.node("GlobalAveragePool", [x.name])], axis=1)
    wname = g.param((classes, x.c), 0.01, "fc_w")  # small, as torchvision initializes its classifiers
    bname = g.param((classes,), 0.0, "fc_b")
    return g.node("Gemm", [flat, wname, bname], transB=1)


def inverted_residual(g: _Graph, x: _T, cout: int, stride: int, expand: int) -> tuple[_T, _T]:
    """MobileNetV2 block: 1x1 expand (ReLU6), 3x3 depthwise (ReLU6), 1x1 linear projection.

    Returns (output, expansion output); SSDLite taps the expansion of one block.
    """
    residual = stride == 1 and x.c == cout
    hidden = x.c * expand
    e = conv(g, x, hidden, 1, act="relu6") if expand != 1 else x
    y = conv(g, e, hidden, 3, stride, groups=hidden, act="relu6")
    y = conv(g, y, cout, 1, act=None, gain=0.5 if residual else 1.0)
    return (add(g, x, y) if residual else y), e


def basic_block(g: _Graph, x: _T, width: int, stride: int) -> _T:
    """ResNet basic block: two 3x3 convs and an identity (or 1x1 projection) shortcut."""
    y = conv(g, x, width, 3, stride)
    y = conv(g, y, width, 3, act=None, gain=0.5)  # damped so the residual sum does not grow with depth
    short = conv(g, x, width, 1, stride, act=None) if stride != 1 or x.c != width else x
    return _T(g.node("Relu", [add(g, short, y).name]), width, y.h, y.w)


def bottleneck(g: _Graph, x: _T, width: int, stride: int, expansion: int = 4) -> _T:
    """ResNet v1.5 bottleneck: 1x1 reduce, 3x3 (carries the stride), 1x1 expand, projection shortcut."""
    cout = width * expansion
    y = conv(g, x, width, 1)
    y = conv(g, y, width, 3, stride)
    y = conv(g, y, cout, 1, act=None, gain=0.5)
    short = conv(g, x, cout, 1, stride, act=None) if stride != 1 or x.c != cout else x
    return _T(g.node("Relu", [add(g, short, y).name]), cout, y.h, y.w)


def fire(g: _Graph, x: _T, squeeze: int, expand: int) -> _T:
    """SqueezeNet fire module: 1x1 squeeze, then 1x1 and 3x3 expands concatenated (no BatchNorm)."""
    s = conv(g, x, squeeze, 1, bn=False)
    e1 = conv(g, s, expand, 1, bn=False)
    e3 = conv(g, s, expand, 3, bn=False)
    return _T(g.node("Concat", [e1.name, e3.name], axis=1), 2 * expand, s.h, s.w)


def mbconv(g: _Graph, x: _T, cout: int, k: int, stride: int, expand: int) -> _T:
    """EfficientNet MBConv: 1x1 expand, kxk depthwise, squeeze-excitation, 1x1 projection; swish."""
    residual = stride == 1 and x.c == cout
    hidden = x.c * expand
    y = conv(g, x, hidden, 1, act="swish") if expand != 1 else x
    y = conv(g, y, hidden, k, stride, groups=hidden, act="swish")
    # squeeze-excitation: its width is a quarter of the block's *input* channels (torchvision, the paper)
    pooled = _T(g.node("GlobalAveragePool", [y.name]), hidden, 1, 1)
    s = conv(g, pooled, max(1, x.c // 4), 1, act="swish", bn=False)
    s = conv(g, s, hidden, 1, act="sigmoid", bn=False)
    y = _T(g.node("Mul", [y.name, s.name]), hidden, y.h, y.w)
    y = conv(g, y, cout, 1, act=None, gain=0.5 if residual else 1.0)
    return add(g, x, y) if residual else y


# ---- the architectures ----------------------------------------------------------------------------

# MobileNetV2 (Sandler et al. 2018, Table 2): expansion t, channels c, repeats n, first stride s
_MBV2 = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]


def _mobilenet_v2_features(g: _Graph, x: _T) -> tuple[_T, _T]:
    """MobileNetV2 up to its final 1x1 conv (1280); also returns block 14's expansion (576 ch, stride 16)."""
    x = conv(g, x, 32, 3, 2, act="relu6")
    tap = x
    block = 0
    for t, c, n, s in _MBV2:
        for i in range(n):
            x, e = inverted_residual(g, x, c, s if i == 0 else 1, t)
            block += 1
            if block == 14:  # the TF Object Detection API's "layer_15/expansion_output"
                tap = e
    return conv(g, x, 1280, 1, act="relu6"), tap


def _mobilenet_v2(g: _Graph, x: _T) -> dict[str, tuple[str, Shape]]:
    x, _ = _mobilenet_v2_features(g, x)
    return {"logits": (classifier(g, x), (NUM_CLASSES,))}


def _resnet(block: Callable[[_Graph, _T, int, int], _T], depths: list[int]) -> Callable[..., dict]:
    def build(g: _Graph, x: _T) -> dict[str, tuple[str, Shape]]:
        x = conv(g, x, 64, 7, 2)
        x = maxpool(g, x, 3, 2, pad=1)
        for stage, (width, n) in enumerate(zip((64, 128, 256, 512), depths)):
            for i in range(n):
                x = block(g, x, width, 2 if stage > 0 and i == 0 else 1)
        return {"logits": (classifier(g, x), (NUM_CLASSES,))}
    return build


# EfficientNet-B0 (Tan & Le 2019, Table 1): expansion, kernel, first stride, channels, repeats
_EFFB0 = [(1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3), (6, 5, 1, 112, 3),
          (6, 5, 2, 192, 4), (6, 3, 1, 320, 1)]


def _efficientnet_b0(g: _Graph, x: _T) -> dict[str, tuple[str, Shape]]:
    x = conv(g, x, 32, 3, 2, act="swish")
    for t, k, s, c, n in _EFFB0:
        for i in range(n):
            x = mbconv(g, x, c, k, s if i == 0 else 1, t)
    x = conv(g, x, 1280, 1, act="swish")
    return {"logits": (classifier(g, x), (NUM_CLASSES,))}


def _squeezenet1_1(g: _Graph, x: _T) -> dict[str, tuple[str, Shape]]:
    x = conv(g, x, 64, 3, 2, pad=0, bn=False)
    x = maxpool(g, x, 3, 2, ceil=True)
    x = fire(g, fire(g, x, 16, 64), 16, 64)
    x = maxpool(g, x, 3, 2, ceil=True)
    x = fire(g, fire(g, x, 32, 128), 32, 128)
    x = maxpool(g, x, 3, 2, ceil=True)
    for squeeze, expand in ((48, 192), (48, 192), (64, 256), (64, 256)):
        x = fire(g, x, squeeze, expand)
    # the classifier is a 1x1 conv + ReLU before the pooling, not a fully connected layer
    x = conv(g, x, NUM_CLASSES, 1, bn=False, gain=0.1)
    logits = g.node("Flatten", [g.node("GlobalAveragePool", [x.name])], axis=1)
    return {"logits": (logits, (NUM_CLASSES,))}


# SSDLite (Sandler et al. 2018, sec. 6.2) as the TF Object Detection API builds it: feature maps from the
# expansion of block 14 (stride 16) and the final 1280 conv (stride 32), four extra layers of depth
# 512/256/256/128 (1x1 to half depth, 3x3 depthwise stride 2, 1x1), and on each map separable heads
# (3x3 depthwise + 1x1) for boxes and classes; 3 anchors on the first map, 6 on the others.
_SSD_EXTRA = (512, 256, 256, 128)
_SSD_ANCHORS = (3, 6, 6, 6, 6, 6)


def _ssd_head(g: _Graph, x: _T, anchors: int, per_anchor: int) -> str:
    y = conv(g, x, x.c, 3, groups=x.c, act="relu6")
    y = conv(g, y, anchors * per_anchor, 1, act=None, bn=False, gain=0.1)
    # [N, A*k, H, W] -> [N, H, W, A*k] -> [N, H*W*A, k]: the TF API's anchor order
    t = g.node("Transpose", [y.name], perm=[0, 2, 3, 1])
    return g.node("Reshape", [t, g.const(np.array([0, -1, per_anchor], np.int64))])


def _ssdlite_mobilenet_v2(g: _Graph, x: _T) -> dict[str, tuple[str, Shape]]:
    top, tap = _mobilenet_v2_features(g, x)
    maps = [tap, top]
    for depth in _SSD_EXTRA:
        y = conv(g, maps[-1], depth // 2, 1, act="relu6")
        y = conv(g, y, depth // 2, 3, 2, groups=depth // 2, act="relu6")
        maps.append(conv(g, y, depth, 1, act="relu6"))
    boxes = [_ssd_head(g, m, a, 4) for m, a in zip(maps, _SSD_ANCHORS)]
    scores = [_ssd_head(g, m, a, COCO_CLASSES) for m, a in zip(maps, _SSD_ANCHORS)]
    total = sum(m.h * m.w * a for m, a in zip(maps, _SSD_ANCHORS))
    return {"boxes": (g.node("Concat", boxes, axis=1), (total, 4)),
            "scores": (g.node("Concat", scores, axis=1), (total, COCO_CLASSES))}


_BUILDERS: dict[str, Callable[[_Graph, _T], dict[str, tuple[str, Shape]]]] = {
    "mobilenet_v2": _mobilenet_v2,
    "resnet18": _resnet(basic_block, [2, 2, 2, 2]),
    "resnet50": _resnet(bottleneck, [3, 4, 6, 3]),
    "efficientnet_b0": _efficientnet_b0,
    "squeezenet1_1": _squeezenet1_1,
    "ssdlite_mobilenet_v2": _ssdlite_mobilenet_v2,
}
MODELS: tuple[str, ...] = tuple(_BUILDERS)


# ---- public API ------------------------------------------------------------------------------------

def _check_name(name: str) -> None:
    if name not in _BUILDERS:
        raise ZooError("model", f"unknown model {name!r}: expected one of {', '.join(MODELS)}")


def resolve_size(name: str, input_size: int | Size | None = None) -> Size:
    """The (height, width) in pixels a build uses: the standard size when None, (n, n) for an int.

    Raises ``ZooError`` (a ``ValueError``) for an unknown model, a non-integer or non-positive size, or a
    size below the networks' output stride of ``MIN_INPUT`` (32) pixels.
    """
    _check_name(name)
    if input_size is None:
        return STANDARD_INPUT[name]
    if isinstance(input_size, (int, np.integer)):
        size: tuple[Any, ...] = (input_size, input_size)
    else:
        try:
            size = tuple(input_size)
        except TypeError:
            size = ()
    if len(size) != 2 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in size):
        raise ZooError("input_size", f"expected an int or (height, width) in pixels, got {input_size!r}")
    h, w = int(size[0]), int(size[1])
    if h <= 0 or w <= 0:
        raise ZooError("input_size", f"must be positive, got {h}x{w}")
    if h < MIN_INPUT or w < MIN_INPUT:
        raise ZooError("input_size", f"{h}x{w} is too small for {name}: its output stride needs at least "
                                     f"{MIN_INPUT}x{MIN_INPUT} pixels")
    return h, w


def _build(name: str, size: Size, seed: int | None, batch: int | None) -> onnx.ModelProto:
    if batch is not None and (not isinstance(batch, (int, np.integer)) or isinstance(batch, bool) or batch < 1):
        raise ZooError("batch", f"expected None (symbolic) or a positive int, got {batch!r}")
    g = _Graph(name, None if seed is None else np.random.default_rng(seed))
    b: int | str = "batch" if batch is None else int(batch)
    outs = _BUILDERS[name](g, _T("input", 3, size[0], size[1]))
    # rename each output's producer so the graph outputs carry stable names
    produced = {t: o for o, (t, _) in outs.items()}
    for node in g.nodes:
        node.output[:] = [produced.get(o, o) for o in node.output]
        node.input[:] = [produced.get(i, i) for i in node.input]
    graph = helper.make_graph(
        g.nodes, name,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [b, 3, size[0], size[1]])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [b, *shape]) for o, (_, shape) in outs.items()],
        initializer=g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="edgemux.zoo", producer_version=BUILDER_HASH,
                              doc_string=f"{name} with random weights; architecture: {PUBLISHED[name].source}")
    model.ir_version = IR_VERSION
    helper.set_model_props(model, {"edgemux.model": name, "edgemux.input_size": f"{size[0]}x{size[1]}",
                                   "edgemux.builder": BUILDER_HASH, "edgemux.seed": str(seed)})
    return model


def build(name: str, *, input_size: int | Size | None = None, seed: int = 0,
          batch: int | None = None) -> onnx.ModelProto:
    """Build model ``name`` (one of ``MODELS``) as an ONNX ModelProto with seeded random weights.

    ``input_size`` is in pixels (an int for square, or (height, width); None: the architecture's standard).
    The input is ``input`` [batch, 3, H, W] float32; classifiers output ``logits`` [batch, 1000], the SSDLite
    detector ``boxes`` [batch, anchors, 4] and ``scores`` [batch, anchors, 91] (raw, no NMS). ``batch`` None
    leaves the batch dimension symbolic. The same arguments give byte-identical serializations.
    """
    size = resolve_size(name, input_size)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ZooError("seed", f"expected a non-negative int, got {seed!r}")
    return _build(name, size, int(seed), batch)


@dataclass(frozen=True)
class ZooStats:
    """Size and cost of one model at one input size, counted from its built graph.

    ``params``: trainable parameters in the published convention (BatchNorm gamma and beta included);
    ``graph_params``: values stored in the folded graph; ``macs``: multiply-accumulates per image (convs and
    fully connected layers); ``gflops``: ``macs / 1e9``; ``input_size``: (height, width) in pixels.
    """

    name: str
    input_size: Size
    params: int
    graph_params: int
    macs: int
    gflops: float
    input_shape: Shape
    outputs: tuple[tuple[str, Shape], ...]

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(o for o, _ in self.outputs)


def _dims(vi: onnx.ValueInfoProto) -> Shape:
    return tuple(d.dim_param if d.HasField("dim_param") else d.dim_value for d in vi.type.tensor_type.shape.dim)


def graph_stats(model: onnx.ModelProto) -> tuple[int, int, int]:
    """(params in the published convention, values stored in the graph, MACs per image) of a zoo model.

    Walks the graph: a Conv costs ``Cout * Cin/groups * kh * kw`` MACs per output pixel (spatial size from
    ONNX shape inference), a Gemm ``K * N``. Only Conv and Gemm weights and biases are parameters.
    """
    # Shape inference only needs the weights' shapes: infer on a skeleton whose large initializers are
    # declared as typed inputs instead (serializing 100 MB of weights would dominate the cost).
    skeleton = onnx.ModelProto(ir_version=model.ir_version, opset_import=model.opset_import)
    graph = skeleton.graph
    graph.name = model.graph.name
    graph.node.extend(model.graph.node)
    graph.input.extend(model.graph.input)
    graph.output.extend(model.graph.output)
    for t in model.graph.initializer:
        if int(np.prod(t.dims)) <= 16:  # constants (clip bounds, reshape targets): inference reads them
            graph.initializer.append(t)
        else:
            graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    inferred = onnx.shape_inference.infer_shapes(skeleton, strict_mode=True)
    shapes = {vi.name: _dims(vi) for vi in (*inferred.graph.value_info, *inferred.graph.output)}
    weights = {t.name: tuple(t.dims) for t in model.graph.initializer}
    params = stored = macs = 0
    for node in model.graph.node:
        if node.op_type not in ("Conv", "Gemm"):
            continue
        w = weights[node.input[1]]
        n = int(np.prod(w)) + sum(int(np.prod(weights[b])) for b in node.input[2:3])
        stored += n
        # BatchNorm had gamma and beta per channel; folded, beta lives on as the bias, gamma in the weight
        params += n + (w[0] if node.doc_string == _BN_FOLDED else 0)
        if node.op_type == "Conv":
            h, wd = shapes[node.output[0]][2:]
            macs += int(np.prod(w)) * int(h) * int(wd)
        else:
            macs += int(np.prod(w))
    return params, stored, macs


def model_stats(name: str, input_size: int | Size | None = None) -> ZooStats:
    """Parameters (count) and GFLOPs (1e9 multiply-adds per image) of ``name`` at ``input_size`` (pixels).

    Counted from the built graph (see ``graph_stats``); the batch dimension stays symbolic in the shapes.
    """
    return _stats(name, resolve_size(name, input_size))


@lru_cache(maxsize=64)
def _stats(name: str, size: Size) -> ZooStats:
    model = _build(name, size, None, None)  # seed None: zero weights: same graph, cheaper to make
    params, stored, macs = graph_stats(model)
    return ZooStats(name, size, params, stored, macs, macs / 1e9, _dims(model.graph.input[0]),
                    tuple((o.name, _dims(o)) for o in model.graph.output))


def default_cache_dir() -> Path:
    """``$EDGEMUX_CACHE/zoo`` if EDGEMUX_CACHE is set, else ``~/.cache/edgemux/zoo``."""
    root = os.environ.get("EDGEMUX_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "edgemux") / "zoo"


def _atomic_write(target: Path, data: bytes) -> None:
    # temp file in the same directory + os.replace: readers never see a half-written file
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def path(name: str, *, input_size: int | Size | None = None, seed: int = 0, batch: int | None = None,
         cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The serialized model on disk, built on first use and cached.

    The file name carries the model, size (pixels), batch, seed and ``BUILDER_HASH`` (so a changed builder
    builds anew). A sidecar ``.sha256`` holds the file's digest: a file that does not match it (corrupt,
    truncated) is rebuilt.
    """
    h, w = resolve_size(name, input_size)
    directory = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{name}-{h}x{w}-b{batch or 'N'}-s{seed}-{BUILDER_HASH}.onnx"
    digest_file = target.with_name(target.name + ".sha256")
    try:
        if hashlib.sha256(target.read_bytes()).hexdigest() == digest_file.read_text(encoding="ascii").strip():
            return target
    except OSError:
        pass  # missing: build it
    data = build(name, input_size=(h, w), seed=seed, batch=batch).SerializeToString()
    _atomic_write(target, data)
    _atomic_write(digest_file, hashlib.sha256(data).hexdigest().encode("ascii"))
    return target
