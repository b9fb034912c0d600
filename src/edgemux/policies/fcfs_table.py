"""Every Edge TPU (FCFS) tenant of a snapshot as flat arrays, and the mean latency check of many candidate
devices at once: the FCFS analogue of ``policies.ibis``'s time-sharing table.

For one decision, ``Ibis`` evaluates every candidate device with the new app added, and on an Edge TPU the
first thing it computes is every tenant's mean end to end (``ibis.predict_means``: ``perf.device.fcfs_responses``
plus the CPU stage and the network). Done device by device that is a Python pass over every tenant of every
candidate. Here the same closed form (``perf.edgetpu``, Ibis Eq. 1-5) is evaluated for all candidates in a
few numpy operations over a per-snapshot table of the tenants:

    lam = sum_i lam_i (req/s),  p_i = lam_i / lam
    q_i = min(1, sum of p_j over the tenants j of i's model)   Poisson tenant
    q_i = 1 if one model is on the device else 0               periodic tenant
    S_i = e_i + (1 - q_i) o_i
    E[S] = sum_i p_i S_i,   E[S^2] = sum_i p_i [q_i E[e_i^2] + (1 - q_i) E[(e_i + o_i)^2]]
    rho = lam E[S] / 1000,  W = (lam / 1000) E[S^2] / (2 (1 - rho))      (P-K, Unstable when rho >= 1)
    R_i = min(W + S_i, B) where the periodic bound B applies (``perf.periodic``; B also replaces an
          Unstable), else W + S_i;  end to end = CPU stage mean + R_i + network.

Only the new tenant changes between candidates, so every per-device, per-model aggregate is the existing
tenants' one (precomputed in the table) plus the new tenant's contribution.

Numerics: the sums are numpy sums in another order than ``math.fsum`` / the sequential sums of
``perf.edgetpu``, so values agree with ``predict_means`` to a relative ~1e-15 / (1 - rho) (about 1e-14 at
rho = 0.9; tested at 1e-9). Decisions that sit on a boundary are therefore left to the exact path by
:func:`fcfs_mean_screen`: a mean within a relative ``SCREEN_TOL`` of its SLO, ``rho`` within ``RHO_TOL``
of 1, a periodic worst-case load within ``SCREEN_TOL`` of 1.

Units: ms, req/s (rates in the table are req/ms). Pure: no I/O, clock or randomness.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from edgemux.cluster.disciplines import traits
from edgemux.cluster.state import App
from edgemux.cluster.workload import ArrivalKind, Tenant
from edgemux.perf.periodic import largest_service_ms
from edgemux.perf.result import Unstable
from edgemux.perf.tandem import tenant_cpu_ms
from edgemux.policies.base import DeviceLoad, Snapshot, segments
from edgemux.profiles.distributions import second_moment

__all__ = ["FcfsTable", "Means", "fcfs_table", "evaluate", "fcfs_means", "mean_outcomes", "fcfs_mean_screen", "outcome",
           "SCREEN_TOL",
           "RHO_TOL"]

SCREEN_TOL = 1e-9
"""Relative margin around an SLO (and around a periodic worst-case load of 1) inside which
:func:`fcfs_mean_screen` leaves the verdict to the exact path (numpy sums vs ``math.fsum``)."""
RHO_TOL = 1e-6
"""Devices with ``|1 - rho| <= RHO_TOL`` are left to the exact path: there P-K divides by ``1 - rho`` and the
summation-order error (~1e-16 relative in rho) could grow past ``SCREEN_TOL``, or flip Unstable vs finite."""

_KEY = "_fcfs_table"

# SLO statistic classes of a tenant on an Edge TPU, as ``Ibis._check`` sorts them
_MEAN, _OPEN, _EXACT = 0, 1, 2
_LEVELS = {"p95": 0.95, "p99": 0.99}


class Candidate(Protocol):
    """What the functions here read of ``ibis.Candidate``: the device index (``snapshot.arrays.devices``
    order) and the tenants with the new one last."""

    @property
    def index(self) -> int: ...

    @property
    def tenants(self) -> list[Tenant]: ...


@dataclass(frozen=True, eq=False)
class FcfsTable:
    """Every tenant of every FCFS device of a snapshot, in device order then load order (so the tenants of
    device ``d`` are rows ``start[d]:stop[d]``, in ``DeviceLoad.tenants`` order, and a candidate's tenants
    are those rows then the new one, as ``Candidate.tenants`` is ``[*load.tenants, new]``), with the
    per-(device, model) aggregates the candidates share. Built once per snapshot (:func:`fcfs_table`)."""

    # per tenant (row)
    dev: np.ndarray        # device index (``snapshot.arrays.devices`` order), intp
    lam: np.ndarray        # rate (req/ms)
    e: np.ndarray          # mean execution time E[e] (ms)
    e2: np.ndarray         # second moment E[e^2] (ms^2)
    o: np.ndarray          # model-switch overhead (ms)
    model: np.ndarray      # model id on its device (``device_models[dev]``), intp
    periodic: np.ndarray   # periodic (camera) arrival, bool
    top: np.ndarray        # largest execution time (ms) for the periodic bound; +inf when unbounded
    fixed: np.ndarray      # CPU stage mean + network (ms); +inf where the CPU stage is Unstable
    slo: np.ndarray        # owner's SLO latency (ms)
    stat: np.ndarray       # owner's SLO statistic as ``Ibis._check`` classes it on an FCFS device: 0 mean,
                           # 1 p95/p99 of a tenant without CPU stage ("open"), 2 p50, or p95/p99 of a
                           # tenant with a CPU stage (no bound settles it: the exact path decides)
    model_lam: np.ndarray  # sum of the rates (req/ms) of the tenants of this row's model on its device
    level: np.ndarray      # the SLO's quantile level (0.95, 0.99), 0 for a mean SLO
    # per device (``snapshot.arrays.devices`` order; empty for non-FCFS devices)
    start: np.ndarray      # first row of the device, intp
    stop: np.ndarray       # one past its last row, intp
    n_models: np.ndarray   # distinct models loaded, intp
    device_models: tuple[dict[str, int], ...]  # per device: model string -> its id in ``model``

    def positions(self, device: int) -> np.ndarray:
        """The rows of ``device``'s tenants, in load order."""
        return np.arange(self.start[device], self.stop[device])


# the columns of a device block, in order (floats; the int/bool ones are converted once per snapshot)
_COLS = ("lam", "e", "e2", "o", "top", "fixed", "slo", "model_lam", "model", "periodic", "stat", "level")
_BLOCK_KEY = "_fcfs_block"
_NO_MODELS: dict[str, int] = {}


@dataclass(frozen=True, eq=False)
class _Block:
    """One FCFS device's rows (``len(tenants) x len(_COLS)``) and its model dictionary."""

    cols: np.ndarray
    models: dict[str, int]


def _block(load: DeviceLoad, apps: Mapping[str, App]) -> _Block:
    """The device's rows, memoized on its (frozen) :class:`DeviceLoad`. ``Snapshot.with_placement`` carries
    the loads of untouched devices over to the new snapshot, so a snapshot derived from one whose table
    was built recomputes only the devices the placement touched; this assumes, as ``with_placement`` does,
    that the apps named by a carried-over load are unchanged (an app name is placed once)."""
    memo = load.__dict__.get(_BLOCK_KEY)
    if memo is not None:
        return memo
    models: dict[str, int] = {}
    rows = []
    for t in load.tenants:
        owner = apps[t.name]
        cpu = tenant_cpu_ms(t)
        top = largest_service_ms(t)
        rows.append((t.rate_rps / 1000.0, t.service.mean, second_moment(t.service), t.switch_ms,
                     math.inf if top is None else top,
                     # end_to_end(cpu, device, network): an Unstable CPU stage makes the mean Unstable
                     math.inf if isinstance(cpu, Unstable) else cpu + t.network_ms,
                     owner.slo.latency_ms, 0.0, models.setdefault(t.model, len(models)),
                     t.arrival.kind is ArrivalKind.PERIODIC, _stat_class(t, owner),
                     _LEVELS.get(owner.slo.stat, 0.0)))
    cols = np.array(rows, dtype=float).reshape(len(rows), len(_COLS))
    if len(rows):
        # per model rate sums on this device (q_i of perf.edgetpu before the new tenant joins)
        mid = cols[:, 8].astype(np.intp)
        cols[:, 7] = np.bincount(mid, weights=cols[:, 0])[mid]
    block = _Block(cols, models)
    load.__dict__[_BLOCK_KEY] = block
    return block


def fcfs_table(snapshot: Snapshot) -> FcfsTable:
    """The snapshot's :class:`FcfsTable`, built on first use and memoized in the (frozen) snapshot, like
    ``feasibility._timeshare_table``; each device's rows are memoized on its ``DeviceLoad`` (see ``_block``), so
    building costs one numpy concatenation plus the devices not seen before."""
    memo = snapshot.__dict__.get(_KEY)
    if memo is not None:
        return memo
    arr = snapshot.arrays
    n = len(arr.devices)
    blocks = [_block(load, snapshot.apps) if traits(d.discipline).one_queue else None
              for d, load in zip(arr.devices, arr.loads)]
    sizes = np.fromiter((0 if b is None else len(b.cols) for b in blocks), dtype=np.intp, count=n)
    stop = np.cumsum(sizes)
    start = stop - sizes
    parts = [b.cols for b in blocks if b is not None]
    cols = np.concatenate(parts) if parts else np.zeros((0, len(_COLS)))
    c = {k: np.ascontiguousarray(cols[:, i]) for i, k in enumerate(_COLS)}
    models = tuple(_NO_MODELS if b is None else b.models for b in blocks)
    table = FcfsTable(dev=np.repeat(np.arange(n, dtype=np.intp), sizes), lam=c["lam"], e=c["e"], e2=c["e2"],
                      o=c["o"], model=c["model"].astype(np.intp), periodic=c["periodic"].astype(bool),
                      top=c["top"], fixed=c["fixed"], slo=c["slo"], stat=c["stat"].astype(np.int8),
                      model_lam=c["model_lam"], level=c["level"], start=start, stop=stop,
                      n_models=np.fromiter((len(m) for m in models), dtype=np.intp, count=n),
                      device_models=models)
    snapshot.__dict__[_KEY] = table
    return table


def _stat_class(t: Tenant, owner: App) -> int:
    """``Ibis._check``'s class of a tenant's SLO statistic on an FCFS device."""
    stat = owner.slo.stat
    if stat == "mean":
        return _MEAN
    # a p50, or a tail with a CPU stage: no certified bound settles it, the estimate decides
    return _OPEN if stat in _LEVELS and t.cpu is None else _EXACT


@dataclass(frozen=True, eq=False)
class Means:
    """:func:`evaluate`'s result for m candidates: end-to-end means of the existing tenants (flat, rows
    of candidate j at ``offset[j]:offset[j+1]``, row k of them = ``table`` row ``rows[k]``) and of the new
    tenants, plus what the screen needs to know about boundaries."""

    rows: np.ndarray       # table row of each existing tenant of each candidate
    cand: np.ndarray       # its candidate (0..m-1)
    offset: np.ndarray     # m + 1 offsets into rows / cand / old
    old: np.ndarray        # mean end to end (ms) of the existing tenants; inf = Unstable
    new: np.ndarray        # mean end to end (ms) of the new tenant of each candidate; inf = Unstable
    boundary: np.ndarray   # per candidate: rho or the periodic worst-case load too near 1 to trust
    # what the lattice tail bounds need (``ibis.fcfs_batch``): the switch mixture of every tenant
    q: np.ndarray          # per existing row: probability its request pays no switch
    q_new: np.ndarray      # per candidate: the same for the new tenant
    lam: np.ndarray        # per candidate: total rate (req/ms) after placement
    lam_new: np.ndarray    # per candidate: the new tenant's rate (req/ms)
    e_new: np.ndarray      # per candidate: the new tenant's mean execution time (ms)
    o_new: np.ndarray      # per candidate: the new tenant's switch overhead (ms)
    det_new: np.ndarray    # per candidate: the new tenant's execution time is a constant
    fixed_new: np.ndarray  # per candidate: the new tenant's CPU stage mean + network (ms)
    bound: np.ndarray      # per candidate: the periodic worst-case bound (ms), inf where it does not apply
    rho: np.ndarray        # per candidate: utilization lam E[S] after placement


def evaluate(snapshot: Snapshot, cands: Sequence[Candidate], new_tenants: Sequence[Tenant]) -> Means:
    """The FCFS model (``perf.edgetpu``, ``perf.periodic``) on every candidate device with its new tenant
    added, all at once: every tenant's mean end to end and the switch mixtures (see :class:`Means`)."""
    table = fcfs_table(snapshot)
    m = len(cands)
    idx = np.fromiter((c.index for c in cands), dtype=np.intp, count=m)
    if m and not snapshot.arrays.fcfs[idx].all():
        raise ValueError("fcfs_means takes FCFS (Edge TPU) candidate devices only")
    # the new tenants: usually one Tenant object for every Edge TPU of a decision, so computed once each
    seen: dict[int, tuple[float, ...]] = {}
    cols = np.empty((m, 8))
    for j, t in enumerate(new_tenants):
        got = seen.get(id(t))
        if got is None:
            cpu = tenant_cpu_ms(t)
            top = largest_service_ms(t)
            got = (t.rate_rps / 1000.0, t.service.mean, second_moment(t.service), t.switch_ms,
                   0.0, float(t.arrival.kind is ArrivalKind.PERIODIC),
                   math.inf if top is None else top,
                   math.inf if isinstance(cpu, Unstable) else cpu + t.network_ms)
            seen[id(t)] = got
        cols[j] = got
    l_n, e_n, e2_n, o_n, _, per_n, top_n, fixed_n = cols.T
    per_n = per_n.astype(bool)
    # the new tenant's model id on each candidate device (-1: not loaded there)
    dm = table.device_models
    mid_n = np.fromiter((dm[c.index].get(t.model, -1) for c, t in zip(cands, new_tenants)), dtype=np.intp,
                        count=m)

    # gather the existing tenants of every candidate: candidate j's rows are start[d_j]:stop[d_j]
    rows, cand, offset = segments(table.start[idx], table.stop[idx])

    lam_r, e, e2, o = table.lam[rows], table.e[rows], table.e2[rows], table.o[rows]
    same = table.model[rows] == mid_n[cand]               # the existing tenant runs the new app's model
    # per (candidate, model) aggregates: the table's (device, model) rate sums plus the new tenant's rate
    model_lam = table.model_lam[rows] + np.where(same, l_n[cand], 0.0)
    lam = np.bincount(cand, weights=lam_r, minlength=m) + l_n           # req/ms
    same_lam = np.bincount(cand, weights=np.where(same, lam_r, 0.0), minlength=m)
    present = np.bincount(cand, weights=same, minlength=m) > 0
    many = (table.n_models[idx] + ~present) > 1                          # more than one model after placement

    # q: probability the previous request ran the tenant's model (perf.edgetpu.same_model_probabilities)
    q = np.where(table.periodic[rows], (~many[cand]).astype(float), np.minimum(1.0, model_lam / lam[cand]))
    q_n = np.where(per_n, (~many).astype(float), np.minimum(1.0, (same_lam + l_n) / lam))
    s = e + (1.0 - q) * o                                                # S_i (ms)
    s_n = e_n + (1.0 - q_n) * o_n
    sw2 = e2 + (1.0 - q) * (2.0 * o * e + o * o)                         # q e2 + (1-q) E[(e+o)^2]
    sw2_n = e2_n + (1.0 - q_n) * (2.0 * o_n * e_n + o_n * o_n)
    # lam E[S] and lam E[S^2] (p_i = lam_i / lam, so lam * sum p_i x_i = sum lam_i x_i)
    rho = np.bincount(cand, weights=lam_r * s, minlength=m) + l_n * s_n
    a2 = np.bincount(cand, weights=lam_r * sw2, minlength=m) + l_n * sw2_n
    stable = rho < 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(stable, a2 / (2.0 * (1.0 - rho)), np.inf)          # P-K mean wait (ms)

    # the periodic worst-case bound (perf.periodic.periodic_fcfs_bound): every tenant periodic and bounded
    per_all = np.bincount(cand, weights=~table.periodic[rows], minlength=m) == 0
    top = table.top[rows] + np.where(many[cand], o, 0.0)
    top_n2 = top_n + np.where(many, o_n, 0.0)
    with np.errstate(invalid="ignore"):
        total = np.bincount(cand, weights=top, minlength=m) + top_n2
        load = np.bincount(cand, weights=top * lam_r, minlength=m) + top_n2 * l_n
    capped = per_all & per_n & np.isfinite(total) & (load <= 1.0)
    bound = np.where(capped, total, np.inf)

    # R_i = min(W + S_i, B) (B also where W is Unstable), then + CPU stage + network
    old = np.minimum(w[cand] + s, bound[cand]) + table.fixed[rows]
    new = np.minimum(w + s_n, bound) + fixed_n
    boundary = (np.abs(1.0 - rho) <= RHO_TOL) | (per_all & per_n & np.isfinite(total)
                                                 & (np.abs(load - 1.0) <= SCREEN_TOL))
    det_n = e2_n <= e_n * e_n
    return Means(rows, cand, offset, old, new, boundary, q, q_n, lam, l_n, e_n, o_n, det_n, fixed_n, bound, rho)


def fcfs_means(snapshot: Snapshot, cands: Sequence[Candidate], new_tenants: Sequence[Tenant]) -> list[np.ndarray]:
    """Every tenant's mean end-to-end latency (ms) on each FCFS candidate device with its new tenant added,
    in ``cands[j].tenants`` order (the device's tenants in load order, then ``new_tenants[j]``, which must
    be ``cands[j].tenants[-1]``): the values of ``ibis.predict_means(device_spec(c.device), c.tenants)``,
    with ``inf`` for an ``Unstable`` (rho >= 1 on the device, or on the tenant's CPU stage) except where
    the periodic bound caps it (then the bound, as ``perf.periodic.cap`` does).

    All candidates are evaluated at once; agreement with ``predict_means`` is to a relative ~1e-15 /
    (1 - rho) (summation order; see the module docstring), and the Unstable/finite and capped/uncapped
    switches may differ where rho or the periodic worst-case load is within rounding of 1."""
    if len(new_tenants) != len(cands):
        raise ValueError(f"{len(cands)} candidates but {len(new_tenants)} new tenants")
    r = evaluate(snapshot, cands, new_tenants)
    return [np.append(r.old[r.offset[j]:r.offset[j + 1]], r.new[j]) for j in range(len(cands))]


def outcome(verdicts: Sequence[str]) -> str | None:
    """What ``Ibis._check`` reports from per-tenant verdicts in tenant order ("pass", "slo", "open": a tail
    not settled yet; any other verdict is reported as it is), the first that is not a pass, ``slo`` also after
    open tenants (an open tenant can only end up pass or ``slo``), ``None`` when an open tenant leaves it
    undetermined, "pass" when every tenant passes."""
    seen_open = False
    for v in verdicts:
        if v == "pass":
            continue
        if v == "slo":
            return "slo"
        if v == "open":
            seen_open = True
            continue
        return None if seen_open else v
    return None if seen_open else "pass"


def mean_outcomes(app: App, snapshot: Snapshot, cands: Sequence[Candidate], r: Means) -> list[str | None]:
    """What the means alone tell ``Ibis._check`` about each FCFS candidate (``r``: :func:`evaluate` of
    ``cands``): ``"slo"`` (rejected, that constraint reported), ``"pass"`` (every tenant has a mean SLO and
    meets it), ``"open"`` (p95/p99 tenants remain for the tail check; nothing else fails), ``None``
    (undecided: a mean within a relative ``SCREEN_TOL`` of its SLO, rho or the periodic worst-case load
    near 1, or a tenant the exact path decides).

    As ``_check`` does, each tenant (existing ones in load order, then the new app, whose owner is ``app``)
    gets a verdict: a mean SLO ``slo`` when its mean is Unstable or over the SLO, else pass; a p95/p99 SLO
    open (with a CPU stage, or a p50 SLO, the candidate is left undecided unless a ``slo`` comes first: the
    exact path decides); the outcome is :func:`outcome` of the verdicts, computed for all candidates at
    once."""
    m = len(cands)
    if not m:
        return []
    table = fcfs_table(snapshot)
    # the new tenant has a CPU stage iff the app has one, so its class is the same on every candidate
    new_stat = _stat_class(cands[0].tenants[-1], app)
    cand = r.cand
    stat = table.stat[r.rows]
    pos = np.arange(len(r.rows), dtype=np.intp) - r.offset[cand]       # position on its device
    n_old = r.offset[1:] - r.offset[:-1]                               # the new app's position

    slo, slo_n = table.slo[r.rows], app.slo.latency_ms
    with np.errstate(invalid="ignore"):
        margin = r.old - slo
        margin_n = r.new - slo_n
    mean = stat == _MEAN
    band = SCREEN_TOL * slo
    unsure = np.bincount(cand, weights=mean & (np.abs(margin) <= band), minlength=m) > 0
    unsure |= r.boundary
    fail = mean & (margin > band)

    # first position of each verdict kind per candidate (none: no such tenant); the new app comes last
    none = np.iinfo(np.intp).max
    first = {k: np.full(m, none, dtype=np.intp) for k in ("slo", "open", "exact")}
    for k, mask in (("slo", fail), ("open", stat == _OPEN), ("exact", stat == _EXACT)):
        np.minimum.at(first[k], cand[mask], pos[mask])
    if new_stat == _MEAN:
        unsure |= np.abs(margin_n) <= SCREEN_TOL * slo_n
        hit = margin_n > SCREEN_TOL * slo_n
        first["slo"] = np.where(hit, np.minimum(first["slo"], n_old), first["slo"])
    else:
        k = "open" if new_stat == _OPEN else "exact"
        first[k] = np.minimum(first[k], n_old)
    # a tenant the exact path decides ends pass or slo, as an open one does, but no bound settles it
    exact = first["exact"] < none
    first["open"] = np.minimum(first["open"], first["exact"])
    a, c = first["slo"], first["open"]
    is_slo = a < none                       # a slo (open tenants before it: still slo)
    is_pass = (a == none) & (c == none)
    is_open = ~is_slo & (c < none)
    out: list[str | None] = []
    for j in range(m):
        if unsure[j]:
            out.append(None)
        elif is_slo[j]:
            out.append("slo")
        elif exact[j]:
            out.append(None)
        elif is_pass[j]:
            out.append("pass")
        elif is_open[j]:
            out.append("open")
        else:
            out.append(None)
    return out


def fcfs_mean_screen(app: App, snapshot: Snapshot, cands: Sequence[Candidate]) -> dict[int, str]:
    """The FCFS candidates (others are ignored) that ``Ibis._check`` certainly rejects from the means
    alone: device index -> the constraint it reports, ``"slo"`` (see :func:`mean_outcomes`)."""
    is_fcfs = snapshot.arrays.fcfs
    fc = [c for c in cands if is_fcfs[c.index]]
    if not fc:
        return {}
    outs = mean_outcomes(app, snapshot, fc, evaluate(snapshot, fc, [c.tenants[-1] for c in fc]))
    return {c.index: o for c, o in zip(fc, outs) if o == "slo"}
