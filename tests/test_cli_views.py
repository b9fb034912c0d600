"""``edgemux get nodes|devices`` (``-o table|wide|json|yaml``, ``--watch``), ``get apps -o wide``, ``get events
--watch`` and ``edgemux top`` against a real control plane's HTTP API (its agents faked: the managers' fake
driver), on an event loop thread while the CLI runs in the test's thread."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from edgemux.cli.main import main
from edgemux.cluster.specs import parse_cluster
from edgemux.runtime.controlplane.api import start_server
from edgemux.runtime.controlplane.overview import device_views
from edgemux.runtime.controlplane.service import ControlPlane
from support import LoopThread
from test_controlplane_managers import ROOMY, FakeDriver, app, node_of, register


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ControlPlane, LoopThread]]:
    """A control plane with two registered (fake) agents and one app, served on 127.0.0.1."""
    loop = LoopThread()
    driver = FakeDriver()
    store = tmp_path_factory.mktemp("cp") / "store.db"

    async def start() -> tuple[ControlPlane, Any]:
        cp = ControlPlane(str(store), parse_cluster(ROOMY), agent_driver=driver, drain_grace_s=0.0)
        server = await start_server(cp, "127.0.0.1", 0)
        await register(cp, driver)
        await cp.apply([app("cam", 10, slo_ms=50)])
        node = node_of(cp, "cam")
        body = driver.report(node)
        body["devices"][0].update({"utilization": 0.25, "queue_depth": 2, "inflight": 1, "backend": "emulated"})
        cp.register_agent(node, body, heartbeat=True)
        return cp, server

    cp, server = loop.run(start())
    try:
        yield server.url, cp, loop
    finally:
        loop.run(server.stop())
        loop.stop()


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_get_nodes_and_devices_show_power_utilization_and_tenants(served: Any, capsys: Any) -> None:
    url, cp, _ = served
    node = node_of(cp, "cam")
    code, out, err = cli(capsys, "get", "nodes", "--server", url)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split() == ["name", "agent", "power", "serving", "ms", "devices", "apps"]
    row = next(line for line in lines if line.startswith(node))
    assert row.split()[1:3] == ["ready", "on"] and row.split()[-1] == "cam"
    code, out, _ = cli(capsys, "get", "devices", "--server", url)
    row = next(line for line in out.splitlines() if line.startswith(f"{node}/tpu0"))
    # the predicted utilization is the estimators', the observed one the agent's heartbeat
    (mine,) = [d for d in device_views(cp) if d["path"] == f"{node}/tpu0"]
    assert f"{100 * mine['utilization']['predicted']:.0f}%" in row and "25%" in row and "emulated" in row
    assert row.split()[-1] == "cam"
    code, out, _ = cli(capsys, "get", "devices", "-o", "wide", "--server", url)
    assert "discipline" in out.splitlines()[0] and "fcfs" in out


def test_get_apps_wide_puts_predicted_beside_observed(served: Any, capsys: Any) -> None:
    url, cp, _ = served
    code, out, _ = cli(capsys, "get", "apps", "-o", "wide", "--server", url)
    assert code == 0
    header, _, row = out.splitlines()[:3]
    assert header.split()[:6] == ["name", "model", "slo", "ms", "predicted", "ok"]
    p95 = cp.describe("cam")["placement"]["pieces"][0]["predicted"]["p95_ms"]
    assert row.split()[:6] == ["cam", "mobilenet_v2", "p95", "50", f"{p95:.1f}", "yes"]


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_get_devices_as_json_or_yaml_is_the_document_alone(served: Any, capsys: Any, fmt: str) -> None:
    url, _, _ = served
    code, out, err = cli(capsys, "get", "devices", "-o", fmt, "--server", url)
    doc = json.loads(out) if fmt == "json" else yaml.safe_load(out)
    assert code == 0 and err == "" and [d["path"] for d in doc["devices"]] == ["n1/tpu0", "n2/tpu0"]
    code, out2, _ = cli(capsys, "get", "devices", "--json", "--server", url)  # --json is -o json
    assert [d["path"] for d in json.loads(out2)["devices"]] == ["n1/tpu0", "n2/tpu0"]


def test_watch_prints_a_table_again_only_when_it_changes(served: Any, capsys: Any) -> None:
    url, cp, loop = served
    code, out, _ = cli(capsys, "get", "nodes", "--watch", "-n", "3", "-d", "0.01", "--server", url)
    assert code == 0 and out.count("serving ms") == 1  # unchanged: printed once


def test_get_events_watch_prints_each_event_once(served: Any, capsys: Any) -> None:
    url, cp, loop = served

    async def add(message: str) -> None:
        cp.events.add("finding", "cam", message)

    loop.run(add("first"))
    code, out, _ = cli(capsys, "get", "events", "--watch", "-n", "2", "-d", "0.01", "--server", url)
    assert code == 0 and out.count("first") == 1 and out.splitlines()[0].split()[:2] == ["seq", "time"]
    loop.run(add("second"))
    code, out, _ = cli(capsys, "get", "events", "--watch", "-n", "1", "-o", "json", "--server", url)
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["message"] for e in events][-2:] == ["first", "second"]


def test_the_operators_applies_moves_and_deletes_are_on_the_timeline(served: Any, capsys: Any) -> None:
    url, cp, loop = served
    node = node_of(cp, "cam")
    target = f"{'n2' if node == 'n1' else 'n1'}/tpu0"
    assert cli(capsys, "move", "app", "cam", "--to", target, "--server", url)[0] == 0
    code, out, _ = cli(capsys, "get", "events", "-o", "json", "--server", url)
    events = {e["kind"]: e for e in json.loads(out)["events"]}
    assert events["admitted"]["app"] == "cam" and events["admitted"]["data"]["by"] == "operator"
    moved = events["operator-move"]
    assert moved["message"] == f"{node}/tpu0 x1 -> {target} x1" and moved["data"]["by"] == "operator"
    assert node_of(cp, "cam") == target.split("/")[0]

    async def reject_and_delete() -> None:
        (r,) = (await cp.apply([app("huge", 5000, slo_ms=6)]))[1]["results"]
        assert r["result"] == "rejected"
        await cp.apply([app("gone", 1)])
        await cp.delete("gone")

    loop.run(reject_and_delete())
    code, out, _ = cli(capsys, "get", "events", "--server", url)
    rows = {line.split()[2]: line for line in out.splitlines()[2:]}
    assert "huge" in rows["rejected"] and "gone" in rows["deleted"] and "admitted" in rows


def test_top_shows_devices_and_apps_on_one_screen(served: Any, capsys: Any) -> None:
    url, _, _ = served
    code, out, err = cli(capsys, "top", "-n", "2", "-d", "0.01", "--server", url)
    assert code == 0 and err == ""
    assert out.count("edgemux top - ") == 2 and "nodes 2/2 ready" in out and "apps 1 (0 missing their SLO)" in out
    assert "util pred" in out and "predicted" in out and "\x1b[2J" not in out  # a pipe: no screen clearing


@pytest.mark.parametrize(("argv", "message"), [
    (["get", "nodes", "--app", "cam"], "--app: only filters events, not nodes"),
    (["get", "nodes", "--watch", "-d", "0"], "--interval: must be a number of seconds > 0"),
    (["top", "-n", "-1"], "--iterations: must be >= 0"),
    (["get", "devices", "-o", "xml"], "invalid choice: 'xml'"),
])
def test_bad_view_options_are_one_line_and_exit_2(served: Any, capsys: Any, argv: list[str], message: str) -> None:
    url, _, _ = served
    code, out, err = cli(capsys, *argv, "--server", url)
    assert code == 2 and out == "" and message in err and len(err.strip().splitlines()) == 1


def test_an_unreachable_control_plane_is_one_line(capsys: Any, tmp_path: Path) -> None:
    code, out, err = cli(capsys, "top", "-n", "1", "--server", "http://127.0.0.1:9")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "127.0.0.1:9" in err
