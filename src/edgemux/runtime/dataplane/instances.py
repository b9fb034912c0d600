"""Instances of one model with a share of a device each (Dhakal et al., papers/002 §IV-B to §IV-E).

An :class:`InstancePool` runs ``instances`` instances of one model. Each instance holds ``share`` of the
device and serves one request at a time; the pool's requests wait in one FIFO queue and each instance takes
the next one when it is free (an M/G/k queue, k = instances, as ``perf.spatial`` estimates it).

**On the real CPU** an instance is an ONNX Runtime session whose ``intra_op_num_threads`` is its share of the
cores: ``threads = max(1, round(share * cores))`` (:func:`threads_for`), and conversely ``share = threads /
cores``. With ``shared_weights`` (Param-Share, §IV-E) the model's initializers are loaded once
(:class:`SharedWeights`: one aligned buffer, an ``OrtValue`` viewing each tensor) and handed to every session
with ``SessionOptions.add_initializer``; the sessions are created from the model's bytes with each initializer
pointing at an in-memory external file (``add_external_initializers_from_files_in_memory``), so no session
parses or copies the weights. Two facts of onnxruntime 1.32 shape this:

* Its Python API does not expose the prepacked-weights container (``CreatePrepackedWeightsContainer`` is C/C++
  only), so kernels that prepack a weight (MatMul/Gemm) still keep a packed copy per session.
* Creating a session reads the in-memory file into a transient copy before the ``add_initializer`` values
  replace it; the copy is freed at once and the pool returns its pages (glibc ``malloc_trim``), so a session
  briefly needs the weights' size again while it is built.
* At graph optimization level ``all`` the NCHWc layout transformer rewrites every convolution's weights into a
  blocked copy *per session* (on resnet18 about the weights' size again per instance), which defeats sharing. A
  shared-weights pool therefore runs at level ``extended`` (no layout transform): the price is latency (on
  this 2-core x86 host mobilenet_v2 at 224 pixels is about 2x slower, resnet18 about 1.3x). A pool without
  sharing runs at ``all`` unless told otherwise. :func:`measure_memory` states both.

**Emulated** instances (devices that are not here) sleep for the profile's batch-1 execution time times
``perf.spatial.slowdown(profile.share_curve, share)`` and return zero tensors of the declared outputs.

**Reconfiguration** (:meth:`InstancePool.reconfigure`) changes the share and/or instance count:

* with ``overlap`` (Overlapped-Execution, §IV-B): the new instances (the shadow) are built and warmed with one
  inference each while the old ones keep serving; then, under the pool's lock, the generation flips: the old
  instances take no further request, the new ones take the queue. Requests in flight on the old instances
  finish (drain) and their sessions are then released. ``unavailable_ms`` is the time no instance could take a
  request: the flip, microseconds.
* without (the baseline): the old instances stop taking requests, finish what they run, are released, and only
  then the new ones are built; requests wait in the queue meanwhile (``unavailable_ms``: the downtime). The new
  sessions are not warmed: their first requests pay the cold start, as a restart does.

In both modes the queue is kept: no request is lost and none fails because of the change.

Memory (:func:`measure_memory`): the resident set (``VmRSS`` of ``/proc/self/status``) of N instances with or
without shared weights, each configuration measured in a fresh child process.

Units: times ms unless a name ends in ``_s`` (seconds); memory MB (10**6 bytes); shares are fractions of one
device in (0, 1].
"""

from __future__ import annotations

import abc
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgemux.perf.spatial import slowdown
from edgemux.profiles.types import Profile
from edgemux.runtime.dataplane.backends import BackendError
from edgemux.runtime.dataplane.protocol import DATATYPES, TensorSpec

__all__ = [
    "EmulatedInstances",
    "InstanceFactory",
    "InstanceMemory",
    "InstancePool",
    "OrtInstances",
    "PoolClosed",
    "PoolResult",
    "Reconfiguration",
    "SharedWeights",
    "SpatialConfigError",
    "check_instances",
    "check_share",
    "cpu_cores",
    "measure_memory",
    "rss_mb",
    "threads_for",
]

_MB = 1e6
_ALIGN = 64  # bytes: every tensor of the shared buffer starts on a cache line, as ORT's own allocator does
_MEMORY_FILE = "edgemux-shared-weights.bin"  # the in-memory external file's name; never exists on disk
OPT_LEVELS = ("basic", "extended", "all")


class SpatialConfigError(BackendError):
    """A share, thread or instance count that cannot be honoured (status 400)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 400)


class PoolClosed(BackendError):
    """The pool was closed before the request could run (status 503)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 503)


# -------------------------------------------------------------------------------------------- shares


def cpu_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def check_share(share: float, *, where: str = "share") -> float:
    """``share`` as a float if it is in (0, 1] of the device; ``SpatialConfigError`` otherwise."""
    try:
        s = float(share)
    except (TypeError, ValueError):
        raise SpatialConfigError(f"{where} must be a number in (0, 1] of the device, got {share!r}") from None
    if isinstance(share, bool) or not (math.isfinite(s) and 0.0 < s <= 1.0):
        raise SpatialConfigError(f"{where} must be in (0, 1] of the device, got {share!r}")
    return s


def check_instances(instances: int, *, where: str = "instances") -> int:
    """``instances`` if it is an integer >= 1; ``SpatialConfigError`` otherwise."""
    if isinstance(instances, bool) or not isinstance(instances, (int, np.integer)) or instances < 1:
        raise SpatialConfigError(f"{where} must be an integer >= 1, got {instances!r}")
    return int(instances)


def threads_for(share: float, cores: int) -> int:
    """Intra-op threads of an instance holding ``share`` of a CPU with ``cores`` cores:
    ``max(1, round(share * cores))`` (so on 2 cores shares 0.25 and 0.5 both give 1 thread, 1.0 gives 2)."""
    s = check_share(share)
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise SpatialConfigError(f"cores must be an integer >= 1, got {cores!r}")
    return max(1, round(s * cores))


def rss_mb() -> float:
    """This process's resident set size (MB), from ``VmRSS`` in ``/proc/self/status`` (``/proc/self/statm``
    as a fallback)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024 / _MB  # the kernel writes kB (KiB)
    except OSError:
        pass
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / _MB


# ------------------------------------------------------------------------------------- shared weights


class SharedWeights:
    """One copy of an ONNX model's initializers for every session of a pool (Param-Share).

    ``buffer`` holds every initializer (aligned to 64 bytes); ``values`` maps each initializer's name to an
    ``OrtValue`` viewing its part of the buffer (no copy); ``model_bytes`` is the model with each initializer's
    data replaced by a reference into an in-memory external file, which is this same buffer. The object must
    outlive every session made with :meth:`apply` (the pool keeps it)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        import onnx
        import onnxruntime as ort
        from onnx import numpy_helper

        model = onnx.load(str(path))
        if any(g.type == onnx.AttributeProto.GRAPH for n in model.graph.node for g in n.attribute):
            # subgraph initializers (If/Loop bodies) are not moved; none of the zoo's models has subgraphs
            raise SpatialConfigError(f"{path}: models with subgraphs cannot share weights")
        # Lay the tensors out first (from their declared types and shapes), then convert one tensor at a time
        # into the buffer and drop its protobuf copy: the peak is the model plus the buffer, not three copies.
        layout: list[tuple[str, np.dtype[Any], tuple[int, ...], int]] = []
        offset = 0
        for init in model.graph.initializer:
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(init.data_type))
            shape = tuple(int(d) for d in init.dims)
            offset += (-offset) % _ALIGN
            layout.append((init.name, dtype, shape, offset))
            offset += int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        self.buffer = np.zeros(max(offset, 1), dtype=np.uint8)
        self.values: dict[str, Any] = {}
        for (name, dtype, shape, off), init in zip(layout, model.graph.initializer):
            if dtype == np.dtype(object):
                raise SpatialConfigError(f"{path}: initializer {name!r} holds strings, which cannot be shared")
            count = int(np.prod(shape, dtype=np.int64))
            view = self.buffer[off: off + count * dtype.itemsize].view(dtype).reshape(shape)
            view[...] = numpy_helper.to_array(init)
            self.values[name] = ort.OrtValue.ortvalue_from_numpy(view)
            init.ClearField("raw_data")
            for typed in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
                init.ClearField(typed)
            init.data_location = onnx.TensorProto.EXTERNAL
            del init.external_data[:]
            for key, value in (("location", _MEMORY_FILE), ("offset", str(off)),
                               ("length", str(count * dtype.itemsize))):
                entry = init.external_data.add()
                entry.key, entry.value = key, value
        self.model_bytes = model.SerializeToString()
        self.nbytes = int(offset)
        del model
        _trim_heap()

    @property
    def mb(self) -> float:
        """Size of the weights (MB)."""
        return self.nbytes / _MB

    def apply(self, opts: Any) -> None:
        """Give ``opts`` (an ``onnxruntime.SessionOptions``) the shared buffer as the model's external file and
        every initializer as a user-supplied ``OrtValue`` (used as is, never copied)."""
        opts.add_external_initializers_from_files_in_memory([_MEMORY_FILE], [self.buffer], [self.buffer.nbytes])
        for name, value in self.values.items():
            opts.add_initializer(name, value)


def _trim_heap() -> None:
    """Give the freed pages of the model's parse back to the OS (glibc ``malloc_trim``), so that the resident
    set counts the one copy of the weights, not the transient protobuf; a no-op without glibc."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


# ------------------------------------------------------------------------------------------ instances


class Instance(abc.ABC):
    """One instance: runs one request at a time (the pool guarantees it)."""

    share: float
    threads: int

    @abc.abstractmethod
    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Execute one request; output name -> array."""

    def close(self) -> None:
        """Release what the instance holds (its session)."""


class InstanceFactory(abc.ABC):
    """Makes the instances of one model for a pool."""

    cores: int

    @abc.abstractmethod
    def make(self, share: float) -> Instance:
        """A new instance holding ``share`` of the device."""

    @abc.abstractmethod
    def warm_inputs(self) -> dict[str, np.ndarray]:
        """One request's inputs, for warming an instance before it serves."""

    @abc.abstractmethod
    def describe(self) -> str:
        """One line: what the instances run and how."""


def random_inputs(specs: Sequence[tuple[str, str, tuple[int, ...]]], seed: int, model: str) -> dict[str, np.ndarray]:
    """Seeded standard-normal float inputs for ``specs`` ((name, onnx type, shape), ...): one request for warming
    an instance. ``SpatialConfigError`` for an input that is not a float tensor."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, typ, shape in specs:
        if typ != "tensor(float)":
            raise SpatialConfigError(f"{model}: input '{name}' is {typ}; warm-up makes float inputs only")
        out[name] = rng.standard_normal(shape).astype(np.float32)
    return out


class _OrtInstance(Instance):
    def __init__(self, session: Any, share: float, threads: int) -> None:
        self.session: Any = session
        self.share = share
        self.threads = threads
        self._names = [o.name for o in session.get_outputs()]

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self._names, self.session.run(self._names, dict(inputs))))

    def close(self) -> None:
        self.session = None  # onnxruntime frees a session when its last reference goes


class OrtInstances(InstanceFactory):
    """ONNX Runtime sessions of the model at ``path`` on the CPU (``cores`` cores, default this process's).

    ``shared_weights``: one copy of the weights for every session (:class:`SharedWeights`). ``optimization``:
    the graph optimization level (``basic``, ``extended``, ``all``); default ``extended`` with shared weights
    and ``all`` without (see the module docstring for why)."""

    def __init__(self, path: str | os.PathLike[str], *, cores: int | None = None, shared_weights: bool = True,
                 optimization: str | None = None, providers: Sequence[str] = ("CPUExecutionProvider",),
                 seed: int = 0) -> None:
        import onnxruntime as ort

        self.path = Path(path)
        if not self.path.is_file():
            raise SpatialConfigError(f"ONNX file {str(path)!r} does not exist")
        self.cores = cpu_cores() if cores is None else cores
        if isinstance(self.cores, bool) or not isinstance(self.cores, int) or self.cores < 1:
            raise SpatialConfigError(f"cores must be an integer >= 1, got {cores!r}")
        level = optimization or ("extended" if shared_weights else "all")
        if level not in OPT_LEVELS:
            raise SpatialConfigError(f"optimization must be one of {', '.join(OPT_LEVELS)}, got {level!r}")
        self.optimization = level
        self._level = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                       "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                       "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[level]
        self.providers = tuple(providers)
        self.weights = SharedWeights(self.path) if shared_weights else None
        self._seed = seed
        self._inputs: list[tuple[str, str, tuple[int, ...]]] | None = None

    @property
    def shared(self) -> bool:
        return self.weights is not None

    def make(self, share: float) -> Instance:
        import onnxruntime as ort

        threads = threads_for(share, self.cores)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1  # one request at a time per instance: the pool decides concurrency
        # instances share the cores with other instances: an idle intra-op thread must sleep, not spin on a
        # core another instance needs (onnxruntime spins by default, made for one session per machine)
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.graph_optimization_level = self._level
        try:
            if self.weights is not None:
                self.weights.apply(opts)
                session = ort.InferenceSession(self.weights.model_bytes, opts, providers=list(self.providers))
                # onnxruntime reads the in-memory file into a transient copy before the add_initializer values
                # replace it; the copy is freed, and trimming gives its pages back so they are not counted
                _trim_heap()
            else:
                session = ort.InferenceSession(str(self.path), opts, providers=list(self.providers))
        except Exception as e:  # onnxruntime raises its own exception types
            raise BackendError(f"cannot create a session of {self.path.name}: {e}", 500) from e
        if self._inputs is None:
            self._inputs = [(i.name, i.type, tuple(d if isinstance(d, int) and d > 0 else 1 for d in i.shape))
                            for i in session.get_inputs()]
        return _OrtInstance(session, share, threads)

    def warm_inputs(self) -> dict[str, np.ndarray]:
        if self._inputs is None:
            self.make(1.0).close()
        assert self._inputs is not None
        return random_inputs(self._inputs, self._seed, self.path.name)

    def describe(self) -> str:
        shared = "one shared copy of the weights" if self.shared else "a copy of the weights per instance"
        return (f"onnxruntime sessions of {self.path.name} on {self.cores} cores, {shared}, "
                f"optimization {self.optimization}")


class _EmulatedInstance(Instance):
    def __init__(self, factory: EmulatedInstances, share: float) -> None:
        self.factory = factory
        self.share = share
        self.threads = 0
        self.stretch = slowdown(factory.profile.share_curve, share)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        f = self.factory
        with f._rng_lock:
            base = float(f.profile.exec[1].distribution().sample(f._rng, 1)[0])
        f._sleep(max(0.0, base * self.stretch) / 1000.0)
        return {s.name: np.zeros(tuple(d if d > 0 else 1 for d in s.shape),
                                 dtype=DATATYPES[s.datatype] if s.datatype != "BYTES" else object)
                for s in f.outputs}


class EmulatedInstances(InstanceFactory):
    """Instances of a model on a device that is not here: each request sleeps the profile's batch-1 execution
    time (ms, drawn with a seeded generator) times ``slowdown(profile.share_curve, share)`` (``1 / share``
    without a curve) and returns zeros of ``outputs``."""

    def __init__(self, profile: Profile, *, inputs: Sequence[TensorSpec] = (), outputs: Sequence[TensorSpec] = (),
                 seed: int = 0, sleep: Callable[[float], None] = time.sleep) -> None:
        if 1 not in profile.exec:
            raise SpatialConfigError(f"profile {profile.name!r} has no batch-1 execution time to emulate")
        self.profile = profile
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.cores = 1
        self._rng = np.random.default_rng(seed)
        self._rng_lock = threading.Lock()  # numpy Generators are not thread-safe
        self._sleep = sleep

    def make(self, share: float) -> Instance:
        return _EmulatedInstance(self, check_share(share))

    def warm_inputs(self) -> dict[str, np.ndarray]:
        return {s.name: np.zeros(tuple(d if d > 0 else 1 for d in s.shape), dtype=DATATYPES[s.datatype])
                for s in self.inputs}

    def describe(self) -> str:
        return f"emulated from profile {self.profile.name} ({self.profile.provenance})"


# ----------------------------------------------------------------------------------------------- pool


@dataclass(frozen=True)
class PoolResult:
    """One request's outcome: ``queue_ms`` from submit to the start of its execution, ``service_ms`` the
    execution; ``instance`` and ``generation`` say which instance ran it; ``share`` its share;
    ``started_s``/``ended_s`` the pool clock (s) at start and end."""

    outputs: dict[str, np.ndarray]
    queue_ms: float
    service_ms: float
    instance: int
    generation: int
    share: float
    started_s: float
    ended_s: float


@dataclass(frozen=True)
class Reconfiguration:
    """What a :meth:`InstancePool.reconfigure` did and cost (ms). ``build_ms``: creating the new instances;
    ``warm_ms``: their warm-up inferences (0 without overlap); ``unavailable_ms``: time in which no instance
    could take a request; ``drain_ms``: from the switch until the old instances finished their requests and
    were released; ``total_ms``: the whole call."""

    overlap: bool
    old_share: float
    old_instances: int
    new_share: float
    new_instances: int
    build_ms: float
    warm_ms: float
    unavailable_ms: float
    drain_ms: float
    total_ms: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(eq=False)
class _Request:
    inputs: Mapping[str, np.ndarray]
    enqueued: float
    future: Future[PoolResult] = field(default_factory=Future)


class _Slot:
    """An instance and the thread serving it, for one generation."""

    def __init__(self, pool: InstancePool, instance: Instance, index: int, generation: int) -> None:
        self.instance = instance
        self.index = index
        self.generation = generation
        self.thread = threading.Thread(target=pool._serve, args=(self,), daemon=True,
                                       name=f"edgemux-instance-{pool.name}-g{generation}-{index}")


class InstancePool:
    """``instances`` instances of one model, each holding ``share`` of the device, serving one FIFO queue.

    ``submit(inputs)`` returns a future of a :class:`PoolResult`; ``run`` waits for the outputs. Every request
    ends completed or with an explicit error (a backend failure, or :class:`PoolClosed` on ``close(drain=False)``).
    ``on_start()`` and ``on_end(start_s, end_s)``, when given, are called by the serving thread around every
    execution (the device worker keeps its busy time with them). ``clock`` returns seconds.
    """

    def __init__(self, factory: InstanceFactory, *, share: float, instances: int, name: str = "pool",
                 warm: bool = True, clock: Callable[[], float] = time.perf_counter,
                 on_start: Callable[[], None] | None = None,
                 on_end: Callable[[float, float], None] | None = None) -> None:
        self.factory = factory
        self.name = name
        self._clock = clock
        self._on_start = on_start
        self._on_end = on_end
        self._cv = threading.Condition()
        self._queue: deque[_Request] = deque()
        self._generation = 0
        self._slots: list[_Slot] = []
        self._closing = False
        self._drain = True
        self._reconfiguring = threading.Lock()  # one reconfiguration (or close) at a time
        self._inflight = 0
        self.completed = 0
        self.failed = 0
        self.reconfigurations: list[Reconfiguration] = []
        share = check_share(share)
        instances = check_instances(instances)
        slots = self._build(share, instances, 0)
        if warm:
            self._warm(slots)
        self._share, self._instances = share, instances
        self._start(slots)

    # -- configuration -----------------------------------------------------------------------------------

    @property
    def share(self) -> float:
        """Each current instance's share of the device."""
        return self._share

    @property
    def instances(self) -> int:
        """The current number of instances."""
        return self._instances

    @property
    def threads(self) -> int:
        """Intra-op threads of each current instance (real CPU; 0 for emulated instances)."""
        with self._cv:
            return self._slots[0].instance.threads if self._slots else 0

    @property
    def generation(self) -> int:
        return self._generation

    def queued(self) -> int:
        """Requests waiting for an instance."""
        with self._cv:
            return len(self._queue)

    def inflight(self) -> int:
        """Requests executing now (on any generation's instances)."""
        with self._cv:
            return self._inflight

    def share_for_threads(self, threads: int) -> float:
        """The share of ``threads`` intra-op threads on this pool's device: ``threads / cores``."""
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise SpatialConfigError(f"threads must be an integer >= 1, got {threads!r}")
        if threads > self.factory.cores:
            raise SpatialConfigError(f"threads {threads} is more than the device's {self.factory.cores} cores")
        return threads / self.factory.cores

    def reconfigure(self, *, share: float | None = None, threads: int | None = None, instances: int | None = None,
                    overlap: bool = True) -> Reconfiguration:
        """Change each instance's share (``share``, or ``threads`` on a CPU: share = threads / cores) and/or the
        number of instances, with or without overlap (module docstring). Blocks until the old instances are
        drained and released; returns what it cost. No request is lost or failed by the change."""
        if share is not None and threads is not None:
            raise SpatialConfigError("give share or threads, not both")
        new_share = (self.share_for_threads(threads) if threads is not None
                     else check_share(share) if share is not None else self._share)
        new_k = check_instances(instances) if instances is not None else self._instances
        with self._reconfiguring:
            if self._closing:
                raise PoolClosed(f"instance pool {self.name} is closed")
            t0 = self._clock()
            old_share, old_k = self._share, self._instances
            if overlap:
                slots = self._build(new_share, new_k, self._generation + 1)
                t1 = self._clock()
                self._warm(slots)
                t2 = self._clock()
                for s in slots:
                    s.thread.start()  # they wait for their generation
                with self._cv:
                    flip = self._clock()
                    old = self._slots
                    self._generation += 1
                    self._slots = slots
                    self._share, self._instances = new_share, new_k
                    self._cv.notify_all()
                    flipped = self._clock()
                for s in old:
                    s.thread.join()
                t3 = self._clock()
                r = Reconfiguration(True, old_share, old_k, new_share, new_k, (t1 - t0) * 1e3, (t2 - t1) * 1e3,
                                    (flipped - flip) * 1e3, (t3 - flipped) * 1e3, (t3 - t0) * 1e3)
            else:
                with self._cv:
                    stop = self._clock()
                    old = self._slots
                    self._generation += 1  # the old instances take no more requests; nobody else does yet
                    self._slots = []
                    self._cv.notify_all()
                for s in old:
                    s.thread.join()
                t1 = self._clock()
                try:
                    slots = self._build(new_share, new_k, self._generation)
                except BaseException:
                    # never leave the queue without instances: rebuild the old configuration
                    slots = self._build(old_share, old_k, self._generation)
                    self._start(slots)
                    raise
                t2 = self._clock()
                with self._cv:
                    self._share, self._instances = new_share, new_k
                self._start(slots)
                serving = self._clock()
                r = Reconfiguration(False, old_share, old_k, new_share, new_k, (t2 - t1) * 1e3, 0.0,
                                    (serving - stop) * 1e3, (t1 - stop) * 1e3, (serving - t0) * 1e3)
            self.reconfigurations.append(r)
            return r

    # -- requests ------------------------------------------------------------------------------------------

    def submit(self, inputs: Mapping[str, np.ndarray]) -> Future[PoolResult]:
        """Queue one request; its future resolves with a :class:`PoolResult` or an error. ``PoolClosed``
        after ``close``."""
        with self._cv:
            if self._closing:
                raise PoolClosed(f"instance pool {self.name} is closed")
            req = _Request(inputs, self._clock())
            self._queue.append(req)
            self._cv.notify()
        return req.future

    def run(self, inputs: Mapping[str, np.ndarray], timeout_s: float | None = None) -> dict[str, np.ndarray]:
        """``submit`` and wait for the outputs (``timeout_s`` seconds; None waits forever)."""
        return self.submit(inputs).result(timeout_s).outputs

    def close(self, drain: bool = True, timeout_s: float = 30.0) -> bool:
        """Stop taking requests and release the instances; True when every serving thread ended in time.
        ``drain`` runs what is queued first; otherwise queued requests fail with :class:`PoolClosed`."""
        with self._reconfiguring:
            with self._cv:
                self._closing = True
                dropped: list[_Request] = []
                if not drain:
                    self._drain = False
                    dropped = list(self._queue)
                    self._queue.clear()
                    self.failed += len(dropped)
                slots = list(self._slots)
                self._cv.notify_all()
            for r in dropped:
                if r.future.set_running_or_notify_cancel():
                    r.future.set_exception(PoolClosed(f"instance pool {self.name} closed before the request ran"))
            deadline = time.monotonic() + timeout_s
            for s in slots:
                if s.thread is not threading.current_thread():
                    s.thread.join(max(0.0, deadline - time.monotonic()))
            return not any(s.thread.is_alive() for s in slots)

    def stats(self) -> dict[str, Any]:
        """Plain values: share, instances, threads per instance, generation, queued, in flight, completed,
        failed, and the reconfigurations so far."""
        with self._cv:
            return {"share": self._share, "instances": self._instances,
                    "threads": self._slots[0].instance.threads if self._slots else 0,
                    "generation": self._generation, "queued": len(self._queue), "inflight": self._inflight,
                    "completed": self.completed, "failed": self.failed,
                    "reconfigurations": [r.as_dict() for r in self.reconfigurations]}

    # -- internals -----------------------------------------------------------------------------------------

    def _build(self, share: float, k: int, generation: int) -> list[_Slot]:
        made: list[Instance] = []
        try:
            for _ in range(k):
                made.append(self.factory.make(share))
        except BaseException:
            for m in made:
                m.close()
            raise
        return [_Slot(self, inst, i, generation) for i, inst in enumerate(made)]

    def _warm(self, slots: list[_Slot]) -> None:
        # one inference each, on this thread, while the current instances keep serving (Dhakal's "warm up")
        inputs = self.factory.warm_inputs()
        for s in slots:
            s.instance.run(inputs)

    def _start(self, slots: list[_Slot]) -> None:
        with self._cv:
            self._slots = slots
        for s in slots:
            s.thread.start()

    def _serve(self, slot: _Slot) -> None:
        try:
            while True:
                with self._cv:
                    while True:
                        if slot.generation < self._generation:
                            return  # retired: the new generation takes the queue
                        if self._closing and (not self._drain or not self._queue):
                            return
                        if slot.generation == self._generation and self._queue:
                            req = self._queue.popleft()
                            if req.future.set_running_or_notify_cancel():
                                break
                            self.failed += 1  # cancelled by its client while queued
                            continue
                        self._cv.wait()
                    self._inflight += 1
                self._execute(slot, req)
        finally:
            slot.instance.close()

    def _execute(self, slot: _Slot, req: _Request) -> None:
        if self._on_start is not None:
            self._on_start()
        start = self._clock()
        error: BaseException | None = None
        outputs: dict[str, np.ndarray] = {}
        try:
            outputs = slot.instance.run(req.inputs)
        except BackendError as e:
            error = e
        except Exception as e:  # anything else from an instance is its failure, reported as a 500
            error = BackendError(f"instance {slot.index} of pool {self.name} failed: {e}", 500)
            error.__cause__ = e
        end = self._clock()
        with self._cv:
            self._inflight -= 1
            if error is None:
                self.completed += 1
            else:
                self.failed += 1
        if self._on_end is not None:
            self._on_end(start, end)
        if error is not None:
            req.future.set_exception(error)
        else:
            req.future.set_result(PoolResult(outputs, (start - req.enqueued) * 1e3, (end - start) * 1e3, slot.index,
                                              slot.generation, slot.instance.share, start, end))


# --------------------------------------------------------------------------------------------- memory


@dataclass(frozen=True)
class InstanceMemory:
    """Resident memory of ``instances`` instances of one model (MB), measured in a fresh child process:
    ``total_mb`` is the RSS growth from building the instances and running one inference on each;
    ``weights_mb`` the size of the model's initializers; ``static_mb`` the weights held (once when ``shared``,
    once per instance otherwise) and ``runtime_mb = total_mb - static_mb`` (sessions, arenas, activations,
    per-session packed or reordered weights), the two columns a profile's ``memory_static_mb`` and
    ``memory_runtime_mb`` take."""

    model: str
    instances: int
    shared: bool
    threads: int
    optimization: str
    total_mb: float
    weights_mb: float
    static_mb: float
    runtime_mb: float
    base_mb: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def measure_memory(path: str | os.PathLike[str], instances: int, shared: bool, *, threads: int = 1,
                   optimization: str | None = None, timeout_s: float = 300.0) -> InstanceMemory:
    """The resident memory (MB) of ``instances`` ONNX Runtime sessions of the model at ``path`` with
    (``shared``) or without one shared copy of the weights, measured in a fresh child process so that
    configurations do not mix (allocator pools and freed pages of one would count in the next).

    The child imports onnxruntime, reads its RSS (``/proc/self/status``), builds an :class:`InstancePool` of
    ``instances`` instances with ``threads`` threads each (warm: one inference per instance), runs one more
    inference per instance and reads its RSS again. Use ``static_mb`` and ``runtime_mb`` as a profile's
    ``memory_static_mb`` and ``memory_runtime_mb``."""
    check_instances(instances)
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise SpatialConfigError(f"threads must be an integer >= 1, got {threads!r}")
    p = Path(path)
    if not p.is_file():
        raise SpatialConfigError(f"ONNX file {str(path)!r} does not exist")
    args = json.dumps({"path": str(p), "instances": int(instances), "shared": bool(shared), "threads": threads,
                       "optimization": optimization})
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "edgemux.runtime.dataplane.instances", "measure-memory", args],
                          capture_output=True, text=True, timeout=timeout_s, env=env)
    if done.returncode != 0:
        raise BackendError(f"memory measurement of {p.name} failed: {done.stderr.strip()[-500:]}", 500)
    data = json.loads(done.stdout.strip().splitlines()[-1])
    return InstanceMemory(**data)


def _measure_in_child(spec: dict[str, Any]) -> dict[str, Any]:
    import onnxruntime  # noqa: F401  (imported before the first reading: its libraries are not the instances')

    base = rss_mb()
    cores = max(cpu_cores(), spec["threads"])
    factory = OrtInstances(spec["path"], cores=cores, shared_weights=spec["shared"],
                           optimization=spec["optimization"])
    share = spec["threads"] / cores
    pool = InstancePool(factory, share=share, instances=spec["instances"], name="memory")
    inputs = factory.warm_inputs()
    with pool._cv:
        slots = list(pool._slots)
    for s in slots:  # every instance has run (its arena is allocated), not only the ones a queue would pick
        s.instance.run(inputs)
    _trim_heap()  # both modes alike: count what is held, not pages freed during set-up
    total = rss_mb() - base
    weights = (factory.weights.mb if factory.weights is not None else SharedWeights(spec["path"]).mb)
    static = weights if spec["shared"] else weights * spec["instances"]
    pool.close()
    return {"model": Path(spec["path"]).name, "instances": spec["instances"], "shared": spec["shared"],
            "threads": spec["threads"], "optimization": factory.optimization, "total_mb": total,
            "weights_mb": weights, "static_mb": static, "runtime_mb": total - static, "base_mb": base}


if __name__ == "__main__":  # the child process of measure_memory
    if len(sys.argv) != 3 or sys.argv[1] != "measure-memory":
        sys.exit("usage: python -m edgemux.runtime.dataplane.instances measure-memory JSON")
    print(json.dumps(_measure_in_child(json.loads(sys.argv[2]))))
