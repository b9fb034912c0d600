"""The offline optimum: the most apps of a trace that can be admitted at once, a yardstick for online policies.

An online policy sees apps one at a time and never moves one it placed; the offline optimum sees the whole
trace and may pick any subset and any assignment. Its count is therefore an upper bound on what any online
policy admits on the same trace *with the same notion of "admissible"* (the criterion below) *and without
splitting an app over several devices* unless ``partitioning=True`` models it.

Method: a MILP (HiGHS through ``highspy``), verified and tightened by the online policies' own check.

* Variables: binary ``y[a, d]`` = app a runs whole on device d (each app on at most one device);
  ``z[k, d]`` = model copy k loaded on d where several apps can share one copy; with ``partitioning`` (only
  for ``criterion="tpu-units"``) continuous ``x[a, d]`` in [0, 1] (the fraction of a's frames on d) and a
  binary ``s[a]`` per app.
* Resources, exact: node CPU cores and host memory (the app's CPU stage is charged on the node of its
  device, as the policies do), device memory per loaded model copy (``policies.base.memory_key`` and
  ``model_memory_mb``: shared apps of one model share a copy; for ``tpu-units`` one copy per profile, the
  MicroEdge Model Size Rule), and per device the utilization ``sum_a lam_a E[e_a] <= cap x c`` (``c`` the
  MPS servers, else 1; ``cap`` = ``max_utilization`` or 1; for ``tpu-units`` the TPU Units Rule, <= 1).
* SLO (``criterion="slo"``), per tenant a and device d, a LINEAR constraint made active by ``y[a, d]``
  (big-M, M from the device's utilization cap) that every placement meeting a's SLO satisfies, i.e. a
  *relaxation* (a necessary condition) of the policies' check. With ``lam`` in req/ms, ``w_b = lam_b E[e_b]``,
  ``r_b = lam_b E[e_b^2] / 2`` (ms) over the apps b on d and ``T_a`` = SLO minus a's own CPU stage mean and
  network latency (ms):

  - M/G/1-FCFS (Edge TPU), mean SLO of a Poisson tenant: P-K ``W + E[e_a] <= T_a`` with
    ``W = sum r_b / (1 - sum w_b)`` is exactly ``sum r_b + (T_a - E[e_a]) sum w_b <= T_a - E[e_a]``. Model
    switches are LEFT OUT of the MILP (switches only lengthen services, so the constraint stays
    necessary); the policy check re-prices them (Ibis Eq. 1-2) on every configuration the MILP proposes.
  - M/G/1-PS: ``E[e_a] / (1 - sum w_b) <= T_a``, i.e. ``sum w_b <= 1 - E[e_a] / T_a`` (exact).
  - MPS, M/G/c limited PS: ``E[R_a] = E[e_a] g(A)`` with ``A = sum w_b`` and ``g(A) = E[N](A) / A``
    increasing, so ``A <= A*_a`` with ``g(A*_a) = T_a / E[e_a]`` (bisection; exact).
  - time-shared GPU, the admission bound ``perf.gpu.lowest_priority_bound``:
    ``e_a / (u + w_a) + R / ((u + w_a) u) <= T_a`` with ``u = 1 - sum w_b`` and ``R = sum r_b``, i.e.
    ``T_a u^2 + (T_a w_a - e_a) u - R >= 0``, not convex. Any feasible u is at least ``u_lo``, the root
    with ``R = r_a`` (a alone), and on ``[u_lo, 1]`` the secant ``u^2 <= (1 + u_lo) u - u_lo`` gives the
    necessary linear ``R + K sum w_b <= K - T_a u_lo`` with ``K = T_a (1 + u_lo + w_a) - e_a``.
  - percentile SLOs, periodic streams on an FCFS device (whose mean and tails the policies cap by the
    worst-case bound of ``perf.periodic``), batching devices and spatial ones (whose tenants do not slow
    each other down): no linear SLO row beyond the utilization cap (the P-K row is not necessary there);
    the policy check decides.

  Each row is the discipline's estimator's (``perf.estimators``: ``mean_row_applies``, ``mean_row``).

* Verification (lazy constraints): every device configuration of a MILP solution is re-checked with the
  check the online policies use: ``Ibis(max_utilization=cap).evaluate`` (every tenant at its own SLO
  statistic by ``perf.device``'s estimators; percentiles by the certified bounds) for ``slo``,
  ``MicroEdge().filter`` for ``tpu-units``. A rejected configuration gets a cut and the MILP is solved
  again. Where more tenants can only make every tenant's estimate worse (every discipline but an Edge TPU
  whose apps pay model switches: a new app of the same model can lower another's switch probability), the
  cut forbids a minimal rejected subset and all its supersets, on every device identical to the one it
  was found on, and on all apps of one type when the subset is of one type (identical apps but names);
  on an Edge TPU with switches it forbids exactly that configuration. The rejected configuration is also
  repaired (its latest apps removed until the check passes) to give a verified feasible solution.

Result: ``admitted`` is a verified feasible count (every device passes the policy check), ``upper_bound``
the MILP's proven bound over the relaxation plus the cuts, which are all valid, so no order-free placement
that the policy check accepts admits more. ``admitted == upper_bound`` proves optimality; the two differ
only when the time limit, ``mip_gap`` or ``max_rounds`` stopped the search.

Splitting: with ``criterion="slo"`` apps are whole. The ``edgemux`` policy (and ``dedicated``,
``microedge(partitioning=True)``) may split an app over several devices; for them the "slo" optimum is NOT
an upper bound (a split can admit an app no single device takes). ``criterion="tpu-units"`` with
``partitioning=True`` models MicroEdge's splitting (fractions of TPU units, any number of pieces).

``prefix=True`` admits a prefix of the trace only (app i admitted implies app i-1 admitted): the offline
counterpart of "apps placed before the first rejection".

Units: ms, req/s (req/ms inside the formulas), MB, CPU cores, TPU units (dimensionless). Pure: no I/O,
no clocks (HiGHS's own time limit bounds the solve), no randomness.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

import highspy
import numpy as np

from edgemux.cluster.state import App, Cluster, Device, Placement, Share
from edgemux.cluster.disciplines import capacity, traits
from edgemux.errors import InputError
from edgemux.perf.estimators import estimator_for
from edgemux.perf.result import Unstable
from edgemux.perf.tandem import tenant_cpu_ms
from edgemux.policies.base import (
    Snapshot,
    device_spec,
    app_units,
    memory_key,
    model_memory_mb,
    resolve_profile,
    tenant_for,
)
from edgemux.policies.highsrows import SparseRows
from edgemux.policies.feasibility import Fit, predict_means
from edgemux.policies.ibis import Ibis
from edgemux.policies.microedge import MicroEdge
from edgemux.profiles.distributions import second_moment
from edgemux.profiles.types import DeviceKind, Profile

__all__ = ["CRITERIA", "OfflineResult", "offline_optimum", "slo_row"]

CRITERIA = ("slo", "tpu-units")
"""``slo``: every tenant meets its SLO by the estimators Ibis/edgemux admit with (and the utilization cap);
``tpu-units``: MicroEdge's rules (TPU units <= 1 per TPU, co-compiled parameter memory), latency unchecked."""

_INF = highspy.kHighsInf
_SLACK = 1e-9
"""Relative slack added to the right-hand side of the SLO rows: floating point must never cut off a
placement the policy check accepts (the check then rejects what slips through)."""


@dataclass(frozen=True)
class OfflineResult:
    """What :func:`offline_optimum` found.

    ``admitted``: apps in the best verified placement (every device passes the policy check);
    ``upper_bound``: a proven upper bound on the optimum (``admitted`` when ``optimal``);
    ``assignment``: app -> its pieces ``((device path, weight), ...)`` (one piece of weight 1 unless
    partitioned); ``rounds``: MILP solves; ``cuts``: lazy constraints added; ``rejected_configs``: device
    configurations the MILP proposed that the policy check rejected (how often the linear SLO rows are
    looser than the estimator); ``status``: ``optimal``, ``time-limit`` or ``work-limit`` (HiGHS
    stopped on its clock or its node limit, bound from its dual bound), ``gap`` (stopped at ``mip_gap``) or ``round-limit``."""

    admitted: int
    upper_bound: int
    assignment: Mapping[str, tuple[tuple[str, float], ...]]
    criterion: str
    prefix: bool
    partitioning: bool
    apps: int
    rounds: int
    cuts: int
    rejected_configs: int
    status: str

    @property
    def optimal(self) -> bool:
        return self.admitted == self.upper_bound


def _signature(app: App) -> tuple[object, ...]:
    """Everything about an app but its name: apps with equal signatures are interchangeable."""
    return tuple(getattr(app, f.name) for f in fields(app) if f.name != "name")


def _device_class(device: Device, cluster: Cluster) -> tuple[object, ...]:
    """Devices with equal classes (and nodes with equal capacities) are interchangeable."""
    node = cluster.node(device.node)
    return (device.kind, device.discipline, device.memory_mb, device.profile_set, device.servers,
            device.max_batch, device.batch_timeout_ms, device.serving_ms, node.cpu_cores, node.memory_mb,
            len(node.devices))


def slo_row(app: App, profile: Profile, device: Device,
            others: Sequence[tuple[App, Profile]]) -> tuple[dict[str, float], float] | None:
    """The linear SLO condition of ``app`` on ``device`` (see the module docstring):
    ``(coefficients by app name, right-hand side)`` such that ``sum_b coef_b <= rhs`` over the apps b on the
    device (``app`` included) is necessary for ``app``'s SLO; ``others`` are the other apps that may join,
    with the profiles they would run. ``None`` when no linear row applies (percentile SLO, periodic stream
    on an FCFS device, batching, spatial sharing). An app that cannot meet its SLO even alone gets
    ``({}, -1)``. Units of the row: ms for FCFS / time-sharing (``r_b`` in ms, ``w_b`` dimensionless),
    dimensionless work otherwise. The row is the discipline's estimator's (``perf.estimators``)."""
    if app.slo.stat != "mean":
        return None
    est = estimator_for(device.discipline)
    if not est.mean_row_applies(app.periodic):
        return None
    tenant = tenant_for(app, profile, serving_ms=device.serving_ms)
    cpu = tenant_cpu_ms(tenant)
    if isinstance(cpu, Unstable):
        return {}, -1.0
    t_a = app.slo.latency_ms - cpu - tenant.network_ms
    e_a = profile.service.mean
    if not t_a >= e_a:
        return {}, -1.0
    members = [(app, profile), *others]

    def w(a: App, p: Profile) -> float:
        return a.rate_rps / 1000.0 * p.service.mean

    def r(a: App, p: Profile) -> float:
        return a.rate_rps / 1000.0 * second_moment(p.service) / 2.0

    row = est.mean_row(t_a, e_a, w(app, profile), r(app, profile), device.servers)
    if row is None:
        return {}, -1.0
    k, rhs = row
    if k is None:
        return {a.name: w(a, p) for a, p in members}, rhs
    return {a.name: r(a, p) + k * w(a, p) for a, p in members}, rhs


class _Model:
    """The MILP and the policy check of one :func:`offline_optimum` call."""

    def __init__(self, apps: list[App], cluster: Cluster, criterion: str, prefix: bool, partitioning: bool,
                 cap: float, time_limit_s: float, mip_gap: float, max_nodes: int | None = None) -> None:
        self.apps = apps
        self.order = {a.name: i for i, a in enumerate(apps)}
        self.cluster = cluster
        self.criterion = criterion
        self.prefix = prefix
        self.partitioning = partitioning
        self.cap = cap
        self.snapshot = Snapshot(cluster)
        self.catalog = self.snapshot.catalog
        devs = list(cluster.devices.values())
        if criterion == "tpu-units":
            devs = [d for d in devs if d.kind is DeviceKind.EDGETPU]   # MicroEdge: only TPUs are candidates
        self.devices = devs
        self.checker = Ibis(max_utilization=cap) if criterion == "slo" else MicroEdge()
        self._memo: dict[tuple[object, ...], bool] = {}
        # interchangeable devices, in cluster order (for symmetry breaking and for replicating cuts)
        self.classes: dict[tuple[object, ...], list[Device]] = {}
        for d in devs:
            self.classes.setdefault(_device_class(d, cluster), []).append(d)
        self.class_of = {d.path: key for key, ds in self.classes.items() for d in ds}
        self.profile: dict[tuple[str, str], Profile] = {}
        for a in apps:
            for d in devs:
                p = resolve_profile(a, d, self.catalog)
                if p is not None and self._alone_ok(a, p, d):
                    self.profile[(a.name, d.path)] = p
        self.h = highspy.Highs()
        self.h.setOptionValue("output_flag", False)
        self.h.setOptionValue("time_limit", float(time_limit_s))
        self.h.setOptionValue("mip_rel_gap", float(mip_gap))
        self.h.setOptionValue("random_seed", 0)
        if max_nodes is not None:
            self.h.setOptionValue("mip_max_nodes", int(max_nodes))
        self.ncols = 0
        self.y: dict[tuple[str, str], int] = {}        # y (whole) or x (partitioned)
        self.s: dict[str, int] = {}                     # admitted, partitioned mode
        self.rows = SparseRows()
        self.cuts = 0
        self._build()

    # ------------------------------------------------------------------------------------ the check

    def _alone_ok(self, app: App, profile: Profile, device: Device) -> bool:
        if self.criterion == "tpu-units" and self.partitioning:
            return True      # a piece of any size may go anywhere its model fits: decided by the MILP
        return self.check(device, [app])

    def check(self, device: Device, names_or_apps: Sequence[App | str]) -> bool:
        """Whether the apps (whole) on ``device`` pass the online policy's check (every tenant, resources
        included), memoized by the apps' signatures and the device's class."""
        apps = [a if isinstance(a, App) else self.apps[self.order[a]] for a in names_or_apps]
        if not apps:
            return True
        key = (self.class_of[device.path], tuple(sorted((_signature(a) for a in apps), key=repr)))
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        snap = self.snapshot
        for a in apps[:-1]:
            p = resolve_profile(a, device, self.catalog)
            if p is None:
                self._memo[key] = False
                return False
            snap = snap.with_placement(a, Placement(a.name, (Share(device.path, 1.0, p.name),), cpu_node=device.node))
        last = apps[-1]
        if self.criterion == "slo":
            assert isinstance(self.checker, Ibis)  # criterion "slo" checks with Ibis (``__init__``)
            ok = isinstance(self.checker.evaluate(last, snap, device), Fit)
        else:
            ok = self.checker.filter(last, snap, device) is None
        self._memo[key] = ok
        return ok

    def monotone(self, device: Device) -> bool:
        """More tenants never make a tenant's estimate better on ``device``: true except on an FCFS device
        where some app pays a model switch (a same-model newcomer lowers others' switch probability)."""
        if not traits(device.discipline).one_queue or self.criterion == "tpu-units":
            return True
        return not any(p.switch_ms > 0 for (a, path), p in self.profile.items() if path == device.path)

    # ------------------------------------------------------------------------------------ the MILP

    def _col(self, lo: float, hi: float, integer: bool, cost: float = 0.0) -> int:
        self.h.addCol(cost, lo, hi, 0, np.array([], dtype=np.int32), np.array([], dtype=float))
        j = self.ncols
        self.ncols += 1
        if integer:
            self.h.changeColIntegrality(j, highspy.HighsVarType.kInteger)
        return j

    def _build(self) -> None:
        part = self.partitioning
        # columns
        for a in self.apps:
            if part:
                self.s[a.name] = self._col(0.0, 1.0, True, 1.0)
            for d in self.devices:
                if (a.name, d.path) in self.profile:
                    self.y[(a.name, d.path)] = self._col(0.0, 1.0, not part, 0.0 if part else 1.0)
        rows = self.rows
        # each app at most once (whole) / its pieces sum to its admission (partitioned)
        for a in self.apps:
            cols = [self.y[(a.name, d.path)] for d in self.devices if (a.name, d.path) in self.y]
            if part:
                rows.add(cols + [self.s[a.name]], [1.0] * len(cols) + [-1.0], 0.0, 0.0)
            elif len(cols) > 1:
                rows.add(cols, [1.0] * len(cols), 0.0, 1.0)
        # prefix: app i admitted only if app i-1 is
        if self.prefix:
            for prev, cur in zip(self.apps, self.apps[1:]):
                c1, v1 = self._admitted(cur)
                c0, v0 = self._admitted(prev)
                rows.add(c1 + c0, v1 + [-v for v in v0], -_INF, 0.0)
        for d in self.devices:
            here = [a for a in self.apps if (a.name, d.path) in self.y]
            if not here:
                continue
            self._memory_rows(d, here)
            self._utilization_row(d, here)
            if self.criterion == "slo":
                self._slo_rows(d, here)
        self._node_rows()
        if not part:
            self._symmetry_rows()
            if self.criterion == "slo":
                self._conflict_rows()
        rows.flush(self.h)
        self.h.changeObjectiveSense(highspy.ObjSense.kMaximize)

    def _admitted(self, app: App) -> tuple[list[int], list[float]]:
        if self.partitioning:
            return [self.s[app.name]], [1.0]
        cols = [self.y[(app.name, d.path)] for d in self.devices if (app.name, d.path) in self.y]
        return cols, [1.0] * len(cols)

    def _memory_rows(self, d: Device, here: list[App]) -> None:
        """Device memory: one copy per model key (``tpu-units``: per profile, the Model Size Rule)."""
        groups: dict[str, list[App]] = {}
        need: dict[str, float] = {}
        for a in here:
            p = self.profile[(a.name, d.path)]
            k = p.name if self.criterion == "tpu-units" else memory_key(a, p)
            groups.setdefault(k, []).append(a)
            need[k] = model_memory_mb(p, d)
        if math.fsum(need.values()) <= d.memory_mb:
            return   # every model fits at once: no row needed
        cols: list[int] = []
        vals: list[float] = []
        for k, members in groups.items():
            if need[k] <= 0.0:
                continue
            if len(members) == 1 and not self.partitioning:
                cols.append(self.y[(members[0].name, d.path)])
            else:
                z = self._col(0.0, 1.0, True)
                for a in members:
                    self.rows.add([self.y[(a.name, d.path)], z], [1.0, -1.0], -_INF, 0.0)
                cols.append(z)
            vals.append(need[k])
        if cols:
            self.rows.add(cols, vals, -_INF, d.memory_mb)

    def _capacity(self, d: Device) -> float:
        """The utilization cap in the device's work units (servers' worth for MPS)."""
        if self.criterion == "tpu-units":
            return 1.0
        return self.cap * capacity(d)

    def _utilization_row(self, d: Device, here: list[App]) -> None:
        if self.criterion == "slo" and traits(d.discipline).batches:
            return   # batching's utilization is not additive: the check decides
        work = [app_units(self.profile[(a.name, d.path)], a.rate_rps) for a in here]
        if math.fsum(work) <= self._capacity(d):
            return
        self.rows.add([self.y[(a.name, d.path)] for a in here], work, -_INF, self._capacity(d) * (1 + _SLACK))

    def _slo_rows(self, d: Device, here: list[App]) -> None:
        cap = self._capacity(d)
        for a in here:
            p = self.profile[(a.name, d.path)]
            others = [(b, self.profile[(b.name, d.path)]) for b in here if b is not a]
            got = slo_row(a, p, d, others)
            if got is None:
                continue
            coef, rhs = got
            ya = self.y[(a.name, d.path)]
            if rhs < 0:
                self.h.changeColBounds(ya, 0.0, 0.0)
                continue
            rhs = rhs * (1 + _SLACK) + _SLACK
            total = math.fsum(v for n, v in coef.items() if n != a.name and v > 0)
            # a tighter bound on the others' sum: the utilization cap bounds sum w; r by a fractional knapsack
            m = max(0.0, min(total, self._row_max(d, a, others, coef, cap)) - rhs)
            if total + coef[a.name] <= rhs:
                continue   # never binding
            cols = [self.y[(b.name, d.path)] for b, _ in others] + [ya]
            vals = [coef[b.name] for b, _ in others] + [coef[a.name] + m]
            self.rows.add(cols, vals, -_INF, rhs + m)

    @staticmethod
    def _row_max(d: Device, a: App, others: list[tuple[App, Profile]], coef: dict[str, float], cap: float) -> float:
        """An upper bound on ``sum_{b != a} coef_b y_b`` subject to ``sum_b w_b y_b <= cap`` (a fractional
        knapsack of the coefficients over the work)."""
        items = []
        for b, p in others:
            w = b.rate_rps / 1000.0 * p.service.mean
            items.append((coef[b.name], w))
        items.sort(key=lambda cw: -(cw[0] / cw[1]) if cw[1] > 0 else -math.inf)
        left, total = cap, 0.0
        for c, w in items:
            if w <= 0.0:
                total += max(c, 0.0)
                continue
            if left <= 0.0:
                break
            take = min(1.0, left / w)
            total += c * take
            left -= w * take
        return total

    def _node_rows(self) -> None:
        """Node CPU cores and host memory: the app's CPU stage on the node of its (first) device."""
        by_node: dict[str, list[Device]] = {}
        for d in self.devices:
            by_node.setdefault(d.node, []).append(d)
        for name, devs in by_node.items():
            node = self.cluster.node(name)
            for attr, capacity in (("cpu_cores", node.cpu_cores), ("memory_mb", node.memory_mb)):
                cols: list[int] = []
                vals: list[float] = []
                for a in self.apps:
                    need = getattr(a, attr)
                    if need <= 0:
                        continue
                    for d in devs:
                        if (a.name, d.path) not in self.y:
                            continue
                        if self.partitioning:
                            # charged once: a binary "CPU stage on this node" per (app, node), summing to s
                            continue
                        cols.append(self.y[(a.name, d.path)])
                        vals.append(need)
                if cols and math.fsum(vals) > capacity:
                    self.rows.add(cols, vals, -_INF, capacity)
        if self.partitioning:
            self._partitioned_node_rows(by_node)

    def _partitioned_node_rows(self, by_node: dict[str, list[Device]]) -> None:
        needy = [a for a in self.apps if a.cpu_cores > 0 or a.memory_mb > 0]
        if not needy:
            return
        c: dict[tuple[str, str], int] = {}
        for a in needy:
            cols = []
            for name in by_node:
                c[(a.name, name)] = self._col(0.0, 1.0, True)
                cols.append(c[(a.name, name)])
            self.rows.add(cols + [self.s[a.name]], [1.0] * len(cols) + [-1.0], 0.0, 0.0)
        for name in by_node:
            node = self.cluster.node(name)
            for attr, capacity in (("cpu_cores", node.cpu_cores), ("memory_mb", node.memory_mb)):
                pairs = [(c[(a.name, name)], getattr(a, attr)) for a in needy if getattr(a, attr) > 0]
                if pairs:
                    self.rows.add([p for p, _ in pairs], [v for _, v in pairs], -_INF, capacity)

    def _conflict_rows(self) -> None:
        """Pairs of apps that cannot share a device (monotone devices): ``y[a, d] + y[b, d] <= 1``. The test
        is necessary for the policy check: both tenants' means by ``predict_means`` (what Ibis judges mean
        SLOs by), a pair with a percentile SLO is left to the check. Pairs are what the linear rows miss most
        (a short app beside a long one on a time-shared GPU), and they tighten the branch and bound."""
        for devs in self.classes.values():
            d = devs[0]
            if not self.monotone(d):
                continue
            here = [a for a in self.apps if (a.name, d.path) in self.y and a.slo.stat == "mean"]
            spec = device_spec(d)
            tenants = {a.name: tenant_for(a, self.profile[(a.name, d.path)], serving_ms=d.serving_ms) for a in here}
            for i, a in enumerate(here):
                for b in here[i + 1:]:
                    means = predict_means(spec, [tenants[a.name], tenants[b.name]])
                    bad = any(isinstance(v, Unstable) or v > x.slo.latency_ms * (1 + _SLACK)
                              for v, x in ((means[a.name], a), (means[b.name], b)))
                    if not bad:
                        continue
                    for dd in devs:
                        ca, cb = self.y.get((a.name, dd.path)), self.y.get((b.name, dd.path))
                        if ca is not None and cb is not None:
                            self.rows.add([ca, cb], [1.0, 1.0], -_INF, 1.0)

    def _symmetry_rows(self) -> None:
        """Interchangeable devices d_0, d_1, ...: relabel so that each device's earliest app (trace order)
        comes after the earlier devices' earliest apps; then app i can only be on d_0..d_i."""
        for devs in self.classes.values():
            for j, d in enumerate(devs):
                for i, a in enumerate(self.apps):
                    if i < j and (a.name, d.path) in self.y:
                        self.h.changeColBounds(self.y[(a.name, d.path)], 0.0, 0.0)

    # ------------------------------------------------------------------------------- cuts and repair

    def cut(self, device: Device, names: list[str]) -> None:
        """Forbid the rejected configuration ``names`` on ``device`` (see the module docstring)."""
        targets = self.classes[self.class_of[device.path]]
        if self.monotone(device):
            core = self._minimal(device, names)
            sigs = {_signature(self.apps[self.order[n]]) for n in core}
            if len(sigs) == 1:   # one type: at most |core| - 1 apps of that type together
                sig = next(iter(sigs))
                members = [a.name for a in self.apps if _signature(a) == sig]
            else:
                members = core
            for d in targets:
                cols = [self.y[(n, d.path)] for n in members if (n, d.path) in self.y]
                if len(cols) >= len(core):
                    self.rows.add(cols, [1.0] * len(cols), -_INF, len(core) - 1.0)
        else:
            inside = set(names)
            for d in targets:
                cols, vals = [], []
                for a in self.apps:
                    if (a.name, d.path) in self.y:
                        cols.append(self.y[(a.name, d.path)])
                        vals.append(1.0 if a.name in inside else -1.0)
                if all((n, d.path) in self.y for n in names):
                    self.rows.add(cols, vals, -_INF, len(names) - 1.0)
        self.cuts += self.rows.flush(self.h)

    def _minimal(self, device: Device, names: list[str]) -> list[str]:
        """A subset of the rejected ``names`` that is still rejected and minimal (monotone case): latest
        apps are dropped first."""
        core = list(names)
        for n in sorted(names, key=lambda x: -self.order[x]):
            trial = [m for m in core if m != n]
            if trial and not self.check(device, trial):
                core = trial
        return core

    def repair(self, device: Device, names: list[str]) -> list[str]:
        """The apps of a rejected configuration that stay: the latest removed until the check passes."""
        keep = sorted(names, key=lambda x: self.order[x])
        while keep and not self.check(device, keep):
            keep.pop()
        return keep


def _validate(apps: Sequence[App], cluster: Cluster, criterion: str, partitioning: bool,
              max_utilization: float | None, time_limit_s: float, mip_gap: float, max_rounds: int) -> None:
    if criterion not in CRITERIA:
        raise InputError("criterion", f"must be one of {', '.join(CRITERIA)}, got {criterion!r}")
    if partitioning and criterion != "tpu-units":
        raise InputError("partitioning", "modelled only for criterion 'tpu-units' (a split app's latency "
                         "is not linear in its pieces)")
    if not isinstance(cluster, Cluster) or not cluster.devices:
        raise InputError("cluster", "needs at least one device")
    seen: set[str] = set()
    for i, a in enumerate(apps):
        if not isinstance(a, App):
            raise InputError(f"apps[{i}]", f"must be an App, got {type(a).__name__}")
        if a.name in seen:
            raise InputError(f"apps[{i}].name", f"duplicate app name {a.name!r}")
        seen.add(a.name)
    if max_utilization is not None and not (0 < max_utilization <= 1):
        raise InputError("max_utilization", f"must be in (0, 1], got {max_utilization!r}")
    if not (time_limit_s > 0 and math.isfinite(time_limit_s)):
        raise InputError("time_limit_s", f"must be a finite number > 0 s, got {time_limit_s!r}")
    if not (0 <= mip_gap < 1):
        raise InputError("mip_gap", f"must be in [0, 1), got {mip_gap!r}")
    if max_rounds < 1:
        raise InputError("max_rounds", f"must be >= 1, got {max_rounds!r}")


def offline_optimum(apps: Sequence[App], cluster: Cluster, *, criterion: str = "slo", prefix: bool = False,
                    partitioning: bool = False, max_utilization: float | None = None,
                    time_limit_s: float = 10.0, mip_gap: float = 0.0, max_rounds: int = 40,
                    start: Mapping[str, str] | None = None, max_nodes: int | None = None) -> OfflineResult:
    """The most apps of ``apps`` (a trace; order matters only with ``prefix``) that ``cluster`` can hold at
    once with every tenant admissible under ``criterion`` (see the module docstring for the model, its
    approximations and when the count bounds an online policy).

    ``criterion``: ``"slo"`` (every tenant's SLO by the estimators Ibis/edgemux use, plus resources and the
    utilization cap ``max_utilization``, default 1 = stability only: the cap is a policy choice, not an
    SLO) or ``"tpu-units"`` (MicroEdge's rules; ``partitioning=True`` lets apps split over TPUs).
    ``prefix``: admit a prefix of the trace only. ``time_limit_s`` (s): HiGHS's limit per MILP solve;
    ``mip_gap``: its relative gap (0 = prove optimality); ``max_rounds``: MILP solves (cut rounds) at most;
    ``max_nodes``: HiGHS's branch-and-bound node limit per solve, a limit on work rather than time: where it
    binds before ``time_limit_s`` the result is the same on any host (status ``work-limit`` when it stops a
    solve; tests use it, experiments may use the clock).
    ``start``: a known placement, app name -> device path (whole apps; e.g. what an online policy
    placed), used as the first incumbent and MIP start when it passes the check (else ignored).
    Profiles come from the built-in catalog (the one the policies' snapshots read).
    Raises :class:`~edgemux.errors.InputError` on bad input."""
    apps = list(apps)
    _validate(apps, cluster, criterion, partitioning, max_utilization, time_limit_s, mip_gap, max_rounds)
    if max_nodes is not None and (isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 1):
        raise InputError("max_nodes", f"must be an integer >= 1, got {max_nodes!r}")
    cap = 1.0 if max_utilization is None else float(max_utilization)
    model = _Model(apps, cluster, criterion, prefix, partitioning, cap, time_limit_s, mip_gap, max_nodes)
    h = model.h
    best_count = 0
    best: dict[str, tuple[tuple[str, float], ...]] = {}
    upper = len(apps)
    rejected = 0
    status = "round-limit"
    rounds = 0
    hint: list[float] | None = None
    if not model.y:   # no app fits any device even alone: nothing to solve
        return OfflineResult(admitted=0, upper_bound=0, assignment={}, criterion=criterion, prefix=prefix,
                             partitioning=partitioning, apps=len(apps), rounds=0, cuts=0, rejected_configs=0,
                             status="optimal")
    if start is not None and not partitioning:
        got = _start(model, start)
        if got is not None:
            best_count, best = len(got), {n: ((p, 1.0),) for n, p in got.items()}
            hint = _hint(model, best)
    while rounds < max_rounds:
        rounds += 1
        if hint is not None:
            sol = highspy.HighsSolution()
            sol.col_value = hint
            sol.value_valid = True
            h.setSolution(sol)
        h.run()
        ms = h.getModelStatus()
        info = h.getInfo()
        if ms == highspy.HighsModelStatus.kOptimal:
            # the dual bound is the proven bound (with mip_gap > 0 the primal may sit below it)
            bound = info.mip_dual_bound if model.ncols else 0.0
        elif ms in (highspy.HighsModelStatus.kTimeLimit, highspy.HighsModelStatus.kSolutionLimit,
                    highspy.HighsModelStatus.kIterationLimit, highspy.HighsModelStatus.kInterrupt):
            bound = info.mip_dual_bound
        else:
            raise InputError("apps", f"the offline MILP ended with status {h.modelStatusToString(ms)}")
        if math.isfinite(bound):
            upper = min(upper, int(math.floor(bound + 1e-6)))
        limit = "time-limit" if ms in (highspy.HighsModelStatus.kTimeLimit,
                                       highspy.HighsModelStatus.kInterrupt) else "work-limit"
        if info.primal_solution_status < 2 and model.ncols:   # no incumbent (a limit before any)
            status = limit
            break
        x = list(h.getSolution().col_value)
        assignment, violated = _read(model, x)
        rejected += len(violated)
        kept = _repaired(model, assignment, violated)
        count = len(kept)
        if count > best_count or not best:
            best_count, best = count, kept
        stopped = ms != highspy.HighsModelStatus.kOptimal
        if not violated:
            status = limit if stopped else ("optimal" if best_count >= upper else "gap")
            break
        for path, names in violated.items():
            model.cut(cluster.devices[path], names)
        hint = _hint(model, kept)
    return OfflineResult(admitted=best_count, upper_bound=max(upper, best_count), assignment=best,
                         criterion=criterion, prefix=prefix, partitioning=partitioning, apps=len(apps),
                         rounds=rounds, cuts=model.cuts, rejected_configs=rejected, status=status)


def _start(model: _Model, start: Mapping[str, str]) -> dict[str, str] | None:
    """``start`` relabelled within each class of interchangeable devices to meet the symmetry rows (devices
    ordered by their earliest app), or ``None`` when it is not a valid verified placement."""
    on: dict[str, list[str]] = {}
    for n, path in start.items():
        if n not in model.order or (n, path) not in model.y:
            return None
        on.setdefault(path, []).append(n)
    for path, names in on.items():
        names.sort(key=lambda x: model.order[x])
        if not model.check(model.cluster.devices[path], names):
            return None
    if model.prefix:
        k = 0
        while k < len(model.apps) and model.apps[k].name in start:
            k += 1
        if k < len(start):
            return None
    out: dict[str, str] = {}
    for devs in model.classes.values():
        used = sorted((p.path for p in devs if p.path in on), key=lambda x: model.order[on[x][0]])
        for target, path in zip(devs, used):
            for n in on[path]:
                if (n, target.path) not in model.y:
                    return None
                out[n] = target.path
    return out


def _read(model: _Model, x: list[float]) -> tuple[dict[str, list[tuple[str, float]]], dict[str, list[str]]]:
    """The solution's pieces per app and the device configurations the policy check rejects."""
    pieces: dict[str, list[tuple[str, float]]] = {}
    on: dict[str, list[str]] = {}
    for (name, path), j in model.y.items():
        v = x[j]
        if (model.partitioning and v > 1e-9) or (not model.partitioning and v > 0.5):
            pieces.setdefault(name, []).append((path, v))
            on.setdefault(path, []).append(name)
    if model.partitioning:
        for name in list(pieces):
            if x[model.s[name]] < 0.5:
                del pieces[name]
        return pieces, {}   # the partitioned model is exact (linear rules): nothing to re-check
    violated = {}
    for path, names in on.items():
        names.sort(key=lambda n: model.order[n])
        if not model.check(model.cluster.devices[path], names):
            violated[path] = names
    return pieces, violated


def _repaired(model: _Model, pieces: dict[str, list[tuple[str, float]]],
              violated: dict[str, list[str]]) -> dict[str, tuple[tuple[str, float], ...]]:
    """A verified placement from a MILP solution: rejected devices repaired, then (``prefix``) cut to the
    longest admitted prefix, re-checked until stable."""
    keep = {n: list(p) for n, p in pieces.items()}
    for path, names in violated.items():
        stay = set(model.repair(model.cluster.devices[path], names))
        for n in names:
            if n not in stay:
                del keep[n]
    while model.prefix:
        k = 0
        while k < len(model.apps) and model.apps[k].name in keep:
            k += 1
        dropped = [a.name for a in model.apps[k:] if a.name in keep]
        if not dropped:
            break
        for n in dropped:
            del keep[n]
        if model.partitioning:
            break
        changed = False   # removing apps can only break a device where estimates are not monotone
        on: dict[str, list[str]] = {}
        for n, p in keep.items():
            on.setdefault(p[0][0], []).append(n)
        for path, names in on.items():
            if not model.check(model.cluster.devices[path], names):
                for n in names:
                    del keep[n]
                changed = True
        if not changed:
            break
    total = {n: math.fsum(v for _, v in p) for n, p in keep.items()}
    return {n: tuple((path, v / total[n]) for path, v in p) for n, p in keep.items()}


def _hint(model: _Model, kept: Mapping[str, tuple[tuple[str, float], ...]]) -> list[float] | None:
    """The verified placement as a MILP start (whole mode only; it satisfies every cut: cuts forbid only
    rejected configurations and their supersets where estimates are monotone)."""
    if model.partitioning:
        return None
    x = [0.0] * model.ncols
    for n, p in kept.items():
        x[model.y[(n, p[0][0])]] = 1.0
    # a start with the memory copies off would be infeasible: let HiGHS complete the z columns
    return None if model.ncols != len(model.y) else x
