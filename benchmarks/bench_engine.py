"""Event-engine throughput: a 4-app processor-sharing device through edgemux and through Ciw.

Model: 4 apps, Poisson arrivals of 175 req/s each, exponential service of mean 1 ms, egalitarian PS
(rho = 0.7; analytic mean response S/(1 - rho) = 3.333 ms). edgemux runs ``simulate_device`` with the
event engine (and, on one workload, the heap-free sweep that ``engine="auto"`` picks for such a device); Ciw runs the same network with ``ciw.PSNode`` (number_of_servers = inf, threshold 1, i.e.
egalitarian PS). Both are timed end to end (sampling, simulation, statistics) on wall clock.

Events are counted the same way for both: arrivals + departures (the events that change the state),
i.e. 2 per completed request. Cancelled/rescheduled departure entries are not counted.
The mean response times must agree within their confidence intervals: a correctness cross-check.

    .venv/bin/python benchmarks/bench_engine.py [--quick]
"""

from __future__ import annotations

import argparse
import math
import platform
import time

import numpy as np

from edgemux.cluster.workload import Arrival, DeviceSpec, Discipline, Tenant
from edgemux.profiles.distributions import Exponential
from edgemux.profiles.types import DeviceKind
from edgemux.sim.run import sample_workload, run_workload, simulate_device
from edgemux.sim.stats import confidence_interval

APPS = 4
RATE_RPS = 175.0
SERVICE_MS = 1.0
WARMUP = 0.1


def bench_sweep(requests: int) -> tuple[float, float, bool]:
    """The same device through the event engine and through the sweep (``sim.sweep``), one pre-sampled
    workload each: events/s of each loop and whether their departures are identical."""
    device = DeviceSpec("gpu0", DeviceKind.GPU_EMBEDDED, Discipline.PS)
    tenants = [Tenant(f"app{i}", f"m{i}", Arrival.poisson(RATE_RPS), Exponential(SERVICE_MS)) for i in range(APPS)]
    w = sample_workload(tenants, requests, seed=2)
    t0 = time.perf_counter()
    evt = run_workload(device, tenants, w, engine="event")
    t1 = time.perf_counter()
    swp = run_workload(device, tenants, w, engine="sweep")
    t2 = time.perf_counter()
    return evt.events / (t1 - t0), swp.events / (t2 - t1), bool(np.array_equal(evt.departure_ms, swp.departure_ms))


def bench_edgemux(requests: int, reps: int) -> tuple[float, int, object, float]:
    device = DeviceSpec("gpu0", DeviceKind.GPU_EMBEDDED, Discipline.PS)
    tenants = [Tenant(f"app{i}", f"m{i}", Arrival.poisson(RATE_RPS), Exponential(SERVICE_MS)) for i in range(APPS)]
    t0 = time.perf_counter()
    res = simulate_device(device, tenants, requests=requests, replications=reps, seed=0, warmup=WARMUP, engine="event")
    secs = time.perf_counter() - t0
    # the event loop alone (workload pre-sampled), for one replication
    w = sample_workload(tenants, requests, seed=1)
    t1 = time.perf_counter()
    raw = run_workload(device, tenants, w, engine="event")
    loop_secs = time.perf_counter() - t1
    return secs, res.events, res, raw.events / loop_secs


def bench_ciw(requests: int, reps: int) -> tuple[float, int, list[float]]:
    import ciw

    lam_ms = RATE_RPS / 1000.0
    horizon = requests / (APPS * lam_ms)  # ms, so that about `requests` arrive
    net = ciw.create_network(
        arrival_distributions={f"Class {i}": [ciw.dists.Exponential(rate=lam_ms)] for i in range(APPS)},
        service_distributions={f"Class {i}": [ciw.dists.Exponential(rate=1.0 / SERVICE_MS)] for i in range(APPS)},
        number_of_servers=[math.inf],
    )
    means: list[float] = []
    events = 0
    t0 = time.perf_counter()
    for r in range(reps):
        ciw.seed(1000 + r)
        q = ciw.Simulation(net, node_class=ciw.PSNode)
        q.simulate_until_max_time(horizon)
        recs = q.get_all_records()
        events += 2 * len(recs)
        resp = np.array([x.exit_date - x.arrival_date for x in recs if x.arrival_date >= WARMUP * horizon])
        means.append(float(resp.mean()))
    return time.perf_counter() - t0, events, means


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller runs")
    args = ap.parse_args()
    em_req, em_reps = (20_000, 5) if args.quick else (200_000, 10)
    ciw_req, ciw_reps = (10_000, 5) if args.quick else (50_000, 10)
    rho = APPS * RATE_RPS / 1000.0 * SERVICE_MS
    analytic = SERVICE_MS / (1 - rho)
    print(f"4-app processor-sharing device, Poisson arrivals, exponential service, rho = {rho:.2f}")
    print(f"python {platform.python_version()}, {platform.machine()}; events = arrivals + departures")

    secs, ev, res, loop_eps = bench_edgemux(em_req, em_reps)
    per_app = [res.tenants[f"app{i}"].mean_ms for i in range(APPS)]  # type: ignore[attr-defined]
    em_mean = float(np.mean([c.value for c in per_app]))
    em_half = max(c.half_width for c in per_app)
    em_eps = ev / secs
    print(f"edgemux event engine: {em_reps} x {em_req:,} requests, {ev:,} events in {secs:.2f} s "
          f"= {em_eps:,.0f} events/s end to end ({loop_eps:,.0f} events/s event loop only) "
          f"[target 200,000: {em_eps / 200_000:.2f} x]")

    evt_eps, swp_eps, same = bench_sweep(em_req)
    print(f"sweep (what `auto` runs for this device): {swp_eps:,.0f} events/s vs the event loop's {evt_eps:,.0f} "
          f"on one workload of {em_req:,} requests = {swp_eps / evt_eps:.1f} x; departures "
          f"{'identical' if same else 'DIFFER'}")

    ciw_secs, ciw_ev, ciw_means = bench_ciw(ciw_req, ciw_reps)
    ciw_ci = confidence_interval(ciw_means, 0.95)
    ciw_eps = ciw_ev / ciw_secs
    print(f"Ciw PSNode:           {ciw_reps} x ~{ciw_req:,} requests, {ciw_ev:,} events in {ciw_secs:.2f} s "
          f"= {ciw_eps:,.0f} events/s")

    print(f"mean response (ms): analytic {analytic:.4f} | edgemux {em_mean:.4f} (per-app 95% CI ±{em_half:.4f}) "
          f"| Ciw {ciw_ci.value:.4f} ± {ciw_ci.half_width:.4f}")
    # the apps are symmetric: compare edgemux's app-average with Ciw's, with a combined half width
    diff = abs(em_mean - ciw_ci.value)
    tol = math.hypot(em_half, ciw_ci.half_width)
    agree = diff <= tol
    print(f"cross-check: |edgemux - Ciw| = {diff:.4f} ms vs combined half width {tol:.4f} ms -> "
          f"{'AGREE' if agree else 'DISAGREE'}; both vs analytic: "
          f"{'ok' if abs(em_mean - analytic) <= em_half * 1.5 else 'off'} / "
          f"{'ok' if ciw_ci.contains(analytic) else 'off'}")
    print(f"speed ratio edgemux / Ciw = {em_eps / ciw_eps:.1f} x")


if __name__ == "__main__":
    main()
