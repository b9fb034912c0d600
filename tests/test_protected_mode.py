"""Protected mode (issue 38, item 4): ``edgemux agent``, ``gateway`` and ``controlplane`` listening beyond
loopback without an admin token refuse to start, in one line with exit code 2 and before they bind anything,
naming the fix; ``--no-auth`` runs them open on purpose; on a loopback address they start open as before;
with a token they start protected. ``edgemux up`` (the engine) passes ``--no-auth`` to its processes when it
runs without a token, so that they start on a Ray node's address too.

Each verb runs as a real process (``python -m edgemux``); a service on ``0.0.0.0`` is reached on 127.0.0.1.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from edgemux.cli.main import main
from edgemux.engines.local import Engine, ProcessSpec
from edgemux.errors import InputError
from edgemux.runtime.auth import TOKEN_ENV, TOKEN_FILE_ENV, is_loopback, server_token, write_token_file
from support import TWO_TPUS_YAML

VERBS = ("agent", "gateway", "controlplane")
START_S = 60.0  # bound on a verb's start-up (imports: a few seconds; a loaded host, more)
REFUSAL = ("edgemux: error: --host: 0.0.0.0 is reachable from other hosts and no admin token is given; give one "
           "(--token-file FILE or $EDGEMUX_TOKEN_FILE) or run open with --no-auth")
# a control API of each verb: the admin token's (401 without it on a protected service, 200 on an open one)
CONTROL = {"agent": "/v1/node", "gateway": "/v1/routes", "controlplane": "/v1/agents"}


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("LOCALHOST", True), ("::ffff:127.0.0.1", True),
    ("0.0.0.0", False), ("::", False), ("", False), ("10.0.0.5", False), ("192.168.1.2", False),
    ("fe80::1", False), ("edge-box-1", False), ("example.com", False),
])
def test_which_addresses_are_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_the_token_a_service_runs_with(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token = write_token_file(token_file)
    # loopback: open without a token, as before
    assert server_token(None, False, "127.0.0.1", env={}) is None
    # beyond loopback: a token from the file, $EDGEMUX_TOKEN_FILE or $EDGEMUX_TOKEN
    assert server_token(str(token_file), False, "0.0.0.0", env={}) == token
    assert server_token(None, False, "0.0.0.0", env={TOKEN_FILE_ENV: str(token_file)}) == token
    assert server_token(None, False, "::", env={TOKEN_ENV: "abc"}) == "abc"
    # none: refused, naming the fix
    with pytest.raises(InputError) as refused:
        server_token(None, False, "0.0.0.0", env={})
    assert f"edgemux: error: {refused.value}" == REFUSAL
    with pytest.raises(InputError, match=r"--host: 10\.1\.2\.3 is reachable from other hosts"):
        server_token(None, False, "10.1.2.3", env={TOKEN_ENV: "  "})
    # --no-auth: open on purpose, whatever the environment holds; with --token-file a contradiction
    assert server_token(None, True, "0.0.0.0", env={TOKEN_ENV: "abc"}) is None
    with pytest.raises(InputError, match="--no-auth: given with --token-file"):
        server_token(str(token_file), True, "0.0.0.0", env={})


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, TOKEN_FILE_ENV)}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def _args(verb: str, tmp_path: Path) -> list[str]:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(TWO_TPUS_YAML, encoding="utf-8")
    if verb == "agent":
        return ["agent", "--cluster", str(cluster), "--node", "n1", "--heartbeat-s", "60"]
    if verb == "controlplane":
        return ["controlplane", "--cluster", str(cluster), "--store", str(tmp_path / "store.sqlite"), "--no-adapt"]
    return ["gateway"]


@pytest.mark.parametrize("verb", VERBS)
def test_a_service_beyond_loopback_without_a_token_refuses_in_one_line(verb: str, tmp_path: Path) -> None:
    # the port is taken, by us: a service that tried to bind it first would say it cannot listen there; the
    # refusal comes before anything binds (and before the control plane opens its store)
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "edgemux", *_args(verb, tmp_path), "--host", "0.0.0.0",
                               "--port", str(port)], capture_output=True, text=True, env=_env(), timeout=START_S,
                              check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == REFUSAL + "\n"
    assert done.stdout == ""
    assert not (tmp_path / "store.sqlite").exists()


def test_no_auth_with_a_token_file_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token_file = tmp_path / "token"
    write_token_file(token_file)
    for verb in VERBS:
        assert main([*_args(verb, tmp_path), "--host", "0.0.0.0", "--no-auth", "--token-file", str(token_file)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("edgemux: error: --no-auth: given with --token-file") and err.count("\n") == 1, err


def _status(url: str, token: str | None = None) -> int:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize("how", ["no-auth beyond loopback", "loopback without a token", "token beyond loopback"])
def test_a_service_starts_open_or_protected(verb: str, how: str, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token = write_token_file(token_file)
    extra = {"no-auth beyond loopback": ["--host", "0.0.0.0", "--no-auth"],
             "loopback without a token": ["--host", "127.0.0.1"],
             "token beyond loopback": ["--host", "0.0.0.0"]}[how]
    # --no-auth ignores a token in the environment; the protected one takes it from $EDGEMUX_TOKEN_FILE
    env = _env(**({TOKEN_ENV: "ignored-token"} if how.startswith("no-auth") else
                  {TOKEN_FILE_ENV: str(token_file)} if how.startswith("token") else {}))
    proc = subprocess.Popen([sys.executable, "-m", "edgemux", *_args(verb, tmp_path), *extra, "--port", "0",
                             "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert " listening on http://" in line, line + (proc.stderr.read() if proc.stderr else "")
        port = line.strip().rsplit(":", 1)[1]
        base = f"http://127.0.0.1:{port}"
        if verb != "controlplane":
            assert _status(base + "/v2/health/live") == 200  # health stays open either way
        if how.startswith("token"):
            assert _status(base + CONTROL[verb]) == 401
            assert _status(base + CONTROL[verb], "ignored-token") == 401
            assert _status(base + CONTROL[verb], token) == 200
        else:
            assert _status(base + CONTROL[verb]) == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=START_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    assert proc.returncode == 0, err
    # running open where other hosts reach it is said, once, as a warning
    assert ("running open on 0.0.0.0 (--no-auth)" in err) is how.startswith("no-auth"), err


class _Recorder:
    """A launcher that records what it is asked to start and starts nothing (the engine stops there)."""

    def __init__(self) -> None:
        self.specs: list[ProcessSpec] = []

    def launch(self, spec: ProcessSpec) -> object:
        self.specs.append(spec)
        raise RuntimeError("recorded")

    def check_nodes(self, nodes: object) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.mark.parametrize("auth", [False, True])
def test_the_engine_hands_its_processes_the_token_or_no_auth(auth: bool, tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(TWO_TPUS_YAML, encoding="utf-8")
    recorder = _Recorder()
    engine = Engine(cluster, host="0.0.0.0", auth=auth, auto_profile=False, launcher=recorder,
                    workdir=tmp_path / "work")
    with pytest.raises(RuntimeError, match="recorded"):
        engine.start()
    (spec,) = recorder.specs  # the control plane, first
    assert spec.role == "controlplane"
    if auth:
        assert "--no-auth" not in spec.args and dict(spec.env)[TOKEN_ENV] == engine.token
    else:
        assert spec.args[-1] == "--no-auth" and TOKEN_ENV not in dict(spec.env)
