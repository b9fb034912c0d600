"""Make-before-break moves (``ControlPlane.transition``, ``POST /v1/apps/{name}/move``) and the reconcile loop,
against the fake agents and gateway of test_runtime_controlplane: the order of the calls, refusals that change
nothing, a roll-back when the target cannot load, and a restart that finds a move half done in the store."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from edgemux.cluster.specs import parse_cluster
from edgemux.cluster.state import Placement, Share
from edgemux.cluster.store import Store
from test_runtime_controlplane import EVENTS, TWO_TPUS, Env, Loop, app_yaml, http

PROFILE = "ibis-edgetpu/mobilenet_v2"


@pytest.fixture
def env(loop: Loop, tmp_path: Path) -> Iterator[Env]:
    e = Env(loop, tmp_path, parse_cluster(TWO_TPUS))
    e.stop()  # restarted with a short drain and a fast reconcile loop
    e.start(drain_grace_s=0.05, reconcile_period_s=0.05)
    yield e
    e.stop()


@pytest.fixture
def loop() -> Iterator[Loop]:
    lp = Loop()
    yield lp
    lp.close()


def until(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def placed(env: Env, app: str) -> Placement:
    with Store.open(env.store_path) as s:
        return s.placements()[app]


def endpoints(env: Env, app: str) -> set[str]:
    return {e["url"] for e in env.gateway.routes[app]["endpoints"]}


def admitted_on(env: Env, name: str = "cam") -> tuple[str, str]:
    """Admit a small app (it fits one TPU) and return (its node, the other node)."""
    env.register_all()
    status, body = env.apply(app_yaml(name, 10))
    assert status == 201, body
    (share,) = placed(env, name).shares
    src = share.device.split("/")[0]
    return src, ("n2" if src == "n1" else "n1")


def test_move_between_nodes_loads_first_switches_routes_then_unloads(env: Env) -> None:
    src, dst = admitted_on(env)
    EVENTS.clear()
    status, body = http("POST", f"{env.url}/v1/apps/cam/move", {"to": [f"{dst}/tpu0"]})
    assert status == 200, body
    assert body["result"] == "moved" and body["to"]["shares"] == [{"device": f"{dst}/tpu0", "weight": 1.0,
                                                                   "profile": PROFILE}]
    assert set(body["steps_s"]) == {"load_s", "switch_s", "drain_s"}
    # make before break: load on the target, route to it alone, and only then unload the source
    new_route = ("gateway", f"PUT {env.agents[dst].url}", "cam")
    order = [e for e in EVENTS if e in ((dst, "PUT", "cam"), new_route, (src, "DELETE", "cam"))]
    assert order == [(dst, "PUT", "cam"), new_route, (src, "DELETE", "cam")], EVENTS
    assert endpoints(env, "cam") == {env.agents[dst].url}
    assert "cam" not in env.agents[src].apps and "cam" in env.agents[dst].apps
    assert placed(env, "cam").shares == (Share(f"{dst}/tpu0", 1.0, PROFILE),)
    with Store.open(env.store_path) as s:
        assert s.transitions() == {} and s.check() == []
    status, d = http("GET", f"{env.url}/v1/apps/cam")
    assert status == 200 and d["status"] == "ready"
    # the same placement again is a no-op
    status, body = http("POST", f"{env.url}/v1/apps/cam/move", {"to": [{"device": f"{dst}/tpu0", "weight": 1}]})
    assert status == 200 and body["result"] == "unchanged"


def test_move_of_a_split_app_changes_weights_on_both_agents(env: Env) -> None:
    env.register_all()
    assert env.apply(app_yaml("big", 200, shared=True))[0] == 201  # split over both TPUs by the policy
    before = {s.device: s.weight for s in placed(env, "big").shares}
    assert len(before) == 2
    # shift a little of the rate between the two pieces: both stay within their SLOs
    w1 = round(before["n1/tpu0"] - 0.01, 6)
    status, body = http("POST", f"{env.url}/v1/apps/big/move",
                        {"to": [{"device": "n1/tpu0", "weight": w1}, {"device": "n2/tpu0", "weight": 1 - w1}]})
    assert status == 200, body
    got = {s.device: s.weight for s in placed(env, "big").shares}
    assert got["n1/tpu0"] == pytest.approx(w1) and got["n2/tpu0"] == pytest.approx(1 - w1)
    route = {e["url"]: e["weight"] for e in env.gateway.routes["big"]["endpoints"]}
    assert route[env.agents["n1"].url] == pytest.approx(w1)
    assert env.agents["n1"].apps["big"]["weight"] == pytest.approx(w1)
    assert env.agents["n2"].deletes() == [] and env.agents["n1"].deletes() == []  # nothing unloaded


@pytest.mark.parametrize("body, status, needle", [
    ({"to": ["n9/tpu0"]}, 404, "unknown device"),
    ({"to": []}, 400, "non-empty list"),
    ({"to": ["n1/tpu0", "n1/tpu0"]}, 400, "twice"),
    ({"to": [{"device": "n1/tpu0", "weight": 0.5}, {"device": "n2/tpu0", "weight": 0.4}]}, 400, "sum to 1"),
    ({"to": [{"device": "n1/tpu0", "weight": 0.5}, "n2/tpu0"]}, 400, "every device or for none"),
    ({"to": [{"device": "n1/tpu0", "weight": 2}]}, 400, "(0, 1]"),
    ({"to": ["n1/tpu0"], "speed": 3}, 400, "JSON object"),
    ([1, 2], 400, "JSON object"),
])
def test_bad_moves_are_refused_and_change_nothing(env: Env, body: Any, status: int, needle: str) -> None:
    admitted_on(env)
    before, routes = env.dump(), dict(env.gateway.routes)
    got, answer = http("POST", f"{env.url}/v1/apps/cam/move", body)
    assert got == status and needle in answer["error"], answer
    assert env.dump() == before and env.gateway.routes == routes


def test_a_move_that_would_break_an_slo_is_refused_with_the_reason_as_data(env: Env) -> None:
    env.register_all()
    assert env.apply(app_yaml("big", 200, shared=True))[0] == 201
    before = env.dump()
    status, answer = http("POST", f"{env.url}/v1/apps/big/move", {"to": ["n1/tpu0"]})
    assert status == 409, answer
    assert answer["rejection"]["app"] == "big" and answer["rejection"]["constraint"] in ("slo", "utilization")
    assert env.dump() == before
    assert http("POST", f"{env.url}/v1/apps/nope/move", {"to": ["n1/tpu0"]})[0] == 404


def test_a_target_that_cannot_load_rolls_back(env: Env) -> None:
    src, dst = admitted_on(env)
    before, routes = env.dump(), {k: dict(v) for k, v in env.gateway.routes.items()}
    env.agents[dst].put_status = 500
    status, answer = http("POST", f"{env.url}/v1/apps/cam/move", {"to": [f"{dst}/tpu0"]})
    assert status == 502 and "rolled back" in answer["error"] and "out of memory" in answer["error"]
    assert env.dump() == before and env.gateway.routes == routes
    assert "cam" in env.agents[src].apps and env.agents[src].deletes() == []


def test_restart_during_loading_keeps_the_app_where_it_was(env: Env) -> None:
    src, dst = admitted_on(env)
    old = placed(env, "cam")
    env.stop()
    # what a control plane killed while the target loaded leaves behind: the move recorded, the target holding
    # the app, the store and the routes still at the source
    with Store.open(env.store_path) as s:
        s.begin_transition(old, Placement("cam", (Share(f"{dst}/tpu0", 1.0, PROFILE),), old.cpu_node))
    env.agents[dst].apps["cam"] = {"device": "tpu0", "model": "zoo:mobilenet_v2@224x224", "profile": PROFILE,
                                   "weight": 1.0, "app": "cam"}
    env.start(drain_grace_s=0.05, reconcile_period_s=0.05)
    env.register_all()
    until(lambda: "cam" not in env.agents[dst].apps)  # the reconcile loop takes the new piece away
    assert placed(env, "cam") == old and endpoints(env, "cam") == {env.agents[src].url}
    assert "cam" in env.agents[src].apps
    with Store.open(env.store_path) as s:
        assert s.transitions() == {}


def test_restart_during_draining_finishes_the_move(env: Env) -> None:
    src, dst = admitted_on(env)
    old = placed(env, "cam")
    new = Placement("cam", (Share(f"{dst}/tpu0", 1.0, PROFILE),), old.cpu_node)
    env.stop()
    with Store.open(env.store_path) as s:  # killed after the switch, before the source unloaded
        s.begin_transition(old, new)
        s.switch_transition("cam")
    env.agents[dst].apps["cam"] = {"device": "tpu0", "model": "zoo:mobilenet_v2@224x224", "profile": PROFILE,
                                   "weight": 1.0, "app": "cam"}
    EVENTS.clear()
    env.start(drain_grace_s=0.05, reconcile_period_s=0.05)
    env.register_all()
    until(lambda: "cam" not in env.agents[src].apps)
    # the gateway had the new route before the source unloaded
    new_route = ("gateway", f"PUT {env.agents[dst].url}", "cam")
    assert EVENTS.index(new_route) < EVENTS.index((src, "DELETE", "cam")), EVENTS
    until(lambda: not env.cp.transitions.records)
    with Store.open(env.store_path) as s:
        assert s.transitions() == {} and s.placements()["cam"] == new
    assert endpoints(env, "cam") == {env.agents[dst].url}


def test_reconcile_loop_repairs_a_gateway_that_lost_its_routes(env: Env) -> None:
    admitted_on(env)
    env.gateway.routes.clear()  # e.g. a gateway restarted without re-registering
    env.cp.routes.acked.clear()  # what the loop learns by reading the gateway's routes back
    until(lambda: "cam" in env.gateway.routes)


# ------------------------------------------------------------------------- kill -9 of the control plane


def _start_cp(store: Path, cluster_file: Path, gateway: str, drain_s: float,
              extra: tuple[str, ...] = ()) -> tuple[Any, str]:
    import os
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "edgemux", "controlplane", "--cluster", str(cluster_file),
                             "--store", str(store), "--port", "0", "--log-level", "warning", "--gateway", gateway,
                             "--drain-grace-s", str(drain_s), "--reconcile-period-s", "0.1", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent / "src")})
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line.startswith("controlplane listening on "), line
    return proc, line.rsplit(" ", 1)[1]


def fake_cluster(loop: Loop, tmp_path: Path, spec: dict[str, Any]) -> tuple[Path, dict[str, Any], Any, Path]:
    """A cluster file of ``spec``, started fake agents of nodes n1 and n2 and a fake gateway, and a store
    path: what a control plane child process (``_start_cp``) is pointed at."""
    import yaml

    from test_runtime_controlplane import FakeAgent, FakeGateway

    cluster_file = tmp_path / "cluster.yaml"
    cluster_file.write_text(yaml.safe_dump(spec))
    agents = {n: FakeAgent(n) for n in ("n1", "n2")}
    gateway = FakeGateway()
    for a in agents.values():
        loop.run(a.start())
    loop.run(gateway.start())
    return cluster_file, agents, gateway, tmp_path / "s.db"


def register_fakes(url: str, agents: dict[str, Any]) -> None:
    """Register every fake agent with the control plane at ``url`` (a 60 s heartbeat: the test reports)."""
    for a in agents.values():
        assert http("POST", f"{url}/v1/agents/{a.node}", {**a.registration().to_json(), "heartbeat_s": 60.0})[0] == 200


@pytest.mark.parametrize("phase", ["loading", "draining"])
def test_kill_9_mid_move_then_restart_serves_from_exactly_one_placement(loop: Loop, tmp_path: Path,
                                                                        phase: str) -> None:
    """The control plane is killed (SIGKILL) while a move loads the target (phase loading) or after it switched
    the routes, while the source drains (phase draining); a new control plane on the same store brings
    agents, gateway and store to one placement: the old one when the switch had not happened, else the new."""
    import threading

    cluster_file, agents, gateway, store = fake_cluster(loop, tmp_path, TWO_TPUS)

    proc, url = _start_cp(store, cluster_file, gateway.url, drain_s=60.0)
    try:
        register_fakes(url, agents)
        assert http("POST", f"{url}/v1/apps", app_yaml("cam", 10), "application/yaml")[0] == 201
        until(lambda: "cam" in gateway.routes)
        with Store.open(store) as s:
            old = s.placements()["cam"]
        src = old.shares[0].device.split("/")[0]
        dst = "n2" if src == "n1" else "n1"
        if phase == "loading":
            hold = loop.run(_make_event())
            agents[dst].put_hold = hold
        def move() -> None:
            try:
                http("POST", f"{url}/v1/apps/cam/move", {"to": [f"{dst}/tpu0"]})
            except OSError:  # the control plane is killed while this call waits for its answer
                pass

        mover = threading.Thread(target=move, daemon=True)
        mover.start()
        if phase == "loading":
            until(lambda: "cam" in agents[dst].apps)  # the target got the PUT and is "loading"
        else:
            until(lambda: {e["url"] for e in gateway.routes["cam"]["endpoints"]} == {agents[dst].url})
        proc.kill()
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    if phase == "loading":
        agents[dst].put_hold = None
        loop.loop.call_soon_threadsafe(hold.set)
    assert "cam" in agents[src].apps  # nothing was unloaded before the kill

    proc, url = _start_cp(store, cluster_file, gateway.url, drain_s=0.2)
    try:
        register_fakes(url, agents)
        keep, drop = (src, dst) if phase == "loading" else (dst, src)
        until(lambda: "cam" not in agents[drop].apps)
        until(lambda: http("GET", f"{url}/v1/apps/cam")[1].get("status") == "ready")
        assert [n for n, a in agents.items() if "cam" in a.apps] == [keep]
        assert {e["url"] for e in gateway.routes["cam"]["endpoints"]} == {agents[keep].url}
        status, route = http("GET", f"{url}/v1/routes/cam")
        assert status == 200 and [e["node"] for e in route["endpoints"]] == [keep]
        until(lambda: not Store.open(store).transitions())
        with Store.open(store) as s:
            assert [sh.device for sh in s.placements()["cam"].shares] == [f"{keep}/tpu0"] and s.check() == []
    finally:
        proc.terminate()
        proc.wait(20)


async def _make_event() -> Any:
    import asyncio

    return asyncio.Event()


SPATIAL_GPU = """apiVersion: edgemux/v1alpha1
kind: Cluster
metadata: {name: spatial}
spec:
  nodes:
    - name: n1
      cpuCores: 4
      memoryMb: 4096
      devices:
        - {name: gpu0, kind: gpu-discrete, discipline: spatial, memoryMb: 16384, profiles: dhakal-v100}
"""


def test_a_reshare_sends_the_agent_new_instances_and_keeps_the_device(loop: Loop, tmp_path: Path) -> None:
    """On a spatial device the app's piece carries its share and instance count to the agent; a transition
    to more instances on the same device is a re-share: one PUT with the new values (the agent re-shares
    with overlap), the placement stored, nothing deleted."""
    import yaml

    env = Env(loop, tmp_path, parse_cluster(yaml.safe_load(SPATIAL_GPU)))
    try:
        env.register_all()
        status, body = env.apply(app_yaml("cam", 500, model="mobilenet", slo_ms=5))
        assert status == 201, body
        (share,) = placed(env, "cam").shares
        assert (share.device, share.fraction, share.instances) == ("n1/gpu0", 0.15, 1)
        put = [c for c in env.agents["n1"].calls if c[0] == "PUT"]
        assert put[-1][2]["fraction"] == 0.15 and put[-1][2]["instances"] == 1
        EVENTS.clear()
        new = Placement("cam", (Share("n1/gpu0", 1.0, share.profile, 0.15, 2),), "n1")
        answer = loop.run(env.cp.transition("cam", new, rate_rps=1500.0))
        assert answer.result == "moved"
        put = [c for c in env.agents["n1"].calls if c[0] == "PUT"]
        assert put[-1][2]["instances"] == 2 and ("n1", "DELETE", "cam") not in EVENTS
        assert placed(env, "cam") == new
        status, described = http("GET", f"{env.url}/v1/apps/cam")
        assert status == 200 and described["placement"]["pieces"][0]["instances"] == 2
        # the control plane refuses what the device cannot hold, changing nothing
        too_many = Placement("cam", (Share("n1/gpu0", 1.0, share.profile, 0.5, 3),), "n1")
        with pytest.raises(Exception, match="hold 1.5 of the device|spatial"):
            loop.run(env.cp.transition("cam", too_many))
        assert placed(env, "cam") == new
    finally:
        env.stop()


def test_a_moved_app_is_served_through_its_first_variants_interface(env: Env) -> None:
    """The control plane learns an app's interface from its first variant's report (its tensors) and sends it
    with every later piece: the move's target serves the app through the same tensors. Learning it asks the
    source agent for nothing."""
    src, dst = admitted_on(env)
    tensors = {"inputs": [{"name": "input", "datatype": "UINT8", "shape": [-1, 224, 224, 3]}],
               "outputs": [{"name": "output", "datatype": "FP32", "shape": [-1, 1000]}]}
    env.agents[src].apps["cam"].update(tensors)  # what a real agent reports of the variant it loaded
    assert env.register(src, "PUT")[0] == 200    # a heartbeat carries it
    assert env.cp.reconciler.interfaces["cam"] == tensors
    env.idle()
    assert [a for a, _ in env.agents[src].puts()] == ["cam"]
    status, body = http("POST", f"{env.url}/v1/apps/cam/move", {"to": [f"{dst}/tpu0"]})
    assert status == 200 and body["result"] == "moved", body
    (sent,) = [b for a, b in env.agents[dst].puts() if a == "cam"]
    assert sent["interface"] == tensors
    # deleted and applied again, the app starts afresh: its next first variant fixes its interface
    assert http("DELETE", f"{env.url}/v1/apps/cam")[0] == 200
    assert "cam" not in env.cp.reconciler.interfaces
