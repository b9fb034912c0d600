"""The gateway's side of a request to an agent: the caller's body on its way, one attempt at one agent, and
what of the agent's reply is checked before it is passed on.

- :class:`RequestBody`: the caller's body, read once; streamed to the first attempt as it arrives (or sent
  as one piece when it has all arrived already), kept, and sent whole on a failover;
- :class:`AgentCalls`: one keep-alive connection pool to the agents; :meth:`AgentCalls.exchange` is one
  attempt (its reply, or :class:`AttemptFailed` when the agent failed to answer);
- :func:`framing_problem`: the gateway does not decode replies; a 200 is passed on when its framing holds
  (the Open Inference Protocol's JSON object, and for binary tensors the JSON header's length inside the
  body), and an agent answering garbage is failed over like one that hangs up.

Units: bytes, seconds (``timeout_s``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from edgemux.runtime.auth import POLICED_HEADER, auth_headers
from edgemux.runtime.dataplane.protocol import HEADER_LENGTH_HEADER, ProtocolError
from edgemux.runtime.ingress.client import MAX_RESPONSE_BYTES
from edgemux.runtime.ingress.dispatch import Reply

__all__ = ["AgentCalls", "AttemptFailed", "RequestBody", "forwarded_headers", "framing_problem", "passed_on"]

# Request headers passed on to the agent: what the protocol needs (binary extension, a compressed body),
# plus tracing ids; hop-by-hop and Host headers are the gateway's own, and so is POLICED_HEADER.
_FORWARD_REQUEST = ("Content-Type", "Content-Encoding", HEADER_LENGTH_HEADER, "traceparent", "tracestate", "X-Request-Id")
# Response headers passed back to the caller with an agent's answer.
_FORWARD_RESPONSE = ("Content-Type", "Content-Encoding", HEADER_LENGTH_HEADER, "Retry-After")
# Read size for replies (bytes): read in chunks so that the bound is enforced early.
_READ_CHUNK = 64 * 1024
_WHITESPACE = b" \t\r\n"


class AttemptFailed(Exception):
    """One attempt at one endpoint failed in a way that says the endpoint is unhealthy (``reason``), and the
    endpoint asked to be left alone for ``retry_after_s`` seconds (None: the gateway's cooldown)."""

    def __init__(self, reason: str, retry_after_s: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s


class RequestBody:
    """A request body on its way to the agents, read from the caller once.

    ``stream()`` hands it to the first attempt chunk by chunk as it arrives, keeping each chunk; ``whole()``
    reads what is left and returns all of it, for a chunked body (bounded by ``limit`` bytes: 413 above) and
    for every attempt after the first. ``length`` is the declared Content-Length (bytes), None for a chunked
    body. When the caller's side breaks off, ``error`` says so (the attempt that was streaming it fails, and
    that is not the endpoint's fault) and ``whole()`` raises it."""

    def __init__(self, content: aiohttp.StreamReader, length: int | None, limit: int) -> None:
        self.length = length
        self.error: ProtocolError | None = None
        self._content = content
        self._limit = limit
        self._chunks: list[bytes] = []
        self._size = 0
        self._done = False

    @property
    def streamable(self) -> bool:
        """Whether the first attempt streams it: its length is declared, nothing of it was read yet, and it
        has not all arrived already (a body that has is sent as one piece: one write, no stream to drive)."""
        return (self.length is not None and self._size == 0 and not self._done
                and self._content.total_bytes < self.length)

    async def _next(self) -> bytes:
        """The next chunk, kept (b"" at the end). No await between the read and the keeping: an attempt
        cancelled while streaming loses no byte of the body."""
        if self._done:
            return b""
        if self.error is not None:
            raise self.error
        try:
            chunk = await self._content.readany()
        except (aiohttp.ClientError, OSError, asyncio.IncompleteReadError) as e:
            self.error = ProtocolError(f"the request body broke off after {self._size} bytes ({type(e).__name__})")
            raise self.error from None
        if not chunk:
            self._done = True
            return b""
        self._size += len(chunk)
        if self._size > self._limit:
            self.error = ProtocolError(f"request body exceeds the limit of {self._limit} bytes", 413)
            raise self.error
        self._chunks.append(chunk)
        return chunk

    async def stream(self) -> AsyncIterator[bytes]:
        """The body as it arrives (for aiohttp's client to send with the declared Content-Length)."""
        while chunk := await self._next():
            yield chunk

    async def whole(self) -> bytes:
        """All of the body: what was streamed already and the rest, read now."""
        while await self._next():
            pass
        if len(self._chunks) > 1:  # joined once, then kept whole for further attempts
            self._chunks = [b"".join(self._chunks)]
        return self._chunks[0] if self._chunks else b""


class AgentCalls:
    """The gateway's calls to agents over one keep-alive pool (opened by :meth:`start` in the running event
    loop). ``timeout_s`` bounds each attempt (seconds, connect to last byte); ``token``: the cluster's admin
    token, which every call carries (the agents take the gateway's inference on it; the client's key stays at
    the gateway)."""

    def __init__(self, timeout_s: float, token: str | None) -> None:
        self.timeout_s = timeout_s
        self.token = token
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        """Open the connection pool (inside the running event loop)."""
        if self._session is None or self._session.closed:
            # One pool for all agents: keep-alive connections are reused across requests and apps. No
            # per-host limit (agents queue on their own devices); a total bound protects the gateway's sockets.
            connector = aiohttp.TCPConnector(limit=1024, limit_per_host=0)
            self._session = aiohttp.ClientSession(
                connector=connector,
                # Bodies travel as they are: no decompression, no compression, no redirects followed.
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                headers=auth_headers(self.token),
            )

    async def close(self) -> None:
        """Close the connection pool (a later call opens a new one)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def exchange(self, method: str, url: str, body: RequestBody | None, headers: Mapping[str, str]) -> Reply:
        """One attempt at an agent: the reply (any status), or :class:`AttemptFailed` on a transport failure
        (check ``body.error``: the caller's body may be what failed). ``body`` is streamed when the first
        attempt can stream it, sent whole otherwise; reading its rest may raise its ``ProtocolError``."""
        if self._session is None or self._session.closed:
            await self.start()
        assert self._session is not None
        for fresh in (False, True):
            data: bytes | AsyncIterator[bytes] | None = None
            sent = headers
            if body is not None and body.streamable:
                assert body.length is not None
                data, sent = body.stream(), {**headers, "Content-Length": str(body.length)}
            elif body is not None:
                data = await body.whole()
            try:
                async with self._session.request(method, url, data=data, headers=sent, allow_redirects=False) as resp:
                    # aiohttp's headers stand in for http.client's: both answer .get(name) case-insensitively.
                    return Reply(resp.status, resp.headers, await _read_reply(resp))
            except aiohttp.ServerDisconnectedError:
                # A keep-alive connection the agent closed while idle fails before any reply byte: that says
                # nothing about the agent, so retry once (aiohttp retries only idempotent methods itself,
                # and inference has no side effects). A second hang-up is the agent's failure.
                if fresh or (body is not None and body.error is not None):
                    raise AttemptFailed("connection closed by the server without an answer") from None
            except asyncio.TimeoutError:
                raise AttemptFailed(f"no answer within the {self.timeout_s:g} s timeout") from None
            except aiohttp.ClientConnectorError as e:
                raise AttemptFailed(_connect_failure(e)) from None
            except (aiohttp.ClientError, OSError) as e:
                raise AttemptFailed(f"{type(e).__name__}: {e}") from None
        raise AssertionError("unreachable")


def framing_problem(reply: Reply) -> str | None:
    """Why a 200 cannot be an Open Inference Protocol answer (None: its framing holds), from its framing alone,
    without decoding it: the body (or, with binary tensors, its JSON header of
    ``Inference-Header-Content-Length`` bytes, a number within the body) must be one JSON object, ``{...}``.
    A compressed body is not looked into (the caller asked for it)."""
    if reply.headers.get("Content-Encoding", "identity").strip().lower() not in ("", "identity"):
        return None
    body = reply.body
    raw = reply.headers.get(HEADER_LENGTH_HEADER)
    if raw is not None:
        try:
            n = int(raw)
        except ValueError:
            return f"malformed reply: {HEADER_LENGTH_HEADER} {raw[:40]!r} is not a number"
        if not 0 < n <= len(body):
            return f"malformed reply: {HEADER_LENGTH_HEADER} {n} outside its body of {len(body)} bytes"
        body = body[:n]
    head = body.strip(_WHITESPACE)
    if not (head.startswith(b"{") and head.endswith(b"}")):
        return "malformed reply: not a JSON object"
    return None


def forwarded_headers(headers: Mapping[str, str], *, inference: bool) -> CIMultiDict[str]:
    """The caller's headers an agent gets (the protocol's and tracing ids), asking for the reply as is; with
    ``inference``, the gateway's mark that it policed and counted the request (``POLICED_HEADER``)."""
    out: CIMultiDict[str] = CIMultiDict()
    for name in _FORWARD_REQUEST:
        value = headers.get(name)
        if value is not None:
            out[name] = value
    # Replies come back as the agent sends them and are checked before being passed on: ask for them plain.
    out["Accept-Encoding"] = "identity"
    if inference:
        out[POLICED_HEADER] = "gateway"
    return out


def passed_on(reply: Reply) -> web.Response:
    """The agent's reply as the gateway's answer: status, body and the protocol's headers, unchanged."""
    headers = {k: reply.headers[k] for k in _FORWARD_RESPONSE if k in reply.headers}
    return web.Response(status=reply.status, body=reply.body, headers=headers)


async def _read_reply(resp: aiohttp.ClientResponse) -> bytes:
    """The reply body, bounded so that a broken agent cannot exhaust the gateway's memory."""
    if resp.content_length is not None and resp.content_length > MAX_RESPONSE_BYTES:
        raise AttemptFailed(f"response larger than {MAX_RESPONSE_BYTES} bytes")
    chunks: list[bytes] = []
    size = 0
    while chunk := await resp.content.read(_READ_CHUNK):
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            raise AttemptFailed(f"response larger than {MAX_RESPONSE_BYTES} bytes")
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _connect_failure(e: aiohttp.ClientConnectorError) -> str:
    if isinstance(e.os_error, ConnectionRefusedError):
        return "connection refused"
    return f"cannot connect: {e.os_error or e}"
