"""TensorFlow Lite models on LiteRT: for real on a CPU, and on a Coral Edge TPU through libedgetpu's delegate.

LiteRT (PyPI ``ai-edge-litert``, the successor of ``tflite-runtime``; the ``litert`` extra) is imported only
when a ``.tflite`` model is read or loaded: the core, and an agent serving ONNX models only, never import it.

- :func:`signature` reads a ``.tflite`` file's tensors (names, Triton datatypes, shapes) and each tensor's
  quantization (scale and zero point: ``real = scale * (q - zero_point)``) without preparing the graph, so
  that the file of a model compiled for the Edge TPU (``*_edgetpu.tflite``, whose ``edgetpu-custom-op`` only
  libedgetpu can run) gives its signature on any host: an emulated Edge TPU serves it with the tensors a real
  one would take.
- :class:`LiteRTBackend` runs a ``.tflite`` model: one interpreter per loaded model with ``threads`` CPU
  threads (XNNPACK), and with ``delegate="edgetpu"`` on an Edge TPU (``load_delegate(EDGETPU_LIBRARY)``). A
  LiteRT interpreter is not thread-safe: each model's runs are serialized on its own lock (concurrency
  across instances is the spatial discipline's, one interpreter each).
- :func:`edgetpu_delegate_available` says whether libedgetpu loads on this host (the device is then real).

Every failure is one line naming the model and what to do: a model compiled for the Edge TPU asked to run
without it, a custom operator LiteRT does not know (a broken model), LiteRT or libedgetpu not installed.
Units: times in ms, memory in MB (10**6 bytes).
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgemux.runtime.dataplane.backends import (
    Backend,
    BackendError,
    ModelInfo,
    ModelNotFound,
    ModelSource,
    Quantization,
    batchable,
)
from edgemux.runtime.dataplane.instances import Instance, InstanceFactory, cpu_cores, threads_for
from edgemux.runtime.dataplane.protocol import DATATYPES, ProtocolError, TensorSpec, datatype_of

__all__ = ["EDGETPU_LIBRARY", "EDGETPU_OP", "LiteRTBackend", "LiteRTInstances", "TFLITE_SUFFIX",
           "compiled_for_edgetpu", "edgetpu_delegate_available", "signature"]

TFLITE_SUFFIX = ".tflite"
# The custom operator the Edge TPU compiler puts in a model's graph: the part that runs on the TPU.
EDGETPU_OP = b"edgetpu-custom-op"
# libedgetpu's shared library (Coral's Debian packages libedgetpu1-std / libedgetpu1-max install it);
# EDGEMUX_EDGETPU_LIBRARY overrides it (a Dev Board's or a custom build's path).
EDGETPU_LIBRARY = "libedgetpu.so.1"
_INSTALL = "install it with: pip install 'edgemux[litert]'"
_MB = 1e6


def _litert() -> Any:
    """The LiteRT interpreter module; ``BackendError`` 503 when the extra is not installed."""
    try:
        from ai_edge_litert import interpreter
    except ImportError:
        raise BackendError(f"serving a .tflite model needs LiteRT (ai-edge-litert), which is not installed: "
                           f"{_INSTALL}", 503) from None
    return interpreter


def _tflite_path(source: ModelSource) -> Path:
    if source.path is None or not source.path.endswith(TFLITE_SUFFIX):
        raise BackendError(f"LiteRT runs .tflite files; {source.describe()} is not one")
    path = Path(source.path)
    if not path.is_file():
        raise ModelNotFound(f"TFLite file {source.path!r} does not exist")
    return path


def compiled_for_edgetpu(path: Path) -> bool:
    """Whether the ``.tflite`` file at ``path`` holds the Edge TPU compiler's custom operator (its graph runs
    only with libedgetpu's delegate)."""
    return EDGETPU_OP in path.read_bytes()


def _spec(detail: dict[str, Any], model: str) -> tuple[TensorSpec, Quantization | None]:
    name = detail["name"] or f"tensor_{detail['index']}"  # a graph may leave a tensor unnamed
    try:
        datatype = datatype_of(np.dtype(detail["dtype"]), name)
    except ProtocolError:
        raise BackendError(f"model '{model}': tensor '{name}' has type {np.dtype(detail['dtype'])}, which "
                           "edgemux cannot serve") from None
    shape_sig = detail.get("shape_signature")
    dims = tuple(int(d) for d in (shape_sig if shape_sig is not None and len(shape_sig) else detail["shape"]))
    scale, zero = detail.get("quantization", (0.0, 0))
    quant = Quantization(float(scale), int(zero)) if scale else None
    return TensorSpec(name, datatype, tuple(d if d >= 0 else -1 for d in dims)), quant


def _read(interpreter: Any, model: str) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...],
                                                  dict[str, Quantization], list[int], list[int]]:
    """(inputs, outputs, quantization by tensor name, input indices, output indices) of a constructed
    interpreter (not necessarily prepared)."""
    quant: dict[str, Quantization] = {}
    sides: list[tuple[tuple[TensorSpec, ...], list[int]]] = []
    for details in (interpreter.get_input_details(), interpreter.get_output_details()):
        specs = []
        for d in details:
            spec, q = _spec(d, model)
            specs.append(spec)
            if q is not None:
                quant[spec.name] = q
        sides.append((tuple(specs), [int(d["index"]) for d in details]))
    (inputs, in_idx), (outputs, out_idx) = sides
    return inputs, outputs, quant, in_idx, out_idx


def signature(source: ModelSource, model: str = "") -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...],
                                                                dict[str, Quantization]]:
    """(inputs, outputs, quantization by tensor name) of the ``.tflite`` file ``source.path``, read without
    preparing its graph (an Edge TPU build gives its signature on a host without libedgetpu)."""
    path = _tflite_path(source)
    interpreter = _construct(_litert(), path, model or source.describe(), threads=1)
    inputs, outputs, quant, _, _ = _read(interpreter, model or source.describe())
    return inputs, outputs, quant


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _construct(litert: Any, path: Path, model: str, *, threads: int, delegates: list[Any] | None = None) -> Any:
    try:
        return litert.Interpreter(model_path=str(path), num_threads=threads, experimental_delegates=delegates)
    except (ValueError, RuntimeError) as e:  # not a TFLite flatbuffer, a truncated file...
        raise BackendError(f"cannot read model '{model}' from {path}: {_first_line(e)}") from None


def edgetpu_library() -> str:
    """The libedgetpu library to load (``EDGEMUX_EDGETPU_LIBRARY``, else ``libedgetpu.so.1``)."""
    return os.environ.get("EDGEMUX_EDGETPU_LIBRARY") or EDGETPU_LIBRARY


@functools.lru_cache(maxsize=4)
def _delegate_or_error(library: str) -> tuple[Any, str | None]:
    # The library is opened on its own first: where it is absent (most hosts) LiteRT is not even imported, so
    # an agent with an Edge TPU device and no Coral starts without it; and LiteRT's Delegate, failing to open
    # a library, leaves an object whose destructor raises ("Exception ignored" in every agent's log).
    try:
        ctypes.CDLL(library)
    except OSError as e:
        return None, _first_line(e)
    try:
        return _litert().load_delegate(library), None
    except BackendError as e:  # LiteRT is not installed
        return None, e.message
    except (OSError, ValueError, RuntimeError) as e:  # the library finds no Edge TPU
        return None, _first_line(e)


def edgetpu_delegate_available() -> tuple[bool, str]:
    """(whether libedgetpu's delegate loads on this host, why not when it does not)."""
    delegate, why = _delegate_or_error(edgetpu_library())
    return delegate is not None, why or ""


@dataclass
class _Handle:
    interpreter: Any
    inputs: list[int]     # tensor indices, in the order of ModelInfo.inputs
    outputs: list[int]
    lock: threading.Lock  # a LiteRT interpreter runs one invocation at a time

    def invoke(self, info: ModelInfo, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One run of the interpreter on ``inputs`` (by ``info``'s input names); its outputs, copied out of the
        interpreter's buffers. The caller holds ``lock`` (an instance runs one request at a time anyway)."""
        it = self.interpreter
        for spec, index in zip(info.inputs, self.inputs):
            it.set_tensor(index, np.ascontiguousarray(inputs[spec.name]))
        it.invoke()
        return {spec.name: np.array(it.get_tensor(index)) for spec, index in zip(info.outputs, self.outputs)}


class LiteRTBackend(Backend):
    """Real inference with LiteRT: one interpreter per loaded ``.tflite`` model, with ``threads`` CPU threads;
    ``delegate="edgetpu"`` runs the models on a Coral Edge TPU through libedgetpu (``BackendError`` 503 at
    construction when it does not load here). A model compiled for the Edge TPU without the delegate, or a
    graph LiteRT cannot prepare, is refused at load with one line (400)."""

    emulated = False

    def __init__(self, threads: int = 1, *, delegate: str | None = None) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise BackendError(f"threads must be a positive int, got {threads!r}")
        if delegate not in (None, "edgetpu"):
            raise BackendError(f"unknown LiteRT delegate {delegate!r} (known: edgetpu)")
        super().__init__()
        self._litert = _litert()
        self.threads = threads
        self.delegate = delegate
        self._delegates: list[Any] | None = None
        if delegate == "edgetpu":
            lib = edgetpu_library()
            loaded, why = _delegate_or_error(lib)
            if loaded is None:
                raise BackendError(f"the Edge TPU runtime {lib} does not load on this host ({why}): install "
                                   "libedgetpu (Coral's libedgetpu1-std package) and plug the accelerator in, "
                                   "or serve the device emulated", 503)
            self._delegates = [loaded]
        self.name = "litert+edgetpu" if delegate else "litert"
        self.on_cpu_threads = delegate is None

    def _open(self, model: str, source: ModelSource) -> tuple[ModelInfo, Any]:
        path = _tflite_path(source)
        if self.delegate is None and compiled_for_edgetpu(path):
            raise BackendError(f"model '{model}' ({path.name}) is compiled for the Edge TPU (its graph holds "
                               f"{EDGETPU_OP.decode()}): it runs only on an edgetpu device with libedgetpu; "
                               "serve its CPU build (the file without _edgetpu) on a cpu device")
        interpreter = _construct(self._litert, path, model, threads=self.threads, delegates=self._delegates)
        try:
            interpreter.allocate_tensors()
        except RuntimeError as e:  # a custom operator LiteRT does not know, a graph it cannot prepare
            raise BackendError(f"cannot prepare model '{model}' ({path.name}) on LiteRT: {_first_line(e)}") from None
        inputs, outputs, quant, in_idx, out_idx = _read(interpreter, model)
        profile = source.profile
        memory = profile.memory_total_mb if profile is not None and profile.memory_total_mb is not None else None
        where = "Edge TPU (libedgetpu)" if self.delegate else f"CPU, {self.threads} threads"
        info = ModelInfo(
            name=model, backend=self.name, emulated=False, source=source.describe(), inputs=inputs,
            outputs=outputs, batchable=batchable(inputs, outputs),
            memory_mb=float(memory if memory is not None else path.stat().st_size / _MB),
            switch_ms=float(profile.switch_ms) if profile is not None else 0.0,
            provenance=f"measured: LiteRT ({where}) on {platform.node() or 'this host'}",
            quantization=tuple(sorted(quant.items())), params=profile.params_key if profile else None)
        return info, _Handle(interpreter, in_idx, out_idx, threading.Lock())

    def _execute(self, info: ModelInfo, handle: Any, inputs: dict[str, np.ndarray],
                 batch: int) -> dict[str, np.ndarray]:
        h: _Handle = handle
        with h.lock:
            try:
                return h.invoke(info, inputs)
            except (RuntimeError, ValueError) as e:
                raise BackendError(f"model '{info.name}' failed in {self.name}: {_first_line(e)}", 500) from None


# ------------------------------------------------------------------------------------------- instances


class _LiteRTInstance(Instance):
    def __init__(self, handle: _Handle, info: ModelInfo, share: float, threads: int) -> None:
        self._handle = handle
        self._info = info
        self.share = share
        self.threads = threads

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._handle.invoke(self._info, inputs)

    def close(self) -> None:
        self._handle.interpreter = None  # LiteRT frees an interpreter when its last reference goes


class LiteRTInstances(InstanceFactory):
    """LiteRT interpreters of the ``.tflite`` model ``source`` on this host's CPU (``cores`` cores), one per
    instance, each with ``threads_for(share, cores)`` threads: the spatial discipline's shares applied to a
    TFLite model as to an ONNX one (each interpreter holds its own copy of the weights: LiteRT's Python API
    shares none)."""

    def __init__(self, source: ModelSource, *, cores: int | None = None, seed: int = 0) -> None:
        self.source = source
        self.path = _tflite_path(source)
        self.cores = cpu_cores() if cores is None else cores
        self._seed = seed
        self._info: ModelInfo | None = None

    def make(self, share: float) -> Instance:
        threads = threads_for(share, self.cores)
        backend = LiteRTBackend(threads)
        info, handle = backend._open(self.path.name, self.source)
        self._info = info
        return _LiteRTInstance(handle, info, share, threads)

    def warm_inputs(self) -> dict[str, np.ndarray]:
        if self._info is None:
            self.make(1.0).close()
        assert self._info is not None
        rng = np.random.default_rng(self._seed)
        out = {}
        for spec in self._info.inputs:
            shape = tuple(d if d > 0 else 1 for d in spec.shape)
            dtype = DATATYPES[spec.datatype]
            if np.issubdtype(dtype, np.integer):
                info = np.iinfo(dtype)
                out[spec.name] = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
            else:
                out[spec.name] = rng.standard_normal(shape).astype(dtype)
        return out

    def describe(self) -> str:
        return f"LiteRT interpreters of {self.path.name} on {self.cores} cores, a copy of the weights per instance"
