"""The reasons an Ibis-family policy gives the devices its screens rejected (``Ibis._summarize``): the numbers a
per-device check would give (what the app needs against what is free, the utilization after placement
against the cap, the first tenant whose SLO breaks), from the snapshot's aggregates and the means, without
running each device's full check. Apart from the policy's class because they only report: no decision reads
them. Units: ms, MB, cores, utilization dimensionless.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from edgemux.cluster.disciplines import capacity
from edgemux.cluster.state import App
from edgemux.perf.result import Unstable
from edgemux.policies.base import Reason, Rejection, Snapshot, device_spec, model_memory_mb, resolve_profile
from edgemux.policies.feasibility import Pending, predict_means

if TYPE_CHECKING:
    from edgemux.policies.ibis import Ibis

__all__ = ["pending_reason", "screened_reason"]


def screened_reason(policy: Ibis, app: App, snapshot: Snapshot, i: int, constraint: str) -> Reason:
    """The reason ``precheck`` would give device ``i``, which ``screen`` rejected with ``constraint``,
    from the snapshot's aggregates: what the app needs against what is free (cores, MB), or the
    utilization after placement (the same formulas as ``precheck``) against the cap; for any other
    constraint ``precheck``'s own."""
    arr = snapshot.arrays
    device = arr.devices[i]
    if constraint == "no-profile":
        return Reason(constraint, device.path)
    if constraint == "cpu":
        return Reason(constraint, device.path, device.node, predicted=app.cpu_cores,
                      limit=float(arr.node_cpu[i] - arr.node_cpu_used[i]), unit="cores")
    if constraint == "node-memory":
        return Reason(constraint, device.path, device.node, predicted=app.memory_mb,
                      limit=float(arr.node_mem[i] - arr.node_mem_used[i]), unit="MB")
    profile = resolve_profile(app, device, snapshot.catalog)
    if profile is not None and constraint == "device-memory":
        return Reason(constraint, device.path, predicted=model_memory_mb(profile, device),
                      limit=float(arr.mem[i] - arr.mem_used[i]), unit="MB")
    if profile is not None and constraint == "utilization" and (arr.additive[i] or arr.fcfs[i]):
        load = arr.loads[i]
        new = policy._new_tenant(app, profile, device.serving_ms)
        if arr.additive[i]:
            c = capacity(device)
            rho = load.work / c + new.rate_rps / 1000.0 * new.service.mean / c
        else:
            rho = load.fcfs_utilization(new)
        return Reason(constraint, device.path, predicted=rho, limit=policy.max_utilization,
                      unit="(rho)")
    r = policy.precheck(app, snapshot, device, i)
    assert isinstance(r, Rejection) and r.constraint == constraint, (r, constraint)
    return r.reason


def pending_reason(policy: Ibis, app: App, snapshot: Snapshot, p: Pending) -> Reason:
    """The reason of a latency rejection known from a screen: the first tenant (in order) that misses its
    SLO, with its predicted mean: as the screen kept it, or from the means where every tenant before it has
    a mean SLO (the means tell it, as ``_latency`` would: its values for mean SLOs are these means);
    otherwise the full ``_latency``."""
    if p.reason is not None:
        return p.reason
    cand = p.cand
    apps = snapshot.apps
    means = predict_means(device_spec(cand.device), cand.tenants)
    for t in cand.tenants:
        owner = app if t.name == app.name else apps[t.name]
        if owner.slo.stat != "mean":
            break   # its percentile decides whether it is the one that breaks: the exact path tells
        v = means[t.name]
        if isinstance(v, Unstable) or v > owner.slo.latency_ms:
            return Reason("slo", cand.device.path, None, t.name, "mean",
                          math.inf if isinstance(v, Unstable) else v, owner.slo.latency_ms, "ms")
    return policy._resolve(app, snapshot, p).reason
