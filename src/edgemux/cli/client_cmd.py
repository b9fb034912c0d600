"""The client verbs of the control plane: ``edgemux apply -f FILE``, ``edgemux get apps|agents|routes|events``,
``edgemux describe app NAME``, ``edgemux delete app NAME``, ``edgemux move app NAME --to
NODE/DEVICE[=WEIGHT][,...]``, ``edgemux rotate-key app NAME``.

Apart from the server's verb (``cli.controlplane_cmd``) so that a client call imports only the API client and
its messages, not the policies and the estimators the server needs (a call is a second less of start-up).
Clients find the control plane with ``--server URL``, else the ``EDGEMUX_SERVER`` environment variable, else
the context ``edgemux up`` wrote, else ``http://127.0.0.1:8470``.

Exit codes: 0 done; 1 an app was rejected (its rejection's message is printed); 2 bad input (a missing or
malformed file, a spec the server refuses, an unknown app, an unreachable server), one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgemux.cli.jsonout import emit
from edgemux.cli.serving import add_token_option
from edgemux.cli.table import fmt_ms, render
from edgemux.cli.views import OUTPUTS, apps_wide_table, devices_table, emit_document, nodes_table, top_screen
from edgemux.cluster.state import Placement
from edgemux.errors import InputError
from edgemux.runtime.controlplane.messages import Event
from edgemux.runtime.controlplane.apiclient import DEFAULT_SERVER, Answer, ControlPlaneClient
from edgemux.runtime.controlplane.context import client_settings
from edgemux.runtime.controlplane.messages import (
    AgentView,
    ApplyAnswer,
    AppView,
    MoveAnswer,
    MoveRequest,
    MoveTarget,
    RouteView,
)
from edgemux.runtime.httputil import quote

CLIENT_TIMEOUT_S = 120.0  # an apply waits for the agents to load models (seconds each)


RESOURCES = ("apps", "nodes", "devices", "agents", "routes", "events")


def watching(parser: argparse.ArgumentParser) -> None:
    """The options of a view that refreshes (``get --watch``, ``top``)."""
    parser.add_argument("-d", "--interval", type=float, default=2.0, metavar="SECONDS",
                        help="seconds between refreshes (default 2)")
    parser.add_argument("-n", "--iterations", type=int, default=0, metavar="N",
                        help="stop after N refreshes (default 0: until Ctrl-C)")


def add_parsers(sub: Any) -> None:
    def client(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--server", default=None,
                            help=f"control plane URL (default $EDGEMUX_SERVER, else the context `edgemux up` wrote, "
                                 f"else {DEFAULT_SERVER})")
        parser.add_argument("--json", action="store_true", help="print the server's JSON answer")
        add_token_option(parser, server=False)

    a = sub.add_parser("apply", help="apply app specs (App, AppList) to the control plane")
    a.add_argument("-f", "--filename", required=True, help="YAML file of App/AppList documents")
    client(a)
    a.set_defaults(func=cmd_apply)
    g = sub.add_parser("get", help="list apps, nodes, devices, agents, routes or events of the control plane")
    g.add_argument("resource", choices=RESOURCES)
    g.add_argument("--app", default=None, help="events: only this app's")
    g.add_argument("-o", "--output", choices=OUTPUTS, default="table",
                   help="table (default), wide (more columns; apps: predicted beside observed latency), json "
                        "(as --json) or yaml")
    g.add_argument("-w", "--watch", action="store_true",
                   help="keep watching: print the table again when it changes (events: each new event)")
    watching(g)
    client(g)
    g.set_defaults(func=cmd_get)
    t = sub.add_parser("top", help="a refreshing view of the devices and apps: utilization and latency, "
                                   "predicted beside observed")
    watching(t)
    t.add_argument("--server", default=None, help="control plane URL (as for get)")
    add_token_option(t, server=False)
    t.set_defaults(func=cmd_top, json=False)
    d = sub.add_parser("describe", help="describe an app: placement, predicted latency, status")
    d.add_argument("resource", choices=("app",))
    d.add_argument("name")
    client(d)
    d.set_defaults(func=cmd_describe)
    x = sub.add_parser("delete", help="delete an app")
    x.add_argument("resource", choices=("app",))
    x.add_argument("name")
    client(x)
    x.set_defaults(func=cmd_delete)
    m = sub.add_parser("move", help="move an app to other devices without dropping a request (make before break)")
    m.add_argument("resource", choices=("app",))
    m.add_argument("name")
    m.add_argument("--to", required=True, metavar="NODE/DEVICE[=WEIGHT],...",
                   help="the new placement: devices, each with its share of the app's rate (default equal "
                        "shares), e.g. node-2/tpu0 or node-1/tpu0=0.7,node-2/tpu0=0.3")
    m.add_argument("--cpu-node", default=None, metavar="NODE", help="node for the app's CPU stage")
    client(m)
    m.set_defaults(func=cmd_move)
    k = sub.add_parser("rotate-key", help="issue a new key for an app (the old one stops working)")
    k.add_argument("resource", choices=("app",))
    k.add_argument("name")
    client(k)
    k.set_defaults(func=cmd_rotate_key)


# ------------------------------------------------------------------------------------------------ client


def _client(args: argparse.Namespace) -> ControlPlaneClient:
    settings = client_settings(args.server, args.token_file)
    return ControlPlaneClient(settings.server, CLIENT_TIMEOUT_S, settings.token, settings.context)


def _fail(answer: Answer, what: str) -> int:
    """Print a server error in one line: exit 1 for a rejection (409 with a rejection), else 2."""
    if answer.status == 409 and isinstance(answer.body, dict) and "rejection" in answer.body:
        print(f"edgemux: {answer.error}", file=sys.stderr)
        return 1
    hint = (" (give the cluster's admin token: --token-file FILE or $EDGEMUX_TOKEN_FILE)"
            if answer.status == 401 else "")
    print(f"edgemux: error: {what}: {answer.error}{hint}", file=sys.stderr)
    return 2


def _shares_text(p: Placement) -> str:
    return ", ".join(f"{s.device} x{s.weight:.3g}" for s in p.shares) or "-"


def cmd_apply(args: argparse.Namespace) -> int:
    path = Path(args.filename)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InputError("-f", f"cannot read {args.filename}: {e.strerror or e}") from None
    answer = _client(args).request("POST", "/v1/apps", data, "application/yaml")
    if args.json:
        emit(answer.body)
    if not (isinstance(answer.body, dict) and isinstance(answer.body.get("results"), list)):
        return _fail(answer, args.filename) if answer.status >= 400 else 0
    applied = ApplyAnswer.from_json(answer.body, answer.status)
    if not args.json:
        rows = []
        for r in applied.results:
            if r.rejection is not None:
                # what broke where the app came closest (a server without headlines: the constraint)
                rows.append([r.app, "rejected", "-", r.rejection.headline or r.rejection.constraint])
            else:
                rows.append([r.app, r.result, r.status or "-",
                             _shares_text(r.placement) if r.placement is not None else "-"])
        print(render(["app", "result", "status", "placement / reason"], rows))
    for r in applied.results:
        if r.key is not None and not args.json:
            print(f"app {r.app} key: {r.key}  (shown once: clients send 'Authorization: Bearer <key>'; "
                  f"edgemux rotate-key app {r.app} issues a new one)")
    for r in applied.rejected:
        assert r.rejection is not None
        print(f"edgemux: {r.rejection.message}", file=sys.stderr)
    return 1 if applied.rejected else 0


_PATHS = {"apps": "/v1/apps", "nodes": "/v1/nodes", "devices": "/v1/devices", "agents": "/v1/agents",
          "routes": "/v1/routes", "events": "/v1/events"}


def _get_path(args: argparse.Namespace) -> str:
    """The API path ``get`` reads: apps in wide output come from the overview (predictions and windows)."""
    if args.app is not None and args.resource != "events":
        raise InputError("--app", f"only filters events, not {args.resource}")
    if args.resource == "apps" and args.output == "wide":
        return "/v1/overview"
    path = _PATHS[args.resource]
    return path + (f"?app={quote(args.app)}" if args.app is not None else "")


def _check_watch(args: argparse.Namespace) -> None:
    if not (args.interval > 0 and args.interval < float("inf")):
        raise InputError("--interval", f"must be a number of seconds > 0, got {args.interval:g}")
    if args.iterations < 0:
        raise InputError("--iterations", f"must be >= 0, got {args.iterations}")


def _refresh(args: argparse.Namespace, client: ControlPlaneClient, what: str, path: Callable[[], str],
             show: Callable[[dict[str, Any]], None], *, once: bool = False) -> int:
    """GET ``path()`` and ``show`` its answer every ``--interval`` seconds until ``--iterations`` answers
    were shown, or Ctrl-C (exit 0); ``once``: just one. A refused or failed call is ``_fail``'s one line."""
    n = 0
    try:
        while True:
            answer = client.request("GET", path())
            if answer.status >= 400 or not isinstance(answer.body, dict):
                return _fail(answer, what)
            show(answer.body)
            n += 1
            if once or n == args.iterations:
                return 0
            time.sleep(args.interval)
    except KeyboardInterrupt:  # the end of a watch
        return 0


def cmd_get(args: argparse.Namespace) -> int:
    """``edgemux get RESOURCE``: one table (or document) of the control plane's; ``--watch`` keeps it up to date
    (events: new ones as they come), every ``--interval`` seconds, until Ctrl-C or ``--iterations``."""
    if args.json:
        args.output = "json"
    path = _get_path(args)
    _check_watch(args)
    client = _client(args)
    what = f"get {args.resource}"
    if args.watch and args.resource == "events":
        return _watch_events(args, client, path)
    last: list[Any] = [None]  # what was shown last: shown again only when it changed

    def show(body: dict[str, Any]) -> None:
        if args.output in ("json", "yaml"):
            if body != last[0]:
                emit_document(body, args.output, stream=args.watch)
            last[0] = body
            return
        text = _table(args.resource, args.output == "wide", body)
        if text != last[0]:
            print(("\n" if last[0] is not None else "") + text, flush=True)
        last[0] = text

    return _refresh(args, client, what, lambda: path, show, once=not args.watch)


def _watch_events(args: argparse.Namespace, client: ControlPlaneClient, path: str) -> int:
    """``get events --watch``: every event so far, then each new one as it comes (JSON/YAML: one document
    per event)."""
    since, header = [0], [args.output in ("table", "wide")]
    sep = "&" if "?" in path else "?"

    def show(body: dict[str, Any]) -> None:
        for e in (Event.from_json(x) for x in body.get("events", [])):
            if args.output in ("json", "yaml"):
                emit_document(e.to_json(), args.output, stream=True)
            else:
                table = _events_table([e]).splitlines()
                print("\n".join(table if header[0] else table[2:]), flush=True)
                header[0] = False
            since[0] = max(since[0], e.seq)

    return _refresh(args, client, "get events", lambda: f"{path}{sep}since={since[0]}", show)


def _events_table(events: list[Event]) -> str:
    return render(["seq", "time", "kind", "app", "message"],
                  [[e.seq, time.strftime("%H:%M:%S", time.localtime(e.time_s)), e.kind, e.app or "-", e.message]
                   for e in events])


def _table(resource: str, wide: bool, b: dict[str, Any]) -> str:
    """The text ``get`` prints for ``resource`` from the server's answer ``b``."""
    if resource == "apps" and wide:
        return apps_wide_table(b.get("apps", []))
    if resource == "apps":
        apps = [AppView.from_json(a) for a in b.get("apps", [])]
        return render(["name", "model", "rate", "slo", "status", "placement"],
                      [[a.name, a.model, f"{a.rate_rps:g}{' fps' if a.periodic else ' rps'}",
                        f"{a.slo_stat} {a.slo_ms:g} ms", a.status, _shares_text(a.placement)] for a in apps])
    if resource == "nodes":
        return nodes_table(b.get("nodes", []), wide)
    if resource == "devices":
        return devices_table(b.get("devices", []), wide)
    if resource == "agents":
        agents = [AgentView.from_json(a) for a in b.get("agents", [])]
        power = b.get("power")
        if isinstance(power, dict):  # consolidation on: each node's power state
            return render(["node", "url", "ready", "power", "heartbeat age (s)", "runs on", "apps"],
                          [[a.node, a.url, "yes" if a.ready else "no", _power_text(power.get(a.node)),
                            f"{a.last_heartbeat_age_s:.1f}", a.runs_on or "-", ", ".join(a.apps) or "-"]
                           for a in agents]
                          + [[n, "-", "no", _power_text(power.get(n)), "-", "-", "(not registered)"]
                             for n in b.get("unregistered_nodes", [])])
        return render(["node", "url", "ready", "heartbeat age (s)", "runs on", "apps"],
                      [[a.node, a.url, "yes" if a.ready else "no", f"{a.last_heartbeat_age_s:.1f}",
                        a.runs_on or "-", ", ".join(a.apps) or "-"] for a in agents]
                      + [[n, "-", "no", "-", "-", "(not registered)"] for n in b.get("unregistered_nodes", [])])
    if resource == "events":
        events = [Event.from_json(e) for e in b.get("events", [])]
        off = "" if b.get("adapt", True) else "adaptation is off (edgemux controlplane --no-adapt)\n"
        return off + _events_table(events)
    routes = [RouteView.from_json(r) for r in b.get("routes", [])]
    return render(["app", "endpoints", "rate (rps)", "burst", "pending"],
                  [[r.app, ", ".join(f"{e.url} x{e.weight:.3g}" for e in r.endpoints) or "-",
                    f"{r.rate_rps:g}", f"{r.burst:g}", len(r.pending)] for r in routes])


def cmd_top(args: argparse.Namespace) -> int:
    """``edgemux top``: the overview's devices and apps every ``--interval`` seconds (on a terminal the screen
    is redrawn in place; in a pipe each screen follows the last), until Ctrl-C or ``--iterations``."""
    _check_watch(args)
    clear = sys.stdout.isatty()
    shown = [0]

    def show(body: dict[str, Any]) -> None:
        print(("\x1b[H\x1b[2J" if clear else ("\n" if shown[0] else "")) + top_screen(body), flush=True)
        shown[0] += 1

    return _refresh(args, _client(args), "top", lambda: "/v1/overview", show)


def cmd_describe(args: argparse.Namespace) -> int:
    answer = _client(args).request("GET", f"/v1/apps/{quote(args.name)}")
    if answer.status >= 400:
        return _fail(answer, f"describe app {args.name}")
    if args.json:
        emit(answer.body)
        return 0
    d = answer.body
    spec = d["spec"]["spec"]
    rate = f"{spec['fps']:g} fps" if "fps" in spec else f"{spec['rate']:g} rps"
    print(f"app {d['name']}: model {spec['model']}, {rate}, burst {spec['burst']:g}, "
          f"SLO {d['slo']['stat']} <= {d['slo']['latency_ms']:g} ms, status {d['status']}")
    contract = d.get("contract") or {}
    if contract and contract["rate_rps"] != contract["declared_rps"]:
        print(f"contract: {contract['rate_rps']:.4g} req/s in force, set by adaptation (declared "
              f"{contract['declared_rps']:.4g} req/s; it is lowered back towards that when the load falls)")
    print(f"reason: {d['reason']}")
    seen = d.get("observed")
    if seen and seen.get("arrivals"):  # a window in which the app sent nothing has arrivals 0
        print(f"observed (last {seen['window_s']:g} s window): {seen['rate_rps']:g} req/s (contract "
              f"{spec.get('rate', spec.get('fps', 0)):g}), {seen['answered']} answered, {seen['refused']} refused, "
              f"{seen['failed']} failed; mean {fmt_ms(seen['mean_ms'])} ms, {d['slo']['stat']} "
              f"{fmt_ms(seen['at_slo_stat_ms'])} ms")
    else:
        print("observed: no requests in the last window")
    rows = []
    for p in d["placement"]["pieces"]:
        pred = p["predicted"]
        emulated = {True: "emulated", False: "real", None: "unknown"}[p["emulated"]]
        rows.append([p["device"], p["kind"], f"{p['weight']:.3g}", p["profile"],
                     p["model_source"] + (f" (stand-in {p['stand_in']})" if p["stand_in"] else ""), emulated,
                     fmt_ms(pred.get("mean_ms")), fmt_ms(pred.get("at_slo_stat_ms")), p["status"]])
    print(render(["device", "kind", "weight", "profile", "model source", "backend", "predicted mean ms",
                  f"predicted {d['slo']['stat']} ms", "status"], rows))
    for p in d["placement"]["pieces"]:
        if p.get("profile_provenance", "").startswith(("calibrated", "fitted")):  # measured or fitted: the catalog's beside it
            print(f"{p['device']}: profile {p['profile']} {p['profile_provenance']}")
    for p in d["placement"]["pieces"]:
        if p.get("error"):
            print(f"{p['device']}: {p['error']}")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    answer = _client(args).request("DELETE", f"/v1/apps/{quote(args.name)}")
    if answer.status >= 400:
        return _fail(answer, f"delete app {args.name}")
    if args.json:
        emit(answer.body)
    else:
        print(f"app {args.name} deleted")
    return 0


def parse_move_target(text: str) -> tuple[MoveTarget, ...]:
    """``NODE/DEVICE[=WEIGHT],...`` as the move request's targets; ``InputError`` naming the bad part."""
    out: list[MoveTarget] = []
    for part in text.split(","):
        device, eq, weight = part.strip().partition("=")
        if "/" not in device or not device.split("/", 1)[0] or not device.split("/", 1)[1]:
            raise InputError("--to", f"expected NODE/DEVICE[=WEIGHT], got {part.strip()!r}")
        w: float | None = None
        if eq:
            try:
                w = float(weight)
            except ValueError:
                raise InputError("--to", f"weight of {device} must be a number, got {weight!r}") from None
        out.append(MoveTarget(device, w))
    return tuple(out)


def cmd_move(args: argparse.Namespace) -> int:
    request = MoveRequest(parse_move_target(args.to), args.cpu_node)
    answer = _client(args).request("POST", f"/v1/apps/{quote(args.name)}/move",
                                   json.dumps(request.to_json()).encode("utf-8"))
    if answer.status >= 400:
        return _fail(answer, f"move app {args.name}")
    if args.json:
        emit(answer.body)
        return 0
    moved = MoveAnswer.from_json(answer.body)
    if moved.result == "unchanged":
        print(f"app {args.name} already runs at {_shares_text(moved.new)}")
    else:
        steps = ", ".join(f"{k.removesuffix('_s')} {v:.2f} s" for k, v in moved.steps_s.items())
        print(f"app {args.name} moved: {_shares_text(moved.old)} -> {_shares_text(moved.new)} ({steps})")
    return 0


def cmd_rotate_key(args: argparse.Namespace) -> int:
    answer = _client(args).request("POST", f"/v1/apps/{quote(args.name)}/key")
    if answer.status >= 400 or not isinstance(answer.body, dict):
        return _fail(answer, f"rotate the key of app {args.name}")
    if args.json:
        emit(answer.body)
    else:
        print(f"app {args.name} key: {answer.body.get('key')}  (shown once; the old key no longer works)")
    return 0


def _power_text(entry: Any) -> str:
    """A node's power state for ``get agents``: the state, and for a waking node when it serves."""
    if not isinstance(entry, dict):
        return "-"
    state = str(entry.get("state", "-"))
    ready = entry.get("ready_in_s")
    return f"{state} (serves in {ready:.0f} s)" if isinstance(ready, (int, float)) else state
