"""``edgemux controlplane``: run the control-plane service (its clients' verbs are ``cli.client_cmd``).

The server prints ``controlplane listening on http://HOST:PORT`` once it serves (``--port 0``: an ephemeral
port) and stops gracefully on Ctrl-C or SIGTERM. Clients find it with ``--server URL``, else the
``EDGEMUX_SERVER`` environment variable, else ``http://127.0.0.1:8470``.

Exit codes: 0 done; 1 an app was rejected (its rejection's message is printed); 2 bad input (a missing or
malformed file, a spec the server refuses, an unknown app, an unreachable server), one line on stderr.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from typing import TYPE_CHECKING, Any

from edgemux.cli.profile_cmd import add_profiles_option, with_profile_sets
from edgemux.cli.serving import add_tls_options, add_token_option, listen, service_token, stop_on_signals, \
    warn_if_open
from edgemux.adapt.settings import AdaptSettings
from edgemux.errors import InputError

if TYPE_CHECKING:
    # the policies and estimators (numpy, scipy: about 0.5 s) are imported by the functions that use them, so
    # that `edgemux controlplane --help` and a usage error answer at once
    from edgemux.adapt.consolidate import ConsolidationSettings


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("controlplane", help="run the control plane: admit apps, drive agents and gateways")
    p.add_argument("--cluster", required=True, help="cluster YAML file (kind: Cluster)")
    p.add_argument("--store", required=True, help="SQLite store file (created when missing; the source of truth)")
    p.add_argument("--policy", default="edgemux", help="admission policy (default edgemux)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="policy option (repeatable)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8470, help="port (default 8470; 0: an ephemeral port)")
    p.add_argument("--gateway", action="append", default=[], metavar="URL", help="gateway to publish routes to")
    p.add_argument("--model", action="append", default=[], metavar="NAME=SOURCE",
                   help="model source the agents load for a catalog model or profile name "
                        "(zoo:NAME@SIZE or an ONNX path on the nodes); repeatable")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.add_argument("--reconcile-period-s", type=float, default=None, metavar="S",
                   help="how often the reconcile loop compares the store with agents and gateways (default 1 s)")
    p.add_argument("--no-adapt", action="store_true",
                   help="do not adapt after placement (no hotspot moves, no re-calibration; docs/adapt.md)")
    p.add_argument("--adapt-option", action="append", default=[], metavar="NAME=VALUE",
                   help="adapt setting, e.g. window_s=5 (repeatable; the settings are in docs/adapt.md)")
    add_consolidate_options(p)
    add_token_option(p, server=True)
    add_tls_options(p)
    p.add_argument("--drain-grace-s", type=float, default=None, metavar="S",
                   help="after a move switches routes, how long the old pieces keep serving before they "
                        "unload (default 1 s)")
    add_profiles_option(p)
    p.set_defaults(func=with_profile_sets(cmd_controlplane))


# ------------------------------------------------------------------------------------------------ server


def cmd_controlplane(args: argparse.Namespace) -> int:
    from edgemux.cli.place_cmd import make_policy, parse_options
    from edgemux.cluster.specs import load_cluster
    from edgemux.runtime import process
    from edgemux.runtime.controlplane.service import ControlPlane
    from edgemux.runtime.process import space_full_collections, tune_allocator
    from edgemux.runtime.tls import server_options

    if not 0 <= args.port <= 65535:
        raise InputError("--port", f"must be in 0..65535, got {args.port}")
    token = service_token(args)  # protected mode: refused before anything opens or binds
    options = parse_options(args.option)
    make_policy(args.policy, options)  # unknown policy/option: one line, exit 2, before anything starts
    adapt = adapt_settings(args.adapt_option, args.no_adapt)
    consolidation, wake_s = consolidate_settings(args.consolidate, args.consolidate_option, args.no_adapt)
    cluster = load_cluster(args.cluster)
    sources: dict[str, str] = {}
    for item in args.model:
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise InputError("--model", f"expected NAME=SOURCE, got {item!r}")
        sources[key.strip()] = value.strip()
    if not logging.getLogger().handlers:
        logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # admission runs the batched Edge TPU check: keep its arrays' pages in the heap (runtime.process)
    tune_allocator()
    space_full_collections()
    timing = {k: v for k, v in (("reconcile_period_s", args.reconcile_period_s),
                                ("drain_grace_s", args.drain_grace_s)) if v is not None}
    for key, low in (("reconcile_period_s", "> 0"), ("drain_grace_s", ">= 0")):
        v = timing.get(key)
        if v is not None and not (math.isfinite(v) and (v > 0 if low == "> 0" else v >= 0)):
            raise InputError("--" + key.replace("_", "-"), f"must be a finite number {low} s, got {v:g}")
    warn_if_open(args, token, "edgemux.controlplane")
    server_options(args.tls_cert, args.tls_key)  # a missing or unusable file: one line, before anything starts
    cp = ControlPlane(args.store, cluster, args.policy, options, gateway_urls=args.gateway, model_sources=sources,
                      adapt=adapt, consolidation=consolidation, wake_s=wake_s, token=token, probe_serving=True,
                      **timing)
    return process.run(_serve(cp, args))


def add_consolidate_options(p: argparse.ArgumentParser) -> None:
    """``--consolidate`` and ``--consolidate-option`` (``edgemux controlplane`` and ``edgemux up``)."""
    p.add_argument("--consolidate", action="store_true",
                   help="switch nodes off at low load and wake them ahead of demand, every SLO kept "
                        "(needs adaptation; docs/adapt.md)")
    p.add_argument("--consolidate-option", action="append", default=[], metavar="NAME=VALUE",
                   help="consolidation setting: switch_off_below, wake_above, min_on or wake_s (one wake-up "
                        "time in s for every node), e.g. wake_s=5 (repeatable; docs/adapt.md)")


CONSOLIDATE_OPTIONS = ("switch_off_below", "wake_above", "min_on", "wake_s")


def consolidate_settings(on: bool, items: list[str], adapt_off: bool) -> tuple[ConsolidationSettings | None,
                                                                             float | None]:
    """Consolidation's settings and the wake-up time for every node (s; None: each node's own) from
    ``--consolidate`` and ``--consolidate-option NAME=VALUE`` items; (None, None) without ``--consolidate``.
    ``InputError`` (one line, exit 2) for an option without ``--consolidate``, ``--consolidate`` with
    ``--no-adapt``, a malformed item, an unknown setting or a value out of range."""
    from edgemux.adapt.consolidate import ConsolidationSettings

    if items and not on:
        raise InputError("--consolidate-option", "given without --consolidate: consolidation is off")
    if not on:
        return None, None
    if adapt_off:
        raise InputError("--consolidate", "needs adaptation (it runs after each adapt step): drop --no-adapt")
    values: dict[str, float | int] = {}
    for item in items:
        key, eq, value = (x.strip() for x in item.partition("="))
        if not eq or not key:
            raise InputError("--consolidate-option", f"expected NAME=VALUE, got {item!r}")
        if key not in CONSOLIDATE_OPTIONS:
            raise InputError("--consolidate-option", f"unknown consolidation setting {key!r}: expected one of "
                             f"{', '.join(CONSOLIDATE_OPTIONS)}")
        try:
            values[key] = int(value) if key == "min_on" else float(value)
        except ValueError:
            kind = "an integer" if key == "min_on" else "a number"
            raise InputError("--consolidate-option", f"{key}: expected {kind}, got {value!r}") from None
    wake_s = values.pop("wake_s", None)
    if wake_s is not None and not (math.isfinite(wake_s) and wake_s >= 0):
        raise InputError("--consolidate-option", f"wake_s: expected a wake-up time >= 0 s, got {wake_s:g}")
    try:
        settings = ConsolidationSettings(**values)  # type: ignore[arg-type]
    except ValueError as e:
        raise InputError("--consolidate-option", str(e)) from None
    return settings, None if wake_s is None else float(wake_s)


def adapt_settings(items: list[str], off: bool) -> AdaptSettings | None:
    """The adapt loop's settings from ``--adapt-option NAME=VALUE`` items; None with ``--no-adapt``.
    ``InputError`` (one line, exit 2) for a malformed item, an unknown setting or a value out of range."""
    options: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise InputError("--adapt-option", f"expected NAME=VALUE, got {item!r}")
        options[key.strip()] = value.strip()
    if off and options:
        raise InputError("--adapt-option", "given with --no-adapt: adaptation is off, its settings do nothing")
    try:
        settings = AdaptSettings().with_options(options)
    except ValueError as e:
        raise InputError("--adapt-option", str(e)) from None
    return None if off else settings


async def _serve(cp: Any, args: argparse.Namespace) -> int:
    from edgemux.runtime.controlplane.api import start_server
    from edgemux.runtime.tls import server_options

    stop = stop_on_signals()
    server = await listen(start_server(cp, args.host, args.port,
                                       ssl_context=server_options(args.tls_cert, args.tls_key)),
                          args.host, args.port)
    print(f"controlplane listening on {server.url}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()
    return 0
