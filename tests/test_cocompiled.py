"""Co-compiled Edge TPU model sets as a first-class thing: models compiled together for one TPU share its
parameter cache, so a switch between them reloads nothing (the estimator, the simulator and the agent's
worker all pay no switch within a set), and the set is one copy in device memory, counted once however many
apps use its members (admission)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from edgemux.cli.main import main
from edgemux.cluster.state import App, Cluster, Device, Node, Placement, Share, Slo
from edgemux.cluster.workload import DeviceSpec, Discipline, Tenant
from edgemux.perf.device import predict_device
from edgemux.perf.result import Unstable
from edgemux.policies import Snapshot
from edgemux.policies.base import model_memory_mb, tenant_for
from edgemux.profiles.catalog import load_catalog
from edgemux.profiles.types import DeviceKind
from edgemux.sim.run import simulate_device

SPEC = DeviceSpec("n1/tpu0", DeviceKind.EDGETPU, Discipline.FCFS)


def pair(cocompiled: bool) -> tuple:
    """Ibis's MobileNet v1 and v2 Edge TPU profiles, as a co-compiled set or each compiled alone."""
    cat = load_catalog()
    v1, v2 = cat.get("ibis-edgetpu/mobilenet_v1"), cat.get("ibis-edgetpu/mobilenet_v2")
    if not cocompiled:
        return v1, v2
    extra = {"cocompiled": "mnv12", "cocompiled_params_mb": 6.5}
    return replace(v1, extra={**v1.extra, **extra}), replace(v2, extra={**v2.extra, **extra})


def tenants(cocompiled: bool, rate: float = 30.0) -> list[Tenant]:
    p1, p2 = pair(cocompiled)
    return [tenant_for(App("a", p1.model, rate, Slo(100)), p1), tenant_for(App("b", p2.model, rate, Slo(100)), p2)]


def test_the_estimator_pays_no_switch_within_a_cocompiled_set() -> None:
    alone, together = tenants(False), tenants(True)
    assert {t.params for t in together} == {"cocompiled:mnv12"} and {t.params for t in alone} == {None}
    assert all(t.switch_ms > 0 for t in together)  # the models do switch, but nothing is reloaded
    without = predict_device(SPEC, alone)
    with_set = predict_device(SPEC, together)
    no_switch = predict_device(SPEC, [replace(t, switch_ms=0.0) for t in alone])
    for name in ("a", "b"):
        assert with_set[name].mean_ms == pytest.approx(no_switch[name].mean_ms, rel=1e-12)
        assert with_set[name].mean_ms < without[name].mean_ms  # the switches cost ~10 ms each
    assert "switch mixture" in without["a"].method and "switch mixture" not in with_set["a"].method
    # at 60 req/s each the switches alone overload the TPU; co-compiled it runs at a third of its capacity
    assert isinstance(predict_device(SPEC, tenants(False, 60.0))["a"].mean_ms, Unstable)
    assert predict_device(SPEC, tenants(True, 60.0))["a"].rho < 0.6


def test_the_simulator_agrees_a_set_switches_nothing() -> None:
    """The seeded simulator on the same device: within a set no request pays a switch, so its mean matches the
    estimator's (exact P-K here) within the 95 % CI of the replications; compiled alone it pays them."""
    together, alone = tenants(True), tenants(False)
    est = predict_device(SPEC, together)
    sim = simulate_device(SPEC, together, requests=40_000, replications=6, seed=1)
    for name in ("a", "b"):
        ci = sim.tenants[name].mean_ms
        assert ci.lo <= est[name].mean_ms <= ci.hi, (name, ci, est[name].mean_ms)
    paying = simulate_device(SPEC, alone, requests=40_000, replications=6, seed=1).tenants["a"].mean_ms
    assert paying.lo > sim.tenants["a"].mean_ms.hi  # compiled alone, the switches show


def test_a_set_is_one_copy_in_memory_counted_once() -> None:
    """Three apps on one 6.9 MB Edge TPU, two of them on one member: compiled alone each app's model is its
    own copy (3.75 + 3.75 + 4.21 MB); co-compiled the set is one copy of 6.5 MB, whatever uses it."""
    dev = Device("n1", "tpu0", DeviceKind.EDGETPU, Discipline.FCFS, 6.9, "ibis-edgetpu")
    cl = Cluster((Node("n1", 4, 4096, (dev,)),))
    for cocompiled, used in ((False, None), (True, 6.5)):
        p1, p2 = pair(cocompiled)
        apps = {"a": App("a", p1.model, 5, Slo(100)), "b": App("b", p1.model, 5, Slo(100)),
                "c": App("c", p2.model, 5, Slo(100))}
        placements = {n: Placement(n, (Share("n1/tpu0", 1.0, (p1 if n != "c" else p2).name),)) for n in apps}
        snap = Snapshot(cl, apps, placements, catalog=_with(load_catalog(), p1, p2))
        load = snap.load("n1/tpu0")
        if cocompiled:
            assert load.memory_used_mb == pytest.approx(used) and list(load.models) == ["cocompiled:mnv12"]
            assert model_memory_mb(p2, dev) == 6.5
        else:
            assert load.memory_used_mb == pytest.approx(2 * p1.extra["params_onchip_mb"] + p2.extra["params_onchip_mb"])
            assert load.memory_used_mb > dev.memory_mb


def _with(catalog, *profiles):
    """``catalog`` with ``profiles`` in place of the ones of the same name."""
    from edgemux.profiles.catalog import Catalog

    table = {**catalog.profiles, **{p.name: p for p in profiles}}
    return Catalog(list(table.values()), list(catalog.constants.values()), list(catalog.infos.values()),
                   list(catalog.columns.values()))


# ----------------------------------------------------------------------------------------------- admission

CLUSTER = """\
apiVersion: edgemux/v1alpha1
kind: Cluster
metadata: {name: one-coral}
spec:
  nodes:
    - name: n1
      cpuCores: 4
      memoryMb: 4096
      devices:
        - {name: tpu0, kind: edgetpu, memoryMb: 6.9, profiles: coral-{which}}
"""
APPS = """\
apiVersion: edgemux/v1alpha1
kind: AppList
metadata: {name: three}
spec:
  apps:
    - {name: a, model: mnv1, rate: 5, slo: {latencyMs: 100, stat: mean}}
    - {name: b, model: mnv1, rate: 5, slo: {latencyMs: 100, stat: mean}}
    - {name: c, model: mnv2, rate: 5, slo: {latencyMs: 100, stat: mean}}
"""
COLUMNS = "model,variant,batch,exec_mean_ms,exec_var_ms2,switch_ms,params_onchip_mb,cocompiled,cocompiled_params_mb,detail,note"


def _columns(*names: str) -> str:
    """The built-in catalog's declarations of ``names``, as a profile set must repeat them."""
    cols = load_catalog().columns
    return "".join(f"  {n}: {json.dumps({k: v for k, v in vars(cols[n]).items() if k != 'name' and v})}\n"
                   for n in names)


def _profile_set(folder: Path) -> None:
    """Two catalogs of the same two Edge TPU models: compiled alone (coral-alone) and co-compiled (coral-set)."""
    folder.mkdir()
    (folder / "catalogs.yaml").write_text(
        "version: 1\ncolumns:\n" + _columns("params_onchip_mb", "cocompiled", "cocompiled_params_mb") +
        "sources:\n  test: made up for the test\ncatalogs:\n"
        "- {name: coral-alone, file: alone.csv, device_kind: edgetpu, source: test, description: alone}\n"
        "- {name: coral-set, file: set.csv, device_kind: edgetpu, source: test, description: co-compiled}\n")
    (folder / "constants.yaml").write_text("constants: []\n")
    (folder / "alone.csv").write_text(f"{COLUMNS}\nmnv1,224-b1,1,4.0,0.04,10.0,3.0,,,made up,\n"
                                      f"mnv2,224-b1,1,5.0,0.05,10.0,3.5,,,made up,\n")
    (folder / "set.csv").write_text(f"{COLUMNS}\nmnv1,224-b1,1,4.0,0.04,10.0,3.0,pair,6.5,made up,\n"
                                    f"mnv2,224-b1,1,5.0,0.05,10.0,3.5,pair,6.5,made up,\n")


def test_a_cocompiled_pair_is_admitted_where_the_models_alone_are_not(tmp_path: Path, capsys) -> None:
    _profile_set(tmp_path / "sets")
    out = {}
    for which in ("alone", "set"):
        cluster = tmp_path / f"{which}.yaml"
        cluster.write_text(CLUSTER.replace("{which}", which))
        apps = tmp_path / "apps.yaml"
        apps.write_text(APPS)
        code = main(["place", "--cluster", str(cluster), "--apps", str(apps), "--policy", "edgemux",
                     "--profiles", str(tmp_path / "sets"), "--json"])
        doc = json.loads(capsys.readouterr().out)
        out[which] = {d["app"]: d for d in doc["decisions"]}
        assert code in (0, 1)
    # compiled alone: a and b are two copies of mnv1 (3 + 3 MB), and mnv2's 3.5 MB no longer fits in 6.9 MB
    assert out["alone"]["c"]["decision"] == "rejected" and out["alone"]["c"]["rejection"]["constraint"] == "device-memory"
    # co-compiled: the set is one 6.5 MB copy, and all three run on the TPU
    assert [d["decision"] for d in out["set"].values()] == ["placed"] * 3


@pytest.mark.parametrize("cocompiled, switches", [(False, 6), (True, 1)])
def test_the_agents_worker_pays_no_switch_within_a_set(cocompiled: bool, switches: int) -> None:
    """An emulated Edge TPU serving both members, requests alternating: compiled alone every request follows
    the other model (6 switches for 6 requests); co-compiled only the first load counts."""
    import numpy as np

    from edgemux.runtime.dataplane.backends import EmulatedBackend, ModelSource
    from edgemux.runtime.dataplane.worker import DeviceWorker

    dev = Device("n1", "tpu0", DeviceKind.EDGETPU, Discipline.FCFS, 8.0, "ibis-edgetpu")
    backend = EmulatedBackend(seed=0, sleep=lambda _s: None)
    p1, p2 = pair(cocompiled)
    for key, p in (("m1", p1), ("m2", p2)):
        backend.load(key, ModelSource(zoo="mobilenet_v2", input_size=32, profile=p))  # tensors only: emulated
    assert {backend.info(k).params for k in ("m1", "m2")} == ({"cocompiled:mnv12"} if cocompiled else {None})
    worker = DeviceWorker(dev, backend, sleep=lambda _s: None)
    try:
        for i in range(6):
            model = ("m1", "m2")[i % 2]
            spec = backend.info(model).inputs[0]
            x = np.zeros([1 if d < 1 else d for d in spec.shape], np.uint8)
            worker.submit("app", model, {spec.name: x}).result(10)
        assert worker.stats()["switches"] == switches
    finally:
        worker.close()
