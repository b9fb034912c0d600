"""The Dhakal reproductions in quick mode: the directions the paper reports hold (multi-instance and
spatio-temporal ratios > 1, overlap's interruption far below the no-overlap one), the schedules respect
their shares and deadline, and the seeded runs are deterministic. A few seconds in all."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from edgemux.experiments import dhakal
from edgemux.experiments.registry import names
from edgemux.experiments.runner import ExperimentResult, run_experiment
from edgemux.perf.batchlatency import spatiotemporal_round, temporal_rounds

NAMES = ("dhakal-multi-instance", "dhakal-spatiotemporal", "dhakal-overlap")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[ExperimentResult, Path]]:
    out = tmp_path_factory.mktemp("dhakal")
    return {n: (run_experiment(n, out, seed=0, quick=True), out) for n in NAMES}


def test_registered_and_files_written(runs: dict[str, tuple[ExperimentResult, Path]]) -> None:
    assert set(NAMES) <= set(names())
    for n, (res, out) in runs.items():
        assert (out / f"{n}.png").stat().st_size > 0
        with (out / f"{n}.csv").open(encoding="utf-8") as f:
            assert len(list(csv.DictReader(f))) == len(res.rows) > 0
        assert res.assumptions and all("DOES NOT" not in r.note for r in res.summary)


def test_multi_instance_beats_one_instance(runs: dict[str, tuple[ExperimentResult, Path]]) -> None:
    res, _ = runs["dhakal-multi-instance"]
    for name, _slo, _src in dhakal.T4_MODELS:
        sel = [r for r in res.rows if r["model"] == name]
        one = next(r for r in sel if r["config"] == "1x100%")
        m = dhakal.t4_model(name, _slo)
        many = next(r for r in sel if r["instances"] == m.n and r["share"] == m.knee_share)
        assert many["rate_at_slo_rps"] > one["rate_at_slo_rps"] and many["sim_rps"] > one["sim_rps"]
        # the simulator carries the offered rate (nothing is lost on a spatial device)
        assert many["sim_rps"] == pytest.approx(many["rate_at_slo_rps"], rel=0.15)
        # the estimator's p99 sits at the SLO it was bisected to
        assert one["est_p99_ms"] == pytest.approx(m.slo_ms, rel=1e-3)
    # the two-point curves: ResNet-50 and VGG-19's capacity ratios are the paper's Table IV ratios
    for name, slo in (("resnet50", 30.0), ("vgg19", 50.0)):
        m = dhakal.t4_model(name, slo)
        assert m.n / dhakal.slowdown(m.curve, m.knee_share) == pytest.approx(m.paper_ratio, rel=0.01)


def test_multi_instance_rows_are_seeded() -> None:
    m = dhakal.t4_model("resnet50", 30.0)
    a = dhakal._multi_instance_rows(m, True, 0)
    assert a == dhakal._multi_instance_rows(m, True, 0)
    assert [r["sim_p99_ms"] for r in a] != [r["sim_p99_ms"] for r in dhakal._multi_instance_rows(m, True, 1)]


def test_spatiotemporal_reproduces_table3_batches(runs: dict[str, tuple[ExperimentResult, Path]]) -> None:
    res, _ = runs["dhakal-spatiotemporal"]
    main = {(r["scheduler"], r["app"]): r for r in res.rows if r["variant"] == "main"}
    assert [main[("temporal", a)]["batch_per_round"] for a in dhakal.TABLE3] == [2, 0.5, 0.5]
    assert [main[("spatio-temporal", a)]["batch_per_round"] for a in dhakal.TABLE3] == [8, 2, 1]
    t = sum(main[("temporal", a)]["throughput_rps"] for a in dhakal.TABLE3)
    s = sum(main[("spatio-temporal", a)]["throughput_rps"] for a in dhakal.TABLE3)
    assert s / t > 1 and s / t == pytest.approx(11 / 3, rel=1e-3)


def test_spatiotemporal_schedule_respects_shares_and_deadline() -> None:
    apps, _ = dhakal.table3_apps()
    for sched in (spatiotemporal_round(apps), temporal_rounds(apps, rounds=4)):
        for slots in sched.rounds:
            for x in slots:
                assert x.end_ms <= dhakal.DEADLINE_MS + 1e-9
                assert sum(y.share for y in slots if y.start_ms <= x.start_ms + 1e-9 < y.end_ms) <= 1 + 1e-6
    st = spatiotemporal_round(apps)
    by = {x.model: x for x in st.rounds[0]}
    # Fig. 10: Yolo runs beside MobileNet and ends before VGG-Face and ResNet-Car start; ResNext after VGG-Face
    assert by["yolo"].start_ms == 0.0 and by["yolo"].end_ms <= by["vgg-face"].start_ms
    assert by["resnext"].start_ms == pytest.approx(by["vgg-face"].end_ms)


def test_overlap_cuts_the_interruption(runs: dict[str, tuple[ExperimentResult, Path]]) -> None:
    res, _ = runs["dhakal-overlap"]
    rep = {r["variant"]: r for r in res.extra["replications"]}
    no, ov, base = (np.mean(rep[v]["interruption"]) for v in ("no-overlap", "overlap", "baseline"))
    assert no == pytest.approx(dhakal.OVERLAP.load_s * 1000.0, abs=5.0)
    assert ov == pytest.approx(dhakal.OVERLAP.downtime_ms, abs=1e-6)
    assert ov * 100 < no and base == 0.0
    late = {v: np.mean(rep[v]["late"]) for v in rep}
    assert late["overlap"] < late["no-overlap"]
    # no service while the new process loads: no completions in the bins inside [3 s, 6 s)
    gap = [r for r in res.rows if r["variant"] == "no-overlap" and 3.0 <= r["t_s"] < 5.9]
    assert gap and all(r["served"] == 0 for r in gap)
    assert all(r["served"] > 0 for r in res.rows if r["variant"] == "overlap" and r["t_s"] >= 0.5)


def test_overlap_is_seeded() -> None:
    a = dhakal.run_overlap(seed=5, quick=True)
    b = dhakal.run_overlap(seed=5, quick=True)
    c = dhakal.run_overlap(seed=6, quick=True)
    assert a.rows == b.rows and a.extra == b.extra
    assert a.rows != c.rows
