"""Check the Edge TPU estimator against real measurements (Ibis' queueing-validation CSVs).

Each CSV row is one request to a single Edge TPU shared by two models with Poisson arrivals
(format: ../shared/validation/ibis-edgetpu/README.md). Requests are grouped by file and load point
(``vary_rho``); per model the observed response times are end_time - start_time (mean, p95, p99) and the
arrival rate is measured from the send times, (n - 1) / (last - first). The prediction comes from the
catalog's Edge TPU profiles (execution time, switch overhead) through the same multi-tenant FCFS estimator
that ``edgemux predict`` uses, with its p95/p99 from the numerical P-K inversion.

Calibrated prediction (``adapt.calibrate``): each request's service time is recovered FCFS-wise from its
send and answer times alone (``start_time``, ``end_time``: the end-to-end times any client has; service
starts at the later of the send and the previous answer) and split by whether it paid a model switch; a
load point is then predicted again with its models' profiles calibrated from the *other* load points of
the same file (leave one load point out, so no point is predicted from its own requests), as a running
system would have calibrated from what it served before. Where the file also has the TPU-side times
(``tpu_submit_time``, ``tpu_end_time``), the same calibration from those is reported beside it
(``device_calibrated_*``), for comparison. Units: ms, req/s.
"""

from __future__ import annotations

import csv
import io
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import Any

import numpy as np

from edgemux.adapt.calibrate import Observed, calibrate, observed_from_fcfs
from edgemux.cluster.workload import Arrival, DeviceSpec, Discipline, Tenant
from edgemux.errors import InputError, UnknownNameError
from edgemux.perf.device import predict_device
from edgemux.perf.paper_forms import ibis_tpu_var_of_means
from edgemux.perf.switchlaw import switch_response_laws
from edgemux.perf.result import Unstable
from edgemux.profiles.types import DeviceKind, Profile

REQUIRED_COLUMNS = ("model", "vary_rho", "start_time", "end_time")
TPU_COLUMNS = ("tpu_submit_time", "tpu_end_time")  # optional: needed for calibration
CATALOG = "ibis-edgetpu"
# Observations a profile needs before calibration replaces it: the smallest switched-request count per
# model in the given files' other load points is in the hundreds, so 20 never leaves a profile uncalibrated
# there, while two or three requests would calibrate on noise.
MIN_SAMPLES = 20


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
    observed_p95_ms: float = math.nan
    observed_p99_ms: float = math.nan
    predicted_p95_ms: float | Unstable | None = None
    predicted_p99_ms: float | Unstable | None = None
    # the same prediction with profiles calibrated on the end-to-end times of the file's other load points
    calibrated_ms: float | Unstable | None = None
    calibrated_p95_ms: float | Unstable | None = None
    calibrated_p99_ms: float | Unstable | None = None
    # ... and on their TPU-side times (None: the file has none)
    device_calibrated_ms: float | Unstable | None = None
    device_calibrated_p95_ms: float | Unstable | None = None
    device_calibrated_p99_ms: float | Unstable | None = None
    # the exact switch law (perf.switchlaw) on the catalog's profiles, and on the e2e-calibrated ones
    law_ms: float | Unstable | None = None
    law_p95_ms: float | Unstable | None = None
    law_p99_ms: float | Unstable | None = None
    law_calibrated_ms: float | Unstable | None = None
    law_calibrated_p95_ms: float | Unstable | None = None
    law_calibrated_p99_ms: float | Unstable | None = None

    @property
    def abs_pct_error(self) -> float:
        """|predicted - observed| / observed in percent (inf when the prediction is unstable)."""
        if isinstance(self.predicted_ms, Unstable):
            return math.inf
        return 100.0 * abs(self.predicted_ms - self.observed_ms) / self.observed_ms

    def error_pct(self, stat: str, basis: str = "catalog") -> float | None:
        """Signed error (predicted - observed) / observed in percent of ``stat`` (mean, p95, p99), from the
        catalog's profiles (``basis`` "catalog"), those calibrated on end-to-end times ("e2e") or on the
        TPU-side times ("device"), or the exact switch law on the catalog's ("law") or the e2e-calibrated
        profiles ("law-e2e"); inf when unstable, None when not predicted."""
        suffix = {"mean": "", "p95": "_p95", "p99": "_p99"}[stat]
        prefix = {"catalog": "predicted", "e2e": "calibrated", "device": "device_calibrated", "law": "law",
                  "law-e2e": "law_calibrated"}[basis]
        pred = getattr(self, f"{prefix}{suffix}_ms")
        obs = getattr(self, f"observed{suffix}_ms")
        if pred is None:
            return None
        if isinstance(pred, Unstable):
            return math.inf
        return 100.0 * (pred - obs) / obs

    @property
    def paper_abs_pct_error(self) -> float:
        """The same error for the paper's variance reading (inf when unstable)."""
        if isinstance(self.paper_ms, Unstable):
            return math.inf
        return 100.0 * abs(self.paper_ms - self.observed_ms) / self.observed_ms


@dataclass(frozen=True)
class _Request:
    start_s: float
    end_s: float
    tpu_submit_s: float  # nan when the file has no TPU-side times
    tpu_end_s: float


def csv_text(path: Path) -> io.StringIO:
    """The CSV file ``path`` as text to read rows from; ``InputError`` naming the file when it cannot be read
    or is not UTF-8 text."""
    try:
        return io.StringIO(path.read_bytes().decode("utf-8"), newline="")
    except UnicodeDecodeError as e:
        raise InputError("encoding", f"not UTF-8 text (byte {e.start}): expected a CSV file", str(path)) from None
    except OSError as e:
        raise InputError("file", f"cannot read: {e.strerror or e}", str(path)) from None


def _read_file(path: Path) -> dict[str, dict[str, list[_Request]]]:
    """load point -> model -> requests of one CSV; ``InputError`` naming file, row and column."""
    groups: dict[str, dict[str, list[_Request]]] = defaultdict(lambda: defaultdict(list))
    with csv_text(path) as fh:
        reader = csv.DictReader(fh)
        fields = reader.fieldnames or []
        missing = [c for c in REQUIRED_COLUMNS if c not in fields]
        if missing:
            raise InputError("columns", f"missing {', '.join(missing)} (expected the ibis-edgetpu format, or the ibis-trt one: model, process_type, response_time)", str(path))
        tpu = all(c in fields for c in TPU_COLUMNS)
        for i, row in enumerate(reader, start=2):
            try:
                start, end = float(row["start_time"]), float(row["end_time"])
                sub, done = ((float(row["tpu_submit_time"]), float(row["tpu_end_time"])) if tpu
                             else (math.nan, math.nan))
            except (TypeError, ValueError):
                cols = "start_time/end_time" + ("/tpu_submit_time/tpu_end_time" if tpu else "")
                raise InputError(f"line {i}", f"{cols} must be numbers", str(path)) from None
            if not (math.isfinite(start) and math.isfinite(end)) or end < start:
                raise InputError(f"line {i}", f"end_time {end} is before start_time {start}", str(path))
            if tpu and (not (math.isfinite(sub) and math.isfinite(done)) or done < sub):
                raise InputError(f"line {i}", f"tpu_end_time {done} is before tpu_submit_time {sub}", str(path))
            groups[row["vary_rho"]][row["model"]].append(_Request(start, end, sub, done))
    if not groups:
        raise InputError("rows", "no requests in file", str(path))
    return groups


def _observed(points: dict[str, dict[str, list[_Request]]], device: bool) -> dict[str, dict[str, Observed]] | None:
    """Per load point, per model, the service-time moments recovered from the end-to-end times (``device``:
    from the TPU-side times; None when the file has none). A load point is one run of the device, so
    requests are ordered within it only."""
    out: dict[str, dict[str, Observed]] = {}
    for point, by_model in points.items():
        reqs = [(m, r) for m, rs in by_model.items() for r in rs]
        if device and any(math.isnan(r.tpu_submit_s) for _, r in reqs):
            return None
        sent = [r.tpu_submit_s if device else r.start_s for _, r in reqs]
        done = [r.tpu_end_s if device else r.end_s for _, r in reqs]
        out[point] = observed_from_fcfs([m for m, _ in reqs], sent, done)
    return out


def _recalibrated(point: str, by_model: dict[str, list[_Request]], profiles: dict[str, Profile],
                  observed: dict[str, dict[str, Observed]]) -> dict[str, Profile]:
    """``profiles`` calibrated on the ``observed`` moments of the load points other than ``point``."""
    others = [obs for q, obs in observed.items() if q != point]
    merged = {m: reduce(Observed.merge, (o.get(m, Observed()) for o in others), Observed()) for m in by_model}
    return {m: calibrate(p, merged[m], MIN_SAMPLES) for m, p in profiles.items()}


def _law(tenants: list[Tenant]) -> dict[str, tuple[Any, Any, Any]]:
    """Per tenant (mean, p95, p99) in ms from the exact switch law (``Unstable`` for each when overloaded)."""
    laws = switch_response_laws(tenants)
    if isinstance(laws, Unstable):
        return {t.name: (laws, laws, laws) for t in tenants}
    return {t.name: (law.mean, *law.quantiles((0.95, 0.99))) for t, law in zip(tenants, laws)}


def _tenants(by_model: dict[str, list[_Request]], profiles: dict[str, Profile]) -> list[Tenant]:
    tenants = []
    for model, reqs in sorted(by_model.items()):
        starts = sorted(r.start_s for r in reqs)
        rate = (len(starts) - 1) / (starts[-1] - starts[0])
        prof = profiles[model]
        tenants.append(Tenant(model, model, Arrival.poisson(rate), prof.service, switch_ms=prof.switch_ms))
    return tenants


def validate_measurements(directory: str | Path) -> list[PointResult]:
    """Predict every (file, load point, model) response time (mean, p95, p99) in ``directory``'s CSVs
    (sorted by name), from the catalog's profiles and, where the TPU-side times exist, from profiles
    calibrated on the file's other load points."""
    d = Path(directory)
    if not d.is_dir():
        raise InputError("--measurements", "not a directory", str(directory))
    files = sorted(d.glob("*.csv"))
    if not files:
        raise InputError("--measurements", "no CSV files in directory", str(directory))
    return validate_files(files)


def validate_files(files: list[Path]) -> list[PointResult]:
    """:func:`validate_measurements` of the given ibis-edgetpu CSVs, in the given order."""
    return [r for point in _evaluate(files) for r in point.results]


@dataclass(frozen=True)
class _Evaluated:
    """One load point of one file: its results (tenants' order), the tenants at the measured rates with the
    profiles calibrated on the file's other load points' end-to-end times, and its request count."""

    results: list[PointResult]
    calibrated: list[Tenant]
    requests: int


def _evaluate(files: list[Path]) -> list[_Evaluated]:
    """Every load point of ``files`` (each read once) predicted from the catalog, from the end-to-end and the
    TPU-side calibrations, and by the exact switch law on the catalog's and the end-to-end-calibrated
    profiles."""
    from edgemux.profiles.catalog import load_catalog

    catalog = load_catalog()
    known = [n.split("/", 1)[1] for n in catalog.profiles if n.startswith(CATALOG + "/")]
    device = DeviceSpec("tpu0", DeviceKind.EDGETPU, Discipline.FCFS)
    out: list[_Evaluated] = []
    for f in files:
        points = _read_file(f)
        observed, device_observed = _observed(points, device=False), _observed(points, device=True)
        assert observed is not None  # end-to-end times: every file has them
        for point, by_model in points.items():
            for model, reqs in by_model.items():
                if model not in known:
                    raise UnknownNameError("model", model, f"Edge TPU model ({CATALOG} catalog)", known, str(f))
                if len(reqs) < 2:
                    raise InputError(f"load point {point}", f"model {model} has fewer than 2 requests", str(f))
            profiles = {m: catalog.find(m, DeviceKind.EDGETPU, CATALOG) for m in by_model}
            tenants = _tenants(by_model, profiles)
            preds = predict_device(device, tenants)
            paper = dict(zip((t.name for t in tenants), ibis_tpu_var_of_means(device, tenants)))
            calibrated = _tenants(by_model, _recalibrated(point, by_model, profiles, observed))
            cal = predict_device(device, calibrated)
            dev = (None if device_observed is None else
                   predict_device(device, _tenants(by_model, _recalibrated(point, by_model, profiles,
                                                                           device_observed))))
            law, law_cal = _law(tenants), _law(calibrated)
            results = []
            for t in tenants:
                lat = np.array([1000.0 * (r.end_s - r.start_s) for r in by_model[t.name]])
                p95, p99 = np.percentile(lat, [95.0, 99.0])
                e, c = preds[t.name], cal[t.name]
                d = dev[t.name] if dev is not None else None
                results.append(PointResult(
                    f.name, point, t.name, len(lat), t.rate_rps, float(lat.mean()), e.mean_ms, paper[t.name],
                    float(p95), float(p99), e.p95_ms, e.p99_ms, c.mean_ms, c.p95_ms, c.p99_ms,
                    d.mean_ms if d else None, d.p95_ms if d else None, d.p99_ms if d else None,
                    *law[t.name], *law_cal[t.name]))
            out.append(_Evaluated(results, calibrated, sum(len(rs) for rs in by_model.values())))
    return out


@dataclass(frozen=True)
class SingleRun:
    """How much one run of a load point's length can differ from the stationary law it samples: per stat
    (p95, p99) the signed errors (law - run) / run in percent of the law against ``runs`` simulated runs of
    each point (rows: runs, columns: the points' tenants in ``results`` order), and each observed value's
    rank among its point's simulated runs (0..1)."""

    stats: tuple[str, ...]
    errors: dict[str, np.ndarray]
    ranks: dict[str, np.ndarray]

    def mae(self, stat: str) -> np.ndarray:
        """Per simulated set of runs, the mean absolute error (percent) a perfect predictor would score."""
        return np.abs(self.errors[stat]).mean(axis=1)

    def worst_under(self, stat: str) -> np.ndarray:
        """Per simulated set of runs, its most negative error (percent)."""
        return self.errors[stat].min(axis=1)


def measure_files(files: list[Path], runs: int = 200, seed: int = 0,
                  progress: Callable[[int, int], None] | None = None) -> tuple[list[PointResult], SingleRun]:
    """:func:`validate_files`, and each load point simulated ``runs`` times, as long as the file's run (its
    request count, from an empty device, at its measured rates), with the exact switch law's model on the
    e2e-calibrated profiles, reading each run's p95 and p99 per model: what a predictor that knew the
    stationary law exactly would score against single runs (``SingleRun``). Seeded: same arguments, same
    answer. ``progress(done, total)`` counts the simulated runs (``runs`` per load point): it is called with 0
    once the points are predicted, then as each run completes."""
    from edgemux.sim.run import replication_stats, simulate_raw

    evaluated = _evaluate(files)
    results = [r for point in evaluated for r in point.results]
    device = DeviceSpec("tpu0", DeviceKind.EDGETPU, Discipline.FCFS)
    sims = np.full((runs, len(results), 2), math.nan)
    first = 0
    total = runs * len(evaluated)
    if progress is not None:
        progress(0, total)
    for k, (point, ss) in enumerate(zip(evaluated, np.random.SeedSequence(seed).spawn(len(evaluated)))):
        cols = slice(first, first + len(point.results))  # the point's results, in its tenants' order
        for r, run_seed in enumerate(ss.spawn(runs)):
            run = simulate_raw(device, point.calibrated, requests=point.requests, seed=run_seed)
            sims[r, cols, :] = replication_stats(run, 0.0)[0][:, 3:5]
            if progress is not None:
                progress(k * runs + r + 1, total)
        first = cols.stop
    out_err: dict[str, np.ndarray] = {}
    out_rank: dict[str, np.ndarray] = {}
    for k, stat in enumerate(("p95", "p99")):
        law = np.array([float(getattr(r, f"law_calibrated_{stat}_ms")) for r in results])
        obs = np.array([getattr(r, f"observed_{stat}_ms") for r in results])
        out_err[stat] = 100.0 * (law[None, :] - sims[:, :, k]) / sims[:, :, k]
        out_rank[stat] = (sims[:, :, k] < obs[None, :]).mean(axis=0)
    return results, SingleRun(("p95", "p99"), out_err, out_rank)


def tail_errors(results: list[PointResult], stat: str, basis: str = "catalog") -> tuple[float, float, float]:
    """Over the points that have the prediction from ``basis`` (see ``PointResult.error_pct``): mean
    absolute error, most negative and most positive signed error of ``stat`` (mean, p95, p99), in percent;
    nan when no point has it."""
    errs = [e for r in results if (e := r.error_pct(stat, basis)) is not None]
    if not errs:
        return math.nan, math.nan, math.nan
    return sum(abs(e) for e in errs) / len(errs), min(errs), max(errs)


def mape(results: list[PointResult], *, paper: bool = False) -> float:
    """Mean absolute percentage error over all points (percent); ``paper`` for the paper's variance reading."""
    return sum(r.paper_abs_pct_error if paper else r.abs_pct_error for r in results) / len(results)
