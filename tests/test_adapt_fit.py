"""``adapt.fit``: profiles fitted to end-to-end windows alone, against windows simulated on a device whose
real service times differ from the catalog's: the fit finds the real scale within its stated interval,
moves less with fewer samples (shrinkage toward the catalog), and leaves out what it cannot fit."""

from __future__ import annotations

from dataclasses import replace

import pytest

from edgemux.adapt.fit import FITTED, fit_windows
from edgemux.adapt.monitor import AppWindow
from edgemux.cluster.state import App, Cluster, Device, Node, Placement, Share, Slo
from edgemux.cluster.workload import Discipline
from edgemux.policies import Snapshot
from edgemux.policies.base import device_spec
from edgemux.profiles.catalog import Catalog
from edgemux.profiles.types import DeviceKind, ExecTime
from edgemux.sim.run import simulate_raw

TPU = Device("n1", "tpu0", DeviceKind.EDGETPU, Discipline.FCFS, 12.0, profile_set="ibis-edgetpu")
CLUSTER = Cluster((Node("n1", 4, 4096, (TPU,)),))
EFF = App("eff", "efficientnet-S", 8.0, Slo(100.0, "p95"))
MOB = App("mob", "mobilenet_v2", 12.0, Slo(50.0, "p95"))
PROFILES = {"eff": "ibis-edgetpu/efficientnet-S", "mob": "ibis-edgetpu/mobilenet_v2"}


def snapshot(catalog: Catalog | None = None) -> Snapshot:
    placements = {a.name: Placement(a.name, (Share("n1/tpu0", 1.0, PROFILES[a.name]),), "n1") for a in (EFF, MOB)}
    snap = Snapshot(CLUSTER, {"eff": EFF, "mob": MOB}, placements)
    return snap if catalog is None else Snapshot(CLUSTER, snap.apps, snap.placements, catalog)


def scaled(catalog: Catalog, name: str, factor: float) -> Catalog:
    p = catalog.get(name)
    e = p.exec[1]
    return catalog.with_profiles([replace(p, exec={**p.exec, 1: ExecTime(1, e.mean_ms * factor, e.var_ms2 * factor ** 2)},
                                          switch_ms=p.switch_ms * factor)])


def windows_on(catalog: Catalog, requests: int, seed: int) -> dict[str, AppWindow]:
    """What the apps' clients see on a device that really runs ``catalog``'s figures: one window each."""
    snap = snapshot(catalog)
    load = snap.device_loads["n1/tpu0"]
    run = simulate_raw(device_spec(TPU), list(load.tenants), requests=requests, seed=seed)
    span_s = float(run.arrival_ms[-1] - run.arrival_ms[0]) / 1000.0
    out = {}
    for i, name in enumerate(run.tenant_names):
        out[name] = AppWindow.of(name, 0.0, span_s, run.latency_ms[run.tenant == i])
    return out


def test_the_fit_finds_a_slower_device_within_its_interval() -> None:
    base = snapshot().catalog
    truth = scaled(base, PROFILES["mob"], 1.5)   # this device runs MobileNetV2 1.5x slower than catalogued
    fits = fit_windows(snapshot(), windows_on(truth, 20_000, 1), base, min_samples=20)
    mob, eff = fits[PROFILES["mob"]], fits[PROFILES["eff"]]
    assert mob.low <= 1.5 <= mob.high and mob.high - mob.low < 0.2, mob
    assert eff.low <= 1.0 <= eff.high, eff
    assert mob.profile.provenance.source == FITTED and "fitted to the end-to-end latency" in mob.profile.provenance.detail
    assert mob.profile.exec[1].mean_ms == pytest.approx(base.get(PROFILES["mob"]).exec[1].mean_ms * mob.theta)
    assert mob.apps == ("mob",) and mob.requests > 10_000


def test_few_samples_move_the_profile_less_and_say_so() -> None:
    base = snapshot().catalog
    truth = scaled(base, PROFILES["mob"], 1.5)
    many = fit_windows(snapshot(), windows_on(truth, 20_000, 2), base, min_samples=20)[PROFILES["mob"]]
    few = fit_windows(snapshot(), windows_on(truth, 60, 2), base, min_samples=20)[PROFILES["mob"]]
    assert 1.0 < few.theta < many.theta  # shrunk toward the catalog
    assert few.high - few.low > many.high - many.low  # and less sure


def test_what_cannot_be_fitted_is_left_out() -> None:
    base = snapshot().catalog
    w = windows_on(base, 2_000, 3)
    assert fit_windows(snapshot(), w, base, min_samples=10_000) == {}      # too few answers
    assert set(fit_windows(snapshot(), w, base, min_samples=20, skip=frozenset({PROFILES["mob"]}))) == {
        PROFILES["eff"]}                                                    # calibrated from device times already
    assert fit_windows(snapshot(), {}, base, min_samples=20) == {}
