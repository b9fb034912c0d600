"""The CLI builds only the parser of the verb it runs (cli/main.py, ``COMMANDS``): the table names every verb
once, each under the module that adds it with the help that module gives it, and a verb's own parser parses
what the whole one parses. With no verb (``--help``, ``--version``, an unknown verb) the verbs are listed from
the table alone, no command module imported.

What makes the CLI answer at once is which modules a command imports, so that is what these tests check (in a
fresh interpreter each); wall times are benchmarks/bench_cli.py's, never asserted."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from edgemux import __version__
from edgemux.cli.main import COMMANDS, build_parser, index_parser, main

MODULES = list(dict.fromkeys(c.module for c in COMMANDS))
# what a command that only parses or calls the control plane's API should not pay for at start-up
HEAVY = ("numpy", "scipy", "asyncio", "aiohttp", "edgemux.perf", "edgemux.policies", "edgemux.sim")
# verbs whose own module imports the estimators to build its parser (not this change's: the policy names in
# place's help, the experiments' names in experiment's, up's use of place's)
HEAVY_VERBS = {"place", "experiment", "up"}


def _sub(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]  # argparse's only handle
    return sub


def _verbs(parser: argparse.ArgumentParser) -> list[str]:
    return list(_sub(parser).choices)


def _imported_after(code: str, modules: tuple[str, ...] = HEAVY) -> list[str]:
    """Which of ``modules`` a fresh interpreter holds after running ``code`` (its stdout discarded)."""
    script = ("import io, json, sys\nsys.stdout = io.StringIO()\n" + code +
              f"\nsys.stdout = sys.__stdout__\nprint(json.dumps(sorted(m for m in {modules!r} if m in sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_table_names_every_verb_once_in_the_listed_order() -> None:
    listed = [c.verb for c in COMMANDS]
    assert _verbs(build_parser()) == listed and len(set(listed)) == len(listed)


@pytest.mark.parametrize("module", MODULES)
def test_the_table_gives_each_verb_the_help_its_module_registers(module: str) -> None:
    registered = {a.dest: a.help for a in _sub(build_parser(next(c.verb for c in COMMANDS if c.module == module)))
                  ._choices_actions}
    assert {c.verb: c.help for c in COMMANDS if c.module == module} == registered


def test_the_verbs_list_from_the_table_is_the_full_parsers_help() -> None:
    assert index_parser().format_help() == build_parser().format_help()


@pytest.mark.parametrize("module", MODULES)
def test_a_verb_builds_the_verbs_of_its_module_alone(module: str) -> None:
    verbs = [c.verb for c in COMMANDS if c.module == module]
    for verb in verbs:
        assert _verbs(build_parser(verb)) == verbs


def test_help_version_and_usage_errors_without_a_verb(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: edgemux") and all(c.verb in out for c in COMMANDS)
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"edgemux {__version__}"
    for argv, message in (([], "the following arguments are required: COMMAND"),
                          (["nosuchverb"], "argument COMMAND: invalid choice: 'nosuchverb'")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("edgemux: error: ") and message in err


@pytest.mark.parametrize("argv", [["--help"], ["--version"], [], ["nosuchverb"]], ids=["help", "version", "none",
                                                                                        "unknown"])
def test_no_verb_imports_no_command_module(argv: list[str]) -> None:
    """`edgemux --help` lists the verbs from the table: no command module, nothing heavy."""
    modules = HEAVY + tuple(f"edgemux.cli.{m}" for m in MODULES)
    code = (f"import contextlib\nfrom edgemux.cli.main import main\n"
            f"with contextlib.redirect_stderr(io.StringIO()):\n    main({argv!r})\n")
    assert _imported_after(code, modules) == []


@pytest.mark.parametrize("verb", [c.verb for c in COMMANDS if c.verb not in HEAVY_VERBS])
def test_a_verbs_help_imports_no_estimator(verb: str) -> None:
    """Building a verb's parser imports neither numpy nor scipy nor the estimators (asyncio only for the
    servers and the load generator, which run an event loop)."""
    imported = _imported_after(f"from edgemux.cli.main import main\nmain([{verb!r}, '--help'])")
    servers = {"agent", "gateway", "load", "demo"}
    assert imported == (["asyncio"] if verb in servers else [])


def test_a_gateway_start_imports_no_estimator() -> None:
    """What the split is for: `edgemux gateway` (started for every cluster) parses its arguments without
    importing the estimators or scipy."""
    code = "from edgemux.cli.main import build_parser\nbuild_parser('gateway').parse_args(['gateway', '--port', '0'])"
    assert _imported_after(code, ("scipy", "numpy", "edgemux.perf", "edgemux.policies")) == []


def test_get_apps_imports_nothing_heavy() -> None:
    """`edgemux get apps` (here against a closed port: the same imports, the call refused) needs the API
    client, its messages and a table: not numpy (0.1 to 0.15 s of start-up), asyncio, the estimators or the
    data plane's codec."""
    code = ("import contextlib\nfrom edgemux.cli.main import main\n"
            "with contextlib.redirect_stderr(io.StringIO()):\n"
            "    assert main(['get', 'apps', '--server', 'http://127.0.0.1:1']) == 2\n")
    assert _imported_after(code, HEAVY + ("edgemux.runtime.dataplane.protocol", "edgemux.adapt.calibrate")) == []
