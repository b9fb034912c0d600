"""One decision core, two drivers: one seeded come-and-go trace replayed through the cluster simulator
(``sim.cluster.simulate_cluster``) and through a control plane (``runtime.controlplane.ControlPlane``) with fake
agents and a fake clock takes the same actions of the adaptation cycle (``adapt.cycle``) in the same order, at
the same times: kinds, apps, nodes, devices, reasons and flags (each action's ``key()``).

The trace, on four single-Edge-TPU nodes with consolidation on (``min_on`` 2): EfficientNet-S, MobileNetV2 and
a camera app arrive and are packed on one node; the empty nodes are switched off; EfficientNet-S triples its
rate (the Ibis rule moves it, at its observed rate, to the other node on), then falls back (reclamation lowers
its raised contract in place); Inception arrives, finds no room on the nodes that are on and wakes one (the
cycle's arrival path; admitted when it serves); a node is drained at low load and switched off; the node that
holds Inception dies (its agent falls silent: ``agent-dead``, its app's evacuation refused until a woken node
has room, then moved); apps leave.

How the control plane is fed what the simulator saw, and where the two drivers are kept alike on purpose:

- **Windows.** The simulator records what its monitor gave the cycle (``ClusterRun.monitored``: per window,
  every placed app's ``AppWindow``), and the control plane's observer is replaced by one that hands back those
  windows (:class:`ReplayObserver`), one level below the agents' cumulative ``Observations`` reports: those
  carry latencies as 1 % histograms (``adapt.monitor.LatencyHistogram``), whose percentiles are a bucket's
  geometric middle, not the simulator's exact ones, so a p95 near an SLO could be judged differently. The
  observer checks that the control plane closes each window at the simulator's times, for the same apps, in
  the same order. Everything from the closed windows on (gathering the inputs, the cycle, carrying out) is the
  control plane's own. Every placed app gets a window in both (an empty one when it sent nothing).
- **Liveness.** Every fake agent heartbeats at each window's end (its period is the window, so no agent looks
  silent between windows); the failed node's agent sends its last heartbeat when it fails and none after, and
  every later call to it fails, so both drivers hear it last at the failure.
- **Wake-up.** The simulator sets a woken node on at its exact wake-up time; the control plane's controller
  loop wakes then (``PowerManager.due_in_s``), and so does this replay (a pass at that time). Wake-up times
  (13 s) do not fall on a window's end or on a trace event (checked), where the drivers' orders within one
  instant could differ (the control plane's pass ticks the power states before a due window's cycle).
- **Busy.** A move holds its app until it serves: the simulator's after ``model_load_s`` (1 s, less than the
  window), the control plane's until its transition ends; the fake agents load at once and the replay waits
  for the control plane's background work after every step, so no move is in flight at the next window in
  either. Neither refuses a switch-off (the fake agent holds nothing by then), and no profile moments are
  reported (the simulator does not calibrate).
- **Arrivals without room.** The simulator keeps such an arrival waiting and admits it when a node serves;
  the control plane answers 409 with ``Retry-After``, and the replay applies it again, as a client does, right
  after the node serves.

:func:`divergence` is the comparison; a replay that wakes nodes only at windows (as the control plane did
before its loop woke at a node's wake-up time) is caught by it, and so are a swapped and a missing action.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterable, Sequence
from dataclasses import replace, dataclass
from pathlib import Path
from typing import Any

import pytest

from edgemux.adapt.consolidate import ConsolidationSettings
from edgemux.adapt.cycle import CycleAction, Woke
from edgemux.adapt.monitor import AppWindow
from edgemux.adapt.plan import TRANSITION_KINDS
from edgemux.adapt.settings import AdaptSettings
from edgemux.cluster.power import NodePower
from edgemux.cluster.state import App, Slo
from edgemux.experiments.dynamic_trace import tpus
from edgemux.policies import get
from edgemux.runtime.controlplane.adaptation import Observer
from edgemux.runtime.controlplane.agentdriver import AgentCallError
from edgemux.runtime.controlplane.service import ControlPlane
from edgemux.sim.cluster import Arrive, ClusterRun, Fail, Leave, Rate, TraceEvent, simulate_cluster
from test_controlplane_managers import FakeDriver, url

WINDOW_S = 10.0
WAKE_S = 13.0
HORIZON_S = 220.0
MODEL_LOAD_S = 1.0
SEED = 1
POLICY = "ibis"
CLUSTER = tpus(4)
SETTINGS = AdaptSettings(window_s=WINDOW_S, trigger_windows=2, min_samples=20, min_dwell_s=60.0,
                         dead_after_s=15.0)
CONSOLIDATION = ConsolidationSettings(switch_off_below=0.3, wake_above=0.6, min_on=2)


def _app(name: str, model: str, rate_rps: float, slo_ms: float) -> App:
    return App(name, model, rate_rps, Slo(slo_ms, "p95"))


TRACE: tuple[TraceEvent, ...] = (
    Arrive(1.0, _app("eff", "efficientnet-S", 10.0, 100.0)),
    Arrive(2.0, _app("mob", "mobilenet_v2", 10.0, 50.0)),
    Arrive(3.0, _app("cam", "mobilenet_v2", 5.0, 50.0)),
    Rate(41.0, "eff", 30.0),   # 3x its contract: the Ibis rule moves it
    Rate(101.0, "eff", 10.0),  # back to its declared rate: its raised contract is reclaimed
    Arrive(105.0, _app("inc", "inception_v3", 3.0, 500.0)),  # no room on the nodes on: a node wakes for it
    Fail(151.0, "n1"),         # the node inc was admitted on
    Leave(201.0, "cam"),
    Leave(203.0, "inc"),
)

Keyed = tuple[float, tuple[object, ...]]


@functools.cache
def simulated(settings: AdaptSettings = SETTINGS) -> ClusterRun:
    """The trace through the cluster simulator (the same every call: seeded)."""
    power = {n.name: NodePower(n.name, 2.0, {f"{n.name}/tpu0": 1.5}, WAKE_S, 0.1) for n in CLUSTER.nodes}
    return simulate_cluster(CLUSTER, get(POLICY), TRACE, horizon_s=HORIZON_S, seed=SEED, settings=settings,
                            model_load_s=MODEL_LOAD_S, power=power, consolidation=CONSOLIDATION)


def keyed(decisions: Iterable[tuple[float, CycleAction]]) -> list[Keyed]:
    """(time s, ``key()``) of each action, in order: what two drivers of one trace must agree on."""
    return [(round(t, 6), a.key()) for t, a in decisions]


def divergence(sim: Sequence[Keyed], cp: Sequence[Keyed]) -> str | None:
    """The first difference between two drivers' keyed actions, in words (None: the same actions in the same
    order at the same times)."""
    for i, (a, b) in enumerate(zip(sim, cp)):
        if a != b:
            return f"action {i}: the simulator's {a} but the control plane's {b}"
    if len(sim) != len(cp):
        longer, name = (sim, "simulator") if len(sim) > len(cp) else (cp, "control plane")
        return f"action {min(len(sim), len(cp))}: only the {name} goes on, with {longer[min(len(sim), len(cp))]}"
    return None


# ------------------------------------------------------------------------------------- the control plane


class ReplayObserver(Observer):
    """The simulator's monitor replayed (module doc): ``close`` hands back the windows the simulator's cycle
    read at that time, and notes every way the control plane's window differs from the simulator's (its
    times, its apps and their order) in ``mismatches``."""

    def __init__(self, monitored: Sequence[tuple[float, tuple[AppWindow, ...]]]) -> None:
        super().__init__()
        self.by_end = {round(end, 6): windows for end, windows in monitored}
        self.mismatches: list[str] = []

    def close(self, apps: Iterable[str], start_s: float, end_s: float) -> dict[str, AppWindow]:
        names = list(apps)
        recorded = self.by_end.get(round(end_s, 6))
        if recorded is None:
            self.mismatches.append(f"a window closes at {end_s} s, where the simulator's does not")
            return super().close(names, start_s, end_s)
        if [w.app for w in recorded] != names:
            self.mismatches.append(f"window ending {end_s} s: the control plane places {names}, the simulator "
                                   f"{[w.app for w in recorded]}")
        if any(w.start_s != start_s for w in recorded):
            self.mismatches.append(f"window ending {end_s} s starts at {start_s} s, the simulator's at "
                                   f"{recorded[0].start_s} s")
        super().close(names, start_s, end_s)  # the (empty) open window closes as it would
        return {w.app: w for w in recorded}


class ReplayDriver(FakeDriver):
    """The fake agents (``test_controlplane_managers.FakeDriver``: loads, unloads and power switches
    acknowledged at once), each heartbeating once a window; a ``dead`` node's agent answers nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.dead: set[str] = set()

    def _check(self, agent_url: str) -> None:
        if agent_url in self.dead:
            raise AgentCallError(f"{agent_url}: connection refused")

    async def put_app(self, agent_url: str, app: str, body: dict[str, Any]) -> None:
        self._check(agent_url)
        await super().put_app(agent_url, app, body)

    async def delete_app(self, agent_url: str, app: str) -> None:
        self._check(agent_url)
        await super().delete_app(agent_url, app)

    async def app_ready(self, agent_url: str, app: str) -> bool:
        self._check(agent_url)
        return await super().app_ready(agent_url, app)

    async def set_power(self, agent_url: str, device: str, state: str) -> None:
        self._check(agent_url)
        await super().set_power(agent_url, device, state)

    def report(self, node: str, incarnation: str = "one", counts: Any = None) -> dict[str, Any]:
        return {**super().report(node, incarnation, counts), "heartbeat_s": WINDOW_S}


class Clock:
    """The control plane's clock: the simulator's time (s)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@dataclass(frozen=True)
class Replayed:
    """What the control plane did with the trace: its ``actions`` keyed (``keyed``), the ``mismatches`` of its
    windows with the simulator's (``ReplayObserver``), and from its events (``GET /v1/events``) each ``power``
    change (node, state) and each transition done (app, what it took), in order."""

    actions: list[Keyed]
    mismatches: list[str]
    power: list[tuple[str, str]]
    moves: list[tuple[str, str]]


async def replay(run: ClusterRun, store: Path, *, wake_at_ready: bool = True, settings: AdaptSettings = SETTINGS
                 ) -> Replayed:
    """The trace through a control plane with fake agents on the simulator's clock, fed the simulator's
    windows (module doc). ``wake_at_ready`` False: no pass runs at a node's wake-up time (its wake is seen at
    the next window or apply only)."""
    clock, driver = Clock(), ReplayDriver()
    cp = ControlPlane(str(store), CLUSTER, POLICY, agent_driver=driver, clock=clock, drain_grace_s=0.0,
                      adapt=settings, consolidation=CONSOLIDATION, wake_s=WAKE_S)
    observer = ReplayObserver(run.monitored)
    cp.adaptation.observer = observer
    cp.adaptation.timer = clock  # windows fall due on the replay's clock
    await cp.start(loop=False)
    try:
        for node in CLUSTER.nodes:
            cp.register_agent(node.name, driver.report(node.name), heartbeat=False)
        await cp.wait_idle()
        failed: set[str] = set()
        waiting: list[App] = []  # apps told to apply again once a node serves
        events = list(TRACE)
        ends = [k * WINDOW_S for k in range(1, int(HORIZON_S / WINDOW_S + 1e-9) + 1)]

        async def apply(app: App) -> None:
            status, body = await cp.apply([app])
            (result,) = body["results"]
            if status == 409 and result.get("retry_after_s") is not None:
                waiting.append(app)

        async def readmit(woke_before: int) -> None:
            if waiting and any(isinstance(a, Woke) for _, a in list(cp.adaptation.decisions)[woke_before:]):
                again = list(waiting)
                waiting.clear()
                for app in again:
                    await apply(app)

        while events or ends:
            ready = clock.t + cp.power.due_in_s() if wake_at_ready else float("inf")
            t = min([ready] + [e.time_s for e in events[:1]] + ends[:1])
            clock.t = t
            seen = len(cp.adaptation.decisions)
            while events and events[0].time_s == t:
                ev = events.pop(0)
                if isinstance(ev, Arrive):
                    await apply(ev.app)
                elif isinstance(ev, Leave):
                    await cp.delete(ev.app_name)
                elif isinstance(ev, Fail):  # its last heartbeat now, then silence
                    cp.register_agent(ev.node, driver.report(ev.node), heartbeat=True)
                    failed.add(ev.node)
                    driver.dead.add(url(ev.node))
                # a Rate changes only what the apps send: the windows carry it
                await cp.wait_idle()
            if ends and ends[0] == t:
                ends.pop(0)
                for node in CLUSTER.nodes:
                    if node.name not in failed:
                        cp.register_agent(node.name, driver.report(node.name), heartbeat=True)
                await cp.wait_idle()
                cp.run_pass()  # the window is due: its observations are read (no gateway here)
                await cp.wait_idle()
            cp.run_pass()  # the window closes and its cycle runs; the power tick
            await cp.wait_idle()
            await readmit(seen)
            await cp.wait_idle()
        events = cp.events.since()
        return Replayed(keyed(cp.adaptation.decisions), observer.mismatches,
                        [(e.data["node"], e.data["state"]) for e in events if e.kind == "power"],
                        [(str(e.app), e.kind) for e in events if e.kind in TRANSITION_KINDS])
    finally:
        await cp.close()


# ------------------------------------------------------------------------------------------------ tests


def test_the_trace_shows_every_kind_of_decision_and_no_instant_is_shared() -> None:
    """The premise: the simulated trace moves an app by the Ibis rule, reclaims a contract, wakes a node for
    an arrival, drains a node and switches it off, and evacuates a dead node's app; and no wake-up time falls
    on a window's end or a trace event (module doc)."""
    run = simulated()
    keys = [a.key() for _, a in run.decisions]
    assert ("move", "eff", ("n3/tpu0",), "over-contract", "moved") in keys
    assert ("move", "eff", ("n3/tpu0",), "under-contract", "contract") in keys
    assert any(k[0] == "drain" for k in keys) and any(k[0] == "switch-off" for k in keys)
    assert any(k[:2] == ("finding", "n1") and k[3] == "agent-dead" for k in keys)
    assert any(k[:2] == ("move", "inc") and k[3] == "agent-dead" for k in keys)
    assert [(d.app, d.arrived_s, d.admitted_s) for d in run.delayed] == [("inc", 105.0, 118.0)]
    woke = {t for t, a in run.decisions if isinstance(a, Woke)}
    assert woke and not woke & ({e.time_s for e in TRACE} | {k * WINDOW_S for k in range(int(HORIZON_S))})


def test_the_simulator_and_the_control_plane_take_the_same_actions_in_the_same_order(tmp_path: Path) -> None:
    """The same actions at the same times, on the same windows; and carried out alike: the control plane's
    power events are the simulator's power changes, its transitions done the simulator's, in order."""
    run = simulated()
    cp = asyncio.run(replay(run, tmp_path / "store.db"))
    assert cp.mismatches == []
    sim = keyed(run.decisions)
    assert divergence(sim, cp.actions) is None
    assert cp.actions == sim and len(sim) > 40
    assert cp.power == [(c.node, c.state) for c in run.power_changes]
    assert cp.moves == [(a.app, a.kind) for a in run.actions]


def test_with_calibration_from_windows_both_drivers_still_agree(tmp_path: Path) -> None:
    """``fit_windows`` on in both drivers: each cycle fits the profiles to the same windows (``adapt.fit``),
    and the simulator and the control plane still take the same actions, recalibrations included."""
    fitting = replace(SETTINGS, fit_windows=1)
    run = simulated(fitting)
    sim = keyed(run.decisions)
    assert any(k[0] == "recalibrated" for _, k in sim)
    cp = asyncio.run(replay(run, tmp_path / "store.db", settings=fitting))
    assert cp.mismatches == [] and divergence(sim, cp.actions) is None


def test_a_control_plane_that_wakes_nodes_late_is_caught(tmp_path: Path) -> None:
    """Without a pass at a node's wake-up time the control plane sets it on only at the next window (or
    apply): the first Woke comes later than the simulator's, and the comparison says where."""
    run = simulated()
    cp = asyncio.run(replay(run, tmp_path / "store.db", wake_at_ready=False))
    why = divergence(keyed(run.decisions), cp.actions)
    assert why is not None and "('woke', 'n1')" in why and "118.0" in why, why


@pytest.mark.parametrize("perturb", ["swap", "drop", "time"])
def test_the_comparison_catches_a_swapped_a_missing_and_a_late_action(perturb: str) -> None:
    sim = keyed(simulated().decisions)
    i = next(k for k in range(len(sim) - 1) if sim[k] != sim[k + 1] and sim[k][0] == sim[k + 1][0])
    cp = list(sim)
    if perturb == "swap":
        cp[i], cp[i + 1] = cp[i + 1], cp[i]
    elif perturb == "drop":
        del cp[i]
    else:
        cp[i] = (cp[i][0] + WINDOW_S, cp[i][1])
    why = divergence(sim, cp)
    assert why is not None and why.startswith(f"action {i}:"), why
    assert divergence(sim, sim[:-1]) == f"action {len(sim) - 1}: only the simulator goes on, with {sim[-1]}"
