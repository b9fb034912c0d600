"""Every module of the packages with registries (policies, experiments) imports on its own, in a fresh
interpreter: no import circle hides behind the order in which the suite happens to import them (the
registries live apart from the frameworks that use them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"

# The third-party libraries those modules import, loaded once in a parent that has not imported edgemux; each
# module is then imported in a child forked from it. An import circle lives inside edgemux, so a child still
# meets every edgemux module in the order its own imports ask for, while the second or so that numpy and scipy
# take to import is paid once instead of once per module (32 modules).
PRELOAD = ("numpy", "scipy.stats", "scipy.optimize", "scipy.special", "scipy.sparse", "scipy.integrate",
           "scipy.interpolate", "yaml", "highspy")

CHECK = """\
import importlib, os, sys
for lib in sys.argv[1].split(','):
    try:
        importlib.import_module(lib)
    except ImportError:  # an optional library: the module that needs it imports it (and fails) in its child
        pass
assert not [m for m in sys.modules if m.split('.')[0] == 'edgemux'], 'the parent must not import edgemux'
sys.stdout.flush()
bad = []
for m in sys.argv[2:]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            importlib.import_module(m)
            code = 0
        except BaseException as e:
            os.write(w, f'{type(e).__name__}: {e}'.encode(errors='replace'))
            code = 1
        os._exit(code)
    os.close(w)
    with os.fdopen(r, 'rb') as f:
        why = f.read().decode(errors='replace')
    _, status = os.waitpid(pid, 0)
    if status:
        bad.append(m + ': ' + (why.strip().splitlines() or [f'exit status {status}'])[-1])
print('\\n'.join(bad))
"""


def test_every_policy_and_experiment_module_imports_alone() -> None:
    modules = sorted(".".join(p.relative_to(SRC).with_suffix("").parts)
                     for pkg in ("policies", "experiments") for p in (SRC / "edgemux" / pkg).rglob("*.py"))
    modules = [m.removesuffix(".__init__") for m in modules]
    # one BLAS thread: the children are forked from a parent that imported numpy
    done = subprocess.run([sys.executable, "-c", CHECK, ",".join(PRELOAD), *modules], capture_output=True,
                          text=True, timeout=600,
                          env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin", "OPENBLAS_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", done.stdout


def test_an_import_circle_is_named(tmp_path: Path) -> None:
    """The check can fail: two modules that import names from each other each fail when imported alone,
    and each is reported with its error."""
    pkg = tmp_path / "circle"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from circle.b import B\nA = 1\n")
    (pkg / "b.py").write_text("from circle.a import A\nB = 2\n")
    done = subprocess.run([sys.executable, "-c", CHECK, "numpy", "circle.a", "circle.b"], capture_output=True,
                          text=True, timeout=600,
                          env={"PYTHONPATH": f"{SRC}:{tmp_path}", "PATH": "/usr/bin:/bin", "OPENBLAS_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("circle.a: ImportError: cannot import name 'A'"), lines
    assert lines[1].startswith("circle.b: ImportError: cannot import name 'B'"), lines
