"""The control-plane service: admits apps with a policy, records them in the store, drives the node agents
and publishes routes to the gateways (flow 1 "Admit" of docs/concepts.md).

Its HTTP API (apps, routes, agents, gateways, metrics), how a changed app is replaced (make before break), how
the model source sent to an agent is chosen (stand-ins included) and how an app split over several devices of
one node is served are described in docs/reference/http.md ("Control plane"); keep that page true when they
change. ``runtime.controlplane.api`` puts a :class:`ControlPlane` behind HTTP (aiohttp) and binds it.

:class:`ControlPlane` is the controller: it holds the configuration (cluster, policy, clock, the agent driver),
the durable store on its own thread (``storethread``: the source of truth, so that a restarted control plane
on the same file serves the same apps), the apply lock (apply, delete, key rotation, moves and switch-offs take
it: each decision sees the commits before it) and the event log, builds one manager per concern, each owning
its state and its part of the store, and runs the controller loop. Its public methods are the facade the HTTP
API, the CLI and the engines call; each hands the call to the manager that owns it.

The managers (docs/serving.md, "The control plane's managers"):

- admission (``admission.Admission``): apply and delete, the decision and its commit, the wake-for-room answer;
- placement (``reconciler.Reconciler``): per app the target (the store's placement: the pieces each node
  should hold) beside the actual (what each agent acknowledged or reported; liveness), the agents' registry
  and heartbeats, and the reconcile pass;
- routes (``routes.RouteManager``): app keys, the routes published to gateways, the gateways' registry and sync;
- transitions (``transitions.Transitions``): make-before-break moves and re-shares, roll-back, the recovery of
  interrupted moves;
- adaptation (``adaptation.AdaptationManager``): observations into windows, one adaptation cycle per window
  (``adapt.cycle``, the simulator's too) and its actions carried out in their order, events;
- power (``power.PowerManager``): node power states, and the cycle's power actions carried out (switching
  devices through agents, waking, draining); the power tick.

The controller loop runs a pass every ``reconcile_period_s``, on every event (``wake``: a registration, a
heartbeat that reports something new, the end of a move, a window's observations read), when the adaptation
window is due and when a waking node's wake-up time comes. A pass calls each manager's ``update()`` in this
fixed order:

1. ``placement``: first, because liveness is what the others act on: an agent that went silent or came back
   gets its apps' routes republished, and every live node whose actual differs from its target is reconciled;
2. ``routes``: then each gateway is brought to the routes this pass's liveness implies (what differs from what
   it acknowledged is pushed);
3. ``transitions``: then the recovered moves whose new route every gateway now holds unload their old pieces
   (never before the routes moved: make before break);
4. ``adaptation``: then, when a window is due, its observations are read and the window closes on the state
   the managers above brought up to date, and its cycle runs: its actions (moves, power changes, events) are
   carried out in the cycle's order;
5. ``power``: last, the power tick: a waking node whose wake-up time has come serves from now.

Admission has no pass: it acts on requests. Work that takes time (calls to agents and gateways, a move) runs in
background tasks a pass starts, so a pass itself is quick. Each manager's update is timed
(``edgemux_controlplane_update_seconds{manager}``) and so is each admission decision
(``edgemux_controlplane_admission_seconds``); ``GET /metrics`` serves them (``metrics``). Calls to agents and
gateways never fail an API call and never crash the control plane: a failure is recorded (the piece is
``pending``) and retried at a later pass.

Units: ``*_s`` seconds, ``*_ms`` milliseconds, ``*_rps`` requests/s, ``*_mb`` MB.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from edgemux.adapt.consolidate import ConsolidationSettings
from edgemux.adapt.monitor import AppWindow
from edgemux.adapt.settings import AdaptSettings
from edgemux.cluster.state import App, Cluster, Placement
from edgemux.errors import InputError
from edgemux.policies import Policy, Snapshot, get
from edgemux.profiles.catalog import Catalog, load_catalog
from edgemux.runtime.auth import Guard
from edgemux.runtime.controlplane.adaptation import AdaptationManager, EventLog
from edgemux.runtime.controlplane.admission import Admission
from edgemux.runtime.controlplane.agentdriver import AgentDriver, HttpAgentDriver
from edgemux.runtime.controlplane.common import (ControlPlaneError, check_url, clip, describe_exc, rejection_json,
                                                 shares_text)
from edgemux.runtime.controlplane.consolidation import NODE_STATES
from edgemux.runtime.controlplane.describe import describe_app, list_apps
from edgemux.runtime.controlplane.messages import MoveAnswer, RouteView
from edgemux.runtime.controlplane.metrics import ControlPlaneMetrics
from edgemux.runtime.controlplane.overview import app_views, device_predictions, device_views
from edgemux.runtime.controlplane.pieces import agent_model
from edgemux.runtime.controlplane.power import PowerManager
from edgemux.runtime.controlplane.reconciler import AgentState, Reconciler
from edgemux.runtime.controlplane.routes import RouteManager
from edgemux.runtime.controlplane.storethread import StoreThread
from edgemux.runtime.controlplane.transitions import Transitions

__all__ = ["DEFAULT_PORT", "MAX_BODY_BYTES", "UPDATE_ORDER", "ControlPlane", "ControlPlaneError", "Updating",
           "agent_model", "clip", "describe_exc", "rejection_json"]

logger = logging.getLogger("edgemux.controlplane")

DEFAULT_PORT = 8470
MAX_BODY_BYTES = 4 * 10**6        # an AppList of thousands of apps is well under this
DEFAULT_CALL_TIMEOUT_S = 30.0     # an agent PUT may build a zoo model and open a session: seconds
RECONCILE_PERIOD_S = 1.0          # how often (s) the controller loop runs when no event wakes it
DRAIN_GRACE_S = 1.0               # after a move's route switch, before the old pieces unload (s)
UPDATE_ORDER = ("placement", "routes", "transitions", "adaptation", "power")  # a pass's order (module doc)


class Updating(Protocol):
    """A manager of the controller loop: ``update()`` does one pass's work (quickly: what takes time it starts
    in the background)."""

    def update(self) -> None: ...


class ControlPlane:
    """The controller of the module docstring, and the facade of its managers.

    ``store_path`` is the SQLite store file (created when missing); ``cluster`` the cluster, written to the
    store when it has none and otherwise checked against it (``set_cluster`` applies a change that keeps
    every placed app's devices; anything else is an ``InputError``). ``policy_name``/``policy_opts`` pick
    the policy (``policies.get``). ``gateway_urls`` are gateways known from the start; ``model_sources``
    overrides the model source per profile or catalog model name; ``call_timeout_s`` bounds each call to
    an agent or gateway (s); ``clock`` (s, monotonic) times heartbeats, windows and moves. ``agent_driver``:
    how agents are reached (``agentdriver``; HTTP by default). ``reconcile_period_s``: the controller loop's
    period (s); ``drain_grace_s``: after a move's switch, before the old pieces unload (s). ``adapt``: the
    settings of the adapt loop (None: it does not run, the observations are still kept for ``describe``).
    ``token``: the cluster's admin token (``runtime.auth``): every API call must carry it, calls to agents and
    gateways carry it, and each app created gets a key (None: an open control plane, no keys).
    ``consolidation`` (needs ``adapt``): switch nodes off at low load and wake them ahead of demand in each
    window's cycle (``adapt.cycle``, ``adapt.consolidate``; the power manager carries it out); ``wake_s``: one wake-up time (s) for every node
    instead of each node's own from power.yaml. ``probe_serving``: time each agent's round trip when it
    registers, its node's serving path until requests say more (``adapt.serving``; ``edgemux controlplane``
    does; off by default so that an embedded control plane's predictions do not depend on its host's timing).

    :meth:`start` opens the store on its thread (decisions and commits run there) and loads the managers'
    in-memory mirror of it, updated after each commit, so reads and heartbeats never wait on the disk.
    """

    def __init__(self, store_path: str, cluster: Cluster, policy_name: str = "edgemux",
                 policy_opts: Mapping[str, Any] | None = None, *, gateway_urls: Iterable[str] = (),
                 clock: Callable[[], float] = time.monotonic, model_sources: Mapping[str, str] | None = None,
                 call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S, agent_driver: AgentDriver | None = None,
                 reconcile_period_s: float = RECONCILE_PERIOD_S, drain_grace_s: float = DRAIN_GRACE_S,
                 adapt: AdaptSettings | None = None, consolidation: ConsolidationSettings | None = None,
                 wake_s: float | None = None, token: str | None = None, probe_serving: bool = False) -> None:
        try:  # an unknown name is an InputError from get(); a bad option a TypeError/ValueError
            self.policy: Policy = get(policy_name, **dict(policy_opts or {}))
        except (TypeError, ValueError) as e:
            raise InputError("policy", f"policy {policy_name!r}: {e}") from None
        for key, v in (("call_timeout_s", call_timeout_s), ("reconcile_period_s", reconcile_period_s)):
            if isinstance(v, bool) or not (isinstance(v, (int, float)) and 0 < v < math.inf):
                raise InputError(key, f"must be a finite number > 0 s, got {v!r}")
        if isinstance(drain_grace_s, bool) or not (isinstance(drain_grace_s, (int, float))
                                                   and 0 <= drain_grace_s < math.inf):
            raise InputError("drain_grace_s", f"must be a finite number >= 0 s, got {drain_grace_s!r}")
        if consolidation is not None and adapt is None:
            raise InputError("consolidation", "needs the adapt loop (it runs in each window's cycle): "
                             "consolidation with adaptation off does nothing")
        self.store_path = str(store_path)
        self.cluster = cluster
        self.policy_name = policy_name
        self.policy_opts = dict(policy_opts or {})
        self.model_sources = dict(model_sources or {})
        self.clock = clock
        self.call_timeout_s = float(call_timeout_s)
        self.reconcile_period_s = float(reconcile_period_s)
        self.drain_grace_s = float(drain_grace_s)
        self.token = token
        self.probe_serving = probe_serving
        self.adapt_settings = adapt
        self.guard = Guard(token, owner_of=lambda key_sha256: self.routes.key_owner(key_sha256))
        self.driver: AgentDriver = agent_driver or HttpAgentDriver(self.call_timeout_s, token)
        self.events = EventLog()
        self.db = StoreThread(self.store_path)
        self.metrics = ControlPlaneMetrics(self._gauges, self._cluster_view)
        # the managers, each owning its state (module doc); they reach one another through this controller
        self.power = PowerManager(self, consolidation, wake_s)
        self.reconciler = Reconciler(self)
        self.routes = RouteManager(self, [check_url(url, "gateway_urls") for url in gateway_urls])
        self.transitions = Transitions(self)
        self.adaptation = AdaptationManager(self, adapt, load_catalog())
        self.admission = Admission(self)
        # the managers the controller loop updates, by the name their metric carries, in UPDATE_ORDER
        by_name: dict[str, Updating] = {"placement": self.reconciler, "routes": self.routes,
                                        "transitions": self.transitions, "adaptation": self.adaptation,
                                        "power": self.power}
        self.managers = {name: by_name[name] for name in UPDATE_ORDER}
        self._apply_lock: asyncio.Lock | None = None
        self._wake: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        for key, src in self.model_sources.items():
            if not isinstance(src, str) or not src.strip():
                raise InputError(f"model_sources.{key}", f"must be a non-empty model source, got {src!r}")

    # -- what the managers share -----------------------------------------------------------------------

    @property
    def apply_lock(self) -> asyncio.Lock:
        """Held by every change of the targets (apply, delete, key rotation, a move, a switch-off)."""
        assert self._apply_lock is not None, "start() first"
        return self._apply_lock

    @property
    def catalog(self) -> Catalog:
        """The profiles in force (calibrated by the adaptation manager)."""
        return self.adaptation.catalog

    def snapshot(self) -> Snapshot:
        """The store's state as the policies read it: every app's target, on every node (kept between
        changes of the targets: ``reconciler.Reconciler.snapshot``)."""
        return self.reconciler.snapshot()

    def spawn(self, coro: Any) -> None:
        """Run ``coro`` in the background; ``close`` cancels it, ``wait_idle`` waits for it."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("background task failed", exc_info=task.exception())

    def wake(self) -> None:
        """Run a pass of the controller loop now rather than at its next period (an event)."""
        if self._wake is not None:
            self._wake.set()

    # -- lifecycle -------------------------------------------------------------------------------------

    async def start(self, *, loop: bool = True) -> None:
        """Open the store (on the store thread), load the managers' mirror of it, finish the moves a previous
        process left, push every route to the gateways known so far and start the controller loop (``loop``
        False: no loop; the caller runs the passes with :meth:`run_pass`, as the managers' tests do)."""
        self._apply_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        stored = await self.db.open(self.cluster)
        self.reconciler.load(stored.apps, stored.placements, stored.declared)
        self.routes.keys = stored.keys
        await self.driver.start()
        logger.info("control plane: %d apps in store %s, policy %s", len(stored.apps), self.store_path,
                    self.policy_name)
        await self.transitions.recover(stored.transitions)
        await self.routes.start()
        if loop:
            self._loop_task = asyncio.get_running_loop().create_task(self._control_loop())
        self.adaptation.start()

    async def _control_loop(self) -> None:
        """The controller loop (module doc): a pass every ``reconcile_period_s``, on every event, when the
        adaptation window is due and when a waking node's wake-up time comes."""
        assert self._wake is not None
        while True:
            timeout = min(self.reconcile_period_s, self.adaptation.due_in_s(), self.power.due_in_s())
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=max(timeout, 0.0))
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            self.run_pass()

    def run_pass(self) -> None:
        """One pass of the controller loop: each manager's ``update()`` in ``UPDATE_ORDER``, each timed; one
        that fails is logged and the others still run."""
        self.metrics.passes.inc()
        for name, manager in self.managers.items():
            t0 = time.perf_counter()
            try:
                manager.update()
            except Exception:  # never let one bad pass stop the loop
                logger.exception("%s update failed", name)
            self.metrics.update.labels(name).observe(time.perf_counter() - t0)

    async def close(self) -> None:
        """Stop the controller loop, cancel background work, close the sessions and the store."""
        if self._loop_task is not None:
            loop_task, self._loop_task = self._loop_task, None
            loop_task.cancel()
            try:
                await loop_task
            except asyncio.CancelledError:
                pass
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        for t in tasks:
            try:
                await t
            except BaseException:  # noqa: BLE001 - a cancelled or failed background task: nothing to do
                pass
        await self.routes.close()
        await self.driver.close()
        await self.db.close()

    async def wait_idle(self, timeout_s: float = 10.0) -> None:
        """Wait (at most ``timeout_s`` s) until no background reconcile or push runs (for tests and tools)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self._tasks:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise asyncio.TimeoutError("background tasks still running")
            await asyncio.wait(list(self._tasks), timeout=left)

    # -- metrics ---------------------------------------------------------------------------------------

    def metrics_text(self) -> bytes:
        """``GET /metrics``: the Prometheus text exposition (``metrics``)."""
        return self.metrics.render()

    def _gauges(self) -> dict[str, dict[str, float]]:
        """The state the scrape-time gauges show (``metrics.ControlPlaneMetrics``)."""
        apps = {"ready": 0.0, "pending": 0.0}
        for name in self.reconciler.apps:
            apps[self.reconciler.status(name)] += 1
        agents = {"true": 0.0, "false": 0.0}
        for node in self.reconciler.agents:
            agents["true" if self.reconciler.alive(node) else "false"] += 1
        out = {"apps": apps, "agents": agents, "moves": {"": float(len(self.transitions.busy()))}}
        if self.power.enabled:
            out["nodes"] = {s: float(sum(1 for n in self.cluster.nodes if self.power.state(n.name) == s))
                            for s in NODE_STATES}
        return out

    def _cluster_view(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The apps and devices the scrape-time gauges show (``overview``), from one snapshot."""
        snap = self.snapshot()
        preds = device_predictions(self, snap)
        return app_views(self, preds, with_series=False), device_views(self, preds, snap)

    # -- the facade (the HTTP API, the CLI, engines and tests call these) ---------------------------------

    @property
    def apps(self) -> dict[str, App]:
        """The apps in force, in admission order (the targets' mirror of the store)."""
        return self.reconciler.apps

    @property
    def placements(self) -> dict[str, Placement]:
        return self.reconciler.placements

    @property
    def declared(self) -> dict[str, float]:
        """Each app's declared contract (req/s), as it was applied."""
        return self.reconciler.declared

    @property
    def agents(self) -> dict[str, AgentState]:
        return self.reconciler.agents

    @property
    def gateways(self) -> dict[str, str | None]:
        """The registered gateways, each with its last error (None: its last push succeeded)."""
        return self.routes.gateways

    @property
    def windows(self) -> dict[str, AppWindow]:
        """The last closed window of each placed app (an empty one when it sent nothing)."""
        return self.adaptation.windows

    async def apply(self, apps: list[App]) -> tuple[int, dict[str, Any]]:
        """Apply apps in order (``POST /v1/apps``); returns (HTTP status, body)."""
        return await self.admission.apply(apps)

    retry_after = staticmethod(Admission.retry_after)

    async def delete(self, name: str) -> dict[str, Any]:
        """Remove an app: store, agents, gateways; ``ControlPlaneError`` 404 for an unknown app."""
        return await self.admission.delete(name)

    async def rotate_key(self, name: str) -> dict[str, Any]:
        """``POST /v1/apps/{name}/key``: a new key for the app (``routes.RouteManager.rotate_key``)."""
        return await self.routes.rotate_key(name)

    def describe(self, name: str) -> dict[str, Any]:
        """``GET /v1/apps/{name}``: spec, placement with predictions and load status, reason, status."""
        return describe_app(self, name)

    def list_apps(self) -> list[dict[str, Any]]:
        """``GET /v1/apps``: every app with its status and shares."""
        return list_apps(self)

    def route(self, app: str) -> RouteView:
        """The app's route (``GET /v1/routes/{app}``); ``ControlPlaneError`` 404 for an unknown app."""
        return self.routes.route(app)

    def plan_move(self, name: str, body: Any) -> Placement:
        """The placement a ``POST /v1/apps/{name}/move`` body asks for (``transitions.Transitions.plan_move``)."""
        return self.transitions.plan_move(name, body)

    async def move(self, name: str, body: Any) -> MoveAnswer:
        """``POST /v1/apps/{name}/move``: the operator's move (``plan_move``, then ``transition``), recorded
        in the timeline as an ``operator-move`` when something moved."""
        answer = await self.transition(name, self.plan_move(name, body))
        if answer.result != "unchanged":
            self.events.add("operator-move", name, f"{shares_text(answer.old)} -> {shares_text(answer.new)}",
                            {"by": "operator", "steps_s": {k: round(v, 3) for k, v in answer.steps_s.items()}})
        return answer

    async def transition(self, name: str, new: Placement, *, rate_rps: float | None = None) -> MoveAnswer:
        """Move app ``name`` to ``new`` make before break, at contract ``rate_rps`` (req/s) when given
        (``transitions.Transitions.transition``)."""
        return await self.transitions.transition(name, new, rate_rps=rate_rps)

    def register_agent(self, node: str, body: Any, *, heartbeat: bool) -> dict[str, Any]:
        """Record a registration (``heartbeat=False``) or heartbeat; schedules a reconcile when needed."""
        return self.reconciler.register_agent(node, body, heartbeat=heartbeat)

    def deregister_agent(self, node: str) -> dict[str, Any]:
        """``DELETE /v1/agents/{node}``: forget the agent; its endpoints leave the routes."""
        return self.reconciler.deregister_agent(node)

    def list_agents(self) -> dict[str, Any]:
        """``GET /v1/agents``."""
        return self.reconciler.list_agents()

    async def register_gateway(self, body: Any) -> dict[str, Any]:
        """``POST /v1/gateways``: register a gateway and push it every route."""
        return await self.routes.register_gateway(body)

    async def observe_gateways(self) -> None:
        """Read every gateway's cumulative observations into the open window."""
        await self.adaptation.observe_gateways()

    async def adapt_step(self) -> None:
        """Close the open window and run its adaptation cycle, its actions carried out, as a pass of the
        controller loop does when a window is due (``adaptation.AdaptationManager.step``)."""
        self.adaptation.step()
