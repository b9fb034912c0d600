"""``benchmarks/bench_gpu.py`` on a machine without a GPU: it says so in one line and exits 2; bad arguments are
one line and exit 2; its report renders; and its predicted-vs-observed orchestration runs, on the CPU's
ONNX Runtime in place of CUDA, producing the rows the GPU run prints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_gpu  # noqa: E402


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCH / "bench_gpu.py"), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def test_without_a_gpu_it_says_so_in_one_line_and_exits_2() -> None:
    from edgemux.runtime.dataplane.gpushare import check_gpu

    if check_gpu().ok:
        pytest.skip("this machine has a GPU: the script measures it")
    done = _run("--quick")
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench_gpu.py: no GPU here: "), done.stderr


@pytest.mark.parametrize("args, words", [
    (["--rho", "1.2"], "--rho must be in (0, 1)"),
    (["--budget-s", "0"], "--budget-s must be a number > 0"),
    (["--mps-servers", "0.5"], "--mps-servers must be a number >= 1"),
    (["--requests", "10"], "--requests must be >= 100"),
    (["--rho", "half"], "invalid float value"),
])
def test_bad_arguments_are_one_line_exit_2(args: list[str], words: str) -> None:
    done = _run(*args)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and words in done.stderr, done.stderr


def test_the_report_renders_every_section() -> None:
    report = {"gpu": "GPU 0: NVIDIA H100", "rho": 0.5, "budget_s": 480.0, "wall_s": 301.2,
              "profiles": [{"model": "zoo:resnet50@224x224", "batch": 1, "mean_ms": 2.1, "p95_ms": 2.3, "cv": 0.04}],
              "spatial": {"summary": "knee 0.3"},
              "colocated": [{"discipline": "gpu-timeshare", "models": "mobilenet_v2@224+resnet50@224", "app": "app1",
                             "predicted_ms": 3.2, "observed_ms": 3.0, "error": 0.0667, "ok": True},
                            {"discipline": "mps", "models": "mobilenet_v2@224+resnet50@224", "app": "app2",
                             "predicted_ms": 5.0, "observed_ms": 4.0, "error": 0.25, "ok": False}]}
    text = bench_gpu.render(report)
    assert "REAL GPU: GPU 0: NVIDIA H100" in text
    assert "zoo:resnet50@224x224" in text and "2.100" in text
    assert "(2)-(4) share curve, throughput at the knee, share change: knee 0.3" in text
    assert "+6.7%  yes" in text and "+25.0%  NO" in text and "within 15%: 1/2" in text
    assert "wall 301 s of a 480 s budget" in text


def test_the_colocated_measurement_runs_on_a_cpu_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """The (5) orchestration (profiles as services, Poisson tenants at rho, a DeviceWorker per discipline,
    predict_device) on the CPU's ONNX Runtime and two small zoo models: the code a GPU run executes, checked
    here for its rows, not for its figures."""
    from edgemux.runtime.dataplane.backends import ModelSource, OnnxRuntimeBackend
    from edgemux.runtime.tools.profiler import profile_models

    models = ("zoo:squeezenet1_1@64", "zoo:mobilenet_v2@32")
    monkeypatch.setattr(bench_gpu, "COLOCATED", (models,))
    backend = OnnxRuntimeBackend(1)
    measured = profile_models(backend, [ModelSource.parse(m) for m in models], [1], 2, 20)
    samples = {m.source: m.samples_ms for m in measured}
    args = bench_gpu.parse_args(["--quick", "--requests", "200", "--rho", "0.3"])
    rows = bench_gpu._colocated(backend, samples, args)
    assert [(r["discipline"], r["app"]) for r in rows] == [("gpu-timeshare", "app1"), ("gpu-timeshare", "app2"),
                                                          ("mps", "app1"), ("mps", "app2")]
    for r in rows:
        assert r["models"] == "squeezenet1_1@64+mobilenet_v2@32"
        assert r["predicted_ms"] > 0 and r["observed_ms"] > 0 and isinstance(r["ok"], bool)
    assert backend.loaded() == {}  # every model it loaded is unloaded again
