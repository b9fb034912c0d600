"""microedge-cameras (MicroEdge Fig. 5, Table 1) and the experiment framework and CLI."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from edgemux.cli.main import main
from edgemux.errors import InputError
from edgemux.experiments.registry import names
from edgemux.experiments.runner import ExperimentResult, Progress, run_experiment, summary_table

# slow: not in `make test-fast` (the module's expensive fixture is built once: make test distributes
# whole modules, --dist loadscope)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> tuple[ExperimentResult, Path]:
    out = tmp_path_factory.mktemp("exp")
    return run_experiment("microedge-cameras", out, seed=0, quick=True), out


def _row(res: ExperimentResult, model: str, policy: str) -> dict:
    return next(r for r in res.rows if r["model"] == model and r["policy"] == policy)


def test_writes_csv_and_png(result: tuple[ExperimentResult, Path]) -> None:
    res, out = result
    csv_path, png = out / "microedge-cameras.csv", out / "microedge-cameras.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = list(csv.DictReader(csv_path.open()))
    assert len(rows) == 8 and {"model", "policy", "cameras", "mean_tpu_utilization"} <= set(rows[0])
    assert res.files == {"csv": str(csv_path), "png": str(png)}


def test_camera_counts_and_utilization(result: tuple[ExperimentResult, Path]) -> None:
    res, _ = result
    for model, units, part, dedicated in [("ssd_mobilenet_v2", 0.35, 17, 6), ("bodypix", 1.2, 5, 3)]:
        wp = _row(res, model, "microedge+wp")
        assert wp["cameras"] == part == wp["theoretical_max"]
        assert abs(wp["mean_tpu_utilization"] - part * units / 6) <= 0.02
        assert _row(res, model, "dedicated")["cameras"] == dedicated
    assert _row(res, "ssd_mobilenet_v2", "microedge")["cameras"] == 12
    assert _row(res, "bodypix", "microedge")["cameras"] == 0
    text = summary_table(res)
    assert "2.8x" in text and "2.83x" in text and "assumptions:" in text


def test_latency_is_rechecked_not_assumed(result: tuple[ExperimentResult, Path]) -> None:
    res, _ = result
    # dedicated Coral-Pie: one camera per TPU, p99 = the 23.3 ms frame time
    assert _row(res, "ssd_mobilenet_v2", "dedicated")["p99_max_ms"] == pytest.approx(1000 * 0.35 / 15, abs=0.01)
    # BodyPix takes 80 ms per frame: every admitted camera exceeds the 66.7 ms budget
    for pol in ("dedicated", "microedge+wp"):
        r = _row(res, "bodypix", pol)
        assert r["cameras_over_budget"] == r["cameras"] > 0
    cams = res.extra["cameras"]
    assert len(cams) == sum(r["cameras"] for r in res.rows)
    assert all(c["over_budget"] == (c["p99_ms"] > 1000 / 15) for c in cams)


def test_edgemux_hosts_as_many_as_first_fit_with_no_frame_late(result: tuple[ExperimentResult, Path]) -> None:
    """With the periodic worst-case bound, edgemux admits two Coral-Pie cameras per TPU (2 x 23.3 ms <= 66.7)
    like microedge without partitioning, and none of its cameras is over budget in simulation."""
    res, _ = result
    ours, first_fit = _row(res, "ssd_mobilenet_v2", "edgemux"), _row(res, "ssd_mobilenet_v2", "microedge")
    assert ours["cameras"] >= first_fit["cameras"] == 12
    assert ours["cameras_over_budget"] == 0 and ours["p99_max_ms"] <= 2 * 1000 * 0.35 / 15 + 1e-6
    assert _row(res, "bodypix", "edgemux")["cameras"] == 0      # 80 ms per frame never meets 66.7 ms


def test_cost_table(result: tuple[ExperimentResult, Path]) -> None:
    res, _ = result
    cost = {c["policy"]: c for c in res.extra["cost"]}
    assert (cost["dedicated"]["tpus"], cost["dedicated"]["usd"]) == (17, 2550)
    assert (cost["microedge+wp"]["tpus"], cost["microedge+wp"]["usd"]) == (6, 1725)
    assert cost["microedge"]["tpus"] == 9 and cost["microedge"]["paper_tpus"] == 8  # ceil(17/2) vs Table 1


def test_unknown_experiment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "microedge-cameras" in names()
    with pytest.raises(InputError):
        run_experiment("no-such", tmp_path)
    assert main(["experiment", "no-such", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no-such" in err and "microedge-cameras" in err
    assert main(["experiment", "ibis-hotspot", "--seed", "-1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--seed: must be an integer >= 0, got -1" in err and "Traceback" not in err


def test_cli_json(result: tuple[ExperimentResult, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
                  monkeypatch: pytest.MonkeyPatch) -> None:
    from edgemux.experiments import registry

    # the experiment itself ran in the fixture: here only the CLI's plumbing
    monkeypatch.setitem(registry._REGISTRY, "microedge-cameras", lambda seed, quick: result[0])
    assert main(["experiment", "microedge-cameras", "--out", str(tmp_path), "--json", "--quick"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["name"] == "microedge-cameras" and doc["summary"][0]["paper"]
    assert (tmp_path / "microedge-cameras.csv").exists()


def test_an_experiments_loops_report_to_the_run_experiments_callback() -> None:
    from edgemux.experiments.runner import _REPORT

    bar = Progress(3, "x")  # no run_experiment: counted silently
    bar.step(), bar.step(), bar.close()
    assert bar.done == 2
    seen: list[tuple[int, int, str]] = []
    token = _REPORT.set(lambda done, total, what: seen.append((done, total, what)))
    try:
        bar = Progress(2, "admitting")
        bar.step(), bar.step(), bar.close()
    finally:
        _REPORT.reset(token)
    assert seen == [(0, 2, "admitting"), (1, 2, "admitting"), (2, 2, "admitting")]


def test_pooled_p99_weights_pieces_by_their_share_of_frames() -> None:
    import numpy as np

    from edgemux.experiments.microedge_cameras import _weighted_quantile

    # 95 % of frames at 10 ms (piece of weight 0.95, 1000 samples), 5 % at 100 ms (weight 0.05, 10 samples):
    # the pooled p99 is 100 ms; unweighted pooling of the samples would say 10 ms
    a, b = np.full(1000, 10.0), np.full(10, 100.0)
    lat = np.concatenate([a, b])
    w = np.concatenate([np.full(a.size, 0.95 / a.size), np.full(b.size, 0.05 / b.size)])
    assert _weighted_quantile(lat, w, 0.99) == 100.0
    assert _weighted_quantile(lat, w, 0.90) == 10.0
    assert float(np.quantile(lat, 0.99)) == 10.0


def test_offline_optimum(result: tuple[ExperimentResult, Path]) -> None:
    """Offline optima of the 40-camera trace on 6 TPUs and each policy's ratio to its reference."""
    res, _ = result
    opt = {(r["model"], r["optimum"]): r["cameras"] for r in res.extra["offline_optimum"]}
    assert opt[("ssd_mobilenet_v2", "fps-whole")] == 12 and opt[("ssd_mobilenet_v2", "fps-split")] == 17
    assert opt[("ssd_mobilenet_v2", "p99-whole")] == 12
    assert opt[("bodypix", "fps-whole")] == 0 and opt[("bodypix", "fps-split")] == 5
    assert opt[("bodypix", "p99-whole")] == 0
    from edgemux.experiments.microedge_cameras import REFERENCE

    for r in res.rows:
        if r["policy"] != "edgemux":   # edgemux may split: its whole-camera p99 optimum is no bound
            assert r["cameras"] <= opt[(r["model"], REFERENCE[r["policy"]])]
    assert any("online / offline optimum, microedge+wp" in s.metric for s in res.summary)
