"""Plain-text tables for the terminal."""

from __future__ import annotations

from collections.abc import Sequence


def render(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces; numbers are expected pre-formatted."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def fmt_ms(x: object, digits: int = 1) -> str:
    """A latency for a table: number with ``digits`` decimals, 'unstable', or '-' when absent."""
    if x is None:
        return "-"
    if isinstance(x, float | int):
        return f"{x:.{digits}f}"
    return "unstable"
