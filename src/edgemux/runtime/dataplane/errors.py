"""The requests a node agent refuses, as errors carrying their HTTP status (``runtime.dataplane.agent`` answers
them with its error table)."""

from __future__ import annotations

from edgemux.errors import EdgemuxError
from edgemux.runtime.httputil import clip

__all__ = ["AgentError", "Fenced", "OverContract"]


class AgentError(EdgemuxError):
    """A request the agent refuses: ``status`` is the HTTP status (400, 404, 409, 504...)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class OverContract(AgentError):
    """The app's token bucket on this agent has no token within ``policing.max_wait_s``: 429, with
    ``retry_after_s`` (s) until one comes."""

    def __init__(self, app: str, retry_after_s: float) -> None:
        super().__init__(f"app '{clip(app)}' is over its contract on this agent: rate limited (its next token "
                         f"in {retry_after_s:.3f} s)", 429)
        self.retry_after_s = retry_after_s


class Fenced(AgentError):
    """The agent is fenced (``runtime.dataplane.lease``): its lease from the control plane ran out, or the
    control plane's answer after a lapsed lease no longer places the app here. 503, with ``retry_after_s``
    (s): the next heartbeat may renew the lease. The message names the reason (it starts with ``fenced:``)."""

    def __init__(self, reason: str, retry_after_s: float) -> None:
        super().__init__(reason, 503)
        self.retry_after_s = retry_after_s
