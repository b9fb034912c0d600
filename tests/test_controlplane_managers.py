"""The control plane's managers, each on its own (runtime/controlplane: reconciler, admission, transitions,
routes, adaptation, power) and the controller that runs them: driven without HTTP where they do not speak it,
through a fake agent driver (the ``AgentDriver`` interface: what each agent holds, every call in order,
failures on demand) and a fake clock, with the controller loop's passes run by hand (``ControlPlane.run_pass``)
so that every step is the test's. Only the routes manager talks HTTP (to a small fake gateway), and the last
test reads ``GET /metrics`` through the real API."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import yaml

from edgemux.adapt.consolidate import ConsolidationSettings
from edgemux.adapt.monitor import AppCounters, LatencyHistogram
from edgemux.adapt.settings import AdaptSettings
from edgemux.cluster.specs import parse_apps, parse_cluster
from edgemux.cluster.state import App, Placement, Share
from edgemux.cluster.store import Store
from edgemux.runtime.auth import digest
from edgemux.runtime.controlplane.agentdriver import AgentCallError, AgentDriver
from edgemux.runtime.controlplane.api import start_server
from edgemux.runtime.controlplane.common import ControlPlaneError
from edgemux.runtime.controlplane.pieces import group_body
from edgemux.runtime.controlplane.service import UPDATE_ORDER, ControlPlane
from edgemux.runtime.controlplane.transitions import RECOVERY_GATEWAY_WAIT_S
from edgemux.runtime.httpserver import Application, Request, Response, delete, get, put
from edgemux.runtime.httputil import json_response
from edgemux.runtime.messages import Observations
from support import TWO_TPUS_YAML, serve_app

TWO_TPUS = yaml.safe_load(TWO_TPUS_YAML)
# one Edge TPU per node, 12 MB: EfficientNet-S and MobileNetV2 fit on one together (as test_runtime_adapt's)
ROOMY = {"apiVersion": "edgemux/v1alpha1", "kind": "Cluster", "metadata": {"name": "two"},
         "spec": {"nodes": [{"name": n, "cpuCores": 4, "memoryMb": 4096,
                             "devices": [{"name": "tpu0", "kind": "edgetpu", "memoryMb": 12,
                                          "profiles": "ibis-edgetpu"}]} for n in ("n1", "n2")]}}
TOKEN = "t" * 43
PROFILE = "ibis-edgetpu/mobilenet_v2"


def url(node: str) -> str:
    return f"http://{node}.test:8000"


def app(name: str, rate: float, model: str = "mobilenet_v2", slo_ms: float = 50) -> App:
    doc = {"apiVersion": "edgemux/v1alpha1", "kind": "App", "metadata": {"name": name},
           "spec": {"model": model, "rate": rate, "burst": 2, "slo": {"latencyMs": slo_ms, "stat": "p95"}}}
    (a,) = parse_apps(doc, "test")
    return a


class FakeClock:
    """The control plane's clock (s), moved by the test."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class FakeDriver(AgentDriver):
    """Agents without HTTP: what each agent (by url) holds, its devices' power states, every call in order
    (``(op, url, app or device)``), and the urls whose PUTs fail (``failing``). Like a real agent it refuses to
    switch a device off while it holds an app."""

    def __init__(self) -> None:
        self.held: dict[str, dict[str, dict[str, Any]]] = {}
        self.power: dict[str, str] = {}
        self.calls: list[tuple[str, str, str]] = []
        self.failing: set[str] = set()

    async def put_app(self, url: str, app: str, body: dict[str, Any]) -> None:
        self.calls.append(("PUT", url, app))
        if url in self.failing:
            raise AgentCallError(f"PUT {url}/v1/apps/{app}: HTTP 507: cannot load model: out of memory", 507)
        self.held.setdefault(url, {})[app] = body

    async def delete_app(self, url: str, app: str) -> None:
        self.calls.append(("DELETE", url, app))
        self.held.get(url, {}).pop(app, None)

    async def app_ready(self, url: str, app: str) -> bool:
        return app in self.held.get(url, {})

    async def set_power(self, url: str, device: str, state: str) -> None:
        self.calls.append(("POWER", url, state))
        if state == "off" and self.held.get(url):
            raise AgentCallError(f"PUT {url}/v1/devices/{device}/power: HTTP 409: device still holds models", 409)
        self.power[url] = state

    def report(self, node: str, incarnation: str = "one", counts: dict[str, AppCounters] | None = None) -> dict[str, Any]:
        """The node's registration or heartbeat body, as its agent would send it (one entry per piece)."""
        held = self.held.get(url(node), {})
        apps = [{**piece, "app": a} for a, body in held.items()
                for piece in body.get("pieces", [{k: v for k, v in body.items() if k != "app"}])]
        out: dict[str, Any] = {"node": node, "url": url(node), "incarnation": incarnation, "heartbeat_s": 1.0,
                               "devices": [{"name": "tpu0", "emulated": True,
                                            "power_state": self.power.get(url(node), "on")}], "apps": apps}
        if counts is not None:
            out["observations"] = Observations(incarnation, dict(counts), {}).to_json()
        return out

    def index(self, call: tuple[str, str, str]) -> int:
        return self.calls.index(call)


def run(tmp_path: Path, body: Callable[[ControlPlane, FakeDriver, FakeClock], Awaitable[None]],
        cluster: dict[str, Any] = TWO_TPUS, before_start: Callable[[ControlPlane], None] | None = None,
        **options: Any) -> None:
    """``body(cp, driver, clock)`` against a control plane started without its loop (the test runs the
    passes), on a store in ``tmp_path``; closed afterwards."""

    async def main() -> None:
        driver, clock = FakeDriver(), FakeClock()
        cp = ControlPlane(str(tmp_path / "store.db"), parse_cluster(cluster), agent_driver=driver, clock=clock,
                          **{"drain_grace_s": 0.0, **options})
        if before_start is not None:
            before_start(cp)
        await cp.start(loop=False)
        try:
            await body(cp, driver, clock)
        finally:
            await cp.close()

    asyncio.run(main())


async def register(cp: ControlPlane, driver: FakeDriver, *nodes: str, incarnation: str = "one",
                   heartbeat: bool = False) -> None:
    for node in nodes or ("n1", "n2"):
        cp.register_agent(node, driver.report(node, incarnation), heartbeat=heartbeat)
    await cp.wait_idle()


def node_of(cp: ControlPlane, name: str) -> str:
    (share,) = cp.placements[name].shares
    return share.device.split("/")[0]


def other(node: str) -> str:
    return "n2" if node == "n1" else "n1"


# ---------------------------------------------------------------------------------------- placement


def test_placement_keeps_target_beside_actual_and_reconciles_the_difference(tmp_path: Path) -> None:
    async def body(cp: ControlPlane, driver: FakeDriver, clock: FakeClock) -> None:
        # n1's agent holds a stray app: the registration's reconcile deletes it
        driver.held[url("n1")] = {"ghost": {"device": "tpu0", "model": "zoo:resnet18", "profile": None,
                                            "weight": 1.0}}
        await register(cp, driver)
        assert ("DELETE", url("n1"), "ghost") in driver.calls and driver.held[url("n1")] == {}
        # every agent refuses the load: the target stands, the actual is empty, the error is kept
        driver.failing = {url("n1"), url("n2")}
        status, answer = await cp.apply([app("cam", 10)])
        assert status == 201 and answer["results"][0]["status"] == "pending"
        node = node_of(cp, "cam")
        (n,) = cp.reconciler.state("cam")
        assert n.node == node and n.actual is None and not n.loaded and n.alive and not n.serving
        assert n.error is not None and "out of memory" in n.error
        assert cp.reconciler.status("cam") == "pending"
        # a pass while they still refuse: tried again, still pending
        cp.run_pass()
        await cp.wait_idle()
        assert driver.calls.count(("PUT", url(node), "cam")) == 2 and cp.reconciler.status("cam") == "pending"
        # the agent recovers: the next pass loads the target, and the actual is the target
        driver.failing.clear()
        cp.run_pass()
        await cp.wait_idle()
        (n,) = cp.reconciler.state("cam")
        assert n.loaded and n.serving and n.error is None and cp.reconciler.status("cam") == "ready"
        assert driver.held[url(node)]["cam"] == group_body(n.target)
        # nothing differs: a pass calls no agent
        calls = len(driver.calls)
        cp.run_pass()
        await cp.wait_idle()
        assert len(driver.calls) == calls
        # the agent goes silent (three heartbeats of 1 s): loaded, but not serving
        clock.t += 3.5
        (n,) = cp.reconciler.state("cam")
        assert n.loaded and not n.alive and not n.serving and cp.reconciler.status("cam") == "pending"
        assert cp.route("cam").pending[0].error == f"agent of node {node} missed its heartbeats"
        # it comes back as a new process holding nothing: the target is loaded again
        driver.held[url(node)] = {}
        await register(cp, driver, node, incarnation="two")
        assert driver.calls[-1] == ("PUT", url(node), "cam") and cp.reconciler.status("cam") == "ready"
        assert cp.reconciler.node_pieces(node) == {"cam": n.target}

    run(tmp_path, body)


def test_placement_registry_refuses_unknown_nodes_and_forgets_deregistered_agents(tmp_path: Path) -> None:
    async def body(cp: ControlPlane, driver: FakeDriver, clock: FakeClock) -> None:
        with pytest.raises(ControlPlaneError, match="unknown node 'n9'") as e:
            cp.register_agent("n9", driver.report("n1") | {"node": "n9"}, heartbeat=False)
        assert e.value.status == 404
        with pytest.raises(ControlPlaneError, match="not registered: register with POST"):
            cp.register_agent("n1", driver.report("n1"), heartbeat=True)
        await register(cp, driver)
        await cp.apply([app("cam", 10)])
        node = node_of(cp, "cam")
        assert cp.reconciler.status("cam") == "ready"
        assert cp.deregister_agent(node) == {"node": node, "registered": False}
        (n,) = cp.reconciler.state("cam")
        assert n.url is None and n.actual is None and n.error == f"agent of node {node} deregistered"
        listing = cp.list_agents()
        assert [a["node"] for a in listing["agents"]] == [other(node)] and listing["unregistered_nodes"] == [node]

    run(tmp_path, body)


# ---------------------------------------------------------------------------------------- admission


def test_admission_commits_then_loads_make_before_break(tmp_path: Path) -> None:
    async def body(cp: ControlPlane, driver: FakeDriver, clock: FakeClock) -> None:
        await register(cp, driver)
        status, answer = await cp.apply([app("cam", 10)])
        assert status == 201 and answer["results"][0]["result"] == "created"
        assert (await cp.db.call("placements"))["cam"] == cp.placements["cam"]
        # the same spec: unchanged, no decision, no call
        calls = len(driver.calls)
        assert (await cp.apply([app("cam", 10)]))[1]["results"][0]["result"] == "unchanged"
        assert len(driver.calls) == calls
        # 200 req/s fits on neither TPU: split over both, both pieces loaded
        status, answer = await cp.apply([app("cam", 200)])
        assert status == 200 and answer["results"][0]["result"] == "updated"
        assert {s.device for s in cp.placements["cam"].shares} == {"n1/tpu0", "n2/tpu0"}
        assert all("cam" in driver.held[url(n)] for n in ("n1", "n2"))
        # back to 10: the node it stays on is loaded before the node it leaves unloads
        await cp.apply([app("cam", 10)])
        kept = node_of(cp, "cam")
        last_put = max(i for i, c in enumerate(driver.calls) if c == ("PUT", url(kept), "cam"))
        assert last_put < driver.index(("DELETE", url(other(kept)), "cam"))
        assert "cam" not in driver.held[url(other(kept))]
        # a rejection changes nothing
        before = await cp.db.call("dump")
        status, answer = await cp.apply([app("huge", 10000)])
        assert status == 409 and answer["results"][0]["result"] == "rejected"
        assert await cp.db.call("dump") == before and "huge" not in cp.apps
        # four decisions (create, two updates, a rejection) timed by the admission metric
        assert "edgemux_controlplane_admission_seconds_count 4.0" in cp.metrics_text().decode()
        # delete: the store, then the agents
        answer = await cp.delete("cam")
        assert answer["agents"] == {kept: "deleted"} and "cam" not in driver.held[url(kept)]
        assert await cp.db.call("apps") == {} and cp.apps == {} and cp.reconciler.actual == {}
        with pytest.raises(ControlPlaneError, match="unknown app 'cam'"):
            await cp.delete("cam")

    run(tmp_path, body)


# -------------------------------------------------------------------------------------- transitions


def test_transitions_move_make_before_break_and_roll_back(tmp_path: Path) -> None:
    async def body(cp: ControlPlane, driver: FakeDriver, clock: FakeClock) -> None:
        await register(cp, driver)
        await cp.apply([app("cam", 10)])
        src = node_of(cp, "cam")
        dst = other(src)
        new = cp.plan_move("cam", {"to": [f"{dst}/tpu0"]})
        answer = await cp.transition("cam", new)
        assert answer.result == "moved" and cp.placements["cam"] == new
        assert driver.index(("PUT", url(dst), "cam")) < driver.index(("DELETE", url(src), "cam"))
        assert await cp.db.call("transitions") == {} and not cp.transitions.records
        assert await cp.db.call("placements") == {"cam": new}
        # the way back fails to load: rolled back, the app stays where it is, the store records no move
        driver.failing.add(url(src))
        back = cp.plan_move("cam", {"to": [f"{src}/tpu0"]})
        with pytest.raises(ControlPlaneError, match="rolled back") as e:
            await cp.transition("cam", back)
        assert e.value.status == 502
        assert cp.placements["cam"] == new and "cam" in driver.held[url(dst)]
        assert await cp.db.call("transitions") == {} and cp.transitions.busy() == frozenset()
        # a move onto a device without room is refused before anything loads
        calls = len(driver.calls)
        await cp.apply([app("big", 60)])
        with pytest.raises(ControlPlaneError) as e:
            await cp.transition("big", cp.placements["cam"], rate_rps=10000.0)
        assert e.value.status == 409 and len(driver.calls) == calls + 1  # big's own load only

    run(tmp_path, body)


def test_transitions_recover_a_switched_move_after_the_routes_moved(tmp_path: Path) -> None:
    # a previous process switched cam from n1 to n2 and was killed before n1 unloaded it
    old = Placement("cam", (Share("n1/tpu0", 1.0, PROFILE),), None)
    new = Placement("cam", (Share("n2/tpu0", 1.0, PROFILE),), None)
    with Store.open(str(tmp_path / "store.db")) as s:
        s.set_cluster(parse_cluster(TWO_TPUS))
        s.admit(app("cam", 10), old)
        s.begin_transition(old, new)
        s.switch_transition("cam")

    async def body(cp: ControlPlane, driver: FakeDriver, clock: FakeClock) -> None:
        assert cp.transitions.records["cam"].phase == "draining" and cp.placements["cam"] == new
        driver.held[url("n1")] = {"cam": {"device": "tpu0", "model": "zoo:mobilenet_v2@224x224",
                                          "profile": PROFILE, "weight": 1.0, "rate_rps": 10.0, "burst": 2.0}}
        await register(cp, driver)
        # n2 gets the app; n1 keeps it while the move drains
        assert "cam" in driver.held[url("n2")] and "cam" in driver.held[url("n1")]
        cp.run_pass()
        await cp.wait_idle()
        assert "cam" in driver.held[url("n1")]  # the grace (5 s) has not passed
        clock.t += 5.0
        await register(cp, driver, heartbeat=True)
        cp.run_pass()
        await cp.wait_idle()
        # no gateway holds the new route yet (none registered): wait for one to come back
        assert "cam" in driver.held[url("n1")] and cp.transitions.records
        clock.t += RECOVERY_GATEWAY_WAIT_S
        await register(cp, driver, heartbeat=True)
        cp.run_pass()
        await cp.wait_idle()
        assert "cam" not in driver.held[url("n1")] and not cp.transitions.records
        assert await cp.db.call("transitions") == {} and cp.reconciler.status("cam") == "ready"

    run(tmp_path, body, drain_grace_s=5.0)


# ------------------------------------------------------------------------------------------- routes


class FakeGateway:
    """Keeps the routes it is given (``PUT``/``DELETE``/``GET /v1/routes``), as a gateway does."""

    def __init__(self) -> None:
        self.routes: dict[str, Any] = {}
        self.url = ""
        self.runner: Any = None

    async def start(self) -> None:
        app = Application([put("/v1/routes/{app}", self._put), delete("/v1/routes/{app}", self._delete),
                           get("/v1/routes", self._list)])
        self.runner, self.url = await serve_app(app)

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.stop()

    async def _put(self, request: Request) -> Response:
        self.routes[request.match_info["app"]] = await request.json()
        return json_response({})

    async def _delete(self, request: Request) -> Response:
        if self.routes.pop(request.match_info["app"], None) is None:
            return json_response({"error": "no route"}, status=404)
        return json_response({})

    async def _list(self, request: Request) -> Response:
        return json_response({"routes": self.routes})


def test_routes_publish_keys_and_sync_a_gateway_that_lost_them(tmp_path: Path) -> None:
    async def body(cp: ControlPlane, driver: FakeDriver, clock: FakeClock) -> None:
        gw = FakeGateway()
        await gw.start()
        try:
            await register(cp, driver)
            status, answer = await cp.apply([app("cam", 10)])
            key = answer["results"][0]["key"]
            node = node_of(cp, "cam")
            assert cp.routes.keys == {"cam": digest(key)} and cp.routes.key_owner(digest(key)) == "cam"
            assert driver.held[url(node)]["cam"]["key_sha256"] == digest(key)
            with pytest.raises(ControlPlaneError, match="gateway registration"):
                await cp.register_gateway({"url": "http://x:1", "extra": 1})
            assert await cp.register_gateway({"url": gw.url}) == {"url": gw.url, "routes": 1, "error": None}
            route = gw.routes["cam"]
            assert [e["url"] for e in route["endpoints"]] == [url(node)] and route["key_sha256"] == digest(key)
            # the gateway restarts and loses its routes: the sync reads them back every 10th pass only
            gw.routes.clear()
            for _ in range(9):
                cp.run_pass()
                await cp.wait_idle()
            assert gw.routes == {}
            cp.run_pass()
            await cp.wait_idle()
            assert gw.routes["cam"] == route
            # a new key: the agent gets the new digest, then the gateway; the old key opens nothing
            new = (await cp.rotate_key("cam"))["key"]
            assert driver.held[url(node)]["cam"]["key_sha256"] == digest(new) == gw.routes["cam"]["key_sha256"]
            assert cp.routes.key_owner(digest(key)) is None
            await cp.delete("cam")
            assert gw.routes == {} and cp.routes.acked[gw.url] == {}
        finally:
            await gw.stop()

    run(tmp_path, body, token=TOKEN)


# --------------------------------------------------------------------------------------- adaptation


def counts(arrivals: int, latency_ms: float) -> dict[str, AppCounters]:
    return {"cam": AppCounters(arrivals, 0, 0, LatencyHistogram.of(np.full(arrivals, latency_ms)))}


def test_adaptation_closes_a_window_when_due_and_carries_its_cycle_out(tmp_path: Path) -> None:
    timer = [0.0]

    def fake_timer(cp: ControlPlane) -> None:
        cp.adaptation.timer = lambda: timer[0]

    async def body(cp: ControlPlane, driver: FakeDriver, clock: FakeClock) -> None:
        await register(cp, driver)
        await cp.apply([app("cam", 10)])
        node = node_of(cp, "cam")
        ad = cp.adaptation
        # the agent's first report is a baseline; the second adds 300 requests to the open window
        cp.register_agent(node, driver.report(node, counts=counts(0, 5.0)), heartbeat=True)
        cp.register_agent(node, driver.report(node, counts=counts(300, 5.0)), heartbeat=True)
        assert ad.due_in_s() == 60.0
        cp.run_pass()
        await cp.wait_idle()
        assert ad.windows == {}  # not due yet
        timer[0] = 60.0
        clock.t += 60.0
        cp.run_pass()  # due: the gateways' observations are read in the background
        assert ad.due_in_s() == float("inf")
        await cp.wait_idle()
        assert ad.due_in_s() == 0.0 and ad.windows == {}  # read: the next pass closes the window
        cp.register_agent(other(node), driver.report(other(node)), heartbeat=True)
        cp.register_agent(node, driver.report(node, counts=counts(300, 5.0)), heartbeat=True)
        cp.run_pass()
        assert ad.windows["cam"].rate_rps == pytest.approx(300 / 60.0) and ad.windows["cam"].arrivals == 300
        assert ad.due_in_s() == 60.0
        first_window = clock.t
        # a step by hand: the inputs it gathered in one place and the cycle's actions it carried out
        clock.t += 60.0
        cp.register_agent(node, driver.report(node, counts=counts(600, 5.0)), heartbeat=True)
        cp.register_agent(other(node), driver.report(other(node)), heartbeat=True)
        outcome = ad.step()
        assert outcome is not None
        inputs = outcome.inputs
        assert inputs.now_s == clock.t and inputs.declared == {"cam": 10.0} and inputs.busy == frozenset()
        assert inputs.windows["cam"].rate_rps == pytest.approx(300 / 60.0) and set(inputs.last_seen_s) == {"n1", "n2"}
        assert inputs.snapshot.placements == cp.placements and inputs.power is None and inputs.observed == {}
        # 5 req/s at 5 ms leaves the device idle: found in both windows, acted on from the second (trigger_windows
        # 2), an event once, when it starts to count; nothing moved for it
        assert [(t, a.kind, a.finding.kind, a.acted, a.first) for t, a in ad.decisions] == [
            (first_window, "finding", "idle-capacity", False, False),
            (clock.t, "finding", "idle-capacity", True, True)]
        assert outcome.actions == (ad.decisions[-1][1],)
        assert [(e.kind, e.message.split(":")[0]) for e in cp.events.since()] == [
            ("admitted", "admitted at n1/tpu0 x1") if node == "n1" else ("admitted", "admitted at n2/tpu0 x1"),
            ("finding", "idle-capacity")]
        # the next window: it still counts, but it is no longer new (no second event); a move planned or in
        # flight holds its app (busy), which the cycle then leaves alone
        clock.t += 60.0
        await register(cp, driver, heartbeat=True)
        ad.pending.add("cam")
        outcome = ad.step()
        assert outcome is not None and outcome.inputs.busy == frozenset({"cam"})
        assert [(a.kind, a.finding.kind, a.first) for a in outcome.actions] == [("finding", "idle-capacity", False)]
        ad.pending.clear()
        assert len(cp.events.since()) == 2

    run(tmp_path, body, before_start=fake_timer,
        adapt=AdaptSettings(window_s=60.0, trigger_windows=2, min_samples=20, min_dwell_s=60.0))


# -------------------------------------------------------------------------------------------- power


def test_power_switches_an_empty_node_off_after_a_window_and_wakes_it_for_room(tmp_path: Path) -> None:
    timer = [0.0]

    def fake_timer(cp: ControlPlane) -> None:
        cp.adaptation.timer = lambda: timer[0]

    async def body(cp: ControlPlane, driver: FakeDriver, clock: FakeClock) -> None:
        await register(cp, driver)
        for name, model, slo_ms in (("eff", "efficientnet-S", 100), ("mob", "mobilenet_v2", 50)):
            await cp.apply([app(name, 10, model, slo_ms)])
            await cp.transition(name, cp.plan_move(name, {"to": ["n1/tpu0"]}))
        assert cp.power.state("n2") == "on" and cp.power.asleep() == frozenset()
        # a window closes: the loop's adaptation pass steps, the power pass after it switches empty n2 off
        timer[0] = 3600.0
        clock.t += 5.0
        await register(cp, driver, heartbeat=True)
        cp.run_pass()
        await cp.wait_idle()
        cp.run_pass()
        await cp.wait_idle()
        assert cp.power.state("n2") == "off" and driver.power[url("n2")] == "off"
        assert driver.power.get(url("n1"), "on") == "on"
        assert [(e.data["node"], e.data["state"]) for e in cp.events.since() if e.kind == "power"] == [("n2", "off")]
        # a third app has no room on n1: n2 wakes, the answer says when to apply again
        status, answer = await cp.apply([app("inc", 5, "inception_v3", 500)])
        (result,) = answer["results"]
        assert status == 409 and result["retry_after_s"] == pytest.approx(30.0)
        assert cp.retry_after(answer) == "30" and cp.power.state("n2") == "waking"
        await cp.wait_idle()
        assert driver.power[url("n2")] == "on"  # its devices switched on at once; the node boots meanwhile
        # the controller loop wakes when n2 serves; a pass then is the power tick: n2 is on
        assert cp.power.due_in_s() == pytest.approx(30.0)
        clock.t += 10.0
        cp.run_pass()
        assert cp.power.state("n2") == "waking" and cp.power.due_in_s() == pytest.approx(20.0)
        clock.t += 20.0
        cp.run_pass()
        assert cp.power.state("n2") == "on" and cp.power.due_in_s() == float("inf")
        assert [(t - clock.t, a.key()) for t, a in cp.adaptation.decisions][-2:] == [(-30.0, ("wake", "n2")),
                                                                                      (0.0, ("woke", "n2"))]
        status, answer = await cp.apply([app("inc", 5, "inception_v3", 500)])
        assert status == 201 and [s.device for s in cp.placements["inc"].shares] == ["n2/tpu0"]
        assert cp.power.state("n2") == "on"
        # a new agent process on n2 reports its devices off while the store places inc there: switched on
        driver.power[url("n2")] = "off"
        calls = len(driver.calls)
        cp.register_agent("n2", driver.report("n2", incarnation="two"), heartbeat=False)
        await cp.wait_idle()
        assert cp.power.state("n2") == "on" and ("POWER", url("n2"), "on") in driver.calls[calls:]
        assert driver.power[url("n2")] == "on"

    run(tmp_path, body, cluster=ROOMY, before_start=fake_timer,
        adapt=AdaptSettings(window_s=3600.0, trigger_windows=2, min_samples=20, min_dwell_s=60.0),
        consolidation=ConsolidationSettings(), wake_s=30.0)


# --------------------------------------------------------------------------------------- controller


def test_a_pass_updates_the_managers_in_order_each_timed_and_one_failure_stops_none(tmp_path: Path) -> None:
    async def body(cp: ControlPlane, driver: FakeDriver, clock: FakeClock) -> None:
        assert list(cp.managers) == list(UPDATE_ORDER) == ["placement", "routes", "transitions", "adaptation",
                                                           "power"]
        seen: list[str] = []
        for name, manager in cp.managers.items():
            real = manager.update

            def update(name: str = name, real: Callable[[], None] = real) -> None:
                seen.append(name)
                if name == "routes":
                    raise RuntimeError("a bad pass")
                real()

            manager.update = update  # type: ignore[method-assign]
        cp.run_pass()
        cp.run_pass()
        assert seen == list(UPDATE_ORDER) * 2
        text = cp.metrics_text().decode()
        assert "edgemux_controlplane_passes_total 2.0" in text
        for name in UPDATE_ORDER:
            assert f'edgemux_controlplane_update_seconds_count{{manager="{name}"}} 2.0' in text
        await register(cp, driver)
        await cp.apply([app("cam", 10)])
        text = cp.metrics_text().decode()
        assert 'edgemux_controlplane_apps{status="ready"} 1.0' in text
        assert 'edgemux_controlplane_agents{ready="true"} 2.0' in text and "edgemux_controlplane_moves 0.0" in text

    run(tmp_path, body)


def test_metrics_are_served_at_get_metrics_with_the_admin_token(tmp_path: Path) -> None:
    async def main() -> None:
        cp = ControlPlane(str(tmp_path / "store.db"), parse_cluster(TWO_TPUS), agent_driver=FakeDriver(),
                          token=TOKEN)
        server = await start_server(cp, "127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as s:
                async with s.get(f"{server.url}/metrics") as r:
                    assert r.status == 401
                async with s.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}) as r:
                    assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                    text = await r.text()
            assert "# TYPE edgemux_controlplane_update_seconds histogram" in text
            assert 'edgemux_controlplane_apps{status="ready"} 0.0' in text
        finally:
            await server.stop()

    asyncio.run(main())
