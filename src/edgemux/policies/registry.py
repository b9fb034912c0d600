"""The registry of policies by name, apart from the framework (:mod:`edgemux.policies.base`): a policy class
registers itself with ``@register("name")`` when its module is imported; ``get`` and ``names`` import the
built-in policies first. Nothing here imports a policy module at import time, so no import circle forms."""

from __future__ import annotations

from collections.abc import Callable

from edgemux.errors import UnknownNameError
from edgemux.policies.base import Policy

_REGISTRY: dict[str, Callable[..., Policy]] = {}


def register(name: str) -> Callable[[type[Policy]], type[Policy]]:
    """Class decorator: make the policy available as ``get(name)``."""

    def deco(cls: type[Policy]) -> type[Policy]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"policy {name!r} registered twice")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def _ensure_builtins() -> None:
    # the built-in policies register themselves on import
    from edgemux.policies import dedicated, edgemux, ibis, knapsack, microedge  # noqa: F401


def get(name: str, **options: object) -> Policy:
    """A new policy called ``name`` configured with ``options``; ``UnknownNameError`` otherwise."""
    _ensure_builtins()
    if name not in _REGISTRY:
        raise UnknownNameError("policy", name, "policy", list(_REGISTRY))
    return _REGISTRY[name](**options)


def names() -> list[str]:
    """Registered policy names, sorted."""
    _ensure_builtins()
    return sorted(_REGISTRY)
