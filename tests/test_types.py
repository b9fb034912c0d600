"""The type checker passes over the packages listed in pyproject.toml's ``[tool.mypy] files`` (the one list of
checked packages: extend it there, not here)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                    reason="mypy is not installed (pip install -e '.[test]' brings it)")
def test_mypy_passes_on_the_checked_packages() -> None:
    # Run from the repository root so the relative paths in [tool.mypy] files resolve; the config is named
    # explicitly so a mypy.ini or setup.cfg elsewhere cannot take its place.
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml")],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, f"mypy exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
