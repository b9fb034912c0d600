"""The registry of experiments by name, apart from the framework that runs them and writes their files
(:mod:`edgemux.experiments.runner`): an experiment function registers itself with ``@register("name")``
when its module is imported; ``get`` and ``names`` import the built-in experiments first."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from edgemux.errors import UnknownNameError

if TYPE_CHECKING:  # the runner imports this module when it runs an experiment
    from edgemux.experiments.runner import ExperimentResult

Experiment = Callable[..., "ExperimentResult"]
_REGISTRY: dict[str, Experiment] = {}


def register(name: str) -> Callable[[Experiment], Experiment]:
    """Decorator: ``fn(seed=, quick=) -> ExperimentResult`` becomes experiment ``name``."""

    def deco(fn: Experiment) -> Experiment:
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise ValueError(f"experiment {name!r} registered twice")
        _REGISTRY[name] = fn
        return fn

    return deco


def _ensure_builtins() -> None:
    # the built-in experiments register themselves on import
    from edgemux.experiments import (  # noqa: F401
        dhakal,
        dynamic_trace,
        energy_diurnal,
        fpga_gpu,
        ibis_capacity,
        ibis_hotspot,
        ibis_hotspot_live,
        microedge_cameras,
        microedge_trace,
        mvsp,
    )


def get(name: str) -> Experiment:
    """The experiment called ``name``; ``UnknownNameError`` (an ``InputError``) otherwise."""
    _ensure_builtins()
    if name not in _REGISTRY:
        raise UnknownNameError("experiment", name, "experiment", list(_REGISTRY))
    return _REGISTRY[name]


def names() -> list[str]:
    """Registered experiment names, sorted."""
    _ensure_builtins()
    return sorted(_REGISTRY)
