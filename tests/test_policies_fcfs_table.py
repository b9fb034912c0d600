"""``policies.fcfs_table``: the vectorized Edge TPU means equal ``ibis.predict_means`` device by device, and
the mean screen never disagrees with ``Ibis._check`` (and finds every rejection the means alone decide).

Snapshots: the admission benchmark's cluster (``ibis-edgetpu`` / ``ibis-jetson-nano`` profiles) filled by
``ibis`` as the benchmark does, and "wild" ones filled by direct placement (no admission control), so that
devices are overloaded, CPU stages unstable, models shared, and one device per snapshot holds only periodic
cameras (the worst-case bound of ``perf.periodic`` caps the means there)."""

from __future__ import annotations

import math
import random
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest

from edgemux.cluster.state import App, Cluster, Device, Node, Placement, Share, Slo
from edgemux.cluster.workload import Discipline, Tenant
from edgemux.perf.periodic import periodic_fcfs_bound
from edgemux.perf.result import Unstable
from edgemux.policies.base import Rejection, Snapshot, device_spec, resolve_profile, tenant_for
from edgemux.policies.fcfs_table import SCREEN_TOL, fcfs_mean_screen, fcfs_means, fcfs_table
from edgemux.policies.fcfs_table import outcome as _outcome
from edgemux.policies.feasibility import Candidate, Fit, Pending, predict_means
from edgemux.policies.ibis import Ibis
from edgemux.profiles.distributions import Empirical, Exponential, Gamma
from edgemux.profiles.types import DeviceKind

REPO = Path(__file__).resolve().parent.parent


sys.path.insert(0, str(REPO / "benchmarks"))   # the admission benchmark's cluster and app generator
import bench_admission as bench  # noqa: E402
FLOORS = bench.model_floors()
TPU = Device("probe", "tpu0", DeviceKind.EDGETPU, Discipline.FCFS, 64.0, "ibis-edgetpu")
# the models with an Edge TPU profile in the benchmark's catalog
TPU_MODELS = sorted(m for m in FLOORS
                    if resolve_profile(App("x", m, 1.0, Slo(1.0)), TPU, Snapshot(Cluster(())).catalog))


def wild_app(rng: random.Random, name: str, periodic: bool | None = None) -> App:
    """A random app: shared or private model, Poisson or camera, mean/p50/p95/p99 SLO, some with a CPU
    stage (a few of them overloaded) and a network latency."""
    model = rng.choice(TPU_MODELS)
    if periodic is None:
        periodic = rng.random() < 0.35
    rate = rng.uniform(1.0, 10.0) if periodic else rng.uniform(0.2, 8.0)
    cores, cpu_ms = (rng.choice([0.5, 1.0, 2.0]), rng.uniform(1.0, 40.0)) if rng.random() < 0.25 else (0.0, 0.0)
    stat = rng.choices(["mean", "p95", "p99", "p50"], [8, 2, 1, 1.5])[0]   # p50: no bound settles it, the estimate does
    slo = FLOORS[model] * rng.uniform(1.5, 10.0) + rng.uniform(10.0, 150.0)
    return App(name, model, rate, Slo(slo, stat), periodic=periodic, shared=rng.random() < 0.5,
               cpu_cores=cores, cpu_ms=cpu_ms, network_ms=rng.choice([0.0, rng.uniform(0.0, 20.0)]))


def wild_snapshot(seed: int, nodes: int = 4, tenants: int = 28) -> Snapshot:
    """The benchmark's cluster filled by direct placement on random Edge TPUs: no admission, so some
    devices are overloaded; ``node-1/tpu0`` gets only cameras, at most three, so the periodic worst-case
    bound applies there."""
    rng = random.Random(seed)
    snap = Snapshot(bench.make_cluster(nodes))
    tpus = [d for d in snap.cluster.devices.values() if d.discipline is Discipline.FCFS]
    cams = 0
    for k in range(tenants):
        device = rng.choice(tpus)
        only_cams = device.path == tpus[0].path
        if only_cams and cams >= 3:
            continue
        app = wild_app(rng, f"w{k}", periodic=True if only_cams else None)
        if only_cams:
            app = replace(app, rate_rps=rng.uniform(1.0, 5.0))
            cams += 1
        profile = resolve_profile(app, device, snap.catalog)
        assert profile is not None
        snap = snap.with_placement(app, Placement(app.name, (Share(device.path, 1.0, profile.name),),
                                                  cpu_node=device.node))
    return snap


@pytest.fixture(scope="module")
def filled() -> Snapshot:
    """The admission benchmark's workload, admitted by ``ibis`` (4 nodes, 70 tenants)."""
    snap, _ = bench.fill(Ibis(), bench.make_cluster(4), 70, 3)
    return snap


@dataclass(frozen=True)
class Cand:
    index: int
    device: Device
    tenants: list[Tenant]


def all_candidates(snap: Snapshot, new: Tenant) -> list[Cand]:
    """Every Edge TPU of the snapshot with ``new`` added (no resource or utilization check)."""
    arr = snap.arrays
    return [Cand(i, d, [*arr.loads[i].tenants, new]) for i, d in enumerate(arr.devices)
            if d.discipline is Discipline.FCFS]


def new_tenants(rng: random.Random, snap: Snapshot, n: int) -> list[Tenant]:
    """Random new tenants: apps' tenants on the ``ibis-edgetpu`` profiles, some of an app already placed
    (its shared or private model is loaded somewhere), some with an execution time the catalog does not
    have (empirical: bounded; exponential, gamma: unbounded)."""
    placed = sorted(a for a, x in snap.apps.items() if x.model in TPU_MODELS)
    out = []
    for k in range(n):
        app = wild_app(rng, f"new{k}")
        if placed and rng.random() < 0.3:  # the same model key as a placed app (shared: the same copy)
            other = snap.apps[rng.choice(placed)]
            app = replace(app, model=other.model, shared=other.shared)
        profile = resolve_profile(app, TPU, snap.catalog)
        assert profile is not None
        t = tenant_for(app, profile)
        r = rng.random()
        e = t.service.mean
        if r < 0.1:
            t = replace(t, service=Empirical((0.5 * e, e, 1.5 * e)))
        elif r < 0.15:
            t = replace(t, service=Exponential(e))
        elif r < 0.2:
            t = replace(t, service=Gamma(e, 0.3))
        out.append(t)
    return out


def _check_means(snap: Snapshot, new: Tenant, seen: dict[str, int]) -> None:
    cands = all_candidates(snap, new)
    got = fcfs_means(snap, cands, [c.tenants[-1] for c in cands])
    assert len(got) == len(cands)
    for c, values in zip(cands, got):
        exact = predict_means(device_spec(c.device), c.tenants)
        assert len(values) == len(c.tenants)
        bound = periodic_fcfs_bound(c.tenants)
        for t, x in zip(c.tenants, values):
            y = exact[t.name]
            if isinstance(y, Unstable):
                assert x == math.inf, (c.device.path, t.name, x, y)
                seen["unstable"] += 1
            else:
                # numpy sums in another order than math.fsum: a relative 1e-9 is ~1e5 times the error seen
                assert x == pytest.approx(y, rel=1e-9, abs=0.0), (c.device.path, t.name, x, y)
                seen["finite"] += 1
                seen["capped"] += bound is not None and y == bound
            seen["cpu"] += t.cpu is not None
        models = [t.model for t in c.tenants]
        seen["shared"] += len(set(models)) < len(models)


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_means_equal_predict_means(seed: int) -> None:
    snap = wild_snapshot(seed)
    rng = random.Random(100 + seed)
    seen = {"unstable": 0, "finite": 0, "capped": 0, "cpu": 0, "shared": 0}
    for new in new_tenants(rng, snap, 60):
        _check_means(snap, new, seen)
    # the cases the formulas branch on were all met
    assert all(v > 0 for v in seen.values()), seen


def test_means_on_the_filled_benchmark_snapshot(filled: Snapshot) -> None:
    rng = random.Random(7)
    seen = {"unstable": 0, "finite": 0, "capped": 0, "cpu": 0, "shared": 0}
    for new in new_tenants(rng, filled, 30):
        _check_means(filled, new, seen)
    assert seen["finite"] > 0 and seen["shared"] > 0, seen


def _means_decide(app: App, snap: Snapshot, c: Candidate) -> str | None:
    """What ``_check`` decides from the exact means alone (its first ``_outcome``), ``None`` when it is
    not a rejection or some mean is within the screen's tolerance of its SLO."""
    owners = [app if t.name == app.name else snap.apps[t.name] for t in c.tenants]
    means = predict_means(device_spec(c.device), c.tenants)
    verdicts = []
    for t, o in zip(c.tenants, owners):
        v = means[t.name]
        if o.slo.stat == "mean":
            if not isinstance(v, Unstable) and abs(v - o.slo.latency_ms) <= SCREEN_TOL * o.slo.latency_ms:
                return None
            verdicts.append("slo" if isinstance(v, Unstable) or v > o.slo.latency_ms else "pass")
        else:
            verdicts.append("open")   # decided by the quantile: the bounds or (p50, a CPU stage) the exact law
    r = _outcome(verdicts)
    return r if r == "slo" else None


def _check_screen(policy: Ibis, snap: Snapshot, app: App, counts: dict[str, int], every: bool) -> None:
    """The screen against ``_check`` on the candidates of ``policy.screen`` (``every``: on every Edge TPU,
    overloaded ones included)."""
    cands, _ = policy.screen(app, snap)
    if every:
        profile = resolve_profile(app, TPU, snap.catalog)
        assert profile is not None
        new = policy._new_tenant(app, profile, 0.0)
        arr = snap.arrays
        cands = [Candidate(i, d, profile, arr.loads[i].tenants, new, 0.0, False)
                 for i, d in enumerate(arr.devices) if d.discipline is Discipline.FCFS]
    sure = fcfs_mean_screen(app, snap, cands)
    assert all(snap.arrays.fcfs[i] for i in sure)  # other devices are ignored
    for c in cands:
        if c.device.discipline is not Discipline.FCFS:
            continue
        r = policy._check(app, snap, c)
        expect = _means_decide(app, snap, c)
        if c.index in sure:
            assert isinstance(r, Pending | Rejection) and r.constraint == sure[c.index], (c.device.path, r, sure)
            assert expect == sure[c.index]
            counts[sure[c.index]] += 1
        else:
            # complete: every rejection the means decide away from the tolerance band is found
            assert expect is None, (c.device.path, expect)
            counts["left"] += 1
            counts["fit"] += isinstance(r, Fit)


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_screen_agrees_with_check_wild(seed: int) -> None:
    snap = wild_snapshot(seed)
    rng = random.Random(200 + seed)
    policy = Ibis(max_utilization=1.0)
    counts = {"slo": 0, "left": 0, "fit": 0}
    for k in range(40):
        _check_screen(policy, snap, wild_app(rng, f"new{k}"), counts, every=k % 2 == 0)
    assert all(v > 0 for v in counts.values()), counts


def test_screen_agrees_with_check_filled(filled: Snapshot) -> None:
    gen = bench.AppGen(11, "new")
    policy = Ibis()
    counts = {"slo": 0, "left": 0, "fit": 0}
    for _ in range(40):
        _check_screen(policy, filled, gen(), counts, every=False)
    assert counts["slo"] > 0 and counts["fit"] > 0, counts


# ---------------------------------------------------------------------------------- hand-made devices


def one_tpu(existing: list[App]) -> Snapshot:
    """One node with one Edge TPU (``ibis-edgetpu``) and one GPU, holding ``existing``."""
    tpu = Device("n1", "tpu0", DeviceKind.EDGETPU, Discipline.FCFS, 64.0, "ibis-edgetpu")
    gpu = Device("n1", "gpu0", DeviceKind.GPU_EMBEDDED, Discipline.GPU_TIMESHARE, 8192.0, "ibis-jetson-nano")
    snap = Snapshot(Cluster((Node("n1", 16.0, 65536.0, (tpu, gpu)),)))
    for a in existing:
        profile = resolve_profile(a, tpu, snap.catalog)
        assert profile is not None
        snap = snap.with_placement(a, Placement(a.name, (Share(tpu.path, 1.0, profile.name),), cpu_node="n1"))
    return snap


def _verdict(snap: Snapshot, app: App) -> tuple[dict[int, str], Fit | Rejection | Pending]:
    policy = Ibis()
    cands, _ = policy.screen(app, snap)
    assert [c.device.discipline for c in cands] == [Discipline.FCFS, Discipline.GPU_TIMESHARE]
    return fcfs_mean_screen(app, snap, cands), policy._check(app, snap, cands[0])


def test_screen_rejects_when_an_existing_tenant_is_pushed_over_its_slo() -> None:
    # mobilenet_v2 alone at 10 req/s: mean 4.91 ms + a little queueing; the SLO leaves about 1 ms of room
    alone = one_tpu([App("cam", "mobilenet_v2", 10.0, Slo(1.0))])
    t = alone.tenants(alone.cluster.devices["n1/tpu0"])[0]
    mean = predict_means(device_spec(alone.cluster.devices["n1/tpu0"]), [t])["cam"]
    assert isinstance(mean, float)
    snap = one_tpu([App("cam", "mobilenet_v2", 10.0, Slo(mean + 1.0))])
    # a second model at 5 req/s adds switches and queueing: "cam" goes over, the new app (loose SLO) would not
    new = App("new", "inception_v3", 5.0, Slo(1000.0))
    sure, r = _verdict(snap, new)
    assert sure == {0: "slo"}
    assert isinstance(r, Rejection) and r.constraint == "slo" and r.tenant == "cam"


def test_screen_leaves_a_feasible_device_to_the_exact_path() -> None:
    snap = one_tpu([App("cam", "mobilenet_v2", 10.0, Slo(500.0)), App("p", "mobilenet_v1", 2.0, Slo(300.0, "p95"))])
    sure, r = _verdict(snap, App("new", "inception_v3", 5.0, Slo(1000.0)))
    assert sure == {} and isinstance(r, Fit)


def test_screen_new_app_order_and_the_exact_path() -> None:
    # the existing tenant has a p50 SLO: no bound settles it, the exact path does (pass or slo), so the new
    # app over its mean SLO after it is a slo either way, and with a loose SLO the exact path fits it
    p50 = App("c", "mobilenet_v2", 10.0, Slo(500.0, "p50"), cpu_cores=1.0, cpu_ms=2.0)
    sure, r = _verdict(one_tpu([p50]), App("new", "inception_v3", 5.0, Slo(1.0)))
    assert sure == {0: "slo"} and isinstance(r, Pending | Rejection) and r.constraint == "slo"
    sure, r = _verdict(one_tpu([p50]), App("new", "inception_v3", 5.0, Slo(1000.0)))
    assert sure == {} and isinstance(r, Fit)
    # a p95 tenant with a CPU stage is estimated by the exact path (no bound settles it): it ends pass or
    # slo, so the new app over its mean SLO after it is a slo either way
    cpu = App("c", "mobilenet_v2", 10.0, Slo(500.0, "p95"), cpu_cores=1.0, cpu_ms=2.0)
    sure, r = _verdict(one_tpu([cpu]), App("new", "inception_v3", 5.0, Slo(1.0)))
    assert sure == {0: "slo"} and isinstance(r, Pending | Rejection) and r.constraint == "slo"
    # ... and with a loose SLO the exact path fits it: the screen leaves the device alone
    sure, r = _verdict(one_tpu([cpu]), App("new", "inception_v3", 5.0, Slo(1000.0)))
    assert sure == {} and isinstance(r, Fit)
    # an open p95 tenant first, then the new app over its mean SLO: slo (open tenants end pass or slo)
    p95 = App("p", "mobilenet_v2", 10.0, Slo(500.0, "p95"))
    sure, r = _verdict(one_tpu([p95]), App("new", "inception_v3", 5.0, Slo(1.0)))
    assert sure == {0: "slo"} and isinstance(r, Pending | Rejection) and r.constraint == "slo"
    # a new app with a p50 SLO: undetermined from the means, the exact path estimates its median
    sure, r = _verdict(one_tpu([p95]), App("new", "inception_v3", 5.0, Slo(900.0, "p50")))
    assert sure == {} and isinstance(r, Fit)
    sure, r = _verdict(one_tpu([p95]), App("new", "inception_v3", 5.0, Slo(1.0, "p50")))
    assert sure == {} and isinstance(r, Pending | Rejection) and r.constraint == "slo"


def test_screen_leaves_a_mean_at_its_slo_undecided() -> None:
    # "a" (mean SLO) comes before "c" (p50, a CPU stage: the exact path, which fits it): the outcome is
    # "slo" if "a" misses its SLO, else a fit; within SCREEN_TOL of the SLO the screen must not guess
    base = [App("a", "mobilenet_v2", 10.0, Slo(500.0)), App("b", "efficientnet-S", 3.0, Slo(500.0)),
            App("c", "mobilenet_v1", 1.0, Slo(500.0, "p50"), cpu_cores=1.0, cpu_ms=2.0)]
    new = App("new", "inception_v3", 5.0, Slo(1000.0))
    snap = one_tpu(base)
    cands, _ = Ibis().screen(new, snap)
    exact = predict_means(device_spec(cands[0].device), cands[0].tenants)["a"]
    assert isinstance(exact, float)
    for slo, want, check in ((exact, {}, "fit"), (exact * (1 - 1e-10), {}, "slo"),
                             (exact * (1 - 1e-6), {0: "slo"}, "slo"),
                             (exact * (1 + 1e-10), {}, "fit"),
                             (exact * (1 + 1e-6), {}, "fit")):
        s = one_tpu([replace(base[0], slo=Slo(slo)), *base[1:]])
        sure, r = _verdict(s, new)
        got = "fit" if isinstance(r, Fit) else r.constraint
        assert sure == want and got == check, (slo / exact - 1, sure, r)


def test_periodic_cap_on_a_camera_device() -> None:
    # two cameras of one model: P-K (Poisson) queueing would exceed the worst case, one frame of each
    # (rho = 0.79: the P-K wait is ~30 ms, the bound two frames, 31.7 ms, the P-K mean ~46 ms)
    snap = one_tpu([App("c0", "efficientnet-M", 25.0, Slo(200.0), periodic=True, shared=True)])
    new = App("new", "efficientnet-M", 25.0, Slo(200.0), periodic=True, shared=True)
    cands, _ = Ibis().screen(new, snap)
    got = fcfs_means(snap, cands[:1], [cands[0].tenants[-1]])[0]
    bound = periodic_fcfs_bound(cands[0].tenants)
    assert bound is not None and np.all(got == bound)
    exact = predict_means(device_spec(cands[0].device), cands[0].tenants)
    assert [exact[t.name] for t in cands[0].tenants] == pytest.approx(list(got), rel=1e-12)


def test_table_is_memoized_and_carried_blocks_are_right() -> None:
    snap = wild_snapshot(5, tenants=30)
    table = fcfs_table(snap)
    assert fcfs_table(snap) is table
    rng = random.Random(5)
    app = wild_app(rng, "late")
    dev = next(d for d in snap.cluster.devices.values() if d.discipline is Discipline.FCFS)
    profile = resolve_profile(app, dev, snap.catalog)
    assert profile is not None
    after = snap.with_placement(app, Placement(app.name, (Share(dev.path, 1.0, profile.name),), cpu_node=dev.node))
    carried = fcfs_table(after)          # untouched devices reuse their rows from ``snap``
    fresh = fcfs_table(Snapshot(after.cluster, dict(after.apps), dict(after.placements)))
    for f in ("dev", "lam", "e", "e2", "o", "model", "periodic", "top", "fixed", "slo", "stat", "model_lam",
              "start", "stop", "n_models"):
        assert np.array_equal(getattr(carried, f), getattr(fresh, f)), f
    assert carried.device_models == fresh.device_models
    i = list(after.cluster.devices).index(dev.path)
    assert [after.apps[t.name].slo.latency_ms for t in after.load(dev).tenants] == list(
        carried.slo[carried.positions(i)])


def test_non_fcfs_candidates() -> None:
    snap = one_tpu([App("a", "mobilenet_v2", 10.0, Slo(500.0))])
    app = App("new", "mobilenet_v2", 1.0, Slo(1.0))
    cands, _ = Ibis().screen(app, snap)
    gpu = [c for c in cands if c.device.discipline is Discipline.GPU_TIMESHARE]
    assert gpu and fcfs_mean_screen(app, snap, gpu) == {}
    with pytest.raises(ValueError):
        fcfs_means(snap, gpu, [c.tenants[-1] for c in gpu])
    assert fcfs_means(snap, [], []) == []
