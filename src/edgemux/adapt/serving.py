"""The serving path: what a request spends between the client and the device's queue, per node, learned from
what the gateways and the agents observed.

The estimators predict a device's queueing and service. A client waits longer: the gateway parses and
polices the request, forwards it, the agent decodes it and encodes the answer, and the answer travels back.
That serving path is the same for every app served by one node's agent whatever the device, and the
estimators carry it as a constant delay per node (``Device.serving_ms``, added to each tenant's network time
by ``policies.base.tenant_for``), so admission, ``describe`` and ``load`` predict end to end.

Measured, per window, from two observations of the same requests: the app's end-to-end latency where it
entered the cluster (the gateway's window, ``adapt.monitor.AppWindow``) and the time its requests spent in
the device's queue and service as the agent timed them (:class:`DeviceTime`). Their difference of means,
less the mean policing wait (``AppWindow.waited_ms``: a request over its contract waits for its token, the
app's doing, not the path's), is the app's serving path in that window; a node's is the answer-weighted mean over the apps placed only on
its devices (an app split over nodes mixes their paths; an app with a CPU stage has the stage's time in the
difference: both are left out).

Measured at start-up: a node whose spec declares no figure (``servingMs`` 0, the default) takes the round
trip of a request that does nothing on its agent (``AgentDriver.probe_ms``: the least of a few health
checks 50 ms apart, timed by the control plane when the agent registers) until its requests say more.

Calibrated, per node, as a weighted mean that forgets (:class:`ServingPath`): the declared or probed figure
counts as ``PRIOR_ANSWERS`` answers, each window's answers
count as themselves, and what was counted before weighs ``DECAY`` per window. A node whose path drifts
(a busier host, a slower link) is followed within a few windows; a handful of answers barely moves a
declared figure.

Pure: windows and device times in, estimates out. Units: ms, counts of answers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the messages that carry DeviceTime stay free of the estimators (a client verb's import)
    from edgemux.adapt.monitor import AppWindow
    from edgemux.policies.base import Snapshot

__all__ = ["DECAY", "PRIOR_ANSWERS", "DeviceTime", "ServingPath", "node_samples", "update_serving"]

PRIOR_ANSWERS = 20.0  # the declared figure weighs as much as this many observed answers
DECAY = 0.5           # the weight left to what was counted before, per window (a window's answers decide)


@dataclass(frozen=True)
class DeviceTime:
    """What an agent's devices spent on one app's requests, cumulative: ``count`` answered and the sum of
    their queueing + service (``total_ms``, ms)."""

    count: int = 0
    total_ms: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 0:
            raise ValueError(f"count must be an integer >= 0, got {self.count!r}")
        if not (math.isfinite(self.total_ms) and self.total_ms >= 0):
            raise ValueError(f"total_ms must be a finite number >= 0, got {self.total_ms!r}")

    def merge(self, other: DeviceTime) -> DeviceTime:
        return DeviceTime(self.count + other.count, self.total_ms + other.total_ms)

    def minus(self, earlier: DeviceTime) -> DeviceTime:
        """The counts since ``earlier``; ``ValueError`` when the count went down (the process restarted)."""
        if self.count < earlier.count:
            raise ValueError(f"count went down ({earlier.count} -> {self.count})")
        return DeviceTime(self.count - earlier.count, max(self.total_ms - earlier.total_ms, 0.0))

    @property
    def mean_ms(self) -> float | None:
        return self.total_ms / self.count if self.count else None

    def to_json(self) -> list[float]:
        """``[count, total_ms]``: what an agent reports."""
        return [self.count, self.total_ms]

    @classmethod
    def from_json(cls, data: object) -> DeviceTime:
        """The inverse of ``to_json``; ``ValueError`` naming what is malformed."""
        if not (isinstance(data, list) and len(data) == 2 and all(isinstance(x, (int, float))
                                                                  and not isinstance(x, bool) for x in data)):
            raise ValueError(f"expected [count, total_ms], got {data!r}")
        count, total = data
        if count != int(count):
            raise ValueError(f"count must be a whole number, got {count!r}")
        return cls(int(count), float(total))


@dataclass(frozen=True)
class ServingPath:
    """One node's serving path (ms): the declared figure ``prior_ms`` and the decayed sums of the observed
    answers (``answers``) and of their serving times (``total_ms``); :attr:`ms` is the estimate."""

    prior_ms: float = 0.0
    answers: float = 0.0
    total_ms: float = 0.0
    windows: int = 0
    source: str = "declared"  # of the prior: "declared" (the spec's servingMs) or "probe" (start-up)

    @property
    def ms(self) -> float:
        """The estimate: the prior and the observations, weighted by answers (ms, >= 0)."""
        return max(0.0, (PRIOR_ANSWERS * self.prior_ms + self.total_ms) / (PRIOR_ANSWERS + self.answers))

    def observe(self, answers: int, total_ms: float) -> ServingPath:
        """After one window in which ``answers`` answers spent ``total_ms`` (ms) on the serving path."""
        return ServingPath(self.prior_ms, DECAY * self.answers + answers, DECAY * self.total_ms + total_ms,
                           self.windows + 1, self.source)

    def probed(self, probe_ms: float) -> ServingPath:
        """With a start-up probe's round trip (ms) as the prior, unless a figure was declared (> 0)."""
        if self.source == "declared" and self.prior_ms > 0:
            return self
        return ServingPath(probe_ms, self.answers, self.total_ms, self.windows, "probe")

    def provenance(self) -> str:
        """Where the estimate comes from, in words."""
        prior = (f"start-up probe {self.prior_ms:.3g} ms (an idle request's round trip)" if self.source == "probe"
                 else f"declared {self.prior_ms:.3g} ms (servingMs)")
        if self.windows == 0 or self.answers == 0:
            return f"{prior}; none observed yet"
        return (f"{self.ms:.3g} ms: {prior} as {PRIOR_ANSWERS:g} answers, and {self.answers:.0f} observed "
                f"answers (decayed x{DECAY:g} a window, {self.windows} windows)")


def node_samples(snapshot: Snapshot, windows: Mapping[str, AppWindow],
                 device: Mapping[str, DeviceTime]) -> dict[str, tuple[int, float]]:
    """Per node, the window's (answers, total serving ms): for each app placed only on that node's devices,
    without a CPU stage, answered both at its entry (``windows``) and by its agent (``device``, the same
    window's device times), ``min(answers) x (entry mean - device mean)`` (module doc)."""
    out: dict[str, tuple[int, float]] = {}
    for name, placement in snapshot.placements.items():
        w, d = windows.get(name), device.get(name)
        app = snapshot.apps.get(name)
        if w is None or w.latency is None or d is None or d.mean_ms is None or app is None or app.cpu_cores > 0:
            continue
        nodes = {snapshot.cluster.devices[s.device].node for s in placement.shares}
        if len(nodes) != 1:
            continue
        n = min(w.latency.count, d.count)
        if n == 0:
            continue
        (node,) = nodes
        got = out.get(node, (0, 0.0))
        # the policing wait is the app's own (a request over its contract waits for a token): not the path's
        entry_ms = w.latency.mean_ms - w.waited_ms / w.latency.count
        out[node] = (got[0] + n, got[1] + n * (entry_ms - d.mean_ms))
    return out


def update_serving(paths: Mapping[str, ServingPath], samples: Mapping[str, tuple[int, float]]
                   ) -> dict[str, ServingPath]:
    """Every node's path after one window: the nodes with samples observe them, the others keep theirs."""
    return {node: (p.observe(*samples[node]) if node in samples else p) for node, p in paths.items()}
