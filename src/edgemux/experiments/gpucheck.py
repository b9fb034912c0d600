"""Check the GPU sharing estimators against real TensorRT response times (Ibis' ``trt_ps_validation.csv``).

Each CSV row is one request's response time (ms) of one model, run either alone (``Sequential``) or at the
same time as the file's other models, each in its own process (``Concurrent``); format:
../shared/validation/ibis-trt/README.md. Each model's process issues its requests one after another, so the
concurrent run is a closed loop: one request in flight per model, no think time. From each model's mean
isolated response time alone, ``perf.closedloop`` predicts its mean concurrent response time under the
two disciplines Ibis brackets a time-shared GPU with (§3.3): processor sharing (what ``gpu-timeshare`` is
with one request per app) and FCFS.

The check also says how fast the models progressed together, as a multiple of one model alone:
``sum_i S_i / R_i`` (isolated mean over concurrent mean). A device that serves one request's isolated time
of work at a time, shared any way, gives at most 1; above 1 the isolated times are not all device work
(host-side time, or a GPU one model alone leaves partly idle), and no discipline fed with isolated times
alone can predict every model. Units: ms.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from edgemux.cluster.workload import Discipline
from edgemux.errors import InputError
from edgemux.experiments.measurements import csv_text
from edgemux.perf.closedloop import ClosedTenant, closed_responses

TRT_COLUMNS = ("model", "process_type", "response_time")
ALONE, TOGETHER = "Sequential", "Concurrent"
LIMIT_PCT = 10.0  # the target for each model's concurrent mean


@dataclass(frozen=True)
class GpuPoint:
    """One model of a TensorRT file: isolated and concurrent means (ms, with their request counts) and the
    concurrent mean predicted from the isolated ones under processor sharing and FCFS."""

    file: str
    model: str
    isolated_n: int
    isolated_ms: float
    concurrent_n: int
    concurrent_ms: float
    ps_ms: float
    fcfs_ms: float

    def error_pct(self, discipline: str) -> float:
        """Signed error (predicted - observed) / observed of the concurrent mean, percent; ``discipline``
        ``ps`` or ``fcfs``."""
        pred = {"ps": self.ps_ms, "fcfs": self.fcfs_ms}[discipline]
        return 100.0 * (pred - self.concurrent_ms) / self.concurrent_ms


@dataclass(frozen=True)
class GpuCheck:
    """A file's points and ``progress``: sum over models of isolated mean / concurrent mean."""

    file: str
    points: tuple[GpuPoint, ...]
    progress: float

    @property
    def within_limit(self) -> list[str]:
        """The models whose processor-sharing prediction is within ``LIMIT_PCT``."""
        return [p.model for p in self.points if abs(p.error_pct("ps")) <= LIMIT_PCT]


def is_trt_file(path: Path) -> bool:
    """Whether the CSV's header is the TensorRT format's (its columns, any order, extra ones allowed)."""
    with csv_text(path) as fh:
        header = next(csv.reader(fh), [])
    return all(c in header for c in TRT_COLUMNS)


def _read(path: Path) -> dict[str, dict[str, list[float]]]:
    """model -> process type -> response times (ms); ``InputError`` naming file, line and column."""
    times: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    with csv_text(path) as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in TRT_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise InputError("columns", f"missing {', '.join(missing)} (expected the ibis-trt format)", str(path))
        for i, row in enumerate(reader, start=2):
            kind = row["process_type"]
            if kind not in (ALONE, TOGETHER):
                raise InputError(f"line {i}", f"process_type must be {ALONE} or {TOGETHER}, got {kind!r}", str(path))
            try:
                ms = float(row["response_time"])
            except (TypeError, ValueError):
                raise InputError(f"line {i}", f"response_time must be a number, got {row['response_time']!r}",
                                 str(path)) from None
            if not (math.isfinite(ms) and ms > 0):
                raise InputError(f"line {i}", f"response_time must be a number > 0, got {ms:g}", str(path))
            times[row["model"]][kind].append(ms)
    if not times:
        raise InputError("rows", "no requests in file", str(path))
    for model, kinds in times.items():
        for kind in (ALONE, TOGETHER):
            if not kinds.get(kind):
                raise InputError(f"model {model}", f"has no {kind} rows: both runs are needed", str(path))
    return times


def gpu_check(path: str | Path) -> GpuCheck:
    """Predict each model's concurrent mean from the isolated means of all the file's models (closed loop,
    one request each in flight, no think time) under processor sharing and FCFS."""
    p = Path(path)
    times = _read(p)
    models = sorted(times)
    alone = [sum(times[m][ALONE]) / len(times[m][ALONE]) for m in models]
    together = [sum(times[m][TOGETHER]) / len(times[m][TOGETHER]) for m in models]
    tenants = [ClosedTenant(s) for s in alone]
    ps = closed_responses(tenants, Discipline.GPU_TIMESHARE)
    fcfs = closed_responses(tenants, Discipline.FCFS)
    points = tuple(GpuPoint(p.name, m, len(times[m][ALONE]), a, len(times[m][TOGETHER]), c, q, f)
                   for m, a, c, q, f in zip(models, alone, together, ps, fcfs))
    return GpuCheck(p.name, points, sum(a / c for a, c in zip(alone, together)))
