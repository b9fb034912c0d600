"""Spatial instances on a GPU (Dhakal et al., papers/002 §IV-A): ONNX Runtime's CUDA execution provider, each
instance's share of the GPU set through NVIDIA MPS's active-thread percentage.

The discipline is the one ``instances`` implements on the CPU (an :class:`~.instances.InstancePool` of N
instances, each holding ``share`` of the device, serving one FIFO queue); only what an instance is differs.

* **MPS** (``mechanism="mps"``, the share enforced): with the MPS control daemon running, a CUDA context is
  limited to ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` percent of the GPU's threads (its SMs), a value read once,
  when the context is created. onnxruntime creates one context per process, so each instance is a child
  process (:class:`ProcessInstances`, child side ``instance_child.py``) started with the percentage of its
  share, ``max(1, round(share * 100))`` (:func:`mps_percentage`); requests and answers cross a pipe as pickled
  arrays, and the child times the session's run alone. Weights are not shared between instances here: MPS
  clients are separate processes and onnxruntime offers no CUDA IPC for initializers, so N instances hold N
  copies on the GPU (Param-Share, §IV-E, is the CPU pool's).
* **Streams** (``mechanism="streams"``, the fallback where no MPS daemon runs): N onnxruntime CUDA sessions in
  this process, each running on its own CUDA stream, so instances run concurrently; the GPU schedules their
  kernels as they come and a share is **not enforced** (it is a label). Pools say which mechanism they run.

``mechanism="auto"`` takes MPS when its control daemon is up (:func:`mps_running`), streams otherwise.
:func:`check_gpu` says whether a CUDA path exists here at all and, if not, why (onnxruntime without its CUDA
provider, no NVIDIA driver or GPU); every caller prints that reason and skips. Nothing here is needed by, or
imported by, the CPU path.

Units: times ms unless a name ends in ``_s`` (seconds); shares are fractions of one GPU in (0, 1].
"""

from __future__ import annotations

import os
import pickle
import select
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgemux.runtime.dataplane.backends import BackendError
from edgemux.runtime.dataplane.instances import (
    OPT_LEVELS,
    Instance,
    InstanceFactory,
    OrtInstances,
    SpatialConfigError,
    check_share,
    random_inputs,
)

CUDA_PROVIDER = "CUDAExecutionProvider"
MPS_CONTROL = "nvidia-cuda-mps-control"
MPS_PERCENTAGE_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MPS_PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
MPS_LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
DEFAULT_MPS_PIPE_DIR = "/tmp/nvidia-mps"  # where CUDA and the daemon look when CUDA_MPS_PIPE_DIRECTORY is unset
MECHANISMS = ("auto", "mps", "streams")
_CHILD = Path(__file__).with_name("instance_child.py")


class GpuUnavailable(BackendError):
    """No CUDA path here (status 503): the message says why."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 503)


# ------------------------------------------------------------------------------------------------ MPS


def mps_percentage(share: float) -> int:
    """MPS's active-thread percentage (an integer 1..100) for ``share`` of a GPU: ``max(1, round(share * 100))``;
    ``SpatialConfigError`` for a share outside (0, 1]."""
    return max(1, round(check_share(share) * 100))


def mps_pipe_dir(env: Mapping[str, str] | None = None) -> Path:
    """The MPS pipe directory CUDA clients use: ``CUDA_MPS_PIPE_DIRECTORY`` or ``/tmp/nvidia-mps``."""
    e = os.environ if env is None else env
    return Path(e.get(MPS_PIPE_ENV) or DEFAULT_MPS_PIPE_DIR)


def mps_running(pipe_dir: str | os.PathLike[str] | None = None) -> bool:
    """True when an MPS control daemon is up: its named pipe ``control`` exists in the pipe directory."""
    return (Path(pipe_dir) if pipe_dir is not None else mps_pipe_dir()).joinpath("control").exists()


def start_mps(pipe_dir: str | os.PathLike[str], log_dir: str | os.PathLike[str], *,
              timeout_s: float = 20.0) -> str | None:
    """Start an MPS control daemon with its pipes in ``pipe_dir`` and logs in ``log_dir`` (both made if
    missing) and export ``CUDA_MPS_PIPE_DIRECTORY`` so this process's children find it. Returns ``None`` when
    it runs, else why not (no ``nvidia-cuda-mps-control`` on the PATH, or its exit and output). The daemon
    changes no GPU setting (compute mode, clocks); :func:`stop_mps` ends it."""
    exe = shutil.which(MPS_CONTROL)
    if exe is None:
        return f"{MPS_CONTROL} is not on the PATH (it comes with the NVIDIA driver)"
    Path(pipe_dir).mkdir(parents=True, exist_ok=True)
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, **{MPS_PIPE_ENV: str(pipe_dir), MPS_LOG_ENV: str(log_dir)})
    try:
        done = subprocess.run([exe, "-d"], env=env, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{MPS_CONTROL} -d failed: {e}"
    if done.returncode != 0 or not mps_running(pipe_dir):
        said = (done.stderr or done.stdout).strip().replace("\n", " ")[:300]
        return f"{MPS_CONTROL} -d exited {done.returncode} without a control pipe in {pipe_dir}: {said or 'no output'}"
    os.environ[MPS_PIPE_ENV] = str(pipe_dir)
    os.environ[MPS_LOG_ENV] = str(log_dir)
    return None


def stop_mps(pipe_dir: str | os.PathLike[str] | None = None, *, timeout_s: float = 20.0) -> bool:
    """Tell the MPS control daemon of ``pipe_dir`` to quit; True when it was running and was told."""
    d = Path(pipe_dir) if pipe_dir is not None else mps_pipe_dir()
    exe = shutil.which(MPS_CONTROL)
    if exe is None or not mps_running(d):
        return False
    env = dict(os.environ, **{MPS_PIPE_ENV: str(d)})
    try:
        subprocess.run([exe], input="quit\n", env=env, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return True


# ------------------------------------------------------------------------------------------ GPU check


@dataclass(frozen=True)
class GpuCheck:
    """Whether a CUDA path exists here: ``ok``; ``reason`` (why not, or what was found); ``gpu`` the GPU's name
    and memory from ``nvidia-smi`` (None when unknown); ``onnxruntime`` its version and ``providers``; ``mps``
    whether an MPS control daemon is running."""

    ok: bool
    reason: str
    gpu: str | None
    onnxruntime: str
    providers: tuple[str, ...]
    mps: bool

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "reason": self.reason, "gpu": self.gpu, "onnxruntime": self.onnxruntime,
                "providers": list(self.providers), "mps": self.mps}


def nvidia_smi_gpu(index: int = 0, *, run: Callable[..., Any] = subprocess.run) -> tuple[str | None, str]:
    """``(description, problem)`` of GPU ``index`` from ``nvidia-smi``: the name and memory (MiB) and an empty
    problem, or ``None`` and why (no ``nvidia-smi``, it failed, no such GPU)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, "no NVIDIA driver here (nvidia-smi is not on the PATH)"
    try:
        done = run([exe, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader", "-i", str(index)],
                   capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"nvidia-smi failed: {e}"
    line = (done.stdout or "").strip().splitlines()
    if done.returncode != 0 or not line:
        said = ((done.stderr or "") + (done.stdout or "")).strip().replace("\n", " ")[:200]
        return None, f"nvidia-smi found no GPU {index}: {said or f'exit {done.returncode}'}"
    name, mem, driver = (p.strip() for p in (line[0].split(",") + ["", ""])[:3])
    return f"{name} ({mem}, driver {driver})", ""


def check_gpu(index: int = 0) -> GpuCheck:
    """Whether ONNX Runtime can run on NVIDIA GPU ``index`` here, and if not why; never raises."""
    import onnxruntime as ort

    providers = tuple(ort.get_available_providers())
    mps = mps_running()
    if CUDA_PROVIDER not in providers:
        return GpuCheck(False, f"onnxruntime {ort.__version__} has no {CUDA_PROVIDER} (it offers "
                               f"{', '.join(providers)}; the CUDA path needs the onnxruntime-gpu package)",
                        None, ort.__version__, providers, mps)
    gpu, problem = nvidia_smi_gpu(index)
    if gpu is None:
        return GpuCheck(False, problem, None, ort.__version__, providers, mps)
    return GpuCheck(True, f"GPU {index}: {gpu}; onnxruntime {ort.__version__} with {CUDA_PROVIDER}; "
                          f"MPS {'running' if mps else 'not running'}", gpu, ort.__version__, providers, mps)


# -------------------------------------------------------------------------------- process instances


class _ProcessInstance(Instance):
    """An instance served by a child process (``instance_child.py``); one request at a time (the pool's rule)."""

    def __init__(self, proc: subprocess.Popen[bytes], share: float, hello: dict[str, Any],
                 stderr: Any) -> None:
        self.proc = proc
        self.share = share
        self.threads = 0  # its CPU threads are the child's, not this process's
        self.pid = int(hello["pid"])
        self.providers = tuple(hello["providers"])
        self.mps_percentage = hello.get("mps_percentage")
        self.last_exec_ms = float("nan")
        self._stderr = stderr
        self._lock = threading.Lock()

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._lock:
            try:
                assert self.proc.stdin is not None and self.proc.stdout is not None
                pickle.dump(("run", dict(inputs)), self.proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
                self.proc.stdin.flush()
                reply = pickle.load(self.proc.stdout)
            except (BrokenPipeError, EOFError, OSError, pickle.UnpicklingError):
                raise BackendError(f"instance process {self.pid} ended ({self._ended()})", 500) from None
        if reply[0] != "ok":
            raise BackendError(f"instance process {self.pid}: {reply[1]}", 500)
        self.last_exec_ms = float(reply[2])
        return dict(reply[1])

    def _ended(self) -> str:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        return f"exit code {code}{_tail(self._stderr)}"

    def close(self) -> None:
        with self._lock:
            try:
                if self.proc.poll() is None:
                    assert self.proc.stdin is not None
                    pickle.dump(("close",), self.proc.stdin)
                    self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
            finally:
                self._stderr.close()


def _tail(f: Any, n: int = 400) -> str:
    """The last ``n`` characters a child wrote to its stderr file, as '': text' (or '')."""
    try:
        f.flush()
        f.seek(0)
        text = f.read().decode("utf-8", "replace").strip()
    except (OSError, ValueError):
        return ""
    return f": {text[-n:]}" if text else ""


class ProcessInstances(InstanceFactory):
    """Instances that each run in a child process: an onnxruntime session of the model at ``path`` with
    ``providers`` (``provider_options`` per provider), started with ``env_for_share(share)`` added to its
    environment. ``start_timeout_s`` bounds a child's start (its session build, CUDA context included).

    The CUDA path uses it with MPS's percentage as the environment (:class:`CudaInstances`); it runs with any
    provider, which is how it is tested where there is no GPU."""

    def __init__(self, path: str | os.PathLike[str], *, providers: Sequence[str],
                 provider_options: Sequence[Mapping[str, str]] | None = None,
                 env_for_share: Callable[[float], Mapping[str, str]] = lambda share: {},
                 optimization: str = "all", threads: int = 1, start_timeout_s: float = 120.0, seed: int = 0,
                 label: str = "") -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise SpatialConfigError(f"ONNX file {str(path)!r} does not exist")
        if optimization not in OPT_LEVELS:
            raise SpatialConfigError(f"optimization must be one of {', '.join(OPT_LEVELS)}, got {optimization!r}")
        self.providers = tuple(providers)
        self.provider_options = [dict(o) for o in (provider_options or [{} for _ in self.providers])]
        self.env_for_share = env_for_share
        self.optimization = optimization
        self.threads = threads
        self.cores = 1
        self.start_timeout_s = start_timeout_s
        self.label = label
        self._seed = seed
        self._inputs: list[tuple[str, str, tuple[int, ...]]] | None = None

    def make(self, share: float) -> _ProcessInstance:
        s = check_share(share)
        env = dict(os.environ)
        env.update(self.env_for_share(s))
        stderr = tempfile.TemporaryFile()
        proc = subprocess.Popen([sys.executable, str(_CHILD)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=stderr, env=env)
        assert proc.stdin is not None and proc.stdout is not None
        try:
            pickle.dump({"path": str(self.path), "providers": list(self.providers),
                         "provider_options": self.provider_options, "optimization": self.optimization,
                         "threads": self.threads}, proc.stdin)
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], self.start_timeout_s)
            if not ready:
                raise BackendError(f"instance process {proc.pid} did not start within {self.start_timeout_s:g} s"
                                   f"{_tail(stderr)}", 500)
            hello = pickle.load(proc.stdout)
        except (BrokenPipeError, EOFError, OSError, pickle.UnpicklingError):
            proc.kill()
            proc.wait()
            raise BackendError(f"instance process {proc.pid} ended at start (exit code {proc.returncode})"
                               f"{_tail(stderr)}", 500) from None
        except BaseException:
            proc.kill()
            proc.wait()
            stderr.close()
            raise
        if not hello.get("ok"):
            proc.wait()
            stderr.close()
            raise BackendError(f"cannot start an instance of {self.path.name}: {hello.get('error')}", 500)
        if self._inputs is None:
            self._inputs = [(n, t, tuple(d if isinstance(d, int) and d > 0 else 1 for d in shape))
                            for n, t, shape in hello["inputs"]]
        return _ProcessInstance(proc, s, hello, stderr)

    def warm_inputs(self) -> dict[str, np.ndarray]:
        if self._inputs is None:
            self.make(1.0).close()
        assert self._inputs is not None
        return random_inputs(self._inputs, self._seed, self.path.name)

    def describe(self) -> str:
        return (self.label or f"onnxruntime sessions of {self.path.name} with {', '.join(self.providers)}, "
                              f"one process per instance")


def time_instance(factory: InstanceFactory, share: float, inputs: Mapping[str, np.ndarray], warmup: int,
                  repeats: int) -> list[float]:
    """Start one instance of ``factory`` at ``share``, run ``warmup`` untimed then ``repeats`` timed requests of
    ``inputs`` alone, and return the timed runs (ms) as the instance measured them (its ``last_exec_ms``: the
    session's run in its own process, not the pipe); the instance is closed after."""
    inst = factory.make(share)
    try:
        for _ in range(warmup):
            inst.run(inputs)
        out = []
        for _ in range(repeats):
            inst.run(inputs)
            out.append(float(getattr(inst, "last_exec_ms")))
        return out
    finally:
        inst.close()


# ----------------------------------------------------------------------------------------- the CUDA path


class CudaInstances(InstanceFactory):
    """Instances of the model at ``path`` on NVIDIA GPU ``device_id`` with onnxruntime's CUDA provider.

    ``mechanism``: ``mps`` (one process per instance at MPS percentage ``mps_percentage(share)``: the share is
    enforced; needs the MPS control daemon, :func:`start_mps`), ``streams`` (sessions in this process, each on
    its own CUDA stream: concurrent, the share not enforced) or ``auto`` (``mps`` when the daemon runs).
    ``GpuUnavailable`` (503) with the reason where there is no CUDA path (:func:`check_gpu`);
    ``SpatialConfigError`` (400) for ``mps`` without a daemon or an unknown mechanism."""

    def __init__(self, path: str | os.PathLike[str], *, mechanism: str = "auto", device_id: int = 0,
                 optimization: str = "all", seed: int = 0, check: GpuCheck | None = None,
                 start_timeout_s: float = 120.0) -> None:
        if mechanism not in MECHANISMS:
            raise SpatialConfigError(f"mechanism must be one of {', '.join(MECHANISMS)}, got {mechanism!r}")
        gpu = check_gpu(device_id) if check is None else check
        if not gpu.ok:
            raise GpuUnavailable(f"no CUDA path: {gpu.reason}")
        pipe = mps_pipe_dir()
        if mechanism == "mps" and not mps_running(pipe):
            raise SpatialConfigError(f"mechanism mps needs the MPS control daemon: no control pipe in {pipe} (start "
                                     f"it with '{MPS_CONTROL} -d', or use mechanism streams)")
        self.mechanism = "mps" if mechanism == "mps" or (mechanism == "auto" and mps_running(pipe)) else "streams"
        self.gpu = gpu
        self.device_id = device_id
        self.cores = 1
        cuda_options = {"device_id": str(device_id)}
        self._inner: InstanceFactory
        if self.mechanism == "mps":
            self._inner = ProcessInstances(
                path, providers=(CUDA_PROVIDER,), provider_options=[cuda_options], optimization=optimization,
                env_for_share=lambda share: {MPS_PERCENTAGE_ENV: str(mps_percentage(share)), MPS_PIPE_ENV: str(pipe)},
                start_timeout_s=start_timeout_s, seed=seed)
        else:
            # cores=1: one intra-op thread per session (a CUDA session's CPU threads only feed the GPU);
            # a copy of the weights per session: the shared-initializer path is the CPU's (CUDA copies them anyway)
            self._inner = OrtInstances(path, cores=1, shared_weights=False, optimization=optimization,
                                       providers=(CUDA_PROVIDER,), seed=seed)

    @property
    def enforced(self) -> bool:
        """Whether an instance's share is enforced by the GPU (MPS) rather than a label (streams)."""
        return self.mechanism == "mps"

    def make(self, share: float) -> Instance:
        check_share(share)
        return self._inner.make(share)

    def warm_inputs(self) -> dict[str, np.ndarray]:
        return self._inner.warm_inputs()

    def describe(self) -> str:
        path = getattr(self._inner, "path", None)
        how = ("share = MPS active-thread percentage, one process per instance" if self.enforced else
               "one CUDA stream per instance in this process, share NOT enforced (no MPS daemon)")
        return (f"onnxruntime {CUDA_PROVIDER} sessions of {Path(str(path)).name} on {self.gpu.gpu}: {how}; "
                f"a copy of the weights per instance")
