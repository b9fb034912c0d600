"""A one-line progress counter for the long commands (``simulate``, ``validate``, ``experiment``, ``profile``).

    [ 12/40] validate  0:41, about 1:10 left

drawn on stderr in place (carriage return) as parts complete, and redrawn every second while none does (the
elapsed time keeps moving through a long part), then cleared. It is drawn only where someone watches: when
stderr is a terminal and the command was not asked for ``--json``; in a pipe, a log file or a test's capture
nothing is written, so stdout and stderr stay what they were without it.

The engines stay free of I/O: they take an optional ``progress(done, total)`` callback and call it as their
parts complete (``experiments.validation.run_grid``, ``sim.run.simulate_device``, ...); a :class:`Progress` is
such a callback.
"""

from __future__ import annotations

import math
import shutil
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

TICK_S = 1.0  # redraw period while no part completes, s: the elapsed time is shown to the second
MIN_REDRAW_S = 0.1  # parts completing faster are drawn at most this often, s (thousands of runs a second)


def _clock_text(seconds: float) -> str:
    """``M:SS`` (``H:MM:SS`` from an hour) of a duration in s."""
    s = max(int(seconds), 0)
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


class Progress:
    """``[done/total] what  elapsed, about ETA left`` on ``stream`` (default: ``sys.stderr`` when made), kept on
    one line; a context manager: the line is cleared on exit. Call it as ``progress(done)`` or, as an engine
    does, ``progress(done, total)`` (a new total is taken); ``detail`` names the part in hand (a device, a
    model). Inactive (it writes nothing at all) unless ``enabled`` and the stream is a terminal. ``eta``: show
    the time left, extrapolated from the parts done (only for parts of about equal size).
    ``note(text)`` prints a lasting line above the counter, whether or not the counter is drawn. Times: s."""

    def __init__(self, total: int, what: str, *, stream: TextIO | None = None, enabled: bool = True,
                 eta: bool = True, tick_s: float = TICK_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.total = max(int(total), 0)
        self.what = what
        self.detail = ""
        self.done = 0
        self.eta = eta
        self.stream: TextIO = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.active = bool(enabled and callable(isatty) and isatty())
        self._tick_s = tick_s
        self._clock = clock
        self._start = clock()
        # the time left is extrapolated from the parts done since the total was last set (an engine that tells
        # its total late has spent the time before on something else)
        self._since, self._done_since = self._start, 0
        self._drawn = 0  # characters of the line now on screen, to blank it out
        self._drawn_at = -math.inf  # when it was drawn (clock s)
        self._lock = threading.Lock()  # the ticker thread and the caller both draw
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    # -- the callback ------------------------------------------------------------------------------------

    def __call__(self, done: int, total: int | None = None, detail: str | None = None) -> None:
        """``done`` parts of ``total`` (unchanged when None) are complete; ``detail``: what is in hand."""
        self.done = max(int(done), 0)
        if total is not None and max(int(total), 0) != self.total:
            self.total = max(int(total), 0)
            self._since, self._done_since = self._clock(), self.done
        news = detail is not None and detail != self.detail
        if detail is not None:
            self.detail = detail
        if news or self.done >= self.total or self._clock() - self._drawn_at >= MIN_REDRAW_S:
            self._draw()

    def note(self, text: str) -> None:
        """Print ``text`` as a line of its own on the stream (the counter, if drawn, is redrawn below it)."""
        with self._lock:
            self._blank()
            self.stream.write(text + "\n")
            self.stream.flush()
        self._draw()

    # -- context -----------------------------------------------------------------------------------------

    def __enter__(self) -> Progress:
        self._start = self._since = self._clock()
        if self.active:
            self._draw()
            self._ticker = threading.Thread(target=self._tick, name="edgemux-progress", daemon=True)
            self._ticker.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Stop redrawing and clear the line (the next output starts on a clean line)."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        with self._lock:
            self._blank()
            if self.active:
                self.stream.flush()

    # -- drawing -----------------------------------------------------------------------------------------

    def line(self) -> str:
        """The counter's text as it is drawn now."""
        width = len(str(self.total))
        elapsed = self._clock() - self._start
        # no total yet (a part whose size the engine has not told): the elapsed time alone
        text = f"[{self.done:>{width}}/{self.total}] {self.what}" if self.total else self.what
        if self.detail:
            text += f": {self.detail}"
        text += f"  {_clock_text(elapsed)}"
        counted = self.done - self._done_since
        if self.eta and counted > 0 and self.done < self.total:
            per_part = (self._clock() - self._since) / counted
            text += f", about {_clock_text(per_part * (self.total - self.done))} left"
        return text

    def _draw(self) -> None:
        if not self.active or self._stop.is_set():
            return
        with self._lock:
            # one line short of the terminal's width: a line that wraps cannot be redrawn with a carriage return
            text = self.line()[: max(shutil.get_terminal_size().columns - 1, 20)]
            self.stream.write("\r" + text + " " * max(self._drawn - len(text), 0))
            self.stream.flush()
            self._drawn = len(text)
            self._drawn_at = self._clock()

    def _blank(self) -> None:
        """Blank the drawn line and return to its start (caller holds the lock)."""
        if self.active and self._drawn:
            self.stream.write("\r" + " " * self._drawn + "\r")
            self._drawn = 0

    def _tick(self) -> None:
        while not self._stop.wait(self._tick_s):
            self._draw()


def progress_for(args: object, total: int, what: str, *, eta: bool = True) -> Progress:
    """The :class:`Progress` of a command run with ``args``: drawn on stderr when it is a terminal, never with
    ``--json`` (whose stderr may be read by a program too)."""
    return Progress(total, what, enabled=not getattr(args, "json", False), eta=eta)
