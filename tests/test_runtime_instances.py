"""runtime.dataplane.instances: instances of one model with a share each, shared weights (Param-Share), memory
measured in child processes, and reconfiguration with and without overlap under concurrent load.

Nothing here asserts how long anything took (the host is shared): counts, identities and memory with a margin.
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import Future, wait
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgemux.profiles.types import DeviceKind, ExecTime, Profile, Provenance
from edgemux.runtime import zoo
from edgemux.runtime.dataplane.instances import (
    EmulatedInstances,
    InstancePool,
    OrtInstances,
    PoolClosed,
    PoolResult,
    SharedWeights,
    SpatialConfigError,
    check_instances,
    check_share,
    measure_memory,
    threads_for,
)
from edgemux.runtime.dataplane.protocol import TensorSpec

WAIT_S = 60.0  # a bound on any wait: a test that needs it has hung, not run slowly


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return zoo.path("squeezenet1_1", input_size=64, cache_dir=tmp_path_factory.mktemp("zoo"))


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """resnet18 at 64x64: 46.7 MB of weights, little compute."""
    return zoo.path("resnet18", input_size=64, cache_dir=tmp_path_factory.mktemp("zoo"))


def _done(futures: list[Future[PoolResult]]) -> list[PoolResult]:
    finished, pending = wait(futures, timeout=WAIT_S)
    assert not pending, "requests did not finish"
    return [f.result() for f in futures]


# ----------------------------------------------------------------------------------------- shared weights


def test_shared_weights_are_one_buffer_and_give_the_same_outputs(small: Path) -> None:
    shared = OrtInstances(small, cores=2, shared_weights=True)
    own = OrtInstances(small, cores=2, shared_weights=False, optimization="extended")
    w = shared.weights
    assert w is not None and w.nbytes > 0
    lo = w.buffer.ctypes.data
    for name, value in w.values.items():  # every weight lives inside the one buffer: nothing was copied
        assert lo <= value.data_ptr() < lo + w.buffer.nbytes, name
    assert len(w.model_bytes) < w.nbytes / 10  # the sessions' model holds no weights
    x = shared.warm_inputs()
    a, b, c = shared.make(0.5), shared.make(1.0), own.make(0.5)
    ya, yb, yc = a.run(x)["logits"], b.run(x)["logits"], c.run(x)["logits"]
    assert np.array_equal(ya, yb)
    np.testing.assert_allclose(ya, yc, rtol=1e-5, atol=1e-5)
    assert (a.threads, b.threads) == (1, 2)


def test_memory_with_shared_weights_is_below_without(big: Path) -> None:
    """4 instances of resnet18: with one copy of the weights the resident memory is at least 1.5 copies of
    the weights (70 MB) below 4 copies; measured in fresh child processes."""
    own = measure_memory(big, 4, shared=False, optimization="extended")
    shared = measure_memory(big, 4, shared=True)
    assert shared.weights_mb == pytest.approx(own.weights_mb) and own.weights_mb > 40
    assert shared.static_mb == pytest.approx(shared.weights_mb)
    assert own.static_mb == pytest.approx(4 * own.weights_mb)
    assert shared.total_mb < own.total_mb - 1.5 * own.weights_mb, (shared, own)
    assert shared.static_mb + shared.runtime_mb == pytest.approx(shared.total_mb)


# -------------------------------------------------------------------------------------- reconfiguration


def _load_while(pool: InstancePool, inputs: dict[str, np.ndarray], action: Any, per_thread: int = 40,
                threads: int = 3) -> tuple[list[Future[PoolResult]], Any]:
    """``threads`` submitters each send ``per_thread`` requests while ``action()`` runs on this thread."""
    futures: list[Future[PoolResult]] = []
    lock = threading.Lock()
    started = threading.Event()

    def submitter() -> None:
        for i in range(per_thread):
            f = pool.submit(inputs)
            with lock:
                futures.append(f)
            if i == 2:
                started.set()

    ts = [threading.Thread(target=submitter) for _ in range(threads)]
    for t in ts:
        t.start()
    started.wait(WAIT_S)
    out = action()
    for t in ts:
        t.join(WAIT_S)
    return futures, out


@pytest.mark.parametrize("overlap", [True, False])
def test_reconfiguration_under_load_loses_and_fails_nothing(small: Path, overlap: bool) -> None:
    f = OrtInstances(small, cores=2, shared_weights=True)
    pool = InstancePool(f, share=0.5, instances=2)
    x = f.warm_inputs()
    expected = pool.run(x, WAIT_S)["logits"]

    def change() -> list[Any]:
        return [pool.reconfigure(share=1.0, instances=1, overlap=overlap),
                pool.reconfigure(threads=1, instances=3, overlap=overlap)]

    futures, recs = _load_while(pool, x, change)
    futures += [pool.submit(x) for _ in range(5)]  # after the change: served by the new instances
    results = _done(futures)
    assert len(results) == 3 * 40 + 5
    assert all(np.array_equal(r.outputs["logits"], expected) for r in results)
    assert pool.failed == 0 and pool.completed == len(results) + 1
    assert [(r.overlap, r.new_share, r.new_instances) for r in recs] == [(overlap, 1.0, 1), (overlap, 0.5, 3)]
    assert {r.generation for r in results[-5:]} == {2}
    assert (pool.share, pool.instances, pool.threads, pool.generation) == (0.5, 3, 1, 2)
    assert all(r.warm_ms > 0 for r in recs) == overlap
    assert pool.close()
    assert pool.stats()["inflight"] == 0


def test_close_without_drain_fails_the_queued_requests_explicitly() -> None:
    gate = threading.Event()
    f = EmulatedInstances(_profile(), outputs=(TensorSpec("y", "FP32", (1, 2)),), sleep=lambda s: gate.wait(WAIT_S))
    pool = InstancePool(f, share=1.0, instances=1, warm=False)
    futures = [pool.submit({}) for _ in range(5)]
    closer = threading.Thread(target=pool.close, kwargs={"drain": False})
    closer.start()
    gate.set()
    closer.join(WAIT_S)
    wait(futures, timeout=WAIT_S)
    errors = [fu.exception() for fu in futures]
    ok = sum(e is None for e in errors)
    assert ok >= 0 and all(e is None or isinstance(e, PoolClosed) for e in errors)
    assert pool.completed + pool.failed == 5 and pool.failed == 5 - ok
    with pytest.raises(PoolClosed):
        pool.submit({})


# ------------------------------------------------------------------------------------------- emulated


def _profile(curve: tuple[tuple[float, float], ...] = ()) -> Profile:
    return Profile(name="cat/m", model="m", variant="v", device_kind=DeviceKind.GPU_DISCRETE,
                   provenance=Provenance("unit test"), exec={1: ExecTime(1, 10.0)}, share_curve=curve)


def test_emulated_instance_sleeps_the_profile_time_times_the_slowdown() -> None:
    slept: list[float] = []
    curve = ((0.25, 40.0), (0.5, 12.0), (1.0, 10.0))
    f = EmulatedInstances(_profile(curve), outputs=(TensorSpec("y", "FP32", (-1, 3)),), sleep=slept.append)
    for share in (0.25, 0.5, 0.75, 1.0):
        out = f.make(share).run({})
        assert out["y"].shape == (1, 3)
    # ExecTime(1, 10.0) has no variance: 10 ms x latency_at(share) / 10 ms
    assert slept == pytest.approx([0.040, 0.012, 0.011, 0.010])
    slept.clear()
    EmulatedInstances(_profile(), sleep=slept.append).make(0.5).run({})  # no curve: 1 / share
    assert slept == pytest.approx([0.020])
    with pytest.raises(ValueError, match="below the profiled range"):
        f.make(0.1)


# ------------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("share", [0, -0.5, 1.5, math.nan, math.inf, True, "half", None])
def test_bad_share_is_refused(share: Any) -> None:
    with pytest.raises(SpatialConfigError, match=r"share must be"):
        check_share(share)
    f = EmulatedInstances(_profile(), sleep=lambda s: None)
    with pytest.raises(SpatialConfigError, match=r"share must be"):
        InstancePool(f, share=share, instances=1)


@pytest.mark.parametrize("instances", [0, -1, 1.5, True, "2"])
def test_bad_instance_count_is_refused(instances: Any) -> None:
    with pytest.raises(SpatialConfigError, match="instances must be an integer >= 1"):
        check_instances(instances)


def test_threads_for_and_bad_reconfigurations(small: Path) -> None:
    assert [threads_for(s, 2) for s in (0.25, 0.5, 0.75, 1.0)] == [1, 1, 2, 2]
    assert [threads_for(s, 8) for s in (0.125, 0.25, 0.5, 1.0)] == [1, 2, 4, 8]
    with pytest.raises(SpatialConfigError, match="cores"):
        threads_for(0.5, 0)
    f = OrtInstances(small, cores=2, shared_weights=False)
    pool = InstancePool(f, share=1.0, instances=1, warm=False)
    try:
        with pytest.raises(SpatialConfigError, match="not both"):
            pool.reconfigure(share=0.5, threads=1)
        with pytest.raises(SpatialConfigError, match="more than the device's 2 cores"):
            pool.reconfigure(threads=3)
        with pytest.raises(SpatialConfigError, match=r"share must be in \(0, 1\]"):
            pool.reconfigure(share=2.0)
        with pytest.raises(SpatialConfigError, match="instances must be"):
            pool.reconfigure(instances=0)
        assert (pool.share, pool.instances, pool.generation) == (1.0, 1, 0)  # nothing changed
    finally:
        pool.close()
    with pytest.raises(SpatialConfigError, match="does not exist"):
        OrtInstances(small.parent / "absent.onnx")
    with pytest.raises(SpatialConfigError, match="optimization"):
        OrtInstances(small, optimization="max")
    with pytest.raises(SpatialConfigError, match="instances must be"):
        measure_memory(small, 0, True)


def test_shared_weights_refuse_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(Exception):
        SharedWeights(tmp_path / "absent.onnx")
