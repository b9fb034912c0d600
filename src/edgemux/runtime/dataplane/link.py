"""A node agent's link to the control plane: register, heartbeat every ``heartbeat_s``, deregister on a
graceful stop (docs/reference/http.md, "Agent to control plane contract"). Failures to reach the control
plane are logged and retried, never fatal. Units: ``*_s`` seconds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

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

    Never fatal: every failure is logged and retried (``delay`` after the failed send, from 0.5 s doubling up
    to ``heartbeat_s``: a timed-out exchange at once). ``registered`` says whether the last exchange
    succeeded; ``last_error`` holds the latest failure (None after a success); ``sent`` counts the messages
    the control plane accepted. ``timeout_s`` bounds one exchange (s). ``on_answer(sent_at, answer)`` is
    called with each accepted message's JSON answer (None when it is not JSON) and the ``clock()`` reading
    (s) taken just before it was sent: what renews the agent's lease (``dataplane.lease``).
    """

    def __init__(self, node: str, report: Callable[[], AgentReport], base_url: str, *, heartbeat_s: float,
                 token: str | None = None, timeout_s: float = 5.0,
                 on_answer: Callable[[float, Any], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.node = node
        self.report = report
        self.token = token
        self.url = f"{base_url.rstrip('/')}/v1/agents/{quote(node)}"
        self.heartbeat_s = heartbeat_s
        self.timeout_s = min(timeout_s, max(heartbeat_s, 0.5))
        self.registered = False
        self.last_error: str | None = None
        self.sent = 0
        self.on_answer = on_answer
        self.clock = clock
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
            loop = asyncio.get_running_loop()
            while True:
                ok = False
                again_now = False
                started = loop.time()  # the cadence runs from each send (the lease is renewed from it)
                try:
                    method = "PUT" if self.registered else "POST"
                    body = self.report().to_json()
                    sent_at = self.clock()  # before sending: the control plane stamps the message later
                    async with session.request(method, self.url, json=body) as resp:
                        raw = await resp.read()
                        status = resp.status
                    if 200 <= status < 300:
                        ok = True
                        self.registered = True
                        self.sent += 1
                        if self.on_answer is not None:
                            self.on_answer(sent_at, _json_or_none(raw))
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
                    # the next one heartbeat_s after this one was sent, not after its answer: a slow answer
                    # does not stretch the period (the lease, renewed from each send, counts it so)
                    await asyncio.sleep(max(0.0, started + self.heartbeat_s - loop.time()))
                elif not again_now:
                    # `delay` after the failed send: a failure that took that long already (a timeout) is
                    # retried at once, so one lost heartbeat costs one timeout, not a timeout and a delay more;
                    # one that came back at once (refused) waits, the delay doubling up to heartbeat_s
                    await asyncio.sleep(max(0.0, started + delay - loop.time()))
                    delay = min(delay * 2, self.heartbeat_s)

    def _failed(self, reason: str) -> None:
        self.last_error = reason
        if not self._down:
            logger.warning("control plane at %s unreachable (%s); serving on, retrying", self.url, reason)
        else:
            logger.debug("control plane at %s still unreachable: %s", self.url, reason)
        self._down = True


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None
