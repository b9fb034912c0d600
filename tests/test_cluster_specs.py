"""Cluster and app specs (``edgemux.cluster.specs``): good files parse, every bad file gives an InputError
naming the field, and to_dict/parse round-trips."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import EXAMPLES
from edgemux.cluster.specs import (app_to_dict, apps_to_dict, cluster_to_dict, load_apps, load_cluster, parse_app,
                                   parse_apps, parse_cluster)
from edgemux.cluster.state import App, Cluster, Device, Node, Slo
from edgemux.cluster.workload import Discipline
from edgemux.errors import InputError, UnknownNameError
from edgemux.profiles.catalog import load_catalog
from edgemux.profiles.types import DeviceKind

CLUSTER = """\
apiVersion: edgemux/v1alpha1
kind: Cluster
metadata: {name: c}
spec:
  nodes:
    - name: n1
      cpuCores: 4
      memoryMb: 2048
      devices:
        - {name: tpu0, kind: edgetpu, memoryMb: 6.9, profiles: microedge}
        - {name: gpu0, kind: gpu-embedded, memoryMb: 4096, profiles: ibis-jetson-nano}
        - {name: gpu1, kind: gpu-discrete, discipline: batch, memoryMb: 16000, maxBatch: 8, batchTimeoutMs: 5}
"""

APP = """\
apiVersion: edgemux/v1alpha1
kind: App
metadata: {name: a}
spec:
  model: mobilenet_v2
  rate: 10
  slo: {latencyMs: 50, stat: p95}
"""

APPLIST = """\
apiVersion: edgemux/v1alpha1
kind: AppList
metadata: {name: l}
spec:
  apps:
    - {name: a, model: mobilenet_v2, rate: 10, slo: {latencyMs: 50}}
    - {name: b, model: bodypix, fps: 15, burst: 2, slo: {latencyMs: 200, stat: p99}, shared: true,
       cpu: {cores: 1, serviceMs: 4}, memoryMb: 100, networkMs: 3, variants: [bodypix]}
"""


def test_cluster_parses_with_default_disciplines(write_yaml):
    c = load_cluster(write_yaml(CLUSTER, "c.yaml"))
    devs = c.devices
    assert list(devs) == ["n1/tpu0", "n1/gpu0", "n1/gpu1"]
    assert devs["n1/tpu0"].discipline is Discipline.FCFS and devs["n1/tpu0"].memory_mb == 6.9
    assert devs["n1/gpu0"].discipline is Discipline.GPU_TIMESHARE
    assert devs["n1/gpu1"].discipline is Discipline.BATCH and devs["n1/gpu1"].max_batch == 8
    assert c.nodes[0].cpu_cores == 4.0 and c.nodes[0].memory_mb == 2048.0


def test_a_nodes_serving_path_is_on_each_of_its_devices(write_yaml):
    """``servingMs`` on a node (default 0) is every device's ``serving_ms``, and written back once, on the node."""
    c = load_cluster(write_yaml(_edit(CLUSTER, "cpuCores: 4", "cpuCores: 4\n      servingMs: 2.5"), "c.yaml"))
    assert {d.serving_ms for d in c.devices.values()} == {2.5} and c.nodes[0].serving_ms == 2.5
    assert cluster_to_dict(c)["spec"]["nodes"][0]["servingMs"] == 2.5
    assert "servingMs" not in cluster_to_dict(c.with_serving({"n1": 0.0}))["spec"]["nodes"][0]
    with pytest.raises(ValueError, match="serving_ms"):
        Node("n1", 1, 1, (c.devices["n1/tpu0"], Device("n1", "x", DeviceKind.CPU, Discipline.FCFS, 1.0)))


def test_apps_parse_single_list_and_stream(write_yaml):
    (a,) = load_apps(write_yaml(APP, "a.yaml"))
    assert a == App("a", "mobilenet_v2", 10.0, Slo(50.0, "p95"))
    listed = load_apps(write_yaml(APPLIST, "l.yaml"))
    assert [x.name for x in listed] == ["a", "b"]
    b = listed[1]
    assert b.periodic and b.rate_rps == 15 and b.burst == 2 and b.shared and b.cpu_cores == 1 and b.cpu_ms == 4
    assert b.slo == Slo(200.0, "p99") and b.variants == ("bodypix",) and b.network_ms == 3
    stream = APP + "---\n" + APP.replace("{name: a}", "{name: a2}")
    assert [x.name for x in load_apps(write_yaml(stream, "s.yaml"))] == ["a", "a2"]
    assert parse_app(yaml.safe_load(APP)) == a


def test_examples_load_and_round_trip():
    c = load_cluster(EXAMPLES / "cluster" / "cluster.yaml")
    apps = load_apps(EXAMPLES / "cluster" / "apps.yaml")
    assert len(c.nodes) == 2 and len(c.devices) == 4 and len(apps) == 5
    assert parse_cluster(yaml.safe_load(yaml.safe_dump(cluster_to_dict(c)))) == c
    assert parse_apps(yaml.safe_load(yaml.safe_dump(apps_to_dict(apps)))) == apps
    assert [parse_app(app_to_dict(a)) for a in apps] == apps


# ------------------------------------------------------------------------------------------- bad specs

def _edit(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new)


BAD_CLUSTERS = [
    ("wrong api", _edit(CLUSTER, "edgemux/v1alpha1", "v1"), "apiVersion", "edgemux/v1alpha1"),
    ("wrong kind", _edit(CLUSTER, "kind: Cluster", "kind: Scenario"), "kind", "'Cluster'"),
    ("no nodes", CLUSTER.split("spec:")[0] + "spec: {}\n", "spec.nodes", "required"),
    # a misspelt field is the typo it is, not a missing field (tests/test_specs_strict.py has the rest)
    ("misspelt nodes", _edit(CLUSTER, "  nodes:", "  nodez:"), "spec.nodez", "did you mean 'nodes'?"),
    ("bad kind", _edit(CLUSTER, "kind: edgetpu", "kind: tpu"), "spec.nodes[0].devices[0].kind", "tpu"),
    ("bad discipline", _edit(CLUSTER, "discipline: batch", "discipline: lifo"),
     "spec.nodes[0].devices[2].discipline", "lifo"),
    ("no memory", _edit(CLUSTER, "memoryMb: 6.9, ", ""), "spec.nodes[0].devices[0].memoryMb", "required"),
    ("zero memory", _edit(CLUSTER, "memoryMb: 6.9", "memoryMb: 0"), "spec.nodes[0].devices[0].memoryMb", "> 0"),
    ("unknown profiles", _edit(CLUSTER, "profiles: microedge", "profiles: nope"),
     "spec.nodes[0].devices[0].profiles", "nope"),
    ("fractional batch", _edit(CLUSTER, "maxBatch: 8", "maxBatch: 2.5"), "spec.nodes[0].devices[2].maxBatch", "whole"),
    ("servers < 1", _edit(CLUSTER, "maxBatch: 8", "servers: 0.5"), "spec.nodes[0].devices[2].servers", ">= 1"),
    ("duplicate device", _edit(CLUSTER, "name: gpu1", "name: gpu0"), "spec.nodes[0].devices[2].name", "duplicate"),
    ("duplicate node", CLUSTER + "    - {name: n1, cpuCores: 1, memoryMb: 1}\n", "spec.nodes[1].name", "duplicate"),
    ("negative cores", _edit(CLUSTER, "cpuCores: 4", "cpuCores: -1"), "spec.nodes[0].cpuCores", "> 0"),
    ("negative serving", _edit(CLUSTER, "cpuCores: 4", "cpuCores: 4\n      servingMs: -1"), "spec.nodes[0].servingMs",
     ">= 0"),
    ("slash in name", _edit(CLUSTER, "name: n1", "name: a/b"), "spec.nodes[0].name", "'/'"),
    ("not a mapping", "- just a list\n", "document", "mapping"),
    ("malformed", CLUSTER + "  oops: [unclosed\n", "line ", "malformed YAML"),
]


@pytest.mark.parametrize("case", BAD_CLUSTERS, ids=[c[0] for c in BAD_CLUSTERS])
def test_bad_cluster_names_the_field(case, write_yaml):
    _, text, field, problem = case
    p = write_yaml(text, "bad-cluster.yaml")
    with pytest.raises(InputError) as e:
        load_cluster(p)
    assert e.value.field.startswith(field) if field == "line " else e.value.field == field, e.value
    assert problem in e.value.problem, e.value
    assert e.value.source == str(p) and str(p) in str(e.value)


BAD_APPS = [
    ("wrong api", _edit(APP, "edgemux/v1alpha1", "edgemux/v2"), "apiVersion", "edgemux/v1alpha1"),
    ("wrong kind", _edit(APP, "kind: App", "kind: Pod"), "kind", "'App' or 'AppList'"),
    ("unknown model", _edit(APP, "mobilenet_v2", "mobilenet_v9"), "spec.model", "mobilenet_v9"),
    ("unknown variant", _edit(APP, "  rate: 10", "  variants: [mobilenet_v2, nope]\n  rate: 10"),
     "spec.variants[1]", "nope"),
    ("negative rate", _edit(APP, "rate: 10", "rate: -3"), "spec.rate", "must be > 0, got -3"),
    ("zero fps", _edit(APP, "rate: 10", "fps: 0"), "spec.fps", "> 0"),
    ("rate and fps", _edit(APP, "rate: 10", "rate: 10\n  fps: 5"), "spec.rate", "exactly one"),
    ("no rate", _edit(APP, "  rate: 10\n", ""), "spec.rate", "exactly one"),
    ("no slo", _edit(APP, "  slo: {latencyMs: 50, stat: p95}\n", ""), "spec.slo", "required"),
    ("bad stat", _edit(APP, "stat: p95", "stat: p90"), "spec.slo.stat", "p90"),
    # mobilenet_v2: 4.91 ms on the Edge TPU (ibis-edgetpu), 13.02 ms on the Jetson Nano
    ("slo below service", _edit(APP, "latencyMs: 50", "latencyMs: 3"), "spec.slo.latencyMs", "4.91"),
    # 4.91 ms + 2 ms network > 5 ms
    ("slo below service+network", _edit(_edit(APP, "rate: 10", "rate: 10\n  networkMs: 2"), "latencyMs: 50",
                                        "latencyMs: 5"), "spec.slo.latencyMs", "6.91"),
    ("cpu without time", _edit(APP, "rate: 10", "rate: 10\n  cpu: {cores: 1}"), "spec.cpu.serviceMs", "required"),
    ("shared not bool", _edit(APP, "rate: 10", "rate: 10\n  shared: yes-please"), "spec.shared", "true or false"),
    ("no name", _edit(APP, "metadata: {name: a}", "metadata: {}"), "metadata.name", "required"),
    ("duplicate in list", _edit(APPLIST, "name: b,", "name: a,"), "spec.apps[1].name", "duplicate app 'a'"),
    ("duplicate in stream", APP + "---\n" + APP, "documents[1].metadata.name", "duplicate app 'a'"),
    ("bad in stream", APP + "---\n" + _edit(_edit(APP, "rate: 10", "rate: -1"), "{name: a}", "{name: a2}"),
     "documents[1].spec.rate", "> 0"),
    ("negative burst", _edit(APP, "rate: 10", "rate: 10\n  burst: -1"), "spec.burst", "> 0"),
    ("malformed", "apiVersion: edgemux/v1alpha1\nkind: App\nspec: {model: [\n", "line ", "malformed YAML"),
]


@pytest.mark.parametrize("case", BAD_APPS, ids=[c[0] for c in BAD_APPS])
def test_bad_app_names_the_field(case, write_yaml):
    _, text, field, problem = case
    p = write_yaml(text, "bad-apps.yaml")
    with pytest.raises(InputError) as e:
        load_apps(p)
    assert e.value.field.startswith(field) if field == "line " else e.value.field == field, e.value
    assert problem in e.value.problem, e.value
    assert str(p) in str(e.value)


def test_slo_error_names_both_numbers_and_unknown_model_is_unknown_name(write_yaml):
    with pytest.raises(InputError) as e:
        load_apps(write_yaml(_edit(APP, "latencyMs: 50", "latencyMs: 3"), "x.yaml"))
    assert "3 ms" in e.value.problem and "4.91 ms" in e.value.problem
    with pytest.raises(UnknownNameError) as u:
        load_apps(write_yaml(_edit(APP, "mobilenet_v2", "mobilenet_v9"), "y.yaml"))
    assert u.value.name == "mobilenet_v9"


def test_missing_file_and_empty_stream(tmp_path, write_yaml):
    with pytest.raises(InputError, match="no such file"):
        load_cluster(tmp_path / "nope.yaml")
    with pytest.raises(InputError, match="no App"):
        load_apps(write_yaml("# nothing\n", "empty.yaml"))


# ------------------------------------------------------------------------------------------- round trip

_CAT = load_catalog()
_MODELS = sorted(m for m in _CAT.models() if any(1 in p.exec for p in _CAT.find_all(m)))
_num = st.floats(min_value=0.001, max_value=1e4, allow_nan=False, allow_infinity=False)
_name = st.text("abcdefghij-0123456789", min_size=1, max_size=12)


@st.composite
def apps_st(draw) -> App:
    cpu = draw(st.booleans())
    return App(name=draw(_name), model=draw(st.sampled_from(_MODELS)), rate_rps=draw(_num),
               slo=Slo(draw(st.floats(min_value=5e4, max_value=1e6)), draw(st.sampled_from(["mean", "p50", "p95", "p99"]))),
               variants=tuple(draw(st.lists(st.sampled_from(_MODELS), max_size=3))), periodic=draw(st.booleans()),
               burst=draw(_num), cpu_cores=draw(_num) if cpu else 0.0, cpu_ms=draw(_num) if cpu else 0.0,
               memory_mb=draw(st.sampled_from([0.0, 1.5, 512.0])), network_ms=draw(st.sampled_from([0.0, 12.23])),
               shared=draw(st.booleans()))


@settings(max_examples=60, deadline=None)
@given(apps_st())
def test_app_round_trip(app):
    assert parse_app(app_to_dict(app)) == app
    assert parse_apps(yaml.safe_load(yaml.safe_dump(apps_to_dict([app])))) == [app]


@st.composite
def clusters_st(draw) -> Cluster:
    nodes = []
    for i in range(draw(st.integers(1, 3))):
        devs = []
        for j in range(draw(st.integers(0, 3))):
            kind = draw(st.sampled_from(list(DeviceKind)))
            devs.append(Device(f"n{i}", f"d{j}", kind, draw(st.sampled_from(list(Discipline))), draw(_num),
                               draw(st.sampled_from([None, "microedge", "ibis-jetson-nano"])),
                               draw(st.floats(1, 8)), draw(st.integers(1, 16)), draw(st.floats(0, 50))))
        nodes.append(Node(f"n{i}", draw(_num), draw(_num), tuple(devs)).with_serving(draw(st.sampled_from([0.0, 2.5]))))
    return Cluster(tuple(nodes))


@settings(max_examples=40, deadline=None)
@given(clusters_st())
def test_cluster_round_trip(cluster):
    assert parse_cluster(cluster_to_dict(cluster)) == cluster
    assert parse_cluster(yaml.safe_load(yaml.safe_dump(cluster_to_dict(cluster)))) == cluster


def test_round_trip_is_not_vacuous():
    a = App("a", "mobilenet_v2", 10.0, Slo(50.0))
    d = app_to_dict(a)
    d["spec"]["rate"] = 11
    assert parse_app(d) != a
