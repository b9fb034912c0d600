"""An agent's apps: the *pieces* each app is served by on this node (one per device it is routed to: model,
profile, weight, contract), the models loaded for them, and the token bucket each app's contract gives it here.

- :class:`Piece`: one app on one device (what ``PUT /v1/apps/{app}`` installs and ``GET /v1/apps`` shows);
- :class:`PieceTable`: every app's pieces and the order its requests take over them (smooth weighted round
  robin), registering and unregistering apps (loading a model once per (source, profile) and device,
  unloading it after its last app leaves and its in-flight requests finish, make before break);
- :class:`Contracts`: each app's token bucket here, from its pieces' contracts (``adapt.police.Policing``,
  the gateway's rule): the requests that did not pass a gateway are policed with it, those that did only
  take their token (they were policed at the gateway).

Units: ``rate_rps`` req/s, ``burst`` requests, ``*_s`` seconds.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import math
import re
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from edgemux.adapt.police import Policing
from edgemux.cluster.state import Device, Node
from edgemux.cluster.disciplines import traits
from edgemux.errors import EdgemuxError, InputError
from edgemux.profiles.catalog import Catalog
from edgemux.profiles.types import Profile
from edgemux.runtime.auth import is_digest
from edgemux.runtime.dataplane.backends import Backend, BackendError, ModelInfo, ModelNotFound, ModelSource
from edgemux.runtime.dataplane.devices import DeviceSet, listing
from edgemux.runtime.dataplane.errors import AgentError, OverContract
from edgemux.runtime.dataplane.instances import SpatialConfigError
from edgemux.runtime.dataplane.interface import Converter, Interface, InterfaceError
from edgemux.runtime.dataplane.protocol import json_type, short_repr
from edgemux.runtime.httputil import clip
from edgemux.runtime.policing import TokenBucket

__all__ = ["Contracts", "Piece", "PieceTable", "check_app_name"]

logger = logging.getLogger("edgemux.agent")

# App names become URL path segments and Prometheus label values: keep them to one safe, bounded token.
_APP_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:+-]{0,127}$")
_PUT_FIELDS = ("device", "model", "profile", "weight", "rate_rps", "burst", "fraction", "instances", "key_sha256",
               "interface")


@dataclass(frozen=True)
class Piece:
    """One app on one device of this agent: ``device`` (name on the node) and ``model`` (the backend's model
    key: the normalized source string, plus ``#profile`` when loaded with a profile), loaded with ``profile``
    (catalog name, or None); ``weight`` is the app's routing share here (0, 1], as the control plane placed
    it; ``info`` the loaded model; ``source`` the normalized source string (what is reported as the app's
    model); ``rate_rps`` (req/s) and ``burst`` (requests) this piece's part of the app's contract (None: not
    policed here); on a spatial device ``instances`` instances each holding ``fraction`` of it (1 and 1
    elsewhere); ``key_sha256`` the digest of the app's key (``runtime.auth``), which opens the app's
    inference here when the agent takes app keys (None: only the admin token does). ``converter`` feeds the
    loaded variant through the app's interface when the spec gave one (``runtime.dataplane.interface``; None:
    clients see the variant's own tensors)."""

    app: str
    device: str
    model: str
    profile: str | None
    weight: float
    info: ModelInfo
    created_at: float = field(default_factory=time.time)  # Unix s
    source: str = ""
    rate_rps: float | None = None
    burst: float | None = None
    fraction: float = 1.0
    instances: int = 1
    key_sha256: str | None = None
    converter: Converter | None = field(default=None, compare=False)

    @property
    def interface(self) -> Interface:
        """The tensors clients send and receive: the app's interface, else the variant's own."""
        return self.converter.interface if self.converter is not None else Interface.of(self.info)

    def as_dict(self, node: str) -> dict[str, Any]:
        """Plain values for ``GET /v1/apps`` and the control-plane messages."""
        return {
            "app": self.app, "device": self.device, "device_path": f"{node}/{self.device}",
            "model": self.source or self.model,
            "profile": self.profile, "weight": self.weight, "rate_rps": self.rate_rps, "burst": self.burst,
            "fraction": self.fraction, "instances": self.instances, "key_sha256": self.key_sha256,
            "emulated": self.info.emulated,
            "backend": self.info.backend, "inputs": self.info.as_dict()["inputs"],
            "outputs": self.info.as_dict()["outputs"], "provenance": self.info.provenance,
            "created_at": self.created_at,
            **({"interface": self.converter.interface.as_dict()} if self.converter is not None else {}),
        }


class _PieceSpec(NamedTuple):
    """One piece of a ``PUT /v1/apps/{app}`` body, checked: its device, the backend's load key, profile name,
    source and normalized source text, weight, contract (req/s, requests; None: not policed) and, on a
    spatial device, its share per instance and instance count."""

    device: Device
    key: str
    profile: str | None
    source: ModelSource
    text: str
    weight: float
    rate: float | None
    burst: float | None
    fraction: float
    instances: int
    key_sha256: str | None
    interface: Interface | None


class _Rotation:
    """An app's pieces on this agent and the order requests take over them: smooth weighted round robin
    (nginx's), unrolled once into a cycle so that picking is one ``next`` (atomic under the GIL, no lock
    on the inference path). Weights are compared in thousandths, so the cycle is at most 1000 long."""

    def __init__(self, pieces: tuple[Piece, ...]) -> None:
        self.pieces = pieces
        if len(pieces) == 1:
            self._order: Iterator[Piece] = itertools.repeat(pieces[0])
            return
        units = [max(1, round(r.weight * 1000)) for r in pieces]
        g = functools.reduce(math.gcd, units)
        units = [u // g for u in units]
        current = [0] * len(pieces)
        seq = []
        for _ in range(sum(units)):
            for i, u in enumerate(units):
                current[i] += u
            best = max(range(len(pieces)), key=lambda i: (current[i], -i))
            current[best] -= sum(units)
            seq.append(pieces[best])
        self._order = itertools.cycle(seq)

    def next(self) -> Piece:
        return next(self._order)


def check_app_name(app: str) -> None:
    """``AgentError`` (400) for a name that cannot be an app's: 1 to 128 letters, digits and ``_ . : + -``,
    starting with a letter or digit (it becomes a URL path segment and a metric label)."""
    if not _APP_NAME_RE.match(app):
        raise AgentError(f"bad app name '{clip(app)}': use 1 to 128 letters, digits and _ . : + - "
                         f"(starting with a letter or digit)")


class Contracts:
    """Each app's token bucket on this agent, from its pieces' contracts summed (``policing``: the gateway's
    rule turning a contract into a bucket). An app without a contract on any piece is not policed here.
    Read on the inference path (one dict lookup and the bucket's own lock)."""

    def __init__(self, policing: Policing) -> None:
        self.policing = policing
        self._buckets: dict[str, TokenBucket] = {}

    def set(self, app: str, pieces: Sequence[Piece]) -> None:
        """Set ``app``'s bucket from its pieces' contracts, keeping the tokens of the bucket it had."""
        contracted = [(r.rate_rps, r.burst) for r in pieces if r.rate_rps is not None and r.burst is not None]
        if not contracted:
            self._buckets.pop(app, None)
            return
        rate, burst = self.policing.contract(math.fsum(c[0] for c in contracted), math.fsum(c[1] for c in contracted))
        bucket = self._buckets.get(app)
        if bucket is None:
            self._buckets[app] = TokenBucket(rate, burst)
        else:
            bucket.reconfigure(rate, burst)

    def drop(self, app: str) -> None:
        """Forget ``app``'s bucket (the app left)."""
        self._buckets.pop(app, None)

    def police(self, app: str) -> float:
        """Take a token of ``app``'s bucket for a request that did not pass a gateway: the wait (s) before it
        may go to the device (0.0: now, or the app is not policed here). ``OverContract`` (429) when the
        token would come later than ``policing.max_wait_s``, with the seconds until one would come."""
        bucket = self._buckets.get(app)
        if bucket is None:
            return 0.0
        admission = bucket.admit(self.policing.max_wait_s)
        if not admission.admitted:
            raise OverContract(app, admission.retry_after_s)
        return admission.wait_s

    def charge(self, app: str) -> None:
        """Take a token of ``app``'s bucket for a request a gateway policed already, never waiting or
        refusing: the bucket then holds what the app sent here through every path, so a client that also
        calls this agent directly gets only what the gateway's traffic left of the contract."""
        bucket = self._buckets.get(app)
        if bucket is not None:
            bucket.try_acquire()


class PieceTable:
    """Every app routed to this agent and its pieces (see the module docstring). ``devices``: the node's
    devices, backends and workers; ``catalog`` the profiles a piece may name; ``cache_dir`` where zoo models
    are built; ``model_dirs`` the directories an ONNX file must be in (None: any path); ``unload_drain_s``
    how long removing an app waits for its in-flight requests before unloading its model (s);
    ``contracts`` the apps' buckets, set as their pieces change.

    Inference only reads the table (one dict lookup, atomic under the GIL); control operations (register,
    unregister, each possibly loading a model for seconds) are serialized by a lock of their own."""

    def __init__(self, node: Node, devices: DeviceSet, contracts: Contracts, *, catalog: Catalog,
                 cache_dir: str | None, model_dirs: tuple[Path, ...] | None, unload_drain_s: float) -> None:
        self.node = node
        self.devices = devices
        self.contracts = contracts
        self.catalog = catalog
        self.cache_dir = cache_dir
        self.model_dirs = model_dirs
        self.unload_drain_s = unload_drain_s
        self._apps: dict[str, _Rotation] = {}  # app -> its pieces (sorted by device name) and their order
        self._control = threading.RLock()
        self.closing = False

    # -- lookups ---------------------------------------------------------------------------------------

    def __contains__(self, app: str) -> bool:
        return app in self._apps

    def next_piece(self, app: str) -> Piece:
        """The piece of ``app`` the next request goes to (smooth weighted round robin over its pieces; the
        only one for an app on one device); ``AgentError`` 404 naming the known apps otherwise."""
        return self._rotation(app).next()

    def pieces(self, app: str) -> tuple[Piece, ...]:
        """Every piece of ``app``, by device name; ``AgentError`` 404 naming the known apps otherwise."""
        return self._rotation(app).pieces

    def _rotation(self, app: str) -> _Rotation:
        p = self._apps.get(app)
        if p is None:
            raise AgentError(f"unknown app '{clip(app)}' on node {self.node.name} (apps: {listing(self._apps)})", 404)
        return p

    def all_pieces(self) -> list[Piece]:
        """Every piece of every app, by app and device name."""
        # a snapshot first: control threads may change the table meanwhile
        return [r for _, p in sorted(list(self._apps.items())) for r in p.pieces]

    def app_dict(self, app: str) -> dict[str, Any]:
        """``GET /v1/apps/{app}``: the piece's fields, or for a split app its pieces under ``pieces``."""
        pieces = self.pieces(app)
        if len(pieces) == 1:
            return pieces[0].as_dict(self.node.name)
        items = [r.as_dict(self.node.name) for r in pieces]
        return {"app": app, "weight": sum(r.weight for r in pieces), "pieces": items,
                "emulated": all(r.info.emulated for r in pieces),
                "inputs": items[0]["inputs"], "outputs": items[0]["outputs"]}

    def key_of(self, app: str) -> str | None:
        """The digest of ``app``'s key here (None: unknown app, or no key)."""
        pieces = self._apps.get(app)
        return pieces.pieces[0].key_sha256 if pieces is not None else None

    def key_owner(self, key_sha256: str) -> str | None:
        """The app here whose key has this digest (None: none)."""
        return next((a for a, p in list(self._apps.items()) if p.pieces[0].key_sha256 == key_sha256), None)

    def close(self) -> None:
        """Refuse registrations from now on (the agent is stopping). Without the control lock: the event loop
        calls it, and a registration may hold the lock for seconds; one already past its check completes."""
        self.closing = True

    # -- control ---------------------------------------------------------------------------------------

    def register(self, app: str, spec: Any) -> tuple[Piece, bool]:
        """Route ``app`` per ``spec`` (the ``PUT /v1/apps/{app}`` body, already parsed from JSON: one piece,
        or ``{"pieces": [...]}``), loading models when needed. Returns (the app's first piece, created).
        Blocking (a load may take seconds): the HTTP layer calls it on a thread. Raises
        ``AgentError``/``BackendError`` with the HTTP status; nothing changes when it raises."""
        check_app_name(app)
        if not isinstance(spec, dict):
            raise AgentError(f"app spec must be a JSON object, got {json_type(spec)}")
        if "pieces" in spec:
            extra = sorted(k for k in spec if k != "pieces")
            if extra:
                raise AgentError(f"unknown field '{clip(str(extra[0]))}' beside 'pieces' in the app spec "
                                 "(a split app's fields go in each piece)")
            items = spec["pieces"]
            if not isinstance(items, list) or not items:
                raise AgentError(f"'pieces' must be a non-empty list of piece objects, got {short_repr(items)}")
            where = [f"pieces[{i}]: " for i in range(len(items))]
        else:
            items, where = [spec], [""]
        wanted = [self._piece_spec(item, w) for item, w in zip(items, where)]
        names = [w.device.name for w in wanted]
        dup = sorted({d for d in names if names.count(d) > 1})
        if dup:
            raise AgentError(f"two pieces on device {dup[0]}: an app has at most one piece per device")

        workers = self.devices.workers
        with self._control:
            if self.closing:
                raise AgentError(f"agent of node {self.node.name} is stopping", 503)
            off = [d for d in names if workers[d].power_state == "off"]
            if off:
                raise AgentError(f"device {workers[off[0]].device.path} is switched off: switch it on "
                                 f"(PUT /v1/devices/{off[0]}/power) before placing an app there", 409)
            old = self._apps.get(app)
            old_by_device = {r.device: r for r in old.pieces} if old is not None else {}
            loaded: list[Piece] = []  # models this call loaded, released again if it fails
            pieces = []
            configured: list[Piece] = []  # spatial instances this call set up, removed again if it fails
            reshare: list[tuple[Piece, Piece]] = []  # (old, new) pieces whose instances change
            done: list[tuple[Piece, Piece]] = []
            try:
                for w in wanted:
                    dev, key = w.device, w.key
                    prev = old_by_device.get(dev.name)
                    if prev is not None and prev.model == key:
                        # same model: the weight and the contract change, and on a spatial device the
                        # instances are re-shared with overlap (the old ones serve until the new are warm)
                        piece = dataclasses.replace(prev, weight=w.weight, rate_rps=w.rate, burst=w.burst,
                                                    fraction=w.fraction, instances=w.instances,
                                                    key_sha256=w.key_sha256,
                                                    converter=self._converter(w, prev.info))
                        if (prev.fraction, prev.instances) != (w.fraction, w.instances):
                            reshare.append((prev, piece))
                        pieces.append(piece)
                        continue
                    info = self._load(self.devices.backends[dev.name], dev, key, w.source)
                    piece = Piece(app, dev.name, key, w.profile, w.weight, info, source=w.text, rate_rps=w.rate,
                                  burst=w.burst, fraction=w.fraction, instances=w.instances,
                                  key_sha256=w.key_sha256)
                    loaded.append(piece)
                    piece = dataclasses.replace(piece, converter=self._converter(w, info))
                    if traits(workers[dev.name].discipline).spatial:
                        # a worker keeps one set of instances per app: another model for the app here
                        # replaces its old instances (break before make, unlike a re-share)
                        if prev is not None:
                            self._remove_instances(prev)
                        self._configure(piece)
                        configured.append(piece)
                    pieces.append(piece)
                _check_same_tensors(app, pieces)
                for prev, piece in reshare:  # last: only when everything else is in place
                    self._configure(piece)
                    done.append((prev, piece))
            except BaseException:
                for prev, _ in reversed(done):
                    self._configure(prev)  # back to the instances it had (overlapped again)
                for r in configured:
                    self._remove_instances(r)
                for r in loaded:
                    self._release(r)
                raise
            self._apps[app] = _Rotation(tuple(sorted(pieces, key=lambda r: r.device)))
            self.contracts.set(app, pieces)
            kept = {(r.device, r.model) for r in pieces}
            for r in old.pieces if old is not None else ():
                if (r.device, r.model) not in kept:
                    # make before break: the new models are loaded and routed before the old ones go
                    if r.device not in {p.device for p in pieces}:
                        self._remove_instances(r)
                    self._release(r)
            for r in loaded:
                logger.info("app %s -> %s model %s%s", app, self.devices.devices[r.device].path, r.model,
                            " (emulated)" if r.info.emulated else "")
            return self._apps[app].pieces[0], old is None

    def unregister(self, app: str) -> dict[str, Any]:
        """Unroute ``app`` and unload its model when no other app on its device uses it (after its in-flight
        requests finish, at most ``unload_drain_s``). Returns what happened; ``AgentError`` 404 if unknown."""
        with self._control:
            pieces = self.pieces(app)
            del self._apps[app]
            self.contracts.drop(app)
            for r in pieces:
                self._remove_instances(r)
            unloaded = [self._release(r) for r in pieces]
        for r, u in zip(pieces, unloaded):
            logger.info("app %s removed from %s%s", app, r.device, f"; model {r.model} unloaded" if u else "")
        if len(pieces) == 1:
            r = pieces[0]
            return {"app": app, "device": r.device, "model": r.source or r.model, "unloaded": unloaded[0]}
        return {"app": app, "pieces": [{"device": r.device, "model": r.source or r.model, "unloaded": u}
                                       for r, u in zip(pieces, unloaded)]}

    def _configure(self, piece: Piece) -> None:
        """Set up or re-share ``piece``'s instances on its spatial device (``DeviceWorker.configure_app``: a
        change is made with overlap)."""
        try:
            self.devices.workers[piece.device].configure_app(piece.app, piece.model, share=piece.fraction,
                                                             instances=piece.instances)
        except SpatialConfigError as e:
            raise AgentError(f"device {self.devices.devices[piece.device].path}: {e.message}", e.status) from None

    def _remove_instances(self, piece: Piece) -> None:
        """Release ``piece``'s instances when its device is spatial (its queued requests run first)."""
        worker = self.devices.workers[piece.device]
        if traits(worker.discipline).spatial:
            try:
                worker.remove_app(piece.app)
            except BackendError:
                pass  # none there (its set-up failed): nothing to release

    def _piece_spec(self, spec: Any, where: str) -> _PieceSpec:
        """What one piece's spec asks for."""
        if not isinstance(spec, dict):
            raise AgentError(f"{where}a piece must be a JSON object, got {json_type(spec)}")
        extra = sorted(k for k in spec if k not in _PUT_FIELDS)
        if extra:
            raise AgentError(f"{where}unknown field '{clip(str(extra[0]))}' in the app spec (known: "
                             f"{', '.join(_PUT_FIELDS)}{', pieces' if not where else ''})")
        if "device" not in spec:
            raise AgentError(f"{where}missing field 'device' in the app spec")
        dev = self.devices.device(spec["device"])
        model_text = spec.get("model")
        if not isinstance(model_text, str) or not model_text.strip():
            raise AgentError(f"{where}'model' must be a non-empty string (zoo:NAME[@SIZE] or an ONNX file path), "
                             f"got {short_repr(model_text)}")
        weight = spec.get("weight", 1.0)
        if (isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight)
                or not 0 < weight <= 1):
            raise AgentError(f"{where}'weight' must be a number in (0, 1], got {short_repr(weight)}")
        rate, burst = spec.get("rate_rps"), spec.get("burst")
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float))
                                 or not math.isfinite(rate) or rate <= 0):
            raise AgentError(f"{where}'rate_rps' must be a number > 0 (req/s), got {short_repr(rate)}")
        if burst is not None and (isinstance(burst, bool) or not isinstance(burst, (int, float))
                                  or not math.isfinite(burst) or burst < 1):
            raise AgentError(f"{where}'burst' must be a number >= 1 (requests), got {short_repr(burst)}")
        if burst is not None and rate is None:
            raise AgentError(f"{where}'burst' without 'rate_rps': a contract needs its rate")
        fraction, instances = spec.get("fraction", 1.0), spec.get("instances", 1)
        if (isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not math.isfinite(fraction)
                or not 0 < fraction <= 1):
            raise AgentError(f"{where}'fraction' must be a number in (0, 1] (the share of the device each "
                             f"instance holds), got {short_repr(fraction)}")
        if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
            raise AgentError(f"{where}'instances' must be an integer >= 1, got {short_repr(instances)}")
        if (fraction, instances) != (1.0, 1) and not traits(dev.discipline).spatial:
            raise AgentError(f"{where}'fraction' and 'instances' apply to spatial devices; device {dev.path} is "
                             f"{dev.discipline.value}")
        key_sha256 = spec.get("key_sha256")
        if key_sha256 is not None and not is_digest(key_sha256):
            raise AgentError(f"{where}'key_sha256' must be 64 lowercase hex digits (an app key's SHA-256), got "
                             f"{short_repr(key_sha256)}")
        backend = self.devices.backends[dev.name]
        profile = self._profile(spec.get("profile"), dev, backend, model_text)
        source = self._source(model_text.strip(), profile)
        src = source.describe()
        pname = profile.name if profile is not None else None
        # one loaded copy per (source, profile): two catalog models sharing a graph (a stand-in) are two
        # models on the device, each with its own timing and switch cost
        key = src if pname is None else f"{src}#{pname}"
        return _PieceSpec(dev, key, pname, source, src, float(weight), None if rate is None else float(rate),
                          None if rate is None else float(burst if burst is not None else 1.0), float(fraction),
                          instances, key_sha256, self._interface(spec.get("interface"), where))

    @staticmethod
    def _interface(doc: Any, where: str) -> Interface | None:
        if doc is None:
            return None
        try:
            return Interface.parse(doc, f"{where}interface")
        except InterfaceError as e:
            raise AgentError(str(e)) from None

    @staticmethod
    def _converter(w: _PieceSpec, info: ModelInfo) -> Converter | None:
        """The converter feeding ``info`` through the piece's interface (None without one)."""
        if w.interface is None:
            return None
        try:
            return Converter(w.interface, info)
        except InterfaceError as e:
            raise AgentError(f"app interface on device {w.device.path}, model {w.text}: {e}") from None

    def _profile(self, name: Any, dev: Device, backend: Backend, model: str) -> Profile | None:
        if name is None:
            if backend.emulated:
                hint = ""
                if model.startswith("zoo:"):
                    found = self.catalog.find_all(model[4:].partition("@")[0], dev.kind)
                    if found:
                        hint = f", e.g. {', '.join(p.name for p in found[:3])}"
                raise AgentError(f"device {dev.path} is emulated: the app spec needs a 'profile' "
                                 f"({dev.kind.value} profiles drive its service times{hint})")
            return None
        if not isinstance(name, str):
            raise AgentError(f"'profile' must be a string, got {json_type(name)}")
        try:
            profile = self.catalog.get(name)
        except InputError as e:
            raise AgentError(e.problem, 404) from None
        if profile.device_kind is not dev.kind:
            raise AgentError(f"profile {profile.name} is for {profile.device_kind.value} devices, but device "
                             f"{dev.path} is {dev.kind.value}")
        return profile

    def _source(self, text: str, profile: Profile | None) -> ModelSource:
        source = ModelSource.parse(text, profile=profile)  # BackendError (400) for a bad size
        if source.zoo is not None:
            from edgemux.runtime import zoo

            if source.zoo not in zoo.MODELS:
                raise AgentError(f"unknown zoo model '{clip(source.zoo)}' (known: {', '.join(zoo.MODELS)})", 404)
            source = dataclasses.replace(source, cache_dir=self.cache_dir)
        elif source.path is not None and self.model_dirs is not None:
            where = Path(source.path).resolve()
            if not any(where.is_relative_to(d) for d in self.model_dirs):
                allowed = ", ".join(str(d) for d in self.model_dirs) or "none: start the agent with --model-dir DIR"
                raise AgentError(f"model path {clip(source.path)} is outside the directories this agent loads ONNX "
                                 f"files from ({allowed}); zoo models (zoo:NAME) are always allowed", 403)
        return source

    def _load(self, backend: Backend, dev: Device, key: str, source: ModelSource) -> ModelInfo:
        try:
            return backend.load(key, source)
        except BackendError as e:
            raise BackendError(f"cannot load model '{key}' on device {dev.path}: {e.message}", e.status) from None
        except EdgemuxError as e:  # e.g. a zoo size below the network's stride
            raise AgentError(f"cannot load model '{key}' on device {dev.path}: {e}") from None
        except Exception as e:  # a file that is not a model (protobuf errors...): the request's fault
            logger.warning("loading %s on %s failed: %r", key, dev.path, e)
            raise AgentError(f"cannot load model '{key}' on device {dev.path}: {e}") from None

    def _release(self, piece: Piece) -> bool:
        """Unload ``piece``'s model when no app uses it on its device any more; True when unloaded."""
        if any(r.device == piece.device and r.model == piece.model for p in self._apps.values() for r in p.pieces):
            return False
        # let requests already accepted finish instead of failing them with "not loaded"
        self.devices.drain(piece.device, piece.model, self.unload_drain_s)
        try:
            self.devices.backends[piece.device].unload(piece.model)
        except ModelNotFound:
            return False
        return True


def _check_same_tensors(app: str, pieces: list[Piece]) -> None:
    """A split app answers with one model metadata: every piece must serve the same tensors (its variant's own,
    or through the app's interface)."""
    first = pieces[0]
    want = first.interface.as_dict()
    for r in pieces[1:]:
        got = r.interface.as_dict()
        for side in ("inputs", "outputs"):
            if got[side] != want[side]:
                raise AgentError(f"the pieces of app '{clip(app)}' serve different tensors: on device {first.device} "
                                 f"its model's {side} are {_tensors(want[side])}, on device {r.device} "
                                 f"{_tensors(got[side])} (give the app one 'interface' to serve both through)")


def _tensors(items: list[dict[str, Any]]) -> str:
    return "[" + ", ".join(f"{t.get('name')} {t.get('datatype')} {t.get('shape')}" for t in items) + "]"
