"""The control-plane service (runtime/controlplane/service.py) and its CLI, against fake agents and a fake gateway:
small apps on edgemux's server core (runtime.httpserver) on 127.0.0.1 that record the calls they get. One real agent (emulated devices) checks
that the model sources the control plane sends are ones the agent loads."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgemux.cli.main import main
from edgemux.cluster.specs import load_cluster, parse_cluster
from edgemux.cluster.store import Store
from edgemux.runtime.dataplane.messages import AgentReport
from edgemux.runtime.controlplane.api import ControlPlaneServer, start_server
from edgemux.runtime.controlplane.service import ControlPlane, agent_model
from edgemux.runtime.httpserver import Application, Request, Response, delete, get, put
from edgemux.runtime.httputil import Site, json_response, start_site
from support import TWO_TPUS_YAML

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_CLUSTER = ROOT / "examples" / "cluster" / "cluster.yaml"

# two nodes with one Edge TPU each: a mobilenet_v2 app at 200 req/s fits on neither alone, so the edgemux
# policy splits it over both (about 0.92 / 0.08)
TWO_TPUS = yaml.safe_load(TWO_TPUS_YAML)


def app_yaml(name: str, rate: float, model: str = "mobilenet_v2", slo_ms: float = 50, burst: float = 2,
             shared: bool = False) -> str:
    # shared apps of one model use one loaded copy: an Edge TPU's 6.9 MB hold one private mobilenet_v2 only
    return (f"apiVersion: edgemux/v1alpha1\nkind: App\nmetadata: {{name: {name}}}\n"
            f"spec: {{model: {model}, rate: {rate}, burst: {burst}, slo: {{latencyMs: {slo_ms}}}, "
            f"shared: {str(shared).lower()}}}\n")


# ------------------------------------------------------------------------------------------- harness


class Loop:
    """An event loop on a thread: servers live there, the test talks to them over HTTP (sync)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: float = 60.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def http(method: str, url: str, body: Any = None, ctype: str = "application/json",
         token: str | None = None) -> tuple[int, Any]:
    data = None
    if body is not None:
        data = body if isinstance(body, bytes) else (body.encode() if isinstance(body, str) else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Authorization": f"Bearer {token}"} if token else {})
    if data is not None:
        req.add_header("Content-Type", ctype)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


# every fake's calls in the order they came, across fakes: (who, method, app), for make-before-break checks
EVENTS: list[tuple[str, str, str]] = []


class FakeAgent:
    """Records control calls and keeps the routes it was given, as an agent reports them. ``put_status``: when
    set, PUTs are answered with it (an error) instead of loading; ``put_hold``: when set, a PUT records the app
    and then waits for it (a model load that takes long). Its one device ``tpu0`` has a power state, switched as
    the real agent switches it (``PUT /v1/devices/tpu0/power``: refused, 409, while it holds an app; a PUT of an
    app is refused, 409, while it is off)."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.put_status: int | None = None
        self.put_hold: asyncio.Event | None = None
        self.calls: list[tuple[str, str, Any]] = []
        self.apps: dict[str, dict[str, Any]] = {}
        self.power = "on"
        self.incarnation = uuid.uuid4().hex
        self.url = ""
        self.site: Site | None = None

    async def start(self) -> None:
        app = Application([put("/v1/apps/{app}", self._put), delete("/v1/apps/{app}", self._delete),
                           get("/v2/models/{app}/ready", self._ready), put("/v1/devices/{device}/power", self._power),
                           get("/v2/health/live", self._live)])
        self.site = await start_site(app, "127.0.0.1", 0)
        self.url = self.site.url

    async def _put(self, request: Request) -> Response:
        app, body = request.match_info["app"], await request.json()
        self.calls.append(("PUT", app, body))
        EVENTS.append((self.node, "PUT", app))
        if self.put_status is not None:
            return json_response({"error": "cannot load model: out of memory"}, status=self.put_status)
        if self.power == "off":
            return json_response({"error": f"device {self.node}/tpu0 is switched off"}, status=409)
        created = app not in self.apps
        self.apps[app] = {**body, "app": app}
        if self.put_hold is not None:
            await self.put_hold.wait()
        return json_response(self.apps[app], status=201 if created else 200)

    async def _live(self, request: Request) -> Response:
        return json_response({"live": True})

    async def _ready(self, request: Request) -> Response:
        app = request.match_info["app"]
        return json_response({}, status=200 if app in self.apps else 404)

    async def _delete(self, request: Request) -> Response:
        app = request.match_info["app"]
        self.calls.append(("DELETE", app, None))
        EVENTS.append((self.node, "DELETE", app))
        if self.apps.pop(app, None) is None:
            return json_response({"error": "unknown app"}, status=404)
        return json_response({"app": app})

    async def _power(self, request: Request) -> Response:
        device, state = request.match_info["device"], (await request.json())["state"]
        self.calls.append(("POWER", device, state))
        EVENTS.append((self.node, "POWER", state))
        if device != "tpu0":
            return json_response({"error": f"node {self.node} has no device {device!r}"}, status=404)
        if state == "off" and self.apps:
            return json_response({"error": f"device {self.node}/tpu0 still holds models"}, status=409)
        self.power = state
        return json_response({"device": device, "path": f"{self.node}/{device}", "state": state})

    def registration(self) -> AgentReport:
        # as the agent reports a split app: one entry per piece (read through the typed message, as the
        # control plane reads it)
        apps = [{**piece, "app": app} for app, body in self.apps.items()
                for piece in body.get("pieces", [{k: v for k, v in body.items() if k != "app"}])]
        return AgentReport.from_json({"node": self.node, "url": self.url, "incarnation": self.incarnation,
                                      "heartbeat_s": 1.0, "devices": [{"name": "tpu0", "emulated": True,
                                                                   "power_state": self.power}],
                                      "apps": apps})

    def puts(self) -> list[tuple[str, Any]]:
        return [(a, b) for m, a, b in self.calls if m == "PUT"]

    def deletes(self) -> list[str]:
        return [a for m, a, _ in self.calls if m == "DELETE"]


class FakeGateway:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.routes: dict[str, Any] = {}
        self.url = ""

    async def start(self) -> None:
        app = Application([put("/v1/routes/{app}", self._put), delete("/v1/routes/{app}", self._delete)])
        self.url = (await start_site(app, "127.0.0.1", 0)).url

    async def _put(self, request: Request) -> Response:
        app, body = request.match_info["app"], await request.json()
        self.calls.append(("PUT", app, body))
        EVENTS.append(("gateway", "PUT " + ",".join(sorted(e["url"] for e in body["endpoints"])), app))
        self.routes[app] = body
        return json_response(body)

    async def _delete(self, request: Request) -> Response:
        app = request.match_info["app"]
        self.calls.append(("DELETE", app, None))
        if self.routes.pop(app, None) is None:
            return json_response({"error": "no route"}, status=404)
        return json_response({})


class Env:
    """A running control plane on a store file, with fake agents for every node and a fake gateway."""

    def __init__(self, loop: Loop, tmp: Path, cluster: Any, agents: bool = True) -> None:
        self.loop, self.tmp, self.cluster = loop, tmp, cluster
        self.store_path = str(tmp / "store.db")
        self.agents = {n.name: FakeAgent(n.name) for n in cluster.nodes}
        self.gateway = FakeGateway()
        for a in self.agents.values():
            loop.run(a.start())
        loop.run(self.gateway.start())
        self.server: ControlPlaneServer = self.start()
        self.url = self.server.url

    def start(self, **options: Any) -> ControlPlaneServer:
        cp = ControlPlane(self.store_path, self.cluster, "edgemux", {}, **options)
        self.server = self.loop.run(start_server(cp, "127.0.0.1", 0))
        self.url = self.server.url
        return self.server

    @property
    def cp(self) -> ControlPlane:
        return self.server.controlplane

    def stop(self) -> None:
        self.loop.run(self.server.stop())

    def idle(self) -> None:
        self.loop.run(self.cp.wait_idle())

    def register(self, node: str, method: str = "POST") -> tuple[int, Any]:
        out = http(method, f"{self.url}/v1/agents/{node}", self.agents[node].registration().to_json())
        self.idle()
        return out

    def register_all(self) -> None:
        for n in self.agents:
            assert self.register(n)[0] == 200
        assert http("POST", f"{self.url}/v1/gateways", {"url": self.gateway.url})[0] == 200

    def apply(self, text: str) -> tuple[int, Any]:
        return http("POST", f"{self.url}/v1/apps", text, "application/yaml")

    def dump(self) -> Any:
        with Store.open(self.store_path) as s:
            return s.dump()


@pytest.fixture
def loop() -> Iterator[Loop]:
    lp = Loop()
    yield lp
    lp.close()


@pytest.fixture
def env(loop: Loop, tmp_path: Path) -> Iterator[Env]:
    e = Env(loop, tmp_path, parse_cluster(TWO_TPUS))
    yield e
    e.stop()


# --------------------------------------------------------------------------------------------- tests


def test_apply_split_app_loads_agents_and_routes_both_pieces(env: Env) -> None:
    env.register_all()
    status, body = env.apply(app_yaml("big", 200))
    assert status == 201, body
    (result,) = body["results"]
    assert result["result"] == "created" and result["status"] == "ready"

    with Store.open(env.store_path) as s:
        placement = s.placements()["big"]
        assert s.apps()["big"].rate_rps == 200
    weights = {sh.device: sh.weight for sh in placement.shares}
    assert set(weights) == {"n1/tpu0", "n2/tpu0"} and sum(weights.values()) == pytest.approx(1.0)

    for node in ("n1", "n2"):
        ((app, put),) = env.agents[node].puts()
        assert app == "big"
        w = weights[f"{node}/tpu0"]
        # each agent polices its part of the contract (200 req/s, burst 2) too
        assert put == {"device": "tpu0", "model": "zoo:mobilenet_v2@224x224",
                       "profile": "ibis-edgetpu/mobilenet_v2", "weight": w, "rate_rps": pytest.approx(200 * w),
                       "burst": pytest.approx(max(1.0, 2 * w))}

    route = env.gateway.routes["big"]
    assert route["model"] == "big" and route["rate_rps"] == 200 and route["burst"] == 2
    got = {e["url"]: e["weight"] for e in route["endpoints"]}
    assert got == {env.agents["n1"].url: weights["n1/tpu0"], env.agents["n2"].url: weights["n2/tpu0"]}
    status, r = http("GET", f"{env.url}/v1/routes/big")
    assert status == 200 and {e["url"]: e["weight"] for e in r["endpoints"]} == got and r["pending"] == []

    status, d = http("GET", f"{env.url}/v1/apps/big")
    assert status == 200 and d["status"] == "ready" and "partitioned" in d["reason"]
    for piece in d["placement"]["pieces"]:
        assert piece["emulated"] is True and piece["emulated_known_from"] == "agent"
        assert piece["predicted"]["mean_ms"] > 0 and piece["status"] == "loaded"
    status, listing = http("GET", f"{env.url}/v1/apps")
    assert status == 200 and [a["name"] for a in listing["apps"]] == ["big"]

    # the same spec again: a no-op (no new agent or gateway call, store untouched)
    before, calls = env.dump(), len(env.gateway.calls)
    status, body = env.apply(app_yaml("big", 200))
    assert status == 200 and body["results"][0]["result"] == "unchanged"
    assert env.dump() == before and len(env.gateway.calls) == calls
    assert all(len(a.puts()) == 1 for a in env.agents.values())


def test_json_body_and_put_by_name(env: Env) -> None:
    env.register_all()
    doc = yaml.safe_load(app_yaml("one", 10))
    status, body = http("PUT", f"{env.url}/v1/apps/one", doc)
    assert status == 201 and body["results"][0]["placement"]["shares"][0]["weight"] == 1.0
    route = env.gateway.routes["one"]
    assert len(route["endpoints"]) == 1 and route["endpoints"][0]["weight"] == 1.0
    status, body = http("PUT", f"{env.url}/v1/apps/other", doc)
    assert status == 400 and "metadata.name" in body["error"]


def test_rejection_leaves_store_unchanged_and_explains(env: Env) -> None:
    env.register_all()
    assert env.apply(app_yaml("small", 10))[0] == 201
    before = env.dump()
    status, body = env.apply(app_yaml("huge", 10000))
    assert status == 409
    rej = body["rejection"]
    assert rej["constraint"] in ("utilization", "device-memory") and rej["counts"]
    assert rej["requested"] > rej["capacity"] - rej.get("used", 0) and "huge" in rej["message"]
    assert body["error"] == rej["message"] and body["results"][0]["result"] == "rejected"
    assert env.dump() == before
    assert all(a != "huge" for ag in env.agents.values() for a, _ in ag.puts())
    # bad specs: 400 naming the field, store unchanged
    status, body = env.apply(app_yaml("bad", 10).replace("slo: {latencyMs: 50}", "slo: {latencyMs: -1}"))
    assert status == 400 and "latencyMs" in body["error"]
    status, body = env.apply("apiVersion: edgemux/v1alpha1\nkind: App\nmetadata: {name: x}\nspec: {model: nope}\n")
    assert status == 400 and "model" in body["error"]
    status, body = env.apply("{{{ not yaml")
    assert status == 400 and body["error"]
    assert env.dump() == before


def test_same_node_split_is_one_put_with_pieces_and_one_endpoint(loop: Loop, tmp_path: Path) -> None:
    # example cluster: node-1 has a TPU and a GPU; the policy splits a 200 req/s app over both: the agent
    # gets both pieces in one PUT and the route lists it once with their summed weight
    e = Env(loop, tmp_path, load_cluster(EXAMPLE_CLUSTER))
    try:
        e.register_all()
        status, body = e.apply(app_yaml("big", 200))
        assert status == 201, body
        shares = body["results"][0]["placement"]["shares"]
        on_node1 = sorted((s["device"].split("/", 1)[1], s["weight"]) for s in shares if s["device"].startswith("node-1/"))
        assert len(on_node1) == 2
        puts = [b for a, b in e.agents["node-1"].puts() if a == "big"]
        assert len(puts) == 1 and set(puts[0]) == {"pieces"}
        assert sorted((p["device"], p["weight"]) for p in puts[0]["pieces"]) == on_node1
        route = e.gateway.routes["big"]
        mine = [x for x in route["endpoints"] if x["url"] == e.agents["node-1"].url]
        assert len(mine) == 1 and mine[0]["weight"] == pytest.approx(sum(w for _, w in on_node1))
        desc = http("GET", f"{e.url}/v1/apps/big")[1]
        assert desc["status"] == "ready"
        assert all(p["status"] == "loaded" for p in desc["placement"]["pieces"])
        # the agent's heartbeat reports the two pieces: nothing to reconcile, no second PUT
        assert e.register("node-1", "PUT")[0] == 200
        assert len([a for a, _ in e.agents["node-1"].puts() if a == "big"]) == 1
        # a restarted agent (new incarnation, no apps) gets both pieces again in one PUT
        e.agents["node-1"].apps.clear()
        e.agents["node-1"].incarnation = "restarted"
        assert e.register("node-1")[0] == 200
        puts = [b for a, b in e.agents["node-1"].puts() if a == "big"]
        assert len(puts) == 2 and len(puts[1]["pieces"]) == 2
        # delete: one DELETE per node
        status, body = http("DELETE", f"{e.url}/v1/apps/big")
        assert status == 200 and e.agents["node-1"].deletes() == ["big"]
    finally:
        e.stop()


def test_delete_unloads_agents_and_removes_routes(env: Env) -> None:
    env.register_all()
    assert env.apply(app_yaml("big", 200))[0] == 201
    status, body = http("DELETE", f"{env.url}/v1/apps/big")
    assert status == 200 and body["agents"] == {"n1": "deleted", "n2": "deleted"}
    assert env.agents["n1"].deletes() == ["big"] and env.agents["n2"].deletes() == ["big"]
    assert ("DELETE", "big", None) in env.gateway.calls and "big" not in env.gateway.routes
    with Store.open(env.store_path) as s:
        assert s.apps() == {} and s.check() == []
    assert http("GET", f"{env.url}/v1/apps/big")[0] == 404
    status, body = http("DELETE", f"{env.url}/v1/apps/big")
    assert status == 404 and "unknown app" in body["error"]


def test_update_is_delete_plus_admit(env: Env) -> None:
    env.register_all()
    assert env.apply(app_yaml("cam", 10))[0] == 201
    assert [a for a, _ in env.agents["n2"].puts()] == []
    status, body = env.apply(app_yaml("cam", 200))
    assert status == 200 and body["results"][0]["result"] == "updated"
    assert len(env.gateway.routes["cam"]["endpoints"]) == 2
    assert [a for a, _ in env.agents["n2"].puts()] == ["cam"]
    # back to one piece: n2 is told to drop it, after the route moved
    status, body = env.apply(app_yaml("cam", 10))
    assert status == 200 and env.agents["n2"].deletes() == ["cam"]
    assert len(env.gateway.routes["cam"]["endpoints"]) == 1
    # a change the policy rejects keeps the old app
    before = env.dump()
    status, body = env.apply(app_yaml("cam", 10000))
    assert status == 409 and env.dump() == before


def test_registration_reconciles_new_incarnation(env: Env) -> None:
    env.register_all()
    assert env.apply(app_yaml("small", 10))[0] == 201
    agent = env.agents["n1"]
    assert [a for a, _ in agent.puts()] == ["small"]
    # a heartbeat reporting what it holds changes nothing
    assert env.register("n1", "PUT")[0] == 200
    assert len(agent.puts()) == 1
    # the agent restarts: new incarnation, no apps, and a stray app someone loaded by hand
    agent.incarnation = uuid.uuid4().hex
    agent.apps = {"ghost": {"app": "ghost", "device": "tpu0", "model": "zoo:resnet18", "profile": None,
                            "weight": 1.0}}
    assert env.register("n1")[0] == 200
    assert [a for a, _ in agent.puts()] == ["small", "small"] and agent.deletes() == ["ghost"]
    assert set(agent.apps) == {"small"}
    # unknown node, unregistered heartbeat, bad bodies
    status, body = http("POST", f"{env.url}/v1/agents/nope", agent.registration().to_json() | {"node": "nope"})
    assert status == 404 and "unknown node" in body["error"]
    assert http("DELETE", f"{env.url}/v1/agents/n2")[0] == 200
    status, body = http("PUT", f"{env.url}/v1/agents/n2", env.agents["n2"].registration().to_json())
    assert status == 404
    assert http("POST", f"{env.url}/v1/agents/n1", {"url": "ftp://x", "incarnation": "a"})[0] == 400
    status, listing = http("GET", f"{env.url}/v1/agents")
    assert status == 200 and [a["node"] for a in listing["agents"]] == ["n1"]
    assert listing["agents"][0]["ready"] is True and listing["unregistered_nodes"] == ["n2"]


def test_unreachable_agent_leaves_app_pending_until_it_registers(env: Env) -> None:
    assert http("POST", f"{env.url}/v1/gateways", {"url": env.gateway.url})[0] == 200
    dead = env.agents["n1"].registration().to_json() | {"url": "http://127.0.0.1:9"}  # nothing listens on port 9
    assert http("POST", f"{env.url}/v1/agents/n1", dead)[0] == 200
    env.idle()
    status, body = env.apply(app_yaml("small", 10))
    assert status == 201 and body["results"][0]["status"] == "pending"
    status, d = http("GET", f"{env.url}/v1/apps/small")
    assert d["status"] == "pending" and d["placement"]["pieces"][0]["error"]
    assert "small" not in env.gateway.routes  # no route to an agent without the app
    with Store.open(env.store_path) as s:
        assert "small" in s.apps()
    # the agent comes up (new incarnation and address): it gets the app, the route appears
    assert env.register("n1")[0] == 200
    assert [a for a, _ in env.agents["n1"].puts()] == ["small"]
    assert http("GET", f"{env.url}/v1/apps/small")[1]["status"] == "ready"
    assert env.gateway.routes["small"]["endpoints"][0]["url"] == env.agents["n1"].url


def test_restart_on_the_same_store_keeps_the_apps(env: Env) -> None:
    env.register_all()
    assert env.apply(app_yaml("big", 200, shared=True))[0] == 201
    assert env.apply(app_yaml("small", 10, shared=True))[0] == 201
    listing = http("GET", f"{env.url}/v1/apps")[1]["apps"]
    env.stop()
    env.start()
    again = http("GET", f"{env.url}/v1/apps")[1]["apps"]
    assert [(a["name"], a["shares"]) for a in again] == [(a["name"], a["shares"]) for a in listing]
    assert all(a["status"] == "pending" for a in again)  # no agent has reported to this process yet
    # the agents register with what they hold: nothing to load again, and the apps are ready
    puts = {n: len(a.puts()) for n, a in env.agents.items()}
    env.register_all()
    assert {n: len(a.puts()) for n, a in env.agents.items()} == puts
    assert all(a["status"] == "ready" for a in http("GET", f"{env.url}/v1/apps")[1]["apps"])


def test_model_sources_for_models_without_a_zoo_graph() -> None:
    from edgemux.profiles.catalog import load_catalog

    cat = load_catalog()
    assert agent_model(cat.get("ibis-edgetpu/efficientnet-S")) == ("zoo:efficientnet_b0@224x224", "efficientnet_b0")
    assert agent_model(cat.get("ibis-edgetpu/mobilenet_v2")) == ("zoo:mobilenet_v2@224x224", None)
    # two catalog models with one stand-in get the same graph; the agent keeps them apart by profile
    assert agent_model(cat.get("ibis-edgetpu/mobilenet_v1"))[0] == agent_model(cat.get("microedge/bodypix"))[0]
    assert agent_model(cat.get("ibis-edgetpu/mobilenet_v1"), {"mobilenet_v1": "/m/v1.onnx"}) == ("/m/v1.onnx", None)


def test_real_agent_registers_and_loads_the_app(loop: Loop, tmp_path: Path) -> None:
    from edgemux.runtime.dataplane.agent import Agent
    from edgemux.runtime.dataplane.agent import start_server as start_agent

    cluster = parse_cluster(TWO_TPUS)
    cp = ControlPlane(str(tmp_path / "s.db"), cluster, "edgemux")
    server = loop.run(start_server(cp, "127.0.0.1", 0))
    agent = Agent(cluster.node("n1"), backends={"tpu0": "emulated"}, controlplane_url=server.url,
                  heartbeat_s=0.2, cache_dir=str(tmp_path / "zoo"))
    try:
        status, body = http("POST", f"{server.url}/v1/apps", app_yaml("eff", 5, "efficientnet-S", 60),
                            "application/yaml")
        assert status == 201, body
        agent_server = loop.run(start_agent(agent, "127.0.0.1", 0))
        for _ in range(300):  # the agent registers, the control plane reconciles: the app gets loaded
            if http("GET", f"{server.url}/v1/apps/eff")[1]["status"] == "ready":
                break
            loop.run(asyncio.sleep(0.05))
        d = http("GET", f"{server.url}/v1/apps/eff")[1]
        assert d["status"] == "ready", d
        (route,) = agent.all_pieces()
        assert route.app == "eff" and route.info.emulated and route.profile == "ibis-edgetpu/efficientnet-S"
        assert route.source == d["placement"]["pieces"][0]["model_source"]
        loop.run(agent_server.stop())
    finally:
        agent.close(drain=False, timeout_s=1)
        loop.run(server.stop())


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12)
_app_like = st.fixed_dictionaries(
    {"apiVersion": st.sampled_from(["edgemux/v1alpha1", "v1", 3]), "kind": st.sampled_from(["App", "AppList", "X"]),
     "metadata": st.one_of(_json_values, st.fixed_dictionaries({"name": st.text(max_size=10)})),
     "spec": _json_values | st.fixed_dictionaries(
         {"model": st.sampled_from(["mobilenet_v2", "efficientnet-S", "resnet50", "nope"]),
          "rate": st.one_of(st.floats(), st.integers(-5, 10**6), st.text(max_size=3)),
          "slo": st.fixed_dictionaries({"latencyMs": st.one_of(st.floats(), st.integers(-1, 10**4))}),
          "burst": st.floats(0.001, 100)},
         optional={"shared": st.booleans(), "cpu": _json_values, "memoryMb": st.floats()})})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from([("POST", "/v1/apps", "json"), ("POST", "/v1/apps", "yaml"), ("PUT", "/v1/apps/x", "json"),
                             ("POST", "/v1/agents/n1", "json"), ("PUT", "/v1/agents/n1", "json"),
                             ("POST", "/v1/gateways", "json")]),
       value=st.one_of(_json_values, _app_like), raw=st.one_of(st.none(), st.binary(max_size=40)))
def test_fuzzed_bodies_never_500(env: Env, path: tuple[str, str, str], value: Any, raw: bytes | None) -> None:
    method, p, kind = path
    if raw is not None:
        body: bytes = raw
    elif kind == "yaml":
        body = yaml.safe_dump(value).encode()
    else:
        body = json.dumps(value).encode()
    status, answer = http(method, env.url + p, body, "application/yaml" if kind == "yaml" else "application/json")
    assert status < 500, answer
    if status >= 400:
        assert isinstance(answer.get("error"), str) and answer["error"]


# ------------------------------------------------------------------------------------------------ CLI


def test_cli_apply_get_describe_delete(env: Env, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env.register_all()
    srv = ["--server", env.url]
    f = tmp_path / "apps.yaml"
    f.write_text(app_yaml("big", 200, shared=True) + "---\n" + app_yaml("small", 10, shared=True))
    assert main(["apply", "-f", str(f), *srv]) == 0
    out = capsys.readouterr().out
    assert "big" in out and "created" in out and "n2/tpu0" in out

    assert main(["get", "apps", *srv]) == 0
    out = capsys.readouterr().out
    assert "big" in out and "small" in out and "ready" in out
    assert main(["get", "agents", *srv]) == 0 and "n1" in capsys.readouterr().out
    assert main(["get", "routes", *srv]) == 0 and env.agents["n2"].url in capsys.readouterr().out

    assert main(["describe", "app", "big", *srv]) == 0
    out = capsys.readouterr().out
    assert "n1/tpu0" in out and "n2/tpu0" in out and "emulated" in out and "partitioned" in out

    # a rejected app: exit 1 with the rejection's message
    bad = tmp_path / "huge.yaml"
    bad.write_text(app_yaml("huge", 10000))
    assert main(["apply", "-f", str(bad), *srv]) == 1
    assert "rejected" in capsys.readouterr().err
    # bad input: exit 2, one line
    assert main(["apply", "-f", str(tmp_path / "missing.yaml"), *srv]) == 2
    broken = tmp_path / "broken.yaml"
    broken.write_text(app_yaml("b", 10).replace("rate: 10", "rate: -3"))
    assert main(["apply", "-f", str(broken), *srv]) == 2
    err = capsys.readouterr().err
    assert "rate" in err and err.count("\n") == 2  # missing file, then the bad field: one line each

    assert main(["delete", "app", "small", *srv]) == 0 and "deleted" in capsys.readouterr().out
    assert main(["delete", "app", "small", *srv]) == 2
    assert main(["describe", "app", "small", *srv]) == 2
    assert main(["get", "apps", "--server", "http://127.0.0.1:9"]) == 2
    assert "cannot reach" in capsys.readouterr().err


def test_cli_controlplane_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path / "s.db")
    assert main(["controlplane", "--cluster", str(tmp_path / "none.yaml"), "--store", store]) == 2
    assert main(["controlplane", "--cluster", str(EXAMPLE_CLUSTER), "--store", store, "--policy", "nope"]) == 2
    assert main(["controlplane", "--cluster", str(EXAMPLE_CLUSTER), "--store", store, "--option", "x=1"]) == 2
    assert main(["controlplane", "--cluster", str(EXAMPLE_CLUSTER), "--store", store, "--port", "70000"]) == 2
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not an SQLite file" * 100)
    assert main(["controlplane", "--cluster", str(EXAMPLE_CLUSTER), "--store", str(garbage), "--port", "0"]) == 2
    assert main(["controlplane", "--cluster", str(EXAMPLE_CLUSTER), "--store", store, "--drain-grace-s", "-1"]) == 2
    assert main(["controlplane", "--cluster", str(EXAMPLE_CLUSTER), "--store", store,
                 "--reconcile-period-s", "nan"]) == 2
    err = capsys.readouterr().err
    assert err.count("edgemux: error:") == 7 and "store" in err
    assert "--drain-grace-s: must be a finite number >= 0 s, got -1" in err
    assert "--reconcile-period-s: must be a finite number > 0 s, got nan" in err


def test_cli_controlplane_serves_until_sigterm(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "edgemux", "controlplane", "--cluster", str(EXAMPLE_CLUSTER),
                             "--store", str(tmp_path / "s.db"), "--port", "0", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("controlplane listening on http://127.0.0.1:"), (line, proc.stderr)
        url = line.rsplit(" ", 1)[1]
        status, info = http("GET", f"{url}/v1")
        assert status == 200 and info["policy"] == "edgemux" and info["nodes"] == ["node-1", "node-2"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
