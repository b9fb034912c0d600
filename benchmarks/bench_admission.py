"""Time per admission decision on a large, full cluster (issue 3: median <= 1 ms, p99 <= 5 ms for ``ibis`` and
``edgemux`` on 100 nodes x 4 devices already holding 2000 tenants).

Cluster: ``--nodes`` nodes (default 100), each with 16 CPU cores, 64 GB host memory, 2 Edge TPUs (FCFS,
``ibis-edgetpu`` profiles) and 2 Jetson-Nano-class embedded GPUs (GPU time-sharing, ``ibis-jetson-nano``
profiles). Assumptions (not from a paper): TPU memory 64 MB (model data beyond the 8 MB SRAM streams from
the host and pays the switch overhead, as Ibis models it), GPU memory 8 GB.

Tenants: seeded random apps over every catalog model with a batch-1 profile on one of those catalogs; rate
0.2-2 req/s (Poisson) or 1-5 FPS (periodic); half shared (AI as a Service); SLO = 3-6 x the model's fastest
service time + 50 ms at the mean (80 %) or p95 (20 %), loose enough that most are admitted. The cluster is
filled by each policy in turn, admitting (and committing to the snapshot) apps until ``--tenants`` are placed.
Then ``--decisions`` further apps from the same generator are decided on the full snapshot without
committing, each timed with ``time.perf_counter``; median and p99 are printed with their ratio to the
targets. Knapsack (latency-oblivious) is shown for reference.

Timing: each decision is timed ``--repeat`` times (default 3) and its fastest time kept, as ``timeit`` does,
so that a scheduler pause on this shared 2-core machine is not charged to the policy; the p99 of the
first (single) timings is printed beside. The process first raises glibc's mmap threshold
(``edgemux.runtime.process.tune_allocator``, as edgemux's long-running processes do: the batched Edge TPU
check allocates arrays of a few hundred kB whose fresh pages would otherwise fault on every decision);
``--default-allocator`` leaves it alone.

``--baseline`` also times, on the same full snapshot: ``NAME-per-device``, the same policy checking
device by device (no batch: ``fcfs_batch``, the time-sharing screen and the vectorized Edge TPU means
off; decisions must be identical), and ``NAME-before``, the procedure before the certified tail bounds:
``tails="estimate"`` device by device, every estimate from ``predict_device`` (the P-K tail inverted by
DFT for every tenant of an Edge TPU with a percentile SLO). Its decisions differ where the certified bound
is more cautious than the estimate; the count is printed.

Where the time goes: a percentile SLO on an Edge TPU is decided from the lattice bounds of
``perf.latticebounds``, one batched call over the Edge TPU candidates in preference order (a coarse lattice
for all, finer ones for what stays open, up to the first certain fit); apps that fit nowhere visit every
candidate, so they set the p99.

    .venv/bin/python benchmarks/bench_admission.py [--quick] [--baseline] [--policies ibis,edgemux,knapsack]
                                                   [--repeat 3] [--default-allocator]
    .venv/bin/python benchmarks/bench_admission.py --profile ibis    # cProfile of the timed decisions
"""

from __future__ import annotations

import argparse
import cProfile
import math
import platform
import pstats
import random
import statistics
import time

from edgemux import policies
from edgemux.cluster.state import App, Cluster, Device, Node, Placement, Slo
from edgemux.cluster.workload import Discipline
from edgemux.policies.edgemux import Edgemux
from edgemux.perf.device import predict_device
from edgemux.policies.base import device_spec
from edgemux.policies.feasibility import judge, predict_means, slo_value
from edgemux.policies.ibis import Ibis
from edgemux.profiles.catalog import load_catalog
from edgemux.profiles.types import DeviceKind
from edgemux.runtime.process import tune_allocator

TARGET_MEDIAN_MS = 1.0
TARGET_P99_MS = 5.0
CATALOGS = ("ibis-edgetpu", "ibis-jetson-nano")


class _Before:
    """The decision procedure before the vectorized screens and the certified tail bounds: ``precheck``
    device by device, and the full latency check on every candidate visited, every estimate from
    ``predict_device`` (the P-K tail inverted by DFT for every tenant of an Edge TPU with a percentile
    SLO), no bound consulted."""

    def __init__(self) -> None:
        super().__init__(tails="estimate")  # type: ignore[call-arg]

    def screened(self) -> bool:
        return False

    def _check(self, app, snapshot, cand):  # type: ignore[no-untyped-def]
        return self._latency(app, snapshot, cand)

    def _latency(self, app, snapshot, cand):  # type: ignore[no-untyped-def]
        owners = [app if t.name == app.name else snapshot.apps[t.name] for t in cand.tenants]
        spec = device_spec(cand.device)
        if all(o.slo.stat == "mean" for o in owners):
            values, method = dict(predict_means(spec, cand.tenants)), "mean"
        else:
            est = predict_device(spec, cand.tenants)
            values = {t.name: slo_value(est[t.name], o.slo.stat) for t, o in zip(cand.tenants, owners)}
            method = next(iter(est.values())).method
        return judge(app, cand, owners, values, method)


class IbisBefore(_Before, Ibis):
    pass


class EdgemuxBefore(_Before, Edgemux):
    pass


class _PerDevice:
    """The same policy checking every candidate device by device (no batched Edge TPU check, no
    time-sharing screen): identical decisions, for a before/after of the batching alone."""

    def vector_latency(self) -> bool:
        return False


class IbisPerDevice(_PerDevice, Ibis):
    pass


class EdgemuxPerDevice(_PerDevice, Edgemux):
    pass


BASELINES = {"ibis": (IbisPerDevice, IbisBefore), "edgemux": (EdgemuxPerDevice, EdgemuxBefore)}


def make_cluster(nodes: int) -> Cluster:
    out = []
    for i in range(nodes):
        name = f"node-{i + 1}"
        devs = (
            Device(name, "tpu0", DeviceKind.EDGETPU, Discipline.FCFS, 64.0, "ibis-edgetpu"),
            Device(name, "tpu1", DeviceKind.EDGETPU, Discipline.FCFS, 64.0, "ibis-edgetpu"),
            Device(name, "gpu0", DeviceKind.GPU_EMBEDDED, Discipline.GPU_TIMESHARE, 8192.0, "ibis-jetson-nano"),
            Device(name, "gpu1", DeviceKind.GPU_EMBEDDED, Discipline.GPU_TIMESHARE, 8192.0, "ibis-jetson-nano"),
        )
        out.append(Node(name, 16.0, 65536.0, devs))
    return Cluster(tuple(out))


def model_floors() -> dict[str, float]:
    """Every model with a batch-1 profile in the benchmark's catalogs -> its fastest service time (ms)."""
    cat = load_catalog()
    floors: dict[str, float] = {}
    for m in cat.models():
        times = [p.service.mean for p in cat.find_all(m) if p.name.split("/")[0] in CATALOGS and 1 in p.exec]
        if times:
            floors[m] = min(times)
    return floors


class AppGen:
    def __init__(self, seed: int, prefix: str) -> None:
        self.rng = random.Random(seed)
        self.floors = model_floors()
        self.models = sorted(self.floors)
        self.prefix = prefix
        self.n = 0

    def __call__(self) -> App:
        r = self.rng
        self.n += 1
        model = r.choice(self.models)
        periodic = r.random() < 0.3
        rate = r.uniform(1.0, 5.0) if periodic else r.uniform(0.2, 2.0)
        stat = "p95" if r.random() < 0.2 else "mean"
        slo = self.floors[model] * r.uniform(3.0, 6.0) + 50.0
        return App(name=f"{self.prefix}{self.n}", model=model, rate_rps=rate, slo=Slo(slo, stat),
                   periodic=periodic, shared=r.random() < 0.5)


def fill(policy: policies.Policy, cluster: Cluster, tenants: int, seed: int) -> tuple[policies.Snapshot, int]:
    snap = policies.Snapshot(cluster)
    _ = snap.device_loads, snap.node_loads  # build the caches once; with_placement carries them over
    gen = AppGen(seed, "t")
    tried = 0
    while len(snap.placements) < tenants and tried < 4 * tenants:
        app = gen()
        tried += 1
        d = policy.decide(app, snap)
        if isinstance(d, Placement):
            snap = snap.with_placement(app, d)
    return snap, tried


def _outcome(d: object) -> object:
    """A decision's outcome: the placement itself, or that it was rejected and why."""
    return d if isinstance(d, Placement) else ("rejected", getattr(d, "constraint", None))


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    k = min(len(s) - 1, max(0, int(round(q / 100.0 * (len(s) - 1)))))
    return s[k]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="20 nodes, 400 tenants, 200 decisions")
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--tenants", type=int, default=2000)
    ap.add_argument("--decisions", type=int, default=500)
    ap.add_argument("--policies", default="ibis,edgemux,knapsack")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--baseline", action="store_true",
                    help="also time ibis/edgemux checking device by device, and the procedure before the certified "
                         "tail bounds, on the same snapshot")
    ap.add_argument("--repeat", type=int, default=3, help="timings per decision; the fastest is kept")
    ap.add_argument("--default-allocator", action="store_true", help="leave glibc's mmap threshold alone")
    ap.add_argument("--profile", metavar="POLICY", help="cProfile the timed decisions of this policy "
                    "(a name as printed, e.g. ibis or ibis-before)")
    a = ap.parse_args()
    if a.quick:
        a.nodes, a.tenants, a.decisions = 20, 400, 200
    if a.repeat < 1:
        ap.error(f"--repeat must be at least 1, got {a.repeat}")
    tuned = False if a.default_allocator else tune_allocator()
    cluster = make_cluster(a.nodes)
    print(f"python {platform.python_version()} on {platform.machine()}; {a.nodes} nodes x 4 devices "
          f"({len(cluster.devices)} devices), {a.tenants} tenants, {a.decisions} timed decisions, seed {a.seed}; "
          f"fastest of {a.repeat} timings per decision; allocator {'tuned' if tuned else 'default'}")
    print(f"{'policy':<19} {'tenants':>8} {'fill s':>7} {'admit %':>8} {'median ms':>10} {'p99 ms':>8} "
          f"{'max ms':>8} {'median/1ms':>11} {'p99/5ms':>8} {'single p99':>11}")
    for name in a.policies.split(","):
        policy = policies.get(name)
        t0 = time.perf_counter()
        snap, tried = fill(policy, cluster, a.tenants, a.seed)
        fill_s = time.perf_counter() - t0
        gen = AppGen(a.seed + 1000, "new")
        apps = [gen() for _ in range(a.decisions)]
        variants = [(name, policy)]
        if a.baseline and name in BASELINES:
            per_device, before = BASELINES[name]
            variants += [(f"{name}-per-device", per_device()), (f"{name}-before", before())]
        first: list[object] | None = None
        for label, pol in variants:
            for app in apps[:20]:  # warm-up: memoized profile lookups, first-call costs
                pol.decide(app, snap)
            times: list[float] = []
            single: list[float] = []
            decisions: list[object] = []
            placed = 0
            prof = cProfile.Profile() if a.profile == label else None
            for app in apps:
                if prof is not None:
                    prof.enable()
                best = math.inf
                for k in range(a.repeat):
                    t = time.perf_counter()
                    d = pol.decide(app, snap)
                    dt = (time.perf_counter() - t) * 1000.0
                    best = min(best, dt)
                    if k == 0:
                        single.append(dt)
                times.append(best)
                if prof is not None:
                    prof.disable()
                placed += isinstance(d, Placement)
                decisions.append(d)
            med, p99 = statistics.median(times), percentile(times, 99)
            print(f"{label:<19} {len(snap.placements):>8} {fill_s:>7.1f} {100.0 * placed / len(apps):>8.1f} "
                  f"{med:>10.3f} {p99:>8.3f} {max(times):>8.3f} {med / TARGET_MEDIAN_MS:>11.2f} "
                  f"{p99 / TARGET_P99_MS:>8.2f} {percentile(single, 99):>11.3f}", flush=True)
            if first is None:
                first = decisions
            elif label.endswith("-per-device"):
                print(f"  {label}: decisions identical to {name}'s: {'yes' if decisions == first else 'NO'}")
            else:
                # a rejection's numbers differ by construction (certified bound vs estimate): compare outcomes
                differ = [(x, y) for x, y in zip(first, decisions) if _outcome(x) != _outcome(y)]
                only = sum(isinstance(y, Placement) and not isinstance(x, Placement) for x, y in differ)
                moved = sum(isinstance(y, Placement) and isinstance(x, Placement) for x, y in differ)
                print(f"  {label}: {len(differ)} of {len(apps)} outcomes differ from {name}'s: {moved} placed "
                      f"on other devices (a device the bound could not certify), {only} placed by the estimate "
                      f"only, {len(differ) - moved - only} other")
            if prof is not None:
                pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
        if len(snap.placements) < a.tenants:
            print(f"  note: only {len(snap.placements)} of {a.tenants} tenants admitted after {tried} tries")
    print(f"targets: median <= {TARGET_MEDIAN_MS} ms, p99 <= {TARGET_P99_MS} ms per decision "
          "(ratio <= 1 meets the target; knapsack is a reference, not a target)")


if __name__ == "__main__":
    main()
