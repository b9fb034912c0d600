"""The adapt loop in the control plane, against the fake agents and gateway of test_runtime_controlplane and a
fake clock: observations from heartbeats and gateways become windows, a sustained surge of an over-contract
app moves it (make before break, at its observed rate), every action is an event (``GET /v1/events``,
``edgemux get events``), describe shows observed beside predicted, calibration replaces a profile, and
``--no-adapt`` only observes. Also the pieces the loop is built from: the latency histogram, the cumulative
counters and the observer's window arithmetic."""

from __future__ import annotations

import json
from dataclasses import replace
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgemux.adapt.calibrate import Observed
from edgemux.adapt.monitor import AppCounters, LatencyHistogram, ServiceMoments
from edgemux.adapt.settings import AdaptSettings
from edgemux.cli.main import main
from edgemux.cluster.specs import parse_cluster
from edgemux.cluster.store import Store
from edgemux.runtime.controlplane.adaptation import Observer
from edgemux.runtime.messages import MessageError, Observations
from edgemux.runtime.tally import Tally
from test_runtime_controlplane import Env, Loop, http

# two nodes, one Edge TPU each, 12 MB so that EfficientNet-S and MobileNetV2 fit on one (Ibis Fig. 20)
CLUSTER = {"apiVersion": "edgemux/v1alpha1", "kind": "Cluster", "metadata": {"name": "two"},
           "spec": {"nodes": [{"name": n, "cpuCores": 4, "memoryMb": 4096,
                               "devices": [{"name": "tpu0", "kind": "edgetpu", "memoryMb": 12,
                                            "profiles": "ibis-edgetpu"}]} for n in ("n1", "n2")]}}
APPS = ("apiVersion: edgemux/v1alpha1\nkind: App\nmetadata: {name: eff}\n"
        "spec: {model: efficientnet-S, rate: 10, burst: 2, slo: {latencyMs: 100, stat: p95}}\n---\n"
        "apiVersion: edgemux/v1alpha1\nkind: App\nmetadata: {name: mob}\n"
        "spec: {model: mobilenet_v2, rate: 10, burst: 2, slo: {latencyMs: 50, stat: p95}}\n")
WINDOW_S = 5.0


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def loop() -> Iterator[Loop]:
    lp = Loop()
    yield lp
    lp.close()


def start(loop: Loop, tmp_path: Path, adapt: AdaptSettings | None) -> tuple[Env, Clock]:
    env = Env(loop, tmp_path, parse_cluster(CLUSTER))
    env.stop()
    clock = Clock()
    # the loop's own period is an hour: the test steps it by hand, on the fake clock
    env.start(drain_grace_s=0.0, reconcile_period_s=0.05, clock=clock,
              adapt=None if adapt is None else adapt)
    env.register_all()
    status, body = env.apply(APPS)
    assert status == 201, body
    # co-locate them on n1/tpu0 (both within their SLOs there at their contracts: the move is checked)
    for app in ("eff", "mob"):
        status, body = http("POST", f"{env.url}/v1/apps/{app}/move", {"to": ["n1/tpu0"]})
        assert status == 200, body
    env.idle()
    return env, clock


class Counts:
    """Cumulative counts of one agent, as its tally would report them."""

    def __init__(self, incarnation: str) -> None:
        self.incarnation = incarnation
        self.apps: dict[str, AppCounters] = {}
        self.profiles: dict[str, Observed] = {}

    def add(self, app: str, rate_rps: float, latency_ms: float, seconds: float = WINDOW_S, refused: int = 0) -> None:
        n = int(round(rate_rps * seconds))
        more = AppCounters(n, refused, 0, LatencyHistogram.of(np.full(n - refused, latency_ms)))
        self.apps[app] = self.apps[app].merge(more) if app in self.apps else more

    def json(self) -> dict[str, Any]:
        return Observations(self.incarnation, dict(self.apps), dict(self.profiles)).to_json()


def heartbeat(env: Env, node: str, counts: Counts) -> None:
    body = {**env.agents[node].registration().to_json(), "observations": counts.json()}
    status, answer = http("PUT", f"{env.url}/v1/agents/{node}", body)
    assert status == 200, answer


def baseline(env: Env) -> Counts:
    """n1's agent's counters, its first report sent (a baseline: the windows count from it) and a step."""
    counts = Counts(env.agents["n1"].incarnation)
    heartbeat(env, "n1", counts)
    env.loop.run(env.cp.adapt_step())
    return counts


def window(env: Env, clock: Clock, counts: Counts, eff: tuple[float, float], mob: tuple[float, float] | None,
           **more: tuple[float, float]) -> None:
    """One window: the apps' traffic (rate req/s, latency ms; ``mob`` None when it is not there) reported by
    n1's agent, then a step."""
    for app, traffic in {"eff": eff, "mob": mob, **more}.items():
        if traffic is not None:
            counts.add(app, *traffic)
    clock.t += WINDOW_S
    heartbeat(env, "n1", counts)
    heartbeat(env, "n2", Counts(env.agents["n2"].incarnation))  # alive, nothing served
    env.loop.run(env.cp.adapt_step())
    env.idle()


def events(env: Env, query: str = "") -> list[dict[str, Any]]:
    """The adaptation's events (the operator's applies and moves left out: tests/test_controlplane_overview.py
    has those)."""
    status, body = http("GET", f"{env.url}/v1/events{query}")
    assert status == 200, body
    return [e for e in body["events"] if e["data"].get("by") != "operator"]


# eff's contract after the move: 150 requests in a 5 s window, at the rate's upper 95 % bound, plus headroom
Z = 1.6448536269514722
NEW_CONTRACT = (150 + Z * Z / 2 + Z * (150 + Z * Z / 4) ** 0.5) / 5 * 1.1
SETTINGS = AdaptSettings(window_s=3600.0, trigger_windows=2, min_samples=20, min_dwell_s=60.0)


def test_a_sustained_surge_moves_the_over_contract_app_at_its_observed_rate(loop: Loop, tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture[str]) -> None:
    env, clock = start(loop, tmp_path, SETTINGS)
    counts = baseline(env)
    window(env, clock, counts, (10, 30), (10, 15))  # calm: nothing
    assert events(env) == []
    # EfficientNet-S sends 3x its contract; its own latency passes its SLO (its bucket queues it), MobileNetV2's
    # stays (the bucket isolates it): one window is not enough...
    window(env, clock, counts, (30, 180), (10, 20))
    assert events(env) == []
    assert env.cp.windows["eff"].rate_rps == pytest.approx(30.0)
    # ...the second is: found, planned, moved to the idle node at 1.1 x the rate's upper 95 % bound (150
    # requests in 5 s: the score bound, 34.3 req/s)
    window(env, clock, counts, (30, 180), (10, 20))
    kinds = [(e["kind"], e["app"]) for e in events(env)]
    assert ("finding", "eff") in kinds and ("move-planned", "eff") in kinds and ("moved", "eff") in kinds, kinds
    planned = next(e for e in events(env) if e["kind"] == "move-planned")
    assert planned["data"]["reason"]["kind"] == "over-contract" and planned["data"]["to"][0]["device"] == "n2/tpu0"
    with Store.open(env.store_path) as s:
        assert [sh.device for sh in s.placements()["eff"].shares] == ["n2/tpu0"]
        assert s.apps()["eff"].rate_rps == pytest.approx(NEW_CONTRACT)  # switched with the placement
        assert [sh.device for sh in s.placements()["mob"].shares] == ["n1/tpu0"]
        assert s.transitions() == {} and s.check() == []
    # the gateway polices the new contract
    assert env.gateway.routes["eff"]["rate_rps"] == pytest.approx(NEW_CONTRACT)
    # still surging, but dwelling: no second move
    window(env, clock, counts, (30, 180), (10, 20))
    assert sum(e["kind"] == "moved" for e in events(env)) == 1
    # the events API filters and pages; the CLI prints them in one table
    assert [e["app"] for e in events(env, "?app=eff")] and all(e["app"] == "eff" for e in events(env, "?app=eff"))
    last = events(env)[-1]["seq"]
    assert events(env, f"?since={last}") == []
    assert main(["get", "events", "--server", env.url]) == 0
    out = capsys.readouterr().out
    assert "move-planned" in out and "moved" in out and "n2/tpu0" in out
    assert main(["get", "events", "--server", env.url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)  # --json prints JSON and nothing else
    assert doc["adapt"] is True and [e["seq"] for e in doc["events"]] == sorted(e["seq"] for e in doc["events"])
    # describe: observed beside predicted
    assert main(["describe", "app", "eff", "--server", env.url]) == 0
    out = capsys.readouterr().out
    assert f"observed (last 5 s window): 30 req/s (contract {NEW_CONTRACT:g})" in out and "predicted p95 ms" in out
    env.stop()


def test_a_raised_contract_is_reclaimed_in_place_and_a_reapply_of_the_same_spec_keeps_it(
        loop: Loop, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """After the surge moved eff at a raised contract, re-applying the same file changes nothing (the spec
    is the declared contract, not the one in force); when eff's load falls back to its declared 10 req/s,
    the raised contract is lowered in place (no model loaded, no move) to 1.1 x the rate's upper bound,
    never below the declared one, and the store keeps the declared rate through it all."""
    env, clock = start(loop, tmp_path, SETTINGS)
    counts = baseline(env)
    for _ in range(3):
        window(env, clock, counts, (30, 180), (10, 20))
    assert env.cp.apps["eff"].rate_rps == pytest.approx(NEW_CONTRACT)
    status, body = env.apply(APPS)  # the same spec again: unchanged, the raised contract stays in force
    assert status == 200 and [r["result"] for r in body["results"]] == ["unchanged", "unchanged"], body
    assert env.cp.apps["eff"].rate_rps == pytest.approx(NEW_CONTRACT)
    assert main(["describe", "app", "eff", "--server", env.url]) == 0
    out = capsys.readouterr().out
    assert f"contract: {NEW_CONTRACT:.4g} req/s in force, set by adaptation (declared 10 req/s" in out
    # the load falls back to the declared rate; past the dwell time two calm windows reclaim
    clock.t += SETTINGS.min_dwell_s
    window(env, clock, counts, (10, 30), (10, 15))
    assert not any(e["kind"] == "contract" for e in events(env))
    window(env, clock, counts, (10, 30), (10, 15))
    planned = [e for e in events(env) if e["kind"] == "move-planned" and e["app"] == "eff"][-1]
    assert planned["data"]["reason"]["kind"] == "under-contract" and "in place" in planned["message"]
    changed = [e for e in events(env) if e["kind"] == "contract"]
    assert [e["app"] for e in changed] == ["eff"] and "(declared 10)" in changed[0]["message"], changed
    lowered = (50 + Z * Z / 2 + Z * (50 + Z * Z / 4) ** 0.5) / 5 * 1.1  # 50 requests in the 5 s window
    assert env.cp.apps["eff"].rate_rps == pytest.approx(lowered) and 10 < lowered < NEW_CONTRACT / 2
    assert env.gateway.routes["eff"]["rate_rps"] == pytest.approx(lowered)
    assert sum(e["kind"] == "moved" for e in events(env)) == 1  # in place: still the one move of the surge
    with Store.open(env.store_path) as s:
        assert [sh.device for sh in s.placements()["eff"].shares] == ["n2/tpu0"]
        assert s.apps()["eff"].rate_rps == pytest.approx(lowered) and s.declared_rates()["eff"] == 10.0
        assert s.transitions() == {} and s.check() == []
    # a changed spec replaces the contract: declared and in force are the new rate
    status, body = env.apply(APPS.replace("{model: efficientnet-S, rate: 10", "{model: efficientnet-S, rate: 8"))
    assert status == 200 and body["results"][0]["result"] == "updated", body
    assert env.cp.apps["eff"].rate_rps == 8.0 and env.cp.declared["eff"] == 8.0
    env.stop()


def test_an_over_contract_split_app_is_repartitioned_over_its_own_devices(loop: Loop, tmp_path: Path) -> None:
    """cam, split 25/75 over both TPUs with eff on n1/tpu0, sends twice its contract while eff misses its SLO:
    the loop gives cam new weights over the same two devices at its new contract (event 'repartitioned',
    no 'moved'), which the store and the gateway's route carry."""
    env = Env(loop, tmp_path, parse_cluster(CLUSTER))
    env.stop()
    clock = Clock()
    env.start(drain_grace_s=0.0, reconcile_period_s=0.05, clock=clock, adapt=SETTINGS)
    env.register_all()
    eff_only = APPS.split("---")[0]
    cam = ("apiVersion: edgemux/v1alpha1\nkind: App\nmetadata: {name: cam}\n"
           "spec: {model: mobilenet_v2, rate: 60, burst: 2, slo: {latencyMs: 40, stat: p95}}\n")
    status, body = env.apply(eff_only + "---\n" + cam)
    assert status == 201, body
    assert http("POST", f"{env.url}/v1/apps/eff/move", {"to": ["n1/tpu0"]})[0] == 200
    status, body = http("POST", f"{env.url}/v1/apps/cam/move",
                        {"to": [{"device": "n1/tpu0", "weight": 0.25}, {"device": "n2/tpu0", "weight": 0.75}]})
    assert status == 200, body
    env.idle()
    counts = baseline(env)
    for _ in range(2):  # eff misses its SLO while cam sends twice its contract
        window(env, clock, counts, (10, 120), None, cam=(120, 45))
    kinds = [(e["kind"], e["app"]) for e in events(env)]
    assert ("repartitioned", "cam") in kinds and not any(k == "moved" for k, _ in kinds), kinds
    planned = next(e for e in events(env) if e["kind"] == "move-planned")
    assert "new weights" in planned["message"] and planned["data"]["reason"]["kind"] == "over-contract"
    with Store.open(env.store_path) as st:
        shares = st.placements()["cam"].shares
        assert [sh.device for sh in shares] == ["n1/tpu0", "n2/tpu0"] and shares[0].weight < 0.25
        assert st.apps()["cam"].rate_rps > 120 and st.declared_rates()["cam"] == 60.0 and st.check() == []
    assert env.gateway.routes["cam"]["rate_rps"] == pytest.approx(env.cp.apps["cam"].rate_rps)
    env.stop()


def test_bad_event_queries_and_options(loop: Loop, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env, _ = start(loop, tmp_path, SETTINGS)
    status, body = http("GET", f"{env.url}/v1/events?since=abc")
    assert status == 400 and "since" in body["error"] and "abc" in body["error"]
    assert main(["get", "apps", "--app", "eff", "--server", env.url]) == 2
    assert "--app: only filters events" in capsys.readouterr().err
    env.stop()


def test_no_adapt_observes_but_never_acts(loop: Loop, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env, clock = start(loop, tmp_path, None)
    counts = baseline(env)
    for _ in range(4):
        window(env, clock, counts, (30, 180), (10, 20))
    status, body = http("GET", f"{env.url}/v1/events")
    assert body["adapt"] is False and [e["kind"] for e in body["events"]] == ["admitted", "admitted"]
    with Store.open(env.store_path) as s:
        assert [sh.device for sh in s.placements()["eff"].shares] == ["n1/tpu0"]
    status, d = http("GET", f"{env.url}/v1/apps/eff")
    assert d["observed"]["rate_rps"] == pytest.approx(30.0) and d["observed"]["at_slo_stat_ms"] == pytest.approx(180, rel=0.01)
    assert main(["get", "events", "--server", env.url]) == 0
    assert "adaptation is off" in capsys.readouterr().out
    env.stop()


def test_calibration_replaces_a_profile_the_agents_measured(loop: Loop, tmp_path: Path) -> None:
    env, clock = start(loop, tmp_path, AdaptSettings(window_s=3600.0, calibration_samples=50))
    counts = Counts(env.agents["n1"].incarnation)
    heartbeat(env, "n1", counts)
    prof = "ibis-edgetpu/mobilenet_v2"
    samples = np.random.default_rng(1).normal(6.0, 0.5, 80)
    counts.profiles[prof] = Observed(ServiceMoments.of(samples), ServiceMoments())
    window(env, clock, counts, (10, 30), (10, 15))
    (ev,) = [e for e in events(env) if e["kind"] == "calibrated"]
    assert ev["data"]["profile"] == prof and "80 requests" in ev["message"] and "catalog: 4.91 ms" in ev["message"]
    status, d = http("GET", f"{env.url}/v1/apps/mob")
    (piece,) = d["placement"]["pieces"]
    assert piece["profile_provenance"].startswith("calibrated")
    # the prediction reads the calibrated figures: mobilenet_v2 now takes ~6 ms, not 4.91
    assert env.cp.catalog.get(prof).exec_time(1).mean_ms == pytest.approx(6.0, abs=0.2)
    # the next window does not announce the same calibration again
    window(env, clock, counts, (10, 30), (10, 15))
    assert sum(e["kind"] == "calibrated" for e in events(env)) == 1
    env.stop()


def test_malformed_observations_are_refused_and_change_nothing(loop: Loop, tmp_path: Path) -> None:
    env, _ = start(loop, tmp_path, SETTINGS)
    body = {**env.agents["n1"].registration().to_json(),
            "observations": {"incarnation": "x", "apps": {"eff": {"arrivals": -3}}}}
    status, answer = http("PUT", f"{env.url}/v1/agents/n1", body)
    assert status == 400 and "observations.apps.eff" in answer["error"] and "arrivals" in answer["error"]
    env.stop()


# ----------------------------------------------------------------------------------------- the pieces


def test_histogram_percentiles_within_one_percent_and_merge_exactly() -> None:
    x = np.random.default_rng(0).gamma(2.0, 10.0, 20_000)
    h = LatencyHistogram.of(x)
    s = h.summary()
    assert s is not None and s.count == 20_000 and s.mean_ms == pytest.approx(float(x.mean()))
    for q, got in ((50, s.p50_ms), (95, s.p95_ms), (99, s.p99_ms)):
        assert got == pytest.approx(float(np.percentile(x, q)), rel=0.011)
    a, b = LatencyHistogram.of(x[:7000]), LatencyHistogram.of(x[7000:])
    assert a.merge(b).buckets == h.buckets and h.minus(a).buckets == b.buckets
    assert LatencyHistogram.from_json(h.to_json()) == h
    assert LatencyHistogram().summary() is None
    with pytest.raises(ValueError, match="went down"):
        a.minus(h)
    for bad, needle in [({"buckets": {"x": 1}}, "not an integer"), ({"buckets": {"3": -1}}, "count >= 0"),
                        ({"total_ms": -1}, "total_ms"), ([], "expected")]:
        with pytest.raises(ValueError, match=needle):
            LatencyHistogram.from_json(bad)


def test_tally_counts_what_a_report_carries() -> None:
    t = Tally("inc")
    for ms in (10.0, 20.0, 30.0):
        t.answered("a", ms)
    t.refused("a")
    t.failed("a")
    t.served("a", "p", 0.0, 5.0, False)
    t.served("a", "p", 0.0, 7.0, False)
    t.served("a", "p", 0.0, 15.0, True)
    obs = t.observations()
    c = obs.apps["a"]
    assert (c.arrivals, c.refused, c.failed, c.latency.count) == (5, 1, 1, 3)
    assert c.latency.total_ms == pytest.approx(60.0)
    o = obs.profiles["p"]
    assert (o.exec.n, o.exec.mean_ms, o.exec.variance_ms2) == (2, 6.0, pytest.approx(2.0))
    assert o.switched.n == 1 and o.switched.mean_ms == 15.0
    assert Observations.from_json(obs.to_json()) == obs
    with pytest.raises(MessageError, match="observations.profiles.p"):
        Observations.from_json({"incarnation": "i", "profiles": {"p": {"exec": [1, 2]}}})


def test_observer_windows_baseline_restart_and_both_views_added() -> None:
    ob = Observer()

    def report(source: str, inc: str, arrivals: int, ms: float, gateway: bool = False) -> None:
        ob.report(source, Observations(inc, {"a": AppCounters(arrivals, 0, 0, LatencyHistogram.of([ms] * arrivals))}),
                  gateway=gateway)

    report("agent:n1", "i1", 100, 10.0)  # baseline: counted before the control plane heard of it
    # an app nobody reported requests of sent nothing: an empty window (as the simulator's monitor gives)
    (empty,) = ob.close(["a"], 0.0, 5.0).values()
    assert (empty.app, empty.arrivals, empty.latency, empty.rate_rps) == ("a", 0, None, 0.0)
    report("agent:n1", "i1", 150, 10.0)
    w = ob.close(["a"], 5.0, 10.0)["a"]
    assert w.arrivals == 50 and w.rate_rps == pytest.approx(10.0)
    report("agent:n1", "i2", 20, 10.0)  # the agent restarted: its counts start from zero
    assert ob.close(["a"], 10.0, 15.0)["a"].arrivals == 20
    # a gateway's requests and those a client sent an agent directly are disjoint (an agent does not count
    # what a gateway forwards it): the window adds them up, each with its own latency
    report("gateway:g", "g1", 0, 1.0, gateway=True)
    report("gateway:g", "g1", 40, 99.0, gateway=True)
    report("agent:n1", "i2", 50, 10.0)  # 30 direct requests since its last report
    w = ob.close(["a", "unknown"], 15.0, 20.0)
    assert list(w) == ["a", "unknown"] and w["unknown"].arrivals == 0
    assert w["a"].arrivals == 70 and w["a"].latency is not None
    assert w["a"].latency.count == 70 and w["a"].latency.p50_ms == pytest.approx(99.0, rel=0.01)
    assert w["a"].latency.mean_ms == pytest.approx((40 * 99.0 + 30 * 10.0) / 70)
    # gateway traffic alone: the gateway's view
    report("gateway:g", "g1", 45, 99.0, gateway=True)
    w = ob.close(["a"], 20.0, 25.0)
    assert w["a"].arrivals == 5 and w["a"].latency is not None
    assert w["a"].latency.p50_ms == pytest.approx(99.0, rel=0.01)


@pytest.mark.parametrize("phase", ["loading", "draining"])
def test_kill_9_during_an_adapt_migration_loses_no_app(loop: Loop, tmp_path: Path, phase: str) -> None:
    """A real control plane (a child process, its adapt loop on 0.3 s windows) moves eff off the hotspot
    when n1's agent reports the surge; it is killed (SIGKILL) while the move loads eff on n2 (phase
    loading) or after the switch, while n1 drains (phase draining). A control plane restarted on the same
    store keeps both apps, each in exactly one placement: eff where it was with its old contract when the
    switch had not happened, else on n2 with the contract it was re-admitted at (switched in the same
    store transaction as the placement)."""
    import threading

    from test_runtime_move import _make_event, _start_cp, fake_cluster, register_fakes, until

    cluster_file, agents, gateway, store = fake_cluster(loop, tmp_path, CLUSTER)
    # two windows in a row, as by default: the first window of a surge has only part of it, and a move
    # planned on it would re-admit eff at too low a rate (in place), then dwell
    adapt = ("--policy", "ibis", "--adapt-option", "window_s=0.3", "--adapt-option", "trigger_windows=2",
             "--adapt-option", "min_samples=5")
    counts = Counts(agents["n1"].incarnation)
    last = [time.monotonic()]

    def report(url: str, surge: bool) -> None:
        if surge:  # the time since the last report of eff at 3x its contract, over its SLO; mob within its own
            now = time.monotonic()
            counts.add("eff", 30, 180, seconds=now - last[0])
            counts.add("mob", 10, 20, seconds=now - last[0])
            last[0] = now
        for n, a in agents.items():
            obs = counts.json() if n == "n1" else Counts(a.incarnation).json()
            http("PUT", f"{url}/v1/agents/{n}", {**a.registration().to_json(), "heartbeat_s": 60.0,
                                                 "observations": obs})

    proc, url = _start_cp(store, cluster_file, gateway.url, drain_s=60.0, extra=adapt)
    try:
        register_fakes(url, agents)
        assert http("POST", f"{url}/v1/apps", APPS, "application/yaml")[0] == 201
        until(lambda: "eff" in gateway.routes and "mob" in gateway.routes)
        with Store.open(store) as s:  # the ibis policy packs both on one device: the hotspot to be
            assert {sh.device for a in ("eff", "mob") for sh in s.placements()[a].shares} == {"n1/tpu0"}
        if phase == "loading":
            hold = loop.run(_make_event())
            agents["n2"].put_hold = hold
        moved = (lambda: "eff" in agents["n2"].apps) if phase == "loading" else (
            lambda: {e["url"] for e in gateway.routes["eff"]["endpoints"]} == {agents["n2"].url})
        stop = threading.Event()

        def surge() -> None:
            while not stop.is_set():
                try:
                    report(url, surge=True)
                except OSError:  # the control plane was killed
                    return
                stop.wait(0.1)

        reporter = threading.Thread(target=surge, daemon=True)
        reporter.start()
        until(moved, timeout_s=30.0)
        proc.kill()
        proc.wait(10)
        stop.set()
        reporter.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    if phase == "loading":
        agents["n2"].put_hold = None
        loop.loop.call_soon_threadsafe(hold.set)
    assert "eff" in agents["n1"].apps  # nothing was unloaded before the kill

    proc, url = _start_cp(store, cluster_file, gateway.url, drain_s=0.2, extra=("--no-adapt",))
    try:
        register_fakes(url, agents)
        keep, drop = ("n1", "n2") if phase == "loading" else ("n2", "n1")
        until(lambda: "eff" not in agents[drop].apps)
        until(lambda: http("GET", f"{url}/v1/apps/eff")[1].get("status") == "ready")
        assert [n for n, a in agents.items() if "eff" in a.apps] == [keep]
        assert {e["url"] for e in gateway.routes["eff"]["endpoints"]} == {agents[keep].url}
        until(lambda: not Store.open(store).transitions())
        with Store.open(store) as s:
            assert set(s.apps()) == {"eff", "mob"} and s.check() == []
            assert [sh.device for sh in s.placements()["eff"].shares] == [f"{keep}/tpu0"]
            assert [sh.device for sh in s.placements()["mob"].shares] == ["n1/tpu0"]
            contract = s.apps()["eff"].rate_rps
        if phase == "loading":
            assert contract == pytest.approx(10.0)
        else:  # re-admitted above its contract; store, route and the agent's policing say the same rate
            assert contract > 11.0
            assert agents["n2"].apps["eff"]["rate_rps"] == pytest.approx(contract)
        assert gateway.routes["eff"]["rate_rps"] == pytest.approx(contract)
    finally:
        proc.terminate()
        proc.wait(20)


PROBE = ("apiVersion: edgemux/v1alpha1\nkind: App\nmetadata: {name: NAME}\n"
         "spec: {model: mobilenet_v2, rate: 1, burst: 1, slo: {latencyMs: 12, stat: mean}}\n")


def test_calibration_from_end_to_end_windows_follows_a_drifting_device(loop: Loop, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """No device-side times at all: n1's agent reports only its apps' windows (rate, latency) while its Edge
    TPU runs MobileNetV2 twice, then three times, as slow as the catalog says (the latencies the estimator
    gives for those devices). With ``fit_windows`` the control plane fits the profile to the windows each
    cycle: the prediction follows the drift, describe shows the fit beside the catalog, and admission uses
    it (an app the catalog admits is refused once the device has slowed)."""
    env, clock = start(loop, tmp_path, replace(SETTINGS, fit_windows=1))
    prof = "ibis-edgetpu/mobilenet_v2"
    catalog_ms = env.cp.catalog.get(prof).exec_time(1).mean_ms
    status, body = env.apply(PROBE.replace("NAME", "probe1"))
    assert status == 201, body                                   # the catalog's MobileNetV2 meets 12 ms
    counts = baseline(env)
    window(env, clock, counts, (10, 26.1), (10, 27.9))           # MobileNetV2 at 2x (estimator: 26.1, 27.9 ms)
    fitted = env.cp.catalog.get(prof)
    assert fitted.provenance.source == "fitted" and fitted.exec_time(1).mean_ms == pytest.approx(2 * catalog_ms, rel=0.1)
    cal = {e["data"]["profile"]: e["message"] for e in events(env) if e["kind"] == "calibrated"}
    assert "x2.000" in cal[prof] and "fitted to the end-to-end latency of 50 requests of mob" in cal[prof], cal
    assert set(cal) == {prof, "ibis-edgetpu/efficientnet-S"}     # eff's profile is fitted too (x1.0)
    window(env, clock, counts, (10, 34.0), (10, 45.9))           # ... then at 3x: the fit follows
    assert env.cp.catalog.get(prof).exec_time(1).mean_ms == pytest.approx(3 * catalog_ms, rel=0.1)
    assert sum(e["kind"] == "calibrated" for e in events(env)) == 2  # announced once each, followed every window
    # describe: the fitted figures beside the catalog's
    assert main(["describe", "app", "mob", "--server", env.url]) == 0
    out = capsys.readouterr().out
    assert "fitted" in out and f"catalog: {catalog_ms:.3g} ms" in out, out
    # admission reads the fitted profile: the same probe is now refused (a 3x MobileNetV2 misses 12 ms)
    status, body = env.apply(PROBE.replace("NAME", "probe2"))
    assert status != 201 and "probe2" in json.dumps(body), body
    env.stop()


def test_the_serving_path_is_calibrated_from_entry_and_device_times_and_admission_uses_it(
        loop: Loop, tmp_path: Path) -> None:
    """The agents report their apps' end-to-end windows and, per app, the queueing + service their devices
    spent (``Observations.device``). Each window the control plane sets each node's serving path to the
    answer-weighted difference (``adapt.serving``: the declared 0 ms counting as 20 answers, what came before
    at half weight): 3 ms a request, then 8 ms when the serving path slows. Predictions carry it end to end
    (describe), and admission uses it: a probe with a 12 ms mean SLO is admitted while the path is short and
    refused on every device once it is long."""
    from edgemux.adapt.serving import PRIOR_ANSWERS, DeviceTime

    env, clock = start(loop, tmp_path, None)
    status, body = env.apply(PROBE.replace("NAME", "probe1"))
    assert status == 201 and "n2/tpu0" in json.dumps(body), body
    counts = {n: Counts(env.agents[n].incarnation) for n in ("n1", "n2")}
    spent: dict[str, dict[str, DeviceTime]] = {"n1": {}, "n2": {}}
    here = {"n1": (("eff", 10.0, 20.0), ("mob", 10.0, 6.0)), "n2": (("probe1", 10.0, 6.0),)}

    def report(node: str) -> None:
        c = counts[node]
        body = {**env.agents[node].registration().to_json(),
                "observations": Observations(c.incarnation, dict(c.apps), {}, dict(spent[node])).to_json()}
        status, answer = http("PUT", f"{env.url}/v1/agents/{node}", body)
        assert status == 200, answer

    for node in counts:
        report(node)                 # the baselines
    env.loop.run(env.cp.adapt_step())

    def served(serving_ms: float) -> None:
        # 50 answers per app; entry latency = the device's time + the serving path
        for node, apps in here.items():
            for app, rate, device_ms in apps:
                counts[node].add(app, rate, device_ms + serving_ms)
                spent[node][app] = spent[node].get(app, DeviceTime()).merge(DeviceTime(50, 50 * device_ms))
            report(node)
        clock.t += WINDOW_S
        env.loop.run(env.cp.adapt_step())
        env.idle()

    before = env.cp.describe("mob")["placement"]["pieces"][0]["predicted"]
    served(3.0)
    first = {"n1": 100 * 3.0 / (PRIOR_ANSWERS + 100), "n2": 50 * 3.0 / (PRIOR_ANSWERS + 50)}
    for node, ms in first.items():
        assert env.cp.cluster.devices[f"{node}/tpu0"].serving_ms == pytest.approx(ms, abs=1e-3)
    served(8.0)
    second = (0.5 * 300 + 800) / (PRIOR_ANSWERS + 0.5 * 100 + 100)
    assert env.cp.cluster.devices["n1/tpu0"].serving_ms == pytest.approx(second, abs=1e-3)
    after = env.cp.describe("mob")["placement"]["pieces"][0]["predicted"]
    assert after["serving_ms"] == pytest.approx(second, abs=1e-3) and "observed answers" in after["serving_from"]
    assert after["mean_ms"] == pytest.approx(before["mean_ms"] + second, abs=1e-3)  # end to end: the path added
    assert after["device_ms"] == pytest.approx(before["device_ms"])
    status, body = env.apply(PROBE.replace("NAME", "probe2"))
    assert status != 201 and "slo" in json.dumps(body), body
    env.stop()


def test_an_agents_round_trip_at_registration_is_its_nodes_serving_path_until_requests_say_more(
        loop: Loop, tmp_path: Path) -> None:
    """With ``probe_serving`` (``edgemux controlplane``'s) the control plane times each registering agent's
    health check: the node's serving path starts there (``describe`` says so); a node whose spec declares one
    keeps it."""
    declared = {**CLUSTER, "spec": {"nodes": [{**CLUSTER["spec"]["nodes"][0], "servingMs": 7.5},
                                              CLUSTER["spec"]["nodes"][1]]}}
    env = Env(loop, tmp_path, parse_cluster(declared))
    env.stop()
    env.start(drain_grace_s=0.0, reconcile_period_s=0.05, probe_serving=True)
    env.register_all()
    paths = env.cp.adaptation.serving
    assert paths["n1"].source == "declared" and env.cp.cluster.devices["n1/tpu0"].serving_ms == 7.5
    assert paths["n2"].source == "probe" and 0.0 < paths["n2"].prior_ms < 1000.0
    assert env.cp.cluster.devices["n2/tpu0"].serving_ms == pytest.approx(paths["n2"].prior_ms, abs=1e-3)
    status, body = env.apply(PROBE.replace("NAME", "p"))
    assert status == 201, body
    piece = env.cp.describe("p")["placement"]["pieces"][0]
    assert piece["predicted"]["serving_from"].startswith("start-up probe" if piece["node"] == "n2" else "declared")
    env.stop()
