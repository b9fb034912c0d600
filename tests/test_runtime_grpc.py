"""The Open Inference Protocol over gRPC, on the agent and the gateway, read by an unmodified
``tritonclient.grpc``: health, metadata, inference with raw and typed contents, statistics, the repository
index, credentials in call metadata, TLS, and every refusal as the gRPC status code its HTTP twin implies."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

grpc = pytest.importorskip("grpc")
tg = pytest.importorskip("tritonclient.grpc")
from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from edgemux.cluster.state import Device, Node  # noqa: E402
from edgemux.cluster.workload import Discipline  # noqa: E402
from edgemux.profiles.types import DeviceKind  # noqa: E402
from edgemux.runtime.auth import digest, new_app_key, new_token  # noqa: E402
from edgemux.runtime.dataplane import grpcwire  # noqa: E402
from edgemux.runtime.dataplane.agent import Agent, start_server  # noqa: E402
from edgemux.runtime.dataplane.backends import EmulatedBackend  # noqa: E402
from edgemux.runtime.dataplane.protocol import DATATYPES, ProtocolError  # noqa: E402
from edgemux.runtime.grpcserver import CODES, code_of  # noqa: E402
from edgemux.runtime.ingress.grpcservice import start_gateway_grpc  # noqa: E402
from edgemux.runtime.ingress.routing import AppRoute  # noqa: E402
from support import LoopThread, ServedAgent  # noqa: E402
from test_runtime_gateway import X, Harness, _refused_url, h, loop_thread, route  # noqa: E402,F401

TOKEN = new_token()
KEY_CAM, KEY_SLOW = new_app_key(), new_app_key()
TPU = {"device": "tpu0", "model": "zoo:mobilenet_v2@32", "profile": "ibis-edgetpu/mobilenet_v2"}
REPO = Path(__file__).resolve().parent.parent


def bearer(secret: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}"}


# ----------------------------------------------------------------------------------------- the wire itself


def test_every_message_matches_tritonclients_field_for_field() -> None:
    """Wire compatibility: each rpc's request and response, nested messages included, has tritonclient's
    field numbers, types and cardinalities (a renumbered field would fail here, not at a user's)."""
    theirs = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    compared = 0

    def same(mine: Any, other: Any, where: str) -> None:
        nonlocal compared
        by_name = {f.name: f for f in other.fields}
        for f in mine.fields:
            t = by_name.get(f.name)
            assert t is not None, f"{where}.{f.name}: not in tritonclient's proto"
            assert (f.number, f.type, f.is_repeated) == (t.number, t.type, t.is_repeated), f"{where}.{f.name}"
            compared += 1
            if f.message_type is not None:
                same(f.message_type, t.message_type, f"{where}.{f.name}")

    for name, (req, resp) in grpcwire.METHODS.items():
        method = theirs.methods_by_name[name]
        same(req.DESCRIPTOR, method.input_type, name)
        same(resp.DESCRIPTOR, method.output_type, name)
    assert compared > 100


@pytest.mark.parametrize("datatype", [d for d in DATATYPES if d != "FP16"])
def test_typed_contents_decode_to_the_arrays_they_carry(datatype: str) -> None:
    dtype = DATATYPES[datatype]
    if datatype == "BYTES":
        values: np.ndarray = np.array([b"a", b"", b"\x00\xff", b"xyz", b"q", b"r"], dtype=object).reshape(2, 3)
    elif datatype == "BOOL":
        values = np.array([[True, False, True], [False, False, True]])
    else:
        values = (np.arange(6) * (3 if dtype.kind != "f" else 0.5)).astype(dtype).reshape(2, 3)
    msg = service_pb2.ModelInferRequest(model_name="m")
    t = msg.inputs.add(name="x", datatype=datatype, shape=[2, 3])
    getattr(t.contents, grpcwire._CONTENTS[datatype]).extend(values.ravel().tolist())
    req = grpcwire.decode_infer_request(grpcwire.messages.ModelInferRequest.FromString(msg.SerializeToString()))
    got = req.input("x")
    assert got.shape == (2, 3) and got.dtype == dtype
    assert got.tolist() == values.tolist()


def test_raw_contents_decode_and_outputs_encode_as_triton_does() -> None:
    x = np.arange(12, dtype=np.float16).reshape(3, 4)
    msg = grpcwire.messages.ModelInferRequest(model_name="m", id="r1")
    msg.inputs.add(name="x", datatype="FP16", shape=[3, 4])
    msg.raw_input_contents.append(x.tobytes())
    msg.outputs.add(name="y")
    req = grpcwire.decode_infer_request(msg)
    np.testing.assert_array_equal(req.input("x"), x)
    resp = grpcwire.infer_response("m", "1", {"y": x * 2, "z": x}, [o.name for o in req.outputs], id=req.id,
                                   parameters={"flag": True, "n": 3, "ms": 1.5, "where": "n1/tpu0"})
    theirs = service_pb2.ModelInferResponse.FromString(resp.SerializeToString())
    result = tg.InferResult(theirs)
    np.testing.assert_array_equal(result.as_numpy("y"), x * 2)
    assert result.as_numpy("z") is None  # not asked for
    assert theirs.id == "r1"
    params = {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in theirs.parameters.items()}
    assert params == {"flag": True, "n": 3, "ms": 1.5, "where": "n1/tpu0"}


@pytest.mark.parametrize("build, problem", [
    (lambda m: (m.inputs.add(name="x", datatype="FP32", shape=[2]).contents.fp32_contents.extend([1.0])),
     "has 1 elements but shape [2] needs 2"),
    (lambda m: m.inputs.add(name="x", datatype="FP16", shape=[1]), "FP16 has no typed contents"),
    (lambda m: m.inputs.add(name="x", datatype="FP64", shape=[1]).contents.fp32_contents.append(1.0),
     "goes in contents.fp64_contents, got fp32_contents"),
    (lambda m: m.inputs.add(name="x", datatype="INT8", shape=[1]).contents.int_contents.append(300),
     "outside INT8's range"),
    (lambda m: m.inputs.add(name="x", datatype="COMPLEX", shape=[1]), "unsupported datatype 'COMPLEX'"),
    (lambda m: m.inputs.add(name="x", datatype="FP32", shape=[-1]), "non-negative"),
    (lambda m: (m.inputs.add(name="x", datatype="FP32", shape=[1]), m.inputs.add(name="y", datatype="FP32", shape=[1]),
                m.raw_input_contents.append(b"\0\0\0\0")), "1 entries for 2 inputs"),
    (lambda m: (m.inputs.add(name="x", datatype="FP32", shape=[2]), m.raw_input_contents.append(b"\0" * 4)),
     "does not match shape [2] of FP32 (expected 8 bytes)"),
])
def test_malformed_requests_name_what_was_expected_and_what_came(build: Any, problem: str) -> None:
    msg = grpcwire.messages.ModelInferRequest(model_name="m")
    build(msg)
    with pytest.raises(ProtocolError) as err:
        grpcwire.decode_infer_request(msg)
    assert problem in err.value.message and err.value.status == 400


def test_http_statuses_map_to_the_grpc_codes_the_protocol_names() -> None:
    assert code_of(429) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert code_of(503) == grpc.StatusCode.UNAVAILABLE
    assert code_of(401) == grpc.StatusCode.UNAUTHENTICATED
    assert code_of(403) == grpc.StatusCode.PERMISSION_DENIED
    assert code_of(404) == grpc.StatusCode.NOT_FOUND
    assert code_of(400) == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(418) == grpc.StatusCode.FAILED_PRECONDITION and code_of(599) == grpc.StatusCode.INTERNAL
    assert all(c != grpc.StatusCode.OK for c in CODES.values())


# ------------------------------------------------------------------------------------------------- agent


class Served(ServedAgent):
    """An agent with the admin token, two apps (``cam``, and ``slow`` policed at 0.1 req/s, burst 1), HTTP
    and gRPC on ephemeral ports, its loop in a thread."""

    def __init__(self) -> None:
        dev = Device("n1", "tpu0", DeviceKind.EDGETPU, Discipline.FCFS, 8.0, "ibis-edgetpu")
        super().__init__(Agent(Node("n1", 2.0, 4096.0, (dev,)), token=TOKEN,
                               backends={"tpu0": EmulatedBackend(seed=0, sleep=lambda _s: None)}),
                         grpc=True, token=TOKEN)
        assert self.grpc_address is not None
        self.address = self.grpc_address
        for app, key, extra in (("cam", KEY_CAM, {}), ("slow", KEY_SLOW, {"rate_rps": 0.1, "burst": 1})):
            assert self.put(app, {**TPU, "key_sha256": digest(key), **extra}, 60) == 201
        self.client = tg.InferenceServerClient(self.address)

    def stop(self) -> None:
        self.client.close()
        super().stop()


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    s = Served()
    yield s
    s.stop()


def frame(n: int = 1) -> Any:
    x = np.random.default_rng(n).integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    i = tg.InferInput("input", list(x.shape), "UINT8")
    i.set_data_from_numpy(x)
    return i


def refusal(fn: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as err:
        fn()
    return err.value


def test_health_and_metadata_answer_as_on_http(served: Served) -> None:
    c = served.client
    assert c.is_server_live() and c.is_server_ready()
    meta = c.get_server_metadata(as_json=True)
    assert meta["name"] == "edgemux-agent" and "statistics" in meta["extensions"]
    md = c.get_model_metadata("cam", headers=bearer(KEY_CAM), as_json=True)
    with urllib.request.urlopen(urllib.request.Request(f"{served.server.url}/v2/models/cam",
                                                       headers={"Authorization": f"Bearer {KEY_CAM}"})) as r:
        http_md = json.loads(r.read())
    assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in md["inputs"]] == \
        [(t["name"], t["datatype"], t["shape"]) for t in http_md["inputs"]]
    assert md["versions"] == ["1"] and md["name"] == "cam"
    assert c.is_model_ready("cam", headers=bearer(KEY_CAM))


def test_inference_with_raw_and_with_typed_contents(served: Served) -> None:
    r = served.client.infer("cam", [frame(2)], headers=bearer(KEY_CAM), request_id="q7")
    out = r.as_numpy("logits")
    assert out.shape == (2, 1000) and out.dtype == np.float32
    resp = r.get_response(as_json=True)
    assert resp["id"] == "q7" and resp["parameters"]["edgemux_device"]["string_param"] == "n1/tpu0"
    # typed contents, with tritonclient's own messages and stub (tritonclient's InferInput always sends raw)
    x = np.zeros((1, 32, 32, 3), np.uint8)
    msg = service_pb2.ModelInferRequest(model_name="cam")
    msg.inputs.add(name="input", datatype="UINT8", shape=x.shape).contents.uint_contents.extend(x.ravel().tolist())
    with grpc.insecure_channel(served.address) as channel:
        answer = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
            msg, metadata=tuple(bearer(KEY_CAM).items()), timeout=30)
    assert [o.name for o in answer.outputs] == ["logits"] and len(answer.raw_output_contents[0]) == 4000


def test_statistics_after_n_requests_count_n(served: Served) -> None:
    def success() -> int:
        stats = served.client.get_inference_statistics("cam", headers=bearer(KEY_CAM), as_json=True)
        return int(stats["model_stats"][0]["inference_stats"]["success"].get("count", 0))

    before = success()
    for _ in range(5):
        served.client.infer("cam", [frame()], headers=bearer(KEY_CAM))
    assert success() == before + 5
    every = served.client.get_inference_statistics(headers=bearer(TOKEN), as_json=True)
    assert {m["name"] for m in every["model_stats"]} == {"cam", "slow"}
    index = served.client.get_model_repository_index(headers=bearer(TOKEN), as_json=True)
    assert {(m["name"], m["state"]) for m in index["models"]} == {("cam", "READY"), ("slow", "READY")}


def test_refusals_are_the_grpc_codes_of_their_http_twins(served: Served) -> None:
    c = served.client
    assert refusal(lambda: c.infer("cam", [frame()])).status() == "StatusCode.UNAUTHENTICATED"
    assert refusal(lambda: c.infer("cam", [frame()], headers=bearer("nonsense"))).status() == \
        "StatusCode.UNAUTHENTICATED"
    denied = refusal(lambda: c.infer("cam", [frame()], headers=bearer(KEY_SLOW)))
    assert denied.status() == "StatusCode.PERMISSION_DENIED" and "not app cam's" in denied.message()
    assert refusal(lambda: c.get_inference_statistics(headers=bearer(KEY_CAM))).status() == \
        "StatusCode.PERMISSION_DENIED"
    missing = refusal(lambda: c.infer("nope", [frame()], headers=bearer(TOKEN)))
    assert missing.status() == "StatusCode.NOT_FOUND" and "nope" in missing.message()
    bad = tg.InferInput("input", [1, 32, 32, 4], "UINT8")
    bad.set_data_from_numpy(np.zeros((1, 32, 32, 4), np.uint8))
    shape = refusal(lambda: c.infer("cam", [bad], headers=bearer(KEY_CAM)))
    assert shape.status() == "StatusCode.INVALID_ARGUMENT"
    assert "expected [-1,32,32,3], got [1,32,32,4]" in shape.message()
    version = refusal(lambda: c.infer("cam", [frame()], model_version="7", headers=bearer(KEY_CAM)))
    assert version.status() == "StatusCode.NOT_FOUND" and "no version '7'" in version.message()


def test_a_policed_request_is_resource_exhausted_with_a_retry_hint(served: Served) -> None:
    msg = grpcwire.messages.ModelInferRequest(model_name="slow")
    msg.inputs.add(name="input", datatype="UINT8", shape=[1, 32, 32, 3])
    msg.raw_input_contents.append(bytes(32 * 32 * 3))
    with grpc.insecure_channel(served.address) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                    request_serializer=lambda m: m.SerializeToString(),
                                    response_deserializer=grpcwire.messages.ModelInferResponse.FromString)
        with pytest.raises(grpc.RpcError) as err:
            for _ in range(60):  # the bucket's depth first (the policing rule's floor: 40), then a refusal
                infer(msg, metadata=tuple(bearer(KEY_SLOW).items()), timeout=30)
    e = err.value
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    trailing = dict(e.trailing_metadata())
    assert float(trailing["retry-after"]) > 0


def test_an_agent_on_tls_serves_grpc_over_tls(tmp_path: Path) -> None:
    from edgemux.runtime.tls import make_local_ca, server_context

    ca = make_local_ca(tmp_path)
    dev = Device("n1", "tpu0", DeviceKind.EDGETPU, Discipline.FCFS, 8.0, "ibis-edgetpu")
    agent = Agent(Node("n1", 2.0, 4096.0, (dev,)), backends={"tpu0": EmulatedBackend(seed=0, sleep=lambda _s: None)})
    lt = LoopThread()
    try:
        server = lt.run(start_server(agent, "127.0.0.1", 0, ssl_context=server_context(ca.cert, ca.key),
                                     grpc_port=0, tls_files=(str(ca.cert), str(ca.key))))
        assert server.grpc is not None and server.grpc.tls
        port = server.grpc.port
        secure = tg.InferenceServerClient(f"localhost:{port}", ssl=True, root_certificates=str(ca.ca))
        assert secure.is_server_live()
        secure.close()
        plain = tg.InferenceServerClient(f"localhost:{port}")
        assert refusal(lambda: plain.is_server_live()).status() == "StatusCode.UNAVAILABLE"
        plain.close()
        lt.run(server.stop())
    finally:
        agent.close(drain=False, timeout_s=5)
        lt.stop()


def test_the_reference_example_runs(served: Served) -> None:
    """docs/reference/grpc.md's example, run as written against this agent (its address and key put in)."""
    page = (REPO / "docs" / "reference" / "grpc.md").read_text(encoding="utf-8")
    code = page.split("```python\n", 1)[1].split("```", 1)[0]
    assert '"localhost:8001"' in code and '"emk_..."' in code
    code = code.replace('"localhost:8001"', repr(served.address)).replace('"emk_..."', repr(KEY_CAM))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert p.returncode == 0, p.stderr
    first, second = p.stdout.strip().splitlines()
    assert first == "(1, 1000) n1/tpu0" and int(second) >= 1


# ----------------------------------------------------------------------------------------------- gateway


def start_grpc_gateway(h: Harness, routes: Any, **kw: Any) -> tuple[Any, Any]:
    gw, _url = h.gateway(routes, **kw)
    site = h.lt.run(start_gateway_grpc(gw, "127.0.0.1", 0))
    h.runners.append(site)  # stopped with the harness (its stop() takes an optional grace)
    return gw, tg.InferenceServerClient(site.address)


def x_input() -> Any:
    i = tg.InferInput("x", list(X.shape), "FP32")
    i.set_data_from_numpy(X)
    return i


def test_the_gateway_routes_grpc_to_its_agents_and_fails_over(h: Harness) -> None:
    dead, ok = _refused_url(), h.agent()
    _gw, c = start_grpc_gateway(h, {"app": route("app", (dead, 1.0), (ok.url, 1.0))})
    for _ in range(3):
        r = c.infer("app", [x_input()], outputs=[tg.InferRequestedOutput("x_out")], request_id="g1")
        np.testing.assert_array_equal(r.as_numpy("x_out"), 2 * X)
        assert r.get_response().id == "g1"
    assert ok.hits == 3
    assert ok.header_lengths[0] is not None  # carried to the agent as a binary request
    assert c.is_server_live() and c.is_server_ready() and c.is_model_ready("app")
    md = c.get_model_metadata("app", as_json=True)
    assert md["name"] == "app" and md["inputs"][0]["name"] == "x"
    c.close()


def test_the_gateway_says_unavailable_policed_not_found_and_passes_agents_refusals_on(h: Harness) -> None:
    refusing = h.agent("400")
    routes = {"down": route("down", (_refused_url(), 1.0)),
              "tight": route("tight", (h.agent().url, 1.0), rate=0.01, burst=1),
              "bad": route("bad", (refusing.url, 1.0))}
    _gw, c = start_grpc_gateway(h, routes)
    down = refusal(lambda: c.infer("down", [x_input()]))
    assert down.status() == "StatusCode.UNAVAILABLE" and "down" in down.message()
    c.infer("tight", [x_input()])
    assert refusal(lambda: c.infer("tight", [x_input()])).status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert refusal(lambda: c.infer("nobody", [x_input()])).status() == "StatusCode.NOT_FOUND"
    bad = refusal(lambda: c.infer("bad", [x_input()]))
    assert bad.status() == "StatusCode.INVALID_ARGUMENT" and "unexpected shape for input 'x'" in bad.message()
    c.close()


def test_the_gateway_checks_app_keys_in_call_metadata(h: Harness) -> None:
    key = new_app_key()
    routes = {"app": AppRoute("app", "m", [(h.agent().url, 1.0)], 1e6, 1e6, key_sha256=digest(key))}
    _gw, c = start_grpc_gateway(h, routes, token=TOKEN)
    assert refusal(lambda: c.infer("app", [x_input()])).status() == "StatusCode.UNAUTHENTICATED"
    assert refusal(lambda: c.infer("app", [x_input()], headers=bearer(new_app_key()))).status() == \
        "StatusCode.UNAUTHENTICATED"
    r = c.infer("app", [x_input()], headers=bearer(key))
    np.testing.assert_array_equal(r.as_numpy("x_out"), 2 * X)
    c.close()


# ----------------------------------------------------------------------------------------------------- CLI


@pytest.mark.parametrize("argv, message", [
    (["agent", "--cluster", "examples/edge-node.yaml", "--node", "x", "--grpc-port", "70000"],
     "--grpc-port: must be in 0..65535, got 70000"),
    (["gateway", "--port", "8123", "--grpc-port", "8123"], "--grpc-port: must differ from --port (8123)"),
])
def test_a_bad_grpc_port_is_one_line(argv: list[str], message: str) -> None:
    p = subprocess.run([sys.executable, "-m", "edgemux", *argv], cwd=REPO, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and p.stdout == ""
    assert len(p.stderr.strip().splitlines()) == 1 and message in p.stderr


def test_a_grpc_port_in_use_is_one_line() -> None:
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        p = subprocess.run([sys.executable, "-m", "edgemux", "gateway", "--grpc-port", str(port)], cwd=REPO,
                           capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stdout == "", p.stdout
    assert p.stderr.strip().splitlines() == [p.stderr.strip()]
    assert f"--grpc-port: cannot listen on 127.0.0.1:{port} (gRPC)" in p.stderr


# -------------------------------------------------------------------------------------------------- fuzz

_BAD_CODES = {"StatusCode.INTERNAL", "StatusCode.UNKNOWN", "StatusCode.DATA_LOSS"}
_FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
_text = st.text(max_size=12)
_param = st.one_of(st.booleans(), st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=True), _text)


@st.composite
def _infer_message(draw: st.DrawFn) -> bytes:
    """A ``ModelInferRequest``, mostly near a valid one for app ``cam`` or ``app`` (the gateway's), sometimes
    anything; or bytes that are no message at all."""
    if draw(st.sampled_from([False, False, False, False, True])):
        return draw(st.binary(max_size=200))
    msg = grpcwire.messages.ModelInferRequest(
        model_name=draw(st.sampled_from(["cam", "app", "cam", "app"]) | _text),
        model_version=draw(st.sampled_from(["", "", "1", "2"]) | _text), id=draw(_text))
    for _ in range(draw(st.integers(0, 3))):
        t = msg.inputs.add(name=draw(st.sampled_from(["input", "x"]) | _text),
                           datatype=draw(st.sampled_from([*DATATYPES, "FP8", ""])),
                           shape=draw(st.lists(st.integers(-2, 40), max_size=5)))
        field = draw(st.sampled_from(sorted(set(grpcwire._CONTENTS.values()))))
        values = {"bool_contents": st.booleans(), "bytes_contents": st.binary(max_size=8),
                  "fp32_contents": st.floats(width=32), "fp64_contents": st.floats()}.get(
            field, st.integers(0, 2**31 - 1))
        getattr(t.contents, field).extend(draw(st.lists(values, max_size=64)))
        for key, value in draw(st.dictionaries(_text, _param, max_size=2)).items():
            grpcwire.set_parameters(t.parameters, {key: value})
    if draw(st.booleans()):
        msg.ClearField("inputs") if draw(st.booleans()) else None
        for _ in range(draw(st.integers(0, 3))):
            msg.raw_input_contents.append(draw(st.binary(max_size=3 * 32 * 32 * 3)))
    for _ in range(draw(st.integers(0, 2))):
        msg.outputs.add(name=draw(st.sampled_from(["logits", "x_out"]) | _text))
    for key, value in draw(st.dictionaries(st.sampled_from(["timeout", "priority"]) | _text, _param,
                                           max_size=2)).items():
        grpcwire.set_parameters(msg.parameters, {key: value})
    return bytes(msg.SerializeToString())


def _raw_infer(address: str, data: bytes, secret: str | None) -> str:
    """Send ``data`` as the ModelInfer request's bytes: "OK" or the gRPC status code it was refused with."""
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                   request_serializer=lambda b: b, response_deserializer=lambda b: b)
        try:
            call(data, metadata=tuple(bearer(secret).items()) if secret else (), timeout=30)
        except grpc.RpcError as e:
            return str(e.code())
    return "OK"


@_FUZZ
@given(data=_infer_message(), secret=st.sampled_from([KEY_CAM, TOKEN, None]))
def test_fuzz_agent_grpc_never_internal(served: Served, data: bytes, secret: str | None) -> None:
    assert _raw_infer(served.address, data, secret) not in _BAD_CODES


def test_after_the_fuzz_the_agent_still_serves(served: Served) -> None:
    before = served.client.get_inference_statistics("cam", headers=bearer(KEY_CAM), as_json=True)
    served.client.infer("cam", [frame()], headers=bearer(KEY_CAM))
    after = served.client.get_inference_statistics("cam", headers=bearer(KEY_CAM), as_json=True)
    count = [int(s["model_stats"][0]["inference_stats"]["success"].get("count", 0)) for s in (before, after)]
    assert count[1] == count[0] + 1


@_FUZZ
@given(data=_infer_message())
def test_fuzz_gateway_grpc_never_internal(h: Harness, data: bytes) -> None:
    if not h.runners:
        start_grpc_gateway(h, {"app": route("app", (h.agent().url, 1.0))})
    site = h.runners[-1]
    assert _raw_infer(site.address, data, None) not in _BAD_CODES
