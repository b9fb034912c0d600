"""Every ``--json`` output is one strict JSON document on stdout and nothing else.

The commands run as a newcomer runs them (a subprocess, so a C library writing to file descriptor 1, as HiGHS
does with its banner, is caught). Which commands have ``--json`` is read from the parser, so a new one without
a case here fails ``test_every_json_command_has_a_case``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgemux.cli.jsonout import emit
from edgemux.cli.main import build_parser
from edgemux.runtime.auth import write_token_file
from support import strict_json

# slow: not in `make test-fast` (the module's expensive fixture is built once: make test distributes
# whole modules, --dist loadscope)
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
EX = ROOT / "examples"
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}


def _json_commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """The command paths (e.g. ("profiles", "list")) whose parser has a --json flag."""
    found = set()
    for action in parser._actions:  # argparse exposes its subparsers only through this attribute
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= _json_commands(sub, prefix + (name,))
        elif "--json" in action.option_strings and prefix:
            found.add(prefix)
    return found


def _run(argv: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgemux", *argv], capture_output=True, text=True, env=ENV,
                          timeout=timeout, cwd=ROOT)


# command path -> (argv, accepted exit codes); "{server}" is a running control plane's URL
CASES: dict[tuple[str, ...], tuple[list[str], set[int]]] = {
    ("predict",): (["predict", str(EX / "edge-node.yaml"), "--json"], {0, 1}),
    ("simulate",): (["simulate", str(EX / "one-camera.yaml"), "--requests", "2000", "--replications", "2",
                     "--json"], {0, 1}),
    ("validate",): (["validate", "--family", "cpu-tandem", "--size", "0.05", "--workers", "1", "--json"], {0, 1}),
    ("profiles", "list"): (["profiles", "list", "--json"], {0}),
    ("profiles", "show"): (["profiles", "show", "ibis-edgetpu/inception_v4", "--json"], {0}),
    ("profiles", "constants"): (["profiles", "constants", "--json"], {0}),
    ("place",): (["place", "--cluster", str(EX / "cluster" / "cluster.yaml"), "--apps",
                  str(EX / "cluster" / "apps.yaml"), "--policy", "edgemux", "--json"], {0, 1}),
    # the experiment whose solver printed its banner on stdout before the JSON
    ("experiment",): (["experiment", "microedge-cameras", "--quick", "--json", "--out", "{tmp}"], {0}),
    ("apply",): (["apply", "-f", str(EX / "cluster" / "apps.yaml"), "--server", "{server}", "--json"], {0, 1}),
    ("get",): (["get", "apps", "--server", "{server}", "--json"], {0}),
    ("describe",): (["describe", "app", "cam-entrance", "--server", "{server}", "--json"], {0}),
    ("delete",): (["delete", "app", "ar-overlay", "--server", "{server}", "--json"], {0}),
    ("move",): (["move", "app", "cam-entrance", "--to", "node-2/tpu0", "--server", "{server}", "--json"], {0}),
    ("rotate-key",): (["rotate-key", "app", "cam-entrance", "--server", "{server}", "--json"], {0}),
    # load needs a gateway and agents: tests/test_runtime_load.py::test_cli_json_output drives it against fake
    # servers and parses its output with the strict parser below
    ("load",): ([], set()),
}


def test_every_json_command_has_a_case() -> None:
    assert _json_commands(build_parser()) == set(CASES)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A control plane with authentication on: (its URL, its admin token file)."""
    where = tmp_path_factory.mktemp("cp")
    store, token = where / "s.db", where / "token"
    write_token_file(token)
    proc = subprocess.Popen([sys.executable, "-m", "edgemux", "controlplane", "--cluster",
                             str(EX / "cluster" / "cluster.yaml"), "--store", str(store), "--port", "0",
                             "--log-level", "warning", "--token-file", str(token)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("controlplane listening on "), line
        yield line.rsplit(" ", 1)[1], str(token)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# the client verbs run in this order against one control plane: apply first, delete last
ORDER = [c for c in CASES if CASES[c][0]]


@pytest.mark.parametrize("command", ORDER, ids=lambda c: " ".join(c))
def test_json_output_parses(command: tuple[str, ...], request: pytest.FixtureRequest, tmp_path: Path) -> None:
    argv, codes = CASES[command]
    if any("{server}" in a for a in argv):
        url, token = request.getfixturevalue("server")
        if command != ("apply",):  # every client verb after apply sees its apps
            _run(["apply", "-f", str(EX / "cluster" / "apps.yaml"), "--server", url, "--token-file", token])
        argv = [a.replace("{server}", url) for a in argv] + ["--token-file", token]
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    done = _run(argv)
    assert done.returncode in codes, (done.returncode, done.stderr[-2000:])
    assert done.stdout.strip(), done.stderr[-2000:]
    doc = strict_json(done.stdout)
    assert isinstance(doc, (dict, list))


def test_emit_writes_non_finite_numbers_as_null(capsys: pytest.CaptureFixture[str]) -> None:
    emit({"a": float("nan"), "b": [float("inf"), 1.5, -float("inf")], "c": (2, "x")})
    assert strict_json(capsys.readouterr().out) == {"a": None, "b": [None, 1.5, None], "c": [2, "x"]}


def test_a_c_level_write_during_json_goes_to_stderr(tmp_path: Path) -> None:
    """The guard itself: a write to descriptor 1 beneath sys.stdout (what HiGHS does) lands on stderr."""
    code = ("import os, sys\n"
            "from edgemux.cli.jsonout import emit, json_only_stdout\n"
            "with json_only_stdout():\n"
            "    os.write(1, b'banner from C\\n')\n"
            "    emit({'ok': True})\n"
            "print('after')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV)
    assert done.returncode == 0, done.stderr
    assert done.stdout == '{\n  "ok": true\n}\nafter\n'
    assert "banner from C" in done.stderr
