"""System shared memory (Triton's extension), read and written by unmodified ``tritonclient.http`` and
``tritonclient.grpc`` with ``tritonclient.utils.shared_memory``, against an agent and a gateway; and every
bad case refused with a clear 4xx / gRPC status: a region outside /dev/shm, offsets beyond it, another app's
region, an unregistered region, a region of a deleted app. /dev/shm is left as it was found."""

from __future__ import annotations

import json
import os
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

tg = pytest.importorskip("tritonclient.grpc")
th = pytest.importorskip("tritonclient.http")
shm = pytest.importorskip("tritonclient.utils.shared_memory")
from tritonclient.utils import InferenceServerException  # noqa: E402

from edgemux.cluster.state import Device, Node  # noqa: E402
from edgemux.cluster.workload import Discipline  # noqa: E402
from edgemux.profiles.types import DeviceKind  # noqa: E402
from edgemux.runtime.auth import digest, new_app_key, new_token  # noqa: E402
from edgemux.runtime.dataplane.agent import Agent  # noqa: E402
from edgemux.runtime.dataplane.backends import EmulatedBackend  # noqa: E402
from edgemux.runtime.dataplane.protocol import InferRequest, InputTensor, RequestedOutput, ShmSlot  # noqa: E402
from edgemux.runtime.dataplane.shm import RegionTable, ShmError  # noqa: E402
from edgemux.runtime.ingress.grpcservice import start_gateway_grpc  # noqa: E402
from edgemux.runtime.ingress.routing import AppRoute  # noqa: E402
from support import ServedAgent  # noqa: E402
from test_runtime_gateway import X, Harness, h, loop_thread  # noqa: E402,F401

if not Path("/dev/shm").is_dir():
    pytest.skip("no /dev/shm on this host", allow_module_level=True)

TOKEN = new_token()
KEY_SQ, KEY_OTHER, KEY_SQ2 = new_app_key(), new_app_key(), new_app_key()
TAG = f"emx{uuid.uuid4().hex[:8]}"  # every region file this module makes starts with it


def bearer(secret: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}"}


@pytest.fixture(scope="module", autouse=True)
def dev_shm_left_clean() -> Iterator[None]:
    """Nothing of this module's is left in /dev/shm (the client destroys what it made; the server never
    makes or keeps a region file)."""
    yield
    assert [n for n in os.listdir("/dev/shm") if n.startswith(TAG)] == []


class Region:
    """A region file this test made (``tritonclient.utils.shared_memory``), destroyed on exit."""

    def __init__(self, name: str, size: int) -> None:
        self.name, self.key, self.size = name, f"/{TAG}{name}", size
        self.handle = shm.create_shared_memory_region(name, self.key, size)

    def __enter__(self) -> Region:
        return self

    def __exit__(self, *exc: Any) -> None:
        shm.destroy_shared_memory_region(self.handle)


# ---------------------------------------------------------------------------------------- the region table


def _req(inputs: list[InputTensor], outputs: list[RequestedOutput] = ()) -> InferRequest:  # type: ignore[assignment]
    return InferRequest(None, {}, inputs, list(outputs))


def test_a_region_is_a_file_directly_under_dev_shm_and_nothing_else(tmp_path: Path) -> None:
    table = RegionTable()
    with Region("ok", 64) as r:
        os.symlink(f"/dev/shm/{TAG}ok", f"/dev/shm/{TAG}link")
        try:
            for key, problem in (("/../etc/passwd", "key must be '/' and a name"), ("etc/passwd", "key must be"),
                                 ("/a/b", "key must be"), ("/..", "key must be"), (f"/{TAG}none", "no shared memory object"),
                                 (f"/{TAG}link", "cannot open"), (7, "key must be")):
                with pytest.raises(ShmError) as err:
                    table.register("cam", "x", key, 0, 8)
                assert problem in err.value.message and err.value.status == 400, key
        finally:
            os.unlink(f"/dev/shm/{TAG}link")
        for offset, size, problem in ((60, 8, "runs past the end"), (0, 65, "runs past the end"),
                                      (-1, 8, "offset must be a non-negative"), (0, 0, "byte_size must be > 0"),
                                      (0, True, "byte_size must be a non-negative")):
            with pytest.raises(ShmError) as err:
                table.register("cam", "x", r.key, offset, size)
            assert problem in err.value.message, (offset, size)
        assert not table
        table.register("cam", "x", r.key, 8, 56)
        with pytest.raises(ShmError) as err:
            table.register("cam", "x", r.key, 0, 8)
        assert err.value.status == 409
        table.close()


def test_each_credential_sees_and_uses_only_its_regions() -> None:
    table = RegionTable(limit_bytes=100)
    with Region("a", 64) as r:
        table.register("cam", "frame", r.key, 0, 64)
        table.register("det", "frame", r.key, 0, 16)  # the same name, another credential's: no clash
        assert table.status("det", None) == [{"name": "frame", "key": r.key, "offset": 0, "byte_size": 16}]
        with pytest.raises(ShmError) as err:
            table.register("cam", "more", r.key, 0, 40)  # 64 + 40 > 100 for this credential
        assert err.value.status == 413
        slot = ShmSlot("frame", 0, 64)
        with pytest.raises(ShmError) as err:  # det's region is 16 bytes: a 64-byte slot runs past it
            table.read_inputs("det", _req([InputTensor("x", "UINT8", (64,), np.empty(0), {}, slot)]))
        assert "runs past region 'frame' (16 bytes)" in err.value.message
        with pytest.raises(ShmError) as err:
            table.read_inputs("pose", _req([InputTensor("x", "UINT8", (64,), np.empty(0), {}, slot)]))
        assert "no shared memory region 'frame' is registered with this credential" in err.value.message
        shm.set_shared_memory_region(r.handle, [np.arange(64, dtype=np.uint8)])
        req = _req([InputTensor("x", "UINT8", (8, 8), np.empty(0), {}, slot)],
                   [RequestedOutput("y", None, ShmSlot("frame", 32, 32)), RequestedOutput("z", None, ShmSlot("frame", 0, 4))])
        table.read_inputs("cam", req)
        assert req.input("x").ravel().tolist() == list(range(64))
        written = table.write_outputs("cam", req, {"y": np.full(8, 7, np.int32)})
        assert written == {"y": ShmSlot("frame", 32, 32)}
        assert shm.get_contents_as_numpy(r.handle, np.int32, [8], offset=32).tolist() == [7] * 8
        with pytest.raises(ShmError) as err:
            table.write_outputs("cam", req, {"z": np.zeros(2, np.int32)})  # 8 bytes for a 4-byte slot
        assert "is 8 bytes, more than its shared memory slot of 4 bytes" in err.value.message
        assert table.release("cam") == 1 and table.holds("det") and not table.holds("cam")
        table.close()
        assert not table


# --------------------------------------------------------------------------------------------- the agent


class Served(ServedAgent):
    """An agent with the admin token, HTTP and gRPC, and two apps: ``sq`` (squeezenet at 32x32 on the cpu
    device, real ONNX Runtime: its outputs depend on its inputs) and ``other`` (an emulated Edge TPU)."""

    def __init__(self) -> None:
        devices = (Device("n1", "tpu0", DeviceKind.EDGETPU, Discipline.FCFS, 8.0, "ibis-edgetpu"),
                   Device("n1", "cpu0", DeviceKind.CPU, Discipline.PS, 2048.0))
        super().__init__(Agent(Node("n1", 2.0, 4096.0, devices), token=TOKEN,
                               backends={"tpu0": EmulatedBackend(seed=0, sleep=lambda _s: None)}),
                         grpc=True, token=TOKEN)
        for app, key, spec in (("sq", KEY_SQ, {"device": "cpu0", "model": "zoo:squeezenet1_1@32"}),
                               ("other", KEY_OTHER, {"device": "tpu0", "model": "zoo:mobilenet_v2@32",
                                                     "profile": "ibis-edgetpu/mobilenet_v2"})):
            self.put(app, {**spec, "key_sha256": digest(key)})
        meta = json.loads(self.get("/v2/models/sq", KEY_SQ))
        (inp,), (out,) = meta["inputs"], meta["outputs"]
        self.input, self.output = inp["name"], out["name"]
        self.shape = [1, *inp["shape"][1:]]
        self.x = np.random.default_rng(0).random(self.shape, dtype=np.float32)
        self.out_bytes = 4 * int(np.prod(out["shape"][1:]))

    def get(self, path: str, secret: str) -> bytes:
        req = urllib.request.Request(self.server.url + path, headers={"Authorization": f"Bearer {secret}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return bytes(r.read())

    def clients(self) -> list[tuple[Any, Any]]:
        return [(th, th.InferenceServerClient(self.server.url.removeprefix("http://"))),
                (tg, tg.InferenceServerClient(self.grpc_address))]

@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    s = Served()
    yield s
    s.stop()


def refusal(fn: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as err:
        fn()
    return err.value


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inputs_and_outputs_in_shared_memory_at_the_agent(served: Served, protocol: str) -> None:
    mod, c = served.clients()[0 if protocol == "http" else 1]
    auth = bearer(KEY_SQ)
    plain_in = mod.InferInput(served.input, served.shape, "FP32")
    plain_in.set_data_from_numpy(served.x)
    want = c.infer("sq", [plain_in], headers=dict(auth)).as_numpy(served.output)
    with Region("in", served.x.nbytes) as rin, Region("out", served.out_bytes + 64) as rout:
        shm.set_shared_memory_region(rin.handle, [served.x])
        c.register_system_shared_memory("in", rin.key, rin.size, headers=dict(auth))
        c.register_system_shared_memory("out", rout.key, rout.size, headers=dict(auth))
        status = c.get_system_shared_memory_status(headers=dict(auth), **({"as_json": True} if mod is tg else {}))
        names = sorted(status["regions"]) if mod is tg else sorted(r["name"] for r in status)
        assert names == ["in", "out"]
        i = mod.InferInput(served.input, served.shape, "FP32")
        i.set_shared_memory("in", rin.size)
        o = mod.InferRequestedOutput(served.output)
        o.set_shared_memory("out", served.out_bytes, offset=64)
        r = c.infer("sq", [i], outputs=[o], headers=dict(auth))
        got = shm.get_contents_as_numpy(rout.handle, np.float32, list(want.shape), offset=64)
        np.testing.assert_array_equal(got, want)
        entry = r.get_output(served.output)
        params = entry["parameters"] if mod is th else {k: v.string_param or v.int64_param
                                                         for k, v in entry.parameters.items()}
        assert params["shared_memory_region"] == "out" and int(params["shared_memory_byte_size"]) == served.out_bytes
        c.unregister_system_shared_memory(headers=dict(auth))
        assert not served.agent.regions.holds("sq")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bad_shared_memory_is_refused_clearly_at_the_agent(served: Served, protocol: str) -> None:
    mod, c = served.clients()[0 if protocol == "http" else 1]
    auth, other = bearer(KEY_SQ), bearer(KEY_SQ2)
    bad_request = "400" if mod is th else "StatusCode.INVALID_ARGUMENT"
    with Region("b", served.x.nbytes) as r:
        e = refusal(lambda: c.register_system_shared_memory("x", "/../../etc/passwd", 8, headers=dict(auth)))
        assert bad_request in str(e.status()) and "key must be '/' and a name" in e.message()
        e = refusal(lambda: c.register_system_shared_memory("x", r.key, r.size + 1, headers=dict(auth)))
        assert "runs past the end" in e.message()
        c.register_system_shared_memory("b", r.key, r.size, headers=dict(auth))

        def infer(region: str, secret: dict[str, str], offset: int = 0) -> Any:
            i = mod.InferInput(served.input, served.shape, "FP32")
            i.set_shared_memory(region, served.x.nbytes, offset=offset)
            return c.infer("sq", [i], headers=dict(secret))

        e = refusal(lambda: infer("b", auth, offset=4))
        assert bad_request in str(e.status()) and "runs past region 'b'" in e.message()
        e = refusal(lambda: infer("nope", auth))
        assert "no shared memory region 'nope' is registered with this credential" in e.message()
        # another app's key may not use it, even on its own app: to that key the region does not exist
        served.put("sq2", {"device": "cpu0", "model": "zoo:squeezenet1_1@32", "key_sha256": digest(KEY_SQ2)})
        i = mod.InferInput(served.input, served.shape, "FP32")
        i.set_shared_memory("b", served.x.nbytes)
        e = refusal(lambda: c.infer("sq2", [i], headers=dict(other)))
        assert "no shared memory region 'b' is registered with this credential" in e.message()
        assert refusal(lambda: c.get_system_shared_memory_status("b", headers=dict(other))).status() in (
            "404", "StatusCode.NOT_FOUND")
        e = refusal(lambda: c.unregister_system_shared_memory("b", headers=dict(other)))
        assert "no shared memory region 'b'" in e.message()
        assert refusal(lambda: c.get_system_shared_memory_status()).status() in ("401", "StatusCode.UNAUTHENTICATED")
        # the app deleted: its key's regions are released
        del_req = urllib.request.Request(f"{served.server.url}/v1/apps/sq2", method="DELETE",
                                         headers={"Authorization": f"Bearer {TOKEN}"})
        urllib.request.urlopen(del_req, timeout=60).read()
        served.put("sq2", {"device": "cpu0", "model": "zoo:squeezenet1_1@32", "key_sha256": digest(KEY_SQ2)})
        c.register_system_shared_memory("mine", r.key, r.size, headers=dict(other))
        urllib.request.urlopen(urllib.request.Request(f"{served.server.url}/v1/apps/sq2", method="DELETE",
                                                      headers={"Authorization": f"Bearer {TOKEN}"}), timeout=60).read()
        assert not served.agent.regions.holds("sq2")
        c.unregister_system_shared_memory(headers=dict(auth))


# ------------------------------------------------------------------------------------------- the gateway


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_gateway_passes_shared_memory_on_to_an_agent_on_its_host(served: Served, protocol: str) -> None:
    """To an agent on its host, the gateway passes the caller's slots on by their objects: the agent reads
    the inputs out of the caller's memory and writes the outputs into it, and the gateway touches no tensor
    byte; the caller sees its own region names, and the same outputs as a plain request's."""
    from edgemux.runtime.httputil import start_site
    from edgemux.runtime.ingress.gateway import Gateway, make_app

    gw = Gateway({"sq": AppRoute("sq", "sq", [(served.server.url, 1.0)], 1e6, 1e6, key_sha256=digest(KEY_SQ))},
                 token=TOKEN)
    site = served.lt.run(start_site(make_app(gw), "127.0.0.1", 0))
    grpc_site = served.lt.run(start_gateway_grpc(gw, "127.0.0.1", 0))
    touched: list[str] = []
    gw.regions.read_inputs = lambda *a: touched.append("read")  # type: ignore[method-assign]
    gw.regions.write_outputs = lambda *a: touched.append("write") or {}  # type: ignore[method-assign]
    try:
        mod, c = ((th, th.InferenceServerClient(site.url.removeprefix("http://"))) if protocol == "http"
                  else (tg, tg.InferenceServerClient(grpc_site.address)))
        auth = bearer(KEY_SQ)
        plain = mod.InferInput(served.input, served.shape, "FP32")
        plain.set_data_from_numpy(served.x)
        want = c.infer("sq", [plain], headers=dict(auth)).as_numpy(served.output)
        with Region("pin", served.x.nbytes + 8) as rin, Region("pout", served.out_bytes) as rout:
            shm.set_shared_memory_region(rin.handle, [served.x], offset=8)
            c.register_system_shared_memory("in", rin.key, rin.size, headers=dict(auth))
            c.register_system_shared_memory("out", rout.key, rout.size, headers=dict(auth))
            i = mod.InferInput(served.input, served.shape, "FP32")
            i.set_shared_memory("in", served.x.nbytes, offset=8)
            o = mod.InferRequestedOutput(served.output)
            o.set_shared_memory("out", served.out_bytes)
            r = c.infer("sq", [i], outputs=[o], headers=dict(auth))
            np.testing.assert_array_equal(shm.get_contents_as_numpy(rout.handle, np.float32, list(want.shape)), want)
            entry = r.get_output(served.output)
            params = entry["parameters"] if mod is th else {k: v.string_param or v.int64_param
                                                             for k, v in entry.parameters.items()}
            assert params == {"shared_memory_region": "out", "shared_memory_byte_size": served.out_bytes}
            assert touched == []
            c.unregister_system_shared_memory(headers=dict(auth))
    finally:
        served.lt.run(grpc_site.stop())
        served.lt.run(site.stop())


def test_only_a_gateways_pass_through_names_a_slot_by_its_object(served: Served) -> None:
    """``edgemux_shm_key`` is honoured only in a request with the gateway's marks beside the admin token:
    not with an app's key, not with the admin token alone; and a tenant's body forwarded through a gateway
    as it came (the gateway does not write the pass-through mark on it, nor pass a caller's on) cannot name
    an object, nor reach a region the admin registered at the agent."""
    import http.client

    from edgemux.runtime.auth import POLICED_HEADER
    from edgemux.runtime.dataplane.shm import PASSED_ON_HEADER
    from edgemux.runtime.httputil import start_site
    from edgemux.runtime.ingress.gateway import Gateway, make_app

    def post(port: int, body: str, headers: dict[str, str]) -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request("POST", "/v2/models/sq/infer", body, headers)
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read()).get("error", "")
        finally:
            conn.close()

    port = int(served.server.url.rsplit(":", 1)[1])
    gw = Gateway({"sq": AppRoute("sq", "sq", [(served.server.url, 1.0)], 1e6, 1e6, key_sha256=digest(KEY_SQ))},
                 token=TOKEN)
    site = served.lt.run(start_site(make_app(gw), "127.0.0.1", 0))
    gw_port = int(site.url.rsplit(":", 1)[1])
    try:
        with Region("k", served.x.nbytes) as r:
            slot = {"edgemux_shm_key": r.key, "edgemux_shm_offset": 0, "shared_memory_byte_size": served.x.nbytes}
            body = json.dumps({"inputs": [{"name": served.input, "datatype": "FP32", "shape": served.shape,
                                           "parameters": slot}]})
            admin = {"Authorization": f"Bearer {TOKEN}"}
            marks = {POLICED_HEADER: "gateway", PASSED_ON_HEADER: "gateway"}
            got = {"app key": post(port, body, {"Authorization": f"Bearer {KEY_SQ}", **marks}),
                   "admin alone": post(port, body, admin),
                   "gateway's marks": post(port, body, {**admin, **marks}),
                   # a tenant sending the marks and the slot to the gateway: forwarded without the pass-through mark
                   "through the gateway": post(gw_port, body, {"Authorization": f"Bearer {KEY_SQ}", **marks})}
            # the admin's own region at the agent, named by a tenant's request through the gateway
            served.agent.regions.register("@admin", "adm", r.key, 0, r.size)
            named = json.dumps({"inputs": [{"name": served.input, "datatype": "FP32", "shape": served.shape,
                                            "parameters": {"shared_memory_region": "adm",
                                                           "shared_memory_byte_size": served.x.nbytes}}]})
            got["admin's region via the gateway"] = post(gw_port, named, {"Authorization": f"Bearer {KEY_SQ}"})
            served.agent.regions.unregister("@admin", "adm")
    finally:
        served.lt.run(site.stop())
    assert got["gateway's marks"][0] == 200
    for case in ("app key", "admin alone", "through the gateway"):
        assert got[case][0] == 403 and "is a gateway's" in got[case][1], (case, got[case])
    status, error = got["admin's region via the gateway"]
    assert status == 400 and "no shared memory region 'adm' is registered with this credential" in error


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inputs_and_outputs_in_shared_memory_through_the_gateway(h: Harness, protocol: str) -> None:
    """The gateway, on the caller's host, reads the inputs from the caller's region and writes the outputs
    into it when the agent is not on its host (here: pass-through off); the agents (the harness's, answering
    2 * x) see an ordinary binary request."""
    key = new_app_key()
    agent = h.agent()
    gw, url = h.gateway({"app": AppRoute("app", "m", [(agent.url, 1.0)], 1e6, 1e6, key_sha256=digest(key))},
                        token=TOKEN, shm_pass_through=False)  # the harness's agent is no edgemux agent
    if protocol == "grpc":
        site = h.lt.run(start_gateway_grpc(gw, "127.0.0.1", 0))
        h.runners.append(site)
        mod, c = tg, tg.InferenceServerClient(site.address)
    else:
        mod, c = th, th.InferenceServerClient(url.removeprefix("http://"))
    auth = bearer(key)
    with Region("gin", X.nbytes) as rin, Region("gout", X.nbytes) as rout:
        shm.set_shared_memory_region(rin.handle, [X])
        c.register_system_shared_memory("in", rin.key, rin.size, headers=dict(auth))
        c.register_system_shared_memory("out", rout.key, rout.size, headers=dict(auth))
        i = mod.InferInput("x", list(X.shape), "FP32")
        i.set_shared_memory("in", X.nbytes)
        o = mod.InferRequestedOutput("x_out")
        o.set_shared_memory("out", X.nbytes)
        c.infer("app", [i], outputs=[o], headers=dict(auth))
        np.testing.assert_array_equal(shm.get_contents_as_numpy(rout.handle, np.float32, list(X.shape)), 2 * X)
        assert agent.header_lengths[-1] is not None  # the agent got the tensor in a binary request
        i.set_shared_memory("in", X.nbytes, offset=4)
        e = refusal(lambda: c.infer("app", [i], outputs=[o], headers=dict(auth)))
        assert "runs past region 'in'" in e.message()
        # plain requests of the same caller still pass (decoded, not shared memory: passed on as they came)
        plain = mod.InferInput("x", list(X.shape), "FP32")
        plain.set_data_from_numpy(X)
        np.testing.assert_array_equal(c.infer("app", [plain], headers=dict(auth)).as_numpy("x_out"), 2 * X)
        gw.remove_route("app")  # the app gone: its regions are released
        assert not gw.regions


# -------------------------------------------------------------------------------------------------- fuzz

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), database=None)
_name = st.sampled_from(["in", "b", "x"]) | st.text(max_size=20)
_key = st.sampled_from([f"/{TAG}fz", "/../etc/passwd", "/", "/dev/shm", f"/{TAG}none"]) | st.text(max_size=30)
_size = st.sampled_from([0, 1, 64, 4096, 4097, 2**40]) | st.integers(-5, 10**6) | st.booleans() | st.none()


@_FUZZ
@given(op=st.sampled_from(["register", "status", "unregister", "unregister-all", "status-all"]), name=_name,
       body=st.fixed_dictionaries({}, optional={"key": _key, "offset": _size, "byte_size": _size,
                                                "extra": st.integers()}) | st.binary(max_size=40),
       secret=st.sampled_from([KEY_SQ, TOKEN, None, "junk"]))
def test_fuzz_shared_memory_endpoints_never_5xx(served: Served, op: str, name: str, body: Any, secret: str | None) -> None:
    """Every answer of the HTTP endpoints is a 2xx or a 4xx with a JSON error, whatever comes; no region file
    appears (the server makes none), and what was registered is unregistered again."""
    import http.client
    import urllib.parse

    quoted = urllib.parse.quote(name, safe="")
    path = {"register": f"/v2/systemsharedmemory/region/{quoted}/register",
            "status": f"/v2/systemsharedmemory/region/{quoted}/status",
            "unregister": f"/v2/systemsharedmemory/region/{quoted}/unregister",
            "unregister-all": "/v2/systemsharedmemory/unregister",
            "status-all": "/v2/systemsharedmemory/status"}[op]
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    u = urllib.parse.urlsplit(served.server.url)
    with Region("fz", 4096):
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        try:
            conn.request("GET" if "status" in op else "POST", path, data if op == "register" else None,
                         {"Authorization": f"Bearer {secret}"} if secret else {})
            r = conn.getresponse()
            status, answer = r.status, r.read()
        finally:
            conn.close()
        assert status < 500, (status, answer[:200])
        if status >= 400:
            assert isinstance(json.loads(answer)["error"], str)
        for owner in ("sq", "@admin"):
            served.agent.regions.unregister(owner, None)
    assert [n for n in os.listdir("/dev/shm") if n.startswith(TAG)] == []


@_FUZZ
@given(name=_name, key=_key, offset=st.integers(0, 2**64 - 1), size=st.integers(0, 2**64 - 1),
       secret=st.sampled_from([KEY_SQ, TOKEN, None]))
def test_fuzz_shared_memory_rpcs_never_internal(served: Served, name: str, key: str, offset: int, size: int,
                                                secret: str | None) -> None:
    import grpc

    from edgemux.runtime.dataplane.grpcwire import messages

    with Region("fz", 4096), grpc.insecure_channel(served.server.grpc.address) as channel:
        for rpc, msg, cls in (
                ("SystemSharedMemoryRegister", messages.SystemSharedMemoryRegisterRequest(
                    name=name, key=key, offset=offset, byte_size=size), messages.SystemSharedMemoryRegisterResponse),
                ("SystemSharedMemoryStatus", messages.SystemSharedMemoryStatusRequest(name=name),
                 messages.SystemSharedMemoryStatusResponse),
                ("SystemSharedMemoryUnregister", messages.SystemSharedMemoryUnregisterRequest(name=name),
                 messages.SystemSharedMemoryUnregisterResponse)):
            call = channel.unary_unary(f"/inference.GRPCInferenceService/{rpc}",
                                       request_serializer=lambda m: m.SerializeToString(),
                                       response_deserializer=cls.FromString)
            try:
                call(msg, metadata=tuple(bearer(secret).items()) if secret else (), timeout=30)
            except grpc.RpcError as e:
                assert e.code() not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), (rpc, e.details())
        for owner in ("sq", "@admin"):
            served.agent.regions.unregister(owner, None)
    assert [n for n in os.listdir("/dev/shm") if n.startswith(TAG)] == []


# ---------------------------------------------------------------------------------------- load generator


def _load_files() -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"edgemux-load-{os.getpid()}-")]


def test_the_load_generator_hands_tensors_over_in_shared_memory_on_this_host(served: Served) -> None:
    """On this host, a request of 64 KiB of tensors or more goes in shared memory (its region made,
    registered, unregistered and removed by the run), a smaller one as binary HTTP; shm=False never."""
    import asyncio

    from edgemux.runtime.tools.load import SHM_MIN_BYTES, run_load

    assert served.x.nbytes < SHM_MIN_BYTES  # squeezenet at 32x32: 12 kB
    small = {served.input: served.x}
    runs = {}
    for label, inputs, shm_arg in (("auto-small", small, None), ("forced", small, True), ("off", small, False)):
        runs[label] = asyncio.run(run_load(served.server.url, "sq", rate_rps=50, duration_s=0.3, inputs=inputs,
                                           key=KEY_SQ, shm=shm_arg))
    big_inputs = {served.input: np.zeros([int(np.ceil(SHM_MIN_BYTES / served.x.nbytes)), *served.shape[1:]],
                                         np.float32)}
    runs["auto-big"] = asyncio.run(run_load(served.server.url, "sq", rate_rps=50, duration_s=0.3,
                                            inputs=big_inputs, key=KEY_SQ))
    assert {k: r.transport for k, r in runs.items()} == {
        "auto-small": "binary", "forced": "shm", "off": "binary", "auto-big": "shm"}
    assert all(r.ok == r.sent and r.sent > 0 for r in runs.values()), {k: r.errors for k, r in runs.items()}
    assert not served.agent.regions.holds("sq") and _load_files() == []


def test_the_load_generator_falls_back_where_shared_memory_is_not_served(h: Harness) -> None:
    """A server that does not take the registration (the harness's agent has no such endpoint) gets binary
    when shared memory was not asked for, and a clear LoadError when it was."""
    import asyncio

    from edgemux.runtime.tools.load import LoadError, run_load

    agent = h.agent()
    big = {"x": np.zeros((40000, 3), np.float32)}
    report = asyncio.run(run_load(agent.url, "m", rate_rps=20, duration_s=0.2, inputs=big))
    assert report.transport == "binary" and report.ok == report.sent > 0
    with pytest.raises(LoadError) as err:
        asyncio.run(run_load(agent.url, "m", rate_rps=20, duration_s=0.2, inputs=big, shm=True))
    assert "cannot register shared memory at" in str(err.value)
    assert _load_files() == []


# ------------------------------------------------------------------------------------------- the client


def test_the_python_client_hands_big_inputs_over_in_shared_memory(served: Served) -> None:
    """edgemux's Client, on the agent's host: a request of SHM_MIN_BYTES or more of tensors goes in shared
    memory (its thread's region, registered with the app's key), a smaller one binary; the outputs are the
    same either way; close() unregisters and removes the region."""
    from edgemux.runtime.dataplane.shm import SHM_MIN_BYTES
    from edgemux.runtime.ingress.client import Client

    route = AppRoute("sq", "sq", [(served.server.url, 1.0)], 1e6, 1e6)
    batch = int(np.ceil(SHM_MIN_BYTES / served.x.nbytes))
    big = np.repeat(served.x, batch, axis=0)
    with Client([route], keys={"sq": KEY_SQ}, shm=False) as plain:
        want_small = plain.infer("sq", {served.input: served.x}).as_numpy(served.output)
        want_big = plain.infer("sq", {served.input: big}).as_numpy(served.output)
    client = Client([route], keys={"sq": KEY_SQ})
    try:
        np.testing.assert_array_equal(client.infer("sq", {served.input: served.x}).as_numpy(served.output), want_small)
        assert not served.agent.regions.holds("sq")  # small: binary
        for _ in range(2):
            got = client.infer("sq", {served.input: big}).as_numpy(served.output)
            np.testing.assert_array_equal(got, want_big)
        assert served.agent.regions.holds("sq")
        assert [n for n in os.listdir("/dev/shm") if n.startswith(f"edgemux-client-{os.getpid()}-")]
    finally:
        client.close()
    assert not served.agent.regions.holds("sq")
    assert [n for n in os.listdir("/dev/shm") if n.startswith(f"edgemux-client-{os.getpid()}-")] == []
