from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run and every machine: a suite that passes here passes on a
# fresh clone in CI, and a counterexample found once is found again (no example database carried around).
settings.register_profile("edgemux", derandomize=True, database=None)
settings.load_profile("edgemux")

# `edgemux up` writes the CLI's context (runtime.controlplane.context): never the user's own, and every test
# process and subprocess (inheriting the environment) sees the same, empty unless a test writes it
os.environ["EDGEMUX_CONTEXT"] = str(Path(tempfile.mkdtemp(prefix="edgemux-test-context-")) / "context.json")

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
# The shared validation data sits beside the checkout (../shared); tests that need it skip without it.
VALIDATION = REPO.parent / "shared" / "validation" / "ibis-edgetpu"


@pytest.fixture
def write_yaml(tmp_path: Path):
    """Write a scenario text to a temporary file and return its path."""

    def _write(text: str, name: str = "scenario.yaml") -> Path:
        p = tmp_path / name
        p.write_text(text, encoding="utf-8")
        return p

    return _write


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` run first (their order among themselves kept): make test spreads modules and
    classes over the cores as they come, and the long ones started last would leave one core idle at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
