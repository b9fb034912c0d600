"""Checking a move: may an admitted app run at a placement someone asks for (an operator's ``edgemux move``, an
adaptation plan) with every tenant on the devices it touches still within its SLO?

The answer is the policy's own: each share is the app at ``weight`` x its rate, put through the policy's
``filter`` on the cluster without the app, as the edgemux policy checks the pieces of an app it splits. A
refusal is a :class:`~edgemux.policies.base.Rejection`, the same data an admission's rejection carries.
"""

from __future__ import annotations

from dataclasses import replace

from edgemux.cluster.disciplines import traits
from edgemux.cluster.state import App, Device, Placement, Share
from edgemux.cluster.workload import shares_used
from edgemux.perf.device import predict_device
from edgemux.perf.dutycycle import EPS
from edgemux.policies.base import (
    Policy,
    Rejection,
    Snapshot,
    device_spec,
    memory_key,
    model_memory_mb,
    resolve_profile,
    tenant_for,
)
from edgemux.policies.feasibility import slo_value


def share_on(app: App, snapshot: Snapshot, device_path: str, weight: float) -> Share | Rejection:
    """The share of ``app`` on ``device_path`` at ``weight`` (a fraction of the app's rate, in (0, 1]), with
    the profile the catalog resolves for the app on that device's kind; a ``no-profile`` rejection when the
    catalog has none."""
    device = snapshot.cluster.devices[device_path]
    profile = resolve_profile(app, device, snapshot.catalog)
    if profile is None:
        return Rejection(app.name, "no-profile", device=device.path, node=device.node,
                         detail=f"no {device.kind.value} profile of {app.model} in the catalog")
    return Share(device.path, weight, profile.name)


def check_move(policy: Policy, app: App, snapshot: Snapshot, placement: Placement) -> Rejection | None:
    """None when ``app`` may run at ``placement``: every share passes ``policy.filter`` as the app at that
    share's fraction of its rate, on ``snapshot`` without the app (it may hold the app; it is taken out).
    Otherwise the first share's rejection, whose ``device``, ``tenant`` and ``predicted_ms`` say what would
    break."""
    rest = snapshot.without(app.name)
    for share in placement.shares:
        piece = replace(app, rate_rps=app.rate_rps * share.weight)
        device = rest.cluster.devices[share.device]
        if traits(device.discipline).spatial:
            why = check_spatial_share(piece, rest, device, share)
        else:
            why = policy.filter(piece, rest, device)
        if why is not None:
            return why
    return None


def check_spatial_share(piece: App, rest: Snapshot, device: Device, share: Share) -> Rejection | None:
    """None when ``piece`` (the app at its share's rate) may run on the spatial ``device`` with exactly the
    share's ``instances`` of ``fraction`` each: they fit in what the other tenants leave free, the model's
    instances fit in device memory (weights once, runtime memory per instance), and every tenant there,
    the piece included, is predicted within its SLO. The policy's own filter would plan a share and count
    of its own; a move (a re-share, an operator's) asks for these."""
    load = rest.load(device)
    profile = rest.catalog.get(share.profile)
    used = shares_used(load.tenants)
    asked = share.fraction * share.instances
    if used + asked > 1.0 + EPS:
        return Rejection(piece.name, "spatial-share", device=device.path, requested=asked, used=used, capacity=1.0,
                         unit="(share)", detail=f"{share.instances} x {share.fraction:g} of the device")
    one = 0.0 if memory_key(piece, profile) in load.models else model_memory_mb(profile, device, share.instances)
    if load.memory_used_mb + one > device.memory_mb + EPS:
        return Rejection(piece.name, "device-memory", device=device.path, requested=one, used=load.memory_used_mb,
                         capacity=device.memory_mb, unit="MB")
    tenants = [*load.tenants, tenant_for(piece, profile, 1.0, share.fraction, share.instances,
                                          serving_ms=device.serving_ms)]
    owners = {t.name: piece if t.name == piece.name else rest.apps[t.name] for t in tenants}
    # tails only where an SLO reads one: the laws are the costly part of a prediction
    est = predict_device(device_spec(device), tenants,
                         tails=[n for n, o in owners.items() if o.slo.stat in ("p95", "p99")])
    for t in tenants:
        owner = owners[t.name]
        # a p50 SLO is judged on the mean, as admission judges it on a spatial device (spatial_fit)
        value = slo_value(est[t.name], "mean" if owner.slo.stat == "p50" else owner.slo.stat)
        if value is None or not isinstance(value, float) or value > owner.slo.latency_ms:
            shown = None if value is None or not isinstance(value, float) else value
            return Rejection(piece.name, "slo", device=device.path, tenant=t.name, predicted_ms=shown,
                             slo_ms=owner.slo.latency_ms, stat=owner.slo.stat, detail=est[t.name].method)
    return None
