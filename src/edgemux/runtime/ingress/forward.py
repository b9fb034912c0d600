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
import re
import ssl
import urllib.parse
from collections.abc import AsyncIterator, Callable, Mapping
from typing import cast

from multidict import CIMultiDict

from edgemux.runtime.auth import POLICED_HEADER, auth_headers
from edgemux.runtime.dataplane.protocol import HEADER_LENGTH_HEADER, ProtocolError
from edgemux.runtime.httpserver import BodyStream, HTTPError, Response
from edgemux.runtime.ingress.client import MAX_RESPONSE_BYTES
from edgemux.runtime.ingress.dispatch import Reply

__all__ = ["AgentCalls", "AttemptFailed", "PassedOn", "RequestBody", "forwarded_headers", "framing_problem", "passed_on"]

# Request headers passed on to the agent: what the protocol needs (binary extension, a compressed body),
# plus tracing ids; hop-by-hop and Host headers are the gateway's own, and so is POLICED_HEADER.
_FORWARD_REQUEST = ("Content-Type", "Content-Encoding", HEADER_LENGTH_HEADER, "traceparent", "tracestate", "X-Request-Id")
# Response headers passed back to the caller with an agent's answer.
_FORWARD_RESPONSE = ("Content-Type", "Content-Encoding", HEADER_LENGTH_HEADER, "Retry-After")
# A reply whose head holds these headers and no other is passed on byte for byte: they are the ones passed
# on anyway plus the two the gateway would write itself with the same values (the body's length, and the
# Date, which a proxy passes on as the origin wrote it: RFC 9110, section 6.6.1).
_PASSABLE = frozenset(h.lower() for h in (*_FORWARD_RESPONSE, "Content-Length", "Date"))
_PROBE_TAIL = b"Accept-Encoding: identity\r\n"
_INFERENCE_TAIL = _PROBE_TAIL + f"{POLICED_HEADER}: gateway\r\n".encode("latin-1")
# One header line of a reply: a token, a colon, a value (no line break inside).
_HEADER_LINE = re.compile(rb"^([!#$%&'*+.^_`|~0-9A-Za-z-]+):([^\r\n]*)\r\n", re.M)
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
        self._buf = bytearray()
        self._waiter: asyncio.Future[Reply] | None = None
        self._head: tuple[int, CIMultiDict[str], int] | None = None  # status, headers, body offset
        self._method = "GET"
        self._closed = False
        self._eof = False
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
        if self._waiter is None or self._waiter.done():
            self.close()  # bytes nobody asked for: the connection is out of step, never reuse it
            return
        self._buf += data
        self._parse()

    def eof_received(self) -> bool:
        self._eof = True
        if self._waiter is not None and not self._waiter.done():
            self._parse()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.reusable = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._waiter is not None and not self._waiter.done():
            self._eof = True
            self._parse()
            if not self._waiter.done():
                started = bool(self._buf) or self._head is not None
                self._waiter.set_exception(_Failed("connection closed mid-answer") if started else _Hangup())
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
        closes the connection and raises ``_Failed``. Cancelled or timed out: closed."""
        assert self.transport is not None
        if not self.usable:
            raise _Hangup()
        self._waiter = waiter = self._loop.create_future()
        self._deadline = deadline
        if self._timer is None or deadline < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = deadline
            self._timer = self._loop.call_at(deadline, self._on_timer)
        self._buf.clear()
        self._head, self._method, self.reusable = None, method, False
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

    def _parse(self) -> None:
        """Advance the reply's parsing with what has arrived; settle the waiter when it is complete (or
        cannot be HTTP)."""
        assert self._waiter is not None
        try:
            reply = self._reply()
        except _Failed as e:
            self.close()
            self._waiter.set_exception(e)
            return
        if reply is not None:
            self._waiter.set_result(reply)

    def _reply(self) -> Reply | None:
        buf = self._buf
        while self._head is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > _MAX_HEAD_BYTES:
                    raise _Failed(f"malformed reply: a head over {_MAX_HEAD_BYTES} bytes")
                if self._eof and buf:
                    raise _Failed("connection closed mid-answer")
                return None
            status, headers = _parse_head(bytes(buf[:end]))
            if 100 <= status < 200:  # an interim answer (100 Continue): the real one follows
                del buf[: end + 4]
                continue
            self._head = (status, headers, end + 4)
        status, headers, start = self._head
        close = "close" in headers.get("Connection", "").lower()
        if self._method == "HEAD" or status in (204, 304):
            body: bytes | None = b""
            done_at = start
        elif "chunked" in headers.get("Transfer-Encoding", "").lower():
            body, done_at = self._dechunk(start)
        elif (length := headers.get("Content-Length")) is not None:
            try:
                n = int(length)
            except ValueError:
                raise _Failed(f"malformed reply: Content-Length {length[:40]!r}") from None
            if n < 0 or n > MAX_RESPONSE_BYTES:
                raise _Failed(f"response larger than {MAX_RESPONSE_BYTES} bytes" if n > 0 else
                              f"malformed reply: Content-Length {n}")
            done_at = start + n
            if len(buf) < done_at:
                return None
            if len(buf) == done_at and buf.startswith(b"HTTP/1.1 ") and _PASSABLE.issuperset(map(str.lower, headers)):
                # the usual reply, exactly what the gateway would answer: passed on as it came (passed_on)
                wire = bytes(buf)
                self.reusable = True  # no Connection header (not passable): kept alive
                return Reply(status, headers, wire[start:], wire)
            body = bytes(buf[start:done_at])
        else:  # framed by the end of the connection
            if len(buf) - start > MAX_RESPONSE_BYTES:
                raise _Failed(f"response larger than {MAX_RESPONSE_BYTES} bytes")
            body, done_at, close = (bytes(buf[start:]), len(buf), True) if self._eof else (None, 0, True)
        if body is None:
            return None
        if len(buf) > done_at:  # more than the reply: out of step, never reuse
            close = True
        self.reusable = not close
        return Reply(status, headers, body)

    def _dechunk(self, start: int) -> tuple[bytes | None, int]:
        """The chunked body from ``start`` when it is complete (None, 0 while it is not)."""
        buf, pos, size = self._buf, start, 0
        chunks: list[bytes] = []
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                return None, 0
            try:
                n = int(bytes(buf[pos:eol]).split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise _Failed("malformed reply: a bad chunk size") from None
            if n == 0:
                end = buf.find(b"\r\n\r\n", eol)  # after the trailers, if any
                if end < 0 and buf[eol: eol + 4] != b"\r\n\r\n":
                    return None, 0
                return b"".join(chunks), (end if end >= 0 else eol) + 4
            size += n
            if size > MAX_RESPONSE_BYTES:
                raise _Failed(f"response larger than {MAX_RESPONSE_BYTES} bytes")
            if len(buf) < eol + 2 + n + 2:
                return None, 0
            chunks.append(bytes(buf[eol + 2: eol + 2 + n]))
            pos = eol + 2 + n + 2


def _parse_head(raw: bytes) -> tuple[int, CIMultiDict[str]]:
    """The status and headers of a reply's head; ``_Failed`` when it is not HTTP/1.x."""
    status_line, _, rest = raw.partition(b"\r\n")
    version, _, reason = status_line.partition(b" ")
    code = reason[:3]
    if not version.startswith(b"HTTP/1.") or not code.isdigit():
        raise _Failed(f"malformed reply: status line {status_line[:60]!r}")
    pairs = _HEADER_LINE.findall(rest + b"\r\n") if rest else []
    if len(pairs) != rest.count(b"\r\n") + (1 if rest else 0):  # a line that is not "name: value"
        bad = next(line for line in rest.split(b"\r\n") if not _HEADER_LINE.fullmatch(line + b"\r\n"))
        raise _Failed(f"malformed reply: header line {bad[:60]!r}")
    headers: CIMultiDict[str] = CIMultiDict([(k.decode("latin-1"), v.strip().decode("latin-1")) for k, v in pairs])
    if version == b"HTTP/1.0" and "keep-alive" not in headers.get("Connection", "").lower():
        headers.add("Connection", "close")  # HTTP/1.0 closes unless it says otherwise
    return int(code), headers


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


def forwarded_headers(headers: Mapping[str, str], *, inference: bool) -> bytes:
    """The header lines an agent gets, encoded: the caller's that the protocol needs (and tracing ids), asking
    for the reply as is; with ``inference``, the gateway's mark that it policed and counted the request
    (``POLICED_HEADER``). A value with a line break is dropped: a header can never add another."""
    lines = []
    for name in _FORWARD_REQUEST:
        value = headers.get(name)
        if value is not None and "\r" not in value and "\n" not in value:
            lines.append(f"{name}: {value}\r\n".encode("utf-8", "surrogateescape"))
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

    def encode(self, keep_alive: bool, http10: bool, head_only: bool, date: bytes) -> bytes:
        if keep_alive and not http10 and not head_only:
            return self.wire
        headers = self._reply.headers
        self.headers = {k: headers[k] for k in _FORWARD_RESPONSE if k in headers}
        return super().encode(keep_alive, http10, head_only, date)
