"""Simulate one device and its tenants: sample a workload, run it through the vectorized FCFS path or the
event engine, and summarize replications with confidence intervals.

Randomness: replication r of ``simulate_device(seed=s)`` uses ``np.random.SeedSequence(s).spawn(R)[r]``;
inside a replication every tenant gets its own child sequence, split again into arrival, device-service
and CPU-service streams. The sampled workload does not depend on the engine, so the same seed run through
both engines sees the very same arrivals and service times. No clocks, no I/O.

Units: times in ms, rates in req/s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from edgemux.cluster.disciplines import capacity, traits
from edgemux.cluster.workload import DeviceSpec, Tenant, check_shares
from edgemux.sim.arrivals import generate_arrivals
from edgemux.sim.devices import LimitedPsStation, station_for
from edgemux.sim.engine import PRIO_ARRIVAL, Engine
from edgemux.sim.lindley import fcfs_lindley
from edgemux.sim.stats import (CI, DeviceSimResult, TenantSimStats, busy_fraction, confidence_interval,
                               percentiles_inplace)
from edgemux.sim.sweep import gpu_timeshare, limited_ps

__all__ = [
    "EngineChoice",
    "EngineName",
    "Workload",
    "RawRun",
    "sample_workload",
    "run_workload",
    "simulate_raw",
    "replication_stats",
    "simulate_device",
    "choose_engine",
]

EngineChoice = Literal["auto", "lindley", "sweep", "event"]
EngineName = Literal["lindley", "sweep", "event"]
"""The engine a run actually uses: ``choose_engine`` resolves an ``EngineChoice`` (``"auto"``) to one."""


@dataclass(frozen=True)
class Workload:
    """One replication's sampled input, per request in arrival order.

    ``service_ms`` is the device execution time alone at batch 1 (switch overhead not included);
    ``cpu_ms`` the CPU-stage work (ms of one core; 0 for tenants without a CPU stage).
    """

    arrival_ms: np.ndarray
    tenant: np.ndarray
    service_ms: np.ndarray
    cpu_ms: np.ndarray

    def __len__(self) -> int:
        return int(self.arrival_ms.size)


@dataclass(frozen=True)
class RawRun:
    """One replication's raw outcome, per request in arrival order.

    ``departure_ms`` is when the device finished the request; ``latency_ms`` the end-to-end latency
    (departure - arrival + the tenant's ``network_ms``, CPU stage included). ``busy_start_ms``/
    ``busy_end_ms`` are the device's busy intervals. ``events`` as in ``DeviceSimResult``.
    """

    tenant_names: tuple[str, ...]
    arrival_ms: np.ndarray
    tenant: np.ndarray
    departure_ms: np.ndarray
    latency_ms: np.ndarray
    busy_start_ms: np.ndarray
    busy_end_ms: np.ndarray
    engine: str
    events: int

    def latencies_of(self, name: str, *, warmup: float = 0.0) -> np.ndarray:
        """End-to-end latencies (ms) of tenant ``name``'s requests after the first ``warmup`` fraction."""
        i = self.tenant_names.index(name)
        k0 = int(math.floor(warmup * self.arrival_ms.size))
        t = self.tenant[k0:]
        return self.latency_ms[k0:][t == i]


def _check_tenants(tenants: Sequence[Tenant]) -> None:
    if len(tenants) == 0:
        raise ValueError("a device simulation needs at least one tenant, got zero")
    names = [t.name for t in tenants]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"tenant names must be unique, repeated: {', '.join(dup)}")
    for t in tenants:
        if not (t.switch_ms >= 0 and math.isfinite(t.switch_ms)):
            raise ValueError(f"tenant {t.name!r}: switch_ms must be a finite number >= 0 ms, got {t.switch_ms}")
        if not (t.network_ms >= 0 and math.isfinite(t.network_ms)):
            raise ValueError(f"tenant {t.name!r}: network_ms must be a finite number >= 0 ms, got {t.network_ms}")
        if t.cpu is not None and not (t.cpu.cores > 0 and math.isfinite(t.cpu.cores)):
            raise ValueError(f"tenant {t.name!r}: CPU cores must be a finite number > 0, got {t.cpu.cores}")


def _check_requests(requests: int) -> None:
    if isinstance(requests, bool) or not isinstance(requests, (int, np.integer)):
        raise ValueError(f"requests must be an integer, got {requests!r}")
    if requests < 1:
        raise ValueError(f"requests must be >= 1 (total arrivals per replication), got {requests}")


def _seed_sequence(seed: int | np.random.SeedSequence) -> np.random.SeedSequence:
    return seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)


def sample_workload(
    tenants: Sequence[Tenant], requests: int, seed: int | np.random.SeedSequence = 0
) -> Workload:
    """Draw one replication's arrivals (``requests`` in total across tenants; with replay tenants, the
    replayed traces, see ``generate_arrivals``) and per-request service times (ms)."""
    _check_tenants(tenants)
    _check_requests(requests)
    per_tenant = _seed_sequence(seed).spawn(len(tenants))
    streams = [ss.spawn(3) for ss in per_tenant]  # arrival, device service, CPU service
    times, idx = generate_arrivals(
        [t.arrival for t in tenants], [np.random.default_rng(s[0]) for s in streams], requests
    )
    service = np.zeros(times.size)
    cpu = np.zeros(times.size)
    has_cpu = any(t.cpu is not None for t in tenants)
    for i, (t, s) in enumerate(zip(tenants, streams)):
        where = np.flatnonzero(idx == i)
        if where.size == 0:
            continue
        service[where] = t.service.sample(np.random.default_rng(s[1]), where.size)
        if t.cpu is not None:
            cpu[where] = t.cpu.service.sample(np.random.default_rng(s[2]), where.size)
    # min/max are NaN when a sample is, and a comparison with NaN is False: two passes, no mask arrays
    checked = (service, cpu) if has_cpu else (service,)
    if any(x.size and not (x.min() >= 0 and x.max() < math.inf) for x in checked):
        raise ValueError("service-time distributions produced negative or non-finite samples")
    return Workload(arrival_ms=times, tenant=idx, service_ms=service, cpu_ms=cpu)


def choose_engine(device: DeviceSpec, tenants: Sequence[Tenant], engine: EngineChoice = "auto") -> EngineName:
    """The engine for a run: with ``engine="auto"``, ``"lindley"`` (vectorized) for a FCFS device and
    ``"sweep"`` (``sim.sweep``) for a processor-sharing, MPS or GPU time-sharing one when no tenant has a
    CPU stage, else ``"event"`` (the event engine, which chains stations). All three give the same
    departures where they apply.

    Forcing ``"lindley"`` or ``"sweep"`` where it does not apply raises ``ValueError``.
    """
    no_cpu = all(t.cpu is None for t in tenants)
    tr = traits(device.discipline)
    lindley = tr.one_queue and no_cpu
    sweep = tr.shares and no_cpu
    if engine == "auto":
        return "lindley" if lindley else "sweep" if sweep else "event"
    if engine == "lindley":
        if not lindley:
            raise ValueError(
                "the vectorized Lindley path simulates only FCFS devices without CPU stages "
                f"(device {device.name!r} is {device.discipline.value}"
                f"{', a tenant has a CPU stage' if not no_cpu else ''})"
            )
        return "lindley"
    if engine == "sweep":
        if not sweep:
            raise ValueError(
                "the sweep simulates only ps, mps and gpu-timeshare devices without CPU stages "
                f"(device {device.name!r} is {device.discipline.value}"
                f"{', a tenant has a CPU stage' if not no_cpu else ''})"
            )
        return "sweep"
    if engine == "event":
        return "event"
    raise ValueError(f"engine must be 'auto', 'lindley', 'sweep' or 'event', got {engine!r}")


def _model_ids(tenants: Sequence[Tenant]) -> np.ndarray:
    ids: dict[str, int] = {}
    # by cache key: what the device keeps loaded (a co-compiled set is one: no switch within it)
    return np.array([ids.setdefault(t.cache_key, len(ids)) for t in tenants], dtype=np.int64)


def _check_device(device: DeviceSpec) -> None:
    if not traits(device.discipline).multi_server and device.servers != 1.0:
        raise ValueError(
            f"device {device.name!r}: servers={device.servers} applies only to the mps discipline, "
            f"not {device.discipline.value}"
        )


def run_workload(
    device: DeviceSpec, tenants: Sequence[Tenant], workload: Workload, *, engine: EngineChoice = "auto"
) -> RawRun:
    """Run a sampled ``workload`` through ``device`` (see ``choose_engine``) and return the raw outcome."""
    _check_tenants(tenants)
    _check_device(device)
    if traits(device.discipline).spatial:
        check_shares(tenants, where=device.name)
    which = choose_engine(device, tenants, engine)
    n = len(workload)
    tenant = workload.tenant
    model_of = _model_ids(tenants)
    switch_of = np.array([t.switch_ms for t in tenants], dtype=float)
    network_of = np.array([t.network_ms for t in tenants], dtype=float)

    # busy intervals (ms): arrays from the Lindley path, lists from the event engine; made arrays below
    busy_s: np.ndarray | list[float]
    busy_e: np.ndarray | list[float]
    if which == "lindley":
        fr = fcfs_lindley(workload.arrival_ms, tenant, workload.service_ms, model_of, switch_of)
        departure = fr.departure_ms
        busy_s, busy_e = fr.start_ms, fr.departure_ms
        events = 2 * n
    elif which == "sweep":
        departure, busy_s, busy_e = _run_sweep(device, tenants, workload)
        events = 2 * n
    else:
        departure, busy_s, busy_e, events = _run_event(device, tenants, workload, model_of, switch_of)

    latency = departure - workload.arrival_ms
    if network_of.any():  # skip a gather over every request in the common no-network case
        latency += network_of[tenant]
    return RawRun(
        tenant_names=tuple(t.name for t in tenants),
        arrival_ms=workload.arrival_ms,
        tenant=tenant,
        departure_ms=departure,
        latency_ms=latency,
        busy_start_ms=np.asarray(busy_s, dtype=float),
        busy_end_ms=np.asarray(busy_e, dtype=float),
        engine=which,
        events=events,
    )


def _run_sweep(device: DeviceSpec, tenants: Sequence[Tenant], w: Workload
               ) -> tuple[np.ndarray, list[float], list[float]]:
    arrival, service = w.arrival_ms.tolist(), w.service_ms.tolist()
    if traits(device.discipline).app_fifo:
        return gpu_timeshare(arrival, service, w.tenant.tolist(), len(tenants))
    return limited_ps(arrival, service, capacity(device))


def _run_event(
    device: DeviceSpec,
    tenants: Sequence[Tenant],
    w: Workload,
    model_of: np.ndarray,
    switch_of: np.ndarray,
) -> tuple[np.ndarray, list[float], list[float], int]:
    n = len(w)
    eng = Engine()
    done = [math.nan] * n

    def record(now: float, req: int) -> None:
        done[req] = now

    tenant_l = w.tenant.tolist()
    service_l = w.service_ms.tolist()
    model_l = model_of[w.tenant].tolist()
    switch_l = switch_of[w.tenant].tolist()
    times = w.arrival_ms.tolist()
    dev = station_for(eng, record, device.discipline, servers=device.servers, service=service_l, model=model_l,
                      switch=switch_l, tenant=tenant_l, n_tenants=len(tenants),
                      instances=[t.instances for t in tenants], arrival=times,
                      laws=[t.batch for t in tenants], n_models=int(model_of.max()) + 1 if model_of.size else 0,
                      max_batch=device.max_batch, timeout_ms=device.batch_timeout_ms)

    # Each tenant with a CPU stage gets its own c-core limited-PS station in tandem before the device.
    entry = []
    cpu_l = w.cpu_ms.tolist() if any(t.cpu is not None for t in tenants) else []
    for t in tenants:
        if t.cpu is None:
            entry.append(dev.arrive)
        else:
            entry.append(LimitedPsStation(eng, dev.arrive, cpu_l, capacity=t.cpu.cores).arrive)
    route = [entry[t] for t in tenant_l]

    # Only the next arrival sits in the heap (not all n): the heap stays tiny and each push/pop cheap.
    schedule = eng.schedule

    def arrive(now: float, i: int) -> None:
        route[i](now, i)
        j = i + 1
        if j < n:
            schedule(times[j], PRIO_ARRIVAL, arrive, j)

    if n:
        schedule(times[0], PRIO_ARRIVAL, arrive, 0)
    eng.run()
    return np.array(done), dev.busy_start, dev.busy_end, eng.executed


def simulate_raw(
    device: DeviceSpec,
    tenants: Sequence[Tenant],
    *,
    requests: int = 200_000,
    seed: int | np.random.SeedSequence = 0,
    engine: EngineChoice = "auto",
) -> RawRun:
    """One replication: per-request arrivals, departures and end-to-end latencies (ms).

    ``seed`` may be an int or a ``SeedSequence``; ``simulate_device(seed=s)``'s replication r equals
    ``simulate_raw(seed=np.random.SeedSequence(s).spawn(R)[r])``.
    """
    _check_device(device)
    return run_workload(device, tenants, sample_workload(tenants, requests, seed), engine=engine)


def replication_stats(run: RawRun, warmup: float) -> tuple[np.ndarray, float]:
    """Per tenant [count, mean, p50, p95, p99, throughput] of one replication, its first ``warmup`` fraction
    of arrivals left out (latencies in ms, throughput in req/s), and the device busy fraction."""
    n = run.arrival_ms.size
    k0 = int(math.floor(warmup * n))
    out = np.full((len(run.tenant_names), 6), math.nan)
    out[:, 0] = 0
    if k0 >= n:
        return out, math.nan
    t0 = float(run.arrival_ms[k0])
    t1 = float(run.arrival_ms[-1])
    span_s = (t1 - t0) / 1000.0
    k = len(run.tenant_names)
    tenant = run.tenant[k0:]
    lat = run.latency_ms[k0:]
    for i in range(k):
        # a fresh array (percentiles_inplace reorders it); gathering at flatnonzero's sorted indices is about
        # three times faster than indexing by the boolean mask, whose random pattern defeats prediction
        li = lat[np.flatnonzero(tenant == i)] if k > 1 else lat.copy()
        out[i, 0] = li.size
        if li.size:
            out[i, 1] = li.mean()
            out[i, 2:5] = percentiles_inplace(li, (50.0, 95.0, 99.0))
    if span_s > 0:  # departures in [t0, t1] per tenant: all of them less the few outside (cheaper to pick)
        outside = (run.departure_ms < t0) | (run.departure_ms > t1)
        counts = np.bincount(run.tenant, minlength=k) - np.bincount(run.tenant[outside], minlength=k)
        out[:, 5] = counts[:k] / span_s
    return out, busy_fraction(run.busy_start_ms, run.busy_end_ms, t0, t1)


def simulate_device(
    device: DeviceSpec,
    tenants: Sequence[Tenant],
    *,
    requests: int = 200_000,
    replications: int = 10,
    seed: int = 0,
    warmup: float = 0.1,
    confidence: float = 0.95,
    engine: EngineChoice = "auto",
    progress: Callable[[int, int], None] | None = None,
) -> DeviceSimResult:
    """Simulate ``device`` shared by ``tenants``; per-tenant latency (ms) and throughput (req/s) CIs.

    ``requests`` arrivals in total per replication across tenants (replay tenants: their traces instead);
    the first ``warmup`` fraction of each replication's arrivals is excluded from latency statistics and
    the measurement window runs from the first measured arrival to the last arrival. Each statistic is
    computed per replication, then averaged with a Student-t interval at ``confidence``. ``engine``
    forces a path (``"lindley"``, ``"sweep"`` or ``"event"``); ``"auto"`` picks one (:func:`choose_engine`).
    ``progress(done, replications)`` is called as each replication completes. Same arguments give
    bit-identical results.
    """
    _check_tenants(tenants)
    _check_requests(requests)
    _check_device(device)
    if isinstance(replications, bool) or not isinstance(replications, (int, np.integer)) or replications < 1:
        raise ValueError(f"replications must be an integer >= 1, got {replications!r}")
    if not 0.0 <= warmup < 1.0:
        raise ValueError(f"warmup must be a fraction in [0, 1), got {warmup}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    which = choose_engine(device, tenants, engine)

    per_tenant = np.empty((replications, len(tenants), 6))
    util = np.empty(replications)
    events = 0
    for r, ss in enumerate(np.random.SeedSequence(seed).spawn(replications)):
        run = simulate_raw(device, tenants, requests=requests, seed=ss, engine=which)
        per_tenant[r], util[r] = replication_stats(run, warmup)
        events += run.events
        if progress is not None:
            progress(r + 1, replications)

    def ci(col: np.ndarray) -> CI:
        return confidence_interval(col, confidence)

    stats = {
        t.name: TenantSimStats(
            name=t.name,
            completed=int(per_tenant[:, i, 0].sum()),
            mean_ms=ci(per_tenant[:, i, 1]),
            p50_ms=ci(per_tenant[:, i, 2]),
            p95_ms=ci(per_tenant[:, i, 3]),
            p99_ms=ci(per_tenant[:, i, 4]),
            throughput_rps=ci(per_tenant[:, i, 5]),
        )
        for i, t in enumerate(tenants)
    }
    return DeviceSimResult(
        tenants=stats, utilization=ci(util), replications=replications, engine=which, events=events
    )
