"""What the control plane shows of an app (``GET /v1/apps``, ``GET /v1/apps/{name}``): read from the managers
that own each part (the targets and actuals, the routes, the move under way, the last closed window, the
profiles in force), changing nothing.

Units: ``*_ms`` milliseconds, ``*_rps`` requests/s, ``*_s`` seconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgemux.cluster.specs import app_to_dict
from edgemux.profiles.catalog import Catalog
from edgemux.profiles.types import DeviceKind
from edgemux.runtime.controlplane.common import num
from edgemux.runtime.controlplane.messages import AppView
from edgemux.runtime.controlplane.overview import device_predictions, observed_view
from edgemux.runtime.controlplane.pieces import Piece

if TYPE_CHECKING:
    from edgemux.runtime.controlplane.service import ControlPlane

__all__ = ["describe_app", "list_apps"]


def list_apps(cp: ControlPlane) -> list[dict[str, Any]]:
    """``GET /v1/apps``: every app (admission order) with its status and shares."""
    out = []
    targets = cp.reconciler
    for name, a in targets.apps.items():
        out.append(AppView(name, a.model, a.rate_rps, a.periodic, a.burst, a.slo.latency_ms, a.slo.stat,
                           targets.status(name), targets.placements[name]).to_json())
    return out


def describe_app(cp: ControlPlane, name: str) -> dict[str, Any]:
    """``GET /v1/apps/{name}``: spec, placement with predictions and load status, reason, status;
    ``ControlPlaneError`` 404 for an unknown app."""
    targets = cp.reconciler
    a = targets.app(name)
    catalog = cp.catalog
    snap = cp.snapshot()
    preds = device_predictions(cp, snap)  # one estimator call per device, shared with the overview
    pieces = []
    nodes = {n.node: n for n in targets.state(name)}
    for piece, share in zip(targets.pieces(name), targets.placements[name].shares):
        dev = cp.cluster.devices[piece.device_path]
        emulated, known = _emulated(cp, piece)
        pred: dict[str, Any]
        p = preds[piece.device_path]
        est = p.tenants.get(name)
        if est is None:  # the estimator could not say: report it, never fail describe
            pred = {"error": p.error or "no estimate"}
        else:
            at_stat = {"mean": est.mean_ms, "p50": est.p50_ms, "p95": est.p95_ms, "p99": est.p99_ms}.get(a.slo.stat)
            serving = cp.adaptation.serving.get(piece.node)
            pred = {"mean_ms": num(est.mean_ms), "p50_ms": num(est.p50_ms), "p95_ms": num(est.p95_ms),
                    "p99_ms": num(est.p99_ms),
                    "device_ms": num(est.device_ms), "serving_ms": num(dev.serving_ms),
                    "serving_from": serving.provenance() if serving is not None else None,
                    "utilization": num(est.rho), "method": est.method, "at_slo_stat_ms": num(at_stat)}
        node = nodes[piece.node]
        pieces.append({
            "device": piece.device_path, "node": piece.node, "kind": dev.kind.value,
            "discipline": dev.discipline.value, "weight": share.weight, "profile": share.profile,
            "fraction": share.fraction, "instances": share.instances,
            "profile_provenance": _profile_provenance(catalog, share.profile),
            "model_source": piece.model, "stand_in": piece.stand_in, "emulated": emulated,
            "emulated_known_from": known, "predicted": pred,
            "agent": node.url,
            "status": "loaded" if node.loaded else "pending",
            "error": node.error,
        })
    return {"name": name, "spec": app_to_dict(a), "status": targets.status(name),
            "contract": {"rate_rps": a.rate_rps, "declared_rps": targets.declared.get(name, a.rate_rps)},
            "slo": {"latency_ms": a.slo.latency_ms, "stat": a.slo.stat},
            "observed": observed_view(cp, name),
            "placement": {"cpu_node": targets.placements[name].cpu_node, "pieces": pieces},
            "reason": _reason(cp, name), "route": cp.routes.route(name).to_json(),
            # the tensors every variant is served through, learned from the first one (None until it reports)
            "interface": cp.reconciler.interfaces.get(name),
            "transition": cp.transitions.phase(name)}


def _emulated(cp: ControlPlane, piece: Piece) -> tuple[bool | None, str]:
    """Whether the piece's device is emulated, and how that is known (its agent, or the kind's default)."""
    agent = cp.reconciler.agents.get(piece.node)
    if agent is not None:
        d = agent.devices.get(piece.device)
        if d is not None and isinstance(d.get("emulated"), bool):
            return d["emulated"], "agent"
    kind = cp.cluster.devices[piece.device_path].kind
    if kind is DeviceKind.CPU:
        return False, "default for kind cpu (onnxruntime)"
    if kind is DeviceKind.GPU_DISCRETE:
        return None, "unknown until its agent registers (CUDA if available, else emulated)"
    return True, f"default for kind {kind.value}"


def _reason(cp: ControlPlane, app: str) -> str:
    """Why the app is where it is, in the policy's terms."""
    p = cp.reconciler.placements[app]
    if len(p.shares) == 1:
        return (f"policy {cp.policy_name}: the whole app fits on {p.shares[0].device} with every tenant "
                f"there within its SLO")
    return (f"policy {cp.policy_name}: no single device could take the whole app, so it is partitioned "
            f"over {len(p.shares)} devices, each piece the rate share that device can take with every "
            f"tenant within its SLO")


def _profile_provenance(catalog: Catalog, name: str) -> str | None:
    """Where a profile's figures come from (the catalog's source, or ``calibrated, ...``)."""
    prof = catalog.profiles.get(name)
    return str(prof.provenance) if prof is not None else None
