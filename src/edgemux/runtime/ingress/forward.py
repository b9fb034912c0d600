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
import collections
import ssl
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import cast

import httptools
from multidict import CIMultiDict

from edgemux.runtime.auth import POLICED_HEADER, auth_headers
from edgemux.runtime.dataplane.protocol import HEADER_LENGTH_HEADER, ProtocolError
from edgemux.runtime.dataplane.shm import PASSED_ON_HEADER
from edgemux.runtime.dataplane.shm import on_this_host as shm_on_this_host
from edgemux.runtime.httpserver import BodyStream, HTTPError, Response
from edgemux.runtime.ingress.client import MAX_RESPONSE_BYTES
from edgemux.runtime.ingress.dispatch import Reply

__all__ = ["AgentCalls", "AttemptFailed", "PassedOn", "RequestBody", "forwarded_headers", "framing_problem", "passed_on"]

# Request headers passed on to the agent: what the protocol needs (binary extension, a compressed body),
# plus tracing ids; hop-by-hop and Host headers are the gateway's own, and so is POLICED_HEADER.
_FORWARD_REQUEST = ("Content-Type", "Content-Encoding", HEADER_LENGTH_HEADER, "traceparent", "tracestate", "X-Request-Id")
_FORWARD_REQUEST_LOWER = frozenset(h.lower().encode("latin-1") for h in _FORWARD_REQUEST)
# Response headers passed back to the caller with an agent's answer.
_FORWARD_RESPONSE = ("Content-Type", "Content-Encoding", HEADER_LENGTH_HEADER, "Retry-After")
# A reply whose head holds these headers and no other is passed on byte for byte: they are the ones passed
# on anyway plus the two the gateway would write itself with the same values (the body's length, and the
# Date, which a proxy passes on as the origin wrote it: RFC 9110, section 6.6.1).
_PASSABLE = frozenset(h.lower() for h in (*_FORWARD_RESPONSE, "Content-Length", "Date"))
_PROBE_TAIL = b"Accept-Encoding: identity\r\n"
_INFERENCE_TAIL = _PROBE_TAIL + f"{POLICED_HEADER}: gateway\r\n".encode("latin-1")
_PASSED_ON_LINE = f"{PASSED_ON_HEADER}: gateway\r\n".encode("latin-1")
# A reply's head (status line and headers) larger than this (bytes) is not an agent's.
_MAX_HEAD_BYTES = 64 * 1024
# Exchanges with agents at once, at most: a bound on the connections the gateway uses (agents queue on their
# own devices; more concurrent requests wait for a slot, within their attempt's timeout).
_MAX_CONNECTIONS = 1024
_WHITESPACE = b" \t\r\n"
# A body with less than this still to come (bytes) is awaited whole rather than streamed: on a LAN its rest is
# microseconds away, and streaming it would cost the agent a wake-up and a read per piece.
_STREAM_MIN_BYTES = 256 * 1024


class AttemptFailed(Exception):
    """One attempt at one endpoint failed in a way that says the endpoint is unhealthy (``reason``), and the
    endpoint asked to be left alone for ``retry_after_s`` seconds (None: the gateway's cooldown)."""

    def __init__(self, reason: str, retry_after_s: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class WholeBody:
    """An inference request that is not an HTTP request as it came (one that came by gRPC, or one whose
    tensors were read out of shared memory): the body an agent takes (``dataplane.protocol``'s HTTP
    encoding) and its header lines as (name, value) bytes, as ``Request.raw_headers`` has them. ``local``:
    another form of it for an agent on this host (:func:`on_this_host`), whose tensors stay in the caller's
    shared memory (``ingress.decoded``)."""

    body: bytes
    raw_headers: tuple[tuple[bytes, bytes], ...]
    local: WholeBody | None = None
    passes_on: bool = False  # its body names the caller's slots by their objects: sent with the gateway's mark

    def head(self) -> bytes:
        """The header lines an agent gets (:func:`forwarded_headers`); for a body that passes its caller's
        shared-memory slots on, with the mark that lets the agent honour them (``dataplane.shm.
        PASSED_ON_HEADER``: written here only, never passed on from a caller, whose headers go through the
        allowlist)."""
        head = forwarded_headers(self.raw_headers, inference=True)
        return head + _PASSED_ON_LINE if self.passes_on else head


_on_this_host: dict[str, bool] = {}


def on_this_host(url: str) -> bool:
    """``dataplane.shm.on_this_host``, remembered per agent URL (asked on every forward of such a request)."""
    known = _on_this_host.get(url)
    if known is None:
        known = _on_this_host[url] = shm_on_this_host(url)
    return known


class RequestBody:
    """A request body on its way to the agents, read from the caller once.

    ``stream()`` hands it to the first attempt chunk by chunk as it arrives, keeping each chunk; ``whole()``
    reads what is left and returns all of it, for a chunked body (bounded by ``limit`` bytes: 413 above) and
    for every attempt after the first. ``length`` is the declared Content-Length (bytes), None for a chunked
    body. When the caller's side breaks off, ``error`` says so (the attempt that was streaming it fails, and
    that is not the endpoint's fault) and ``whole()`` raises it."""

    def __init__(self, content: BodyStream, length: int | None, limit: int) -> None:
        self.length = length
        self.error: ProtocolError | None = None
        self._content = content
        self._limit = limit
        self._chunks: list[bytes] = []
        self._size = 0
        self._done = False

    @classmethod
    def complete(cls, data: bytes) -> RequestBody:
        """A body that is all here already (an inference that came by gRPC): sent in one piece."""
        body = cls(BodyStream(None, False, False), len(data), max(1, len(data)))
        body._chunks, body._size, body._done = ([data] if data else []), len(data), True
        return body

    @property
    def streamable(self) -> bool:
        """Whether the first attempt streams it: its length is declared, nothing of it was read yet, and it
        has not all arrived already (a body that has is sent as one piece: one write, no stream to drive)."""
        return (self.length is not None and self._size == 0 and not self._done
                and self._content.total_bytes + _STREAM_MIN_BYTES < self.length)

    async def _next(self) -> bytes:
        """The next chunk, kept (b"" at the end). No await between the read and the keeping: an attempt
        cancelled while streaming loses no byte of the body."""
        if self._done:
            return b""
        if self.error is not None:
            raise self.error
        try:
            chunk = await self._content.readany()
        except HTTPError as e:  # malformed chunked coding (400), no bytes for too long (408)
            self.error = ProtocolError(f"the request body broke off after {self._size} bytes: {e.message}", e.status)
            raise self.error from None
        except OSError as e:  # the caller went away
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
        """The body as it arrives (sent with the declared Content-Length)."""
        while chunk := await self._next():
            yield chunk

    def arrived(self) -> bytes | None:
        """All of the body when it has all arrived and nothing of it was read yet (taken at once, without
        waiting), else None (``whole()`` reads it). ``ProtocolError`` 413 above the limit."""
        if self._chunks or self._done or not self._content.complete:
            return None
        data = self._content.read_nowait()
        self._done = True
        if len(data) > self._limit:
            self.error = ProtocolError(f"request body exceeds the limit of {self._limit} bytes", 413)
            raise self.error
        self._size = len(data)
        self._chunks = [data] if data else []
        return data

    async def whole(self) -> bytes:
        """All of the body: what was streamed already and the rest, read now."""
        data = self.arrived()
        if data is not None:
            return data
        while await self._next():
            pass
        if len(self._chunks) > 1:  # joined once, then kept whole for further attempts
            self._chunks = [b"".join(self._chunks)]
        return self._chunks[0] if self._chunks else b""


class AgentCalls:
    """The gateway's calls to agents: HTTP/1.1 over a pool of keep-alive connections of its own, one exchange
    at a time on each (:class:`_Connection`). A call is a few dozen Python operations where a general client
    (aiohttp's) spends a few hundred on options the gateway never uses (cookies, redirects, proxies,
    compression, tracing): measured on the inference path, most of the gateway's own CPU time per request.

    ``timeout_s`` bounds each attempt (seconds, connect to last byte); ``token``: the cluster's admin token,
    which every call carries (the agents take the gateway's inference on it; the client's key stays at the
    gateway). HTTPS endpoints are verified against the CA bundle OpenSSL reads (``SSL_CERT_FILE``)."""

    def __init__(self, timeout_s: float, token: str | None) -> None:
        self.timeout_s = timeout_s
        self.token = token
        self._auth = "".join(f"{k}: {v}\r\n" for k, v in auth_headers(token).items()).encode("latin-1")
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._targets: dict[tuple[str, str], tuple[tuple[str, str, int], bytes]] = {}
        self._ssl: ssl.SSLContext | None = None
        self._open: set[_Connection] = set()
        self._busy = 0  # exchanges under way (each holds a connection)
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop it runs in (asking is a system call)
        self._queue: collections.deque[asyncio.Future[None]] = collections.deque()  # exchanges waiting for one

    async def start(self) -> None:
        """Nothing to open ahead: connections are made on first use and kept for the next exchange."""
        self._loop = asyncio.get_running_loop()

    async def close(self) -> None:
        """Close every connection (a later call opens new ones)."""
        for conn in list(self._open):
            conn.close()
        self._open.clear()
        self._idle.clear()
        self._loop = None

    async def exchange(self, method: str, url: str, body: RequestBody | None, headers: bytes) -> Reply:
        """One attempt at an agent: the reply (any status), or :class:`AttemptFailed` on a transport failure
        (check ``body.error``: the caller's body may be what failed). ``headers``: header lines, encoded
        (:func:`forwarded_headers`). ``body`` is streamed when the first attempt can stream it, sent whole
        otherwise; reading its rest may raise its ``ProtocolError``."""
        if method == "HEAD":  # its reply's Content-Length describes a body that does not come
            raise ValueError("an exchange is a GET or a POST, not a HEAD")
        key, line = self._target(method, url)
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        if self._busy < _MAX_CONNECTIONS and not self._queue:
            self._busy += 1  # a slot is free (the usual case): no wait
        else:
            await self._slot(deadline)
        try:
            for fresh in (False, True):
                data: bytes | AsyncIterator[bytes] = b""
                length = 0
                if body is not None:
                    arrived = body.arrived()  # the usual case: it has all arrived, and is sent as one piece
                    if arrived is not None:
                        data, length = arrived, len(arrived)
                    elif body.streamable:
                        assert body.length is not None
                        data, length = body.stream(), body.length
                    else:
                        data = await body.whole()
                        length = len(data)
                head = b"".join((line, headers, b"" if body is None else b"Content-Length: %d\r\n" % length,
                                 self._auth, b"\r\n"))
                try:
                    idle = self._idle.get(key)
                    conn = idle.pop() if idle else None
                    if conn is None or not conn.usable:
                        conn = self._idle_connection(key, conn)
                    if conn is None:
                        async with asyncio.timeout_at(deadline):
                            conn = await self._connect(key)
                    if isinstance(data, bytes):  # the usual case: the connection's own timer bounds the wait
                        reply = await conn.exchange(head, data, method, deadline)
                    else:  # streaming the caller's body: the wait for its bytes is bounded too
                        async with asyncio.timeout_at(deadline):
                            reply = await conn.exchange(head, data, method, deadline)
                except _Hangup:
                    # A keep-alive connection the agent closed while idle fails before any reply byte: that says
                    # nothing about the agent, so retry once (inference has no side effects). A second hang-up
                    # is the agent's failure.
                    if fresh or (body is not None and body.error is not None):
                        raise AttemptFailed("connection closed by the server without an answer") from None
                    continue
                except TimeoutError:
                    raise AttemptFailed(f"no answer within the {self.timeout_s:g} s timeout") from None
                except _Failed as e:
                    raise AttemptFailed(e.reason) from None
                if conn.reusable:
                    self._idle.setdefault(key, []).append(conn)
                else:
                    self._discard(conn)
                return reply
            raise AssertionError("unreachable")
        finally:
            self._release()

    async def _slot(self, deadline: float) -> None:
        """Wait (until ``deadline``, loop time) for one of the ``_MAX_CONNECTIONS`` exchange slots to be
        released: all are taken."""
        waiter = asyncio.get_running_loop().create_future()
        self._queue.append(waiter)
        try:
            async with asyncio.timeout_at(deadline):
                await waiter  # the releasing exchange hands its slot over (the count stays)
        except BaseException as e:
            if waiter.done() and not waiter.cancelled():
                self._release()  # handed over just as this one gave up: pass it on
            else:
                waiter.cancel()
            if isinstance(e, TimeoutError):
                raise AttemptFailed(f"no connection free within the {self.timeout_s:g} s timeout") from None
            raise

    def _release(self) -> None:
        while self._queue:
            waiter = self._queue.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._busy -= 1

    def _idle_connection(self, key: tuple[str, str, int], closed: _Connection | None) -> _Connection | None:
        """An idle connection to ``key`` (scheme, host, port) the agent has not closed meanwhile, if any;
        ``closed``: one taken from the idle ones that the agent has closed (discarded here)."""
        if closed is not None:
            self._discard(closed)
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.usable:
                return conn
            self._discard(conn)
        return None

    async def _connect(self, key: tuple[str, str, int]) -> _Connection:
        """A new connection to ``key`` (scheme, host, port)."""
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        context = None
        if scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            context = self._ssl
        try:
            _, conn = await loop.create_connection(lambda: _Connection(loop), host, port, ssl=context,
                                                   server_hostname=host if context is not None else None)
        except ConnectionRefusedError:
            raise AttemptFailed("connection refused") from None
        except OSError as e:  # no route, a name that does not resolve, a certificate not trusted...
            raise AttemptFailed(f"cannot connect: {e}") from None
        self._open.add(conn)
        conn.on_close = self._open.discard
        return conn

    def _discard(self, conn: _Connection) -> None:
        conn.close()
        self._open.discard(conn)

    def _target(self, method: str, url: str) -> tuple[tuple[str, str, int], bytes]:
        """(pool key, request line and Host header) of ``method`` on ``url``, made once per pair."""
        got = self._targets.get((method, url))
        if got is None:
            parts = urllib.parse.urlsplit(url)
            scheme, host = parts.scheme, parts.hostname or ""
            port = parts.port or (443 if scheme == "https" else 80)
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            netloc = f"[{host}]" if ":" in host else host
            if len(self._targets) > 4096:  # a bound: endpoints change rarely, URLs with versions a little more
                self._targets.clear()
            line = f"{method} {target} HTTP/1.1\r\nHost: {netloc}:{port}\r\n".encode("latin-1", "replace")
            got = self._targets[(method, url)] = ((scheme, host, port), line)
        return got


class _Hangup(Exception):
    """The connection ended before any byte of the reply: the agent may have closed it while it was idle."""


class _Failed(Exception):
    """The exchange failed once the reply had started (or the reply is not HTTP): ``reason`` says how."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection to an agent, one exchange at a time: writes a request (its head,
    then its body, as bytes or as chunks while they arrive, respecting the transport's flow control) and
    reads the reply into a :class:`Reply`: the status line, the headers, and a body framed by its
    Content-Length, by chunked transfer coding, or by the end of the connection; bounded by
    ``MAX_RESPONSE_BYTES``. After the exchange, ``reusable`` says whether the connection may take another."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.on_close: Callable[[_Connection], None] | None = None
        self._waiter: asyncio.Future[Reply] | None = None
        self._closed = False
        # the reply being read: llhttp (httptools, the parser the servers' requests went through a moment
        # before, so its code is warm) calls back as it finds the parts
        self._parser = httptools.HttpResponseParser(self)
        self._buf = bytearray()       # the exchange's bytes as they came (a reply passed on whole is these)
        self._status_seen = False     # the status line is parsed (errors before it are the status line's)
        self._fields: list[tuple[str, str]] = []
        self._head_bytes = 0
        self._headers: CIMultiDict[str] | None = None  # the final answer's headers, once its head is whole
        self._status = 0
        self._body: list[bytes] = []
        self._size = 0
        self._interim = False         # the message being read is an interim (1xx) answer: skipped
        self._by_eof = False          # the body runs to the end of the connection (no length, not chunked)
        self._complete = False        # the final answer is whole
        self._keep = False            # and the agent keeps the connection (llhttp's reading of it)
        self._extra = False           # bytes came after it: the connection is out of step
        self._as_it_came = True       # no interim answer went before it: its bytes may be passed on whole
        self._failure: _Failed | None = None  # raised inside a parser callback
        self._paused = False
        self._drain: asyncio.Future[None] | None = None
        self.reusable = False
        # the exchange's deadline (loop time), watched by one timer re-armed lazily: most exchanges end long
        # before it, and a timer made and cancelled per exchange would cost more than the check
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    # -- asyncio.Protocol ------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a TCP or TLS transport (uvloop's TLS one does not declare itself an asyncio.Transport)
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            self.close()  # bytes nobody asked for: the connection is out of step, never reuse it
            return
        self._buf += data
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError:
            self._fail(self._failure or _Failed("malformed reply"))
            return
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as e:
            self._fail(_Failed(self._malformed(str(e))))
            return
        if self._complete:
            self._settle()
        elif self._headers is None and len(self._buf) > _MAX_HEAD_BYTES:  # a header line that does not end
            self._fail(_Failed(f"malformed reply: a head over {_MAX_HEAD_BYTES} bytes"))

    def eof_received(self) -> bool:
        self._ended()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.reusable = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._waiter is not None and not self._waiter.done():
            self._ended()
            if not self._waiter.done():
                self._waiter.set_exception(_Failed("connection closed mid-answer") if self._buf else _Hangup())
        self._wake_writer(exc)
        if self.on_close is not None:
            self.on_close(self)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake_writer(None)

    # -- the exchange ----------------------------------------------------------------------------------

    @property
    def usable(self) -> bool:
        """Whether an idle connection may take an exchange (the agent has not closed it meanwhile)."""
        return not self._closed and self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    async def exchange(self, head: bytes, body: bytes | AsyncIterator[bytes], method: str, deadline: float) -> Reply:
        """Send one request (``head`` ready to write; ``body`` bytes, or chunks to stream) and read its reply.
        ``_Hangup`` when the connection ends before any reply byte, ``_Failed`` after; ``TimeoutError`` when
        the reply is not complete at ``deadline`` (loop time); a failing ``body`` stream (the caller's side)
        closes the connection and raises ``_Failed``. Cancelled or timed out: closed. The caller hands it a
        :attr:`usable` connection (asked once, by the pool)."""
        assert self.transport is not None
        if self._closed:
            raise _Hangup()
        self._waiter = waiter = self._loop.create_future()
        self._deadline = deadline
        if self._timer is None or deadline < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = deadline
            self._timer = self._loop.call_at(deadline, self._on_timer)
        self._buf.clear()
        self._headers, self._complete, self._extra, self._as_it_came, self.reusable = None, False, False, True, False
        sent_all = False
        try:
            if isinstance(body, bytes):
                self.transport.writelines((head, body))
            else:
                self.transport.write(head)
                try:
                    async for chunk in body:
                        if self._closed:
                            break
                        self.transport.write(chunk)
                        if self._paused:
                            await self._drained()
                except (ProtocolError, ConnectionError) as e:
                    self.close()  # half a body sent: the agent must not take the connection for a whole one
                    raise _Failed(f"the request body broke off: {e}") from None
            sent_all = not self._closed
            reply = await waiter
        except BaseException:
            self.close()
            raise
        finally:
            self._waiter = None
        # an agent that answered before the body was all sent may still be reading it: do not reuse
        self.reusable = self.reusable and sent_all and self.usable
        return reply

    def _on_timer(self) -> None:
        """The deadline's timer: the exchange in flight, if its deadline has come, fails with TimeoutError;
        else the timer is set again for the deadline of the exchange now under way."""
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done() or self._closed:
            return
        if self._loop.time() < self._deadline:
            self._timer_at = self._deadline
            self._timer = self._loop.call_at(self._deadline, self._on_timer)
            return
        waiter.set_exception(TimeoutError())

    async def _drained(self) -> None:
        self._drain = self._loop.create_future()
        try:
            await self._drain
        finally:
            self._drain = None

    def _wake_writer(self, exc: Exception | None) -> None:
        if self._drain is not None and not self._drain.done():
            if exc is not None or self._closed:
                self._drain.set_exception(ConnectionResetError("the connection to the agent closed"))
            else:
                self._drain.set_result(None)

    # -- reading the reply -----------------------------------------------------------------------------

    def _fail(self, failure: _Failed) -> None:
        self.close()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(failure)

    def _malformed(self, reason: str) -> str:
        """The reason llhttp gave, said of the part of the reply it is about."""
        if not self._status_seen:
            line = bytes(self._buf.partition(b"\r\n")[0][:60])
            return f"malformed reply: status line {line!r} ({reason})"
        if self._headers is None:
            part = "Content-Length" if "Content-Length" in reason else "header line"
            return f"malformed reply: {part} ({reason})"
        return f"malformed reply: body ({reason})"

    def _failing(self, reason: str) -> _Failed:
        """A failure raised inside a callback (httptools wraps it; data_received answers with it)."""
        self._failure = _Failed(reason)
        return self._failure

    def _ended(self) -> None:
        """The agent closed its side: a body framed by the end of the connection is whole now."""
        if self._waiter is None or self._waiter.done():
            return
        if self._headers is not None and self._by_eof and not self._complete:
            self._complete, self._keep = True, False
            self._settle()

    def _settle(self) -> None:
        """The final answer is whole: the waiter gets its :class:`Reply` (with its bytes as they came, to be
        passed on whole, when it is exactly what the gateway would answer: see :func:`passed_on`)."""
        assert self._waiter is not None and self._headers is not None
        headers, body = self._headers, (self._body[0] if len(self._body) == 1 else b"".join(self._body))
        self.reusable = self._keep and not self._extra
        wire = None
        if (self._as_it_came and not self._extra and "Content-Length" in headers and self._buf.startswith(b"HTTP/1.1 ")
                and _PASSABLE.issuperset(map(str.lower, headers))):
            wire = bytes(self._buf)
        self._waiter.set_result(Reply(self._status, headers, body, wire))

    # -- httptools callbacks ---------------------------------------------------------------------------

    # Once the answer asked for is whole, what follows it is not read: the connection is out of step
    # (``_extra``) and the answer stands as it was.

    def on_message_begin(self) -> None:
        if self._complete:
            self._extra = True  # a second answer behind the one asked for
            return
        self._status_seen, self._fields, self._head_bytes, self._body, self._size = False, [], 0, [], 0

    def on_status(self, status: bytes) -> None:
        self._status_seen = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._complete:
            return
        self._head_bytes += len(name) + len(value)
        if self._head_bytes > _MAX_HEAD_BYTES:
            raise self._failing(f"malformed reply: a head over {_MAX_HEAD_BYTES} bytes")
        self._fields.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        if self._complete:
            return
        status = self._parser.get_status_code()
        self._interim = 100 <= status < 200
        if self._interim:  # an interim answer (100 Continue): the real one follows
            self._as_it_came = False
            return
        headers = CIMultiDict(self._fields)
        length = headers.get("Content-Length")  # llhttp has checked it is a number
        if length is not None and int(length) > MAX_RESPONSE_BYTES:
            raise self._failing(f"response larger than {MAX_RESPONSE_BYTES} bytes")
        self._by_eof = (length is None and status not in (204, 304)
                        and "chunked" not in headers.get("Transfer-Encoding", "").lower())
        self._status, self._headers = status, headers

    def on_body(self, body: bytes) -> None:
        if self._complete:
            return
        self._size += len(body)
        if self._size > MAX_RESPONSE_BYTES:
            raise self._failing(f"response larger than {MAX_RESPONSE_BYTES} bytes")
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        if not self._complete:
            self._complete, self._keep = True, self._parser.should_keep_alive()


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


def forwarded_headers(raw_headers: Iterable[tuple[bytes, bytes]], *, inference: bool) -> bytes:
    """The header lines an agent gets, encoded: of the caller's (``Request.raw_headers``, bytes as they came,
    passed on without decoding), the first of each that the protocol needs (and tracing ids); then the ask
    for the reply as is, and with ``inference`` the gateway's mark that it policed and counted the request
    (``POLICED_HEADER``). A value with a line break is dropped: a header can never add another."""
    lines: list[bytes] = []
    seen: set[bytes] = set()
    for name, value in raw_headers:
        low = name.lower()
        if low in _FORWARD_REQUEST_LOWER and low not in seen and b"\r" not in value and b"\n" not in value:
            seen.add(low)
            lines += (name, b": ", value, b"\r\n")
    # Replies come back as the agent sends them and are checked before being passed on: ask for them plain.
    lines.append(_INFERENCE_TAIL if inference else _PROBE_TAIL)
    return b"".join(lines)


def passed_on(reply: Reply) -> Response:
    """The agent's reply as the gateway's answer: status, body and the protocol's headers, unchanged; one read
    with its ``wire`` bytes is answered with those bytes where it can be (:class:`PassedOn`)."""
    if reply.wire is not None:
        return PassedOn(reply)
    headers = {k: reply.headers[k] for k in _FORWARD_RESPONSE if k in reply.headers}
    return Response(reply.body, reply.status, headers)


class PassedOn(Response):
    """An agent's reply whose head holds nothing the gateway would write differently (``_PASSABLE``). On a
    kept HTTP/1.1 connection, and not to HEAD, the answer is its bytes as they came: no header is decoded and
    encoded again on the request's path. Otherwise (a connection that closes, HTTP/1.0, HEAD) it is encoded
    like any answer, from its status, body and passed-on headers."""

    __slots__ = ("wire", "_reply")

    def __init__(self, reply: Reply) -> None:
        super().__init__(reply.body, reply.status)
        assert reply.wire is not None
        self.wire = reply.wire
        self._reply = reply

    @property
    def reply(self) -> Reply:
        """The agent's reply it passes on (its headers as they came)."""
        return self._reply

    def encode(self, keep_alive: bool, http10: bool, head_only: bool, date: bytes) -> bytes:
        if keep_alive and not http10 and not head_only:
            return self.wire
        headers = self._reply.headers
        self.headers = {k: headers[k] for k in _FORWARD_RESPONSE if k in headers}
        return super().encode(keep_alive, http10, head_only, date)
