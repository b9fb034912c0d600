"""The runtime's request queues (``runtime.dataplane.queues``) against the simulator's stations
(``sim.devices``): driven through the same arrivals in virtual time, a queue serves in its station's
order, and where the two differ by design (processor sharing) in the order the station finishes equal
requests."""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from edgemux.cluster.disciplines import TRAITS
from edgemux.cluster.state import Device
from edgemux.cluster.workload import BatchLaw, Discipline
from edgemux.profiles.types import DeviceKind
from edgemux.runtime.dataplane.backends import EmulatedBackend
from edgemux.runtime.dataplane.meter import DeviceMeter
from edgemux.runtime.dataplane.queues import QUEUES, Job, QueueHost, RequestQueue
from edgemux.sim.devices import station_for
from edgemux.sim.engine import PRIO_ARRIVAL, PRIO_DEPARTURE, PRIO_TIMER, Engine



def _host() -> QueueHost:
    def closed_never() -> None:
        return None

    return QueueHost(EmulatedBackend(), threading.Condition(), lambda: 0.0, lambda s: None, 1, 0,
                     DeviceMeter("cpu", 60.0, 0.0), closed_never)


def _queue(d: Discipline, **kw: Any) -> RequestQueue:
    return QUEUES[d](Device("n1", "d0", DeviceKind.GPU_DISCRETE, d, 100.0, **kw), _host())


def _by_station(d: Discipline, arrivals: Sequence[float], service: Sequence[float], model: Sequence[int],
                switch: float, **kw: Any) -> list[float]:
    eng = Engine()
    done = [math.nan] * len(arrivals)
    st = station_for(eng, lambda now, req: done.__setitem__(req, now), d, servers=1.0, service=service,
                     model=model, switch=[switch] * len(arrivals), tenant=model, n_tenants=max(model) + 1,
                     arrival=arrivals, laws=[kw.get("law")] * (max(model) + 1), n_models=max(model) + 1,
                     max_batch=kw.get("max_batch", 1), timeout_ms=kw.get("timeout", 0.0))
    for i, t in enumerate(arrivals):
        eng.schedule(t, PRIO_ARRIVAL, st.arrive, i)
    eng.run()
    return done


def _by_queue(q: RequestQueue, arrivals: Sequence[float], service: Sequence[float], model: Sequence[int],
              switch: float, law: BatchLaw | None = None) -> list[float]:
    """The queue served as its worker serves it with one thread, in virtual time: pop when the device is
    free (on an arrival, a completion, or when ``pop`` said to wait), pay the switch where the discipline
    ``pays_switch``, a batch takes its law's time (else the sum of its requests')."""
    eng = Engine()
    done = [math.nan] * len(arrivals)
    state: dict[str, Any] = {"busy": False, "last": None}
    pays = TRAITS[q.device.discipline].pays_switch

    def start(now: float) -> None:
        jobs, wait_s = q.pop(now, False)
        if not jobs:
            if wait_s is not None:
                eng.schedule(now + wait_s, PRIO_TIMER, on_timer)
            return
        state["busy"] = True
        dur = law.batch_ms(len(jobs)) if law is not None else math.fsum(service[j.seq] for j in jobs)
        if pays and jobs[0].model != state["last"]:
            dur += switch
            state["last"] = jobs[0].model
        eng.schedule(now + dur, PRIO_DEPARTURE, finish, jobs)

    def finish(now: float, jobs: list[Job]) -> None:
        for j in jobs:
            done[j.seq] = now
        state["busy"] = False
        start(now)

    def on_timer(now: float, _: Any) -> None:
        if not state["busy"]:
            start(now)

    def arrive(now: float, i: int) -> None:
        q.push(Job(i, f"app{model[i]}", f"m{model[i]}", {}, 1, now))
        if not state["busy"]:
            start(now)

    for i, t in enumerate(arrivals):
        eng.schedule(t, PRIO_ARRIVAL, arrive, i)
    eng.run()
    return done


def _dyadic(rng: random.Random, n: int, step: float, top: int) -> list[float]:
    # multiples of a power of two: every sum and difference below is exact, so times compare exactly
    return [step * rng.randint(1, top) for _ in range(n)]


@pytest.mark.parametrize("seed", range(5))
def test_fcfs_queue_serves_in_the_station_order(seed: int) -> None:
    rng = random.Random(seed)
    n = 60
    arrivals = sorted(_dyadic(rng, n, 1 / 8, 400))
    service = _dyadic(rng, n, 1 / 16, 32)
    model = [rng.randrange(3) for _ in range(n)]
    want = _by_station(Discipline.FCFS, arrivals, service, model, 0.75)
    assert _by_queue(_queue(Discipline.FCFS), arrivals, service, model, 0.75) == want


@pytest.mark.parametrize("seed", range(5))
def test_batch_queue_forms_the_station_batches(seed: int) -> None:
    rng = random.Random(seed)
    n = 60
    arrivals = sorted(_dyadic(rng, n, 1 / 8, 300))
    model = [rng.randrange(3) for _ in range(n)]
    law = BatchLaw(k1_ms=0.25, k2_ms=1.5)
    # the station's timeout (its time unit) is the queue's batch_timeout_ms / 1000 (s): 0.5 either way
    want = _by_station(Discipline.BATCH, arrivals, [1.0] * n, model, 0.5, law=law, max_batch=3, timeout=0.5)
    got = _by_queue(_queue(Discipline.BATCH, max_batch=3, batch_timeout_ms=500.0), arrivals, [1.0] * n, model,
                    0.5, law)
    assert got == want


@pytest.mark.parametrize("d", [Discipline.PS, Discipline.MPS], ids=lambda d: d.value)
def test_limited_ps_queue_takes_requests_in_the_station_order(d: Discipline) -> None:
    """Equal requests present together: the station serves them all at once and they finish together,
    released in arrival order; the queue hands them to its threads in that order."""
    n = 9
    want = _by_station(d, [0.0] * n, [1.0] * n, [0] * n, 0.0)
    release = sorted(range(n), key=lambda i: want[i])          # stable: ties keep arrival order
    q = _queue(d, servers=2.0 if d is Discipline.MPS else 1.0)
    for i in range(n):
        q.push(Job(i, "app", "m", {}, 1, 0.0))
    assert [q.pop(0.0, False)[0][0].seq for _ in range(n)] == release
    assert q.queued == 0 and q.threads == (2 if d is Discipline.MPS else 1)


@pytest.mark.parametrize("seed", range(5))
def test_timeshare_queue_serves_the_station_rounds(seed: int) -> None:
    """Equal requests of several apps present together: the station finishes them in rounds (every app with
    work one request, together); the queue's rotation takes the same rounds one request at a time."""
    rng = random.Random(seed)
    n = 30
    app = [rng.randrange(4) for _ in range(n)]
    done = _by_station(Discipline.GPU_TIMESHARE, [0.0] * n, [1.0] * n, app, 0.0)
    rounds: dict[float, set[int]] = {}
    for i, t in enumerate(done):
        rounds.setdefault(t, set()).add(i)
    q = _queue(Discipline.GPU_TIMESHARE)
    for i in range(n):
        q.push(Job(i, f"app{app[i]}", "m", {}, 1, 0.0))
    order = [q.pop(0.0, False)[0][0].seq for _ in range(n)]
    assert q.pop(0.0, False) == ([], None)
    k = 0
    for t in sorted(rounds):
        assert set(order[k:k + len(rounds[t])]) == rounds[t]
        k += len(rounds[t])


@pytest.mark.parametrize("d", [d for d in Discipline if QUEUES[d].threads], ids=lambda d: d.value)
def test_drain_returns_every_waiting_job_once(d: Discipline) -> None:
    q = _queue(d, max_batch=4, batch_timeout_ms=1e6)
    jobs = [Job(i, f"app{i % 3}", f"m{i % 2}", {}, 1, 0.0) for i in range(10)]
    for j in jobs:
        q.push(j)
    first, _ = q.pop(0.0, True)
    left = q.drain()
    assert sorted(j.seq for j in first + left) == list(range(10)) and q.queued == 0
    assert q.pop(0.0, True) == ([], None)

