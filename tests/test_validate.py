"""``edgemux validate``: the grid and the real Edge TPU measurements, good and bad paths."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import VALIDATION
from edgemux.cli.main import main
from edgemux.experiments.validation import FAMILIES, Case, build_cases, run_grid
from edgemux.sim.run import choose_engine

needs_data = pytest.mark.skipif(not VALIDATION.is_dir(), reason="../shared/validation not beside the checkout")


@needs_data
def test_measurements_mape_within_5pct(capsys):
    code = main(["validate", "--measurements", str(VALIDATION), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert data["passed"] and data["mape_pct"]["all"] <= 5.0
    # two files x five load points x two models
    assert len(data["points"]) == 20
    for p in data["points"]:
        assert p["predicted_ms"] != "unstable"
        assert p["observed_p99_ms"] > p["observed_p95_ms"] > 0 and p["predicted_p99_ms"] > p["predicted_p95_ms"]
        assert isinstance(p["calibrated_p99_ms"], float)
    errors = data["errors_pct"]
    assert errors["calibrated"]["p95"]["mean_abs_pct"] < errors["catalog"]["p95"]["mean_abs_pct"]


@needs_data
def test_measurements_table(capsys):
    assert main(["validate", "--measurements", str(VALIDATION)]) == 0
    out = capsys.readouterr().out
    assert "MAPE all 20 points" in out and "PASS" in out
    assert " p99 error: catalog profiles mean |error|" in out and "calibrated" in out


def _one_line_exit_2(argv, capsys, needle):
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and needle in err and "Traceback" not in err


def test_measurements_bad_dir(tmp_path, capsys):
    _one_line_exit_2(["validate", "--measurements", str(tmp_path / "nope")], capsys, "not a directory")
    _one_line_exit_2(["validate", "--measurements", str(tmp_path)], capsys, "no CSV files")


def test_measurements_bad_csv(tmp_path, capsys):
    (tmp_path / "x.csv").write_text("model,foo\nmobilenet_v2,1\n")
    _one_line_exit_2(["validate", "--measurements", str(tmp_path)], capsys, "missing vary_rho")
    (tmp_path / "x.csv").write_text("model,vary_rho,start_time,end_time\nmobilenet_v2,0.1,abc,2\n")
    _one_line_exit_2(["validate", "--measurements", str(tmp_path)], capsys, "line 2")
    (tmp_path / "x.csv").write_text("model,vary_rho,start_time,end_time\nmobilenet_v2,0.1,3,2\n")
    _one_line_exit_2(["validate", "--measurements", str(tmp_path)], capsys, "before start_time")
    (tmp_path / "x.csv").write_text("model,vary_rho,start_time,end_time,tpu_submit_time,tpu_end_time\n"
                                    "mobilenet_v2,0.1,1,2,1.5,1.2\n")
    _one_line_exit_2(["validate", "--measurements", str(tmp_path)], capsys, "before tpu_submit_time")
    (tmp_path / "x.csv").write_text(
        "model,vary_rho,start_time,end_time\nresnet9000,0.1,1,2\nresnet9000,0.1,2,3\n")
    _one_line_exit_2(["validate", "--measurements", str(tmp_path)], capsys, "resnet9000")


@needs_data
def test_measurements_fail_when_profiles_wrong(tmp_path, capsys, monkeypatch):
    """The MAPE check can fail: halve every Edge TPU execution time and the prediction misses."""
    import dataclasses

    from edgemux.profiles import catalog as cat

    shutil.copy(next(VALIDATION.glob("*.csv")), tmp_path)
    real = cat.load_catalog()

    class Halved:
        def __init__(self, inner):
            self.inner = inner
            self.profiles = inner.profiles

        def find(self, model, kind, catalog=None):
            p = self.inner.find(model, kind, catalog)
            e = p.exec_time(1)
            return dataclasses.replace(p, exec={1: dataclasses.replace(e, mean_ms=e.mean_ms / 2)})

    monkeypatch.setattr(cat, "load_catalog", lambda: Halved(real))
    assert main(["validate", "--measurements", str(tmp_path)]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_validate_bad_options(capsys):
    _one_line_exit_2(["validate", "--family", "nope"], capsys, "unknown 'nope'")
    _one_line_exit_2(["validate", "--size", "0"], capsys, "--size")


def test_grid_small_runs_and_reports(capsys):
    """A tiny grid over two families runs end to end and prints every row with a verdict."""
    code = main(["validate", "--size", "0.05", "--family", "cpu-tandem", "--family", "batch", "--workers", "1",
                 "--json"])
    data = json.loads(capsys.readouterr().out)
    assert data["rows"] and all(r["verdict"] in ("ok", "FAIL", "info") for r in data["rows"])
    assert code in (0, 1)


def test_gpu_rows_check_estimate_and_report_band(capsys):
    """gpu-timeshare cases: an upper check of the admission bound on every case, the point estimate checked
    at low load and reported elsewhere (the Ibis-like mix included), and the Ibis band as a report."""
    main(["validate", "--size", "0.05", "--family", "gpu-timeshare", "--workers", "1", "--json"])
    rows = json.loads(capsys.readouterr().out)["rows"]
    kinds = {(r["family"], r["kind"]) for r in rows}
    assert ("GPU time-sharing point estimate", "approx") in kinds
    assert ("GPU time-sharing point estimate", "report") in kinds
    upper = [r for r in rows if r["family"] == "GPU time-sharing bound is conservative"]
    assert len(upper) == 20 and all(r["kind"] == "upper" for r in upper)
    assert any(r["case"].startswith("Ibis-like mix") for r in upper)
    band = [r for r in rows if r["family"] == "Ibis GPU band [FCFS, PS]"]
    assert band and all(r["verdict"] == "info" and r["tolerance_pct"] is None for r in band)


PARTS = 6  # the grid in this many test classes, each one unit of the suite's --dist loadscope
MIN_CHECKS = 300  # the full grid's checks at least (each part holds about a sixth of 775: `edgemux validate --json`)


# CPU time per arrival of each engine, relative to the vectorized Lindley path (measured over the whole grid:
# about 95 ns an arrival for Lindley, 590 for the sweep, 800 for the sweep with its control run, 1,400 for the
# event engine)
ENGINE_COST = {"lindley": 1.0, "sweep": 6.0, "event": 15.0}
CONTROL_COST = 2.0  # a controlled case also runs its FCFS control on the same arrivals


def _work(c: Case) -> float:
    """A case's simulation work (in Lindley arrivals): arrivals x replications x its engine's cost."""
    cost = ENGINE_COST[choose_engine(c.device, list(c.tenants))] + (CONTROL_COST if c.controlled else 0.0)
    return c.requests * c.replications * cost


def _grid_parts() -> list[list[tuple[str, str]]]:
    """The full grid's cases as (family, label), in ``PARTS`` parts of about equal work: longest first onto
    the lightest part."""
    parts: list[list[tuple[str, str]]] = [[] for _ in range(PARTS)]
    load = [0.0] * PARTS
    for c in sorted(build_cases(1.0), key=lambda c: -_work(c)):
        i = load.index(min(load))
        parts[i].append((c.family, c.label))
        load[i] += _work(c)
    return parts


def _check_grid_part(part: int) -> None:
    """The cases of one part, as `edgemux validate` runs them (a case's seed is its index in the whole grid,
    so these are the rows of the full run): every check holds."""
    mine = set(_grid_parts()[part])
    rows = run_grid(select=lambda c: (c.family, c.label) in mine, workers=1)
    assert rows
    failed = [r for r in rows if r.verdict == "FAIL"]
    assert not failed, failed
    assert sum(r.passed is not None for r in rows) >= MIN_CHECKS / PARTS  # so the whole grid has MIN_CHECKS
    # the exact checks are meaningful only if the simulator is precise enough to see a 2 % miss
    assert all(r.half_width / r.simulated < 0.02 for r in rows if r.kind == "exact")


def _grid_class(part: int) -> type:
    def test_full_validate_passes(self: object) -> None:
        _check_grid_part(part)

    return pytest.mark.slow(type(f"TestFullGridPart{part}", (), {"test_full_validate_passes": test_full_validate_passes}))


for _part in range(PARTS):  # one class per part: loadscope gives each to whichever worker is free
    globals()[f"TestFullGridPart{_part}"] = _grid_class(_part)


def test_grid_parts_cover_the_grid_once() -> None:
    every = [x for part in _grid_parts() for x in part]
    assert sorted(every) == sorted((c.family, c.label) for c in build_cases(1.0))
    assert len(set(every)) == len(every)


def test_full_grid_size() -> None:
    """The grid's shape does not depend on ``size`` (only run lengths do); that the full grid has at least
    ``MIN_CHECKS`` checks is asserted part by part (``_check_grid_part``: each part at least its share)."""
    assert [(c.family, c.label) for c in build_cases(0.01)] == [(c.family, c.label) for c in build_cases(1.0)]


def test_families_list_matches_the_grid():
    """--family checks names against FAMILIES; every case of the grid must belong to one of them."""
    from edgemux.experiments.validation import build_cases

    assert {c.family for c in build_cases(0.01)} == set(FAMILIES)


@needs_data
def test_measurements_without_device_times_calibrate_from_end_to_end_times(tmp_path, capsys):
    """A file with only the send and answer times (what any client has) is calibrated the same way: the
    e2e-calibrated figures equal those of the full file, and the device-side ones are absent."""
    import csv

    src = next(VALIDATION.glob("*.csv"))
    with src.open(newline="") as fh, (tmp_path / src.name).open("w", newline="") as out:
        reader = csv.DictReader(fh)
        keep = [c for c in reader.fieldnames or [] if not c.startswith("tpu_")]
        writer = csv.DictWriter(out, keep, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(reader)
    full = tmp_path / "full"
    full.mkdir()
    shutil.copy(src, full)
    assert main(["validate", "--measurements", str(tmp_path), "--json"]) == 0
    bare = json.loads(capsys.readouterr().out)
    assert main(["validate", "--measurements", str(full), "--json"]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert bare["errors_pct"]["device_calibrated"] is None and whole["errors_pct"]["device_calibrated"] is not None
    assert [p["calibrated_p99_ms"] for p in bare["points"]] == [p["calibrated_p99_ms"] for p in whole["points"]]
    assert all(p["device_calibrated_ms"] is None for p in bare["points"])
    errors = bare["errors_pct"]
    assert errors["calibrated"]["mean"]["mean_abs_pct"] < errors["catalog"]["mean"]["mean_abs_pct"]


@needs_data
def test_switch_law_calibrated_from_end_to_end_times_meets_the_p95_targets(capsys):
    """Issue 36's tail targets on the real files, from end-to-end times only: the exact switch law's p95 mean
    |error| at most 6 % and no p95 under-estimated by more than 12 %. Its p99 is judged against single runs
    of the same length: a predictor that knew each point's law exactly would score a p99 mean |error| of
    about 10 % (never below 6 % in 95 % of simulated sets), and the observed p99s fall outside their 90 %
    band of single runs no more often than 90 % bands allow."""
    assert main(["validate", "--measurements", str(VALIDATION), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    law = data["errors_pct"]["law_calibrated"]
    assert law["p95"]["mean_abs_pct"] <= 6.0 and law["p95"]["min_pct"] >= -12.0, law
    before = data["errors_pct"]["catalog"]
    assert law["p95"]["mean_abs_pct"] < before["p95"]["mean_abs_pct"] and law["p95"]["min_pct"] > before["p95"]["min_pct"]
    p99 = data["single_run"]["p99"]
    assert p99["perfect_mae_pct"]["p5"] > 6.0, p99   # the 6 % p99 target is below what single runs allow
    assert law["p99"]["mean_abs_pct"] <= p99["perfect_mae_pct"]["p95"], (law, p99)
    assert all(data["single_run"][s]["outside_90pct_band"] <= 4 for s in ("p95", "p99")), data["single_run"]
    assert all(0.0 <= p["single_run_rank_p99"] <= 1.0 for p in data["points"])
