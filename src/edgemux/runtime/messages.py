"""What every typed message between edgemux's services is built with: reading a field of a JSON object
with its type checked, and the one error a malformed message raises.

A message is a frozen dataclass with ``to_json()`` (plain JSON values) and ``from_json(doc)`` (validated:
:class:`MessageError` names the field, what was expected and what came). The messages themselves live
with the service that defines them: :mod:`edgemux.runtime.dataplane.messages` (agent <-> control plane),
:mod:`edgemux.runtime.ingress.routing` (the route a gateway holds), :mod:`edgemux.runtime.controlplane.messages`
(the control plane's API).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgemux.errors import EdgemuxError

if TYPE_CHECKING:
    # Read by Observations.from_json alone: every message module builds on the helpers here, and the control
    # plane's client verbs (`edgemux get apps`) need not import the calibration's numpy and YAML catalog
    from edgemux.adapt.calibrate import Observed
    from edgemux.adapt.monitor import AppCounters
    from edgemux.adapt.serving import DeviceTime

_MISSING: Any = object()


class MessageError(EdgemuxError, ValueError):
    """A message that does not have the expected shape; the text names the field."""


def json_kind(value: Any) -> str:
    """The JSON type name of a parsed value, for messages (``object``, ``array``, ``string``, ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def obj(doc: Any, where: str) -> dict[str, Any]:
    """``doc`` when it is a JSON object, else :class:`MessageError`."""
    if not isinstance(doc, dict):
        raise MessageError(f"{where}: expected a JSON object, got {json_kind(doc)}")
    return doc


def text(doc: dict[str, Any], key: str, where: str, default: Any = _MISSING, *, empty: bool = False) -> Any:
    """The string ``doc[key]`` (non-empty unless ``empty``); ``default`` when absent (required otherwise)."""
    v = doc.get(key, default)
    if v is _MISSING:
        raise MessageError(f"{where}.{key}: missing (expected a string)")
    if v is default and default is not _MISSING:
        return v
    if not isinstance(v, str) or (not empty and not v):
        raise MessageError(f"{where}.{key}: expected a {'' if empty else 'non-empty '}string, got {json_kind(v)}")
    return v


def number(doc: dict[str, Any], key: str, where: str, default: Any = _MISSING) -> Any:
    """The finite number ``doc[key]`` as a float; ``default`` when absent (required otherwise)."""
    v = doc.get(key, default)
    if v is _MISSING:
        raise MessageError(f"{where}.{key}: missing (expected a number)")
    if v is default and default is not _MISSING:
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
        raise MessageError(f"{where}.{key}: expected a finite number, got {json_kind(v)} {str(v)[:40]}")
    return float(v)


def flag(doc: dict[str, Any], key: str, where: str, default: Any = _MISSING) -> Any:
    """The boolean ``doc[key]``; ``default`` when absent (required otherwise)."""
    v = doc.get(key, default)
    if v is _MISSING:
        raise MessageError(f"{where}.{key}: missing (expected true or false)")
    if v is default and default is not _MISSING:
        return v
    if not isinstance(v, bool):
        raise MessageError(f"{where}.{key}: expected true or false, got {json_kind(v)}")
    return v


def array(doc: dict[str, Any], key: str, where: str, default: Any = _MISSING) -> list[Any]:
    """The list ``doc[key]``; ``default`` when absent (required otherwise)."""
    v = doc.get(key, default)
    if v is _MISSING:
        raise MessageError(f"{where}.{key}: missing (expected an array)")
    if v is default and default is not _MISSING:
        return list(v)
    if not isinstance(v, list):
        raise MessageError(f"{where}.{key}: expected an array, got {json_kind(v)}")
    return v


@dataclass(frozen=True)
class Observations:
    """What one process (an agent, a gateway) observed since it started, cumulative, sent in every report:
    per app its :class:`~edgemux.adapt.monitor.AppCounters`, per profile (catalog name) the service-time
    moments its devices measured (:class:`~edgemux.adapt.calibrate.Observed`; agents only), per app the
    queueing + service its devices spent on every request they answered, whoever sent it
    (:class:`~edgemux.adapt.serving.DeviceTime`; agents only: the serving path is the rest). The control
    plane subtracts two reports of one ``incarnation`` to get the window between them (``adapt`` reads
    windows)."""

    incarnation: str
    apps: dict[str, AppCounters] = field(default_factory=dict)
    profiles: dict[str, Observed] = field(default_factory=dict)
    device: dict[str, DeviceTime] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"incarnation": self.incarnation, "apps": {a: c.to_json() for a, c in sorted(self.apps.items())},
                "profiles": {p: o.to_json() for p, o in sorted(self.profiles.items())},
                **({"device": {a: t.to_json() for a, t in sorted(self.device.items())}} if self.device else {})}

    @classmethod
    def from_json(cls, doc: Any, where: str = "observations") -> Observations:
        from edgemux.adapt.calibrate import Observed
        from edgemux.adapt.monitor import AppCounters
        from edgemux.adapt.serving import DeviceTime

        d = obj(doc, where)
        def read(key: str, reader: Any) -> dict[str, Any]:
            out = {}
            for name, body in obj(d.get(key, {}), f"{where}.{key}").items():
                try:
                    out[name] = reader(body)
                except ValueError as e:
                    raise MessageError(f"{where}.{key}.{name}: {e}") from None
            return out

        apps: dict[str, AppCounters] = read("apps", AppCounters.from_json)
        profiles: dict[str, Observed] = read("profiles", Observed.from_json)
        device: dict[str, DeviceTime] = read("device", DeviceTime.from_json)
        return cls(text(d, "incarnation", where), apps, profiles, device)
