"""A small experiment framework: experiments register by name and return an :class:`ExperimentResult`
(rows, a summary table with the paper's figure beside ours, the assumptions, a plot function);
:func:`run_experiment` writes ``<out>/<name>.csv`` and ``<out>/<name>.png`` and returns the result.

Plots use matplotlib's Agg backend (headless). An experiment counts its long loops with :class:`Progress`,
which writes nothing itself: it reports to the ``progress`` callback :func:`run_experiment` was given (the CLI
draws it, ``cli.progress``), so experiments stay free of terminal I/O and there is one progress display.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar


__all__ = ["SummaryRow", "ExperimentResult", "run_experiment", "Progress", "progress",
           "summary_table", "write_csv", "pyplot", "save_figure"]

T = TypeVar("T")


@dataclass(frozen=True)
class SummaryRow:
    """One line of the summary: what is measured, the paper's figure (text, '-' when the paper has none),
    ours, and a note (e.g. how they compare or why they differ)."""

    metric: str
    paper: str
    edgemux: str
    note: str = ""


@dataclass
class ExperimentResult:
    """What an experiment returns. ``rows`` become the CSV (columns: union of keys, first-seen order);
    ``plot(rows, path)`` draws the PNG; ``extra`` holds further tables (name -> rows) for ``--json``."""

    name: str
    title: str
    rows: list[dict[str, Any]]
    summary: list[SummaryRow]
    assumptions: list[str]
    plot: Callable[[list[dict[str, Any]], Path], None] | None = None
    extra: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title,
                "summary": [{"metric": r.metric, "paper": r.paper, "edgemux": r.edgemux, "note": r.note}
                 for r in self.summary],
                "assumptions": list(self.assumptions), "rows": self.rows, "extra": self.extra,
                "files": self.files}


# ------------------------------------------------------------------------------------------ progress


# the progress callback of the run_experiment in progress (done, total, what): where Progress reports
_REPORT: ContextVar[Callable[[int, int, str], None] | None] = ContextVar("edgemux_experiment_progress", default=None)


class Progress:
    """A count of an experiment's loop (``total`` parts, ``label`` naming it), reported as
    ``(done, total, label)`` to the progress callback of the :func:`run_experiment` running it (none: counted
    silently, as in tests calling an experiment directly)."""

    def __init__(self, total: int, label: str = "") -> None:
        self.total = max(int(total), 0)
        self.label = label
        self.done = 0
        self._report = _REPORT.get()
        if self._report is not None:
            self._report(0, self.total, label)

    def step(self, n: int = 1) -> None:
        """``n`` more parts done."""
        self.done += n
        if self._report is not None:
            self._report(self.done, self.total, self.label)

    def close(self) -> None:
        """The loop ended (nothing to undo: the caller's display moves on with the next report)."""


def progress(items: Iterable[T], total: int, label: str = "") -> Iterator[T]:
    """Iterate ``items``, counting them with a :class:`Progress`."""
    bar = Progress(total, label)
    for x in items:
        yield x
        bar.step()


# ------------------------------------------------------------------------------------------- output


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow(r)


def _render(headers: list[str], rows: list[list[str]]) -> str:
    cells = [headers] + rows
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def summary_table(result: ExperimentResult) -> str:
    """The summary as text: a title, the table (metric, paper, edgemux, note) and the assumptions."""
    lines = [result.title, "",
             _render(["metric", "paper", "edgemux", "note"],
                    [[r.metric, r.paper, r.edgemux, r.note] for r in result.summary])]
    if result.assumptions:
        lines += ["", "assumptions:"] + [f"  - {a}" for a in result.assumptions]
    if result.files:
        lines += ["", "wrote: " + ", ".join(result.files.values())]
    return "\n".join(lines)


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the headless Agg backend (imported on first use: only plots need it)."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def save_figure(fig: Any, path: Path) -> None:
    """Lay out, write (PNG, 110 dpi) and close ``fig``."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)


def run_experiment(name: str, out_dir: str | Path = "out", seed: int = 0, quick: bool = False,
                   progress: Callable[[int, int, str], None] | None = None) -> ExperimentResult:
    """Run experiment ``name``; write ``<out>/<name>.csv`` and ``<out>/<name>.png``; return its result
    (``UnknownNameError``, an ``InputError``, for a name that is not registered). ``progress(done, total,
    step)`` is called before each of its steps (``run``, ``csv``, ``png``; an experiment without a plot skips
    ``png``) with the steps done so far, and with ``done`` at the end; during the run, the experiment's own
    loops (:class:`Progress`) report through it with their own totals and labels."""
    from edgemux.experiments.registry import get  # the registry imports the experiments, which import this

    experiment = get(name)

    def report(done: int, step: str) -> None:
        if progress is not None:
            progress(done, 3, step)

    report(0, "run")
    token = _REPORT.set(progress)  # the experiment's own loops report here
    try:
        result = experiment(seed=seed, quick=quick)
    finally:
        _REPORT.reset(token)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report(1, "csv")
    csv_path = out / f"{name}.csv"
    write_csv(result.rows, csv_path)
    result.files["csv"] = str(csv_path)
    if result.plot is not None:
        report(2, "png")
        png = out / f"{name}.png"
        result.plot(result.rows, png)
        result.files["png"] = str(png)
    report(3, "done")
    return result
