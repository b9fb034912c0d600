"""The vectorized screen of every device (``Ibis.screen``) decides exactly what the per-device loop over
``Ibis.precheck`` decides: same placements, same rejections (constraint, numbers, counts), for ibis and
edgemux, on random mixed clusters with node, memory and utilization limits that bite."""

from __future__ import annotations

import random

import pytest

from edgemux.cluster.state import App, Cluster, Device, Node, Placement, Slo
from edgemux.cluster.workload import Discipline
from edgemux.policies import Rejection, Snapshot, get
from edgemux.policies.edgemux import Edgemux
from edgemux.policies.ibis import Ibis
from edgemux.profiles.types import DeviceKind

# slow: each test checks one policy's fast path against its reference loop decision by decision (seconds each)
pytestmark = pytest.mark.slow

MODELS = ["mobilenet_v2", "mobilenet_v1", "efficientnet-S", "inception_v3", "alexnet", "googlenet", "resnet18",
          "ssd_mobilenet_v2", "bodypix", "yolov4_tiny"]


class LoopIbis(Ibis):
    def screened(self) -> bool:
        return False


class LoopEdgemux(Edgemux):
    def screened(self) -> bool:
        return False


def cluster(rng: random.Random) -> Cluster:
    nodes = []
    for k in range(5):
        devs = (Device(f"n{k}", "tpu0", DeviceKind.EDGETPU, Discipline.FCFS, rng.choice([6.9, 16.0, 64.0]),
                       profile_set=rng.choice(["ibis-edgetpu", "microedge"])),
                Device(f"n{k}", "gpu0", DeviceKind.GPU_EMBEDDED, Discipline.GPU_TIMESHARE,
                       rng.choice([2500.0, 8192.0]), profile_set="ibis-jetson-nano"),
                Device(f"n{k}", "gpu1", DeviceKind.GPU_EMBEDDED, rng.choice([Discipline.PS, Discipline.MPS]),
                       8192.0, profile_set="ibis-jetson-nano", servers=rng.choice([1.0, 1.65])),
                Device(f"n{k}", "gpu2", DeviceKind.GPU_EMBEDDED, Discipline.BATCH, 8192.0,
                       profile_set="ibis-jetson-nano", max_batch=4, batch_timeout_ms=5.0))
        nodes.append(Node(f"n{k}", rng.choice([2.0, 4.0]), rng.choice([1024.0, 4096.0]), devs))
    return Cluster(tuple(nodes))


def app(rng: random.Random, i: int, slo_ms: tuple[float, float] = (60.0, 600.0), rate_max: float = 40.0) -> App:
    cores = rng.choice([0.0, 0.0, 0.5, 1.0])
    return App(f"a{i}", rng.choice(MODELS), rng.uniform(1.0, rate_max),
               Slo(rng.uniform(*slo_ms), rng.choice(["mean", "mean", "p95", "p99"])),
               periodic=rng.random() < 0.3, shared=rng.random() < 0.4, cpu_cores=cores,
               cpu_ms=2.0 if cores else 0.0, memory_mb=rng.choice([0.0, 256.0]))


@pytest.mark.parametrize("name, loop, opts", [
    ("ibis", LoopIbis, {}), ("ibis", LoopIbis, {"choice": "spread"}),
    ("ibis", LoopIbis, {"heterogeneous": True, "max_utilization": 0.6}),
    ("edgemux", LoopEdgemux, {}), ("edgemux", LoopEdgemux, {"choice": "spread", "max_utilization": 0.7}),
])
@pytest.mark.parametrize("seed", [1])
def test_screen_equals_loop(name, loop, opts, seed):
    rng = random.Random(seed)
    s = Snapshot(cluster(rng))
    fast, slow = get(name, **opts), loop(**opts)
    assert fast.screened() and not slow.screened()
    kinds = set()
    for i in range(20):
        a = app(rng, i)
        d_fast, d_slow = fast.decide(a, s), slow.decide(a, s)
        assert d_fast == d_slow, (i, a)
        kinds.add(d_fast.constraint if isinstance(d_fast, Rejection) else "placed")
        if isinstance(d_fast, Placement):
            s = s.with_placement(a, d_fast)
    assert "placed" in kinds and len(kinds) >= 2, kinds   # placed and a rejection (the percentile apps now fit the GPUs)


class NoVectorIbis(Ibis):
    def vector_latency(self) -> bool:
        return False


class NoVectorEdgemux(Edgemux):
    def vector_latency(self) -> bool:
        return False


@pytest.mark.parametrize("name, plain, opts, seed", [
    ("ibis", NoVectorIbis, {}, 3), ("ibis", NoVectorIbis, {"choice": "spread"}, 2),
    ("edgemux", NoVectorEdgemux, {}, 3),
])
def test_timeshare_vector_screen_equals_exact_checks(name, plain, opts, seed, monkeypatch):
    """The vectorized time-sharing screen only ever skips devices the exact check rejects, with the same
    constraint: decisions and rejections (tenant, numbers, counts) are identical, and it did skip some."""
    from edgemux.policies import feasibility as feasibility_mod
    from edgemux.policies import ibis as ibis_mod

    monkeypatch.setattr(feasibility_mod, "_SCREEN_MIN", 1)
    calls = {"skipped": 0}
    real = ibis_mod.timeshare_screen

    def counting(*args):  # type: ignore[no-untyped-def]
        out = real(*args)
        calls["skipped"] += len(out)
        return out

    monkeypatch.setattr(ibis_mod, "timeshare_screen", counting)
    rng = random.Random(seed)
    s = Snapshot(cluster(rng))
    fast, slow = get(name, **opts), plain(**opts)
    for i in range(16):
        a = app(rng, i, (20.0, 300.0), 80.0)   # loaded enough that means miss on the Jetson (what the screen skips)
        d_fast, d_slow = fast.decide(a, s), slow.decide(a, s)
        assert d_fast == d_slow, (i, a)
        if isinstance(d_fast, Placement):
            s = s.with_placement(a, d_fast)
    assert calls["skipped"] > 0
