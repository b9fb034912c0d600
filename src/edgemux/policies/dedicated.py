"""``dedicated``: whole devices per app (MicroEdge's baseline, §1 and §6.2).

An Edge TPU app gets ``ceil(units)`` empty TPUs (units = exec ms x fps / 1000, ``perf.dutycycle``), its
requests split evenly over them; an app on any other kind gets one empty device. Devices are taken first
fit in cluster order; the app's CPU stage runs on the first device's node.
"""

from __future__ import annotations

from edgemux.cluster.state import App, Device, Placement, Share
from edgemux.perf.dutycycle import dedicated_tpus
from edgemux.policies.base import (
    Decision,
    Policy,
    Rejection,
    Snapshot,
    app_units,
    check_device_memory,
    check_node,
    check_profile,
    summarize,
)
from edgemux.policies.registry import register
from edgemux.profiles.types import DeviceKind


@register("dedicated")
class Dedicated(Policy):
    def filter(self, app: App, snapshot: Snapshot, device: Device) -> Rejection | None:
        profile = check_profile(app, snapshot, device)
        if isinstance(profile, Rejection):
            return profile
        load = snapshot.load(device)
        if not load.empty:
            return Rejection(app.name, "occupied", device=device.path,
                             detail=f"dedicated to {', '.join(load.apps)}")
        return check_device_memory(app, profile, load)

    def devices_needed(self, app: App, snapshot: Snapshot, device: Device) -> int:
        if device.kind is not DeviceKind.EDGETPU:
            return 1
        profile = check_profile(app, snapshot, device)
        assert not isinstance(profile, Rejection)
        return dedicated_tpus(app_units(profile, app.rate_rps))

    def place(self, app: App, snapshot: Snapshot) -> Decision:
        """The app on ``devices_needed`` empty devices of one kind (the first that passes decides the kind)."""
        rejections: list[Rejection] = []
        chosen: list[Device] = []
        need = 0
        for device in self.candidates(app, snapshot):
            if chosen and device.kind is not chosen[0].kind:
                continue
            why = self.filter(app, snapshot, device) or (None if chosen else check_node(app, snapshot, device))
            if why is not None:
                rejections.append(why)
                continue
            if not chosen:
                need = self.devices_needed(app, snapshot, device)
            chosen.append(device)
            if len(chosen) == need:
                break
        if not chosen:
            return summarize(app, rejections)
        if len(chosen) < need:
            return Rejection(app.name, "devices", device=chosen[0].path, requested=need,
                             used=None, capacity=len(chosen), unit="empty TPUs",
                             detail=f"needs ceil(units) = {need} empty TPUs, {len(chosen)} free")
        profile = check_profile(app, snapshot, chosen[0])
        assert not isinstance(profile, Rejection)
        w = 1.0 / need
        shares = tuple(Share(d.path, w if i < need - 1 else 1.0 - w * (need - 1), profile.name)
                       for i, d in enumerate(chosen))
        return Placement(app.name, shares, cpu_node=chosen[0].node)
