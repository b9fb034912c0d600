"""edgemux beside the serving systems people already run: the same model, the same request bytes, one run.

Every server serves the same ONNX file (``zoo:squeezenet1_1@64`` exported from edgemux's zoo; input
1x3x64x64 FP32, output 1x1000 FP32) on ONNX Runtime's CPU provider with one intra-op and one inter-op thread
(``benchmarks/peers/onnx_session.py``, the options of edgemux's ``OnnxRuntimeBackend``), each in its own
process(es), started by this script and stopped before the next one starts, so that each is measured alone:

* edgemux: the agent (``edgemux agent``, node ``cpu-1`` of ``examples/local/cluster.yaml``: a REAL cpu
  device) and, in front of it, the gateway (``edgemux gateway``, policing and routing; a route pushed to it)
  and the relay floor (``peers/floor_relay.py``: the least one hop through a Python proxy does), so that the
  gateway's added overhead is read against the agent's own and against the hop's;
* KServe's ModelServer, Ray Serve, MLServer and PyTriton (NVIDIA Triton's core), each in its own virtual
  environment under ``--peers-dir`` (made and installed by this script on first use: pinned versions from
  PyPI, with this interpreter's onnxruntime version), serving the model through the small files in
  ``benchmarks/peers/`` that follow each peer's documented custom-model pattern in its fastest setting.

The requests are the Open Inference Protocol's two forms as ``tritonclient.http`` encodes them, once, sent
as the same bytes to every server: JSON (the tensor as a JSON list, 241 kB) and binary tensor data
(Triton's extension: a JSON header and the raw 49 kB, the answer asked for in binary too). Two more forms
are sent to the servers that are measured with them: gRPC (a ``ModelInferRequest`` with the tensor in
``raw_input_contents``, serialized once, sent on one channel and its answer's bytes not parsed: edgemux's
agent and gateway with ``--grpc-port``, the gRPC floor ``peers/floor_grpc.py``, and the peers that serve the
protocol over gRPC: KServe, MLServer and PyTriton; Ray Serve's gRPC takes a user's own service definitions,
so it has none to measure) and system shared memory (a JSON body naming two regions this script makes, the input in
one and the output written into the other: edgemux's agent and gateway, and PyTriton, whose Triton core serves
the extension). A server that
does not answer a form correctly (the answer is compared with ONNX Runtime's own output) is reported with
what it answered, as is a peer that does not install or start.

Latency: sequential requests on one keep-alive connection from this process (``http.client``, head and body
in one write; answers read whole, not decoded), one form after the other, each form's paths in interleaved
blocks with a direct in-process ``InferenceSession.run`` on the same file, so that a slow moment of the host
hits all of them alike (and one form's large requests do not slow another's: ``measure_latency``).
Overhead = a path's percentile minus the direct call's (p50 and p99), measured in the same phase.

Throughput: ``closedloop.py`` (a separate process) with k concurrent keep-alive clients against each path,
the real model behind it; it shares the host's cores with the server, so the figures are lower bounds.

    .venv/bin/python benchmarks/bench_peers.py [--peers kserve,rayserve,mlserver,pytriton | none]
        [--peers-dir build/peers] [--no-install] [--requests N] [--concurrency 1,4,16] [--seconds S] [--quick]
        [--no-floor] [--aiohttp-floor] [--mix-forms]

The first run installs the peers (about 2 GB, a few minutes). Units: ms (latency), req/s (throughput).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from closedloop import run_level  # benchmarks/closedloop.py, beside this script
from hostload import host_busy_s  # benchmarks/hostload.py, beside this script
from peers.onnx_session import open_session  # benchmarks/peers/, what every peer server serves

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
PEER_FILES = HERE / "peers"
ZOO_MODEL = ("squeezenet1_1", 64)
MODEL = "zoo:squeezenet1_1@64"
APP = "sq"
BLOCK = 20            # requests per path per interleaved block
TARGET_RATIO = 3.0    # edgemux's p50 overhead must be at most a third of the best peer's (issue 17)
GATEWAY_SHARE = 0.5   # the gateway's added p50 overhead at most half the agent's own (issue 33)
OWN_COST_MS = 0.5     # the agent's p50 overhead at most this above the floor's, on JSON and binary (issue 35)
FORMS = ("json", "binary", "shm", "grpc")
START_TIMEOUT_S = 240.0
RELAY_LABEL = "floor relay -> agent"

# The peers, pinned so that a rerun measures the same code; each gets its own virtual environment because
# their dependency pins conflict (e.g. PyTriton wants numpy < 2).
PEER_PACKAGES = {
    "kserve": "kserve==0.21.0",
    "rayserve": "ray[serve]==2.60.0",
    "mlserver": "mlserver==1.7.1",
    "pytriton": "nvidia-pytriton==0.7.0",
}
# the peers that serve the Open Inference Protocol over gRPC (Ray Serve's gRPC takes a user's own service
# definitions, not KServe's, so it has no OIP gRPC endpoint to measure)
GRPC_PEERS = ("kserve", "mlserver", "pytriton")
SHM_PEERS = ("pytriton",)  # Triton's system shared memory extension, on the CPU too
PEER_TITLES = {"edgemux": "edgemux", "kserve": "KServe ModelServer", "rayserve": "Ray Serve (HTTP)",
               "mlserver": "MLServer", "pytriton": "PyTriton (Triton core)",
               "floor": "floor: core+orjson+ORT, no checks",
               "floor-aiohttp": "floor on aiohttp (--aiohttp-floor)"}


class PeerError(Exception):
    """A peer could not be installed or started; the message says why (one line, then a log tail)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, lines: int = 6) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:])


# ------------------------------------------------------------------------------------------ the request


@dataclass(frozen=True)
class Form:
    """One encoding of the request: its body and headers, sent as is to every server that takes it."""

    name: str           # "json", "binary", "shm" (HTTP, the tensors in shared memory) or "grpc"
    body: bytes
    headers: dict[str, str]
    protocol: str = "http"


# the shared-memory form's regions (this process makes and fills them; each endpoint that takes the form
# registers them): the input tensor, and a slot for the output
SHM_IN, SHM_OUT = "bench-in", "bench-out"


def make_forms(x: np.ndarray, input_name: str, output_name: str) -> dict[str, Form]:
    """The JSON and the binary request for input ``x`` as ``tritonclient.http`` writes them (the bytes a
    standard client sends; its JSON is Python's ``json`` of the float32 values widened to float64, 17
    significant digits), each asking for ``output_name`` in its own form."""
    import tritonclient.http as th

    forms = {}
    for name, binary in (("json", False), ("binary", True)):
        inp = th.InferInput(input_name, list(x.shape), th.np_to_triton_dtype(x.dtype))
        inp.set_data_from_numpy(x, binary_data=binary)
        out = th.InferRequestedOutput(output_name, binary_data=binary)
        body, header_length = th.InferenceServerClient.generate_request_body([inp], outputs=[out])
        headers = {"Content-Type": "application/octet-stream" if binary else "application/json"}
        if header_length is not None:
            headers["Inference-Header-Content-Length"] = str(header_length)
        forms[name] = Form(name, bytes(body), headers)
    from edgemux.runtime.dataplane.grpcwire import messages

    msg = messages.ModelInferRequest(model_name=APP)
    msg.inputs.add(name=input_name, datatype="FP32", shape=x.shape)
    msg.outputs.add(name=output_name)
    msg.raw_input_contents.append(x.tobytes())
    forms["grpc"] = Form("grpc", msg.SerializeToString(), {}, "grpc")
    doc = {"inputs": [{"name": input_name, "datatype": "FP32", "shape": list(x.shape), "parameters": {
               "shared_memory_region": SHM_IN, "shared_memory_byte_size": x.nbytes}}],
           "outputs": [{"name": output_name, "parameters": {
               "shared_memory_region": SHM_OUT, "shared_memory_byte_size": OUTPUT_BYTES}}]}
    forms["shm"] = Form("shm", json.dumps(doc).encode(), {"Content-Type": "application/json"})
    return forms


OUTPUT_BYTES = 1000 * 4  # the model's 1x1000 FP32 output


class Shared:
    """The shared-memory form's two regions, made by this process (``dataplane.shm.OwnRegion``), the input
    written once; registered at each endpoint that takes the form (``register``), removed by ``close``."""

    def __init__(self, x: np.ndarray) -> None:
        from edgemux.runtime.dataplane.shm import OwnRegion

        self.inp, self.out = OwnRegion(x.nbytes, prefix="bench-peers"), OwnRegion(OUTPUT_BYTES, prefix="bench-peers")
        self.inp.write(0, x.tobytes())

    def register(self, port: int) -> str | None:
        """Register both regions at the server on ``port``; None, or why it refused."""
        for name, region in ((SHM_IN, self.inp), (SHM_OUT, self.out)):
            base = f"http://127.0.0.1:{port}/v2/systemsharedmemory/region/{name}"
            for action, body in (("unregister", b""), ("register", json.dumps(
                    {"key": region.key, "offset": 0, "byte_size": region.size}).encode())):
                req = urllib.request.Request(f"{base}/{action}", method="POST", data=body,
                                             headers={"Content-Type": "application/json"})
                try:
                    urllib.request.urlopen(req, timeout=30).read()
                except urllib.error.HTTPError as e:
                    if action == "register":
                        return f"HTTP {e.code}: {e.read()[:160].decode('utf-8', 'replace')}"
                except OSError as e:
                    return f"{type(e).__name__}: {e}"
        return None

    def unregister(self, port: int) -> None:
        """Unregister both regions at ``port`` (a server with regions registered decodes a caller's requests
        to look for slots: the other forms are measured without)."""
        for name in (SHM_IN, SHM_OUT):
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/systemsharedmemory/region/{name}/unregister",
                                         method="POST", data=b"")
            try:
                urllib.request.urlopen(req, timeout=30).read()
            except OSError:
                pass

    def output(self) -> bytes:
        return self.out.read(0, OUTPUT_BYTES)

    def close(self) -> None:
        self.inp.close()
        self.out.close()


def check_answer(status: int, body: bytes, header_length: str | None, output_name: str,
                 expected: np.ndarray, form: Form | None = None, shared: Shared | None = None) -> str | None:
    """None when the answer carries ``expected`` (to 1e-4), in its body or (the shared-memory form) in the
    output region; else one line saying what came instead."""
    from edgemux.runtime.dataplane.protocol import ProtocolError, decode_infer_response

    if status != 200:
        return f"{'gRPC' if form is not None and form.protocol == 'grpc' else 'HTTP'} {status}: " \
               f"{body[:160].decode('utf-8', 'replace')}"
    try:
        if form is not None and form.protocol == "grpc":
            from edgemux.runtime.dataplane.grpcwire import messages

            resp = messages.ModelInferResponse.FromString(body)
            index = [o.name for o in resp.outputs].index(output_name) if any(
                o.name == output_name for o in resp.outputs) else None
            got = None if index is None else np.frombuffer(resp.raw_output_contents[index], dtype=np.float32)
        elif form is not None and form.name == "shm":
            # the output is in the region (the answer names the slot, or, as Triton's, only the tensor)
            assert shared is not None
            got = np.frombuffer(shared.output(), dtype=np.float32)
        else:
            got = decode_infer_response(body, header_length).outputs.get(output_name)
    except ProtocolError as e:
        return f"unreadable answer: {e.message}"
    except Exception as e:  # noqa: BLE001 - a protobuf parse error, say
        return f"unreadable answer: {type(e).__name__}: {e}"
    if got is None:
        return f"no output '{output_name}' in the answer"
    if got.size != expected.size or not np.allclose(got.reshape(expected.shape), expected, rtol=1e-4, atol=1e-4):
        return "wrong values in the answer"
    return None


class Connection:
    """One keep-alive connection sending pre-encoded requests (head and body in one write)."""

    def __init__(self, port: int, path: str) -> None:
        from edgemux.runtime.ingress.client import _OneWriteHTTPConnection

        self._conn = _OneWriteHTTPConnection("127.0.0.1", port, timeout=60)
        self.path = path

    def send(self, form: Form) -> tuple[int, bytes, str | None]:
        """(status, body, Inference-Header-Content-Length) of one request."""
        self._conn.request("POST", self.path, form.body, form.headers)
        resp = self._conn.getresponse()
        body = resp.read()
        return resp.status, body, resp.getheader("Inference-Header-Content-Length")

    def close(self) -> None:
        self._conn.close()


class GrpcConnection:
    """One gRPC channel sending the pre-serialized ``ModelInferRequest`` (its bytes, as the HTTP forms'),
    the answer's bytes not parsed: what ``Connection`` is for HTTP."""

    def __init__(self, port: int) -> None:
        import grpc

        self._grpc = grpc
        self._channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", -1)])
        self._call = self._channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                               request_serializer=None, response_deserializer=None)

    def send(self, form: Form) -> tuple[int, bytes, str | None]:
        """(200 and the answer's bytes, or the gRPC status code's number and its message)."""
        try:
            return 200, self._call(form.body, timeout=60), None
        except self._grpc.RpcError as e:
            return int(e.code().value[0]), f"{e.code().name}: {e.details()}".encode(), None

    def close(self) -> None:
        self._channel.close()


def connect(ep: Endpoint, form: Form) -> Connection | GrpcConnection:
    """A connection to ``ep`` for ``form``'s protocol."""
    if form.protocol == "grpc":
        assert ep.grpc_port is not None
        return GrpcConnection(ep.grpc_port)
    return Connection(ep.port, ep.path)


# ------------------------------------------------------------------------------------------- the servers


@dataclass
class Endpoint:
    """A path to measure: ``label`` (e.g. "edgemux agent"), where it listens and which forms it answers."""

    server: str
    label: str
    port: int
    path: str
    forms: dict[str, str | None] = field(default_factory=dict)  # form -> None (answers) or why not
    grpc_port: int | None = None  # where it serves gRPC (None: not measured over gRPC)
    shm: bool = False  # whether it takes system shared memory (the "shm" form)


@dataclass
class Running:
    """A started server: its processes (each the leader of its own process group) and endpoints."""

    name: str
    procs: list[subprocess.Popen[bytes]]
    endpoints: list[Endpoint]
    start_s: float
    logs: list[Path]

    def stop(self) -> None:
        """SIGTERM each process group, SIGKILL what is left after 20 s (Ray and Triton start helpers)."""
        for p in self.procs:
            _signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + 20.0
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(p, signal.SIGKILL)
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass


def _signal_group(p: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _spawn(cmd: list[str], log: Path, *, env: dict[str, str] | None = None,
           cwd: Path | None = None) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True)


def _wait_answering(proc: subprocess.Popen[bytes], port: int, path: str, form: Form, log: Path,
                    timeout_s: float = START_TIMEOUT_S) -> None:
    """Poll until ``path`` answers ``form`` with 200; PeerError when the process exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PeerError(f"exited with code {proc.returncode} before serving: {_tail(log)}")
        conn = Connection(port, path)
        try:
            status, body, _ = conn.send(form)
            if status == 200:
                return
            last = f"HTTP {status}: {body[:120].decode('utf-8', 'replace')}"
        except (OSError, http.client.HTTPException) as e:
            last = f"{type(e).__name__}: {e}"
        finally:
            conn.close()
        time.sleep(0.5)
    raise PeerError(f"not serving after {timeout_s:.0f} s ({last}): {_tail(log)}")


def _put_json(url: str, doc: dict[str, Any]) -> None:
    req = urllib.request.Request(url, method="PUT", headers={"Content-Type": "application/json"},
                                 data=json.dumps(doc).encode())
    urllib.request.urlopen(req, timeout=120).read()


def start_edgemux(workdir: Path, form: Form, relay: bool = True) -> Running:
    """The agent (real cpu0, app ``sq`` on the zoo model) and a gateway routing ``sq`` to it; with ``relay``,
    also ``peers/floor_relay.py`` in front of the agent (the least one hop through a Python proxy costs)."""
    t0 = time.perf_counter()
    agent_port, gw_port, agent_grpc, gw_grpc = (_free_port() for _ in range(4))
    logs = [workdir / "edgemux-agent.log", workdir / "edgemux-gateway.log"]
    agent = _spawn([sys.executable, "-m", "edgemux", "agent", "--cluster", str(ROOT / "examples/local/cluster.yaml"),
                    "--node", "cpu-1", "--port", str(agent_port), "--grpc-port", str(agent_grpc),
                    "--log-level", "warning"], logs[0])
    procs = [agent]
    try:
        gateway = _spawn([sys.executable, "-m", "edgemux", "gateway", "--port", str(gw_port), "--grpc-port",
                          str(gw_grpc), "--log-level", "warning", "--timeout-s", "30"], logs[1])
        procs.append(gateway)
        agent_url, gw_url = f"http://127.0.0.1:{agent_port}", f"http://127.0.0.1:{gw_port}"
        for url, proc, log in ((agent_url, agent, logs[0]), (gw_url, gateway, logs[1])):
            _wait_live(url, proc, log)
        _put_json(f"{agent_url}/v1/apps/{APP}", {"device": "cpu0", "model": MODEL})
        # a contract that never limits: the figure is the path, not the policing
        _put_json(f"{gw_url}/v1/routes/{APP}", {"model": APP, "endpoints": [{"url": agent_url, "weight": 1}],
                                               "rate_rps": 1e9, "burst": 1e9})
        path = f"/v2/models/{APP}/infer"
        _wait_answering(agent, agent_port, path, form, logs[0])
        _wait_answering(gateway, gw_port, path, form, logs[1])
        start_s = time.perf_counter() - t0
        endpoints = [Endpoint("edgemux", "edgemux agent", agent_port, path, grpc_port=agent_grpc, shm=True),
                     Endpoint("edgemux", "edgemux gateway -> agent", gw_port, path, grpc_port=gw_grpc, shm=True)]
        if relay:
            relay_port = _free_port()
            logs.append(workdir / "floor-relay.log")
            procs.append(_spawn([sys.executable, str(PEER_FILES / "floor_relay.py"), "--port", str(relay_port),
                                 "--upstream-port", str(agent_port)], logs[-1]))
            _wait_answering(procs[-1], relay_port, path, form, logs[-1])
            endpoints.append(Endpoint("floor", RELAY_LABEL, relay_port, path))
    except BaseException:
        Running("edgemux", procs, [], 0.0, logs).stop()
        raise
    return Running("edgemux", procs, endpoints, start_s, logs)


def _wait_live(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PeerError(f"exited with code {proc.returncode}: {_tail(log)}")
        try:
            urllib.request.urlopen(url + "/v2/health/live", timeout=1).read()
            return
        except (OSError, urllib.error.URLError):
            time.sleep(0.1)
    raise PeerError(f"{url} not live after 60 s: {_tail(log)}")


def start_floor(model_path: Path, workdir: Path, form: Form, stack: str = "core") -> Running:
    """``peers/floor_server.py`` with this interpreter: the least a server on edgemux's stack (its HTTP server
    core, orjson, ONNX Runtime) does per request, without any of a server's checks or bookkeeping; with
    ``stack="aiohttp"`` the same on aiohttp's server (what edgemux's servers ran on before the core)."""
    t0 = time.perf_counter()
    port = _free_port()
    name = "floor" if stack == "core" else f"floor-{stack}"
    log = workdir / f"{name}.log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PEER_FILES), str(ROOT / "src")]))
    proc = _spawn([sys.executable, str(PEER_FILES / "floor_server.py"), "--model", str(model_path), "--name", APP,
                   "--port", str(port), "--stack", stack], log, env=env)
    running = _answering(name, name, proc, port, log, form, t0)
    if stack == "core":  # and its gRPC twin (peers/floor_grpc.py), measured as the same endpoint's gRPC form
        grpc_port = _free_port()
        running.procs.append(_spawn([sys.executable, str(PEER_FILES / "floor_grpc.py"), "--model", str(model_path),
                                     "--name", APP, "--port", str(grpc_port)], workdir / "floor-grpc.log", env=env))
        running.logs.append(workdir / "floor-grpc.log")
        running.endpoints[0].grpc_port = grpc_port
        try:
            _wait_grpc(running.procs[-1], grpc_port, running.logs[-1])
        except BaseException:
            running.stop()
            raise
    return running


def _wait_grpc(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    """Until the gRPC server on ``port`` accepts a channel (PeerError when the process exits or 60 s pass)."""
    import grpc

    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PeerError(f"exited with code {proc.returncode} before serving: {_tail(log)}")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            try:
                grpc.channel_ready_future(channel).result(timeout=1.0)
                return
            except grpc.FutureTimeoutError:
                pass
    raise PeerError(f"gRPC not serving on {port} after 60 s: {_tail(log)}")


def _answering(server: str, label: str, proc: subprocess.Popen[bytes], port: int, log: Path, form: Form,
               t0: float) -> Running:
    """``proc`` (serving app ``APP`` on ``port``) once it answers ``form``, as a ``Running`` with its start-up
    time since ``t0`` (s); stopped again, and PeerError raised, when it does not come up."""
    running = Running(server, [proc], [Endpoint(server, label, port, f"/v2/models/{APP}/infer")], 0.0, [log])
    try:
        _wait_answering(proc, port, f"/v2/models/{APP}/infer", form, log)
    except BaseException:
        running.stop()
        raise
    running.start_s = time.perf_counter() - t0
    return running


def peer_python(peers_dir: Path, peer: str) -> Path:
    return peers_dir / peer / "bin" / "python"


def install_peer(peers_dir: Path, peer: str) -> None:
    """Make ``peers_dir/peer`` (a virtual environment) with the pinned peer, numpy and this interpreter's
    onnxruntime; a stamp file marks a finished install. PeerError with pip's last lines on failure."""
    venv = peers_dir / peer
    stamp = venv / ".installed"
    want = f"{PEER_PACKAGES[peer]} onnxruntime=={metadata.version('onnxruntime')}"
    if stamp.exists() and stamp.read_text() == want:
        return
    shutil.rmtree(venv, ignore_errors=True)
    try:
        peers_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # e.g. --peers-dir names a file
        raise PeerError(f"cannot use {peers_dir} for the peers' environments: {e.strerror or e}") from None
    log = peers_dir / f"{peer}-install.log"
    base = getattr(sys, "_base_executable", sys.executable)  # the interpreter this venv was made from
    steps = [[base, "-m", "venv", str(venv)],
             [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *want.split(), "numpy"]]
    with open(log, "wb") as out:
        for cmd in steps:
            done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False)
            if done.returncode != 0:
                raise PeerError(f"install failed ({' '.join(cmd[-4:])}, exit {done.returncode}): {_tail(log)}")
    stamp.write_text(want)


def start_peer(peer: str, peers_dir: Path, model_path: Path, workdir: Path, form: Form) -> Running:
    """Start ``peer`` serving ``model_path`` as app ``sq``; PeerError when it is not installed or not serving."""
    py = peer_python(peers_dir, peer)
    if not (peers_dir / peer / ".installed").exists():
        raise PeerError(f"not installed in {peers_dir / peer} (run without --no-install to install it)")
    t0 = time.perf_counter()
    port = _free_port()
    log = workdir / f"{peer}.log"
    env = dict(os.environ, PYTHONPATH=str(PEER_FILES))
    env.pop("VIRTUAL_ENV", None)
    grpc_port = _free_port() if peer in GRPC_PEERS else None
    args = ["--model", str(model_path), "--name", APP, "--port", str(port)]
    if grpc_port is not None and peer != "mlserver":
        args += ["--grpc-port", str(grpc_port)]
    cwd = None
    if peer == "kserve":
        cmd = [str(py), str(PEER_FILES / "kserve_server.py"), *args]
    elif peer == "rayserve":
        cmd = [str(py), str(PEER_FILES / "rayserve_server.py"), *args]
    elif peer == "pytriton":
        # Triton's Python backend stub links against libpython: name the interpreter's lib/ directory.
        base = subprocess.run([str(py), "-c", "import sys; print(sys.base_prefix)"], capture_output=True,
                              text=True, check=True).stdout.strip()
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(Path(base) / "lib"),
                                                               env.get("LD_LIBRARY_PATH", "")]))
        cmd = [str(py), str(PEER_FILES / "pytriton_server.py"), *args]
    elif peer == "mlserver":
        cwd = workdir / "mlserver-models"
        cwd.mkdir(exist_ok=True)
        (cwd / "settings.json").write_text(json.dumps({
            "http_port": port, "grpc_port": grpc_port, "metrics_port": _free_port(),
            "parallel_workers": 0, "debug": False}))
        (cwd / "model-settings.json").write_text(json.dumps({
            "name": APP, "implementation": "mlserver_model.OnnxModel", "parameters": {"uri": str(model_path)}}))
        cmd = [str(py.with_name("mlserver")), "start", str(cwd)]
    else:
        raise PeerError(f"unknown peer {peer!r}")
    running = _answering(peer, PEER_TITLES[peer], _spawn(cmd, log, env=env, cwd=cwd), port, log, form, t0)
    # Triton's core serves system shared memory (the shared-memory form); the other peers do not
    running.endpoints[0].shm = peer in SHM_PEERS
    if grpc_port is not None:  # its OIP gRPC front end, measured as the same endpoint's gRPC form
        running.endpoints[0].grpc_port = grpc_port
        try:
            _wait_grpc(running.procs[0], grpc_port, log)
        except BaseException:
            running.stop()
            raise
    return running


# ------------------------------------------------------------------------------------------ measurement


def probe_forms(ep: Endpoint, forms: dict[str, Form], output_name: str, expected: np.ndarray,
                shared: Shared | None = None) -> None:
    """Fill ``ep.forms``: for each form, None when the endpoint answers it correctly, else why not."""
    for name, form in forms.items():
        if form.protocol == "grpc" and ep.grpc_port is None:
            ep.forms[name] = "not measured over gRPC here"
            continue
        if name == "shm":
            why = "not measured with shared memory here" if not ep.shm or shared is None else shared.register(ep.port)
            if why is not None:
                ep.forms[name] = why
                continue
        conn = connect(ep, form)
        if name == "shm" and shared is not None:
            shared.out.write(0, bytes(OUTPUT_BYTES))  # what the answer is read from: this server must write it
        try:
            status, body, hlen = conn.send(form)
            ep.forms[name] = check_answer(status, body, hlen, output_name, expected, form, shared)
        except (OSError, http.client.HTTPException) as e:
            ep.forms[name] = f"{type(e).__name__}: {e}"
        finally:
            conn.close()
            if name == "shm" and shared is not None:
                shared.unregister(ep.port)  # registered again while its own form is measured


def measure_latency(endpoints: list[Endpoint], forms: dict[str, Form], direct: Any, requests: int,
                    warmup: int, mix_forms: bool = False, shared: Shared | None = None) -> dict[str, np.ndarray]:
    """Latencies (ms) keyed "direct" and "LABEL|FORM" for every form an endpoint answers: one form after the
    other, its paths and the direct call interleaved in blocks of ``BLOCK``; ``warmup`` requests per path
    first, not kept. With ``mix_forms``, every path of both forms in one interleaving (the script's way
    before issue 33).

    One form at a time because one form's requests slow the next ones of the other on the same path: after
    a block of 241 kB JSON requests, binary requests through a proxy (the gateway, the relay floor) run
    slower for tens of requests, which a client sending one form never sees (docs/results.md, "Beside the
    peers", measures both ways)."""
    by_form: dict[str, list[tuple[str, Any]]] = {}
    conns = []
    for ep in endpoints:
        for name, why in ep.forms.items():
            if why is None:
                form = forms[name]
                conn = connect(ep, form)
                conns.append(conn)
                by_form.setdefault("all" if mix_forms else name, [("direct", direct)]).append(
                    (f"{ep.label}|{name}", lambda conn=conn, form=form: conn.send(form)))
    lat: dict[str, list[float]] = {"direct": []}
    shm_ports = [ep.port for ep in endpoints if ep.forms.get("shm", "no") is None]
    try:
        for form_name, paths in by_form.items():
            if shared is not None and form_name in ("shm", "all"):
                for port in shm_ports:
                    shared.register(port)
            for key, call in paths:
                lat.setdefault(key, [])
                for _ in range(warmup):
                    call()
            for _ in range(max(1, requests // BLOCK)):
                for key, call in paths:
                    out = lat[key]
                    for _ in range(BLOCK):
                        t = time.perf_counter()
                        result = call()
                        out.append((time.perf_counter() - t) * 1000.0)
                        if key != "direct" and result[0] != 200:
                            raise RuntimeError(f"{key}: HTTP {result[0]} during the measurement")
            if shared is not None and form_name == "shm":
                for port in shm_ports:
                    shared.unregister(port)
    finally:
        for conn in conns:
            conn.close()
    return {k: np.asarray(v) for k, v in lat.items()}


def measure_throughput(ep: Endpoint, form: Form, workdir: Path, levels: list[int], seconds: float,
                       warm_s: float) -> list[dict[str, Any]]:
    """One ``closedloop.py`` run per concurrency level against ``ep`` with ``form``."""
    body_file = workdir / f"{form.name}.body"
    if not body_file.exists():
        body_file.write_bytes(form.body)
    url = f"http://127.0.0.1:{ep.port}{ep.path}"
    return [run_level(url, str(body_file), form.headers, k, seconds, warm_s) for k in levels]


@dataclass
class Phase:
    """What was measured while one server ran."""

    server: str
    start_s: float | None = None
    error: str | None = None
    endpoints: list[Endpoint] = field(default_factory=list)
    lat: dict[str, np.ndarray] = field(default_factory=dict)
    throughput: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    busy_cores: float | None = None

    def pct(self, key: str, q: float) -> float:
        return float(np.percentile(self.lat[key], q))

    def overhead(self, key: str, q: float) -> float:
        return self.pct(key, q) - self.pct("direct", q)


def run_phase(server: str, start: Any, forms: dict[str, Form], output_name: str, expected: np.ndarray,
              direct: Any, workdir: Path, args: argparse.Namespace, shared: Shared | None = None) -> Phase:
    """Start one server, probe its forms, measure latency and throughput, stop it."""
    phase = Phase(server)
    try:
        running = start()
    except PeerError as e:
        phase.error = str(e)
        return phase
    phase.start_s = running.start_s
    try:
        for ep in running.endpoints:
            probe_forms(ep, forms, output_name, expected, shared)
        phase.endpoints = running.endpoints
        busy0, t0 = host_busy_s(), time.perf_counter()
        phase.lat = measure_latency(running.endpoints, forms, direct, args.requests, args.warmup, args.mix_forms,
                                    shared)
        busy1, t1 = host_busy_s(), time.perf_counter()
        if busy0 is not None and busy1 is not None:
            phase.busy_cores = (busy1 - busy0) / (t1 - t0)
        for ep in running.endpoints:
            if ep.server.startswith("floor"):
                continue
            for name, why in ep.forms.items():
                if why is None and name in ("json", "binary"):  # closedloop.py speaks HTTP with a body of its own
                    phase.throughput[f"{ep.label}|{name}"] = measure_throughput(
                        ep, forms[name], workdir, args.levels, args.seconds, args.warm)
    finally:
        running.stop()
    return phase


# ------------------------------------------------------------------------------------------------ report


def report(phases: list[Phase], args: argparse.Namespace) -> bool:
    """Print the tables and the verdict; True when edgemux served every request it was sent."""
    print()
    print("Latency, sequential requests on one keep-alive connection (ms); overhead = path - direct, same phase")
    header = (f"{'server / path':<38} {'form':<7} {'p50':>8} {'p99':>8} {'over p50':>9} {'over p99':>9} "
              f"{'x edgemux':>10}")
    print(header)
    print("-" * len(header))
    ours = next((p for p in phases if p.server == "edgemux" and p.lat), None)
    agent: dict[str, float | None] = {  # edgemux agent's p50 overhead per form, the reference for the ratios
        form: ours.overhead(f"edgemux agent|{form}", 50) if ours and f"edgemux agent|{form}" in ours.lat else None
        for form in FORMS}
    best: dict[str, tuple[float, str]] = {}
    for phase in phases:
        title = PEER_TITLES.get(phase.server, phase.server)
        if phase.error is not None:
            print(f"{title:<38} could not start: {phase.error}")
            continue
        print(f"{title:<38} {'direct':<7} {phase.pct('direct', 50):>8.3f} {phase.pct('direct', 99):>8.3f}"
              + (f"   (host busy {phase.busy_cores:.2f} cores)" if phase.busy_cores is not None else ""))
        for ep in phase.endpoints:
            for form, why in ep.forms.items():
                key = f"{ep.label}|{form}"
                if why is not None:
                    print(f"  {ep.label:<36} {form:<7} not answered: {why}")
                    continue
                o50, o99 = phase.overhead(key, 50), phase.overhead(key, 99)
                ref = agent.get(form)
                ours_or_floor = phase.server == "edgemux" or phase.server.startswith("floor")
                ratio = f"{o50 / ref:>9.1f}x" if ref and not ours_or_floor else f"{'':>10}"
                print(f"  {ep.label:<36} {form:<7} {phase.pct(key, 50):>8.3f} {phase.pct(key, 99):>8.3f} "
                      f"{o50:>9.3f} {o99:>9.3f} {ratio}")
                if not ours_or_floor and (form not in best or o50 < best[form][0]):
                    best[form] = (o50, PEER_TITLES[phase.server])
    print("direct: InferenceSession.run in this process on the same file and input, measured in each server's "
          "phase; host busy: CPU the whole host used while the phase's latency was measured (the server's own "
          "work included); floor: benchmarks/peers/floor_server.py, the least a server on edgemux's stack (its "
          "HTTP server core) does "
          "(read, orjson or a view of the bytes, the model on the event loop, answer), not a peer; floor relay: "
          "benchmarks/peers/floor_relay.py in front of the agent, the least one hop through a Python proxy on "
          "edgemux's stack does (httptools both ways, the reply's bytes as they came), not a gateway")
    floor_phase = next((p for p in phases if p.server == "floor" and p.lat), None)
    print()
    print(f"Verdict: edgemux agent's p50 overhead at most 1/{TARGET_RATIO:g} of the best peer's")
    for form in ("json", "binary", "grpc"):
        ref = agent[form]
        if ref is None:
            print(f"  {form:<7} edgemux agent not measured")
        elif form not in best:
            print(f"  {form:<7} edgemux agent {ref:.3f} ms; no peer answered this form")
        else:
            peer_o, peer_name = best[form]
            meets = ref * TARGET_RATIO <= peer_o
            print(f"  {form:<7} edgemux agent {ref:.3f} ms vs best peer {peer_name} {peer_o:.3f} ms: ratio "
                  f"{peer_o / ref:.1f}x -> {'meets' if meets else 'MISSES'} the 1/{TARGET_RATIO:g} target")
            if floor_phase is not None and f"floor|{form}" in floor_phase.lat:
                target, fl = peer_o / TARGET_RATIO, floor_phase.overhead(f"floor|{form}", 50)
                stack = ("grpcio's asyncio server, protobuf and ONNX Runtime" if form == "grpc" else
                         "edgemux's server core, orjson and ONNX Runtime")
                print(f"          target {target:.3f} ms; the floor's overhead {fl:.3f} ms: the target is "
                      + ("above the floor (within this stack's reach)" if fl <= target else
                         f"BELOW THE FLOOR: no server on {stack} reaches it on this host"))
    if ours is not None and floor_phase is not None:
        for form in ("json", "binary", "grpc"):
            a, f = f"edgemux agent|{form}", f"floor|{form}"
            if a in ours.lat and f in floor_phase.lat:
                own = ours.overhead(a, 50) - floor_phase.overhead(f, 50)
                target = f" -> {'meets' if own <= OWN_COST_MS else 'MISSES'} the {OWN_COST_MS:g} ms target" \
                    if form != "grpc" else ""
                print(f"  edgemux agent's own cost over the floor, {form}: p50 {own:.3f} ms (agent overhead "
                      f"{ours.overhead(a, 50):.3f} - floor overhead {floor_phase.overhead(f, 50):.3f}){target}")
    if ours is not None:
        for who in ("edgemux agent", "edgemux gateway -> agent"):
            sh, bi = f"{who}|shm", f"{who}|binary"
            if sh in ours.lat and bi in ours.lat:
                print(f"  shared memory beside binary, {who}: p50 overhead {ours.overhead(sh, 50):.3f} ms vs "
                      f"{ours.overhead(bi, 50):.3f} ms ({ours.overhead(sh, 50) - ours.overhead(bi, 50):+.3f} ms; "
                      "the 49 kB input and the 4 kB output in regions of this process)")
        a, g = "edgemux agent|grpc", "edgemux gateway -> agent|grpc"
        if a in ours.lat and g in ours.lat:
            print(f"  gateway's added overhead over gRPC (no target): p50 {ours.pct(g, 50) - ours.pct(a, 50):.3f} ms "
                  f"(gateway path - agent path; the gateway carries it to the agent as binary HTTP)")
        for form in ("json", "binary"):
            a, g = f"edgemux agent|{form}", f"edgemux gateway -> agent|{form}"
            if a in ours.lat and g in ours.lat:
                added, own = ours.pct(g, 50) - ours.pct(a, 50), ours.overhead(a, 50)
                ratio = f"{added / own:.2f}" if own > 0 else "n/a"
                meets = own > 0 and added <= GATEWAY_SHARE * own
                print(f"  gateway's added overhead, {form}: p50 {added:.3f} ms, "
                      f"p99 {ours.pct(g, 99) - ours.pct(a, 99):.3f} ms (gateway path - agent path); "
                      f"{ratio} of the agent's own p50 overhead ({own:.3f} ms) -> "
                      f"{'meets' if meets else 'MISSES'} the {GATEWAY_SHARE:g} target")
                r = f"{RELAY_LABEL}|{form}"
                if r in ours.lat and own > 0:
                    hop = ours.pct(r, 50) - ours.pct(a, 50)
                    print(f"          the relay floor's added overhead {hop:.3f} ms ({hop / own:.2f} of the agent's): "
                          f"the gateway is {added - hop:+.3f} ms from it; the target is "
                          + ("above the floor (within this stack's reach)" if hop <= GATEWAY_SHARE * own else
                             "BELOW THE FLOOR: one hop through a Python process costs more on this host"))
    print()
    print(f"Throughput, closed loop, k concurrent clients (closedloop.py, a separate process; {args.seconds:g} s "
          "per level): req/s (p50 ms), errors")
    levels_header = "".join(f"{'k=' + str(k):>22}" for k in args.levels)
    print(f"{'server / path':<38} {'form':<7}{levels_header}")
    clean = True
    for phase in phases:
        for key, levels in phase.throughput.items():
            label, form = key.split("|")
            cells = "".join(f"{lv['rps']:>10.0f} ({lv['p50_ms']:>6.2f}) {lv['errors']:>3}" for lv in levels)
            print(f"{label:<38} {form:<7}{cells}")
            if phase.server == "edgemux" and any(lv["errors"] for lv in levels):
                clean = False
    for phase in phases:
        if phase.start_s is not None:
            print(f"start-up to first answer: {PEER_TITLES.get(phase.server, phase.server)} {phase.start_s:.1f} s")
    return clean and ours is not None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", default=",".join(PEER_PACKAGES),
                    help=f"comma-separated peers to run beside edgemux, or 'none' (default: {','.join(PEER_PACKAGES)})")
    ap.add_argument("--peers-dir", default=str(ROOT / "build" / "peers"),
                    help="where the peers' virtual environments live (default build/peers)")
    ap.add_argument("--no-install", action="store_true", help="do not install missing peers: report them")
    ap.add_argument("--requests", type=int, default=None,
                    help="timed requests per path (default 1000; 60 with --quick)")
    ap.add_argument("--concurrency", default=None, help="closed-loop levels (default 1,4,16; 1,4 with --quick)")
    ap.add_argument("--seconds", type=float, default=None,
                    help="counted seconds per level (default 3; 0.5 with --quick)")
    ap.add_argument("--no-floor", action="store_true",
                    help="do not measure the floors (peers/floor_server.py, peers/floor_relay.py)")
    ap.add_argument("--mix-forms", action="store_true",
                    help="interleave the JSON and binary paths in one rotation (default: one form after the other)")
    ap.add_argument("--aiohttp-floor", action="store_true",
                    help="also measure the floor served by aiohttp's server (what edgemux's servers ran on before)")
    ap.add_argument("--quick", action="store_true", help="small counts (smoke test)")
    args = ap.parse_args(argv)
    peers = [] if args.peers.strip() == "none" else [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = [p for p in peers if p not in PEER_PACKAGES]
    if unknown:
        ap.exit(2, f"bench_peers: unknown peer {unknown[0]!r} (known: {', '.join(PEER_PACKAGES)}, or none)\n")
    args.peer_list = peers
    if args.requests is not None and args.requests < BLOCK:
        ap.exit(2, f"bench_peers: --requests must be at least {BLOCK}, got {args.requests}\n")
    args.requests = args.requests or (60 if args.quick else 1000)
    args.warmup = 10 if args.quick else 50
    try:
        levels = [int(k) for k in (args.concurrency or ("1,4" if args.quick else "1,4,16")).split(",")]
    except ValueError:
        ap.exit(2, f"bench_peers: --concurrency must be comma-separated integers, got {args.concurrency!r}\n")
    if any(k < 1 for k in levels):
        ap.exit(2, f"bench_peers: --concurrency levels must be >= 1, got {args.concurrency!r}\n")
    args.levels = levels
    args.seconds = args.seconds if args.seconds is not None else (0.5 if args.quick else 3.0)
    if not args.seconds > 0:
        ap.exit(2, f"bench_peers: --seconds must be > 0, got {args.seconds:g}\n")
    args.warm = 0.2 if args.quick else 0.5
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import onnx
    import onnxruntime as ort

    from edgemux.runtime import zoo

    peers_dir = Path(args.peers_dir).resolve()
    print("Serving overhead and throughput beside the peers")
    print(f"model {MODEL} ({ZOO_MODEL[0]} at {ZOO_MODEL[1]} px, batch 1), REAL onnxruntime {ort.__version__} "
          f"CPUExecutionProvider, 1 intra-op thread, in every server; host {platform.node()} "
          f"({platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()})")
    print(f"{args.requests} timed sequential requests per path after {args.warmup} warm-up, interleaved in blocks "
          f"of {BLOCK} with a direct call, "
          + ("both forms in one rotation (--mix-forms)" if args.mix_forms else "one form after the other")
          + "; each server alone on the host while measured")
    if args.peer_list and not args.no_install:
        # pip is mostly network and unpacking: install the missing peers side by side
        todo = [p for p in args.peer_list if not (peers_dir / p / ".installed").exists()]
        if todo:
            print(f"installing {', '.join(todo)} into {peers_dir} (first run only; a few minutes)")
        install_errors: dict[str, str] = {}
        with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
            futures = {pool.submit(install_peer, peers_dir, p): p for p in args.peer_list}
            for fut in concurrent.futures.as_completed(futures):
                try:
                    fut.result()
                except PeerError as e:
                    install_errors[futures[fut]] = str(e)
    else:
        install_errors = {}
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        workdir = Path(tmp)
        model_path = workdir / "model.onnx"
        onnx.save(zoo.build(ZOO_MODEL[0], input_size=ZOO_MODEL[1]), str(model_path))
        session, input_name, output_name = open_session(str(model_path))  # the peers' own session options
        x = np.random.default_rng(0).standard_normal((1, 3, ZOO_MODEL[1], ZOO_MODEL[1])).astype(np.float32)
        expected = session.run([output_name], {input_name: x})[0]
        forms = make_forms(x, input_name, output_name)
        print(f"request bytes: json {len(forms['json'].body):,} B, binary {len(forms['binary'].body):,} B, "
              f"gRPC {len(forms['grpc'].body):,} B, shared memory {len(forms['shm'].body):,} B of JSON naming the "
              "regions (the same bytes to every server that takes the form)")

        def direct() -> Any:
            return session.run([output_name], {input_name: x})

        shared = Shared(x)  # the shared-memory form's regions, for every server that takes it
        phases = [run_phase("edgemux", lambda: start_edgemux(workdir, forms["json"], relay=not args.no_floor),
                            forms, output_name, expected, direct, workdir, args, shared)]
        if not args.no_floor:
            print("measuring the floor ...", flush=True)
            phases.append(run_phase("floor", lambda: start_floor(model_path, workdir, forms["json"]), forms,
                                    output_name, expected, direct, workdir, args))
        if args.aiohttp_floor:
            print("measuring the floor on aiohttp ...", flush=True)
            phases.append(run_phase("floor-aiohttp", lambda: start_floor(model_path, workdir, forms["json"], "aiohttp"),
                                    forms, output_name, expected, direct, workdir, args))
        for peer in args.peer_list:
            print(f"measuring {PEER_TITLES[peer]} ...", flush=True)
            if peer in install_errors:
                phases.append(Phase(peer, error=install_errors[peer]))
                continue
            phases.append(run_phase(peer, lambda peer=peer: start_peer(peer, peers_dir, model_path, workdir,
                                                                       forms["json"]),
                                    forms, output_name, expected, direct, workdir, args, shared))
        shared.close()
        ok = report(phases, args)
    if phases[0].error is not None:
        print(f"edgemux did not start: {phases[0].error}", file=sys.stderr)
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
