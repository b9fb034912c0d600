"""``edgemux place``: admit the apps of a file, in file order, with one policy; print each decision.

With ``--store FILE`` the decisions are recorded in the durable SQLite store (``cluster.store``): the cluster is
set when the store has none, each placed app is admitted in its own transaction (a rejected app changes
nothing), and a later run continues from what is stored (an app name already there is reported as a
duplicate). Bad input (missing or malformed file, unknown policy or option, bad spec, a store whose cluster
differs from ``--cluster``) is one line and exit code 2.
"""

from __future__ import annotations

import argparse
import inspect
from typing import Any

from edgemux.cli.jsonout import emit
from edgemux.cli.profile_cmd import add_profiles_option, with_profile_sets
from edgemux.cli.table import render
from edgemux.cluster.specs import load_apps, load_cluster
from edgemux.cluster.state import App, Cluster, Placement, Share
from edgemux.errors import EdgemuxError, InputError
from edgemux.policies import Policy, Rejection, Snapshot, get
from edgemux.policies.base import ranked


def add_parser(sub: Any) -> None:
    p = sub.add_parser("place", help="admit and place apps on a cluster with an admission policy")
    p.add_argument("--cluster", required=True, help="cluster YAML file (kind: Cluster)")
    p.add_argument("--apps", required=True, help="apps YAML file (kind: App, AppList or a --- stream)")
    p.add_argument("--policy", required=True, help="policy name (knapsack, dedicated, ibis, microedge, edgemux)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="policy option (repeatable), e.g. --option choice=spread --option max_utilization=0.8")
    p.add_argument("--store", help="SQLite store file: record the placements; a later run continues from it")
    p.add_argument("--explain", action="store_true",
                   help="show each rejection's full reason, and what broke on every device tried")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_profiles_option(p)
    p.set_defaults(func=with_profile_sets(cmd_place))


# ------------------------------------------------------------------------------------------- options


def parse_value(text: str) -> bool | int | float | str:
    """An option value: true/false (any case), then int, then float, else the string itself."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def parse_options(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise InputError("--option", f"expected KEY=VALUE, got {item!r}")
        out[key.replace("-", "_")] = parse_value(value)
    return out


def _expected_type(default: Any) -> type | None:
    """The type an option takes, read from its default (bool before int: bool is an int subclass)."""
    for t in (bool, int, float, str):
        if isinstance(default, t):
            return t
    return None


def _fits_type(value: Any, want: type) -> bool:
    if want is bool:
        return isinstance(value, bool)
    if want is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, want) and not (want is int and isinstance(value, bool))


def make_policy(name: str, options: dict[str, Any]) -> Policy:
    """The named policy with ``options``; ``InputError`` for an unknown policy, option or bad value."""
    cls = type(get(name))  # UnknownNameError (an InputError) lists the known policies
    params = inspect.signature(cls.__init__).parameters
    known = [k for k, v in params.items() if k != "self"
             and v.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    for key, value in options.items():
        if key not in known:
            have = ", ".join(known) if known else "none"
            raise InputError("--option", f"unknown option {key!r} for policy {name!r} (known: {have})")
        want = _expected_type(params[key].default)
        if want is not None and not _fits_type(value, want):
            raise InputError("--option", f"policy {name!r}: {key} expects {want.__name__}, got {value!r}")
    try:
        return get(name, **options)
    except (TypeError, ValueError) as e:
        raise InputError("--option", f"policy {name!r}: {e}") from None


# ------------------------------------------------------------------------------------------- decisions


def _placed_text(p: Placement) -> str:
    return ", ".join(f"{s.device} x{s.weight:.3g} ({s.profile}"
                     + (f"; {s.instances} x {s.fraction:.3g} of the device" if (s.fraction, s.instances) != (1.0, 1)
                        else "") + ")" for s in p.shares)


def _rejection_json(r: Rejection) -> dict[str, Any]:
    d: dict[str, Any] = {"constraint": r.constraint, "message": r.message}
    for k in ("device", "node", "requested", "used", "capacity", "unit", "tenant", "predicted_ms", "slo_ms",
              "stat", "detail"):
        v = getattr(r, k)
        if v is not None and v != "":
            d[k] = v if not isinstance(v, float) or v != float("inf") else "unstable"
    if r.counts:
        d["counts"] = dict(r.counts)
    if r.reasons:
        # every device tried, as data: what broke there and its numbers (Reason.to_json)
        d["reasons"] = [x.to_json() for x in r.reasons]
    return d


def _reason_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    """(app, device, reason) for every device a rejected app was tried on, closest first per app."""
    out = []
    for r in rows:
        if r["decision"] == "rejected":
            for x in ranked(r["rejection"].reasons):
                out.append([r["app"], x.device or x.where or "-", x.what])
    return out


def _open_store(path: str, cluster: Cluster) -> Any:
    from edgemux.cluster.store import Store

    store = Store.open(path)
    try:
        stored = store.cluster()
        if not stored.nodes:
            store.set_cluster(cluster)
        elif stored != cluster:
            raise InputError("--store", f"{path} holds a different cluster than the one given with --cluster")
    except BaseException:
        store.close()
        raise
    return store


def cmd_place(args: argparse.Namespace) -> int:
    """Admit the apps in file order; print a decision per app and a summary."""
    policy = make_policy(args.policy, parse_options(args.option))
    cluster = load_cluster(args.cluster)
    apps = load_apps(args.apps)
    store = _open_store(args.store, cluster) if args.store else None
    try:
        if store is not None:
            snapshot = Snapshot(cluster, store.apps(), store.placements())
            stored_before = len(snapshot.placements)
        else:
            snapshot = Snapshot(cluster)
            stored_before = 0
        rows: list[dict[str, Any]] = []
        for app in apps:
            decision = policy.decide(app, snapshot)
            if isinstance(decision, Placement):
                if store is not None:
                    try:
                        store.admit(app, decision)
                    except EdgemuxError as e:
                        raise EdgemuxError(f"--store {args.store}: {e}") from None
                snapshot = snapshot.with_placement(app, decision)
                rows.append({"app": app.name, "decision": "placed", "placement": decision})
            else:
                rows.append({"app": app.name, "decision": "duplicate" if decision.constraint == "duplicate"
                             else "rejected", "rejection": decision})
    finally:
        if store is not None:
            store.close()
    per_device = {path: list(snapshot.load(path).apps) for path in cluster.devices}
    admitted = sum(r["decision"] == "placed" for r in rows)
    if args.json:
        out = {
            "policy": args.policy, "options": parse_options(args.option), "store": args.store,
            "admitted": admitted, "total": len(apps), "previously_stored": stored_before,
            "decisions": [_row_json(r, apps) for r in rows],
            "devices": [{"device": p, "tenants": t} for p, t in per_device.items()],
        }
        emit(out)
        return 0
    table = []
    for r in rows:
        if r["decision"] == "placed":
            table.append([r["app"], "placed", _placed_text(r["placement"])])
        else:
            rej: Rejection = r["rejection"]
            why = rej.message if args.explain else rej.constraint
            if r["decision"] == "duplicate" and not args.explain:
                why = "already admitted" + (" (in the store)" if store is not None else "")
            table.append([r["app"], r["decision"], why])
    print(f"policy {args.policy}" + (f" ({', '.join(args.option)})" if args.option else "")
          + f", cluster {args.cluster}" + (f", store {args.store} ({stored_before} apps before)" if store else ""))
    print(render(["app", "decision", "placement" if not args.explain else "placement / reason"], table))
    print()
    print(f"admitted {admitted} of {len(apps)}")
    print(render(["device", "tenants", "apps"],
                 [[p, len(t), ", ".join(t) or "-"] for p, t in per_device.items()]))
    reasons = _reason_rows(rows) if args.explain else []
    if reasons:
        print()
        print("rejected apps, device by device (closest first):")
        print(render(["app", "device", "reason"], reasons))
    return 0


def _share_json(s: Share) -> dict[str, Any]:
    """A placed share; ``fraction`` and ``instances`` only where it holds part of a spatial device (as the
    control plane's placement messages write it)."""
    out: dict[str, Any] = {"device": s.device, "weight": s.weight, "profile": s.profile}
    if (s.fraction, s.instances) != (1.0, 1):
        out.update(fraction=s.fraction, instances=s.instances)
    return out


def _row_json(r: dict[str, Any], apps: list[App]) -> dict[str, Any]:
    if r["decision"] == "placed":
        p: Placement = r["placement"]
        return {"app": r["app"], "decision": "placed", "cpu_node": p.cpu_node,
                "shares": [_share_json(s) for s in p.shares]}
    return {"app": r["app"], "decision": r["decision"], "rejection": _rejection_json(r["rejection"])}
