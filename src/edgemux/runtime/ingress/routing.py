"""Weighted round robin over an app's endpoints, with failover.

A placement with more than one share partitions an app's requests over devices (e.g. 0.6 / 0.4). The client
spreads requests with nginx's *smooth* weighted round robin: deterministic, interleaved (weights 3:2 give
``a b a b a``, not ``a a a b b``) and exact over every cycle of integer weights; float weights work the
same way, with counts never drifting from their shares. An endpoint that fails is marked down for a
cooldown (skipped, its share spread over the others in proportion), then tried again; a retry can exclude
the endpoint that just failed.

Times are seconds on the router's clock (``time.monotonic`` by default).
"""

from __future__ import annotations

import math
import numbers
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

from edgemux.cluster.state import Placement
from edgemux.errors import EdgemuxError
from edgemux.runtime.auth import is_digest
from edgemux.runtime.dataplane.protocol import TensorSpec, json_type, short_repr
from edgemux.runtime.httputil import quote
from edgemux.runtime.policing import TokenBucket

# How long a failed endpoint is skipped when mark_down is not told until when (seconds).
DEFAULT_COOLDOWN_S = 5.0


@dataclass(frozen=True)
class Endpoint:
    """Where requests for one share go: the ``device`` path (``node-3/tpu0``) and the ``url`` of the agent
    that serves it (empty when the device is served in-process)."""

    device: str
    url: str = ""
    # the hash of (device, url), computed once: every request looks endpoints up in a few dicts and sets
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.device, self.url)))

    def __hash__(self) -> int:
        return self._hash


class NoEndpointError(EdgemuxError):
    """No endpoint of ``app`` can take a request now (all down, excluded, or with zero weight).
    ``retry_after_s`` is the time in seconds until the first down endpoint comes back (None if none will)."""

    def __init__(self, app: str, detail: str, retry_after_s: float | None) -> None:
        super().__init__(f"app '{app}': no endpoint available ({detail})")
        self.app = app
        self.retry_after_s = retry_after_s


class WeightedRouter:
    """Smooth weighted round robin over one app's endpoints, skipping endpoints marked down.

    Thread-safe: the HTTP server may route one app from several threads.
    """

    def __init__(
        self,
        app: str,
        weights: Mapping[Endpoint, float] | Iterable[tuple[Endpoint, float]],
        clock: Callable[[], float] = time.monotonic,
        cooldown_s: float = DEFAULT_COOLDOWN_S,
    ) -> None:
        if not (math.isfinite(cooldown_s) and cooldown_s >= 0):
            raise ValueError(f"cooldown_s must be a finite number of seconds >= 0, got {cooldown_s!r}")
        self.app = app
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._lock = threading.Lock()
        self._weights: dict[Endpoint, float] = {}
        self._current: dict[Endpoint, float] = {}  # nginx's current_weight, per endpoint
        self._down: dict[Endpoint, float] = {}  # endpoint -> clock time (s) when it may be tried again
        self.update(weights)

    @classmethod
    def from_placement(
        cls,
        placement: Placement,
        urls: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        cooldown_s: float = DEFAULT_COOLDOWN_S,
    ) -> WeightedRouter:
        """A router over a placement's shares: one endpoint per device, weighted by the share's weight;
        ``urls`` maps device paths to agent URLs."""
        urls = urls or {}
        pairs = [(Endpoint(s.device, urls.get(s.device, "")), s.weight) for s in placement.shares]
        return cls(placement.app, pairs, clock=clock, cooldown_s=cooldown_s)

    @property
    def weights(self) -> dict[Endpoint, float]:
        """The endpoints and their weights (a copy)."""
        with self._lock:
            return dict(self._weights)

    def update(self, weights: Mapping[Endpoint, float] | Iterable[tuple[Endpoint, float]]) -> None:
        """Replace the endpoints and weights in place (routes republished after a migration or
        re-partitioning). Endpoints that stay keep their round-robin position and any down mark, so the
        interleaving continues without a jolt; new endpoints start fresh."""
        pairs = list(weights.items() if isinstance(weights, Mapping) else weights)
        new = _validated(self.app, pairs)
        with self._lock:
            self._weights = new
            self._current = {e: self._current.get(e, 0.0) for e in new}
            self._down = {e: t for e, t in self._down.items() if e in new}

    def pick(self, exclude: frozenset[Endpoint] = frozenset(), now: float | None = None) -> Endpoint:
        """The endpoint for the next request, skipping those marked down (until their cooldown ends), those
        in ``exclude`` (e.g. the one that just failed, on retry) and those with weight 0. ``now`` is seconds on
        the router's clock (default: read it). Raises :class:`NoEndpointError` when none is left."""
        with self._lock:
            if not self._down and not exclude and len(self._weights) == 1:
                # one endpoint, up: it earns its weight and pays it back (its current weight stays 0.0)
                ((e, w),) = self._weights.items()
                if w > 0:
                    return e
            t = self._clock() if now is None else now
            for e in [e for e, until in self._down.items() if until <= t]:
                del self._down[e]  # cooldown over: try it again
            eligible = [
                e for e, w in self._weights.items() if w > 0 and e not in exclude and e not in self._down
            ]
            if not eligible:
                raise self._none_left(exclude, t)
            # nginx: every eligible endpoint earns its weight; the richest is picked and pays the round's total.
            total = 0.0
            best = eligible[0]
            for e in eligible:
                self._current[e] += self._weights[e]
                total += self._weights[e]
                if self._current[e] > self._current[best]:
                    best = e  # strict '>' keeps ties in declaration order: deterministic
            self._current[best] -= total
            return best

    def mark_down(self, endpoint: Endpoint, until: float | None = None) -> None:
        """Skip ``endpoint`` until clock time ``until`` (seconds; default: now + cooldown_s), after a failure."""
        with self._lock:
            self._require(endpoint)
            self._down[endpoint] = self._clock() + self.cooldown_s if until is None else until

    def mark_up(self, endpoint: Endpoint) -> None:
        """Route to ``endpoint`` again now (e.g. its agent reported healthy)."""
        with self._lock:
            self._require(endpoint)
            self._down.pop(endpoint, None)

    def is_down(self, endpoint: Endpoint, now: float | None = None) -> bool:
        """Whether ``endpoint`` is skipped at ``now`` (seconds on the router's clock; default: read it)."""
        with self._lock:
            t = self._clock() if now is None else now
            return self._down.get(endpoint, -math.inf) > t

    def _require(self, endpoint: Endpoint) -> None:
        if endpoint not in self._weights:
            known = ", ".join(e.device for e in self._weights)
            raise ValueError(f"app '{self.app}' has no endpoint {endpoint.device!r} (endpoints: {known})")

    def _none_left(self, exclude: frozenset[Endpoint], t: float) -> NoEndpointError:
        parts = []
        down = [e for e in self._weights if e in self._down]
        if down:
            parts.append("down: " + ", ".join(f"{e.device} for {self._down[e] - t:.3g} s" for e in down))
        excluded = [e.device for e in self._weights if e in exclude and e not in self._down]
        if excluded:
            parts.append("excluded: " + ", ".join(excluded))
        zero = [e.device for e, w in self._weights.items() if w == 0 and e not in exclude and e not in self._down]
        if zero:
            parts.append("weight 0: " + ", ".join(zero))
        retry = min((self._down[e] - t for e in down), default=None)
        return NoEndpointError(self.app, "; ".join(parts), retry)


def _validated(app: str, pairs: list[tuple[Endpoint, float]]) -> dict[Endpoint, float]:
    if not pairs:
        raise ValueError(f"app '{app}': routes need at least one endpoint")
    out: dict[Endpoint, float] = {}
    for endpoint, weight in pairs:
        if not isinstance(endpoint, Endpoint):
            raise ValueError(f"app '{app}': endpoints must be Endpoint, got {endpoint!r}")
        if endpoint in out:
            raise ValueError(f"app '{app}': endpoint {endpoint.device!r} appears twice")
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not math.isfinite(weight) or weight < 0:
            raise ValueError(
                f"app '{app}': weight of endpoint {endpoint.device!r} must be a finite number >= 0, got {weight!r}"
            )
        out[endpoint] = float(weight)
    if not any(w > 0 for w in out.values()):
        raise ValueError(f"app '{app}': at least one endpoint needs a positive weight")
    return out


# ------------------------------------------------------------------------------------------ app routes


@dataclass(frozen=True)
class Target:
    """Where an endpoint URL points: connection key (scheme, host, port) and the path prefix."""

    scheme: str
    host: str
    port: int
    prefix: str


def parse_endpoint_url(url: str, app: str = "?") -> Target:
    """Where an endpoint URL points; ``ValueError`` naming ``app`` for a URL that cannot be one."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"app '{app}': endpoint URL must be http(s)://host[:port][/prefix], got {url!r}")
    if parts.query or parts.fragment:
        raise ValueError(f"app '{app}': endpoint URL must not have a query or fragment, got {url!r}")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ValueError(f"app '{app}': endpoint URL has a bad port: {url!r}") from None
    return Target(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))


EndpointLike = Union[str, Endpoint]


@dataclass(frozen=True, init=False)
class AppRoute:
    """What the client needs to serve one app, as the control plane publishes it.

    ``model`` is the model's name at the agents; ``endpoints`` are (agent URL or
    :class:`~edgemux.runtime.ingress.routing.Endpoint`, weight) pairs, the weights being the placement's workload
    partitioning shares (any non-negative scale; 0 = no traffic); ``rate_rps`` (requests per second) and
    ``burst`` (requests) are the app's policing contract; ``input`` is the model's image input, which lets
    :meth:`Client.infer` take a bare frame and pre-process it; ``model_version`` selects
    ``/v2/models/{model}/versions/{v}/infer`` when not empty; ``key_sha256`` is the SHA-256 digest of the app's
    key (``runtime.auth``), which a gateway with authentication on accepts for this app (None: the app has no
    key, only the admin token opens it).
    """

    app: str
    model: str
    endpoints: tuple[tuple[Endpoint, float], ...]
    rate_rps: float
    burst: float
    input: TensorSpec | None = None
    model_version: str = ""
    key_sha256: str | None = None

    def __init__(
        self,
        app: str,
        model: str,
        endpoints: Mapping[EndpointLike, float] | Iterable[tuple[EndpointLike, float]],
        rate_rps: float,
        burst: float,
        input: TensorSpec | None = None,
        model_version: str = "",
        key_sha256: str | None = None,
    ) -> None:
        # Hand-written so that callers may pass URLs, a mapping or any iterable; what is stored is canonical.
        if not isinstance(app, str) or not app:
            raise ValueError(f"app must be a non-empty string, got {app!r}")
        if not isinstance(model, str) or not model:
            raise ValueError(f"app '{app}': model must be a non-empty string, got {model!r}")
        pairs = list(endpoints.items() if isinstance(endpoints, Mapping) else endpoints)
        canon: list[tuple[Endpoint, float]] = []
        for item in pairs:
            try:
                where, weight = item
            except (TypeError, ValueError):
                raise ValueError(f"app '{app}': endpoints must be (url, weight) pairs, got {item!r}") from None
            ep = Endpoint(where, where) if isinstance(where, str) else where
            if not isinstance(ep, Endpoint):
                raise ValueError(f"app '{app}': an endpoint must be a URL or an Endpoint, got {where!r}")
            parse_endpoint_url(ep.url, app)  # refuse a malformed URL now, not at the first request
            if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not (
                math.isfinite(weight) and float(weight) >= 0
            ):
                raise ValueError(f"app '{app}': weight of {ep.url} must be a finite number >= 0, got {weight!r}")
            canon.append((ep, float(weight)))
        if not canon or not any(w > 0 for _, w in canon):
            raise ValueError(f"app '{app}': routes need at least one endpoint with a positive weight")
        if len({ep for ep, _ in canon}) != len(canon):
            raise ValueError(f"app '{app}': an endpoint appears twice in {[ep.url for ep, _ in canon]}")
        try:
            TokenBucket(rate_rps, burst, clock=lambda: 0.0)  # same checks (and messages) as the real bucket
        except ValueError as e:
            raise ValueError(f"app '{app}': {e}") from None
        if input is not None and not isinstance(input, TensorSpec):
            raise ValueError(f"app '{app}': input must be a TensorSpec or None, got {input!r}")
        if key_sha256 is not None and not is_digest(key_sha256):
            raise ValueError(f"app '{app}': key_sha256 must be 64 lowercase hex digits, got {short_repr(key_sha256)}")
        object.__setattr__(self, "app", app)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "endpoints", tuple(canon))
        object.__setattr__(self, "rate_rps", float(rate_rps))
        object.__setattr__(self, "burst", float(burst))
        object.__setattr__(self, "input", input)
        object.__setattr__(self, "model_version", str(model_version))
        object.__setattr__(self, "key_sha256", key_sha256)
        # every request of the app goes to this path: made once, not per request (not a field: not compared)
        object.__setattr__(self, "_infer_path", self.model_path("infer"))

    @property
    def infer_path(self) -> str:
        """The request path below an endpoint's URL, model name (and version) percent-encoded."""
        return str(self.__dict__["_infer_path"])

    def model_path(self, leaf: str, version: str = "") -> str:
        """The path below an endpoint's URL of this route's model: ``version`` when given (a caller asking
        for one), else the route's own, then ``leaf`` (``infer``, ``ready``, or "" for the metadata), the
        names percent-encoded."""
        path = "/v2/models/" + quote(self.model)
        version = version or self.model_version
        if version:
            path += "/versions/" + quote(version)
        return path + ("/" + leaf if leaf else "")

    def to_json(self) -> dict[str, Any]:
        """This route as the ``PUT /v1/routes/{app}`` message (see :func:`route_to_json`)."""
        return route_to_json(self)

    @classmethod
    def from_json(cls, app: str, doc: Any) -> AppRoute:
        """The route a ``PUT /v1/routes/{app}`` message describes; :class:`RouteError` lists every problem."""
        return route_from_json(app, doc)


class RouteError(ValueError):
    """A pushed route is invalid: ``reasons`` are ``"field: problem"`` lines, all of them at once."""

    def __init__(self, app: str, reasons: list[str]) -> None:
        super().__init__(f"invalid route for app '{app}': " + "; ".join(reasons))
        self.app = app
        self.reasons = reasons


# ------------------------------------------------------------------------------------------ route JSON


_ROUTE_FIELDS = {"model", "model_version", "endpoints", "rate_rps", "burst", "app", "key_sha256"}
_ENDPOINT_FIELDS = {"url", "weight", "device"}


def route_from_json(app: str, doc: Any) -> AppRoute:
    """The :class:`~edgemux.runtime.ingress.routing.AppRoute` described by a ``PUT /v1/routes/{app}`` body (parsed
    JSON); raises :class:`RouteError` listing every problem as ``"field: problem"``."""
    if not isinstance(doc, dict):
        raise RouteError(app, [f"body: must be a JSON object, got {json_type(doc)}"])
    reasons = [f"{k}: unknown field (known: {', '.join(sorted(_ROUTE_FIELDS))})" for k in doc if k not in _ROUTE_FIELDS]
    if "app" in doc and doc["app"] != app:
        reasons.append(f"app: {doc['app']!r} differs from the app in the path, {app!r}")
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        reasons.append(f"model: must be a non-empty string, got {short_repr(model)}")
    version = doc.get("model_version", "")
    if not isinstance(version, str):
        reasons.append(f"model_version: must be a string, got {short_repr(version)}")
    key = doc.get("key_sha256")
    if key is not None and not is_digest(key):
        reasons.append(f"key_sha256: must be 64 lowercase hex digits (an app key's SHA-256), got {short_repr(key)}")
    for name, low, strict in (("rate_rps", 0.0, True), ("burst", 1.0, False)):
        v = _finite(doc.get(name))
        if v is None or v < low or (strict and v == low):
            reasons.append(f"{name}: must be a finite number {'>' if strict else '>='} {low:g}, got {short_repr(doc.get(name))}")
    pairs: list[tuple[Endpoint, float]] = []
    raw_eps = doc.get("endpoints")
    if not isinstance(raw_eps, list) or not raw_eps:
        reasons.append(f"endpoints: must be a non-empty list of {{url, weight}} objects, got {short_repr(raw_eps)}")
        raw_eps = []
    for i, raw in enumerate(raw_eps):
        where = f"endpoints[{i}]"
        if not isinstance(raw, dict):
            reasons.append(f"{where}: must be an object with url and weight, got {json_type(raw)}")
            continue
        reasons += [f"{where}.{k}: unknown field" for k in raw if k not in _ENDPOINT_FIELDS]
        url, weight, device = raw.get("url"), _finite(raw.get("weight")), raw.get("device", raw.get("url"))
        ok = True
        if not isinstance(url, str) or not url:
            reasons.append(f"{where}.url: must be an http(s) URL string, got {short_repr(url)}")
            ok = False
        else:
            problem = _url_problem(url)
            if problem:
                reasons.append(f"{where}.url: {problem}")
                ok = False
        if weight is None or weight < 0:
            reasons.append(f"{where}.weight: must be a finite number >= 0, got {short_repr(raw.get('weight'))}")
            ok = False
        if not isinstance(device, str) or not device:
            reasons.append(f"{where}.device: must be a non-empty string, got {short_repr(device)}")
            ok = False
        if ok:
            assert weight is not None and isinstance(url, str) and isinstance(device, str)
            pairs.append((Endpoint(device, url), weight))
    if reasons:
        raise RouteError(app, reasons)
    try:
        # AppRoute judges what spans fields: duplicates, at least one positive weight.
        rate, burst = _finite(doc["rate_rps"]), _finite(doc["burst"])
        assert isinstance(model, str) and rate is not None and burst is not None  # checked above
        return AppRoute(app, model, pairs, rate, burst, model_version=version, key_sha256=key)
    except ValueError as e:
        raise RouteError(app, [f"endpoints: {e}"]) from None


def route_to_json(route: AppRoute) -> dict[str, Any]:
    """An :class:`~edgemux.runtime.ingress.routing.AppRoute` as a ``PUT /v1/routes/{app}`` body."""
    return {
        "model": route.model,
        "model_version": route.model_version,
        "endpoints": [{"url": ep.url, "weight": w, "device": ep.device} for ep, w in route.endpoints],
        "rate_rps": route.rate_rps,
        "burst": route.burst,
        **({"key_sha256": route.key_sha256} if route.key_sha256 is not None else {}),
    }


def _finite(v: Any) -> float | None:
    """``v`` as a float when it is a finite JSON number, else None (JSON integers may be too large for a
    float, and booleans are not numbers here)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _url_problem(url: str) -> str:
    """Why ``url`` cannot be an endpoint URL ("" if it can). AppRoute is the one judge of endpoint URLs,
    so a one-endpoint route is built to ask it."""
    try:
        AppRoute("probe", "probe", [(url, 1.0)], 1.0, 1.0)
    except ValueError as e:
        return str(e).removeprefix("app 'probe': ")
    return ""
