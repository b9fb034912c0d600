"""The ingress core: what the Python client and the gateway decide about a request, written once and without
I/O, so that the synchronous client and the asynchronous gateway run the same policing, routing and failover.

* :class:`RouteTable` holds each app's :class:`~edgemux.runtime.ingress.routing.AppRoute` with its token bucket, its
  weighted round-robin router and the last failure of each endpoint; a republished route keeps the bucket's
  tokens (capped at the new burst), the router's position and the cooldowns of endpoints that stay.
* :func:`police` admits a request against its app's bucket: the wait (s) before it may be sent, or
  :class:`RateLimited` when its token would come later than the caller's ``max_wait_s``.
* :class:`Attempts` is one admitted request on its way: which endpoint to try next (at most one attempt per
  endpoint, one token however many), what a reply means (:func:`verdict`), what marks an endpoint down (its
  cooldown, or the server's ``Retry-After``), and the :class:`Unavailable` error naming every endpoint when
  none is left.

The callers do the I/O: the client over ``http.client`` on the caller's thread, the gateway over ``aiohttp``
on its event loop. Times are seconds on the injected ``clock``.
"""

from __future__ import annotations

import http.client
import json
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from edgemux.adapt.police import Policing
from edgemux.errors import EdgemuxError
from edgemux.runtime.policing import TokenBucket
from edgemux.runtime.ingress.routing import (
    AppRoute,
    Endpoint,
    NoEndpointError,
    WeightedRouter,
)

# Error messages quoted from a server are cut to this many characters to keep errors one readable line.
QUOTE_LIMIT = 300


# ------------------------------------------------------------------------------------------------- errors


class RateLimited(EdgemuxError):
    """The app is over its contracted rate: retry after ``retry_after_s`` seconds. ``source`` is ``"client"``
    when the local token bucket refused it (nothing was sent), ``"gateway"`` for the gateway's bucket, else
    the URL of the endpoint that answered 429. The HTTP layer maps this to 429 with ``Retry-After``."""

    def __init__(self, app: str, retry_after_s: float, source: str = "client", detail: str = "") -> None:
        self.app = app
        self.retry_after_s = retry_after_s
        self.source = source
        where = "by the client's token bucket" if source == "client" else f"by {source}"
        extra = f": {detail}" if detail else ""
        super().__init__(f"app '{app}': rate limited {where}; retry after {retry_after_s:.3g} s{extra}")


class RequestError(EdgemuxError):
    """An endpoint refused the request as bad (HTTP 4xx other than 429): not retried elsewhere, since every
    endpoint would refuse it too. ``status`` is the HTTP status and ``message`` the server's ``error``."""

    def __init__(self, app: str, endpoint: str, status: int, message: str) -> None:
        self.app = app
        self.endpoint = endpoint
        self.status = status
        self.message = message
        super().__init__(f"app '{app}': {endpoint} answered HTTP {status}: {message}")


class Unavailable(EdgemuxError):
    """No endpoint of ``app`` could serve the request. ``failures`` maps each endpoint URL to why it failed
    (or why it was skipped); ``retry_after_s`` is the time in seconds until the first endpoint in cooldown
    may be tried again (None when not known). The HTTP layer maps this to 503."""

    def __init__(self, app: str, failures: Mapping[str, str], retry_after_s: float | None = None) -> None:
        self.app = app
        self.failures = dict(failures)
        self.retry_after_s = retry_after_s
        listed = "; ".join(f"{url} ({why})" for url, why in self.failures.items()) or "no endpoint"
        super().__init__(f"app '{app}': no endpoint could serve the request: {listed}")


# ------------------------------------------------------------------------------------------------ replies


@dataclass
class Reply:
    """An endpoint's answer: HTTP ``status``, ``headers`` (anything with a case-insensitive ``get``) and
    ``body``; ``wire``: the whole answer as it came (status line, head and body) when the gateway may pass
    it on byte for byte (None otherwise, and in the client)."""

    status: int
    headers: Any
    body: bytes
    wire: bytes | None = None


def server_message(reply: Reply) -> str:
    """The server's ``{"error": ...}`` message, else the start of its body as text."""
    try:
        doc = json.loads(reply.body.decode("utf-8"))
        if isinstance(doc, dict) and isinstance(doc.get("error"), str):
            return str(doc["error"][:QUOTE_LIMIT])
    except (UnicodeDecodeError, ValueError, RecursionError):
        pass
    text = reply.body[:QUOTE_LIMIT].decode("utf-8", "replace").strip()
    return text or (reply.headers.get("Reason") or http.client.responses.get(reply.status, "no message"))


def reply_retry_after(reply: Reply) -> float | None:
    """Retry-After in seconds (delta-seconds form; an HTTP date is not worth parsing for sub-second waits)."""
    value = reply.headers.get("Retry-After")
    if value is None:
        return None
    try:
        s = float(value)
    except ValueError:
        return None
    return s if math.isfinite(s) and s >= 0 else None


def verdict(status: int) -> str:
    """What an endpoint's HTTP ``status`` means for the request: ``"ok"`` (200: the answer), ``"retry"``
    (5xx: the endpoint failed; try another), ``"rate-limited"`` (429: the caller must slow down; another
    endpoint would be asked to break the same contract) or ``"refused"`` (another 4xx: the request itself
    is bad, and every endpoint would refuse it)."""
    if status == 200:
        return "ok"
    if status >= 500:
        return "retry"
    if status == 429:
        return "rate-limited"
    return "refused"


# ------------------------------------------------------------------------------------------------- routes


@dataclass
class AppState:
    """One app's route and the state that outlives its requests."""

    route: AppRoute
    bucket: TokenBucket
    router: WeightedRouter
    # Why each endpoint last failed, to name it when it is skipped during its cooldown.
    last_failure: dict[Endpoint, str] = field(default_factory=dict)
    # The gateway's model-metadata cache: version -> (real-time expiry s, body, headers); emptied on republish.
    metadata: dict[str, tuple[float, bytes, dict[str, str]]] = field(default_factory=dict)


class RouteTable:
    """Apps' routes and states, safe to use from several threads (routes are pushed from one, requests come
    from others). ``clock`` (s) drives the buckets and the cooldowns; ``cooldown_s`` is how long a failed
    endpoint is skipped; ``policing`` turns each route's contract into its bucket (``adapt.police.Policing``,
    the rule the cluster simulator runs too)."""

    def __init__(self, clock: Callable[[], float], cooldown_s: float, policing: Policing = Policing()) -> None:
        self._clock = clock
        self._policing = policing
        self._cooldown_s = cooldown_s
        self._lock = threading.Lock()
        self._apps: dict[str, AppState] = {}

    def update(self, app: str, route: AppRoute) -> None:
        """Install or replace ``app``'s route. The token bucket keeps its tokens (capped at the new burst)
        and the router its round-robin position and down marks for endpoints that stay; the metadata cache
        is emptied, since the model may have changed. ValueError for a route of another app."""
        if route.app != app:
            raise ValueError(f"route for app '{route.app}' given as the route of app '{app}'")
        with self._lock:
            state = self._apps.get(app)
            if state is None:
                self._apps[app] = AppState(route, TokenBucket(*self._policing.contract(route.rate_rps, route.burst),
                                                               clock=self._clock),
                                           WeightedRouter(app, route.endpoints, clock=self._clock,
                                                          cooldown_s=self._cooldown_s))
                return
            state.bucket.reconfigure(*self._policing.contract(route.rate_rps, route.burst))
            state.router.update(route.endpoints)
            kept = {ep for ep, _ in route.endpoints}
            state.last_failure = {e: why for e, why in state.last_failure.items() if e in kept}
            state.metadata = {}
            state.route = route

    def install(self, app: str, route: AppRoute) -> AppState:
        """``app``'s state, installing ``route`` only if the app has none yet (a lookup's answer must not
        replace a route pushed, or installed by another request, meanwhile: that one keeps its bucket)."""
        with self._lock:
            state = self._apps.get(app)
        if state is None:
            self.update(app, route)
        with self._lock:
            return self._apps[app]

    def get(self, app: str) -> AppState | None:
        with self._lock:
            return self._apps.get(app)

    def remove(self, app: str) -> bool:
        """Forget ``app``'s route and state; True if it had one."""
        with self._lock:
            return self._apps.pop(app, None) is not None

    def routes(self) -> dict[str, AppRoute]:
        """The routes installed now, by app, sorted by app name."""
        with self._lock:
            return {app: s.route for app, s in sorted(self._apps.items())}

    def __len__(self) -> int:
        with self._lock:
            return len(self._apps)


def police(app: str, state: AppState, max_wait_s: float, source: str = "client") -> float:
    """Take ``app``'s token for one request: returns how long (s) to wait before sending it, or raises
    :class:`RateLimited` (``source`` names the bucket) when the token would come later than ``max_wait_s``."""
    admission = state.bucket.admit(max_wait_s)
    if not admission.admitted:
        raise RateLimited(app, admission.retry_after_s, source=source)
    return admission.wait_s


class Attempts:
    """One admitted request on its way to ``app``'s endpoints. Call :meth:`next` for the endpoint to try
    (None when none is left), then :meth:`succeeded` or :meth:`failed` with what happened; when :meth:`next`
    says none is left, :meth:`unavailable` is the error to answer."""

    def __init__(self, app: str, state: AppState, clock: Callable[[], float]) -> None:
        self.app = app
        self.state = state
        self._clock = clock
        self.tried: set[Endpoint] = set()
        self.failures: dict[str, str] = {}  # endpoint URL -> why it failed, for this request
        self.retry_after_s: float | None = None

    def next(self) -> Endpoint | None:
        """The next endpoint by weighted round robin among those not tried and not in cooldown."""
        try:
            ep = self.state.router.pick(exclude=frozenset(self.tried) if self.tried else frozenset())
        except NoEndpointError as e:
            self.retry_after_s = e.retry_after_s
            return None
        self.tried.add(ep)
        return ep

    def failed(self, ep: Endpoint, reason: str, retry_after_s: float | None = None) -> None:
        """``ep`` failed (transport, 5xx, malformed reply): it is skipped for its cooldown, or for
        ``retry_after_s`` seconds when the server said how long it will be busy."""
        self.failures[ep.url] = reason
        self.state.last_failure[ep] = reason
        until = None if retry_after_s is None else self._clock() + retry_after_s
        try:
            self.state.router.mark_down(ep, until)
        except ValueError:
            pass  # routes were republished meanwhile without this endpoint: nothing to mark

    def succeeded(self, ep: Endpoint) -> None:
        """``ep`` answered: its last failure is forgotten."""
        self.state.last_failure.pop(ep, None)

    def unavailable(self) -> Unavailable:
        """The error when no endpoint is left, naming every endpoint: those that failed now, and those
        skipped because of an earlier failure."""
        failures = dict(self.failures)
        for ep, weight in self.state.route.endpoints:
            if ep in self.tried or weight <= 0:
                continue
            earlier = self.state.last_failure.get(ep, "an earlier failure")
            failures[ep.url] = f"skipped during its cooldown after {earlier}"
        return Unavailable(self.app, failures, self.retry_after_s)
