"""Device workers: one per device, owning its threads and enforcing its sharing discipline in real time.

A :class:`DeviceWorker` takes requests (``submit``), queues them as the device's
:class:`~edgemux.cluster.workload.Discipline` says, executes them on a :class:`~edgemux.runtime.dataplane.backends.Backend`
and resolves each request's ``Future`` with a :class:`Result` (outputs and timing) or an explicit error: no
request is lost silently. The disciplines follow the simulator's stations (``edgemux.sim.devices``) so that
the simulator, the emulated devices and the estimators agree about what a device does:

``fcfs``
    One request at a time, in arrival order. Before a request whose model differs from the previous
    request's (and before the very first one: the device starts with no model loaded, as in the simulator)
    the worker pays the model-switch cost: it sleeps ``switch_ms(model)`` ms. For an emulated backend that
    sleep *is* the emulated parameter reload; for a real backend the switch costs whatever the backend
    really costs (cache misses, weight uploads) *plus* that sleep, so ``switch_ms`` should be left 0 for
    real devices unless the profile's switch cost is meant to be imposed on top.
``gpu-timeshare``
    FIFO within an app, round robin across the apps that have work: one executing thread takes the head
    request of the next app in turn. *Approximation*: the simulator processor-shares the k active apps'
    head requests (each progresses at rate 1/k, all run together); here each request runs alone, in
    rotation. Throughput and the apps' fair share of the device are the same; a single request's latency
    is not stretched by the others, they wait for their turn instead. No switch cost (as in the simulator:
    Ibis §3.3 treats GPU context switches as negligible).
``ps`` / ``mps``
    Up to ``c = ceil(servers)`` executions at once (c threads taking requests in arrival order).
    *Difference*: the simulator's limited processor sharing serves all n present requests at rate
    ``min(1, c/n)`` each; here at most c run and the rest wait in FIFO order (an M/G/c queue rather than
    limited PS), and a fractional ``servers`` is rounded up. A real device slows concurrent executions
    down by itself; an emulated one runs its c sleeps side by side at full speed. No switch cost.
``batch``
    One queue per model. When the device is free, a model's queue is ready when it holds ``max_batch``
    requests or its oldest request has waited ``batch_timeout_ms``; among ready queues the one with the
    oldest head request goes, taking up to ``max_batch`` requests, executed as one ``Backend.run_batch``
    call on inputs concatenated along axis 0. The batch pays the model-switch cost when the previous batch
    ran another model, as in the simulator. While draining on ``close`` the queues go without waiting out
    the timeout.
``spatial``
    Controlled spatial sharing (Dhakal et al. §IV): each app runs ``instances`` instances of its model, each
    holding ``share`` of the device (:class:`~edgemux.runtime.dataplane.instances.InstancePool`; on the
    real CPU an instance is an ONNX Runtime session with ``max(1, round(share * cores))`` intra-op threads,
    optionally sharing one copy of the weights; on an emulated device it sleeps the profile's time times
    ``perf.spatial.slowdown(share_curve, share)``). Per app one FIFO queue served by that app's instances:
    each takes the app's next request when free, and apps never wait for each other. An app is set up and
    changed with :meth:`DeviceWorker.configure_app` (share, instances; a change is made with overlap by
    default: the new instances are built and warmed while the old ones serve), which refuses a share outside
    (0, 1] and instances holding more than the device (``perf.spatial.check_shares``). *Difference*: the
    simulator serves each spatial tenant as its own M/G/k queue whose service is the profile's time
    stretched by the share curve, with perfect isolation; here instances of different apps run side by side
    on real cores (or in emulated sleeps), so a real CPU's shared caches and memory bandwidth slow them down
    by whatever they really cost, and a share is rounded to whole threads. No switch cost.

Units: ``*_ms`` in milliseconds, ``*_s`` in seconds; ``clock`` returns seconds.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgemux.cluster.state import Device
from edgemux.cluster.workload import Arrival, Discipline, Tenant
from edgemux.errors import EdgemuxError
from edgemux.perf.spatial import check_shares
from edgemux.profiles.distributions import Deterministic
from edgemux.profiles.power import device_power
from edgemux.runtime.dataplane.backends import Backend, BackendError, EmulatedBackend, ModelNotFound, OnnxRuntimeBackend
from edgemux.runtime.dataplane.instances import (
    EmulatedInstances,
    InstanceFactory,
    InstancePool,
    OrtInstances,
    PoolClosed,
    PoolResult,
    Reconfiguration,
    SpatialConfigError,
    check_instances,
    check_share,
    cpu_cores,
    threads_for,
)

__all__ = ["AppStats", "DeviceWorker", "Overloaded", "Result", "WorkerClosed"]

DEFAULT_MAX_QUEUE = 1024
DEFAULT_WINDOW_S = 60.0
# Before any request has finished there is no observed service time to estimate a queue's drain time
# from; 1 ms per queued request is a short, honest "try again soon".
_UNOBSERVED_SERVICE_S = 0.001


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


@dataclass
class AppStats:
    """Per-app counters. ``requests`` counts every ``submit``; each ends as ``completed``, ``failed`` (bad
    input, unknown model, backend error, cancelled or dropped at close) or ``rejected`` (queue full, worker
    closed), or is still pending. Times are sums over completed requests, in ms."""

    requests: int = 0
    completed: int = 0
    failed: int = 0
    rejected: int = 0
    latency_ms_total: float = 0.0
    queue_ms_total: float = 0.0
    service_ms_total: float = 0.0

    def as_dict(self) -> dict[str, float | int]:
        n = self.completed
        return {
            "requests": self.requests, "completed": n, "failed": self.failed, "rejected": self.rejected,
            "latency_ms_total": self.latency_ms_total, "queue_ms_total": self.queue_ms_total,
            "service_ms_total": self.service_ms_total,
            "latency_ms_mean": self.latency_ms_total / n if n else 0.0,
            "queue_ms_mean": self.queue_ms_total / n if n else 0.0,
            "service_ms_mean": self.service_ms_total / n if n else 0.0,
        }


@dataclass(eq=False)  # identity semantics: inputs are arrays, which do not compare to a bool
class _Job:
    seq: int          # submission order: the oldest head has the lowest seq
    app: str
    model: str
    inputs: Mapping[str, np.ndarray]
    items: int        # leading-dimension size (1 for a model without a batch dimension)
    enqueued: float   # clock() at submit, s
    future: Future[Result] = field(default_factory=Future)


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
        # c parallel executions for ps/mps; the other disciplines are sequential (one thread)
        self.servers = math.ceil(device.servers) if self.discipline in (Discipline.PS, Discipline.MPS) else 1
        # spatial: each app's instance pool has its own threads; the worker runs none
        self._spatial = self.discipline is Discipline.SPATIAL
        self.cores = cpu_cores() if cores is None else check_instances(cores, where="cores")
        self._seed = seed
        self._pools: dict[str, InstancePool] = {}        # spatial: app -> its instances
        self._pool_models: dict[str, str] = {}           # spatial: app -> the model its instances run
        self._configuring = threading.Lock()             # spatial: one configuration change at a time
        self._sequential = self.discipline in (Discipline.FCFS, Discipline.BATCH)  # they pay switch costs
        self._batch_timeout_s = max(0.0, device.batch_timeout_ms) / 1000.0
        self._max_batch = max(1, device.max_batch)

        self._cv = threading.Condition()
        self._fifo: deque[_Job] = deque()                # fcfs, ps, mps
        self._per_app: dict[str, deque[_Job]] = {}       # gpu-timeshare: FIFO per app
        self._turns: deque[str] = deque()                # gpu-timeshare: apps with work, next turn first
        self._per_model: dict[str, deque[_Job]] = {}     # batch: FIFO per model
        self._queued = 0
        self._seq = 0
        self._closing = False
        self._drain = True
        self._threads: list[threading.Thread] = []
        self._started = False
        self._last_model: str | None = None  # touched only by the single thread of a sequential discipline

        # accounting (under _cv)
        self._apps: dict[str, AppStats] = {}
        self._inflight = 0
        self.max_inflight = 0
        self._executions = 0       # backend calls (a batch is one)
        self._executed_requests = 0
        self._occupied_s = 0.0     # sum of execution durations, for the drain-time estimate
        self._switches = 0
        self._created = clock()
        self._busy_since: float | None = None
        self._busy_total_s = 0.0
        self._busy_periods: deque[tuple[float, float]] = deque()  # closed busy periods within the window
        # power (cluster.power's states): modelled from the device kind's figures where there are some
        self.power = device_power(self.device.kind.value)
        self._off = False
        self._on_s = 0.0                  # seconds spent on before the current on period
        self._on_since: float | None = self._created
        if start:
            self.start()

    # -- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the executing threads (idempotent)."""
        with self._cv:
            if self._started:
                return
            self._started = True
            for i in range(0 if self._spatial else self.servers):
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
            dropped = self._take_all_locked() if not self._drain else []
            self._cv.notify_all()
            never_started = not self._started
        self._fail(dropped, f"device worker {self.device.path} closed before the request ran")
        if self._spatial:
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
                dropped = self._take_all_locked()
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
            stats = self._app_locked(app)
            stats.requests += 1
            if self._closing:
                stats.rejected += 1
                raise WorkerClosed(f"device worker {self.device.path} is closed")
            if self._off:
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
            if self._queued >= self.max_queue:
                stats.rejected += 1
                retry = self._retry_after_locked()
                raise Overloaded(f"device {self.device.path} has {self._queued} requests queued (max_queue "
                                 f"{self.max_queue}); retry after {retry:.3f} s", retry)
            job = _Job(self._seq, app, model, inputs, items, self._clock())
            self._seq += 1
            if self._spatial:
                inner = self._submit_spatial_locked(job, stats)
            else:
                self._enqueue_locked(job)
                self._queued += 1
                self._cv.notify()
        if self._spatial:
            # outside the lock: a request already done runs the callback here, and it resolves job.future
            inner.add_done_callback(lambda f: self._spatial_done(job, f))
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
            self._prune_locked(now)
            start = now - self.window_s
            busy = sum(min(e, now) - max(s, start) for s, e in self._busy_periods if e > start)
            if self._busy_since is not None:
                busy += now - max(self._busy_since, start)
            span = min(self.window_s, now - self._created)
            return {
                "device": self.device.path,
                "kind": self.device.kind.value,
                "discipline": self.discipline.value,
                "backend": self.backend.name,
                "emulated": self.backend.emulated,
                "servers": self.servers,
                "max_queue": self.max_queue,
                "queued": self._queued,
                "inflight": self._inflight,
                "max_inflight": self.max_inflight,
                "executions": self._executions,
                "switches": self._switches,
                "busy_s": self._busy_total_s + (now - self._busy_since if self._busy_since is not None else 0.0),
                "window_s": self.window_s,
                "utilization": min(1.0, busy / span) if span > 0 else 0.0,
                "loaded_models": loaded,
                "closed": self._closing,
                "power_state": "off" if self._off else "on",
                **self._power_locked(now, min(1.0, busy / span) if span > 0 else 0.0),
                "apps": {a: s.as_dict() for a, s in sorted(self._apps.items())},
                **({"spatial": self.spatial_config()} if self._spatial else {}),
            }

    # -- power -----------------------------------------------------------------------------------------

    @property
    def power_state(self) -> str:
        """``on`` or ``off``."""
        return "off" if self._off else "on"

    def set_power(self, state: str) -> str:
        """Switch the device ``off`` or ``on``; returns the state. Switching off refuses (``BackendError``
        409) while the device holds a loaded model or queued work: its tenants are moved off first (the
        consolidation planner's rule), so nothing is ever lost to a switch-off. ``BackendError`` (400) for any
        other state."""
        if state not in ("on", "off"):
            raise BackendError(f"power state must be 'on' or 'off', got {state!r}", 400)
        loaded = sorted(self.backend.loaded())
        with self._cv:
            if state == "off" and not self._off:
                held = loaded + sorted(self._pools)
                if held or self._queued or self._inflight:
                    what = (f"models {', '.join(held)}" if held else
                            f"{self._queued} queued and {self._inflight} running requests")
                    raise BackendError(f"device {self.device.path} still holds {what}: move its tenants off "
                                       "before switching it off", 409)
                now = self._clock()
                if self._on_since is not None:
                    self._on_s += now - self._on_since
                self._on_since = None
                self._off = True
            elif state == "on" and self._off:
                self._on_since = self._clock()
                self._off = False
            return "off" if self._off else "on"

    def _power_locked(self, now: float, utilization: float) -> dict[str, Any]:
        """The modelled power (W) now and energy (J) so far, per app its dynamic share (J); {} without figures."""
        if self.power is None:
            return {}
        on_s = self._on_s + (now - self._on_since if self._on_since is not None else 0.0)
        busy_s = self._busy_total_s + (now - self._busy_since if self._busy_since is not None else 0.0)
        dyn = self.power.active_w - self.power.idle_w
        return {"power_w": 0.0 if self._off else self.power.at(utilization),
                "energy_j": self.power.idle_w * on_s + dyn * busy_s,
                "app_energy_j": {a: dyn * st.service_ms_total / 1000.0 for a, st in sorted(self._apps.items())},
                "power_source": self.power.source}

    # -- spatial sharing -------------------------------------------------------------------------------

    def configure_app(self, app: str, model: str, *, share: float, instances: int = 1, overlap: bool = True,
                      shared_weights: bool = True) -> Reconfiguration | None:
        """Set (or change) ``app``'s instances on this ``spatial`` device: ``instances`` instances of ``model``
        (loaded on the backend), each holding ``share`` of the device (in (0, 1]; on the real CPU
        ``max(1, round(share * cores))`` intra-op threads; on the ``cuda`` backend an MPS active-thread
        percentage, ``gpushare.CudaInstances``). ``shared_weights``: the app's instances share one copy of the
        weights (real CPU; taken when the app is first set up; on the GPU each instance has its own).

        A first call builds and warms the instances and returns None. A later call for the same app and model
        changes them with ``overlap`` (new instances built and warmed while the old ones serve, then an atomic
        switch) or without (stop, drain, rebuild: requests wait meanwhile) and returns the
        :class:`~edgemux.runtime.dataplane.instances.Reconfiguration`. No queued or running request is lost.

        Raises ``SpatialConfigError`` (400) on a device that is not ``spatial``, a share outside (0, 1],
        instances < 1, or when all apps' instances would hold more than the device (naming each holding);
        ``BackendError`` (409) when the app already runs another model (``remove_app`` it first);
        ``ModelNotFound`` (404) for a model the backend has not loaded."""
        if not self._spatial:
            raise SpatialConfigError(f"device {self.device.path} runs discipline {self.discipline.value}, "
                                     "not spatial: it has no per-app instances to configure")
        share = check_share(share, where=f"app {app!r}: share")
        instances = check_instances(instances, where=f"app {app!r}: instances")
        with self._configuring:
            if self._closing:
                raise WorkerClosed(f"device worker {self.device.path} is closed")
            have = self._pool_models.get(app)
            if have is not None and have != model:
                raise BackendError(f"app {app!r} runs model {have!r} on device {self.device.path}; remove it "
                                   f"before giving it model {model!r}", 409)
            holdings = {a: (p.share, p.instances) for a, p in self._pools.items()}
            holdings[app] = (share, instances)
            try:
                check_shares([Tenant(a, self._pool_models.get(a, model), Arrival.poisson(0.0), Deterministic(1.0),
                                     share=s, instances=k) for a, (s, k) in sorted(holdings.items())],
                             where=f"device {self.device.path}")
            except ValueError as e:
                raise SpatialConfigError(str(e)) from None
            if isinstance(self.backend, OnnxRuntimeBackend) and self.backend.name != "cuda":
                # a real CPU holds whole threads: shares rounded up to one thread each can oversubscribe the
                # cores although the shares fit (two instances at 0.25 of 2 cores are two threads, not 0.5)
                threads = {a: threads_for(s, self.cores) * k for a, (s, k) in holdings.items()}
                if sum(threads.values()) > self.cores:
                    parts = ", ".join(f"{a} {n}" for a, n in sorted(threads.items()))
                    raise SpatialConfigError(f"device {self.device.path}: the instances need {sum(threads.values())}"
                                             f" intra-op threads on {self.cores} cores ({parts})")
            pool = self._pools.get(app)
            if pool is not None:
                return pool.reconfigure(share=share, instances=instances, overlap=overlap)
            factory = self._factory(model, shared_weights)
            pool = InstancePool(factory, share=share, instances=instances, name=f"{self.device.path}:{app}",
                                clock=self._clock, on_start=self._spatial_started, on_end=self._spatial_ended)
            with self._cv:  # submit reads these under _cv
                self._pools[app] = pool
                self._pool_models[app] = model
            return None

    def remove_app(self, app: str, drain: bool = True, timeout_s: float = 10.0) -> bool:
        """Release ``app``'s instances on a spatial device (its queued requests run first when ``drain``);
        True when they ended within ``timeout_s`` (seconds). ``BackendError`` (404) for an app without any."""
        with self._configuring, self._cv:
            pool = self._pools.pop(app, None)
            self._pool_models.pop(app, None)
        if pool is None:
            raise BackendError(f"app {app!r} has no instances on device {self.device.path}", 404)
        return pool.close(drain=drain, timeout_s=timeout_s)

    def spatial_config(self) -> dict[str, dict[str, Any]]:
        """Each app's instances on a spatial device: model, share, instances, threads per instance (0 when
        emulated), queued and in-flight requests, and the held fraction of the device (share x instances)."""
        with self._cv:  # not _configuring: stats must not wait for a reconfiguration's build
            pools = dict(self._pools)
            models = dict(self._pool_models)
        return {a: {"model": models[a], "share": p.share, "instances": p.instances, "threads": p.threads,
                    "held": p.share * p.instances, "queued": p.queued(), "inflight": p.inflight()}
                for a, p in sorted(pools.items())}

    def _factory(self, model: str, shared_weights: bool) -> InstanceFactory:
        source = self.backend.source(model)
        if isinstance(self.backend, OnnxRuntimeBackend) and self.backend.name == "cuda":
            # the GPU's share through MPS where its daemon runs, else concurrent streams (gpushare says which);
            # imported here: the CPU path never loads the CUDA one
            from edgemux.runtime.dataplane.gpushare import CudaInstances

            return CudaInstances(source.onnx_path(), seed=self._seed)
        if isinstance(self.backend, OnnxRuntimeBackend):
            return OrtInstances(source.onnx_path(), cores=self.cores, shared_weights=shared_weights,
                                providers=self.backend.providers)
        if isinstance(self.backend, EmulatedBackend):
            info = self.backend.info(model)
            if source.profile is None:
                raise SpatialConfigError(f"emulated model {model!r} has no profile to emulate instances from")
            return EmulatedInstances(source.profile, inputs=info.inputs, outputs=info.outputs, seed=self._seed,
                                     sleep=self._sleep)
        raise SpatialConfigError(f"backend {self.backend.name} cannot run spatial instances")

    def _submit_spatial_locked(self, job: _Job, stats: AppStats) -> Future[PoolResult]:
        pool = self._pools.get(job.app)
        if pool is None or self._pool_models.get(job.app) != job.model:
            stats.failed += 1
            what = (f"runs model {self._pool_models[job.app]!r}, not {job.model!r}" if pool is not None
                    else "has no instances: configure_app first")
            raise BackendError(f"app {job.app!r} on spatial device {self.device.path} {what}", 409)
        waiting = sum(p.queued() for p in self._pools.values())
        if waiting >= self.max_queue:
            stats.rejected += 1
            retry = self._retry_after_locked(waiting, max(1, sum(p.instances for p in self._pools.values())))
            raise Overloaded(f"device {self.device.path} has {waiting} requests queued (max_queue "
                             f"{self.max_queue}); retry after {retry:.3f} s", retry)
        try:
            return pool.submit(job.inputs)
        except PoolClosed as e:
            stats.rejected += 1
            raise WorkerClosed(f"device worker {self.device.path}: {e.message}") from None

    def _spatial_done(self, job: _Job, inner: Future[PoolResult]) -> None:
        error = inner.exception()
        with self._cv:
            s = self._apps[job.app]
            if error is None:
                r = inner.result()
                s.completed += 1
                s.queue_ms_total += r.queue_ms
                s.service_ms_total += r.service_ms
                s.latency_ms_total += r.queue_ms + r.service_ms
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

    def _spatial_started(self) -> None:
        with self._cv:
            self._inflight += 1
            self.max_inflight = max(self.max_inflight, self._inflight)
            if self._busy_since is None:
                self._busy_since = self._clock()

    def _spatial_ended(self, start: float, end: float) -> None:
        with self._cv:
            self._execution_ended_locked(start, end, 1)

    def _execution_ended_locked(self, start: float, end: float, requests: int) -> None:
        """Count one execution of ``requests`` requests that ran from ``start`` to ``end`` (clock s) and close
        the device's busy period when nothing else runs."""
        self._inflight -= 1
        self._executions += 1
        self._executed_requests += requests
        self._occupied_s += end - start
        if self._inflight == 0 and self._busy_since is not None:
            self._busy_total_s += end - self._busy_since
            self._busy_periods.append((self._busy_since, end))
            self._busy_since = None
            self._prune_locked(end)

    # -- internals: queues -----------------------------------------------------------------------------

    def _app_locked(self, app: str) -> AppStats:
        stats = self._apps.get(app)
        if stats is None:
            stats = self._apps[app] = AppStats()
        return stats

    def _enqueue_locked(self, job: _Job) -> None:
        d = self.discipline
        if d is Discipline.GPU_TIMESHARE:
            q = self._per_app.setdefault(job.app, deque())
            if not q:
                self._turns.append(job.app)  # the app gets a turn after those already waiting
            q.append(job)
        elif d is Discipline.BATCH:
            self._per_model.setdefault(job.model, deque()).append(job)
        else:
            self._fifo.append(job)

    def _pick_locked(self, now: float) -> tuple[list[_Job], float | None]:
        """The next execution's jobs (empty if none is due) and, when empty, how long to wait at most (s;
        None: until notified)."""
        d = self.discipline
        if d is Discipline.GPU_TIMESHARE:
            if not self._turns:
                return [], None
            app = self._turns.popleft()
            q = self._per_app[app]
            job = q.popleft()
            if q:
                self._turns.append(app)  # round robin: back of the line for the app's next request
            else:
                del self._per_app[app]
            return [job], None
        if d is Discipline.BATCH:
            return self._pick_batch_locked(now)
        if self._fifo:
            return [self._fifo.popleft()], None
        return [], None

    def _pick_batch_locked(self, now: float) -> tuple[list[_Job], float | None]:
        best: deque[_Job] | None = None
        next_ready = math.inf
        flush = self._closing  # draining: no reason to wait for more requests
        for q in self._per_model.values():
            if not q:
                continue
            deadline = q[0].enqueued + self._batch_timeout_s
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
        return jobs, None

    def _take_all_locked(self) -> list[_Job]:
        jobs = list(self._fifo)
        self._fifo.clear()
        for q in (*self._per_app.values(), *self._per_model.values()):
            jobs.extend(q)
        self._per_app.clear()
        self._turns.clear()
        self._per_model.clear()
        self._queued = 0
        return jobs

    def _fail(self, jobs: list[_Job], message: str) -> None:
        if not jobs:
            return
        with self._cv:
            for j in jobs:
                self._apps[j.app].failed += 1
        for j in jobs:
            if j.future.set_running_or_notify_cancel():
                j.future.set_exception(WorkerClosed(message))

    # -- internals: execution --------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            jobs = self._take()
            if jobs is None:
                return
            self._run(jobs)

    def _take(self) -> list[_Job] | None:
        """Block until an execution is due; None when the thread should end."""
        with self._cv:
            while True:
                if self._closing and not self._drain:
                    return None
                jobs, wait_s = self._pick_locked(self._clock())
                if jobs:
                    self._queued -= len(jobs)
                    # a future the client cancelled while queued is dropped here, never executed
                    live = []
                    for j in jobs:
                        if j.future.set_running_or_notify_cancel():
                            live.append(j)
                        else:
                            self._apps[j.app].failed += 1
                    if not live:
                        continue
                    self._inflight += 1
                    self.max_inflight = max(self.max_inflight, self._inflight)
                    if self._busy_since is None:
                        self._busy_since = self._clock()
                    return live
                if self._closing and self._queued == 0:
                    self._cv.notify_all()  # wake the other threads of a pool so they end too
                    return None
                self._cv.wait(wait_s)

    def _run(self, jobs: list[_Job]) -> None:
        model = jobs[0].model
        start = self._clock()
        switch = 0.0
        error: BaseException | None = None
        outputs: list[dict[str, np.ndarray]] = []
        try:
            if self._sequential and model != self._last_model:
                cost = float(self._switch_ms(model))
                self._last_model = model
                with self._cv:
                    self._switches += 1
                if cost > 0:
                    self._sleep(cost / 1000.0)
                    switch = (self._clock() - start) * 1000.0
            if self.discipline is Discipline.BATCH:
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
            self._execution_ended_locked(start, end, len(jobs))
            for j in jobs:
                s = self._apps[j.app]
                if error is None:
                    q = (start - j.enqueued) * 1000.0
                    s.completed += 1
                    s.queue_ms_total += q
                    s.service_ms_total += service_ms
                    s.latency_ms_total += q + service_ms
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

    def _prune_locked(self, now: float) -> None:
        start = now - self.window_s
        while self._busy_periods and self._busy_periods[0][1] <= start:
            self._busy_periods.popleft()

    def _retry_after_locked(self, queued: int | None = None, servers: int | None = None) -> float:
        per_request_s = (self._occupied_s / self._executed_requests if self._executed_requests
                         else _UNOBSERVED_SERVICE_S)
        return max(0.001, (self._queued if queued is None else queued) * per_request_s / (servers or self.servers))

    def _profile_switch_ms(self, model: str) -> float:
        try:
            return self.backend.info(model).switch_ms
        except BackendError:
            return 0.0  # unloaded meanwhile: the run itself reports the 404
