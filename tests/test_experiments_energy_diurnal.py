"""``energy-diurnal`` in quick mode (one hour of the dynamic trace's afternoon): files written, consolidation
spends less than always-on with SLO attainment >= 99 %, the lower bound is below both, and the run is seeded."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from edgemux.experiments import energy_diurnal
from edgemux.experiments.registry import names
from edgemux.experiments.runner import ExperimentResult, run_experiment

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def res(tmp_path_factory: pytest.TempPathFactory) -> tuple[ExperimentResult, Path]:
    out = tmp_path_factory.mktemp("ed")
    return run_experiment(energy_diurnal.NAME, out, seed=0, quick=True), out


def test_registered_and_files_written(res: tuple[ExperimentResult, Path]) -> None:
    r, out = res
    assert energy_diurnal.NAME in names()
    assert (out / f"{energy_diurnal.NAME}.png").stat().st_size > 0
    with (out / f"{energy_diurnal.NAME}.csv").open(encoding="utf-8") as f:
        assert [row["config"] for row in csv.DictReader(f)] == ["always-on", "consolidation", "lower-bound"]
    assert all("DOES NOT" not in s.note for s in r.summary)


def test_consolidation_saves_energy_within_the_slo(res: tuple[ExperimentResult, Path]) -> None:
    on, cons, lb = res[0].rows
    assert cons["energy_kwh"] < on["energy_kwh"]
    assert cons["attainment"] >= 0.99
    assert cons["switch_offs"] > 0 and on["switch_offs"] == 0
    assert lb["energy_kwh"] <= cons["energy_kwh"] and lb["energy_kwh"] <= on["energy_kwh"]
    assert lb["node_hours_on"] <= cons["node_hours_on"] + 1e-9


def test_the_quick_run_is_seeded(res: tuple[ExperimentResult, Path]) -> None:
    again = energy_diurnal.run(seed=0, quick=True)
    assert again.rows == res[0].rows
