"""Open Inference Protocol codec: interoperates with the real tritonclient.http, and refuses bad requests with
Triton-style messages (and only ProtocolError, whatever the bytes)."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pytest
import tritonclient.http as th
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from edgemux.runtime.dataplane.protocol import (
    DATATYPES,
    HEADER_LENGTH_HEADER,
    InferRequest,
    ProtocolError,
    TensorSpec,
    check_content_length,
    datatype_of,
    decode_infer_request,
    decode_model_metadata,
    encode_infer_response,
    error_body,
    model_metadata_body,
    server_metadata_body,
    validate_request,
)

NUMERIC = [d for d in DATATYPES if d != "BYTES"]


def _sample(datatype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """A deterministic array of ``datatype`` covering each type's extremes where it has them."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if datatype == "BYTES":
        pool = [b"", b"a", "é€".encode(), b"cat", b"x" * 40]
        out = np.empty(n, dtype=object)
        out[:] = [pool[i % len(pool)] for i in range(n)]
        return out.reshape(shape)
    if datatype == "BOOL":
        return rng.integers(0, 2, size=shape).astype(bool)
    dt = DATATYPES[datatype]
    if dt.kind in "iu":
        info = np.iinfo(dt)
        vals = rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)
        flat = vals.reshape(-1)
        if flat.size >= 2:  # the extremes travel too
            flat[0], flat[1] = info.min, info.max
        return vals
    return (rng.standard_normal(shape) * 1000).astype(dt)


def _client_request(tensors: list[tuple[str, np.ndarray, bool]], outputs=None, **kw):
    """Request body built by tritonclient itself: (name, array, binary_data) per input."""
    inputs = []
    for name, arr, binary in tensors:
        datatype = "BYTES" if arr.dtype == object else th.np_to_triton_dtype(arr.dtype)
        inp = th.InferInput(name, list(arr.shape), datatype)
        inp.set_data_from_numpy(arr, binary_data=binary)
        inputs.append(inp)
    return th.InferenceServerClient.generate_request_body(inputs, outputs=outputs, **kw)


def _client_parse(body: bytes, headers: dict[str, str]):
    hl = headers.get(HEADER_LENGTH_HEADER)
    return th.InferenceServerClient.parse_response_body(body, header_length=None if hl is None else int(hl))


def _as_bytes(arr: np.ndarray) -> list[bytes]:
    return [v if isinstance(v, bytes) else str(v).encode() for v in arr.ravel().tolist()]


def _assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    if want.dtype == object:
        assert _as_bytes(got) == _as_bytes(want)
    else:
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------------------- tritonclient -> decoder


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_decodes_tritonclient_request_every_datatype(datatype: str, binary: bool) -> None:
    arr = _sample(datatype, (2, 3, 4), seed=len(datatype))
    body, hl = _client_request([("x", arr, binary)], request_id="req-7")
    assert (hl is None) == (not binary)
    req = decode_infer_request(body, hl)
    assert req.id == "req-7"
    (t,) = req.inputs
    assert (t.name, t.datatype, t.shape) == ("x", datatype, (2, 3, 4))
    _assert_same(t.data, arr)


def test_decodes_mixed_binary_and_json_inputs_and_requested_outputs() -> None:
    img = _sample("FP16", (1, 3, 8, 8))
    labels = _sample("BYTES", (2,))
    ids = _sample("INT64", (5,))
    outs = [th.InferRequestedOutput("probs", binary_data=True), th.InferRequestedOutput("label", binary_data=False)]
    body, hl = _client_request(
        [("img", img, True), ("labels", labels, False), ("ids", ids, True)], outputs=outs, priority=2
    )
    assert hl is not None
    req = decode_infer_request(body, str(hl))  # the HTTP layer hands the header over as text
    _assert_same(req.input("img"), img)
    _assert_same(req.input("labels"), labels)
    _assert_same(req.input("ids"), ids)
    assert [o.name for o in req.outputs] == ["probs", "label"]
    assert req.wants_binary("probs") and not req.wants_binary("label")
    assert req.parameters["priority"] == 2
    assert req.id is None


def test_no_requested_outputs_means_all_binary_as_tritonclient_asks() -> None:
    body, hl = _client_request([("x", _sample("FP32", (3,)), False)])
    req = decode_infer_request(body, hl)
    assert req.outputs == [] and req.binary_data_output is True and req.wants_binary("anything")


def test_binary_inputs_are_read_only_views() -> None:
    body, hl = _client_request([("x", _sample("FP32", (4,)), True)])
    arr = decode_infer_request(body, hl).input("x")
    assert not arr.flags.writeable


# ------------------------------------------------------------------------------- encoder -> tritonclient


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_tritonclient_parses_our_response_every_datatype(datatype: str, binary: bool) -> None:
    arr = _sample(datatype, (3, 2), seed=7)
    asked = [th.InferRequestedOutput("y", binary_data=binary)]
    body, hl = _client_request([("x", _sample("FP32", (1,)), False)], asked)
    req = decode_infer_request(body, hl)
    out_body, headers = encode_infer_response("m", "1", {"y": arr, "unasked": arr}, req)
    assert (HEADER_LENGTH_HEADER in headers) == binary
    assert headers["Content-Type"] == ("application/octet-stream" if binary else "application/json")
    result = _client_parse(out_body, headers)
    resp = result.get_response()
    assert resp["model_name"] == "m" and resp["model_version"] == "1"
    assert [o["name"] for o in resp["outputs"]] == ["y"]  # only what was asked for
    assert resp["outputs"][0]["datatype"] == datatype
    _assert_same(result.as_numpy("y"), arr)


def test_response_mixes_binary_and_json_outputs_and_echoes_id() -> None:
    outs = [th.InferRequestedOutput("b", binary_data=False), th.InferRequestedOutput("a", binary_data=True)]
    body, hl = _client_request([("x", _sample("FP32", (1,)), True)], outs, request_id="abc")
    req = decode_infer_request(body, hl)
    a, b = _sample("FP32", (2, 2)), _sample("BYTES", (3,))
    out_body, headers = encode_infer_response("m", "2", [("a", a), ("b", b)], req)
    result = _client_parse(out_body, headers)
    assert [o["name"] for o in result.get_response()["outputs"]] == ["b", "a"]  # request order
    assert result.get_response()["id"] == "abc"
    _assert_same(result.as_numpy("a"), a)
    _assert_same(result.as_numpy("b"), b)


def test_response_without_request_is_json_and_special_floats_survive() -> None:
    arr = np.array([np.nan, np.inf, -np.inf, 0.5], dtype=np.float32)
    body, headers = encode_infer_response("m", "1", {"y": arr}, id="r")
    assert headers == {"Content-Type": "application/json"}
    result = _client_parse(body, headers)
    _assert_same(result.as_numpy("y"), arr)
    assert result.get_response()["id"] == "r"


def test_json_floats_are_written_short_and_read_back_exactly() -> None:
    """JSON data is written by orjson from the array: FP32 as its shortest FP32 text (0.1, not the double
    0.10000000149011612 that tolist() gave), which reads back as the same FP32 value."""
    arr = np.array([0.1, 1 / 3, 3.4e38, -0.0], dtype=np.float32)
    body, _ = encode_infer_response("m", "1", {"y": arr})
    assert b'"data":[0.1,0.33333334,3.4e+38,-0.0]' in body
    _assert_same(decode_infer_request(body.replace(b'"outputs"', b'"inputs"')).input("y"), arr)


def test_json_that_only_the_standard_library_reads_still_decodes() -> None:
    """NaN and Infinity are not JSON, but Python's json (and so tritonclient) writes them: orjson refuses
    them and the standard library reads them, as before."""
    body = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[3],"data":[NaN,Infinity,-Infinity]}]}'
    _assert_same(decode_infer_request(body).input("x"), np.array([np.nan, np.inf, -np.inf], np.float32))


def test_response_errors() -> None:
    req = decode_infer_request(b'{"inputs":[],"outputs":[{"name":"nope"}]}')
    with pytest.raises(ProtocolError, match="unexpected output 'nope': model 'm' produces 'y'") as e:
        encode_infer_response("m", "1", {"y": np.zeros(1)}, req)
    assert e.value.status == 400
    with pytest.raises(ProtocolError, match="no Open Inference Protocol datatype") as e:
        encode_infer_response("m", "1", {"c": np.zeros(2, dtype=np.complex64)})
    assert e.value.status == 500
    bad = np.array([b"\xff\xfe"], dtype=object)
    with pytest.raises(ProtocolError, match="not valid UTF-8"):
        encode_infer_response("m", "1", {"s": bad})
    assert datatype_of(np.dtype("U3")) == "BYTES" and datatype_of(np.dtype(">f4")) == "FP32"


# ---------------------------------------------------------------------------------------- round trips

_NUMERIC_DTYPES = st.sampled_from([DATATYPES[d] for d in NUMERIC])
_SHAPES = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4)


@st.composite
def _tensors(draw, allow_nan: bool = False, text_only: bool = False) -> np.ndarray:
    shape = draw(_SHAPES)
    if draw(st.integers(0, 6)) == 0:  # BYTES about one time in seven
        n = int(np.prod(shape))
        elem = st.text(max_size=8).map(str.encode) if text_only else st.binary(max_size=8)
        out = np.empty(n, dtype=object)
        out[:] = draw(st.lists(elem, min_size=n, max_size=n))
        return out.reshape(shape)
    dt = draw(_NUMERIC_DTYPES)
    elements = hnp.from_dtype(dt, allow_nan=allow_nan, allow_infinity=allow_nan) if dt.kind == "f" else None
    return draw(hnp.arrays(dt, shape, elements=elements))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arr=_tensors(text_only=True), binary=st.booleans())
def test_roundtrip_tritonclient_request_to_decoder(arr: np.ndarray, binary: bool) -> None:
    body, hl = _client_request([("x", arr, binary)])
    _assert_same(decode_infer_request(body, hl).input("x"), arr)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arr=_tensors(allow_nan=True, text_only=True), binary=st.booleans())
def test_roundtrip_encoder_to_tritonclient(arr: np.ndarray, binary: bool) -> None:
    req = InferRequest(id="q", parameters={}, inputs=[], outputs=[], binary_data_output=binary)
    body, headers = encode_infer_response("m", "1", {"y": arr}, req)
    _assert_same(_client_parse(body, headers).as_numpy("y"), arr)


@settings(max_examples=60, deadline=None)
@given(arr=_tensors(), nested=st.booleans())
def test_roundtrip_our_encoder_to_our_decoder_as_request(arr: np.ndarray, nested: bool) -> None:
    """Our binary output layout is also a valid request layout (the gateway forwards bodies)."""
    req = InferRequest(id=None, parameters={}, inputs=[], outputs=[], binary_data_output=True)
    body, headers = encode_infer_response("m", "1", {"x": arr}, req)
    header = json.loads(body[: int(headers[HEADER_LENGTH_HEADER])])
    header["inputs"] = header.pop("outputs")
    text = json.dumps(header).encode()
    got = decode_infer_request(text + body[int(headers[HEADER_LENGTH_HEADER]) :], len(text)).input("x")
    _assert_same(got, arr)
    if arr.dtype != object:  # JSON data may be nested row-major
        data = arr.tolist() if nested else arr.ravel().tolist()
        doc = {"inputs": [{"name": "x", "datatype": datatype_of(arr.dtype), "shape": list(arr.shape), "data": data}]}
        _assert_same(decode_infer_request(json.dumps(doc).encode()).input("x"), arr)


# ----------------------------------------------------------------------------------------- validation

MODEL_IN = [TensorSpec("input", "FP32", (-1, 3, 224, 224))]
MODEL_OUT = [TensorSpec("probs", "FP32", (-1, 1000))]


def _json_request(*inputs: dict, outputs: list | None = None) -> InferRequest:
    doc: dict = {"inputs": list(inputs)}
    if outputs is not None:
        doc["outputs"] = outputs
    return decode_infer_request(json.dumps(doc).encode())


def _zeros(name: str, shape: list[int], datatype: str = "FP32") -> dict:
    value = False if datatype == "BOOL" else ("" if datatype == "BYTES" else 0)
    return {"name": name, "datatype": datatype, "shape": shape, "data": [value] * int(np.prod(shape))}


def test_validate_accepts_variable_batch() -> None:
    for batch in (1, 2):
        validate_request(_json_request(_zeros("input", [batch, 3, 224, 224])), "m", MODEL_IN, MODEL_OUT)


@pytest.mark.parametrize(
    "req, message",
    [
        (_json_request(_zeros("input", [3, 224, 224])),
         "unexpected shape for input 'input': expected [-1,3,224,224], got [3,224,224]"),
        (_json_request(_zeros("input", [1, 3, 224, 225])),
         "unexpected shape for input 'input': expected [-1,3,224,224], got [1,3,224,225]"),
        (_json_request(_zeros("input", [1, 3, 224, 224], "INT64")),
         "unexpected datatype for input 'input': expected FP32, got INT64"),
        (_json_request(_zeros("foo", [1])), "unexpected input 'foo': model 'm' expects 'input'"),
        (_json_request(), "missing input 'input'"),
        (_json_request(_zeros("input", [1, 3, 224, 224]), outputs=[{"name": "logits"}]),
         "unexpected output 'logits': model 'm' produces 'probs'"),
    ],
    ids=["rank", "dim", "datatype", "unexpected", "missing", "output"],
)
def test_validate_messages(req: InferRequest, message: str) -> None:
    with pytest.raises(ProtocolError) as e:
        validate_request(req, "m", MODEL_IN, MODEL_OUT)
    assert str(e.value) == message and e.value.status == 400


def test_validate_fixed_shape_message_matches_triton_style() -> None:
    spec = [TensorSpec("input", "FP32", (1, 3, 224, 224))]
    with pytest.raises(ProtocolError) as e:
        validate_request(_json_request(_zeros("input", [3, 224, 224])), "m", spec)
    assert str(e.value) == "unexpected shape for input 'input': expected [1,3,224,224], got [3,224,224]"


def test_tensor_spec_rejects_bad_declarations() -> None:
    with pytest.raises(ValueError, match="unsupported datatype 'BF16'"):
        TensorSpec("x", "BF16", (1,))
    with pytest.raises(ValueError, match="dims must be integers >= -1"):
        TensorSpec("x", "FP32", (-2,))


# ------------------------------------------------------------------------------------- decode errors


def _binary_request(header: dict, payload: bytes) -> tuple[bytes, int]:
    text = json.dumps(header).encode()
    return text + payload, len(text)


def _err(body: bytes, hl=None, **kw) -> ProtocolError:
    with pytest.raises(ProtocolError) as e:
        decode_infer_request(body, hl, **kw)
    return e.value


def test_malformed_json_says_where() -> None:
    e = _err(b'{"inputs": [\n  {"name": "x",]}')
    assert "malformed request JSON at line 2 column" in str(e) and e.status == 400
    assert "invalid UTF-8 at byte 1" in str(_err(b"{\xff}"))
    assert "must be an object, got array" in str(_err(b"[1, 2]"))
    assert str(_err(b"[" * 100_000 + b"]" * 100_000)) == "malformed request JSON: nested too deeply"


def test_header_length_problems() -> None:
    body = b'{"inputs": []}'
    assert str(_err(body, 999)) == f"{HEADER_LENGTH_HEADER} 999 is larger than the request body ({len(body)} bytes)"
    assert "must be a non-negative integer, got \"abc\"" in str(_err(body, "abc"))
    assert "must be a non-negative integer, got -1" in str(_err(body, -1))
    assert decode_infer_request(body, str(len(body))).inputs == []  # all header, no binary part


def test_body_size_limit_is_413() -> None:
    e = _err(b'{"inputs": []}', max_body_bytes=10)
    assert e.status == 413 and "exceeds the limit of 10 bytes" in str(e)
    with pytest.raises(ProtocolError) as e2:
        check_content_length("1000", max_body_bytes=999)
    assert e2.value.status == 413
    assert check_content_length(None) is None and check_content_length("12") == 12


def test_binary_sizes_must_add_up() -> None:
    head = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [25], "parameters": {"binary_data_size": 100}}]}
    body, hl = _binary_request(head, b"\0" * 60)
    assert str(_err(body, hl)) == "input 'x': binary_data_size 100 but 60 bytes remain"
    head["inputs"][0]["parameters"]["binary_data_size"] = 60
    body, hl = _binary_request(head, b"\0" * 60)
    assert "binary_data_size 60 does not match shape [25] of FP32 (expected 100 bytes)" in str(_err(body, hl))
    head["inputs"][0]["shape"] = [15]
    body, hl = _binary_request(head, b"\0" * 64)
    assert "4 bytes of binary data after" in str(_err(body, hl))
    assert "no Inference-Header-Content-Length header" in str(_err(_binary_request(head, b"")[0]))


def test_bytes_binary_problems() -> None:
    payload = struct.pack("<I", 3) + b"abc" + struct.pack("<I", 10) + b"xy"
    tensor = {"name": "s", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": len(payload)}}
    head = {"inputs": [tensor]}
    assert "BYTES element 1 claims 10 bytes but 2 remain" in str(_err(*_binary_request(head, payload)))
    payload = struct.pack("<I", 1) + b"a" + b"\0\0"
    head["inputs"][0]["parameters"]["binary_data_size"] = len(payload)
    assert "truncated length prefix" in str(_err(*_binary_request(head, payload)))
    payload = struct.pack("<I", 1) + b"a"
    head["inputs"][0]["parameters"]["binary_data_size"] = len(payload)
    assert "BYTES data has 1 elements but shape [2] needs 2" in str(_err(*_binary_request(head, payload)))


@pytest.mark.parametrize(
    "tensor, message",
    [
        ({"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3]},
         "'data' has 3 elements but shape [2,2] needs 4"),
        ({"name": "x", "datatype": "UINT8", "shape": [1], "data": [300]},
         "value 300 is out of range for UINT8 [0, 255]"),
        ({"name": "x", "datatype": "INT32", "shape": [1], "data": [1.5]}, "INT32 data must be integers, got 1.5"),
        ({"name": "x", "datatype": "FP32", "shape": [1], "data": ["a"]}, "FP32 data must be numbers, got \"a\""),
        ({"name": "x", "datatype": "BOOL", "shape": [1], "data": [1]}, "BOOL data must be true or false, got 1"),
        ({"name": "x", "datatype": "BYTES", "shape": [1], "data": [1]}, "BYTES data must be strings, got number 1"),
        # the element types are checked in C as exact types: a bool is not a number, even after good ones
        ({"name": "x", "datatype": "FP32", "shape": [3], "data": [1.5, 2, True]}, "FP32 data must be numbers, got true"),
        ({"name": "x", "datatype": "INT8", "shape": [2], "data": [1, False]}, "INT8 data must be integers, got false"),
        ({"name": "x", "datatype": "INT64", "shape": [2], "data": [1, 2**70]},  # beyond 64 bits: read as a float
         "value 1.1805916207174113e+21 is out of range for INT64"),
        ({"name": "x", "datatype": "FP32", "shape": [2, 1], "data": [[1.0], [None]]}, "FP32 data must be numbers, got null"),
        ({"name": "x", "datatype": "BF16", "shape": [1], "data": [1]}, "unsupported datatype 'BF16'"),
        ({"name": "x", "datatype": "FP32", "shape": [-1], "data": []},
         "'shape' must be a list of non-negative integers"),
        ({"name": "x", "datatype": "FP32", "shape": [1]}, "no 'data' and no parameters.binary_data_size"),
        ({"name": 3, "datatype": "FP32", "shape": [1], "data": [1]}, "inputs[0]: 'name' must be a string, got number"),
        ({"name": "x", "datatype": "FP32", "shape": [1], "parameters": {"shared_memory_region": "r"}},
         "shared_memory_byte_size must be a non-negative integer (bytes), got null"),
        ({"name": "x", "datatype": "FP32", "shape": [1], "parameters": {"shared_memory_byte_size": 4}},
         "shared_memory_region must be a region's name, got null"),
        ({"name": "x", "datatype": "FP32", "shape": [1], "data": [1],
          "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 4}},
         "has both a shared memory region and data in the request"),
    ],
)
def test_json_input_problems(tensor: dict, message: str) -> None:
    e = _err(json.dumps({"inputs": [tensor]}).encode())
    assert message in str(e) and e.status == 400


def test_request_level_problems() -> None:
    x = _zeros("x", [1])
    assert "input 'x' appears more than once" in str(_err(json.dumps({"inputs": [x, x]}).encode()))
    assert "'id' must be a string" in str(_err(json.dumps({"id": 5, "inputs": []}).encode()))
    assert "'inputs' must be a list, got null" in str(_err(b"{}"))
    doc = {"inputs": [], "parameters": {"binary_data_output": "yes"}}
    assert "binary_data_output' must be true or false" in str(_err(json.dumps(doc).encode()))
    doc = {"inputs": [], "outputs": [{"name": "y", "parameters": {"classification": 3}}]}
    assert "classification extension is not supported" in str(_err(json.dumps(doc).encode()))
    doc = {"inputs": [], "outputs": [{"name": "y"}, {"name": "y"}]}
    assert "output 'y' requested more than once" in str(_err(json.dumps(doc).encode()))


# ------------------------------------------------------------------------------------------- fuzzing

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=5), kids, max_size=4),
    max_leaves=20,
)
_HEADER_LENGTHS = st.none() | st.integers(-5, 300) | st.text(max_size=4)


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=200), hl=_HEADER_LENGTHS)
def test_fuzz_arbitrary_bytes_only_protocol_error(body: bytes, hl) -> None:
    try:
        decode_infer_request(body, hl)
    except ProtocolError:
        pass


@settings(max_examples=300, deadline=None)
@given(doc=_JSON, tail=st.binary(max_size=40), split=st.booleans())
def test_fuzz_arbitrary_json_only_protocol_error(doc, tail: bytes, split: bool) -> None:
    text = json.dumps(doc).encode()
    try:
        decode_infer_request(text + tail if split else text, len(text) if split else None)
    except ProtocolError:
        pass


_FIELD = _JSON | st.sampled_from(list(DATATYPES) + ["BF16"]) | st.lists(st.integers(-2, 5), max_size=4)
_NEAR_INPUT = st.fixed_dictionaries(
    {"name": st.sampled_from(["x", "y"]) | _JSON},
    optional={
        "datatype": st.sampled_from(list(DATATYPES)) | _JSON,
        "shape": st.lists(st.integers(-1, 4) | _JSON, max_size=3),
        "data": _FIELD,
        "parameters": st.fixed_dictionaries({}, optional={"binary_data_size": st.integers(-1, 40) | _JSON}) | _JSON,
    },
)
_NEAR_REQUEST = st.fixed_dictionaries(
    {"inputs": st.lists(_NEAR_INPUT, max_size=3)},
    optional={
        "id": _JSON,
        "parameters": st.fixed_dictionaries({}, optional={"binary_data_output": _JSON}),
        "outputs": st.lists(st.fixed_dictionaries({"name": _JSON}, optional={"parameters": _JSON}), max_size=2) | _JSON,
    },
)


@settings(max_examples=400, deadline=None)
@given(doc=_NEAR_REQUEST, tail=st.binary(max_size=40), split=st.booleans())
def test_fuzz_near_valid_requests_only_protocol_error(doc, tail: bytes, split: bool) -> None:
    """Requests shaped like real ones reach deep into the decoder, and the validator behind it."""
    text = json.dumps(doc).encode()
    try:
        req = decode_infer_request(text + tail if split else text, len(text) if split else None)
        validate_request(req, "m", [TensorSpec("x", "FP32", (-1, 2))], [TensorSpec("y", "FP32", (1,))])
    except ProtocolError:
        pass


# ------------------------------------------------------------------------------------------ metadata


def test_metadata_and_error_bodies() -> None:
    assert json.loads(server_metadata_body(version="9")) == {
        "name": "edgemux", "version": "9", "extensions": ["binary_tensor_data"]}
    meta = json.loads(model_metadata_body("resnet", ["1", 2], "onnxruntime_onnx", MODEL_IN, MODEL_OUT))
    assert meta == {
        "name": "resnet",
        "versions": ["1", "2"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 224, 224]}],
        "outputs": [{"name": "probs", "datatype": "FP32", "shape": [-1, 1000]}],
    }
    assert json.loads(error_body("missing input 'input'")) == {"error": "missing input 'input'"}


@pytest.mark.parametrize("datatype", ["INT32", "FP32", "BOOL", "BYTES"])
def test_json_null_in_data_is_a_clear_400(datatype: str) -> None:
    """A null element is bad data like any other (it once slipped past the element check and crashed)."""
    body = json.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": [2], "data": [None, 1]}]})
    with pytest.raises(ProtocolError) as e:
        decode_infer_request(body.encode())
    assert e.value.status == 400
    assert f"input 'x': {datatype} data must be" in e.value.message and e.value.message.endswith("null")


# ----------------------------------------------------------------------------------- JSON fast path


_NUMERIC = sorted(DATATYPES.keys() - {"BYTES", "BOOL"})
# JSON scalars a client may put in a numeric tensor's data, mostly numbers (the fast path's case) and now and
# then what it must hand to the general path: booleans (0 and 1 are where they hide), null, strings, nested
# lists, integers beyond 64 bits or near the edges of each type, floats that overflow FP16/FP32.
_EDGE_INTS = [0, 1, -1, 127, 128, -128, -129, 255, 256, 2**15, 2**31, -(2**31) - 1, 2**32, 2**53, 2**53 + 1,
              2**60 + 2**36 + 1, 2**63 - 1, -(2**63), 2**63, 2**64 - 1, 2**64, 10**30]
_scalars = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    st.integers(-(2**70), 2**70),
    st.sampled_from(_EDGE_INTS),
    st.sampled_from([0.0, 1.0, -0.0, 65504.0, 65520.0, 3.4e38, 3.5e38, 1e308]),
)
_odd = st.one_of(st.booleans(), st.none(), st.text(max_size=3), st.lists(st.integers(0, 3), max_size=2))


def _outcome(fn: Any, data: list[Any], datatype: str) -> tuple[str, Any]:
    try:
        with np.errstate(over="ignore"):
            got = fn(data, datatype, (len(data),), len(data), "input 'x'")
    except ProtocolError as e:
        return ("error", e.message)
    return ("array", (got.dtype.str, got.tobytes(), got.shape, got.flags.writeable))


@settings(max_examples=400, deadline=None)
@given(datatype=st.sampled_from(_NUMERIC), data=st.lists(_scalars, max_size=12),
       odd=st.lists(st.tuples(st.integers(0, 12), _odd), max_size=2))
def test_typed_fast_path_gives_exactly_what_the_general_path_gives(datatype: str, data: list[Any],
                                                                   odd: list[tuple[int, Any]]) -> None:
    """``_from_json`` reads a flat list of numbers in one C loop (``_typed_list``) and hands everything else
    to ``_from_json_general``: for any list, the two give the same array to the bit, or the same message."""
    from edgemux.runtime.dataplane import protocol

    data = list(data)
    for pos, value in odd:
        data.insert(min(pos, len(data)), value)
    assert _outcome(protocol._from_json, data, datatype) == _outcome(protocol._from_json_general, data, datatype)


def test_typed_fast_path_takes_the_common_case_and_leaves_the_rest() -> None:
    from edgemux.runtime.dataplane.protocol import _typed_list

    floats = np.random.default_rng(1).standard_normal(300).tolist()
    got = _typed_list(floats, "FP32")
    assert got is not None and got.dtype == np.float32 and np.array_equal(got, np.array(floats, dtype=np.float32))
    assert _typed_list([1, 2, 255], "UINT8") is not None
    for data, datatype in (([1.0, True], "FP32"), ([0, False], "INT32"), ([1.5], "INT64"), (["1.5"], "FP32"),
                           ([None], "FP32"), ([[1.0]], "FP32"), ([256], "UINT8"), ([-1], "UINT64"),
                           ([10**400], "FP32"), ([2**64], "INT64")):
        assert _typed_list(data, datatype) is None, (data, datatype)


# ----------------------------------------------------------------------------------------- model metadata


def test_model_metadata_round_trips_and_reads_variable_dims() -> None:
    ins = [TensorSpec("images", "FP32", (-1, 3, 224, 224))]
    outs = [TensorSpec("logits", "FP32", (-1, 1000)), TensorSpec("ids", "INT64", (-1,))]
    meta = decode_model_metadata(model_metadata_body("classify", ["1"], "onnxruntime_onnx", ins, outs))
    assert meta.name == "classify" and list(meta.inputs) == ins and list(meta.outputs) == outs


@pytest.mark.parametrize(
    "body, message",
    [
        (b"[1]", "expected a JSON object, got array"),
        (b'{"inputs": []}', "'name' must be a non-empty string"),
        (b'{"name": "m", "inputs": {}}', "'inputs' must be an array, got object"),
        (b'{"name": "m", "inputs": [3]}', r"inputs\[0\]: expected an object, got number"),
        (b'{"name": "m", "inputs": [{"name": "x", "datatype": "FP32", "shape": [-2]}]}', "integers >= -1"),
        (b'{"name": "m", "inputs": [{"name": "x", "datatype": "FP99", "shape": [1]}]}', "unsupported datatype"),
        (b'{"name": "m", "outputs": [{"name": 1, "datatype": "FP32", "shape": [1]}]}',
         r"outputs\[0\]: 'name' and 'datatype' must be strings"),
        (b"{nope", "malformed model metadata JSON"),
    ],
)
def test_malformed_model_metadata_is_named(body: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        decode_model_metadata(body)
