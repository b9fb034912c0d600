"""The local engine and ``edgemux up``/``edgemux gateway``: real processes on this machine.

No wall-clock thresholds: every wait has a generous timeout so that a slow machine makes a test slower,
never flaky, and a broken build fails instead of hanging.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgemux.cli.main import main
from edgemux.profiles.catalog import load_catalog_from
from edgemux.engines.local import Engine, EngineError, LocalLauncher, ProcessSpec
from edgemux.runtime.dataplane.protocol import DATATYPES

REPO = Path(__file__).resolve().parent.parent
LOCAL = REPO / "examples" / "local"
TIMEOUT_S = 120.0  # generous: the whole cluster starts on a loaded 2-core machine


def _http(method: str, url: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Authorization": f"Bearer {token}"} if token else {})
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    return status, (json.loads(raw) if raw else None)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def wait_for(what: str, check: Any, timeout_s: float = TIMEOUT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _edgemux(*args: str, timeout_s: float = TIMEOUT_S, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgemux", *args], capture_output=True, text=True,
                          timeout=timeout_s, **kw)


# --------------------------------------------------------------------------------------------- engine


def test_engine_runs_the_local_cluster_admits_serves_and_stops(capsys: pytest.CaptureFixture[str]) -> None:
    grpc_port = _free_port()
    eng = Engine(LOCAL / "cluster.yaml", listen_timeout_s=TIMEOUT_S, ready_timeout_s=TIMEOUT_S,
                 gateway_grpc_port=grpc_port)
    with eng:
        cp, gw = eng.controlplane_url, eng.gateway_url
        assert cp and gw and cp.startswith("http://127.0.0.1:") and gw.startswith("http://127.0.0.1:")
        assert set(eng.agent_urls) == {"edge-1", "edge-2", "cpu-1"}
        # the cpu device had no profile: the engine measured one on this host
        assert eng.measured_profiles is not None

        # authentication is on: the token file is the owner's only, and no API answers without the token
        assert eng.token is not None and eng.token_file is not None
        assert eng.token_file.stat().st_mode & 0o777 == 0o600
        status, err = _http("GET", cp + "/v1/agents")
        assert status == 401 and "missing credentials" in err["error"]
        # every agent registered and is ready
        status, agents = _http("GET", cp + "/v1/agents", token=eng.token)
        assert status == 200 and agents["unregistered_nodes"] == []
        assert {a["node"]: a["ready"] for a in agents["agents"]} == {"edge-1": True, "edge-2": True, "cpu-1": True}
        # the summary tells emulated from real devices
        emulated = {d["path"]: d["emulated"] for _, d in eng.devices()}
        assert emulated == {"edge-1/tpu0": True, "edge-1/gpu0": True, "edge-2/tpu0": True, "cpu-1/cpu0": False}
        assert "1 real, 3 emulated" in eng.summary()

        # apply the demo apps: one rejection (exit 1) with its reason, the others created
        code = main(["apply", "-f", str(LOCAL / "apps.yaml"), "--server", cp, "--json",
                     "--token-file", str(eng.token_file)])
        out = capsys.readouterr().out
        assert code == 1
        results = {r["app"]: r for r in json.loads(out)["results"]}
        assert results["cam-hd"]["result"] == "rejected"
        assert results["cam-hd"]["rejection"]["constraint"]
        assert results["cam-hd"]["rejection"]["message"]
        # classify-lite: a real TFLite model, measured on LiteRT by the engine too (the litert extra is installed)
        assert {a for a, r in results.items() if r["result"] == "created"} == {
            "cam-entrance", "detect-people", "classify", "cpu-squeeze", "classify-lite"}
        assert eng.measured_litert is not None
        assert [s["device"] for s in results["classify-lite"]["placement"]["shares"]] == ["cpu-1/cpu0"]
        key = results["cpu-squeeze"]["key"]  # each app created got its key, shown once
        assert key.startswith("emk_") and results["classify"]["key"] != key
        shares = results["cpu-squeeze"]["placement"]["shares"]
        assert [s["device"] for s in shares] == ["cpu-1/cpu0"]

        # the app on the real device becomes ready and the gateway gets its route
        def ready() -> bool:
            _, apps = _http("GET", cp + "/v1/apps", token=eng.token)
            return any(a["name"] == "cpu-squeeze" and a["status"] == "ready" for a in apps["apps"])

        wait_for("cpu-squeeze ready", ready)
        # the real device runs the graph that was measured (its input size), not the zoo's standard one
        _, described = _http("GET", cp + "/v1/apps/cpu-squeeze", token=eng.token)
        (piece,) = described["placement"]["pieces"]
        assert piece["emulated"] is False
        # the control plane loads the graph the profile was measured on (its model_source column)
        measured = load_catalog_from(Path(eng.measured_profiles)).profiles[piece["profile"]]
        assert piece["model_source"] == measured.extra["model_source"]
        wait_for("the gateway's route", lambda: "cpu-squeeze" in (
            _http("GET", gw + "/v1/routes", token=eng.token)[1] or {}).get("routes", {}))

        # one inference through the gateway, on the real CPU device, with the app's key: another app's key
        # is refused (403), no key at all too (401)
        assert _http("GET", gw + "/v2/models/cpu-squeeze")[0] == 401
        assert _http("GET", gw + "/v2/models/cpu-squeeze", token=results["classify"]["key"])[0] == 403
        status, meta = _http("GET", gw + "/v2/models/cpu-squeeze", token=key)
        assert status == 200, meta
        (inp,) = meta["inputs"]
        shape = [1 if d < 0 else d for d in inp["shape"]]
        request = {"inputs": [{"name": inp["name"], "shape": shape, "datatype": inp["datatype"],
                               "data": [0.5] * math.prod(shape)}]}
        status, reply = _http("POST", gw + "/v2/models/cpu-squeeze/infer", request, token=key)
        assert status == 200, reply
        expected = {o["name"]: [1 if d < 0 else d for d in o["shape"]] for o in meta["outputs"]}
        assert {o["name"]: o["shape"] for o in reply["outputs"]} == expected
        assert math.prod(next(iter(expected.values()))) == 1000  # SqueezeNet 1.1: ImageNet's 1000 classes
        assert reply["parameters"]["edgemux_device"] == "cpu-1/cpu0"
        assert reply["parameters"]["edgemux_emulated"] is False

        # the same app over gRPC at the gateway (up --grpc-port), also after the gateway is killed and started
        # again: it takes its gRPC port again, so a client's target stays valid
        assert eng.gateway_grpc_address == f"127.0.0.1:{grpc_port}"
        assert f"gateway gRPC  127.0.0.1:{grpc_port}" in eng.summary()
        x = np.full(shape, 0.5, DATATYPES[inp["datatype"]])
        assert _grpc_infer(eng.gateway_grpc_address, "cpu-squeeze", inp["name"], x, key).shape == tuple(
            next(iter(expected.values())))
        eng.kill("gateway")
        eng.restart("gateway")
        wait_for("the restarted gateway's route", lambda: "cpu-squeeze" in (
            _http("GET", eng.gateway_url + "/v1/routes", token=eng.token)[1] or {}).get("routes", {}))
        assert _grpc_infer(eng.gateway_grpc_address, "cpu-squeeze", inp["name"], x, key).shape == tuple(
            next(iter(expected.values())))
        gw = eng.gateway_url

        # one app, one interface: classify moves between an Edge TPU variant (UINT8 [N,224,224,3]) and the real
        # CPU's (FP32 [N,3,96,96]) while an unmodified tritonclient sends the same bytes through the gateway
        _move_keeps_the_interface(eng, results["classify"]["key"])

        pids = eng.pids
        workdir = eng.workdir
        assert set(pids) == {"controlplane", "gateway", "agent edge-1", "agent edge-2", "agent cpu-1"}
        codes = eng.stop()
    # graceful: every process exited 0, none is left, and the temporary folder is gone
    assert codes == {name: 0 for name in pids}
    assert all(_gone(pid) for pid in pids.values() if pid is not None)
    assert not workdir.exists()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _grpc_infer(address: str, app: str, name: str, x: np.ndarray, key: str) -> np.ndarray:
    """``app``'s one output for input ``name`` = ``x``, asked with an unmodified ``tritonclient.grpc``."""
    import tritonclient.grpc as tg
    from tritonclient.utils import np_to_triton_dtype

    client = tg.InferenceServerClient(address)
    try:
        inp = tg.InferInput(name, list(x.shape), np_to_triton_dtype(x.dtype))
        inp.set_data_from_numpy(x)
        result = client.infer(app, [inp], headers={"authorization": f"Bearer {key}"}, client_timeout=60)
        (out,) = result.get_response().outputs
        y = result.as_numpy(out.name)
        assert y is not None
        return y
    finally:
        client.close()


def _move_keeps_the_interface(eng: Engine, key: str) -> None:
    import tritonclient.http as th

    cp, gw = eng.controlplane_url, eng.gateway_url
    assert cp and gw

    def described() -> Any:
        return _http("GET", cp + "/v1/apps/classify", token=eng.token)[1]

    # This test is about one interface across variants, not about room on a busy CPU. Whether classify fits
    # on the CPU is predicted from CPU times measured at start-up, and with the suite beside it those were
    # slow enough to refuse the move twice: classify-lite's p95 72.7 ms > 25 beside it, then classify's own
    # p95 180 ms > 50 alone. So the CPU's other tenants go, and classify asks little: 5 req/s, a mean of 10 s
    # (the sender's closed loop waits for its tokens; nothing is refused).
    for tenant in ("classify-lite", "cpu-squeeze"):
        status, body = _http("DELETE", cp + f"/v1/apps/{tenant}", token=eng.token)
        assert status == 200, body
    loose = {"apiVersion": "edgemux/v1alpha1", "kind": "App", "metadata": {"name": "classify"},
             "spec": {"model": "mobilenet_v2", "rate": 5, "burst": 10, "slo": {"latencyMs": 10000, "stat": "mean"}}}
    status, body = _http("PUT", cp + "/v1/apps/classify", loose, token=eng.token)
    assert status in (200, 201), body
    iface = wait_for("classify's interface", lambda: described().get("interface"))
    (where,) = [p["device"] for p in described()["placement"]["pieces"]]
    other = "cpu-1/cpu0" if where != "cpu-1/cpu0" else "edge-1/tpu0"
    (spec,) = iface["inputs"]
    x = np.random.default_rng(0).integers(0, 256, [1 if d < 0 else d for d in spec["shape"]]).astype(
        DATATYPES[spec["datatype"]])
    answers: list[tuple[str, tuple[int, ...]]] = []
    failures: list[str] = []
    stop = threading.Event()

    def send() -> None:
        tc = th.InferenceServerClient(gw.removeprefix("http://"))
        try:
            inp = th.InferInput(spec["name"], list(x.shape), spec["datatype"])
            inp.set_data_from_numpy(x, binary_data=True)
            while not stop.is_set():
                try:
                    out = tc.infer("classify", [inp], headers={"Authorization": f"Bearer {key}"})
                    y = out.as_numpy(iface["outputs"][0]["name"])
                    answers.append((str(y.dtype), tuple(y.shape)))
                except Exception as e:  # noqa: BLE001 - every failure is the finding
                    failures.append(repr(e))
                time.sleep(0.02)
        finally:
            tc.close()

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        wait_for("answers before the move", lambda: len(answers) >= 5)
        status, body = _http("POST", cp + "/v1/apps/classify/move", {"to": [other]}, token=eng.token)
        assert status == 200 and body["result"] == "moved", body
        n = len(answers)
        wait_for("answers after the move", lambda: len(answers) >= n + 10)
    finally:
        stop.set()
        sender.join(60)
    assert not failures, failures[:3]
    want = iface["outputs"][0]
    assert set(answers) == {(str(np.dtype(DATATYPES[want["datatype"]])), tuple(1 if d < 0 else d for d in want["shape"]))}
    (now,) = [p for p in described()["placement"]["pieces"]]
    assert now["device"] == other
    # the agent serves the new variant (its own tensors differ) through the app's interface
    status, held = _http("GET", now["agent"] + "/v1/apps/classify", token=eng.token)
    assert status == 200 and held["interface"] == iface, held
    variant = held["pieces"][0] if "pieces" in held else held
    assert [(t["datatype"], t["shape"]) for t in variant["inputs"]] != [(spec["datatype"], spec["shape"])], variant
    status, meta = _http("GET", gw + "/v2/models/classify", token=key)
    assert status == 200 and [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        (spec["name"], spec["datatype"], spec["shape"])]  # the app's interface, not the new variant's


def test_local_launcher_passes_profile_sets_to_the_verbs_that_read_profiles(tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path)
    cp = launcher.command(ProcessSpec("controlplane", "controlplane", ("controlplane", "--port", "0"), profiles=("/p",)))
    assert cp[-2:] == ["--profiles", "/p"]
    agent = launcher.command(ProcessSpec("agent n", "agent", ("agent", "--node", "n"), profiles=("/p", "/q")))
    assert agent[1:] == ["-m", "edgemux", "agent", "--node", "n", "--profiles", "/p", "--profiles", "/q"]
    plain = launcher.command(ProcessSpec("gateway", "gateway", ("gateway",)))
    assert plain[1:] == ["-m", "edgemux", "gateway"]
    with pytest.raises(EngineError, match="'gateway' takes no profile sets"):
        launcher.command(ProcessSpec("gateway", "gateway", ("gateway",), profiles=("/p",)))


# ---------------------------------------------------------------------------------------------- up


def test_up_exits_1_naming_the_process_that_failed_at_start_up() -> None:
    # the agent of cpu-1 refuses its arguments at start-up (exit 2); the others must be stopped again
    r = _edgemux("up", "--cluster", str(LOCAL / "cluster.yaml"), "--no-auto-profile",
                 "--agent-arg", "cpu-1=--max-queue=0", "--ready-timeout-s", str(TIMEOUT_S))
    assert r.returncode == 1, r.stderr
    assert "agent cpu-1" in r.stderr and "exited with status 2" in r.stderr
    assert "--max-queue" in r.stderr  # its last stderr lines are shown


def test_up_bad_input_is_one_line_exit_2(tmp_path: Path) -> None:
    assert main(["up", "--cluster", str(tmp_path / "missing.yaml")]) == 2
    assert main(["up", "--policy", "no-such-policy"]) == 2
    assert main(["up", "--agent-arg", "no-equals-sign"]) == 2
    # adapt settings are checked before anything starts, as the control plane would check them
    assert main(["up", "--adapt-option", "window_s=-1"]) == 2
    assert main(["up", "--adapt-option", "no_such_setting=1"]) == 2
    assert main(["up", "--no-adapt", "--adapt-option", "window_s=2"]) == 2
    assert main(["up", "--grpc-port", "0"]) == 2  # a fixed port: the restarted gateway takes it again
    assert main(["up", "--grpc-port", "70000"]) == 2
    taken = tmp_path / "a-file"
    taken.write_text("not a folder", encoding="utf-8")
    assert main(["up", "--workdir", str(taken)]) == 2  # one line naming --workdir, not a traceback


def _start_up(*args: str) -> tuple[subprocess.Popen[str], str]:
    """``edgemux up ARGS`` started, and what it printed until it serves (``Ctrl-C stops everything``)."""
    proc = subprocess.Popen([sys.executable, "-m", "edgemux", "up", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:  # ends at EOF if `up` dies: the caller's asserts then say why
        lines.append(line)
        if line.startswith("Ctrl-C stops everything"):
            break
    return proc, "".join(lines)


def test_up_keeps_its_apps_and_token_across_runs_and_one_up_per_folder(tmp_path: Path) -> None:
    """Two runs of `up` on one folder: the first applies an app and is SIGKILLed (no chance to stop anything:
    its processes die with it, by the parent-death signal, so none serves on from the folder's store); the
    second resumes the app with the same token and stops on SIGINT, every process gone. A second `up` on a
    folder in use is refused; --ephemeral keeps nothing."""
    cluster = tmp_path / "one-node.yaml"
    cluster.write_text(
        "apiVersion: edgemux/v1alpha1\nkind: Cluster\nmetadata: {name: one}\nspec:\n  nodes:\n"
        "    - name: n1\n      cpuCores: 2\n      memoryMb: 2048\n      devices:\n"
        "        - {name: tpu0, kind: edgetpu, memoryMb: 6.9, profiles: ibis-edgetpu}\n", encoding="utf-8")
    apps = tmp_path / "apps.yaml"
    apps.write_text("apiVersion: edgemux/v1alpha1\nkind: App\nmetadata: {name: cam}\nspec:\n"
                    "  model: mobilenet_v2\n  rate: 5\n  slo: {latencyMs: 100}\n", encoding="utf-8")
    folder = Path(os.environ["EDGEMUX_HOME"]) / "up" / "one"  # the cluster's name
    tokens, seen = [], []
    for run in range(2):
        proc, text = _start_up("--cluster", str(cluster))
        try:
            assert f"state: {folder} (kept:" in text, text + (proc.stderr.read() if proc.stderr else "")
            token = (folder / "token").read_text(encoding="utf-8").strip()
            assert re.search(rf"^dashboard: http://127\.0\.0\.1:\d+/dashboard#token={token} ", text, re.M), text
            if run == 0:
                # a second `up` on the same folder is refused before it starts anything, naming the first
                second = _edgemux("up", "--cluster", str(cluster))
                assert second.returncode == 2 and second.stdout == ""
                assert f"in use by another edgemux up (pid {proc.pid})" in second.stderr
                assert len(second.stderr.strip().splitlines()) == 1
                assert _edgemux("apply", "-f", str(apps)).returncode == 0
            got = _edgemux("get", "apps", "--json")
            assert got.returncode == 0, got.stderr
            seen.append([a["name"] for a in json.loads(got.stdout)["apps"]])
            tokens.append((folder / "token").read_text(encoding="utf-8"))
            assert "1 nodes, 1 devices: 0 real, 1 emulated" in text, text
            pids = [int(m) for m in re.findall(r"\(pid (\d+)", text)]
            assert len(pids) == 3  # control plane, gateway, one agent
            if run == 0:
                proc.kill()
                proc.wait()
            else:
                proc.send_signal(signal.SIGINT)
                assert proc.wait(timeout=TIMEOUT_S) == 0
            deadline = time.monotonic() + TIMEOUT_S
            while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert all(_gone(pid) for pid in pids), (run, pids)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert seen == [["cam"], ["cam"]] and tokens[0] == tokens[1]  # the second run resumed the first's app
    # --ephemeral: a temporary folder, removed at exit
    proc, text = _start_up("--cluster", str(cluster), "--ephemeral")
    try:
        m = re.search(r"^state: (\S+) \(temporary", text, re.M)
        assert m is not None, text
        assert json.loads(_edgemux("get", "apps", "--json").stdout)["apps"] == []
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=TIMEOUT_S) == 0 and not Path(m.group(1)).exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert main(["up", "--ephemeral", "--workdir", str(tmp_path)]) == 2


# ------------------------------------------------------------------------------------------ gateway


@pytest.mark.parametrize("args", [
    ["--port", "70000"],
    ["--timeout-s", "0"],
    ["--max-wait-s", "-1"],
    ["--max-body-mb", "nan"],
    ["--controlplane", "not-a-url"],
    ["--no-such-option"],
])
def test_gateway_bad_args_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gateway", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err and len(err.splitlines()) == 1


def test_gateway_serves_without_its_control_plane_and_stops_on_sigterm() -> None:
    # a control plane that is not there: registration is retried in the background, never fatal
    proc = subprocess.Popen([sys.executable, "-m", "edgemux", "gateway", "--controlplane", "http://127.0.0.1:9"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("gateway listening on http://127.0.0.1:"), line + (proc.stderr.read() if proc.stderr else "")
        url = line.split(" listening on ")[1].strip()
        assert _http("GET", url + "/v2/health/live")[0] == 200
        assert _http("GET", url + "/v2/models/nope/ready")[0] == 404
        # Registration runs in the background, so its first failure may come after the gateway serves (on a
        # busy host, well after): wait for it rather than race it. The timer ends the wait if it never comes.
        assert proc.stderr is not None
        watchdog = threading.Timer(TIMEOUT_S, proc.kill)
        watchdog.start()
        seen: list[str] = []
        try:
            for err_line in proc.stderr:
                seen.append(err_line)
                if "cannot register with the control plane" in err_line:
                    break
        finally:
            watchdog.cancel()
        assert seen and "cannot register with the control plane" in seen[-1], "".join(seen)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=TIMEOUT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_up_with_a_taken_grpc_port_stops_naming_the_gateway() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = _edgemux("up", "--grpc-port", str(port), "--no-auto-profile")
    assert r.returncode == 1, r.stderr
    assert "gateway exited with status 2 during start-up" in r.stderr and f"--grpc-port: cannot listen on 127.0.0.1:{port}" in r.stderr
    assert "Traceback" not in r.stderr
