"""The control plane's scale optimizations (benchmarks/bench_scale.py, issue 38) give what the unoptimized code
gave, on random clusters and random sequences of changes: each test pins the optimized result equal to the one
computed from scratch, not its speed.

- ``Snapshot.without`` carries the cached aggregates over and recomputes only the devices and node the app
  leaves (as ``with_placement`` does for an app it adds): equal to a snapshot built from scratch;
- the reconciler keeps the snapshot of its targets between changes (``Reconciler.snapshot``), updated with each
  apply and delete: equal to ``Snapshot(cluster, apps, placements, catalog)`` of the same targets;
- the reconciler indexes its targets by node (``node_pieces``: a heartbeat and a pass read one node's apps, not
  every app's) and keeps each app's groups while their inputs are the same objects: equal to the scan over
  every app and to ``groups_of(pieces_of(...))``.
"""

from __future__ import annotations

import random
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import edgemux.policies.ibis as ibis_module
from edgemux.cluster.specs import parse_apps, parse_cluster
from edgemux.cluster.state import App, Placement, Share, Slo
from edgemux.policies import get
from edgemux.policies.base import DeviceArrays, Rejection, Snapshot, resolve_profile
from edgemux.policies.ibis import Ibis
from edgemux.runtime.controlplane.pieces import groups_of
from edgemux.runtime.controlplane.service import ControlPlane

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))   # the admission benchmark's mixed cluster (Edge TPUs and GPUs)
import bench_admission as bench  # noqa: E402
import bench_scale as scale  # noqa: E402

MODELS = ("mobilenet_v1", "mobilenet_v2", "efficientnet-S", "inception_v3", "ssd_mobilenet_v2")


def random_app(rng: random.Random, name: str) -> App:
    # odd core counts and memory sizes: sums in another order would differ in their last bits
    cores, cpu_ms = (rng.uniform(0.1, 1.0), rng.uniform(1.0, 20.0)) if rng.random() < 0.3 else (0.0, 0.0)
    return App(name, rng.choice(MODELS), rng.uniform(0.5, 10.0), Slo(rng.uniform(50.0, 300.0),
                                                                        rng.choice(["mean", "p95", "p99"])),
               periodic=rng.random() < 0.3, shared=rng.random() < 0.5, cpu_cores=cores, cpu_ms=cpu_ms,
               memory_mb=rng.choice([0.0, rng.uniform(10.0, 100.0)]))


def random_placement(rng: random.Random, snap: Snapshot, app: App) -> Placement:
    """``app`` on one to three random devices that have a profile for it (weights summing to 1), its CPU slot
    on the first one's node."""
    devices = [d for d in snap.cluster.devices.values() if resolve_profile(app, d, snap.catalog) is not None]
    chosen = rng.sample(devices, min(len(devices), rng.choice([1, 1, 2, 3])))
    raw = [rng.uniform(0.2, 1.0) for _ in chosen]
    weights = [w / sum(raw) for w in raw]
    shares = []
    for d, w in zip(chosen, weights):
        profile = resolve_profile(app, d, snap.catalog)
        assert profile is not None
        shares.append(Share(d.path, w, profile.name))
    return Placement(app.name, tuple(shares), chosen[0].node if app.cpu_cores > 0 or app.memory_mb > 0 else None)


def same_snapshot(got: Snapshot, want: Snapshot) -> None:
    """Equal apps, placements (in order), device and node aggregates and device arrays."""
    assert list(got.apps.items()) == list(want.apps.items())
    assert list(got.placements.items()) == list(want.placements.items())
    assert got.device_loads == want.device_loads   # tenants in the same order, sums bit for bit
    assert got.node_loads == want.node_loads
    same_arrays(got.arrays, want.arrays)


def same_arrays(a: DeviceArrays, b: DeviceArrays) -> None:
    """``a`` (carried over) equal to ``b`` (built): every array, and each device's switch entries as read
    through its ``sw_start``/``sw_stop``/``sw_index`` (where they sit in the flattened arrays may differ)."""
    assert a.devices == b.devices and a.loads == b.loads and a.index == b.index
    for name in ("node_cpu_used", "node_cpu", "node_mem_used", "node_mem", "mem_used", "mem", "work", "rate",
                 "divisor", "fcfs", "additive"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    for x, y in ((a.groups, b.groups), (a.model_devices, b.model_devices), (a.node_rows, b.node_rows)):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])
    for i in range(len(a.devices)):
        ra, rb = slice(a.sw_start[i], a.sw_stop[i]), slice(b.sw_start[i], b.sw_stop[i])
        for name in ("sw_lam", "sw_lo", "sw_lp"):
            np.testing.assert_array_equal(getattr(a, name)[ra], getattr(b, name)[rb], err_msg=name)
        assert {m: e - a.sw_start[i] for m, e in a.sw_index[i].items()} == \
            {m: e - b.sw_start[i] for m, e in b.sw_index[i].items()}


@pytest.mark.parametrize("seed", range(4))
def test_snapshot_without_carries_aggregates_equal_to_from_scratch(seed: int) -> None:
    rng = random.Random(seed)
    snap = Snapshot(bench.make_cluster(3))
    snap.arrays  # cached (with the aggregates): with_placement and without carry them over
    for step in range(60):
        if snap.apps and rng.random() < 0.35:
            gone = rng.choice(list(snap.apps))
            snap = snap.without(gone)
            assert gone not in snap.apps
        else:
            app = random_app(rng, f"a{step}")
            snap = snap.with_placement(app, random_placement(rng, snap, app))
        assert {"device_loads", "node_loads", "arrays"} <= snap.__dict__.keys()
        same_snapshot(snap, Snapshot(snap.cluster, dict(snap.apps), dict(snap.placements), snap.catalog))
    # an app that is not there: the same state, aggregates carried
    again = snap.without("no-such-app")
    same_snapshot(again, Snapshot(snap.cluster, dict(snap.apps), dict(snap.placements), snap.catalog))


def controlplane(tmp_path: Path, nodes: int = 3) -> ControlPlane:
    """A control plane that is not started: its reconciler's targets are set by hand (as admission and moves
    set them after their commits)."""
    return ControlPlane(str(tmp_path / "store.db"), bench.make_cluster(nodes))


def scan_node_pieces(cp: ControlPlane, node: str) -> dict[str, object]:
    """``node_pieces`` as it was: every app's groups, in admission order."""
    rec = cp.reconciler
    return {app: g[node] for app in rec.placements
            if node in (g := groups_of(rec.pieces_of(rec.placements[app], rec.apps[app])))}


@pytest.mark.parametrize("seed", range(4))
def test_reconciler_snapshot_index_and_groups_equal_from_scratch(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    cp = controlplane(tmp_path)
    rec = cp.reconciler
    rec.load({}, {}, {})
    nodes = [n.name for n in cp.cluster.nodes]
    for step in range(80):
        r = rng.random()
        if rec.apps and r < 0.2:
            rec.drop(rng.choice(list(rec.apps)))
        elif rec.apps and r < 0.35:    # a changed app: re-admitted, it goes last
            name = rng.choice(list(rec.apps))
            app = replace(random_app(rng, name), model=rec.apps[name].model)
            rec.set_target(app, random_placement(rng, cp.snapshot(), app))
        elif rec.apps and r < 0.45:    # a move's switch: new placement and contract, same admission rank
            name = rng.choice(list(rec.apps))
            app = replace(rec.apps[name], rate_rps=rec.apps[name].rate_rps * rng.uniform(1.0, 1.5))
            placement = random_placement(rng, cp.snapshot(), app)
            rec.switch(name, app, placement, rec.groups_of(placement, app))
        elif rec.apps and r < 0.5:     # a new key digest, a learned interface: new pieces
            name = rng.choice(list(rec.apps))
            if rng.random() < 0.5:
                cp.routes.keys[name] = f"{step:064x}"
            else:
                rec.interfaces[name] = {"inputs": [{"name": f"x{step}"}], "outputs": []}
        else:
            app = random_app(rng, f"a{step}")
            rec.set_target(app, random_placement(rng, cp.snapshot(), app))
        got = cp.snapshot()
        same_snapshot(got, Snapshot(cp.cluster, dict(rec.apps), dict(rec.placements), cp.catalog))
        assert cp.snapshot() is got   # kept until the next change
        for node in nodes:
            assert rec.node_pieces(node) == scan_node_pieces(cp, node)
            assert list(rec.node_pieces(node)) == list(scan_node_pieces(cp, node))   # admission order
        for name in rec.apps:
            assert rec.groups(name) == groups_of(rec.pieces_of(rec.placements[name], rec.apps[name]))
    # a snapshot taken before a change keeps its own state
    before = cp.snapshot()
    kept = dict(before.placements)
    app = random_app(rng, "late")
    rec.set_target(app, random_placement(rng, cp.snapshot(), app))
    assert dict(before.placements) == kept and "late" in cp.snapshot().placements
    # a new catalog or cluster: a snapshot of them
    cp.adaptation.catalog = cp.catalog.with_profiles([])
    assert cp.snapshot().catalog is cp.catalog
    same_snapshot(cp.snapshot(), Snapshot(cp.cluster, dict(rec.apps), dict(rec.placements), cp.catalog))
    # loading targets (a restart) indexes them afresh
    apps, placements = dict(rec.apps), dict(rec.placements)
    rec.load(apps, placements, {a: x.rate_rps for a, x in apps.items()})
    for node in nodes:
        assert rec.node_pieces(node) == scan_node_pieces(cp, node)
    same_snapshot(cp.snapshot(), Snapshot(cp.cluster, apps, placements, cp.catalog))


def test_carried_arrays_pack_their_switch_entries_as_build_lays_them() -> None:
    """Hundreds of changes on a few Edge TPUs leave more stale switch entries than live ones: the arrays are
    packed again, into exactly ``build``'s layout, and read the same all along."""
    rng = random.Random(7)
    snap = Snapshot(bench.make_cluster(2))
    snap.arrays
    sizes, packs = [], 0
    for step in range(900):
        if len(snap.apps) > 12 or (snap.apps and rng.random() < 0.4):
            snap = snap.without(rng.choice(list(snap.apps)))
        else:
            app = replace(random_app(rng, f"a{step}"), model=rng.choice(MODELS[:3]))
            snap = snap.with_placement(app, random_placement(rng, snap, app))
        fresh = Snapshot(snap.cluster, dict(snap.apps), dict(snap.placements), snap.catalog)
        if sizes and snap.arrays.sw_lam.size < sizes[-1]:   # just packed: build's own layout, bit for bit
            packs += 1
            built = fresh.arrays
            for name in ("sw_start", "sw_stop", "sw_lam", "sw_lo", "sw_lp"):
                np.testing.assert_array_equal(getattr(snap.arrays, name), getattr(built, name), err_msg=name)
            assert snap.arrays.sw_index == built.sw_index
        sizes.append(snap.arrays.sw_lam.size)
        if step % 100 == 99:
            same_snapshot(snap, fresh)
    assert max(sizes) > 1024 and packs >= 1


def test_device_predictions_kept_for_unchanged_devices_equal_from_scratch(tmp_path: Path) -> None:
    """``overview.device_predictions`` keeps a device's prediction while its aggregates are the same object:
    after every change, each device's equals the estimators' on a snapshot built from scratch."""
    from edgemux.perf.device import device_utilization, predict_device
    from edgemux.policies.base import device_spec
    from edgemux.runtime.controlplane.overview import DevicePrediction, device_predictions

    rng = random.Random(3)
    cp = controlplane(tmp_path, nodes=2)
    rec = cp.reconciler
    rec.load({}, {}, {})
    for step in range(12):
        if rec.apps and rng.random() < 0.3:
            rec.drop(rng.choice(list(rec.apps)))
        else:
            app = replace(random_app(rng, f"a{step}"), model=rng.choice(MODELS[:3]), cpu_cores=0.0, cpu_ms=0.0)
            rec.set_target(app, random_placement(rng, cp.snapshot(), app))
        got = device_predictions(cp)
        fresh = Snapshot(cp.cluster, dict(rec.apps), dict(rec.placements), cp.catalog)
        for path, dev in cp.cluster.devices.items():
            tenants = fresh.tenants(path)
            spec = device_spec(dev)
            want = DevicePrediction(device_utilization(spec, tenants), predict_device(spec, tenants)) if tenants \
                else DevicePrediction(0.0, {})
            assert got[path] == want, path
        # each app's prediction (kept while its placement and its devices' predictions are the same objects)
        # equal to the one computed from these predictions afresh
        from edgemux.runtime.controlplane.overview import _predicted, predicted_view
        for name, app in rec.apps.items():
            placement = rec.placements[name]
            want_app = _predicted(got, name, placement, app.slo.stat)
            assert predicted_view(cp, got, name, placement, app.slo.stat) == want_app, name


@pytest.mark.parametrize("policy_name", ["edgemux", "ibis"])
def test_batches_growing_by_eight_decide_as_one_batch_of_the_rest(policy_name: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``Ibis.BATCH_GROWTH``: Edge TPU candidates checked in batches of 8, 64, 512... rather than 8 and then
    every other one: every decision (placements, and rejections with their reasons and message) is the same,
    on bench_scale's cluster filled tight (where the first 8 candidates often all miss) and on the admission
    benchmark's mixed one."""
    fast, before = get(policy_name), get(policy_name)
    assert isinstance(fast, Ibis) and isinstance(before, Ibis) and fast.BATCH_GROWTH == 8
    before.BATCH_GROWTH = 1000   # the growth before: the second batch is every candidate left
    sizes: list[int] = []
    real = ibis_module.fcfs_batch

    def counted(app: App, snap: Snapshot, cands: list, first_fit: bool = True) -> dict:
        sizes.append(len(cands))
        return real(app, snap, cands, first_fit)

    monkeypatch.setattr(ibis_module, "fcfs_batch", counted)
    gen = bench.AppGen(5, "g")
    docs = scale.app_docs(560, 1)
    for cluster, apps in ((parse_cluster(scale.cluster_doc(40)), [parse_apps(d, "t")[0] for d in docs]),
                          (bench.make_cluster(6), [gen() for _ in range(150)])):
        snap = Snapshot(cluster)
        for app in apps:
            got, want = fast.decide(app, snap), before.decide(app, snap)
            assert got == want, app.name
            if isinstance(got, Rejection):
                assert isinstance(want, Rejection)
                assert got.reasons == want.reasons and got.message == want.message
            else:
                snap = snap.with_placement(app, got)
    assert 64 in sizes   # decisions went past the first batch, into a second one of 64


def _repartition_plan_before(policy, snapshot, findings, settings, *, limit, exclude=frozenset()):  # type: ignore[no-untyped-def]
    """``adapt.plan.repartition_plan`` as it was: every placement read for every hotspot (the step for one app,
    ``relief``, is the plan's own: what is pinned here is which apps it is tried on, and in what order)."""
    from edgemux.adapt.plan import HOTSPOT_KINDS, Plan, relief

    out: list = []
    current = snapshot
    for f in findings:
        if f.kind not in HOTSPOT_KINDS or len(out) >= limit:
            continue
        for name, placement in current.placements.items():
            if name in exclude or len(placement.shares) < 2 or any(t.app == name for t in out):
                continue
            t = relief(policy, current, name, f, settings)
            if t is not None:
                out.append(t)
                current = t.applied(current)
                break
    return Plan(tuple(out))


@pytest.mark.parametrize("seed", [0, 2])  # two quick draws (a draw whose repartitions search long takes 7 s)
def test_repartition_plan_reads_the_split_apps_by_device_as_a_pass_over_every_app(seed: int) -> None:
    """``adapt.plan.repartition_plan`` finds the split apps on each hotspot through an index by device: the
    same plan as reading every placement for every hotspot, whatever the limit and the apps left alone."""
    from edgemux.adapt.detect import Finding
    from edgemux.adapt.plan import repartition_plan
    from edgemux.adapt.settings import AdaptSettings

    rng = random.Random(seed)
    policy = get("edgemux")
    snap = Snapshot(bench.make_cluster(3))
    for k in range(16):
        app = replace(random_app(rng, f"a{k}"), rate_rps=rng.uniform(0.5, 3.0))
        snap = snap.with_placement(app, random_placement(rng, snap, app))
    devices = list(snap.cluster.devices)
    kinds = ["slo-at-risk", "slo-violated", "dropping", "idle-capacity"]
    planned = 0
    for _ in range(3):
        findings = [Finding(rng.choice(kinds), None, tuple(rng.sample(devices, rng.choice([1, 2]))), 1.0, 0.5, "ms",
                            "test") for _ in range(rng.randint(2, 6))]
        exclude = frozenset(rng.sample(list(snap.apps), 3))
        settings = AdaptSettings(repartition_min_shift=rng.choice([0.0, 0.05, 0.3]))
        for limit in (1, 2):
            got = repartition_plan(policy, snap, findings, settings, limit=limit, exclude=exclude)
            assert got == _repartition_plan_before(policy, snap, findings, settings, limit=limit, exclude=exclude)
            planned += len(got.transitions)
    assert planned > 0


@pytest.mark.parametrize("seed", range(3))
def test_tail_laws_share_lattices_and_own_laws_equal_from_scratch(seed: int) -> None:
    """The Edge TPU tail estimator computes each distinct lattice once per grid (``distributions.lattice``'s
    memo) and one law per distinct own service (tenants of one model): every tenant's law equal, to the bit,
    to one computed alone from its own lattice, and the aggregate's lattice to ``Mixture.lattice``."""
    from edgemux.cluster.workload import Arrival, Tenant
    from edgemux.perf import tails
    from edgemux.perf.edgetpu import service_mixture, tenant_service
    from edgemux.profiles.catalog import load_catalog
    from edgemux.profiles.distributions import Gamma, lattice

    catalog = load_catalog()
    profiles = [catalog.get(f"ibis-edgetpu/{m}") for m in ("mobilenet_v1", "mobilenet_v2", "efficientnet-S")]
    rng = random.Random(seed)
    tenants = []
    for i in range(rng.randint(8, 20)):
        p = rng.choice(profiles)
        # some tenants calibrated (their own gamma): equal values share, distinct ones do not
        service = Gamma(p.service.mean * rng.choice([1.0, 1.1]), 0.05) if rng.random() < 0.3 else p.service
        tenants.append(Tenant(f"t{i}", p.model, Arrival.poisson(rng.uniform(0.3, 1.5)), service, p.switch_ms))
    laws = tails.edgetpu_response_laws(tenants)
    assert not isinstance(laws, tails.Unstable)
    lam = sum(t.rate_rps for t in tenants)
    agg = service_mixture(tenants)
    owns = [tenant_service(t, tenants) for t in tenants]
    dt, n = tails.plan_grid(lam, agg, owns)
    np.testing.assert_array_equal(lattice(agg, dt, n, {}), agg.lattice(dt, n))
    w = tails._waiting(lam, agg, dt, n)
    assert len({id(law) for law in laws}) == len(set(owns)) < len(tenants)   # one law per distinct own service
    for own, law in zip(owns, laws):
        ol = np.asarray(own.lattice(dt, n), dtype=float)
        alone = tails._to_pmf(w.fft * np.fft.rfft(ol / ol.sum()), n)
        assert law is not None and law.dt_ms == dt
        np.testing.assert_array_equal(law.pmf, alone)
