"""How long the CLI takes to answer: wall time of a fresh ``edgemux`` process per command, against a 0.3 s target.

Starts a control plane (``edgemux controlplane``, no agents: the apps it places stay ``pending``, which is all
``get apps`` reads) on an ephemeral port with examples/cluster/, applies examples/cluster/apps.yaml to it, then
times, interleaved, ``--runs`` fresh processes (``python -m edgemux ...``, stdout and stderr discarded) of

* ``edgemux --help``       the verbs' list, from cli/main.py's table (no command module imported);
* ``edgemux get apps``     an HTTP GET to the control plane and a table;
* ``edgemux get --help``   the client verbs' parser;
* ``edgemux apply --help`` the same module's, through another verb;

and, for scale, ``python -c pass`` (the interpreter's own start). Each line gives the median and the largest
wall time (s) and the median over the 0.3 s target (below 1.0: within it). The figures depend on the host's
load; a busy host moves them by tens of ms, so they are printed, never asserted (tests/test_cli_main.py checks
which modules a command imports instead).

    .venv/bin/python benchmarks/bench_cli.py [--runs N]

To time another tree with the same interpreter (e.g. the commit before a change): ``PYTHONPATH=OTHER/src``.

Units: s.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import edgemux

TARGET_S = 0.3  # wall time a user waits for an answer before it feels slow
ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "examples" / "cluster" / "cluster.yaml"
APPS = ROOT / "examples" / "cluster" / "apps.yaml"


def start_controlplane(store: Path) -> tuple[subprocess.Popen[str], str]:
    """An ``edgemux controlplane`` process on an ephemeral port of 127.0.0.1, and its URL once it listens."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgemux", "controlplane", "--cluster", str(CLUSTER), "--store", str(store),
         "--port", "0", "--no-adapt", "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "controlplane listening on URL", or "" when it exited
    if not line.startswith("controlplane listening on "):
        proc.kill()
        raise SystemExit(f"bench_cli: the control plane did not start (exit code {proc.wait()})")
    return proc, line.split()[-1]


def wall_s(argv: list[str], env: dict[str, str]) -> float:
    """Wall time (s) of one fresh process running ``argv``, from spawn to exit."""
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--runs", type=int, default=10, help="fresh processes per command (default 10)")
    args = ap.parse_args()
    if args.runs < 1:
        print("bench_cli: --runs must be >= 1", file=sys.stderr)
        return 2
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_controlplane(Path(tmp) / "store.db")
        try:
            # exit code 1: an app of the example is rejected (no profile of its model on some device); the rest are
            # placed, which is what `get apps` lists
            applied = subprocess.run([sys.executable, "-m", "edgemux", "apply", "-f", str(APPS), "--server", url],
                                     capture_output=True, text=True, env=env)
            if applied.returncode not in (0, 1):
                raise SystemExit(f"bench_cli: apply failed: {applied.stderr.strip()}")
            edgemux_cmd = [sys.executable, "-m", "edgemux"]
            commands = {
                "python -c pass": [sys.executable, "-c", "pass"],
                "edgemux --help": edgemux_cmd + ["--help"],
                "edgemux get apps": edgemux_cmd + ["get", "apps", "--server", url],
                "edgemux get --help": edgemux_cmd + ["get", "--help"],
                "edgemux apply --help": edgemux_cmd + ["apply", "--help"],
            }
            for argv in commands.values():  # once each, untimed: bytecode caches written, files in the page cache
                wall_s(argv, env)
            samples: dict[str, list[float]] = {name: [] for name in commands}
            for _ in range(args.runs):  # interleaved, so a burst of load on the host touches every command alike
                for name, argv in commands.items():
                    samples[name].append(wall_s(argv, env))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print(f"edgemux {edgemux.__version__} from {Path(edgemux.__file__).parent}; Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; {args.runs} runs each")
    print(f"{'command':<22} {'median s':>9} {'max s':>7} {'median/target':>14}")
    for name, xs in samples.items():
        med = statistics.median(xs)
        print(f"{name:<22} {med:>9.3f} {max(xs):>7.3f} {med / TARGET_S:>14.2f}")
    print(f"target: {TARGET_S} s wall per command")
    return 0


if __name__ == "__main__":
    sys.exit(main())
