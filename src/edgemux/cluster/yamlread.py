"""Reading Kubernetes-style YAML specs: typed access to mappings that reports every problem as an
``InputError`` naming the dotted field (``spec.apps[1].rate``) and the file, and YAML loading that reports
malformed documents with their line and column. Shared by scenarios (``cluster.scenario``) and cluster/app
specs (``cluster.specs``).

Specs are strict, as ``kubectl``'s strict validation: every mapping declares its fields with
:meth:`Reader.only` before reading any of them, and a key it does not declare is an ``UnknownFieldError``
(``spec.brust: unknown field, did you mean 'burst'?``) rather than a typo dropped for its default."""

from __future__ import annotations

import builtins
import math
from pathlib import Path
from typing import Any

import yaml

from edgemux.errors import InputError, UnknownFieldError

API_VERSION = "edgemux/v1alpha1"
# the top of every document, and its metadata: Kubernetes' name, labels and annotations (edgemux reads the
# name; labels and annotations are kept for the user's tools, checked only for their shape)
ROOT_FIELDS = ("apiVersion", "kind", "metadata", "spec")
METADATA_FIELDS = ("name", "labels", "annotations")


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

    def only(self, *known: builtins.str) -> "Reader":
        """Declare this mapping's fields: ``UnknownFieldError`` for the first key (in document order) that is
        not one of ``known``, naming it by its dotted path with the closest known field as a suggestion.
        Call it before reading any field, so a misspelt required field (``latencyMS``) is reported as the
        typo it is rather than as ``latencyMs: is required``. Returns the reader, for chaining."""
        UnknownFieldError.check(self.data, known, self.path, self.source)
        return self

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

    def header(self, kinds: tuple[builtins.str, ...]) -> builtins.str:
        """Check a document's top: only ``ROOT_FIELDS``, ``apiVersion`` this version, ``kind`` one of
        ``kinds``; returns the kind."""
        self.only(*ROOT_FIELDS)
        api = self.str("apiVersion")
        if api != API_VERSION:
            raise self.fail("apiVersion", f"expected {API_VERSION!r}, got {api!r}")
        kind = self.str("kind") or ""
        if kind not in kinds:
            raise self.fail("kind", f"expected {' or '.join(repr(k) for k in kinds)}, got {kind!r}")
        return kind

    def metadata(self, required: builtins.bool = True) -> builtins.str | None:
        """The document's ``metadata.name`` (None when not ``required`` and absent), after checking that the
        metadata has only ``METADATA_FIELDS`` and that its labels and annotations map strings to strings,
        as Kubernetes requires."""
        meta = self.sub("metadata", required=required)
        if meta is None:
            return None
        meta.only(*METADATA_FIELDS)
        for key in ("labels", "annotations"):
            tags = meta.sub(key, required=False)
            if tags is None:
                continue
            for k, v in tags.data.items():
                if not isinstance(k, builtins.str) or not k:
                    raise meta.fail(key, f"expected non-empty string keys, got {k!r}")
                if not isinstance(v, builtins.str):
                    raise tags.fail(k, f"expected a string, got {v!r}")
        return meta.str("name", required=required)


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
