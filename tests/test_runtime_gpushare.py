"""runtime.dataplane.gpushare: the CUDA path of spatial sharing (ONNX Runtime's CUDA provider, a share set by
NVIDIA MPS's active-thread percentage, one process per instance).

Two parts. Everywhere: the process-per-instance machinery runs with the CPU provider (outputs, the
percentage a child is started with, reconfiguration under load, a child killed on purpose, set-up failures),
and every entry point of the CUDA path says why it cannot run where there is no GPU (one line; the CLI exits
2, the benchmark prints SKIPPED and exits 0). With a GPU (skipped here, the reason printed by ``-ra``): CUDA
outputs match the CPU's, MPS enforces a share (a small share is slower on a large batch), the worker's
``cuda`` backend serves a spatial app and re-shares it with overlap under load.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future, wait
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgemux.cli.main import main as cli
from edgemux.runtime import zoo
from edgemux.runtime.dataplane.backends import BackendError
from edgemux.runtime.dataplane.gpushare import (
    MPS_PERCENTAGE_ENV,
    CudaInstances,
    GpuUnavailable,
    ProcessInstances,
    check_gpu,
    mps_percentage,
    mps_running,
    nvidia_smi_gpu,
    start_mps,
    stop_mps,
)
from edgemux.runtime.dataplane.instances import InstancePool, OrtInstances, PoolResult, SpatialConfigError

WAIT_S = 120.0  # a bound on any wait: a test that needs it has hung, not run slowly
ROOT = Path(__file__).resolve().parent.parent
GPU = check_gpu()
needs_gpu = pytest.mark.skipif(not GPU.ok, reason=f"no CUDA path here: {GPU.reason}")


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return zoo.path("squeezenet1_1", input_size=64, cache_dir=tmp_path_factory.mktemp("zoo"))


def _cpu_children(path: Path, **kw: Any) -> ProcessInstances:
    return ProcessInstances(path, providers=("CPUExecutionProvider",),
                            env_for_share=lambda s: {MPS_PERCENTAGE_ENV: str(mps_percentage(s))}, **kw)


def _done(futures: list[Future[PoolResult]]) -> list[PoolResult]:
    _, pending = wait(futures, timeout=WAIT_S)
    assert not pending, "requests did not finish"
    return [f.result() for f in futures]


# ------------------------------------------------------------------------------------------ shares and MPS


@pytest.mark.parametrize(("share", "pct"), [(1.0, 100), (0.5, 50), (0.25, 25), (0.123, 12), (0.001, 1)])
def test_mps_percentage_of_a_share(share: float, pct: int) -> None:
    assert mps_percentage(share) == pct


@pytest.mark.parametrize("share", [0.0, -0.1, 1.5, float("nan"), "half", True])
def test_mps_percentage_refuses_a_share_outside_the_device(share: Any) -> None:
    with pytest.raises(SpatialConfigError, match=r"share must be .*in \(0, 1\]"):
        mps_percentage(share)


def test_mps_running_reads_the_control_pipe(tmp_path: Path) -> None:
    assert not mps_running(tmp_path)
    (tmp_path / "control").touch()
    assert mps_running(tmp_path)


def test_start_mps_without_the_control_program_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on it
    why = start_mps(tmp_path / "pipe", tmp_path / "log")
    assert why is not None and "nvidia-cuda-mps-control is not on the PATH" in why
    assert not stop_mps(tmp_path / "pipe")


def test_nvidia_smi_problems_are_reasons_not_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert nvidia_smi_gpu() == (None, "no NVIDIA driver here (nvidia-smi is not on the PATH)")
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'No devices were found' >&2\nexit 6\n")
    fake.chmod(0o755)
    gpu, why = nvidia_smi_gpu(3)
    assert gpu is None and why == "nvidia-smi found no GPU 3: No devices were found"
    fake.write_text("#!/bin/sh\necho 'NVIDIA H200, 143771 MiB, 580.159.03'\n")
    assert nvidia_smi_gpu() == ("NVIDIA H200 (143771 MiB, driver 580.159.03)", "")


# ---------------------------------------------------------------------------- process per instance (CPU)


def test_a_process_instance_answers_what_an_in_process_session_answers(small: Path) -> None:
    f = _cpu_children(small)
    inst = f.make(0.3)
    try:
        assert inst.mps_percentage == "30" and inst.pid != os.getpid()
        assert inst.providers == ("CPUExecutionProvider",)
        x = f.warm_inputs()
        got = inst.run(x)
        want = OrtInstances(small, shared_weights=False).make(1.0).run(x)
        assert got.keys() == want.keys()
        for k in got:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)
        assert inst.last_exec_ms > 0  # timed in the child
    finally:
        inst.close()
    assert inst.proc.poll() == 0  # closed cleanly, not killed


@pytest.mark.parametrize("overlap", [True, False])
def test_process_instances_reshare_under_load_and_lose_nothing(small: Path, overlap: bool) -> None:
    f = _cpu_children(small)
    pool = InstancePool(f, share=0.5, instances=2, name="children")
    x = f.warm_inputs()
    futures: list[Future[PoolResult]] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set() and len(futures) < 400:
            futures.append(pool.submit(x))
            stop.wait(0.002)

    t = threading.Thread(target=load)
    t.start()
    try:
        rec = pool.reconfigure(share=1.0, instances=1, overlap=overlap)
        rec2 = pool.reconfigure(share=0.25, instances=3, overlap=overlap)
    finally:
        stop.set()
        t.join()
    results = _done(futures)
    assert pool.close(drain=True)
    assert len(results) == len(futures) and pool.failed == 0
    assert {r.share for r in results} <= {0.5, 1.0, 0.25}
    assert rec.new_instances == 1 and rec2.new_instances == 3 and pool.generation == 2


def test_a_killed_instance_process_fails_its_request_with_the_reason(small: Path) -> None:
    f = _cpu_children(small)
    inst = f.make(1.0)
    x = f.warm_inputs()
    inst.run(x)
    os.kill(inst.pid, signal.SIGKILL)
    inst.proc.wait(timeout=WAIT_S)
    with pytest.raises(BackendError, match=rf"instance process {inst.pid} ended \(exit code -9") as e:
        inst.run(x)
    assert e.value.status == 500
    inst.close()  # closing a dead instance is quiet


def test_an_instance_that_cannot_start_says_why(small: Path, tmp_path: Path) -> None:
    f = ProcessInstances(small, providers=("NoSuchExecutionProvider",))
    with pytest.raises(BackendError, match="cannot start an instance of squeezenet1_1.*NoSuchExecutionProvider"):
        f.make(1.0)
    with pytest.raises(SpatialConfigError, match="does not exist"):
        ProcessInstances(tmp_path / "missing.onnx", providers=("CPUExecutionProvider",))
    with pytest.raises(SpatialConfigError, match="optimization must be one of"):
        ProcessInstances(small, providers=("CPUExecutionProvider",), optimization="max")
    with pytest.raises(SpatialConfigError, match=r"share must be in \(0, 1\]"):
        _cpu_children(small).make(1.5)


def test_a_bad_request_fails_that_request_not_the_instance(small: Path) -> None:
    f = _cpu_children(small)
    inst = f.make(1.0)
    try:
        with pytest.raises(BackendError, match=rf"instance process {inst.pid}: .*") as e:
            inst.run({"wrong": np.zeros(3, dtype=np.float32)})
        assert e.value.status == 500
        assert inst.run(f.warm_inputs())  # still serving
    finally:
        inst.close()


# ------------------------------------------------------------------------------ the CUDA path, no GPU here


@pytest.mark.skipif(GPU.ok, reason="a GPU is here")
def test_without_a_gpu_every_entry_point_says_why(small: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "CUDAExecutionProvider" in GPU.reason or "NVIDIA" in GPU.reason
    with pytest.raises(GpuUnavailable, match=r"^no CUDA path: ") as e:
        CudaInstances(small)
    assert e.value.status == 503
    code = cli(["profile", "--backend", "cuda", "--models", "squeezenet1_1@64", "--shares", "0.5,1",
                "--out", str(small.parent / "p")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("edgemux: error: CUDA not available")


@pytest.mark.skipif(GPU.ok, reason="a GPU is here")
def test_the_gpu_benchmark_skips_with_the_reason() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_spatial_cuda.py"), "--json"],
                          capture_output=True, text=True, timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"skipped": GPU.reason}
    assert f"SKIPPED: no CUDA path here: {GPU.reason}" in done.stderr


def test_cuda_instances_refuse_a_bad_mechanism(small: Path) -> None:
    with pytest.raises(SpatialConfigError, match="mechanism must be one of auto, mps, streams"):
        CudaInstances(small, mechanism="mig")


def test_the_gpu_benchmark_refuses_bad_numbers() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_spatial_cuda.py"), "--rate", "0"],
                          capture_output=True, text=True, timeout=WAIT_S)
    assert done.returncode == 2 and done.stderr.strip().endswith("--rate must be a number > 0, got 0")


# --------------------------------------------------------------------------------------- with a GPU


@pytest.fixture(scope="module")
def mps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str | None]:
    """An MPS daemon for this module's GPU tests (started here unless one runs); None with the reason
    printed where it cannot start."""
    if mps_running():
        yield None
        return
    d = tmp_path_factory.mktemp("mps")
    why = start_mps(d / "pipe", d / "log")
    if why is not None:
        print(f"MPS not started: {why}")
        yield why
        return
    try:
        yield None
    finally:
        stop_mps(d / "pipe")
        os.environ.pop("CUDA_MPS_PIPE_DIRECTORY", None)
        os.environ.pop("CUDA_MPS_LOG_DIRECTORY", None)


@needs_gpu
def test_cuda_streams_answer_what_the_cpu_answers(small: Path) -> None:
    f = CudaInstances(small, mechanism="streams")
    assert not f.enforced and "NOT enforced" in f.describe()
    x = f.warm_inputs()
    inst = f.make(0.5)
    got = inst.run(x)
    want = OrtInstances(small, shared_weights=False).make(1.0).run(x)
    for k in want:  # cuDNN's algorithms (TF32 where it chooses) vs the CPU's: equal to 1 % of the output's scale
        assert float(np.abs(got[k] - want[k]).max()) <= 0.01 * float(np.abs(want[k]).max()), k
    inst.close()


@needs_gpu
def test_mps_enforces_a_share(tmp_path: Path, mps: str | None) -> None:
    if mps is not None:
        pytest.skip(f"MPS cannot start here: {mps}")
    f = CudaInstances(zoo.path("resnet50", input_size=224, cache_dir=tmp_path), mechanism="mps")
    assert f.enforced
    x = {k: np.repeat(v, 32, axis=0) for k, v in f.warm_inputs().items()}
    medians = {}
    for share in (0.1, 1.0):
        inst = f.make(share)
        assert inst.mps_percentage == str(mps_percentage(share))  # type: ignore[attr-defined]
        for _ in range(5):
            inst.run(x)
        xs = []
        for _ in range(15):
            inst.run(x)
            xs.append(inst.last_exec_ms)  # type: ignore[attr-defined]
        inst.close()
        medians[share] = float(np.median(xs))
    # a tenth of the SMs on a batch of 32 ResNet-50 images: several times slower, never about the same
    assert medians[0.1] > 2.0 * medians[1.0], medians


@needs_gpu
@pytest.mark.parametrize("mechanism", ["mps", "streams"])
def test_cuda_pool_reshares_under_load_and_loses_nothing(small: Path, mps: str | None, mechanism: str) -> None:
    if mechanism == "mps" and mps is not None:
        pytest.skip(f"MPS cannot start here: {mps}")
    f = CudaInstances(small, mechanism=mechanism)
    pool = InstancePool(f, share=0.5, instances=2, name=f"cuda-{mechanism}")
    x = f.warm_inputs()
    futures = [pool.submit(x) for _ in range(50)]
    rec = pool.reconfigure(share=1.0, instances=1, overlap=True)
    futures += [pool.submit(x) for _ in range(50)]
    results = _done(futures)
    assert pool.close(drain=True)
    assert pool.failed == 0 and len(results) == 100 and rec.unavailable_ms < 50.0


@needs_gpu
def test_the_cuda_backend_worker_serves_a_spatial_app(tmp_path: Path, mps: str | None) -> None:
    """The worker's ``cuda`` backend runs spatial apps as CUDA instances: four at 0.25 on a host counted as 2
    cores (the CPU's thread rule does not apply to a GPU), outputs as the CPU's, a re-share with overlap."""
    from edgemux.cluster.state import Device
    from edgemux.cluster.workload import Discipline
    from edgemux.profiles.types import DeviceKind
    from edgemux.runtime.dataplane.backends import ModelSource, OnnxRuntimeBackend, make_backend
    from edgemux.runtime.dataplane.worker import DeviceWorker

    backend = make_backend("cuda")
    source = ModelSource(zoo="squeezenet1_1", input_size=64, cache_dir=str(tmp_path))
    backend.load("sq", source)
    cpu = OnnxRuntimeBackend(threads=1)
    cpu.load("sq", source)
    dev = Device("n1", "gpu0", DeviceKind.GPU_DISCRETE, Discipline.SPATIAL, memory_mb=16000.0)
    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64), dtype=np.float32)
    with DeviceWorker(dev, backend, cores=2) as w:
        assert w.configure_app("a", "sq", share=0.25, instances=4) is None
        r = w.submit("a", "sq", {"input": x}).result(WAIT_S)
        want = cpu.run("sq", {"input": x})["logits"]
        assert float(np.abs(r.outputs["logits"] - want).max()) <= 0.01 * float(np.abs(want).max())
        rec = w.configure_app("a", "sq", share=0.5, instances=2, overlap=True)
        assert rec is not None and rec.new_share == 0.5 and w.spatial_config()["a"]["instances"] == 2
        assert w.submit("a", "sq", {"input": x}).result(WAIT_S).outputs["logits"].shape == (1, 1000)
        assert w.remove_app("a")
