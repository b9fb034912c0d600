"""``--json`` output: JSON on stdout and nothing else.

Two things used to break that promise: a library writing to file descriptor 1 from C (HiGHS prints its banner
when a solver object is built, below Python's ``sys.stdout``), and non-finite floats, which ``json.dumps`` writes
as the bare words ``NaN``/``Infinity`` that strict parsers refuse. ``json_only_stdout`` points descriptor 1 at
stderr while a ``--json`` command runs and gives Python's ``sys.stdout`` the real stdout; ``emit`` writes one
strict JSON document, non-finite numbers as ``null``.
"""

from __future__ import annotations

import io
import json
import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def _finite(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by None (JSON null), containers copied."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def emit(obj: Any, *, default: Any = None, ensure_ascii: bool = True, indent: int | None = 2) -> None:
    """Print ``obj`` as one strict JSON document (indented; NaN and infinities as null) on stdout.
    ``default``: as for ``json.dumps``, for values JSON has no type for; ``indent`` None: one line (a stream
    of documents, JSON Lines)."""
    if default is not None:
        # round-trip first so that what ``default`` returns is also checked for non-finite floats
        obj = json.loads(json.dumps(obj, default=default))
    print(json.dumps(_finite(obj), indent=indent, allow_nan=False, ensure_ascii=ensure_ascii), flush=indent is None)


@contextmanager
def json_only_stdout() -> Iterator[None]:
    """While the block runs, writes to file descriptor 1 that bypass ``sys.stdout`` (C libraries) go to stderr,
    and ``sys.stdout`` writes to the real stdout. Does nothing when stdout is not a real file (a test's capture
    object), where C-level writes cannot reach it anyway."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation, ValueError):
        yield
        return
    sys.stdout.flush()
    saved = os.dup(fd)
    os.dup2(2, fd)
    previous = sys.stdout
    sys.stdout = os.fdopen(os.dup(saved), "w", encoding=previous.encoding or "utf-8", closefd=True)
    try:
        yield
    finally:
        try:
            sys.stdout.flush()
        finally:
            sys.stdout.close()
            sys.stdout = previous
            os.dup2(saved, fd)
            os.close(saved)
