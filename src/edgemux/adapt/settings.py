"""The adaptation loop's settings, each with its unit and its range; a value out of range is a ValueError
naming the setting, what it expected and what came (the CLI turns it into one line and exit code 2)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

__all__ = ["AdaptSettings"]

# name -> (low, high, integer?): the accepted closed range of each setting
_RANGES: dict[str, tuple[float, float, bool]] = {
    "window_s": (0.1, 3600.0, False),
    "trigger_windows": (1, 100, True),
    "min_dwell_s": (0.0, 86400.0, False),
    "rate_tolerance": (0.0, 10.0, False),
    "headroom": (0.0, 10.0, False),
    "loss_tolerance": (0.0, 1.0, False),
    "min_samples": (1, 1_000_000, True),
    "max_moves_per_step": (1, 1000, True),
    "dead_after_s": (0.1, 86400.0, False),
}


@dataclass(frozen=True)
class AdaptSettings:
    """``window_s``: length of a monitoring window (s). ``trigger_windows``: consecutive windows a finding
    must be seen in before it is acted on. ``min_dwell_s``: least time between two moves of one app (s), so
    that a noisy load cannot make it oscillate. ``rate_tolerance``: an app is over its contract when its
    observed rate exceeds ``rate_rps * (1 + rate_tolerance)``. ``headroom``: a migrated app is re-admitted at
    ``observed rate * (1 + headroom)``, its new contract. ``loss_tolerance``: fraction of an app's requests
    that may be refused or fail in a window before it counts as dropping. ``min_samples``: answered requests
    a window needs before its latency statistics are judged. ``max_moves_per_step``: moves one step may plan.
    ``dead_after_s``: an agent not heard from for this long is dead (s)."""

    window_s: float = 5.0
    trigger_windows: int = 2
    min_dwell_s: float = 60.0
    rate_tolerance: float = 0.1
    headroom: float = 0.1
    loss_tolerance: float = 0.01
    min_samples: int = 20
    max_moves_per_step: int = 1
    dead_after_s: float = 15.0

    def __post_init__(self) -> None:
        for f in fields(self):
            low, high, integer = _RANGES[f.name]
            v = getattr(self, f.name)
            kind = "an integer" if integer else "a number"
            ok = not isinstance(v, bool) and (isinstance(v, int) if integer else isinstance(v, (int, float)))
            if not ok or not math.isfinite(v) or not low <= v <= high:
                raise ValueError(f"adapt setting {f.name}: expected {kind} in [{low:g}, {high:g}], got {v!r}")

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def with_options(self, options: Mapping[str, str]) -> AdaptSettings:
        """These settings with ``options`` (name -> text, e.g. from ``--adapt-option NAME=VALUE``) applied."""
        changes: dict[str, float | int] = {}
        for name, text in options.items():
            if name not in _RANGES:
                raise ValueError(f"unknown adapt setting {name!r}: expected one of {', '.join(self.names())}")
            integer = _RANGES[name][2]
            try:
                changes[name] = int(text) if integer else float(text)
            except ValueError:
                kind = "an integer" if integer else "a number"
                raise ValueError(f"adapt setting {name}: expected {kind}, got {text!r}") from None
        return replace(self, **changes)  # type: ignore[arg-type]
