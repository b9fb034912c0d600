"""The ``edgemux`` command: one entry point, verbs as subcommands.

Bad input never produces a traceback: ``EdgemuxError`` (and argument errors) become one line on stderr
and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from edgemux import __version__
from edgemux.cli.jsonout import json_only_stdout
from edgemux.errors import EdgemuxError


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage problem in one line (and exit code 2), as the rest of the CLI does."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


# The command modules in the order their verbs are listed, each with the verbs it adds. A run of one verb builds
# that verb's module alone, so it imports only what the verb needs: `edgemux gateway` and `edgemux agent`, which
# `edgemux up` starts for every node, skip the estimators and scipy (0.3 to 0.8 s of CPU at each start). No
# verb, --help, --version or an unknown verb build them all. tests/test_cli_main.py checks the table.
COMMANDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("scenario_cmd", ("predict", "simulate")),
    ("validate_cmd", ("validate",)),
    ("profiles_cmd", ("profiles",)),
    ("place_cmd", ("place",)),
    ("experiment_cmd", ("experiment",)),
    ("agent_cmd", ("agent",)),
    ("profile_cmd", ("profile",)),
    ("controlplane_cmd", ("controlplane",)),
    ("client_cmd", ("apply", "get", "describe", "delete", "move", "rotate-key")),
    ("load_cmd", ("load",)),
    ("gateway_cmd", ("gateway",)),
    ("up_cmd", ("up",)),
    ("demo_cmd", ("demo",)),
)


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The CLI's parser: every verb, or only the verbs of the module that adds ``verb`` when it is one."""
    import importlib

    modules = [m for m, verbs in COMMANDS if verb in verbs] or [m for m, _ in COMMANDS]
    p = _Parser(prog="edgemux", description="SLO-aware multi-tenant DNN inference on shared edge accelerators.")
    p.add_argument("--version", action="version", version=f"edgemux {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in modules:
        module = importlib.import_module(f"edgemux.cli.{name}")
        add = getattr(module, "add_parsers", None) or module.add_parser
        add(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 1 a check failed, 2 bad input)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(args_list[0] if args_list else None)
    try:
        args = parser.parse_args(args_list)
    except SystemExit as e:  # usage errors (code 2), --help/--version (code 0): already printed
        return int(e.code or 0)
    try:
        if getattr(args, "json", False):
            with json_only_stdout():  # --json: stdout carries the JSON document alone
                code = args.func(args)
        else:
            code = args.func(args)
    except EdgemuxError as e:
        print(f"edgemux: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `edgemux profiles list | head`
        return 0
    return int(code or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
