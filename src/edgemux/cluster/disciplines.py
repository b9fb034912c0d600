"""What each sharing discipline is, as the layers above ask it: one :class:`Traits` row per
:class:`~edgemux.cluster.workload.Discipline`, in :data:`TRAITS`.

Every question the estimators, the policies, the simulator and the runtime put to a discipline is a
column here, so that code reads a trait (``traits(d).shares``) instead of naming disciplines. The other
per-discipline tables, one per layer, each keyed by the same enum (``tests/test_disciplines.py`` checks
that every member has a row in each):

- ``perf.estimators.ESTIMATORS``: the estimator (utilization, per-tenant means, tails);
- ``sim.devices.STATIONS``: the station that executes the discipline in virtual time;
- ``runtime.dataplane.queues.QUEUES``: the request queue a device worker serves in real time.

Adding a discipline is a member of the enum (``cluster/workload.py``), a row in each of the four tables and
its description in docs/estimators.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from edgemux.cluster.workload import Discipline
from edgemux.profiles.types import DeviceKind

__all__ = ["Traits", "TRAITS", "DEFAULT_DISCIPLINE", "traits", "capacity"]


@dataclass(frozen=True)
class Traits:
    """What one discipline does, column by column (each says who asks)."""

    discipline: Discipline
    multi_server: bool = False
    """Offers ``device.servers`` servers' worth of execution (c of the M/G/c limited PS of MPS); every
    other discipline offers one (:func:`capacity`)."""
    pays_switch: bool = False
    """Sequential: executes one request (or one batch) at a time, non-preemptively, with one model loaded, so
    a request (or batch) pays its tenant's ``switch_ms`` when the device last ran another model; the
    time-sharing and spatial disciplines keep every model resident (Ibis §3.3)."""
    shares: bool = False
    """Processor-shared, work-conserving across all tenants: utilization is the tenants' summed work
    ``sum lam_i E[S_i]`` over the capacity, additive tenant by tenant (the policies' cached aggregates);
    without CPU stages the simulator's sweep (``sim.sweep``) runs it."""
    one_queue: bool = False
    """All tenants' requests wait in one FIFO queue for one server (M/G/1 with the model-switch mixture,
    Ibis Eq. 1-5): the Lindley recursion simulates it, the policies' switch-work tables
    (``policies.fcfs_table``) and certified tail bounds apply."""
    app_fifo: bool = False
    """FIFO within an app, processor-shared across the apps with work (embedded GPU time-sharing, Ibis
    §3.3): the estimate is the lowest-priority bound the policies' time-share screen evaluates in bulk."""
    batches: bool = False
    """Executes batches of one model's queued requests (Ibis Eq. 9): utilization is not additive."""
    spatial: bool = False
    """Split into isolated shares, each tenant on its own instances at its share of the device (Dhakal et al.
    §IV): admission plans a share and instances per app, and the shares on a device sum to at most 1."""


TRAITS: dict[Discipline, Traits] = {
    Discipline.FCFS: Traits(Discipline.FCFS, pays_switch=True, one_queue=True),
    Discipline.PS: Traits(Discipline.PS, shares=True),
    Discipline.GPU_TIMESHARE: Traits(Discipline.GPU_TIMESHARE, shares=True, app_fifo=True),
    Discipline.MPS: Traits(Discipline.MPS, multi_server=True, shares=True),
    Discipline.BATCH: Traits(Discipline.BATCH, pays_switch=True, batches=True),
    Discipline.SPATIAL: Traits(Discipline.SPATIAL, spatial=True),
}
"""One row per discipline; a trait a row does not name is False."""

DEFAULT_DISCIPLINE: dict[DeviceKind, Discipline] = {
    DeviceKind.EDGETPU: Discipline.FCFS,
    DeviceKind.GPU_EMBEDDED: Discipline.GPU_TIMESHARE,
    DeviceKind.GPU_DISCRETE: Discipline.GPU_TIMESHARE,
    DeviceKind.FPGA: Discipline.FCFS,
    DeviceKind.CPU: Discipline.PS,
}
"""What a device of each kind does when its file does not say (Ibis §3: TPU FCFS, GPU time-sharing)."""


def traits(discipline: Discipline) -> Traits:
    """The row of ``discipline``."""
    return TRAITS[discipline]


class _HasServers(Protocol):
    @property
    def discipline(self) -> Discipline: ...

    @property
    def servers(self) -> float: ...


def capacity(device: _HasServers) -> float:
    """The servers' worth of execution ``device`` offers (dimensionless): ``device.servers`` where the
    discipline is ``multi_server`` (MPS), else 1. The divisor of additive work in a utilization."""
    return device.servers if TRAITS[device.discipline].multi_server else 1.0
