"""Percentile SLOs on Edge TPUs with ``tails="bound"`` (the default): the batched decision over every Edge TPU
(``ibis.fcfs_batch``) decides exactly what the per-device checks decide, the certified values are never
below the DFT estimate (less its allowance), so the bound only ever admits less than the estimate, and the
vectorized FCFS utilization equals the per-device one."""

from __future__ import annotations

import math
from dataclasses import replace
import sys
from pathlib import Path

import numpy as np
import pytest

from edgemux.cluster.state import App, Cluster, Placement, Slo
from edgemux.cluster.workload import Discipline
from edgemux.perf.device import predict_device
from edgemux.perf.tailbounds import DFT_REL_TOL
from edgemux.policies import Snapshot, get
from edgemux.policies import feasibility as feasibility_mod
from edgemux.policies import ibis as ibis_mod
from edgemux.policies.base import device_spec
from edgemux.policies.edgemux import Edgemux
from edgemux.policies.feasibility import Fit, STAT_Q, bound_values
from edgemux.policies.ibis import Ibis

REPO = Path(__file__).resolve().parent.parent


sys.path.insert(0, str(REPO / "benchmarks"))   # the admission benchmark's cluster and app generator
import bench_admission as bench  # noqa: E402


class Gen(bench.AppGen):
    """The benchmark's apps with more percentile SLOs (half p95/p99), so that tails decide often."""

    def __call__(self) -> App:
        a = super().__call__()
        stat = self.rng.choice(["mean", "p95", "p99"])
        return App(a.name, a.model, a.rate_rps, Slo(a.slo.latency_ms * (1.3 if stat != "mean" else 1.0), stat),
                   periodic=a.periodic, shared=a.shared)


def tpu_cluster(nodes: int) -> Cluster:
    """The benchmark's cluster with its Edge TPUs only: these tests are of the Edge TPU batch, and every
    percentile app would otherwise also be judged on the GPUs' tail laws (``perf.sojourn``), seconds of
    work that only slow the check down (they have their own tests)."""
    full = bench.make_cluster(nodes)
    return Cluster(tuple(replace(n, devices=tuple(d for d in n.devices if d.discipline is Discipline.FCFS))
                         for n in full.nodes))


def filled(policy, nodes: int, tenants: int, seed: int) -> Snapshot:
    snap = Snapshot(tpu_cluster(nodes))
    gen = Gen(seed, "t")
    for _ in range(4 * tenants):
        if len(snap.placements) >= tenants:
            break
        app = gen()
        d = policy.decide(app, snap)
        if isinstance(d, Placement):
            snap = snap.with_placement(app, d)
    return snap


class PerDeviceIbis(Ibis):
    def vector_latency(self) -> bool:
        return False


class PerDeviceEdgemux(Edgemux):
    def vector_latency(self) -> bool:
        return False


@pytest.mark.parametrize("name, plain, opts", [
    ("ibis", PerDeviceIbis, {}), ("ibis", PerDeviceIbis, {"choice": "spread"}),
    ("edgemux", PerDeviceEdgemux, {}),
])
def test_batched_edge_tpus_decide_as_the_per_device_checks(name, plain, opts, monkeypatch):
    """On full clusters (tight packing leaves many devices at the edge of their SLOs) every decision, and
    every rejection's numbers, equal those of the per-device path; the batch decided devices by the means
    and by the lattice tails, and past a first fit it left devices undecided."""
    seen = {"mean": 0, "tails": 0, "skipped": 0}
    real = feasibility_mod.first_fit_quantiles

    def counting(queues, queries, known_ok, *args):  # type: ignore[no-untyped-def]
        ok, undecided = real(queues, queries, known_ok, *args)
        seen["tails"] += int((~undecided).sum())
        seen["skipped"] += int(undecided.sum())
        return ok, undecided

    monkeypatch.setattr(feasibility_mod, "first_fit_quantiles", counting)
    real_batch = ibis_mod.fcfs_batch

    def batch(*args, **kw):  # type: ignore[no-untyped-def]
        out = real_batch(*args, **kw)
        seen["mean"] += len(out)
        return out

    monkeypatch.setattr(ibis_mod, "fcfs_batch", batch)
    fast, slow = get(name, **opts), plain(**opts)
    assert fast.batched() and not slow.batched()
    snap = filled(fast, 12, 120, seed=5)
    gen = Gen(77, "new")
    outcomes = set()
    for i in range(60):
        a = gen()
        d_fast, d_slow = fast.decide(a, snap), slow.decide(a, snap)
        assert d_fast == d_slow, (i, a)
        outcomes.add("placed" if isinstance(d_fast, Placement) else d_fast.constraint)
        if isinstance(d_fast, Placement) and i % 3 == 0:
            snap = snap.with_placement(a, d_fast)
    assert "placed" in outcomes and len(outcomes) >= 2, outcomes
    assert seen["mean"] > 0 and seen["tails"] > 0 and seen["skipped"] > 0, seen


def test_certified_values_sit_above_the_estimate():
    """On every Edge TPU of a full snapshot plus a new app, each percentile tenant's certified value (the
    periodic worst case or the lattice bound, end to end) is at least the DFT estimate less its allowance,
    and a device the bound accepts the estimate accepts too."""
    pol = Ibis()
    snap = filled(pol, 8, 70, seed=9)   # room left: some devices accept
    gen = Gen(11, "probe")
    checked = accepted = 0
    for _ in range(12):
        app = gen()
        cands, _, _ = pol._cheap_all(app, snap)
        for c in cands:
            if c.device.discipline is not Discipline.FCFS:
                continue
            owners = [app if t.name == app.name else snap.apps[t.name] for t in c.tenants]
            if not feasibility_mod.tails_only(device_spec(c.device), c.tenants, owners):
                continue
            bound = bound_values(device_spec(c.device), c.tenants, owners)
            if bound is None:
                continue
            est = predict_device(device_spec(c.device), c.tenants)
            for t, o in zip(c.tenants, owners):
                if o.slo.stat == "mean":
                    continue
                e = est[t.name].p95_ms if o.slo.stat == "p95" else est[t.name].p99_ms
                b = bound[t.name]
                assert isinstance(e, float) and isinstance(b, float)
                assert b >= e * (1.0 - DFT_REL_TOL) - 0.5, (t.name, b, e)
                checked += 1
            by_bound = Ibis(tails="bound").evaluate(app, snap, c.device)
            if isinstance(by_bound, Fit):
                accepted += 1
                assert isinstance(Ibis(tails="estimate").evaluate(app, snap, c.device), Fit)
    assert checked > 20 and accepted > 0, (checked, accepted)


def test_vectorized_fcfs_utilization_equals_the_per_device_one():
    snap = filled(Ibis(), 6, 100, seed=2)
    arr = snap.arrays
    idx = np.flatnonzero(arr.fcfs)
    gen = Gen(3, "u")
    for _ in range(20):
        app = gen()
        profiles = {p.name: p for p in (ibis_mod.resolve_profile(app, arr.devices[i], snap.catalog)
                                        for i in idx.tolist()) if p is not None}
        for profile in profiles.values():
            new = ibis_mod.tenant_for(app, profile)
            vec = arr.fcfs_utilizations(new, idx)
            ref = np.array([arr.loads[i].fcfs_utilization(new) for i in idx.tolist()])
            assert np.allclose(vec, ref, rtol=1e-12, atol=0.0)


def test_tails_option_is_validated():
    with pytest.raises(ValueError, match="tails must be one of bound, estimate"):
        Ibis(tails="exact")
    assert get("edgemux", tails="estimate").tails == "estimate"
    assert not get("ibis", tails="estimate").batched()
    assert not math.isnan(STAT_Q["p99"])
