from __future__ import annotations

from pathlib import Path

import pytest

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
