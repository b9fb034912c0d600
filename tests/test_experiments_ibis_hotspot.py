"""ibis-hotspot (Ibis Fig. 20) quick run: the figures it must show hold, and the runner writes its CSV and
PNG. About a second."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from edgemux.experiments.ibis_hotspot import EFF, MOB, SURGE_AT_S
from edgemux.experiments.registry import names
from edgemux.experiments.runner import ExperimentResult, run_experiment


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[ExperimentResult, Path]:
    out = tmp_path_factory.mktemp("hotspot")
    return run_experiment("ibis-hotspot", out, seed=0, quick=True), out


def _summary(res: ExperimentResult, start: str) -> str:
    (row,) = [r for r in res.summary if r.metric.startswith(start)]
    return row.edgemux + " | " + row.note


def test_registered() -> None:
    assert "ibis-hotspot" in names()


def test_the_must_show_figures_hold(quick: tuple[ExperimentResult, Path]) -> None:
    res, _ = quick
    assert all("DOES NOT" not in r.note for r in res.summary)
    totals = {(t["config"], t["app"]): t for t in res.extra["totals"]}
    assert totals[("adapt", MOB.name)]["attainment"] >= 0.99
    assert totals[("static", MOB.name)]["attainment"] >= 0.99  # the bucket alone protects the neighbour
    (move,) = res.extra["actions"]
    assert (move["app"], move["from"], move["to"]) == (EFF.name, "n1/tpu0", "n2/tpu0")
    detect = min(f["time_s"] for f in res.extra["findings"] if f["kind"] == "slo-violated" and f["app"] == EFF.name)
    assert SURGE_AT_S < detect <= move["time_s"] < move["serve_s"]
    eff = [r for r in res.rows if r["config"] == "adapt" and r["app"] == EFF.name]
    back = next(r for r in eff if r["t_s"] >= detect and r["p95_ms"] <= EFF.slo.latency_ms)
    assert (back["t_s"] + 5.0 - detect) / 5.0 <= 3
    assert all(r["p95_ms"] <= EFF.slo.latency_ms for r in eff if r["t_s"] >= back["t_s"])
    assert _summary(res, "windows after detection").startswith(f"{(back['t_s'] + 5.0 - detect) / 5.0:g} ")
    static_eff = [r for r in res.rows if r["config"] == "static" and r["app"] == EFF.name and r["t_s"] >= SURGE_AT_S]
    assert static_eff and all(r["p95_ms"] > EFF.slo.latency_ms for r in static_eff)


def test_quick_run_writes_csv_and_png(quick: tuple[ExperimentResult, Path]) -> None:
    res, out = quick
    csv_path, png = out / "ibis-hotspot.csv", out / "ibis-hotspot.png"
    assert png.stat().st_size > 10_000
    with csv_path.open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(res.rows) == 2 * 2 * 36  # 2 configurations x 2 apps x 180 s / 5 s
    assert {"t_s", "app", "p95_ms", "p99_ms", "mean_ms", "arrivals", "refused"} <= set(rows[0])
    assert res.assumptions and res.files == {"csv": str(csv_path), "png": str(png)}
