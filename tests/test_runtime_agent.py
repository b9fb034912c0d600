"""runtime.dataplane.agent: the node agent's Open Inference Protocol data plane, control API, metrics, control-plane
contract and the ``edgemux agent`` command.

The agent runs a node with one emulated Edge TPU (the ibis-edgetpu/mobilenet_v2 profile: deterministic
4.91 ms) and one real CPU device (onnxruntime, squeezenet1_1 at 64x64 pixels). Servers run on 127.0.0.1
with ephemeral ports, either in a thread (for blocking clients: http.client, tritonclient) or inside
``asyncio.run`` with an aiohttp client (``_serving``). Nothing asserts wall-clock thresholds; every wait has a bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from edgemux.adapt.police import Policing
from edgemux.cluster.state import Device, Node
from edgemux.cluster.workload import Discipline
from edgemux.profiles.types import DeviceKind
from edgemux.runtime import zoo
from edgemux.runtime.auth import POLICED_HEADER, digest, new_app_key, new_token
from edgemux.runtime.dataplane.agent import Agent, AgentServer, make_app, start_server
from edgemux.runtime.dataplane.backends import EmulatedBackend
from edgemux.runtime.dataplane.protocol import DATATYPES, HEADER_LENGTH_HEADER
from edgemux.runtime.httpserver import Application, Request, Response, delete, post, put
from edgemux.runtime.httputil import Site, json_response, start_site

SIZE = 64  # squeezenet at 64x64 pixels: a real network that runs in a few ms
TPU_PROFILE = "ibis-edgetpu/mobilenet_v2"
TPU_MODEL = "zoo:mobilenet_v2@32"  # the emulated device only needs the tensors' shapes: keep them small
CPU_MODEL = f"zoo:squeezenet1_1@{SIZE}"
REPO = Path(__file__).resolve().parent.parent


@contextlib.asynccontextmanager
async def _serving(app: Application) -> AsyncIterator[aiohttp.ClientSession]:
    """``app`` served on an ephemeral port, and a client session whose relative URLs go to it; leaving
    stops the server (which runs the application's cleanup)."""
    site = await start_site(app, "127.0.0.1", 0, shutdown_timeout_s=10.0)
    try:
        async with aiohttp.ClientSession(site.url) as client:
            yield client
    finally:
        await site.stop()


def _node(*, cpu: bool = True) -> Node:
    devices = [Device("n1", "tpu0", DeviceKind.EDGETPU, Discipline.FCFS, 8.0, "ibis-edgetpu")]
    if cpu:
        devices.append(Device("n1", "cpu0", DeviceKind.CPU, Discipline.PS, 2048.0))
    return Node("n1", 4.0, 4096.0, tuple(devices))


# ------------------------------------------------------------------------------------------- helpers


class Served:
    """An agent served on 127.0.0.1 (ephemeral port) by an event loop in a thread, for blocking clients."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.loop = asyncio.new_event_loop()
        started: queue.Queue[AgentServer | BaseException] = queue.Queue()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            try:
                started.put(self.loop.run_until_complete(start_server(agent, "127.0.0.1", 0)))
            except BaseException as e:  # pragma: no cover - reported to the test
                started.put(e)
                return
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        got = started.get(timeout=30)
        if isinstance(got, BaseException):
            raise got
        self.server = got
        parsed = urllib.parse.urlsplit(got.url)
        self.host, self.port = parsed.hostname or "127.0.0.1", int(parsed.port or 0)
        self.hostport = f"{self.host}:{self.port}"
        self._conn: http.client.HTTPConnection | None = None

    def call(self, method: str, path: str, body: Any = None,
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        """One request on a kept-alive connection (reopened after an error): (status, headers, body).
        ``body``: bytes as they are, a str as UTF-8, anything else as JSON."""
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode("utf-8")
        for attempt in range(2):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
            try:
                self._conn.request(method, path, body=body, headers=headers or {})
                resp = self._conn.getresponse()
                data = resp.read()
                if resp.getheader("Connection", "").lower() == "close":
                    self._conn.close()
                    self._conn = None
                return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
            except (ConnectionError, http.client.HTTPException):
                self._conn.close()
                self._conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def json(self, method: str, path: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
        """One JSON exchange, with ``token`` as its bearer credential when given."""
        status, _, data = self.call(method, path, body, {"Authorization": f"Bearer {token}"} if token else None)
        return status, json.loads(data)

    def stop(self) -> None:
        if self._conn is not None:
            self._conn.close()
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


def _infer_json(x: np.ndarray, binary_output: bool = False) -> bytes:
    return json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": list(x.shape),
                                   "data": x.ravel().tolist()}],
                       "outputs": [{"name": "logits", "parameters": {"binary_data": binary_output}}]}).encode()


def _infer_binary(x: np.ndarray, binary_output: bool = True, name: str = "input",
                  datatype: str | None = None) -> tuple[bytes, dict[str, str]]:
    datatype = datatype or {np.dtype(np.float32): "FP32", np.dtype(np.uint8): "UINT8"}[x.dtype]
    blob = np.ascontiguousarray(x).tobytes()
    header = json.dumps({"inputs": [{"name": name, "datatype": datatype, "shape": list(x.shape),
                                     "parameters": {"binary_data_size": len(blob)}}],
                         "parameters": {"binary_data_output": binary_output}}).encode()
    return header + blob, {HEADER_LENGTH_HEADER: str(len(header)), "Content-Type": "application/octet-stream"}


def _decode_response(headers: dict[str, str], data: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    hlen = int(headers.get(HEADER_LENGTH_HEADER.lower(), len(data)))
    header = json.loads(data[:hlen])
    out: dict[str, np.ndarray] = {}
    offset = hlen
    for o in header["outputs"]:
        dtype = DATATYPES[o["datatype"]]
        if "data" in o:
            out[o["name"]] = np.array(o["data"], dtype=dtype).reshape(o["shape"])
        else:
            n = o["parameters"]["binary_data_size"]
            out[o["name"]] = np.frombuffer(data[offset:offset + n], dtype=dtype).reshape(o["shape"])
            offset += n
    return header, out


def _x(n: int, size: int = SIZE, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 3, size, size), dtype=np.float32)


def _tpu_x(n: int, size: int = 32, seed: int = 0) -> np.ndarray:
    """An image batch as an Edge TPU model takes it (uint8 pixels, NHWC): what the emulated TPU expects."""
    return np.random.default_rng(seed).integers(0, 256, (n, size, size, 3), dtype=np.uint8)


def _metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus samples as {(name, sorted labels): value}."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("zoo")


@pytest.fixture(scope="module")
def direct(cache: Path) -> Callable[[np.ndarray], np.ndarray]:
    """squeezenet through a plain onnxruntime session: what the agent's CPU device must return."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    session = ort.InferenceSession(str(zoo.path("squeezenet1_1", input_size=SIZE, cache_dir=cache)), opts,
                                   providers=["CPUExecutionProvider"])
    return lambda x: session.run(None, {"input": x})[0]


def _serve_with_apps(cache: Path, **kw: Any) -> Served:
    served = Served(Agent(_node(), cache_dir=str(cache), **kw))
    status, body = served.json("PUT", "/v1/apps/sq", {"device": "cpu0", "model": CPU_MODEL, "weight": 0.5})
    assert status == 201, body
    status, body = served.json("PUT", "/v1/apps/cam", {"device": "tpu0", "model": TPU_MODEL, "profile": TPU_PROFILE})
    assert status == 201, body
    return served


@pytest.fixture(scope="module")
def served(cache: Path) -> Any:
    s = _serve_with_apps(cache)
    yield s
    s.stop()


# ------------------------------------------------------------------------------------------ inference


def test_put_app_then_infer_json_and_binary_match_onnxruntime(served: Served, direct: Any) -> None:
    status, apps = served.json("GET", "/v1/apps")
    assert status == 200
    by_name = {a["app"]: a for a in apps["apps"]}
    assert by_name["sq"]["device"] == "cpu0" and by_name["sq"]["weight"] == 0.5 and not by_name["sq"]["emulated"]
    assert by_name["cam"]["emulated"] and by_name["cam"]["profile"] == TPU_PROFILE
    # idempotent: the same PUT again is 200 and changes nothing but the weight
    status, again = served.json("PUT", "/v1/apps/sq", {"device": "n1/cpu0", "model": CPU_MODEL, "weight": 0.5})
    assert status == 200 and again["model"] == f"zoo:squeezenet1_1@{SIZE}x{SIZE}"

    x = _x(2)
    want = direct(x)
    status, headers, data = served.call("POST", "/v2/models/sq/infer", _infer_json(x),
                                        {"Content-Type": "application/json"})
    assert status == 200, data
    header, out = _decode_response(headers, data)
    assert header["model_name"] == "sq" and header["model_version"] == "1"
    assert header["parameters"]["edgemux_device"] == "n1/cpu0" and header["parameters"]["edgemux_emulated"] is False
    np.testing.assert_allclose(out["logits"], want, rtol=1e-5, atol=1e-5)

    body, hdrs = _infer_binary(x)
    status, headers, data = served.call("POST", "/v2/models/sq/versions/1/infer", body, hdrs)
    assert status == 200, data
    assert HEADER_LENGTH_HEADER.lower() in headers
    _, out = _decode_response(headers, data)
    np.testing.assert_allclose(out["logits"], want, rtol=1e-5, atol=1e-5)

    # the emulated Edge TPU answers zeros of the declared shape, labelled as emulated
    body, hdrs = _infer_binary(_tpu_x(1, 32))
    status, headers, data = served.call("POST", "/v2/models/cam/infer", body, hdrs)
    assert status == 200, data
    header, out = _decode_response(headers, data)
    assert out["logits"].shape == (1, 1000) and not out["logits"].any()
    assert header["parameters"]["edgemux_emulated"] is True and header["parameters"]["edgemux_device"] == "n1/tpu0"


def test_health_and_metadata(served: Served) -> None:
    assert served.call("GET", "/v2/health/live")[0] == 200
    assert served.call("GET", "/v2/health/ready")[0] == 200
    status, meta = served.json("GET", "/v2")
    assert status == 200 and meta["name"] == "edgemux-agent" and "binary_tensor_data" in meta["extensions"]
    status, md = served.json("GET", "/v2/models/sq")
    assert status == 200 and md["platform"] == "onnxruntime" and md["versions"] == ["1"]
    assert md["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 3, SIZE, SIZE]}]
    assert md["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 1000]}]
    status, md = served.json("GET", "/v2/models/cam/versions/1")
    assert status == 200 and md["platform"] == "emulated"
    assert served.call("GET", "/v2/models/cam/ready")[0] == 200
    status, err = served.json("GET", "/v2/models/cam/versions/7/ready")
    assert status == 404 and "no version '7'" in err["error"]
    status, node = served.json("GET", "/v1/node")
    devs = {d["name"]: d for d in node["devices"]}
    assert devs["tpu0"]["emulated"] and devs["tpu0"]["kind"] == "edgetpu" and devs["tpu0"]["discipline"] == "fcfs"
    assert not devs["cpu0"]["emulated"] and devs["cpu0"]["backend"] == "onnxruntime"
    assert [m["model"] for m in devs["cpu0"]["loaded_models"]] == [f"zoo:squeezenet1_1@{SIZE}x{SIZE}"]
    assert {"queue_depth", "utilization", "inflight"} <= set(devs["tpu0"])


def test_tritonclient_works_unmodified(served: Served, direct: Any) -> None:
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    client = httpclient.InferenceServerClient(url=served.hostport, connection_timeout=30, network_timeout=30)
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("sq") and client.is_model_ready("cam")
        assert not client.is_model_ready("nope")
        assert client.get_server_metadata()["name"] == "edgemux-agent"
        md = client.get_model_metadata("sq")
        assert md["inputs"][0]["shape"] == [-1, 3, SIZE, SIZE]
        x = _x(3, seed=7)
        want = direct(x)
        for binary in (True, False):
            inp = httpclient.InferInput("input", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=binary)
            out = httpclient.InferRequestedOutput("logits", binary_data=binary)
            result = client.infer("sq", [inp], outputs=[out], request_id=f"r-{binary}")
            np.testing.assert_allclose(result.as_numpy("logits"), want, rtol=1e-5, atol=1e-5)
            assert result.get_response()["id"] == f"r-{binary}"
        inp = httpclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        result = client.infer("sq", [inp], model_version="1")  # no outputs named: all, as binary
        np.testing.assert_allclose(result.as_numpy("logits"), want, rtol=1e-5, atol=1e-5)
        tpu_in = httpclient.InferInput("input", [1, 32, 32, 3], "UINT8")
        tpu_in.set_data_from_numpy(_tpu_x(1, 32))
        assert client.infer("cam", [tpu_in]).as_numpy("logits").shape == (1, 1000)
        with pytest.raises(InferenceServerException) as e:
            client.infer("nope", [inp])
        assert "unknown app 'nope'" in e.value.message()
        bad = httpclient.InferInput("input", [1, 3, 32, 32], "FP32")
        bad.set_data_from_numpy(_x(1, 32))
        with pytest.raises(InferenceServerException) as e:
            client.infer("sq", [bad])
        assert "unexpected shape for input 'input'" in e.value.message()
    finally:
        client.close()


def test_bad_inputs_are_4xx_with_reasons(served: Served) -> None:
    cases: list[tuple[str, bytes, dict[str, str], int, str]] = [
        ("sq", b'{"inputs": [', {}, 400, "malformed request JSON"),
        ("sq", b"\xff\xfe", {}, 400, "invalid UTF-8"),
        ("sq", _infer_json(_x(1, 32)), {}, 400, "unexpected shape for input 'input': expected [-1,3,64,64], got [1,3,32,32]"),
        ("sq", _infer_binary(np.zeros((1, 3, SIZE, SIZE), np.int32), datatype="INT32")[0],
         _infer_binary(np.zeros((1, 3, SIZE, SIZE), np.int32), datatype="INT32")[1], 400,
         "unexpected datatype for input 'input': expected FP32, got INT32"),
        ("sq", _infer_binary(_x(1), name="image")[0], _infer_binary(_x(1), name="image")[1], 400, "unexpected input 'image'"),
        ("sq", json.dumps({"inputs": []}).encode(), {}, 400, "missing input 'input'"),
        ("sq", json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3, SIZE, SIZE],
                                       "data": [1.0]}]}).encode(), {}, 400, "'data' has 1 elements"),
        ("sq", json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3, SIZE, SIZE],
                                       "data": [0.0] * (3 * SIZE * SIZE)}], "outputs": [{"name": "probs"}]}).encode(),
         {}, 400, "unexpected output 'probs'"),
        ("sq", json.dumps({"inputs": [], "parameters": {"timeout": "soon"}}).encode(), {}, 400, "missing input"),
        ("nope", _infer_json(_x(1)), {}, 404, "unknown app 'nope'"),
    ]
    for app, body, headers, want_status, want_text in cases:
        status, hdrs, data = served.call("POST", f"/v2/models/{app}/infer", body, headers)
        assert status == want_status, (want_text, data)
        assert hdrs["content-type"].startswith("application/json")
        assert want_text in json.loads(data)["error"], data
    status, err = served.json("GET", "/v2/models/sq/infer")
    assert status == 405 and "not allowed" in err["error"]
    status, err = served.json("GET", "/v2/nothing/here")
    assert status == 404 and "no such endpoint" in err["error"]


def test_control_errors_name_the_problem(served: Served, tmp_path: Path) -> None:
    garbage = tmp_path / "not-a-model.onnx"
    garbage.write_bytes(b"definitely not protobuf \x00\x01")
    cases: list[tuple[Any, int, str]] = [
        ({"device": "tpu9", "model": TPU_MODEL, "profile": TPU_PROFILE}, 404, "unknown device 'tpu9' on node n1"),
        ({"device": "tpu0", "model": TPU_MODEL, "profile": "ibis-edgetpu/nope"}, 404, "unknown profile"),
        ({"device": "tpu0", "model": TPU_MODEL}, 400, "device n1/tpu0 is emulated: the app spec needs a 'profile'"),
        ({"device": "cpu0", "model": CPU_MODEL, "profile": TPU_PROFILE}, 400, "is for edgetpu devices"),
        ({"device": "cpu0", "model": "zoo:alexnet"}, 404, "unknown zoo model 'alexnet'"),
        ({"device": "cpu0", "model": "zoo:squeezenet1_1@big"}, 400, "bad input size"),
        ({"device": "cpu0", "model": "zoo:squeezenet1_1@8"}, 400, "too small"),
        ({"device": "cpu0", "model": str(tmp_path / "missing.onnx")}, 404, "does not exist"),
        ({"device": "cpu0", "model": str(garbage)}, 400, "cannot load model"),
        ({"device": "tpu0", "model": str(garbage), "profile": TPU_PROFILE}, 400, "cannot load model"),
        ({"device": "cpu0", "model": CPU_MODEL, "weight": 0}, 400, "'weight' must be a number in (0, 1]"),
        ({"device": "cpu0", "model": CPU_MODEL, "wieght": 1}, 400, "unknown field 'wieght'"),
        ({"model": CPU_MODEL}, 400, "missing field 'device'"),
        ({"device": "cpu0", "model": 3}, 400, "'model' must be a non-empty string"),
        ([1, 2], 400, "must be a JSON object"),
        ({"device": "cpu0", "model": CPU_MODEL, "rate_rps": 0}, 400, "'rate_rps' must be a number > 0 (req/s)"),
        ({"device": "cpu0", "model": CPU_MODEL, "rate_rps": 5, "burst": 0.5}, 400,
         "'burst' must be a number >= 1 (requests)"),
        ({"device": "cpu0", "model": CPU_MODEL, "burst": 3}, 400, "'burst' without 'rate_rps'"),
    ]
    for spec, want_status, want_text in cases:
        status, err = served.json("PUT", "/v1/apps/other", spec)
        assert status == want_status, (spec, err)
        assert want_text in err["error"], (spec, err)
    status, _, data = served.call("PUT", "/v1/apps/other", b"{nope")
    assert status == 400 and "malformed app spec JSON" in json.loads(data)["error"]
    status, err = served.json("PUT", "/v1/apps/bad%20name", {"device": "cpu0", "model": CPU_MODEL})
    assert status == 400 and "bad app name" in err["error"]
    status, err = served.json("DELETE", "/v1/apps/other")
    assert status == 404 and "unknown app 'other'" in err["error"]
    assert served.json("GET", "/v1/apps/other")[0] == 404


def test_the_agent_polices_a_client_that_bypasses_the_gateway(cache: Path) -> None:
    """An app whose pieces carry a contract is policed by the agent itself, with the gateway's rule
    (``adapt.police.Policing``; exact here: 1 req/s, burst 2, no waiting): the third immediate request is a
    429 naming the contract, with Retry-After, counted as refused in the observations; a new contract
    (re-PUT, same model: nothing reloads) is policed at once, and a piece without one is not policed."""
    served = Served(Agent(_node(cpu=False), cache_dir=str(cache), policing=Policing.exact(max_wait_s=0.0)))
    try:
        spec = {"device": "tpu0", "model": TPU_MODEL, "profile": TPU_PROFILE, "rate_rps": 1.0, "burst": 2}
        status, body = served.json("PUT", "/v1/apps/cam", spec)
        assert status == 201 and body["rate_rps"] == 1.0 and body["burst"] == 2.0, body
        req, hdrs = _infer_binary(_tpu_x(1, 32))
        assert [served.call("POST", "/v2/models/cam/infer", req, hdrs)[0] for _ in range(2)] == [200, 200]
        status, headers, data = served.call("POST", "/v2/models/cam/infer", req, hdrs)
        assert status == 429 and headers["retry-after"] == "1", data
        assert "over its contract on this agent" in json.loads(data)["error"]
        counts = served.agent.tally.observations().apps["cam"]
        assert (counts.arrivals, counts.refused, counts.latency.count) == (3, 1, 2)
        # an open agent believes every caller: a gateway's mark is enough (policed and counted there)
        assert served.call("POST", "/v2/models/cam/infer", req, {**hdrs, POLICED_HEADER: "gateway"})[0] == 200
        assert served.agent.tally.observations().apps["cam"].arrivals == 3
        # a larger contract (the adapt loop re-admitted the app): more tokens at once
        assert served.json("PUT", "/v1/apps/cam", {**spec, "rate_rps": 1000.0, "burst": 50})[0] == 200
        time.sleep(0.01)
        assert served.call("POST", "/v2/models/cam/infer", req, hdrs)[0] == 200
        # no contract: not policed here (an agent used on its own)
        assert served.json("PUT", "/v1/apps/cam", {k: v for k, v in spec.items() if k not in ("rate_rps", "burst")})[0] == 200
        assert {served.call("POST", "/v2/models/cam/infer", req, hdrs)[0] for _ in range(5)} == {200}
    finally:
        served.stop()


def test_a_gateways_request_is_policed_and_counted_once_at_the_gateway(cache: Path) -> None:
    """A request with a gateway's mark (``POLICED_HEADER``) and the admin token was policed and counted at the
    gateway: the agent neither holds it to the contract nor counts it in its observations (the control plane
    reads the gateway's), it only takes the request's token, so that a client calling the agent directly gets
    what the gateway's traffic left of the contract; its execution is still measured (the profile's
    service-time moments, which calibration reads). The mark with an app key counts for nothing: that
    request is policed and counted like any other. (1 req/s, burst 2, exact, no waiting.)"""
    token, key = new_token(), new_app_key()
    served = Served(Agent(_node(cpu=False), cache_dir=str(cache), policing=Policing.exact(max_wait_s=0.0),
                          token=token))
    try:
        spec = {"device": "tpu0", "model": TPU_MODEL, "profile": TPU_PROFILE, "rate_rps": 1.0, "burst": 2,
                "key_sha256": digest(key)}
        assert served.json("PUT", "/v1/apps/cam", spec, token=token)[0] == 201
        req, hdrs = _infer_binary(_tpu_x(1, 32))
        admin, keyed = {**hdrs, "Authorization": f"Bearer {token}"}, {**hdrs, "Authorization": f"Bearer {key}"}
        marked = {**admin, POLICED_HEADER: "gateway"}
        assert [served.call("POST", "/v2/models/cam/infer", req, marked)[0] for _ in range(4)] == [200] * 4
        def executions() -> int:  # what calibration reads: with and without a model switch (the first)
            seen = served.agent.tally.observations().profiles[TPU_PROFILE]
            return seen.exec.n + seen.switched.n

        assert "cam" not in served.agent.tally.observations().apps and executions() == 4
        # the gateway's requests took the bucket's tokens: a direct request finds none, and is counted
        status, headers, data = served.call("POST", "/v2/models/cam/infer", req, keyed)
        assert status == 429 and "over its contract on this agent" in json.loads(data)["error"], data
        assert served.call("POST", "/v2/models/cam/infer", req, {**keyed, POLICED_HEADER: "gateway"})[0] == 429
        assert served.call("POST", "/v2/models/cam/infer", req, admin)[0] == 429  # the admin token alone: direct
        counts = served.agent.tally.observations().apps["cam"]
        assert (counts.arrivals, counts.refused) == (3, 3) and executions() == 4
    finally:
        served.stop()


def test_delete_unloads_a_model_only_when_unused(served: Served) -> None:
    spec = {"device": "tpu0", "model": "zoo:squeezenet1_1@32", "profile": TPU_PROFILE}
    key = "zoo:squeezenet1_1@32x32"
    assert served.json("PUT", "/v1/apps/shared-a", spec)[0] == 201
    assert served.json("PUT", "/v1/apps/shared-b", {**spec, "weight": 0.25})[0] == 201  # AI as a Service

    def loaded() -> dict[str, list[str]]:
        node = served.json("GET", "/v1/node")[1]
        tpu = next(d for d in node["devices"] if d["name"] == "tpu0")
        return {m["model"]: m["apps"] for m in tpu["loaded_models"]}

    assert loaded()[key] == ["shared-a", "shared-b"]
    body, hdrs = _infer_binary(_tpu_x(1, 32))
    assert served.call("POST", "/v2/models/shared-b/infer", body, hdrs)[0] == 200
    status, gone = served.json("DELETE", "/v1/apps/shared-a")
    assert status == 200 and gone == {"app": "shared-a", "device": "tpu0", "model": key, "unloaded": False}
    assert loaded()[key] == ["shared-b"]
    assert served.call("POST", "/v2/models/shared-b/infer", body, hdrs)[0] == 200  # still served
    assert served.call("POST", "/v2/models/shared-a/infer", body, hdrs)[0] == 404
    status, gone = served.json("DELETE", "/v1/apps/shared-b")
    assert status == 200 and gone["unloaded"] is True
    assert key not in loaded()
    assert "zoo:mobilenet_v2@32x32" in loaded()  # the other app's model is untouched

    # moving an app: the new model is loaded, the old one released (it had no other user)
    assert served.json("PUT", "/v1/apps/mover", spec)[0] == 201
    status, moved = served.json("PUT", "/v1/apps/mover", {**spec, "model": "zoo:squeezenet1_1@48"})
    assert status == 200 and moved["model"] == "zoo:squeezenet1_1@48x48"
    assert key not in loaded() and "zoo:squeezenet1_1@48x48" in loaded()
    # the same model under another profile: another model on the device (its own timing), moved to
    status, moved = served.json("PUT", "/v1/apps/mover", {**spec, "model": "zoo:squeezenet1_1@48",
                                                          "profile": "ibis-edgetpu/mobilenet_v1"})
    assert status == 200 and moved["profile"] == "ibis-edgetpu/mobilenet_v1"
    assert served.json("DELETE", "/v1/apps/mover")[1]["unloaded"] is True

    # two profiles on one graph side by side (two catalog models sharing a stand-in graph)
    v2 = {**spec, "model": "zoo:squeezenet1_1@48", "profile": "ibis-edgetpu/mobilenet_v2"}
    v1 = {**v2, "profile": "ibis-edgetpu/mobilenet_v1"}
    assert served.json("PUT", "/v1/apps/as-v2", v2)[0] == 201
    assert served.json("PUT", "/v1/apps/as-v1", v1)[0] == 201
    node = served.json("GET", "/v1/node")[1]
    tpu = next(d for d in node["devices"] if d["name"] == "tpu0")
    both = {(m["model"], m["profile"]): m["apps"] for m in tpu["loaded_models"]}
    assert both[("zoo:squeezenet1_1@48x48", "ibis-edgetpu/mobilenet_v2")] == ["as-v2"]
    assert both[("zoo:squeezenet1_1@48x48", "ibis-edgetpu/mobilenet_v1")] == ["as-v1"]
    body48, hdrs48 = _infer_binary(_tpu_x(1, 48))
    for app in ("as-v1", "as-v2"):
        assert served.call("POST", f"/v2/models/{app}/infer", body48, hdrs48)[0] == 200


def test_metrics_count_requests_per_app_and_label_emulated_devices(served: Served) -> None:
    body, hdrs = _infer_binary(_x(1))
    for _ in range(3):
        assert served.call("POST", "/v2/models/sq/infer", body, hdrs)[0] == 200
    assert served.call("POST", "/v2/models/sq/infer", b"{", {})[0] == 400
    assert served.call("POST", "/v2/models/ghost/infer", body, hdrs)[0] == 404
    status, headers, text = served.call("GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    m = _metrics(text.decode())
    assert m[("edgemux_requests_total", (("app", "sq"), ("code", "200"), ("device", "n1/cpu0")))] >= 3
    assert m[("edgemux_requests_total", (("app", "sq"), ("code", "400"), ("device", "n1/cpu0")))] >= 1
    assert m[("edgemux_rejections_total", (("app", "sq"), ("reason", "bad_request")))] >= 1
    assert m[("edgemux_request_latency_seconds_count", (("app", "sq"), ("device", "n1/cpu0")))] >= 3
    assert m[("edgemux_queue_wait_seconds_count", (("app", "sq"), ("device", "n1/cpu0")))] >= 3
    assert m[("edgemux_unknown_app_requests_total", ())] >= 1
    assert m[("edgemux_device_info", (("backend", "emulated"), ("device", "n1/tpu0"), ("discipline", "fcfs"),
                                      ("emulated", "true"), ("kind", "edgetpu")))] == 1
    assert m[("edgemux_device_info", (("backend", "onnxruntime"), ("device", "n1/cpu0"), ("discipline", "ps"),
                                      ("emulated", "false"), ("kind", "cpu")))] == 1
    assert m[("edgemux_device_loaded_models", (("device", "n1/cpu0"),))] == 1
    assert 0 <= m[("edgemux_device_utilization", (("device", "n1/cpu0"), ("emulated", "false")))] <= 1


# ------------------------------------------------------------------- overload, timeout, body limit


class _Gate:
    """An emulated backend's sleep that blocks until released: an execution stays in flight on demand."""

    def __init__(self) -> None:
        self.open = threading.Event()

    def sleep(self, _s: float) -> None:
        self.open.wait(20)


def test_overload_timeout_and_body_limit_are_explicit() -> None:
    gate = _Gate()
    agent = Agent(_node(cpu=False), backends={"tpu0": EmulatedBackend(sleep=gate.sleep)}, max_queue=1,
                  max_body_bytes=20_000)

    async def scenario() -> None:
        async with _serving(make_app(agent)) as client:
            r = await client.put("/v1/apps/g", json={"device": "tpu0", "model": TPU_MODEL, "profile": TPU_PROFILE})
            assert r.status == 201, await r.text()
            x = _tpu_x(1, 32)
            body, hdrs = _infer_binary(x)

            first = asyncio.ensure_future(client.post("/v2/models/g/infer", data=body, headers=hdrs))
            worker = agent.workers["tpu0"]
            for _ in range(2000):  # until the first request executes (blocked in the gated backend)
                if worker.stats()["inflight"] == 1:
                    break
                await asyncio.sleep(0.005)
            assert worker.stats()["inflight"] == 1

            # queued behind it, with a 0.2 s timeout of its own (tritonclient's `timeout`, microseconds)
            header = json.loads(body[:int(hdrs[HEADER_LENGTH_HEADER])])
            header["parameters"]["timeout"] = 200_000
            h2 = json.dumps(header).encode()
            r = await client.post("/v2/models/g/infer", data=h2 + body[int(hdrs[HEADER_LENGTH_HEADER]):],
                                  headers={HEADER_LENGTH_HEADER: str(len(h2))})
            assert r.status == 504
            assert "no result within 0.2 s" in (await r.json())["error"]

            # the timed-out request still holds the only queue slot until the device reaches it: full
            r = await client.post("/v2/models/g/infer", data=body, headers=hdrs)
            assert r.status == 503
            assert int(r.headers["Retry-After"]) >= 1
            assert "requests queued" in (await r.json())["error"]

            # 413 from Content-Length, before reading the body; and while reading a chunked one
            r = await client.post("/v2/models/g/infer", data=b"x" * 30_000)
            assert r.status == 413 and "exceeds the limit of 20000 bytes" in (await r.json())["error"]

            async def chunks() -> Any:
                for _ in range(30):
                    yield b"y" * 1000

            r = await client.post("/v2/models/g/infer", data=chunks())
            assert r.status == 413 and "exceeds the limit" in (await r.json())["error"]

            gate.open.set()
            r = await first
            assert r.status == 200

            r = await client.get("/metrics")
            m = _metrics(await r.text())
            for reason in ("queue_full", "timeout", "too_large"):
                assert m[("edgemux_rejections_total", (("app", "g"), ("reason", reason)))] >= 1, reason
            assert m[("edgemux_requests_total", (("app", "g"), ("code", "503"), ("device", "n1/tpu0")))] == 1
            assert m[("edgemux_requests_total", (("app", "g"), ("code", "504"), ("device", "n1/tpu0")))] == 1
        # leaving the client ran on_cleanup: the agent drained and stopped
        assert agent.workers["tpu0"].closed and not agent.ready

    try:
        asyncio.run(asyncio.wait_for(scenario(), 60))
    finally:
        gate.open.set()
        agent.close(drain=False, timeout_s=5)


def test_graceful_close_drains_in_flight_requests() -> None:
    gate = _Gate()
    agent = Agent(_node(cpu=False), backends={"tpu0": EmulatedBackend(sleep=gate.sleep)})

    async def scenario() -> None:
        site = await start_site(make_app(agent), "127.0.0.1", 0)
        client = aiohttp.ClientSession(site.url)
        r = await client.put("/v1/apps/g", json={"device": "tpu0", "model": TPU_MODEL, "profile": TPU_PROFILE})
        assert r.status == 201
        body, hdrs = _infer_binary(_tpu_x(1, 32))
        pending = [asyncio.ensure_future(client.post("/v2/models/g/infer", data=body, headers=hdrs)) for _ in range(3)]
        for _ in range(2000):
            st = agent.workers["tpu0"].stats()
            if st["inflight"] + st["queued"] == 3:
                break
            await asyncio.sleep(0.005)
        asyncio.get_running_loop().call_later(0.05, gate.open.set)
        closing = asyncio.ensure_future(agent.aclose(drain=True))
        results = await asyncio.gather(*pending)
        assert [r.status for r in results] == [200, 200, 200]  # nothing queued was dropped
        assert await closing is True
        await client.close()
        await site.stop()

    try:
        asyncio.run(asyncio.wait_for(scenario(), 60))
    finally:
        gate.open.set()
        agent.close(drain=False, timeout_s=5)


# ---------------------------------------------------------------------------------------------- fuzz


@pytest.fixture(scope="module")
def fuzz_served(cache: Path) -> Any:
    s = _serve_with_apps(cache)
    yield s
    s.stop()


_json_leaf = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
              | st.text(max_size=8))
_json = st.recursive(_json_leaf, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                     max_leaves=16)
_tensor = st.fixed_dictionaries(
    {"name": st.sampled_from(["input", "logits", ""]) | st.text(max_size=6),
     "datatype": st.sampled_from([*DATATYPES, "FP8", "fp32"]),
     "shape": st.lists(st.integers(-2, 70), max_size=5)},
    optional={"data": _json | st.lists(st.floats(width=32) | st.integers(-300, 300), max_size=30),
              "parameters": st.fixed_dictionaries({}, optional={"binary_data_size": st.integers(-5, 64) | _json,
                                                                "binary_data": _json})})
_request = st.fixed_dictionaries(
    {"inputs": st.lists(_tensor, max_size=3)},
    optional={"outputs": st.lists(st.fixed_dictionaries({"name": st.sampled_from(["logits", "x"])},
                                                        optional={"parameters": _json}), max_size=2) | _json,
              "parameters": st.dictionaries(st.sampled_from(["binary_data_output", "timeout", "x"]), _json, max_size=2),
              "id": _json})


@st.composite
def _near_valid(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str]]:
    """(app, body, headers): a correct binary request for one of the apps, often damaged (shape, datatype,
    sizes, header length, trailing bytes)."""
    app, app_size = draw(st.sampled_from([("sq", SIZE), ("cam", 32)]))
    n = draw(st.integers(1, 2))
    shape = [n, 3, app_size, app_size]
    if draw(st.booleans()):
        shape[draw(st.integers(0, 3))] = draw(st.integers(0, 70))
    datatype = draw(st.sampled_from(["FP32", "FP32", "FP32", "FP16", "INT64", "BYTES", "BOOL"]))
    count = int(np.prod(shape))
    blob = b"\x00" * (count * (DATATYPES[datatype].itemsize if datatype != "BYTES" else 4))
    blob = blob[: draw(st.integers(0, len(blob)))] if draw(st.sampled_from([False, False, False, True])) else blob
    size = draw(st.just(len(blob)) | st.just(len(blob)) | st.integers(-3, len(blob) + 3))
    header = json.dumps({"inputs": [{"name": "input", "datatype": datatype, "shape": shape,
                                     "parameters": {"binary_data_size": size}}],
                         "parameters": {"binary_data_output": draw(st.booleans())}}).encode()
    hlen = draw(st.just(str(len(header))) | st.just(str(len(header))) | st.integers(-2, len(header) + 8).map(str)
                | st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=4))
    tail = draw(st.just(b"") | st.binary(max_size=4))
    return app, header + blob + tail, {HEADER_LENGTH_HEADER: hlen}


_segment = st.sampled_from(["v2", "v1", "models", "apps", "infer", "ready", "versions", "health", "live", "metrics",
                            "node", "sq", "cam", "1"]) | st.text(min_size=1, max_size=8)


def _quote(seg: str) -> str:
    return urllib.parse.quote(seg, safe="")


def _assert_clean(status: int, headers: dict[str, str], data: bytes) -> None:
    assert status < 500, (status, data[:300])
    if status >= 400:
        assert headers["content-type"].startswith("application/json")
        assert isinstance(json.loads(data)["error"], str)


_FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)


_random_payload = st.one_of(
    st.binary(max_size=300).map(lambda b: (b, {})),
    _json.map(lambda v: (json.dumps(v).encode(), {})),
    _request.map(lambda v: (json.dumps(v).encode(), {})),
    st.tuples(_request.map(lambda v: json.dumps(v).encode()), st.binary(max_size=64),
              st.integers(-2, 400)).map(lambda t: (t[0] + t[1], {HEADER_LENGTH_HEADER: str(t[2])})))


@st.composite
def _infer_case(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str]]:
    """(path, body, headers) of an inference request: mostly for a real app, sometimes for a random name
    or version."""
    # sampled_from with the common case first: hypothesis leans towards the first element and towards 0
    if draw(st.sampled_from(["near-valid", "random", "near-valid"])) == "near-valid":
        app, body, headers = draw(_near_valid())
    else:
        app = draw(st.sampled_from(["sq", "cam"]))
        body, headers = draw(_random_payload)
    if draw(st.sampled_from([False, False, False, False, False, True])):
        app = draw(st.text(min_size=1, max_size=10))
    version = draw(st.sampled_from([None, None, None, "1", "1", None, None, "2", "x"]))
    path = f"/v2/models/{_quote(app)}" + (f"/versions/{_quote(version)}" if version else "") + "/infer"
    return path, body, headers


@_FUZZ
@given(case=_infer_case())
def test_fuzz_infer_never_5xx(fuzz_served: Served, case: tuple[str, bytes, dict[str, str]]) -> None:
    path, body, headers = case
    _assert_clean(*fuzz_served.call("POST", path, body, headers))


_spec_values = st.fixed_dictionaries(
    {},
    optional={"device": st.sampled_from(["tpu0", "cpu0", "n1/tpu0", "gpu9", ""]) | _json,
              "model": st.sampled_from([CPU_MODEL, TPU_MODEL, "zoo:nosuch", "zoo:squeezenet1_1@x",
                                        "zoo:squeezenet1_1@8", "zoo:", "/nonexistent/m.onnx", ""]) | _json,
              "profile": st.sampled_from([TPU_PROFILE, "microedge/bodypix", "nope/x", None]) | _json,
              "weight": st.sampled_from([0.5, 1, 0, -1, 2]) | _json,
              "extra": _json})


_spec_plausible = st.fixed_dictionaries(
    {"device": st.sampled_from(["tpu0", "cpu0", "n1/tpu0"]),
     "model": st.sampled_from([CPU_MODEL, TPU_MODEL, "zoo:squeezenet1_1@32", "zoo:nosuch", "zoo:squeezenet1_1@8"])},
    optional={"profile": st.sampled_from([TPU_PROFILE, "ibis-edgetpu/mobilenet_v1", "microedge/bodypix"]),
              "weight": st.sampled_from([0.5, 1, 0, 2])})


@_FUZZ
@given(method=st.sampled_from(["GET", "PUT", "DELETE", "POST", "PATCH"]),
       target=st.one_of(st.text(min_size=1, max_size=12).map(lambda a: f"/v1/apps/{_quote(a)}"),
                        st.sampled_from(["fz1", "fz2", "sq"]).map(lambda a: f"/v1/apps/{a}"),
                        st.lists(_segment, min_size=0, max_size=6).map(lambda s: "/" + "/".join(map(_quote, s)))),
       body=st.one_of(st.none(), st.binary(max_size=200), _json.map(lambda v: json.dumps(v).encode()),
                      _spec_values.map(lambda v: json.dumps(v).encode()),
                      _spec_plausible.map(lambda v: json.dumps(v).encode())))
def test_fuzz_control_and_paths_never_5xx(fuzz_served: Served, method: str, target: str, body: bytes | None) -> None:
    _assert_clean(*fuzz_served.call(method, target, body))


# ------------------------------------------------------------------------------ control-plane contract


class _FakeControlPlane:
    """Records the agent's messages; answers PUT with 404 for a node it has not seen registered (as a
    control plane that lost its state would)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, Any]] = []
        self.known: set[str] = set()
        self.site: Site | None = None

    async def handle(self, request: Request) -> Response:
        node = request.match_info["node"]
        body = await request.json() if request.can_read_body else None
        self.seen.append((request.method, node, body))
        if request.method == "POST":
            self.known.add(node)
            return json_response({"ok": True}, 201)
        if request.method == "PUT" and node not in self.known:
            return json_response({"error": "unknown agent"}, 404)
        if request.method == "DELETE":
            self.known.discard(node)
        return json_response({"ok": True})

    async def start(self, port: int = 0) -> int:
        path = "/v1/agents/{node}"
        app = Application([post(path, self.handle), put(path, self.handle), delete(path, self.handle)])
        self.site = await start_site(app, "127.0.0.1", port)
        return int(self.site.server.addresses[0][1])

    async def stop(self) -> None:
        assert self.site is not None
        await self.site.stop()

    def methods(self) -> list[str]:
        return [m for m, _, _ in self.seen]


async def _until(cond: Callable[[], bool], what: str, limit_s: float = 20.0) -> None:
    deadline = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def test_controlplane_register_heartbeat_reregister_and_outage() -> None:
    async def scenario() -> None:
        cp = _FakeControlPlane()
        port = await cp.start()
        agent = Agent(_node(cpu=False), controlplane_url=f"http://127.0.0.1:{port}/", heartbeat_s=0.05)
        server = await start_server(agent)
        try:
            await _until(lambda: cp.methods().count("PUT") >= 2, "two heartbeats")
            method, node, body = cp.seen[0]
            assert (method, node) == ("POST", "n1")
            assert body["url"] == server.url and body["node"] == "n1" and body["apps"] == []
            assert body["incarnation"] == agent.incarnation and body["heartbeat_s"] == 0.05
            assert [d["name"] for d in body["devices"]] == ["tpu0"] and body["devices"][0]["emulated"] is True
            # the control plane forgets the agent: the next heartbeat is 404 and the agent registers again
            cp.known.clear()
            await _until(lambda: cp.methods().count("POST") >= 2, "re-registration")
            # the control plane goes down: the agent serves on and keeps retrying
            await cp.stop()
            assert agent.link is not None
            await _until(lambda: agent.link is not None and agent.link.last_error is not None, "a failed heartbeat")
            async with aiohttp.ClientSession() as s:
                async with s.put(f"{server.url}/v1/apps/cam", json={"device": "tpu0", "model": TPU_MODEL,
                                                                    "profile": TPU_PROFILE}) as r:
                    assert r.status == 201
                data, hdrs = _infer_binary(_tpu_x(1, 32))
                async with s.post(f"{server.url}/v2/models/cam/infer", data=data, headers=hdrs) as r:
                    assert r.status == 200
                async with s.get(f"{server.url}/v2/health/ready") as r:
                    assert r.status == 200
            # it comes back (without its state): the agent's heartbeat is refused, it registers with its apps
            cp2 = _FakeControlPlane()
            await cp2.start(port)
            cp = cp2
            await _until(lambda: "POST" in cp2.methods(), "registration with the restarted control plane")
            post = next(b for m, _, b in cp2.seen if m == "POST")
            assert [a["app"] for a in post["apps"]] == ["cam"]
            await _until(lambda: agent.link is not None and agent.link.last_error is None, "recovery")
        finally:
            await server.stop()
        assert cp.methods()[-1] == "DELETE"  # graceful stop deregisters
        await cp.stop()

    asyncio.run(asyncio.wait_for(scenario(), 90))


# ----------------------------------------------------------------------------------------------- CLI


CLUSTER_YAML = """\
apiVersion: edgemux/v1alpha1
kind: Cluster
metadata: {name: lab}
spec:
  nodes:
    - name: n1
      cpuCores: 4
      memoryMb: 4096
      devices:
        - {name: tpu0, kind: edgetpu, memoryMb: 8, profiles: ibis-edgetpu}
        - {name: cpu0, kind: cpu, memoryMb: 2048}
"""


def _cli(tmp_path: Path, *args: str) -> list[str]:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER_YAML, encoding="utf-8")
    return [sys.executable, "-m", "edgemux", "agent", "--cluster", str(cluster), *args]


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["EDGEMUX_CACHE"] = str(tmp_path / "cache")
    env["PYTHONPATH"] = str(REPO / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_cli_bad_node_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run(_cli(tmp_path, "--node", "nope"), capture_output=True, text=True, timeout=60,
                          env=_env(tmp_path))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown node 'nope' (known: n1)" in lines[0], proc.stderr


@pytest.mark.parametrize("args, text", [
    (["--max-body-mb", "0"], "--max-body-mb: must be > 0"),
    (["--threads", "0"], "--threads: must be >= 1"),
    (["--port", "70000"], "--port: must be in 0..65535"),
    (["--controlplane", "ftp://x"], "controlplane_url: expected http://HOST:PORT"),
    (["--backend", "tpu0"], "--backend: expected DEVICE=KIND, got 'tpu0'"),
    (["--backend", "tpu0=tensorrt"], "unknown backend 'tensorrt' (known: cuda, edgetpu, emulated, litert, onnxruntime)"),
    (["--backend", "gpu9=emulated"], "--backend: unknown device 'gpu9' on node n1 (devices: cpu0, tpu0)"),
    (["--backend", "tpu0=emulated", "--backend", "tpu0=litert"], "device 'tpu0' is given twice"),
])
def test_cli_bad_arguments_are_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   args: list[str], text: str) -> None:
    from edgemux.cli.main import main

    assert main(_cli(tmp_path, "--node", "n1", *args)[3:]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and text in err[0], err


def test_cli_a_device_declared_a_real_edge_tpu_without_libedgetpu_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ai_edge_litert")
    from edgemux.cli.main import main
    from edgemux.runtime.dataplane.litert import edgetpu_delegate_available

    if edgetpu_delegate_available()[0]:
        pytest.skip("libedgetpu loads on this host")
    assert main(_cli(tmp_path, "--node", "n1", "--backend", "tpu0=edgetpu")[3:]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--backend: tpu0: the Edge TPU runtime libedgetpu.so.1 does not load" in err[0], err


def test_cli_serves_and_stops_gracefully_on_sigterm(tmp_path: Path) -> None:
    proc = subprocess.Popen(_cli(tmp_path, "--node", "n1", "--port", "0"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(tmp_path))
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(proc.stdout.readline() if proc.stdout else ""), daemon=True).start()
    try:
        line = lines.get(timeout=60).strip()
        assert line.startswith("agent n1 listening on http://127.0.0.1:"), line
        url = line.rsplit(" ", 1)[1]
        with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=10) as r:
            assert r.status == 200 and json.loads(r.read())["ready"] is True
        req = urllib.request.Request(f"{url}/v1/apps/cam", method="PUT", data=json.dumps(
            {"device": "tpu0", "model": TPU_MODEL, "profile": TPU_PROFILE}).encode())
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 201
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                f.close()

