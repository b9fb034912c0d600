"""How the control plane talks to node agents: one interface, :class:`AgentDriver`, so that the control plane's
logic (admission, reconciliation, make-before-break moves) does not know how an agent is reached.

:class:`HttpAgentDriver` speaks the agent's control API over HTTP (``PUT``/``DELETE /v1/apps/{app}``,
``GET /v2/models/{app}/ready``, ``PUT /v1/devices/{device}/power``; see the agent's module docstring).
Another engine (a distributed one, say) supplies its own driver, e.g. calling actor methods instead of URLs: the control plane only needs the four
operations below, each of which either succeeds or raises :class:`AgentCallError` with a message that names
the call and what came back.
"""

from __future__ import annotations

import asyncio
import json
import time
from abc import ABC, abstractmethod
from typing import Any

import aiohttp

from edgemux.runtime.auth import auth_headers
from edgemux.runtime.httputil import quote


PROBES = 9           # round trips of a serving-path probe (the first, which may connect, is left out)
PROBE_GAP_S = 0.05   # between them (s)


class AgentCallError(Exception):
    """A call to an agent that did not do what was asked. ``status``: the agent's HTTP status, or None when
    no answer came (refused, timed out). ``message`` names the call and the agent's error."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class AgentDriver(ABC):
    """The operations the control plane performs on a node's agent, addressed by the agent's ``url`` as it
    registered (an opaque address for drivers that do not speak HTTP)."""

    async def start(self) -> None:
        """Acquire what calls need (connections); called once before the first call."""

    async def close(self) -> None:
        """Release what :meth:`start` acquired."""

    @abstractmethod
    async def put_app(self, url: str, app: str, body: dict[str, Any]) -> None:
        """Load and route ``app`` on the agent as ``body`` says (one piece, or ``{"pieces": [...]}``); returns
        when the model is loaded. ``AgentCallError`` when the agent refuses or cannot be reached."""

    @abstractmethod
    async def delete_app(self, url: str, app: str) -> None:
        """Unroute ``app`` on the agent (its model unloads after its in-flight requests). An app the agent
        does not have counts as done. ``AgentCallError`` otherwise."""

    @abstractmethod
    async def app_ready(self, url: str, app: str) -> bool:
        """True when the agent serves ``app`` (its model is loaded and its device runs)."""

    @abstractmethod
    async def set_power(self, url: str, device: str, state: str) -> None:
        """Switch ``device`` (its name on the agent's node) ``on`` or ``off``. The agent refuses to switch off
        a device that holds a model (``AgentCallError``, status 409), and so a device is never switched off
        under a tenant, whatever the caller believes."""

    async def probe_ms(self, url: str) -> float | None:
        """The round trip (ms) of a request that does nothing on the agent: the start-up measure of a node's
        serving path (``adapt.serving``). None: this driver cannot time one (the default) or no answer came."""
        return None


class HttpAgentDriver(AgentDriver):
    """:class:`AgentDriver` over the agent's HTTP control API. ``timeout_s`` bounds each call (s): a ``PUT``
    may build a model and open a session, which takes seconds. ``token``: the cluster's admin token, sent with
    every call (``runtime.auth``; None: the agents are open)."""

    def __init__(self, timeout_s: float, token: str | None = None) -> None:
        self.timeout_s = float(timeout_s)
        self.token = token
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                                                  headers=auth_headers(self.token))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def put_app(self, url: str, app: str, body: dict[str, Any]) -> None:
        await self._call("PUT", f"{url}/v1/apps/{quote(app)}", body)

    async def delete_app(self, url: str, app: str) -> None:
        try:
            await self._call("DELETE", f"{url}/v1/apps/{quote(app)}")
        except AgentCallError as e:
            if e.status != 404:  # 404: already gone, which is what was asked
                raise

    async def app_ready(self, url: str, app: str) -> bool:
        try:
            await self._call("GET", f"{url}/v2/models/{quote(app)}/ready")
        except AgentCallError:
            return False
        return True

    async def set_power(self, url: str, device: str, state: str) -> None:
        await self._call("PUT", f"{url}/v1/devices/{quote(device)}/power", {"state": state})

    async def probe_ms(self, url: str) -> float | None:
        """The least of ``PROBES`` round trips of ``GET /v2/health/live`` (ms), ``PROBE_GAP_S`` apart (a
        client's spacing, not back to back: a process woken from idle is part of what a request pays).

        The least, not the median: an agent registers while the host is still starting the cluster's other
        processes (and, in a test run, other tests), and a round trip that waited for a core measures the
        host's start-up, not the hop. On a busy CI host the median once read more than 15.9 ms where an idle
        host reads under 1 ms (docs/adapt.md): ``ibis-hotspot-live`` started with its two apps on two nodes, which admission
        (adding the figure to every tenant's latency) does only from 15.9 ms on. What requests pay under load
        the windows learn (``adapt.serving``)."""
        if self._session is None:
            return None
        took = []
        for _ in range(PROBES):
            start = time.perf_counter()
            try:
                async with self._session.get(f"{url}/v2/health/live") as resp:
                    await resp.read()
                    ok = resp.status == 200
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                return None
            if not ok:
                return None
            took.append((time.perf_counter() - start) * 1000.0)
            await asyncio.sleep(PROBE_GAP_S)
        return min(took[1:])  # the first one may open the connection

    async def _call(self, method: str, url: str, body: Any = None) -> None:
        if self._session is None:
            raise AgentCallError(f"{method} {url}: the driver is not started")
        status, err = await http_call(self._session, method, url, body)
        if err is not None:
            raise AgentCallError(err, status)


async def http_call(session: aiohttp.ClientSession, method: str, url: str,
                    body: Any = None) -> tuple[int | None, str | None]:
    """One JSON call of the control plane (to an agent or a gateway): (HTTP status or None when no answer
    came, None or one line naming the call and the server's ``{"error": ...}``, or how it failed). Never
    raises but for cancellation."""
    try:
        async with session.request(method, url, json=body) as resp:
            raw = await resp.read()
            if 200 <= resp.status < 300:
                return resp.status, None
            try:
                detail = json.loads(raw).get("error") or raw[:200].decode("utf-8", "replace")
            except (ValueError, AttributeError):
                detail = raw[:200].decode("utf-8", "replace")
            return resp.status, f"{method} {url}: HTTP {resp.status}: {detail}"
    except asyncio.CancelledError:
        raise
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
        text = str(e)
        return None, f"{method} {url}: {type(e).__name__}" + (f": {text}" if text else "")
