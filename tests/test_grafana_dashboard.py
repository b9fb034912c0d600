"""deploy/grafana/edgemux.json is a dashboard Grafana imports (the structure of its dashboard JSON model: a
title and uid, panels with unique ids on the 24-column grid, each query with a refId and a datasource, the
template variables its queries use), and every metric its queries name is one edgemux serves: the control
plane's from a real scrape of one with an app on it, the gateways' and agents' from the names they register."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from test_controlplane_managers import ROOMY, FakeClock, FakeDriver, app, counts, node_of, register, run

REPO = Path(__file__).resolve().parent.parent
DASHBOARD = REPO / "deploy" / "grafana" / "edgemux.json"
METRIC = re.compile(r"\b(edgemux_[a-z_]+)")
SUFFIXES = ("_bucket", "_count", "_sum")


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def queries(doc: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in doc["templating"]["list"] if v["type"] == "query"]
    return exprs


def test_the_dashboard_has_grafanas_dashboard_model() -> None:
    doc = dashboard()
    assert doc["title"] and re.fullmatch(r"[a-z0-9-]{1,40}", doc["uid"]) and isinstance(doc["schemaVersion"], int)
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    cells: set[tuple[int, int]] = set()
    for p in doc["panels"]:
        g = p["gridPos"]
        assert g["w"] > 0 and g["h"] > 0 and 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        area = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not area & cells, f"panel {p['title']!r} overlaps another"
        cells |= area
        assert p["type"] in ("timeseries", "stat", "table", "gauge") and p["title"] and p["targets"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs))
        for t in [p, *p["targets"]]:
            assert t["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    # every $variable a query uses is defined ($__ ones are Grafana's own)
    used = {v for e in queries(doc) for v in re.findall(r"\$(\w+)", e) if not v.startswith("__")}
    assert used <= set(variables), used - set(variables)


def test_a_panel_puts_predicted_beside_observed_at_the_slo_statistic() -> None:
    (panel,) = [p for p in dashboard()["panels"] if "predicted beside observed" in p["title"] and
                any("app_predicted" in t["expr"] for t in p["targets"])]
    exprs = " ".join(t["expr"] for t in panel["targets"])
    for name in ("edgemux_app_predicted_latency_seconds", "edgemux_app_observed_latency_seconds",
                 "edgemux_app_slo_seconds"):
        assert name in exprs


def _registered_in_src() -> set[str]:
    """The metric names the gateway's and agents' code registers (quoted in the source)."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in (REPO / "src" / "edgemux" / "runtime").rglob("*.py"))
    return set(re.findall(r"\"(edgemux_[a-z_]+)\"", text))


def test_every_metric_the_dashboard_queries_is_served(tmp_path: Path) -> None:
    names = set()
    for e in queries(dashboard()):
        for m in METRIC.findall(e):
            for s in SUFFIXES:
                m = m.removesuffix(s)
            names.add(m)
    scraped: list[str] = []

    async def body(cp: Any, driver: FakeDriver, clock: FakeClock) -> None:
        await register(cp, driver)
        await cp.apply([app("cam", 10)])
        node = node_of(cp, "cam")
        for total in (0, 300):
            report = driver.report(node, counts=counts(total, 5.0))
            report["devices"][0]["utilization"] = 0.2
            cp.register_agent(node, report, heartbeat=True)
        clock.t += 60.0
        cp.adaptation.step()
        scraped.append(cp.metrics_text().decode())

    run(tmp_path, body, cluster=ROOMY)
    served = {line.split("{")[0].split(" ")[0] for line in scraped[0].splitlines() if line.startswith("edgemux_")}
    controlplane = {n for n in names if n.startswith(("edgemux_app_", "edgemux_controlplane_",
                                                      "edgemux_device_predicted", "edgemux_device_observed"))}
    assert controlplane and controlplane <= served, controlplane - served
    others = names - controlplane
    src = _registered_in_src()
    assert others <= src | {n.removesuffix("_total") for n in src}, others - src


@pytest.mark.parametrize("bad", ["edgemux_no_such_metric", "edgemux_app_predicted_latency"])
def test_the_metric_check_can_fail(bad: str) -> None:
    assert bad not in _registered_in_src()
