"""policies.offline: the offline optimum against brute force, the P-K formula, and the online policies."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from edgemux.cluster.state import App, Cluster, Device, Node, Slo
from edgemux.cluster.workload import Discipline
from edgemux.errors import InputError
from edgemux.experiments.ibis_capacity import admit_order
from edgemux.perf.gpu import mps_responses, timeshare_responses
from edgemux.perf.queueing import mg1_response
from edgemux.policies import get
from edgemux.policies.base import resolve_profile, tenant_for
from edgemux.policies.offline import offline_optimum, slo_row
from edgemux.profiles.catalog import load_catalog
from edgemux.profiles.distributions import second_moment
from edgemux.profiles.types import DeviceKind
from edgemux.sim.workloads import BODYPIX, CORAL_PIE, cameras

MODELS = ("resnet18", "alexnet", "inception_v3", "resnet50", "resnet101", "vgg16")


def gpus(n: int, discipline: Discipline, memory_mb: float = 3000.0, servers: float = 1.0) -> Cluster:
    return Cluster(tuple(Node(f"n{i}", 4, 8192, (Device(f"n{i}", "gpu0", DeviceKind.GPU_EMBEDDED, discipline,
                                                       memory_mb, profile_set="ibis-jetson-nano",
                                                       servers=servers),))
                         for i in range(n)))


def random_apps(n: int, seed: int, util: tuple[float, float] = (0.1, 0.45), factor: tuple[float, float] = (1.5, 6.0)) -> list[App]:
    cat = load_catalog()
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        m = MODELS[int(rng.integers(len(MODELS)))]
        s = cat.find(m, DeviceKind.GPU_EMBEDDED, "ibis-jetson-nano").service.mean
        u = float(rng.uniform(*util))
        out.append(App(f"a{i}", m, u * 1000.0 / s, Slo(float(rng.uniform(*factor)) * s, "mean")))
    return out


def _profile(app: App, cluster: Cluster):  # noqa: ANN202
    d = next(iter(cluster.devices.values()))
    return resolve_profile(app, d, load_catalog())


def _fits_pk(apps: list[App], cluster: Cluster) -> bool:
    """P-K directly (M/G/1-FCFS, no switches in these profiles), mean SLO of every tenant."""
    if not apps:
        return True
    ps = [_profile(a, cluster) for a in apps]
    lam = sum(a.rate_rps for a in apps)
    m1 = sum(a.rate_rps * p.service.mean for a, p in zip(apps, ps)) / lam
    m2 = sum(a.rate_rps * second_moment(p.service) for a, p in zip(apps, ps)) / lam
    for a, p in zip(apps, ps):
        r = mg1_response(lam, m1, m2)
        if not isinstance(r, float):
            return False
        if r - m1 + p.service.mean > a.slo.latency_ms:
            return False
    return True


def _fits_linear(apps: list[App], cluster: Cluster) -> bool:
    """The same check through the linear rows the MILP uses (slo_row)."""
    d = next(iter(cluster.devices.values()))
    ps = {a.name: _profile(a, cluster) for a in apps}
    for a in apps:
        row = slo_row(a, ps[a.name], d, [(b, ps[b.name]) for b in apps if b is not a])
        assert row is not None
        coef, rhs = row
        if rhs < 0 or math.fsum(coef.values()) > rhs * (1 + 1e-12):
            return False
    return True


def _fits_mps(apps: list[App], cluster: Cluster) -> bool:
    if not apps:
        return True
    d = next(iter(cluster.devices.values()))
    ts = [tenant_for(a, _profile(a, cluster)) for a in apps]
    return all(isinstance(r, float) and r <= a.slo.latency_ms for r, a in zip(mps_responses(ts, d.servers), apps))


def _memory_ok(apps: list[App], cluster: Cluster) -> bool:
    d = next(iter(cluster.devices.values()))
    return sum(_profile(a, cluster).memory_total_mb for a in apps) <= d.memory_mb


def brute_force(apps: list[App], cluster: Cluster, fits, prefix: bool = False) -> int:  # noqa: ANN001
    """Every assignment of each app to a device or to nothing; the largest admitted count."""
    n_dev = len(cluster.devices)
    best = 0
    for assign in itertools.product(range(n_dev + 1), repeat=len(apps)):
        on = [[a for a, k in zip(apps, assign) if k == d] for d in range(n_dev)]
        count = sum(1 for k in assign if k < n_dev)
        if count <= best:
            continue
        if prefix and any(assign[i] == n_dev and assign[i + 1] < n_dev for i in range(len(apps) - 1)):
            continue
        if all(_memory_ok(g, cluster) and fits(g, cluster) for g in on):
            best = count
    return best


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fcfs_matches_brute_force_and_pk(seed: int) -> None:
    cluster = gpus(2, Discipline.FCFS)
    apps = random_apps(6, seed)
    bf_pk = brute_force(apps, cluster, _fits_pk)
    bf_lin = brute_force(apps, cluster, _fits_linear)
    assert bf_pk == bf_lin          # the linear rows are the P-K condition exactly
    res = offline_optimum(apps, cluster)
    assert res.optimal and res.status == "optimal"
    assert res.admitted == bf_pk
    # the assignment it returns is feasible by P-K and memory
    for path in cluster.devices:
        on = [a for a in apps if a.name in res.assignment and res.assignment[a.name][0][0] == path]
        assert _memory_ok(on, cluster) and _fits_pk(on, cluster)


@pytest.mark.parametrize("seed", [4, 5])
def test_prefix_matches_brute_force(seed: int) -> None:
    cluster = gpus(2, Discipline.FCFS)
    apps = random_apps(6, seed)
    res = offline_optimum(apps, cluster, prefix=True)
    assert res.admitted == brute_force(apps, cluster, _fits_pk, prefix=True)
    assert res.admitted <= offline_optimum(apps, cluster).admitted
    assert set(res.assignment) == {a.name for a in apps[:res.admitted]}


@pytest.mark.parametrize("seed", [6, 7])
def test_mps_matches_brute_force(seed: int) -> None:
    cluster = gpus(2, Discipline.MPS, servers=1.65)
    apps = random_apps(6, seed, util=(0.3, 0.8), factor=(1.2, 3.0))
    bf = brute_force(apps, cluster, _fits_mps)
    res = offline_optimum(apps, cluster)
    assert res.optimal and res.admitted == bf


@pytest.mark.parametrize("seed", [8, 9])
def test_timeshare_relaxation_is_necessary_and_cuts_reach_brute_force(seed: int) -> None:
    cluster = gpus(2, Discipline.GPU_TIMESHARE)
    apps = random_apps(6, seed)

    def exact(g: list[App], c: Cluster) -> bool:
        if not g:
            return True
        ts = [tenant_for(a, _profile(a, c)) for a in g]
        return all(isinstance(r, float) and r <= a.slo.latency_ms for r, a in zip(timeshare_responses(ts), g))

    # every configuration the exact bound accepts satisfies the secant rows (necessary condition)
    for k in range(1, 4):
        for g in itertools.combinations(apps, k):
            if exact(list(g), cluster):
                assert _fits_linear(list(g), cluster)
    res = offline_optimum(apps, cluster)
    assert res.optimal and res.admitted == brute_force(apps, cluster, exact)


def test_order_matters_online_first_fit_below_optimum() -> None:
    """knapsack (first fit on memory) and ibis see apps one at a time; the optimum sees the trace."""
    found = False
    for seed in range(10, 30):
        cluster = gpus(2, Discipline.FCFS)
        apps = random_apps(8, seed)
        opt = offline_optimum(apps, cluster)
        ib = admit_order(get("ibis"), cluster, apps, stop_at_first=False).admitted
        assert ib <= opt.admitted
        if ib < opt.admitted:
            found = True
            break
    assert found


def test_online_policies_never_exceed_optimum_on_a_trace() -> None:
    cluster = gpus(3, Discipline.MPS, memory_mb=4096.0, servers=1.65)
    apps = random_apps(14, 42, util=(0.2, 0.6), factor=(1.3, 4.0))
    opt = offline_optimum(apps, cluster)
    prefix = offline_optimum(apps, cluster, prefix=True)
    assert opt.optimal and prefix.optimal
    for name, options in (("ibis", {}), ("ibis", {"choice": "spread"}), ("edgemux", {"partitioning": False})):
        out = admit_order(get(name, **options), cluster, apps, stop_at_first=False)
        assert out.admitted <= opt.admitted
        first = admit_order(get(name, **options), cluster, apps)
        assert first.placed <= prefix.admitted


def test_cameras_tpu_units_and_p99() -> None:
    from edgemux.experiments.microedge_cameras import six_tpus

    apps = cameras(CORAL_PIE, 20)
    assert offline_optimum(apps, six_tpus(), criterion="tpu-units").admitted == 12        # 2 x 0.35 per TPU
    assert offline_optimum(apps, six_tpus(), criterion="tpu-units", partitioning=True).admitted == 17
    assert offline_optimum(apps, six_tpus(), criterion="slo").admitted == 12
    body = cameras(BODYPIX, 8)
    assert offline_optimum(body, six_tpus(), criterion="tpu-units").admitted == 0         # 1.2 units > 1
    assert offline_optimum(body, six_tpus(), criterion="tpu-units", partitioning=True).admitted == 5


def test_start_is_a_floor() -> None:
    cluster = gpus(2, Discipline.GPU_TIMESHARE)
    apps = random_apps(8, 3)
    out = admit_order(get("ibis"), cluster, apps, stop_at_first=False)
    start = {n: p.shares[0].device for n, p in out.final.placements.items()}
    res = offline_optimum(apps, cluster, start=start, max_rounds=1, time_limit_s=5)
    assert res.admitted >= out.admitted and res.upper_bound >= res.admitted


@pytest.mark.parametrize("kwargs, field", [
    ({"criterion": "fps"}, "criterion"),
    ({"partitioning": True}, "partitioning"),
    ({"max_utilization": 1.5}, "max_utilization"),
    ({"time_limit_s": 0}, "time_limit_s"),
    ({"mip_gap": -0.1}, "mip_gap"),
    ({"max_rounds": 0}, "max_rounds"),
])
def test_bad_input(kwargs: dict, field: str) -> None:
    with pytest.raises(InputError) as e:
        offline_optimum(random_apps(2, 0), gpus(1, Discipline.FCFS), **kwargs)
    assert e.value.field == field


def test_bad_apps_and_cluster() -> None:
    apps = random_apps(2, 0)
    with pytest.raises(InputError, match="duplicate"):
        offline_optimum([apps[0], apps[0]], gpus(1, Discipline.FCFS))
    with pytest.raises(InputError, match="App"):
        offline_optimum(["x"], gpus(1, Discipline.FCFS))  # type: ignore[list-item]
    with pytest.raises(InputError, match="device"):
        offline_optimum(apps, Cluster(()))
