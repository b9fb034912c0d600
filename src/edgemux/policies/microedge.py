"""``microedge``: MicroEdge Algorithm 1, First-Fit TPU admission control (Cao et al., paper 003, §4.2-4.3).

Only Edge TPUs are candidates. An app needs ``units = exec ms x fps / 1000`` TPU units (§4.1). A TPU takes it
when

- TPU Units Rule (Eq. 2): the units already assigned there plus the app's stay <= 1;
- Model Size Rule (Eq. 3): the app's model is already loaded there, or its on-chip parameter data fits in
  the TPU's free parameter memory (``Device.memory_mb``, 6.9 MB of 8 MB on a Coral TPU), so it can be
  co-compiled with the models there and no model switch is paid.

Without partitioning the first TPU that takes the app whole wins. With ``partitioning=True``
(AdmissionControlWithWorkloadPartitioning) an app no single TPU can take is split: walking TPUs in order,
each TPU whose memory admits the model gives ``min(remaining units, 1 - load)``; the app is admitted when
the pieces cover its units, with share weights = each piece's fraction of its units (the client's weighted
round robin). Latency is not checked: MicroEdge counts only frame rate.

Model identity: MicroEdge's TPU Service loads each model once per TPU, so "model in TPU" compares profiles,
whichever apps loaded them.

Without co-compiling (``co_compiling=False``, the "without co-compiling" configurations of §6.3 / Fig. 6):
a TPU holds one compiled model at a time, so a TPU only ever hosts apps of one model. The TPU Units Rule is
unchanged; in place of the Model Size Rule's "fits beside the models there" a TPU takes the app only when it
is empty or every app on it runs the same model (constraint ``"single-model"``; requested 1 model, used =
distinct models loaded there, capacity 1), and the model alone must still fit the parameter memory
(``"model-size"``, as with co-compiling on an empty TPU). With partitioning the same rule picks the TPUs a
camera's pieces may go to. So co-compiling on never admits fewer apps on a given snapshot than off.

Why this reading and not "models share a TPU and every switch is paid in the TPU units":

- §4.1 defines an app's TPU units once, at submission, from an offline profile ("including model switching
  time"); Algorithm 1 compares that fixed number with ``1 - CurrentLoad`` and has no term that re-prices
  units by the other models on a TPU, which a swap-cost reading would need;
- §4.2 states the Model Size Rule's purpose as avoiding model swapping "when consecutive Invoke calls routed
  to a given TPU request different models", i.e. multi-model TPUs are the thing co-compiling enables;
- §6.3 explains Fig. 6b by "co-compiling allows a single TPU to host multiple models which in turn cater to
  the inference requests from multiple cameras": without it a TPU caters to one model's cameras;
- the ``microedge`` catalog has ``switch_ms = 0`` (switching is folded into the units) and no parameter
  sizes, so a swap-cost accounting would have no data to price switches with.
"""

from __future__ import annotations

from edgemux.cluster.state import App, Device, Placement, Share
from edgemux.perf.dutycycle import EPS
from edgemux.policies.base import (
    Decision,
    DeviceLoad,
    Policy,
    Rejection,
    Snapshot,
    app_units,
    check_node,
    check_profile,
    model_memory_mb,
    summarize,
)
from edgemux.policies.registry import register
from edgemux.profiles.types import DeviceKind, Profile


@register("microedge")
class MicroEdge(Policy):
    def __init__(self, partitioning: bool = False, co_compiling: bool = True) -> None:
        self.partitioning = partitioning
        self.co_compiling = co_compiling

    def candidates(self, app: App, snapshot: Snapshot) -> list[Device]:
        return [d for d in snapshot.cluster.devices.values() if d.kind is DeviceKind.EDGETPU]

    def first_fit(self) -> bool:
        return True

    def _model_fits(self, app: App, profile: Profile, load: DeviceLoad) -> Rejection | None:
        """Model Size Rule (Eq. 3); without co-compiling, first the one-model-per-TPU rule."""
        if not self.co_compiling and load.profiles and load.profiles != {profile.name}:
            # without co-compiling a TPU holds one compiled model: only apps of that model may join
            loaded = sorted(load.profiles)
            return Rejection(app.name, "single-model", device=load.device.path, requested=1.0,
                             used=float(len(loaded)), capacity=1.0, unit="models",
                             detail=f"without co-compiling the TPU holds one model; {', '.join(loaded)} "
                                    f"is loaded there, the app needs {profile.name}")
        if profile.name in load.profiles:
            return None
        need = model_memory_mb(profile, load.device)
        if load.profiles_memory_mb + need > load.device.memory_mb + EPS:
            return Rejection(app.name, "model-size", device=load.device.path, requested=need,
                             used=load.profiles_memory_mb, capacity=load.device.memory_mb, unit="MB",
                             detail="co-compiled parameter data would exceed the TPU's parameter memory")
        return None

    def filter(self, app: App, snapshot: Snapshot, device: Device) -> Rejection | None:
        profile = check_profile(app, snapshot, device)
        if isinstance(profile, Rejection):
            return profile
        load = snapshot.load(device)
        units = app_units(profile, app.rate_rps)
        if load.units_used + units > 1.0 + EPS:
            return Rejection(app.name, "tpu-units", device=device.path, requested=units,
                             used=load.units_used, capacity=1.0, unit="TPU units")
        return self._model_fits(app, profile, load) or check_node(app, snapshot, device)

    def post_filter(self, app: App, snapshot: Snapshot, rejection: Rejection) -> Decision:
        """With ``partitioning``: the app split over TPUs by their free units (workload partitioning)."""
        if not self.partitioning:
            return rejection
        return self._partition(app, snapshot, rejection)

    def _partition(self, app: App, snapshot: Snapshot, whole: Rejection) -> Decision:
        pieces: list[tuple[Device, str, float]] = []
        remaining: float | None = None
        total: float | None = None
        rejections: list[Rejection] = []
        for device in self.candidates(app, snapshot):
            profile = check_profile(app, snapshot, device)
            if isinstance(profile, Rejection):
                rejections.append(profile)
                continue
            if total is None:
                total = remaining = app_units(profile, app.rate_rps)
                if not pieces and (why := check_node(app, snapshot, device)) is not None:
                    return why
            assert remaining is not None  # set with total, on the first device with a profile
            load = snapshot.load(device)
            why = self._model_fits(app, profile, load)
            if why is not None:
                rejections.append(why)
                continue
            wp = min(remaining, 1.0 - load.units_used)
            if wp > EPS:
                pieces.append((device, profile.name, wp))
                remaining -= wp
            else:
                rejections.append(Rejection(app.name, "tpu-units", device=device.path, requested=remaining,
                                            used=load.units_used, capacity=1.0, unit="TPU units"))
            if remaining <= EPS:
                break
        if total is None or remaining is None or remaining > EPS or not pieces:
            if total is not None and pieces:
                free = total - (remaining or 0.0)
                tpus = self.candidates(app, snapshot)
                used = sum(snapshot.load(d).units_used for d in tpus)
                return Rejection(app.name, "tpu-units", requested=total, used=used, capacity=float(len(tpus)),
                                 unit="TPU units", detail=f"partitioned over every TPU whose memory admits "
                                 f"the model: {free:.4g} of {total:.4g} units free")
            return summarize(app, rejections) if rejections else whole
        covered = total - remaining
        weights = [wp / covered for _, _, wp in pieces]
        weights[-1] = 1.0 - sum(weights[:-1])
        shares = tuple(Share(d.path, w, prof) for (d, prof, _), w in zip(pieces, weights))
        return Placement(app.name, shares, cpu_node=pieces[0][0].node)
