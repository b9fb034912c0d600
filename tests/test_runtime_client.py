"""The inference client against real HTTP servers on 127.0.0.1: outputs (JSON and binary), smooth weighted
round robin, failover and cooldowns, 4xx/429 handling, timeouts, policing with a fake clock, route updates,
threads; the request/response codec against tritonclient; client-side pre-processing.

No wall-clock thresholds are asserted: policing and cooldowns run on a fake clock and a recording sleep, and
the only real waits are the short client timeout against a server that never answers."""

from __future__ import annotations

import json
import re
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import tritonclient.http as th

from edgemux.adapt.police import Policing
from edgemux.errors import UnknownNameError
from edgemux.runtime.ingress.client import (
    AppRoute,
    Client,
    RateLimited,
    RequestError,
    Unavailable,
)
from edgemux.runtime.dataplane.preprocess import resize_bilinear, to_model_input
from edgemux.runtime.dataplane.protocol import (
    HEADER_LENGTH_HEADER,
    InferRequest,
    ProtocolError,
    TensorSpec,
    decode_infer_request,
    decode_infer_response,
    encode_infer_request,
    encode_infer_response,
    error_body,
    model_metadata_body,
)
from edgemux.runtime.ingress.routing import Endpoint

TIMEOUT_S = 0.3  # the client's timeout against the server that never answers
# Every other client gets a generous timeout, so that a slow moment of a loaded machine is never a failover.
SAFE_TIMEOUT_S = 10.0


# ------------------------------------------------------------------------------------------ test servers


class _Handler(BaseHTTPRequestHandler):
    """Implements POST /v2/models/{m}/infer: echoes every input as '<name>_out', numbers doubled; or fails on
    purpose according to the server's ``mode``."""

    protocol_version = "HTTP/1.1"  # keep-alive, as real agents

    def log_message(self, *args: object) -> None:  # keep pytest output clean
        pass

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in two writes: without NODELAY, Nagle + delayed ACK add ~40 ms a request.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_GET(self) -> None:
        """Model metadata (``GET /v2/models/{m}``) declaring the server's ``spec``; 404 when it has none."""
        srv: _Server = self.server  # type: ignore[assignment]
        with srv.lock:
            srv.gets.append(self.path)
        m = re.fullmatch(r"/v2/models/([^/]+)", self.path)
        if m and srv.spec is not None and srv.mode != "404":
            self._reply(200, model_metadata_body(m.group(1), ["1"], "onnxruntime_onnx", [srv.spec], []), {})
        else:
            self._reply(404, error_body(f"unknown model at {self.path}"), {})

    def do_POST(self) -> None:
        srv: _Server = self.server  # type: ignore[assignment]
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with srv.lock:
            srv.hits += 1
            srv.ports.add(self.client_address[1])
            srv.paths.append(self.path)
            srv.binary.append(HEADER_LENGTH_HEADER in self.headers)
        mode = srv.mode
        if mode == "close":
            self.close_connection = True  # hang up without a word
            return
        if mode == "hang":
            srv.release.wait(10.0)
            self.close_connection = True
            return
        if mode == "503":
            self._reply(503, error_body("device overloaded"), {"Content-Type": "application/json"})
            return
        if mode == "400":
            self._reply(400, error_body("unexpected shape for input 'x': expected [1,3], got [2,3]"), {})
            return
        if mode == "404":
            self._reply(404, error_body("unknown model 'cam'"), {})
            return
        if mode == "429":
            self._reply(429, error_body("app over its rate"), {"Retry-After": "2"})
            return
        if mode == "garbage":
            self._reply(200, b"{not json", {"Content-Type": "application/json"})
            return
        m = re.fullmatch(r"/v2/models/([^/]+)/infer", self.path)
        if not m:
            self._reply(404, error_body(f"no such path {self.path}"), {})
            return
        try:
            req = decode_infer_request(body, self.headers.get(HEADER_LENGTH_HEADER))
        except ProtocolError as e:
            self._reply(e.status, error_body(e.message), {})
            return
        with srv.lock:
            srv.requests.append(req)
        outs = {t.name + "_out": (t.data if t.datatype == "BYTES" else t.data * 2) for t in req.inputs}
        data, headers = encode_infer_response(m.group(1), "1", outs, req)
        self._reply(200, data, headers)
        if mode == "ok_close":
            self.close_connection = True  # announced: _reply sent "Connection: close"
        if mode == "ok_then_drop":
            # Answer as if the connection stayed open, then drop it: what a server's idle timeout does.
            self.close_connection = True

    def _reply(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        if self.server.mode == "ok_close":  # type: ignore[attr-defined]
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, mode: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.mode = mode
        self.lock = threading.Lock()
        self.hits = 0
        self.ports: set[int] = set()  # client ports seen: one per connection
        self.paths: list[str] = []
        self.binary: list[bool] = []
        self.requests: list = []
        self.gets: list[str] = []
        self.spec: TensorSpec | None = None  # the model input its metadata declares (None: no metadata)
        self.release = threading.Event()
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.release.set()
        self.shutdown()
        self.server_close()


@pytest.fixture
def serve() -> Iterator:
    started: list[_Server] = []

    def _start(*modes: str) -> list[_Server]:
        out = [_Server(m) for m in modes]
        started.extend(out)
        return out

    yield _start
    for s in started:
        s.stop()


def _closed_port_url() -> str:
    """A URL where nothing listens (connection refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


class FakeClock:
    """A clock that moves only when told (or when ``sleep`` is asked to advance it); records sleeps."""

    def __init__(self, advance_on_sleep: bool = True) -> None:
        self.t = 1000.0
        self.sleeps: list[float] = []
        self.advance_on_sleep = advance_on_sleep

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        if self.advance_on_sleep:
            self.t += s


def _route(*endpoints: tuple[str, float], rate: float = 1e6, burst: float = 1e6, **kw) -> AppRoute:
    return AppRoute("cam", "resnet", list(endpoints), rate_rps=rate, burst=burst, **kw)


def _client(route: AppRoute, clock: FakeClock | None = None, **kw) -> Client:
    clock = clock or FakeClock()
    kw.setdefault("timeout_s", SAFE_TIMEOUT_S)
    kw.setdefault("policing", Policing.exact())  # these tests count tokens of the contract as written
    return Client([route], clock=clock, sleep=clock.sleep, **kw)


X = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}


# ------------------------------------------------------------------------------------------ outputs


@pytest.mark.parametrize("binary", [True, False])
def test_outputs_round_trip(serve, binary: bool) -> None:
    (srv,) = serve("ok")
    inputs = {
        "x": np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3),
        "n": np.array([[1, -2, 3]], dtype=np.int64),
        "s": np.array([b"cat", "é".encode()], dtype=object),
    }
    with _client(_route((srv.url, 1.0))) as c:
        r = c.infer("cam", inputs, binary=binary, request_id="req-7")
    assert set(r.outputs) == {"x_out", "n_out", "s_out"}
    np.testing.assert_array_equal(r.as_numpy("x_out"), inputs["x"] * 2)
    assert r.outputs["x_out"].dtype == np.float32
    np.testing.assert_array_equal(r.outputs["n_out"], inputs["n"] * 2)
    assert r.outputs["n_out"].dtype == np.int64
    assert list(r.outputs["s_out"]) == [b"cat", "é".encode()]
    assert (r.endpoint, r.attempts, r.id, r.model_name) == (srv.url, 1, "req-7", "resnet")
    assert r.queue_wait_ms == 0.0 and r.latency_ms >= 0 and r.total_ms >= r.latency_ms
    assert srv.paths == ["/v2/models/resnet/infer"]
    assert srv.binary == [binary]
    assert srv.requests[0].binary_data_output is binary


def test_keep_alive_reuses_one_connection(serve) -> None:
    (srv,) = serve("ok")
    with _client(_route((srv.url, 1))) as c:
        for _ in range(5):
            c.infer("cam", X)
    assert srv.hits == 5 and len(srv.ports) == 1


def test_path_prefix_and_version_are_sent(serve) -> None:
    # The model name is percent-encoded below the URL's path prefix; the test server only serves the plain
    # path, so it answers 404, which also shows a 404 is a RequestError.
    (srv,) = serve("ok")
    route = AppRoute("cam", "det/v", [(srv.url + "/agent/", 1)], 1e6, 1e6, model_version="2")
    with _client(route) as c, pytest.raises(RequestError) as ei:
        c.infer("cam", X)
    assert srv.paths == ["/agent/v2/models/det%2Fv/versions/2/infer"]
    assert ei.value.status == 404


def test_stale_keep_alive_connection_is_retried_on_a_fresh_one(serve) -> None:
    (srv,) = serve("ok_then_drop")
    with _client(_route((srv.url, 1))) as c:
        results = [c.infer("cam", X) for _ in range(3)]
    # Each request after the first found its kept-alive connection dropped and reconnected, silently.
    assert [r.attempts for r in results] == [1, 1, 1]
    assert srv.hits == 3 and len(srv.ports) == 3


def test_connection_close_replies_and_client_close_reconnect(serve) -> None:
    (srv,) = serve("ok_close")
    with _client(_route((srv.url, 1))) as c:
        assert [c.infer("cam", X).attempts for _ in range(3)] == [1, 1, 1]
        assert len(srv.ports) == 3  # one connection per request, as the server asked
        srv.mode = "ok"
        c.infer("cam", X)
        c.close()  # the client stays usable: the next request reconnects
        c.infer("cam", X)
        c.infer("cam", X)
    assert srv.hits == 6 and len(srv.ports) == 5


def test_against_an_agent_on_the_server_core() -> None:
    """The agents are served by edgemux's server core (runtime.httpserver): keep-alive and the binary extension
    work against one."""
    import asyncio

    from edgemux.runtime.httpserver import Application, Request, Response, post
    from edgemux.runtime.httputil import start_site

    async def infer(request: Request) -> Response:
        req = decode_infer_request(await request.read(), request.headers.get(HEADER_LENGTH_HEADER))
        body, headers = encode_infer_response(
            request.match_info["model"], "1", {"y": req.input("x") + 1}, req
        )
        return Response(body=body, headers=headers)

    loop = asyncio.new_event_loop()
    site = loop.run_until_complete(start_site(Application([post("/v2/models/{model}/infer", infer)]), "127.0.0.1", 0))
    port = site.server.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        with _client(_route((f"http://127.0.0.1:{port}", 1))) as c:
            for binary in (True, False, True):
                r = c.infer("cam", X, binary=binary)
                np.testing.assert_array_equal(r.outputs["y"], X["x"] + 1)
    finally:
        asyncio.run_coroutine_threadsafe(site.stop(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


# ------------------------------------------------------------------------------------------ routing


def test_weighted_round_robin_exact_counts(serve) -> None:
    a, b = serve("ok", "ok")
    with _client(_route((a.url, 0.7), (b.url, 0.3))) as c:
        used = [c.infer("cam", X).endpoint for _ in range(100)]
    assert (a.hits, b.hits) == (70, 30)
    assert used.count(a.url) == 70
    # Smooth WRR interleaves: never more than 3 of a in a row at 7:3 (plain WRR would send 7).
    assert "a" * 4 not in "".join("a" if u == a.url else "b" for u in used)


def test_failover_and_cooldown_on_fake_clock(serve) -> None:
    bad, good = serve("503", "ok")
    clock = FakeClock()
    with _client(_route((bad.url, 1), (good.url, 1)), clock, cooldown_s=5.0) as c:
        r = c.infer("cam", X)
        assert (r.endpoint, r.attempts) == (good.url, 2)
        assert "HTTP 503: device overloaded" in r.failures[bad.url]
        for _ in range(4):  # during the cooldown the failed endpoint is skipped
            assert c.infer("cam", X).attempts == 1
        assert (bad.hits, good.hits) == (1, 5)
        clock.t += 4.9
        c.infer("cam", X)
        assert bad.hits == 1
        clock.t += 0.2  # cooldown over: tried again, and it has recovered
        bad.mode = "ok"
        used = {c.infer("cam", X).endpoint for _ in range(2)}
        assert used == {bad.url, good.url} and bad.hits == 2


def test_server_retry_after_on_503_sets_the_cooldown(serve) -> None:
    class _Busy(_Handler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.server.hits += 1  # type: ignore[attr-defined]
            self._reply(503, error_body("queue full"), {"Retry-After": "30"})

    (good,) = serve("ok")
    busy = _Server("503")
    busy.RequestHandlerClass = _Busy
    try:
        clock = FakeClock()
        with _client(_route((busy.url, 1), (good.url, 1)), clock, cooldown_s=1.0) as c:
            c.infer("cam", X)
            clock.t += 10.0  # past cooldown_s but within the server's Retry-After
            c.infer("cam", X)
            c.infer("cam", X)
            assert busy.hits == 1
            clock.t += 21.0
            c.infer("cam", X)
            c.infer("cam", X)
            assert busy.hits == 2
    finally:
        busy.stop()


@pytest.mark.parametrize("failure", ["refused", "close", "garbage", "hang"])
def test_failover_on_transport_failures(serve, failure: str) -> None:
    (good,) = serve("ok")
    if failure == "refused":
        bad_url = _closed_port_url()
    else:
        (bad,) = serve(failure)
        bad_url = bad.url
    # After a timeout the healthy server must answer within the same timeout: 1 s is ample for loopback.
    timeout_s = 1.0 if failure == "hang" else SAFE_TIMEOUT_S
    with _client(_route((bad_url, 2), (good.url, 1)), timeout_s=timeout_s) as c:
        r = c.infer("cam", X)
    assert (r.endpoint, r.attempts) == (good.url, 2)
    why = r.failures[bad_url]
    expected = {
        "refused": "connection refused",
        "close": "closed by the server",
        "garbage": "malformed response",
        "hang": "no answer within the 1 s timeout",
    }[failure]
    assert expected in why


def test_timeout_fires_against_a_server_that_never_answers(serve) -> None:
    # Alone on the route, so that no healthy server has to answer within the short timeout on a busy machine.
    (hang,) = serve("hang")
    with _client(_route((hang.url, 1)), timeout_s=TIMEOUT_S) as c, pytest.raises(Unavailable) as ei:
        c.infer("cam", X)
    assert ei.value.failures == {hang.url: f"no answer within the {TIMEOUT_S:g} s timeout"}
    assert hang.hits == 1


def test_4xx_is_not_retried(serve) -> None:
    bad, good = serve("400", "ok")
    with _client(_route((bad.url, 1), (good.url, 1))) as c:
        with pytest.raises(RequestError) as ei:
            c.infer("cam", X)
        assert ei.value.status == 400
        assert ei.value.message == "unexpected shape for input 'x': expected [1,3], got [2,3]"
        assert ei.value.endpoint == bad.url
        assert (bad.hits, good.hits) == (1, 0)
        # A bad request says nothing about the endpoint's health: it stays in rotation.
        bad.mode = "ok"
        assert {c.infer("cam", X).endpoint for _ in range(2)} == {bad.url, good.url}


def test_429_from_server_is_rate_limited_with_retry_after(serve) -> None:
    limited, good = serve("429", "ok")
    with _client(_route((limited.url, 1), (good.url, 1))) as c, pytest.raises(RateLimited) as ei:
        c.infer("cam", X)
    assert ei.value.retry_after_s == 2.0 and ei.value.source == limited.url
    assert (limited.hits, good.hits) == (1, 0)


def test_all_down_raises_unavailable_naming_every_endpoint(serve) -> None:
    a, b = serve("503", "close")
    clock = FakeClock()
    with _client(_route((a.url, 1), (b.url, 1)), clock, cooldown_s=5.0) as c:
        with pytest.raises(Unavailable) as ei:
            c.infer("cam", X)
        e = ei.value
        assert e.app == "cam" and set(e.failures) == {a.url, b.url}
        assert a.url in str(e) and b.url in str(e) and "HTTP 503" in str(e) and "closed by the server" in str(e)
        assert (a.hits, b.hits) == (1, 1)  # one attempt per endpoint, no more
        # Within the cooldown nothing is sent; the error still names both endpoints and when to come back.
        clock.t += 1.0
        with pytest.raises(Unavailable) as ei:
            c.infer("cam", X)
        assert (a.hits, b.hits) == (1, 1)
        assert all("cooldown" in why for why in ei.value.failures.values())
        assert "HTTP 503" in ei.value.failures[a.url]
        assert ei.value.retry_after_s == pytest.approx(4.0)


# ------------------------------------------------------------------------------------------ policing


def test_policing_burst_then_paced_waits(serve) -> None:
    (srv,) = serve("ok")
    clock = FakeClock(advance_on_sleep=True)
    with _client(_route((srv.url, 1), rate=10.0, burst=3), clock, max_wait_s=0.5) as c:
        waits = [c.infer("cam", X).queue_wait_ms for _ in range(6)]
    assert waits[:3] == [0.0, 0.0, 0.0]  # the burst goes at once
    assert waits[3:] == pytest.approx([100.0] * 3)  # then one request per 1/rate
    assert clock.sleeps == pytest.approx([0.1] * 3)
    assert srv.hits == 6


def test_policing_refuses_beyond_max_wait_without_sending(serve) -> None:
    (srv,) = serve("ok")
    clock = FakeClock(advance_on_sleep=False)  # concurrent callers: nobody's wait has elapsed yet
    with _client(_route((srv.url, 1), rate=10.0, burst=3), clock, max_wait_s=0.25) as c:
        for _ in range(5):
            c.infer("cam", X)
        assert clock.sleeps == pytest.approx([0.1, 0.2])  # tokens reserved in arrival order
        with pytest.raises(RateLimited) as ei:
            c.infer("cam", X)
        assert ei.value.source == "client" and ei.value.retry_after_s == pytest.approx(0.3)
        assert srv.hits == 5
        clock.t += 0.3  # later the app is within its contract again
        c.infer("cam", X)
    assert srv.hits == 6


def test_unencodable_input_costs_no_token(serve) -> None:
    (srv,) = serve("ok")
    clock = FakeClock(advance_on_sleep=False)
    with _client(_route((srv.url, 1), rate=1.0, burst=1), clock, max_wait_s=0.0) as c:
        with pytest.raises(ValueError, match="complex"):
            c.infer("cam", {"x": np.ones(2, dtype=np.complex64)})
        c.infer("cam", X)  # the burst token is still there
    assert srv.hits == 1 and clock.sleeps == []


def test_failover_takes_one_token(serve) -> None:
    bad, good = serve("503", "ok")
    clock = FakeClock(advance_on_sleep=False)
    with _client(_route((bad.url, 1), (good.url, 1), rate=1.0, burst=2), clock, max_wait_s=0.0) as c:
        assert c.infer("cam", X).attempts == 2
        c.infer("cam", X)
        with pytest.raises(RateLimited):
            c.infer("cam", X)


# ------------------------------------------------------------------------------------------ routes


def test_update_routes_keeps_bucket_and_follows_new_weights(serve) -> None:
    a, b = serve("ok", "ok")
    clock = FakeClock(advance_on_sleep=False)
    with _client(_route((a.url, 1), (b.url, 1), rate=1.0, burst=2), clock, max_wait_s=10.0) as c:
        c.infer("cam", X)
        c.infer("cam", X)
        assert (a.hits, b.hits) == (1, 1)
        c.update_routes("cam", _route((b.url, 1), rate=1.0, burst=2))  # a's device was migrated away
        r = c.infer("cam", X)
        assert r.endpoint == b.url
        assert clock.sleeps == [pytest.approx(1.0)]  # no fresh burst from republishing
        c.update_routes("cam", _route((a.url, 3), (b.url, 1), rate=1.0, burst=2))
        for _ in range(8):
            c.infer("cam", X)
    assert (a.hits, b.hits) == (1 + 6, 2 + 2)


def test_routes_from_a_callable_are_looked_up_once(serve) -> None:
    (srv,) = serve("ok")
    asked: list[str] = []

    def lookup(app: str) -> AppRoute | None:
        asked.append(app)
        return _route((srv.url, 1)) if app == "cam" else None

    clock = FakeClock()
    with Client(lookup, clock=clock, sleep=clock.sleep, timeout_s=SAFE_TIMEOUT_S) as c:
        c.infer("cam", X)
        c.infer("cam", X)
        with pytest.raises(UnknownNameError, match="unknown app 'other'"):
            c.infer("other", X)
    assert asked == ["cam", "other"]


def test_a_404_from_a_looked_up_route_asks_the_route_again_and_retries_once(serve) -> None:
    """After a move the old endpoint no longer has the app: the client asks its route source again and
    sends the request to the new endpoint, within the same call and the same token."""
    old, new = serve("404", "ok")
    routes = [_route((old.url, 1)), _route((new.url, 1))]
    asked: list[str] = []

    def lookup(app: str) -> AppRoute | None:
        asked.append(app)
        return routes[min(len(asked), 2) - 1]

    clock = FakeClock()
    with Client(lookup, clock=clock, sleep=clock.sleep, timeout_s=SAFE_TIMEOUT_S) as c:
        r = c.infer("cam", X)
        assert r.endpoint == new.url and r.attempts == 2 and "route looked up again" in r.failures[old.url]
        assert c.route("cam").endpoints == routes[1].endpoints
    assert asked == ["cam", "cam"] and (old.hits, new.hits) == (1, 1)
    # a 404 from a route that is not stale (the source gives the same one) is the caller's: RequestError
    (gone,) = serve("404")
    with Client(lambda app: _route((gone.url, 1)), clock=clock, sleep=clock.sleep, timeout_s=SAFE_TIMEOUT_S) as c:
        with pytest.raises(RequestError) as ei:
            c.infer("cam", X)
        assert ei.value.status == 404 and gone.hits == 1


def test_app_route_validation() -> None:
    with pytest.raises(ValueError, match="endpoint URL"):
        AppRoute("cam", "m", [("ftp://x", 1)], 1, 1)
    with pytest.raises(ValueError, match="positive weight"):
        AppRoute("cam", "m", [("http://x", 0)], 1, 1)
    with pytest.raises(ValueError, match="rate_rps"):
        AppRoute("cam", "m", [("http://x", 1)], 0, 1)
    with pytest.raises(ValueError, match="burst"):
        AppRoute("cam", "m", {"http://x": 1}, 1, 0.5)
    r = AppRoute("cam", "m", [(Endpoint("node-1/tpu0", "http://x:9"), 2)], 5, 2)
    assert r.endpoints == ((Endpoint("node-1/tpu0", "http://x:9"), 2.0),)


def test_threads_share_the_router_and_keep_their_own_connections(serve) -> None:
    a, b = serve("ok", "ok")
    errors: list[BaseException] = []
    with _client(_route((a.url, 1), (b.url, 1))) as c:

        def work() -> None:
            try:
                for _ in range(25):
                    r = c.infer("cam", X)
                    np.testing.assert_array_equal(r.outputs["x_out"], X["x"] * 2)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    assert (a.hits, b.hits) == (50, 50)
    assert len(a.ports) <= 4 and len(b.ports) <= 4


def test_bare_frame_is_preprocessed_for_the_routes_input(serve) -> None:
    (srv,) = serve("ok")
    spec = TensorSpec("images", "FP32", (-1, 3, 4, 4))
    frame = np.full((8, 8, 3), 255, dtype=np.uint8)
    with _client(_route((srv.url, 1), input=spec)) as c:
        r = c.infer("cam", frame)
        sent = srv.requests[-1].input("images")
        assert sent.shape == (1, 3, 4, 4) and sent.dtype == np.float32
        np.testing.assert_allclose(r.outputs["images_out"], 2.0)
        ready = np.zeros((1, 3, 4, 4), dtype=np.float32)  # already the model's shape: sent as it is
        c.infer("cam", ready)
        assert srv.requests[-1].input("images").shape == (1, 3, 4, 4)
    with _client(_route((srv.url, 1))) as c, pytest.raises(ValueError, match="declares exactly one input"):
        c.infer("cam", frame)  # no input on the route and no metadata at the endpoint: nothing to name it by
    assert srv.gets == ["/v2/models/resnet"]


def test_bare_frame_input_is_learnt_from_model_metadata_and_again_after_a_move(serve) -> None:
    """A route from the control plane declares no input: the client reads the model's one input from the
    endpoint's metadata (once per route), and when the app moves to a device whose model wants another size
    the request that found the old endpoint gone is encoded again for the new one."""
    old, new = serve("ok", "ok")
    old.spec = TensorSpec("images", "FP32", (-1, 3, 4, 4))
    new.spec = TensorSpec("images", "FP32", (-1, 3, 2, 2))
    routes = [_route((old.url, 1)), _route((new.url, 1))]
    asked: list[str] = []

    def lookup(app: str) -> AppRoute | None:
        asked.append(app)
        return routes[min(len(asked), 2) - 1]

    frame = np.full((8, 8, 3), 255, dtype=np.uint8)
    with Client(lookup, timeout_s=SAFE_TIMEOUT_S) as c:
        for _ in range(3):
            c.infer("cam", frame)
        assert [r.input("images").shape for r in old.requests] == [(1, 3, 4, 4)] * 3
        assert len(old.gets) == 1 and c.route("cam").input == old.spec  # asked once, kept with the route
        old.mode = "404"  # the app moved away
        r = c.infer("cam", frame)
        assert r.endpoint == new.url and new.requests[-1].input("images").shape == (1, 3, 2, 2)
        assert c.route("cam").input == new.spec and len(new.gets) == 1


# ------------------------------------------------------------------------------------------ codec vs tritonclient


def _triton_inputs(arrays: dict[str, np.ndarray], binary: bool) -> list:
    out = []
    for name, a in arrays.items():
        dt = "BYTES" if a.dtype == object else th.np_to_triton_dtype(a.dtype)
        t = th.InferInput(name, list(a.shape), dt)
        t.set_data_from_numpy(a, binary_data=binary)
        out.append(t)
    return out


@pytest.mark.parametrize("binary", [True, False])
def test_request_encoding_matches_tritonclient(binary: bool) -> None:
    arrays = {
        "f": np.array([[0.5, -1.25], [3.0, 1e-3]], dtype=np.float32),
        "h": np.array([1.5, -2.0], dtype=np.float16),
        "u": np.array([0, 255, 7], dtype=np.uint8),
        "b": np.array([True, False]),
        "s": np.array([b"ab", b""], dtype=object),
    }
    ours_body, ours_headers = encode_infer_request(arrays, binary=binary, request_id="r1")
    theirs_body, theirs_hlen = th.InferenceServerClient.generate_request_body(
        _triton_inputs(arrays, binary), request_id="r1"
    )
    ours = decode_infer_request(ours_body, ours_headers.get(HEADER_LENGTH_HEADER))
    theirs = decode_infer_request(theirs_body, theirs_hlen)
    assert ours.id == theirs.id == "r1"
    assert (HEADER_LENGTH_HEADER in ours_headers) == (theirs_hlen is not None) == binary
    described = [[(t.name, t.datatype, t.shape) for t in r.inputs] for r in (ours, theirs)]
    assert described[0] == described[1]
    for o, t in zip(ours.inputs, theirs.inputs):
        np.testing.assert_array_equal(o.data, t.data)
    assert ours.binary_data_output is binary


@pytest.mark.parametrize("binary", [True, False])
def test_response_decoding_matches_tritonclient(binary: bool) -> None:
    outputs = {
        "scores": np.array([[0.1, 0.7, 0.2]], dtype=np.float32),
        "ids": np.array([3, 1], dtype=np.int64),
        "labels": np.array([b"cat", b"dog"], dtype=object),
    }
    request = InferRequest(id=None, parameters={}, inputs=[], outputs=[], binary_data_output=binary)
    body, headers = encode_infer_response("m", "3", outputs, request, id="q")
    ours = decode_infer_response(body, headers.get(HEADER_LENGTH_HEADER))
    hlen = headers.get(HEADER_LENGTH_HEADER)
    theirs = th.InferenceServerClient.parse_response_body(body, header_length=int(hlen) if hlen else None)
    assert (ours.model_name, ours.model_version, ours.id) == ("m", "3", "q")
    for name in outputs:
        expected = theirs.as_numpy(name)
        if name == "labels" and not binary:
            # tritonclient gives JSON BYTES as str, binary ones as bytes; ours are bytes either way.
            expected = np.array([v.encode() for v in expected], dtype=object)
        got = ours.outputs[name]
        assert got.dtype == expected.dtype and got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)


def test_malformed_responses_are_protocol_errors() -> None:
    with pytest.raises(ProtocolError, match="malformed response"):
        decode_infer_response(b"[1]")
    entry = {"name": "y", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}}
    head = json.dumps({"outputs": [entry]})
    with pytest.raises(ProtocolError, match="8 but 4 bytes remain"):
        decode_infer_response(head.encode() + b"\0" * 4, len(head))


# ------------------------------------------------------------------------------------------ preprocess


def _gradient(h: int, w: int) -> np.ndarray:
    """RGB float image: R rises with x, G with y, B constant; values within [0, 1]."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    return np.stack([x / (2 * w), y / (2 * h), np.full_like(x, 0.25)], axis=-1)


def _expected(h: int, w: int, out_h: int, out_w: int) -> np.ndarray:
    """Bilinear resizing keeps a linear gradient linear: the value at each output pixel's clamped centre."""
    sx = np.clip((np.arange(out_w) + 0.5) * w / out_w - 0.5, 0, w - 1)
    sy = np.clip((np.arange(out_h) + 0.5) * h / out_h - 0.5, 0, h - 1)
    yy, xx = np.meshgrid(sy, sx, indexing="ij")
    return np.stack([xx / (2 * w), yy / (2 * h), np.full_like(xx, 0.25)], axis=-1).astype(np.float32)


@pytest.mark.parametrize("out_hw", [(8, 12), (2, 3), (5, 7), (4, 6)])
def test_resize_keeps_a_linear_gradient(out_hw: tuple[int, int]) -> None:
    got = resize_bilinear(_gradient(4, 6), *out_hw)
    np.testing.assert_allclose(got, _expected(4, 6, *out_hw), atol=1e-6)


def test_to_model_input_layout_scale_and_batch() -> None:
    image = _gradient(4, 6)
    nhwc = to_model_input(image, TensorSpec("in", "FP32", (-1, 8, 12, 3)))
    nchw = to_model_input(image, TensorSpec("in", "FP32", (1, 3, 8, 12)))
    assert nhwc.shape == (1, 8, 12, 3) and nchw.shape == (1, 3, 8, 12)
    assert nhwc.dtype == nchw.dtype == np.float32 and nchw.flags.c_contiguous
    np.testing.assert_allclose(nhwc[0], _expected(4, 6, 8, 12), atol=1e-6)
    np.testing.assert_array_equal(nchw[0], nhwc[0].transpose(2, 0, 1))

    u8 = np.rint(image * 255).astype(np.uint8)
    scaled = to_model_input(u8, TensorSpec("in", "FP32", (-1, 4, 6, 3)))  # same size: scale only
    np.testing.assert_allclose(scaled[0], u8 / 255.0, atol=1e-7)
    assert scaled.max() <= 1.0
    same = to_model_input(u8, TensorSpec("in", "UINT8", (-1, 4, 6, 3)))  # Edge TPU: bytes as they are
    assert same.dtype == np.uint8 and np.array_equal(same[0], u8)
    resized = to_model_input(u8, TensorSpec("in", "UINT8", (-1, 8, 12, 3)))
    expected = np.clip(np.rint(resize_bilinear(u8 / 255.0, 8, 12) * 255), 0, 255)
    np.testing.assert_array_equal(resized[0], expected)
    half = to_model_input(image, TensorSpec("in", "FP16", (-1, 3, -1, -1)))  # variable H, W: kept
    assert half.shape == (1, 3, 4, 6) and half.dtype == np.float16
    gray = to_model_input(u8[:, :, 0], TensorSpec("in", "FP32", (-1, 1, 8, 12)))
    assert gray.shape == (1, 1, 8, 12)
    np.testing.assert_allclose(gray[0, 0], resize_bilinear(u8[:, :, :1] / 255.0, 8, 12)[:, :, 0], atol=1e-6)


def test_int8_inputs_get_the_pixels_shifted_and_quantized_outputs_dequantize() -> None:
    """A full-integer TFLite model's INT8 image input takes the pixels 0..255 shifted to -128..127 (its UINT8
    twin's scale, zero point 128 lower: the same real values); outputs read back with their metadata's scale
    and zero point."""
    from edgemux.runtime.dataplane.preprocess import dequantize
    from edgemux.runtime.dataplane.protocol import decode_model_metadata

    u8 = np.array([[[0, 128, 255]]], dtype=np.uint8)
    same = to_model_input(u8, TensorSpec("in", "INT8", (1, 1, 1, 3)))
    assert same.dtype == np.int8 and same.tolist() == [[[[-128, 0, 127]]]]
    as_uint8 = to_model_input(u8, TensorSpec("in", "UINT8", (1, 1, 1, 3)))
    assert (same.astype(np.int16) + 128).tolist() == as_uint8.astype(np.int16).tolist()
    resized = to_model_input(np.full((4, 4, 3), 255, np.uint8), TensorSpec("in", "INT8", (1, 2, 2, 3)))
    assert resized.shape == (1, 2, 2, 3) and (resized == 127).all()
    meta = decode_model_metadata(json.dumps({"name": "m", "inputs": [], "outputs": [
        {"name": "scores", "datatype": "UINT8", "shape": [1, 2],
         "parameters": {"quantization": {"scale": 0.00390625, "zero_point": 0}}},
        {"name": "plain", "datatype": "FP32", "shape": [1]}]}).encode())
    assert meta.quantization == {"scores": (0.00390625, 0)}
    np.testing.assert_allclose(dequantize(np.array([[0, 128]], np.uint8), *meta.quantization["scores"]), [[0.0, 0.5]])
    with pytest.raises(ProtocolError, match="parameters.quantization must be"):
        decode_model_metadata(b'{"name": "m", "outputs": [{"name": "s", "datatype": "UINT8", "shape": [1], '
                              b'"parameters": {"quantization": {"scale": 0, "zero_point": 0}}}]}')
    with pytest.raises(ValueError, match="scale must be"):
        dequantize(np.zeros(1, np.uint8), -1.0, 0)


@pytest.mark.parametrize(
    ("image_shape", "spec", "message"),
    [
        ((1, 4, 6, 3), TensorSpec("in", "FP32", (-1, 3, 8, 8)), "or 2 (grayscale), got 4 with shape [1,4,6,3]"),
        ((4, 6, 4), TensorSpec("in", "FP32", (-1, 3, 8, 8)), "number of image channels: expected 3, got 4"),
        ((4, 6, 3), TensorSpec("in", "FP32", (3, 8, 8)), "expected 4 (batch, then CHW or HWC), got 3"),
        ((4, 6, 3), TensorSpec("in", "INT16", (-1, 8, 8, 3)), "expected one of UINT8, INT8, FP16, FP32, got INT16"),
        ((4, 6, 3), TensorSpec("in", "FP32", (4, 8, 8, 3)), "makes a batch of 1, the model expects 4"),
        ((4, 6, 3), TensorSpec("in", "FP32", (-1, 8, 8, 5)), "cannot tell the channel dimension of shape [-1,8,8,5]"),
    ],
)
def test_to_model_input_errors_say_expected_and_got(image_shape, spec: TensorSpec, message: str) -> None:
    with pytest.raises(ValueError) as ei:
        to_model_input(np.zeros(image_shape, dtype=np.uint8), spec)
    assert message in str(ei.value) and "input 'in'" in str(ei.value)


def test_request_head_and_body_go_out_in_one_write() -> None:
    """Two writes would be two TCP segments (TCP_NODELAY) and a second wake-up of the server per request."""
    from edgemux.runtime.ingress import client as client_mod

    sent: list[bytes] = []
    conn = client_mod._OneWriteHTTPConnection("127.0.0.1", 9)
    conn.send = sent.append  # type: ignore[method-assign]
    conn.putrequest("POST", "/v2/models/m/infer")
    conn.putheader("Content-Length", "5")
    conn.endheaders(message_body=b"hello")
    assert len(sent) == 1
    assert sent[0].startswith(b"POST /v2/models/m/infer HTTP/1.1\r\n")
    assert sent[0].endswith(b"\r\n\r\nhello")
    # a body that is not bytes (a file, an iterable) keeps http.client's own path
    sent.clear()
    conn2 = client_mod._OneWriteHTTPConnection("127.0.0.1", 9)
    conn2.send = sent.append  # type: ignore[method-assign]
    conn2.putrequest("POST", "/x")
    conn2.putheader("Content-Length", "2")
    conn2.endheaders(message_body=iter([b"ab"]))
    assert sent[0].endswith(b"\r\n\r\n") and b"ab" in sent[1:]
