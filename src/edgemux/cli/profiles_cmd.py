"""``edgemux profiles``: list and show the built-in profiles and constants.

    edgemux profiles list [--kind KIND] [--catalog NAME] [--json]
    edgemux profiles show NAME [--json]
    edgemux profiles constants [--json]

Unknown names raise ``InputError``/``UnknownNameError``; the ``edgemux`` entry point turns them into one
line on stderr and exit code 2. Times are printed in ms, memory in MB.
"""

from __future__ import annotations

import argparse
from typing import Any

from edgemux.cli.jsonout import emit
from edgemux.cli.table import render
from edgemux.profiles.catalog import Catalog, load_catalog, parse_kind
from edgemux.profiles.types import DeviceKind, Profile


def add_parsers(subparsers: Any) -> None:
    """Register ``profiles list|show|constants`` on an argparse subparsers object."""
    p = subparsers.add_parser("profiles", help="list and show built-in profiles (numbers from the papers)",
                              description="Built-in profiles transcribed from the papers, with provenance.")
    sub = p.add_subparsers(dest="profiles_command", metavar="ACTION", parser_class=type(p))
    sub.required = True

    lp = sub.add_parser("list", help="one line per profile")
    lp.add_argument("--kind", metavar="KIND",
                    help=f"only profiles for this device kind ({', '.join(k.value for k in DeviceKind)})")
    lp.add_argument("--catalog", metavar="NAME", help="only profiles of this catalog (e.g. ibis-edgetpu)")
    lp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    lp.set_defaults(func=cmd_list)

    sp = sub.add_parser("show", help="every field of one profile, with its provenance")
    sp.add_argument("name", metavar="NAME", help="profile name, e.g. ibis-edgetpu/inception_v4")
    sp.add_argument("--json", action="store_true", help="print JSON instead of text")
    sp.set_defaults(func=cmd_show)

    cp = sub.add_parser("constants", help="device-level facts and network constants")
    cp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    cp.set_defaults(func=cmd_constants)


def _num(x: float | None, digits: int = 3) -> str:
    """A number with at most ``digits`` decimals and no trailing zeros; '-' when absent."""
    if x is None:
        return "-"
    text = f"{x:.{digits}f}".rstrip("0").rstrip(".")
    return text if text not in ("", "-0") else "0"


def _with_unit(x: float | None, unit: str) -> str:
    return "-" if x is None else f"{_num(x)} {unit}"


def _exec_cell(p: Profile) -> str:
    """Batch-1 execution time (ms); a profile known only at another batch size says which."""
    if 1 in p.exec:
        return _num(p.exec[1].mean_ms)
    if p.exec:
        b = min(p.exec)
        return f"{_num(p.exec[b].mean_ms)} @b{b}"
    return "-"


def profile_to_json(p: Profile, catalog: Catalog | None = None) -> dict[str, Any]:
    """A profile as plain JSON-able data (times ms, variances ms^2, memory MB, power W)."""
    out: dict[str, Any] = {
        "name": p.name,
        "catalog": p.name.split("/", 1)[0],
        "model": p.model,
        "variant": p.variant,
        "device_kind": p.device_kind.value,
        "exec": [{"batch": e.batch, "mean_ms": e.mean_ms, "var_ms2": e.var_ms2}
                 for _, e in sorted(p.exec.items())],
        "switch_ms": p.switch_ms,
        "memory_static_mb": p.memory_static_mb,
        "memory_runtime_mb": p.memory_runtime_mb,
        "memory_total_mb": p.memory_total_mb,
        "power_w": p.power_w,
        "share_curve": [[s, ms] for s, ms in p.share_curve],
        "extra": dict(p.extra),
        "provenance": {"source": p.provenance.source, "detail": p.provenance.detail, "note": p.provenance.note},
    }
    if catalog is not None:
        out["extra_units"] = {k: catalog.columns[k].unit for k in p.extra
                              if k in catalog.columns and catalog.columns[k].unit}
    return out


def cmd_list(args: argparse.Namespace) -> int:
    """Print the profiles (filtered by ``--kind`` / ``--catalog``) as an aligned table or JSON."""
    catalog = load_catalog()
    kind = parse_kind(args.kind) if getattr(args, "kind", None) else None
    only = getattr(args, "catalog", None)
    if only is not None:
        catalog.info(only)
    chosen = [p for p in catalog.profiles.values()
              if (kind is None or p.device_kind is kind) and (only is None or catalog.catalog_of(p) == only)]
    if getattr(args, "json", False):
        emit([profile_to_json(p, catalog) for p in chosen], ensure_ascii=False)
        return 0
    if not chosen:
        print("no profiles match")
        return 0
    rows = [(p.name, p.device_kind.value, _exec_cell(p), _num(p.switch_ms), _num(p.memory_total_mb),
             p.provenance.detail) for p in chosen]
    print(render(("NAME", "KIND", "EXEC MS (B=1)", "SWITCH MS", "MEMORY MB", "SOURCE"), rows))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    """Print every field of one profile, its extra facts with their units, and its provenance."""
    catalog = load_catalog()
    p = catalog.get(args.name)
    if getattr(args, "json", False):
        emit(profile_to_json(p, catalog), ensure_ascii=False)
        return 0
    info = catalog.info(catalog.catalog_of(p))
    execs = "; ".join(f"batch {e.batch}: mean {_num(e.mean_ms)} ms, var {_num(e.var_ms2)} ms^2"
                      for _, e in sorted(p.exec.items())) or "-"
    curve = ", ".join(f"{_num(s)} -> {_num(ms)} ms" for s, ms in p.share_curve) or "-"
    lines = [
        f"name:          {p.name}",
        f"model:         {p.model}",
        f"variant:       {p.variant}",
        f"device kind:   {p.device_kind.value}",
        f"catalog:       {info.name} ({info.description})",
        f"exec time:     {execs}",
        f"switch:        {_num(p.switch_ms)} ms",
        f"memory:        static {_with_unit(p.memory_static_mb, 'MB')}, "
        f"runtime {_with_unit(p.memory_runtime_mb, 'MB')}, total {_with_unit(p.memory_total_mb, 'MB')}",
        f"power:         {_with_unit(p.power_w, 'W')}",
        f"share curve:   {curve}",
    ]
    if p.extra:
        lines.append("extra:")
        width = max(len(k) for k in p.extra)
        for key, value in p.extra.items():
            col = catalog.columns.get(key)
            shown = _num(value, 6) if isinstance(value, float) else str(value)
            unit = f" {col.unit}" if col is not None and col.unit else ""
            meaning = f"  ({col.meaning})" if col is not None else ""
            lines.append(f"  {key.ljust(width)} = {shown}{unit}{meaning}")
    lines += ["provenance:", f"  source: {p.provenance.source}", f"  detail: {p.provenance.detail}"]
    if p.provenance.note:
        lines.append(f"  note:   {p.provenance.note}")
    print("\n".join(lines))
    return 0


def cmd_constants(args: argparse.Namespace) -> int:
    """Print the device-level facts and network constants with units and provenance."""
    catalog = load_catalog()
    consts = list(catalog.constants.values())
    if getattr(args, "json", False):
        emit([{"key": c.key, "value": c.value, "unit": c.unit, "meaning": c.meaning,
               "provenance": {"source": c.provenance.source, "detail": c.provenance.detail,
                              "note": c.provenance.note}} for c in consts], ensure_ascii=False)
        return 0
    rows = [(c.key, _num(c.value), c.unit, c.meaning) for c in consts]
    print(render(("KEY", "VALUE", "UNIT", "MEANING"), rows))
    return 0
