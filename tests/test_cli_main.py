"""The CLI builds only the parser of the verb it runs (cli/main.py, ``COMMANDS``): the table names every verb
once, each under the module that adds it, and a verb's own parser parses what the whole one parses."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from edgemux.cli.main import COMMANDS, build_parser


def _verbs(parser: argparse.ArgumentParser) -> list[str]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]  # argparse's only handle
    return list(sub.choices)


def test_the_table_names_every_verb_once_in_the_listed_order() -> None:
    listed = [v for _, verbs in COMMANDS for v in verbs]
    assert _verbs(build_parser()) == listed and len(set(listed)) == len(listed)


@pytest.mark.parametrize("module, verbs", COMMANDS, ids=[m for m, _ in COMMANDS])
def test_a_verb_builds_the_verbs_of_its_module_alone(module: str, verbs: tuple[str, ...]) -> None:
    for verb in verbs:
        assert _verbs(build_parser(verb)) == list(verbs)


def test_a_gateway_start_imports_no_estimator() -> None:
    """What the split is for: `edgemux gateway` (started for every cluster) parses its arguments without
    importing the estimators or scipy."""
    code = ("import sys\nfrom edgemux.cli.main import build_parser\n"
            "build_parser('gateway').parse_args(['gateway', '--port', '0'])\n"
            "print(sorted(m for m in ('scipy', 'edgemux.perf', 'edgemux.policies') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_client_verb_imports_no_estimator() -> None:
    """The control plane's client verbs (``cli.client_cmd``) are apart from its server's: `edgemux get apps`
    parses and builds its call without importing the policies, the estimators or scipy."""
    code = ("import sys\nfrom edgemux.cli.main import build_parser\n"
            "args = build_parser('get').parse_args(['get', 'apps', '--server', 'http://127.0.0.1:1'])\n"
            "import edgemux.cli.client_cmd\n"
            "print(sorted(m for m in ('scipy', 'edgemux.perf', 'edgemux.policies') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
