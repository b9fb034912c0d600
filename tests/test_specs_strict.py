"""Strict specs (docs/reference/formats.md, "Strict fields"): a field that a mapping does not have is refused in one
line naming its dotted path, with the closest known field as a suggestion, before any other check of that mapping,
in every spec edgemux reads: scenarios, clusters, App/AppList documents (files and the control plane's HTTP body)
and a profile set's index and constants files.

``test_every_mapping_is_strict`` walks every mapping of full documents (every optional sub-mapping present) and
plants an unknown key in each: a mapping parsed without ``Reader.only`` fails it."""

from __future__ import annotations

import copy
import json
import re
import shutil
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import EXAMPLES, REPO
from edgemux.cli.main import main
from edgemux.cluster import scenario as scenario_mod
from edgemux.cluster import specs as specs_mod
from edgemux.cluster.scenario import parse_scenario
from edgemux.cluster.specs import parse_apps, parse_cluster
from edgemux.errors import InputError, UnknownFieldError, closest_name
from edgemux.profiles.catalog import CatalogDataError, load_catalog_from
from support import TWO_TPUS_YAML, LoopThread

UNKNOWN = "zzUnknownField"  # close to no field: refused without a suggestion

SCENARIO = """\
apiVersion: edgemux/v1alpha1
kind: Scenario
metadata: {name: s, labels: {team: vision}, annotations: {owner: "a@b.c"}}
spec:
  nodes:
    - name: n1
      devices:
        - {name: tpu0, kind: edgetpu, discipline: fcfs, profiles: ibis-edgetpu}
        - {name: gpu0, kind: gpu-discrete, discipline: batch, maxBatch: 4, batchTimeoutMs: 2, servers: 1}
  apps:
    - {name: a, model: mobilenet_v2, device: n1/tpu0, fps: 5, networkMs: 3, sharedModel: m,
       profile: ibis-edgetpu/mobilenet_v2,
       slo: {latencyMs: 120, stat: p95}, cpu: {cores: 1, serviceMs: 2, varianceMs2: 1}}
    - {name: b, model: custom, device: n1/gpu0, rate: 3, serviceMs: 10, varianceMs2: 4, switchMs: 1,
       batchLaw: {k1Ms: 2, k2Ms: 8}}
"""

CLUSTER = """\
apiVersion: edgemux/v1alpha1
kind: Cluster
metadata: {name: c, labels: {site: lab}, annotations: {note: x}}
spec:
  nodes:
    - name: n1
      cpuCores: 4
      memoryMb: 2048
      servingMs: 1.5
      devices:
        - {name: tpu0, kind: edgetpu, memoryMb: 6.9, profiles: microedge}
        - {name: gpu1, kind: gpu-discrete, discipline: batch, memoryMb: 16000, maxBatch: 8, batchTimeoutMs: 5,
           servers: 1}
"""

APP = """\
apiVersion: edgemux/v1alpha1
kind: App
metadata: {name: a, labels: {tier: gold}, annotations: {why: demo}}
spec:
  model: mobilenet_v2
  variants: [mobilenet_v2]
  rate: 10
  burst: 2
  slo: {latencyMs: 50, stat: p95}
  cpu: {cores: 1, serviceMs: 4}
  memoryMb: 100
  networkMs: 3
  shared: false
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

PARSERS: dict[str, Callable[[Any], Any]] = {
    "scenario": lambda d: parse_scenario(d, "s.yaml"),
    "cluster": lambda d: parse_cluster(d, "c.yaml"),
    "app": lambda d: parse_apps(d, "a.yaml"),
    "applist": lambda d: parse_apps(d, "a.yaml"),
}
DOCS = {"scenario": SCENARIO, "cluster": CLUSTER, "app": APP, "applist": APPLIST}
# mappings whose keys are names the user chooses, not fields
FREE_FORM = ("labels", "annotations")


def _set(doc: Any, path: str, key: Any, value: Any) -> Any:
    """A copy of ``doc`` with ``key: value`` added to the mapping at dotted ``path`` ("" is the top)."""
    out = copy.deepcopy(doc)
    node = out
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        node = node[int(part[1:-1])] if part.startswith("[") else node[part]
    node[key] = value
    return out


def _mappings(node: Any, path: str = "") -> Iterator[str]:
    """The dotted path of every mapping in a parsed document, free-form ones left out."""
    if isinstance(node, dict):
        yield path
        for k, v in node.items():
            if k not in FREE_FORM:
                yield from _mappings(v, f"{path}.{k}" if path else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _mappings(v, f"{path}[{i}]")


def _refused(kind: str, doc: Any) -> UnknownFieldError:
    with pytest.raises(UnknownFieldError) as e:
        PARSERS[kind](doc)
    return e.value


# ----------------------------------------------------------------------------------------- suggestions


@pytest.mark.parametrize("name, known, expected", [
    ("brust", ("rate", "burst", "fps"), "burst"),
    ("latencyMS", ("latencyMs", "stat"), "latencyMs"),     # case alone: always suggested
    ("MEMORYMB", ("memoryMb", "networkMs"), "memoryMb"),
    ("kindd", ("name", "kind", "discipline"), "kind"),
    (UNKNOWN, ("name", "kind"), None),
    ("x", ("model", "rate"), None),
])
def test_closest_name(name: str, known: tuple[str, ...], expected: str | None) -> None:
    assert closest_name(name, known) == expected


# ------------------------------------------------------------------------------------- the typos refused


TYPOS = [
    # (spec, dotted path of the mapping, typo, value, the field it suggests)
    ("app", "spec", "brust", 10, "burst"),
    ("app", "spec.slo", "latencyMS", 50, "latencyMs"),    # latencyMs itself is then missing: the typo wins
    ("app", "spec.cpu", "serviceMS", 4, "serviceMs"),
    ("app", "metadata", "nmae", "x", "name"),
    ("app", "metadata", "label", {"a": "b"}, "labels"),
    ("app", "", "specs", {}, "spec"),
    ("app", "", "apiversion", "edgemux/v1alpha1", "apiVersion"),
    ("applist", "spec", "aps", [], "apps"),
    ("applist", "spec.apps[1]", "modle", "bodypix", "model"),
    ("applist", "metadata", "annotation", {}, "annotations"),
    ("cluster", "spec", "nodez", [], "nodes"),
    ("cluster", "spec.nodes[0]", "cpucores", 4, "cpuCores"),
    ("cluster", "spec.nodes[0]", "servingMS", 1, "servingMs"),
    ("cluster", "spec.nodes[0].devices[1]", "kindd", "gpu-discrete", "kind"),
    ("cluster", "spec.nodes[0].devices[0]", "memoryMB", 6.9, "memoryMb"),
    ("cluster", "metadata", "nam", "c", "name"),
    ("scenario", "spec", "app", [], "apps"),
    ("scenario", "spec.nodes[0]", "devics", [], "devices"),
    ("scenario", "spec.nodes[0].devices[0]", "disipline", "fcfs", "discipline"),
    ("scenario", "spec.apps[0]", "devise", "n1/tpu0", "device"),
    ("scenario", "spec.apps[0].slo", "latencyMS", 100, "latencyMs"),
    ("scenario", "spec.apps[0].cpu", "varianceMS2", 1, "varianceMs2"),
    ("scenario", "spec.apps[1].batchLaw", "k1ms", 2, "k1Ms"),
    ("scenario", "metadata", "Name", "s", "name"),
]


@pytest.mark.parametrize("kind, path, typo, value, suggestion", TYPOS,
                         ids=[f"{t[0]}:{t[1]}.{t[2]}" for t in TYPOS])
def test_typo_is_refused_with_its_suggestion(kind: str, path: str, typo: str, value: Any, suggestion: str) -> None:
    err = _refused(kind, _set(yaml.safe_load(DOCS[kind]), path, typo, value))
    field = f"{path}.{typo}" if path else typo
    assert err.field == field and err.suggestion == suggestion
    assert str(err) == f"{err.source}: {field}: unknown field, did you mean {suggestion!r}?"
    assert "\n" not in str(err)


def test_a_misspelt_required_field_is_the_typo_not_a_missing_field() -> None:
    doc = yaml.safe_load(APP)
    doc["spec"]["slo"] = {"latencyMS": 50}
    err = _refused("app", doc)
    assert "is required" not in str(err) and "did you mean 'latencyMs'?" in str(err)
    doc = yaml.safe_load(CLUSTER)
    del doc["spec"]["nodes"][0]["devices"][0]["memoryMb"]
    doc["spec"]["nodes"][0]["devices"][0]["memoryMB"] = 6.9
    assert _refused("cluster", doc).suggestion == "memoryMb"


def test_no_close_field_lists_the_known_ones() -> None:
    err = _refused("app", _set(yaml.safe_load(APP), "spec", UNKNOWN, 1))
    assert err.suggestion is None and err.field == f"spec.{UNKNOWN}"
    assert err.problem == f"unknown field (known: {', '.join(specs_mod.APP_SPEC_FIELDS)})"


def test_a_stream_names_the_document_and_non_string_keys_are_fields_too() -> None:
    second = yaml.safe_load(APP.replace("{name: a,", "{name: b,"))
    second["spec"]["brust"] = 3
    err = _refused("app", [yaml.safe_load(APP), second])
    assert err.field == "documents[1].spec.brust"
    assert _refused("app", _set(yaml.safe_load(APP), "spec", 7, 1)).field == "spec.7"


def test_scenario_device_has_no_cluster_memory() -> None:
    """A scenario plans no memory: a cluster device's ``memoryMb`` copied into one is refused, not ignored."""
    err = _refused("scenario", _set(yaml.safe_load(SCENARIO), "spec.nodes[0].devices[0]", "memoryMb", 8))
    assert err.field == "spec.nodes[0].devices[0].memoryMb"


def test_metadata_labels_and_annotations_map_strings_to_strings() -> None:
    for doc in (yaml.safe_load(APP), yaml.safe_load(CLUSTER), yaml.safe_load(SCENARIO)):
        doc["metadata"]["labels"] = {"version": 2}
        kind = doc["kind"].lower()
        with pytest.raises(InputError) as e:
            PARSERS[kind](doc)
        assert e.value.field == "metadata.labels.version" and "expected a string" in e.value.problem


# ----------------------------------------------------------------------------- every mapping is strict


CASES = [(kind, path) for kind, text in DOCS.items() for path in _mappings(yaml.safe_load(text))]


@pytest.mark.parametrize("kind, path", CASES, ids=[f"{k}:{p or '<top>'}" for k, p in CASES])
def test_every_mapping_is_strict(kind: str, path: str) -> None:
    doc = yaml.safe_load(DOCS[kind])
    PARSERS[kind](doc)  # the document itself is good
    err = _refused(kind, _set(doc, path, UNKNOWN, 1))
    assert err.field == (f"{path}.{UNKNOWN}" if path else UNKNOWN) and err.suggestion is None


def test_full_documents_reach_every_declared_field() -> None:
    """The documents above use every field each mapping declares, so the walk covers every mapping kind."""
    used: set[str] = set()
    for text in DOCS.values():
        for path in _mappings(yaml.safe_load(text)):
            doc = yaml.safe_load(text)
            node = doc
            for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
                node = node[int(part[1:-1])] if part.startswith("[") else node[part]
            used.update(node)
    declared = {f for mod in (specs_mod, scenario_mod) for name, fields in vars(mod).items()
                if name.endswith("_FIELDS") for f in fields}
    assert declared <= used, sorted(declared - used)


@pytest.mark.parametrize("path", sorted(EXAMPLES.rglob("*.yaml")), ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_examples_use_known_fields_only(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]
    for i, doc in enumerate(docs):
        kind = {"Scenario": "scenario", "Cluster": "cluster"}.get(doc["kind"], "app")
        try:
            PARSERS[kind](doc)
        except UnknownFieldError as e:
            pytest.fail(f"{path} document {i}: {e}")
        except InputError:
            pass  # a model of a local profile set (examples/local): not this test's business


# ------------------------------------------------------------------------------------------ profile sets


@pytest.fixture
def profile_set(tmp_path: Path) -> Path:
    """A copy of the built-in catalogs as a profile set directory (what ``--profiles DIR`` reads)."""
    data = resources.files("edgemux.profiles") / "data"
    out = tmp_path / "set"
    shutil.copytree(str(data), out)
    return out


@pytest.mark.parametrize("file, path, typo, suggestion", [
    ("catalogs.yaml", "", "colums", "columns"),
    ("catalogs.yaml", "", UNKNOWN, None),
    ("catalogs.yaml", "catalogs[0]", "descripton", "description"),
    ("catalogs.yaml", "columns.task", "meanng", "meaning"),
    ("constants.yaml", "", "constant", "constants"),
    ("constants.yaml", "constants[0]", "vlaue", "value"),
])
def test_profile_set_files_are_strict(profile_set: Path, file: str, path: str, typo: str,
                                      suggestion: str | None) -> None:
    doc = yaml.safe_load((profile_set / file).read_text(encoding="utf-8"))
    (profile_set / file).write_text(yaml.safe_dump(_set(doc, path, typo, "x")), encoding="utf-8")
    with pytest.raises(CatalogDataError) as e:
        load_catalog_from(profile_set)
    assert e.value.field == (f"{path}.{typo}" if path else typo) and e.value.source == f"{profile_set}/{file}"
    assert e.value.problem.startswith("unknown field") and (suggestion is None or f"{suggestion!r}?" in e.value.problem)


# ------------------------------------------------------------------------------------------------ the docs


def _code_words(section: str) -> set[str]:
    """Every identifier inside the section's inline code spans and fenced blocks."""
    spans = re.findall(r"```.*?```|`[^`\n]+`", section, flags=re.S)
    return {w for s in spans for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", s)}


def _section(title: str) -> str:
    text = (REPO / "docs" / "reference" / "formats.md").read_text(encoding="utf-8")
    m = re.search(rf"^## {re.escape(title)}.*?(?=^## |\Z)", text, flags=re.S | re.M)
    assert m, title
    return m.group(0)


@pytest.mark.parametrize("title, fields", [
    ("Scenario", {f for n, v in vars(scenario_mod).items() if n.endswith("_FIELDS") for f in v}),
    ("Cluster", {*specs_mod.CLUSTER_SPEC_FIELDS, *specs_mod.NODE_FIELDS, *specs_mod.CLUSTER_DEVICE_FIELDS}),
    ("Apps", {*specs_mod.APPLIST_SPEC_FIELDS, *specs_mod.APPLIST_ITEM_FIELDS, *specs_mod.SLO_FIELDS,
              *specs_mod.CPU_FIELDS}),
    ("Strict fields", {"name", "labels", "annotations"}),
])
def test_formats_md_documents_every_declared_field(title: str, fields: set[str]) -> None:
    assert fields <= _code_words(_section(title)), sorted(fields - _code_words(_section(title)))


# ----------------------------------------------------------------------------------------- CLI and HTTP


def test_cli_prints_one_line_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster, apps = tmp_path / "cluster.yaml", tmp_path / "apps.yaml"
    cluster.write_text(CLUSTER, encoding="utf-8")
    apps.write_text(APP.replace("burst: 2", "brust: 2"), encoding="utf-8")
    assert main(["place", "--cluster", str(cluster), "--apps", str(apps), "--policy", "edgemux"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"edgemux: error: {apps}: spec.brust: unknown field, did you mean 'burst'?\n"

    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(SCENARIO.replace("kind: edgetpu", "kindd: edgetpu"), encoding="utf-8")
    assert main(["predict", str(scenario)]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("edgemux: error: ")
    assert "spec.nodes[0].devices[0].kindd: unknown field, did you mean 'kind'?" in err


def _post(url: str, body: bytes, ctype: str) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_http_post_apps_answers_400_naming_the_field(tmp_path: Path) -> None:
    from edgemux.runtime.controlplane.api import start_server
    from edgemux.runtime.controlplane.service import ControlPlane

    loop = LoopThread()
    cp = ControlPlane(str(tmp_path / "store.db"), parse_cluster(yaml.safe_load(TWO_TPUS_YAML)), "edgemux", {})
    server = loop.run(start_server(cp, "127.0.0.1", 0))
    try:
        doc = yaml.safe_load(APP)
        doc["spec"]["brust"] = 10
        status, body = _post(f"{server.url}/v1/apps", json.dumps(doc).encode(), "application/json")
        assert status == 400 and body["field"] == "spec.brust", body
        assert "unknown field, did you mean 'burst'?" in body["error"]
        yaml_body = APP.replace("latencyMs: 50", "latencyMS: 50").encode()
        status, body = _post(f"{server.url}/v1/apps", yaml_body, "application/yaml")
        assert status == 400 and body["field"] == "spec.slo.latencyMS", body
        assert "did you mean 'latencyMs'?" in body["error"]
    finally:
        loop.run(server.stop())
        loop.stop()
