"""docs/serving.md's session, run as the page tells a new user to, in the page's order, on a local cluster.

The page marks each example it means to be run with an HTML comment before its fence, ``<!-- example: NAME -->``:

- ``by-hand``: ``edgemux up ...`` (started here, on a free gRPC port and a temporary work folder and CLI
  context), then every ``edgemux`` line in another shell; a line whose comment says ``exit N`` must exit N,
  the others 0;
- ``curl``: the curl requests with the app's key (skipped without curl), and the same requests through urllib,
  with and without the key;
- ``tritonclient-http``, ``tritonclient-grpc``: the tritonclient examples against the gateway;
- ``from-python``: the Python example, run after the CLI's ``apply`` as the page orders them (its apps come back
  ``unchanged``, without keys: the example must get one).

The environment the examples read (``GATEWAY``, ``GATEWAY_GRPC``, ``EDGEMUX_APP_KEY``) is what the page's
``export`` lines name, filled from what ``up`` and ``apply`` printed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")  # the serve extra
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SERVING = ROOT / "docs" / "serving.md"
EXAMPLE = re.compile(r"^<!-- example: ([\w-]+)[^>]*-->\n```(\w+)\n(.*?)^```", re.S | re.M)
EXPORT = re.compile(r"^export (\w+)=", re.M)
APP = "cpu-squeeze"  # the app the curl and tritonclient examples call
READY_MARK = "Ctrl-C stops everything."


def examples() -> dict[str, tuple[str, str]]:
    """The page's marked examples: name -> (fence language, text)."""
    return {m.group(1): (m.group(2), m.group(3)) for m in EXAMPLE.finditer(SERVING.read_text(encoding="utf-8"))}


def command_lines(text: str) -> list[str]:
    """The shell lines of a block, comments and blank lines dropped, ``\\`` continuations joined."""
    out, cur = [], ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        line = cur + line
        cur = ""
        if line.strip() and not line.lstrip().startswith("#"):
            out.append(line.strip())
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Cluster:
    controlplane: str
    gateway: str
    gateway_grpc: str
    token_file: str
    agents: dict[str, str]
    env: dict[str, str]
    steps: list[tuple[str, int, int, str, str]] = field(default_factory=list)  # line, expected, rc, out, err
    keys: dict[str, str] = field(default_factory=dict)


def _edgemux(line: str) -> list[str]:
    words = shlex.split(line, comments=True)
    assert words[0] == "edgemux", line
    return [sys.executable, "-m", "edgemux", *words[1:]]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    lang, block = examples()["by-hand"]
    assert lang == "bash"
    lines = command_lines(block)
    up, rest = lines[0], lines[1:]
    assert up.startswith("edgemux up"), f"the by-hand example starts with `edgemux up`, not {up!r}"
    tmp = tmp_path_factory.mktemp("serving-doc")
    env = {**os.environ, "EDGEMUX_CONTEXT": str(tmp / "context.json"), "EDGEMUX_HOME": str(tmp / "home"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for name in ("EDGEMUX_SERVER", "EDGEMUX_TOKEN", "EDGEMUX_TOKEN_FILE", "EDGEMUX_APP_KEY"):
        env.pop(name, None)
    args = _edgemux(up)
    if "--grpc-port" in args:  # the page's fixed port may be taken here: a free one in its place
        args[args.index("--grpc-port") + 1] = str(_free_port())
    args += ["--workdir", str(tmp / "work")]  # a fresh cluster: its apply creates the apps and prints their keys
    log = tmp / "up.out"
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while READY_MARK not in log.read_text(encoding="utf-8"):
            assert proc.poll() is None, f"edgemux up exited {proc.returncode}:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"edgemux up not ready in 240 s:\n{log.read_text()}"
            time.sleep(0.3)
        text = log.read_text(encoding="utf-8")

        def find(pattern: str) -> str:
            m = re.search(pattern, text, re.M)
            assert m, f"`edgemux up` printed no {pattern!r}:\n{text}"
            return m.group(1)

        c = Cluster(controlplane=find(r"^controlplane\s+(\S+)"), gateway=find(r"^gateway\s+(http\S+)"),
                    gateway_grpc=find(r"^gateway gRPC\s+(\S+)"), token_file=find(r"^admin token: (\S+)"),
                    agents=dict(re.findall(r"^agent (\S+)\s+(http\S+)", text, re.M)), env=env)
        for line in rest:
            expected = re.search(r"#.*\bexit (\d+)", line)
            r = subprocess.run(_edgemux(line), cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
            c.steps.append((line, int(expected.group(1)) if expected else 0, r.returncode, r.stdout, r.stderr))
            c.keys.update(re.findall(r"^app (\S+) key: (emk_\S+)", r.stdout, re.M))
        yield c
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def _client_env(c: Cluster) -> dict[str, str]:
    """What the page's export lines set, from what up and apply printed."""
    given = {"GATEWAY": c.gateway, "GATEWAY_GRPC": c.gateway_grpc, "EDGEMUX_APP_KEY": c.keys.get(APP, "")}
    text = SERVING.read_text(encoding="utf-8")
    section = text.split("### Inference from any client", 1)[1].split("<!-- example:", 1)[0]
    assert set(EXPORT.findall(section)) == set(given), "the page exports other variables than the test gives"
    assert given["EDGEMUX_APP_KEY"], f"apply printed no key for {APP}"
    return {**c.env, **given}


def test_by_hand_steps_exit_as_the_page_says(cluster: Cluster) -> None:
    assert cluster.steps, "the by-hand example has no step after `edgemux up`"
    for line, expected, rc, out, err in cluster.steps:
        assert rc == expected, f"`{line}` exited {rc}, the page implies {expected}:\n{out}\n{err}"
    assert APP in cluster.keys, f"`edgemux apply` printed no key for {APP}"


def test_curl_example(cluster: Cluster, tmp_path: Path) -> None:
    if shutil.which("curl") is None:
        pytest.skip("no curl here (test_the_curl_requests_through_urllib makes the same requests)")
    lang, block = examples()["curl"]
    assert lang == "bash"
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, env=_client_env(cluster),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    meta, answer = r.stdout.splitlines()[-2:]
    assert json.loads(meta)["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 64, 64]}]
    assert "'edgemux_device': 'cpu-1/cpu0'" in answer and answer.endswith("[1, 1000]"), answer


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_curl_requests_through_urllib(cluster: Cluster) -> None:
    """The request the curl example sends, with its header; without it 401, with another app's key 403, as the
    page says."""
    env = _client_env(cluster)
    body = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3, 64, 64],
                                   "data": [0.5] * (3 * 64 * 64)}]}).encode()
    url = f"{env['GATEWAY']}/v2/models/{APP}/infer"
    status, answer = _post(url, body, {"Authorization": f"Bearer {env['EDGEMUX_APP_KEY']}"})
    assert status == 200, answer
    assert answer["outputs"][0]["shape"] == [1, 1000] and answer["parameters"]["edgemux_device"] == "cpu-1/cpu0"
    status, answer = _post(url, body, {})
    assert status == 401 and answer["error"].startswith("missing credentials"), answer
    other = next(k for app, k in cluster.keys.items() if app != APP)
    status, answer = _post(url, body, {"Authorization": f"Bearer {other}"})
    assert status == 403 and answer["error"] == f"this key is not app {APP}'s", answer


@pytest.mark.parametrize("name", ["tritonclient-http", "tritonclient-grpc"])
def test_tritonclient_examples(cluster: Cluster, name: str) -> None:
    pytest.importorskip("tritonclient.http" if name.endswith("http") else "tritonclient.grpc")
    lang, code = examples()[name]
    assert lang == "python"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_client_env(cluster), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    first, last = r.stdout.splitlines()[0], r.stdout.splitlines()[-1]
    assert first == ("[{'name': 'input', 'datatype': 'FP32', 'shape': [-1, 3, 64, 64]}]" if name.endswith("http")
                     else "True"), r.stdout
    assert last == "(1, 1000) cpu-1/cpu0", r.stdout


def test_python_example_after_the_cli_apply(cluster: Cluster) -> None:
    """Run after `edgemux apply` (the fixture's by-hand steps), as the page orders them."""
    assert any(line.startswith("edgemux apply") for line, *_ in cluster.steps)
    lang, code = examples()["from-python"]
    assert lang == "python"
    r = subprocess.run([sys.executable, "-c", code, cluster.controlplane, cluster.token_file], cwd=ROOT,
                       env=cluster.env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("cam-hd rejected: "), r.stdout
    assert lines[1] == "not ready: []", r.stdout
    assert lines[2].endswith("{'logits': (1, 1000)}"), r.stdout
    assert re.fullmatch(r"(moved|unchanged) \[.*\] -> \['cpu-1/cpu0'\]", lines[3]), r.stdout
    assert lines[4] == cluster.agents["cpu-1"], r.stdout
