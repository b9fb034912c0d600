"""Reading Kubernetes-style YAML specs: typed access to mappings that reports every problem as an
``InputError`` naming the dotted field (``spec.apps[1].rate``) and the file, and YAML loading that reports
malformed documents with their line and column. Shared by scenarios (``cluster.scenario``) and cluster/app
specs (``cluster.specs``)."""

from __future__ import annotations

import builtins
import math
from pathlib import Path
from typing import Any

import yaml

from edgemux.errors import InputError

API_VERSION = "edgemux/v1alpha1"


def typename(v: Any) -> str:
    """A short name for the type of a YAML value, for error messages."""
    return "nothing" if v is None else type(v).__name__


class Reader:
    """Typed access to a YAML mapping that reports problems with their dotted path.

    The accessors are named after the YAML types they return (``str``, ``bool``, ``list``), which shadows the
    builtins inside this class body: annotations below the ``str``/``bool`` methods spell the builtins
    ``builtins.str``/``builtins.bool`` so they name the types, not the methods."""

    def __init__(self, data: Any, path: str, source: str) -> None:
        self.source = source
        self.path = path
        if not isinstance(data, dict):
            raise InputError(path or "document", f"expected a mapping, got {typename(data)}", source)
        self.data = data

    def _f(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def field(self, key: str) -> str:
        """The dotted path of ``key`` in this mapping."""
        return self._f(key)

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def sub(self, key: str, required: bool = True) -> "Reader | None":
        if not self.has(key):
            if required:
                raise InputError(self._f(key), "is required", self.source)
            return None
        return Reader(self.data[key], self._f(key), self.source)

    def list(self, key: str) -> list["Reader"]:
        if not self.has(key):
            raise InputError(self._f(key), "is required", self.source)
        items = self.data[key]
        if not isinstance(items, list):
            raise InputError(self._f(key), f"expected a list, got {typename(items)}", self.source)
        return [Reader(x, f"{self._f(key)}[{i}]", self.source) for i, x in enumerate(items)]

    def str(self, key: str, default: str | None = None, required: bool = True) -> str | None:
        if not self.has(key):
            if default is not None or not required:
                return default
            raise InputError(self._f(key), "is required", self.source)
        v = self.data[key]
        if not isinstance(v, str) or not v:
            raise InputError(self._f(key), f"expected a non-empty string, got {v!r}", self.source)
        return v

    def strs(self, key: builtins.str) -> tuple[builtins.str, ...]:
        """A list of non-empty strings (empty tuple when absent)."""
        if not self.has(key):
            return ()
        items = self.data[key]
        if not isinstance(items, list):
            raise InputError(self._f(key), f"expected a list of strings, got {typename(items)}", self.source)
        for i, v in enumerate(items):
            if not isinstance(v, str) or not v:
                raise InputError(f"{self._f(key)}[{i}]", f"expected a non-empty string, got {v!r}", self.source)
        return tuple(items)

    def bool(self, key: builtins.str, default: builtins.bool = False) -> builtins.bool:
        if not self.has(key):
            return default
        v = self.data[key]
        if not isinstance(v, bool):
            raise InputError(self._f(key), f"expected true or false, got {v!r}", self.source)
        return v

    def num(self, key: builtins.str, default: float | None = None, *, minimum: float | None = 0.0,
            strictly: builtins.bool = False, required: builtins.bool = False) -> float | None:
        if not self.has(key):
            if required:
                raise InputError(self._f(key), "is required", self.source)
            return default
        v = self.data[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise InputError(self._f(key), f"expected a finite number, got {v!r}", self.source)
        if minimum is not None and (v < minimum or (strictly and v == minimum)):
            rel = ">" if strictly else ">="
            raise InputError(self._f(key), f"must be {rel} {minimum:g}, got {v:g}", self.source)
        return float(v)

    def fail(self, key: builtins.str, problem: builtins.str) -> InputError:
        return InputError(self._f(key), problem, self.source)


def read_text(path: str | Path) -> str:
    """The text of a spec file; ``InputError`` (field "file") when it cannot be read."""
    src = str(path)
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError("file", "no such file", src) from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError("file", f"cannot read: {e}", src) from None


def _yaml_error(e: yaml.YAMLError, src: str) -> InputError:
    mark = getattr(e, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "document"
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return InputError(where, f"malformed YAML: {problem}", src)


def parse_yaml(text: str, source: str) -> Any:
    """One YAML document; malformed YAML is an ``InputError`` naming the line and column."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise _yaml_error(e, source) from None


def parse_yaml_all(text: str, source: str) -> list[Any]:
    """Every document of a YAML stream (empty documents dropped), with the errors of ``parse_yaml``."""
    try:
        return [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise _yaml_error(e, source) from None
