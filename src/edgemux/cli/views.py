"""The cluster's views for the terminal: the tables of ``edgemux get nodes|devices``, ``get apps -o wide`` and
``edgemux top``, made from the control plane's JSON (``GET /v1/nodes``, ``/v1/devices``, ``/v1/overview``;
``runtime.controlplane.overview`` describes the fields), and the output formats every ``get`` shares
(``-o table|wide|json|yaml``).

Pure formatting: no I/O here but the one ``emit`` of a document, so a test feeds it a JSON document and reads
the text. Units: latencies in ms, rates in req/s, utilization as a percentage of the device's time.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from edgemux.cli.jsonout import emit
from edgemux.cli.table import fmt_ms, render

__all__ = ["OUTPUTS", "apps_wide_table", "devices_table", "emit_document", "nodes_table", "top_screen"]

OUTPUTS = ("table", "wide", "json", "yaml")


def emit_document(doc: Any, output: str, stream: bool = False) -> None:
    """Print ``doc`` as JSON or YAML (``output``), nothing else on stdout. ``stream``: one of several
    documents (a watch): JSON on one line (JSON Lines), YAML ended by ``---``."""
    if output == "yaml":
        import yaml  # only here: a table needs no YAML writer

        sys.stdout.write(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False) + ("---\n" if stream else ""))
        sys.stdout.flush()
    else:
        emit(doc, indent=None if stream else 2)


def _pct(x: Any) -> str:
    """A utilization (fraction) as a percentage; '-' unknown, 'unstable' for an unstable queue."""
    if isinstance(x, bool) or x is None:
        return "-"
    if isinstance(x, (int, float)):
        return f"{100 * x:.0f}%"
    return str(x)


def _backend(d: Mapping[str, Any]) -> str:
    emulated = d.get("emulated")
    kind = {True: "emulated", False: "real", None: "?"}.get(emulated, "?")
    backend = d.get("backend")
    return f"{kind} ({backend})" if backend and backend != kind else kind


def _tenants(d: Mapping[str, Any]) -> str:
    return ", ".join(t["app"] + (f" x{t['weight']:.2g}" if t["weight"] != 1 else "") for t in d["tenants"]) or "-"


def nodes_table(nodes: Sequence[Mapping[str, Any]], wide: bool = False) -> str:
    """``get nodes``: per node its agent, power, serving path (ms), devices and apps."""
    headers = ["name", "agent", "power", "serving ms", "devices", "apps"]
    if wide:
        headers += ["serving from", "url", "version", "cpu cores", "memory MB"]
    rows = []
    for n in nodes:
        agent = n.get("agent")
        state = "-" if agent is None else ("ready" if agent["ready"] else "not ready")
        row: list[object] = [n["name"], state, n["power"], fmt_ms(n.get("serving_ms"), 2),
                             ", ".join(d["name"] for d in n["devices"]) or "-", ", ".join(n["apps"]) or "-"]
        if wide:
            row += [n.get("serving_from") or "-", agent["url"] if agent else "-",
                    (agent or {}).get("version") or "-", f"{n['cpu_cores']:g}", f"{n['memory_mb']:g}"]
        rows.append(row)
    return render(headers, rows)


def devices_table(devices: Sequence[Mapping[str, Any]], wide: bool = False) -> str:
    """``get devices``: per device its kind, backend (real or emulated), power, utilization predicted beside
    observed, queue and tenants."""
    headers = ["device", "kind", "backend", "power", "util pred", "util obs", "queue", "tenants"]
    if wide:
        headers += ["discipline", "inflight", "memory MB", "report age s"]
    rows = []
    for d in devices:
        u = d["utilization"]
        q = d.get("queue_depth")
        row: list[object] = [d["path"], d["kind"], _backend(d), d["power"], _pct(u["predicted"]), _pct(u["observed"]),
                             "-" if q is None else q, _tenants(d)]
        if wide:
            age = d.get("reported_age_s")
            row += [d["discipline"], "-" if d.get("inflight") is None else d["inflight"],
                    f"{d['memory_used_mb']:.3g}/{d['memory_mb']:g}", "-" if age is None else f"{age:.1f}"]
        rows.append(row)
    out = render(headers, rows)
    errors = [f"{d['path']}: no prediction: {d['error']}" for d in devices if d.get("error")]
    return "\n".join([out, *errors])


def _verdict(meets: Any) -> str:
    return {True: "yes", False: "NO", None: "-"}.get(meets, "-")


def apps_wide_table(apps: Sequence[Mapping[str, Any]]) -> str:
    """``get apps -o wide`` and ``top``: per app its SLO, predicted beside observed latency at the SLO's
    statistic (end to end, ms), whether each meets it, the rate observed, attainment over the recorded
    windows, status and placement."""
    rows = []
    for a in apps:
        slo, pred, seen = a["slo"], a["predicted"], a.get("observed") or {}
        att = a.get("attainment")
        rows.append([a["name"], a["model"], f"{slo['stat']} {slo['latency_ms']:g}", fmt_ms(pred.get("at_slo_stat_ms")),
                     _verdict(a.get("predicted_meets_slo")), fmt_ms(seen.get("at_slo_stat_ms")),
                     _verdict(a.get("observed_meets_slo")),
                     f"{seen['rate_rps']:.3g}" if seen.get("rate_rps") is not None else "-",
                     "-" if att is None else f"{100 * att:.0f}%", a["status"],
                     ", ".join(f"{p['device']} x{p['weight']:.2g}" for p in a["placement"]) or "-"])
    return render(["name", "model", "slo ms", "predicted", "ok", "observed", "ok", "rate obs", "attained",
                   "status", "placement"], rows)


def top_screen(doc: Mapping[str, Any]) -> str:
    """``edgemux top``: one screen of the overview (``GET /v1/overview``): a header line, devices, apps."""
    import time

    devices = [d for n in doc["nodes"] for d in n["devices"]]
    apps = doc["apps"]
    ready = sum(1 for n in doc["nodes"] if n.get("agent") and n["agent"]["ready"])
    missing = sum(1 for a in apps if a.get("observed_meets_slo") is False)
    window = f", windows of {doc['window_s']:g} s" if doc.get("window_s") else ""
    head = (f"edgemux top - {time.strftime('%H:%M:%S', time.localtime(doc['time_s']))}  "
            f"nodes {ready}/{len(doc['nodes'])} ready  devices {len(devices)}  apps {len(apps)} "
            f"({missing} missing their SLO)  policy {doc['policy']}  adaptation {'on' if doc['adapt'] else 'off'}"
            f"{window}")
    return "\n".join([head, "", devices_table(devices), "", apps_wide_table(apps) if apps else "no apps"])
