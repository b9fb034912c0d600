"""Device sharing disciplines (``edgemux.cluster.workload.Discipline``) as stations of the event engine.

A station receives requests through ``arrive(now_ms, req)`` and hands each finished request to
``sink(now_ms, req)`` (the next station, or the recorder). Requests are integer indices into per-request
lists (service time, tenant, model...) prepared once per replication, so the hot path touches only Python
lists and floats. Every station records its busy periods (time with at least one request in service) as
``busy_start``/``busy_end`` lists, appended only when it turns busy or idle.

Model-switch overhead is paid by the sequential, non-preemptive disciplines (FCFS, batching): a request
(or batch) pays its tenant's ``switch_ms`` when the previous one the device ran used another model; the
device starts with no model loaded (cold start, as in ``lindley``). Time-sharing disciplines (PS,
GPU time-sharing, MPS) ignore ``switch_ms``: Ibis §3.3 treats GPU context switches as negligible.

Processor-sharing stations use the virtual-time trick: every request in service progresses at the same
rate r(n), so the "virtual time" ``V`` (attained service of a request present since V=0) grows at r(n)
and a request of size s that arrives at virtual time V finishes when V reaches ``V + s``. A heap keyed by
that virtual finish gives the next departure in O(log n) per event.

Units: ms.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from heapq import heappop, heappush
from dataclasses import dataclass
from typing import Any

from edgemux.cluster.workload import BatchLaw, Discipline
from edgemux.sim.engine import PRIO_DEPARTURE, PRIO_TIMER, Engine

__all__ = [
    "Sink",
    "Station",
    "FcfsStation",
    "LimitedPsStation",
    "GpuTimeshareStation",
    "BatchStation",
    "SpatialStation",
    "StationInputs",
    "STATIONS",
    "station_for",
]

Sink = Callable[[float, int], None]
"""Receives a finished request: ``sink(now_ms, request_index)``."""


class Station:
    """Common state: the engine, where finished requests go, and busy-period bookkeeping."""

    def __init__(self, engine: Engine, sink: Sink) -> None:
        self.engine = engine
        self.sink = sink
        self.busy_start: list[float] = []
        self.busy_end: list[float] = []

    def arrive(self, now: float, req: int) -> None:  # pragma: no cover - interface
        """Accept request ``req`` at virtual time ``now`` (ms)."""
        raise NotImplementedError


class FcfsStation(Station):
    """Non-preemptive FCFS single server with model-switch overhead (Edge TPU, Ibis §3.2).

    ``service[req]`` is the execution time (ms), ``model[req]`` an integer model id and ``switch[req]``
    the overhead (ms) paid when the previously served request had another model id.
    """

    def __init__(
        self,
        engine: Engine,
        sink: Sink,
        service: Sequence[float],
        model: Sequence[int],
        switch: Sequence[float],
    ) -> None:
        super().__init__(engine, sink)
        self._service = service
        self._model = model
        self._switch = switch
        self._queue: deque[int] = deque()
        self._busy = False
        self._loaded = -1  # cold start: no model loaded
        self.occupation = 0.0  # total time requests held the device (ms), switches included

    def arrive(self, now: float, req: int) -> None:
        if self._busy:
            self._queue.append(req)
            return
        self._busy = True
        self.busy_start.append(now)
        self._start(now, req)

    def _start(self, now: float, req: int) -> None:
        s = self._service[req]
        m = self._model[req]
        if m != self._loaded:
            s += self._switch[req]
            self._loaded = m
        self.occupation += s
        self.engine.schedule(now + s, PRIO_DEPARTURE, self._depart, req)

    def _depart(self, now: float, req: int) -> None:
        if self._queue:
            self._start(now, self._queue.popleft())
        else:
            self._busy = False
            self.busy_end.append(now)
        self.sink(now, req)


class LimitedPsStation(Station):
    """Limited processor sharing: with n requests present each progresses at rate ``min(1, c/n)``.

    ``c = 1`` is egalitarian PS (rate 1/n); ``c > 1`` (may be fractional) is MPS request parallelism
    (Ibis §3.4.3) or a c-core CPU stage (Ibis §3.5); ``c < 1`` is a fractional CPU share (a lone request
    runs at rate c). ``service[req]`` is the request's work in ms at rate 1.
    """

    def __init__(self, engine: Engine, sink: Sink, service: Sequence[float], capacity: float = 1.0) -> None:
        if not (capacity > 0 and math.isfinite(capacity)):
            raise ValueError(f"processor-sharing capacity must be a finite number > 0, got {capacity}")
        super().__init__(engine, sink)
        self._service = service
        self._c = float(capacity)
        self._jobs: list[tuple[float, int]] = []  # (virtual finish, request)
        self._v = 0.0  # virtual time: attained service of a request present since V=0
        self._last = 0.0  # real time V was last brought up to date
        self._dep: list[Any] | None = None  # handle of the scheduled next departure

    def arrive(self, now: float, req: int) -> None:
        jobs = self._jobs
        n = len(jobs)
        if n:
            c = self._c
            self._v += (now - self._last) * (c / n if n > c else 1.0)
            assert self._dep is not None  # a departure is scheduled whenever requests are present
            self.engine.cancel(self._dep)
        else:
            self._v = 0.0  # restart virtual time each busy period: keeps it small and exact
            self.busy_start.append(now)
        self._last = now
        heappush(jobs, (self._v + self._service[req], req))
        self._schedule_next(now)

    def _schedule_next(self, now: float) -> None:
        jobs = self._jobs
        remaining = jobs[0][0] - self._v
        if remaining < 0.0:
            remaining = 0.0
        n = len(jobs)
        c = self._c
        self._dep = self.engine.schedule(now + remaining / (c / n if n > c else 1.0), PRIO_DEPARTURE, self._depart)

    def _depart(self, now: float, _: Any) -> None:
        jobs = self._jobs
        # At this instant V equals the head's virtual finish by construction; taking it exactly avoids
        # letting rounding in (now - last) * rate accumulate across the busy period.
        self._v, req = heappop(jobs)
        self._last = now
        if jobs:
            self._schedule_next(now)
        else:
            self._dep = None
            self.busy_end.append(now)
        self.sink(now, req)


class GpuTimeshareStation(Station):
    """Embedded-GPU time sharing (Ibis §3.3): FIFO within an app, processor sharing across apps.

    Each app (``app[req]``, one CUDA context) serves its own requests one at a time in arrival order; the
    head requests of the k apps that have work each progress at rate 1/k.
    """

    def __init__(self, engine: Engine, sink: Sink, service: Sequence[float], app: Sequence[int], n_apps: int) -> None:
        super().__init__(engine, sink)
        self._service = service
        self._app = app
        self._waiting: list[deque[int]] = [deque() for _ in range(n_apps)]
        self._active = [False] * n_apps  # app has a head request in service
        self._heads: list[tuple[float, int]] = []  # (virtual finish, request) of active apps' heads
        self._v = 0.0
        self._last = 0.0
        self._dep: list[Any] | None = None

    def arrive(self, now: float, req: int) -> None:
        a = self._app[req]
        if self._active[a]:
            self._waiting[a].append(req)
            return
        self._active[a] = True
        heads = self._heads
        k = len(heads)
        if k:
            self._v += (now - self._last) / k
            assert self._dep is not None  # a departure is scheduled whenever requests are present
            self.engine.cancel(self._dep)
        else:
            self._v = 0.0
            self.busy_start.append(now)
        self._last = now
        heappush(heads, (self._v + self._service[req], req))
        self._schedule_next(now)

    def _schedule_next(self, now: float) -> None:
        heads = self._heads
        remaining = heads[0][0] - self._v
        if remaining < 0.0:
            remaining = 0.0
        self._dep = self.engine.schedule(now + remaining * len(heads), PRIO_DEPARTURE, self._depart)

    def _depart(self, now: float, _: Any) -> None:
        heads = self._heads
        self._v, req = heappop(heads)
        self._last = now
        a = self._app[req]
        waiting = self._waiting[a]
        if waiting:
            nxt = waiting.popleft()
            heappush(heads, (self._v + self._service[nxt], nxt))
        else:
            self._active[a] = False
        if heads:
            self._schedule_next(now)
        else:
            self._dep = None
            self.busy_end.append(now)
        self.sink(now, req)


class BatchStation(Station):
    """Batching server: batches of one model's queued requests, up to ``max_batch``.

    When the device is free, a model's queue is *ready* if it holds ``max_batch`` requests or its oldest
    request has waited ``timeout_ms``; among ready models the one with the oldest head request goes, taking
    up to ``max_batch`` requests. The batch takes ``law.batch_ms(b)`` when the head request's tenant has a
    ``BatchLaw`` (Ibis Eq. 9), otherwise the sum of the b requests' own service times (no batching gain),
    plus the head tenant's switch overhead when the previous batch ran another model. All requests of a
    batch finish together. Request indices must follow arrival order (the oldest head is the lowest index).
    """

    def __init__(
        self,
        engine: Engine,
        sink: Sink,
        *,
        arrival: Sequence[float],
        service: Sequence[float],
        model: Sequence[int],
        switch: Sequence[float],
        law: Sequence[BatchLaw | None],
        n_models: int,
        max_batch: int,
        timeout_ms: float,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if timeout_ms < 0:
            raise ValueError(f"batch timeout must be >= 0 ms, got {timeout_ms}")
        super().__init__(engine, sink)
        self._arrival = arrival
        self._service = service
        self._model = model
        self._switch = switch
        self._law = law
        self._queues: list[deque[int]] = [deque() for _ in range(n_models)]
        self._b = max_batch
        self._timeout = timeout_ms
        self._busy = False
        self._loaded = -1
        self._timer: list[Any] | None = None
        self.occupation = 0.0
        self.batches = 0

    def arrive(self, now: float, req: int) -> None:
        self._queues[self._model[req]].append(req)
        if not self._busy and self._try_start(now):
            self._busy = True
            self.busy_start.append(now)

    def _try_start(self, now: float) -> bool:
        """Start the next batch if a queue is ready (True), else arm the timer for the next deadline."""
        best_q: deque[int] | None = None
        best_head = -1
        next_ready = math.inf
        arrival = self._arrival
        for q in self._queues:
            if not q:
                continue
            head = q[0]
            deadline = arrival[head] + self._timeout  # same expression as the timer's time: exact compare
            if len(q) >= self._b or deadline <= now:
                if best_q is None or head < best_head:
                    best_q, best_head = q, head
            elif deadline < next_ready:
                next_ready = deadline
        if self._timer is not None:
            self.engine.cancel(self._timer)
            self._timer = None
        if best_q is None:
            if next_ready < math.inf:
                self._timer = self.engine.schedule(next_ready, PRIO_TIMER, self._on_timer)
            return False
        b = min(len(best_q), self._b)
        batch = [best_q.popleft() for _ in range(b)]
        law = self._law[best_head]
        if law is not None:
            dur = law.batch_ms(b)
        else:
            dur = math.fsum(self._service[r] for r in batch)
        m = self._model[best_head]
        if m != self._loaded:
            dur += self._switch[best_head]
            self._loaded = m
        self.occupation += dur
        self.batches += 1
        self.engine.schedule(now + dur, PRIO_DEPARTURE, self._done, batch)
        return True

    def _on_timer(self, now: float, _: Any) -> None:
        self._timer = None
        if not self._busy and self._try_start(now):
            self._busy = True
            self.busy_start.append(now)

    def _done(self, now: float, batch: list[int]) -> None:
        if not self._try_start(now):
            self._busy = False
            self.busy_end.append(now)
        sink = self.sink
        for r in batch:
            sink(now, r)


class SpatialStation(Station):
    """Controlled spatial sharing (Dhakal et al. §IV): tenant i owns ``instances[i]`` servers (its instances,
    each at its share of the device, so ``service[req]`` is already the time at that share); its requests
    wait in its own FIFO queue for the first free instance. Tenants never wait for each other. The device
    is busy while any instance of any tenant serves. No switch cost: each instance keeps its model loaded.
    """

    def __init__(self, engine: Engine, sink: Sink, service: Sequence[float], tenant: Sequence[int],
                 instances: Sequence[int]) -> None:
        if any(k < 1 for k in instances):
            raise ValueError(f"every tenant needs at least one instance, got {list(instances)}")
        super().__init__(engine, sink)
        self._service = service
        self._tenant = tenant
        self._k = list(instances)                   # instances per tenant
        self._busy = [0] * len(self._k)             # of them serving a request
        self._queues: list[deque[int]] = [deque() for _ in self._k]
        self._in_service = 0

    def set_instances(self, tenant: int, instances: int) -> None:
        """Tenant ``tenant`` runs ``instances`` instances from now on (a re-share the adaptation loop carried
        out). New ones take its queue at once; with fewer, busy instances finish their request and retire
        instead of taking the next one."""
        if instances < 1:
            raise ValueError(f"a tenant needs at least one instance, got {instances}")
        self._k[tenant] = instances
        q = self._queues[tenant]
        while self._busy[tenant] < instances and q:
            self._busy[tenant] += 1
            self._start(self.engine.now, q.popleft())

    def arrive(self, now: float, req: int) -> None:
        t = self._tenant[req]
        if self._busy[t] < self._k[t]:
            self._busy[t] += 1
            self._start(now, req)
        else:
            self._queues[t].append(req)

    def _start(self, now: float, req: int) -> None:
        if self._in_service == 0:
            self.busy_start.append(now)
        self._in_service += 1
        self._run(now, req)

    def _run(self, now: float, req: int) -> None:
        self.engine.schedule(now + self._service[req], PRIO_DEPARTURE, self._depart, req)

    def _depart(self, now: float, req: int) -> None:
        t = self._tenant[req]
        q = self._queues[t]
        if q and self._busy[t] <= self._k[t]:
            self._run(now, q.popleft())  # the freed instance takes its tenant's next request at once
        else:
            self._busy[t] -= 1           # idle, or retired by a re-share to fewer instances
            self._in_service -= 1
            if self._in_service == 0:
                self.busy_end.append(now)
        self.sink(now, req)


@dataclass(frozen=True)
class StationInputs:
    """What the station of any discipline may read. Per-request lists indexed by request id, which may grow
    while the run goes on: ``service`` (ms), ``model`` (id), ``switch`` (ms), ``tenant`` (index) and, for
    batching, ``arrival`` (ms; request ids in arrival order). Per tenant: ``instances`` (spatial; default
    one each) and ``laws`` (batching's Eq. 9 law, or None). ``servers``: c for MPS; ``n_models``: how many
    model ids there are; ``max_batch``/``timeout_ms`` configure batching."""

    servers: float
    service: Sequence[float]
    model: Sequence[int]
    switch: Sequence[float]
    tenant: Sequence[int]
    n_tenants: int
    instances: Sequence[int] | None = None
    arrival: Sequence[float] | None = None
    laws: Sequence[BatchLaw | None] | None = None
    n_models: int = 0
    max_batch: int = 1
    timeout_ms: float = 0.0


StationBuilder = Callable[[Engine, Sink, StationInputs], Station]
"""Builds one discipline's station: ``build(engine, sink, inputs)``."""


def _fcfs(engine: Engine, sink: Sink, r: StationInputs) -> Station:
    return FcfsStation(engine, sink, r.service, r.model, r.switch)


def _ps(engine: Engine, sink: Sink, r: StationInputs) -> Station:
    return LimitedPsStation(engine, sink, r.service, capacity=1.0)


def _mps(engine: Engine, sink: Sink, r: StationInputs) -> Station:
    return LimitedPsStation(engine, sink, r.service, capacity=r.servers)


def _timeshare(engine: Engine, sink: Sink, r: StationInputs) -> Station:
    return GpuTimeshareStation(engine, sink, r.service, r.tenant, r.n_tenants)


def _batch(engine: Engine, sink: Sink, r: StationInputs) -> Station:
    if r.arrival is None or r.laws is None:
        raise ValueError("a batch device's station needs its requests' arrival times, numbered in arrival "
                         "order, and its tenants' batch laws (BatchStation)")
    laws = r.laws
    return BatchStation(engine, sink, arrival=r.arrival, service=r.service, model=r.model, switch=r.switch,
                        law=[laws[t] for t in r.tenant], n_models=r.n_models, max_batch=r.max_batch,
                        timeout_ms=r.timeout_ms)


def _spatial(engine: Engine, sink: Sink, r: StationInputs) -> Station:
    return SpatialStation(engine, sink, r.service, r.tenant, r.instances or [1] * r.n_tenants)


STATIONS: dict[Discipline, StationBuilder] = {
    Discipline.FCFS: _fcfs,
    Discipline.PS: _ps,
    Discipline.GPU_TIMESHARE: _timeshare,
    Discipline.MPS: _mps,
    Discipline.BATCH: _batch,
    Discipline.SPATIAL: _spatial,
}
"""The station of each discipline: FCFS with model switches, PS (limited PS at c = 1), GPU time-sharing
across tenants, MPS (limited PS at c = ``servers``), batching, spatial sharing."""


def station_for(engine: Engine, sink: Sink, discipline: Discipline, *, servers: float, service: Sequence[float],
                model: Sequence[int], switch: Sequence[float], tenant: Sequence[int], n_tenants: int,
                instances: Sequence[int] | None = None, arrival: Sequence[float] | None = None,
                laws: Sequence[BatchLaw | None] | None = None, n_models: int = 0, max_batch: int = 1,
                timeout_ms: float = 0.0) -> Station:
    """The station of a device with ``discipline`` (:data:`STATIONS`), its inputs as :class:`StationInputs`
    describes them (ms); ``ValueError`` for a batch device without ``arrival`` and ``laws``."""
    return STATIONS[discipline](engine, sink, StationInputs(
        servers, service, model, switch, tenant, n_tenants, instances, arrival, laws, n_models, max_batch,
        timeout_ms))
