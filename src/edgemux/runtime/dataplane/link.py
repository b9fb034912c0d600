"""A node agent's link to the control plane: register, heartbeat every ``heartbeat_s``, deregister on a
graceful stop (docs/reference/http.md, "Agent to control plane contract"). Failures to reach the control
plane are logged and retried, never fatal. Units: ``*_s`` seconds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import aiohttp

from edgemux.runtime.auth import auth_headers
from edgemux.runtime.dataplane.messages import AgentReport
from edgemux.runtime.httputil import describe_exc, quote

__all__ = ["ControlPlaneLink"]

logger = logging.getLogger("edgemux.agent")

_RETRY_FIRST_S = 0.5


class ControlPlaneLink:
    """Registers the agent of ``node`` with the control plane at ``base_url`` and heartbeats every
    ``heartbeat_s`` seconds, each message being ``report()`` (the contract of docs/reference/http.md), with
    the admin ``token`` when the cluster has one.

    Never fatal: every failure is logged and retried. ``registered`` says whether the last exchange
    succeeded; ``last_error`` holds the latest failure (None after a success); ``sent`` counts the messages
    the control plane accepted. ``timeout_s`` bounds one exchange (s).
    """

    def __init__(self, node: str, report: Callable[[], AgentReport], base_url: str, *, heartbeat_s: float,
                 token: str | None = None, timeout_s: float = 5.0) -> None:
        self.node = node
        self.report = report
        self.token = token
        self.url = f"{base_url.rstrip('/')}/v1/agents/{quote(node)}"
        self.heartbeat_s = heartbeat_s
        self.timeout_s = min(timeout_s, max(heartbeat_s, 0.5))
        self.registered = False
        self.last_error: str | None = None
        self.sent = 0
        self._task: asyncio.Task[None] | None = None
        self._down = False  # in an outage: warn once when it starts, not at every retry

    def start(self) -> None:
        """Start the background task on the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"edgemux-link-{self.node}")

    async def stop(self, deregister: bool = True) -> None:
        """Stop heartbeating and, when registered, tell the control plane this agent is leaving (2 s)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        if deregister and self.registered:
            try:
                async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0),
                                                 headers=auth_headers(self.token)) as s:
                    async with s.delete(self.url) as resp:
                        await resp.read()
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                logger.info("could not deregister from the control plane at %s: %s", self.url, describe_exc(e))
            self.registered = False

    async def _run(self) -> None:
        delay = min(_RETRY_FIRST_S, self.heartbeat_s)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                                         headers=auth_headers(self.token)) as session:
            while True:
                ok = False
                again_now = False
                try:
                    method = "PUT" if self.registered else "POST"
                    async with session.request(method, self.url, json=self.report().to_json()) as resp:
                        await resp.read()
                        status = resp.status
                    if 200 <= status < 300:
                        ok = True
                        self.registered = True
                        self.sent += 1
                    elif method == "PUT" and status in (404, 410):
                        # the control plane forgot us (restarted without its store): register again now
                        logger.info("control plane at %s does not know node %s: registering again",
                                    self.url, self.node)
                        self.registered = False
                        again_now = True
                    else:
                        self._failed(f"{method} answered HTTP {status}")
                except asyncio.CancelledError:
                    raise
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                    self._failed(describe_exc(e))
                except Exception as e:  # never let a bug here stop the agent from serving
                    logger.exception("control-plane link failed")
                    self._failed(describe_exc(e))
                if ok:
                    if self._down:
                        logger.info("control plane at %s reachable again", self.url)
                    self._down = False
                    self.last_error = None
                    delay = min(_RETRY_FIRST_S, self.heartbeat_s)
                    await asyncio.sleep(self.heartbeat_s)
                elif not again_now:
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self.heartbeat_s)

    def _failed(self, reason: str) -> None:
        self.last_error = reason
        if not self._down:
            logger.warning("control plane at %s unreachable (%s); serving on, retrying", self.url, reason)
        else:
            logger.debug("control plane at %s still unreachable: %s", self.url, reason)
        self._down = True
