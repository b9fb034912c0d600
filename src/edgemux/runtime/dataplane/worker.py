"""Device workers: one per device, owning its threads and enforcing its sharing discipline in real time.

A :class:`DeviceWorker` takes requests (``submit``), queues them as the device's
:class:`~edgemux.cluster.workload.Discipline` says, executes them on a :class:`~edgemux.runtime.dataplane.backends.Backend`
and resolves each request's ``Future`` with a :class:`Result` (outputs and timing) or an explicit error: no
request is lost silently. The order is the discipline's request queue's (``runtime.dataplane.queues``, one
per discipline, each mirroring a simulator station of ``edgemux.sim.devices``) so that the simulator, the
emulated devices and the estimators agree about what a device does; the worker keeps the threads, the lock,
the clock, the model-switch costs (paid where the discipline ``pays_switch``: the worker sleeps
``switch_ms(model)`` ms before a request, or batch, of another model than the last) and the accounting.

Units: ``*_ms`` in milliseconds, ``*_s`` in seconds; ``clock`` returns seconds.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgemux.cluster.disciplines import traits
from edgemux.cluster.state import Device
from edgemux.cluster.workload import Discipline
from edgemux.errors import EdgemuxError
from edgemux.runtime.dataplane.backends import Backend, BackendError, ModelNotFound
from edgemux.runtime.dataplane.instances import (
    PoolClosed,
    PoolResult,
    Reconfiguration,
    SpatialConfigError,
    check_instances,
    cpu_cores,
)
from edgemux.runtime.dataplane.meter import AppStats, DeviceMeter
from edgemux.runtime.dataplane.queues import Job, QueueHost, SpatialQueue, queue_for

__all__ = ["AppStats", "DeviceWorker", "Overloaded", "Result", "WorkerClosed"]

DEFAULT_MAX_QUEUE = 1024
DEFAULT_WINDOW_S = 60.0


class Overloaded(EdgemuxError):
    """The device's queue is full: the request was not accepted. ``retry_after_s`` (seconds) estimates when
    the queue will have drained (queued requests x observed service time per request / servers); the agent
    answers 503 with a ``Retry-After`` header."""

    status = 503

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s


class DeviceOff(BackendError):
    """The device is switched off (status 503): it takes no request until it is switched on."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 503)


class WorkerClosed(BackendError):
    """The worker is closed (or closed before a queued request could run): status 503."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 503)


@dataclass(frozen=True)
class Result:
    """One request's outcome. ``queue_ms``: from ``submit`` to the start of its execution; ``service_ms``:
    the execution, model-switch included (``switch_ms`` of it); ``batch_size``: items executed together
    (the sum of the batch's requests' leading dimensions; 1 for a lone single-item request); ``device``:
    the device path; ``emulated``: True when the backend only emulated the device."""

    outputs: dict[str, np.ndarray]
    queue_ms: float
    service_ms: float
    batch_size: int
    device: str
    emulated: bool
    switch_ms: float = 0.0

    @property
    def latency_ms(self) -> float:
        """Time on the device: queueing plus service (ms)."""
        return self.queue_ms + self.service_ms


class DeviceWorker:
    """Executes one device's requests under its sharing discipline (see the module docstring).

    ``switch_ms(model)`` gives the model-switch cost in ms paid by the sequential disciplines (default: the
    loaded model's ``ModelInfo.switch_ms``, i.e. its profile's). ``max_queue`` bounds the requests waiting
    (not yet executing) over all queues. ``window_s`` is the utilization window. ``sleep`` is how the
    switch cost is spent (seconds; injectable for tests). With ``start=False`` the threads start on
    ``start()`` (requests can be queued before, e.g. while models warm up).

    On a ``spatial`` device each app must be set up with :meth:`configure_app` before its requests are
    accepted; its instances serve at once (``start`` does not apply to them). ``cores`` is the CPU's cores
    that shares are fractions of (default: this process's CPU affinity); ``seed`` seeds emulated instances.
    """

    def __init__(
        self,
        device: Device,
        backend: Backend,
        *,
        clock: Callable[[], float] = time.monotonic,
        switch_ms: Callable[[str], float] | None = None,
        max_queue: int = DEFAULT_MAX_QUEUE,
        window_s: float = DEFAULT_WINDOW_S,
        sleep: Callable[[float], None] = time.sleep,
        start: bool = True,
        cores: int | None = None,
        seed: int = 0,
    ) -> None:
        if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 1:
            raise ValueError(f"max_queue must be a positive int, got {max_queue!r}")
        if not (window_s > 0 and math.isfinite(window_s)):
            raise ValueError(f"window_s must be a finite number > 0 s, got {window_s!r}")
        self.device = device
        self.backend = backend
        self.discipline = Discipline(device.discipline)
        self.max_queue = max_queue
        self.window_s = float(window_s)
        self._clock = clock
        self._sleep = sleep
        self._switch_ms = switch_ms if switch_ms is not None else self._profile_switch_ms
        self.cores = cpu_cores() if cores is None else check_instances(cores, where="cores")
        row = traits(self.discipline)
        self._pays_switch = row.pays_switch   # sequential: one model loaded, a switch before another's request
        self._batches = row.batches

        self._cv = threading.Condition()
        self._meter = DeviceMeter(device.kind.value, self.window_s, clock())   # accounting, under _cv
        self.power = self._meter.power
        self._queue = queue_for(device, QueueHost(backend, self._cv, clock, sleep, self.cores, seed, self._meter,
                                                  self._check_open))
        # parallel executions on the worker's threads (a spatial queue's instances run on their own: one)
        self.servers = max(1, self._queue.threads)
        self._seq = 0
        self._closing = False
        self._drain = True
        self._threads: list[threading.Thread] = []
        self._started = False
        # touched only by the single thread of a sequential discipline: the last model run, and what the device
        # kept loaded for it (its co-compiled set, else itself), looked up only when the model changes
        self._last_model: str | None = None
        self._last_loaded: str | None = None
        if start:
            self.start()

    # -- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the executing threads (idempotent)."""
        with self._cv:
            if self._started:
                return
            self._started = True
            for i in range(self._queue.threads):
                t = threading.Thread(target=self._loop, name=f"edgemux-worker-{self.device.path}-{i}", daemon=True)
                self._threads.append(t)
        for t in self._threads:
            t.start()

    def close(self, drain: bool = True, timeout_s: float = 10.0) -> bool:
        """Stop accepting requests and stop the threads; True when every thread ended within ``timeout_s``.

        ``drain=True`` executes what is queued first (a worker never started is started to do so);
        ``drain=False`` fails every queued request's future with ``WorkerClosed`` at once, and only the
        executions already in flight finish. Requests still queued when ``timeout_s`` runs out are failed
        with ``WorkerClosed`` too; an execution stuck in the backend cannot be interrupted: its thread (a
        daemon) resolves its future whenever the backend returns.
        """
        with self._cv:
            self._closing = True
            if not drain:
                self._drain = False
            dropped = self._queue.drain() if not self._drain else []
            self._cv.notify_all()
            never_started = not self._started
        self._fail(dropped, f"device worker {self.device.path} closed before the request ran")
        if not self._queue.threads:   # served on threads of its own (spatial instances): it closes them
            return self._queue.close(drain, timeout_s)
        if never_started:
            if self._drain:
                self.start()
            else:
                return True
        deadline = time.monotonic() + max(0.0, timeout_s)
        me = threading.current_thread()  # close() from a future's callback runs on a worker thread
        others = [t for t in self._threads if t is not me]
        for t in others:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = any(t.is_alive() for t in others)
        if alive:
            with self._cv:
                self._drain = False
                dropped = self._queue.drain()
                self._cv.notify_all()
            self._fail(dropped, f"device worker {self.device.path} did not drain within {timeout_s} s")
        return not alive

    def __enter__(self) -> DeviceWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closing

    # -- requests --------------------------------------------------------------------------------------

    def submit(self, app: str, model: str, inputs: Mapping[str, np.ndarray]) -> Future[Result]:
        """Queue one request of ``app`` for ``model``; the future resolves with a :class:`Result` or an error.

        Raises at once (the request is not queued): ``ModelNotFound`` (404) for a model the backend has not
        loaded, ``InvalidInput`` (400) for inputs that do not match the model, ``Overloaded`` when
        ``max_queue`` requests are waiting, ``WorkerClosed`` (503) after ``close``.
        """
        with self._cv:
            stats = self._meter.app(app)
            stats.requests += 1
            if self._closing:
                stats.rejected += 1
                raise WorkerClosed(f"device worker {self.device.path} is closed")
            if self._meter.off:
                stats.rejected += 1
                raise DeviceOff(f"device {self.device.path} is switched off")
        try:
            # validated before queueing: a bad request fails alone, never a whole batch later
            items = self.backend.check_inputs(model, inputs)
        except BackendError as e:
            with self._cv:
                stats.failed += 1
            if e.status == 404:
                raise ModelNotFound(f"{e.message} (device {self.device.path})") from None
            raise
        with self._cv:
            if self._closing:
                stats.rejected += 1
                raise WorkerClosed(f"device worker {self.device.path} is closed")
            try:
                self._queue.accepts(app, model)
            except BackendError:
                stats.failed += 1
                raise
            waiting = self._queue.backlog()
            if waiting >= self.max_queue:
                stats.rejected += 1
                retry = self._meter.retry_after(waiting, self._queue.parallel())
                raise Overloaded(f"device {self.device.path} has {waiting} requests queued (max_queue "
                                 f"{self.max_queue}); retry after {retry:.3f} s", retry)
            job = Job(self._seq, app, model, inputs, items, self._clock())
            self._seq += 1
            try:
                inner = self._queue.push(job)
            except PoolClosed as e:
                stats.rejected += 1
                raise WorkerClosed(f"device worker {self.device.path}: {e.message}") from None
            self._cv.notify()
        if inner is not None:
            # outside the lock: a request already done runs the callback here, and it resolves job.future
            inner.add_done_callback(lambda f: self._instance_done(job, f))
        return job.future

    def infer(self, app: str, model: str, inputs: Mapping[str, np.ndarray], timeout_s: float | None = None) -> Result:
        """``submit`` and wait for the result (seconds; None waits forever)."""
        return self.submit(app, model, inputs).result(timeout_s)

    # -- statistics ------------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Plain values for metrics: queue and in-flight counts, executions, switches, busy time (s) and
        utilization (fraction of the last ``window_s`` seconds with at least one execution in flight, the
        simulator's busy periods), loaded models and per-app counters (see :class:`AppStats`)."""
        loaded = sorted(self.backend.loaded())
        with self._cv:
            now = self._clock()
            m = self._meter
            utilization = m.utilization(now)
            return {
                "device": self.device.path,
                "kind": self.device.kind.value,
                "discipline": self.discipline.value,
                "backend": self.backend.name,
                "emulated": self.backend.emulated,
                "servers": self.servers,
                "max_queue": self.max_queue,
                "queued": self._queue.queued,
                "inflight": m.inflight,
                "max_inflight": m.max_inflight,
                "executions": m.executions,
                "switches": m.switches,
                "busy_s": m.busy_s(now),
                "window_s": self.window_s,
                "utilization": utilization,
                "loaded_models": loaded,
                "closed": self._closing,
                "power_state": "off" if m.off else "on",
                **m.energy(now, utilization),
                "apps": {a: s.as_dict() for a, s in sorted(m.apps.items())},
                **self._queue.describe(),
            }

    # -- power -----------------------------------------------------------------------------------------

    @property
    def power_state(self) -> str:
        """``on`` or ``off``."""
        return "off" if self._meter.off else "on"

    def set_power(self, state: str) -> str:
        """Switch the device ``off`` or ``on``; returns the state. Switching off refuses (``BackendError``
        409) while the device holds a loaded model or queued work: its tenants are moved off first (the
        consolidation planner's rule), so nothing is ever lost to a switch-off. ``BackendError`` (400) for any
        other state."""
        if state not in ("on", "off"):
            raise BackendError(f"power state must be 'on' or 'off', got {state!r}", 400)
        loaded = sorted(self.backend.loaded())
        with self._cv:
            if state == "off" and not self._meter.off:
                held = loaded + self._queue.holders()
                if held or self._queue.queued or self._meter.inflight:
                    what = (f"models {', '.join(held)}" if held else
                            f"{self._queue.queued} queued and {self._meter.inflight} running requests")
                    raise BackendError(f"device {self.device.path} still holds {what}: move its tenants off "
                                       "before switching it off", 409)
            if (state == "off") != self._meter.off:
                self._meter.switch(state == "off", self._clock())
            return "off" if self._meter.off else "on"

    @property
    def max_inflight(self) -> int:
        """The most executions that were ever in flight at once."""
        return self._meter.max_inflight

    # -- spatial sharing -------------------------------------------------------------------------------

    def configure_app(self, app: str, model: str, *, share: float, instances: int = 1, overlap: bool = True,
                      shared_weights: bool = True) -> Reconfiguration | None:
        """Set (or change) ``app``'s instances on this ``spatial`` device (``SpatialQueue.configure`` says how
        and what it raises); ``SpatialConfigError`` (400) on a device that is not ``spatial``."""
        return self._spatial_queue().configure(app, model, share=share, instances=instances, overlap=overlap,
                                               shared_weights=shared_weights)

    def remove_app(self, app: str, drain: bool = True, timeout_s: float = 10.0) -> bool:
        """Release ``app``'s instances on a spatial device (its queued requests run first when ``drain``);
        True when they ended within ``timeout_s`` (seconds). ``BackendError`` (404) for an app without any."""
        if not isinstance(self._queue, SpatialQueue):
            raise BackendError(f"app {app!r} has no instances on device {self.device.path}", 404)
        return self._queue.remove(app, drain, timeout_s)

    def spatial_config(self) -> dict[str, dict[str, Any]]:
        """Each app's instances on a spatial device: model, share, instances, threads per instance (0 when
        emulated), queued and in-flight requests, and the held fraction of the device (share x instances)."""
        return self._queue.config() if isinstance(self._queue, SpatialQueue) else {}

    def _spatial_queue(self) -> SpatialQueue:
        if not isinstance(self._queue, SpatialQueue):
            raise SpatialConfigError(f"device {self.device.path} runs discipline {self.discipline.value}, "
                                     "not spatial: it has no per-app instances to configure")
        return self._queue

    def _check_open(self) -> None:
        if self._closing:
            raise WorkerClosed(f"device worker {self.device.path} is closed")

    def _instance_done(self, job: Job, inner: Future[PoolResult]) -> None:
        error = inner.exception()
        with self._cv:
            s = self._meter.apps[job.app]
            if error is None:
                r = inner.result()
                s.complete(r.queue_ms, r.service_ms)
            else:
                s.failed += 1
        if not job.future.set_running_or_notify_cancel():
            return
        if error is not None:
            if isinstance(error, PoolClosed):
                error = WorkerClosed(f"device worker {self.device.path} closed before the request ran")
            job.future.set_exception(error)
        else:
            r = inner.result()
            job.future.set_result(Result(r.outputs, r.queue_ms, r.service_ms, job.items, self.device.path,
                                         self.backend.emulated))

    # -- internals -------------------------------------------------------------------------------------

    def _fail(self, jobs: list[Job], message: str) -> None:
        if not jobs:
            return
        with self._cv:
            for j in jobs:
                self._meter.apps[j.app].failed += 1
        for j in jobs:
            if j.future.set_running_or_notify_cancel():
                j.future.set_exception(WorkerClosed(message))

    def _loop(self) -> None:
        while True:
            jobs = self._take()
            if jobs is None:
                return
            self._run(jobs)

    def _take(self) -> list[Job] | None:
        """Block until an execution is due; None when the thread should end."""
        with self._cv:
            while True:
                if self._closing and not self._drain:
                    return None
                jobs, wait_s = self._queue.pop(self._clock(), self._closing)
                if jobs:
                    # a future the client cancelled while queued is dropped here, never executed
                    live = []
                    for j in jobs:
                        if j.future.set_running_or_notify_cancel():
                            live.append(j)
                        else:
                            self._meter.apps[j.app].failed += 1
                    if not live:
                        continue
                    self._meter.started(self._clock())
                    return live
                if self._closing and self._queue.queued == 0:
                    self._cv.notify_all()  # wake the other threads of a pool so they end too
                    return None
                self._cv.wait(wait_s)

    def _run(self, jobs: list[Job]) -> None:
        model = jobs[0].model
        start = self._clock()
        switch = 0.0
        error: BaseException | None = None
        outputs: list[dict[str, np.ndarray]] = []
        try:
            if self._pays_switch and model != self._last_model:
                self._last_model = model
                loaded = self._loaded_for(model)
                if loaded != self._last_loaded:
                    self._last_loaded = loaded
                    cost = float(self._switch_ms(model))
                    with self._cv:
                        self._meter.switches += 1
                    if cost > 0:
                        self._sleep(cost / 1000.0)
                        switch = (self._clock() - start) * 1000.0
            if self._batches:
                outputs = self.backend.run_batch(model, [j.inputs for j in jobs])
            else:
                outputs = [self.backend.run(model, jobs[0].inputs)]
        except BackendError as e:
            error = e
        except Exception as e:  # anything else from a backend is its failure, reported as a 500
            error = BackendError(f"model '{model}' failed on device {self.device.path}: {e}", 500)
            error.__cause__ = e
        end = self._clock()
        service_ms = (end - start) * 1000.0
        items = sum(j.items for j in jobs)
        with self._cv:
            self._meter.ended(start, end, len(jobs))
            for j in jobs:
                s = self._meter.apps[j.app]
                if error is None:
                    s.complete((start - j.enqueued) * 1000.0, service_ms)
                else:
                    s.failed += 1
        # resolve outside the lock: future callbacks run in this thread and may call back into the worker
        for j, out in zip(jobs, outputs if error is None else [None] * len(jobs)):
            if error is not None:
                j.future.set_exception(error)
            else:
                assert out is not None
                j.future.set_result(Result(out, (start - j.enqueued) * 1000.0, service_ms, items, self.device.path,
                                           self.backend.emulated, switch))

    def _loaded_for(self, model: str) -> str:
        """What the device keeps loaded for ``model``: its co-compiled set (``ModelInfo.params``: members
        reload nothing between each other), else the model."""
        try:
            return self.backend.info(model).params or model
        except ModelNotFound:
            return model

    def _profile_switch_ms(self, model: str) -> float:
        try:
            return self.backend.info(model).switch_ms
        except BackendError:
            return 0.0  # unloaded meanwhile: the run itself reports the 404
