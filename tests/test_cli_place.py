"""``edgemux place``: decisions as a table and JSON, explained rejections, the durable store across runs, and
every bad-input case as one line with exit code 2."""

from __future__ import annotations

import json

import pytest

from conftest import EXAMPLES
from edgemux.cli.main import main
from edgemux.cli.place_cmd import parse_value
from edgemux.cluster.store import Store

CLUSTER = str(EXAMPLES / "cluster" / "cluster.yaml")
APPS = str(EXAMPLES / "cluster" / "apps.yaml")
BASE = ["place", "--cluster", CLUSTER, "--apps", APPS]

# one Edge TPU; the second app cannot meet its SLO next to the first
ONE_TPU = """\
apiVersion: edgemux/v1alpha1
kind: Cluster
metadata: {name: one}
spec:
  nodes:
    - name: n1
      cpuCores: 4
      memoryMb: 4096
      devices:
        - {name: tpu0, kind: edgetpu, memoryMb: 64, profiles: ibis-edgetpu}
"""
TWO_APPS = """\
apiVersion: edgemux/v1alpha1
kind: AppList
metadata: {name: two}
spec:
  apps:
    - {name: a, model: mobilenet_v2, rate: 60, slo: {latencyMs: 50, stat: mean}}
    - {name: b, model: inception_v3, rate: 5, slo: {latencyMs: 120, stat: mean}}
"""


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_place_table(capsys):
    code, out, err = run(BASE + ["--policy", "knapsack"], capsys)
    assert code == 0, err
    assert "admitted 5 of 5" in out
    assert "node-1/tpu0 x1 (ibis-edgetpu/ssd_mobilenet_v2)" in out
    assert "cam-entrance, classify-shared" in out  # per-device tenants
    code, out, err = run(BASE + ["--policy", "ibis"], capsys)
    assert code == 0, err
    # the camera fits by the periodic bound; the p95/p99 apps fit the Jetsons on their tail laws; cam-dock
    # has no Edge TPU profile in ibis-edgetpu and misses its SLO on the other node
    assert "admitted 4 of 5" in out and "rejected" in out


def test_place_json(capsys):
    code, out, err = run(BASE + ["--policy", "ibis", "--option", "choice=spread", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["policy"] == "ibis" and doc["options"] == {"choice": "spread"}
    assert doc["total"] == 5 and doc["admitted"] == sum(d["decision"] == "placed" for d in doc["decisions"])
    assert [d["app"] for d in doc["decisions"]] == ["cam-entrance", "cam-dock", "ar-overlay",
                                                    "classify-shared", "detect-people"]
    placed = doc["decisions"][0]
    assert placed["decision"] == "placed" and placed["shares"][0]["weight"] == 1.0
    assert doc["admitted"] == 5   # spread leaves room for cam-dock on node-2's Edge TPU
    assert sum(len(d["tenants"]) for d in doc["devices"]) == doc["admitted"]
    code, out, err = run(BASE + ["--policy", "ibis", "--json"], capsys)
    rejected = next(d for d in json.loads(out)["decisions"] if d["decision"] == "rejected")
    assert rejected["app"] == "cam-dock"
    assert rejected["rejection"]["constraint"] and rejected["rejection"]["message"]


def test_explain_names_the_constraint_and_tenant(write_yaml, capsys):
    c = write_yaml(ONE_TPU, "c.yaml")
    a = write_yaml(TWO_APPS, "a.yaml")
    argv = ["place", "--cluster", str(c), "--apps", str(a), "--policy", "ibis"]
    code, out, err = run(argv + ["--explain"], capsys)
    assert code == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("b "))
    assert "rejected" in line
    # the existing tenant a is the one that would break
    assert "rejected: slo: a would see mean " in line and "ms > 50 ms on n1/tpu0" in line
    code, out, _ = run(argv, capsys)
    assert "a would see" not in out  # without --explain only the constraint
    code, out, _ = run(argv + ["--json"], capsys)
    rej = json.loads(out)["decisions"][1]["rejection"]
    assert rej["constraint"] == "slo" and rej["tenant"] == "a" and rej["stat"] == "mean"
    assert rej["predicted_ms"] > rej["slo_ms"] == 50


def test_explain_utilization_numbers(write_yaml, capsys):
    c = write_yaml(ONE_TPU, "c.yaml")
    a = write_yaml(TWO_APPS, "a.yaml")
    code, out, err = run(["place", "--cluster", str(c), "--apps", str(a), "--policy", "ibis",
                          "--option", "max_utilization=0.05", "--explain"], capsys)
    assert code == 0, err
    assert "rejected: utilization 0.29 > 0.05 on n1/tpu0" in out and "admitted 0 of 2" in out
    # and every device tried, in a table of its own
    assert out.splitlines()[-1].split() == ["b", "n1/tpu0", "utilization", "0.31", ">", "0.05"]


def test_store_persists_and_second_run_reports_duplicates(tmp_path, capsys):
    db = str(tmp_path / "s.db")
    code, out, err = run(BASE + ["--policy", "knapsack", "--store", db], capsys)
    assert code == 0, err
    assert "admitted 5 of 5" in out
    with Store.open(db) as s:
        assert list(s.apps()) == ["cam-entrance", "cam-dock", "ar-overlay", "classify-shared", "detect-people"]
        assert s.placements()["cam-dock"].shares[0].device == "node-2/tpu0"
        before = s.dump()
    code, out, err = run(BASE + ["--policy", "knapsack", "--store", db, "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["previously_stored"] == 5 and doc["admitted"] == 0
    assert {d["decision"] for d in doc["decisions"]} == {"duplicate"}
    assert sum(len(d["tenants"]) for d in doc["devices"]) == 5  # the stored tenants are still there
    with Store.open(db) as s:
        assert s.dump() == before and s.check() == []


def test_store_rejected_app_changes_nothing(write_yaml, tmp_path, capsys):
    c = write_yaml(ONE_TPU, "c.yaml")
    a = write_yaml(TWO_APPS, "a.yaml")
    db = str(tmp_path / "s.db")
    code, out, err = run(["place", "--cluster", str(c), "--apps", str(a), "--policy", "ibis", "--store", db],
                         capsys)
    assert code == 0, err
    with Store.open(db) as s:
        assert list(s.apps()) == ["a"] and s.loaded_models("n1/tpu0") == {"ibis-edgetpu/mobilenet_v2": 1}


def test_store_continues_from_stored_state(write_yaml, tmp_path, capsys):
    c = write_yaml(ONE_TPU, "c.yaml")
    first = write_yaml(TWO_APPS.replace("    - {name: b", "    # - {name: b"), "first.yaml")
    second = write_yaml(TWO_APPS.replace("    - {name: a", "    # - {name: a"), "second.yaml")
    db = str(tmp_path / "s.db")
    assert run(["place", "--cluster", str(c), "--apps", str(first), "--policy", "ibis", "--store", db],
               capsys)[0] == 0
    code, out, _ = run(["place", "--cluster", str(c), "--apps", str(second), "--policy", "ibis", "--store", db,
                        "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    # b alone would fit the empty TPU; next to the stored a it does not
    assert doc["decisions"][0]["decision"] == "rejected"
    code, out, _ = run(["place", "--cluster", str(c), "--apps", str(second), "--policy", "ibis", "--json"], capsys)
    assert json.loads(out)["decisions"][0]["decision"] == "placed"


def test_parse_value():
    assert parse_value("true") is True and parse_value("False") is False
    assert parse_value("3") == 3 and isinstance(parse_value("3"), int)
    assert parse_value("0.8") == 0.8 and parse_value("spread") == "spread"


@pytest.mark.parametrize("extra, needle", [
    (["--policy", "nope"], "unknown policy 'nope'"),
    (["--policy", "ibis", "--option", "foo=1"], "unknown option 'foo'"),
    (["--policy", "ibis", "--option", "choice"], "expected KEY=VALUE"),
    (["--policy", "ibis", "--option", "choice=sideways"], "choice must be one of"),
    (["--policy", "ibis", "--option", "max_utilization=2"], "max_utilization"),
    (["--policy", "ibis", "--option", "max_utilization=high"], "max_utilization expects float, got 'high'"),
    (["--policy", "microedge", "--option", "co_compiling=maybe"], "co_compiling expects bool, got 'maybe'"),
    (["--policy", "edgemux", "--option", "max_parts=2.5"], "max_parts expects int, got 2.5"),
    (["--policy", "ibis", "--option", "choice=7"], "choice expects str, got 7"),
])
def test_bad_policy_or_option(extra, needle, capsys):
    code, out, err = run(BASE + extra, capsys)
    assert code == 2 and out == ""
    assert err.startswith("edgemux: error: ") and err.count("\n") == 1 and needle in err


BAD_APPS = {
    "malformed": "apiVersion: edgemux/v1alpha1\nkind: AppList\nspec: {apps: [\n",
    "unknown-model": TWO_APPS.replace("mobilenet_v2", "no_such_net"),
    "negative-rate": TWO_APPS.replace("rate: 60", "rate: -3"),
    "slo-below-service": TWO_APPS.replace("latencyMs: 50", "latencyMs: 0.01"),
    "duplicate-name": TWO_APPS.replace("name: b", "name: a"),
}


@pytest.mark.parametrize("case", sorted(BAD_APPS))
def test_bad_apps_file(case, write_yaml, capsys):
    a = write_yaml(BAD_APPS[case], "a.yaml")
    code, out, err = run(["place", "--cluster", CLUSTER, "--apps", str(a), "--policy", "ibis"], capsys)
    assert code == 2 and out == ""
    assert err.startswith("edgemux: error: ") and err.count("\n") == 1


def test_bad_cluster_and_missing_files(write_yaml, tmp_path, capsys):
    bad = write_yaml(ONE_TPU.replace("kind: edgetpu", "kind: abacus"), "c.yaml")
    for argv in (["place", "--cluster", str(bad), "--apps", APPS, "--policy", "ibis"],
                 ["place", "--cluster", str(tmp_path / "missing.yaml"), "--apps", APPS, "--policy", "ibis"],
                 ["place", "--cluster", CLUSTER, "--apps", str(tmp_path / "missing.yaml"), "--policy", "ibis"],
                 ["place", "--cluster", CLUSTER, "--apps", APPS]):
        code, out, err = run(argv, capsys)
        assert code == 2 and out == "", argv
        assert err.startswith("edgemux: error: ") or err.startswith("edgemux place: error: "), err
        assert err.count("\n") == 1, err


def test_store_with_other_cluster_or_not_a_store(write_yaml, tmp_path, capsys):
    db = tmp_path / "s.db"
    assert run(BASE + ["--policy", "knapsack", "--store", str(db)], capsys)[0] == 0
    c = write_yaml(ONE_TPU, "c.yaml")
    code, out, err = run(["place", "--cluster", str(c), "--apps", APPS, "--policy", "ibis", "--store", str(db)],
                         capsys)
    assert code == 2 and out == "" and "different cluster" in err and err.count("\n") == 1
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    code, out, err = run(BASE + ["--policy", "ibis", "--store", str(junk)], capsys)
    assert code == 2 and out == "" and err.startswith("edgemux: error: ") and err.count("\n") == 1
