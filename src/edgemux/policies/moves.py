"""Checking a move: may an admitted app run at a placement someone asks for (an operator's ``edgemux move``, an
adaptation plan) with every tenant on the devices it touches still within its SLO?

The answer is the policy's own: each share is the app at ``weight`` x its rate, put through the policy's
``filter`` on the cluster without the app, as the edgemux policy checks the pieces of an app it splits. A
refusal is a :class:`~edgemux.policies.base.Rejection`, the same data an admission's rejection carries.
"""

from __future__ import annotations

from dataclasses import replace

from edgemux.cluster.state import App, Placement, Share
from edgemux.policies.base import Policy, Rejection, Snapshot, resolve_profile


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
        why = policy.filter(piece, rest, rest.cluster.devices[share.device])
        if why is not None:
            return why
    return None
