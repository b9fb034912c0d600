"""The ``edgemux`` command: one entry point, verbs as subcommands.

Bad input never produces a traceback: ``EdgemuxError`` (and argument errors) become one line on stderr
and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

from edgemux import __version__
from edgemux.cli.jsonout import json_only_stdout
from edgemux.errors import EdgemuxError

DESCRIPTION = "SLO-aware multi-tenant DNN inference on shared edge accelerators."


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage problem in one line (and exit code 2), as the rest of the CLI does."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


class Command(NamedTuple):
    """One verb of the CLI: the module under ``edgemux.cli`` that adds it, and its one-line help."""

    verb: str
    module: str
    help: str


# Every verb in the order it is listed, with the module that adds it and the one-line help that module gives it.
# A run of one verb builds that verb's module alone, so it imports only what the verb needs: `edgemux gateway`
# and `edgemux agent`, which `edgemux up` starts for every node, skip the estimators and scipy (0.3 to 0.8 s of
# CPU at each start). No verb, --help, --version or an unknown verb list the verbs from this table without
# importing any command module (`edgemux --help` in 0.05 s rather than 1.2 s). tests/test_cli_main.py checks
# that the table names every verb its modules add, in order, with the help they register.
COMMANDS: tuple[Command, ...] = (
    Command("predict", "scenario_cmd", "predict every app's latency on a scenario with the estimators"),
    Command("simulate", "scenario_cmd",
            "simulate a scenario (discrete events, virtual time) next to the prediction"),
    Command("validate", "validate_cmd", "check estimators against the simulator, or against measurements"),
    Command("profiles", "profiles_cmd", "list and show built-in profiles (numbers from the papers)"),
    Command("place", "place_cmd", "admit and place apps on a cluster with an admission policy"),
    Command("experiment", "experiment_cmd", "reproduce a paper's experiment (CSV, PNG, summary table)"),
    Command("agent", "agent_cmd", "run a node agent: serve inference on one node's devices"),
    Command("profile", "profile_cmd", "measure models on a real backend and write a profile set"),
    Command("controlplane", "controlplane_cmd", "run the control plane: admit apps, drive agents and gateways"),
    Command("apply", "client_cmd", "apply app specs (App, AppList) to the control plane"),
    Command("get", "client_cmd", "list apps, nodes, devices, agents, routes or events of the control plane"),
    Command("top", "client_cmd", "a refreshing view of the devices and apps: utilization and latency, "
                                 "predicted beside observed"),
    Command("describe", "client_cmd", "describe an app: placement, predicted latency, status"),
    Command("delete", "client_cmd", "delete an app"),
    Command("move", "client_cmd",
            "move an app to other devices without dropping a request (make before break)"),
    Command("rotate-key", "client_cmd", "issue a new key for an app (the old one stops working)"),
    Command("load", "load_cmd", "offer an app open-loop load; observed latency beside the predicted"),
    Command("gateway", "gateway_cmd", "run the gateway: police and route inference requests by app name"),
    Command("up", "up_cmd", "run a cluster locally: control plane, gateway and one agent per node"),
    Command("demo", "demo_cmd",
            "bring up the local cluster, admit example apps, drive load, print predicted vs observed, shut down"),
)

_MODULE_OF = {c.verb: c.module for c in COMMANDS}


def _top() -> tuple[argparse.ArgumentParser, Any]:
    """The parser's top level (``--version``) and its verbs' action, to which the verbs are added."""
    p = _Parser(prog="edgemux", description=DESCRIPTION)
    p.add_argument("--version", action="version", version=f"edgemux {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    return p, sub


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The CLI's full parser: every verb with all its options (importing every command module), or only the
    verbs of the module that adds ``verb`` when it is one."""
    import importlib

    wanted = _MODULE_OF.get(verb or "")
    modules = [wanted] if wanted else list(dict.fromkeys(c.module for c in COMMANDS))
    p, sub = _top()
    for name in modules:
        module = importlib.import_module(f"edgemux.cli.{name}")
        add = getattr(module, "add_parsers", None) or module.add_parser
        add(sub)
    return p


def index_parser() -> argparse.ArgumentParser:
    """The top-level parser built from ``COMMANDS`` alone: what ``edgemux``, ``edgemux --help``,
    ``--version`` and an unknown verb need (the list of verbs and their help), with no command module
    imported. Its verbs take any arguments; a verb's own options come from :func:`build_parser`."""
    p, sub = _top()
    for c in COMMANDS:
        sp = sub.add_parser(c.verb, help=c.help, add_help=False)
        sp.add_argument("rest", nargs=argparse.REMAINDER)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 1 a check failed, 2 bad input)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        if args_list and args_list[0] in _MODULE_OF:
            args = build_parser(args_list[0]).parse_args(args_list)
        else:
            # Help, --version, no verb or an unknown one exit here. Should a verb ever parse (no top-level option
            # lets one come second today), its own module's parser parses the line again.
            verb = index_parser().parse_args(args_list).command
            args = build_parser(verb).parse_args(args_list)
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
