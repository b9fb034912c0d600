"""The adaptation loop's settings, each with its unit and its range; a value out of range is a ValueError
naming the setting, what it expected and what came (the CLI turns it into one line and exit code 2)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

__all__ = ["AdaptSettings"]


def _setting(default: float, low: float, high: float) -> Any:
    """A setting's field: its default and the closed range it accepts (an int default makes it an integer)."""
    return field(default=default, metadata={"range": (low, high)})


@dataclass(frozen=True)
class AdaptSettings:
    """``window_s``: length of a monitoring window (s). ``trigger_windows``: consecutive windows a finding
    must be seen in before it is acted on. ``min_dwell_s``: least time between two moves of one app (s), so
    that a noisy load cannot make it oscillate. ``rate_tolerance``: an app is over its contract when its
    observed rate exceeds ``rate_rps * (1 + rate_tolerance)``. ``headroom``: a migrated app is re-admitted at
    ``observed rate * (1 + headroom)``, its new contract. ``loss_tolerance``: fraction of an app's requests
    that may be refused or fail in a window before it counts as dropping. ``min_samples``: answered requests
    a window needs before its latency statistics are judged. ``max_moves_per_step``: moves one step may plan.
    ``dead_after_s``: an agent not heard from for this long is dead (s). ``calibration_samples``: observed
    executions of a profile before they replace the catalog's figures (``adapt.calibrate``).
    ``idle_utilization``: a device that carries apps but whose utilization at the observed rates is below
    this is reported as idle capacity (0: never). ``repartition_min_shift``: a re-partition of a split app
    (new weights over its devices) is planned only when it moves at least this fraction of the app's rate
    (``adapt.plan.shift``), so that noise does not keep re-weighting it. ``fit_windows``: 1 to also calibrate
    from the apps' end-to-end windows alone (``adapt.fit``) the profiles no device measured often enough, 0
    not to."""

    window_s: float = _setting(5.0, 0.1, 3600.0)
    trigger_windows: int = _setting(2, 1, 100)
    min_dwell_s: float = _setting(60.0, 0.0, 86400.0)
    rate_tolerance: float = _setting(0.1, 0.0, 10.0)
    headroom: float = _setting(0.1, 0.0, 10.0)
    loss_tolerance: float = _setting(0.01, 0.0, 1.0)
    min_samples: int = _setting(20, 1, 1_000_000)
    max_moves_per_step: int = _setting(1, 1, 1000)
    dead_after_s: float = _setting(15.0, 0.1, 86400.0)
    calibration_samples: int = _setting(200, 2, 1_000_000_000)
    idle_utilization: float = _setting(0.05, 0.0, 1.0)
    repartition_min_shift: float = _setting(0.05, 0.0, 1.0)
    fit_windows: int = _setting(0, 0, 1)

    def __post_init__(self) -> None:
        for f in fields(self):
            low, high = f.metadata["range"]
            integer = isinstance(f.default, int)
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
        integers = {f.name: isinstance(f.default, int) for f in fields(self)}
        changes: dict[str, float | int] = {}
        for name, text in options.items():
            if name not in integers:
                raise ValueError(f"unknown adapt setting {name!r}: expected one of {', '.join(self.names())}")
            integer = integers[name]
            try:
                changes[name] = int(text) if integer else float(text)
            except ValueError:
                kind = "an integer" if integer else "a number"
                raise ValueError(f"adapt setting {name}: expected {kind}, got {text!r}") from None
        return replace(self, **changes)  # type: ignore[arg-type]
