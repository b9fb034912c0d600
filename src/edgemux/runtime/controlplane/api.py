"""The control plane's HTTP API: the aiohttp application around a :class:`ControlPlane` (routes in
docs/reference/http.md), its error middleware and the server it binds.

Units: ``*_s`` seconds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from edgemux import __version__
from edgemux.cluster.specs import parse_apps
from edgemux.cluster.state import App
from edgemux.cluster.store import StoreError
from edgemux.cluster.yamlread import parse_yaml_all
from edgemux.errors import EdgemuxError, InputError
from edgemux.runtime.auth import ADMIN, auth_middleware
from edgemux.runtime.controlplane.metrics import CONTENT_TYPE
from edgemux.runtime.controlplane.service import (DEFAULT_PORT, MAX_BODY_BYTES, ControlPlane, ControlPlaneError,
                                                  clip, describe_exc)
from edgemux.runtime.httputil import parse_json, read_body

__all__ = ["CONTROLPLANE_KEY", "ControlPlaneServer", "make_app", "parse_app_body", "start_server"]

logger = logging.getLogger("edgemux.controlplane")

_YAML_TYPES = ("application/yaml", "text/yaml", "application/x-yaml", "text/x-yaml")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:+-]{0,127}$")  # the agent's app-name rule (URL-safe)


# ------------------------------------------------------------------------------------------------- HTTP


CONTROLPLANE_KEY: web.AppKey[ControlPlane] = web.AppKey("edgemux_controlplane", ControlPlane)


async def _read_body(request: web.Request, limit: int = MAX_BODY_BYTES) -> bytes:
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
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp

    async def _apps_body(self, request: web.Request) -> list[App]:
        raw = await _read_body(request)
        return parse_app_body(raw, request.content_type)

    async def post_apps(self, request: web.Request) -> web.Response:
        apps = await self._apps_body(request)
        return self._applied(*await self.cp.apply(apps))

    def _applied(self, status: int, body: dict[str, Any]) -> web.Response:
        retry = self.cp.retry_after(body)
        return _json(body, status, {"Retry-After": retry} if retry is not None else None)

    async def put_app(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        apps = await self._apps_body(request)
        if len(apps) != 1 or apps[0].name != name:
            got = ", ".join(a.name for a in apps)
            raise ControlPlaneError(f"metadata.name: PUT /v1/apps/{clip(name)} takes exactly one App named "
                                    f"'{clip(name)}', got {clip(got) or 'none'}")
        return self._applied(*await self.cp.apply(apps))

    async def list_apps(self, request: web.Request) -> web.Response:
        return _json({"apps": self.cp.list_apps()})

    async def get_app(self, request: web.Request) -> web.Response:
        return _json(self.cp.describe(request.match_info["name"]))

    async def delete_app(self, request: web.Request) -> web.Response:
        return _json(await self.cp.delete(request.match_info["name"]))

    async def rotate_key(self, request: web.Request) -> web.Response:
        return _json(await self.cp.rotate_key(request.match_info["name"]))

    async def move_app(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        body = _parse_json(await _read_body(request), "move")
        return _json((await self.cp.transition(name, self.cp.plan_move(name, body))).to_json())

    async def list_routes(self, request: web.Request) -> web.Response:
        return _json({"routes": [self.cp.route(a).to_json() for a in self.cp.apps]})

    async def get_route(self, request: web.Request) -> web.Response:
        return _json(self.cp.route(request.match_info["app"]).to_json())

    async def register(self, request: web.Request) -> web.Response:
        body = _parse_json(await _read_body(request), "agent registration")
        return _json(self.cp.register_agent(request.match_info["node"], body, heartbeat=False))

    async def heartbeat(self, request: web.Request) -> web.Response:
        body = _parse_json(await _read_body(request), "agent heartbeat")
        return _json(self.cp.register_agent(request.match_info["node"], body, heartbeat=True))

    async def deregister(self, request: web.Request) -> web.Response:
        return _json(self.cp.deregister_agent(request.match_info["node"]))

    async def list_agents(self, request: web.Request) -> web.Response:
        return _json(self.cp.list_agents())

    async def post_gateway(self, request: web.Request) -> web.Response:
        body = _parse_json(await _read_body(request), "gateway registration")
        return _json(await self.cp.register_gateway(body))

    async def list_gateways(self, request: web.Request) -> web.Response:
        return _json({"gateways": [{"url": u, "last_error": e} for u, e in self.cp.gateways.items()]})

    async def list_events(self, request: web.Request) -> web.Response:
        """``GET /v1/events[?since=SEQ][&app=NAME]``: the adapt loop's events, oldest first."""
        since_text = request.query.get("since", "0")
        try:
            since = int(since_text)
        except ValueError:
            raise ControlPlaneError(f"since: expected an event sequence number (an integer), got "
                                    f"'{clip(since_text)}'") from None
        events = self.cp.events.since(since, request.query.get("app"))
        return _json({"events": [e.to_json() for e in events], "adapt": self.cp.adapt_settings is not None})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.cp.metrics_text(), headers={"Content-Type": CONTENT_TYPE})

    async def info(self, request: web.Request) -> web.Response:
        return _json({"name": "edgemux-controlplane", "version": __version__, "policy": self.cp.policy_name,
                      "options": self.cp.policy_opts, "store": self.cp.store_path,
                      "nodes": [n.name for n in self.cp.cluster.nodes], "apps": len(self.cp.apps)})


@web.middleware
async def _errors_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every failure as ``{"error": ...}`` with its status; an unexpected one is logged and a 500."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        message = e.reason
        if e.status == 404:
            message = f"no such endpoint: {request.method} {clip(request.path, 120)}"
        elif e.status == 405:
            message = f"method {request.method} is not allowed on {clip(request.path, 120)}"
        headers = {k: v for k, v in e.headers.items() if k.lower() == "allow"}
        return _json({"error": message}, e.status, headers)
    except asyncio.CancelledError:
        raise
    except ControlPlaneError as e:
        return _json({"error": e.message, **e.extra}, e.status)
    except InputError as e:
        return _json({"error": str(e), "field": e.field}, 400)
    except StoreError as e:  # e.g. a store refusing a commit: the request could not be carried out
        return _json({"error": str(e)}, 409)
    except EdgemuxError as e:
        return _json({"error": str(e)}, 400)
    except Exception as e:
        logger.error("error in %s %s", request.method, request.path, exc_info=e)
        return _json({"error": f"internal error: {describe_exc(e)}"}, 500)


def _json(obj: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(body=json.dumps(obj, separators=(",", ":")).encode("utf-8"), status=status,
                        content_type="application/json", headers=dict(headers or {}))


def make_app(cp: ControlPlane) -> web.Application:
    """The aiohttp application of ``cp`` (routes in docs/reference/http.md); its startup opens the store and
    its cleanup closes it."""
    # authentication first: a request without the admin token never reaches a handler (every route is /v1)
    app = web.Application(middlewares=[auth_middleware(cp.guard, lambda request: ADMIN), _errors_middleware],
                          client_max_size=MAX_BODY_BYTES)
    app[CONTROLPLANE_KEY] = cp
    h = _Handlers(cp)
    r = app.router
    r.add_get("/v1", h.info)
    r.add_get("/v1/apps", h.list_apps)
    r.add_post("/v1/apps", h.post_apps)
    r.add_get("/v1/apps/{name}", h.get_app)
    r.add_put("/v1/apps/{name}", h.put_app)
    r.add_delete("/v1/apps/{name}", h.delete_app)
    r.add_post("/v1/apps/{name}/move", h.move_app)
    r.add_post("/v1/apps/{name}/key", h.rotate_key)
    r.add_get("/v1/routes", h.list_routes)
    r.add_get("/v1/routes/{app}", h.get_route)
    r.add_get("/v1/agents", h.list_agents)
    r.add_post("/v1/agents/{node}", h.register)
    r.add_put("/v1/agents/{node}", h.heartbeat)
    r.add_delete("/v1/agents/{node}", h.deregister)
    r.add_get("/v1/gateways", h.list_gateways)
    r.add_get("/v1/events", h.list_events)
    r.add_post("/v1/gateways", h.post_gateway)
    r.add_get("/metrics", h.metrics)

    async def _startup(_: web.Application) -> None:
        await cp.start()

    async def _cleanup(_: web.Application) -> None:
        await cp.close()

    app.on_startup.append(_startup)
    app.on_cleanup.append(_cleanup)
    return app


@dataclass
class ControlPlaneServer:
    """A running control plane: ``url`` is the bound ``http://HOST:PORT``; ``stop`` closes it."""

    controlplane: ControlPlane
    runner: web.AppRunner
    url: str

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start_server(cp: ControlPlane, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *,
                       ssl_context: ssl.SSLContext | None = None) -> ControlPlaneServer:
    """Serve ``cp`` on ``host``:``port`` (0: an ephemeral port), over TLS with ``ssl_context``
    (``runtime.tls``). Raises ``OSError`` when the address cannot be bound and the store's errors
    (``StoreError``/``InputError``) when it cannot be opened."""
    runner = web.AppRunner(make_app(cp), access_log=None)
    await runner.setup()  # runs on_startup: opens the store
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bhost, bport = str(runner.addresses[0][0]), int(runner.addresses[0][1])
    if bhost in ("0.0.0.0", "::"):
        bhost = socket.gethostname()
    scheme = "https" if ssl_context is not None else "http"
    return ControlPlaneServer(cp, runner, f"{scheme}://{f'[{bhost}]' if ':' in bhost else bhost}:{bport}")
