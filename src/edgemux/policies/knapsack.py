"""``knapsack``: the papers' latency-oblivious baseline (Ibis §4, "traditional knapsack placement").

Resources are treated as additive: an app fits a device when its CPU stage fits the node's free cores, its
host memory the node's free memory, and its model copy the device's free memory. First fit in cluster
order. Latency is never looked at, so co-located tenants may break their SLOs.
"""

from __future__ import annotations

from edgemux.cluster.state import App, Device
from edgemux.policies.base import (
    Policy,
    Rejection,
    Snapshot,
    fit_resources,
)
from edgemux.policies.registry import register


@register("knapsack")
class Knapsack(Policy):
    def filter(self, app: App, snapshot: Snapshot, device: Device) -> Rejection | None:
        fit = fit_resources(app, snapshot, device)
        return fit if isinstance(fit, Rejection) else None

    def first_fit(self) -> bool:
        return True
