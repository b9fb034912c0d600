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


def build_parser() -> argparse.ArgumentParser:
    from edgemux.cli import profiles_cmd, scenario_cmd, validate_cmd
    from edgemux.cli import place_cmd
    from edgemux.cli import experiment_cmd
    from edgemux.cli import agent_cmd
    from edgemux.cli import profile_cmd
    from edgemux.cli import controlplane_cmd
    from edgemux.cli import load_cmd
    from edgemux.cli import gateway_cmd
    from edgemux.cli import up_cmd
    from edgemux.cli import demo_cmd

    p = _Parser(prog="edgemux", description="SLO-aware multi-tenant DNN inference on shared edge accelerators.")
    p.add_argument("--version", action="version", version=f"edgemux {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    scenario_cmd.add_parsers(sub)
    validate_cmd.add_parser(sub)
    profiles_cmd.add_parsers(sub)
    place_cmd.add_parser(sub)
    experiment_cmd.add_parser(sub)
    agent_cmd.add_parser(sub)
    profile_cmd.add_parser(sub)
    controlplane_cmd.add_parsers(sub)
    load_cmd.add_parser(sub)
    gateway_cmd.add_parser(sub)
    up_cmd.add_parser(sub)
    demo_cmd.add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 1 a check failed, 2 bad input)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
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
