"""``ibis``: Ibis Algorithm 1, latency-aware online knapsack placement (Liang et al., paper 000, §4).

A device is feasible for an app when (Algorithm 1, lines 4-9)

1. resources fit: the node's free CPU cores and memory, the device's free memory (a shared,
   AI-as-a-Service app joining a loaded copy of its model needs no device memory);
2. utilization after placement is at most ``max_utilization`` (``maxRho``, default 0.9);
3. every tenant on the device, the new one and every existing one, still meets its SLO at its own
   statistic (mean, p95, p99 from ``perf.device.predict_device``). A statistic the estimator cannot give
   for a tenant (a tail on a PS-type device, or with a CPU stage) makes the device infeasible with the
   constraint ``no-estimate``: Ibis never guesses.

Among feasible devices: the most utilized after placement (``choice="tight"``, worst fit, the default) or
the least utilized (``choice="spread"``). ``heterogeneous=True`` (§4.1.1) instead picks the device where the
new app's predicted latency is lowest, so the accelerator kind is chosen by the models, ties broken by the
utilization rule. A shared app (AI as a Service, lines 13-15) prefers feasible devices that already hold
its model.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace

import numpy as np

from edgemux.cluster.state import App, Device, Placement, Share
from edgemux.cluster.workload import DeviceSpec, Discipline, Tenant
from edgemux.perf.device import TenantEstimate, device_utilization, fcfs_responses, fcfs_tails, predict_device
from edgemux.perf.gpu import batch_responses, gpu_ps_responses, mps_responses, timeshare_responses
from edgemux.perf.result import Latency, Unstable
from edgemux.perf.periodic import periodic_fcfs_bound
from edgemux.perf.latticebounds import (
    Queries,
    Queues,
    decide_quantiles,
    device_quantile_verdicts,
    first_fit_quantiles,
)
from edgemux.perf.tailbounds import edgetpu_decision_bounds
from edgemux.perf.tandem import end_to_end, tenant_cpu_ms
from edgemux.perf.dutycycle import EPS
from edgemux.profiles.distributions import second_moment
from edgemux.profiles.types import Profile
from edgemux.policies.fcfs_table import SCREEN_TOL, fcfs_table, mean_outcomes
from edgemux.policies.fcfs_table import outcome as _outcome
from edgemux.policies.fcfs_table import evaluate as fcfs_evaluate
from edgemux.policies.base import (
    Decision,
    Policy,
    Rejection,
    Snapshot,
    device_spec,
    fit_resources,
    model_key,
    model_memory_mb,
    register,
    resolve_profile,
    summarize,
    tenant_for,
)

CHOICES = ("tight", "spread")
TAILS = ("bound", "estimate")


@dataclass(frozen=True)
class Fit:
    """A feasible device: utilization after placement and the new app's predicted latency at its stat."""

    device: Device
    profile: str
    utilization: float
    latency_ms: float
    grouped: bool


def predict_means(device: DeviceSpec, tenants: list[Tenant]) -> dict[str, Latency]:
    """Every tenant's mean end-to-end latency on ``device``: the ``mean_ms`` of
    ``perf.device.predict_device`` (same estimator per discipline) without the tail inversion, which costs
    far more and is only needed for percentile SLOs."""
    d = device.discipline
    where = device.name
    if d is Discipline.FCFS:
        dev, _ = fcfs_responses(tenants, where=where)
    elif d is Discipline.PS:
        dev = gpu_ps_responses(tenants, where=where)
    elif d is Discipline.GPU_TIMESHARE:
        dev = timeshare_responses(tenants, where=where)
    elif d is Discipline.MPS:
        dev = mps_responses(tenants, device.servers, where=where)
    else:
        dev, _ = batch_responses(tenants, device.max_batch, device.batch_timeout_ms, where=where)
    return {t.name: end_to_end(tenant_cpu_ms(t), x, t.network_ms) for t, x in zip(tenants, dev)}


def slo_value(est: TenantEstimate, stat: str) -> float | Unstable | None:
    """The estimate at an SLO statistic; None when the estimator gives none (p50: not modelled)."""
    if stat == "mean":
        return est.mean_ms
    if stat == "p95":
        return est.p95_ms
    if stat == "p99":
        return est.p99_ms
    return None


@dataclass(slots=True)   # not frozen: built for every candidate of every decision, frozen init costs 3x
class _Candidate:
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
class _Pending:
    """A candidate known to fail the latency check with ``constraint``, found from the cheap mean
    estimates alone; its full :class:`Rejection` (tenant, predicted vs SLO) is built only if reported."""

    cand: _Candidate
    constraint: str


_TAIL_QS = (0.95, 0.99)          # the quantiles ``perf.device.predict_device`` gives (p95, p99)
_STAT_Q = {"p95": 0.95, "p99": 0.99}


def _tails_only(spec: DeviceSpec, tenants: list[Tenant], owners: list[App]) -> bool:
    """An Edge TPU where every percentile SLO is a p95/p99 of a tenant without CPU stage: every tenant
    has an estimate at its statistic (``_fcfs_values`` applies)."""
    return spec.discipline is Discipline.FCFS and all(
        o.slo.stat == "mean" or (o.slo.stat in _STAT_Q and t.cpu is None) for t, o in zip(tenants, owners))


def _fcfs_values(app: App, spec: DeviceSpec, tenants: list[Tenant], owners: list[App],
                 means: dict[str, Latency] | None = None, verdicts: list[str] | None = None,
                 upper: dict[int, float] | None = None) -> dict[str, Latency | None]:
    """Each tenant's estimate at its SLO statistic on an Edge TPU (``_tails_only``), as
    ``perf.device.predict_device`` gives it (mean end to end; ``p95``/``p99`` = the P-K inversion capped by
    the periodic bound, plus the network latency), except that a tenant other than the new app whose
    tail verdict is a pass from the rigorous bounds (``Ibis._settle_tails``; ``verdicts``/``upper`` as
    ``_check`` leaves them, computed here when not given) gets its upper bound, which meets its SLO, and a
    tenant after one certainly over its SLO (never read by ``_judge``) gets ``inf``: the inversion is run
    only for the other percentile tenants (one W, their own services)."""
    if means is None:
        means = predict_means(spec, tenants)
    if verdicts is None:
        verdicts = ["pass" if o.slo.stat == "mean" else "open" for o in owners]
        upper = Ibis._settle_tails(tenants, owners, verdicts)
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
            values[tenants[i].name] = tails[i][_TAIL_QS.index(_STAT_Q[owners[i].slo.stat])]
    return values


def _bound_values(spec: DeviceSpec, tenants: list[Tenant], owners: list[App],
                  means: dict[str, Latency] | None = None) -> dict[str, Latency | None] | None:
    """Each tenant's value at its SLO statistic on an Edge TPU (``_tails_only``) with ``tails="bound"``: the
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
    qs = [_STAT_Q[owners[i].slo.stat] for i in which]
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


def _judge(app: App, cand: _Candidate, owners: list[App], values: dict[str, Latency | None],
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
    return Fit(cand.device, cand.profile.name, cand.utilization, mine, cand.grouped)


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
    a2 = np.zeros(n)
    usable = np.zeros(n, dtype=bool)
    for i, (d, load) in enumerate(zip(arr.devices, arr.loads)):
        if d.discipline is not Discipline.GPU_TIMESHARE:
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
            a2[i] += x * second_moment(t.service)
        usable[i] = ok
    f = np.array
    table = _TimeshareTable(f(dev, dtype=np.intp), f(s, dtype=float), f(lam, dtype=float),
                            f(fixed, dtype=float), f(slo, dtype=float), a2, usable)
    snapshot.__dict__[_TS_KEY] = table
    return table


def _timeshare_screen(app: App, snapshot: Snapshot, cands: list[_Candidate]) -> dict[int, str]:
    """The latency verdict ``_latency`` would reach on time-shared GPU candidates where it is certainly a
    rejection, computed for all of them at once: device index -> ``"slo"`` or ``"no-estimate"``.

    On such a device ``_latency`` evaluates every tenant's mean end to end, ``lowest_priority_bound`` plus
    its CPU stage and network, in tenant order (existing tenants, then the new app) and reports the first
    that misses its SLO (``slo``) or has no estimate at its statistic (``no-estimate``: the new app with a
    percentile SLO). The same closed form is evaluated here over the snapshot's tenant arrays. A device is
    left out (decided by the exact path) when an existing tenant has a percentile SLO, when any value is
    within ``_SCREEN_TOL`` of its SLO, or when the device would be saturated; passing devices are left out
    too, so every placement still comes from the exact check."""
    gpu = [c for c in cands if c.device.discipline is Discipline.GPU_TIMESHARE]
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
    for j, c in enumerate(gpu):
        if not live[j] or unsure[j]:
            continue
        if fail[j]:
            out[c.index] = "slo"
        elif percentile:
            out[c.index] = "no-estimate"
        elif val_n[j] - slo_n > _SCREEN_TOL * slo_n:
            out[c.index] = "slo"
    return out




def _fcfs_batch(app: App, snapshot: Snapshot, cands: list[_Candidate],
                first_fit: bool = True) -> dict[int, Fit | _Pending]:
    """``_check``'s outcome with ``tails="bound"`` (not heterogeneous) on FCFS candidates, all at once:
    device index -> a :class:`Fit` or a :class:`_Pending` rejection. Mean SLOs from the vectorized means
    of ``policies.fcfs_table`` (``mean_outcomes``); p95/p99 SLOs from the periodic worst case or one
    :func:`perf.latticebounds.decide_quantiles` call over every candidate, each device asking for all its
    percentile tenants as ``_bound_values`` does (so its lattice, and the answer, is the same). Left out
    for the per-device path: what ``mean_outcomes`` leaves undecided (a mean at the edge of its SLO, rho
    near 1, an open tenant before a "no-estimate" one), any other "no-estimate"
    case the means do not settle, an execution time that is not a constant. ``first_fit``: ``cands`` are in
    preference order and only the first fit matters (``decide``), so candidates after a certain fit may be
    left out too."""
    out: dict[int, Fit | _Pending] = {}
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
        if o in ("slo", "no-estimate"):
            out[c.index] = _Pending(c, o)
        elif o == "pass":
            out[c.index] = Fit(c.device, c.profile.name, c.utilization, float(ev.new[j]), c.grouped)
        elif o == "open" and det[j] and ev.det_new[j] and 0.0 < ev.rho[j] < 1.0:
            tails.append(j)
    stat = table.stat[rows]
    n_stat = app.slo.stat
    n_slo = app.slo.latency_ms
    new_open = n_stat in _STAT_Q and new[0].cpu is None
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
        lv = np.concatenate([lv, np.full(len(tails), _STAT_Q[n_stat])])
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
        out[c.index] = _Pending(c, "slo") if bad[k] else \
            Fit(c.device, c.profile.name, c.utilization, float(mine[k]), c.grouped)
    return out


@register("ibis")
class Ibis(Policy):
    def __init__(self, max_utilization: float = 0.9, choice: str = "tight",
                 heterogeneous: bool = False, tails: str = "bound") -> None:
        if choice not in CHOICES:
            raise ValueError(f"choice must be one of {', '.join(CHOICES)}, got {choice!r}")
        if tails not in TAILS:
            raise ValueError(f"tails must be one of {', '.join(TAILS)}, got {tails!r}")
        self.tails = tails
        if not (0 < max_utilization <= 1):
            raise ValueError(f"max_utilization must be in (0, 1], got {max_utilization!r}")
        self.max_utilization = max_utilization
        self.choice = choice
        self.heterogeneous = heterogeneous

    # ------------------------------------------------------------------ the two steps of feasibility

    def _new_tenant(self, app: App, profile: Profile) -> Tenant:
        # one Tenant per (app, profile) within a decision: devices of a kind share it
        memo = self.__dict__.setdefault("_memo", {})
        key = (app, profile.name)
        if key not in memo:
            if len(memo) > 64:
                memo.clear()
            memo[key] = tenant_for(app, profile)
        return memo[key]

    def _cheap(self, app: App, snapshot: Snapshot, device: Device, index: int = 0) -> _Candidate | Rejection:
        """Algorithm 1 lines 5-6, 8: resources fit and utilization after placement <= maxRho."""
        profile = fit_resources(app, snapshot, device)
        if isinstance(profile, Rejection):
            return profile
        load = snapshot.load(device)
        new = self._new_tenant(app, profile)
        if device.discipline in (Discipline.PS, Discipline.GPU_TIMESHARE, Discipline.MPS):
            c = device.servers if device.discipline is Discipline.MPS else 1.0
            before = load.work / c                       # additive: cached aggregate, no per-tenant pass
            rho = before + new.rate_rps / 1000.0 * new.service.mean / c
        elif device.discipline is Discipline.FCFS:
            before = -1.0
            rho = load.fcfs_utilization(new)
        else:
            before = -1.0
            rho = device_utilization(device_spec(device), [*load.tenants, new])
        if not rho <= self.max_utilization:
            if before < 0:
                before = device_utilization(device_spec(device), load.tenants) if load.tenants else 0.0
            return Rejection(app.name, "utilization", device=device.path, requested=rho - before,
                             used=before, capacity=self.max_utilization, unit="(rho)")
        grouped = app.shared and model_key(app, profile) in load.models
        return _Candidate(index, device, profile, load.tenants, new, rho, grouped)

    def _latency(self, app: App, snapshot: Snapshot, cand: _Candidate) -> Fit | Rejection:
        """Algorithm 1 line 7: every tenant (new and existing) meets its SLO at its own statistic.

        The estimates are those of ``perf.device.predict_device``. On an Edge TPU where every percentile
        SLO is a p95/p99 of a tenant without CPU stage (so every tenant has an estimate) they are computed
        by ``_fcfs_values``: the same numbers, the tail inverted only for the tenants whose verdict the
        rigorous bounds do not settle as a pass (and for the new app, whose estimate a :class:`Fit`
        carries)."""
        apps = snapshot.apps
        owners = [app if t.name == app.name else apps[t.name] for t in cand.tenants]
        spec = device_spec(cand.device)
        if all(o.slo.stat == "mean" for o in owners):
            means = predict_means(spec, cand.tenants)
            values: dict[str, Latency | None] = dict(means)
            method = "mean"
        elif _tails_only(spec, cand.tenants, owners):
            bound = _bound_values(spec, cand.tenants, owners) if self.tails == "bound" else None
            values = _fcfs_values(app, spec, cand.tenants, owners) if bound is None else bound
            method = "fcfs"  # unused: every tenant has an estimate
        else:
            est = predict_device(spec, cand.tenants)
            values = {t.name: slo_value(est[t.name], o.slo.stat) for t, o in zip(cand.tenants, owners)}
            method = next(iter(est.values())).method
        return _judge(app, cand, owners, values, method)

    def _check(self, app: App, snapshot: Snapshot, cand: _Candidate) -> Fit | Rejection | _Pending:
        """``_latency``'s outcome, skipping the tail inversion where it cannot change it.

        Every tenant gets a verdict: a mean-SLO tenant from the (cheap, exact) means, pass or ``slo``; a
        percentile SLO with no estimator (PS-type device, CPU stage, p50) ``no-estimate``; a p95/p99 SLO
        on an Edge TPU first "open", then settled where the rigorous quantile bounds of
        ``perf.tailbounds`` (Cramér-Lundberg, proved there) are decisive with the allowance for the DFT
        estimate's error: pass when ``upper + tol <= SLO``, ``slo`` when ``lower - tol > SLO``. ``_latency``
        reports the first tenant (in order) that is not a pass; an open tenant can only end up pass or
        ``slo``. So the device is infeasible with ``slo`` when a ``slo`` verdict comes before any
        ``no-estimate``, with ``no-estimate`` when one comes before any open tenant, feasible when all pass
        (not used with ``heterogeneous``, whose ranking needs the estimate itself); otherwise
        ``_latency`` runs (the exact inversion). A feasible :class:`Fit` from the bounds carries the new
        app's mean, or for a percentile SLO the upper bound, as ``latency_ms`` (unused without
        ``heterogeneous``)."""
        apps = snapshot.apps
        owners = [app if t.name == app.name else apps[t.name] for t in cand.tenants]
        if all(o.slo.stat == "mean" for o in owners):
            return self._latency(app, snapshot, cand)
        means = predict_means(device_spec(cand.device), cand.tenants)
        fcfs = cand.device.discipline is Discipline.FCFS
        verdicts: list[str] = []
        for t, owner in zip(cand.tenants, owners):
            stat = owner.slo.stat
            if stat == "mean":
                v = means[t.name]
                verdicts.append("slo" if isinstance(v, Unstable) or v > owner.slo.latency_ms else "pass")
            elif fcfs and t.cpu is None and stat in ("p95", "p99"):
                verdicts.append("open")
            else:
                verdicts.append("no-estimate")
        outcome = _outcome(verdicts)
        if outcome in ("slo", "no-estimate"):
            return _Pending(cand, outcome)
        if self.tails == "bound":
            # what _latency computes, reusing the means just computed (the lattice bounds need no shortcut)
            spec = device_spec(cand.device)
            if type(self)._latency is Ibis._latency and _tails_only(spec, cand.tenants, owners):
                values = _bound_values(spec, cand.tenants, owners, means)
                if values is not None:
                    return _judge(app, cand, owners, values, "fcfs")
            return self._latency(app, snapshot, cand)
        upper = self._settle_tails(cand.tenants, owners, verdicts)
        outcome = _outcome(verdicts)
        if outcome in ("slo", "no-estimate"):
            return _Pending(cand, outcome)
        if outcome == "pass" and not self.heterogeneous:
            i = next(k for k, t in enumerate(cand.tenants) if t.name == app.name)
            mine = means[app.name] if owners[i].slo.stat == "mean" else upper[i]
            return Fit(cand.device, cand.profile.name, cand.utilization, float(mine), cand.grouped)
        if "no-estimate" in verdicts or type(self)._latency is not Ibis._latency:
            return self._latency(app, snapshot, cand)
        values = _fcfs_values(app, device_spec(cand.device), cand.tenants, owners, means, verdicts, upper)
        return _judge(app, cand, owners, values, "fcfs")

    @staticmethod
    def _settle_tails(tenants: list[Tenant], owners: list[App], verdicts: list[str]) -> dict[int, float]:
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
        db = edgetpu_decision_bounds(tenants, _TAIL_QS, which)
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
            q = _STAT_Q[owners[i].slo.stat]
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

    def evaluate(self, app: App, snapshot: Snapshot, device: Device) -> Fit | Rejection:
        """Algorithm 1 lines 4-8 on one device: a :class:`Fit` or why not."""
        c = self._cheap(app, snapshot, device)
        return c if isinstance(c, Rejection) else self._latency(app, snapshot, c)

    def filter(self, app: App, snapshot: Snapshot, device: Device) -> Rejection | None:
        r = self.evaluate(app, snapshot, device)
        return r if isinstance(r, Rejection) else None

    def _util_key(self, utilization: float) -> float:
        return utilization if self.choice == "tight" else -utilization

    def score(self, app: App, snapshot: Snapshot, device: Device) -> float:
        """Utilization after placement (tight) or its negative (spread); with ``heterogeneous`` the
        negative predicted latency of the app. ``decide`` ranks by (grouped, [latency,] utilization)."""
        r = self.evaluate(app, snapshot, device)
        if isinstance(r, Rejection):
            return -math.inf
        return -r.latency_ms if self.heterogeneous else self._util_key(r.utilization)

    # ---------------------------------------------------------------------------------- decision

    # ------------------------------------------------------------------ all devices at once

    def _screened(self) -> bool:
        """True when ``_screen`` gives exactly what ``_cheap`` over ``candidates`` gives (a subclass that
        changes either falls back to the per-device loop)."""
        cls = type(self)
        return cls.candidates is Policy.candidates and cls._cheap is Ibis._cheap

    def _screen(self, app: App, snapshot: Snapshot) -> tuple[list[_Candidate], list[str | None]]:
        """``_cheap`` on every device of the cluster at once: the candidates (cluster order) and, per device
        index, the constraint that rejects it (``None`` for a candidate). Resource checks and additive
        utilization are numpy expressions over the snapshot's arrays doing the same floating-point operations
        as ``_cheap``; an FCFS device is computed exactly (``DeviceLoad.fcfs_utilization``) only when the
        bound ``work + new work`` (its utilization without switches, a lower bound) does not already exceed
        the cap; a batching device goes through ``_cheap`` itself."""
        arr = snapshot.arrays
        n = len(arr.devices)
        ok = np.ones(n, dtype=bool)
        why: list[str | None] = [None] * n

        def reject(mask: np.ndarray, constraint: str) -> None:
            hit = mask & ok
            for i in np.flatnonzero(hit).tolist():
                why[i] = constraint
            ok[hit] = False

        if app.cpu_cores > 0:
            reject(arr.node_cpu_used + app.cpu_cores > arr.node_cpu + EPS, "cpu")
        if app.memory_mb > 0:
            reject(arr.node_mem_used + app.memory_mb > arr.node_mem + EPS, "node-memory")
        cands: list[_Candidate] = []
        maxu = self.max_utilization
        for (kind, _), idx in arr.groups.items():
            profile = resolve_profile(app, arr.devices[int(idx[0])], snapshot.catalog)
            if profile is None:
                for i in idx.tolist():
                    why[i] = "no-profile"   # the first check: overrides node rejections
                ok[idx] = False
                continue
            sub = idx[ok[idx]]
            if not len(sub):
                continue
            key = model_key(app, profile)
            present = np.zeros(n, dtype=bool)
            if key in arr.model_devices:
                present[arr.model_devices[key]] = True
            need = model_memory_mb(profile, arr.devices[int(sub[0])])
            mem_bad = np.zeros(n, dtype=bool)
            mem_bad[sub] = ~present[sub] & (arr.mem_used[sub] + need > arr.mem[sub] + EPS)
            reject(mem_bad, "device-memory")
            sub = sub[ok[sub]]
            if not len(sub):
                continue
            new = self._new_tenant(app, profile)
            x = new.rate_rps / 1000.0 * new.service.mean
            rho = np.full(n, np.nan)
            add = sub[arr.additive[sub]]
            rho[add] = arr.work[add] / arr.divisor[add] + x / arr.divisor[add]
            fc = sub[arr.fcfs[sub]]
            lower = arr.work[fc] + x
            sure = (lower > maxu) & (arr.rate[fc] + new.rate_rps > 0.0)
            rest = fc[~sure]
            if rest.size:
                rho[rest] = arr.fcfs_utilizations(new, rest)
                # the numpy sums may differ from fsum's in the last bits: recompute next to the cap
                for i in rest[np.abs(rho[rest] - maxu) <= 1e-9 * maxu].tolist():
                    rho[i] = arr.loads[i].fcfs_utilization(new)
            bad = np.zeros(n, dtype=bool)
            bad[fc[sure]] = True
            bad[add] = ~(rho[add] <= maxu)
            rest = fc[~sure]
            bad[rest] = ~(rho[rest] <= maxu)
            reject(bad, "utilization")
            for i in sub[ok[sub]].tolist():
                device, load = arr.devices[i], arr.loads[i]
                if arr.additive[i] or arr.fcfs[i]:
                    cands.append(_Candidate(i, device, profile, load.tenants, new, float(rho[i]),
                                            bool(app.shared and present[i])))
                else:
                    c = self._cheap(app, snapshot, device, i)
                    if isinstance(c, Rejection):
                        ok[i] = False
                        why[i] = c.constraint
                    else:
                        cands.append(c)
        cands.sort(key=lambda c: c.index)
        return cands, why

    def _cheap_all(self, app: App, snapshot: Snapshot) -> tuple[list[_Candidate], list[Rejection] | None,
                                                                  list[str | None] | None]:
        """The cheap checks over the candidate devices: (candidates in device order, the rejections in device
        order or ``None`` when screened, the per-device constraints when screened)."""
        if self._screened():
            cands, why = self._screen(app, snapshot)
            return cands, None, why
        rejections: list[Rejection] = []
        cands = []
        for i, device in enumerate(self.candidates(app, snapshot)):
            c = self._cheap(app, snapshot, device, i)
            if isinstance(c, Rejection):
                rejections.append(c)
            else:
                cands.append(c)
        return cands, rejections, None

    def _vector_latency(self) -> bool:
        """True when the vectorized time-sharing screen gives what ``_check`` would (a subclass that
        changes the checks falls back to them)."""
        cls = type(self)
        return self._screened() and cls._check is Ibis._check and cls._latency is Ibis._latency

    def _rank(self, cands: list[_Candidate]) -> list[_Candidate]:
        """``cands`` best first: grouped (its model already loaded, for a shared app) before the others, then
        by utilization after placement (most utilized first with ``tight``, least with ``spread``), ties to
        the earlier device. One lexsort: a Python key per candidate costs more on big clusters."""
        n = len(cands)
        if n < 2:
            return list(cands)
        grouped = np.fromiter((c.grouped for c in cands), dtype=bool, count=n)
        util = np.fromiter((c.utilization for c in cands), dtype=float, count=n)
        index = np.fromiter((c.index for c in cands), dtype=np.intp, count=n)
        order = np.lexsort((index, -util if self.choice == "tight" else util, ~grouped))
        return [cands[i] for i in order.tolist()]

    def _batched(self) -> bool:
        """True when Edge TPU candidates are decided all at once (``_fcfs_batch``): the vectorized path, with
        certified tail bounds, and a choice that needs no per-device latency (not heterogeneous)."""
        return self._vector_latency() and self.tails == "bound" and not self.heterogeneous

    def _resolve(self, app: App, snapshot: Snapshot, p: _Pending) -> Rejection:
        r = self._latency(app, snapshot, p.cand)
        assert isinstance(r, Rejection) and r.constraint == p.constraint, (r, p.constraint)
        return r

    def _summarize(self, app: App, snapshot: Snapshot, cheap: list[Rejection] | None,
                   why: list[str | None] | None, pending: list[Rejection | _Pending]) -> Rejection:
        """``summarize`` of (cheap rejections in device order + latency rejections), building only the one
        rejection it reports when the cheap checks were screened or a latency rejection is pending."""
        late = [self._resolve(app, snapshot, r) if isinstance(r, _Pending) else r for r in pending] \
            if cheap is not None else pending
        if cheap is not None:
            return summarize(app, cheap + late)  # type: ignore[operator]
        assert why is not None
        counts = Counter(c for c in why if c is not None)
        counts.update(r.constraint for r in late)
        if not counts:
            return summarize(app, [])
        order = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        top = order[0][0]
        first: Rejection | _Pending | None = next((r for r in late if r.constraint == top), None)
        if isinstance(first, _Pending):
            first = self._resolve(app, snapshot, first)
        if top in why:
            i = why.index(top)
            r = self._cheap(app, snapshot, snapshot.arrays.devices[i], i)
            assert isinstance(r, Rejection) and r.constraint == top, (r, top)
            first = r
        assert first is not None
        return replace(first, counts=tuple(order))

    # ---------------------------------------------------------------------------------- decision

    def decide(self, app: App, snapshot: Snapshot) -> Decision:
        """Algorithm 1. The latency check is the costly step, so it runs last: devices passing the cheap
        checks are visited best score first, and (unless ``heterogeneous``, whose score is the latency
        itself) the first one meeting every SLO is the answer; ties go to the earlier device."""
        if app.name in snapshot.placements:
            return Rejection(app.name, "duplicate", detail="an app of this name is already placed")
        cands, cheap, why = self._cheap_all(app, snapshot)
        cands = self._rank(cands)
        vector = self._vector_latency()
        sure = _timeshare_screen(app, snapshot, cands) if vector else {}
        batched = self._batched()
        fcfs = [c for c in cands if c.device.discipline is Discipline.FCFS] if batched else []
        done: dict[int, Fit | _Pending] = {}
        next_fcfs = 0       # fcfs[:next_fcfs] have been through _fcfs_batch
        chunk = 8           # grows: a decision that finds a fit early pays for a few devices only
        late: list[Rejection | _Pending] = []
        best: tuple[tuple[float, ...], Fit] | None = None
        for c in cands:
            if c.index in sure:
                late.append(_Pending(c, sure[c.index]))
                continue
            if batched and c.device.discipline is Discipline.FCFS and c.index not in done \
                    and next_fcfs < len(fcfs):
                done.update(_fcfs_batch(app, snapshot, fcfs[next_fcfs:next_fcfs + chunk]))
                next_fcfs += chunk
                chunk *= 1000
            r = done[c.index] if c.index in done else self._check(app, snapshot, c)
            if not isinstance(r, Fit):
                late.append(r)
                continue
            if not self.heterogeneous:
                best = ((), r)
                break
            key = (float(r.grouped), -r.latency_ms, self._util_key(r.utilization))
            if best is None or key > best[0]:
                best = (key, r)
        if best is None:
            return self._summarize(app, snapshot, cheap, why, late)
        fit = best[1]
        return Placement(app.name, (Share(fit.device.path, 1.0, fit.profile),), cpu_node=fit.device.node)
