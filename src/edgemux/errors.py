"""Errors that carry what was wrong as data, so the CLI can print one clear line."""

from __future__ import annotations


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
