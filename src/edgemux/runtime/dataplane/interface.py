"""An app's interface, and the converter that feeds a device variant of its model through it.

An app's model comes in device variants: Coral's UINT8 ``[1,224,224,3]`` Edge TPU build, an FP32
``[1,3,96,96]`` ONNX graph on the CPU. A client written against one variant must keep working when the app
moves to another (``edgemux move``, a re-share, the adaptation loop), so an app may be served through one
:class:`Interface` (its tensors as clients see them) whatever variant a device runs: a :class:`Converter`
turns each request's tensors into the variant's and the variant's answers back into the interface's.

What converts (each tensor paired with the variant's by name, or by position when the names differ):

- an image input (rank 4, 1 or 3 channels, channels-first or -last) to any other image input with the same
  channels: each picture is taken to [0, 1] floats (UINT8 pixels / 255, INT8 pixels + 128 first, floats as
  they are) and made into the variant's input by ``preprocess.to_model_input`` (bilinear resize, layout,
  scale: what edgemux's client does to a camera frame);
- a tensor of the same shape in another datatype: quantized with the variant's (scale, zero point) when the
  variant is quantized and the interface is not, dequantized in the other direction, cast otherwise;
- identical tensors pass as they are (no copy).

Anything else (outputs of another shape, a 1001-class variant behind a 1000-class interface, a non-image
input of another shape) is refused when the app is registered, naming both tensors: a converter never guesses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgemux.runtime.dataplane.backends import InvalidInput, ModelInfo, Quantization
from edgemux.runtime.dataplane.preprocess import dequantize, to_model_input
from edgemux.runtime.dataplane.protocol import (
    DATATYPES,
    ProtocolError,
    TensorSpec,
    json_type,
    short_repr,
    tensor_quantization,
)

__all__ = ["Converter", "Interface", "InterfaceError"]

Convert = Callable[[np.ndarray], np.ndarray]
_QUANTIZED = ("UINT8", "INT8")
_FIELDS = ("inputs", "outputs")


class InterfaceError(ValueError):
    """An interface that is malformed, or that a variant cannot be fed through (the message says which
    tensors and why)."""


@dataclass(frozen=True)
class Interface:
    """The tensors an app's clients send and receive: ``inputs``/``outputs`` (-1 for a variable dimension)
    and the (scale, zero point) of its quantized ones by name."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    quantization: tuple[tuple[str, Quantization], ...] = ()

    @classmethod
    def of(cls, info: ModelInfo) -> Interface:
        """A variant's own tensors, as an interface (what an app inherits from its first variant)."""
        return cls(info.inputs, info.outputs, info.quantization)

    @classmethod
    def parse(cls, doc: Any, where: str = "interface") -> Interface:
        """``{"inputs": [{"name", "datatype", "shape"[, "parameters": {"quantization": {"scale",
        "zero_point"}}]}], "outputs": [...]}`` (the model metadata's form); ``InterfaceError`` naming the field."""
        if not isinstance(doc, dict):
            raise InterfaceError(f"{where}: expected an object with 'inputs' and 'outputs', got {json_type(doc)}")
        extra = sorted(k for k in doc if k not in _FIELDS)
        if extra:
            raise InterfaceError(f"{where}: unknown field '{extra[0]}' (known: inputs, outputs)")
        quant: list[tuple[str, Quantization]] = []
        sides = []
        for side in _FIELDS:
            items = doc.get(side)
            if not isinstance(items, list) or not items:
                raise InterfaceError(f"{where}.{side}: expected a non-empty list of tensors, got {short_repr(items)}")
            specs = []
            for i, t in enumerate(items):
                at = f"{where}.{side}[{i}]"
                if not isinstance(t, dict):
                    raise InterfaceError(f"{at}: expected an object, got {json_type(t)}")
                bad = sorted(k for k in t if k not in ("name", "datatype", "shape", "parameters"))
                if bad:
                    raise InterfaceError(f"{at}: unknown field '{bad[0]}' (known: name, datatype, shape, parameters)")
                name, dtype, shape = t.get("name"), t.get("datatype"), t.get("shape")
                if not isinstance(name, str) or not name or dtype not in DATATYPES:
                    raise InterfaceError(f"{at}: 'name' must be a non-empty string and 'datatype' one of "
                                         f"{', '.join(DATATYPES)}, got {short_repr(name)} and {short_repr(dtype)}")
                if (not isinstance(shape, list)
                        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= -1 for d in shape)):
                    raise InterfaceError(f"{at}: 'shape' must be a list of integers >= -1, got {short_repr(shape)}")
                specs.append(TensorSpec(name, dtype, tuple(shape)))
                try:
                    q = tensor_quantization(t, at)  # the model metadata's rule, one place
                except ProtocolError as e:
                    raise InterfaceError(e.message) from None
                if q is not None:
                    quant.append((name, Quantization(*q)))
            sides.append(tuple(specs))
        return cls(sides[0], sides[1], tuple(sorted(quant)))

    def as_dict(self) -> dict[str, Any]:
        """The form :meth:`parse` reads (the model metadata's tensors)."""
        quant = dict(self.quantization)

        def spec(s: TensorSpec) -> dict[str, Any]:
            d: dict[str, Any] = {"name": s.name, "datatype": s.datatype, "shape": list(s.shape)}
            if s.name in quant:
                d["parameters"] = {"quantization": quant[s.name].as_dict()}
            return d

        return {"inputs": [spec(s) for s in self.inputs], "outputs": [spec(s) for s in self.outputs]}


def _pairs(mine: Sequence[TensorSpec], theirs: Sequence[TensorSpec], side: str) -> list[tuple[TensorSpec, TensorSpec]]:
    """The interface's tensors paired with the variant's: by name, else by position."""
    if {s.name for s in mine} == {s.name for s in theirs}:
        by_name = {s.name: s for s in theirs}
        return [(s, by_name[s.name]) for s in mine]
    if len(mine) == len(theirs):
        return list(zip(mine, theirs))
    raise InterfaceError(f"the app's {side} ({', '.join(s.name for s in mine)}) and the variant's "
                         f"({', '.join(s.name for s in theirs)}) neither share their names nor their number")


def _fmt(s: TensorSpec) -> str:
    return f"'{s.name}' {s.datatype} [{','.join(str(d) for d in s.shape)}]"


def _same_shape(a: TensorSpec, b: TensorSpec) -> bool:
    return len(a.shape) == len(b.shape) and all(x == y or -1 in (x, y) for x, y in zip(a.shape, b.shape))


def _image_channels(s: TensorSpec) -> int | None:
    if len(s.shape) != 4 or s.datatype not in ("UINT8", "INT8", "FP16", "FP32"):
        return None
    if s.shape[3] in (1, 3):
        return s.shape[3]
    return s.shape[1] if s.shape[1] in (1, 3) else None


def _unit_pictures(array: np.ndarray, spec: TensorSpec) -> list[np.ndarray]:
    """Each picture of a batch as (H, W, C) floats in [0, 1]."""
    x = np.asarray(array)
    if spec.datatype == "UINT8":
        unit = x.astype(np.float32) / np.float32(255.0)
    elif spec.datatype == "INT8":
        unit = (x.astype(np.float32) + np.float32(128.0)) / np.float32(255.0)
    else:
        unit = x.astype(np.float32)
    if spec.shape[3] not in (1, 3):  # channels first
        unit = unit.transpose(0, 2, 3, 1)
    return list(unit)


def _image(mine: TensorSpec, theirs: TensorSpec) -> Convert:
    def convert(array: np.ndarray) -> np.ndarray:
        pictures = _unit_pictures(array, mine)
        if len(pictures) > 1 and theirs.shape[0] == 1:
            raise InvalidInput(f"input '{mine.name}': a batch of {len(pictures)}, and the device's variant takes "
                               "one picture at a time")
        return np.concatenate([to_model_input(p, theirs) for p in pictures], axis=0)
    return convert


def _numeric(src: TensorSpec, dst: TensorSpec, quant: Mapping[str, Quantization], src_is_variant: bool,
             variant_quant: Mapping[str, Quantization]) -> Convert:
    """Same shape, another datatype: (de)quantize where one side is quantized, else cast."""
    qs = (variant_quant if src_is_variant else quant).get(src.name)
    qd = (quant if src_is_variant else variant_quant).get(dst.name)
    target = DATATYPES[dst.datatype]
    if qs is not None and src.datatype in _QUANTIZED and dst.datatype not in _QUANTIZED:
        return lambda a: dequantize(a, qs.scale, qs.zero_point).astype(target)
    if qd is not None and dst.datatype in _QUANTIZED and src.datatype not in _QUANTIZED:
        info = np.iinfo(target)
        return lambda a: np.clip(np.rint(np.asarray(a, np.float32) / np.float32(qd.scale)) + qd.zero_point,
                                 info.min, info.max).astype(target)
    return lambda a: np.asarray(a).astype(target)


class Converter:
    """Feeds the variant ``info`` through ``interface``: :meth:`inputs` turns a request's tensors (by the
    interface's names) into the variant's, :meth:`outputs` the variant's answer into the interface's.
    ``InterfaceError`` at construction when some tensor cannot be converted (see the module docstring);
    ``identity`` when nothing needs converting (the request path then does no work at all)."""

    def __init__(self, interface: Interface, info: ModelInfo) -> None:
        self.interface = interface
        quant, vquant = dict(interface.quantization), dict(info.quantization)
        self._in: list[tuple[str, str, Convert | None]] = []
        for mine, theirs in _pairs(interface.inputs, info.inputs, "inputs"):
            if mine == theirs and quant.get(mine.name) == vquant.get(theirs.name):
                self._in.append((mine.name, theirs.name, None))
            elif _image_channels(mine) is not None and _image_channels(mine) == _image_channels(theirs):
                self._in.append((mine.name, theirs.name, _image(mine, theirs)))
            elif _same_shape(mine, theirs):
                self._in.append((mine.name, theirs.name, _numeric(mine, theirs, quant, False, vquant)))
            else:
                raise InterfaceError(f"the app's input {_fmt(mine)} cannot be fed to the variant's {_fmt(theirs)}: "
                                     "only images (rank 4, 1 or 3 channels) are resized and laid out anew")
        self._out: list[tuple[str, str, Convert | None]] = []
        for mine, theirs in _pairs(interface.outputs, info.outputs, "outputs"):
            if mine == theirs and quant.get(mine.name) == vquant.get(theirs.name):
                self._out.append((theirs.name, mine.name, None))
            elif _same_shape(mine, theirs):
                self._out.append((theirs.name, mine.name, _numeric(theirs, mine, quant, True, vquant)))
            else:
                raise InterfaceError(f"the variant's output {_fmt(theirs)} cannot be answered as the app's "
                                     f"{_fmt(mine)}: outputs convert between datatypes of one shape only")
        self.identity = all(f is None and a == b for a, b, f in (*self._in, *self._out))

    def inputs(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A request's tensors (validated against the interface) as the variant takes them."""
        if self.identity:
            return dict(arrays)
        return {theirs: (arrays[mine] if f is None else f(arrays[mine])) for mine, theirs, f in self._in}

    def outputs(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The variant's outputs as the interface answers them."""
        if self.identity:
            return dict(arrays)
        return {mine: (arrays[theirs] if f is None else f(arrays[theirs])) for theirs, mine, f in self._out
                if theirs in arrays}
