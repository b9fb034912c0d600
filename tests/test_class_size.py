"""No class in src/ over about 400 lines (issue 33: a class that large does the work of several; split it by
concern, as the control plane's managers are). Counted by an AST walk, from the ``class`` line to the class's
last line, docstring and comments included."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "edgemux"
LIMIT = 420  # about 400, with a margin of 5 % so that a docstring's extra paragraph does not fail the suite


def class_sizes(root: Path = SRC) -> dict[str, int]:
    """Every class under ``root`` (nested ones too), as ``path:Name`` relative to ``root``, with its length in
    lines."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                out[f"{path.relative_to(root).as_posix()}:{node.name}"] = node.end_lineno - node.lineno + 1
    return out


def test_no_class_over_about_400_lines() -> None:
    over = {name: n for name, n in class_sizes().items() if n > LIMIT}
    assert over == {}, f"classes over {LIMIT} lines (split them by concern): {over}"


def test_the_size_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "big.py").write_text("class Big:\n" + "    x = 1\n" * (LIMIT + 1) + "\n\nclass Small:\n    pass\n")
    sizes = class_sizes(tmp_path)
    assert sizes == {"big.py:Big": LIMIT + 2, "big.py:Small": 2}
    assert sizes["big.py:Big"] > LIMIT
