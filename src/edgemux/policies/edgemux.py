"""``edgemux``: ours. Ibis's latency-aware feasibility (every tenant at its own SLO statistic, utilization
cap, AI-as-a-Service grouping, optional heterogeneous choice) plus MicroEdge-style workload partitioning
made latency-aware: when no single device can take the whole app, it is split over several devices, each
piece the largest fraction of the app's rate that device can take with every tenant there (the piece
included) still meeting its SLO.

The largest fraction is found by bisection on the piece's rate: utilization and every queueing estimate
used here grow with a tenant's rate, so feasibility is monotone in it. Devices are tried with the most
free utilization first (ties: cluster order); at most ``max_parts`` pieces, none smaller than
``min_piece`` of the app. The app's CPU stage and host memory are charged once, on the first piece's node;
each piece loads its own copy of the model (or joins a shared one).
"""

from __future__ import annotations

import math
from dataclasses import replace

from edgemux.cluster.disciplines import traits
from edgemux.cluster.state import App, Placement, Share
from edgemux.perf.dutycycle import EPS
from edgemux.policies.base import Decision, Rejection, Snapshot, largest_feasible
from edgemux.policies.registry import register
from edgemux.policies.feasibility import Candidate, Fit, Pending, fcfs_batch, timeshare_screen
from edgemux.policies.ibis import Ibis


@register("edgemux")
class Edgemux(Ibis):
    def __init__(self, max_utilization: float = 0.9, choice: str = "tight", heterogeneous: bool = False,
                 tails: str = "bound", partitioning: bool = True, max_parts: int = 4, min_piece: float = 0.05,
                 bisection_steps: int = 12) -> None:
        super().__init__(max_utilization=max_utilization, choice=choice, heterogeneous=heterogeneous, tails=tails)
        if max_parts < 1:
            raise ValueError(f"max_parts must be >= 1, got {max_parts!r}")
        if not (0 < min_piece <= 1):
            raise ValueError(f"min_piece must be in (0, 1], got {min_piece!r}")
        self.partitioning = partitioning
        self.max_parts = max_parts
        self.min_piece = min_piece
        self.bisection_steps = bisection_steps

    def post_filter(self, app: App, snapshot: Snapshot, rejection: Rejection) -> Decision:
        """With ``partitioning``: the app split over the devices that can each take a piece with every tenant
        within its SLO (module docstring); else, or when no split covers it, the whole app's rejection."""
        if not self.partitioning:
            return rejection
        return self._partition(app, snapshot) or rejection

    def _fits(self, app: App, snapshot: Snapshot, device_path: str, weight: float) -> Fit | None:
        piece = replace(app, rate_rps=app.rate_rps * weight)
        r = self.evaluate(piece, snapshot, snapshot.cluster.devices[device_path])
        return None if isinstance(r, Rejection) else r

    def _may_cover(self, snapshot: Snapshot, cands: list[Candidate]) -> bool:
        """False when the pieces cannot add up to the whole app whatever the latency checks say. A piece
        of fraction f adds f x the app's work, so a device takes at most the f that keeps its utilization
        within ``max_utilization``: ``(max_utilization * c - work) / app work`` on an additive device (c
        servers), the same with c = 1 on an Edge TPU counting execution work only (a lower bound on its
        utilization: a piece of a loaded model may save switches); a device whose bound is below
        ``min_piece`` takes no piece. ``cands``: the devices the smallest piece passed, with that piece
        as their last tenant."""
        arr = snapshot.arrays
        caps: list[float] = []
        for c in cands:
            i = c.index
            if not (arr.additive[i] or arr.fcfs[i]):
                return True                                    # batching: no bound here
            piece = c.new
            whole = piece.rate_rps / 1000.0 * piece.service.mean / self.min_piece
            if whole <= 0.0:
                return True
            servers = arr.divisor[i] if arr.additive[i] else 1.0
            cap = min(1.0, (self.max_utilization * servers - arr.work[i]) / whole)
            caps.append(cap if cap >= self.min_piece else 0.0)
        caps.sort(reverse=True)
        return math.fsum(caps[:self.max_parts]) >= 1.0 - EPS

    def _partition(self, app: App, snapshot: Snapshot) -> Placement | None:
        # devices that can take at least the smallest piece, most free utilization first
        order: list[tuple[float, int, str]] = []
        known: set[str] = set()    # devices known to take the smallest piece
        smallest = replace(app, rate_rps=app.rate_rps * self.min_piece)
        if self.screened():
            small = self.screen(smallest, snapshot)[0]
            # a device that surely rejects the smallest piece rejects every larger one: latency grows with rate
            sure = timeshare_screen(smallest, snapshot, small) if self.vector_latency() else {}
            left = [c for c in small if c.index not in sure]
            # the same two necessary conditions as below, before the Edge TPUs' latency batch (a superset
            # of devices only makes them weaker): most rejected apps stop here
            if len(left) < 2 or not self._may_cover(snapshot, left):
                return None
            if self.batched():
                got = fcfs_batch(smallest, snapshot, [c for c in small if traits(c.device.discipline).one_queue],
                                  first_fit=False)
                sure.update({i: r.constraint for i, r in got.items() if isinstance(r, Pending)})
                known = {c.device.path for c in small if isinstance(got.get(c.index), Fit)}
            order = [(c.utilization, c.index, c.device.path) for c in small if c.index not in sure]
            if not self._may_cover(snapshot, [c for c in small if c.index not in sure]):
                return None
        else:
            for i, (path, device) in enumerate(snapshot.cluster.devices.items()):
                c = self.precheck(smallest, snapshot, device, i)
                if isinstance(c, Rejection):
                    continue
                order.append((c.utilization, i, path))
        if len(order) < 2:
            return None    # a partition needs two devices that take a piece
        order.sort()
        pieces: list[tuple[str, Fit, float]] = []
        remaining = 1.0
        for _, _, path in order:
            if len(pieces) == self.max_parts or remaining <= EPS:
                break
            if path not in known and self._fits(app, snapshot, path, self.min_piece) is None:
                continue
            # the whole app fits on no device (decide rejected it there), so a first piece is always a part
            fit = self._fits(app, snapshot, path, remaining) if remaining < 1.0 else None
            if fit is not None:
                pieces.append((path, fit, remaining))
                remaining = 0.0
                break
            # feasible at min_piece, infeasible at remaining
            lo = largest_feasible(lambda f: self._fits(app, snapshot, path, f) is not None, self.min_piece,
                                  remaining, self.bisection_steps)
            fit = self._fits(app, snapshot, path, lo)
            assert fit is not None
            pieces.append((path, fit, lo))
            remaining -= lo
        if remaining > EPS or len(pieces) < 2:
            return None
        weights = [w for _, _, w in pieces]
        weights[-1] = 1.0 - sum(weights[:-1])
        # on a spatial device each piece runs the instances and share planned for its own rate
        shares = tuple(Share(path, w, fit.profile, fit.fraction, fit.instances)
                       for (path, fit, _), w in zip(pieces, weights))
        first = snapshot.cluster.devices[pieces[0][0]]
        return Placement(app.name, shares, cpu_node=first.node)
