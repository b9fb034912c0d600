"""Inference backends: what actually executes a model for a device worker.

A :class:`Backend` loads models (``load``), checks a request's tensors against the model's declared inputs
with Triton-style messages, and executes requests (``run``, and ``run_batch`` for dynamic batching: the
requests are concatenated along axis 0, run as one call, and the outputs split back). ``run`` blocks; the
device worker (``edgemux.runtime.dataplane.worker``) calls it from its own threads.

* :class:`OnnxRuntimeBackend` runs the ONNX graph for real with onnxruntime (CPU, or CUDA when
  ``make_backend("cuda")`` finds the provider).
* :class:`~edgemux.runtime.dataplane.litert.LiteRTBackend` runs ``.tflite`` models for real with LiteRT (CPU,
  or a Coral Edge TPU through libedgetpu); :class:`FormatBackend` is a real device's backend, each model on
  the runtime of its file's format (ONNX on onnxruntime, ``.tflite`` on LiteRT, which is imported only then).
* :class:`EmulatedBackend` stands in for devices that are not physically here (Edge TPU, Jetson, FPGA): it
  sleeps for a service time drawn from the model's :class:`~edgemux.profiles.types.Profile` and returns zero
  tensors of the declared output shapes. ``emulated`` is always True and every :class:`ModelInfo` it returns
  carries the profile's provenance, so every report can say which numbers came from a real device.

Units: times in ms unless a name ends in ``_s``; memory in MB (10**6 bytes).
"""

from __future__ import annotations

import abc
import platform
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from edgemux.errors import EdgemuxError
from edgemux.profiles.types import DeviceKind, Profile
from edgemux.runtime.dataplane.protocol import DATATYPES, ProtocolError, TensorSpec, datatype_of

__all__ = [
    "Backend",
    "BackendError",
    "BackendKind",
    "EmulatedBackend",
    "FormatBackend",
    "InvalidInput",
    "ModelInfo",
    "ModelNotFound",
    "ModelSource",
    "OnnxRuntimeBackend",
    "Quantization",
    "batchable",
    "is_tflite",
    "make_backend",
]

BackendKind = Literal["onnxruntime", "emulated", "cuda", "litert"]
_MB = 1e6  # bytes per MB, as everywhere in edgemux's memory figures

# onnxruntime's type strings -> Triton datatype names (the KServe v2 vocabulary of runtime.dataplane.protocol)
_ORT_TYPES: dict[str, str] = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}
# ONNX TensorProto element types (onnx.TensorProto.FLOAT == 1 ...) -> Triton datatype names
_ONNX_ELEM: dict[int, str] = {1: "FP32", 2: "UINT8", 3: "INT8", 4: "UINT16", 5: "INT16", 6: "INT32", 7: "INT64",
                              8: "BYTES", 9: "BOOL", 10: "FP16", 11: "FP64", 12: "UINT32", 13: "UINT64"}


class BackendError(EdgemuxError):
    """A request or model the backend cannot serve. ``status`` is the HTTP status the agent answers with
    (400 bad input, 404 unknown model, 409 name conflict, 500 backend failure, 503 unavailable)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class InvalidInput(BackendError):
    """Inputs that do not match the model's declared inputs (name, datatype, shape): status 400."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 400)


class ModelNotFound(BackendError):
    """A model that is not loaded (or a source that does not exist): status 404."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 404)


# ------------------------------------------------------------------------------------------- model source


def is_tflite(source: ModelSource) -> bool:
    """Whether ``source`` is a TensorFlow Lite file (``.tflite``), which LiteRT runs (not onnxruntime)."""
    return source.path is not None and source.path.lower().endswith(".tflite")


@dataclass(frozen=True)
class Quantization:
    """One tensor's affine quantization (a TFLite model's INT8/UINT8 tensors):
    ``real = scale * (quantized - zero_point)``."""

    scale: float
    zero_point: int

    def as_dict(self) -> dict[str, float | int]:
        return {"scale": self.scale, "zero_point": self.zero_point}



@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: a zoo model (``zoo``, at ``input_size`` pixels, weights seeded by ``seed``)
    or an ONNX file (``path``); exactly one of the two, except that an emulated model may give neither and
    declare its tensors in ``inputs``/``outputs`` instead.

    ``profile`` drives emulation (service time per batch size, ``switch_ms``) and, for a real backend, adds
    its ``switch_ms`` to the model-switch cost the worker pays (see ``ModelInfo.switch_ms``).
    ``inputs``/``outputs`` override the graph's declared tensors (used when there is no graph).
    ``cache_dir`` is where zoo models are built (``zoo.default_cache_dir()`` when None).
    """

    zoo: str | None = None
    path: str | None = None
    input_size: int | tuple[int, int] | None = None
    seed: int = 0
    profile: Profile | None = None
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        if self.zoo is not None and self.path is not None:
            raise BackendError("a model source is either a zoo model or an ONNX file, not both")
        if self.path is not None:
            object.__setattr__(self, "path", str(self.path))
        if self.cache_dir is not None:
            object.__setattr__(self, "cache_dir", str(self.cache_dir))

    @classmethod
    def parse(cls, text: str, *, input_size: int | tuple[int, int] | None = None,
              profile: Profile | None = None, seed: int = 0) -> ModelSource:
        """``zoo:NAME`` (optionally ``zoo:NAME@SIZE`` with SIZE ``224`` or ``320x240``, height x width in
        pixels) or a path to an ONNX file."""
        if text.startswith("zoo:"):
            name, _, size = text[4:].partition("@")
            if size:
                try:
                    h, _, w = size.partition("x")
                    input_size = (int(h), int(w or h))
                except ValueError:
                    raise BackendError(f"bad input size {size!r} in {text!r}: expected 224 or 320x240") from None
            return cls(zoo=name, input_size=input_size, seed=seed, profile=profile)
        return cls(path=text, profile=profile)

    def describe(self) -> str:
        """One line: ``zoo:squeezenet1_1@64x64`` or the file path, or ``declared tensors``."""
        if self.zoo is not None:
            if self.input_size is None:
                return f"zoo:{self.zoo}"
            h, w = (self.input_size, self.input_size) if isinstance(self.input_size, int) else self.input_size
            return f"zoo:{self.zoo}@{h}x{w}"
        return self.path if self.path is not None else "declared tensors"

    def onnx_path(self) -> Path:
        """The ONNX file to load (a zoo model is built and cached on first use)."""
        if self.zoo is not None:
            from edgemux.runtime import zoo

            return zoo.path(self.zoo, input_size=self.input_size, seed=self.seed, cache_dir=self.cache_dir)
        if self.path is None:
            raise BackendError("this model source names no zoo model and no ONNX file")
        p = Path(self.path)
        if not p.is_file():
            raise ModelNotFound(f"ONNX file {self.path!r} does not exist")
        return p


@dataclass(frozen=True)
class ModelInfo:
    """A loaded model as its backend sees it.

    ``inputs``/``outputs`` are the declared tensors (-1 for a symbolic dimension); ``batchable`` is True when
    every input and output has a symbolic leading (batch) dimension, so requests can be concatenated;
    ``memory_mb`` an estimate (the profile's static + runtime memory when known, else the weights' size);
    ``switch_ms`` the model-switch cost a sequential worker pays before running this model after another
    (the profile's ``switch_ms``, 0 without a profile); ``provenance`` where the timing numbers come from
    (the profile's provenance for an emulated model, the backend and host for a real one);
    ``quantization`` the (tensor name, :class:`Quantization`) pairs of its quantized tensors (a TFLite
    model's; empty for a float model); ``params`` the co-compiled Edge TPU parameter set it belongs to
    (``cocompiled:<set>``, from its profile: a sequential worker pays no switch between members; None: its own).
    """

    name: str
    backend: str
    emulated: bool
    source: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    batchable: bool
    memory_mb: float
    switch_ms: float
    provenance: str
    quantization: tuple[tuple[str, Quantization], ...] = ()
    params: str | None = None

    @property
    def platform(self) -> str:
        """The model metadata's ``platform``: ``emulated``, ``litert`` (a .tflite file on LiteRT, on a CPU or
        an Edge TPU) or ``onnxruntime`` (on a CPU or CUDA)."""
        if self.emulated:
            return "emulated"
        return "litert" if self.backend.startswith("litert") else "onnxruntime"

    def as_dict(self) -> dict[str, Any]:
        """Plain values (for the agent's model metadata and status pages)."""
        quant = {"quantization": {n: q.as_dict() for n, q in self.quantization}} if self.quantization else {}
        return {**quant, 
            "name": self.name, "backend": self.backend, "emulated": self.emulated, "source": self.source,
            "inputs": [_spec_dict(s) for s in self.inputs], "outputs": [_spec_dict(s) for s in self.outputs],
            "batchable": self.batchable, "memory_mb": self.memory_mb, "switch_ms": self.switch_ms,
            "provenance": self.provenance,
        }


def _spec_dict(s: TensorSpec) -> dict[str, Any]:
    return {"name": s.name, "datatype": s.datatype, "shape": list(s.shape)}


def _fmt(shape: Sequence[int]) -> str:
    """Triton's way of printing a shape: ``[1,3,224,224]``."""
    return "[" + ",".join(str(int(d)) for d in shape) + "]"


def _names(specs: Sequence[TensorSpec]) -> str:
    return ", ".join(f"'{s.name}'" for s in specs) if specs else "nothing"


def _dim(d: object) -> int:
    """A declared dimension: a positive int, or -1 for a symbolic/unknown one."""
    return int(d) if isinstance(d, (int, np.integer)) and not isinstance(d, bool) and int(d) > 0 else -1


def batchable(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> bool:
    """Whether requests can be concatenated: every input and output has a symbolic leading dimension."""
    return bool(inputs) and all(len(s.shape) >= 1 and s.shape[0] == -1 for s in (*inputs, *outputs))


# ------------------------------------------------------------------------------------------------ backend


class Backend(abc.ABC):
    """Loads and executes models. Thread-safe: ``run`` may be called from several worker threads at once.

    Subclasses implement ``_open`` (read a model, return its info and a handle) and ``_execute`` (run one
    validated, possibly concatenated batch). ``load`` is idempotent per model name.
    """

    name: str = "backend"
    emulated: bool = False
    # whether its models run on this host's CPU threads (a spatial share is then whole threads of the cores)
    on_cpu_threads: bool = False

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards the model tables (loads are rare, runs read them)
        self._models: dict[str, tuple[ModelInfo, ModelSource, Any]] = {}

    # -- model management ------------------------------------------------------------------------------

    def load(self, model: str, source: ModelSource) -> ModelInfo:
        """Load ``model`` from ``source`` and return its info. Loading a name already loaded from an equal
        source returns the existing info (idempotent); from another source it is a 409 ``BackendError``
        (unload it first: a model name always means one graph)."""
        if not model or not isinstance(model, str):
            raise BackendError(f"model name must be a non-empty string, got {model!r}")
        with self._lock:
            have = self._models.get(model)
        if have is not None:
            if have[1] == source:
                return have[0]
            raise BackendError(f"model '{model}' is already loaded from {have[1].describe()}; unload it before "
                               f"loading it from {source.describe()}", 409)
        # Opening (building a zoo model, creating a session) is slow: do it outside the lock so runs of
        # other models go on meanwhile; a concurrent load of the same name keeps the first one stored.
        info, handle = self._open(model, source)
        with self._lock:
            have = self._models.setdefault(model, (info, source, handle))
        if have[1] != source:
            raise BackendError(f"model '{model}' is already loaded from {have[1].describe()}", 409)
        return have[0]

    def unload(self, model: str) -> None:
        """Forget ``model`` (its session and memory). Unloading a model that is not loaded is a 404."""
        with self._lock:
            if self._models.pop(model, None) is None:
                raise ModelNotFound(f"model '{model}' is not loaded")

    def loaded(self) -> dict[str, ModelInfo]:
        """The loaded models by name."""
        with self._lock:
            return {name: entry[0] for name, entry in self._models.items()}

    def info(self, model: str) -> ModelInfo:
        """The info of a loaded model; ``ModelNotFound`` (404) otherwise."""
        return self._entry(model)[0]

    def source(self, model: str) -> ModelSource:
        """Where a loaded model came from (the spatial discipline builds its instances from it);
        ``ModelNotFound`` (404) otherwise."""
        return self._entry(model)[1]

    def for_model(self, model: str) -> Backend:
        """The backend that runs ``model`` (itself; a :class:`FormatBackend`'s, the runtime of its format)."""
        return self

    def _entry(self, model: str) -> tuple[ModelInfo, ModelSource, Any]:
        with self._lock:
            entry = self._models.get(model)
            if entry is None:
                known = ", ".join(f"'{m}'" for m in sorted(self._models)) or "none"
                raise ModelNotFound(f"model '{model}' is not loaded on backend {self.name} (loaded: {known})")
            return entry

    # -- execution -------------------------------------------------------------------------------------

    def check_inputs(self, model: str, inputs: Mapping[str, np.ndarray]) -> int:
        """Check ``inputs`` against the model's declared inputs; return the batch size (leading dimension
        when the model is batchable, else 1). Raises ``InvalidInput`` (400) with Triton's messages:
        ``unexpected shape for input 'input': expected [1,3,224,224], got [3,224,224]``."""
        info = self._entry(model)[0]
        return _check(info, inputs)

    def run(self, model: str, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Execute one request (blocking): output name -> array."""
        info, _, handle = self._entry(model)
        batch = _check(info, inputs)
        arrays = {k: np.asarray(v) for k, v in inputs.items()}
        return self._execute(info, handle, arrays, batch)

    def run_batch(self, model: str, requests: Sequence[Mapping[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """Execute several requests of one model as one batch and return each request's outputs.

        When the model is batchable, the requests' inputs are concatenated along axis 0 (each request may
        itself carry n >= 1 items), executed in one call, and the outputs split back by each request's item
        count. A model with a fixed batch dimension cannot be concatenated: its requests run one after
        another (no batching gain, as the simulator assumes without a batching law).
        """
        if not requests:
            return []
        info, _, handle = self._entry(model)
        counts = [_check(info, r) for r in requests]
        if len(requests) == 1 or not info.batchable:
            return [self._execute(info, handle, {k: np.asarray(v) for k, v in r.items()}, n)
                    for r, n in zip(requests, counts)]
        joined = {s.name: np.concatenate([np.asarray(r[s.name]) for r in requests], axis=0) for s in info.inputs}
        total = sum(counts)
        out = self._execute(info, handle, joined, total)
        bounds = np.cumsum(counts)[:-1]
        split: list[dict[str, np.ndarray]] = [{} for _ in requests]
        for name, array in out.items():
            if array.ndim == 0 or array.shape[0] != total:
                raise BackendError(f"model '{model}': output '{name}' has shape {_fmt(array.shape)}, whose leading "
                                   f"dimension is not the batch of {total}: cannot split it per request", 500)
            for i, part in enumerate(np.split(array, bounds, axis=0)):
                split[i][name] = part
        return split

    @abc.abstractmethod
    def _open(self, model: str, source: ModelSource) -> tuple[ModelInfo, Any]:
        """Read the model: its info and a backend-specific handle (a session, a profile...)."""

    @abc.abstractmethod
    def _execute(self, info: ModelInfo, handle: Any, inputs: dict[str, np.ndarray],
                 batch: int) -> dict[str, np.ndarray]:
        """Run validated inputs carrying ``batch`` items; return every declared output."""


def _check(info: ModelInfo, inputs: Mapping[str, np.ndarray]) -> int:
    declared = {s.name: s for s in info.inputs}
    for name in inputs:
        if name not in declared:
            raise InvalidInput(f"unexpected input '{name}': model '{info.name}' expects {_names(info.inputs)}")
    for s in info.inputs:
        if s.name not in inputs:
            raise InvalidInput(f"missing input '{s.name}' for model '{info.name}'")
    batch: int | None = None
    for s in info.inputs:
        array = np.asarray(inputs[s.name])
        try:
            got = datatype_of(array.dtype, s.name)
        except ProtocolError:  # complex, structured...: no wire datatype, so never what the model declares
            got = str(array.dtype)
        if got != s.datatype:
            raise InvalidInput(f"unexpected datatype for input '{s.name}': expected {s.datatype}, got {got}")
        shape = array.shape
        if len(shape) != len(s.shape) or any(e != -1 and e != g for g, e in zip(shape, s.shape)):
            raise InvalidInput(f"unexpected shape for input '{s.name}': expected {_fmt(s.shape)}, got {_fmt(shape)}")
        if info.batchable:
            if shape[0] < 1:
                raise InvalidInput(f"input '{s.name}' has an empty batch: shape {_fmt(shape)}")
            if batch is not None and shape[0] != batch:
                raise InvalidInput(f"inputs disagree on the batch size: '{s.name}' has {shape[0]}, "
                                   f"another input has {batch}")
            batch = shape[0]
    return batch if batch is not None else 1


# ------------------------------------------------------------------------------------------- onnxruntime


class OnnxRuntimeBackend(Backend):
    """Real inference with onnxruntime: one ``InferenceSession`` per loaded model, cached until unload.

    ``threads`` is the session's ``intra_op_num_threads`` (cores one inference may use); inter-op
    parallelism is 1 (the device worker decides how many requests run at once). ``providers`` defaults to
    the CPU provider; ``make_backend("cuda")`` passes CUDA first. Concurrent ``run`` calls on one session
    are safe (onnxruntime documents ``Run`` as thread-safe).
    """

    emulated = False

    def __init__(self, threads: int = 1, *, providers: Sequence[str] = ("CPUExecutionProvider",),
                 name: str = "onnxruntime") -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise BackendError(f"threads must be a positive int, got {threads!r}")
        super().__init__()
        self.threads = threads
        self.providers = tuple(providers)
        self.name = name
        self.on_cpu_threads = self.providers[0] == "CPUExecutionProvider"

    def _open(self, model: str, source: ModelSource) -> tuple[ModelInfo, Any]:
        import onnxruntime as ort  # imported here: the emulated-only agent never pays for it

        path = source.onnx_path()
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.threads
        opts.inter_op_num_threads = 1
        try:
            session = ort.InferenceSession(str(path), opts, providers=list(self.providers))
        except Exception as e:  # onnxruntime raises its own exception types for bad graphs
            raise BackendError(f"cannot load model '{model}' from {source.describe()}: {e}", 400) from e
        inputs = source.inputs or tuple(_ort_spec(x) for x in session.get_inputs())
        outputs = source.outputs or tuple(_ort_spec(x) for x in session.get_outputs())
        profile = source.profile
        memory = profile.memory_total_mb if profile is not None and profile.memory_total_mb is not None else None
        if memory is None:
            memory = path.stat().st_size / _MB  # the weights; activations come on top
        info = ModelInfo(
            name=model, backend=self.name, emulated=False, source=source.describe(), inputs=inputs,
            outputs=outputs, batchable=batchable(inputs, outputs), memory_mb=float(memory),
            switch_ms=float(profile.switch_ms) if profile is not None else 0.0,
            provenance=f"measured: {self.name} ({', '.join(session.get_providers())}, {self.threads} threads) "
                       f"on {platform.node() or 'this host'}", params=profile.params_key if profile else None)
        return info, session

    def _execute(self, info: ModelInfo, handle: Any, inputs: dict[str, np.ndarray],
                 batch: int) -> dict[str, np.ndarray]:
        names = [s.name for s in info.outputs]
        try:
            results = handle.run(names, inputs)
        except Exception as e:
            raise BackendError(f"model '{info.name}' failed in {self.name}: {e}", 500) from e
        return dict(zip(names, results))


def _ort_spec(node: Any) -> TensorSpec:
    datatype = _ORT_TYPES.get(node.type)
    if datatype is None:
        raise BackendError(f"tensor '{node.name}' has type {node.type}, which edgemux cannot serve", 400)
    return TensorSpec(node.name, datatype, tuple(_dim(d) for d in (node.shape or ())))


# ---------------------------------------------------------------------------------------------- emulated


@dataclass
class _EmulatedModel:
    profile: Profile


class EmulatedBackend(Backend):
    """A device that is not physically here, emulated from profiles.

    ``run`` sleeps for a service time (ms) drawn from the profile's distribution for the batch size, with a
    seeded ``numpy.random.Generator`` (one stream for the backend, drawn under a lock, so a given ``seed``
    and request order give the same times), and returns zero tensors of the declared output shapes (a
    symbolic batch dimension becomes the batch size, any other symbolic dimension 1). A batch size the
    profile has no entry for takes the sum of that many batch-1 draws: no batching gain, as the simulator
    assumes for a tenant without a batching law.

    Tensors come from the zoo graph's metadata for a zoo source (no weights are built; on an Edge TPU
    profile the input is the quantized model's uint8 NHWC image, see ``_edgetpu_input``), from the ONNX
    file's graph for a file source, or from the source's declared ``inputs``/``outputs``.

    ``sleep`` and ``timer`` (seconds) are injectable; ``samples`` keeps the last ``keep`` (sampled ms,
    measured ms, model, batch) tuples so tests and the profiler can compare the two.
    """

    name = "emulated"
    emulated = True

    def __init__(self, seed: int = 0, *, sleep: Callable[[float], None] = time.sleep,
                 timer: Callable[[], float] = time.perf_counter, keep: int = 10_000) -> None:
        super().__init__()
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        self._rng_lock = threading.Lock()  # numpy Generators are not thread-safe
        self._sleep = sleep
        self._timer = timer
        self._keep = keep
        self.samples: list[tuple[float, float, str, int]] = []

    def provenance(self, model: str) -> str:
        """Where ``model``'s timings come from: ``emulated from profile P (its provenance)``."""
        return self.info(model).provenance

    def _open(self, model: str, source: ModelSource) -> tuple[ModelInfo, Any]:
        profile = source.profile
        if profile is None:
            raise BackendError(f"emulated model '{model}' needs a profile (service times per batch size)")
        if not profile.exec:
            raise BackendError(f"profile {profile.name!r} has no execution times: cannot emulate model '{model}'")
        if 1 not in profile.exec:
            raise BackendError(f"profile {profile.name!r} has no batch-1 execution time "
                               f"(known batches: {sorted(profile.exec)})")
        inputs, outputs, weights_mb, quant = _declared(source)
        memory = profile.memory_total_mb if profile.memory_total_mb is not None else weights_mb
        info = ModelInfo(
            name=model, backend=self.name, emulated=True, source=source.describe(), inputs=inputs,
            outputs=outputs, batchable=batchable(inputs, outputs), memory_mb=float(memory),
            switch_ms=float(profile.switch_ms),
            provenance=f"emulated from profile {profile.name} ({profile.device_kind.value}): {profile.provenance}",
            quantization=quant, params=profile.params_key)
        return info, _EmulatedModel(profile)

    def service_ms(self, profile: Profile, batch: int) -> float:
        """Draw the service time (ms) of one batch of ``batch`` items."""
        with self._rng_lock:
            if batch in profile.exec:
                return float(profile.exec[batch].distribution().sample(self._rng, 1)[0])
            return float(np.sum(profile.exec[1].distribution().sample(self._rng, batch)))

    def _execute(self, info: ModelInfo, handle: Any, inputs: dict[str, np.ndarray],
                 batch: int) -> dict[str, np.ndarray]:
        want = max(0.0, self.service_ms(handle.profile, batch))
        start = self._timer()
        self._sleep(want / 1000.0)
        measured = (self._timer() - start) * 1000.0
        with self._rng_lock:
            self.samples.append((want, measured, info.name, batch))
            if len(self.samples) > self._keep:
                del self.samples[: len(self.samples) - self._keep]
        out: dict[str, np.ndarray] = {}
        for s in info.outputs:
            shape = tuple(batch if (i == 0 and info.batchable) else (d if d > 0 else 1) for i, d in enumerate(s.shape))
            out[s.name] = np.zeros(shape, dtype=DATATYPES[s.datatype] if s.datatype != "BYTES" else object)
        return out


def _declared(source: ModelSource) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...], float,
                                            tuple[tuple[str, Quantization], ...]]:
    """(inputs, outputs, weights MB, quantization) for an emulated model: from the zoo's metadata, the ONNX
    file's graph, the TFLite file's signature, or the source's declarations (which take precedence)."""
    inputs, outputs, weights_mb = source.inputs, source.outputs, 0.0
    quant: tuple[tuple[str, Quantization], ...] = ()
    if source.zoo is not None:
        from edgemux.runtime import zoo

        try:
            stats = zoo.model_stats(source.zoo, source.input_size)
        except zoo.ZooError as e:
            raise ModelNotFound(str(e)) from e
        if not inputs and source.profile is not None and source.profile.device_kind is DeviceKind.EDGETPU:
            inputs = (_edgetpu_input(tuple(_dim(d) for d in stats.input_shape)),)
        inputs = inputs or (TensorSpec("input", "FP32", tuple(_dim(d) for d in stats.input_shape)),)
        outputs = outputs or tuple(TensorSpec(n, "FP32", tuple(_dim(d) for d in shape)) for n, shape in stats.outputs)
        weights_mb = stats.graph_params * 4 / _MB  # FP32 weights
    elif source.path is not None and is_tflite(source):
        # an Edge TPU build's signature reads on any host: an emulated Edge TPU takes what a real one would
        from edgemux.runtime.dataplane.litert import signature

        tensors = signature(source)
        inputs, outputs = inputs or tensors[0], outputs or tensors[1]
        quant = tuple(sorted(tensors[2].items()))
        weights_mb = Path(source.path).stat().st_size / _MB
    elif source.path is not None and not (inputs and outputs):
        import onnx

        path = source.onnx_path()
        graph = onnx.load(str(path), load_external_data=False).graph
        weights = {t.name for t in graph.initializer}
        inputs = inputs or tuple(_onnx_spec(v) for v in graph.input if v.name not in weights)
        outputs = outputs or tuple(_onnx_spec(v) for v in graph.output)
        weights_mb = path.stat().st_size / _MB
    if not inputs or not outputs:
        raise BackendError(f"emulated model from {source.describe()} declares no "
                           f"{'inputs' if not inputs else 'outputs'}: give a zoo model, an ONNX file or the tensors")
    return tuple(inputs), tuple(outputs), weights_mb, quant


def _edgetpu_input(nchw: tuple[int, ...]) -> TensorSpec:
    """What an Edge TPU model takes instead of the zoo graph's FP32 NCHW image: the Edge TPU runs only fully
    8-bit quantized TensorFlow Lite models, whose image input is uint8 pixels in NHWC order (Coral's models
    page lists them as 224x224x3; libedgetpu logs 150,528 bytes, 224 x 224 x 3, for a 224-pixel MobileNet's
    input). An emulated Edge TPU is sent what a real one would be: a quarter of the FP32 bytes. Outputs stay
    the zoo graph's FP32, as a host reads them after dequantizing (they are small)."""
    batch, channels, height, width = nchw
    return TensorSpec("input", "UINT8", (batch, height, width, channels))


def _onnx_spec(v: Any) -> TensorSpec:
    t = v.type.tensor_type
    datatype = _ONNX_ELEM.get(t.elem_type)
    if datatype is None:
        raise BackendError(f"tensor '{v.name}' has ONNX element type {t.elem_type}, which edgemux cannot serve")
    dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim)
    return TensorSpec(v.name, datatype, tuple(_dim(d) for d in dims))


# ------------------------------------------------------------------------------------------ by format


class FormatBackend(Backend):
    """A real device's backend: each model runs on the runtime of its file's format, ONNX (and zoo models) on
    ``onnx`` (an :class:`OnnxRuntimeBackend`), ``.tflite`` files on LiteRT (a ``LiteRTBackend`` with the same
    ``threads``, made on the first ``.tflite`` model: an agent serving ONNX only never imports LiteRT).
    Reports name the runtime that ran each model (``ModelInfo.backend``); :meth:`for_model` returns it."""

    emulated = False

    def __init__(self, onnx: OnnxRuntimeBackend) -> None:
        super().__init__()
        self.onnx = onnx
        self.threads = onnx.threads
        self.name = onnx.name
        self._tflite: Backend | None = None
        self._make_lock = threading.Lock()

    def _runtime(self, source: ModelSource) -> Backend:
        if not is_tflite(source):
            return self.onnx
        with self._make_lock:
            if self._tflite is None:
                from edgemux.runtime.dataplane.litert import LiteRTBackend

                self._tflite = LiteRTBackend(self.threads)
            return self._tflite

    def for_model(self, model: str) -> Backend:
        return self._entry(model)[2][0]

    def _open(self, model: str, source: ModelSource) -> tuple[ModelInfo, Any]:
        runtime = self._runtime(source)
        info, handle = runtime._open(model, source)
        return info, (runtime, handle)

    def _execute(self, info: ModelInfo, handle: Any, inputs: dict[str, np.ndarray],
                 batch: int) -> dict[str, np.ndarray]:
        runtime, inner = handle
        return runtime._execute(info, inner, inputs, batch)


# ----------------------------------------------------------------------------------------------- factory


def make_backend(kind: BackendKind | str, **opts: Any) -> Backend:
    """The backend named ``kind``: ``onnxruntime`` (opts: ``threads``), ``litert`` (``.tflite`` models; opts:
    ``threads``, ``delegate="edgetpu"``), ``edgetpu`` (``litert`` on a real Edge TPU: 503 where libedgetpu does
    not load), ``emulated`` (opts: ``seed``,
    ``sleep``, ``timer``) or ``cuda`` (onnxruntime with the CUDA execution provider, CPU as fallback for
    the operators CUDA lacks; opts: ``threads``). ``cuda`` raises ``BackendError`` (503) when this
    onnxruntime build has no CUDA provider. Nothing CUDA-related is imported unless ``kind`` is ``cuda``."""
    if kind == "onnxruntime":
        return OnnxRuntimeBackend(int(opts.pop("threads", 1)), **opts)
    if kind == "emulated":
        return EmulatedBackend(**opts)
    if kind in ("litert", "edgetpu"):
        from edgemux.runtime.dataplane.litert import LiteRTBackend

        if kind == "edgetpu":  # a device declared a real Edge TPU: LiteRT with libedgetpu's delegate, or 503
            opts["delegate"] = "edgetpu"
        return LiteRTBackend(int(opts.pop("threads", 1)), **opts)
    if kind == "cuda":
        import onnxruntime as ort

        available = ort.get_available_providers()
        if "CUDAExecutionProvider" not in available:
            raise BackendError(f"CUDA not available: onnxruntime {ort.__version__} offers {', '.join(available)} "
                               "(install onnxruntime-gpu with a matching CUDA runtime)", 503)
        return OnnxRuntimeBackend(int(opts.pop("threads", 1)),
                                  providers=("CUDAExecutionProvider", "CPUExecutionProvider"), name="cuda", **opts)
    raise BackendError(f"unknown backend {kind!r} (known: onnxruntime, litert, edgetpu, emulated, cuda)")
