"""Feasibility of an app on devices, as the latency-aware policies (Ibis, edgemux) decide it: the cheap
checks' survivors (:class:`Candidate`), a latency verdict known early (:class:`Pending`), every tenant's SLO
statistic on a device after placement (:func:`fcfs_values`, :func:`bound_values`, :func:`judge`) and the two
screens that decide many devices at once (:func:`timeshare_screen` for time-shared GPUs, :func:`fcfs_batch`
for Edge TPUs). Pure: no I/O, no clocks. Latencies are ms, rates req/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from edgemux.cluster.state import App, Device
from edgemux.cluster.disciplines import traits
from edgemux.cluster.workload import DeviceSpec, Tenant
from edgemux.perf.device import TenantEstimate, device_utilization
from edgemux.perf.estimators import QS, estimator_for, fcfs_tails
from edgemux.perf.result import Latency, Unstable
from edgemux.perf.periodic import periodic_fcfs_bound
from edgemux.perf.tailbounds import edgetpu_decision_bounds
from edgemux.perf.latticebounds import (
    Queries,
    Queues,
    decide_quantiles,
    device_quantile_verdicts,
    first_fit_quantiles,
)
from edgemux.perf.tandem import end_to_end, tenant_cpu_ms
from edgemux.profiles.distributions import second_moment
from edgemux.profiles.types import Profile
from edgemux.policies.fcfs_table import SCREEN_TOL, fcfs_table, mean_outcomes
from edgemux.policies.fcfs_table import evaluate as fcfs_evaluate
from edgemux.policies.base import Reason, Rejection, Snapshot

@dataclass(frozen=True)
class Fit:
    """A feasible device: utilization after placement and the new app's predicted latency at its stat."""

    device: Device
    profile: str
    utilization: float
    latency_ms: float
    grouped: bool
    fraction: float = 1.0   # a spatial device: the share of it each of the app's instances holds
    instances: int = 1


def predict_means(device: DeviceSpec, tenants: list[Tenant]) -> dict[str, Latency]:
    """Every tenant's mean end-to-end latency on ``device``: the ``mean_ms`` of
    ``perf.device.predict_device`` (same estimator per discipline) without the tail inversion, which costs
    far more and is only needed for percentile SLOs."""
    dev = estimator_for(device.discipline).responses(device, tenants)
    return {t.name: end_to_end(tenant_cpu_ms(t), x, t.network_ms) for t, x in zip(tenants, dev)}


def slo_value(est: TenantEstimate, stat: str) -> float | Unstable | None:
    """The estimate at an SLO statistic; None when the estimator gives none (a percentile not asked for)."""
    if stat == "mean":
        return est.mean_ms
    if stat == "p50":
        return est.p50_ms
    if stat == "p95":
        return est.p95_ms
    if stat == "p99":
        return est.p99_ms
    return None


@dataclass(slots=True)   # not frozen: built for every candidate of every decision, frozen init costs 3x
class Candidate:
    """A device that passed the cheap checks (resources, utilization). Treated as immutable."""

    index: int
    device: Device
    profile: Profile
    existing: tuple[Tenant, ...]   # the device's tenants before placement
    new: Tenant                    # the app's tenant on this device
    utilization: float
    grouped: bool

    @property
    def tenants(self) -> list[Tenant]:
        """Every tenant after placement: the existing ones, then the new one (built on use: most candidates
        of a decision are never looked at that closely)."""
        return [*self.existing, self.new]


@dataclass(slots=True)
class Pending:
    """A candidate known to fail the latency check with ``constraint``, found from the cheap mean
    estimates alone; its full :class:`Rejection` (tenant, predicted vs SLO) is built only if reported.
    ``reason``: what broke, where the screen that found it kept the numbers (else built when needed)."""

    cand: Candidate
    constraint: str
    reason: Reason | None = None


TAIL_QS = QS                    # the quantiles ``perf.device.predict_device`` gives (p50, p95, p99)
STAT_Q = {"p95": 0.95, "p99": 0.99}  # the tails the certified bounds settle (``perf.tailbounds``); a p50
                                     # SLO takes the estimate path (the bounds are built for the tail)


def tails_only(spec: DeviceSpec, tenants: list[Tenant], owners: list[App]) -> bool:
    """An Edge TPU where every percentile SLO is a p95/p99 of a tenant without CPU stage: every tenant
    has an estimate at its statistic (``fcfs_values`` applies)."""
    return estimator_for(spec.discipline).tail_bounds and all(
        o.slo.stat == "mean" or (o.slo.stat in STAT_Q and t.cpu is None) for t, o in zip(tenants, owners))


def fcfs_values(app: App, spec: DeviceSpec, tenants: list[Tenant], owners: list[App],
                 means: dict[str, Latency] | None = None, verdicts: list[str] | None = None,
                 upper: dict[int, float] | None = None) -> dict[str, Latency | None]:
    """Each tenant's estimate at its SLO statistic on an Edge TPU (``tails_only``), as
    ``perf.device.predict_device`` gives it (mean end to end; ``p95``/``p99`` = the P-K inversion capped by
    the periodic bound, plus the network latency), except that a tenant other than the new app whose
    tail verdict is a pass from the rigorous bounds (``settle_tails``; ``verdicts``/``upper`` as
    ``_check`` leaves them, computed here when not given) gets its upper bound, which meets its SLO, and a
    tenant after one certainly over its SLO (never read by ``judge``) gets ``inf``: the inversion is run
    only for the other percentile tenants (one W, their own services)."""
    if means is None:
        means = predict_means(spec, tenants)
    if verdicts is None:
        verdicts = ["pass" if o.slo.stat == "mean" else "open" for o in owners]
        upper = settle_tails(tenants, owners, verdicts)
    upper = upper or {}
    values: dict[str, Latency | None] = {}
    need: list[int] = []
    failed = False  # a tenant certainly over its SLO: the check stops there, later tenants are not read
    for i, (t, o) in enumerate(zip(tenants, owners)):
        if failed:
            values[t.name] = math.inf
        elif o.slo.stat == "mean":
            v = means[t.name]
            values[t.name] = v
            failed = isinstance(v, Unstable) or v > o.slo.latency_ms
        elif verdicts[i] == "pass" and t.name != app.name and i in upper:
            values[t.name] = upper[i]
        else:
            need.append(i)
            failed = verdicts[i] == "slo"
    if need:
        tails = fcfs_tails(tenants, need, periodic_fcfs_bound(tenants), where=spec.name)
        for i in need:
            values[tenants[i].name] = tails[i][TAIL_QS.index(STAT_Q[owners[i].slo.stat])]
    return values


def bound_values(spec: DeviceSpec, tenants: list[Tenant], owners: list[App],
                  means: dict[str, Latency] | None = None) -> dict[str, Latency | None] | None:
    """Each tenant's value at its SLO statistic on an Edge TPU (``tails_only``) with ``tails="bound"``: the
    mean end to end as ``predict_device`` gives it; for a p95/p99 SLO a certified upper bound on the
    quantile end to end, the smaller of the periodic worst case (``perf.periodic``, when it applies) and
    the lattice bound of ``perf.latticebounds`` (plus the network latency). The value meets the SLO
    exactly when one of the two certifies it. ``None`` when a service law is not finitely valued (the
    estimate path applies)."""
    which = [i for i, o in enumerate(owners) if o.slo.stat != "mean"]
    if means is None:
        means = predict_means(spec, tenants)
    values: dict[str, Latency | None] = dict(means)
    if not which:
        return values
    t = [owners[i].slo.latency_ms - tenants[i].network_ms for i in which]
    qs = [STAT_Q[owners[i].slo.stat] for i in which]
    cap = periodic_fcfs_bound(tenants)
    res = device_quantile_verdicts(tenants, which, qs, t, [True] * len(which))
    if res is None:
        rho = device_utilization(spec, tenants)
        if rho < 1.0:
            return None
        for i in which:   # overloaded: no quantile, unless the periodic bound holds
            net = tenants[i].network_ms
            values[tenants[i].name] = cap + net if cap is not None else Unstable(rho, spec.name)
        return values
    ok, up = res
    for j, i in enumerate(which):
        net = tenants[i].network_ms
        slo = owners[i].slo.latency_ms
        capped = math.inf if cap is None else cap + net
        if ok[j]:
            values[tenants[i].name] = min(float(up[j]) + net, slo, capped)
        elif capped <= slo:
            values[tenants[i].name] = capped
        else:
            values[tenants[i].name] = min(max(float(up[j]) + net, math.nextafter(slo, math.inf)), capped)
    return values


def judge(app: App, cand: Candidate, owners: list[App], values: dict[str, Latency | None],
           method: str) -> Fit | Rejection:
    """Algorithm 1 line 7 from the estimates: the first tenant (in order) without an estimate or over its
    SLO rejects the device; else a :class:`Fit` with the new app's estimate."""
    mine = math.inf
    for t, owner in zip(cand.tenants, owners):
        stat = owner.slo.stat
        value = values[t.name]
        if value is None:
            return Rejection(app.name, "no-estimate", device=cand.device.path, tenant=t.name, stat=stat,
                             slo_ms=owner.slo.latency_ms, detail=f"no {stat} estimate from {method}")
        if isinstance(value, Unstable) or value > owner.slo.latency_ms:
            pred = math.inf if isinstance(value, Unstable) else value
            return Rejection(app.name, "slo", device=cand.device.path, tenant=t.name, predicted_ms=pred,
                             slo_ms=owner.slo.latency_ms, stat=stat,
                             detail=str(value) if isinstance(value, Unstable) else "")
        if t.name == app.name:
            mine = value
    return Fit(cand.device, cand.profile.name, cand.utilization, mine, cand.grouped, cand.new.share,
               cand.new.instances)


_SCREEN_MIN = 16
"""Time-shared GPU candidates below which the per-device path is cheaper than building the table."""
_SCREEN_TOL = SCREEN_TOL
"""Relative margin around an SLO inside which a vectorized screen leaves the verdict to the exact path
(the numpy sums may differ from ``math.fsum``'s in the last bits): the same for GPUs and Edge TPUs."""
_TS_KEY = "_ibis_timeshare_table"


@dataclass(frozen=True, eq=False)
class _TimeshareTable:
    """Every time-shared GPU tenant of a snapshot as arrays (the inputs of ``perf.gpu.lowest_priority_bound``
    and of the end-to-end sum), with per-device sums; built once per snapshot, on first use."""

    dev: np.ndarray      # device index (cluster order) of each tenant
    s: np.ndarray        # mean service (ms)
    lam: np.ndarray      # rate (req/ms)
    fixed: np.ndarray    # CPU stage mean + network (ms); inf where the CPU stage is unstable
    slo: np.ndarray      # SLO (ms), all at the mean
    names: tuple[str, ...]  # tenant name of each row (which tenant a rejection names)
    a2: np.ndarray       # per device: sum of lam E[S^2] (ms)
    usable: np.ndarray   # per device: a time-shared GPU whose tenants all have mean SLOs


def _timeshare_table(snapshot: Snapshot) -> _TimeshareTable:
    memo = snapshot.__dict__.get(_TS_KEY)
    if memo is not None:
        return memo
    arr = snapshot.arrays
    n = len(arr.devices)
    dev: list[int] = []
    s: list[float] = []
    lam: list[float] = []
    fixed: list[float] = []
    slo: list[float] = []
    names: list[str] = []
    a2 = np.zeros(n)
    usable = np.zeros(n, dtype=bool)
    for i, (d, load) in enumerate(zip(arr.devices, arr.loads)):
        if not traits(d.discipline).app_fifo:
            continue
        ok = True
        for t in load.tenants:
            owner = snapshot.apps[t.name]
            ok = ok and owner.slo.stat == "mean"
            cpu = tenant_cpu_ms(t)
            x = t.rate_rps / 1000.0
            dev.append(i)
            s.append(t.service.mean)
            lam.append(x)
            fixed.append(math.inf if isinstance(cpu, Unstable) else cpu + t.network_ms)
            slo.append(owner.slo.latency_ms)
            names.append(t.name)
            a2[i] += x * second_moment(t.service)
        usable[i] = ok
    f = np.array
    table = _TimeshareTable(f(dev, dtype=np.intp), f(s, dtype=float), f(lam, dtype=float),
                            f(fixed, dtype=float), f(slo, dtype=float), tuple(names), a2, usable)
    snapshot.__dict__[_TS_KEY] = table
    return table


def timeshare_screen(app: App, snapshot: Snapshot, cands: list[Candidate],
                     kept: dict[int, Reason] | None = None) -> dict[int, str]:
    """The latency verdict ``_latency`` would reach on time-shared GPU candidates where it is certainly a
    rejection, computed for all of them at once: device index -> ``"slo"``. With ``kept``, each such
    device's :class:`Reason` goes there too: the first tenant (in order) over its SLO with its mean end to
    end (ms) as evaluated here (equal to ``_latency``'s up to rounding: no value is near its SLO).

    On such a device ``_latency`` evaluates every tenant's mean end to end, ``lowest_priority_bound`` plus
    its CPU stage and network, in tenant order (existing tenants, then the new app) and reports the first
    that misses its SLO (``slo``; a new app with a percentile SLO is left to the exact path once the
    existing tenants' means pass). The same closed form is evaluated here over the snapshot's tenant arrays. A device is
    left out (decided by the exact path) when an existing tenant has a percentile SLO, when any value is
    within ``_SCREEN_TOL`` of its SLO, or when the device would be saturated; passing devices are left out
    too, so every placement still comes from the exact check."""
    gpu = [c for c in cands if traits(c.device.discipline).app_fifo]
    if len(gpu) < _SCREEN_MIN:
        return {}
    table = _timeshare_table(snapshot)
    arr = snapshot.arrays
    gpu = [c for c in gpu if table.usable[c.index]]
    if not gpu:
        return {}
    idx = np.fromiter((c.index for c in gpu), dtype=np.intp, count=len(gpu))
    # the new tenant is one object per profile in a decision (Ibis._new_tenant): its numbers once each
    kinds: dict[int, int] = {}
    uniq: list[tuple[float, float, float, float]] = []
    which = np.empty(len(gpu), dtype=np.intp)
    for j, c in enumerate(gpu):
        t = c.new
        k = kinds.get(id(t))
        if k is None:
            cpu = tenant_cpu_ms(t)
            if isinstance(cpu, Unstable):
                return {}
            k = kinds[id(t)] = len(uniq)
            uniq.append((t.rate_rps / 1000.0, t.service.mean, second_moment(t.service), cpu + t.network_ms))
        which[j] = k
    l_n, s_n, m2_n, fixed_n = np.array(uniq, dtype=float)[which].T
    rho = arr.work[idx] + l_n * s_n
    half = (table.a2[idx] + l_n * m2_n) / 2.0
    live = 1.0 - rho > 1e-9
    pos = np.full(len(arr.devices), -1, dtype=np.intp)
    pos[idx] = np.arange(len(idx))
    tpos = pos[table.dev]
    sel = tpos >= 0
    k = tpos[sel]
    with np.errstate(divide="ignore", invalid="ignore"):
        a = 1.0 - rho[k] + table.lam[sel] * table.s[sel]
        val = table.s[sel] / a + half[k] / (a * (1.0 - rho[k])) + table.fixed[sel]
        margin = val - table.slo[sel]
        band = _SCREEN_TOL * table.slo[sel]
        fail = np.bincount(k[margin > band], minlength=len(idx)) > 0
        unsure = np.bincount(k[np.abs(margin) <= band], minlength=len(idx)) > 0
        a_n = 1.0 - rho + l_n * s_n
        val_n = s_n / a_n + half / (a_n * (1.0 - rho)) + fixed_n
    out: dict[int, str] = {}
    percentile = app.slo.stat != "mean"
    slo_n = app.slo.latency_ms
    first = _first_failing(k, margin > band, len(idx)) if kept is not None else None
    rows = np.flatnonzero(sel)
    for j, c in enumerate(gpu):
        if not live[j] or unsure[j]:
            continue
        if fail[j]:
            out[c.index] = "slo"
            if first is not None and kept is not None:
                r = int(first[j])   # the existing tenant that breaks first (rows are in tenant order)
                kept[c.index] = Reason("slo", c.device.path, None, table.names[int(rows[r])], "mean",
                                       float(val[r]), float(table.slo[rows[r]]), "ms")
        elif percentile:
            continue                        # p50/p95/p99: the exact path reads the quantile
        elif val_n[j] - slo_n > _SCREEN_TOL * slo_n:
            out[c.index] = "slo"
            if kept is not None:
                kept[c.index] = Reason("slo", c.device.path, None, app.name, "mean", float(val_n[j]), slo_n, "ms")
    return out


def _first_failing(group: np.ndarray, failed: np.ndarray, groups: int) -> np.ndarray:
    """Per group, the position (in ``group``'s order) of its first element with ``failed`` set (a large
    number where none is)."""
    first = np.full(groups, np.iinfo(np.intp).max, dtype=np.intp)
    np.minimum.at(first, group[failed], np.flatnonzero(failed))
    return first




def fcfs_batch(app: App, snapshot: Snapshot, cands: list[Candidate],
                first_fit: bool = True) -> dict[int, Fit | Pending]:
    """``_check``'s outcome with ``tails="bound"`` (not heterogeneous) on FCFS candidates, all at once:
    device index -> a :class:`Fit` or a :class:`Pending` rejection. Mean SLOs from the vectorized means
    of ``policies.fcfs_table`` (``mean_outcomes``); p95/p99 SLOs from the periodic worst case or one
    :func:`perf.latticebounds.decide_quantiles` call over every candidate, each device asking for all its
    percentile tenants as ``bound_values`` does (so its lattice, and the answer, is the same). Left out
    for the per-device path: what ``mean_outcomes`` leaves undecided (a mean at the edge of its SLO, rho
    near 1, a tenant the exact path decides), an execution time that is not a constant. ``first_fit``: ``cands`` are in
    preference order and only the first fit matters (``decide``), so candidates after a certain fit may be
    left out too."""
    out: dict[int, Fit | Pending] = {}
    if not cands:
        return out
    table = fcfs_table(snapshot)
    new = [c.new for c in cands]
    ev = fcfs_evaluate(snapshot, cands, new)
    rows, off = ev.rows, ev.offset
    det = np.bincount(ev.cand, weights=table.e2[rows] > table.e[rows] ** 2, minlength=len(cands)) == 0
    tails: list[int] = []
    for j, o in enumerate(mean_outcomes(app, snapshot, cands, ev)):
        c = cands[j]
        if o == "slo":
            out[c.index] = Pending(c, o)
        elif o == "pass":
            out[c.index] = Fit(c.device, c.profile.name, c.utilization, float(ev.new[j]), c.grouped)
        elif o == "open" and det[j] and ev.det_new[j] and 0.0 < ev.rho[j] < 1.0:
            tails.append(j)
    stat = table.stat[rows]
    n_stat = app.slo.stat
    n_slo = app.slo.latency_ms
    new_open = n_stat in STAT_Q and new[0].cpu is None
    fits = [j for j in range(len(cands)) if isinstance(out.get(cands[j].index), Fit)] if first_fit else []
    if fits:    # the loop stops at the first fit: candidates after it need no tails
        tails = [j for j in tails if j < fits[0]]
    if not tails:
        return out
    # the lattice: every tail candidate's aggregate switch mixture, and a query per percentile tenant
    k_of = np.full(len(cands), -1, dtype=np.intp)
    k_of[tails] = np.arange(len(tails))
    t_idx = np.array(tails, dtype=np.intp)
    size = (off[1:] - off[:-1])[t_idx] + 1
    width = 2 * int(size.max())
    ax = np.zeros((len(tails), width))
    ap = np.zeros((len(tails), width))
    sel = k_of[ev.cand] >= 0
    kr = k_of[ev.cand[sel]]
    pos = (np.arange(rows.size) - off[ev.cand])[sel]
    r_sel = rows[sel]
    e, o, q = table.e[r_sel], table.o[r_sel], ev.q[sel]
    share = table.lam[r_sel] / ev.lam[ev.cand[sel]]
    ax[kr, 2 * pos], ax[kr, 2 * pos + 1] = e, e + o
    ap[kr, 2 * pos], ap[kr, 2 * pos + 1] = share * q, share * (1.0 - q)
    last = size - 1
    e_n, o_n, q_n = ev.e_new[t_idx], ev.o_new[t_idx], ev.q_new[t_idx]
    share_n = ev.lam_new[t_idx] / ev.lam[t_idx]
    ar = np.arange(len(tails))
    ax[ar, 2 * last], ax[ar, 2 * last + 1] = e_n, e_n + o_n
    ap[ar, 2 * last], ap[ar, 2 * last + 1] = share_n * q_n, share_n * (1.0 - q_n)
    # queries: the existing percentile tenants (table order), then the new app where it has one
    old_q = np.flatnonzero(sel & (stat == 1))
    qk = k_of[ev.cand[old_q]]
    y = np.stack([table.e[rows[old_q]], table.e[rows[old_q]] + table.o[rows[old_q]]], axis=1)
    rr = np.stack([ev.q[old_q], 1.0 - ev.q[old_q]], axis=1)
    slo_q = table.slo[rows[old_q]]
    net = table.fixed[rows[old_q]]          # an "open" tenant has no CPU stage: its fixed part is the network
    lv = table.level[rows[old_q]]
    if new_open:
        qk = np.concatenate([qk, ar])
        y = np.concatenate([y, np.stack([e_n, e_n + o_n], axis=1)])
        rr = np.concatenate([rr, np.stack([q_n, 1.0 - q_n], axis=1)])
        slo_q = np.concatenate([slo_q, np.full(len(tails), n_slo)])
        net = np.concatenate([net, ev.fixed_new[t_idx]])
        lv = np.concatenate([lv, np.full(len(tails), STAT_Q[n_stat])])
    capped = ev.bound[t_idx][qk] + net
    # candidates are in preference order: past the first certified fit the lattice need not refine
    queues, queries = Queues(ev.lam[t_idx], ax, ap), Queries(qk, y, rr, slo_q - net, lv)
    if first_fit:
        ok, undecided = first_fit_quantiles(queues, queries, known_ok=capped <= slo_q)
    else:
        ok, _ = decide_quantiles(queues, queries)
        ok |= capped <= slo_q
        undecided = np.zeros(ok.size, dtype=bool)
    # a percentile tenant passes when the lattice certifies it or the periodic worst case does
    good = ok
    skip = np.bincount(qk, weights=undecided, minlength=len(tails)) > 0
    bad = np.bincount(qk, weights=~good, minlength=len(tails)) > 0
    if new_open:
        # the new app's quantile is certified within its SLO (or the periodic worst case): report that bound
        # (a Fit's latency is only ranked with heterogeneous, which does not take this path)
        k0 = old_q.size
        mine = np.minimum(slo_q[k0:], capped[k0:])
    else:
        mine = ev.new[t_idx]
    for k, j in enumerate(tails):
        c = cands[j]
        if skip[k]:
            continue
        out[c.index] = Pending(c, "slo") if bad[k] else \
            Fit(c.device, c.profile.name, c.utilization, float(mine[k]), c.grouped)
    return out


def settle_tails(tenants: list[Tenant], owners: list[App], verdicts: list[str]) -> dict[int, float]:
    """Settle the "open" verdicts (p95/p99 on an Edge TPU, no CPU stage) in place where decisive (see
    ``_check``); returns an upper bound (end to end, ms) of each tenant settled as pass.

    The estimate ``predict_device`` gives is ``min(x, B) + network`` with x the DFT inversion and B the
    periodic worst-case bound (``perf.periodic``, ``None`` unless every tenant is periodic). With
    ``lo <= x <= hi`` up to the allowance ``tol``: pass when ``B + network <= SLO`` or ``hi + tol +
    network <= SLO``; ``slo`` when ``lo - tol + network > SLO`` and B (if any) ``+ network > SLO``."""
    which = [i for i, v in enumerate(verdicts) if v == "open"]
    if not which:
        return {}
    cap = periodic_fcfs_bound(tenants)
    db = edgetpu_decision_bounds(tenants, TAIL_QS, which)
    upper: dict[int, float] = {}
    for i in which:
        net = tenants[i].network_ms
        slo = owners[i].slo.latency_ms
        capped = cap is not None and cap + net <= slo
        if db is None:
            if capped:
                verdicts[i] = "pass"
                upper[i] = cap + net  # type: ignore[operator]
            continue
        q = STAT_Q[owners[i].slo.stat]
        qb = db.bound(i, q, tight=False)        # cheap first; tighter upper bounds only if needed
        hi = qb.upper + db.tolerance_ms(qb.upper)
        lo = qb.lower - db.tolerance_ms(qb.lower)
        for step in (1, 2):
            if capped or hi + net <= slo or lo + net > slo:
                break
            ref = db.bound(i, q).upper if step == 1 else db.refined_upper(i, q)
            hi = ref + db.tolerance_ms(ref)
        if capped or hi + net <= slo:
            verdicts[i] = "pass"
            upper[i] = min(hi, math.inf if cap is None else cap) + net
        elif lo + net > slo and (cap is None or cap + net > slo):
            verdicts[i] = "slo"
    return upper
