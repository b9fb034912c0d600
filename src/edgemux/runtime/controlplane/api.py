"""The control plane's HTTP API: the application (``runtime.httpserver``) around a :class:`ControlPlane` (routes in
docs/reference/http.md), its error table and the server it binds.

Units: ``*_s`` seconds.
"""

from __future__ import annotations

import logging
import re
import ssl
from dataclasses import dataclass
from typing import Any

from edgemux import __version__
from edgemux.cluster.specs import parse_apps
from edgemux.cluster.state import App
from edgemux.cluster.store import StoreError
from edgemux.cluster.yamlread import parse_yaml_all
from edgemux.errors import EdgemuxError, InputError
from edgemux.runtime.auth import auth_middleware
from edgemux.runtime.controlplane import dashboard
from edgemux.runtime.controlplane.metrics import CONTENT_TYPE
from edgemux.runtime.controlplane.overview import device_views, node_views, overview
from edgemux.runtime.controlplane.service import DEFAULT_PORT, MAX_BODY_BYTES, ControlPlane, ControlPlaneError
from edgemux.runtime.httpserver import Application, Request, Response, Route, delete, get, post, put
from edgemux.runtime.httputil import (Answer, ErrorTable, Site, clip, describe_exc, json_response, make_application,
                                      parse_json, read_body, start_site)

__all__ = ["ControlPlaneServer", "make_app", "parse_app_body", "start_server"]

logger = logging.getLogger("edgemux.controlplane")

_YAML_TYPES = ("application/yaml", "text/yaml", "application/x-yaml", "text/x-yaml")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:+-]{0,127}$")  # the agent's app-name rule (URL-safe)


# ------------------------------------------------------------------------------------------------- HTTP


async def _read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    return await read_body(request, limit, ControlPlaneError)


def _parse_json(raw: bytes, what: str) -> Any:
    return parse_json(raw, what, ControlPlaneError)


def parse_app_body(raw: bytes, content_type: str) -> list[App]:
    """Apps from a request body: YAML (any number of documents) for a YAML content type, else JSON (one
    document, or a list of documents). ``InputError``/``ControlPlaneError`` (400) naming the field."""
    source = "request body"
    if content_type in _YAML_TYPES:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ControlPlaneError(f"malformed YAML: invalid UTF-8 at byte {e.start}") from None
        try:
            docs: Any = parse_yaml_all(text, source)
        except RecursionError:
            raise ControlPlaneError("malformed YAML: nested too deeply") from None
    else:
        docs = _parse_json(raw, "app spec")
    if isinstance(docs, list) and len(docs) == 1:
        docs = docs[0]
    try:
        apps = parse_apps(docs, source)
    except EdgemuxError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, RecursionError) as e:
        # a shape the spec reader did not foresee (e.g. a YAML tag that builds an odd value): still the
        # client's mistake, never a 500
        raise ControlPlaneError(f"malformed app spec: {describe_exc(e)}") from None
    for a in apps:
        if not _NAME_RE.match(a.name):
            raise InputError("metadata.name", f"bad app name {a.name!r}: use 1 to 128 letters, digits and "
                                              f"_ . : + - (starting with a letter or digit)", source)
    return apps


class _Handlers:
    """The control plane's request handlers (``runtime.httputil``'s pattern): each failure is an exception
    that the error table answers."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp

    def routes(self) -> list[Route]:
        """The route table (docs/reference/http.md, "Control plane")."""
        return [
            get("/v1", self.info),
            get("/v1/apps", self.list_apps),
            post("/v1/apps", self.post_apps),
            get("/v1/apps/{name}", self.get_app),
            put("/v1/apps/{name}", self.put_app),
            delete("/v1/apps/{name}", self.delete_app),
            post("/v1/apps/{name}/move", self.move_app),
            post("/v1/apps/{name}/key", self.rotate_key),
            get("/v1/routes", self.list_routes),
            get("/v1/routes/{app}", self.get_route),
            get("/v1/agents", self.list_agents),
            post("/v1/agents/{node}", self.register),
            put("/v1/agents/{node}", self.heartbeat),
            delete("/v1/agents/{node}", self.deregister),
            get("/v1/gateways", self.list_gateways),
            get("/v1/events", self.list_events),
            post("/v1/gateways", self.post_gateway),
            get("/v1/nodes", self.list_nodes),
            get("/v1/devices", self.list_devices),
            get("/v1/overview", self.get_overview),
            get("/metrics", self.metrics),
            *dashboard.routes(),  # the page's static files (GET /dashboard, /dashboard/{asset}): no data in them
        ]

    async def _apps_body(self, request: Request) -> list[App]:
        raw = await _read_body(request)
        return parse_app_body(raw, request.content_type)

    async def post_apps(self, request: Request) -> Response:
        apps = await self._apps_body(request)
        return self._applied(*await self.cp.apply(apps))

    def _applied(self, status: int, body: dict[str, Any]) -> Response:
        retry = self.cp.retry_after(body)
        return json_response(body, status, {"Retry-After": retry} if retry is not None else None)

    async def put_app(self, request: Request) -> Response:
        name = request.match_info["name"]
        apps = await self._apps_body(request)
        if len(apps) != 1 or apps[0].name != name:
            got = ", ".join(a.name for a in apps)
            raise ControlPlaneError(f"metadata.name: PUT /v1/apps/{clip(name)} takes exactly one App named "
                                    f"'{clip(name)}', got {clip(got) or 'none'}")
        return self._applied(*await self.cp.apply(apps))

    async def list_apps(self, request: Request) -> Response:
        return json_response({"apps": self.cp.list_apps()})

    async def get_app(self, request: Request) -> Response:
        return json_response(self.cp.describe(request.match_info["name"]))

    async def delete_app(self, request: Request) -> Response:
        return json_response(await self.cp.delete(request.match_info["name"]))

    async def rotate_key(self, request: Request) -> Response:
        return json_response(await self.cp.rotate_key(request.match_info["name"]))

    async def move_app(self, request: Request) -> Response:
        name = request.match_info["name"]
        body = _parse_json(await _read_body(request), "move")
        return json_response((await self.cp.move(name, body)).to_json())

    async def list_routes(self, request: Request) -> Response:
        return json_response({"routes": [self.cp.route(a).to_json() for a in self.cp.apps]})

    async def get_route(self, request: Request) -> Response:
        return json_response(self.cp.route(request.match_info["app"]).to_json())

    async def register(self, request: Request) -> Response:
        body = _parse_json(await _read_body(request), "agent registration")
        return json_response(self.cp.register_agent(request.match_info["node"], body, heartbeat=False))

    async def heartbeat(self, request: Request) -> Response:
        body = _parse_json(await _read_body(request), "agent heartbeat")
        return json_response(self.cp.register_agent(request.match_info["node"], body, heartbeat=True))

    async def deregister(self, request: Request) -> Response:
        return json_response(self.cp.deregister_agent(request.match_info["node"]))

    async def list_agents(self, request: Request) -> Response:
        return json_response(self.cp.list_agents())

    async def post_gateway(self, request: Request) -> Response:
        body = _parse_json(await _read_body(request), "gateway registration")
        return json_response(await self.cp.register_gateway(body))

    async def list_gateways(self, request: Request) -> Response:
        return json_response({"gateways": [{"url": u, "last_error": e} for u, e in self.cp.gateways.items()]})

    async def list_events(self, request: Request) -> Response:
        """``GET /v1/events[?since=SEQ][&app=NAME]``: the adapt loop's events, oldest first."""
        since_text = request.query.get("since", "0")
        try:
            since = int(since_text)
        except ValueError:
            raise ControlPlaneError(f"since: expected an event sequence number (an integer), got "
                                    f"'{clip(since_text)}'") from None
        events = self.cp.events.since(since, request.query.get("app"))
        return json_response({"events": [e.to_json() for e in events], "adapt": self.cp.adapt_settings is not None})

    async def list_nodes(self, request: Request) -> Response:
        """``GET /v1/nodes``: every node with its agent, power, serving path, apps and devices (``overview``)."""
        return json_response({"nodes": node_views(self.cp)})

    async def list_devices(self, request: Request) -> Response:
        """``GET /v1/devices``: every device, predicted utilization beside its agent's (``overview``)."""
        return json_response({"devices": device_views(self.cp)})

    async def get_overview(self, request: Request) -> Response:
        """``GET /v1/overview[?since=UNIX_S]``: nodes, devices, apps and their timelines after ``since`` (the
        dashboard's one call)."""
        since_text = request.query.get("since", "0")
        try:
            since = float(since_text)
        except ValueError:
            raise ControlPlaneError(f"since: expected a Unix time in seconds, got '{clip(since_text)}'") from None
        return json_response(overview(self.cp, since))

    async def metrics(self, request: Request) -> Response:
        return Response(body=self.cp.metrics_text(), headers={"Content-Type": CONTENT_TYPE})

    async def info(self, request: Request) -> Response:
        return json_response({"name": "edgemux-controlplane", "version": __version__, "policy": self.cp.policy_name,
                      "options": self.cp.policy_opts, "store": self.cp.store_path,
                      "nodes": [n.name for n in self.cp.cluster.nodes], "apps": len(self.cp.apps)})


# The control plane's errors as answers (httputil.ErrorTable: the first matching row wins).
ERRORS: tuple[tuple[Any, Any], ...] = (
    (ControlPlaneError, lambda e: Answer(e.status, e.message, e.extra)),
    (InputError, lambda e: Answer(400, str(e), {"field": e.field})),
    (StoreError, lambda e: Answer(409, str(e))),  # e.g. a store refusing a commit: the request could not be done
    (EdgemuxError, lambda e: Answer(400, str(e))),
)


def make_app(cp: ControlPlane) -> Application:
    """The application of ``cp`` (routes in docs/reference/http.md; ``runtime.httputil.start_site`` serves
    it); its startup opens the store and its cleanup closes it."""
    # every route but the dashboard's static files needs the admin token (dashboard.need)
    app = make_application(_Handlers(cp).routes(), ErrorTable(ERRORS, logger),
                           auth=auth_middleware(cp.guard, dashboard.need), client_max_size=MAX_BODY_BYTES)
    app.on_startup.append(cp.start)
    app.on_cleanup.append(cp.close)
    return app


@dataclass
class ControlPlaneServer:
    """A running control plane: ``url`` is the bound ``http://HOST:PORT``; ``stop`` closes it."""

    controlplane: ControlPlane
    site: Site
    url: str

    async def stop(self) -> None:
        await self.site.stop()


async def start_server(cp: ControlPlane, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *,
                       ssl_context: ssl.SSLContext | None = None) -> ControlPlaneServer:
    """Serve ``cp`` on ``host``:``port`` (0: an ephemeral port), over TLS with ``ssl_context``
    (``runtime.tls``). Raises ``OSError`` when the address cannot be bound and the store's errors
    (``StoreError``/``InputError``) when it cannot be opened."""
    site = await start_site(make_app(cp), host, port, ssl_context=ssl_context)  # its startup opens the store
    return ControlPlaneServer(cp, site, site.public_url)
