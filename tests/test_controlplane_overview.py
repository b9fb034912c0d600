"""The cluster at a glance (runtime/controlplane/overview.py): nodes and devices with predicted beside reported
utilization, apps with predicted beside observed latency and their timelines, the scrape-time gauges of
``/metrics`` and the routes ``/v1/nodes``, ``/v1/devices``, ``/v1/overview`` behind the admin token. Driven
through the managers' fake agent driver and clock (tests/test_controlplane_managers.py)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from edgemux.adapt.settings import AdaptSettings
from edgemux.cluster.specs import parse_cluster
from edgemux.perf.device import predict_device
from edgemux.policies.base import device_spec
from edgemux.runtime.controlplane.api import start_server
from edgemux.runtime.controlplane.overview import (Timeline, TimelinePoint, app_views, device_views, node_views,
                                                   overview)
from edgemux.runtime.controlplane.prediction import weighted_prediction
from edgemux.runtime.controlplane.service import ControlPlane
from test_controlplane_managers import (ROOMY, TOKEN, FakeClock, FakeDriver, app, counts, node_of, other, register,
                                        run)


def heartbeat(cp: ControlPlane, driver: FakeDriver, node: str, utilization: float, **extra: Any) -> None:
    """A heartbeat from ``node`` whose device reports ``utilization`` and a queue of 3."""
    body = driver.report(node, **extra)
    body["devices"][0].update({"utilization": utilization, "queue_depth": 3, "inflight": 1, "backend": "emulated"})
    cp.register_agent(node, body, heartbeat=True)


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample of the Prometheus text ``text``."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
        if m and m.group(1) == name and ",".join(sorted((m.group(2) or "").split(","))) == want:
            return float(m.group(3))
    raise AssertionError(f"no sample {name}{{{want}}}")


def test_devices_and_nodes_show_predicted_beside_reported(tmp_path: Path) -> None:
    async def body(cp: ControlPlane, driver: FakeDriver, clock: FakeClock) -> None:
        await register(cp, driver)
        await cp.apply([app("cam", 10)])
        node = node_of(cp, "cam")
        heartbeat(cp, driver, node, 0.27)
        devices = {d["path"]: d for d in device_views(cp)}
        assert set(devices) == {"n1/tpu0", "n2/tpu0"}
        mine, idle = devices[f"{node}/tpu0"], devices[f"{other(node)}/tpu0"]
        dev = cp.cluster.devices[f"{node}/tpu0"]
        rho = predict_device(device_spec(dev), cp.snapshot().tenants(dev))["cam"].rho
        assert mine["utilization"] == {"predicted": pytest.approx(rho), "observed": 0.27} and rho > 0
        assert mine["tenants"] == [{"app": "cam", "weight": 1.0, "profile": cp.placements["cam"].shares[0].profile}]
        assert (mine["emulated"], mine["queue_depth"], mine["inflight"], mine["power"]) == (True, 3, 1, "on")
        assert mine["memory_used_mb"] > 0 and mine["kind"] == "edgetpu"
        # the other device: no tenant, nothing predicted; its agent's registration reported no utilization
        assert idle["tenants"] == [] and idle["utilization"] == {"predicted": 0.0, "observed": None}
        nodes = {n["name"]: n for n in node_views(cp)}
        assert nodes[node]["apps"] == ["cam"] and nodes[other(node)]["apps"] == []
        assert nodes[node]["agent"]["ready"] is True and [d["path"] for d in nodes[node]["devices"]] == [mine["path"]]
        assert nodes[node]["serving_from"].startswith("declared")

    run(tmp_path, body, cluster=ROOMY)


def test_an_app_shows_its_prediction_beside_the_last_window_and_keeps_a_timeline(tmp_path: Path) -> None:
    timer = [0.0]

    def fake_timer(cp: ControlPlane) -> None:
        cp.adaptation.timer = lambda: timer[0]
        cp.adaptation.wall = lambda: 1.8e9 + clock_of[0].t  # the timeline's Unix time, on the test's clock

    clock_of: list[FakeClock] = []

    async def body(cp: ControlPlane, driver: FakeDriver, clock: FakeClock) -> None:
        clock_of.append(clock)
        await register(cp, driver)
        await cp.apply([app("cam", 10, slo_ms=50)])
        node = node_of(cp, "cam")
        (view,) = app_views(cp)
        assert view["observed"] is None and view["series"] == [] and view["attainment"] is None
        described = cp.describe("cam")["placement"]["pieces"][0]["predicted"]
        assert view["predicted"]["p95_ms"] == pytest.approx(described["p95_ms"])
        assert view["predicted"]["at_slo_stat_ms"] == view["predicted"]["p95_ms"]
        assert view["predicted_meets_slo"] is True
        # two windows: 300 requests at 5 ms, then 300 at 80 ms (over the 50 ms SLO)
        for total, latency in ((300, 5.0), (600, 80.0)):
            cp.register_agent(node, driver.report(node, counts=counts(total - 300, latency)), heartbeat=True)
            cp.register_agent(node, driver.report(node, counts=counts(total, latency)), heartbeat=True)
            clock.t += 60.0
            assert cp.adaptation.step() is not None
        (view,) = app_views(cp)
        assert view["observed"]["p95_ms"] == pytest.approx(80.0, rel=0.02) and view["observed_meets_slo"] is False
        points = view["series"]
        assert [p["observed_ms"] is not None for p in points] == [True, True]
        assert points[1]["time_s"] - points[0]["time_s"] == pytest.approx(60.0)  # one window apart
        assert points[0]["observed_ms"] == pytest.approx(5.0, rel=0.02) and points[0]["rate_rps"] == 5.0
        assert points[1]["predicted_ms"] == pytest.approx(view["predicted"]["p95_ms"])
        assert view["attainment"] == 0.5
        # since: only the points after it
        (later,) = app_views(cp, since_s=points[0]["time_s"])
        assert [p["time_s"] for p in later["series"]] == [points[1]["time_s"]]
        # a deleted app's timeline goes at the next window
        await cp.delete("cam")
        clock.t += 60.0
        cp.adaptation.step()
        assert cp.adaptation.timeline.series == {}

    run(tmp_path, body, cluster=ROOMY, before_start=fake_timer,
        adapt=AdaptSettings(window_s=60.0, trigger_windows=2, min_samples=20, min_dwell_s=60.0))


def test_weighted_prediction_weighs_pieces_with_traffic_and_says_unstable_or_unknown() -> None:
    a = {"mean_ms": 10.0, "p50_ms": 9.0, "p95_ms": 20.0, "p99_ms": 30.0}
    b = {"mean_ms": 20.0, "p50_ms": 19.0, "p95_ms": 40.0, "p99_ms": 50.0}
    out = weighted_prediction([(0.75, a), (0.25, b), (0.0, {"mean_ms": "unstable"})])
    assert out == {"mean_ms": 12.5, "p50_ms": 11.5, "p95_ms": 25.0, "p99_ms": 35.0}
    assert weighted_prediction([(0.5, a), (0.5, {**b, "p99_ms": "unstable"})])["p99_ms"] == "unstable"
    assert weighted_prediction([(0.5, a), (0.5, None)])["mean_ms"] is None


def test_timeline_is_bounded_and_attainment_counts_windows_with_answers() -> None:
    t = Timeline(points=3)
    for i, observed in enumerate((10.0, None, 60.0, 40.0, 70.0)):
        t.record("cam", TimelinePoint(float(i), 30.0, observed, 20.0, observed, 5.0, 0))
    assert [p.time_s for p in t.of("cam")] == [2.0, 3.0, 4.0]
    assert t.attainment("cam", 50.0) == pytest.approx(1 / 3)
    assert t.attainment("ghost", 50.0) is None


def test_metrics_carry_predicted_and_observed_gauges_and_counted_actions(tmp_path: Path) -> None:
    async def body(cp: ControlPlane, driver: FakeDriver, clock: FakeClock) -> None:
        await register(cp, driver)
        await cp.apply([app("cam", 10, slo_ms=50)])
        node = node_of(cp, "cam")
        heartbeat(cp, driver, node, 0.4)
        for total in (0, 300):
            cp.register_agent(node, driver.report(node, counts=counts(total, 5.0)), heartbeat=True)
        clock.t += 60.0
        cp.adaptation.step()
        clock.t += 60.0
        heartbeat(cp, driver, node, 0.4, counts=counts(600, 5.0))
        cp.adaptation.step()  # an idle device, found twice: an acted finding
        text = cp.metrics_text().decode()
        (view,) = app_views(cp)
        assert metric(text, "edgemux_app_slo_seconds", app="cam", stat="p95") == 0.05
        assert metric(text, "edgemux_app_predicted_latency_seconds", app="cam", stat="p95") == pytest.approx(
            view["predicted"]["p95_ms"] / 1000)
        assert metric(text, "edgemux_app_observed_latency_seconds", app="cam", stat="mean") == pytest.approx(
            0.005, rel=0.02)
        assert metric(text, "edgemux_device_observed_utilization", node=node, device="tpu0", kind="edgetpu") == 0.4
        assert metric(text, "edgemux_device_predicted_utilization", node=node, device="tpu0",
                      kind="edgetpu") == pytest.approx(device_views(cp)[0 if node == "n1" else 1]["utilization"]
                                                       ["predicted"])
        kinds = [a.kind for _, a in cp.adaptation.decisions]
        assert kinds and metric(text, "edgemux_controlplane_adaptation_actions_total",
                                kind="finding") == kinds.count("finding")

    run(tmp_path, body, cluster=ROOMY,
        adapt=AdaptSettings(window_s=60.0, trigger_windows=2, min_samples=20, min_dwell_s=60.0))


def test_the_views_are_served_behind_the_admin_token(tmp_path: Path) -> None:
    async def main() -> None:
        cp = ControlPlane(str(tmp_path / "store.db"), parse_cluster(ROOMY), agent_driver=FakeDriver(), token=TOKEN)
        server = await start_server(cp, "127.0.0.1", 0)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        try:
            async with aiohttp.ClientSession() as s:
                for path in ("/v1/nodes", "/v1/devices", "/v1/overview"):
                    async with s.get(f"{server.url}{path}") as r:
                        assert r.status == 401, path
                async with s.get(f"{server.url}/v1/nodes", headers=auth) as r:
                    assert [n["name"] for n in (await r.json())["nodes"]] == ["n1", "n2"]
                async with s.get(f"{server.url}/v1/devices", headers=auth) as r:
                    assert [d["path"] for d in (await r.json())["devices"]] == ["n1/tpu0", "n2/tpu0"]
                async with s.get(f"{server.url}/v1/overview?since=0", headers=auth) as r:
                    doc = await r.json()
                    assert r.status == 200 and doc["apps"] == [] and doc["policy"] == cp.policy_name
                    assert doc == {**overview(cp), "time_s": doc["time_s"]}
                async with s.get(f"{server.url}/v1/overview?since=yesterday", headers=auth) as r:
                    assert r.status == 400 and "since" in (await r.json())["error"]
        finally:
            await server.stop()

    asyncio.run(main())


def test_every_adaptation_action_kind_is_counted_from_zero() -> None:
    import inspect

    from edgemux.adapt import cycle
    from edgemux.adapt.plan import transition_kind
    from edgemux.runtime.controlplane.metrics import ACTION_KINDS

    kinds = {c.kind for _, c in inspect.getmembers(cycle, inspect.isclass)
             if c.__module__ == cycle.__name__ and isinstance(getattr(c, "kind", None), str) and c.kind}
    whats = set(re.findall(r'return "(\w+)"', inspect.getsource(transition_kind)))
    assert whats == {"contract", "moved", "reshared", "repartitioned"}
    assert set(ACTION_KINDS) == (kinds - {"move"}) | whats
