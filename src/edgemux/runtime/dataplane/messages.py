"""The agent's messages to the control plane, typed: the register/heartbeat report (``POST``/``PUT
/v1/agents/{node}``, docs/reference/http.md "Agent") and the pieces it reports in it.

The agent builds an :class:`AgentReport` and sends ``to_json()``; the control plane reads it back with
``from_json`` (:class:`~edgemux.runtime.messages.MessageError` naming the field for a malformed one) and
compares each :class:`PieceReport` with the pieces the store wants on that node.

Units: ``*_s`` seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edgemux.runtime.messages import MessageError, Observations, array, number, obj, text

# Set by an engine that starts an agent somewhere it can name better than the host name (the Ray engine:
# "ray node ID at IP"); the agent sends it as ``runs_on`` in every registration.
RUNS_ON_ENV = "EDGEMUX_RUNS_ON"

DEFAULT_HEARTBEAT_S = 5.0  # assumed when a report does not say


@dataclass(frozen=True)
class PieceReport:
    """One piece an agent serves: ``app`` on ``device`` (the device's name on its node) with ``model`` (its
    source), ``profile`` and ``weight`` (its share of the app's requests on this agent), its contract, and on
    a spatial device its ``instances`` each holding ``fraction`` of it (1 and 1 elsewhere, and from an agent
    that does not say); ``key_sha256`` the digest of the app key it takes (``runtime.auth``; None: none);
    ``extra`` keeps the report's other fields (backend, tensors, provenance, ...) for the
    people who read them."""

    app: str
    device: str
    model: str
    profile: str | None
    weight: float
    rate_rps: float | None = None
    burst: float | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    fraction: float = 1.0
    instances: int = 1
    key_sha256: str | None = None

    _KEYS = ("app", "device", "model", "profile", "weight", "rate_rps", "burst", "fraction", "instances",
             "key_sha256")

    def to_json(self) -> dict[str, Any]:
        return {**self.extra, "app": self.app, "device": self.device, "model": self.model,
                "profile": self.profile, "weight": self.weight, "rate_rps": self.rate_rps, "burst": self.burst,
                "fraction": self.fraction, "instances": self.instances, "key_sha256": self.key_sha256}

    @classmethod
    def from_json(cls, doc: Any, where: str = "piece") -> PieceReport:
        d = obj(doc, where)
        fraction = number(d, "fraction", where, 1.0)
        if not 0 < fraction <= 1:
            raise MessageError(f"{where}.fraction: expected a number in (0, 1], got {fraction!r}")
        instances = number(d, "instances", where, 1)
        if not (float(instances).is_integer() and instances >= 1):
            raise MessageError(f"{where}.instances: expected an integer >= 1, got {instances!r}")
        return cls(text(d, "app", where), text(d, "device", where), text(d, "model", where),
                   text(d, "profile", where, None), number(d, "weight", where),
                   number(d, "rate_rps", where, None), number(d, "burst", where, None),
                   {k: v for k, v in d.items() if k not in cls._KEYS}, float(fraction), int(instances),
                   text(d, "key_sha256", where, None))


@dataclass(frozen=True)
class AgentReport:
    """A registration or heartbeat: which agent (``node``, its ``url``, the ``incarnation`` of its
    process: a new one means it holds nothing loaded before), its heartbeat period (s), its version, its
    devices (by name, as ``GET /v1/node`` shows them), the pieces it serves and what it observed of its apps
    and profiles (cumulative, None from an agent that does not count), and where its process runs
    (``runs_on``: the host name, or what the engine that started it says, e.g. the Ray node), and the lease
    it asks for (``lease_s``, s: it fences itself after that long without an acknowledged heartbeat,
    ``dataplane.lease``; 0 or None: it never does). ``extra`` keeps the rest of the node's status."""

    node: str
    url: str
    incarnation: str
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    version: str | None = None
    devices: dict[str, dict[str, Any]] = field(default_factory=dict)
    pieces: tuple[PieceReport, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    observations: Observations | None = field(default=None, compare=False)
    runs_on: str | None = None
    lease_s: float | None = None

    _KEYS = ("node", "url", "incarnation", "heartbeat_s", "version", "devices", "apps", "observations", "runs_on",
             "lease_s")

    def by_app(self) -> dict[str, list[PieceReport]]:
        """The reported pieces by app (one per device the app runs on here)."""
        out: dict[str, list[PieceReport]] = {}
        for p in self.pieces:
            out.setdefault(p.app, []).append(p)
        return out

    def to_json(self) -> dict[str, Any]:
        return {**self.extra, "node": self.node, "url": self.url, "incarnation": self.incarnation,
                "heartbeat_s": self.heartbeat_s, "version": self.version, "devices": list(self.devices.values()),
                "apps": [p.to_json() for p in self.pieces],
                **({"observations": self.observations.to_json()} if self.observations is not None else {}),
                **({"runs_on": self.runs_on} if self.runs_on is not None else {}),
                **({"lease_s": self.lease_s} if self.lease_s is not None else {})}

    @classmethod
    def from_json(cls, doc: Any, node: str | None = None) -> AgentReport:
        """Read a report; ``node`` (the node the URL names) is the default of the body's ``node`` and must
        agree with it."""
        d = obj(doc, "agent registration")
        name = text(d, "node", "registration", node)
        if name is None:
            raise MessageError("registration.node: missing (expected a string)")
        if node is not None and name != node:
            raise MessageError(f"registration.node: {name!r} but the URL names node {node}")
        inc = text(d, "incarnation", "registration")
        if len(inc) > 200:
            raise MessageError("registration.incarnation: longer than 200 characters")
        hb = number(d, "heartbeat_s", "registration", DEFAULT_HEARTBEAT_S)
        if not hb > 0:
            raise MessageError(f"registration.heartbeat_s: must be > 0 s, got {hb:g}")
        version = d.get("version")
        devices: dict[str, dict[str, Any]] = {}
        for i, dev in enumerate(array(d, "devices", "registration", [])):
            w = f"registration.devices[{i}]"
            dev = obj(dev, w)
            devices[text(dev, "name", w)] = dev
        pieces = tuple(PieceReport.from_json(p, f"registration.apps[{i}]")
                       for i, p in enumerate(array(d, "apps", "registration", [])))
        seen = d.get("observations")
        observations = None if seen is None else Observations.from_json(seen, "registration.observations")
        runs_on = text(d, "runs_on", "registration", None)
        if runs_on is not None and len(runs_on) > 200:
            raise MessageError("registration.runs_on: longer than 200 characters")
        lease = number(d, "lease_s", "registration", None)
        if lease is not None and not lease >= 0:
            raise MessageError(f"registration.lease_s: must be >= 0 s, got {lease:g}")
        return cls(name, text(d, "url", "registration"), inc, hb, version if isinstance(version, str) else None,
                   devices, pieces, {k: v for k, v in d.items() if k not in cls._KEYS}, observations, runs_on,
                   None if lease is None else float(lease))
