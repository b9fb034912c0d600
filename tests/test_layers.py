"""docs/architecture.md: layers import downwards only, and estimators/policies do no I/O and read no clocks."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "edgemux"
# lowest first; a module may import its own layer and the layers before it
ORDER = ["profiles", "cluster", "perf", "policies", "adapt", "sim", "runtime", "engines", "experiments", "cli"]
TOP_LEVEL_OK = {"errors", "__init__"}  # shared by every layer
# the runtime's subsystems, lowest first (src/edgemux/runtime/__init__.py); its shared modules sit below them all
RUNTIME_ORDER = ["zoo", "dataplane", "ingress", "controlplane", "tools"]
RUNTIME_SHARED = {"httputil", "httpserver", "grpcserver", "process", "messages", "tally", "loopmetrics", "policing", "auth", "tls",
                  "__init__"}
PURE = {"perf", "policies", "adapt"}
IMPURE_MODULES = {"time", "datetime", "socket", "subprocess", "random", "os", "pathlib", "urllib", "requests"}


def _layer(path: Path) -> str:
    rel = path.relative_to(SRC).parts
    return rel[0] if len(rel) > 1 else Path(rel[0]).stem


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
    return out


MODULES = sorted(p for p in SRC.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_imports_point_down(path: Path) -> None:
    layer = _layer(path)
    if layer in TOP_LEVEL_OK or layer == "__main__":
        return
    assert layer in ORDER, f"{path}: layer {layer!r} is not in the map of docs/architecture.md"
    for mod in _imports(path):
        parts = mod.split(".")
        if parts[0] != "edgemux" or len(parts) < 2 or parts[1] in TOP_LEVEL_OK:
            continue
        target = parts[1]
        assert ORDER.index(target) <= ORDER.index(layer), f"{path.relative_to(SRC)} imports {mod} (upwards)"


def _subsystem(path: Path) -> str | None:
    """The runtime subsystem a module belongs to ("shared" for the runtime's own modules), None outside it."""
    rel = path.relative_to(SRC).parts
    if rel[0] != "runtime":
        return None
    return "shared" if len(rel) == 2 else rel[1]


def _runtime_targets(mod: str) -> str | None:
    parts = mod.split(".")
    if parts[:2] != ["edgemux", "runtime"]:
        return None
    if len(parts) == 2 or parts[2] in RUNTIME_SHARED:
        return "shared"
    return parts[2]


RUNTIME_MODULES = [p for p in MODULES if _subsystem(p) is not None]


@pytest.mark.parametrize("path", RUNTIME_MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_runtime_subsystems_point_down(path: Path) -> None:
    """Within the runtime: a subsystem imports the shared modules, itself and the subsystems before it."""
    sub = _subsystem(path)
    if sub == "shared":
        allowed: set[str] = {"shared"}
    else:
        assert sub in RUNTIME_ORDER, f"{path}: runtime subsystem {sub!r} is not in RUNTIME_ORDER"
        allowed = {"shared", *RUNTIME_ORDER[: RUNTIME_ORDER.index(sub) + 1]}
    for mod in _imports(path):
        target = _runtime_targets(mod)
        if target is not None:
            assert target in allowed, f"{path.relative_to(SRC)} imports {mod} (upwards within the runtime)"


def test_runtime_check_can_fail() -> None:
    assert _subsystem(SRC / "runtime" / "dataplane" / "agent.py") == "dataplane"
    assert _runtime_targets("edgemux.runtime.controlplane.service") == "controlplane"
    assert _runtime_targets("edgemux.runtime.httputil") == "shared"
    assert RUNTIME_ORDER.index("controlplane") > RUNTIME_ORDER.index("dataplane")


@pytest.mark.parametrize("path", [p for p in MODULES if _layer(p) in PURE], ids=lambda p: str(p.relative_to(SRC)))
def test_estimators_are_pure(path: Path) -> None:
    for mod in _imports(path):
        assert mod.split(".")[0] not in IMPURE_MODULES, f"{path.relative_to(SRC)} imports {mod}"
    text = path.read_text(encoding="utf-8")
    assert "open(" not in text and "np.random" not in text, f"{path.relative_to(SRC)} does I/O or draws randomness"


def test_layer_test_can_fail(tmp_path: Path) -> None:
    """The scan sees an upward import when one is there."""
    bad = tmp_path / "x.py"
    bad.write_text("from edgemux.sim.run import simulate_device\nimport time\n")
    assert "edgemux.sim.run" in _imports(bad) and "time" in _imports(bad)


def _private_reach_ins(path: Path) -> list[str]:
    """``from edgemux.x import _name`` and ``module._name`` on an edgemux module bound by an import: the
    private names ``path`` takes from another module of the package."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found, modules = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("edgemux"):
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    found.append(f"from {node.module} import {a.name}")
                elif any((SRC.parent / node.module.replace(".", "/") / tail).exists()
                         for tail in (f"{a.name}.py", f"{a.name}/__init__.py")):  # a module or a package
                    modules.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("edgemux.") and a.asname:
                    modules.add(a.asname)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"{node.value.id}.{node.attr}")
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_no_private_names_from_other_modules(path: Path) -> None:
    assert _private_reach_ins(path) == []


def test_private_reach_in_check_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "x.py"
    bad.write_text("from edgemux.policies.ibis import _hidden\nfrom edgemux.runtime import zoo\nzoo._cache\n")
    assert _private_reach_ins(bad) == ["from edgemux.policies.ibis import _hidden", "zoo._cache"]


DOC = SRC.parent.parent / "docs" / "architecture.md"


def layer_imports() -> dict[str, list[str]]:
    """What each layer imports from the other layers, in the code (lowest first)."""
    out: dict[str, set[str]] = {layer: set() for layer in ORDER}
    for path in MODULES:
        layer = _layer(path)
        if layer not in out:
            continue
        for mod in _imports(path):
            parts = mod.split(".")
            if parts[0] == "edgemux" and len(parts) > 1 and parts[1] in out and parts[1] != layer:
                out[layer].add(parts[1])
    return {layer: sorted(targets, key=ORDER.index) for layer, targets in out.items()}


def documented_imports(text: str) -> dict[str, list[str]]:
    """The table "What the layers import today" of docs/architecture.md, as layer -> layers."""
    section = text.split("What the layers import today", 1)[1]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines()[1:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) == 2 and cells[0] in ORDER:
            rows[cells[0]] = [] if cells[1] in ("–", "-") else [c.strip() for c in cells[1].split(",")]
        elif rows and not line.startswith("|"):
            break
    return rows


def test_the_architecture_page_says_what_each_layer_imports() -> None:
    """The page's import table is the code's (it once said ``sim`` imported only profiles and cluster)."""
    assert documented_imports(DOC.read_text(encoding="utf-8")) == layer_imports()


def test_the_import_table_check_can_fail() -> None:
    text = DOC.read_text(encoding="utf-8").replace("| sim | profiles, cluster, policies, adapt |",
                                                   "| sim | profiles, cluster |")
    assert documented_imports(text) != layer_imports()
