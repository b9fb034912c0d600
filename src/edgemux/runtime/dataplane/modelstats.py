"""Per-app inference statistics in the shape of Triton's statistics extension (``GET /v2/models/stats``,
``GET /v2/models/{app}/stats``), which ``tritonclient``'s ``get_inference_statistics`` reads.

Each app served here counts its requests answered (``success``) and failed (``fail``) with their total
durations, and splits a success into ``queue`` (waiting for the device), ``compute_input`` (decoding the
request and converting it to the variant's tensors), ``compute_infer`` (the device's execution, switch
included) and ``compute_output`` (converting and encoding the answer). Durations are kept in nanoseconds, as
the extension reports them; ``last_inference`` is the last answer's time in ms since the Unix epoch. Counters
only grow; an app removed here forgets its own.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ModelStats", "StatsTable"]

_PARTS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")


@dataclass
class ModelStats:
    """One app's counters: per part, (count, total ns); inferences (items) and executions (runs)."""

    last_inference_ms: int = 0
    inference_count: int = 0
    execution_count: int = 0
    parts: dict[str, list[int]] = field(default_factory=lambda: {p: [0, 0] for p in _PARTS})

    def as_dict(self, name: str, version: str) -> dict[str, Any]:
        """The extension's ``model_stats`` entry."""
        per = {p: {"count": c, "ns": ns} for p, (c, ns) in self.parts.items()}
        batch = [{"batch_size": 1, **{p: per[p] for p in ("compute_input", "compute_infer", "compute_output")}}]
        return {"name": name, "version": version, "last_inference": self.last_inference_ms,
                "inference_count": self.inference_count, "execution_count": self.execution_count,
                "inference_stats": per, "batch_stats": batch if self.execution_count else []}


def _ns(ms: float) -> int:
    return max(0, int(round(ms * 1e6)))


class StatsTable:
    """The apps' statistics, updated from the request path (the event loop) and read by the endpoints."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._apps: dict[str, ModelStats] = {}

    def succeeded(self, app: str, items: int, total_ms: float, input_ms: float, queue_ms: float,
                  infer_ms: float, output_ms: float) -> None:
        """One request of ``app`` answered: ``items`` inferences in one execution; durations in ms."""
        with self._lock:
            s = self._apps.setdefault(app, ModelStats())
            s.inference_count += items
            s.execution_count += 1
            s.last_inference_ms = int(time.time() * 1000)
            for part, ms in (("success", total_ms), ("compute_input", input_ms), ("queue", queue_ms),
                             ("compute_infer", infer_ms), ("compute_output", output_ms)):
                c = s.parts[part]
                c[0] += 1
                c[1] += _ns(ms)

    def failed(self, app: str, total_ms: float) -> None:
        """One request of ``app`` failed after ``total_ms`` ms."""
        with self._lock:
            c = self._apps.setdefault(app, ModelStats()).parts["fail"]
            c[0] += 1
            c[1] += _ns(total_ms)

    def forget(self, app: str) -> None:
        with self._lock:
            self._apps.pop(app, None)

    def view(self, apps: list[str], version: str) -> dict[str, Any]:
        """``{"model_stats": [...]}`` for ``apps`` (those never used count zero)."""
        with self._lock:
            return {"model_stats": [self._apps.get(a, ModelStats()).as_dict(a, version) for a in apps]}
