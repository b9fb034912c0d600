"""``ibis``: Ibis Algorithm 1, latency-aware online knapsack placement (Liang et al., paper 000, §4).

A device is feasible for an app when (Algorithm 1, lines 4-9)

1. resources fit: the node's free CPU cores and memory, the device's free memory (a shared,
   AI-as-a-Service app joining a loaded copy of its model needs no device memory);
2. utilization after placement is at most ``max_utilization`` (``maxRho``, default 0.9);
3. every tenant on the device, the new one and every existing one, still meets its SLO at its own
   statistic (mean, p50, p95, p99 from ``perf.device.predict_device``: every discipline gives each, exact
   where a law is known and a validated approximation elsewhere, ``perf.sojourn``). A statistic an
   estimator could not give would make the device infeasible with the constraint ``no-estimate``: Ibis
   never guesses.

Among feasible devices: the most utilized after placement (``choice="tight"``, worst fit, the default) or
the least utilized (``choice="spread"``). ``heterogeneous=True`` (§4.1.1) instead picks the device where the
new app's predicted latency is lowest, so the accelerator kind is chosen by the models, ties broken by the
utilization rule. A shared app (AI as a Service, lines 13-15) prefers feasible devices that already hold
its model.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from edgemux.cluster.state import App, Device, Placement, Share
from edgemux.cluster.disciplines import capacity, traits
from edgemux.cluster.workload import Tenant
from edgemux.perf.device import device_utilization, predict_device
from edgemux.perf.estimators import estimator_for
from edgemux.perf.result import Latency, Unstable
from edgemux.perf.dutycycle import EPS
from edgemux.profiles.types import Profile
from edgemux.policies.fcfs_table import outcome as _outcome
from edgemux.policies.feasibility import (
    settle_tails,
    Candidate,
    Fit,
    Pending,
    bound_values,
    fcfs_batch,
    fcfs_values,
    judge,
    predict_means,
    slo_value,
    STAT_Q,
    tails_only,
    timeshare_screen,
)
from edgemux.policies.ibis_reasons import pending_reason, screened_reason
from edgemux.policies.base import (
    Decision,
    Policy,
    Reason,
    Rejection,
    Snapshot,
    closest,
    count_constraints,
    device_spec,
    fit_resources,
    memory_key,
    model_memory_mb,
    resolve_profile,
    spatial_fit,
    summarize,
    tenant_for,
)
from edgemux.policies.registry import register

CHOICES = ("tight", "spread")
TAILS = ("bound", "estimate")


@register("ibis")
class Ibis(Policy):
    BATCH_GROWTH = 8
    """How much larger each batch of Edge TPU candidates (``fcfs_batch``) is than the one before: 8, 64, 512...
    A batch's cost grows with its candidates, and a fit is usually among the first few dozen (the most
    utilized devices first with ``tight``): on 4,000 devices a second batch of every other candidate took
    ~200 ms where the fit was the 9th to 26th. The decision does not depend on it: each candidate's outcome
    in a batch is its own, and those a batch leaves out come after a fit."""

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

    def _new_tenant(self, app: App, profile: Profile, serving_ms: float) -> Tenant:
        # one Tenant per (app, profile, serving path) within a decision: devices of a kind share it
        memo = self.__dict__.setdefault("_memo", {})
        key = (app, profile.name, serving_ms)
        hit = memo.get(key)
        # a name is not enough: a re-calibrated catalog (adapt.calibrate) keeps the name with new figures
        if hit is None or hit[0] is not profile:
            if len(memo) > 64:
                memo.clear()
            hit = memo[key] = (profile, tenant_for(app, profile, serving_ms=serving_ms))
        return hit[1]

    def precheck(self, app: App, snapshot: Snapshot, device: Device, index: int = 0) -> Candidate | Rejection:
        """Algorithm 1 lines 5-6, 8: resources fit and utilization after placement <= maxRho."""
        profile = fit_resources(app, snapshot, device)
        if isinstance(profile, Rejection):
            return profile
        load = snapshot.load(device)
        new = self._new_tenant(app, profile, device.serving_ms)
        tr = traits(device.discipline)
        if tr.spatial:
            spatial = spatial_fit(app, profile, load, new, self.max_utilization)
            if isinstance(spatial, Rejection):
                return spatial
            new = spatial
        if tr.shares:
            c = capacity(device)
            before = load.work / c                       # additive: cached aggregate, no per-tenant pass
            rho = before + new.rate_rps / 1000.0 * new.service.mean / c
        elif tr.one_queue:
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
        grouped = app.shared and memory_key(app, profile) in load.models
        return Candidate(index, device, profile, load.tenants, new, rho, grouped)

    def _latency(self, app: App, snapshot: Snapshot, cand: Candidate) -> Fit | Rejection:
        """Algorithm 1 line 7: every tenant (new and existing) meets its SLO at its own statistic.

        The estimates are those of ``perf.device.predict_device``. On an Edge TPU where every percentile
        SLO is a p95/p99 of a tenant without CPU stage (so every tenant has an estimate) they are computed
        by ``fcfs_values``: the same numbers, the tail inverted only for the tenants whose verdict the
        rigorous bounds do not settle as a pass (and for the new app, whose estimate a :class:`Fit`
        carries)."""
        apps = snapshot.apps
        owners = [app if t.name == app.name else apps[t.name] for t in cand.tenants]
        spec = device_spec(cand.device)
        if all(o.slo.stat == "mean" for o in owners):
            means = predict_means(spec, cand.tenants)
            values: dict[str, Latency | None] = dict(means)
            method = "mean"
        elif tails_only(spec, cand.tenants, owners):
            bound = bound_values(spec, cand.tenants, owners) if self.tails == "bound" else None
            values = fcfs_values(app, spec, cand.tenants, owners) if bound is None else bound
            method = "fcfs"  # unused: every tenant has an estimate
        else:
            # tails only where an SLO reads one: the laws are the costly part of a prediction
            est = predict_device(spec, cand.tenants,
                                 tails=[t.name for t, o in zip(cand.tenants, owners) if o.slo.stat != "mean"])
            values = {t.name: slo_value(est[t.name], o.slo.stat) for t, o in zip(cand.tenants, owners)}
            method = next(iter(est.values())).method
        return judge(app, cand, owners, values, method)

    def _check(self, app: App, snapshot: Snapshot, cand: Candidate) -> Fit | Rejection | Pending:
        """``_latency``'s outcome, skipping the tail inversion where it cannot change it.

        Off an Edge TPU, or with a p50 tenant or a p95/p99 tenant that has a CPU stage (no certified bound
        settles those), ``_latency`` decides at once. Otherwise every tenant gets a verdict: a mean-SLO
        tenant from the (cheap, exact) means, pass or ``slo``; a p95/p99 SLO first "open", then settled where the rigorous quantile bounds of
        ``perf.tailbounds`` (Cramér-Lundberg, proved there) are decisive with the allowance for the DFT
        estimate's error: pass when ``upper + tol <= SLO``, ``slo`` when ``lower - tol > SLO``. ``_latency``
        reports the first tenant (in order) that is not a pass; an open tenant can only end up pass or
        ``slo``. So the device is infeasible with ``slo`` when a ``slo`` verdict comes, feasible when all pass
        (not used with ``heterogeneous``, whose ranking needs the estimate itself); otherwise
        ``_latency`` runs (the exact inversion). A feasible :class:`Fit` from the bounds carries the new
        app's mean, or for a percentile SLO the upper bound, as ``latency_ms`` (unused without
        ``heterogeneous``)."""
        apps = snapshot.apps
        owners = [app if t.name == app.name else apps[t.name] for t in cand.tenants]
        est = estimator_for(cand.device.discipline)
        if (all(o.slo.stat == "mean" for o in owners) or not est.tail_bounds
                or any(o.slo.stat != "mean" and (o.slo.stat not in STAT_Q or t.cpu is not None)
                       for t, o in zip(cand.tenants, owners))):
            # the bounds settle only an Edge TPU's p95/p99 of tenants without a CPU stage: the estimate decides
            return self._latency(app, snapshot, cand)
        means = predict_means(device_spec(cand.device), cand.tenants)
        verdicts: list[str] = []
        for t, owner in zip(cand.tenants, owners):
            stat = owner.slo.stat
            if stat == "mean":
                v = means[t.name]
                verdicts.append("slo" if isinstance(v, Unstable) or v > owner.slo.latency_ms else "pass")
            else:  # p95/p99 without a CPU stage (anything else went to _latency above)
                verdicts.append("open")
        outcome = _outcome(verdicts)
        if outcome == "slo":
            return Pending(cand, outcome)
        if self.tails == "bound":
            # what _latency computes, reusing the means just computed (the lattice bounds need no shortcut)
            spec = device_spec(cand.device)
            if type(self)._latency is Ibis._latency and tails_only(spec, cand.tenants, owners):
                values = bound_values(spec, cand.tenants, owners, means)
                if values is not None:
                    return judge(app, cand, owners, values, "fcfs")
            return self._latency(app, snapshot, cand)
        upper = settle_tails(cand.tenants, owners, verdicts)
        outcome = _outcome(verdicts)
        if outcome == "slo":
            return Pending(cand, outcome)
        if outcome == "pass" and not self.heterogeneous:
            i = next(k for k, t in enumerate(cand.tenants) if t.name == app.name)
            mine = means[app.name] if owners[i].slo.stat == "mean" else upper[i]
            assert not isinstance(mine, Unstable)  # a pass has a finite value for every tenant
            return Fit(cand.device, cand.profile.name, cand.utilization, float(mine), cand.grouped)
        if type(self)._latency is not Ibis._latency:
            return self._latency(app, snapshot, cand)
        values = fcfs_values(app, device_spec(cand.device), cand.tenants, owners, means, verdicts, upper)
        return judge(app, cand, owners, values, "fcfs")

    def evaluate(self, app: App, snapshot: Snapshot, device: Device) -> Fit | Rejection:
        """Algorithm 1 lines 4-8 on one device: a :class:`Fit` or why not."""
        c = self.precheck(app, snapshot, device)
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

    def screened(self) -> bool:
        """True when ``screen`` gives exactly what ``precheck`` over ``candidates`` gives (a subclass that
        changes either falls back to the per-device loop)."""
        cls = type(self)
        return cls.candidates is Policy.candidates and cls.precheck is Ibis.precheck

    def screen(self, app: App, snapshot: Snapshot) -> tuple[list[Candidate], list[str | None]]:
        """``precheck`` on every device of the cluster at once: the candidates (cluster order) and, per device
        index, the constraint that rejects it (``None`` for a candidate). Resource checks and additive
        utilization are numpy expressions over the snapshot's arrays doing the same floating-point operations
        as ``precheck``; an FCFS device is computed exactly (``DeviceLoad.fcfs_utilization``) only when the
        bound ``work + new work`` (its utilization without switches, a lower bound) does not already exceed
        the cap; a batching device goes through ``precheck`` itself."""
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
        cands: list[Candidate] = []
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
            key = memory_key(app, profile)  # a co-compiled set already on a device costs no memory there
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
            new = self._new_tenant(app, profile, 0.0)  # its load: the same on every device
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
            # one pass in Python per candidate device, so its work is kept small: the app's tenant looked up
            # once per serving path (``_new_tenant``'s, which hashes the app), the arrays' values read at once
            at: dict[float, Tenant] = {}
            keep = sub[ok[sub]]
            quick = (arr.additive[keep] | arr.fcfs[keep]).tolist()
            for i, q, r, pr in zip(keep.tolist(), quick, rho[keep].tolist(), present[keep].tolist()):
                device = arr.devices[i]
                if q:
                    new_t = at.get(device.serving_ms)
                    if new_t is None:
                        new_t = at[device.serving_ms] = self._new_tenant(app, profile, device.serving_ms)
                    cands.append(Candidate(i, device, profile, arr.loads[i].tenants, new_t, r,
                                           bool(app.shared and pr)))
                else:
                    c = self.precheck(app, snapshot, device, i)
                    if isinstance(c, Rejection):
                        ok[i] = False
                        why[i] = c.constraint
                    else:
                        cands.append(c)
        cands.sort(key=lambda c: c.index)
        return cands, why

    def _cheap_all(self, app: App, snapshot: Snapshot) -> tuple[list[Candidate], list[Rejection] | None,
                                                                  list[str | None] | None]:
        """The cheap checks over the candidate devices: (candidates in device order, the rejections in device
        order or ``None`` when screened, the per-device constraints when screened)."""
        if self.screened():
            cands, why = self.screen(app, snapshot)
            return cands, None, why
        rejections: list[Rejection] = []
        cands = []
        for i, device in enumerate(self.candidates(app, snapshot)):
            c = self.precheck(app, snapshot, device, i)
            if isinstance(c, Rejection):
                rejections.append(c)
            else:
                cands.append(c)
        return cands, rejections, None

    def vector_latency(self) -> bool:
        """True when the vectorized time-sharing screen gives what ``_check`` would (a subclass that
        changes the checks falls back to them)."""
        cls = type(self)
        return self.screened() and cls._check is Ibis._check and cls._latency is Ibis._latency

    def _rank(self, cands: list[Candidate]) -> list[Candidate]:
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

    def batched(self) -> bool:
        """True when Edge TPU candidates are decided all at once (``fcfs_batch``): the vectorized path, with
        certified tail bounds, and a choice that needs no per-device latency (not heterogeneous)."""
        return self.vector_latency() and self.tails == "bound" and not self.heterogeneous

    def _resolve(self, app: App, snapshot: Snapshot, p: Pending) -> Rejection:
        r = self._latency(app, snapshot, p.cand)
        assert isinstance(r, Rejection) and r.constraint == p.constraint, (r, p.constraint)
        return r

    def _summarize(self, app: App, snapshot: Snapshot, cheap: list[Rejection] | None,
                   why: list[str | None] | None, pending: list[Rejection | Pending]) -> Rejection:
        """``summarize`` of (cheap rejections in device order + latency rejections), building only the one
        full rejection it reports (the closest device's) when the cheap checks were screened or a latency
        rejection is pending; the other devices' reasons come from the numbers the checks had, or from the
        means where only a mean tells which tenant would break (``ibis_reasons.pending_reason``)."""
        if cheap is not None:
            late = [self._resolve(app, snapshot, r) if isinstance(r, Pending) else r for r in pending]
            return summarize(app, cheap + late)
        assert why is not None
        rejected = [(i, c) for i, c in enumerate(why) if c is not None]
        if not rejected and not pending:
            return summarize(app, [])
        reasons = [screened_reason(self, app, snapshot, i, c) for i, c in rejected]
        reasons += [pending_reason(self, app, snapshot, r) if isinstance(r, Pending) else r.reason for r in pending]
        k = closest(reasons)
        if k < len(rejected):
            i, c = rejected[k]
            full = self.precheck(app, snapshot, snapshot.arrays.devices[i], i)
            assert isinstance(full, Rejection) and full.constraint == c, (full, c)
        else:
            item = pending[k - len(rejected)]
            full = self._resolve(app, snapshot, item) if isinstance(item, Pending) else item
        constraints = [c for _, c in rejected] + [r.constraint for r in pending]
        return replace(full, counts=count_constraints(constraints), reasons=tuple(reasons))

    # ---------------------------------------------------------------------------------- decision

    def place(self, app: App, snapshot: Snapshot) -> Decision:
        """Algorithm 1, filter and score over every device at once. The latency check is the costly step, so
        it runs last: devices passing the cheap checks are visited best score first, and (unless
        ``heterogeneous``, whose score is the latency itself) the first one meeting every SLO is the answer;
        ties go to the earlier device."""
        cands, cheap, why = self._cheap_all(app, snapshot)
        cands = self._rank(cands)
        vector = self.vector_latency()
        kept: dict[int, Reason] = {}    # the screen's numbers for what it rejects, should the app be rejected
        sure = timeshare_screen(app, snapshot, cands, kept) if vector else {}
        batched = self.batched()
        fcfs = [c for c in cands if traits(c.device.discipline).one_queue] if batched else []
        done: dict[int, Fit | Pending] = {}
        next_fcfs = 0       # fcfs[:next_fcfs] have been through fcfs_batch
        chunk = 8           # grows (BATCH_GROWTH): a decision that finds a fit early pays for a few devices only
        late: list[Rejection | Pending] = []
        best: tuple[tuple[float, ...], Fit] | None = None
        for c in cands:
            if c.index in sure:
                late.append(Pending(c, sure[c.index], kept.get(c.index)))
                continue
            if batched and traits(c.device.discipline).one_queue and c.index not in done \
                    and next_fcfs < len(fcfs):
                done.update(fcfs_batch(app, snapshot, fcfs[next_fcfs:next_fcfs + chunk]))
                next_fcfs += chunk
                chunk *= self.BATCH_GROWTH
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
        return Placement(app.name, (Share(fit.device.path, 1.0, fit.profile, fit.fraction, fit.instances),),
                         cpu_node=fit.device.node)
