"""The profiler: measure models on a real backend and write a profile set that edgemux can load.

``profile_models`` runs every model at every batch size on a :class:`~edgemux.runtime.dataplane.backends.Backend`
(warm-up runs first, untimed, then timed runs) and returns one :class:`Measurement` per (model, batch):
the samples and their mean, variance, percentiles, minimum and maximum, all in ms. ``write_profile_set``
turns measurements into a profile set in the format of the built-in catalogs (``catalogs.yaml`` + one CSV +
``constants.yaml``; see ``edgemux/profiles/data/README.md``), so that ``load_catalog_from(dir)`` and the
CLI's ``--profiles DIR`` read it back and every profile carries where its numbers came from::

    measured with onnxruntime 1.17.1 (CPUExecutionProvider, 1 threads) on host / CPU model at
    2026-01-01T12:00:00Z, 5 warm-up + 30 timed runs per batch

A catalog row holds one batch size per (model, variant), so each batch size is its own variant,
``<H>x<W>-b<batch>`` (``squeezenet1_1:64x64-b2``); ``Catalog.find`` picks the batch-1 variant for
service times.

``profile_share_curves`` measures a model's **share curve** (Dhakal et al. §IV-B, ``perf.spatial``): the
latency of one batch-1 request alone at each share of the CPU, a share running as
``threads = max(1, round(share * cores))`` intra-op threads (``runtime.dataplane.instances.threads_for``).
Shares that map to the same thread count are measured once and share the point. A point is the median of
the timed runs (robust to the other processes of a busy host); the curve is checked with
``perf.spatial.check_curve`` and written, on the batch-1 row, into the ``share_curve`` column.

Units: times ms (variances ms^2), memory MB (10**6 bytes).
"""

from __future__ import annotations

import csv
import io
import math
import os
import platform
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from edgemux.errors import InputError
from edgemux.perf.spatial import ShareCurve, check_curve
from edgemux.profiles.catalog import (
    CONSTANTS_FILE,
    INDEX_FILE,
    load_builtin_catalog,
    load_catalog_from,
    parse_kind,
)
from edgemux.profiles.types import DeviceKind
from edgemux.runtime.dataplane.backends import Backend, BackendError, ModelSource, OnnxRuntimeBackend, make_backend
from edgemux.runtime.dataplane.instances import SpatialConfigError, check_share, threads_for
from edgemux.runtime.dataplane.protocol import DATATYPES, TensorSpec

__all__ = [
    "GENERATOR",
    "HostInfo",
    "Measurement",
    "ProfilerError",
    "ShareCurveResult",
    "check_shares_arg",
    "check_catalog_name",
    "check_out_dir",
    "host_info",
    "profile_models",
    "profile_share_curves",
    "provenance_text",
    "write_profile_set",
]

_MB = 1e6  # bytes per MB, as everywhere in edgemux's memory figures
# Written into catalogs.yaml (the loader ignores unknown keys): marks a directory as one this profiler
# wrote, so re-profiling into it may replace it without --force.
GENERATOR = "edgemux profile"
SOURCE_KEY = "measured"
_CATALOG_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")  # the loader's rule for catalog names
_MODEL_BAD = re.compile(r"[^A-Za-z0-9_.+-]")  # characters a model name in a catalog may not hold

# Extra CSV columns of a measured set. Their declarations must be identical in every set (the column
# table is shared when sets are combined), so nothing host- or run-specific goes into them.
COLUMNS: dict[str, dict[str, str]] = {
    "exec_p50_ms": {"type": "number", "unit": "ms", "meaning": "median of the timed runs of one batch"},
    "exec_p95_ms": {"type": "number", "unit": "ms",
                    "meaning": "95th percentile of the timed runs of one batch (linear interpolation)"},
    "exec_min_ms": {"type": "number", "unit": "ms", "meaning": "fastest timed run of one batch"},
    "exec_max_ms": {"type": "number", "unit": "ms", "meaning": "slowest timed run of one batch"},
    "exec_cv": {"type": "number", "unit": "dimensionless",
                "meaning": "coefficient of variation of the timed runs: standard deviation / mean"},
    "timed_runs": {"type": "number", "unit": "count", "meaning": "timed runs the statistics are computed from"},
    "warmup_runs": {"type": "number", "unit": "count", "meaning": "untimed runs made before the timed ones"},
    "model_source": {"type": "text", "meaning": "what was run: zoo:NAME@HxW (edgemux model zoo) or an ONNX file"},
}
CSV_COLUMNS = ("model", "variant", "batch", "exec_mean_ms", "exec_var_ms2", "memory_static_mb",
               *COLUMNS, "share_curve", "detail", "note")


class ProfilerError(InputError):
    """A profiling request or output directory edgemux cannot honour (the CLI prints it as one line)."""


# ------------------------------------------------------------------------------------------ measurements


@dataclass(frozen=True)
class Measurement:
    """Execution times of one model at one batch size on one backend.

    ``samples_ms``: the timed runs (ms), each one ``Backend.run`` call on a batch of ``batch`` items;
    ``mean_ms``, ``var_ms2`` (sample variance, n-1 denominator; 0 for a single run), ``p50_ms``,
    ``p95_ms`` (linear interpolation), ``min_ms``, ``max_ms`` summarize them. ``memory_static_mb`` is the
    model's static memory estimate (the ONNX file's size: its weights), ``None`` when unknown.
    """

    model: str
    source: str
    input_size: tuple[int, int] | None
    batch: int
    warmup: int
    samples_ms: tuple[float, ...]
    mean_ms: float
    var_ms2: float
    p50_ms: float
    p95_ms: float
    min_ms: float
    max_ms: float
    memory_static_mb: float | None = None

    @classmethod
    def from_samples(cls, model: str, source: str, input_size: tuple[int, int] | None, batch: int,
                     warmup: int, samples_ms: Sequence[float],
                     memory_static_mb: float | None = None) -> Measurement:
        """Summarize ``samples_ms`` (at least one finite, non-negative time in ms)."""
        xs = np.asarray(samples_ms, dtype=float)
        if xs.size == 0 or not np.all(np.isfinite(xs)) or np.any(xs < 0):
            raise ProfilerError("samples", f"expected at least one finite non-negative time (ms), got {list(xs)}")
        return cls(model=model, source=source, input_size=input_size, batch=batch, warmup=warmup,
                   samples_ms=tuple(float(x) for x in xs), mean_ms=float(xs.mean()),
                   var_ms2=float(xs.var(ddof=1)) if xs.size > 1 else 0.0,
                   p50_ms=float(np.percentile(xs, 50)), p95_ms=float(np.percentile(xs, 95)),
                   min_ms=float(xs.min()), max_ms=float(xs.max()), memory_static_mb=memory_static_mb)

    @property
    def repeats(self) -> int:
        """Number of timed runs."""
        return len(self.samples_ms)

    @property
    def cv(self) -> float:
        """Coefficient of variation, standard deviation / mean (dimensionless; 0 when the mean is 0)."""
        return math.sqrt(self.var_ms2) / self.mean_ms if self.mean_ms > 0 else 0.0

    @property
    def per_item_ms(self) -> float:
        """Mean time per item of the batch (ms)."""
        return self.mean_ms / self.batch

    @property
    def variant(self) -> str:
        """The catalog variant name: ``<H>x<W>-b<batch>`` (``b<batch>`` when the input size is unknown)."""
        size = f"{self.input_size[0]}x{self.input_size[1]}-" if self.input_size else ""
        return f"{size}b{self.batch}"


def _check_batches(batches: Sequence[int]) -> list[int]:
    out: list[int] = []
    for b in batches:
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1:
            raise ProfilerError("batch", f"batch sizes must be positive ints, got {b!r}")
        if int(b) not in out:
            out.append(int(b))
    if not out:
        raise ProfilerError("batch", "no batch sizes given")
    return sorted(out)


def _model_name(source: ModelSource) -> str:
    """The name the profile gets: the zoo model's name, or the ONNX file's stem made catalog-safe."""
    if source.zoo is not None:
        return source.zoo
    stem = Path(source.path or "model").stem
    name = _MODEL_BAD.sub("_", stem).lstrip("_.+-")
    return name or "model"


def _input_size(source: ModelSource, inputs: Sequence[TensorSpec]) -> tuple[int, int] | None:
    """(height, width) in pixels: the zoo size, else the last two dimensions of a fixed 4-D input."""
    if source.zoo is not None:
        from edgemux.runtime import zoo

        return zoo.resolve_size(source.zoo, source.input_size)
    if len(inputs) == 1 and len(inputs[0].shape) == 4:
        shape = inputs[0].shape
        # channels-last (a TFLite image model's [1, H, W, C]) when the last dimension is 1 or 3 and the second is not
        h, w = (shape[1], shape[2]) if shape[3] in (1, 3) and shape[1] not in (1, 3) else (shape[2], shape[3])
        if h > 0 and w > 0:
            return int(h), int(w)
    return None


def _static_memory_mb(source: ModelSource, backend_estimate: float) -> float:
    """The ONNX file's size (its weights, MB); the backend's own estimate when there is no file."""
    try:
        return source.onnx_path().stat().st_size / _MB
    except (OSError, BackendError):
        return float(backend_estimate)


def _make_inputs(model: str, specs: Sequence[TensorSpec], batch: int, batchable: bool,
                 rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random inputs of the declared shapes with ``batch`` items (values do not change the cost of a
    dense CNN, but random data avoids any all-zero fast path)."""
    out: dict[str, np.ndarray] = {}
    for s in specs:
        shape = list(s.shape)
        if batchable:
            shape[0] = batch
        elif shape and shape[0] != batch:
            raise BackendError(f"cannot profile model '{model}' at batch {batch}: its input '{s.name}' has a "
                               f"fixed batch dimension {shape[0]}")
        if any(d < 1 for d in shape):
            raise BackendError(f"cannot profile model '{model}': input '{s.name}' has a symbolic dimension "
                               f"other than the batch ({shape}); export it with fixed sizes")
        dtype = DATATYPES.get(s.datatype)
        if dtype is None or s.datatype == "BYTES":
            raise BackendError(f"cannot profile model '{model}': input '{s.name}' has datatype {s.datatype}")
        if dtype.kind == "f":
            out[s.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            out[s.name] = rng.integers(0, 2, shape).astype(dtype)
        else:
            out[s.name] = rng.integers(0, 8, shape).astype(dtype)  # small: safe as indices or token ids
    return out


def profile_models(backend: Backend, sources: Sequence[ModelSource], batches: Sequence[int], warmup: int,
                   repeats: int, *, timer: Callable[[], float] = time.perf_counter, seed: int = 0,
                   progress: Callable[[Measurement], None] | None = None) -> list[Measurement]:
    """Measure every source at every batch size on ``backend``; one :class:`Measurement` per pair, in
    source order, batch sizes ascending.

    For each pair: ``warmup`` untimed runs (session start-up, allocator and cache warm-up), then
    ``repeats`` timed runs. ``timer`` (seconds, monotonic) is called exactly twice per timed run, right
    before and right after ``backend.run``, and never during warm-up, so an injected timer determines the
    samples exactly; the inputs are made before the first call (seeded by ``seed``, the source's position
    and the batch size). A model the backend already had loaded stays loaded; the others are unloaded
    when done. ``progress`` is called with each measurement as it completes.
    """
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ProfilerError("warmup", f"expected a non-negative int, got {warmup!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ProfilerError("repeats", f"expected a positive int, got {repeats!r}")
    sizes = _check_batches(batches)
    out: list[Measurement] = []
    for i, source in enumerate(sources):
        name = f"profile:{source.describe()}"
        was_loaded = name in backend.loaded()
        info = backend.load(name, source)
        try:
            model = _model_name(source)
            size = _input_size(source, info.inputs)
            memory = _static_memory_mb(source, info.memory_mb)
            for b in sizes:
                rng = np.random.default_rng([seed, i, b])
                arrays = _make_inputs(name, info.inputs, b, info.batchable, rng)
                for _ in range(warmup):
                    backend.run(name, arrays)
                samples: list[float] = []
                for _ in range(repeats):
                    start = timer()
                    backend.run(name, arrays)
                    samples.append((timer() - start) * 1000.0)
                m = Measurement.from_samples(model, source.describe(), size, b, warmup, samples, memory)
                out.append(m)
                if progress is not None:
                    progress(m)
        finally:
            if not was_loaded:
                backend.unload(name)
    return out


# ------------------------------------------------------------------------------------------ share curves


def check_shares_arg(shares: Sequence[float]) -> list[float]:
    """The distinct shares, ascending; ``ProfilerError`` (field --shares) for none or one outside (0, 1]."""
    out: list[float] = []
    for x in shares:
        try:
            out.append(check_share(x))
        except SpatialConfigError:
            raise ProfilerError("--shares", f"every share must be in (0, 1] of the device, got {x!r}") from None
    if not out:
        raise ProfilerError("--shares", "no shares given")
    return sorted(set(out))


@dataclass(frozen=True)
class ShareCurveResult:
    """One model's measured share curve: ``points`` ((share, median ms), ...) ascending, ``threads`` the
    intra-op threads each share ran with, ``cores`` the CPU's cores, ``measurements`` one per distinct
    thread count; ``curve`` is the checked curve, or None with ``problem`` saying why the points are not a
    valid (non-increasing) curve."""

    model: str
    source: str
    cores: int
    points: tuple[tuple[float, float], ...]
    threads: tuple[int, ...]
    measurements: tuple[Measurement, ...]
    curve: ShareCurve | None
    problem: str | None


def profile_share_curves(sources: Sequence[ModelSource], shares: Sequence[float], cores: int, warmup: int,
                         repeats: int, *, timer: Callable[[], float] = time.perf_counter, seed: int = 0,
                         providers: Sequence[str] = ("CPUExecutionProvider",),
                         progress: Callable[[int, Measurement], None] | None = None,
                         backend: str = "onnxruntime") -> list[ShareCurveResult]:
    """Each source's share curve on this CPU (``cores`` cores): for every distinct thread count
    ``max(1, round(share * cores))`` of ``shares``, a fresh ``backend`` (onnxruntime, or ``litert`` for
    ``.tflite`` models) with that many threads
    measures ``warmup`` + ``repeats`` batch-1 runs (:func:`profile_models`); each share's point is the median
    (ms) of its thread count's runs. ``progress(threads, measurement)`` is called as each completes."""
    wanted = check_shares_arg(shares)
    by_share = {sh: threads_for(sh, cores) for sh in wanted}
    out: list[ShareCurveResult] = []
    for source in sources:
        per_threads: dict[int, Measurement] = {}
        for t in sorted(set(by_share.values())):
            runtime = (make_backend("litert", threads=t) if backend == "litert"
                       else OnnxRuntimeBackend(t, providers=providers))
            m = profile_models(runtime, [source], [1], warmup, repeats, timer=timer, seed=seed)[0]
            per_threads[t] = m
            if progress is not None:
                progress(t, m)
        points = tuple((sh, per_threads[by_share[sh]].p50_ms) for sh in wanted)
        name = _model_name(source)
        try:
            curve: ShareCurve | None = check_curve(points, where=f"share curve of {name}")
            problem = None
        except ValueError as e:
            curve, problem = None, str(e)
        out.append(ShareCurveResult(name, source.describe(), cores, points, tuple(by_share[sh] for sh in wanted),
                                    tuple(per_threads.values()), curve, problem))
    return out


def profile_gpu_share_curves(sources: Sequence[ModelSource], shares: Sequence[float], warmup: int, repeats: int,
                             *, device_id: int = 0, seed: int = 0,
                             progress: Callable[[int, Measurement], None] | None = None) -> list[ShareCurveResult]:
    """Each source's share curve on NVIDIA GPU ``device_id`` (Dhakal et al. §IV-B): for every distinct MPS
    active-thread percentage ``max(1, round(share * 100))`` of ``shares``, one instance in its own process at
    that percentage (``gpushare.CudaInstances``, mechanism ``mps``) runs ``warmup`` + ``repeats`` batch-1
    requests; a sample is the session's run timed in the child (ms), and each share's point is the median. In
    the result ``cores`` is 0 and ``threads`` holds the percentages. ``GpuUnavailable`` (503) where there is no
    CUDA path, ``SpatialConfigError`` where no MPS daemon runs (a share needs one to be enforced)."""
    from edgemux.runtime.dataplane.gpushare import CudaInstances, mps_percentage, time_instance

    wanted = check_shares_arg(shares)
    pct = {sh: mps_percentage(sh) for sh in wanted}
    out: list[ShareCurveResult] = []
    for source in sources:
        factory = CudaInstances(source.onnx_path(), mechanism="mps", seed=seed)
        inputs = factory.warm_inputs()
        name = _model_name(source)
        per_pct: dict[int, Measurement] = {}
        for p in sorted(set(pct.values())):
            samples = time_instance(factory, p / 100.0, inputs, warmup, repeats)
            m = Measurement.from_samples(name, source.describe(), _input_size(source, ()), 1, warmup, samples)
            per_pct[p] = m
            if progress is not None:
                progress(p, m)
        points = tuple((sh, per_pct[pct[sh]].p50_ms) for sh in wanted)
        try:
            curve: ShareCurve | None = check_curve(points, where=f"GPU share curve of {name}")
            problem = None
        except ValueError as e:
            curve, problem = None, str(e)
        out.append(ShareCurveResult(name, source.describe(), 0, points, tuple(pct[sh] for sh in wanted),
                                    tuple(per_pct.values()), curve, problem))
    return out


def curve_text(curve: Sequence[tuple[float, float]]) -> str:
    """A curve in the catalog's ``share:ms;share:ms`` form (shortest exact float text)."""
    return ";".join(f"{_fmt(s)}:{_fmt(ms)}" for s, ms in curve)


# ------------------------------------------------------------------------------------------- provenance


@dataclass(frozen=True)
class HostInfo:
    """Where and how measurements were taken: backend name and version, execution providers, intra-op
    threads, host name, CPU model (``None`` when unknown) and the UTC date (ISO 8601, ``...Z``)."""

    backend: str
    version: str
    providers: tuple[str, ...]
    threads: int
    node: str
    cpu_model: str | None
    date: str

    def as_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "version": self.version, "providers": list(self.providers),
                "threads": self.threads, "node": self.node, "cpu_model": self.cpu_model, "date": self.date}


def cpu_model(cpuinfo: str | os.PathLike[str] = "/proc/cpuinfo") -> str | None:
    """The CPU's model name from ``/proc/cpuinfo`` (x86 ``model name``; ARM ``Hardware``/``Model``,
    other fields on other ISAs); ``None`` when the file or the field is absent."""
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip():
            fields.setdefault(key.strip().lower(), " ".join(value.split()))
    for key in ("model name", "hardware", "model", "cpu model", "cpu", "processor"):
        found = fields.get(key)
        # on x86 'processor' is just the CPU's index: a number is not a model
        if found and not found.isdigit():
            return found
    return None


def host_info(backend: Backend, *, now: datetime | None = None,
              cpuinfo: str | os.PathLike[str] = "/proc/cpuinfo") -> HostInfo:
    """Describe ``backend`` and this host at ``now`` (default: the current UTC time, to the second)."""
    when = (now or datetime.now(timezone.utc)).astimezone(timezone.utc).replace(microsecond=0)
    version = ""
    if backend.name in ("onnxruntime", "cuda"):
        import onnxruntime as ort

        version = ort.__version__
    elif backend.name.startswith("litert"):
        from importlib.metadata import version as package_version

        version = package_version("ai-edge-litert")
    return HostInfo(
        backend="onnxruntime" if backend.name == "cuda" else backend.name, version=version,
        providers=tuple(getattr(backend, "providers", ())) or (backend.name,),
        threads=int(getattr(backend, "threads", 1)), node=platform.node() or "unknown-host",
        cpu_model=cpu_model(cpuinfo), date=when.strftime("%Y-%m-%dT%H:%M:%SZ"))


def provenance_text(host: HostInfo, warmup: int, repeats: int) -> str:
    """The provenance every profile of the set carries, e.g. ``measured with onnxruntime 1.17.1
    (CPUExecutionProvider, 1 threads) on node1 / AMD EPYC 7763 at 2026-01-01T12:00:00Z, 5 warm-up + 30
    timed runs per batch``. The CPU model is left out when unknown."""
    backend = f"{host.backend} {host.version}".strip()
    where = host.node + (f" / {host.cpu_model}" if host.cpu_model else "")
    return (f"measured with {backend} ({', '.join(host.providers)}, {host.threads} threads) on {where} "
            f"at {host.date}, {warmup} warm-up + {repeats} timed runs per batch")


# -------------------------------------------------------------------------------------------- writing


def _is_ours(directory: Path) -> bool:
    try:
        data = yaml.safe_load((directory / INDEX_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(data, dict) and data.get("generated_by") == GENERATOR


def check_out_dir(out_dir: str | os.PathLike[str], force: bool = False) -> Path:
    """``out_dir`` as a Path if the profiler may write there: absent, an empty directory, a profile set
    this profiler wrote earlier (replaced), or anything else with ``force``. ``ProfilerError`` otherwise.
    Call it before measuring so a bad ``--out`` fails in a second, not after minutes."""
    path = Path(out_dir)
    if not path.exists() and not path.is_symlink():
        return path
    if not path.is_dir():
        if force:
            return path
        raise ProfilerError("--out", f"{path} exists and is not a directory (use --force to replace it)")
    if force or not any(path.iterdir()) or _is_ours(path):
        return path
    raise ProfilerError("--out", f"{path} is a non-empty directory that is not a profile set written by "
                                 f"'{GENERATOR}' (use --force to replace it)")


def check_catalog_name(name: str) -> str:
    """``name`` if a new profile set may be called so: the loader's catalog-name rule (lower-case letters,
    digits, '-') and not a built-in catalog (the two could not be loaded together); ``ProfilerError``."""
    if not isinstance(name, str) or not _CATALOG_RE.match(name):
        raise ProfilerError("--catalog", f"{name!r} must be lower-case letters, digits and '-' "
                                         "(it prefixes profile names: <catalog>/<model>)")
    if name in load_builtin_catalog().catalogs():
        raise ProfilerError("--catalog", f"{name!r} is a built-in catalog; choose another name")
    return name


def _fmt(x: float | None) -> str:
    # repr is the shortest text that reads back as the same float: the CSV round trip is exact
    return "" if x is None else repr(float(x))


def _csv_text(rows: list[list[str]], header_comment: str) -> str:
    buf = io.StringIO()
    for line in header_comment.splitlines():
        buf.write(f"# {line}".rstrip() + "\n")
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    w.writerows(rows)
    return buf.getvalue()


def write_profile_set(measurements: Sequence[Measurement], out_dir: str | os.PathLike[str], catalog_name: str,
                      device_kind: DeviceKind | str = DeviceKind.CPU, host: HostInfo | None = None, *,
                      force: bool = False, description: str | None = None,
                      share_curves: Mapping[str, ShareCurve] | None = None) -> Path:
    """Write ``measurements`` as the profile set ``catalog_name`` (kind ``device_kind``) in ``out_dir``:
    ``catalogs.yaml`` (whose ``sources`` entry is :func:`provenance_text`), ``<catalog_name>.csv`` (one row
    per model, input size and batch; times ms, variances ms^2, memory MB) and an empty ``constants.yaml``.

    The set is written to a temporary directory beside ``out_dir``, read back with ``load_catalog_from``
    (so a set that would not load is never left behind), then renamed into place. ``out_dir`` must pass
    :func:`check_out_dir` (``force`` replaces anything). ``host`` is required: a measurement without a
    source is not a profile. ``share_curves`` maps a measurement's ``source`` (``zoo:NAME@HxW`` or the file)
    to its share curve (checked with ``perf.spatial.check_curve``), written on its batch-1 row. Returns the
    directory.
    """
    if not measurements:
        raise ProfilerError("measurements", "nothing to write: no measurements")
    if host is None:
        raise ProfilerError("host", "a profile set needs its provenance: pass host_info(backend)")
    check_catalog_name(catalog_name)
    kind = parse_kind(device_kind)
    warmups = {m.warmup for m in measurements}
    repeats = {m.repeats for m in measurements}
    if len(warmups) != 1 or len(repeats) != 1:
        # one provenance text per set: it states the warm-up and timed runs, so they must be the same
        raise ProfilerError("measurements", f"mixed warm-up/timed run counts ({sorted(warmups)} / "
                                            f"{sorted(repeats)}): write them as separate profile sets")
    warmup, runs = warmups.pop(), repeats.pop()
    seen: set[tuple[str, str]] = set()
    for m in measurements:
        if (m.model, m.variant) in seen:
            raise ProfilerError("measurements", f"model {m.model} variant {m.variant} measured twice")
        seen.add((m.model, m.variant))
    curves: dict[str, ShareCurve] = {}
    for src, points in (share_curves or {}).items():
        try:
            curves[src] = check_curve(points, where=f"share curve of {src}")
        except ValueError as e:
            raise ProfilerError("share_curves", str(e)) from None
        if not any(m.source == src and m.batch == 1 for m in measurements):
            raise ProfilerError("share_curves", f"{src} has a share curve but no batch-1 measurement to write "
                                                "it with")
    target = check_out_dir(out_dir, force)
    provenance = provenance_text(host, warmup, runs)
    csv_name = f"{catalog_name}.csv"

    rows = []
    for m in measurements:
        rows.append([
            m.model, m.variant, str(m.batch), _fmt(m.mean_ms), _fmt(m.var_ms2), _fmt(m.memory_static_mb),
            _fmt(m.p50_ms), _fmt(m.p95_ms), _fmt(m.min_ms), _fmt(m.max_ms), _fmt(m.cv), str(m.repeats),
            str(m.warmup), m.source,
            curve_text(curves[m.source]) if m.batch == 1 and m.source in curves else "",
            f"{m.source}, batch {m.batch}: {m.repeats} timed runs after {m.warmup} warm-up",
            "exec_var_ms2 is the sample variance (n-1) of the timed runs; memory_static_mb is the ONNX "
            "file size (weights); runtime memory not measured"
            + ("; share_curve: median ms of batch-1 runs alone at each share of the CPU, a share running "
               "max(1, round(share x cores)) intra-op threads" if m.batch == 1 and m.source in curves else ""),
        ])
    index = {
        "version": 1,
        "generated_by": GENERATOR,
        "host": {**host.as_dict(), "warmup_runs": warmup, "timed_runs": runs},
        "sources": {SOURCE_KEY: provenance},
        "columns": COLUMNS,
        "catalogs": [{
            "name": catalog_name, "file": csv_name, "device_kind": kind.value, "source": SOURCE_KEY,
            "description": description or (f"execution times measured with {host.backend} on "
                                            f"{host.node} ({kind.value}), one variant per input size and batch"),
        }],
    }
    header = (f"Profile set {catalog_name} (device kind {kind.value}), written by '{GENERATOR}'.\n"
              f"Provenance: {provenance}.\n"
              "One row per model, input size (pixels) and batch size; variant = <H>x<W>-b<batch>.\n"
              "Units: ms, ms^2, MB. Read it with --profiles DIR or load_catalog_from(DIR).")
    index_text = "".join(f"# {ln}\n" for ln in header.splitlines()) + yaml.safe_dump(
        index, sort_keys=False, allow_unicode=True, width=110)
    constants_text = "# No device-level constants are measured by the profiler.\nconstants: []\n"

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.tmp-"))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it private (0700); a profile set is meant to be shared
        (tmp / INDEX_FILE).write_text(index_text, encoding="utf-8")
        (tmp / csv_name).write_text(_csv_text(rows, header), encoding="utf-8")
        (tmp / CONSTANTS_FILE).write_text(constants_text, encoding="utf-8")
        load_catalog_from(tmp, label=str(target))  # never publish a set that does not load
        _replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _replace(tmp: Path, target: Path) -> None:
    """Move the finished ``tmp`` directory to ``target``: readers see the old set or the new one, never a
    half-written one (renames within one directory are atomic)."""
    if not target.exists() and not target.is_symlink():
        os.rename(tmp, target)
        return
    if target.is_dir() and not target.is_symlink() and not any(target.iterdir()):
        os.rename(tmp, target)  # POSIX rename replaces an empty directory
        return
    old = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.old-"))
    os.rmdir(old)
    os.rename(target, old)
    try:
        os.rename(tmp, target)
    except BaseException:
        os.rename(old, target)  # put the previous set back
        raise
    if old.is_dir() and not old.is_symlink():
        shutil.rmtree(old, ignore_errors=True)
    else:
        old.unlink(missing_ok=True)
