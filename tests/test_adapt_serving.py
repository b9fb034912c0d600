"""The serving path per node (``adapt.serving``): measured from the entry's and the device's times of the same
window, calibrated as a decaying weighted mean with the declared figure as its prior, carried by every
policy and the simulator as a constant delay end to end, and reported by the agents' tallies."""

from __future__ import annotations

import numpy as np
import pytest

from edgemux.adapt.monitor import AppCounters, AppWindow, LatencyHistogram
from edgemux.adapt.serving import DECAY, PRIOR_ANSWERS, DeviceTime, ServingPath, node_samples, update_serving
from edgemux.cluster.state import App, Cluster, Device, Node, Placement, Share, Slo
from edgemux.cluster.workload import Discipline
from edgemux.perf.device import predict_device
from edgemux.policies import Snapshot, get
from edgemux.policies.base import device_spec
from edgemux.profiles.types import DeviceKind
from edgemux.runtime.messages import MessageError, Observations
from edgemux.runtime.tally import Tally


def cluster(serving_ms: float = 0.0) -> Cluster:
    def node(name: str) -> Node:
        return Node(name, 4, 4096, (Device(name, "tpu0", DeviceKind.EDGETPU, Discipline.FCFS, 12.0,
                                           "ibis-edgetpu"),))
    return Cluster((node("n1"), node("n2"))).with_serving({"n1": serving_ms})


def snapshot() -> Snapshot:
    apps = {"a": App("a", "mobilenet_v2", 10, Slo(50)), "b": App("b", "mobilenet_v2", 10, Slo(50)),
            "split": App("split", "mobilenet_v2", 10, Slo(50)),
            "cpu": App("cpu", "mobilenet_v2", 10, Slo(50), cpu_cores=1, cpu_ms=2)}
    p = "ibis-edgetpu/mobilenet_v2"
    placements = {"a": Placement("a", (Share("n1/tpu0", 1.0, p),)), "b": Placement("b", (Share("n2/tpu0", 1.0, p),)),
                  "split": Placement("split", (Share("n1/tpu0", 0.5, p), Share("n2/tpu0", 0.5, p))),
                  "cpu": Placement("cpu", (Share("n1/tpu0", 1.0, p),), "n1")}
    return Snapshot(cluster(), apps, placements)


def test_a_node_sample_is_the_entry_mean_less_the_device_mean_over_its_own_apps() -> None:
    windows = {name: AppWindow.of(name, 0.0, 5.0, np.full(40, 9.0)) for name in ("a", "b", "split", "cpu")}
    device = {"a": DeviceTime(40, 40 * 6.0), "b": DeviceTime(30, 30 * 5.0), "split": DeviceTime(40, 40 * 1.0),
              "cpu": DeviceTime(40, 40 * 1.0)}
    got = node_samples(snapshot(), windows, device)
    # a: 40 x (9 - 6); b: min(40, 30) x (9 - 5); split (two nodes) and cpu (a CPU stage) left out
    assert got == {"n1": (40, pytest.approx(120.0)), "n2": (30, pytest.approx(120.0))}
    assert node_samples(snapshot(), windows, {}) == {}
    # a policing wait is the app's (over its contract), not the path's: 40 answers that waited 2 ms each
    waited = {**windows, "a": AppCounters(40, 0, 0, LatencyHistogram.of(np.full(40, 9.0)), 80.0).window("a", 0, 5)}
    assert node_samples(snapshot(), waited, device)["n1"] == (40, pytest.approx(40 * (9.0 - 2.0 - 6.0)))
    assert node_samples(snapshot(), {"a": AppWindow.of("a", 0.0, 5.0, [])}, device) == {}


def test_the_estimate_weighs_the_prior_as_answers_and_forgets_at_the_decay() -> None:
    p = ServingPath(2.0)
    assert p.ms == 2.0 and "none observed" in p.provenance()
    p = p.observe(80, 80 * 4.0)
    assert p.ms == pytest.approx((PRIOR_ANSWERS * 2.0 + 320.0) / (PRIOR_ANSWERS + 80))
    q = p.observe(80, 80 * 10.0)
    assert q.ms == pytest.approx((PRIOR_ANSWERS * 2.0 + DECAY * 320.0 + 800.0) / (PRIOR_ANSWERS + DECAY * 80 + 80))
    for _ in range(12):  # a drift is followed: the old windows fade
        q = q.observe(80, 80 * 10.0)
    assert q.ms == pytest.approx(10.0, rel=0.15) and "12" not in q.provenance().split("windows")[0][-3:]
    assert ServingPath(0.0).observe(10, -50.0).ms == 0.0  # never below 0
    probed = ServingPath(0.0).probed(1.5)
    assert probed.ms == 1.5 and probed.source == "probe" and probed.provenance().startswith("start-up probe 1.5 ms")
    assert ServingPath(2.0).probed(1.5) == ServingPath(2.0)  # a declared figure stays
    assert probed.observe(20, 60.0).source == "probe" and probed.observe(20, 60.0).ms == pytest.approx(2.25)
    paths = update_serving({"n1": ServingPath(1.0), "n2": ServingPath(3.0)}, {"n1": (10, 20.0)})
    assert paths["n2"] == ServingPath(3.0) and paths["n1"].windows == 1


def test_every_prediction_and_the_simulator_carry_the_serving_path() -> None:
    """The path is a constant delay: mean, p95 and p99 move by exactly it, the device time does not; the
    simulator's replay adds it to every answer; a policy refuses where it breaks an SLO."""
    app = App("a", "mobilenet_v2", 10, Slo(7.0, "p95"))
    p = "ibis-edgetpu/mobilenet_v2"
    place = Placement("a", (Share("n1/tpu0", 1.0, p),))
    est = {}
    for ms in (0.0, 4.0):
        snap = Snapshot(cluster(ms), {"a": app}, {"a": place})
        dev = snap.cluster.devices["n1/tpu0"]
        est[ms] = predict_device(device_spec(dev), snap.tenants(dev))["a"]
    assert est[4.0].mean_ms == pytest.approx(est[0.0].mean_ms + 4.0)
    assert est[4.0].p95_ms == pytest.approx(est[0.0].p95_ms + 4.0, abs=0.05)
    assert est[4.0].device_ms == est[0.0].device_ms
    # admission: the 7 ms p95 fits n1 without its path, n2 only with it
    for name in ("ibis", "edgemux"):
        for ms, where in ((0.0, "n1/tpu0"), (4.0, "n2/tpu0")):
            d = get(name).decide(app, Snapshot(cluster(ms)))
            assert isinstance(d, Placement) and d.shares[0].device == where, (name, ms, d)
    from edgemux.sim.cluster import simulate_cluster
    from edgemux.sim.trace import Arrive

    means = {}
    for ms in (0.0, 4.0):
        run = simulate_cluster(cluster(ms), get("ibis"), [Arrive(0.0, app, place)], horizon_s=30.0, seed=3)
        rows = [r for r in run.windows if r.app == "a" and r.answered]
        means[ms] = sum(r.mean_ms * r.answered for r in rows) / sum(r.answered for r in rows)
    assert means[4.0] == pytest.approx(means[0.0] + 4.0, rel=1e-9)  # same seed, same draws: exactly the path


def test_agents_report_device_time_per_app_and_the_message_checks_it() -> None:
    t = Tally("i1")
    t.served("a", "p", 1.0, 4.0, False)
    t.served("a", "p", 2.0, 5.0, False)
    obs = t.observations()
    assert obs.device == {"a": DeviceTime(2, 12.0)} and obs.device["a"].mean_ms == 6.0
    back = Observations.from_json(obs.to_json())
    assert back.device == obs.device
    assert "device" not in Tally("i2").observations().to_json()  # a gateway's reports stay as they were
    t.answered("a", 10.0, 4.0)
    t.answered("a", 12.0)
    back = Observations.from_json(t.observations().to_json())
    assert back.apps["a"].waited_ms == 4.0 and back.apps["a"].window("a", 0, 1).waited_ms == 4.0
    assert back.apps["a"].minus(AppCounters(1, 0, 0, LatencyHistogram.of([10.0]), 4.0)).waited_ms == 0.0
    with pytest.raises(MessageError, match="waited_ms"):
        Observations.from_json({**obs.to_json(), "apps": {"a": {"arrivals": 1, "waited_ms": -1}}}, "observations")
    for bad in ([1], [-1, 2.0], [1.5, 2.0], "x", [1, float("inf")]):
        with pytest.raises(MessageError, match="observations.device.a"):
            Observations.from_json({**obs.to_json(), "device": {"a": bad}}, "observations")
    assert DeviceTime(5, 10.0).minus(DeviceTime(2, 4.0)) == DeviceTime(3, 6.0)
    # the profiles' moments carry their largest execution, through the report (calibration keeps it)
    assert Observations.from_json(t.observations().to_json()).profiles["p"].exec.max_ms == 5.0
    with pytest.raises(ValueError, match="went down"):
        DeviceTime(1, 1.0).minus(DeviceTime(2, 4.0))


def test_the_start_up_probe_reads_the_least_round_trip_not_one_that_waited_for_a_busy_host() -> None:
    """``HttpAgentDriver.probe_ms`` against a real HTTP server whose health answers wait 40 ms but for two
    (a host busy starting the cluster's other processes): the probe is the hop's cost, near the quick ones.
    A median would read over 40 ms; the first round trip (it may connect) is left out even when quick; no
    answer is no figure."""
    import asyncio

    from aiohttp import web

    from edgemux.runtime.controlplane.agentdriver import PROBES, HttpAgentDriver

    async def main() -> tuple[float | None, float | None, float | None]:
        calls = {"n": 0}
        quick = {0, 4, 6}  # the first (left out), then two of the eight that count

        async def live(request: web.Request) -> web.Response:
            n = calls["n"]
            calls["n"] += 1
            if n not in quick:
                await asyncio.sleep(0.04)
            return web.json_response({})

        app = web.Application()
        app.router.add_get("/v2/health/live", live)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        driver = HttpAgentDriver(5.0)
        await driver.start()
        try:
            ms = await driver.probe_ms(f"http://127.0.0.1:{port}")
            assert calls["n"] == PROBES
            closed = await driver.probe_ms("http://127.0.0.1:1")  # nothing listens
            unstarted = await HttpAgentDriver(5.0).probe_ms(f"http://127.0.0.1:{port}")
        finally:
            await driver.close()
            await runner.cleanup()
        return ms, closed, unstarted

    ms, closed, unstarted = asyncio.run(main())
    assert ms is not None and ms < 40.0
    assert closed is None and unstarted is None
