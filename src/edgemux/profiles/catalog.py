"""Built-in profile catalogs transcribed from the papers, plus device-level and network constants.

The numbers live in data files (``profiles/data/*.csv`` and ``*.yaml``), never in code; this module only
reads and validates them. ``data/README.md`` says where every number came from. A profile is named
``<catalog>/<model>``, or ``<catalog>/<model>:<variant>`` when one catalog has several variants of a model.

Units: times ms, variances ms^2, memory MB, power W, rates req/s.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from edgemux.errors import InputError, UnknownFieldError, UnknownNameError
from edgemux.profiles.types import DeviceKind, ExecTime, Profile, Provenance

INDEX_FILE = "catalogs.yaml"
CONSTANTS_FILE = "constants.yaml"

# CSV columns that map onto Profile fields; every other column must be declared in the index.
STANDARD_COLUMNS = (
    "model", "variant", "batch", "exec_mean_ms", "exec_var_ms2", "switch_ms", "memory_static_mb",
    "memory_runtime_mb", "power_w", "share_curve", "detail", "note",
)
_REQUIRED_COLUMNS = ("model", "detail")
# '/' and ':' separate catalog, model and variant in profile names, so they may not appear inside them.
_MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
_CATALOG_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_CONSTANT_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
# The fields of the index and constants files (a profile set's own files, as `edgemux profile` writes them and a
# user may edit them); any other key is refused, as in cluster and app specs. ``host`` is the profiler's record
# of the machine it measured on, kept as written.
INDEX_FIELDS = ("version", "generated_by", "host", "sources", "columns", "catalogs")
CATALOG_ENTRY_FIELDS = ("name", "device_kind", "source", "file", "description")
COLUMN_FIELDS = ("type", "unit", "meaning")
CONSTANTS_FILE_FIELDS = ("constants",)
CONSTANT_FIELDS = ("key", "value", "unit", "meaning", "source", "detail", "note")


class CatalogDataError(InputError):
    """A built-in data file is malformed; names the file and the line or entry."""


@dataclass(frozen=True)
class Constant:
    """A device-level fact or network constant that belongs to no single model (``value`` in ``unit``)."""

    key: str
    value: float
    unit: str
    meaning: str
    provenance: Provenance


@dataclass(frozen=True)
class CatalogInfo:
    """One built-in catalog: its name (the profile-name prefix), device kind, data file and citation."""

    name: str
    device_kind: DeviceKind
    file: str
    source: str
    description: str


@dataclass(frozen=True)
class ColumnInfo:
    """A non-standard CSV column, kept in ``Profile.extra``: its type (number/text), unit and meaning."""

    name: str
    type: str
    unit: str
    meaning: str


def normalize_model_name(name: str) -> str:
    """Case- and punctuation-insensitive key (``ResNet-50`` and ``resnet50`` match; so do
    ``MobileNetV2`` and ``mobilenet_v2``)."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def parse_kind(kind: DeviceKind | str) -> DeviceKind:
    """``kind`` as a DeviceKind; ``UnknownNameError`` (field "kind") listing the known kinds otherwise."""
    if isinstance(kind, DeviceKind):
        return kind
    try:
        return DeviceKind.parse(kind)
    except ValueError:
        raise UnknownNameError("kind", str(kind), "device kind", [k.value for k in DeviceKind]) from None


class Catalog:
    """All built-in profiles (stable order: catalogs in precedence order, rows in file order), the
    constants, and what each catalog and extra column means. Read-only: it is shared by ``load_catalog``."""

    def __init__(self, profiles: Sequence[Profile], constants: Sequence[Constant],
                 infos: Sequence[CatalogInfo], columns: Sequence[ColumnInfo]) -> None:
        self.profiles: Mapping[str, Profile] = MappingProxyType({p.name: p for p in profiles})
        self.constants: Mapping[str, Constant] = MappingProxyType({c.key: c for c in constants})
        self.infos: Mapping[str, CatalogInfo] = MappingProxyType({i.name: i for i in infos})
        self.columns: Mapping[str, ColumnInfo] = MappingProxyType({c.name: c for c in columns})

    def catalogs(self) -> list[str]:
        """Catalog names in precedence order."""
        return list(self.infos)

    def catalog_of(self, profile: Profile | str) -> str:
        """The catalog a profile (or profile name) belongs to: its name up to the first '/'."""
        name = profile.name if isinstance(profile, Profile) else profile
        return name.split("/", 1)[0]

    def info(self, catalog: str) -> CatalogInfo:
        """Description of one catalog; ``UnknownNameError`` listing the catalogs otherwise."""
        if catalog not in self.infos:
            raise UnknownNameError("catalog", catalog, "catalog", self.catalogs())
        return self.infos[catalog]

    def get(self, name: str) -> Profile:
        """The profile called ``name``; ``UnknownNameError`` listing known names otherwise.

        A ``<catalog>/<model>`` name of a model that has several variants lists those variants.
        """
        if name in self.profiles:
            return self.profiles[name]
        # narrow the hint to what the user most likely meant: the model's variants, else its catalog
        variants = [n for n in self.profiles if n.startswith(name + ":")]
        same_catalog = [n for n in self.profiles if self.catalog_of(n) == self.catalog_of(name)]
        raise UnknownNameError("profile", name, "profile", variants or same_catalog or list(self.profiles))

    def constant(self, key: str) -> Constant:
        """The constant called ``key``; ``UnknownNameError`` listing known keys otherwise."""
        if key not in self.constants:
            raise UnknownNameError("constant", key, "constant", list(self.constants))
        return self.constants[key]

    def models(self, kind: DeviceKind | str | None = None) -> list[str]:
        """Sorted model names with a profile (on ``kind`` when given)."""
        k = None if kind is None else parse_kind(kind)
        return sorted({p.model for p in self.profiles.values() if k is None or p.device_kind is k})

    def find_all(self, model: str, kind: DeviceKind | str | None = None,
                 catalog: str | None = None) -> list[Profile]:
        """Every profile of ``model`` (on ``kind``, in ``catalog`` when given), in catalog order.

        An exact model-name match wins; otherwise names are compared case- and punctuation-insensitively.
        """
        k = None if kind is None else parse_kind(kind)
        if catalog is not None:
            self.info(catalog)
        scope = [p for p in self.profiles.values()
                 if (k is None or p.device_kind is k) and (catalog is None or self.catalog_of(p) == catalog)]
        exact = [p for p in scope if p.model == model]
        if exact:
            return exact
        key = normalize_model_name(model)
        return [p for p in scope if normalize_model_name(p.model) == key]

    def find(self, model: str, kind: DeviceKind | str, catalog: str | None = None) -> Profile:
        """The profile to use for ``model`` on a device of ``kind`` (optionally only from ``catalog``).

        Among several, one with a batch-1 execution time wins (so ``Profile.service`` works), then the
        earlier catalog. Errors name the model and the kind, and say which kinds do have the model.
        """
        k = parse_kind(kind)
        found = self.find_all(model, k, catalog)
        if found:
            with_batch1 = [p for p in found if 1 in p.exec]
            return (with_batch1 or found)[0]
        scope = f" in catalog {catalog!r}" if catalog is not None else ""
        elsewhere = self.find_all(model)
        if not elsewhere:
            known = sorted({p.model for p in self.profiles.values() if p.device_kind is k
                            and (catalog is None or self.catalog_of(p) == catalog)})
            raise UnknownNameError("model", model, f"{k.value} model{scope}", known)
        by_kind: dict[str, list[str]] = {}
        for p in elsewhere:
            by_kind.setdefault(p.device_kind.value, []).append(p.name)
        have = "; ".join(f"{kd}: {', '.join(names)}" for kd, names in by_kind.items())
        raise InputError("model", f"no {k.value} profile of model {model!r}{scope}; "
                                  f"model {model!r} has profiles for {have}")

    def with_profiles(self, profiles: Sequence[Profile]) -> Catalog:
        """A new catalog where each of ``profiles`` replaces the profile of the same name (re-calibrated
        figures, ``adapt.calibrate``), in place in the precedence order; ``UnknownNameError`` for a name this
        catalog does not have (a replacement never adds a profile silently)."""
        new = {p.name: p for p in profiles}
        for name in new:
            self.get(name)
        return Catalog([new.get(n, p) for n, p in self.profiles.items()], list(self.constants.values()),
                       list(self.infos.values()), list(self.columns.values()))

    def merged(self, other: Catalog, label: str = "profile set") -> Catalog:
        """This catalog followed by ``other`` (a measured or imported profile set), as a new ``Catalog``.

        Precedence follows order: ``other``'s catalogs come after this one's, so a device without a
        ``profile_set`` still prefers the earlier (built-in) profiles; name the set to use the new ones.
        A catalog name or constant key present in both, or a column declared differently, raises
        ``CatalogDataError`` naming ``label``: silently shadowing a profile would lose its provenance.
        """
        for name in other.infos:
            if name in self.infos:
                raise CatalogDataError("catalogs", f"catalog {name!r} is already defined "
                                                   f"(known: {', '.join(self.catalogs())})", label)
        for key in other.constants:
            if key in self.constants:
                raise CatalogDataError("constants", f"constant {key!r} is already defined", label)
        for name, col in other.columns.items():
            mine = self.columns.get(name)
            # the column table is shared by all catalogs, so a name may only mean one thing
            if mine is not None and mine != col:
                raise CatalogDataError(f"columns.{name}", f"declared as {col.type} in {col.unit or 'no unit'} "
                                                          f"({col.meaning!r}), but already declared as "
                                                          f"{mine.type} in {mine.unit or 'no unit'} "
                                                          f"({mine.meaning!r})", label)
        columns = {**self.columns, **other.columns}
        return Catalog([*self.profiles.values(), *other.profiles.values()],
                       [*self.constants.values(), *other.constants.values()],
                       [*self.infos.values(), *other.infos.values()], list(columns.values()))


# --------------------------------------------------------------------------------------------- loading


def data_dir() -> Traversable:
    """The packaged data folder."""
    return resources.files("edgemux.profiles") / "data"


@functools.lru_cache(maxsize=1)
def load_builtin_catalog() -> Catalog:
    """The built-in catalogs, read and validated once per process (``CatalogDataError`` on bad data)."""
    return load_catalog_from(data_dir(), label="edgemux/profiles/data")


# The profile sets in use for this process (``use_profile_sets``) and the combined catalog made of them.
# A module-level setting because every consumer (cluster and app validation, policies, the simulator)
# asks ``load_catalog()`` without arguments: this is how a measured set reaches all of them at once.
_active_sets: tuple[Path, ...] = ()
_active_catalog: Catalog | None = None


def load_catalog(extra: Sequence[str | os.PathLike[str]] = ()) -> Catalog:
    """The catalog to use: the built-in catalogs, then the profile sets made active with
    ``use_profile_sets``, then the profile-set directories in ``extra`` (each one in the format of
    ``data/``: an index, its CSVs and a constants file, e.g. written by ``edgemux profile``).

    Without ``extra`` the result is one shared object (read once per process, or once per
    ``use_profile_sets``); directories in ``extra`` are read anew on every call. ``CatalogDataError`` on a
    bad set, or when a set redefines a catalog name or constant that an earlier one has.
    """
    base = _active_catalog if _active_catalog is not None else load_builtin_catalog()
    return _merge_sets(base, extra)


def active_profile_sets() -> tuple[Path, ...]:
    """The profile-set directories ``load_catalog()`` includes now (``use_profile_sets``), in order."""
    return _active_sets


@contextlib.contextmanager
def use_profile_sets(dirs: Sequence[str | os.PathLike[str]]) -> Iterator[Catalog]:
    """Within the ``with`` block, ``load_catalog()`` returns the built-in catalogs followed by the profile
    sets in ``dirs`` (read and validated once, on entry); yields that catalog. The previous setting comes
    back on exit, so a command or a test leaves no trace. With no ``dirs`` nothing changes.

    Not thread-safe: meant for a process's entry point (the CLI's ``--profiles``), before work starts.
    """
    global _active_sets, _active_catalog
    if not dirs:
        yield load_catalog()
        return
    combined = _merge_sets(load_catalog(), dirs)
    before = (_active_sets, _active_catalog)
    _active_sets = before[0] + tuple(Path(d) for d in dirs)
    _active_catalog = combined
    try:
        yield combined
    finally:
        _active_sets, _active_catalog = before


def _merge_sets(base: Catalog, dirs: Sequence[str | os.PathLike[str]]) -> Catalog:
    out = base
    for d in dirs:
        path = Path(d)
        if not path.is_dir():
            raise CatalogDataError("directory", "no such profile-set directory", str(path))
        out = out.merged(load_catalog_from(path), label=str(path))
    return out


def load_catalog_from(directory: Traversable | Path, label: str | None = None) -> Catalog:
    """Read and validate the catalogs in ``directory`` (an index, its CSVs and the constants file).

    ``label`` is how error messages name the folder. Raises ``CatalogDataError`` naming the file and
    the line (CSV) or entry (YAML) of the first problem.
    """
    where = label or str(directory)
    index = _load_yaml(directory, INDEX_FILE, where)
    _only(index, INDEX_FIELDS, "", f"{where}/{INDEX_FILE}")
    sources = _parse_sources(index, f"{where}/{INDEX_FILE}")
    columns = _parse_columns(index, f"{where}/{INDEX_FILE}")
    infos = _parse_infos(index, sources, directory, f"{where}/{INDEX_FILE}")
    profiles: list[Profile] = []
    for info in infos:
        text = _read_text(directory, info.file, where)
        profiles.extend(_parse_profiles(text, info, {c.name: c for c in columns}, f"{where}/{info.file}"))
    constants_doc = _load_yaml(directory, CONSTANTS_FILE, where)
    _only(constants_doc, CONSTANTS_FILE_FIELDS, "", f"{where}/{CONSTANTS_FILE}")
    constants = _parse_constants(constants_doc, sources, f"{where}/{CONSTANTS_FILE}")
    return Catalog(profiles, constants, infos, columns)


def _read_text(directory: Traversable | Path, name: str, where: str) -> str:
    path = directory / name
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CatalogDataError("file", f"cannot read: {e}", f"{where}/{name}") from None


def _load_yaml(directory: Traversable | Path, name: str, where: str) -> dict[str, Any]:
    src = f"{where}/{name}"
    try:
        data = yaml.safe_load(_read_text(directory, name, where))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"line {mark.line + 1}" if mark else "document"
        raise CatalogDataError(at, f"malformed YAML: {getattr(e, 'problem', None) or e}", src) from None
    if not isinstance(data, dict):
        raise CatalogDataError("document", "expected a mapping at the top level", src)
    return data


def _only(entry: Mapping[str, Any], known: tuple[str, ...], field: str, src: str) -> None:
    """``UnknownFieldError``'s check (the one the spec readers use), raised as a ``CatalogDataError`` like every
    other problem of a data file, with the same message."""
    try:
        UnknownFieldError.check(entry, known, field, src)
    except UnknownFieldError as e:
        raise CatalogDataError(e.field, e.problem, src) from None


def _text(entry: Mapping[str, Any], key: str, field: str, src: str, required: bool = True) -> str:
    value = entry.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value.strip():
        raise CatalogDataError(f"{field}.{key}", f"expected non-empty text, got {value!r}", src)
    return value.strip()


def _parse_sources(index: Mapping[str, Any], src: str) -> dict[str, str]:
    if index.get("version") != 1:
        raise CatalogDataError("version", f"expected 1, got {index.get('version')!r}", src)
    raw = index.get("sources")
    if not isinstance(raw, dict) or not raw:
        raise CatalogDataError("sources", "expected a non-empty mapping of key -> citation", src)
    return {str(k): _text(raw, k, "sources", src) for k in raw}


def _parse_columns(index: Mapping[str, Any], src: str) -> list[ColumnInfo]:
    raw = index.get("columns")
    if not isinstance(raw, dict):
        raise CatalogDataError("columns", "expected a mapping of column name -> {type, unit, meaning}", src)
    out = []
    for name, spec in raw.items():
        field = f"columns.{name}"
        if name in STANDARD_COLUMNS:
            raise CatalogDataError(field, "is a standard column; do not redeclare it", src)
        if not isinstance(spec, dict):
            raise CatalogDataError(field, "expected a mapping with type, unit, meaning", src)
        _only(spec, COLUMN_FIELDS, field, src)
        ctype = spec.get("type")
        if ctype not in ("number", "text"):
            raise CatalogDataError(f"{field}.type", f"expected 'number' or 'text', got {ctype!r}", src)
        out.append(ColumnInfo(str(name), ctype, _text(spec, "unit", field, src, required=False),
                              _text(spec, "meaning", field, src)))
    return out


def _parse_infos(index: Mapping[str, Any], sources: Mapping[str, str], directory: Traversable | Path,
                 src: str) -> list[CatalogInfo]:
    raw = index.get("catalogs")
    if not isinstance(raw, list) or not raw:
        raise CatalogDataError("catalogs", "expected a non-empty list", src)
    out: list[CatalogInfo] = []
    for i, entry in enumerate(raw):
        field = f"catalogs[{i}]"
        if not isinstance(entry, dict):
            raise CatalogDataError(field, "expected a mapping", src)
        _only(entry, CATALOG_ENTRY_FIELDS, field, src)
        name = _text(entry, "name", field, src)
        if not _CATALOG_RE.match(name):
            raise CatalogDataError(f"{field}.name", f"{name!r} must be lower-case letters, digits and '-'", src)
        if any(o.name == name for o in out):
            raise CatalogDataError(f"{field}.name", f"duplicate catalog {name!r}", src)
        try:
            kind = DeviceKind.parse(_text(entry, "device_kind", field, src))
        except ValueError as e:
            raise CatalogDataError(f"{field}.device_kind", str(e), src) from None
        source_key = _text(entry, "source", field, src)
        if source_key not in sources:
            raise CatalogDataError(f"{field}.source", f"unknown source {source_key!r} "
                                                      f"(known: {', '.join(sources)})", src)
        file = _text(entry, "file", field, src)
        if not (directory / file).is_file():
            raise CatalogDataError(f"{field}.file", f"no such data file {file!r}", src)
        out.append(CatalogInfo(name, kind, file, sources[source_key], _text(entry, "description", field, src)))
    return out


def _parse_constants(data: Mapping[str, Any], sources: Mapping[str, str], src: str) -> list[Constant]:
    raw = data.get("constants")
    if not isinstance(raw, list):
        raise CatalogDataError("constants", "expected a list", src)
    out: dict[str, Constant] = {}
    for i, entry in enumerate(raw):
        field = f"constants[{i}]"
        if not isinstance(entry, dict):
            raise CatalogDataError(field, "expected a mapping", src)
        _only(entry, CONSTANT_FIELDS, field, src)
        key = _text(entry, "key", field, src)
        if not _CONSTANT_RE.match(key):
            raise CatalogDataError(f"{field}.key", f"{key!r} must be lower-case letters, digits, '_', '.', '-'", src)
        if key in out:
            raise CatalogDataError(f"{field}.key", f"duplicate constant {key!r}", src)
        value = entry.get("value")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise CatalogDataError(f"{field}.value", f"expected a finite number, got {value!r}", src)
        source_key = _text(entry, "source", field, src)
        if source_key not in sources:
            raise CatalogDataError(f"{field}.source", f"unknown source {source_key!r}", src)
        prov = Provenance(sources[source_key], _text(entry, "detail", field, src),
                          _text(entry, "note", field, src, required=False))
        out[key] = Constant(key, float(value), _text(entry, "unit", field, src),
                            _text(entry, "meaning", field, src), prov)
    return list(out.values())


# ------------------------------------------------------------------------------------------- CSV rows


@dataclass
class _Row:
    line: int
    model: str
    variant: str
    fields: dict[str, Any]


def _csv_rows(text: str, src: str) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """Header and data rows with their line numbers; '#' lines and blank lines are comments.

    Lines are parsed one at a time (no multi-line quoted cells) so every error can name its line.
    """
    header: list[str] | None = None
    rows: list[tuple[int, list[str]]] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            cells = [c.strip() for c in next(csv.reader([line], strict=True))]
        except csv.Error as e:
            raise CatalogDataError(f"line {lineno}", f"malformed CSV: {e}", src) from None
        if header is None:
            header = cells
            continue
        if len(cells) != len(header):
            raise CatalogDataError(f"line {lineno}", f"has {len(cells)} cells, the header has {len(header)}", src)
        rows.append((lineno, cells))
    if header is None:
        raise CatalogDataError("header", "no header line", src)
    return header, rows


def _check_header(header: list[str], columns: Mapping[str, ColumnInfo], src: str) -> None:
    seen: set[str] = set()
    for col in header:
        if col in seen:
            raise CatalogDataError("header", f"duplicate column {col!r}", src)
        seen.add(col)
        if col not in STANDARD_COLUMNS and col not in columns:
            raise CatalogDataError("header", f"unknown column {col!r}: declare it under 'columns' in "
                                             f"{INDEX_FILE} (standard: {', '.join(STANDARD_COLUMNS)})", src)
    for col in _REQUIRED_COLUMNS:
        if col not in seen:
            raise CatalogDataError("header", f"missing required column {col!r}", src)


def _number(cell: str, where: str, src: str, *, minimum: float | None = None, strict: bool = False) -> float:
    try:
        x = float(cell)
    except ValueError:
        raise CatalogDataError(where, f"expected a number, got {cell!r}", src) from None
    if not math.isfinite(x):
        raise CatalogDataError(where, f"expected a finite number, got {cell!r}", src)
    if minimum is not None and (x <= minimum if strict else x < minimum):
        rel = ">" if strict else ">="
        raise CatalogDataError(where, f"must be {rel} {minimum:g}, got {cell}", src)
    return x


def _share_curve(cell: str, where: str, src: str) -> tuple[tuple[float, float], ...]:
    points = []
    for part in cell.split(";"):
        share_s, sep, ms_s = part.partition(":")
        if not sep:
            raise CatalogDataError(where, f"expected 'share:ms;share:ms', got {cell!r}", src)
        share = _number(share_s.strip(), where, src, minimum=0.0, strict=True)
        if share > 1:
            raise CatalogDataError(where, f"share must be in (0, 1], got {share:g}", src)
        points.append((share, _number(ms_s.strip(), where, src, minimum=0.0, strict=True)))
    shares = [s for s, _ in points]
    if shares != sorted(set(shares)):
        raise CatalogDataError(where, "shares must be distinct and increasing", src)
    return tuple(points)


def _parse_row(lineno: int, cells: dict[str, str], columns: Mapping[str, ColumnInfo], src: str) -> _Row:
    def at(col: str) -> str:
        return f"line {lineno}, column {col}"

    model = cells.get("model", "")
    if not _MODEL_RE.match(model):
        raise CatalogDataError(at("model"), f"expected a model name (letters, digits, '_.+-'), got {model!r}", src)
    variant = cells.get("variant", "") or "default"
    if not _MODEL_RE.match(variant):
        raise CatalogDataError(at("variant"), f"expected a variant name (letters, digits, '_.+-'), got {variant!r}", src)
    if not cells.get("detail"):
        raise CatalogDataError(at("detail"), "provenance detail (where in the source) is required", src)

    f: dict[str, Any] = {"detail": cells["detail"], "note": cells.get("note", ""), "extra": {}}
    mean = cells.get("exec_mean_ms", "")
    var = cells.get("exec_var_ms2", "")
    batch = cells.get("batch", "")
    if mean:
        b = 1
        if batch:
            b_f = _number(batch, at("batch"), src, minimum=1)
            if b_f != int(b_f):
                raise CatalogDataError(at("batch"), f"must be a whole number, got {batch}", src)
            b = int(b_f)
        v = _number(var, at("exec_var_ms2"), src, minimum=0) if var else 0.0
        f["exec"] = {b: ExecTime(b, _number(mean, at("exec_mean_ms"), src, minimum=0, strict=True), v)}
    elif var or batch:
        raise CatalogDataError(at("exec_mean_ms"), "batch/exec_var_ms2 given without exec_mean_ms", src)
    for col in ("switch_ms", "memory_static_mb", "memory_runtime_mb"):
        if cells.get(col):
            f[col] = _number(cells[col], at(col), src, minimum=0)
    if cells.get("power_w"):
        f["power_w"] = _number(cells["power_w"], at("power_w"), src, minimum=0, strict=True)
    if cells.get("share_curve"):
        f["share_curve"] = _share_curve(cells["share_curve"], at("share_curve"), src)
    for col, info in columns.items():
        cell = cells.get(col, "")
        if cell:
            f["extra"][col] = _number(cell, at(col), src) if info.type == "number" else cell
    return _Row(lineno, model, variant, f)


def _parse_profiles(text: str, info: CatalogInfo, columns: Mapping[str, ColumnInfo], src: str) -> list[Profile]:
    header, raw_rows = _csv_rows(text, src)
    _check_header(header, columns, src)
    used = {c: columns[c] for c in header if c in columns}
    rows = [_parse_row(lineno, dict(zip(header, cells)), used, src) for lineno, cells in raw_rows]
    if not rows:
        raise CatalogDataError("rows", "no profiles in this file", src)

    first_line: dict[tuple[str, str], int] = {}
    per_model: dict[str, int] = {}
    for r in rows:
        key = (r.model, r.variant)
        if key in first_line:
            raise CatalogDataError(f"line {r.line}", f"duplicate model/variant {r.model}:{r.variant} "
                                                     f"(first on line {first_line[key]})", src)
        first_line[key] = r.line
        per_model[r.model] = per_model.get(r.model, 0) + 1

    out = []
    for r in rows:
        name = f"{info.name}/{r.model}" + (f":{r.variant}" if per_model[r.model] > 1 else "")
        f = r.fields
        out.append(Profile(
            name=name, model=r.model, variant=r.variant, device_kind=info.device_kind,
            provenance=Provenance(info.source, f["detail"], f["note"]),
            exec=f.get("exec", {}), memory_static_mb=f.get("memory_static_mb"),
            memory_runtime_mb=f.get("memory_runtime_mb"), switch_ms=f.get("switch_ms", 0.0),
            power_w=f.get("power_w"), share_curve=f.get("share_curve", ()), extra=f["extra"],
        ))
    return out
