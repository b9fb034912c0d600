"""An app's placement as its agents serve it: one :class:`Piece` per share (the ``PUT /v1/apps/{app}`` body of
its agent), grouped by node (:data:`Group`: what one agent serves of the app), and the model source each piece
is told to load (``agent_model``: "Model sources" in docs/reference/http.md).

Units: ``*_rps`` requests/s, ``burst`` requests.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from edgemux.cluster.state import App, Cluster, Placement
from edgemux.profiles.catalog import Catalog
from edgemux.profiles.types import Profile
from edgemux.runtime.dataplane.messages import PieceReport

__all__ = ["Group", "Piece", "agent_model", "group_body", "group_matches", "groups_of", "pieces_of"]


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


@dataclass(frozen=True)
class Piece:
    """One share of an app as its node's agent serves it: the ``PUT /v1/apps/{app}`` body fields. ``rate_rps``
    (req/s) and ``burst`` (requests) are this piece's part of the app's contract (the contract times the
    weight): the agent polices the app with them, so that a client that bypasses the gateway cannot send
    more than the contract either. ``interface`` is the app's tensors (the agent's ``interface`` field:
    every variant is served through them; None while none is known), learned from the app's first variant
    (``Reconciler.learn_interface``); not part of a piece's identity, so that learning it moves nothing."""

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
    interface: dict[str, Any] | None = field(default=None, compare=False)

    def body(self) -> dict[str, Any]:
        """The piece's fields of the agent's ``PUT /v1/apps/{app}`` body."""
        out: dict[str, Any] = {"device": self.device, "model": self.model, "profile": self.profile,
                               "weight": self.weight, "rate_rps": self.rate_rps, "burst": self.burst}
        if (self.fraction, self.instances) != (1.0, 1):  # only spatial pieces say: any agent reads the rest
            out.update(fraction=self.fraction, instances=self.instances)
        if self.key_sha256 is not None:
            out["key_sha256"] = self.key_sha256
        if self.interface is not None:
            out["interface"] = self.interface
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
                and reported.key_sha256 == self.key_sha256 and self._serves_interface(reported))

    def _serves_interface(self, reported: PieceReport) -> bool:
        """Whether the reported piece serves the app's interface: through it, or as its variant's own tensors
        (the first variant's); a report that says neither (the control plane's own record of a PUT) counts."""
        if self.interface is None:
            return True
        extra = reported.extra
        if "interface" in extra:
            return bool(extra["interface"] == self.interface)
        if "inputs" in extra and "outputs" in extra:
            return bool({"inputs": extra["inputs"], "outputs": extra["outputs"]} == self.interface)
        return True

    def report(self, app: str) -> PieceReport:
        """The piece as its agent reports it once loaded."""
        return PieceReport(app, self.device, self.model, self.profile, self.weight, self.rate_rps, self.burst,
                           {"interface": self.interface} if self.interface is not None else {},
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


def pieces_of(cluster: Cluster, catalog: Catalog, model_sources: Mapping[str, str], placement: Placement,
              contract: App, key_sha256: str | None, interface: dict[str, Any] | None = None) -> list[Piece]:
    """``placement``'s shares as agent pieces, each with its part (its weight) of ``contract``'s rate (req/s)
    and burst, in placement order; ``key_sha256``: the app key's digest each piece carries (None: no key);
    ``interface``: the app's tensors, which every piece serves (None: each its variant's own)."""
    out = []
    for s in placement.shares:
        dev = cluster.devices[s.device]
        model, stand_in = agent_model(catalog.get(s.profile), model_sources)
        out.append(Piece(placement.app, dev.node, dev.name, dev.path, model, stand_in, s.profile, s.weight,
                         contract.rate_rps * s.weight, max(1.0, contract.burst * s.weight), s.fraction,
                         s.instances, key_sha256, interface))
    return out


def groups_of(pieces: list[Piece]) -> dict[str, Group]:
    """Pieces by node, nodes in the order they come, each node's pieces by device name."""
    out: dict[str, list[Piece]] = {}
    for p in pieces:
        out.setdefault(p.node, []).append(p)
    return {n: tuple(sorted(ps, key=lambda p: p.device)) for n, ps in out.items()}
