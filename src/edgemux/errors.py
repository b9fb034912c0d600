"""Errors that carry what was wrong as data, so the CLI can print one clear line."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any


class EdgemuxError(Exception):
    """Base class for errors a user can act on (bad input, unknown name)."""


class InputError(EdgemuxError):
    """Bad input: names the offending field, what was expected and what came.

    ``field`` is a dotted path into the input (``apps[2].rate``); ``problem`` says what is wrong.
    """

    def __init__(self, field: str, problem: str, source: str | None = None) -> None:
        self.field = field
        self.problem = problem
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{field}: {problem}")


class UnknownNameError(InputError):
    """A name (model, profile, discipline, device kind) that is not in its catalog."""

    def __init__(self, field: str, name: str, kind: str, known: list[str], source: str | None = None) -> None:
        shown = ", ".join(sorted(known)[:12]) + (", ..." if len(known) > 12 else "")
        super().__init__(field, f"unknown {kind} {name!r} (known: {shown})", source)
        self.name = name


def closest_name(name: str, known: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The known name ``name`` most likely misspells, or None: a match ignoring case first (``latencyMS`` for
    ``latencyMs``, which difflib alone ranks no higher than any other near miss), then difflib's closest at
    ``cutoff`` or better, compared in lower case so a wrong capital costs nothing."""
    names = list(known)
    lowered = {n.lower(): n for n in reversed(names)}  # reversed: the first declared wins a tie
    if name.lower() in lowered:
        return lowered[name.lower()]
    close = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=cutoff)
    return lowered[close[0]] if close else None


class UnknownFieldError(InputError):
    """A key that a spec mapping does not have (``brust`` for ``burst``), named by its dotted path
    (``spec.brust``), with the closest known field as a suggestion or, with none close, the known fields.

    Without this a misspelt optional field would be dropped in silence and its default used."""

    def __init__(self, field: str, key: str, known: Iterable[str], source: str | None = None) -> None:
        names = list(known)
        self.key = key
        self.known = tuple(names)
        self.suggestion = closest_name(key, names)
        if self.suggestion is not None:
            problem = f"unknown field, did you mean {self.suggestion!r}?"
        else:
            problem = f"unknown field (known: {', '.join(names)})"
        super().__init__(field, problem, source)

    @classmethod
    def check(cls, data: Mapping[Any, Any], known: Iterable[str], path: str, source: str | None = None) -> None:
        """Raise for the first key of ``data`` (in document order) that is not in ``known``; ``path`` is the
        dotted path of the mapping itself ("" at the top of a document)."""
        allowed = tuple(known)
        for key in data:
            if key not in allowed:
                name = str(key)
                raise cls(f"{path}.{name}" if path else name, name, allowed, source)
