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
    check_device_memory,
    check_node,
    check_profile,
    register,
)


@register("knapsack")
class Knapsack(Policy):
    def filter(self, app: App, snapshot: Snapshot, device: Device) -> Rejection | None:
        profile = check_profile(app, snapshot, device)
        if isinstance(profile, Rejection):
            return profile
        return check_node(app, snapshot, device) or check_device_memory(app, profile, snapshot.load(device))

    def first_fit(self) -> bool:
        return True
