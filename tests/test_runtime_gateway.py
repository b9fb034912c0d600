"""The gateway against real agents (small ones on edgemux's server core) on 127.0.0.1: outputs through it (JSON and binary, tritonclient
unmodified), smooth weighted round robin, failover and cooldowns, 4xx pass-through, all-down 503, policing
with a fake clock, the route control API, limits, metrics, and a fuzz that looks for 5xx.

Servers and the gateway run in one event loop on a background thread; the tests talk to them over HTTP from
the main thread, as any client would. No wall-clock thresholds are asserted: policing and cooldowns run on a
fake clock, and the only real wait is a short gateway timeout against an agent that never answers."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as th
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgemux.adapt.police import Policing
from edgemux.runtime.auth import POLICED_HEADER
from edgemux.runtime.ingress.client import AppRoute
from edgemux.runtime.ingress.dispatch import Reply
from edgemux.runtime.ingress.forward import AgentCalls, forwarded_headers, framing_problem
from edgemux.runtime.ingress.gateway import Gateway, RouteError, make_app, route_from_json
from edgemux.runtime.dataplane.protocol import (
    HEADER_LENGTH_HEADER,
    ProtocolError,
    decode_infer_request,
    decode_infer_response,
    encode_infer_request,
    encode_infer_response,
    error_body,
    TensorSpec,
    model_metadata_body,
)
from edgemux.runtime.httpserver import Application, Request, Response, get, post
from support import LoopThread, serve_app

SAFE_TIMEOUT_S = 10.0  # every gateway but the timeout test's: a slow moment must never look like a failure
HANG_TIMEOUT_S = 1.0  # the gateway's timeout against the agent that never answers (it also bounds the good agent)
X = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)


# ------------------------------------------------------------------------------------------ infrastructure


class FakeClock:
    """Seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Agent:
    """A small Open Inference Protocol agent: answers ``{input}_out`` = 2 * input, or fails on purpose
    according to ``mode`` ("ok", "503", "400", "429", "hang", "garbage", "badframe": a binary answer whose
    JSON header length runs past its body, "opaque": a 200 that is a JSON object but no inference answer)."""

    def __init__(self, mode: str = "ok", retry_after: str | None = None) -> None:
        self.mode = mode
        self.retry_after = retry_after
        self.hits = 0
        self.meta_hits = 0
        self.paths: list[str] = []
        self.bodies: list[bytes] = []
        self.header_lengths: list[str | None] = []
        self.marks: list[str | None] = []  # each request's POLICED_HEADER (infer and probes)
        self.release: asyncio.Event | None = None
        self.url = ""

    def app(self) -> Application:
        routes = []
        for prefix in ("/v2/models/{m}", "/v2/models/{m}/versions/{v}"):
            routes += [post(prefix + "/infer", self.infer), get(prefix, self.metadata), get(prefix + "/ready", self.ready)]
        return Application(routes, client_max_size=64 * 1024 * 1024)

    async def infer(self, request: Request) -> Response:
        body = await request.read()
        self.hits += 1
        self.paths.append(request.path)
        self.bodies.append(body)
        self.header_lengths.append(request.headers.get(HEADER_LENGTH_HEADER))
        self.marks.append(request.headers.get(POLICED_HEADER))
        if self.mode == "503":
            headers = {"Retry-After": self.retry_after} if self.retry_after else {}
            return Response(status=503, body=error_body("device overloaded"), headers=headers)
        if self.mode == "400":
            return Response(status=400, body=error_body("unexpected shape for input 'x'"), content_type="application/json")
        if self.mode == "429":
            return Response(status=429, body=error_body("over its rate"), headers={"Retry-After": "2"})
        if self.mode == "garbage":
            return Response(status=200, body=b"{not json", content_type="application/json")
        if self.mode == "badframe":
            return Response(status=200, body=b'{"outputs": []}', headers={HEADER_LENGTH_HEADER: "99"})
        if self.mode == "opaque":
            return Response(status=200, body=b' {"not": "decoded"}\n', content_type="application/json")
        if self.mode == "hang":
            assert self.release is not None
            await asyncio.wait_for(self.release.wait(), 10.0)
            return Response(status=503)
        try:
            req = decode_infer_request(body, request.headers.get(HEADER_LENGTH_HEADER))
        except ProtocolError as e:
            return Response(status=e.status, body=error_body(e.message))
        outs = {t.name + "_out": t.data * 2 for t in req.inputs}
        data, headers = encode_infer_response(request.match_info["m"], "1", outs, req)
        return Response(status=200, body=data, headers=headers)

    async def metadata(self, request: Request) -> Response:
        self.meta_hits += 1
        self.marks.append(request.headers.get(POLICED_HEADER))
        if self.mode != "ok":
            return Response(status=503, body=error_body("down"))
        spec = TensorSpec("x", "FP32", (-1, 3))
        body = model_metadata_body(request.match_info["m"], ["1"], "onnxruntime_onnx", [spec], [TensorSpec("x_out", "FP32", (-1, 3))])
        return Response(body=body, content_type="application/json")

    async def ready(self, request: Request) -> Response:
        return Response(status=200 if self.mode == "ok" else 400)


async def _hang_up_server() -> tuple[asyncio.base_events.Server, str]:
    """Accepts, reads the request and closes the connection without a word."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


class RawAgent:
    """An agent that answers every request with ``reply`` (raw bytes, as written), after reading the request's
    head and its Content-Length body; counts the connections it accepts; with ``close``, closes each
    connection after answering."""

    def __init__(self, reply: bytes, close: bool = False) -> None:
        self.reply = reply
        self.close = close
        self.connections = 0
        self.requests = 0
        self.url = ""

    async def start(self) -> asyncio.base_events.Server:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                                   if line.lower().startswith(b"content-length:")), 0)
                    await reader.readexactly(length)
                    self.requests += 1
                    writer.write(self.reply)
                    await writer.drain()
                    if self.close:
                        break
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        return server


def _refused_url() -> str:
    """A URL on which nothing listens."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


class Harness:
    """Starts agents and gateways in the loop thread and stops them all at the end of the test."""

    def __init__(self, lt: LoopThread) -> None:
        self.lt = lt
        self.runners: list[Any] = []
        self.servers: list[asyncio.base_events.Server] = []
        self.agents: list[Agent] = []

    def agent(self, mode: str = "ok", retry_after: str | None = None) -> Agent:
        a = Agent(mode, retry_after)

        async def start() -> None:
            a.release = asyncio.Event()
            runner, a.url = await serve_app(a.app())
            self.runners.append(runner)

        self.lt.run(start())
        self.agents.append(a)
        return a

    def raw_agent(self, reply: bytes, close: bool = False) -> RawAgent:
        a = RawAgent(reply, close)
        self.servers.append(self.lt.run(a.start()))
        return a

    def hang_up_url(self) -> str:
        server, url = self.lt.run(_hang_up_server())
        self.servers.append(server)
        return url

    def gateway(self, routes: Any, **kw: Any) -> tuple[Gateway, str]:
        kw.setdefault("timeout_s", SAFE_TIMEOUT_S)
        kw.setdefault("policing", Policing.exact())  # these tests count tokens of the contract as written
        gw = Gateway(routes, **kw)

        async def start() -> str:
            runner, url = await serve_app(make_app(gw))
            self.runners.append(runner)
            return url

        return gw, self.lt.run(start())

    def close(self) -> None:
        async def stop() -> None:
            for a in self.agents:
                if a.release is not None:
                    a.release.set()
            for s in self.servers:
                s.close()
            for r in reversed(self.runners):
                await r.stop()

        self.lt.run(stop())


@pytest.fixture(scope="module")
def loop_thread() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    lt.stop()


@pytest.fixture
def h(loop_thread: LoopThread) -> Iterator[Harness]:
    harness = Harness(loop_thread)
    yield harness
    harness.close()


def call(
    base: str, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, http.client.HTTPMessage, bytes]:
    """One HTTP exchange with the gateway: (status, headers, body)."""
    u = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read()
    finally:
        conn.close()


def infer(base: str, app: str = "app", binary: bool = True, x: np.ndarray = X) -> tuple[int, http.client.HTTPMessage, bytes]:
    body, headers = encode_infer_request({"x": x}, binary=binary)
    return call(base, "POST", f"/v2/models/{app}/infer", body, headers)


def route(app: str, *pairs: tuple[str, float], rate: float = 1e6, burst: float = 1e6, model: str = "resnet") -> AppRoute:
    return AppRoute(app, model, list(pairs), rate, burst)


def error_of(body: bytes) -> dict[str, Any]:
    doc = json.loads(body)
    assert isinstance(doc, dict) and isinstance(doc["error"], str)
    return doc


# ------------------------------------------------------------------------------------------- outputs


@pytest.mark.parametrize("binary", [False, True])
def test_outputs_through_the_gateway_body_forwarded_unchanged(h: Harness, binary: bool) -> None:
    a = h.agent()
    _, base = h.gateway({"app": route("app", (a.url, 1.0))})
    body, headers = encode_infer_request({"x": X}, binary=binary)
    status, rh, rb = call(base, "POST", "/v2/models/app/infer", body, headers)
    assert status == 200
    res = decode_infer_response(rb, rh.get(HEADER_LENGTH_HEADER))
    np.testing.assert_array_equal(res.outputs["x_out"], 2 * X)
    assert res.model_name == "resnet"  # the agent's answer, unchanged
    assert a.paths == ["/v2/models/resnet/infer"]  # the app's name rewritten to the route's model
    assert a.bodies == [body]  # byte for byte
    assert a.header_lengths == [headers.get(HEADER_LENGTH_HEADER)]
    assert (HEADER_LENGTH_HEADER in rh) == binary


def test_replies_pass_through_undecoded_and_requests_carry_the_gateways_mark(h: Harness) -> None:
    """The gateway does not decode a 200: one whose framing holds (a JSON object) is the caller's answer byte
    for byte, whatever it holds (the agent answers for its contents). Each forwarded inference carries the
    gateway's mark (policed and counted here), whatever the caller sent as that header; probes do not."""
    a = h.agent("opaque")
    _, base = h.gateway({"app": route("app", (a.url, 1.0))})
    body, headers = encode_infer_request({"x": X})
    status, _, rb = call(base, "POST", "/v2/models/app/infer", body, {**headers, POLICED_HEADER: "forged"})
    assert (status, rb) == (200, b' {"not": "decoded"}\n')
    a.mode = "ok"
    assert call(base, "GET", "/v2/models/app")[0] == 200
    assert a.marks == ["gateway", None]


def test_forwarded_headers_pass_the_protocols_and_tracing_ids_as_they_came() -> None:
    """What an agent gets of the caller's head: the protocol's headers and tracing ids, bytes as they came
    (the first of a repeated one), never the caller's credentials, hop-by-hop headers, Host or a forged mark;
    then the gateway's own ask for a plain reply, and on inference its mark."""
    raw = [(b"Host", b"gw:8000"), (b"content-type", b"application/octet-stream"), (b"Authorization", b"Bearer k"),
           (b"Inference-Header-Content-Length", b"120"), (b"Connection", b"keep-alive"), (b"Content-Length", b"9"),
           (b"traceparent", b"00-ab-cd-01"), (b"Traceparent", b"00-second-01"), (POLICED_HEADER.encode(), b"forged"),
           (b"X-Request-Id", b"r\xc3\xa9q")]
    got = forwarded_headers(raw, inference=True)
    assert got == (b"content-type: application/octet-stream\r\nInference-Header-Content-Length: 120\r\n"
                   b"traceparent: 00-ab-cd-01\r\nX-Request-Id: r\xc3\xa9q\r\n"
                   b"Accept-Encoding: identity\r\n" + POLICED_HEADER.encode() + b": gateway\r\n")
    assert forwarded_headers((), inference=False) == b"Accept-Encoding: identity\r\n"


def test_version_path_is_forwarded(h: Harness) -> None:
    a = h.agent()
    _, base = h.gateway({"app": route("app", (a.url, 1.0))})
    body, headers = encode_infer_request({"x": X})
    assert call(base, "POST", "/v2/models/app/versions/3/infer", body, headers)[0] == 200
    assert a.paths == ["/v2/models/resnet/versions/3/infer"]


@pytest.mark.parametrize("binary", [False, True])
def test_tritonclient_works_unmodified(h: Harness, binary: bool) -> None:
    a = h.agent()
    _, base = h.gateway({"cam-1": route("cam-1", (a.url, 1.0))})
    tc = th.InferenceServerClient(base.removeprefix("http://"))
    try:
        assert tc.is_server_live()
        assert tc.is_server_ready()
        assert tc.is_model_ready("cam-1")
        meta = tc.get_model_metadata("cam-1")
        assert meta["name"] == "cam-1" and meta["inputs"][0]["name"] == "x"
        inp = th.InferInput("x", list(X.shape), "FP32")
        inp.set_data_from_numpy(X, binary_data=binary)
        out = th.InferRequestedOutput("x_out", binary_data=binary)
        result = tc.infer("cam-1", [inp], outputs=[out])
        np.testing.assert_array_equal(result.as_numpy("x_out"), 2 * X)
        with pytest.raises(th.InferenceServerException, match="unknown app 'nope'"):
            tc.infer("nope", [inp])
    finally:
        tc.close()


def test_model_metadata_is_cached_and_server_metadata(h: Harness) -> None:
    a = h.agent()
    _, base = h.gateway({"app": route("app", (a.url, 1.0))})
    for _ in range(3):
        status, _, body = call(base, "GET", "/v2/models/app")
        assert status == 200 and json.loads(body)["name"] == "app"
    assert a.meta_hits == 1
    status, _, body = call(base, "GET", "/v2")
    assert status == 200 and "binary_tensor_data" in json.loads(body)["extensions"]


# ------------------------------------------------------------------------------------------- routing


def test_weighted_round_robin_exact_counts(h: Harness) -> None:
    a, b = h.agent(), h.agent()
    _, base = h.gateway({"app": route("app", (a.url, 0.7), (b.url, 0.3))}, clock=FakeClock())
    for _ in range(100):
        assert infer(base)[0] == 200
    assert (a.hits, b.hits) == (70, 30)


@pytest.mark.parametrize("failure", ["503", "refused", "hang_up", "hang", "garbage", "badframe"])
def test_failover_and_cooldown(h: Harness, failure: str) -> None:
    clock = FakeClock()
    good = h.agent()
    if failure == "refused":
        bad_url = _refused_url()
    elif failure == "hang_up":
        bad_url = h.hang_up_url()
    else:
        bad_url = h.agent(failure).url
    timeout = HANG_TIMEOUT_S if failure == "hang" else SAFE_TIMEOUT_S
    gw, base = h.gateway(
        {"app": route("app", (bad_url, 1.0), (good.url, 1.0))}, clock=clock, cooldown_s=5.0, timeout_s=timeout
    )
    status, rh, body = infer(base)
    assert status == 200  # the bad endpoint was tried first (declaration order), then the good one
    np.testing.assert_array_equal(decode_infer_response(body, rh.get(HEADER_LENGTH_HEADER)).outputs["x_out"], 2 * X)
    for _ in range(4):  # the bad endpoint is skipped during its cooldown
        assert infer(base)[0] == 200
    assert good.hits == 5
    metrics = call(base, "GET", "/metrics")[2].decode()
    assert 'edgemux_gateway_failovers_total{app="app"} 1.0' in metrics
    clock.t += 5.0  # cooldown over: back in the interleaving, so tried again within two requests (and failed over)
    assert infer(base)[0] == 200 and infer(base)[0] == 200
    assert 'edgemux_gateway_failovers_total{app="app"} 2.0' in call(base, "GET", "/metrics")[2].decode()


def test_endpoint_comes_back_after_cooldown(h: Harness) -> None:
    clock = FakeClock()
    a, b = h.agent("503"), h.agent()
    _, base = h.gateway({"app": route("app", (a.url, 1.0), (b.url, 1.0))}, clock=clock, cooldown_s=5.0)
    assert infer(base)[0] == 200 and (a.hits, b.hits) == (1, 1)
    a.mode = "ok"
    for _ in range(3):
        infer(base)
    assert a.hits == 1  # still cooling down
    clock.t += 5.0
    for _ in range(4):
        infer(base)
    assert a.hits == 3  # back in the interleaving


def test_503_retry_after_sets_the_cooldown(h: Harness) -> None:
    clock = FakeClock()
    a, b = h.agent("503", retry_after="30"), h.agent()
    _, base = h.gateway({"app": route("app", (a.url, 1.0), (b.url, 1.0))}, clock=clock, cooldown_s=5.0)
    infer(base)
    clock.t += 10.0  # past the gateway's cooldown, within the agent's Retry-After
    infer(base)
    infer(base)
    assert a.hits == 1
    clock.t += 21.0
    infer(base)
    infer(base)
    assert a.hits == 2


@pytest.mark.parametrize("mode,status", [("400", 400), ("429", 429)])
def test_4xx_is_passed_through_once(h: Harness, mode: str, status: int) -> None:
    a, b = h.agent(mode), h.agent()
    _, base = h.gateway({"app": route("app", (a.url, 1.0), (b.url, 1.0))}, clock=FakeClock())
    code, rh, body = infer(base)
    assert code == status
    assert body == (error_body("unexpected shape for input 'x'") if mode == "400" else error_body("over its rate"))
    if mode == "429":
        assert rh["Retry-After"] == "2"
    assert (a.hits, b.hits) == (1, 0)
    assert infer(base)[0] == 200  # not marked down: the next request goes to b by round robin, a after
    assert infer(base)[0] == status and a.hits == 2


def test_all_down_is_503_naming_every_endpoint(h: Harness) -> None:
    clock = FakeClock()
    a = h.agent("503")
    refused = _refused_url()
    _, base = h.gateway({"app": route("app", (a.url, 1.0), (refused, 1.0))}, clock=clock, cooldown_s=5.0)
    status, rh, body = infer(base)
    assert status == 503
    assert rh["Retry-After"] == "5"
    doc = error_of(body)
    assert doc["app"] == "app" and "'app'" in doc["error"]
    assert doc["failures"] == {a.url: "HTTP 503: device overloaded", refused: "connection refused"}
    # Within the cooldown nothing is tried, and the answer still says why each endpoint is out.
    clock.t += 2.0
    status, rh, body = infer(base)
    assert status == 503 and rh["Retry-After"] == "3" and a.hits == 1
    failures = error_of(body)["failures"]
    assert "skipped during its cooldown after HTTP 503" in failures[a.url]
    assert "connection refused" in failures[refused]


# ------------------------------------------------------------------------------------------- policing


def test_policing_refuses_the_third_immediate_request(h: Harness) -> None:
    clock = FakeClock()
    a = h.agent()
    _, base = h.gateway({"app": route("app", (a.url, 1.0), rate=5.0, burst=2.0)}, clock=clock, max_wait_s=0.0)
    assert infer(base)[0] == 200
    assert infer(base)[0] == 200
    status, rh, body = infer(base)
    assert status == 429 and rh["Retry-After"] == "1"  # 0.2 s until the next token, rounded up
    assert "rate limited" in error_of(body)["error"]
    assert a.hits == 2  # refused without sending
    clock.t += 0.2
    assert infer(base)[0] == 200
    metrics = call(base, "GET", "/metrics")[2].decode()
    assert 'edgemux_gateway_requests_total{app="app",code="429"} 1.0' in metrics
    assert 'edgemux_gateway_requests_total{app="app",code="200"} 3.0' in metrics


def test_policing_waits_are_awaited_not_refused(h: Harness) -> None:
    clock = FakeClock()
    waits: list[float] = []

    async def fake_sleep(s: float) -> None:
        waits.append(s)
        clock.t += s

    a = h.agent()
    _, base = h.gateway(
        {"app": route("app", (a.url, 1.0), rate=5.0, burst=1.0)}, clock=clock, max_wait_s=1.0, sleep=fake_sleep
    )
    for _ in range(3):
        assert infer(base)[0] == 200
    assert waits == [pytest.approx(0.2), pytest.approx(0.2)]
    metrics = call(base, "GET", "/metrics")[2].decode()
    assert 'edgemux_gateway_policing_wait_seconds_count{app="app"} 3.0' in metrics
    assert 'edgemux_gateway_latency_seconds_count{app="app"} 3.0' in metrics


def test_a_bad_request_is_the_agents_400_passed_on_and_costs_its_token(h: Harness) -> None:
    """The gateway does not parse bodies (the agent validates them against its model): a malformed request
    reaches the agent byte for byte, its 400 comes back unchanged, and it spent the app's token."""
    a = h.agent()
    _, base = h.gateway({"app": route("app", (a.url, 1.0), rate=5.0, burst=1.0)}, clock=FakeClock(), max_wait_s=0.0)
    status, _, body = call(base, "POST", "/v2/models/app/infer", b'{"inputs": 3}', {"Content-Type": "application/json"})
    assert status == 400 and "'inputs' must be a list" in error_of(body)["error"]
    assert a.bodies == [b'{"inputs": 3}']
    assert infer(base)[0] == 429  # the one token went to the bad request, as at the agent


# ------------------------------------------------------------------------------------------- bodies


def _big() -> tuple[np.ndarray, bytes, dict[str, str]]:
    """A request of about 1.2 MB: many socket reads, so that it streams in many chunks."""
    x = np.arange(3 * 100_000, dtype=np.float32).reshape(100_000, 3)
    body, headers = encode_infer_request({"x": x}, binary=True)
    return x, body, dict(headers)


def test_a_large_body_is_streamed_through_unchanged(h: Harness) -> None:
    a = h.agent()
    _, base = h.gateway({"app": route("app", (a.url, 1.0))})
    x, body, headers = _big()
    status, rh, rb = call(base, "POST", "/v2/models/app/infer", body, headers)
    assert status == 200 and a.bodies == [body]
    np.testing.assert_array_equal(decode_infer_response(rb, rh.get(HEADER_LENGTH_HEADER)).outputs["x_out"], 2 * x)


def test_a_body_cut_off_by_a_failing_endpoint_is_sent_whole_to_the_next(h: Harness) -> None:
    """The first endpoint reads 64 kB of the streamed body and hangs up: the next gets all of it."""
    good = h.agent()
    gw, base = h.gateway({"app": route("app", (h.hang_up_url(), 1.0), (good.url, 1.0))}, clock=FakeClock())
    x, body, headers = _big()
    status, rh, rb = call(base, "POST", "/v2/models/app/infer", body, headers)
    assert status == 200 and good.bodies == [body]
    np.testing.assert_array_equal(decode_infer_response(rb, rh.get(HEADER_LENGTH_HEADER)).outputs["x_out"], 2 * x)
    assert 'edgemux_gateway_failovers_total{app="app"} 1.0' in call(base, "GET", "/metrics")[2].decode()


def test_a_chunked_body_is_forwarded_whole(h: Harness) -> None:
    a = h.agent()
    _, base = h.gateway({"app": route("app", (a.url, 1.0))})
    _, body, headers = _big()
    u = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    try:
        pieces = [body[i : i + 100_000] for i in range(0, len(body), 100_000)]
        conn.request("POST", "/v2/models/app/infer", body=iter(pieces), headers=headers, encode_chunked=True)
        assert conn.getresponse().status == 200
    finally:
        conn.close()
    assert a.bodies == [body]


def test_a_caller_breaking_off_is_not_the_endpoints_failure(h: Harness) -> None:
    """The caller declares 1.2 MB, sends 100 kB and goes: the attempt streaming it fails, the endpoint is
    not put in cooldown and nothing is a 5xx."""
    first, second = h.agent(), h.agent()
    _, base = h.gateway({"app": route("app", (first.url, 1.0), (second.url, 1.0))}, clock=FakeClock())
    _, body, headers = _big()
    u = urllib.parse.urlsplit(base)
    with socket.create_connection((u.hostname, u.port), timeout=30) as sock:
        head = "".join(f"{k}: {v}\r\n" for k, v in {**headers, "Content-Length": str(len(body))}.items())
        sock.sendall(f"POST /v2/models/app/infer HTTP/1.1\r\nHost: x\r\n{head}\r\n".encode() + body[:100_000])
    deadline = time.monotonic() + 30.0
    while 'edgemux_gateway_requests_total{app="app",code="400"} 1.0' not in (m := call(base, "GET", "/metrics")[2].decode()):
        assert time.monotonic() < deadline, m
        time.sleep(0.05)
    assert "failovers_total{app=\"app\"} 1.0" not in m and 'code="5' not in m
    assert first.bodies == [] and second.bodies == []  # the cut body reached no agent's handler whole
    assert infer(base)[0] == 200 and infer(base)[0] == 200
    assert (len(first.bodies), len(second.bodies)) == (1, 1)  # neither endpoint was put in cooldown


# -------------------------------------------------------------------------------------- limits, errors


def test_unknown_app_is_404_naming_it(h: Harness) -> None:
    a = h.agent()
    _, base = h.gateway({"app": route("app", (a.url, 1.0))})
    for method, path in (("POST", "/v2/models/cam-9/infer"), ("GET", "/v2/models/cam-9"), ("GET", "/v2/models/cam-9/ready")):
        status, _, body = call(base, method, path, b"{}" if method == "POST" else None)
        assert status == 404 and "unknown app 'cam-9'" in error_of(body)["error"], path
        assert "'app'" not in error_of(body)["error"]  # other tenants' apps are not listed
    status, _, body = call(base, "GET", "/v2/nothing/here")
    assert status == 404 and error_of(body)


def test_oversized_body_is_413_before_reading(h: Harness) -> None:
    a = h.agent()
    _, base = h.gateway({"app": route("app", (a.url, 1.0))}, max_body_bytes=1000)
    status, _, body = infer(base, x=np.zeros((1, 1000), np.float32))
    assert status == 413 and "exceeds the limit of 1000 bytes" in error_of(body)["error"]
    # Chunked: no Content-Length to check, so the count stops it while reading.
    u = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    try:
        conn.request("POST", "/v2/models/app/infer", body=iter([b"x" * 600] * 4), encode_chunked=True)
        resp = conn.getresponse()
        assert resp.status == 413 and error_of(resp.read())
    finally:
        conn.close()
    assert a.hits == 0


def test_a_bug_is_a_500_json_error(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    a = h.agent()
    gw, base = h.gateway({"app": route("app", (a.url, 1.0))})

    async def broken(*args: Any) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(gw, "_infer", broken)
    status, _, body = infer(base)
    assert status == 500 and "RuntimeError: boom" in error_of(body)["error"]
    assert 'code="500"' in call(base, "GET", "/metrics")[2].decode()


def test_health_ready_needs_routes(h: Harness) -> None:
    _, base = h.gateway({})
    assert call(base, "GET", "/v2/health/live")[0] == 200
    assert call(base, "GET", "/v2/health/ready")[0] == 503
    a = h.agent()
    assert call(base, "PUT", "/v1/routes/app", json.dumps({"model": "m", "endpoints": [{"url": a.url, "weight": 1}], "rate_rps": 10, "burst": 2}).encode())[0] == 200
    assert call(base, "GET", "/v2/health/ready")[0] == 200


def test_model_ready_follows_the_agents(h: Harness) -> None:
    clock = FakeClock()
    a = h.agent("503")
    _, base = h.gateway({"app": route("app", (a.url, 1.0))}, clock=clock)
    assert call(base, "GET", "/v2/models/app/ready")[0] == 400  # the agent answers "not ready"
    a.mode = "ok"
    assert call(base, "GET", "/v2/models/app/ready")[0] == 200


# ----------------------------------------------------------------------------------------- control API


def test_route_push_replace_list_delete(h: Harness) -> None:
    clock = FakeClock()
    a, b = h.agent(), h.agent()
    gw, base = h.gateway({}, clock=clock, max_wait_s=0.0)
    doc = {"model": "resnet", "endpoints": [{"url": a.url, "weight": 1.0, "device": "node-1/gpu0"}], "rate_rps": 5, "burst": 2}
    status, _, body = call(base, "PUT", "/v1/routes/cam-1", json.dumps(doc).encode())
    assert status == 200 and json.loads(body)["app"] == "cam-1"
    assert infer(base, "cam-1")[0] == 200 and infer(base, "cam-1")[0] == 200
    # Republished (a second endpoint): the bucket keeps its state, so no fresh burst.
    doc["endpoints"].append({"url": b.url, "weight": 1.0})
    assert call(base, "PUT", "/v1/routes/cam-1", json.dumps(doc).encode())[0] == 200
    assert infer(base, "cam-1")[0] == 429
    listed = json.loads(call(base, "GET", "/v1/routes")[2])["routes"]
    assert [e["url"] for e in listed["cam-1"]["endpoints"]] == [a.url, b.url]
    assert listed["cam-1"]["endpoints"][0]["device"] == "node-1/gpu0"
    assert gw.routes()["cam-1"].rate_rps == 5.0
    assert call(base, "DELETE", "/v1/routes/cam-1")[0] == 200
    assert infer(base, "cam-1")[0] == 404
    assert call(base, "DELETE", "/v1/routes/cam-1")[0] == 404


GOOD = {"model": "m", "endpoints": [{"url": "http://127.0.0.1:9", "weight": 1}], "rate_rps": 10, "burst": 2}


@pytest.mark.parametrize(
    "change,field",
    [
        ({"model": ""}, "model"),
        ({"model": 3}, "model"),
        ({"rate_rps": 0}, "rate_rps"),
        ({"rate_rps": "fast"}, "rate_rps"),
        ({"burst": 0.5}, "burst"),
        ({"burst": 10**400}, "burst"),
        ({"endpoints": []}, "endpoints"),
        ({"endpoints": "http://x"}, "endpoints"),
        ({"endpoints": [{"url": "ftp://x", "weight": 1}]}, "endpoints[0].url"),
        ({"endpoints": [{"url": 5, "weight": 1}]}, "endpoints[0].url"),
        ({"endpoints": [{"url": "http://x:1", "weight": -1}]}, "endpoints[0].weight"),
        ({"endpoints": [{"url": "http://x:1", "weight": True}]}, "endpoints[0].weight"),
        ({"endpoints": [{"url": "http://x:1", "weight": 1, "wieght": 2}]}, "endpoints[0].wieght"),
        ({"endpoints": [{"url": "http://x:1", "weight": 0}]}, "endpoints"),
        ({"endpoints": [{"url": "http://x:1", "weight": 1}, {"url": "http://x:1", "weight": 1}]}, "endpoints"),
        ({"rate": 3}, "rate"),
        ({"model_version": 2}, "model_version"),
    ],
)
def test_route_push_is_validated(h: Harness, change: dict[str, Any], field: str) -> None:
    _, base = h.gateway({})
    status, _, body = call(base, "PUT", "/v1/routes/app", json.dumps({**GOOD, **change}).encode())
    assert status == 400
    doc = error_of(body)
    assert any(r.startswith(field + ":") for r in doc["reasons"]), doc
    assert call(base, "GET", "/v2/health/ready")[0] == 503  # nothing installed


def test_route_from_json_round_trip_and_not_json(h: Harness) -> None:
    r = route_from_json("app", GOOD)
    assert r.model == "m" and r.endpoints[0][1] == 1.0 and r.burst == 2.0
    with pytest.raises(RouteError, match="body: must be a JSON object"):
        route_from_json("app", [GOOD])
    _, base = h.gateway({})
    status, _, body = call(base, "PUT", "/v1/routes/app", b"{nope")
    assert status == 400 and error_of(body)["reasons"][0].startswith("body:")


def test_routes_from_a_callable_are_looked_up_once(h: Harness) -> None:
    a = h.agent()
    asked: list[str] = []

    def lookup(app: str) -> AppRoute | None:
        asked.append(app)
        return route(app, (a.url, 1.0)) if app == "app" else None

    _, base = h.gateway(lookup)
    assert call(base, "GET", "/v2/health/ready")[0] == 200
    assert infer(base)[0] == 200 and infer(base)[0] == 200
    assert infer(base, "other")[0] == 404
    assert asked == ["app", "other"]


def test_a_failing_route_lookup_is_503_not_500(h: Harness) -> None:
    def lookup(app: str) -> AppRoute | None:
        raise ConnectionError("control plane unreachable")

    _, base = h.gateway(lookup)
    status, rh, body = infer(base)
    assert status == 503 and rh["Retry-After"] == "1"
    assert "route lookup failed: ConnectionError: control plane unreachable" in error_of(body)["error"]


def test_a_policing_wait_does_not_block_other_apps(h: Harness) -> None:
    """Real clock and asyncio.sleep: while one app's request waits 2 s for its token, another app's request
    is served. Only the order of completion is asserted, no duration."""
    a = h.agent()
    _, base = h.gateway(
        {"slow": route("slow", (a.url, 1.0), rate=0.5, burst=1.0), "fast": route("fast", (a.url, 1.0))}, max_wait_s=5.0
    )
    assert infer(base, "slow")[0] == 200  # takes the one token: the next request must wait 2 s
    done: list[str] = []
    waiting = threading.Thread(target=lambda: done.append(f"slow {infer(base, 'slow')[0]}"))
    waiting.start()
    for _ in range(3000):  # a guard against hanging, not a timing assertion
        if _waiting_for_token(base):
            break
        time.sleep(0.005)
    done.append(f"fast {infer(base, 'fast')[0]}")
    waiting.join(30)
    assert done == ["fast 200", "slow 200"]


def _waiting_for_token(base: str) -> bool:
    """Whether the gateway has admitted a second 'slow' request (it is then waiting for its token)."""
    text = call(base, "GET", "/metrics")[2].decode()
    return 'edgemux_gateway_policing_wait_seconds_count{app="slow"} 2.0' in text


def test_gateway_argument_checks() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        Gateway({}, timeout_s=0)
    with pytest.raises(ValueError, match="max_body_bytes"):
        Gateway({}, max_body_bytes=0)
    with pytest.raises(ValueError, match="given as the route of app"):
        Gateway({"a": route("b", ("http://x:1", 1.0))})


# ------------------------------------------------------------------------------------------------ fuzz


# (method, path) pairs the gateway serves: most fuzz requests aim at one, so that they get past the router.
_ENDPOINTS = [
    ("POST", "/v2/models/ok/infer"), ("POST", "/v2/models/down/infer"), ("POST", "/v2/models/fz/infer"),
    ("POST", "/v2/models/ok/versions/1/infer"), ("GET", "/v2/models/ok"), ("GET", "/v2/models/down"),
    ("GET", "/v2/models/fz"), ("GET", "/v2/models/ok/ready"), ("GET", "/v2/models/down/ready"),
    ("GET", "/v2/models/ok/versions/7"), ("PUT", "/v1/routes/fz"), ("DELETE", "/v1/routes/fz"),
    ("GET", "/v1/routes"), ("GET", "/metrics"), ("GET", "/v2"), ("GET", "/v2/health/ready"), ("GET", "/v2/health/live"),
]


def _route_bodies(urls: list[str]) -> st.SearchStrategy[Any]:
    scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=8))
    endpoint = st.fixed_dictionaries(
        {"url": st.one_of(st.sampled_from(urls + ["ftp://x", "http://", "http://h:99999"]), scalar), "weight": scalar},
        optional={"device": scalar, "junk": scalar},
    )
    return st.fixed_dictionaries(
        {},
        optional={
            "model": st.one_of(st.just("m"), scalar),
            "endpoints": st.one_of(st.lists(endpoint, max_size=3), scalar),
            "rate_rps": st.one_of(st.just(1e6), scalar),
            "burst": st.one_of(st.just(1e6), scalar),
            "model_version": scalar,
        },
    )


def _infer_bodies() -> st.SearchStrategy[Any]:
    scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=6))
    tensor = st.fixed_dictionaries(
        {},
        optional={
            "name": st.one_of(st.just("x"), scalar),
            "datatype": st.one_of(st.sampled_from(["FP32", "INT8", "BYTES", "BOOL", "FP16"]), scalar),
            "shape": st.one_of(st.lists(st.integers(-2, 4), max_size=3), scalar),
            "data": st.one_of(st.lists(scalar, max_size=4), scalar),
            "parameters": st.one_of(st.fixed_dictionaries({}, optional={"binary_data_size": scalar}), scalar),
        },
    )
    return st.fixed_dictionaries(
        {},
        optional={"inputs": st.one_of(st.lists(tensor, max_size=2), scalar), "outputs": st.one_of(st.lists(st.dictionaries(st.just("name"), scalar), max_size=2), scalar), "id": scalar},
    )


def test_fuzz_paths_and_bodies_never_5xx(h: Harness) -> None:
    """Whatever is sent, the only 5xx is the deliberate 503 of an app whose agents are down."""
    ok = h.agent()
    down = _refused_url()
    valid_body, valid_headers = encode_infer_request({"x": X}, binary=True)
    gw, base = h.gateway(
        {"ok": route("ok", (ok.url, 1.0)), "down": route("down", (down, 1.0))}, clock=FakeClock(), max_body_bytes=4096
    )

    bodies = st.one_of(
        st.binary(max_size=300),
        _infer_bodies().map(lambda d: json.dumps(d).encode()),
        _route_bodies([ok.url, down]).map(lambda d: json.dumps(d).encode()),
        st.just(valid_body),
        st.tuples(st.integers(0, len(valid_body) - 1), st.integers(0, 255)).map(  # one byte of it changed
            lambda t: valid_body[: t[0]] + bytes([t[1]]) + valid_body[t[0] + 1 :]
        ),
        st.binary(min_size=4097, max_size=5000),
    )
    segment = st.text(max_size=12).map(lambda s: urllib.parse.quote(s, safe=""))
    raw = st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=20)
    methods = st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"])
    requests = st.one_of(
        st.sampled_from(_ENDPOINTS),
        st.sampled_from(_ENDPOINTS),  # twice: the served endpoints get most of the examples
        # an endpoint's path with one segment replaced by anything (app names, versions, junk)
        st.tuples(st.sampled_from(_ENDPOINTS), st.integers(1, 5), segment).map(
            lambda t: (t[0][0], "/".join(seg if i != t[1] else t[2] for i, seg in enumerate(t[0][1].split("/"))))
        ),
        st.tuples(methods, st.sampled_from([p for _, p in _ENDPOINTS]), raw).map(lambda t: (t[0], t[1] + t[2])),
    )
    header_lengths = st.one_of(st.none(), st.integers(-5, 400).map(str), st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=6))

    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(request=requests, body=bodies, hlen=header_lengths)
    def check(request: tuple[str, str], body: bytes, hlen: str | None) -> None:
        method, path = request
        headers = {"Content-Type": "application/octet-stream"}
        if hlen is not None:
            headers[HEADER_LENGTH_HEADER] = hlen
        if len(body) == len(valid_body) and hlen is None:
            headers.update(valid_headers)
        status, _, rb = call(base, method, path, body if method != "GET" else None, headers)
        if status >= 500:
            assert status == 503, (method, path, status, rb[:300])
            doc = error_of(rb)
            assert "no endpoint could serve the request" in doc["error"] or "no routes" in doc["error"], doc

    check()
    assert call(base, "GET", "/metrics")[0] == 200


_OK = b'{"model_name":"m","outputs":[]}'


@pytest.mark.parametrize(("reply", "reused"), [
    (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(_OK) + _OK, True),
    # chunked transfer coding, a chunk extension and a trailer
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\n" + _OK[:5] + b"\r\n%x\r\n" % (len(_OK) - 5)
     + _OK[5:] + b"\r\n0\r\nX-Trailer: 1\r\n\r\n", True),
    # an interim answer first
    (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(_OK) + _OK, True),
    (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(_OK) + _OK, False),
    # HTTP/1.0 without a length: the body runs to the end of the connection
    (b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + _OK, False),
    # a second answer behind the one asked for: the first stands, the connection is out of step
    (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(_OK) + _OK
     + b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nno", False),
])
def test_the_gateways_calls_read_every_framing_and_keep_connections_alive(h: Harness, reply: bytes,
                                                                          reused: bool) -> None:
    """The gateway's own HTTP/1.1 calls (forward.AgentCalls): each reply framing gives the body, passed on as
    it came; a keep-alive connection serves the next request, one that says it closes (or runs to its end)
    is not reused."""
    a = h.raw_agent(reply, close=not reused)
    _, base = h.gateway({"app": route("app", (a.url, 1.0))})
    for _ in range(3):
        status, _, body = infer(base)
        assert (status, body) == (200, _OK)
    assert a.requests == 3 and a.connections == (1 if reused else 3)


def _raw_infer(base: str, extra: bytes = b"") -> bytes:
    """One inference request on a raw socket (``extra``: header lines to add); the answer's bytes as they
    came, read to the end of its Content-Length."""
    body, headers = encode_infer_request({"x": X}, binary=True)
    u = urllib.parse.urlsplit(base)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode()
    with socket.create_connection((u.hostname, u.port), timeout=30) as s:
        s.sendall(b"POST /v2/models/app/infer HTTP/1.1\r\nHost: x\r\n" + head + extra
                  + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        data = b""
        while b"\r\n\r\n" not in data or len(data) < data.index(b"\r\n\r\n") + 4 + int(
                re.search(rb"Content-Length: (\d+)", data).group(1)):  # type: ignore[union-attr]
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk
    return data


@pytest.mark.parametrize(("extra_reply_header", "extra_request_header", "as_it_came"), [
    (b"", b"", True),  # the usual reply, on a kept connection: its bytes as they came
    (b"X-Agent-Own: 1\r\n", b"", False),  # a header the gateway does not pass on: encoded anew, without it
    (b"", b"Connection: close\r\n", False),  # the caller's connection closes: the answer says so
])
def test_a_reply_is_passed_on_byte_for_byte_when_nothing_in_it_would_change(
        h: Harness, extra_reply_header: bytes, extra_request_header: bytes, as_it_came: bool) -> None:
    """forward.PassedOn: a reply whose head the gateway would write alike goes out as the agent wrote it (its
    reason phrase shows it); anything else is encoded again with the protocol's headers only."""
    reply = (b"HTTP/1.1 200 Fine\r\nContent-Type: application/json\r\n" + extra_reply_header
             + b"Date: Sat, 28 Nov 2026 00:00:00 GMT\r\nContent-Length: %d\r\n\r\n" % len(_OK) + _OK)
    a = h.raw_agent(reply)
    _, base = h.gateway({"app": route("app", (a.url, 1.0))})
    got = _raw_infer(base, extra_request_header)
    if as_it_came:
        assert got == reply
    else:
        assert got.startswith(b"HTTP/1.1 200 OK\r\n") and got.endswith(b"\r\n\r\n" + _OK), got
        assert b"X-Agent-Own" not in got and b"Content-Type: application/json\r\n" in got, got
        assert (b"Connection: close\r\n" in got) == bool(extra_request_header), got


def test_the_gateways_calls_refuse_head(loop_thread: LoopThread) -> None:
    """forward.AgentCalls reads a reply's body by its framing, which a reply to HEAD does not follow."""
    calls = AgentCalls(1.0, None)

    async def head() -> None:
        with pytest.raises(ValueError, match="a GET or a POST, not a HEAD"):
            await calls.exchange("HEAD", "http://127.0.0.1:9/v2", None, b"")

    loop_thread.run(head())


@pytest.mark.parametrize(("reply", "why"), [
    (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (64 * 1024 * 1024 + 1), "response larger than"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: nope\r\n\r\n", "malformed reply: Content-Length"),
    (b"SMTP ready\r\n\r\n", "malformed reply: status line"),
    (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed reply: header line"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "malformed reply: body (Invalid character in chunk size)"),
    (b"HTTP/1.1 2xx OK\r\n\r\n", "malformed reply: status line"),
    (b"HTTP/1.1 200 OK\r\nX-A: 1\nX-B: 2\r\n\r\n", "malformed reply: header line"),  # a bare line feed
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}", "connection closed mid-answer"),
])
def test_a_reply_that_is_not_http_fails_the_endpoint_over(h: Harness, reply: bytes, why: str) -> None:
    bad, good = h.raw_agent(reply, close=True), h.agent()
    _, base = h.gateway({"app": route("app", (bad.url, 1.0), (good.url, 1.0))}, clock=FakeClock())
    status, rh, rb = infer(base)
    assert status == 200 and good.hits == 1
    np.testing.assert_array_equal(decode_infer_response(rb, rh.get(HEADER_LENGTH_HEADER)).outputs["x_out"], 2 * X)
    _, base_alone = h.gateway({"app": route("app", (bad.url, 1.0))}, clock=FakeClock())
    status, _, rb = infer(base_alone)
    assert status == 503 and why in error_of(rb)["failures"][bad.url], rb


@pytest.mark.parametrize(("body", "headers", "problem"), [
    (b'{"outputs": []}', {}, None),
    (b' \n{"a": 1}\r\n', {}, None),
    (b"{not json", {}, "not a JSON object"),
    (b"", {}, "not a JSON object"),
    (b'[1, 2]', {}, "not a JSON object"),
    (b'{"outputs": []}\x00\x01\x02', {HEADER_LENGTH_HEADER: "15"}, None),
    (b'{"outputs": []}', {HEADER_LENGTH_HEADER: "99"}, "outside its body"),
    (b'{"outputs": []}', {HEADER_LENGTH_HEADER: "0"}, "outside its body"),
    (b'{"outputs": []}', {HEADER_LENGTH_HEADER: "x"}, "is not a number"),
    (b'{"outputs": []}\x00', {HEADER_LENGTH_HEADER: "16"}, "not a JSON object"),
    (b"\x1f\x8b compressed", {"Content-Encoding": "gzip"}, None),  # asked for by the caller: not looked into
])
def test_a_reply_is_judged_by_its_framing_alone(body: bytes, headers: dict[str, str], problem: str | None) -> None:
    found = framing_problem(Reply(200, headers, body))
    assert (found is None) if problem is None else (found is not None and problem in found), found
