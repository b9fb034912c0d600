"""Progress of the long commands (cli/progress.py): a counter on stderr when stderr is a terminal, nothing with
``--json`` or in a pipe; the engines report through an optional ``progress(done, total)`` callback. The terminal
is a StringIO that says it is one; the runs are the smallest each command takes. No wall-clock thresholds: the
times shown come from an injected clock."""

from __future__ import annotations

import io
import json
import sys
import time
from pathlib import Path

import pytest

from edgemux.cli.main import main
from edgemux.cli.progress import Progress
from edgemux.experiments import registry
from edgemux.experiments.runner import ExperimentResult, SummaryRow, run_experiment
from edgemux.experiments.validation import run_grid

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


class Clock:
    """A clock the test moves by hand (s)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _shown(stream: io.StringIO) -> list[str]:
    """Every state the line was drawn in, in order (blank redraws left out)."""
    return [s.rstrip() for s in stream.getvalue().split("\r") if s.strip()]


def _run_on_terminal(argv: list[str], monkeypatch: pytest.MonkeyPatch,
                     capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run the CLI with stderr a terminal: (exit code, stdout, what was drawn on stderr)."""
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    code = main(argv)
    monkeypatch.undo()
    out, err = capsys.readouterr()
    assert err == ""  # nothing went past the terminal stand-in
    return code, out, term.getvalue()


# ------------------------------------------------------------------------------------------- Progress


def test_the_counter_shows_parts_elapsed_time_and_time_left_then_clears() -> None:
    term, clock = Terminal(), Clock()
    with Progress(4, "validate", stream=term, clock=clock, tick_s=3600) as bar:
        clock.now += 10
        bar(1)
        clock.now += 20
        bar(2, detail="node-1/tpu0")
        clock.now += 15
        bar(4)
        drawn = term.getvalue()
    assert _shown(term) == ["[0/4] validate  0:00", "[1/4] validate  0:10, about 0:30 left",
                            "[2/4] validate: node-1/tpu0  0:30, about 0:30 left", "[4/4] validate: node-1/tpu0  0:45"]
    # cleared: the last write blanks the longest line drawn and returns to the line's start
    assert term.getvalue().endswith("\r") and term.getvalue()[len(drawn):].strip() == ""


def test_a_total_told_late_extrapolates_from_the_parts_since() -> None:
    term, clock = Terminal(), Clock()
    with Progress(0, "validate", stream=term, clock=clock, tick_s=3600) as bar:
        clock.now += 100  # e.g. the predictions, before the engine knows how many runs follow
        bar(0, 10, "single runs")
        clock.now += 2
        bar(1)
    assert _shown(term) == ["validate  0:00", "[ 0/10] validate: single runs  1:40",
                            "[ 1/10] validate: single runs  1:42, about 0:18 left"]


def test_without_eta_no_time_left_is_shown() -> None:
    term, clock = Terminal(), Clock()
    with Progress(3, "experiment x", stream=term, clock=clock, tick_s=3600, eta=False) as bar:
        clock.now += 60
        bar(1, detail="csv")
    assert _shown(term)[-1] == "[1/3] experiment x: csv  1:00"


def test_parts_faster_than_a_redraw_are_drawn_at_most_ten_times_a_second() -> None:
    term, clock = Terminal(), Clock()
    with Progress(1000, "validate", stream=term, clock=clock, tick_s=3600) as bar:
        for i in range(1, 1001):
            clock.now += 0.001  # a thousand parts in a second
            bar(i)
    shown = _shown(term)
    assert 10 <= len(shown) <= 12 and shown[-1].startswith("[1000/1000]")


def test_the_ticker_redraws_while_no_part_completes() -> None:
    term = Terminal()
    with Progress(2, "experiment x", stream=term, tick_s=0.01) as bar:
        deadline = time.monotonic() + 60  # a bound for a broken ticker, not a timing check
        while len(_shown(term)) < 3 and time.monotonic() < deadline:  # the ticker's redraws, without a call
            time.sleep(0.01)
        assert bar.done == 0 and len(_shown(term)) >= 3
    assert all(s.startswith("[0/2] experiment x") for s in _shown(term))


def test_notes_go_above_the_counter_and_are_printed_off_a_terminal_too() -> None:
    term, clock = Terminal(), Clock()
    with Progress(2, "profile", stream=term, clock=clock, tick_s=3600) as bar:
        bar.note("  m batch 1: mean 1.000 ms")
        clock.now += 1
        bar(1)
    line = "[0/2] profile  0:00"
    # drawn, blanked, the note on a line of its own, drawn again below it, counted on, cleared
    assert term.getvalue() == ("\r" + line + "\r" + " " * len(line) + "\r" + "  m batch 1: mean 1.000 ms\n"
                               + "\r" + line + "\r[1/2] profile  0:01, about 0:01 left"
                               + "\r" + " " * 36 + "\r")

    pipe = io.StringIO()  # not a terminal: the note alone
    with Progress(2, "profile", stream=pipe) as bar:
        bar(1)
        bar.note("  m batch 1: mean 1.000 ms")
        bar(2)
    assert pipe.getvalue() == "  m batch 1: mean 1.000 ms\n"


@pytest.mark.parametrize("stream, enabled", [(io.StringIO(), True), (Terminal(), False)],
                         ids=["not-a-terminal", "disabled-json"])
def test_nothing_is_written_off_a_terminal_or_when_disabled(stream: io.StringIO, enabled: bool) -> None:
    with Progress(3, "simulate", stream=stream, enabled=enabled, tick_s=0.001) as bar:
        for i in range(4):
            bar(i, detail="d")
    assert stream.getvalue() == ""


# -------------------------------------------------------------------------------------------- engines


def test_run_grid_reports_every_case_in_and_out_of_processes() -> None:
    select = lambda c: c.family == "batch"  # noqa: E731 (3 cases at size 0.01)
    calls: dict[int, list[tuple[int, int]]] = {1: [], 2: []}
    rows = {w: run_grid(size=0.01, workers=w, select=select, progress=lambda d, t, w=w: calls[w].append((d, t)))
            for w in (1, 2)}
    assert calls[1] == calls[2] == [(0, 3), (1, 3), (2, 3), (3, 3)]
    assert rows[1] == rows[2]  # grid order whatever order the processes finish in


def test_run_experiment_reports_its_steps(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(registry._REGISTRY, "progress-test", _tiny_experiment)
    calls: list[tuple[int, int, str]] = []
    run_experiment("progress-test", tmp_path, progress=lambda d, t, s: calls.append((d, t, s)))
    assert calls == [(0, 3, "run"), (1, 3, "csv"), (3, 3, "done")]  # no plot: no png step


def _tiny_experiment(seed: int = 0, quick: bool = False) -> ExperimentResult:
    return ExperimentResult("progress-test", "a test's experiment", [{"x": seed}], [SummaryRow("x", "-", "0")], [])


# ------------------------------------------------------------------------------------------- commands


SIMULATE = ["simulate", str(EXAMPLES / "one-camera.yaml"), "--requests", "100", "--replications", "2"]
VALIDATE = ["validate", "--size", "0.01", "--family", "batch", "--workers", "1"]


@pytest.mark.parametrize("argv, first, last", [
    (SIMULATE, "[0/2] simulate", "[2/2] simulate"),
    (VALIDATE, "validate", "[3/3] validate"),
], ids=["simulate", "validate"])
def test_a_long_command_shows_progress_on_a_terminal(argv: list[str], first: str, last: str,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, out, drawn = _run_on_terminal(argv, monkeypatch, capsys)
    assert code in (0, 1) and out  # 1: a check of the tiny grid may miss; the table is printed either way
    shown = _shown(Terminal(drawn))
    assert shown[0].startswith(first) and shown[-1].startswith(last)
    assert drawn.endswith("\r") and drawn.rsplit("\r", 2)[-2].strip() == ""  # cleared before the table


@pytest.mark.parametrize("argv", [SIMULATE, VALIDATE], ids=["simulate", "validate"])
def test_json_or_a_pipe_gets_no_progress(argv: list[str], monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    code, out, drawn = _run_on_terminal(argv + ["--json"], monkeypatch, capsys)
    assert code in (0, 1) and json.loads(out) and drawn == ""
    assert main(argv) in (0, 1)  # capsys's stderr is no terminal
    assert capsys.readouterr().err == ""


def test_experiment_shows_its_steps_on_a_terminal(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(registry._REGISTRY, "progress-test", _tiny_experiment)
    argv = ["experiment", "progress-test", "--out", str(tmp_path)]
    code, out, drawn = _run_on_terminal(argv, monkeypatch, capsys)
    assert code == 0 and "a test's experiment" in out
    shown = _shown(Terminal(drawn))
    assert shown[0].startswith("[0/3] experiment progress-test") and any(": csv" in s for s in shown)
    assert "left" not in drawn  # steps of unequal length: no time left extrapolated

    monkeypatch.setitem(registry._REGISTRY, "progress-test", _tiny_experiment)
    code, out, drawn = _run_on_terminal(argv + ["--json"], monkeypatch, capsys)
    assert code == 0 and json.loads(out)["name"] == "progress-test" and drawn == ""


def test_profile_counts_measurements_and_keeps_its_lines(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv("EDGEMUX_CACHE", str(tmp_path / "cache"))
    argv = ["profile", "--backend", "onnxruntime", "--models", "squeezenet1_1@64", "--batch", "1,2",
            "--warmup", "0", "--repeats", "1", "--out", str(tmp_path / "set"), "--catalog", "cpu-progress"]
    code, out, drawn = _run_on_terminal(argv, monkeypatch, capsys)
    assert code == 0 and "squeezenet1_1" in out
    shown = _shown(Terminal(drawn))
    assert shown[0] == "[0/2] profile  0:00" and any(s.startswith("[2/2] profile") for s in shown)
    assert drawn.count("batch 1: mean") == drawn.count("batch 2: mean") == 1  # the lines, once each

    assert main(argv + ["--force"]) == 0  # not a terminal: the lines alone, as before
    err = capsys.readouterr().err
    assert "[" not in err and err.count("\n") == 2 and "batch 2: mean" in err
