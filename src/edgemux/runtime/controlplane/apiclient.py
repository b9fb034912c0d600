"""The one client of the control plane's HTTP API (docs/reference/http.md, "Control plane").

The CLI verbs, the local engine, the demo, the gateway's registration, the load generator and the
benchmarks all reach the control plane through :class:`ControlPlaneClient`, so that what counts as
unreachable, what a non-JSON answer means and how an error is worded are decided once. Answers come back as
the typed messages of :mod:`edgemux.runtime.controlplane.messages`.

It is synchronous (``urllib``): the calls are few and short (a registration, a describe, an apply). Code on
an event loop calls it through ``asyncio.to_thread`` rather than through a second, asynchronous copy of
the same logic.

Units: ``*_s`` seconds.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgemux.errors import EdgemuxError
from edgemux.runtime.auth import auth_headers
from edgemux.runtime.httputil import quote
from edgemux.runtime.controlplane.messages import Event
from edgemux.runtime.controlplane.messages import (
    AgentView,
    ApplyAnswer,
    AppView,
    MoveAnswer,
    MoveRequest,
    RouteView,
)

if TYPE_CHECKING:  # an annotation only: the client verbs stay clear of the gateway's routing (and numpy)
    from edgemux.runtime.ingress.routing import AppRoute

CALL_TIMEOUT_S = 30.0  # one call; an apply may run a policy that bisects for a while
DEFAULT_SERVER = "http://127.0.0.1:8470"  # the control plane's default port


class ApiUnreachable(EdgemuxError):
    """Nothing answered at the URL (refused, timed out, name not resolved); ``reason`` says which."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class ApiError(EdgemuxError):
    """The control plane answered with an error status (``status``) or a body that is not what the call
    expects; ``body`` is the parsed JSON answer ({} when there was none)."""

    def __init__(self, message: str, status: int, body: Any) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


@dataclass(frozen=True)
class Answer:
    """One HTTP answer: its status and its JSON body ({} when empty)."""

    status: int
    body: Any

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def error(self) -> str:
        """The server's one-line error (its ``error`` field), else ``HTTP <status>``."""
        if isinstance(self.body, dict) and isinstance(self.body.get("error"), str):
            return str(self.body["error"])
        return f"HTTP {self.status}"


def call(method: str, url: str, body: bytes | None = None, *, content_type: str = "application/json",
         timeout_s: float = CALL_TIMEOUT_S, token: str | None = None, context: ssl.SSLContext | None = None) -> Answer:
    """One JSON exchange with an edgemux service (control plane, agent or gateway control API), carrying
    ``token`` (the admin token, ``runtime.auth``) when given; an ``https`` URL is verified with ``context``
    (default: OpenSSL's CA bundle, ``$SSL_CERT_FILE``).

    An error status is data here (``Answer.status``); nothing answering is :class:`ApiUnreachable`, a body
    that is not JSON an :class:`ApiError`. ``timeout_s`` bounds the exchange (s)."""
    req = urllib.request.Request(url, data=body, method=method, headers=auth_headers(token))
    if body is not None:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s, context=context) as resp:
            status, raw = int(resp.status), resp.read()
    except urllib.error.HTTPError as e:
        status, raw = int(e.code), e.read()
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = str(getattr(e, "reason", e)) or type(e).__name__
        base = urllib.parse.urlsplit(url)
        raise ApiUnreachable(f"cannot reach {base.scheme}://{base.netloc}: {reason}", reason) from None
    try:
        doc = json.loads(raw.decode("utf-8")) if raw.strip() else {}
    except (UnicodeDecodeError, ValueError):
        raise ApiError(f"{method} {url}: HTTP {status} with a body that is not JSON", status, {}) from None
    return Answer(status, doc)


def probe(url: str, timeout_s: float = 5.0, context: ssl.SSLContext | None = None) -> int | None:
    """The HTTP status of ``GET url`` (a health check: the body is not read as JSON); None when nothing
    answers within ``timeout_s`` (s). ``context`` as for :func:`call`."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s, context=context) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (urllib.error.URLError, OSError, ValueError):
        return None


class ControlPlaneClient:
    """The control plane at ``url`` (``http://HOST:PORT``). ``timeout_s`` bounds each call (s); ``token`` is
    the cluster's admin token, sent with every call (None: none; a control plane with authentication on then
    answers 401, an :class:`ApiError` that says so); ``context`` verifies an ``https`` control plane (default:
    OpenSSL's CA bundle, ``$SSL_CERT_FILE``).

    The ``request`` method returns any answer as data; the verbs below return typed messages and raise
    :class:`ApiError` for an error status (except where an error is an expected answer, as an apply's
    rejection: 409 with the rejection, returned as data) and :class:`ApiUnreachable` when nothing answers.
    """

    def __init__(self, url: str = DEFAULT_SERVER, timeout_s: float = CALL_TIMEOUT_S, token: str | None = None,
                 context: ssl.SSLContext | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.token = token
        self.context = context

    def __repr__(self) -> str:
        return f"ControlPlaneClient({self.url!r})"

    def request(self, method: str, path: str, body: bytes | None = None,
                content_type: str = "application/json") -> Answer:
        """One call (``path`` below the server URL, starting with ``/``); any status comes back as data."""
        try:
            return call(method, self.url + path, body, content_type=content_type, timeout_s=self.timeout_s,
                        token=self.token, context=self.context)
        except ApiUnreachable as e:
            raise ApiUnreachable(f"cannot reach the control plane at {self.url}: {e.reason}", e.reason) from None

    def get(self, path: str, what: str) -> dict[str, Any]:
        """``GET path`` as a JSON object; an error status or another JSON type is an :class:`ApiError`
        worded ``"<what>: <server's error>"``."""
        answer = self.request("GET", path)
        if not answer.ok or not isinstance(answer.body, dict):
            raise ApiError(f"{what}: {answer.error}", answer.status, answer.body)
        return answer.body

    # -- apps ------------------------------------------------------------------------------------------

    def apps(self) -> list[AppView]:
        """``GET /v1/apps``: every admitted app with its status and placement."""
        doc = self.get("/v1/apps", "list apps")
        return [AppView.from_json(a) for a in doc.get("apps", [])]

    def describe(self, name: str) -> dict[str, Any]:
        """``GET /v1/apps/{name}``: the app's describe document (spec, status, pieces with their predicted
        latency, route, transition). Left as JSON: it is shown to people, field for field."""
        return self.get(f"/v1/apps/{quote(name)}", f"describe app {name}")

    def apply(self, data: bytes, content_type: str = "application/yaml") -> ApplyAnswer:
        """``POST /v1/apps`` with a YAML (or JSON) body of app specs. A rejection (409) is an answer,
        not an error; any other error status is an :class:`ApiError`."""
        answer = self.request("POST", "/v1/apps", data, content_type)
        if answer.status == 409 and isinstance(answer.body, dict) and "results" in answer.body:
            return ApplyAnswer.from_json(answer.body, answer.status)
        if not answer.ok:
            raise ApiError(f"apply: {answer.error}", answer.status, answer.body)
        return ApplyAnswer.from_json(answer.body, answer.status)

    def delete(self, name: str) -> dict[str, Any]:
        """``DELETE /v1/apps/{name}``."""
        answer = self.request("DELETE", f"/v1/apps/{quote(name)}")
        if not answer.ok or not isinstance(answer.body, dict):
            raise ApiError(f"delete app {name}: {answer.error}", answer.status, answer.body)
        return answer.body

    def move(self, name: str, request: MoveRequest) -> MoveAnswer:
        """``POST /v1/apps/{name}/move``: move the app make-before-break. A refused move (409 with its
        rejection) is an :class:`ApiError` whose ``body`` carries the rejection."""
        answer = self.request("POST", f"/v1/apps/{quote(name)}/move", json.dumps(request.to_json()).encode())
        if not answer.ok:
            raise ApiError(f"move app {name}: {answer.error}", answer.status, answer.body)
        return MoveAnswer.from_json(answer.body)

    def rotate_key(self, name: str) -> dict[str, Any]:
        """``POST /v1/apps/{name}/key``: a new key for the app (``{"app", "key"}``); the old one stops working."""
        answer = self.request("POST", f"/v1/apps/{quote(name)}/key")
        if not answer.ok or not isinstance(answer.body, dict):
            raise ApiError(f"rotate the key of app {name}: {answer.error}", answer.status, answer.body)
        return answer.body

    def wait_ready(self, names: list[str], timeout_s: float, poll_s: float = 0.5) -> list[str]:
        """Wait until every app in ``names`` is ``ready`` (loaded on live agents); the names still pending
        after ``timeout_s`` (s) come back (empty when all are ready)."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = {a.name: a.status for a in self.apps()}
            pending = [n for n in names if status.get(n) != "ready"]
            if not pending or time.monotonic() > deadline:
                return pending
            time.sleep(poll_s)

    # -- routes ----------------------------------------------------------------------------------------

    def route(self, name: str) -> RouteView:
        """``GET /v1/routes/{name}``: the app's endpoints and its pieces not loaded yet."""
        return RouteView.from_json(self.get(f"/v1/routes/{quote(name)}", f"route of app {name}"))

    def app_route(self, name: str) -> AppRoute | None:
        """What a :class:`~edgemux.runtime.ingress.client.Client` needs for ``name`` (pass this method as its
        ``routes``); None for an unknown app or one with no endpoint loaded yet."""
        answer = self.request("GET", f"/v1/routes/{quote(name)}")
        if answer.status == 404:
            return None
        if not answer.ok or not isinstance(answer.body, dict):
            raise ApiError(f"route of app {name}: {answer.error}", answer.status, answer.body)
        return RouteView.from_json(answer.body).app_route()

    # -- agents and gateways ---------------------------------------------------------------------------

    def agents(self) -> list[AgentView]:
        """``GET /v1/agents``: the registered agents."""
        return [AgentView.from_json(a) for a in self.get("/v1/agents", "list agents").get("agents", [])]

    def gateways(self) -> list[str]:
        """``GET /v1/gateways``: the URLs of the registered gateways."""
        doc = self.get("/v1/gateways", "list gateways")
        return [str(g["url"]) for g in doc.get("gateways", []) if isinstance(g, dict) and g.get("url")]

    def events(self, since: int = 0, app: str | None = None) -> list[Event]:
        """``GET /v1/events``: the adapt loop's events after sequence number ``since`` (of ``app`` only when
        given), oldest first."""
        query = f"?since={int(since)}" + (f"&app={quote(app)}" if app is not None else "")
        doc = self.get(f"/v1/events{query}", "list events")
        return [Event.from_json(e, f"events[{i}]") for i, e in enumerate(doc.get("events", []))]

    def register_gateway(self, url: str) -> dict[str, Any]:
        """``POST /v1/gateways``: register the gateway at ``url`` (the control plane pushes it every route)."""
        answer = self.request("POST", "/v1/gateways", json.dumps({"url": url}).encode())
        if not answer.ok or not isinstance(answer.body, dict):
            raise ApiError(f"register gateway {url}: {answer.error}", answer.status, answer.body)
        return answer.body
