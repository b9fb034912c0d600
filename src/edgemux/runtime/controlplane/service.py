"""The control-plane service: admits apps with a policy, records them in the store, drives the node agents
and publishes routes to the gateways (flow 1 "Admit" of docs/concepts.md).

Its HTTP API (apps, routes, agents, gateways), how a changed app is replaced (make before break), how the
model source sent to an agent is chosen (stand-ins included) and how an app split over several devices of
one node is served are described in docs/reference/http.md ("Control plane"); keep that page true when
they change.

:class:`ControlPlane` owns the durable :class:`~edgemux.cluster.store.Store` (the source of truth: a
restarted control plane on the same file serves the same apps), the admission policy, the registered agents
and gateways. ``runtime.controlplane.api`` puts it behind HTTP (aiohttp) and binds it. Calls to agents
and gateways never fail an API call and never crash the control plane: a failure is recorded (the piece is
``pending``) and retried on the agent's next registration or heartbeat.

Units: ``*_s`` seconds, ``*_ms`` milliseconds, ``*_rps`` requests/s, ``*_mb`` MB.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import re
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp


from edgemux.adapt.calibrate import calibrated_catalog
from edgemux.adapt.consolidate import ConsolidationSettings, consolidate_plan, holding, observed_utilization, \
    utilization_trend
from edgemux.adapt.loop import AdaptState, step
from edgemux.adapt.monitor import AppWindow
from edgemux.adapt.plan import Transition, live_snapshot, transition_kind
from edgemux.adapt.settings import AdaptSettings
from edgemux.cluster.specs import app_to_dict
from edgemux.cluster.state import App, Cluster, Placement
from edgemux.cluster.store import Store, StoreError, TransitionRecord
from edgemux.errors import EdgemuxError, InputError
from edgemux.perf.device import predict_device
from edgemux.policies import Policy, Rejection, Snapshot, get
from edgemux.policies.base import device_spec
from edgemux.policies.moves import check_move, share_on
from edgemux.profiles.catalog import Catalog, load_catalog
from edgemux.profiles.types import DeviceKind, Profile
from edgemux.runtime.controlplane.adaptation import EventLog, Observer
from edgemux.runtime.auth import Guard, auth_headers, digest, new_app_key
from edgemux.runtime.controlplane.agentdriver import AgentCallError, AgentDriver, HttpAgentDriver, http_call
from edgemux.runtime.controlplane.consolidation import PowerStates
from edgemux.runtime.controlplane.messages import (
    AgentView,
    ApplyAnswer,
    ApplyResult,
    AppView,
    MoveAnswer,
    MoveRequest,
    PendingPiece,
    RejectionView,
    RouteEndpoint,
    RouteView,
    placement_to_json,
)
from edgemux.runtime.ingress.routing import AppRoute, Endpoint, RouteError
from edgemux.runtime.messages import MessageError, Observations
from edgemux.runtime.dataplane.messages import AgentReport, PieceReport
from edgemux.runtime.dataplane.protocol import short_repr

__all__ = ["ControlPlane", "ControlPlaneError", "DEFAULT_PORT", "agent_model", "rejection_json"]

logger = logging.getLogger("edgemux.controlplane")

DEFAULT_PORT = 8470
MAX_BODY_BYTES = 4 * 10**6        # an AppList of thousands of apps is well under this
DEFAULT_CALL_TIMEOUT_S = 30.0     # an agent PUT may build a zoo model and open a session: seconds
READY_HEARTBEATS = 3              # an agent is ready while its last heartbeat is within 3 x heartbeat_s
RECONCILE_PERIOD_S = 1.0          # how often (s) the reconcile loop runs when no event wakes it
GATEWAY_OBSERVE_EVERY = 10        # every 10th pass reads each gateway's routes back (a restarted gateway)
DRAIN_GRACE_S = 1.0               # after a move's route switch, before the old pieces unload (s)
READY_TIMEOUT_S = 30.0            # a move waits this long (s) for its new pieces to say they are ready
RECOVERY_GATEWAY_WAIT_S = 30.0    # after a restart, how long (s) an interrupted move waits for a gateway


class ControlPlaneError(EdgemuxError):
    """A request the control plane refuses; ``status`` is the HTTP status."""

    def __init__(self, message: str, status: int = 400, extra: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.extra = dict(extra or {})


# ------------------------------------------------------------------------------------- model sources


def _family_stand_in(model: str) -> str:
    """The zoo graph standing in for a catalog model without one (same task and output shape family)."""
    m = model.lower()
    if m.startswith(("ssd", "yolo")):
        return "ssdlite_mobilenet_v2"
    if m.startswith(("mobilenet", "bodypix")):
        return "mobilenet_v2"
    if m.startswith("efficientnet"):
        return "efficientnet_b0"
    if m in ("resnet18", "resnet34"):
        return "resnet18"
    if m.startswith(("alexnet", "squeezenet")):
        return "squeezenet1_1"
    return "resnet50"


def _input_hw(profile: Profile) -> tuple[int, int] | None:
    """(height, width) in pixels from a profile's ``input_shape`` (``[N, 3, H, W]``), when it says."""
    text = profile.extra.get("input_shape")
    if not isinstance(text, str):
        return None
    dims = re.findall(r"\d+", text)
    if len(dims) >= 3:
        h, w = int(dims[-2]), int(dims[-1])
        if h >= 32 and w >= 32:
            return h, w
    return None


def agent_model(profile: Profile, overrides: Mapping[str, str] | None = None) -> tuple[str, str | None]:
    """(model source for the agent's ``PUT /v1/apps``, stand-in zoo model or None) for a share running
    ``profile`` ("Model sources" in docs/reference/http.md). Deterministic: the same profile always gives
    the same source, so a restarted control plane asks the agents for what they already hold."""
    from edgemux.runtime import zoo

    if overrides:
        for key in (profile.name, profile.model):
            if key in overrides:
                return overrides[key], None
    measured = profile.extra.get("model_source")
    if isinstance(measured, str) and measured.strip():
        return measured.strip(), None   # a profile measured by `edgemux profile`: the graph it timed
    exact = profile.model in zoo.MODELS
    name = profile.model if exact else _family_stand_in(profile.model)
    h, w = _input_hw(profile) or zoo.STANDARD_INPUT[name]
    return f"zoo:{name}@{h}x{w}", None if exact else name


# ------------------------------------------------------------------------------------------- JSON helpers


def _num(x: Any) -> Any:
    """A number for JSON: non-finite (an unstable queue) becomes the string ``"unstable"``."""
    if isinstance(x, float) and not math.isfinite(x):
        return "unstable"
    if x is not None and not isinstance(x, (int, float, str, bool)):  # perf's Unstable marker
        return "unstable"
    return x


def rejection_json(r: Rejection) -> dict[str, Any]:
    """A rejection as plain data: constraint, message and the numbers that are set."""
    d: dict[str, Any] = {"app": r.app, "constraint": r.constraint, "message": r.message}
    for k in ("device", "node", "requested", "used", "capacity", "unit", "tenant", "predicted_ms", "slo_ms",
              "stat", "detail"):
        v = getattr(r, k)
        if v is not None and v != "":
            d[k] = _num(v)
    if r.counts:
        d["counts"] = dict(r.counts)
    return d


def rejection_view(r: Rejection) -> RejectionView:
    """A rejection as its typed message."""
    d = rejection_json(r)
    return RejectionView(d.pop("constraint"), d.pop("message"), d)


def clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_exc(e: BaseException) -> str:
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


# ----------------------------------------------------------------------------------------------- state


@dataclass
class AgentState:
    """A registered agent: where it is, which process (``incarnation``), its heartbeat period (s), when it
    was last heard from (control-plane clock, s), its devices and the pieces it reported (by app name: one
    entry per device the app runs on there)."""

    node: str
    url: str
    incarnation: str
    heartbeat_s: float
    last_seen: float
    registered_at: float
    version: str | None = None
    devices: dict[str, dict[str, Any]] = field(default_factory=dict)
    reported: dict[str, list[PieceReport]] = field(default_factory=dict)
    runs_on: str | None = None


@dataclass(frozen=True)
class Piece:
    """One share of an app as its node's agent serves it: the ``PUT /v1/apps/{app}`` body fields. ``rate_rps``
    (req/s) and ``burst`` (requests) are this piece's part of the app's contract (the contract times the
    weight): the agent polices the app with them, so that a client that bypasses the gateway cannot send
    more than the contract either."""

    app: str
    node: str
    device: str          # name on the node
    device_path: str
    model: str           # model source (see agent_model)
    stand_in: str | None
    profile: str
    weight: float
    rate_rps: float
    burst: float
    fraction: float = 1.0   # a spatial device: the share of it each instance holds
    instances: int = 1
    key_sha256: str | None = None  # the app key's digest: the agent takes the key for direct inference

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"device": self.device, "model": self.model, "profile": self.profile,
                               "weight": self.weight, "rate_rps": self.rate_rps, "burst": self.burst}
        if (self.fraction, self.instances) != (1.0, 1):  # only spatial pieces say: any agent reads the rest
            out.update(fraction=self.fraction, instances=self.instances)
        if self.key_sha256 is not None:
            out["key_sha256"] = self.key_sha256
        return out

    def matches(self, reported: PieceReport | None) -> bool:
        """True when an agent's reported piece is this piece (same device, model, profile, weight and
        contract)."""
        if reported is None:
            return False
        return (reported.device == self.device and reported.model == self.model
                and reported.profile == self.profile and reported.instances == self.instances
                and math.isclose(reported.fraction, self.fraction, rel_tol=1e-9)
                and math.isclose(reported.weight, self.weight, rel_tol=1e-9, abs_tol=1e-12)
                and reported.rate_rps is not None and math.isclose(reported.rate_rps, self.rate_rps, rel_tol=1e-9)
                and reported.burst is not None and math.isclose(reported.burst, self.burst, rel_tol=1e-9)
                and reported.key_sha256 == self.key_sha256)

    def report(self, app: str) -> PieceReport:
        """The piece as its agent reports it once loaded."""
        return PieceReport(app, self.device, self.model, self.profile, self.weight, self.rate_rps, self.burst,
                           fraction=self.fraction, instances=self.instances, key_sha256=self.key_sha256)


Group = tuple[Piece, ...]  # an app's pieces on one node, by device name: what its agent serves of it


def group_body(group: Group) -> dict[str, Any]:
    """The ``PUT /v1/apps/{app}`` body for an app's pieces on one node."""
    return group[0].body() if len(group) == 1 else {"pieces": [p.body() for p in group]}


def group_matches(group: Group, reported: list[PieceReport] | None) -> bool:
    """True when an agent's reported pieces of an app are exactly ``group`` (devices, models, profiles,
    weights)."""
    if reported is None or len(reported) != len(group):
        return False
    by_device = {r.device: r for r in reported}
    return len(by_device) == len(group) and all(p.matches(by_device.get(p.device)) for p in group)


# ------------------------------------------------------------------------------------------ control plane


class ControlPlane:
    """Admission, the store and the drive of agents and gateways (see the module docstring).

    ``store_path`` is the SQLite store file (created when missing); ``cluster`` the cluster, written to the
    store when it has none and otherwise checked against it (``set_cluster`` applies a change that keeps
    every placed app's devices; anything else is an ``InputError``). ``policy_name``/``policy_opts`` pick
    the policy (``policies.get``). ``gateway_urls`` are gateways known from the start; ``model_sources``
    overrides the model source per profile or catalog model name; ``call_timeout_s`` bounds each call to
    an agent or gateway (s); ``clock`` (s, monotonic) times heartbeats. ``adapt``: the settings of the adapt
    loop (``run_adaptation``; None: it does not run, the observations are still kept for ``describe``).
    ``token``: the cluster's admin token (``runtime.auth``): every API call must carry it, calls to agents and
    gateways carry it, and each app created gets a key (None: an open control plane, no keys).
    ``consolidation`` (needs ``adapt``): switch nodes off at low load and wake them ahead of demand after each
    adapt step (``adapt.consolidate``; the states in ``runtime.controlplane.consolidation``); ``wake_s``: one
    wake-up time (s) for every node instead of each node's own from power.yaml.

    The store is opened by :meth:`start` on a thread of its own (SQLite connections belong to one
    thread), where decisions and commits run; the HTTP handlers keep an in-memory mirror of the apps and
    placements, updated after each commit, so reads and heartbeats never wait on the disk.
    """

    def __init__(self, store_path: str, cluster: Cluster, policy_name: str = "edgemux",
                 policy_opts: Mapping[str, Any] | None = None, *, gateway_urls: Iterable[str] = (),
                 clock: Callable[[], float] = time.monotonic, model_sources: Mapping[str, str] | None = None,
                 call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S, agent_driver: AgentDriver | None = None,
                 reconcile_period_s: float = RECONCILE_PERIOD_S, drain_grace_s: float = DRAIN_GRACE_S,
                 adapt: AdaptSettings | None = None, consolidation: ConsolidationSettings | None = None,
                 wake_s: float | None = None, token: str | None = None) -> None:
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
        self.keys: dict[str, str] = {}  # app -> its key's digest (runtime.auth), as the store keeps them
        self.guard = Guard(token, owner_of=self._key_owner)
        self.driver: AgentDriver = agent_driver or HttpAgentDriver(self.call_timeout_s, token)
        self.catalog = load_catalog()
        self.base_catalog = self.catalog  # what calibration starts from; self.catalog may be calibrated
        self.adapt_settings = adapt
        if consolidation is not None and adapt is None:
            raise InputError("consolidation", "needs the adapt loop (it runs after each adapt step): "
                             "consolidation with adaptation off does nothing")
        self.consolidation = consolidation
        self.power = PowerStates(cluster, consolidation, clock(), wake_s) if consolidation is not None else None
        self._adapt_pending: set[str] = set()  # apps the adapt loop planned a move for that has not finished
        self.adapt_state = AdaptState()
        self.observer = Observer()
        self.events = EventLog()
        self.windows: dict[str, AppWindow] = {}  # the last closed window of each app that had requests
        self._window_start: float | None = None
        self._adapt_task: asyncio.Task[None] | None = None
        self._acted: set[tuple[str, str]] = set()  # keys of the findings acted on in the last window
        self._refused: set[tuple[str, tuple[str, str], str]] = set()  # the last step's refusals
        self.agents: dict[str, AgentState] = {}
        self.gateways: dict[str, str | None] = {}  # url -> last error (None: last push succeeded)
        for url in gateway_urls:
            self.gateways[_check_url(url, "gateway_urls")] = None
        self.apps: dict[str, App] = {}
        self.placements: dict[str, Placement] = {}
        # app -> the contract it was applied with (req/s); self.apps holds the one in force, which the adapt
        # loop may raise above it (an over-contract move) and lower again towards it (a reclaim)
        self.declared: dict[str, float] = {}
        # (app, node) -> the pieces the agent acknowledged or reported; (app, node) -> the last failure
        self._loaded: dict[tuple[str, str], Group] = {}
        self._errors: dict[tuple[str, str], str] = {}
        self._store: Store | None = None
        self._db = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="edgemux-store")
        self._apply_lock: asyncio.Lock | None = None
        self._node_locks: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._session: aiohttp.ClientSession | None = None
        # gateway url -> app -> the route body it acknowledged (what the reconcile loop compares against)
        self._pushed: dict[str, dict[str, AppRoute | None]] = {}
        # moves under way, by app (as in the store); a draining one's old pieces unload after its deadline
        self.transitions: dict[str, TransitionRecord] = {}
        self._drain_until: dict[str, float] = {}
        self._moving: set[str] = set()  # apps a transition() of this process is moving: the loop leaves them be
        for key, src in self.model_sources.items():
            if not isinstance(src, str) or not src.strip():
                raise InputError(f"model_sources.{key}", f"must be a non-empty model source, got {src!r}")

    # -- lifecycle -------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the store (on the store thread), reconcile its cluster and load the apps into the mirror."""
        loop = asyncio.get_running_loop()
        self._apply_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        try:
            apps, placements, transitions, declared, keys = await loop.run_in_executor(self._db, self._open_store)
        except BaseException:
            self._db.shutdown(wait=False)  # nothing else will run on the store thread
            raise
        self.apps, self.placements, self.declared, self.keys = apps, placements, declared, keys
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.call_timeout_s),
                                              headers=auth_headers(self.token))
        await self.driver.start()
        logger.info("control plane: %d apps in store %s, policy %s", len(apps), self.store_path, self.policy_name)
        await self._recover(transitions)
        for url in list(self.gateways):
            self._spawn(self._push_all_routes(url))
        self._loop_task = loop.create_task(self._reconcile_loop())
        self._window_start = self.clock()
        self._adapt_task = loop.create_task(self._adapt_loop())

    async def _recover(self, transitions: dict[str, TransitionRecord]) -> None:
        """Finish the moves a previous process left in the store. One still ``loading`` never switched: the
        store places the app where it was, so the move is forgotten and the reconcile loop takes the new
        pieces away again. One ``draining`` had switched: the store places the app at its new pieces, whose
        routes are published before the old pieces unload, ``drain_grace_s`` after this start."""
        for app, rec in transitions.items():
            if rec.phase == "loading":
                await asyncio.get_running_loop().run_in_executor(self._db, self._store_call, "end_transition", app)
                logger.warning("app %s: a move to %s was interrupted before its switch; it stays at %s", app,
                               _shares_text(rec.new), _shares_text(rec.old))
            else:
                self.transitions[app] = rec
                self._drain_until[app] = self.clock() + self.drain_grace_s
                logger.warning("app %s: finishing an interrupted move to %s (old pieces unload after the "
                               "routes moved)", app, _shares_text(rec.new))

    def wake(self) -> None:
        """Run the reconcile loop now rather than at its next period (an event: a registration, an apply)."""
        if self._wake is not None:
            self._wake.set()

    async def _reconcile_loop(self) -> None:
        """The control loop: every ``reconcile_period_s`` and on every event, compare what should run (the
        store's placements, published as routes) with what runs (agents' reports and liveness, what each
        gateway acknowledged) and act on the difference. Republishes the routes of an agent's apps when it
        goes silent or comes back, so that gateways stop sending to a dead agent without waiting for a
        request to fail there; finishes draining moves."""
        assert self._wake is not None
        was: dict[str, bool] = {}
        passes = 0
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.reconcile_period_s)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            passes += 1
            try:
                for node in list(self.agents):
                    alive = self._alive(node)
                    if was.get(node, alive) != alive:
                        logger.warning("agent %s %s", node, "is back" if alive else "missed its heartbeats")
                        for app in sorted(self.node_pieces(node)):
                            self._spawn(self._publish(app))
                    was[node] = alive
                    lock = self._node_locks.setdefault(node, asyncio.Lock())
                    if alive and not lock.locked() and self._needs_reconcile(node):
                        self._spawn(self._reconcile(node))
                for url in list(self.gateways):
                    self._spawn(self._sync_gateway(url, observe=passes % GATEWAY_OBSERVE_EVERY == 0))
                for app in list(self._drain_until):
                    if app not in self._moving and self._drained(app):
                        self._spawn(self._finish_drain(app))
            except Exception:  # never let one bad pass stop the loop
                logger.exception("reconcile pass failed")

    def _drained(self, app: str) -> bool:
        """(recovery) A switched move's old pieces may go: its grace has passed and every gateway holds the new
        route; with no gateway registered yet, wait ``RECOVERY_GATEWAY_WAIT_S`` more for one to come back
        (a gateway re-registers with a restarted control plane within its check period)."""
        now, until = self.clock(), self._drain_until[app]
        if now < until:
            return False
        if not self.gateways:
            return now >= until + RECOVERY_GATEWAY_WAIT_S
        if app not in self.apps:
            return True
        body = self._route_body(app)
        # the new pieces serve (a route with endpoints) and every gateway holds that route
        return body is not None and all(self._pushed.get(url, {}).get(app) == body for url in self.gateways)

    async def _finish_drain(self, app: str) -> None:
        """(recovery) Unload a switched move's old pieces on the nodes the app left, then forget the move."""
        rec = self.transitions.get(app)
        self._drain_until.pop(app, None)
        if rec is None:
            return
        if app in self.placements:
            new_nodes = set(self.groups(app))
            for node in sorted({self.cluster.devices[s.device].node for s in rec.old.shares} - new_nodes):
                await self._delete_piece(app, node)
        await asyncio.get_running_loop().run_in_executor(self._db, self._store_call, "end_transition", app)
        self.transitions.pop(app, None)
        logger.info("app %s: interrupted move finished at %s", app, _shares_text(rec.new))

    # -- adaptation ------------------------------------------------------------------------------------

    async def _adapt_loop(self) -> None:
        """Every window (``adapt.window_s``; 5 s when adaptation is off, for ``describe``): read the gateways'
        observations, close the window and, when adaptation is on, run one ``adapt_step``."""
        window_s = (self.adapt_settings or AdaptSettings()).window_s
        while True:
            await asyncio.sleep(window_s)
            try:
                await self.observe_gateways()
                await self.adapt_step()
            except asyncio.CancelledError:
                raise
            except Exception:  # never let one bad window stop the loop
                logger.exception("adapt window failed")

    async def observe_gateways(self) -> None:
        """Read every gateway's cumulative observations (``GET /v1/observations``); one that does not answer
        is skipped this window."""
        if self._session is None:
            return
        for url in list(self.gateways):
            try:
                async with self._session.get(f"{url}/v1/observations") as resp:
                    body = await resp.json() if resp.status == 200 else None
                obs = Observations.from_json(body) if body is not None else None
            except asyncio.CancelledError:
                raise
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
                logger.debug("gateway %s: no observations this window (%s)", url, describe_exc(e))
                continue
            if obs is not None:
                self.observer.report(f"gateway:{url}", obs, gateway=True)

    async def adapt_step(self) -> None:
        """Close the open window and, with adaptation on: re-calibrate the profiles from what the agents
        measured, run ``adapt.loop.step`` on the store's snapshot (on the nodes that are on) and carry out its
        plan (each move make before break, at its new contract), then, with consolidation, one step of its
        planner; every action is recorded as an event."""
        now = self.clock()
        start = self._window_start if self._window_start is not None else now
        self._window_start = now
        if now <= start:
            return
        self.windows = self.observer.close(list(self.apps), start, now)
        settings = self.adapt_settings
        if settings is None:
            return
        self._calibrate(settings)
        self._power_tick()
        full = Snapshot(self.cluster, self.apps, self.placements, self.catalog)
        snap = self._live(full)  # nothing is planned onto a switched-off or waking node
        windows = {a: w for a, w in self.windows.items() if a not in self._moving and a not in self.transitions}
        seen = {n: a.last_seen for n, a in self.agents.items() 
                if n in {x.name for x in snap.cluster.nodes}}
        result = step(self.adapt_state, self.policy, snap, windows, settings, now, last_seen_s=seen,
                      declared=self.declared, busy=frozenset(self._moving) | frozenset(self.transitions))
        self.adapt_state = result.state
        # a finding is an event once, when it starts to count (not again every window it lasts)
        new = {f.key for f in result.acted} - self._acted
        self._acted = {f.key for f in result.acted}
        for f in result.acted:
            if f.key in new:
                self.events.add("finding", f.app, f"{f.kind}: {f.detail}", {"finding": f.to_json()})
        plan = result.plan
        for f in plan.unexplained:
            if f.key in new:
                self.events.add("unexplained", f.app, f"{f.kind} at contracted rates (profiles off? "
                                f"calibration needs {settings.calibration_samples} executions): {f.detail}",
                                {"finding": f.to_json()})
        refused = {(r.app, r.reason.key, r.rejection.constraint) for r in plan.refused}
        for r in plan.refused:
            # once while it lasts: an app a dead node's loss leaves without a home is refused every window
            if (r.app, r.reason.key, r.rejection.constraint) not in self._refused:
                self.events.add("move-refused", r.app, f"no room at {r.rate_rps:.3g} req/s: {r.rejection.message}",
                                r.to_json())
        self._refused = refused
        for t in plan.transitions:
            self._plan_move(t)
        if self.power is not None:
            if plan.refused:
                self.power.starved = True  # an app found no room: a switched-off node may have it
            self._consolidate(full, frozenset(t.app for t in plan.transitions))

    def _plan_move(self, t: Transition) -> None:
        """Record a planned transition as an event and carry it out in the background."""
        kind = transition_kind(self.placements[t.app], t.placement)
        what = {"contract": f"contract {self.apps[t.app].rate_rps:.3g} -> {t.rate_rps:.3g} req/s in place",
                "repartitioned": f"new weights {_shares_text(t.placement)} at {t.rate_rps:.3g} req/s",
                "reshared": f"new shares {_shares_text(t.placement)} at {t.rate_rps:.3g} req/s (overlapped)",
                "moved": f"move to {_shares_text(t.placement)} at {t.rate_rps:.3g} req/s"}[kind]
        self.events.add("move-planned", t.app, f"{t.reason.kind} on {', '.join(t.reason.devices)}: {what}",
                        t.to_json())
        self._adapt_pending.add(t.app)
        self._spawn(self._adapt_move(t.app, t.placement, t.rate_rps, kind))

    async def _adapt_move(self, app: str, placement: Placement, rate_rps: float, kind: str) -> None:
        """Carry out one planned transition (``kind`` from ``adapt.plan.transition_kind``) and record what
        happened as an event of that kind (or ``move-failed``)."""
        before = self.apps[app].rate_rps if app in self.apps else rate_rps  # deleted meanwhile: move-failed
        try:
            answer = await self.transition(app, placement, rate_rps=rate_rps)
        except ControlPlaneError as e:
            self.events.add("move-failed", app, e.message, dict(e.extra or {}))
            return
        finally:
            self._adapt_pending.discard(app)
        steps = {"steps_s": {k: round(v, 3) for k, v in answer.steps_s.items()}}
        # contract: same pieces, the agents re-police at the new rate; repartitioned: new weights over devices
        # it ran on, only routes change; moved: a model loaded elsewhere, make before break
        message = {"contract": f"contract {before:.3g} -> {rate_rps:.3g} req/s at {_shares_text(placement)} "
                               f"(declared {self.declared.get(app, rate_rps):.3g})",
                   "repartitioned": f"now {_shares_text(placement)}, contract {rate_rps:.3g} req/s",
                   "reshared": f"now {_shares_text(placement)}, contract {rate_rps:.3g} req/s",
                   "moved": f"now at {_shares_text(placement)}, contract {rate_rps:.3g} req/s"}[kind]
        self.events.add(kind, app, message, steps)

    # -- consolidation ---------------------------------------------------------------------------------

    def _live(self, snap: Snapshot) -> Snapshot:
        """``snap`` on the nodes that are on: switched-off and waking nodes (which hold nothing) left out."""
        asleep = self.power.asleep() if self.power is not None else frozenset()
        return live_snapshot(snap, asleep)[0] if asleep else snap

    def _power_event(self, node: str, state: str, message: str, **data: Any) -> None:
        self.events.add("power", None, f"node {node} {message}", {"node": node, "state": state, **data})

    def _power_tick(self) -> None:
        """Waking nodes whose wake-up time has passed serve from now."""
        if self.power is None:
            return
        now = self.clock()
        for node in self.power.ready(now):
            self.power.set(node, "on", now)
            self._power_event(node, "on", "is on: it woke and takes placements again")

    def _consolidate(self, full: Snapshot, moved: frozenset[str]) -> None:
        """One step of the consolidation planner (``adapt.consolidate``, the simulator's too) on the store's
        snapshot ``full``: switch off the emptied draining nodes, wake ahead of demand, drain a node. ``moved``:
        the apps this window's adapt step is moving (left where they are)."""
        assert self.power is not None and self.consolidation is not None
        now = self.clock()
        on = self.power.in_state("on", "draining")
        u = observed_utilization(full, self.windows, on)
        self.power.observe(now, u)
        busy = moved | frozenset(self._moving) | frozenset(self.transitions) | frozenset(self._adapt_pending)
        plan = consolidate_plan(self.policy, full, self.power.view(), self.consolidation,
                                trend_per_s=utilization_trend(self.power.util_hist), starved=self.power.starved,
                                exclude=busy, observed_utilization=u)
        self.power.starved = False
        why = "; ".join(plan.reasons)
        for node in plan.undrain:
            self.power.set(node, "on", now)
            self._power_event(node, "on", f"stops draining: {why}")
        for node in plan.wake:
            self._wake_node(node, why)
        for t in plan.transitions:
            self._plan_move(t)
        for node in plan.draining:
            self.power.set(node, "draining", now)
            self._power_event(node, "draining", f"is draining: {why}", apps=[t.app for t in plan.transitions])
        for node in plan.switch_off:
            self._spawn(self._switch_off(node, why))

    def _wake_node(self, node: str, why: str) -> None:
        """Switch ``node`` on (waking: it serves ``wake_s`` later) and its agent's devices on."""
        assert self.power is not None
        self.power.set(node, "waking", self.clock())
        n = self.power.nodes[node]
        self._power_event(node, "waking", f"is waking (serves in {n.wake_s:g} s): {why}", wake_s=n.wake_s)
        self._spawn(self._wake_devices(node))

    async def _wake_devices(self, node: str) -> None:
        """The devices half of a wake; when the agent cannot switch them on, the node is off again (admission
        must not count on it) and a later step or arrival wakes it again."""
        assert self.power is not None
        err = await self._switch_devices(node, "on")
        if err is not None and self.power.state(node) == "waking":
            self.power.set(node, "off", self.clock())
            self._power_event(node, "off", f"could not be woken: {err}", error=err)

    async def _switch_devices(self, node: str, state: str) -> str | None:
        """Switch every device of ``node`` ``on`` or ``off`` through its agent; None when done, else one line
        naming what failed (an agent that is not registered, or its refusal: a device that holds a model is
        never switched off). A failed switch-off switches the devices it got back on."""
        agent = self.agents.get(node)
        if agent is None or not self._alive(node):
            return f"the agent of node {node} is not {'registered' if agent is None else 'answering'}"
        done: list[str] = []
        for device in self.cluster.node(node).devices:
            try:
                await self.driver.set_power(agent.url, device.name, state)
            except AgentCallError as e:
                if state == "off":
                    for d in done:  # a node is off whole or not at all
                        try:
                            await self.driver.set_power(agent.url, d, "on")
                        except AgentCallError:
                            pass
                return e.message
            done.append(device.name)
        return None

    async def _switch_off(self, node: str, why: str) -> None:
        """Switch a drained node off: under the apply lock, so that nothing is admitted onto it meanwhile, and
        only when the store places nothing there and no move touches it (a node never goes off under a
        tenant; its agent refuses too). A node that cannot be switched off stays draining: the next step
        tries again, or stops the drain when a tenant stays."""
        assert self.power is not None and self._apply_lock is not None
        async with self._apply_lock:
            if self.power.state(node) not in ("on", "draining"):  # an empty node is switched off without a drain
                return
            full = Snapshot(self.cluster, self.apps, self.placements, self.catalog)
            held = holding(full, node)
            reported = sorted(self.agents[node].reported) if node in self.agents else []
            if held or reported:
                logger.info("node %s not switched off yet: it holds %s", node, ", ".join(held or reported))
                return
            err = await self._switch_devices(node, "off")
            if err is not None:
                self._power_event(node, "draining", f"could not be switched off: {err}", error=err)
                return
            self.power.set(node, "off", self.clock())
            self._power_event(node, "off", f"is off: {why}")

    def _calibrate(self, settings: AdaptSettings) -> None:
        """``self.catalog`` := the base catalog with every profile the agents measured often enough replaced
        by what they measured; an event for each profile whose calibration is new."""
        observed = {n: o for n, o in self.observer.profiles().items() if n in self.base_catalog.profiles}
        before = {n: p.provenance for n, p in self.catalog.profiles.items()}
        catalog, changed = calibrated_catalog(self.base_catalog, observed, settings.calibration_samples)
        for p in changed:
            if before.get(p.name) is not None and before[p.name].source != p.provenance.source:
                self.events.add("calibrated", None, f"profile {p.name}: {p.provenance.detail} "
                                f"({p.provenance.note})", {"profile": p.name})
        self.catalog = catalog

    def _open_store(self) -> tuple[dict[str, App], dict[str, Placement], dict[str, TransitionRecord],
                                   dict[str, float], dict[str, str]]:
        store = Store.open(self.store_path)
        try:
            stored = store.cluster()
            if stored != self.cluster:
                # an empty store takes the cluster; a changed one is accepted only when it keeps every
                # placed app's devices and CPU nodes (set_cluster refuses otherwise, changing nothing)
                try:
                    store.set_cluster(self.cluster)
                except StoreError as e:
                    raise InputError("cluster", f"store {self.store_path} holds another cluster: {e}") from None
            apps, placements, transitions = store.apps(), store.placements(), store.transitions()
            declared, keys = store.declared_rates(), store.keys()
        except BaseException:
            store.close()
            raise
        self._store = store
        return apps, placements, transitions, declared, keys

    def _store_call(self, method: str, *args: Any) -> Any:
        """(store thread) One store method by name."""
        assert self._store is not None
        return getattr(self._store, method)(*args)

    async def close(self) -> None:
        """Cancel background reconciles, close the HTTP session and the store."""
        for name in ("_loop_task", "_adapt_task"):
            loop_task = getattr(self, name)
            setattr(self, name, None)
            if loop_task is not None:
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
        if self._session is not None:
            await self._session.close()
            self._session = None
        await self.driver.close()
        if self._store is not None:
            store, self._store = self._store, None
            await asyncio.get_running_loop().run_in_executor(self._db, store.close)
        self._db.shutdown(wait=True)

    async def wait_idle(self, timeout_s: float = 10.0) -> None:
        """Wait (at most ``timeout_s`` s) until no background reconcile or push runs (for tests and tools)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self._tasks:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise asyncio.TimeoutError("background tasks still running")
            await asyncio.wait(list(self._tasks), timeout=left)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("background task failed", exc_info=task.exception())

    # -- pieces and status -----------------------------------------------------------------------------

    def pieces(self, app: str) -> list[Piece]:
        """The app's shares as agent pieces, in placement order."""
        return self._pieces_of(self.placements[app], self.apps[app])

    def _pieces_of(self, placement: Placement, contract: App) -> list[Piece]:
        """``placement``'s shares as agent pieces, each with its part (its weight) of ``contract``'s rate and
        burst, in placement order."""
        out = []
        for s in placement.shares:
            dev = self.cluster.devices[s.device]
            model, stand_in = agent_model(self.catalog.get(s.profile), self.model_sources)
            out.append(Piece(placement.app, dev.node, dev.name, dev.path, model, stand_in, s.profile, s.weight,
                             contract.rate_rps * s.weight, max(1.0, contract.burst * s.weight), s.fraction,
                             s.instances, self.keys.get(placement.app)))
        return out

    def groups(self, app: str) -> dict[str, Group]:
        """The app's pieces by node (nodes in placement order, pieces by device name)."""
        return self._groups_of(self.placements[app], self.apps[app])

    def _groups_of(self, placement: Placement, contract: App) -> dict[str, Group]:
        """A placement's pieces (at ``contract``) by node, nodes in placement order, pieces by device name."""
        out: dict[str, list[Piece]] = {}
        for p in self._pieces_of(placement, contract):
            out.setdefault(p.node, []).append(p)
        return {n: tuple(sorted(ps, key=lambda p: p.device)) for n, ps in out.items()}

    def node_pieces(self, node: str) -> dict[str, Group]:
        """The pieces placed on ``node``, by app."""
        return {app: g[node] for app in self.placements if node in (g := self.groups(app))}

    def _alive(self, node: str) -> bool:
        """The node's agent is registered and heartbeating (its last heartbeat within ``READY_HEARTBEATS``
        intervals): a silent agent's endpoints leave the routes."""
        a = self.agents.get(node)
        return a is not None and self.clock() - a.last_seen <= READY_HEARTBEATS * a.heartbeat_s

    def app_status(self, app: str) -> str:
        """``ready`` when every piece is loaded on a live agent, else ``pending``."""
        ready = all(self._loaded.get((app, n)) == g and self._alive(n) for n, g in self.groups(app).items())
        return "ready" if ready else "pending"

    def route(self, app: str) -> RouteView:
        """The app's route (see ``GET /v1/routes/{app}``); ``ControlPlaneError`` 404 for an unknown app."""
        a = self._app(app)
        endpoints: list[RouteEndpoint] = []
        pending: list[PendingPiece] = []
        for node, g in self.groups(app).items():
            agent = self.agents.get(node)
            # one endpoint per agent: it splits the app over its pieces by their weights
            weight = sum(p.weight for p in g)
            device = ", ".join(p.device_path for p in g)
            if agent is not None and self._loaded.get((app, node)) == g and self._alive(node):
                endpoints.append(RouteEndpoint(agent.url, weight, node, device))
            else:
                error = self._errors.get((app, node), "not loaded yet")
                if agent is not None and not self._alive(node):
                    error = f"agent of node {node} missed its heartbeats"
                pending.append(PendingPiece(node, device, weight, error))
        return RouteView(app, app, tuple(endpoints), a.rate_rps, a.burst, tuple(pending))

    def _app(self, name: str) -> App:
        a = self.apps.get(name)
        if a is None:
            raise ControlPlaneError(f"unknown app '{clip(name)}' (apps: {_listing(self.apps)})", 404)
        return a

    def _emulated(self, piece: Piece) -> tuple[bool | None, str]:
        """Whether the piece's device is emulated, and how that is known (its agent, or the kind's default)."""
        agent = self.agents.get(piece.node)
        if agent is not None:
            d = agent.devices.get(piece.device)
            if d is not None and isinstance(d.get("emulated"), bool):
                return d["emulated"], "agent"
        kind = self.cluster.devices[piece.device_path].kind
        if kind is DeviceKind.CPU:
            return False, "default for kind cpu (onnxruntime)"
        if kind is DeviceKind.GPU_DISCRETE:
            return None, "unknown until its agent registers (CUDA if available, else emulated)"
        return True, f"default for kind {kind.value}"

    def reason(self, app: str) -> str:
        """Why the app is where it is, in the policy's terms."""
        p = self.placements[app]
        if len(p.shares) == 1:
            return (f"policy {self.policy_name}: the whole app fits on {p.shares[0].device} with every tenant "
                    f"there within its SLO")
        return (f"policy {self.policy_name}: no single device could take the whole app, so it is partitioned "
                f"over {len(p.shares)} devices, each piece the rate share that device can take with every "
                f"tenant within its SLO")

    def describe(self, name: str) -> dict[str, Any]:
        """``GET /v1/apps/{name}``: spec, placement with predictions and load status, reason, status."""
        a = self._app(name)
        snap = Snapshot(self.cluster, self.apps, self.placements, self.catalog)
        pieces = []
        groups = self.groups(name)
        for piece, share in zip(self.pieces(name), self.placements[name].shares):
            dev = self.cluster.devices[piece.device_path]
            emulated, known = self._emulated(piece)
            pred: dict[str, Any]
            try:
                est = predict_device(device_spec(dev), snap.tenants(dev))[name]
                at_stat = {"mean": est.mean_ms, "p50": None, "p95": est.p95_ms, "p99": est.p99_ms}.get(a.slo.stat)
                pred = {"mean_ms": _num(est.mean_ms), "p95_ms": _num(est.p95_ms), "p99_ms": _num(est.p99_ms),
                        "device_ms": _num(est.device_ms), "utilization": _num(est.rho), "method": est.method,
                        "at_slo_stat_ms": _num(at_stat)}
            except Exception as e:  # an estimator that cannot say: report it, never fail describe
                pred = {"error": describe_exc(e)}
            agent = self.agents.get(piece.node)
            pieces.append({
                "device": piece.device_path, "node": piece.node, "kind": dev.kind.value,
                "discipline": dev.discipline.value, "weight": share.weight, "profile": share.profile,
                "fraction": share.fraction, "instances": share.instances,
                "profile_provenance": _profile_provenance(self.catalog, share.profile),
                "model_source": piece.model, "stand_in": piece.stand_in, "emulated": emulated,
                "emulated_known_from": known, "predicted": pred,
                "agent": agent.url if agent else None,
                "status": "loaded" if self._loaded.get((name, piece.node)) == groups[piece.node] else "pending",
                "error": self._errors.get((name, piece.node)),
            })
        rec = self.transitions.get(name)
        moving = ({"phase": rec.phase, "from": placement_to_json(rec.old), "to": placement_to_json(rec.new)}
                  if rec is not None else {"phase": "moving"} if name in self._moving else None)
        return {"name": name, "spec": app_to_dict(a), "status": self.app_status(name),
                "contract": {"rate_rps": a.rate_rps, "declared_rps": self.declared.get(name, a.rate_rps)},
                "slo": {"latency_ms": a.slo.latency_ms, "stat": a.slo.stat},
                "observed": self._observed_view(name),
                "placement": {"cpu_node": self.placements[name].cpu_node, "pieces": pieces},
                "reason": self.reason(name), "route": self.route(name).to_json(), "transition": moving}

    def _observed_view(self, name: str) -> dict[str, Any] | None:
        """The app's last closed window (rate, losses, latency statistics; ms, req/s), None before one."""
        w = self.windows.get(name)
        if w is None:
            return None
        lat = w.latency
        stat = None if lat is None else lat.at(self.apps[name].slo.stat)
        return {"window_s": round(w.duration_s, 3), "rate_rps": round(w.rate_rps, 3), "arrivals": w.arrivals,
                "refused": w.refused, "failed": w.failed, "answered": lat.count if lat else 0,
                "mean_ms": _num(lat.mean_ms) if lat else None, "p95_ms": _num(lat.p95_ms) if lat else None,
                "p99_ms": _num(lat.p99_ms) if lat else None, "at_slo_stat_ms": _num(stat)}

    def list_apps(self) -> list[dict[str, Any]]:
        out = []
        for name, a in self.apps.items():
            out.append(AppView(name, a.model, a.rate_rps, a.periodic, a.burst, a.slo.latency_ms, a.slo.stat,
                               self.app_status(name), self.placements[name]).to_json())
        return out

    # -- apply / delete --------------------------------------------------------------------------------

    async def apply(self, apps: list[App]) -> tuple[int, dict[str, Any]]:
        """Apply apps in order (``POST /v1/apps`` in docs/reference/http.md); returns (HTTP status, body)."""
        assert self._apply_lock is not None, "start() first"
        results = []
        for app in apps:
            async with self._apply_lock:
                results.append(await self._apply_one(app))
        answer = ApplyAnswer(tuple(results))
        status = 409 if answer.rejected else 201 if any(r.result == "created" for r in results) else 200
        return status, answer.to_json()

    @staticmethod
    def retry_after(body: Mapping[str, Any]) -> str | None:
        """The ``Retry-After`` header (whole seconds) of an apply answer whose rejected apps wait for a node
        to wake; None otherwise."""
        waits = [r["retry_after_s"] for r in body.get("results", []) if r.get("retry_after_s") is not None]
        return str(max(1, math.ceil(max(waits)))) if waits else None

    async def _apply_one(self, app: App) -> ApplyResult:
        loop = asyncio.get_running_loop()
        old = self.apps.get(app.name)
        if old is not None and replace(old, rate_rps=self.declared.get(app.name, old.rate_rps)) == app:
            # the spec as applied: unchanged, whatever contract adaptation has put in force since
            return ApplyResult(app.name, "unchanged", self.app_status(app.name), self.placements[app.name])
        self._power_tick()
        full = Snapshot(self.cluster, self.apps, self.placements, self.catalog)
        snap = self._live(full)  # switched-off and waking nodes take no placement
        if old is not None:
            snap = snap.without(app.name)
        # a new app gets a key when authentication is on (shown once, in this answer); a changed one keeps its own
        key = new_app_key() if old is None and self.guard.enabled else None
        key_sha256 = digest(key) if key is not None else self.keys.get(app.name)
        # decide and commit on the store thread: a policy may bisect for a while, a commit fsyncs
        decision = await loop.run_in_executor(self._db, self._decide_commit, app, snap, old, key_sha256)
        if isinstance(decision, Rejection):
            wait = self._wake_for(app, full, decision)
            if wait is not None:
                view = rejection_view(decision)
                view = replace(view, message=f"{view.message}; {wait[1]}")
                return ApplyResult(app.name, "rejected", rejection=view, retry_after_s=wait[0])
            return ApplyResult(app.name, "rejected", rejection=rejection_view(decision))
        old_groups = self.groups(app.name) if old is not None else {}
        self.apps[app.name] = app
        self.placements[app.name] = decision
        self.declared[app.name] = app.rate_rps
        if key_sha256 is not None:
            self.keys[app.name] = key_sha256
        if old is not None:
            self.apps[app.name] = self.apps.pop(app.name)  # admission order: a replaced app goes last
            self.placements[app.name] = self.placements.pop(app.name)
        new_groups = self.groups(app.name)
        for node in old_groups:
            if self._loaded.get((app.name, node)) != new_groups.get(node):
                self._loaded.pop((app.name, node), None)
        self._errors = {k: v for k, v in self._errors.items() if k[0] != app.name}
        # make before break: load the new pieces, move the route, then unload the dropped pieces
        await asyncio.gather(*(self._put_group(app.name, n, g) for n, g in new_groups.items()))
        await self._publish(app.name)
        await asyncio.gather(*(self._delete_piece(app.name, n) for n in old_groups if n not in new_groups))
        logger.info("app %s %s: %s", app.name, "updated" if old else "admitted",
                    ", ".join(f"{s.device} x{s.weight:.3g}" for s in decision.shares))
        pending = tuple({"node": p.node, "device": p.device, "weight": p.weight, "error": p.error}
                        for p in self.route(app.name).pending)
        return ApplyResult(app.name, "updated" if old is not None else "created", self.app_status(app.name),
                           decision, pending=pending, key=key)

    def _wake_for(self, app: App, full: Snapshot, rejection: Rejection) -> tuple[float, str] | None:
        """An app found no room on the nodes that are on: with a node off or waking, wake the one the
        consolidation planner picks (unless one is waking already) and say when to apply again: (seconds,
        words). None when every node is on (the rejection stands)."""
        if self.power is None or self.consolidation is None or not self.power.asleep():
            return None
        self.power.starved = True
        if not self.power.in_state("waking"):
            view = replace(self.power.view(), waking=frozenset())
            plan = consolidate_plan(self.policy, full, view, self.consolidation, starved=True)
            why = f"app {app.name} found no room ({rejection.constraint})"
            for node in plan.undrain:
                self.power.set(node, "on", self.clock())
                self._power_event(node, "on", f"stops draining: {why}")
            for node in plan.wake:
                self._wake_node(node, why)
        ready = self.power.ready_in_s(self.clock())
        if ready is None:  # a wake failed at once: nothing is coming
            return None
        waking = ", ".join(sorted(self.power.in_state("waking")))
        return ready, (f"node {waking} is waking to make room (it serves in about {math.ceil(ready):.0f} s): "
                       f"apply again then")

    def _decide_commit(self, app: App, snap: Snapshot, old: App | None,
                       key_sha256: str | None = None) -> Placement | Rejection:
        """(store thread) The policy's decision; a placement is committed (delete + admit for a change) with
        the app's key digest."""
        assert self._store is not None
        decision = self.policy.decide(app, snap)
        if isinstance(decision, Rejection):
            return decision
        if old is not None:
            old_placement = self.placements[app.name]
            self._store.remove(app.name)
            try:
                self._store.admit(app, decision, key_sha256=key_sha256)
            except BaseException:
                # put the old app back, its declared contract and key too: the change did not happen
                self._store.admit(old, old_placement, declared_rps=self.declared.get(app.name),
                                  key_sha256=self.keys.get(app.name))
                raise
        else:
            self._store.admit(app, decision, key_sha256=key_sha256)
        return decision

    def _key_owner(self, key_sha256: str) -> str | None:
        """The app whose key has this digest (None: no app's)."""
        return next((a for a, d in self.keys.items() if d == key_sha256), None)

    async def rotate_key(self, name: str) -> dict[str, Any]:
        """``POST /v1/apps/{name}/key``: a new key for the app; the old one stops opening it as soon as the
        gateways and agents hold the new digest (the routes are pushed and the agents reconciled now).
        ``ControlPlaneError`` 404 for an unknown app, 409 when authentication is off (there are no keys)."""
        assert self._apply_lock is not None, "start() first"
        if not self.guard.enabled:
            raise ControlPlaneError("authentication is off (the control plane has no admin token): apps have no "
                                    "keys to rotate", 409)
        async with self._apply_lock:
            self._app(name)
            key = new_app_key()
            await asyncio.get_running_loop().run_in_executor(self._db, self._store_call, "set_key", name,
                                                             digest(key))
            self.keys[name] = digest(key)
            # the agents first (the same pieces with the new digest: nothing reloads), then the gateways: a
            # piece counts as loaded only as the agent holds it, so publishing first would drop the route
            await asyncio.gather(*(self._put_group(name, n, g) for n, g in self.groups(name).items()))
            await self._publish(name)
        logger.info("app %s: key rotated", name)
        return {"app": name, "key": key}

    async def delete(self, name: str) -> dict[str, Any]:
        """Remove an app: store, agents, gateways; ``ControlPlaneError`` 404 for an unknown app."""
        assert self._apply_lock is not None, "start() first"
        async with self._apply_lock:
            self._app(name)
            nodes = list(self.groups(name))
            await asyncio.get_running_loop().run_in_executor(self._db, self._store_remove, name)
            del self.apps[name]
            del self.placements[name]
            self.declared.pop(name, None)
            self.keys.pop(name, None)
            for node in nodes:
                self._loaded.pop((name, node), None)
                self._errors.pop((name, node), None)
            # routes first: clients stop being sent there before the agents drop the app
            await self._unpublish(name)
            done = await asyncio.gather(*(self._delete_piece(name, node) for node in nodes))
        logger.info("app %s deleted", name)
        return {"app": name, "deleted": True,
                "agents": {node: ("deleted" if ok else err) for node, (ok, err) in zip(nodes, done)}}

    # -- moves (make before break) ---------------------------------------------------------------------

    def plan_move(self, name: str, body: Any) -> Placement:
        """The placement a ``POST /v1/apps/{name}/move`` body asks for: ``{"to": [{"device": "node/dev",
        "weight": w}, ...], "cpu_node": optional}`` (a device may also be a bare ``"node/dev"`` string; weights
        default to equal parts and must sum to 1). Profiles are the catalog's for each device's kind.
        ``ControlPlaneError`` 400 for a bad body, 404 for an unknown app or device."""
        app = self._app(name)
        try:
            req = MoveRequest.from_json(body)
        except MessageError as e:
            raise ControlPlaneError(str(e)) from None
        for t in req.to:
            if t.device not in self.cluster.devices:
                raise ControlPlaneError(f"unknown device '{clip(t.device)}' (devices: "
                                        f"{_listing(self.cluster.devices)})", 404)
        devices = [t.device for t in req.to]
        given = [t.weight for t in req.to if t.weight is not None]
        weights = given or [1.0 / len(devices)] * len(devices)
        if not math.isclose(math.fsum(weights), 1.0, abs_tol=1e-6):
            raise ControlPlaneError(f"'to': weights must sum to 1, got {math.fsum(weights):.6g}")
        weights[-1] = 1.0 - math.fsum(weights[:-1])  # exactly 1, as a placement requires
        snap = Snapshot(self.cluster, self.apps, self.placements, self.catalog)
        shares = []
        for device, w in zip(devices, weights):
            share = share_on(app, snap, device, w)
            if isinstance(share, Rejection):
                raise ControlPlaneError(share.message, 409, {"rejection": rejection_json(share)})
            shares.append(share)
        cpu_node = req.cpu_node if req.cpu_node is not None else (
            self.cluster.devices[devices[0]].node if self.placements[name].cpu_node is not None else None)
        if cpu_node is not None and cpu_node not in {n.name for n in self.cluster.nodes}:
            raise ControlPlaneError(f"unknown node '{clip(str(cpu_node))}' for 'cpu_node'", 404)
        return Placement(name, tuple(shares), cpu_node)

    async def transition(self, name: str, new: Placement, *, rate_rps: float | None = None) -> MoveAnswer:
        """Move app ``name`` to ``new`` without dropping a request (make before break); with ``rate_rps``
        (req/s) the app's contract becomes that rate at the switch (the adapt loop re-admits an app that sends
        more than its contract at its observed rate):

        1. check that every tenant of the devices it goes to stays within its SLO (the policy's filter;
           ``ControlPlaneError`` 409 with the rejection otherwise) and record the move in the store;
        2. load the app on the agents of the new pieces and wait until each says it is ready;
        3. switch: one store transaction makes ``new`` the placement; every gateway gets the new route;
        4. drain: ``drain_grace_s`` for requests already sent to the old pieces, then unload those;
        5. forget the move.

        A failure in 2 rolls back (the new pieces unload, the old ones stay; ``ControlPlaneError`` 502 naming
        the agent's error); a crash anywhere is finished from the store by the next start (see ``_recover``).
        Returns the :class:`MoveAnswer` (``moved`` or ``unchanged``, with each step's duration in s).
        """
        assert self._apply_lock is not None, "start() first"
        async with self._apply_lock:
            app = self._app(name)
            if rate_rps is not None:
                app = replace(app, rate_rps=float(rate_rps))
            old = self.placements[name]
            if new == old and app == self.apps[name]:
                return MoveAnswer(name, "unchanged", old, new)
            if name in self.transitions:
                raise ControlPlaneError(f"app '{name}' is still finishing a move", 409)
            if self.power is not None:
                asleep = sorted({self.cluster.devices[sh.device].node for sh in new.shares} & self.power.asleep())
                if asleep:
                    raise ControlPlaneError(f"node {asleep[0]} is {self.power.state(asleep[0])}: it takes no "
                                            f"placement until it is on", 409)
            # at the new contract: every tenant where it goes must stay within its SLO at that rate
            why = check_move(self.policy, app, Snapshot(self.cluster, self.apps, self.placements, self.catalog), new)
            if why is not None:
                raise ControlPlaneError(why.message, 409, {"rejection": rejection_json(why)})
            loop = asyncio.get_running_loop()
            t0 = self.clock()
            steps: dict[str, float] = {}
            await loop.run_in_executor(self._db, self._store_call, "begin_transition", old, new)
            self._moving.add(name)
            try:
                old_groups, new_groups = self.groups(name), self._groups_of(new, app)
                changed = {n: g for n, g in new_groups.items() if old_groups.get(n) != g}
                try:
                    await self._load_for_move(name, changed)
                except BaseException as e:
                    await self._roll_back(name, changed, old_groups)
                    await loop.run_in_executor(self._db, self._store_call, "end_transition", name)
                    if isinstance(e, AgentCallError):
                        raise ControlPlaneError(f"move of app '{name}' rolled back: {e.message}", 502) from None
                    raise
                steps["load_s"] = self.clock() - t0
                # the switch: the store, then what the agents hold and the routes every gateway gets
                await loop.run_in_executor(self._db, self._store_call, "switch_transition", name, rate_rps)
                self.placements[name] = new
                self.apps[name] = app  # its contract (the route's policing rate) changes with the switch
                for n, g in new_groups.items():
                    self._loaded[(name, n)] = g
                    self._errors.pop((name, n), None)
                    agent = self.agents.get(n)
                    if agent is not None:
                        agent.reported[name] = [p.report(name) for p in g]
                await self._publish(name)
                steps["switch_s"] = self.clock() - t0 - steps["load_s"]
                # drain: requests already on their way to the agents the app leaves finish there (an agent
                # that keeps the app moved it between its devices itself, make before break)
                left = [n for n in old_groups if n not in new_groups]
                if left:
                    await asyncio.sleep(self.drain_grace_s)
                for n in left:
                    await self._delete_piece(name, n)
                    self._errors.pop((name, n), None)
                steps["drain_s"] = self.clock() - t0 - steps["load_s"] - steps["switch_s"]
                await loop.run_in_executor(self._db, self._store_call, "end_transition", name)
            finally:
                self._moving.discard(name)
                self.wake()
        logger.info("app %s moved: %s -> %s (%.2f s)", name, _shares_text(old), _shares_text(new), self.clock() - t0)
        return MoveAnswer(name, "moved", old, new, steps)

    async def _load_for_move(self, name: str, changed: Mapping[str, Group]) -> None:
        """Put the app's new pieces on their agents (together) and wait until each agent says the app is ready
        (``READY_TIMEOUT_S``). ``AgentCallError`` naming the first failure."""
        for node in changed:
            if node not in self.agents or not self._alive(node):
                raise AgentCallError(f"agent of node {node} is not registered or missed its heartbeats")
        results = await asyncio.gather(*(self.driver.put_app(self.agents[n].url, name, group_body(g))
                                         for n, g in changed.items()), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        deadline = self.clock() + READY_TIMEOUT_S
        for node in changed:
            while not await self.driver.app_ready(self.agents[node].url, name):
                if self.clock() > deadline:
                    raise AgentCallError(f"app {name} on node {node}: not ready within {READY_TIMEOUT_S:g} s")
                await asyncio.sleep(0.05)

    async def _roll_back(self, name: str, changed: Mapping[str, Group], old_groups: Mapping[str, Group]) -> None:
        """Undo ``_load_for_move``: a node the app did not run on drops it; one it ran on gets its old pieces
        back. Failures are left to the reconcile loop, which brings the agents to the store (the old placement)."""
        for node in changed:
            agent = self.agents.get(node)
            if agent is None:
                continue
            try:
                if node in old_groups:
                    await self.driver.put_app(agent.url, name, group_body(old_groups[node]))
                else:
                    await self.driver.delete_app(agent.url, name)
                    agent.reported.pop(name, None)
            except AgentCallError as e:
                logger.warning("app %s: rolling back a move on node %s: %s (the reconcile loop retries)",
                               name, node, e.message)

    def _store_remove(self, name: str) -> None:
        assert self._store is not None
        self._store.remove(name)

    # -- agents ----------------------------------------------------------------------------------------

    def register_agent(self, node: str, body: Any, *, heartbeat: bool) -> dict[str, Any]:
        """Record a registration (``heartbeat=False``) or heartbeat; schedules a reconcile when needed."""
        try:
            self.cluster.node(node)
        except ValueError:
            raise ControlPlaneError(f"unknown node '{clip(node)}' (nodes: "
                                    f"{_listing([n.name for n in self.cluster.nodes])})", 404) from None
        old = self.agents.get(node)
        if heartbeat and old is None:
            raise ControlPlaneError(f"agent of node {node} is not registered: register with POST", 404)
        try:
            msg = AgentReport.from_json(body, node)
        except MessageError as e:
            raise ControlPlaneError(str(e)) from None
        url = _check_url(msg.url, "url", ControlPlaneError)
        if msg.observations is not None:
            self.observer.report(f"agent:{node}", msg.observations, gateway=False)
        now = self.clock()
        restarted = old is None or old.incarnation != msg.incarnation or old.url != url
        state = AgentState(node, url, msg.incarnation, msg.heartbeat_s, now,
                           now if restarted or old is None else old.registered_at, msg.version,
                           msg.devices, msg.by_app(), msg.runs_on)
        self.agents[node] = state
        if restarted and self.power is not None:
            self._recover_power(node, msg)
        if restarted:
            # a new process holds nothing we loaded before: forget the marks, reload from the report
            for key in [k for k in self._loaded if k[1] == node]:
                del self._loaded[key]
            logger.info("agent %s registered at %s (incarnation %s)", node, state.url, state.incarnation[:12])
        if restarted or self._needs_reconcile(node):
            lock = self._node_locks.setdefault(node, asyncio.Lock())
            if restarted or not lock.locked():  # a running reconcile already covers a plain heartbeat
                self._spawn(self._reconcile(node))
            self.wake()
        return {"node": node, "registered": True, "incarnation": state.incarnation,
                "apps": sorted(self.node_pieces(node))}

    def _recover_power(self, node: str, msg: AgentReport) -> None:
        """A new agent process (or the first report to this process): its devices' states are the truth for
        on and off. Every device off: the node is off (a restarted control plane finds the nodes it switched
        off); a device on where the node was off: the node came back on by itself (it serves now)."""
        assert self.power is not None
        states = {str(d.get("power_state", "on")) for d in msg.devices.values()}
        current = self.power.state(node)
        if states == {"off"} and current != "off" and not self.node_pieces(node):
            self.power.set(node, "off", self.clock())
            self._power_event(node, "off", "is off: its agent reports every device switched off")
        elif "on" in states and current == "off":
            self.power.set(node, "on", self.clock())
            self._power_event(node, "on", "is on: its agent reports devices switched on")
        elif "off" in states and self.node_pieces(node):
            # the store places apps there: the node must serve (an agent must never hold a tenant's device off)
            self.power.set(node, "on", self.clock())
            self._power_event(node, "on", "is switched on: its agent reports devices off where the store places "
                              f"{', '.join(sorted(self.node_pieces(node)))}")
            self._spawn(self._switch_devices(node, "on"))

    def _hands_off(self, app: str) -> bool:
        """True while a move of this process owns the app's pieces: the reconciler neither loads nor unloads
        them then."""
        return app in self._moving

    def _keep_extra(self, app: str) -> bool:
        """True when an agent may hold ``app`` beyond its placement: a move owns it, or an interrupted move's
        old pieces are still draining."""
        return app in self._moving or app in self._drain_until

    def _needs_reconcile(self, node: str) -> bool:
        agent = self.agents[node]
        want = self.node_pieces(node)
        if any(not self._hands_off(a) and (not group_matches(g, agent.reported.get(a)) or
                                           self._loaded.get((a, node)) != g) for a, g in want.items()):
            return True
        return any(a not in want and not self._keep_extra(a) for a in agent.reported)

    async def _reconcile(self, node: str) -> None:
        """Bring the node's agent to the store's pieces: PUT the missing or different, DELETE the extra,
        then republish the routes of the apps whose endpoints changed."""
        lock = self._node_locks.setdefault(node, asyncio.Lock())
        async with lock:
            agent = self.agents.get(node)
            if agent is None:
                return
            want = self.node_pieces(node)
            touched: list[str] = []
            for app, group in want.items():
                if self._hands_off(app):
                    continue
                if group_matches(group, agent.reported.get(app)):
                    if self._loaded.get((app, node)) != group:
                        self._loaded[(app, node)] = group
                        self._errors.pop((app, node), None)
                        touched.append(app)
                    continue
                ok, _ = await self._put_group(app, node, group)
                if ok:
                    touched.append(app)
            for app in [a for a in agent.reported if a not in want and not self._keep_extra(a)]:
                await self._delete_piece(app, node)
            for app in touched:
                if app in self.apps:
                    await self._publish(app)

    def deregister_agent(self, node: str) -> dict[str, Any]:
        if self.agents.pop(node, None) is None:
            raise ControlPlaneError(f"agent of node '{clip(node)}' is not registered", 404)
        self.observer.forget(f"agent:{node}")
        gone = [k[0] for k in self._loaded if k[1] == node]
        for app in gone:
            del self._loaded[(app, node)]
            self._errors[(app, node)] = f"agent of node {node} deregistered"
            self._spawn(self._publish(app))  # its endpoint leaves the route
        logger.info("agent %s deregistered", node)
        return {"node": node, "registered": False}

    def list_agents(self) -> dict[str, Any]:
        now = self.clock()
        agents = []
        for node, a in self.agents.items():
            age = max(0.0, now - a.last_seen)
            agents.append(AgentView(node, a.url, a.incarnation, a.version, a.heartbeat_s, age,
                                    age <= READY_HEARTBEATS * a.heartbeat_s, tuple(sorted(a.reported)),
                                    tuple(sorted(a.devices)), a.runs_on,
                                    self.power.state(node) if self.power is not None else None).to_json())
        missing = [n.name for n in self.cluster.nodes if n.name not in self.agents]
        out: dict[str, Any] = {"agents": agents, "unregistered_nodes": missing}
        if self.power is not None:
            out["power"] = self.power.to_json(now)
        return out

    # -- gateways --------------------------------------------------------------------------------------

    async def register_gateway(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict) or set(body) - {"url"}:
            raise ControlPlaneError("gateway registration must be a JSON object {\"url\": \"http://HOST:PORT\"}")
        url = _check_url(body.get("url"), "url", ControlPlaneError)
        self.gateways[url] = None
        pushed = await self._push_all_routes(url)
        return {"url": url, "routes": pushed, "error": self.gateways.get(url)}

    async def _push_all_routes(self, url: str) -> int:
        n = 0
        for app in list(self.apps):
            if await self._publish_to(url, app):
                n += 1
        return n

    # -- outgoing calls (never raise) ------------------------------------------------------------------

    async def _call(self, method: str, url: str, body: Any = None) -> tuple[int | None, str | None]:
        """(HTTP status or None, error text or None) of one call to an agent or gateway."""
        if self._session is None:
            return None, "control plane is not started"
        return await http_call(self._session, method, url, body)

    async def _put_group(self, app: str, node: str, group: Group) -> tuple[bool, str | None]:
        agent = self.agents.get(node)
        key = (app, node)
        if agent is None:
            self._errors[key] = f"agent of node {node} is not registered"
            return False, self._errors[key]
        try:
            await self.driver.put_app(agent.url, app, group_body(group))
            err = None
        except AgentCallError as e:
            err = e.message
        if err is None and app in self.placements and self.groups(app).get(node) == group:
            self._loaded[key] = group
            self._errors.pop(key, None)
            agent.reported[app] = [p.report(app) for p in group]
            return True, None
        if err is not None:
            if self._errors.get(key) != err:
                logger.warning("app %s on %s: %s (retried at the agent's next heartbeat)", app,
                               ", ".join(p.device_path for p in group), err)
            self._errors[key] = err
        return False, err

    async def _delete_piece(self, app: str, node: str) -> tuple[bool, str | None]:
        agent = self.agents.get(node)
        if agent is None:
            return False, f"agent of node {node} is not registered (it drops the app when it registers)"
        try:
            await self.driver.delete_app(agent.url, app)
        except AgentCallError as e:
            err = e.message
        else:
            agent.reported.pop(app, None)
            self._loaded.pop((app, node), None)
            return True, None
        logger.warning("removing app %s from node %s: %s (retried at its next heartbeat)", app, node, err)
        return False, err

    async def _publish(self, app: str) -> None:
        await asyncio.gather(*(self._publish_to(url, app) for url in list(self.gateways)))

    def _route_body(self, app: str) -> AppRoute | None:
        """The route a gateway should hold for ``app``; None when no endpoint has it loaded (no route rather
        than one that sends clients to agents without the app). When every piece's agent is dead (missed its
        heartbeats), the route keeps those agents: a request then fails over through all of them and gets the
        gateway's 503 naming them, not a 404 as if the app did not exist, until the app is re-placed or the
        agents come back."""
        view = self.route(app)
        key = self.keys.get(app)
        body = view.app_route(key)
        if body is None and view.pending and all(
                p.node in self.agents and not self._alive(p.node) and self._loaded.get((app, p.node)) is not None
                for p in view.pending):
            body = AppRoute(app, view.model, [(Endpoint(p.device, self.agents[p.node].url), p.weight)
                                              for p in view.pending], view.rate_rps, view.burst, key_sha256=key)
        return body

    async def _publish_to(self, url: str, app: str) -> bool:
        if app not in self.apps:
            return False
        body = self._route_body(app)
        if body is not None:
            status, err = await self._call("PUT", f"{url}/v1/routes/{_q(app)}", body.to_json())
        else:
            status, err = await self._call("DELETE", f"{url}/v1/routes/{_q(app)}")
            if status == 404:
                err = None
        self.gateways[url] = err
        if err is not None:
            logger.warning("gateway %s: %s", url, err)
            self._pushed.get(url, {}).pop(app, None)  # unknown: the next pass pushes it again
        elif body is None:
            self._pushed.setdefault(url, {}).pop(app, None)
        else:
            self._pushed.setdefault(url, {})[app] = body
        return err is None

    async def _sync_gateway(self, url: str, observe: bool) -> None:
        """Push the routes whose body differs from what ``url`` acknowledged, and remove those of apps that
        are gone. ``observe``: first read the gateway's routes back (``GET /v1/routes``), so that a gateway
        that restarted and lost them gets them again."""
        if observe and self._session is not None:
            try:
                async with self._session.get(f"{url}/v1/routes") as resp:
                    held = (await resp.json()).get("routes", {}) if resp.status == 200 else None
            except asyncio.CancelledError:
                raise
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, AttributeError):
                held = None
            if isinstance(held, dict):
                # what the gateway holds, as it says; a route it holds that we cannot read stays listed as
                # None, which differs from any route we push, so the comparison below replaces or removes it
                self._pushed[url] = {app: _read_route(app, body) for app, body in held.items()}
        acked = self._pushed.setdefault(url, {})
        for app in list(self.apps):
            if self._hands_off(app):
                continue  # the move publishes its own switch
            want = self._route_body(app)
            if (app in acked) if want is None else (acked.get(app) != want):
                await self._publish_to(url, app)
        for app in [a for a in acked if a not in self.apps]:
            status, err = await self._call("DELETE", f"{url}/v1/routes/{_q(app)}")
            if err is None or status == 404:
                acked.pop(app, None)

    async def _unpublish(self, app: str) -> None:
        for url in list(self.gateways):
            status, err = await self._call("DELETE", f"{url}/v1/routes/{_q(app)}")
            self.gateways[url] = None if (err is None or status == 404) else err
            if err is None or status == 404:
                self._pushed.get(url, {}).pop(app, None)


def _profile_provenance(catalog: Catalog, name: str) -> str | None:
    """Where a profile's figures come from (the catalog's source, or ``calibrated, ...``)."""
    prof = catalog.profiles.get(name)
    return str(prof.provenance) if prof is not None else None


def _read_route(app: str, body: Any) -> AppRoute | None:
    """A route a gateway says it holds; None when it is not one we could have pushed."""
    try:
        return AppRoute.from_json(app, body)
    except (RouteError, ValueError):
        return None


def _shares_text(p: Placement) -> str:
    return ", ".join(f"{s.device} x{s.weight:.3g}" + (f" ({s.instances} x {s.fraction:.3g} of it)"
                                                      if (s.fraction, s.instances) != (1.0, 1) else "")
                     for s in p.shares)


def _check_url(url: Any, field_name: str, exc: type[Exception] = InputError) -> str:
    if isinstance(url, str):
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme in ("http", "https") and parsed.netloc and len(url) <= 2048:
            return url.rstrip("/")
    message = f"expected an http://HOST:PORT URL, got {short_repr(url)}"
    if exc is InputError:
        raise InputError(field_name, message)
    raise ControlPlaneError(f"'{field_name}': {message}")


def _q(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _listing(names: Iterable[str]) -> str:
    items = list(names)
    return (", ".join(items[:12]) + (", ..." if len(items) > 12 else "")) or "none"
