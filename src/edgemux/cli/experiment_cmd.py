"""``edgemux experiment NAME [--out DIR] [--seed N] [--quick] [--json]``: run one of the papers' experiments,
write ``<out>/<NAME>.csv`` and ``<out>/<NAME>.png``, and print the summary table (the paper's figure beside
ours) with the assumptions, or the whole result as JSON. An unknown name is an ``InputError`` (exit 2)."""

from __future__ import annotations

import argparse
from typing import Any

from edgemux.cli.jsonout import emit
from edgemux.cli.progress import progress_for
from edgemux.errors import InputError
from edgemux.experiments.registry import names
from edgemux.experiments.runner import run_experiment, summary_table


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("experiment", help="reproduce a paper's experiment (CSV, PNG, summary table)",
                              description="Run an experiment; writes <out>/<NAME>.csv and <out>/<NAME>.png.")
    p.add_argument("name", metavar="NAME", help=f"experiment name ({', '.join(names())})")
    p.add_argument("--out", default="out", metavar="DIR", help="output directory (default out/)")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="random seed (default 0)")
    p.add_argument("--quick", action="store_true", help="fewer simulated requests (a smoke run)")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    p.set_defaults(func=cmd_experiment)


def cmd_experiment(args: argparse.Namespace) -> int:
    if args.seed < 0:  # numpy's seed sequences take none; say so before an experiment starts
        raise InputError("--seed", f"must be an integer >= 0, got {args.seed}")
    # steps, not equal parts: the run is nearly all of the time, so no time left is extrapolated from them
    with progress_for(args, 3, f"experiment {args.name}", eta=False) as bar:
        result = run_experiment(args.name, args.out, seed=args.seed, quick=args.quick, progress=bar)
    if args.json:
        emit(result.to_json(), default=str)
    else:
        print(summary_table(result))
    return 0
