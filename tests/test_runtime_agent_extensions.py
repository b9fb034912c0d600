"""The agent's Triton protocol extensions beyond plain inference: the binary extension's raw request (a body that
is only the tensor, ``Inference-Header-Content-Length: 0``) and the statistics extension, read by an unmodified
tritonclient."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from edgemux.cluster.state import Device, Node
from edgemux.cluster.workload import Discipline
from edgemux.profiles.types import DeviceKind
from edgemux.runtime.dataplane.agent import Agent
from edgemux.runtime.dataplane.backends import EmulatedBackend
from edgemux.runtime.dataplane.protocol import HEADER_LENGTH_HEADER, decode_infer_response
from support import ServedAgent

TPU_MODEL = {"device": "tpu0", "model": "zoo:mobilenet_v2@32", "profile": "ibis-edgetpu/mobilenet_v2"}


class Served(ServedAgent):
    """An open agent with one emulated Edge TPU and app ``cam`` on it."""

    def __init__(self) -> None:
        dev = Device("n1", "tpu0", DeviceKind.EDGETPU, Discipline.FCFS, 8.0, "ibis-edgetpu")
        super().__init__(Agent(Node("n1", 2.0, 4096.0, (dev,)),
                               backends={"tpu0": EmulatedBackend(seed=0, sleep=lambda _s: None)}))
        assert self.put("cam", TPU_MODEL, 60) == 201

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        u = urllib.parse.urlsplit(self.url)
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        try:
            c.request("POST", path, body, headers)
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            c.close()


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    s = Served()
    yield s
    s.stop()


def test_a_raw_binary_request_is_answered_like_triton_answers_it(served: Served) -> None:
    """The body is the input's bytes alone: its name, datatype and shape come from the model, a variable
    leading dimension from the body's size, and every output comes back binary (with its JSON header)."""
    (spec,) = served.agent.pieces("cam")[0].interface.inputs
    assert (spec.datatype, spec.shape) == ("UINT8", (-1, 32, 32, 3))
    x = np.arange(2 * 32 * 32 * 3, dtype=np.uint32).astype(np.uint8).reshape(2, 32, 32, 3)
    status, headers, body = served.post("/v2/models/cam/infer", x.tobytes(),
                                        {HEADER_LENGTH_HEADER: "0", "Content-Type": "application/octet-stream"})
    assert status == 200, body
    assert HEADER_LENGTH_HEADER.lower() in headers  # outputs binary, after a JSON header
    res = decode_infer_response(body, headers[HEADER_LENGTH_HEADER.lower()])
    (out,) = res.outputs.values()
    assert out.shape[0] == 2  # the batch deduced from the body: two pictures
    header = json.loads(body[: int(headers[HEADER_LENGTH_HEADER.lower()])])
    assert all("binary_data_size" in o["parameters"] for o in header["outputs"])


@pytest.mark.parametrize("size, words", [
    (32 * 32 * 3 + 1, "expected a multiple of 3072 bytes (UINT8 [-1,32,32,3]), got 3073"),
    (0, "expected a multiple of 3072 bytes"),
])
def test_a_raw_binary_request_of_the_wrong_size_is_400_naming_both(served: Served, size: int, words: str) -> None:
    status, _, body = served.post("/v2/models/cam/infer", b"\0" * size, {HEADER_LENGTH_HEADER: "0"})
    assert status == 400 and words in json.loads(body)["error"], body


def test_statistics_of_an_app_after_n_requests_equal_n(served: Served) -> None:
    import tritonclient.http as th

    tc = th.InferenceServerClient(served.url.removeprefix("http://"))
    try:
        assert "statistics" in tc.get_server_metadata()["extensions"]
        before = tc.get_inference_statistics("cam")["model_stats"][0]
        n = 5
        x = np.zeros((1, 32, 32, 3), np.uint8)
        inp = th.InferInput("input", list(x.shape), "UINT8")
        inp.set_data_from_numpy(x, binary_data=True)
        for _ in range(n):
            tc.infer("cam", [inp])
        bad = th.InferInput("input", [1, 3], "UINT8")
        bad.set_data_from_numpy(np.zeros((1, 3), np.uint8))
        with pytest.raises(Exception):
            tc.infer("cam", [bad])
        after = tc.get_inference_statistics("cam")["model_stats"][0]
        everyone = tc.get_inference_statistics()["model_stats"]
    finally:
        tc.close()
    inf = after["inference_stats"]
    assert after["name"] == "cam" and after["version"] == "1"
    assert inf["success"]["count"] - before["inference_stats"]["success"]["count"] == n
    assert after["inference_count"] - before["inference_count"] == n
    assert inf["fail"]["count"] - before["inference_stats"]["fail"]["count"] == 1
    for part in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert inf[part]["count"] == inf["success"]["count"] and inf[part]["ns"] >= 0
    assert inf["success"]["ns"] >= inf["compute_infer"]["ns"] > 0 and after["last_inference"] > 0
    assert [s["name"] for s in everyone] == ["cam"]


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_statistics_of_an_unknown_app_is_404(served: Served) -> None:
    status, doc = _get(f"{served.url}/v2/models/nope/stats")
    assert status == 404 and "nope" in doc["error"]


def test_the_repository_index_lists_the_apps_as_models(served: Served) -> None:
    import tritonclient.http as th

    tc = th.InferenceServerClient(served.url.removeprefix("http://"))
    try:
        assert tc.get_model_repository_index() == [{"name": "cam", "version": "1", "state": "READY", "reason": ""}]
    finally:
        tc.close()
    status, _, body = served.post("/v2/repository/index", b'{"ready": true}', {"Content-Type": "application/json"})
    assert status == 200 and [m["name"] for m in json.loads(body)] == ["cam"]
    status, _, body = served.post("/v2/repository/index", b'{"redy": true}', {"Content-Type": "application/json"})
    assert status == 400 and "expected {} or" in json.loads(body)["error"]


def test_every_json_answer_has_the_protocols_shape(served: Served) -> None:
    """The JSON of server and model metadata, statistics, the repository index and the shared-memory status
    parse strictly (no unknown field, every value of its field's type) into the protocol's own messages
    (``dataplane.grpcwire``: Triton's JSON for these extensions is the protobuf JSON of the same messages),
    so a field misnamed or mistyped here fails; the tensors' ``parameters`` (quantization), an addition the
    OpenAPI spec's open objects allow, are checked apart."""
    from google.protobuf import json_format

    from edgemux.runtime.dataplane.grpcwire import messages

    def strict(cls: Any, doc: Any) -> None:
        json_format.ParseDict(doc, cls())  # raises on an unknown field or a value of the wrong type

    _, server = _get(f"{served.url}/v2")
    strict(messages.ServerMetadataResponse, server)
    _, model = _get(f"{served.url}/v2/models/cam")
    for t in model["inputs"] + model["outputs"]:
        params = t.pop("parameters", {})
        assert set(params) <= {"quantization"}
    strict(messages.ModelMetadataResponse, model)
    _, stats = _get(f"{served.url}/v2/models/cam/stats")
    strict(messages.ModelStatisticsResponse, stats)
    _, every = _get(f"{served.url}/v2/models/stats")
    strict(messages.ModelStatisticsResponse, every)
    status, _, body = served.post("/v2/repository/index", b"{}", {"Content-Type": "application/json"})
    strict(messages.RepositoryIndexResponse, {"models": json.loads(body)})
    _, regions = _get(f"{served.url}/v2/systemsharedmemory/status")
    strict(messages.SystemSharedMemoryStatusResponse, {"regions": {r["name"]: r for r in regions}})
    with pytest.raises(json_format.ParseError):  # the check can fail
        strict(messages.ModelStatisticsResponse, {"model_stats": [{"name": "cam", "inference_count": "many"}]})
