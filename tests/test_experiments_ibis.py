"""ibis-capacity, ibis-hetero, ibis-aiaas (Ibis Fig. 17-19): quick runs and invariants that hold by
construction (and so catch bugs when they fail)."""

from __future__ import annotations

import csv
import io
from dataclasses import replace
from pathlib import Path

import pytest

from edgemux.cli.main import main
from edgemux.cluster.workload import Arrival
from edgemux.experiments import ibis_capacity as ic
from edgemux.experiments.registry import names
from edgemux.experiments.runner import ExperimentResult, run_experiment
from edgemux.policies import get
from edgemux.policies.base import device_spec
from edgemux.policies.feasibility import predict_means
from edgemux.profiles.distributions import Deterministic
from edgemux.sim.workloads import ibis_apps

# slow: not in `make test-fast` (the module's expensive fixture is built once: make test distributes
# whole modules, --dist loadscope)
pytestmark = pytest.mark.slow

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def capacity(tmp_path_factory: pytest.TempPathFactory) -> tuple[ExperimentResult, Path]:
    out = tmp_path_factory.mktemp("cap")
    return run_experiment("ibis-capacity", out, seed=0, quick=True), out


@pytest.fixture(scope="module")
def hetero(tmp_path_factory: pytest.TempPathFactory) -> tuple[ExperimentResult, Path]:
    out = tmp_path_factory.mktemp("het")
    return run_experiment("ibis-hetero", out, seed=0, quick=True), out


@pytest.fixture(scope="module")
def aiaas(tmp_path_factory: pytest.TempPathFactory) -> tuple[ExperimentResult, Path]:
    out = tmp_path_factory.mktemp("aiaas")
    return run_experiment("ibis-aiaas", out, seed=0, quick=True), out


def test_registered() -> None:
    assert {"ibis-capacity", "ibis-hetero", "ibis-aiaas"} <= set(names())


@pytest.mark.parametrize("which", ["capacity", "hetero", "aiaas"])
def test_files_summary_assumptions(which: str, request: pytest.FixtureRequest) -> None:
    res, out = request.getfixturevalue(which)
    csv_path, png = out / f"{res.name}.csv", out / f"{res.name}.png"
    assert res.files == {"csv": str(csv_path), "png": str(png)}
    assert png.read_bytes()[:8] == PNG
    rows = list(csv.DictReader(csv_path.open()))
    assert len(rows) == len(res.rows) > 0
    assert res.summary and all(r.metric and r.edgemux for r in res.summary)
    assert any(r.paper not in ("-", "") for r in res.summary)          # the paper's figure is beside ours
    assert len(res.assumptions) >= 5


def _cap(res: ExperimentResult, scenario: str, policy: str) -> list[dict]:
    rows = [r for r in res.rows if r["scenario"] == scenario and r["policy"] == policy]
    return sorted(rows, key=lambda r: r["apps"])


def test_capacity_points_and_fractions(capacity: tuple[ExperimentResult, Path]) -> None:
    res, _ = capacity
    for sc in ("mps", "timeshare", "nano-rates"):
        for pol in ("knapsack", "ibis", "edgemux"):
            rows = _cap(res, sc, pol)
            assert [r["apps"] for r in rows] == list(ic.CAPACITY_POINTS)
            succ = [r["success"] for r in rows]
            ok = [r["success_no_violation"] for r in rows]
            assert all(0.0 <= x <= 1.0 for x in succ + ok)
            # prefix orders: success is non-increasing in the number of apps
            assert succ == sorted(succ, reverse=True) and ok == sorted(ok, reverse=True)
            # a predicted violation can only remove successes
            assert all(o <= s for o, s in zip(ok, succ))


def test_capacity_policy_order(capacity: tuple[ExperimentResult, Path]) -> None:
    res, _ = capacity
    for sc in ("mps", "timeshare", "nano-rates"):
        kn, ib, em = (_cap(res, sc, p) for p in ("knapsack", "ibis", "edgemux"))
        for k, i, e in zip(kn, ib, em):
            assert e["success"] >= i["success"]          # edgemux = ibis + partitioning when ibis rejects
            assert k["success"] >= i["success"]          # knapsack checks a subset of ibis's constraints
            # ibis and edgemux never admit a state the queueing model says breaks an SLO
            assert i["orders_with_predicted_violation"] == 0 == e["orders_with_predicted_violation"]
            assert i["success_no_violation"] == i["success"]
    edgemux_below = [r for r in res.summary if "orders where edgemux placed fewer than ibis" in r.note]
    assert edgemux_below and all(r.note.endswith(": 0") for r in edgemux_below)


def test_capacity_simulated_violations(capacity: tuple[ExperimentResult, Path]) -> None:
    res, _ = capacity
    sims = res.extra["simulated_configs"]
    assert sims, "the re-check simulated nothing"
    # exact means (MPS) or a proven bound (time-sharing): latency-aware policies have no simulated violation
    for sc in ("mps", "timeshare"):
        for pol in ic.LATENCY_AWARE:
            rows = _cap(res, sc, pol)
            assert sum(r["sim_configs"] for r in rows) > 0
            assert sum(r["sim_tenant_violations"] for r in rows) == 0
    # knapsack's violations are counted, not assumed: under time-sharing its first fit overloads a GPU
    assert sum(r["sim_tenant_violations"] for r in _cap(res, "timeshare", "knapsack")) > 0
    # every simulated configuration is distinct within (scenario, policy, order)
    keys = [(d["scenario"], d["policy"], d["order"], d["device"], d["tenants"], d["apps"]) for d in sims]
    assert len(keys) == len(set(keys))
    for r in res.rows:
        if r.get("sim_configs"):
            assert 0 < r["sim_config_violation_rate_ub95"] <= 1


def test_upper_bound() -> None:
    assert ic.upper_bound(0, 100) == pytest.approx(1 - 0.05 ** (1 / 100))
    assert 2.9 / 100 < ic.upper_bound(0, 100) < 3.1 / 100
    assert ic.upper_bound(1, 100) > ic.upper_bound(0, 100)
    assert ic.upper_bound(0, 0) == 1.0 and ic.upper_bound(5, 5) == 1.0


@pytest.mark.parametrize("scenario", ["mps", "timeshare"])
def test_nano_time_scaling_is_exact(scenario: str) -> None:
    """The discrete GPU is simulated in Nano time: rate lambda/k and SLO R x k on the Nano profiles stand for
    rate lambda and SLO R on a GPU whose service times are S/k. The estimators are time-homogeneous, so each
    tenant's predicted mean over its SLO is the same in both."""
    k = ic.SPEEDUP_DISCRETE
    sc = next(s for s in ic.capacity_scenarios() if s.name == scenario)
    nano = ic.admit_order(get("ibis"), ic.discrete_cluster(sc), ibis_apps(8, 5), stop_at_first=False).final
    assert nano is not None
    for path, load in nano.device_loads.items():
        if not load.tenants:
            continue
        spec = device_spec(load.device)
        real = [replace(t, arrival=Arrival.poisson(t.rate_rps * k), service=Deterministic(t.service.mean / k))
                for t in load.tenants]
        a, b = predict_means(spec, list(load.tenants)), predict_means(spec, real)
        for t in load.tenants:
            assert a[t.name] == pytest.approx(k * b[t.name], rel=1e-9)
    nr = next(s for s in ic.capacity_scenarios() if not s.device_relative)
    for x, y in zip(ibis_apps(5, 1), nr.apps(ibis_apps(5, 1))):
        assert y.rate_rps == pytest.approx(x.rate_rps / nr.speedup)
        assert y.slo.latency_ms == pytest.approx(x.slo.latency_ms * nr.speedup)


def test_hetero(hetero: tuple[ExperimentResult, Path]) -> None:
    res, _ = hetero
    by = {r["setup"]: r for r in res.rows}
    assert set(by) == {"static", "heterogeneous"}
    for r in by.values():
        assert 0 < r["placed_before_first_rejection"] <= r["admitted_of_trace"] <= r["trace_length"]
        assert r["sim_configs"] > 0 and r["sim_tenant_violations"] == 0    # admitted under the proven bound
    # choosing the kind by predicted latency packs more than a random static choice
    assert by["heterogeneous"]["admitted_of_trace"] > by["static"]["admitted_of_trace"]


def test_aiaas(aiaas: tuple[ExperimentResult, Path]) -> None:
    res, _ = aiaas
    by = {r["setup"]: r for r in res.rows}
    assert set(by) == {"user-trained", "mixed", "AIaaS"}
    u, m, a = by["user-trained"], by["mixed"], by["AIaaS"]
    # same traces, only the shared flag differs: sharing copies can only free memory
    assert u["admitted_of_trace"] <= m["admitted_of_trace"] <= a["admitted_of_trace"]
    assert a["models_loaded_per_node"] <= u["models_loaded_per_node"]
    # user-trained: one Nano holds a few ~1.2 GB model copies (paper: 2 to 3)
    assert 2.0 <= u["models_loaded_per_node"] <= 4.0
    assert u["apps_per_node"] == pytest.approx(u["models_loaded_per_node"])
    for r in by.values():
        assert r["sim_configs"] > 0 and r["sim_tenant_violations"] == 0


def test_cli_prints_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["experiment", "ibis-aiaas", "--quick", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "Ibis Fig. 19" in out and "assumptions:" in out and "2x" in out
    assert (tmp_path / "ibis-aiaas.csv").exists() and (tmp_path / "ibis-aiaas.png").exists()
    rows = list(csv.DictReader(io.StringIO((tmp_path / "ibis-aiaas.csv").read_text())))
    assert len(rows) == 3


def test_capacity_offline_optimum(capacity: tuple[ExperimentResult, Path]) -> None:
    """The offline optimum (longest prefix placeable at once) is printed per scenario with each policy's
    ratio; non-splitting ibis never places more than it, and it is never below ibis (ibis is its start)."""
    res, _ = capacity
    table = res.extra["offline_optimum"]
    assert {r["scenario"] for r in table} == {"mps", "timeshare", "nano-rates"}
    for r in table:
        assert r["optimum_prefix"] <= r["optimum_upper_bound"] <= 70
        if r["policy"] == "ibis":
            assert r["placed"] <= r["optimum_prefix"]
        if r["policy"] == "knapsack":
            assert r["placed_no_predicted_violation"] <= r["optimum_upper_bound"]
    metrics = [s.metric for s in res.summary]
    for sc in ("mps", "timeshare", "nano-rates"):
        assert any(m.startswith(f"[{sc}] offline optimum") for m in metrics)
        for tag in ("knapsack", "ibis", "edgemux"):
            assert any(m.startswith(f"[{sc}] online / offline optimum, {tag}") for m in metrics)
    mps = [r for r in table if r["scenario"] == "mps"]
    assert all(r["optimum_status"] == "optimal" for r in mps)   # MPS rows are exact: proven at the root node
