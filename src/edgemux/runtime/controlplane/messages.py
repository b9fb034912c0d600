"""The control plane's API messages (docs/reference/http.md, "Control plane"), typed: the service builds
its answers from these and :mod:`.apiclient` reads them back, so a field renamed on one side fails a test
instead of a ``KeyError`` in a user's terminal.

Every message has ``to_json()`` and ``from_json(doc)``; a malformed one is a
:class:`~edgemux.runtime.messages.MessageError` naming the field. Placements travel as
:class:`~edgemux.cluster.state.Placement` (:func:`placement_to_json`, :func:`placement_from_json`).

Units: ``*_s`` seconds, ``*_ms`` milliseconds, ``*_rps`` requests/s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgemux.cluster.state import Placement, Share, StateError
from edgemux.runtime.messages import MessageError, array, flag, number, obj, text

if TYPE_CHECKING:
    # Imported where they are used (a move request read by the service, a route built for a gateway): the
    # client verbs (`edgemux get apps`) read these messages without the data plane's numpy codec
    from edgemux.runtime.ingress.routing import AppRoute

# ------------------------------------------------------------------------------------------- placements


def placement_to_json(p: Placement) -> dict[str, Any]:
    """``{"cpu_node", "shares": [{"device", "weight", "profile"[, "fraction", "instances"]}]}`` (the app's name is
    not repeated; ``fraction`` and ``instances`` only where a share holds part of a spatial device or runs more
    than one instance)."""
    return {"cpu_node": p.cpu_node, "shares": [_share_json(s) for s in p.shares]}


def _share_json(s: Share) -> dict[str, Any]:
    out: dict[str, Any] = {"device": s.device, "weight": s.weight, "profile": s.profile}
    if s.fraction != 1.0 or s.instances != 1:
        out.update(fraction=s.fraction, instances=s.instances)
    return out


def placement_from_json(app: str, doc: Any, where: str = "placement") -> Placement:
    """The :class:`Placement` of ``app`` that :func:`placement_to_json` wrote."""
    d = obj(doc, where)
    shares = []
    for i, s in enumerate(array(d, "shares", where)):
        sw = f"{where}.shares[{i}]"
        s = obj(s, sw)
        k = number(s, "instances", sw, 1)
        if isinstance(k, float) and not k.is_integer():
            raise MessageError(f"{sw}.instances: expected an integer, got {k!r}")
        shares.append((text(s, "device", sw), number(s, "weight", sw), text(s, "profile", sw),
                       number(s, "fraction", sw, 1.0), int(k)))
    try:
        return Placement(app, tuple(Share(*x) for x in shares), text(d, "cpu_node", where, None))
    except StateError as e:
        raise MessageError(f"{where}: {e}") from None


# ------------------------------------------------------------------------------------------------ apply


@dataclass(frozen=True)
class RejectionView:
    """Why an app was refused: the constraint that decided it (the one that broke where the app came
    closest), the one-line message, the numbers of that device that were set (device, tenant,
    predicted_ms, slo_ms, ...) as ``detail``, ``headline`` (what broke there, in a few words:
    ``utilization 1.52 > 0.90 on edge-2/tpu0``) and ``reasons``: every device tried, each a record
    ``{kind, device[, node, tenant, stat][, predicted, limit, unit, ratio]}`` (``predicted`` against
    ``limit`` in ``unit``: ms for an SLO, the utilization cap, MB or cores needed against free)."""

    constraint: str
    message: str
    detail: dict[str, Any] = field(default_factory=dict)
    headline: str = ""
    reasons: tuple[dict[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        out = {**self.detail, "constraint": self.constraint, "message": self.message}
        if self.headline:
            out["headline"] = self.headline
        if self.reasons:
            out["reasons"] = list(self.reasons)
        return out

    @classmethod
    def from_json(cls, doc: Any, where: str = "rejection") -> RejectionView:
        d = obj(doc, where)
        reasons = tuple(obj(r, f"{where}.reasons[{i}]") for i, r in enumerate(array(d, "reasons", where, [])))
        for i, r in enumerate(reasons):
            text(r, "kind", f"{where}.reasons[{i}]")
        return cls(text(d, "constraint", where), text(d, "message", where),
                   {k: v for k, v in d.items() if k not in ("constraint", "message", "headline", "reasons")},
                   text(d, "headline", where, ""), reasons)


@dataclass(frozen=True)
class ApplyResult:
    """What became of one app of an apply: ``result`` is ``created``, ``updated``, ``unchanged`` or
    ``rejected``; a placed app has its ``placement`` and ``status`` (``ready``/``pending``), a refused one
    its ``rejection``; ``pending`` lists pieces not loaded yet (node, device, error). ``retry_after_s``: a
    rejected app for which a switched-off node is waking, the seconds until it serves (apply again then).
    ``key``: a created app's key, with authentication on (``runtime.auth``): shown in this answer only."""

    app: str
    result: str
    status: str | None = None
    placement: Placement | None = None
    rejection: RejectionView | None = None
    pending: tuple[dict[str, Any], ...] = ()
    retry_after_s: float | None = None
    key: str | None = None

    RESULTS = ("created", "updated", "unchanged", "rejected")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"app": self.app, "result": self.result}
        if self.status is not None:
            out["status"] = self.status
        if self.placement is not None:
            out["placement"] = placement_to_json(self.placement)
        if self.rejection is not None:
            out["rejection"] = self.rejection.to_json()
        if self.pending:
            out["pending"] = list(self.pending)
        if self.retry_after_s is not None:
            out["retry_after_s"] = round(self.retry_after_s, 3)
        if self.key is not None:
            out["key"] = self.key
        return out

    @classmethod
    def from_json(cls, doc: Any, where: str = "result") -> ApplyResult:
        d = obj(doc, where)
        app, result = text(d, "app", where), text(d, "result", where)
        if result not in cls.RESULTS:
            raise MessageError(f"{where}.result: expected one of {', '.join(cls.RESULTS)}, got {result!r}")
        placement = (placement_from_json(app, d["placement"], f"{where}.placement")
                     if d.get("placement") is not None else None)
        rejection = (RejectionView.from_json(d["rejection"], f"{where}.rejection")
                     if d.get("rejection") is not None else None)
        if (result == "rejected") != (rejection is not None):
            raise MessageError(f"{where}: a rejection comes with result 'rejected' and only then")
        pending = tuple(obj(p, f"{where}.pending[{i}]") for i, p in enumerate(array(d, "pending", where, [])))
        retry = number(d, "retry_after_s", where, None)
        return cls(app, result, text(d, "status", where, None), placement, rejection, pending, retry,
                   text(d, "key", where, None))


@dataclass(frozen=True)
class ApplyAnswer:
    """The answer to ``POST /v1/apps``: one :class:`ApplyResult` per app, in order; ``http_status`` is 201
    when an app was created, 409 when one was rejected, else 200."""

    results: tuple[ApplyResult, ...]
    http_status: int = 200

    @property
    def rejected(self) -> list[ApplyResult]:
        return [r for r in self.results if r.rejection is not None]

    @property
    def admitted(self) -> list[ApplyResult]:
        return [r for r in self.results if r.rejection is None]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"results": [r.to_json() for r in self.results],
                               "applied": len(self.admitted), "rejected": len(self.rejected)}
        if self.rejected:
            first = self.rejected[0].rejection
            assert first is not None
            out["error"] = first.message
            out["rejection"] = first.to_json()
        return out

    @classmethod
    def from_json(cls, doc: Any, http_status: int = 200) -> ApplyAnswer:
        d = obj(doc, "apply answer")
        return cls(tuple(ApplyResult.from_json(r, f"results[{i}]") for i, r in enumerate(array(d, "results", "apply"))),
                   http_status)


# ------------------------------------------------------------------------------------------------- moves


@dataclass(frozen=True)
class MoveTarget:
    """One device an app moves to (``NODE/DEVICE``) and its share of the requests (None: equal parts)."""

    device: str
    weight: float | None = None


@dataclass(frozen=True)
class MoveRequest:
    """The body of ``POST /v1/apps/{name}/move``: where to, and optionally the node of the CPU stage.
    ``from_json`` checks its shape (the service then checks the devices, the weights' sum and the SLOs)."""

    to: tuple[MoveTarget, ...]
    cpu_node: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"to": [{"device": t.device} if t.weight is None else
                                      {"device": t.device, "weight": t.weight} for t in self.to]}
        if self.cpu_node is not None:
            out["cpu_node"] = self.cpu_node
        return out

    @classmethod
    def from_json(cls, doc: Any) -> MoveRequest:
        from edgemux.runtime.dataplane.protocol import short_repr

        if not isinstance(doc, dict) or not set(doc) <= {"to", "cpu_node"}:
            raise MessageError('a move must be a JSON object {"to": [{"device": "NODE/DEVICE", "weight": W}, '
                               '...], "cpu_node": "NODE" (optional)}')
        to = doc.get("to")
        if not isinstance(to, list) or not to:
            raise MessageError(f"'to' must be a non-empty list of devices, got {short_repr(to)}")
        targets = []
        for i, t in enumerate(to):
            if isinstance(t, str):
                t = {"device": t}
            if not isinstance(t, dict) or not set(t) <= {"device", "weight"} or not isinstance(t.get("device"), str):
                raise MessageError(f"'to[{i}]' must be \"NODE/DEVICE\" or {{\"device\": \"NODE/DEVICE\", "
                                   f"\"weight\": W}}, got {short_repr(t)}")
            w = t.get("weight")
            if w is not None and (isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 < w <= 1):
                raise MessageError(f"'to[{i}].weight' must be a number in (0, 1], got {short_repr(w)}")
            targets.append(MoveTarget(t["device"], None if w is None else float(w)))
        devices = [t.device for t in targets]
        if len(set(devices)) != len(devices):
            raise MessageError(f"'to' names device {next(d for d in devices if devices.count(d) > 1)} twice")
        if len({t.weight is None for t in targets}) > 1:
            raise MessageError("'to': give a weight for every device or for none")
        cpu_node = doc.get("cpu_node")
        if cpu_node is not None and (not isinstance(cpu_node, str) or not cpu_node):
            raise MessageError(f"'cpu_node' must be a node name, got {short_repr(cpu_node)}")
        return cls(tuple(targets), cpu_node)


@dataclass(frozen=True)
class MoveAnswer:
    """The answer to a move: ``result`` ``moved`` or ``unchanged``, the placements before and after, and
    how long each step took (``steps_s``: load_s, switch_s, drain_s; s)."""

    app: str
    result: str
    old: Placement
    new: Placement
    steps_s: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"app": self.app, "result": self.result, "from": placement_to_json(self.old),
                               "to": placement_to_json(self.new)}
        if self.steps_s:
            out["steps_s"] = {k: round(v, 4) for k, v in self.steps_s.items()}
        return out

    @classmethod
    def from_json(cls, doc: Any) -> MoveAnswer:
        d = obj(doc, "move answer")
        app = text(d, "app", "move")
        steps = obj(d.get("steps_s", {}), "move.steps_s")
        return cls(app, text(d, "result", "move"), placement_from_json(app, d.get("from"), "move.from"),
                   placement_from_json(app, d.get("to"), "move.to"),
                   {k: number(steps, k, "move.steps_s") for k in steps})


# ------------------------------------------------------------------------------------------------ routes


@dataclass(frozen=True)
class RouteEndpoint:
    """An agent that serves the app: its URL, its weight (the sum of its pieces' shares), its node and the
    devices its pieces run on."""

    url: str
    weight: float
    node: str
    device: str


@dataclass(frozen=True)
class PendingPiece:
    """A piece of the placement not served yet, and why (``error``)."""

    node: str
    device: str
    weight: float
    error: str


@dataclass(frozen=True)
class RouteView:
    """``GET /v1/routes/{app}``: the endpoints that serve the app now and the pieces not loaded yet."""

    app: str
    model: str
    endpoints: tuple[RouteEndpoint, ...]
    rate_rps: float
    burst: float
    pending: tuple[PendingPiece, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"app": self.app, "model": self.model,
                "endpoints": [{"url": e.url, "weight": e.weight, "node": e.node, "device": e.device}
                              for e in self.endpoints],
                "rate_rps": self.rate_rps, "burst": self.burst,
                "pending": [{"node": p.node, "device": p.device, "weight": p.weight, "error": p.error}
                            for p in self.pending]}

    @classmethod
    def from_json(cls, doc: Any) -> RouteView:
        d = obj(doc, "route")
        eps = []
        for i, e in enumerate(array(d, "endpoints", "route")):
            w = f"route.endpoints[{i}]"
            e = obj(e, w)
            eps.append(RouteEndpoint(text(e, "url", w), number(e, "weight", w), text(e, "node", w),
                                     text(e, "device", w)))
        pend = []
        for i, p in enumerate(array(d, "pending", "route", [])):
            w = f"route.pending[{i}]"
            p = obj(p, w)
            pend.append(PendingPiece(text(p, "node", w), text(p, "device", w), number(p, "weight", w),
                                     text(p, "error", w, "", empty=True)))
        return cls(text(d, "app", "route"), text(d, "model", "route"), tuple(eps), number(d, "rate_rps", "route"),
                   number(d, "burst", "route"), tuple(pend))

    def app_route(self, key_sha256: str | None = None) -> AppRoute | None:
        """The :class:`AppRoute` a gateway or client holds for this app, with its key's digest when given (the
        gateways'); None while no endpoint serves it."""
        from edgemux.runtime.ingress.routing import AppRoute, Endpoint

        if not any(e.weight > 0 for e in self.endpoints):
            return None
        return AppRoute(self.app, self.model, [(Endpoint(e.device, e.url), e.weight) for e in self.endpoints],
                        self.rate_rps, self.burst, key_sha256=key_sha256)


# ------------------------------------------------------------------------------------------ apps, agents


@dataclass(frozen=True)
class AppView:
    """One entry of ``GET /v1/apps``: the app's contract, its status (``ready``/``pending``) and placement."""

    name: str
    model: str
    rate_rps: float
    periodic: bool
    burst: float
    slo_ms: float
    slo_stat: str
    status: str
    placement: Placement

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "model": self.model, "rate_rps": self.rate_rps, "periodic": self.periodic,
                "burst": self.burst, "slo": {"latency_ms": self.slo_ms, "stat": self.slo_stat},
                "status": self.status, **placement_to_json(self.placement)}

    @classmethod
    def from_json(cls, doc: Any) -> AppView:
        d = obj(doc, "app")
        name = text(d, "name", "app")
        w = f"apps[{name}]"
        slo = obj(d.get("slo"), f"{w}.slo")
        return cls(name, text(d, "model", w), number(d, "rate_rps", w), flag(d, "periodic", w), number(d, "burst", w),
                   number(slo, "latency_ms", f"{w}.slo"), text(slo, "stat", f"{w}.slo"), text(d, "status", w),
                   placement_from_json(name, d, w))


@dataclass(frozen=True)
class AgentView:
    """One entry of ``GET /v1/agents``: a registered agent, whether it is ready (heard from within its lease
    + margin, ``reconciler.lost_after_s``), the apps it reports, its devices and where its process runs
    (``runs_on``); with consolidation on, its node's ``power`` state (``on``, ``draining``, ``off``, ``waking``)."""

    node: str
    url: str
    incarnation: str
    version: str | None
    heartbeat_s: float
    last_heartbeat_age_s: float
    ready: bool
    apps: tuple[str, ...]
    devices: tuple[str, ...]
    runs_on: str | None = None
    power: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "url": self.url, "incarnation": self.incarnation, "version": self.version,
                "heartbeat_s": self.heartbeat_s, "last_heartbeat_age_s": round(self.last_heartbeat_age_s, 3),
                "ready": self.ready, "apps": list(self.apps), "devices": list(self.devices),
                "runs_on": self.runs_on, "power": self.power}

    @classmethod
    def from_json(cls, doc: Any) -> AgentView:
        d = obj(doc, "agent")
        w = f"agents[{text(d, 'node', 'agent')}]"
        return cls(text(d, "node", w), text(d, "url", w), text(d, "incarnation", w), text(d, "version", w, None),
                   number(d, "heartbeat_s", w), number(d, "last_heartbeat_age_s", w), flag(d, "ready", w),
                   tuple(str(a) for a in array(d, "apps", w, [])), tuple(str(x) for x in array(d, "devices", w, [])),
                   text(d, "runs_on", w, None), text(d, "power", w, None))


@dataclass(frozen=True)
class Event:
    """One thing an operator asked (``OPERATOR_EVENTS``) or the adapt loop saw or did: ``seq`` (increasing),
    ``time_s`` (Unix s), ``kind`` (one of ``EVENT_KINDS``), the ``app`` concerned (None for a node's or a
    profile's: ``power``, ``calibrated``), a one-line ``message``, and the reason and figures as ``data`` (a
    finding's JSON, a rejection, a move's step durations...; ``by: operator`` on an operator's)."""

    seq: int
    time_s: float
    kind: str
    app: str | None
    message: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "time_s": self.time_s, "kind": self.kind, "app": self.app,
                "message": self.message, "data": self.data}

    @classmethod
    def from_json(cls, doc: Any, where: str = "event") -> Event:
        d = obj(doc, where)
        seq = number(d, "seq", where)
        data = d.get("data", {})
        return cls(int(seq), number(d, "time_s", where), text(d, "kind", where), text(d, "app", where, None),
                   text(d, "message", where), dict(obj(data, f"{where}.data")))
