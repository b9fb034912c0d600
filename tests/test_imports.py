"""Every module of the packages with registries (policies, experiments) imports on its own, in a fresh
interpreter: no import circle hides behind the order in which the suite happens to import them (the
registries live apart from the frameworks that use them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"


def test_every_policy_and_experiment_module_imports_alone() -> None:
    modules = sorted(".".join(p.relative_to(SRC).with_suffix("").parts)
                     for pkg in ("policies", "experiments") for p in (SRC / "edgemux" / pkg).rglob("*.py"))
    modules = [m.removesuffix(".__init__") for m in modules]
    code = ("import importlib, subprocess, sys\n"
            "bad = []\n"
            "for m in sys.argv[1:]:\n"
            "    r = subprocess.run([sys.executable, '-c', f'import {m}'], capture_output=True, text=True)\n"
            "    if r.returncode:\n"
            "        bad.append(m + ': ' + (r.stderr.strip().splitlines() or ['?'])[-1])\n"
            "print('\\n'.join(bad))\n")
    done = subprocess.run([sys.executable, "-c", code, *modules], capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", done.stdout
