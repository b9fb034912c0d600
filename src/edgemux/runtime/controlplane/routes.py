"""The keys and routes manager: the apps' keys (their digests, as the store keeps them), the route each app's
clients use (built from its target beside its actual: only endpoints that serve), the registry of gateways and
what each one acknowledged, and the sync that pushes each gateway the routes that differ.

A route is published (``PUT {gateway}/v1/routes/{app}``) whenever an app's endpoints change (an apply, a move's
switch, a reconcile, an agent going silent or coming back) and removed (``DELETE``) when the app is gone or
has no loaded endpoint. Each pass of the controller loop (:meth:`RouteManager.update`) pushes to every
gateway the routes whose body differs from what it acknowledged; every ``GATEWAY_OBSERVE_EVERY``-th pass it
first reads the gateway's routes back (``GET /v1/routes``), so that a gateway that restarted and lost them gets
them again. A failed call is recorded as the gateway's last error and retried at the next pass.

Units: none.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import aiohttp

from edgemux.runtime.auth import auth_headers, digest, new_app_key
from edgemux.runtime.controlplane.agentdriver import http_call
from edgemux.runtime.controlplane.common import ControlPlaneError, check_url, describe_exc, quote
from edgemux.runtime.controlplane.messages import PendingPiece, RouteEndpoint, RouteView
from edgemux.runtime.ingress.routing import AppRoute, Endpoint, RouteError
from edgemux.runtime.messages import Observations

if TYPE_CHECKING:
    from edgemux.runtime.controlplane.service import ControlPlane

__all__ = ["GATEWAY_OBSERVE_EVERY", "RouteManager"]

logger = logging.getLogger("edgemux.controlplane")

GATEWAY_OBSERVE_EVERY = 10  # every 10th pass reads each gateway's routes back (a restarted gateway)


class RouteManager:
    """Keys, routes and gateways (module doc), for the controller ``cp``; ``gateway_urls``: gateways known
    from the start (already checked)."""

    def __init__(self, cp: ControlPlane, gateway_urls: list[str]) -> None:
        self.cp = cp
        self.keys: dict[str, str] = {}  # app -> its key's digest (runtime.auth), as the store keeps them
        self.gateways: dict[str, str | None] = {url: None for url in gateway_urls}  # url -> last error
        # gateway url -> app -> the route it acknowledged (what the sync compares against)
        self.acked: dict[str, dict[str, AppRoute | None]] = {}
        self._session: aiohttp.ClientSession | None = None
        self._passes = 0

    async def start(self) -> None:
        """Open the session of the calls to gateways and push every route to the gateways known so far."""
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.cp.call_timeout_s),
                                              headers=auth_headers(self.cp.token))
        for url in list(self.gateways):
            self.cp.spawn(self.push_all(url))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- keys ------------------------------------------------------------------------------------------

    def key_owner(self, key_sha256: str) -> str | None:
        """The app whose key has this digest (None: no app's)."""
        return next((a for a, d in self.keys.items() if d == key_sha256), None)

    async def rotate_key(self, name: str) -> dict[str, Any]:
        """``POST /v1/apps/{name}/key``: a new key for the app; the old one stops opening it as soon as the
        gateways and agents hold the new digest (the routes are pushed and the agents reconciled now).
        ``ControlPlaneError`` 404 for an unknown app, 409 when authentication is off (there are no keys)."""
        cp = self.cp
        if not cp.guard.enabled:
            raise ControlPlaneError("authentication is off (the control plane has no admin token): apps have no "
                                    "keys to rotate", 409)
        async with cp.apply_lock:
            cp.reconciler.app(name)
            key = new_app_key()
            await cp.db.call("set_key", name, digest(key))
            self.keys[name] = digest(key)
            # the agents first (the same pieces with the new digest: nothing reloads), then the gateways: a
            # piece counts as loaded only as the agent holds it, so publishing first would drop the route
            await asyncio.gather(*(cp.reconciler.put_group(name, n, g)
                                   for n, g in cp.reconciler.groups(name).items()))
            await self.publish(name)
        logger.info("app %s: key rotated", name)
        return {"app": name, "key": key}

    # -- routes ----------------------------------------------------------------------------------------

    def route(self, app: str) -> RouteView:
        """The app's route (see ``GET /v1/routes/{app}``); ``ControlPlaneError`` 404 for an unknown app."""
        a = self.cp.reconciler.app(app)
        endpoints: list[RouteEndpoint] = []
        pending: list[PendingPiece] = []
        for n in self.cp.reconciler.state(app):
            # one endpoint per agent: it splits the app over its pieces by their weights
            weight = sum(p.weight for p in n.target)
            device = ", ".join(p.device_path for p in n.target)
            if n.url is not None and n.serving:
                endpoints.append(RouteEndpoint(n.url, weight, n.node, device))
            else:
                error = n.error if n.error is not None else "not loaded yet"
                if n.url is not None and not n.alive:
                    error = f"agent of node {n.node} missed its heartbeats"
                pending.append(PendingPiece(n.node, device, weight, error))
        return RouteView(app, app, tuple(endpoints), a.rate_rps, a.burst, tuple(pending))

    def route_body(self, app: str) -> AppRoute | None:
        """The route a gateway should hold for ``app``; None when no endpoint has it loaded (no route rather
        than one that sends clients to agents without the app). When every piece's agent is dead (missed its
        heartbeats), the route keeps those agents: a request then fails over through all of them and gets the
        gateway's 503 naming them, not a 404 as if the app did not exist, until the app is re-placed or the
        agents come back."""
        view = self.route(app)
        key = self.keys.get(app)
        body = view.app_route(key)
        if body is None and view.pending:
            dead = {n.node: n for n in self.cp.reconciler.state(app)
                    if n.url is not None and not n.alive and n.actual is not None}
            if all(p.node in dead for p in view.pending):
                body = AppRoute(app, view.model, [(Endpoint(p.device, str(dead[p.node].url)), p.weight)
                                                  for p in view.pending], view.rate_rps, view.burst, key_sha256=key)
        return body

    async def publish(self, app: str) -> None:
        """Push the app's route to every gateway."""
        await asyncio.gather(*(self.publish_to(url, app) for url in list(self.gateways)))

    async def publish_to(self, url: str, app: str) -> bool:
        """Push the app's route to the gateway at ``url`` (or remove it there when it has no endpoint); True
        when the gateway acknowledged."""
        if app not in self.cp.reconciler.apps:
            return False
        body = self.route_body(app)
        if body is not None:
            status, err = await self._call("PUT", f"{url}/v1/routes/{quote(app)}", body.to_json())
        else:
            status, err = await self._call("DELETE", f"{url}/v1/routes/{quote(app)}")
            if status == 404:
                err = None
        self.gateways[url] = err
        if err is not None:
            logger.warning("gateway %s: %s", url, err)
            self.acked.get(url, {}).pop(app, None)  # unknown: the next pass pushes it again
        elif body is None:
            self.acked.setdefault(url, {}).pop(app, None)
        else:
            self.acked.setdefault(url, {})[app] = body
        return err is None

    async def unpublish(self, app: str) -> None:
        """Remove a deleted app's route at every gateway."""
        for url in list(self.gateways):
            status, err = await self._call("DELETE", f"{url}/v1/routes/{quote(app)}")
            self.gateways[url] = None if (err is None or status == 404) else err
            if err is None or status == 404:
                self.acked.get(url, {}).pop(app, None)

    def everywhere(self, app: str) -> bool:
        """The app's route serves (it has endpoints) and every gateway acknowledged it."""
        body = self.route_body(app)
        return body is not None and all(self.acked.get(url, {}).get(app) == body for url in self.gateways)

    # -- gateways --------------------------------------------------------------------------------------

    async def register_gateway(self, body: Any) -> dict[str, Any]:
        """``POST /v1/gateways``: register a gateway and push it every route."""
        if not isinstance(body, dict) or set(body) - {"url"}:
            raise ControlPlaneError("gateway registration must be a JSON object {\"url\": \"http://HOST:PORT\"}")
        url = check_url(body.get("url"), "url", ControlPlaneError)
        self.gateways[url] = None
        pushed = await self.push_all(url)
        return {"url": url, "routes": pushed, "error": self.gateways.get(url)}

    async def push_all(self, url: str) -> int:
        """Push every app's route to the gateway at ``url``; how many it acknowledged."""
        n = 0
        for app in list(self.cp.reconciler.apps):
            if await self.publish_to(url, app):
                n += 1
        return n

    def update(self) -> None:
        """One pass: sync every gateway in the background (reading its routes back every
        ``GATEWAY_OBSERVE_EVERY``-th pass)."""
        self._passes += 1
        for url in list(self.gateways):
            self.cp.spawn(self.sync(url, observe=self._passes % GATEWAY_OBSERVE_EVERY == 0))

    async def sync(self, url: str, observe: bool) -> None:
        """Push the routes whose body differs from what ``url`` acknowledged, and remove those of apps that
        are gone. ``observe``: first read the gateway's routes back (``GET /v1/routes``)."""
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
                self.acked[url] = {app: _read_route(app, body) for app, body in held.items()}
        acked = self.acked.setdefault(url, {})
        apps = self.cp.reconciler.apps
        for app in list(apps):
            if self.cp.transitions.hands_off(app):
                continue  # the move publishes its own switch
            want = self.route_body(app)
            if (app in acked) if want is None else (acked.get(app) != want):
                await self.publish_to(url, app)
        for app in [a for a in acked if a not in apps]:
            status, err = await self._call("DELETE", f"{url}/v1/routes/{quote(app)}")
            if err is None or status == 404:
                acked.pop(app, None)

    async def observations(self) -> list[tuple[str, Observations]]:
        """Every gateway's cumulative observations (``GET /v1/observations``), by url; one that does not
        answer is left out."""
        out: list[tuple[str, Observations]] = []
        if self._session is None:
            return out
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
                out.append((url, obs))
        return out

    async def _call(self, method: str, url: str, body: Any = None) -> tuple[int | None, str | None]:
        """(HTTP status or None, error text or None) of one call to a gateway."""
        if self._session is None:
            return None, "control plane is not started"
        return await http_call(self._session, method, url, body)


def _read_route(app: str, body: Any) -> AppRoute | None:
    """A route a gateway says it holds; None when it is not one we could have pushed."""
    try:
        return AppRoute.from_json(app, body)
    except (RouteError, ValueError):
        return None
