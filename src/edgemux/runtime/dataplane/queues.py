"""The request queue of each sharing discipline, as a device worker serves it in real time: one
:class:`RequestQueue` class per simulator station (``sim.devices``), in :data:`QUEUES`, keyed by
:class:`~edgemux.cluster.workload.Discipline` (``queue_for``).

A queue holds the requests a :class:`~edgemux.runtime.dataplane.worker.DeviceWorker` accepted and has not yet
started, and says which go next: ``push`` a job, ``pop`` the next execution's jobs (or how long to wait for
one to be due), ``drain`` every job left. The worker keeps its threads (``threads`` of them), its lock (every
method is called under it) and its clock. Each class names the station it mirrors (``station``); where the
two differ, its docstring says how:

``fcfs`` (:class:`FcfsQueue`, ``FcfsStation``)
    One request at a time, in arrival order. Before a request whose model differs from the previous
    request's (and before the very first one: the device starts with no model loaded, as in the simulator)
    the worker pays the model-switch cost: it sleeps ``switch_ms(model)`` ms. For an emulated backend that
    sleep *is* the emulated parameter reload; for a real backend the switch costs whatever the backend
    really costs (cache misses, weight uploads) *plus* that sleep, so ``switch_ms`` should be left 0 for
    real devices unless the profile's switch cost is meant to be imposed on top.
``ps`` / ``mps`` (:class:`LimitedPsQueue`, ``LimitedPsStation``)
    Up to ``c = ceil(servers)`` executions at once (c threads taking requests in arrival order).
    *Difference*: the simulator's limited processor sharing serves all n present requests at rate
    ``min(1, c/n)`` each; here at most c run and the rest wait in FIFO order (an M/G/c queue rather than
    limited PS), and a fractional ``servers`` is rounded up. A real device slows concurrent executions
    down by itself; an emulated one runs its c sleeps side by side at full speed. No switch cost.
``gpu-timeshare`` (:class:`TimeshareQueue`, ``GpuTimeshareStation``)
    FIFO within an app, round robin across the apps that have work: one executing thread takes the head
    request of the next app in turn. *Approximation*: the simulator processor-shares the k active apps'
    head requests (each progresses at rate 1/k, all run together); here each request runs alone, in
    rotation. Throughput and the apps' fair share of the device are the same, and equal requests present
    together are served in the same rounds (every app with work one request); a single request's latency
    is not stretched by the others, they wait for their turn instead. No switch cost (as in the simulator: Ibis §3.3 treats GPU context switches as
    negligible).
``batch`` (:class:`BatchQueue`, ``BatchStation``)
    One queue per model. When the device is free, a model's queue is ready when it holds ``max_batch``
    requests or its oldest request has waited ``batch_timeout_ms``; among ready queues the one with the
    oldest head request goes, taking up to ``max_batch`` requests, executed as one ``Backend.run_batch``
    call on inputs concatenated along axis 0. The batch pays the model-switch cost when the previous batch
    ran another model, as in the simulator. While draining on ``close`` the queues go without waiting out
    the timeout.
``spatial`` (:class:`SpatialQueue`, ``SpatialStation``)
    Controlled spatial sharing (Dhakal et al. §IV): each app runs ``instances`` instances of its model, each
    holding ``share`` of the device (:class:`~edgemux.runtime.dataplane.instances.InstancePool`; on the
    real CPU an instance is an ONNX Runtime session with ``max(1, round(share * cores))`` intra-op threads,
    optionally sharing one copy of the weights; on an emulated device it sleeps the profile's time times
    ``perf.spatial.slowdown(share_curve, share)``). Per app one FIFO queue served by that app's instances:
    each takes the app's next request when free, and apps never wait for each other. The worker runs no
    thread for it: ``push`` hands the job to its app's instances. An app is set up and changed with
    :meth:`SpatialQueue.configure` (share, instances; a change is made with overlap by default: the new
    instances are built and warmed while the old ones serve), which refuses a share outside (0, 1] and
    instances holding more than the device (``perf.spatial.check_shares``). *Difference*: the simulator
    serves each spatial tenant as its own M/G/k queue whose service is the profile's time stretched by the
    share curve, with perfect isolation; here instances of different apps run side by side on real cores
    (or in emulated sleeps), so a real CPU's shared caches and memory bandwidth slow them down by whatever
    they really cost, and a share is rounded to whole threads. No switch cost.

Units: ``*_ms`` in milliseconds, ``*_s`` in seconds; clocks return seconds.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from edgemux.cluster.state import Device
from edgemux.cluster.workload import Arrival, Discipline, Tenant
from edgemux.perf.spatial import check_shares
from edgemux.profiles.distributions import Deterministic
from edgemux.runtime.dataplane.backends import Backend, BackendError, EmulatedBackend, OnnxRuntimeBackend
from edgemux.runtime.dataplane.instances import (
    EmulatedInstances,
    InstanceFactory,
    InstancePool,
    OrtInstances,
    PoolResult,
    Reconfiguration,
    SpatialConfigError,
    check_instances,
    check_share,
    threads_for,
)
from edgemux.runtime.dataplane.meter import DeviceMeter
from edgemux.sim.devices import BatchStation, FcfsStation, GpuTimeshareStation, LimitedPsStation, SpatialStation, Station

__all__ = [
    "Job",
    "QueueHost",
    "RequestQueue",
    "FcfsQueue",
    "LimitedPsQueue",
    "TimeshareQueue",
    "BatchQueue",
    "SpatialQueue",
    "QUEUES",
    "queue_for",
]


@dataclass(eq=False)  # identity semantics: inputs are arrays, which do not compare to a bool
class Job:
    """One accepted request: ``seq`` is its submission order (the oldest head has the lowest), ``items`` its
    leading-dimension size (1 for a model without a batch dimension), ``enqueued`` the worker's clock at
    submit (s); ``future`` resolves with its result."""

    seq: int
    app: str
    model: str
    inputs: Mapping[str, np.ndarray]
    items: int
    enqueued: float
    future: Future[Any] = field(default_factory=Future)


@dataclass(frozen=True)
class QueueHost:
    """What a queue may use of its worker: the backend, the worker's lock (a ``Condition``; held around every
    queue method) and clock (s), how switch and emulated times are slept, the CPU's cores, the seed of
    emulated instances, the worker's accounting (counting the executions that do not run on its threads) and
    its check that it is not closing (raises if it is)."""

    backend: Backend
    lock: threading.Condition
    clock: Callable[[], float]
    sleep: Callable[[float], None]
    cores: int
    seed: int
    meter: DeviceMeter
    check_open: Callable[[], None]


class RequestQueue:
    """The waiting requests of one device under its discipline (see the module docstring). ``queued`` counts
    the jobs waiting for the worker's threads; ``threads`` is how many threads the worker runs for it."""

    station: ClassVar[type[Station]]
    threads: int = 1

    def __init__(self, device: Device, host: QueueHost) -> None:
        self.device = device
        self.host = host
        self.queued = 0

    def push(self, job: Job) -> Future[PoolResult] | None:
        """Take ``job``: None when the worker's threads will ``pop`` it, else the future of the execution
        that took it elsewhere (spatial: the app's instances)."""
        raise NotImplementedError

    def pop(self, now: float, flush: bool) -> tuple[list[Job], float | None]:
        """The next execution's jobs at clock ``now`` (s), empty when none is due, and then how long to wait
        at most (s; None: until a push). ``flush``: draining, no reason to wait for more requests."""
        raise NotImplementedError

    def drain(self) -> list[Job]:
        """Every job still waiting, removed (the worker fails them)."""
        raise NotImplementedError

    def accepts(self, app: str, model: str) -> None:
        """Raise ``BackendError`` when this queue cannot take ``app``'s requests for ``model`` at all (checked
        before its capacity)."""

    def backlog(self) -> int:
        """Requests waiting to execute, wherever they wait (the bound ``max_queue`` applies to)."""
        return self.queued

    def parallel(self) -> int:
        """Executions that can run at once (the drain-time estimate divides by it)."""
        return self.threads

    def holders(self) -> list[str]:
        """Apps that hold a part of the device of their own (a switch-off must wait for them to leave)."""
        return []

    def describe(self) -> dict[str, Any]:
        """What this queue adds to the worker's stats."""
        return {}

    def close(self, drain: bool, timeout_s: float) -> bool:
        """Stop what serves this queue outside the worker's threads; True when it ended within ``timeout_s``."""
        return True


class FcfsQueue(RequestQueue):
    """fcfs: one FIFO queue over every app, one execution at a time."""

    station: ClassVar[type[Station]] = FcfsStation

    def __init__(self, device: Device, host: QueueHost) -> None:
        super().__init__(device, host)
        self._fifo: deque[Job] = deque()

    def push(self, job: Job) -> None:
        self._fifo.append(job)
        self.queued += 1
        return None

    def pop(self, now: float, flush: bool) -> tuple[list[Job], float | None]:
        if self._fifo:
            self.queued -= 1
            return [self._fifo.popleft()], None
        return [], None

    def drain(self) -> list[Job]:
        jobs = list(self._fifo)
        self._fifo.clear()
        self.queued = 0
        return jobs


class LimitedPsQueue(FcfsQueue):
    """ps, mps: one FIFO queue served by ``ceil(device.servers)`` threads at once."""

    station: ClassVar[type[Station]] = LimitedPsStation

    def __init__(self, device: Device, host: QueueHost) -> None:
        super().__init__(device, host)
        self.threads = math.ceil(device.servers)


class TimeshareQueue(RequestQueue):
    """gpu-timeshare: a FIFO queue per app; the apps with work take turns, one execution at a time."""

    station: ClassVar[type[Station]] = GpuTimeshareStation

    def __init__(self, device: Device, host: QueueHost) -> None:
        super().__init__(device, host)
        self._per_app: dict[str, deque[Job]] = {}
        self._turns: deque[str] = deque()  # apps with work, next turn first

    def push(self, job: Job) -> None:
        q = self._per_app.setdefault(job.app, deque())
        if not q:
            self._turns.append(job.app)  # the app gets a turn after those already waiting
        q.append(job)
        self.queued += 1
        return None

    def pop(self, now: float, flush: bool) -> tuple[list[Job], float | None]:
        if not self._turns:
            return [], None
        app = self._turns.popleft()
        q = self._per_app[app]
        job = q.popleft()
        if q:
            self._turns.append(app)  # round robin: back of the line for the app's next request
        else:
            del self._per_app[app]
        self.queued -= 1
        return [job], None

    def drain(self) -> list[Job]:
        jobs = [j for q in self._per_app.values() for j in q]
        self._per_app.clear()
        self._turns.clear()
        self.queued = 0
        return jobs


class BatchQueue(RequestQueue):
    """batch: a FIFO queue per model; batches of up to ``device.max_batch`` of one model's requests, when
    full or when the oldest has waited ``device.batch_timeout_ms``, oldest head first."""

    station: ClassVar[type[Station]] = BatchStation

    def __init__(self, device: Device, host: QueueHost) -> None:
        super().__init__(device, host)
        self._per_model: dict[str, deque[Job]] = {}
        self._timeout_s = max(0.0, device.batch_timeout_ms) / 1000.0
        self._max_batch = max(1, device.max_batch)

    def push(self, job: Job) -> None:
        self._per_model.setdefault(job.model, deque()).append(job)
        self.queued += 1
        return None

    def pop(self, now: float, flush: bool) -> tuple[list[Job], float | None]:
        best: deque[Job] | None = None
        next_ready = math.inf
        for q in self._per_model.values():
            if not q:
                continue
            deadline = q[0].enqueued + self._timeout_s
            if flush or len(q) >= self._max_batch or deadline <= now:
                if best is None or q[0].seq < best[0].seq:
                    best = q
            else:
                next_ready = min(next_ready, deadline)
        if best is None:
            return [], (max(0.0, next_ready - now) if next_ready < math.inf else None)
        jobs = [best.popleft() for _ in range(min(len(best), self._max_batch))]
        if not best:
            del self._per_model[jobs[0].model]
        self.queued -= len(jobs)
        return jobs, None

    def drain(self) -> list[Job]:
        jobs = [j for q in self._per_model.values() for j in q]
        self._per_model.clear()
        self.queued = 0
        return jobs


class SpatialQueue(RequestQueue):
    """spatial: per app a FIFO queue served by the app's own instances (an ``InstancePool``), which run on
    threads of their own; the worker runs none (``threads = 0``) and ``pop`` never has work."""

    station: ClassVar[type[Station]] = SpatialStation
    threads = 0

    def __init__(self, device: Device, host: QueueHost) -> None:
        super().__init__(device, host)
        self._pools: dict[str, InstancePool] = {}        # app -> its instances
        self._models: dict[str, str] = {}                # app -> the model its instances run
        self._configuring = threading.Lock()             # one configuration change at a time

    def push(self, job: Job) -> Future[PoolResult]:
        return self._pools[job.app].submit(job.inputs)   # ``accepts`` found the pool; PoolClosed after close

    def pop(self, now: float, flush: bool) -> tuple[list[Job], float | None]:
        return [], None

    def drain(self) -> list[Job]:
        return []   # requests wait in the pools, which ``close`` drains or fails

    def accepts(self, app: str, model: str) -> None:
        pool = self._pools.get(app)
        if pool is None or self._models.get(app) != model:
            what = (f"runs model {self._models[app]!r}, not {model!r}" if pool is not None
                    else "has no instances: configure_app first")
            raise BackendError(f"app {app!r} on spatial device {self.device.path} {what}", 409)

    def backlog(self) -> int:
        return sum(p.queued() for p in self._pools.values())

    def parallel(self) -> int:
        return max(1, sum(p.instances for p in self._pools.values()))

    def holders(self) -> list[str]:
        return sorted(self._pools)

    def describe(self) -> dict[str, Any]:
        return {"spatial": self.config()}

    def close(self, drain: bool, timeout_s: float) -> bool:
        with self._configuring:
            pools = list(self._pools.values())
        deadline = time.monotonic() + max(0.0, timeout_s)
        ok = True
        for pool in pools:
            ok = pool.close(drain=drain, timeout_s=max(0.0, deadline - time.monotonic())) and ok
        if not ok:
            for pool in pools:
                pool.close(drain=False, timeout_s=0.0)
        return ok

    def configure(self, app: str, model: str, *, share: float, instances: int = 1, overlap: bool = True,
                  shared_weights: bool = True) -> Reconfiguration | None:
        """Set (or change) ``app``'s instances on the device: ``instances`` instances of ``model``
        (loaded on the backend), each holding ``share`` of the device (in (0, 1]; on the real CPU
        ``max(1, round(share * cores))`` intra-op threads; on the ``cuda`` backend an MPS active-thread
        percentage, ``gpushare.CudaInstances``). ``shared_weights``: the app's instances share one copy of the
        weights (real CPU; taken when the app is first set up; on the GPU each instance has its own).

        A first call builds and warms the instances and returns None. A later call for the same app and model
        changes them with ``overlap`` (new instances built and warmed while the old ones serve, then an atomic
        switch) or without (stop, drain, rebuild: requests wait meanwhile) and returns the
        :class:`~edgemux.runtime.dataplane.instances.Reconfiguration`. No queued or running request is lost.

        Raises ``SpatialConfigError`` (400) for a share outside (0, 1], instances < 1, or when all apps'
        instances would hold more than the device (naming each holding); ``BackendError`` (409) when the app already runs another model (``remove_app`` it first);
        ``ModelNotFound`` (404) for a model the backend has not loaded; the worker's ``WorkerClosed`` (503)
        once it is closing."""
        share = check_share(share, where=f"app {app!r}: share")
        instances = check_instances(instances, where=f"app {app!r}: instances")
        backend, path, cores = self.host.backend, self.device.path, self.host.cores
        with self._configuring:
            self.host.check_open()   # under _configuring: a closing worker's close() sees every pool
            have = self._models.get(app)
            if have is not None and have != model:
                raise BackendError(f"app {app!r} runs model {have!r} on device {path}; remove it "
                                   f"before giving it model {model!r}", 409)
            holdings = {a: (p.share, p.instances) for a, p in self._pools.items()}
            holdings[app] = (share, instances)
            try:
                check_shares([Tenant(a, self._models.get(a, model), Arrival.poisson(0.0), Deterministic(1.0),
                                     share=s, instances=k) for a, (s, k) in sorted(holdings.items())],
                             where=f"device {path}")
            except ValueError as e:
                raise SpatialConfigError(str(e)) from None
            if backend.for_model(model).on_cpu_threads:  # the runtime of its format, on a real device
                # a real CPU holds whole threads: shares rounded up to one thread each can oversubscribe the
                # cores although the shares fit (two instances at 0.25 of 2 cores are two threads, not 0.5)
                threads = {a: threads_for(s, cores) * k for a, (s, k) in holdings.items()}
                if sum(threads.values()) > cores:
                    parts = ", ".join(f"{a} {n}" for a, n in sorted(threads.items()))
                    raise SpatialConfigError(f"device {path}: the instances need {sum(threads.values())}"
                                             f" intra-op threads on {cores} cores ({parts})")
            pool = self._pools.get(app)
            if pool is not None:
                return pool.reconfigure(share=share, instances=instances, overlap=overlap)
            pool = InstancePool(self._factory(model, shared_weights), share=share, instances=instances,
                                name=f"{path}:{app}", clock=self.host.clock, on_start=self._started,
                                on_end=self._ended)
            with self.host.lock:  # the worker's submit reads these under its lock
                self._pools[app] = pool
                self._models[app] = model
            return None

    def remove(self, app: str, drain: bool = True, timeout_s: float = 10.0) -> bool:
        """Release ``app``'s instances (see ``DeviceWorker.remove_app``)."""
        with self._configuring, self.host.lock:
            pool = self._pools.pop(app, None)
            self._models.pop(app, None)
        if pool is None:
            raise BackendError(f"app {app!r} has no instances on device {self.device.path}", 404)
        return pool.close(drain=drain, timeout_s=timeout_s)

    def config(self) -> dict[str, dict[str, Any]]:
        """Each app's instances (see ``DeviceWorker.spatial_config``)."""
        with self.host.lock:  # not _configuring: stats must not wait for a reconfiguration's build
            pools = dict(self._pools)
            models = dict(self._models)
        return {a: {"model": models[a], "share": p.share, "instances": p.instances, "threads": p.threads,
                    "held": p.share * p.instances, "queued": p.queued(), "inflight": p.inflight()}
                for a, p in sorted(pools.items())}

    def _started(self) -> None:
        with self.host.lock:
            self.host.meter.started(self.host.clock())

    def _ended(self, start: float, end: float) -> None:
        with self.host.lock:
            self.host.meter.ended(start, end, 1)

    def _factory(self, model: str, shared_weights: bool) -> InstanceFactory:
        source = self.host.backend.source(model)
        backend = self.host.backend.for_model(model)  # the runtime of its format, on a real device
        if isinstance(backend, OnnxRuntimeBackend) and backend.name == "cuda":
            # the GPU's share through MPS where its daemon runs, else concurrent streams (gpushare says which);
            # imported here: the CPU path never loads the CUDA one
            from edgemux.runtime.dataplane.gpushare import CudaInstances

            return CudaInstances(source.onnx_path(), seed=self.host.seed)
        if isinstance(backend, OnnxRuntimeBackend):
            return OrtInstances(source.onnx_path(), cores=self.host.cores, shared_weights=shared_weights,
                                providers=backend.providers)
        if backend.name == "litert" and backend.on_cpu_threads:
            from edgemux.runtime.dataplane.litert import LiteRTInstances

            return LiteRTInstances(source, cores=self.host.cores, seed=self.host.seed)
        if isinstance(backend, EmulatedBackend):
            info = backend.info(model)
            if source.profile is None:
                raise SpatialConfigError(f"emulated model {model!r} has no profile to emulate instances from")
            return EmulatedInstances(source.profile, inputs=info.inputs, outputs=info.outputs, seed=self.host.seed,
                                     sleep=self.host.sleep)
        raise SpatialConfigError(f"backend {backend.name} cannot run spatial instances (yet): model {model!r} "
                                 "runs on one shared instance under the time-sharing disciplines")


QUEUES: dict[Discipline, type[RequestQueue]] = {
    Discipline.FCFS: FcfsQueue,
    Discipline.PS: LimitedPsQueue,
    Discipline.GPU_TIMESHARE: TimeshareQueue,
    Discipline.MPS: LimitedPsQueue,
    Discipline.BATCH: BatchQueue,
    Discipline.SPATIAL: SpatialQueue,
}
"""The request queue of each discipline (the same station classes as ``sim.devices.STATIONS`` builds)."""


def queue_for(device: Device, host: QueueHost) -> RequestQueue:
    """The request queue of ``device``'s discipline."""
    return QUEUES[Discipline(device.discipline)](device, host)
