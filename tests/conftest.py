from __future__ import annotations

import json
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

# `edgemux up` keeps each cluster's store and token under $EDGEMUX_HOME (default ~/.edgemux): never the user's,
# and a folder of each test's own (see `own_home`), so that no test resumes the apps another left
_HOMES = Path(tempfile.mkdtemp(prefix="edgemux-test-home-"))
_home_count = 0


@pytest.fixture(autouse=True)
def own_home(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test (and every process it starts) gets an $EDGEMUX_HOME of its own, created only if used."""
    global _home_count
    _home_count += 1
    monkeypatch.setenv("EDGEMUX_HOME", str(_HOMES / str(_home_count)))


REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
# The shared validation data sits beside the checkout (../shared); tests that need it skip without it.
VALIDATION = REPO.parent / "shared" / "validation" / "ibis-edgetpu"

# Seconds each scope's tests took in a `make test` run (a scope: what --dist loadscope hands to one worker, a
# module or a class), written by `pytest ... --store-scope-seconds` (docs/development.md, "Tests"). Only the
# order in which scopes start comes from it, never a verdict: a stale file costs minutes, not correctness.
SCOPE_SECONDS = Path(__file__).with_name("scope_seconds.json")


@pytest.fixture
def write_yaml(tmp_path: Path):
    """Write a scenario text to a temporary file and return its path."""

    def _write(text: str, name: str = "scenario.yaml") -> Path:
        p = tmp_path / name
        p.write_text(text, encoding="utf-8")
        return p

    return _write


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--store-scope-seconds", action="store_true",
                     help=f"write each scope's test time (s) of this run into {SCOPE_SECONDS.name}, for the order "
                          "in which make test starts the scopes")


def scope_of(nodeid: str) -> str:
    """The scope pytest-xdist's --dist loadscope gives a test: its id up to the last '::' (module or class)."""
    return nodeid.rsplit("::", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest scopes first, by tests/scope_seconds.json (make test hands scopes to the workers in this
    order, --no-loadscope-reorder; one started last and long would leave the other cores idle at the end).
    A scope the file does not know goes first if it has a test marked ``slow``, last otherwise. Tests keep
    their order within a scope."""
    try:
        seconds: dict[str, float] = json.loads(SCOPE_SECONDS.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        seconds = {}
    slow = {scope_of(item.nodeid) for item in items if item.get_closest_marker("slow") is not None}

    def key(item: pytest.Item) -> float:
        scope = scope_of(item.nodeid)
        if scope in seconds:
            return -seconds[scope]
        return -float("inf") if scope in slow else 0.0

    items.sort(key=key)


class _ScopeClock:
    """Sums each scope's test time (setup, call and teardown, s) from the reports of this run and writes it to
    tests/scope_seconds.json at the end (in the controlling process only: xdist's workers report to it)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        scope = scope_of(report.nodeid)
        self.seconds[scope] = self.seconds.get(scope, 0.0) + report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        try:
            known = json.loads(SCOPE_SECONDS.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            known = {}
        known.update({s: round(v, 1) for s, v in self.seconds.items()})
        # scopes of modules that are gone leave the file
        known = {s: v for s, v in known.items() if (REPO / s.split("::")[0]).exists()}
        SCOPE_SECONDS.write_text(json.dumps(dict(sorted(known.items())), indent=1) + "\n", encoding="utf-8")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--store-scope-seconds") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_ScopeClock(), "edgemux-scope-clock")
