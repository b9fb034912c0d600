"""Fencing by lease (runtime.dataplane.lease, the control plane's lost rule in runtime.controlplane.reconciler;
docs/multihost.md), with fake clocks:

- the lease itself: granted by an answer, renewed from the instant the acknowledged message was *sent*,
  lapsed exactly after it, and after a lapse an answer unfences only the apps it places here;
- an agent whose heartbeats fail is fenced exactly after its lease (503 naming the reason, counted, its
  models kept) and unfenced by the control plane's next answer, for the apps that answer confirms;
- the control plane declares a node lost (routes, ``ready``, the adapt loop's ``dead_after_s``) only after
  lease + margin, and grants the lease in its answer;
- an app evacuated while its node was partitioned is deleted from the returning agent before that agent
  serves it again: at every step at most one placement accepts the app's requests.

The end-to-end version across namespaced hosts is tests/test_partition.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import yaml

from edgemux.adapt.settings import AdaptSettings
from edgemux.cluster.specs import parse_apps, parse_cluster
from edgemux.cluster.state import Device, Node
from edgemux.cluster.workload import Discipline
from edgemux.errors import InputError
from edgemux.profiles.types import DeviceKind
from edgemux.runtime.controlplane.agentdriver import AgentCallError, AgentDriver
from edgemux.runtime.controlplane.reconciler import LEASE_DRIFT, READY_HEARTBEATS, AgentState, lost_after_s
from edgemux.runtime.controlplane.service import ControlPlane
from edgemux.runtime.dataplane.agent import Agent, start_server
from edgemux.runtime.dataplane.lease import Lease, check_lease_s
from edgemux.runtime.dataplane.messages import AgentReport
from edgemux.runtime.dataplane.protocol import HEADER_LENGTH_HEADER
from edgemux.runtime.httpserver import Application, Request, Response, delete, post, put
from edgemux.runtime.httputil import json_response, start_site
from support import TWO_TPUS_YAML

TPU_PROFILE = "ibis-edgetpu/mobilenet_v2"
TPU_MODEL = "zoo:mobilenet_v2@32"  # the emulated device only needs the tensors' shapes: keep them small


class Clock:
    """A fake monotonic clock (s), moved by the test."""

    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


# ------------------------------------------------------------------------------------------ the lease


def test_the_lease_is_granted_renewed_from_the_send_and_lapses_exactly_after_it() -> None:
    clock = Clock()
    lease = Lease(3.0, clock)
    assert lease.why("cam") == "" and lease.lapsed() == ""  # no grant yet: nothing fenced
    clock.t = 1000.0
    assert lease.why("cam") == ""
    # a heartbeat sent at 1000, acknowledged at 1000.4: the lease runs from the send
    clock.t = 1000.4
    lease.acknowledged(1000.0, {"lease_s": 3.0, "apps": ["cam"]}, {"cam"})
    assert lease.granted_s == 3.0 and lease.renewed_at == 1000.0
    clock.t = 1003.0
    assert lease.why("cam") == ""  # exactly at the lease: still held
    clock.t = 1003.2
    assert lease.why("cam") == "fenced: no word from the control plane for 3.2 s > lease 3 s"
    assert lease.why("other") == lease.lapsed()  # every app
    assert lease.to_json()["fenced"] == lease.lapsed()
    # an answer that keeps no lease (a control plane that does not fence) drops it: nothing fenced
    lease.acknowledged(1003.1, {"apps": []}, {"cam"})
    assert lease.granted_s is None and lease.why("cam") == ""


def test_after_a_lapse_only_the_apps_the_answer_places_here_are_unfenced() -> None:
    clock = Clock(0.0)
    lease = Lease(2.0, clock)
    lease.acknowledged(0.0, {"lease_s": 2.0, "apps": ["a", "b"]}, {"a", "b"})
    # a normal answer that does not list an app held here (a move draining it away) fences nothing
    clock.t = 1.0
    lease.acknowledged(1.0, {"lease_s": 2.0, "apps": ["a"]}, {"a", "b"})
    assert lease.why("b") == "" and lease.unconfirmed == {}
    # the link drops: the lease lapses at 3.0; an app PUT here while the heartbeat was on its way counts
    clock.t = 9.0
    assert lease.lapsed()
    lease.placed("c", at=9.1)
    clock.t = 9.3
    lease.acknowledged(9.0, {"lease_s": 2.0, "apps": ["a"]}, {"a", "b", "c"})
    assert lease.lapses == 1 and lease.lapsed() == ""
    assert lease.why("a") == "" and lease.why("c") == ""
    assert lease.why("b").startswith("fenced: app 'b' is held here but the control plane no longer places it here")
    assert lease.to_json()["unconfirmed"] == ["b"]
    # the reconcile pass deletes it (or PUTs it again): either ends its fence
    lease.removed("b")
    assert lease.why("b") == "" and lease.unconfirmed == {}
    # after another lapse, a later answer that places the app here again confirms it
    clock.t = 20.0
    lease.acknowledged(20.0, {"lease_s": 2.0, "apps": []}, {"a"})
    assert lease.why("a").startswith("fenced: app 'a'")
    clock.t = 21.0
    lease.acknowledged(21.0, {"lease_s": 2.0, "apps": ["a"]}, {"a"})
    assert lease.why("a") == ""


def test_a_lease_of_zero_ignores_grants_and_bad_leases_are_named() -> None:
    clock = Clock(0.0)
    lease = Lease(0.0, clock)
    lease.acknowledged(0.0, {"lease_s": 1.0, "apps": []}, {"a"})
    clock.t = 100.0
    assert lease.granted_s is None and lease.why("a") == ""
    assert check_lease_s(0.0, 1.0) is None and check_lease_s(3.0, 1.0) is None
    assert "exceed the heartbeat period (1 s)" in (check_lease_s(1.0, 1.0) or "")
    assert "finite number" in (check_lease_s(float("inf"), 1.0) or "")
    assert "finite number" in (check_lease_s(-1.0, 1.0) or "")
    node = Node("n1", 4.0, 4096.0, (Device("n1", "tpu0", DeviceKind.EDGETPU, Discipline.FCFS, 8.0, "ibis-edgetpu"),))
    with pytest.raises(InputError, match="lease_s"):
        Agent(node, heartbeat_s=1.0, lease_s=0.5)
    agent = Agent(node, heartbeat_s=0.5)
    try:
        assert agent.lease.lease_s == 1.5  # the default: three heartbeats
        assert agent.registration().lease_s == 1.5
    finally:
        agent.close(drain=False, timeout_s=1.0)


def test_the_report_carries_the_lease_and_a_bad_one_is_named() -> None:
    doc = {"node": "n1", "url": "http://a:1", "incarnation": "i", "heartbeat_s": 1.0, "lease_s": 3.0}
    assert AgentReport.from_json(doc, "n1").lease_s == 3.0
    assert AgentReport.from_json({**doc, "lease_s": None}, "n1").lease_s is None
    assert "lease_s" not in AgentReport("n1", "http://a:1", "i").to_json()
    from edgemux.runtime.messages import MessageError

    with pytest.raises(MessageError, match="registration.lease_s: must be >= 0"):
        AgentReport.from_json({**doc, "lease_s": -1}, "n1")


# ----------------------------------------------------------------- an agent whose heartbeats fail


class FakeControlPlane:
    """Answers registrations and heartbeats as the control plane does (the lease granted, ``apps`` the apps
    placed on the node), or fails them (``down``: 503)."""

    def __init__(self) -> None:
        self.down = False
        self.apps: list[str] = []
        self.answered = 0
        self.site: Any = None

    async def handle(self, request: Request) -> Response:
        body: dict[str, Any] = (await request.json() if request.can_read_body else None) or {}
        if request.method == "DELETE":
            return json_response({"registered": False})
        if self.down:
            return json_response({"error": "down"}, 503)
        self.answered += 1
        return json_response({"node": "n1", "registered": True, "apps": list(self.apps),
                              **({"lease_s": body["lease_s"]} if body.get("lease_s") else {})})

    async def start(self) -> str:
        path = "/v1/agents/{node}"
        app = Application([post(path, self.handle), put(path, self.handle), delete(path, self.handle)])
        self.site = await start_site(app, "127.0.0.1", 0)
        return str(self.site.url)


def _infer_body() -> tuple[bytes, dict[str, str]]:
    x = np.zeros((1, 32, 32, 3), np.uint8)
    blob = x.tobytes()
    header = json.dumps({"inputs": [{"name": "input", "datatype": "UINT8", "shape": list(x.shape),
                                     "parameters": {"binary_data_size": len(blob)}}]}).encode()
    return header + blob, {HEADER_LENGTH_HEADER: str(len(header)), "Content-Type": "application/octet-stream"}


async def _until(cond: Any, what: str, limit_s: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def _metric(text: str, name: str, labels: str = "") -> float | None:
    for line in text.splitlines():
        if line.startswith(name + (labels or " ")) or line.startswith(f"{name}{{{labels}}}"):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_an_agent_whose_heartbeats_fail_fences_exactly_after_its_lease_and_unfences_on_the_answer(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        cp = FakeControlPlane()
        cp_url = await cp.start()
        clock = Clock(500.0)
        node = Node("n1", 4.0, 4096.0, (Device("n1", "tpu0", DeviceKind.EDGETPU, Discipline.FCFS, 8.0,
                                               "ibis-edgetpu"),))
        agent = Agent(node, controlplane_url=cp_url, heartbeat_s=0.05, lease_s=3.0,
                      cache_dir=str(tmp_path / "zoo"))
        agent.lease.clock = clock  # the lease's time is the test's; the heartbeats still go every 0.05 s
        server = await start_server(agent)
        body, headers = _infer_body()
        try:
            async with aiohttp.ClientSession(server.url) as s:
                for app in ("cam", "keep"):  # as the control plane would PUT them
                    async with s.put(f"/v1/apps/{app}", json={"device": "tpu0", "model": TPU_MODEL,
                                                              "profile": TPU_PROFILE}) as r:
                        assert r.status == 201, await r.text()
                cp.apps = ["cam", "keep"]
                await _until(lambda: agent.lease.granted_s == 3.0, "a granted lease")
                async with s.post("/v2/models/cam/infer", data=body, headers=headers) as r:
                    assert r.status == 200, await r.text()
                # the link fails: no heartbeat is acknowledged any more
                cp.down = True
                seen = cp.answered
                await _until(lambda: agent.link is not None and agent.link.last_error is not None, "a failed heartbeat")
                assert cp.answered == seen
                renewed = agent.lease.renewed_at
                assert renewed == 500.0
                clock.t = renewed + 3.0  # exactly the lease: still serving
                async with s.post("/v2/models/cam/infer", data=body, headers=headers) as r:
                    assert r.status == 200, await r.text()
                clock.t = renewed + 3.2  # past it: fenced, every app, 503 naming the reason
                for app in ("cam", "keep"):
                    async with s.post(f"/v2/models/{app}/infer", data=body, headers=headers) as r:
                        assert r.status == 503
                        assert r.headers["Retry-After"] == "1"
                        doc = await r.json()
                        assert doc == {"error": "fenced: no word from the control plane for 3.2 s > lease 3 s"}
                    async with s.get(f"/v2/models/{app}/ready") as r:
                        assert r.status == 503
                async with s.post("/v2/models/nope/infer", data=body, headers=headers) as r:
                    assert r.status == 404  # an app it does not hold is still unknown
                async with s.get("/metrics") as r:
                    text = await r.text()
                assert _metric(text, "edgemux_fenced_requests_total", 'app="cam"') == 1.0
                assert _metric(text, "edgemux_agent_fenced") == 1.0
                assert _metric(text, 'edgemux_rejections_total', 'app="keep",reason="fenced"') == 1.0
                async with s.get("/v1/node") as r:
                    lease = (await r.json())["controlplane"]["lease"]
                assert lease["fenced"].startswith("fenced: no word") and lease["granted_s"] == 3.0
                # its models stay loaded
                assert sorted(p.app for p in agent.all_pieces()) == ["cam", "keep"]
                # the link returns; meanwhile the control plane placed cam elsewhere: its answer unfences keep only
                cp.apps = ["keep"]
                cp.down = False
                await _until(lambda: agent.lease.lapses == 1, "the answer after the lapse")
                async with s.post("/v2/models/keep/infer", data=body, headers=headers) as r:
                    assert r.status == 200, await r.text()
                async with s.post("/v2/models/cam/infer", data=body, headers=headers) as r:
                    assert r.status == 503
                    assert (await r.json())["error"].startswith(
                        "fenced: app 'cam' is held here but the control plane no longer places it here")
                async with s.get("/metrics") as r:
                    assert _metric(await r.text(), "edgemux_agent_fenced") == 0.0
                # the reconcile pass deletes it: then it is simply not here
                async with s.delete("/v1/apps/cam") as r:
                    assert r.status == 200
                async with s.post("/v2/models/cam/infer", data=body, headers=headers) as r:
                    assert r.status == 404
        finally:
            await server.stop()
            await cp.site.stop()

    asyncio.run(asyncio.wait_for(scenario(), 120))


# ------------------------------------------------------------------------------- the control plane


def _app(name: str, rate: float) -> Any:
    doc = {"apiVersion": "edgemux/v1alpha1", "kind": "App", "metadata": {"name": name},
           "spec": {"model": "mobilenet_v2", "rate": rate, "burst": 2, "slo": {"latencyMs": 50, "stat": "p95"}}}
    (a,) = parse_apps(doc, "test")
    return a


def _url(node: str) -> str:
    return f"http://{node}.test:8000"


class LeasedAgents(AgentDriver):
    """Agents without HTTP, each with its real ``Lease`` (on the test's clock): what each holds, every call in
    order, and the nodes cut off (``partitioned``: every call to them fails, as it would time out)."""

    def __init__(self, clock: Clock, lease_s: float) -> None:
        self.held: dict[str, dict[str, dict[str, Any]]] = {}
        self.leases: dict[str, Lease] = {}
        self.calls: list[tuple[str, str, str]] = []
        self.partitioned: set[str] = set()
        self.ready_gate: asyncio.Event | None = None  # set: app_ready waits for it (a slow load)
        self.clock = clock
        self.lease_s = lease_s

    def lease(self, node: str) -> Lease:
        return self.leases.setdefault(node, Lease(self.lease_s, self.clock))

    def _check(self, url: str, what: str) -> None:
        if any(url == _url(n) for n in self.partitioned):
            raise AgentCallError(f"{what} {url}: timed out (partitioned)")

    async def put_app(self, url: str, app: str, body: dict[str, Any]) -> None:
        self.calls.append(("PUT", url, app))
        self._check(url, "PUT")
        self.held.setdefault(url, {})[app] = body
        self.lease(url.split("//")[1].split(".")[0]).placed(app)

    async def delete_app(self, url: str, app: str) -> None:
        self.calls.append(("DELETE", url, app))
        self._check(url, "DELETE")
        self.held.get(url, {}).pop(app, None)
        self.lease(url.split("//")[1].split(".")[0]).removed(app)

    async def app_ready(self, url: str, app: str) -> bool:
        self._check(url, "GET")
        if self.ready_gate is not None:
            await self.ready_gate.wait()
        return app in self.held.get(url, {})

    async def set_power(self, url: str, device: str, state: str) -> None:
        self._check(url, "PUT")

    async def probe_ms(self, url: str) -> float | None:
        return None

    def report(self, node: str, heartbeat_s: float = 1.0) -> dict[str, Any]:
        held = self.held.get(_url(node), {})
        apps = [{**piece, "app": a} for a, body in held.items()
                for piece in body.get("pieces", [{k: v for k, v in body.items() if k != "app"}])]
        return {"node": node, "url": _url(node), "incarnation": "one", "heartbeat_s": heartbeat_s,
                "lease_s": self.lease_s, "devices": [{"name": "tpu0", "emulated": True}], "apps": apps}

    def heartbeat(self, cp: ControlPlane, node: str, *, first: bool = False) -> dict[str, Any]:
        """The agent of ``node`` sends its heartbeat now and takes the answer, as its link does."""
        sent_at = self.clock()
        answer = cp.register_agent(node, self.report(node), heartbeat=not first)
        self.lease(node).acknowledged(sent_at, answer, set(self.held.get(_url(node), {})))
        return answer

    def accepting(self, app: str) -> set[str]:
        """The nodes whose agent would accept a request for ``app`` now: it holds it and is not fenced."""
        return {u.split("//")[1].split(".")[0] for u, apps in self.held.items()
                if app in apps and not self.lease(u.split("//")[1].split(".")[0]).why(app)}


def _run(tmp_path: Path, body: Any, **options: Any) -> None:
    async def main() -> None:
        clock = Clock(1000.0)
        agents = LeasedAgents(clock, 2.0)
        cp = ControlPlane(str(tmp_path / "store.db"), parse_cluster(yaml.safe_load(TWO_TPUS_YAML)),
                          agent_driver=agents, clock=clock, **{"drain_grace_s": 0.0, **options})
        await cp.start(loop=False)
        try:
            await body(cp, agents, clock)
        finally:
            await cp.close()

    asyncio.run(main())


def test_lost_after_lease_plus_margin_and_the_old_rule_without_a_lease() -> None:
    leased = AgentState("n1", "http://a:1", "i", 0.5, 0.0, 0.0, lease_s=1.5)
    assert lost_after_s(leased) == pytest.approx(1.5 * (1 + LEASE_DRIFT) + 0.5)
    plain = AgentState("n1", "http://a:1", "i", 0.5, 0.0, 0.0)
    assert lost_after_s(plain) == READY_HEARTBEATS * 0.5


def test_the_control_plane_declares_a_node_lost_only_after_lease_plus_margin(tmp_path: Path) -> None:
    async def body(cp: ControlPlane, agents: LeasedAgents, clock: Clock) -> None:
        for n in ("n1", "n2"):
            answer = agents.heartbeat(cp, n, first=True)
            assert answer["lease_s"] == 2.0 and answer["apps"] == []  # the lease granted
        await cp.wait_idle()
        status, _ = await cp.apply([_app("cam", 10)])
        assert status == 201
        await cp.wait_idle()
        (share,) = cp.placements["cam"].shares
        node = share.device.split("/")[0]
        assert agents.heartbeat(cp, node)["apps"] == ["cam"]
        t0 = clock.t
        lost = 2.0 * (1 + LEASE_DRIFT) + 1.0  # lease + one heartbeat + 1 % of the lease
        settings = AdaptSettings(dead_after_s=0.1)
        for dt in (1.0, 2.0, 2.01, 3.0, lost - 1e-6):
            clock.t = t0 + dt
            assert cp.reconciler.alive(node), dt
            assert cp.route("cam").endpoints, dt
            # every decision agrees: the agent list, and the adapt loop's threshold
            assert [a["ready"] for a in cp.reconciler.list_agents()["agents"] if a["node"] == node] == [True]
            if dt > 2.0:
                assert agents.lease(node).lapsed()  # the agent fenced itself first
        assert cp.adaptation.gather(clock.t, settings).settings.dead_after_s == pytest.approx(lost)
        clock.t = t0 + lost + 0.01
        assert not cp.reconciler.alive(node)
        assert [a["ready"] for a in cp.reconciler.list_agents()["agents"] if a["node"] == node] == [False]
        assert not cp.route("cam").endpoints
        assert cp.route("cam").pending[0].error == f"agent of node {node} missed its heartbeats"
        # a longer dead_after_s setting stands
        assert cp.adaptation.gather(clock.t, AdaptSettings(dead_after_s=30.0)).settings.dead_after_s == 30.0

    _run(tmp_path, body)


def test_an_app_evacuated_during_a_partition_is_deleted_from_the_returning_agent_before_it_serves(
        tmp_path: Path) -> None:
    async def body(cp: ControlPlane, agents: LeasedAgents, clock: Clock) -> None:
        for n in ("n1", "n2"):
            agents.heartbeat(cp, n, first=True)
        await cp.wait_idle()
        assert (await cp.apply([_app("cam", 10)]))[0] == 201
        await cp.wait_idle()
        (share,) = cp.placements["cam"].shares
        cut = share.device.split("/")[0]
        other = "n2" if cut == "n1" else "n1"
        for n in ("n1", "n2"):
            agents.heartbeat(cp, n)
        assert agents.accepting("cam") == {cut}
        # the link of `cut` drops: its agent keeps running and holding cam; the other heartbeats on
        agents.partitioned.add(cut)
        t0 = clock.t
        evacuated_at = None
        while clock.t < t0 + 12.0:
            clock.t = round(clock.t + 0.25, 6)
            agents.heartbeat(cp, other)
            cp.run_pass()
            if not cp.reconciler.alive(cut) and evacuated_at is None:
                assert agents.lease(cut).lapsed(), "the control plane lost a node whose agent was not fenced"
                cp.adaptation.step()  # the window's cycle: the lost node's apps are evacuated
                evacuated_at = clock.t
            await cp.wait_idle()
            # at every step, one placement at most accepts cam's requests
            assert len(agents.accepting("cam")) <= 1, (clock.t - t0, agents.accepting("cam"))
        assert evacuated_at is not None
        assert [s.device for s in cp.placements["cam"].shares] == [f"{other}/tpu0"]
        assert agents.accepting("cam") == {other}
        # the partitioned agent still holds it: the evacuation does not call a lost node (no call gets through)
        assert "cam" in agents.held[_url(cut)] and ("DELETE", _url(cut), "cam") not in agents.calls
        # the link returns: the first answer unfences nothing that the store moved away
        agents.partitioned.clear()
        calls = len(agents.calls)
        answer = agents.heartbeat(cp, cut)
        assert answer["apps"] == [] and answer["lease_s"] == 2.0
        lease = agents.lease(cut)
        assert lease.lapsed() == "" and lease.why("cam").startswith("fenced: app 'cam' is held here")
        assert agents.accepting("cam") == {other}
        # the reconcile that answer started deletes it
        await cp.wait_idle()
        assert ("DELETE", _url(cut), "cam") in agents.calls[calls:]
        assert "cam" not in agents.held[_url(cut)] and lease.unconfirmed == {}
        assert agents.accepting("cam") == {other}
        assert cp.reconciler.alive(cut) and cp.reconciler.status("cam") == "ready"

    _run(tmp_path, body, adapt=AdaptSettings(window_s=1.0, dead_after_s=0.1))


def test_an_app_a_move_is_loading_onto_a_node_stays_served_there_after_a_lapse(tmp_path: Path) -> None:
    """A lease that lapses without a partition (two heartbeats lost on a busy host) while a move loads an app
    onto the node: the answer lists the app (placed there by the move), so it is not fenced as one the
    control plane moved away, and the move completes."""
    async def body(cp: ControlPlane, agents: LeasedAgents, clock: Clock) -> None:
        for n in ("n1", "n2"):
            agents.heartbeat(cp, n, first=True)
        await cp.wait_idle()
        assert (await cp.apply([_app("cam", 10)]))[0] == 201
        await cp.wait_idle()
        (share,) = cp.placements["cam"].shares
        src = share.device.split("/")[0]
        dst = "n2" if src == "n1" else "n1"
        agents.heartbeat(cp, src)
        agents.heartbeat(cp, dst)
        agents.ready_gate = asyncio.Event()
        move = asyncio.create_task(cp.transition("cam", cp.plan_move("cam", {"to": [f"{dst}/tpu0"]})))
        for _ in range(200):
            if "cam" in agents.held.get(_url(dst), {}):
                break
            await asyncio.sleep(0.01)
        clock.t += 2.1  # dst's lease lapsed (no heartbeat acknowledged for 2.1 s > 2 s); not lost yet (3.02 s)
        assert agents.lease(dst).lapsed() and cp.reconciler.alive(dst)
        answer = agents.heartbeat(cp, dst)
        assert answer["apps"] == ["cam"] and [s.device for s in cp.placements["cam"].shares] == [f"{src}/tpu0"]
        assert agents.lease(dst).why("cam") == ""
        agents.heartbeat(cp, src)
        agents.ready_gate.set()
        assert (await move).result == "moved"
        assert [s.device for s in cp.placements["cam"].shares] == [f"{dst}/tpu0"]
        assert agents.accepting("cam") == {dst}

    _run(tmp_path, body)
