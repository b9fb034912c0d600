"""runtime.dataplane.worker: each sharing discipline's order, switches, batching and concurrency; overload and close.

Nothing here asserts how long anything took: orderings, counts and the worker's own accounting only
(the machine is shared and noisy). Service times are a few ms of emulated sleep.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import CancelledError, Future, wait
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgemux.cluster.state import Device
from edgemux.cluster.workload import Discipline
from edgemux.profiles.types import DeviceKind, ExecTime, Profile, Provenance
from edgemux.runtime.dataplane.backends import (
    BackendError,
    EmulatedBackend,
    InvalidInput,
    ModelInfo,
    ModelNotFound,
    ModelSource,
    OnnxRuntimeBackend,
)
from edgemux.runtime.dataplane.instances import SpatialConfigError
from edgemux.runtime.dataplane.protocol import TensorSpec
from edgemux.runtime.dataplane.worker import DeviceWorker, Overloaded, Result, WorkerClosed

WAIT_S = 10.0  # upper bound on any wait: a test that needs it has hung, not run slowly
X = {"x": np.ones((1, 4), np.float32)}


def _device(discipline: Discipline, **kw: Any) -> Device:
    return Device("n1", "tpu0", DeviceKind.EDGETPU, discipline, memory_mb=8.0, **kw)


def _profile(mean_ms: float, switch_ms: float = 0.0) -> Profile:
    return Profile(name="p", model="m", variant="m", device_kind=DeviceKind.EDGETPU,
                   provenance=Provenance("unit test"), exec={1: ExecTime(1, mean_ms)}, switch_ms=switch_ms)


def _source(mean_ms: float = 1.0, switch_ms: float = 0.0) -> ModelSource:
    return ModelSource(profile=_profile(mean_ms, switch_ms), inputs=(TensorSpec("x", "FP32", (-1, 4)),),
                       outputs=(TensorSpec("y", "FP32", (-1, 2)),))


def _emulated(*models: str, mean_ms: float = 1.0, switch_ms: float = 0.0, cls: type = EmulatedBackend) -> Any:
    b = cls(seed=0)
    for m in models:
        b.load(m, _source(mean_ms, switch_ms))
    return b


def _results(futures: list[Future[Result]]) -> list[Result]:
    done, pending = wait(futures, timeout=WAIT_S)
    assert not pending, "requests did not finish"
    return [f.result() for f in futures]


class _Recorder:
    """Records the order in which futures resolve (callbacks run in the resolving worker thread)."""

    def __init__(self) -> None:
        self.order: list[Any] = []
        self._lock = threading.Lock()

    def watch(self, fut: Future[Result], tag: Any) -> Future[Result]:
        def done(_: Future[Result]) -> None:
            with self._lock:
                self.order.append(tag)
        fut.add_done_callback(done)
        return fut


class GatedBackend(EmulatedBackend):
    """Emulated backend whose executions block until ``gate`` opens; counts executions in flight."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self.gate = threading.Event()
        self.inflight = 0
        self.max_inflight = 0
        self.started = 0
        self._count = threading.Lock()

    def _execute(self, info: ModelInfo, handle: Any, inputs: dict[str, np.ndarray],
                 batch: int) -> dict[str, np.ndarray]:
        with self._count:
            self.inflight += 1
            self.started += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            assert self.gate.wait(WAIT_S), "gate never opened"
            return super()._execute(info, handle, inputs, batch)
        finally:
            with self._count:
                self.inflight -= 1


def _until(pred: Any, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.002)


# --------------------------------------------------------------------------------------------------- fcfs


def test_fcfs_runs_in_submission_order_and_pays_switches_only_on_model_changes() -> None:
    sleeps: list[float] = []

    def sleep(s: float) -> None:  # the worker spends switch costs through this: count them, not wall time
        sleeps.append(s)
        time.sleep(s)

    backend = _emulated("a", "b", mean_ms=1.0, switch_ms=3.0)
    w = DeviceWorker(_device(Discipline.FCFS), backend, sleep=sleep, start=False)
    models = ["a", "a", "b", "b", "a", "b", "b"]
    rec = _Recorder()
    futures = [rec.watch(w.submit("app", m, X), i) for i, m in enumerate(models)]
    w.start()
    results = _results(futures)
    assert rec.order == list(range(len(models)))
    # cold start (a), then every change of model: a a | b b | a | b b
    switched = [i for i, r in enumerate(results) if r.switch_ms > 0]
    assert switched == [0, 2, 4, 5]
    assert sleeps == [0.003] * 4
    assert w.stats()["switches"] == 4
    assert [s[2] for s in backend.samples] == models  # the backend ran them in that order too
    assert all(r.batch_size == 1 and r.emulated and r.device == "n1/tpu0" for r in results)
    assert all(r.outputs["y"].shape == (1, 2) for r in results)
    assert all(r.service_ms >= r.switch_ms for r in results)
    assert w.close()


def test_fcfs_switch_cost_callable_overrides_the_profile() -> None:
    sleeps: list[float] = []
    backend = _emulated("a", "b", switch_ms=50.0)
    w = DeviceWorker(_device(Discipline.FCFS), backend, switch_ms={"a": 2.0, "b": 0.0}.__getitem__,
                     sleep=sleeps.append, start=False)
    futures = [w.submit("app", m, X) for m in ("a", "b", "a")]
    w.start()
    _results(futures)
    assert sleeps == [0.002, 0.002]  # b's switch is free: counted as a switch, nothing slept
    assert w.stats()["switches"] == 3
    w.close()


def test_fcfs_with_real_onnxruntime(tmp_path: Path) -> None:
    backend = OnnxRuntimeBackend(threads=1)
    backend.load("sq", ModelSource(zoo="squeezenet1_1", input_size=64, cache_dir=str(tmp_path)))
    dev = Device("n1", "cpu0", DeviceKind.CPU, Discipline.FCFS, memory_mb=1000.0)
    xs = [np.random.default_rng(i).standard_normal((1, 3, 64, 64), dtype=np.float32) for i in range(3)]
    with DeviceWorker(dev, backend) as w:
        results = _results([w.submit("cam", "sq", {"input": x}) for x in xs])
    for x, r in zip(xs, results):
        np.testing.assert_allclose(r.outputs["logits"], backend.run("sq", {"input": x})["logits"], rtol=1e-5, atol=1e-6)
        assert not r.emulated and r.switch_ms == 0.0 and r.service_ms > 0
    stats = w.stats()
    assert stats["emulated"] is False and stats["backend"] == "onnxruntime" and stats["closed"]
    assert stats["apps"]["cam"]["completed"] == 3


# -------------------------------------------------------------------------------------------------- batch


def test_batch_full_batch_goes_as_one_execution() -> None:
    backend = _emulated("m")
    w = DeviceWorker(_device(Discipline.BATCH, max_batch=4, batch_timeout_ms=60_000.0), backend)
    results = _results([w.submit(f"app{i % 2}", "m", X) for i in range(4)])
    assert [r.batch_size for r in results] == [4] * 4
    assert len({r.service_ms for r in results}) == 1  # finished together
    assert [(s[2], s[3]) for s in backend.samples] == [("m", 4)]  # one backend call of 4 items
    assert w.stats()["executions"] == 1
    assert w.close()


def test_batch_lone_request_goes_alone_after_the_timeout() -> None:
    backend = _emulated("m")
    w = DeviceWorker(_device(Discipline.BATCH, max_batch=4, batch_timeout_ms=30.0), backend)
    (r,) = _results([w.submit("app", "m", X)])
    assert r.batch_size == 1
    assert r.queue_ms >= 30.0 - 1e-6  # not dispatched before its timeout (a lower bound: delays only add)
    assert w.close()


def test_batch_groups_per_model_oldest_head_first_and_pays_switches() -> None:
    backend = _emulated("a", "b", switch_ms=1.0)
    w = DeviceWorker(_device(Discipline.BATCH, max_batch=2, batch_timeout_ms=60_000.0), backend, start=False)
    rec = _Recorder()
    futures = [rec.watch(w.submit("app", m, X), (i, m)) for i, m in enumerate(["a", "b", "a", "b"])]
    w.start()
    results = _results(futures)
    assert [(s[2], s[3]) for s in backend.samples] == [("a", 2), ("b", 2)]
    assert [r.batch_size for r in results] == [2] * 4
    assert w.stats()["switches"] == 2
    assert [m for _, m in rec.order] == ["a", "a", "b", "b"]
    w.close()


def test_batch_drain_on_close_does_not_wait_out_the_timeout() -> None:
    backend = _emulated("m")
    w = DeviceWorker(_device(Discipline.BATCH, max_batch=8, batch_timeout_ms=600_000.0), backend)
    futures = [w.submit("app", "m", X) for _ in range(3)]
    assert w.close(drain=True, timeout_s=WAIT_S)
    assert [f.result(0).batch_size for f in futures] == [3] * 3


# ------------------------------------------------------------------------------------------------ ps, mps


@pytest.mark.parametrize(("discipline", "servers", "c"),
                         [(Discipline.MPS, 2.0, 2), (Discipline.MPS, 1.65, 2), (Discipline.PS, 3.0, 3)])
def test_ps_and_mps_run_c_at_once_never_more(discipline: Discipline, servers: float, c: int) -> None:
    backend = _emulated("m", cls=GatedBackend)
    w = DeviceWorker(_device(discipline, servers=servers), backend)
    futures = [w.submit("app", "m", X) for _ in range(3 * c)]
    _until(lambda: backend.inflight == c)
    time.sleep(0.05)  # room for a (wrong) extra thread to start one more execution
    assert backend.inflight == c and backend.started == c
    assert w.stats()["inflight"] == c and w.stats()["queued"] == 2 * c
    backend.gate.set()
    _results(futures)
    assert backend.max_inflight == c and w.max_inflight == c
    assert w.stats()["switches"] == 0  # time-sharing disciplines pay no switch cost
    assert w.close()


# ------------------------------------------------------------------------------------------ gpu-timeshare


def test_gpu_timeshare_alternates_between_apps_fifo_within_each() -> None:
    backend = _emulated("m", switch_ms=5.0)
    w = DeviceWorker(_device(Discipline.GPU_TIMESHARE), backend, start=False)
    rec = _Recorder()
    futures = [rec.watch(w.submit(app, "m", X), (app, i))
               for app, n in (("A", 3), ("B", 3), ("C", 1)) for i in range(n)]
    w.start()
    _results(futures)
    assert rec.order == [("A", 0), ("B", 0), ("C", 0), ("A", 1), ("B", 1), ("A", 2), ("B", 2)]
    assert w.stats()["switches"] == 0
    w.close()


# ------------------------------------------------------------------------------------- overload and close


def test_full_queue_raises_overloaded_and_close_without_drain_fails_queued() -> None:
    backend = _emulated("m")
    w = DeviceWorker(_device(Discipline.FCFS), backend, max_queue=2, start=False)
    futures = [w.submit("app", "m", X) for _ in range(2)]
    with pytest.raises(Overloaded, match=r"n1/tpu0 has 2 requests queued \(max_queue 2\)") as e:
        w.submit("app", "m", X)
    assert e.value.retry_after_s > 0 and e.value.status == 503
    assert w.close(drain=False)
    for f in futures:
        with pytest.raises(WorkerClosed, match="closed before the request ran") as ce:
            f.result(WAIT_S)
        assert ce.value.status == 503
    with pytest.raises(WorkerClosed, match="is closed"):
        w.submit("app", "m", X)
    assert backend.samples == []  # nothing ran
    app = w.stats()["apps"]["app"]
    assert (app["requests"], app["completed"], app["failed"], app["rejected"]) == (4, 0, 2, 2)


def test_close_with_drain_finishes_queued_and_in_flight_work() -> None:
    backend = _emulated("m", mean_ms=2.0)
    w = DeviceWorker(_device(Discipline.FCFS), backend)
    futures = [w.submit("app", "m", X) for _ in range(5)]
    assert w.close(drain=True, timeout_s=WAIT_S)
    assert all(f.done() and f.exception() is None for f in futures)
    assert w.stats()["apps"]["app"]["completed"] == 5


def test_close_without_drain_lets_the_execution_in_flight_finish() -> None:
    backend = _emulated("m", cls=GatedBackend)
    w = DeviceWorker(_device(Discipline.FCFS), backend)
    first, second = w.submit("app", "m", X), w.submit("app", "m", X)
    _until(lambda: backend.inflight == 1)
    opener = threading.Timer(0.05, backend.gate.set)
    opener.start()
    assert w.close(drain=False, timeout_s=WAIT_S)
    opener.join()
    assert first.result(0).outputs["y"].shape == (1, 2)
    with pytest.raises(WorkerClosed):
        second.result(0)


def test_a_never_started_worker_drains_on_close() -> None:
    w = DeviceWorker(_device(Discipline.FCFS), _emulated("m"), start=False)
    f = w.submit("app", "m", X)
    assert w.close(drain=True, timeout_s=WAIT_S)
    assert f.result(0).batch_size == 1


# ---------------------------------------------------------------------------------- errors and accounting


def test_unknown_model_and_bad_inputs_are_refused_at_submit() -> None:
    w = DeviceWorker(_device(Discipline.FCFS), _emulated("m"))
    with pytest.raises(ModelNotFound, match=r"model 'nope' is not loaded .*\(device n1/tpu0\)") as e:
        w.submit("app", "nope", X)
    assert e.value.status == 404
    with pytest.raises(InvalidInput, match=r"^unexpected shape for input 'x': expected \[-1,4\], got \[4\]$"):
        w.submit("app", "m", {"x": np.ones(4, np.float32)})
    app = w.stats()["apps"]["app"]
    assert (app["requests"], app["failed"]) == (2, 2)
    w.close()


class _Failing(EmulatedBackend):
    def _execute(self, info: ModelInfo, handle: Any, inputs: dict[str, np.ndarray],
                 batch: int) -> dict[str, np.ndarray]:
        if inputs["x"][0, 0] < 0:
            raise RuntimeError("device fell over")
        return super()._execute(info, handle, inputs, batch)


def test_backend_failure_fails_that_request_only() -> None:
    w = DeviceWorker(_device(Discipline.FCFS), _emulated("m", cls=_Failing))
    bad = w.submit("app", "m", {"x": -np.ones((1, 4), np.float32)})
    good = w.submit("app", "m", X)
    with pytest.raises(BackendError, match="model 'm' failed on device n1/tpu0: device fell over") as e:
        bad.result(WAIT_S)
    assert e.value.status == 500
    assert good.result(WAIT_S).outputs["y"].shape == (1, 2)
    app = w.stats()["apps"]["app"]
    assert (app["completed"], app["failed"]) == (1, 1)
    w.close()


def test_a_request_cancelled_while_queued_never_runs() -> None:
    backend = _emulated("m")
    w = DeviceWorker(_device(Discipline.FCFS), backend, start=False)
    kept, dropped = w.submit("app", "m", X), w.submit("app", "m", X)
    assert dropped.cancel()
    w.start()
    kept.result(WAIT_S)
    assert w.close()
    with pytest.raises(CancelledError):
        dropped.result(0)
    assert len(backend.samples) == 1
    assert w.stats()["apps"]["app"]["failed"] == 1


def test_stats_account_per_app_and_device() -> None:
    backend = _emulated("m", mean_ms=2.0)
    w = DeviceWorker(_device(Discipline.FCFS), backend, window_s=30.0)
    results = _results([w.submit(app, "m", X) for app in ("A", "B", "A")])
    s = w.stats()
    assert s["device"] == "n1/tpu0" and s["discipline"] == "fcfs" and s["kind"] == "edgetpu"
    assert s["emulated"] is True and s["loaded_models"] == ["m"] and s["executions"] == 3
    assert s["queued"] == 0 and s["inflight"] == 0
    assert s["busy_s"] > 0 and 0 < s["utilization"] <= 1 and s["window_s"] == 30.0
    a, b = s["apps"]["A"], s["apps"]["B"]
    assert (a["requests"], a["completed"], b["completed"]) == (2, 2, 1)
    assert a["latency_ms_mean"] == pytest.approx(a["queue_ms_mean"] + a["service_ms_mean"])
    assert a["service_ms_total"] == pytest.approx(results[0].service_ms + results[2].service_ms)
    # busy time covers every service: the device was busy at least as long as the requests ran
    assert s["busy_s"] * 1000 >= sum(r.service_ms for r in results) - 1e-6
    w.close()


def test_close_from_a_result_callback_does_not_deadlock() -> None:
    w = DeviceWorker(_device(Discipline.FCFS), _emulated("m"))
    closed: list[bool] = []
    f = w.submit("app", "m", X)
    f.add_done_callback(lambda _: closed.append(w.close(drain=False, timeout_s=WAIT_S)))
    f.result(WAIT_S)
    _until(lambda: bool(closed))
    assert closed == [True] and w.closed


# ------------------------------------------------------------------------------------------------ spatial


def _spatial_worker(mean_ms: float = 5.0, **kw: Any) -> DeviceWorker:
    b = _emulated("m", "n", mean_ms=mean_ms)
    d = Device("n1", "gpu0", DeviceKind.GPU_DISCRETE, Discipline.SPATIAL, memory_mb=16000.0)
    return DeviceWorker(d, b, **kw)


def test_spatial_apps_have_their_own_queues_and_instances() -> None:
    """App a's backlog of 12 requests on 1 instance does not delay app b, which has 2 instances of its own:
    b's requests, sent after all of a's, finish before a's last one."""
    w = _spatial_worker(mean_ms=5.0)
    try:
        assert w.configure_app("a", "m", share=0.5, instances=1) is None
        w.configure_app("b", "n", share=0.25, instances=2)
        fa = [w.submit("a", "m", X) for _ in range(12)]
        fb = [w.submit("b", "n", X) for _ in range(2)]
        _results(fa + fb)
        assert max(f.result().queue_ms for f in fb) < fa[-1].result().queue_ms
        cfg = w.spatial_config()
        assert {a: (c["model"], c["share"], c["instances"], c["held"]) for a, c in cfg.items()} == {
            "a": ("m", 0.5, 1, 0.5), "b": ("n", 0.25, 2, 0.5)}
        st = w.stats()
        assert st["apps"]["a"]["completed"] == 12 and st["apps"]["b"]["completed"] == 2
        assert st["executions"] == 14 and st["discipline"] == "spatial"
    finally:
        assert w.close()


def test_spatial_refuses_holding_more_than_the_device_and_bad_shares() -> None:
    w = _spatial_worker()
    try:
        w.configure_app("a", "m", share=0.5, instances=1)
        with pytest.raises(BackendError, match=r"hold 1.25 of the device.*a 1 x 0.5, b 3 x 0.25") as e:
            w.configure_app("b", "n", share=0.25, instances=3)
        assert e.value.status == 400
        with pytest.raises(BackendError, match=r"share must be in \(0, 1\]"):
            w.configure_app("b", "n", share=1.5)
        with pytest.raises(BackendError, match=r"share must be in \(0, 1\]"):
            w.configure_app("b", "n", share=0.0)
        with pytest.raises(BackendError, match="instances must be an integer >= 1"):
            w.configure_app("b", "n", share=0.25, instances=0)
        with pytest.raises(BackendError, match="hold 1.5 of the device"):
            w.configure_app("a", "m", share=0.5, instances=3)  # a change is checked too
        assert w.spatial_config()["a"]["instances"] == 1 and "b" not in w.spatial_config()
        with pytest.raises(BackendError, match="runs model 'm'") as e:
            w.configure_app("a", "n", share=0.25)
        assert e.value.status == 409
        with pytest.raises(BackendError, match="has no instances: configure_app first"):
            w.submit("b", "n", X)
        with pytest.raises(ModelNotFound):
            w.configure_app("c", "absent", share=0.25)
        assert w.stats()["apps"]["b"]["failed"] == 1
    finally:
        w.close()
    fifo = DeviceWorker(_device(Discipline.FCFS), _emulated("m"))
    try:
        with pytest.raises(BackendError, match="not spatial"):
            fifo.configure_app("a", "m", share=0.5)
    finally:
        fifo.close()


@pytest.mark.parametrize("overlap", [True, False])
def test_spatial_reconfiguration_under_load_loses_nothing(overlap: bool) -> None:
    w = _spatial_worker(mean_ms=2.0)
    try:
        w.configure_app("a", "m", share=0.5, instances=2)
        futures: list[Future[Result]] = []
        stop = threading.Event()

        def load() -> None:
            while not stop.is_set() and len(futures) < 400:
                futures.append(w.submit("a", "m", X))
                time.sleep(0.001)

        t = threading.Thread(target=load)
        t.start()
        while len(futures) < 10:
            time.sleep(0.005)
        r1 = w.configure_app("a", "m", share=1.0, instances=1, overlap=overlap)
        r2 = w.configure_app("a", "m", share=0.25, instances=4, overlap=overlap)
        stop.set()
        t.join(WAIT_S)
        results = _results(futures)
        assert r1 is not None and r2 is not None and r1.overlap is overlap
        st = w.stats()["apps"]["a"]
        assert st["completed"] == len(results) == st["requests"] and st["failed"] == 0
        assert w.spatial_config()["a"]["instances"] == 4
    finally:
        assert w.close()


def test_spatial_close_without_drain_fails_queued_requests_as_worker_closed() -> None:
    w = _spatial_worker(mean_ms=20.0)
    w.configure_app("a", "m", share=1.0, instances=1)
    futures = [w.submit("a", "m", X) for _ in range(6)]
    w.close(drain=False)
    wait(futures, timeout=WAIT_S)
    errors = [f.exception() for f in futures]
    assert any(isinstance(e, WorkerClosed) for e in errors)
    assert all(e is None or isinstance(e, WorkerClosed) for e in errors)
    st = w.stats()["apps"]["a"]
    assert st["completed"] + st["failed"] == 6
    with pytest.raises(WorkerClosed):
        w.submit("a", "m", X)


def test_spatial_on_the_real_cpu_counts_whole_threads(tmp_path: Path) -> None:
    """On 2 cores, two instances at 0.25 hold 0.5 of the device by shares but two threads: a third instance
    fits the shares (0.75) and is refused for threads; the real instances answer as one session does."""
    backend = OnnxRuntimeBackend(threads=1)
    backend.load("sq", ModelSource(zoo="squeezenet1_1", input_size=64, cache_dir=str(tmp_path)))
    dev = Device("n1", "cpu0", DeviceKind.CPU, Discipline.SPATIAL, memory_mb=1000.0)
    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64), dtype=np.float32)
    with DeviceWorker(dev, backend, cores=2) as w:
        w.configure_app("a", "sq", share=0.25, instances=2)
        with pytest.raises(SpatialConfigError, match=r"need 3 intra-op threads on 2 cores \(a 2, b 1\)"):
            w.configure_app("b", "sq", share=0.25)
        r = w.submit("a", "sq", {"input": x}).result(30)
        np.testing.assert_allclose(r.outputs["logits"], backend.run("sq", {"input": x})["logits"], rtol=1e-4,
                                   atol=1e-5)
        assert not r.emulated and "b" not in w.spatial_config()
