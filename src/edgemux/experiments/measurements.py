"""Check the Edge TPU estimator against real measurements (Ibis' queueing-validation CSVs).

Each CSV row is one request to a single Edge TPU shared by two models with Poisson arrivals
(format: ../shared/validation/ibis-edgetpu/README.md). Requests are grouped by file and load point
(``vary_rho``); per model the observed mean response time is mean(end_time - start_time) and the arrival
rate is measured from the send times, (n - 1) / (last - first). The prediction comes from the catalog's
Edge TPU profiles (execution time, switch overhead) through the same multi-tenant FCFS estimator that
``edgemux predict`` uses. Units: ms, req/s.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from edgemux.cluster.workload import Arrival, DeviceSpec, Discipline, Tenant
from edgemux.errors import InputError, UnknownNameError
from edgemux.perf.device import predict_device
from edgemux.perf.paper_forms import ibis_tpu_var_of_means
from edgemux.perf.result import Unstable
from edgemux.profiles.types import DeviceKind

REQUIRED_COLUMNS = ("model", "vary_rho", "start_time", "end_time")
CATALOG = "ibis-edgetpu"


@dataclass(frozen=True)
class PointResult:
    """Observed vs predicted mean response time of one model at one load point of one file."""

    file: str
    load_point: str
    model: str
    requests: int
    rate_rps: float
    observed_ms: float
    predicted_ms: float | Unstable
    paper_ms: float | Unstable  # Ibis Eq. 3 with Var[S] = variance of the tenants' means (perf.paper_forms)

    @property
    def abs_pct_error(self) -> float:
        """|predicted - observed| / observed in percent (inf when the prediction is unstable)."""
        if isinstance(self.predicted_ms, Unstable):
            return math.inf
        return 100.0 * abs(self.predicted_ms - self.observed_ms) / self.observed_ms

    @property
    def paper_abs_pct_error(self) -> float:
        """The same error for the paper's variance reading (inf when unstable)."""
        if isinstance(self.paper_ms, Unstable):
            return math.inf
        return 100.0 * abs(self.paper_ms - self.observed_ms) / self.observed_ms


def _read_file(path: Path) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """load point -> model -> [(start s, end s)] for one CSV; ``InputError`` naming file, row and column."""
    groups: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise InputError("columns", f"missing {', '.join(missing)} (expected the ibis-edgetpu format)", str(path))
        for i, row in enumerate(reader, start=2):
            try:
                start, end = float(row["start_time"]), float(row["end_time"])
            except (TypeError, ValueError):
                raise InputError(f"line {i}", "start_time/end_time must be numbers", str(path)) from None
            if not (math.isfinite(start) and math.isfinite(end)) or end < start:
                raise InputError(f"line {i}", f"end_time {end} is before start_time {start}", str(path))
            groups[row["vary_rho"]][row["model"]].append((start, end))
    if not groups:
        raise InputError("rows", "no requests in file", str(path))
    return groups


def validate_measurements(directory: str | Path) -> list[PointResult]:
    """Predict every (file, load point, model) mean response time in ``directory``'s CSVs (sorted by name)."""
    from edgemux.profiles.catalog import load_catalog

    d = Path(directory)
    if not d.is_dir():
        raise InputError("--measurements", "not a directory", str(directory))
    files = sorted(d.glob("*.csv"))
    if not files:
        raise InputError("--measurements", "no CSV files in directory", str(directory))
    catalog = load_catalog()
    known = [n.split("/", 1)[1] for n in catalog.profiles if n.startswith(CATALOG + "/")]
    device = DeviceSpec("tpu0", DeviceKind.EDGETPU, Discipline.FCFS)
    results: list[PointResult] = []
    for f in files:
        for point, by_model in _read_file(f).items():
            tenants: list[Tenant] = []
            observed: dict[str, tuple[int, float]] = {}
            for model, reqs in sorted(by_model.items()):
                if model not in known:
                    raise UnknownNameError("model", model, f"Edge TPU model ({CATALOG} catalog)", known, str(f))
                if len(reqs) < 2:
                    raise InputError(f"load point {point}", f"model {model} has fewer than 2 requests", str(f))
                starts = sorted(s for s, _ in reqs)
                rate = (len(starts) - 1) / (starts[-1] - starts[0])
                prof = catalog.find(model, DeviceKind.EDGETPU, CATALOG)
                tenants.append(Tenant(model, model, Arrival.poisson(rate), prof.service, switch_ms=prof.switch_ms))
                observed[model] = (len(reqs), 1000.0 * sum(e - s for s, e in reqs) / len(reqs))
            preds = predict_device(device, tenants)
            paper = dict(zip((t.name for t in tenants), ibis_tpu_var_of_means(device, tenants)))
            for t in tenants:
                n, obs = observed[t.name]
                results.append(PointResult(f.name, point, t.name, n, t.rate_rps, obs, preds[t.name].mean_ms,
                                           paper[t.name]))
    return results


def mape(results: list[PointResult], *, paper: bool = False) -> float:
    """Mean absolute percentage error over all points (percent); ``paper`` for the paper's variance reading."""
    return sum(r.paper_abs_pct_error if paper else r.abs_pct_error for r in results) / len(results)
