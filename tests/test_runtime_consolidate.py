"""Consolidation on the running control plane, against the fake agents and gateway of test_runtime_controlplane
and a fake clock: at low load an empty node is switched off through its agent and a node with tenants is drained
make before break and then switched off; admission and the adapt loop never place on a switched-off or waking
node; an app that finds no room wakes a node (the apply says when to come back, with Retry-After); a woken node
serves after its wake-up time; a failed drain stops; a restarted control plane finds the nodes it switched off
from the agents' reports; a node is never switched off while it holds a tenant. Bad options are one line."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from edgemux.adapt.consolidate import ConsolidationSettings
from edgemux.adapt.settings import AdaptSettings
from edgemux.cli.main import main
from edgemux.runtime.auth import auth_headers
from edgemux.cluster.specs import parse_cluster
from test_runtime_adapt import CLUSTER, WINDOW_S, Clock, Counts, events, heartbeat
from test_runtime_controlplane import EVENTS, Env, Loop, http
from test_runtime_engine import wait_for

SETTINGS = AdaptSettings(window_s=3600.0, trigger_windows=2, min_samples=20, min_dwell_s=60.0)
WAKE_S = 30.0


def app_yaml(name: str, model: str, rate: float, slo_ms: float) -> str:
    return (f"apiVersion: edgemux/v1alpha1\nkind: App\nmetadata: {{name: {name}}}\n"
            f"spec: {{model: {model}, rate: {rate}, burst: 2, slo: {{latencyMs: {slo_ms}, stat: p95}}}}\n")


def start(loop: Loop, tmp_path: Path, env: Env | None = None) -> tuple[Env, Clock]:
    if env is None:
        env = Env(loop, tmp_path, parse_cluster(CLUSTER))
    env.stop()
    clock = Clock()
    env.start(drain_grace_s=0.0, reconcile_period_s=0.05, clock=clock, adapt=SETTINGS,
              consolidation=ConsolidationSettings(), wake_s=WAKE_S)
    env.register_all()
    return env, clock


def place(env: Env, name: str, model: str, rate: float, slo_ms: float, where: str) -> None:
    status, body = env.apply(app_yaml(name, model, rate, slo_ms))
    assert status == 201, body
    status, body = http("POST", f"{env.url}/v1/apps/{name}/move", {"to": [where]})
    assert status == 200, body
    env.idle()


def step(env: Env, clock: Clock, advance_s: float = WINDOW_S) -> None:
    """One window with no traffic: both agents heartbeat, then an adapt step (and its consolidation step)."""
    clock.t += advance_s
    for node in ("n1", "n2"):
        heartbeat(env, node, Counts(env.agents[node].incarnation))
    env.loop.run(env.cp.adapt_step())
    env.idle()


def power(env: Env) -> dict[str, str]:
    status, body = http("GET", f"{env.url}/v1/agents")
    assert status == 200, body
    assert {a["node"]: a["power"] for a in body["agents"]} == {n: p["state"] for n, p in body["power"].items()}
    return {n: p["state"] for n, p in body["power"].items()}


def power_events(env: Env) -> list[tuple[str, str]]:
    return [(e["data"]["node"], e["data"]["state"]) for e in events(env) if e["kind"] == "power"]


@pytest.fixture
def loop() -> Any:
    lp = Loop()
    yield lp
    lp.close()


def test_an_empty_node_is_switched_off_and_a_new_app_wakes_it(loop: Loop, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    env, clock = start(loop, tmp_path)
    place(env, "eff", "efficientnet-S", 10, 100, "n1/tpu0")
    place(env, "mob", "mobilenet_v2", 10, 50, "n1/tpu0")
    assert power(env) == {"n1": "on", "n2": "on"}
    step(env, clock)
    # n2 holds nothing and the load is low: switched off at once (no drain needed), through its agent
    assert power(env) == {"n1": "on", "n2": "off"}
    assert env.agents["n2"].power == "off" and env.agents["n1"].power == "on"
    assert power_events(env) == [("n2", "off")]
    assert main(["get", "agents", "--server", env.url]) == 0
    out = capsys.readouterr().out
    assert "power" in out and "off" in out
    # min_on: the last node on stays on
    step(env, clock)
    assert power(env) == {"n1": "on", "n2": "off"}

    # a third app does not fit on n1 (three tenants of 12 MB): it is refused, n2 wakes, the answer says when
    # to come back
    status, headers, body = http_full("POST", f"{env.url}/v1/apps", app_yaml("inc", "inception_v3", 5, 500))
    assert status == 409, body
    (result,) = body["results"]
    assert result["result"] == "rejected" and result["retry_after_s"] == pytest.approx(WAKE_S)
    assert "node n2 is waking to make room (it serves in about 30 s): apply again then" in result["rejection"]["message"]
    assert headers["Retry-After"] == "30"
    assert power(env) == {"n1": "on", "n2": "waking"}
    env.idle()
    assert env.agents["n2"].power == "on"  # the devices are switched on at once; the node boots meanwhile
    # still waking: nothing is placed there yet, and a second refused apply does not wake anything more
    clock.t += 10
    status, body = env.apply(app_yaml("inc", "inception_v3", 5, 500))
    assert status == 409 and body["results"][0]["retry_after_s"] == pytest.approx(WAKE_S - 10)
    assert [s for _, s in power_events(env)] == ["off", "waking"]
    # after its wake-up time it serves: the same apply is admitted there
    clock.t += WAKE_S
    status, body = env.apply(app_yaml("inc", "inception_v3", 5, 500))
    assert status == 201, body
    assert [s["device"] for s in body["results"][0]["placement"]["shares"]] == ["n2/tpu0"]
    assert power(env) == {"n1": "on", "n2": "on"}
    assert power_events(env)[-1] == ("n2", "on")
    env.stop()


def http_full(method: str, url: str, body: str, token: str | None = None) -> tuple[int, dict[str, str], Any]:
    """A YAML request whose answer's headers are wanted too: (status, headers, JSON body)."""
    req = urllib.request.Request(url, data=body.encode(), method=method,
                                 headers={"Content-Type": "application/yaml", **auth_headers(token)})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read())


def test_a_node_with_tenants_is_drained_make_before_break_then_switched_off(loop: Loop, tmp_path: Path) -> None:
    env, clock = start(loop, tmp_path)
    place(env, "eff", "efficientnet-S", 10, 100, "n1/tpu0")
    place(env, "mob", "mobilenet_v2", 10, 50, "n2/tpu0")
    EVENTS.clear()
    step(env, clock)
    # one node is drained: its app moves to the other (fewest tenants, then least work: mob's node)
    assert power(env)["n2"] == "draining", events(env)
    kinds = [e["kind"] for e in events(env)]
    assert kinds[:3] == ["move-planned", "power", "moved"], kinds
    planned = next(e for e in events(env) if e["kind"] == "move-planned")
    assert planned["app"] == "mob" and planned["data"]["reason"]["kind"] == "consolidate"
    route = http("GET", f"{env.url}/v1/routes/mob")[1]
    assert [e["node"] for e in route["endpoints"]] == ["n1"]
    # make before break: mob loaded on n1 before it left n2; n2 is switched off only at the next step, after
    step(env, clock)
    assert power(env) == {"n1": "on", "n2": "off"}
    order = [(n, m.split()[0], x) for n, m, x in EVENTS if x in ("mob", "off")]
    # loaded where it goes, the route switched, unloaded where it was, and only then the node off
    assert order == [("n1", "PUT", "mob"), ("gateway", "PUT", "mob"), ("n2", "DELETE", "mob"),
                     ("n2", "POWER", "off")], order
    env.stop()


def test_a_failed_drain_stops_and_the_node_stays_on(loop: Loop, tmp_path: Path) -> None:
    env, clock = start(loop, tmp_path)
    place(env, "eff", "efficientnet-S", 10, 100, "n1/tpu0")
    place(env, "mob", "mobilenet_v2", 10, 50, "n2/tpu0")
    env.agents["n1"].put_status = 507  # n1 cannot load mob: the drain's move fails and rolls back
    step(env, clock)
    assert [e["kind"] for e in events(env)][:3] == ["move-planned", "power", "move-failed"]
    assert power(env)["n2"] == "draining"
    step(env, clock)
    # mob still on n2 with no move in flight: the drain stops; n2 was never switched off under it
    assert power(env) == {"n1": "on", "n2": "on"}
    assert power_events(env)[-1] == ("n2", "on")
    last = [e["message"] for e in events(env) if e["kind"] == "power"][-1]
    assert "n2 still holds mob with no move in flight: it stops draining" in last, last
    assert ("POWER", "tpu0", "off") not in env.agents["n2"].calls
    assert http("GET", f"{env.url}/v1/routes/mob")[1]["endpoints"][0]["node"] == "n2"
    env.stop()


def test_a_switched_off_node_takes_no_move_and_a_restart_finds_it_off(loop: Loop, tmp_path: Path) -> None:
    env, clock = start(loop, tmp_path)
    place(env, "eff", "efficientnet-S", 10, 100, "n1/tpu0")
    step(env, clock)
    assert power(env) == {"n1": "on", "n2": "off"}
    status, body = http("POST", f"{env.url}/v1/apps/eff/move", {"to": ["n2/tpu0"]})
    assert status == 409 and "node n2 is off: it takes no placement until it is on" in body["error"]
    # a new control plane on the same store: the agents' reports say n2's devices are off
    env, clock = start(loop, tmp_path, env)
    assert power(env) == {"n1": "on", "n2": "off"}
    assert power_events(env) == [("n2", "off")]
    assert "every device switched off" in next(e["message"] for e in events(env) if e["kind"] == "power")
    # an agent that restarted (its devices on) brings its node back on
    env.agents["n2"].power = "on"
    env.agents["n2"].incarnation = "restarted"
    assert env.register("n2")[0] == 200
    assert power(env)["n2"] == "on"
    env.stop()


def test_adaptation_does_not_plan_onto_a_switched_off_node(loop: Loop, tmp_path: Path) -> None:
    """A surge of an over-contract app on n1 with n2 off: the rising utilization wakes n2 ahead of demand (its
    trend over the wake-up time passes wake_above), and while n2 boots the Ibis rule finds no room on the nodes
    that are on: the move is refused, not planned onto the waking node."""
    env, clock = start(loop, tmp_path)
    place(env, "eff", "efficientnet-S", 10, 100, "n1/tpu0")
    place(env, "mob", "mobilenet_v2", 10, 50, "n1/tpu0")
    step(env, clock)
    assert power(env)["n2"] == "off"
    counts = Counts(env.agents["n1"].incarnation)
    heartbeat(env, "n1", counts)
    for _ in range(2):
        counts.add("eff", 30, 180)
        counts.add("mob", 10, 20)
        clock.t += WINDOW_S
        heartbeat(env, "n1", counts)
        heartbeat(env, "n2", Counts(env.agents["n2"].incarnation))
        env.loop.run(env.cp.adapt_step())
        env.idle()
    kinds = [e["kind"] for e in events(env)]
    assert "moved" not in kinds and "move-refused" in kinds, kinds
    assert power(env)["n2"] == "waking" and power_events(env)[-1] == ("n2", "waking")
    wake = next(e["message"] for e in events(env) if e["kind"] == "power" and e["data"]["state"] == "waking")
    assert "wake n2: utilization" in wake and "> 0.6" in wake, wake
    assert kinds.index("power", 1) < kinds.index("move-refused")  # refused while n2 was waking
    env.stop()


@pytest.mark.parametrize(("args", "words"), [
    (["--consolidate-option", "wake_s=5"], "given without --consolidate"),
    (["--consolidate", "--no-adapt"], "needs adaptation"),
    (["--consolidate", "--consolidate-option", "wake_s=-1"], "wake_s: expected a wake-up time >= 0 s, got -1"),
    (["--consolidate", "--consolidate-option", "sleepy=1"], "unknown consolidation setting 'sleepy'"),
    (["--consolidate", "--consolidate-option", "min_on=0.5"], "min_on: expected an integer, got '0.5'"),
    (["--consolidate", "--consolidate-option", "min_on=0"], "min_on must be an integer >= 1"),
    (["--consolidate", "--consolidate-option", "wake_above=0.2"], "must be below wake_above"),
    (["--consolidate", "--consolidate-option", "wake_s"], "expected NAME=VALUE, got 'wake_s'"),
])
@pytest.mark.parametrize("command", ["controlplane", "up"])
def test_bad_consolidation_options_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str,
                                                args: list[str], words: str) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(json.dumps(CLUSTER))
    base = (["controlplane", "--cluster", str(cluster), "--store", str(tmp_path / "s.db")] if command == "controlplane"
            else ["up", "--cluster", str(cluster)])
    assert main(base + args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err, err


# ------------------------------------------------------------------------------------- real processes


def _get(url: str, token: str | None) -> Any:
    with urllib.request.urlopen(urllib.request.Request(url, headers=auth_headers(token)), timeout=60) as resp:
        return json.loads(resp.read())


def test_up_with_consolidation_switches_a_real_agents_devices_off_and_wakes_them(tmp_path: Path) -> None:
    """``edgemux up --consolidate`` on two emulated Edge TPU nodes (real processes): with two light apps the
    control plane empties one node make before break and switches its device off through its agent (which
    then reports it off and draws nothing); a third app that does not fit on the node left on wakes it (409
    with Retry-After), and applied again after the wake-up time it is placed there."""
    from edgemux.engines.local import Engine

    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(json.dumps(CLUSTER))
    eng = Engine(cluster, listen_timeout_s=120.0, ready_timeout_s=120.0, heartbeat_s=0.5,
                 adapt_options=["window_s=1"], consolidate=True, consolidate_options=["wake_s=1"])
    with eng:
        cp = eng.controlplane_url
        for name, model, rate, slo in (("eff", "efficientnet-S", 10, 100), ("mob", "mobilenet_v2", 10, 50)):
            status, _, body = http_full("POST", f"{cp}/v1/apps", app_yaml(name, model, rate, slo), eng.token)
            assert status == 201, body

        def one_off() -> str | None:
            states = {a["node"]: a["power"] for a in _get(f"{cp}/v1/agents", eng.token)["agents"]}
            off = [n for n, s in states.items() if s == "off"]
            return off[0] if off and set(states.values()) == {"on", "off"} else None

        off = wait_for("a node switched off", one_off)
        on = ({"n1", "n2"} - {off}).pop()
        apps = {a["name"]: a for a in _get(f"{cp}/v1/apps", eng.token)["apps"]}
        assert all(s["device"] == f"{on}/tpu0" for a in apps.values() for s in a["shares"]), apps
        agent = eng.agent_urls[off]
        (tpu,) = _get(f"{agent}/v1/node", eng.token)["devices"]
        assert tpu["power_state"] == "off" and tpu["power_w"] == 0.0 and tpu["loaded_models"] == []
        kinds = [e["kind"] for e in _get(f"{cp}/v1/events", eng.token)["events"]]
        assert "power" in kinds

        # the third app has no room on the node left on: it wakes the other one
        status, headers, body = http_full("POST", f"{cp}/v1/apps", app_yaml("inc", "inception_v3", 5, 500),
                                          eng.token)
        assert status == 409 and headers.get("Retry-After") == "1", (status, headers, body)
        assert f"node {off} is waking" in body["results"][0]["rejection"]["message"]

        def placed() -> Any:
            status, _, body = http_full("POST", f"{cp}/v1/apps", app_yaml("inc", "inception_v3", 5, 500), eng.token)
            return body if status == 201 else None

        body = wait_for("inc admitted on the woken node", placed)
        assert [s["device"] for s in body["results"][0]["placement"]["shares"]] == [f"{off}/tpu0"]
        (tpu,) = _get(f"{agent}/v1/node", eng.token)["devices"]
        assert tpu["power_state"] == "on"
        codes = eng.stop()
    assert set(codes.values()) == {0}
