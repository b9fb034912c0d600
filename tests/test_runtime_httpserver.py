"""runtime.httpserver, the HTTP/1.1 server core under the agent, the gateway and the control plane, at the
protocol level: raw sockets write bytes and read what comes back.

Each behaviour of the module docstring has a test: keep-alive, ``Connection: close`` and HTTP/1.0, pipelined
requests answered in order, ``Expect: 100-continue``, chunked bodies, body and head limits, malformed requests,
HEAD, slow clients (idle, head, body, an answer nobody reads), a client that goes away mid-body, graceful
shutdown and TLS. Timeouts are the server's, set short by each test; every wait here is bounded, and nothing
asserts how fast anything was.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgemux.runtime.httpserver import (
    Application,
    ClientDisconnected,
    HTTPError,
    Limits,
    Request,
    Response,
    delete,
    get,
    post,
)
from edgemux.runtime.httputil import ErrorTable, Site, json_response, make_application, start_site
from support import LoopThread

BOUND_S = 20.0  # the longest any wait here may take: a guard against hanging, not a measurement


class Handlers:
    """The test application's handlers: echo a body, answer after a gate opens, record what they were told."""

    def __init__(self) -> None:
        self.gate: asyncio.Event | None = None
        self.entered: threading.Event = threading.Event()
        self.told: list[str] = []
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        self.finished = threading.Event()

    def routes(self) -> list[Any]:
        return [get("/hello", self.hello), post("/echo", self.echo), post("/refuse", self.refuse),
                get("/slow", self.slow), get("/big", self.big), post("/hold", self.hold),
                get("/items/{name}", self.item), delete("/items/{name}", self.item), get("/boom", self.boom),
                post("/first", self.first), get("/raw", self.raw)]

    async def raw(self, request: Request) -> Response:
        """Answers with the head's lines as they came (``raw_headers``), each ``name: value`` in latin-1."""
        lines = [f"{n.decode('latin-1')}: {v.decode('latin-1')}" for n, v in request.raw_headers]
        return json_response({"raw": lines, "x": request.headers.getall("X-Twice")})

    async def first(self, request: Request) -> Response:
        """Answers with the first piece of the body, as soon as it is there, without the rest."""
        return Response(await request.content.readany())

    async def hello(self, request: Request) -> Response:
        return json_response({"hello": request.query.get("who", "world")})

    async def echo(self, request: Request) -> Response:
        body = await request.read()
        return Response(body, headers={"X-Length": str(len(body))}, content_type="application/octet-stream")

    async def refuse(self, request: Request) -> Response:
        # answers from the head alone: the body is never read
        raise HTTPError(413, "refused from the head")

    async def slow(self, request: Request) -> Response:
        self.entered.set()
        assert self.gate is not None
        await asyncio.wait_for(self.gate.wait(), BOUND_S)
        self.finished.set()
        return json_response({"slow": True})

    async def big(self, request: Request) -> Response:
        return Response(b"z" * (8 << 20))

    async def hold(self, request: Request) -> Response:
        """Reads the body, recording how the read ended."""
        self.entered.set()
        try:
            await request.read()
            self.told.append("read")
        except ClientDisconnected:
            self.told.append("disconnected")
            raise
        except HTTPError as e:
            self.told.append(f"HTTP {e.status}")
            raise
        finally:
            self.finished.set()
        return json_response({})

    async def item(self, request: Request) -> Response:
        self.seen.append((request.method, request.path, dict(request.match_info)))
        return json_response({"name": request.match_info["name"]})

    async def boom(self, request: Request) -> Response:
        raise RuntimeError("a bug")


class Served:
    """The test application served from a loop thread with ``limits``; ``connect()`` opens a raw socket."""

    def __init__(self, lt: LoopThread, limits: Limits, shutdown_timeout_s: float = 5.0,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        import logging

        self.lt = lt
        self.handlers = Handlers()
        app = make_application(self.handlers.routes(), ErrorTable((), logging.getLogger("test")), client_max_size=1000)
        self.cleaned = threading.Event()

        async def cleanup() -> None:
            self.cleaned.set()

        app.on_cleanup.append(cleanup)

        async def start() -> Site:
            self.handlers.gate = asyncio.Event()
            return await start_site(app, "127.0.0.1", 0, limits=limits, shutdown_timeout_s=shutdown_timeout_s,
                                    ssl_context=ssl_context)

        self.site: Site = lt.run(start())
        self.port = self.site.server.addresses[0][1]

    def connect(self) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=BOUND_S)
        return s

    def open_gate(self) -> None:
        assert self.handlers.gate is not None
        self.lt.loop.call_soon_threadsafe(self.handlers.gate.set)

    def stop(self) -> None:
        self.open_gate()
        self.lt.run(self.site.stop(), timeout=BOUND_S + 10)


@pytest.fixture(scope="module")
def lt() -> Iterator[LoopThread]:
    loop_thread = LoopThread()
    yield loop_thread
    loop_thread.stop()


@pytest.fixture
def served(lt: LoopThread) -> Iterator[Served]:
    s = Served(lt, Limits())
    yield s
    s.stop()


# --------------------------------------------------------------------------------------------- reading


def read_answer(s: socket.socket, buf: bytearray | None = None, head_only: bool = False) -> tuple[int, dict[str, str], bytes]:
    """One answer from ``s`` (status, headers with lowercase names, body by its Content-Length); ``buf`` holds
    bytes read past the previous answer and keeps those past this one."""
    buf = buf if buf is not None else bytearray()
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before an answer's head; got {bytes(buf)!r}")
        buf += chunk
    end = buf.index(b"\r\n\r\n")
    head = bytes(buf[:end]).decode("latin-1").split("\r\n")
    del buf[: end + 4]
    status = int(head[0].split(" ")[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:])}
    length = 0 if head_only or status < 200 else int(headers.get("content-length", "0"))
    while len(buf) < length:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed mid-body")
        buf += chunk
    body = bytes(buf[:length])
    del buf[:length]
    return status, headers, body


def closed_by_server(s: socket.socket) -> bool:
    """Whether the server closes ``s`` (reads until EOF, bounded by the socket's timeout)."""
    try:
        while True:
            if not s.recv(65536):
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def rest_until_closed(s: socket.socket) -> bytes:
    """What the server still sends on ``s`` until it closes it."""
    out = bytearray()
    while chunk := s.recv(65536):
        out += chunk
    return bytes(out)


def request(method: str, path: str, body: bytes = b"", headers: str = "", version: str = "1.1") -> bytes:
    host = "Host: t\r\n" if version == "1.1" else ""
    length = f"Content-Length: {len(body)}\r\n" if body or method in ("POST", "PUT") else ""
    return f"{method} {path} HTTP/{version}\r\n{host}{length}{headers}\r\n".encode() + body


# ------------------------------------------------------------------------------------------ connections


def test_raw_headers_are_the_head_as_it_came(served: Served) -> None:
    """``raw_headers``: every header line in order, names in the client's case, values' bytes unchanged (what
    a proxy passes on without a decode and an encode); ``headers`` holds the same, case-insensitively."""
    with served.connect() as s:
        s.sendall(b"GET /raw HTTP/1.1\r\nhost: t\r\nX-Twice: 1\r\nx-twice: 2\r\nX-Bytes: caf\xc3\xa9\r\n\r\n")
        status, _, body = read_answer(s)
    assert status == 200
    assert json.loads(body) == {"raw": ["host: t", "X-Twice: 1", "x-twice: 2", "X-Bytes: caf\u00c3\u00a9"],
                                "x": ["1", "2"]}


def test_keep_alive_serves_requests_one_after_another_on_one_connection(served: Served) -> None:
    with served.connect() as s:
        buf = bytearray()
        for who in ("a", "b", "c"):
            s.sendall(request("GET", f"/hello?who={who}"))
            status, headers, body = read_answer(s, buf)
            assert status == 200 and json.loads(body) == {"hello": who}
            assert headers["content-type"] == "application/json" and "connection" not in headers
            assert "date" in headers


def test_connection_close_and_http10(served: Served) -> None:
    with served.connect() as s:
        s.sendall(request("GET", "/hello", headers="Connection: close\r\n"))
        status, headers, _ = read_answer(s)
        assert status == 200 and headers["connection"] == "close"
        assert closed_by_server(s)
    with served.connect() as s:  # HTTP/1.0 closes unless it asks to keep the connection
        s.sendall(request("GET", "/hello", version="1.0"))
        status, headers, _ = read_answer(s)
        assert status == 200 and headers["connection"] == "close"
        assert closed_by_server(s)
    with served.connect() as s:
        buf = bytearray()
        for _ in range(2):
            s.sendall(request("GET", "/hello", headers="Connection: keep-alive\r\n", version="1.0"))
            status, headers, _ = read_answer(s, buf)
            assert status == 200 and headers["connection"] == "keep-alive"


def test_pipelined_requests_are_answered_in_order(served: Served) -> None:
    """The first request waits on a gate while the second, sent behind it in the same write, is ready at once:
    the answers still come in request order."""
    with served.connect() as s:
        s.sendall(request("GET", "/slow") + request("POST", "/echo", b"second") + request("GET", "/hello?who=third"))
        assert served.handlers.entered.wait(BOUND_S)
        served.open_gate()
        buf = bytearray()
        answers = [read_answer(s, buf) for _ in range(3)]
        assert [a[0] for a in answers] == [200, 200, 200]
        assert json.loads(answers[0][2]) == {"slow": True}
        assert answers[1][2] == b"second"
        assert json.loads(answers[2][2]) == {"hello": "third"}


def test_head_answers_the_get_head_without_its_body(served: Served) -> None:
    with served.connect() as s:
        buf = bytearray()
        s.sendall(request("HEAD", "/hello"))
        status, headers, body = read_answer(s, buf, head_only=True)
        assert status == 200 and int(headers["content-length"]) == len(b'{"hello":"world"}') and body == b""
        s.sendall(request("GET", "/hello"))  # nothing of a body was left on the connection
        assert read_answer(s, buf)[2] == b'{"hello":"world"}'


# ------------------------------------------------------------------------------------------------ bodies


def test_a_chunked_body_reaches_the_handler_whole(served: Served) -> None:
    with served.connect() as s:
        chunked = b"5\r\nhello\r\n1;ext=1\r\n \r\n5\r\nworld\r\n0\r\nTrailer: x\r\n\r\n"
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked)
        status, headers, body = read_answer(s)
        assert (status, body, headers["x-length"]) == (200, b"hello world", "11")


def test_expect_100_continue_is_answered_when_the_handler_reads(served: Served) -> None:
    with served.connect() as s:
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
        status, _, _ = read_answer(s)
        assert status == 100  # the handler asked for the body
        s.sendall(b"ping")
        status, _, body = read_answer(s)
        assert (status, body) == (200, b"ping")
    with served.connect() as s:  # refused from the head: no 100, the body is never asked for
        s.sendall(b"POST /refuse HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
        status, headers, body = read_answer(s)
        assert status == 413 and json.loads(body) == {"error": "refused from the head"}
        assert headers["connection"] == "close"  # its body was never read: the connection cannot go on


def test_a_body_over_the_limit_is_413_declared_or_chunked(served: Served) -> None:
    with served.connect() as s:
        s.sendall(request("POST", "/echo", b"x" * 1500))
        status, _, body = read_answer(s)
        assert status == 413 and "exceeds the limit of 1000 bytes" in json.loads(body)["error"]
    with served.connect() as s:
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                  + b"".join(b"64\r\n" + b"y" * 100 + b"\r\n" for _ in range(15)) + b"0\r\n\r\n")
        status, _, body = read_answer(s)
        assert status == 413 and "exceeds the limit" in json.loads(body)["error"]


def test_a_body_is_streamed_to_its_handler_and_an_unread_rest_dropped(served: Served) -> None:
    """The handler gets the first bytes while the rest is still to come, and answers; the connection closes
    after the answer, reading and dropping the rest (the client reads its answer, not a reset)."""
    with served.connect() as s:
        s.sendall(b"POST /first HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n" + b"a" * 10)
        status, headers, body = read_answer(s)
        assert (status, body, headers["connection"]) == (200, b"a" * 10, "close")
        s.sendall(b"b" * 99990)  # the rest, sent after the answer: dropped
        assert closed_by_server(s)


def test_a_request_behind_connection_close_or_an_upgrade_is_not_answered(served: Served) -> None:
    for first in (request("GET", "/hello?who=1", headers="Connection: close\r\n"),
                  request("GET", "/hello?who=1", headers="Connection: upgrade\r\nUpgrade: websocket\r\n")):
        with served.connect() as s:
            s.sendall(first + request("GET", "/hello?who=2"))
            buf = bytearray()
            assert json.loads(read_answer(s, buf)[2]) == {"hello": "1"}
            assert rest_until_closed(s) == b"" and not buf


def test_a_client_that_goes_away_mid_body_is_told(served: Served) -> None:
    with served.connect() as s:
        s.sendall(b"POST /hold HTTP/1.1\r\nHost: t\r\nContent-Length: 900\r\n\r\n" + b"x" * 10)
        assert served.handlers.entered.wait(BOUND_S)
    assert served.handlers.finished.wait(BOUND_S)
    assert served.handlers.told == ["disconnected"]


# ------------------------------------------------------------------------------------------ bad requests


@pytest.mark.parametrize("raw, status, words", [
    (b"GARBAGE\r\n\r\n", 400, "malformed HTTP request"),
    (b"GET /hello HTTP/1.1\r\n\r\n", 400, "Host header"),
    (b"GET /hello HTTP/9.9\r\nHost: t\r\n\r\n", 400, "malformed HTTP request"),
    (b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello", 400, "malformed"),
    (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: t\r\n\r\n", 414, "request target over"),
    (b"GET /hello HTTP/1.1\r\nHost: t\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(200)) + b"\r\n", 431,
     "request head over"),
    (b"GET /hello HTTP/1.1\r\nHost: t\r\nX-Big: " + b"v" * 70000 + b"\r\n\r\n", 431, "request head over"),
])
def test_a_malformed_request_is_a_json_4xx_and_the_connection_closes(served: Served, raw: bytes, status: int,
                                                                      words: str) -> None:
    with served.connect() as s:
        s.sendall(raw)
        got, headers, body = read_answer(s)
        assert got == status and words in json.loads(body)["error"], body
        assert headers["connection"] == "close" and headers["content-type"] == "application/json"
        assert closed_by_server(s)


def test_a_malformed_request_behind_good_ones_is_answered_after_them(served: Served) -> None:
    with served.connect() as s:
        s.sendall(request("GET", "/hello?who=one") + b"GARBAGE\r\n\r\n")
        buf = bytearray()
        assert json.loads(read_answer(s, buf)[2]) == {"hello": "one"}
        assert read_answer(s, buf)[0] == 400
        assert closed_by_server(s)


def test_no_route_wrong_method_and_a_bug_answer_json(served: Served) -> None:
    with served.connect() as s:
        buf = bytearray()
        s.sendall(request("GET", "/nope/%2Fx"))
        status, _, body = read_answer(s, buf)
        assert status == 404 and json.loads(body) == {"error": "no such endpoint: GET /nope//x"}
        s.sendall(request("POST", "/hello"))
        status, headers, body = read_answer(s, buf)
        assert status == 405 and headers["allow"] == "GET,HEAD"
        assert json.loads(body) == {"error": "method POST is not allowed on /hello"}
        s.sendall(request("GET", "/boom"))
        status, _, body = read_answer(s, buf)
        assert status == 500 and json.loads(body) == {"error": "internal error: RuntimeError: a bug"}
        s.sendall(request("GET", "/items/a%2Fb"))  # a placeholder is one segment, decoded
        assert json.loads(read_answer(s, buf)[2]) == {"name": "a/b"}
    assert served.handlers.seen == [("GET", "/items/a/b", {"name": "a/b"})]


# ----------------------------------------------------------------------------------------- slow clients


def test_slow_clients_are_timed_out(lt: LoopThread) -> None:
    """An idle connection, a head that does not end (a slowloris) and a body whose bytes stop coming: each is
    cut by its own timeout (set short here)."""
    served = Served(lt, Limits(keepalive_timeout_s=0.2, head_timeout_s=0.3, body_timeout_s=0.3))
    try:
        with served.connect() as s:  # idle: closed without a word
            assert closed_by_server(s)
        with served.connect() as s:  # a head trickling in, never ending
            s.sendall(b"GET /hello HTTP/1.1\r\nHost: t\r\n")
            deadline = time.monotonic() + BOUND_S
            answer = b""
            while time.monotonic() < deadline:
                try:
                    s.sendall(b"X-a: b\r\n")
                except OSError:
                    break
                s.settimeout(0.05)
                try:
                    chunk = s.recv(65536)
                except TimeoutError:
                    continue
                answer += chunk
                if not chunk:
                    break
            assert answer.startswith(b"HTTP/1.1 408 ") and b"request head timed out" in answer
        with served.connect() as s:  # a body that stops: the handler is told 408
            s.sendall(b"POST /hold HTTP/1.1\r\nHost: t\r\nContent-Length: 500\r\n\r\n" + b"x" * 10)
            status, headers, body = read_answer(s)
            assert status == 408 and "request body timed out" in json.loads(body)["error"]
            assert headers["connection"] == "close"
        assert served.handlers.told == ["HTTP 408"]
    finally:
        served.stop()


def test_an_answer_the_client_does_not_read_is_dropped(lt: LoopThread) -> None:
    """Back-pressure: an 8 MB answer to a client that reads nothing fills the socket; after the write
    timeout the server drops the connection. A client that reads gets all of it."""
    served = Served(lt, Limits(write_timeout_s=0.3))
    try:
        with served.connect() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(request("GET", "/big"))
            deadline = time.monotonic() + BOUND_S
            while served.site.server.connections and time.monotonic() < deadline:
                time.sleep(0.02)
            assert not served.site.server.connections
        with served.connect() as s:
            s.sendall(request("GET", "/big"))
            status, _, body = read_answer(s)
            assert status == 200 and len(body) == 8 << 20
    finally:
        served.stop()


# -------------------------------------------------------------------------------------------- stopping


def test_graceful_shutdown_lets_in_flight_requests_finish(lt: LoopThread) -> None:
    served = Served(lt, Limits())
    idle = served.connect()
    busy = served.connect()
    try:
        busy.sendall(request("GET", "/slow"))
        assert served.handlers.entered.wait(BOUND_S)
        stopping = asyncio.run_coroutine_threadsafe(served.site.stop(), lt.loop)
        assert closed_by_server(idle)  # an idle connection is closed at once
        with pytest.raises(OSError):  # and nobody new is let in
            socket.create_connection(("127.0.0.1", served.port), timeout=BOUND_S).close()
        served.open_gate()
        status, headers, body = read_answer(busy)  # the in-flight request is answered, then the connection closes
        assert status == 200 and headers["connection"] == "close" and json.loads(body) == {"slow": True}
        assert closed_by_server(busy)  # its sending side: the server lingers until the client closes its own
        busy.close()
        stopping.result(BOUND_S)
        assert served.cleaned.is_set()
    finally:
        idle.close()
        busy.close()


def test_shutdown_drops_what_outlasts_its_timeout(lt: LoopThread) -> None:
    served = Served(lt, Limits(), shutdown_timeout_s=0.2)
    with served.connect() as busy:
        busy.sendall(request("GET", "/slow"))
        assert served.handlers.entered.wait(BOUND_S)
        lt.run(served.site.stop(), timeout=BOUND_S)  # the gate never opens: the handler is cancelled
        assert closed_by_server(busy)
    assert served.cleaned.is_set() and not served.handlers.finished.is_set()


# ------------------------------------------------------------------------------------------------- TLS


def test_tls(lt: LoopThread, tmp_path: Path) -> None:
    from edgemux.runtime.tls import client_context, make_local_ca, server_context

    made = make_local_ca(tmp_path, ["127.0.0.1"])
    served = Served(lt, Limits(), ssl_context=server_context(made.cert, made.key))
    try:
        assert served.site.url.startswith("https://")
        with client_context(str(made.ca)).wrap_socket(served.connect(), server_hostname="127.0.0.1") as s:
            buf = bytearray()
            for who in ("x", "y"):
                s.sendall(request("GET", f"/hello?who={who}"))
                assert json.loads(read_answer(s, buf)[2]) == {"hello": who}
            s.sendall(request("POST", "/echo", b"over tls"))
            assert read_answer(s, buf)[2] == b"over tls"
    finally:
        served.stop()


def test_a_plain_application_without_middlewares(lt: LoopThread) -> None:
    """The core alone (no error table): its own refusals (here no route) still get the JSON error shape."""

    async def hi(request: Request) -> Response:
        return Response(b"hi", content_type="text/plain")

    async def start() -> Site:
        return await start_site(Application([get("/", hi)]), "127.0.0.1", 0)

    site = lt.run(start())
    try:
        with socket.create_connection(("127.0.0.1", site.server.addresses[0][1]), timeout=BOUND_S) as s:
            buf = bytearray()
            s.sendall(request("GET", "/"))
            status, headers, body = read_answer(s, buf)
            assert (status, headers["content-type"], body) == (200, "text/plain", b"hi")
            s.sendall(request("GET", "/missing"))
            status, _, body = read_answer(s, buf)
            assert status == 404 and json.loads(body) == {"error": "no such endpoint: GET /missing"}
    finally:
        lt.run(site.stop())
