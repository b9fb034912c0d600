"""MVSP: model-variant selection and placement over an edge network (Bensalem, Dizdarević, Jukan).

IoT nodes send requests for models; edge nodes host instances of model *variants* (a batch size or a
precision of a model, each with its own exclusive latency ``L_mv``, memory ``R_mv`` and maximum load
``Load_mv``). A solution forwards every (IoT node, model) demand to one (edge node, variant) and decides how
many instances of each variant every edge node runs. Its quality is ``alpha * L + (1 - alpha) * C``: ``L``
the request-weighted mean of communication plus inference latency (Eq. 1), ``C`` the mean utilization cost
of the edge nodes (Eq. 5), where a node's cost is an exponential ``phi`` of its memory utilization (Eq. 6-8).

This module holds the instance, the solution and ``evaluate``, which computes a given solution's latency,
cost and constraint violations exactly as the paper's equations define them; the solvers (the MILP, the
heuristic) are judged by it. ``solve`` is the MILP with HiGHS: in configuration form (one binary per
whole instance vector of a node: exact, no big-M) when the enumeration is small enough (K <= 4 on
P1/P2-sized instances), else in big-M form, started from the heuristic's solution; an infeasible instance raises ``MvspInfeasible`` naming the
constraints that cannot hold. Pure: no I/O, no clocks (HiGHS's own time limit bounds a solve).

Interpretation choices (the paper's text and equations disagree or are garbled; each is an option here):

* Eq. 3's interference sum runs over every *other* (model, variant) on the node, ``(m', v') != (m, v)``
  (the extraction prints ``v' != v`` under ``m' in M``, which would skip the same variant index of other
  models, which has no meaning).
* K: Eq. 11 bounds each variant's instance count on a node (``n_mv^e <= K``), but Table I defines K as the
  "maximum number of model-variants per edge node" and §III-A says "K = 1 means that no GPU sharing is
  allowed". ``k_scope="node"`` (default) bounds the sum of all instances on a node by K, as the text means;
  ``k_scope="variant"`` is Eq. 11 as printed.
* The cost curve: ``phi(u) = scale * (exp(rate * u) - 1)``. The paper names an exponential without its
  constants; ``CostCurve.paper()`` is fitted to the (utilization, cost) pairs §III-B/C reports (see there).

Units: ms (latencies), req/s (rates, loads), MB (memory), utilization and cost dimensionless.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import highspy
import numpy as np

from edgemux.errors import EdgemuxError, InputError
from edgemux.policies.highsrows import SparseRows

__all__ = ["Variant", "EdgeNode", "Demand", "CostCurve", "MvspInstance", "MvspSolution", "Evaluation", "evaluate",
           "solve", "MvspInfeasible", "MvspNoSolution", "infeasibility_causes"]


@dataclass(frozen=True)
class Variant:
    """One deployable form of a model: ``latency_ms`` exclusive inference latency per request on a node of
    speed 1 (``L_mv``), ``memory_mb`` per instance (``R_mv``), ``max_load_rps`` one instance sustains with
    stable performance (``Load_mv``), ``interference`` its coefficient ``alpha_mv`` (Eq. 3, 14)."""

    model: str
    name: str
    latency_ms: float
    memory_mb: float
    max_load_rps: float
    interference: float = 0.1
    source: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.model, self.name)


@dataclass(frozen=True)
class EdgeNode:
    """An edge node: ``memory_mb`` its capacity ``C^e``; ``speed`` divides every variant's latency there
    (1.0: the device the variants were profiled on)."""

    name: str
    memory_mb: float
    speed: float = 1.0


@dataclass(frozen=True)
class Demand:
    """IoT node ``iot``'s requests for ``model``: ``rate_rps`` (``r_m^i``) and its round-trip latency bound
    ``max_latency_ms`` (``Lmax_m^i``, Eq. 4)."""

    iot: str
    model: str
    rate_rps: float
    max_latency_ms: float

    @property
    def key(self) -> tuple[str, str]:
        return (self.iot, self.model)


@dataclass(frozen=True)
class CostCurve:
    """The utilization cost ``phi(u) = scale * (exp(rate * u) - 1)`` and its tangents at ``points`` (Eq. 6).

    ``paper()``: the paper gives no constants. Four (mean utilization, mean cost) pairs it reports pin them:
    (0.38, 0.05) and (0.63, 0.20) in §III-B, (0.67, 0.23) and (0.70, 0.30) in §III-C. Fitting through the
    first and the §III-B high-load pair (0.76, 0.40): exp(0.38 rate) = 0.40/0.05 - 1 = 7, so rate = ln 7 / 0.38
    = 5.12 and scale = 0.05 / 6 = 0.00833; the curve then gives 0.20 at 0.63, 0.25 at 0.67 and 0.29 at 0.70,
    within 0.02 of the other three (a mean of per-node costs need not equal the cost of the mean)."""

    scale: float
    rate: float
    points: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)

    @classmethod
    def paper(cls) -> CostCurve:
        rate = math.log(7.0) / 0.38
        return cls(scale=0.05 / 6.0, rate=rate)

    def value(self, u: float) -> float:
        """phi(u), exact."""
        return self.scale * math.expm1(self.rate * u)

    def tangents(self) -> tuple[tuple[float, float], ...]:
        """(slope, intercept) of the tangent at each point: y(u) = slope * u + intercept (Eq. 6)."""
        out = []
        for p in self.points:
            slope = self.scale * self.rate * math.exp(self.rate * p)
            out.append((slope, self.value(p) - slope * p))
        return tuple(out)

    def approx(self, u: float) -> float:
        """max over the tangents and 0 (costs are non-negative): what the MILP's ``z^e`` equals (Eq. 7)."""
        return max(0.0, *(a * u + b for a, b in self.tangents()))


@dataclass(frozen=True)
class MvspInstance:
    """A problem: ``edges``, ``variants`` (of every model), ``demands`` (one per IoT node and model, rate > 0)
    and ``comm_ms[(iot, edge)]`` the round-trip communication latency ``CL^{ie}`` (ms; a missing pair is
    unreachable). ``k`` (K), ``k_scope`` ("node" or "variant", see the module docstring), ``alpha`` the
    latency weight of the objective, ``cost`` the utilization cost curve.

    Raises ``InputError`` on bad input: negative rates or latencies, a demand for a model without variants,
    an IoT node that reaches no edge node, a model none of whose variants fits in any node's memory."""

    edges: tuple[EdgeNode, ...]
    variants: tuple[Variant, ...]
    demands: tuple[Demand, ...]
    comm_ms: Mapping[tuple[str, str], float]
    k: int = 2
    alpha: float = 0.1
    cost: CostCurve = field(default_factory=CostCurve.paper)
    k_scope: str = "node"

    def __post_init__(self) -> None:
        if not self.edges:
            raise InputError("edges", "an MVSP instance needs at least one edge node")
        names = [e.name for e in self.edges]
        if len(set(names)) != len(names):
            raise InputError("edges", "edge node names must be unique")
        for e in self.edges:
            if not (math.isfinite(e.memory_mb) and e.memory_mb > 0):
                raise InputError("edges", f"edge node '{e.name}': memory must be > 0 MB, got {e.memory_mb}")
            if not (math.isfinite(e.speed) and e.speed > 0):
                raise InputError("edges", f"edge node '{e.name}': speed must be > 0, got {e.speed}")
        keys = [v.key for v in self.variants]
        if len(set(keys)) != len(keys):
            raise InputError("variants", "each (model, variant) must appear once")
        for v in self.variants:
            for what, x in (("latency_ms", v.latency_ms), ("memory_mb", v.memory_mb),
                            ("max_load_rps", v.max_load_rps)):
                if not (math.isfinite(x) and x > 0):
                    raise InputError("variants", f"variant {v.model}/{v.name}: {what} must be > 0, got {x}")
            if not (math.isfinite(v.interference) and v.interference >= 0):
                raise InputError("variants", f"variant {v.model}/{v.name}: interference must be >= 0, got {v.interference}")
        if not isinstance(self.k, int) or isinstance(self.k, bool) or self.k < 1:
            raise InputError("k", f"K must be an integer >= 1, got {self.k!r}")
        if self.k_scope not in ("node", "variant"):
            raise InputError("k_scope", f"must be 'node' or 'variant', got {self.k_scope!r}")
        if not (0.0 <= self.alpha <= 1.0):
            raise InputError("alpha", f"the latency weight must be in [0, 1], got {self.alpha}")
        edge_names = set(names)
        for (i, en), cl in self.comm_ms.items():
            if en not in edge_names:
                raise InputError("comm_ms", f"communication latency names unknown edge node '{en}'")
            if not (math.isfinite(cl) and cl >= 0):
                raise InputError("comm_ms", f"communication latency {i} -> {en} must be >= 0 ms, got {cl}")
        seen: set[tuple[str, str]] = set()
        models = {v.model for v in self.variants}
        biggest = max(e.memory_mb for e in self.edges)
        for d in self.demands:
            if d.key in seen:
                raise InputError("demands", f"IoT node '{d.iot}' asks for model '{d.model}' twice")
            seen.add(d.key)
            if not (math.isfinite(d.rate_rps) and d.rate_rps > 0):
                raise InputError("demands", f"IoT node '{d.iot}', model '{d.model}': rate must be > 0 req/s, got {d.rate_rps}")
            if not (math.isfinite(d.max_latency_ms) and d.max_latency_ms > 0):
                raise InputError("demands", f"IoT node '{d.iot}', model '{d.model}': latency bound must be > 0 ms, "
                                            f"got {d.max_latency_ms}")
            if d.model not in models:
                raise InputError("demands", f"IoT node '{d.iot}' asks for model '{d.model}', which has no variants")
            if not any((d.iot, e) in self.comm_ms for e in edge_names):
                raise InputError("demands", f"IoT node '{d.iot}' reaches no edge node (no communication latency to any)")
        for m in sorted(models):
            smallest = min(v.memory_mb for v in self.variants if v.model == m)
            if smallest > biggest:
                raise InputError("variants", f"every variant of model '{m}' needs more memory ({smallest:g} MB) than "
                                             f"the largest edge node has ({biggest:g} MB)")

    def variants_of(self, model: str) -> tuple[Variant, ...]:
        return tuple(v for v in self.variants if v.model == model)

    def edge(self, name: str) -> EdgeNode:
        for e in self.edges:
            if e.name == name:
                return e
        raise InputError("edge", f"unknown edge node '{name}'")

    def exclusive_ms(self, variant: Variant, edge: EdgeNode) -> float:
        """``L_mv^e``: the variant's latency alone on ``edge`` (ms)."""
        return variant.latency_ms / edge.speed


@dataclass(frozen=True)
class Evaluation:
    """A solution's figures per the paper's equations: ``latency_ms`` L (Eq. 1), ``cost`` C with the exact
    phi and ``cost_tangent`` C with the tangent approximation the MILP optimizes (Eq. 5-7), ``utilization``
    the mean memory utilization over edge nodes, ``objective`` alpha L + (1 - alpha) C (tangent cost, as the
    MILP counts it), ``demand_ms`` each demand's round trip CL + IL, and ``violations``: one line per broken
    constraint (empty when feasible)."""

    latency_ms: float
    cost: float
    cost_tangent: float
    utilization: float
    objective: float
    demand_ms: Mapping[tuple[str, str], float]
    violations: tuple[str, ...]

    @property
    def feasible(self) -> bool:
        return not self.violations


@dataclass(frozen=True)
class MvspSolution:
    """``assignment[(iot, model)] = (edge, variant name)`` (x), ``instances[(edge, model, variant name)]`` = n
    (> 0 only), the solution's ``evaluation``, and how it was found: ``method`` ("milp", "heuristic",
    "brute-force"), ``status`` ("optimal", "time-limit", "feasible"), ``mip_gap`` (the solver's final
    relative gap, at most the requested gap when "optimal"; None for a heuristic), ``bound`` (the solver's
    lower bound on the objective, or None) and ``solver_s`` (the solver's own run time in s, as HiGHS
    reports it; None when no solver ran). A MILP solution also carries the heuristic's own solution it
    started from (``heuristic``: ``mvsp_greedy.greedy(instance)``, deterministic, so a caller comparing
    the two need not run it again) or, when the heuristic placed nothing, why (``heuristic_note``)."""

    assignment: Mapping[tuple[str, str], tuple[str, str]]
    instances: Mapping[tuple[str, str, str], int]
    evaluation: Evaluation
    method: str
    status: str
    mip_gap: float | None = None
    bound: float | None = None
    solver_s: float | None = None
    heuristic: MvspSolution | None = None
    heuristic_note: str = ""


def evaluate(instance: MvspInstance, assignment: Mapping[tuple[str, str], tuple[str, str]],
             instances: Mapping[tuple[str, str, str], int]) -> Evaluation:
    """Latency, cost and violations of a given forwarding (``assignment``) and instance counts, per Eq. 1-13."""
    inst = instance
    variants = {v.key: v for v in inst.variants}
    edges = {e.name: e for e in inst.edges}
    violations: list[str] = []
    n: dict[tuple[str, str, str], int] = {}
    for (e, m, v), count in instances.items():
        if e not in edges or (m, v) not in variants:
            violations.append(f"instances name unknown edge node or variant {(e, m, v)}")
            continue
        if count < 0 or int(count) != count:
            violations.append(f"instance count of {m}/{v} on {e} must be a non-negative integer, got {count}")
            continue
        if count:
            n[(e, m, v)] = int(count)
    # per-node interference work: sum of alpha * L^e * n over the node's instances
    work: dict[str, float] = {e: 0.0 for e in edges}
    for (e, m, v), count in n.items():
        var = variants[(m, v)]
        work[e] += var.interference * inst.exclusive_ms(var, edges[e]) * count

    def il(e: str, m: str, v: str) -> float:  # Eq. 3
        var = variants[(m, v)]
        le = inst.exclusive_ms(var, edges[e])
        own = var.interference * le * n.get((e, m, v), 0)
        return le + var.interference * le * (n.get((e, m, v), 0) - 1) + (work[e] - own)

    demand_ms: dict[tuple[str, str], float] = {}
    load: dict[tuple[str, str, str], float] = {}
    total_rate = 0.0
    weighted = 0.0
    for d in inst.demands:
        total_rate += d.rate_rps
        target = assignment.get(d.key)
        if target is None:
            violations.append(f"demand {d.iot}/{d.model} is not forwarded (Eq. 13)")
            continue
        e, v = target
        if e not in edges or (d.model, v) not in variants:
            violations.append(f"demand {d.iot}/{d.model} forwarded to unknown edge node or variant {target}")
            continue
        cl = inst.comm_ms.get((d.iot, e))
        if cl is None:
            violations.append(f"demand {d.iot}/{d.model} forwarded to {e}, which it cannot reach")
            continue
        if n.get((e, d.model, v), 0) < 1:
            violations.append(f"demand {d.iot}/{d.model} forwarded to {d.model}/{v} on {e}, which runs no instance (Eq. 10)")
            continue
        rt = cl + il(e, d.model, v)
        demand_ms[d.key] = rt
        weighted += d.rate_rps * rt
        if rt > d.max_latency_ms * (1 + 1e-9) + 1e-9:
            violations.append(f"demand {d.iot}/{d.model}: round trip {rt:.3f} ms > bound {d.max_latency_ms:g} ms (Eq. 4)")
        load[(e, d.model, v)] = load.get((e, d.model, v), 0.0) + d.rate_rps
    for key, rate in load.items():
        var = variants[key[1:]]
        cap = var.max_load_rps * n[key]
        if rate > cap * (1 + 1e-9) + 1e-9:
            violations.append(f"{key[1]}/{key[2]} on {key[0]}: load {rate:g} req/s > {n[key]} x {var.max_load_rps:g} (Eq. 9)")
    per_node: dict[str, int] = {}
    for (e, m, v), count in n.items():
        per_node[e] = per_node.get(e, 0) + count
        if inst.k_scope == "variant" and count > inst.k:
            violations.append(f"{m}/{v} on {e}: {count} instances > K = {inst.k} (Eq. 11)")
    if inst.k_scope == "node":
        for node, count in per_node.items():
            if count > inst.k:
                violations.append(f"{node}: {count} instances > K = {inst.k} per node")
    utils = []
    costs = []
    costs_t = []
    for edge in inst.edges:
        used = sum(variants[(m, v)].memory_mb * c for (ee, m, v), c in n.items() if ee == edge.name)
        u = used / edge.memory_mb
        if u > 1 + 1e-9:
            violations.append(f"{edge.name}: memory {used:g} MB > capacity {edge.memory_mb:g} MB (Eq. 12)")
        utils.append(u)
        costs.append(inst.cost.value(u))
        costs_t.append(inst.cost.approx(u))
    latency = weighted / total_rate if total_rate > 0 else 0.0
    cost = sum(costs) / len(costs)
    cost_t = sum(costs_t) / len(costs_t)
    return Evaluation(latency_ms=latency, cost=cost, cost_tangent=cost_t, utilization=sum(utils) / len(utils),
                      objective=inst.alpha * latency + (1 - inst.alpha) * cost_t, demand_ms=demand_ms,
                      violations=tuple(violations))


# ---------------------------------------------------------------------------------------------------------
# The MILP (Eq. 1-13) with HiGHS
# ---------------------------------------------------------------------------------------------------------


class MvspInfeasible(InputError):
    """No solution meets every constraint; ``causes`` names each constraint group that cannot be met (an
    IoT node's latency bound, an edge node's memory, the instances K allows)."""

    def __init__(self, causes: Sequence[str]) -> None:
        self.causes = tuple(causes)
        super().__init__("mvsp instance", "infeasible: " + "; ".join(self.causes))


class MvspNoSolution(EdgemuxError):
    """The solver reached its time limit before it found any feasible solution (the instance may well be
    feasible: raise the time limit or use the heuristic)."""


_INF = highspy.kHighsInf
_EPS = 1e-9


class _Milp:
    """Columns collected in Python, rows in a :class:`SparseRows`; handed to HiGHS in one go."""

    def __init__(self) -> None:
        self.cost: list[float] = []
        self.lb: list[float] = []
        self.ub: list[float] = []
        self.integer: list[int] = []
        self.rows = SparseRows()

    def col(self, lb: float, ub: float, cost: float = 0.0, integer: bool = False) -> int:
        self.cost.append(cost)
        self.lb.append(lb)
        self.ub.append(ub)
        if integer:
            self.integer.append(len(self.cost) - 1)
        return len(self.cost) - 1

    def row(self, terms: Iterable[tuple[int, float]], lo: float, hi: float) -> None:
        self.rows.add_terms(terms, lo, hi)

    def highs(self, *, time_limit_s: float, mip_gap: float, threads: int | None, maximize: bool = False) -> highspy.Highs:
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("time_limit", float(time_limit_s))
        h.setOptionValue("mip_rel_gap", float(mip_gap))
        # the relative gap decides; an absolute gap of HiGHS's default 1e-6 would stop early on small objectives
        h.setOptionValue("mip_abs_gap", 1e-12)
        if threads is not None:
            h.setOptionValue("threads", int(threads))
        n = len(self.cost)
        h.addCols(n, np.array(self.cost, dtype=np.float64), np.array(self.lb, dtype=np.float64),
                  np.array(self.ub, dtype=np.float64), 0, np.zeros(n, dtype=np.int32),
                  np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float64))
        self.rows.add_to(h)
        if self.integer:
            h.changeColsIntegrality(len(self.integer), np.array(self.integer, dtype=np.int32),
                                    np.full(len(self.integer), highspy.HighsVarType.kInteger.value, dtype=np.uint8))
        if maximize:
            h.changeObjectiveSense(highspy.ObjSense.kMaximize)
        return h


@dataclass
class _Slack:
    col: int
    kind: str          # "latency", "memory", "k-node", "k-variant", "load"
    key: tuple[str, ...]
    scale: float       # the slack's unit in the objective (ms of Lmax, MB of C, ...)


@dataclass
class _Built:
    milp: _Milp
    x: dict[tuple[int, str, str], int]        # (demand index, edge, variant name) -> column
    # (edge, model, variant name) -> [(column, multiplier)]: n is the weighted sum of those columns
    n: dict[tuple[str, str, str], list[tuple[int, int]]]
    slacks: list[_Slack]
    form: str = "big-m"                       # "big-m" or "configurations"
    # configurations form: edge -> {frozenset of (variant key, count)} -> y column
    y: dict[str, dict[frozenset[tuple[tuple[str, str], int]], int]] = field(default_factory=dict)


def _needed(rate: float, load: float) -> int:
    """Instances a rate needs (Eq. 9): ceil(rate / load), robust to rounding."""
    return max(1, math.ceil(rate / load - 1e-9))


def _fits(inst: MvspInstance, v: Variant, e: EdgeNode) -> int:
    """How many instances of ``v`` node ``e`` can hold: K (Eq. 11, either scope) and memory (Eq. 12)."""
    return min(inst.k, int(math.floor(e.memory_mb / v.memory_mb + 1e-9)))


def _max_work(weights: Sequence[float], memory: Sequence[float], ub: Sequence[int], capacity: float | None,
              k: int | None) -> float:
    """Upper bound on a node's interference work W = sum a n (ms) over integer n <= ub, within ``capacity``
    MB and ``k`` instances: the big-M of the W-linked rows. A tiny knapsack, solved by HiGHS; its dual bound
    is a valid upper bound even if the solve stops early."""
    cols = [j for j in range(len(weights)) if ub[j] > 0 and weights[j] > 0]
    trivial = sum(weights[j] * ub[j] for j in cols)
    if not cols or (capacity is None and k is None):
        return trivial
    milp = _Milp()
    for j in cols:
        milp.col(0.0, float(ub[j]), weights[j], integer=True)
    if capacity is not None:
        milp.row(((c, memory[j]) for c, j in enumerate(cols)), -_INF, capacity)
    if k is not None:
        milp.row(((c, 1.0) for c in range(len(cols))), -_INF, float(k))
    h = milp.highs(time_limit_s=5.0, mip_gap=1e-9, threads=None, maximize=True)
    h.run()
    info = h.getInfo()
    if h.getModelStatus() == highspy.HighsModelStatus.kOptimal:
        bound = max(info.objective_function_value, info.mip_dual_bound)
    else:
        bound = info.mip_dual_bound if math.isfinite(info.mip_dual_bound) else trivial
    return min(trivial, bound) * (1 + 1e-9) + 1e-9


def _build(inst: MvspInstance, *, elastic: bool) -> _Built:
    """The MILP of Eq. 1-13, linearized (see ``solve``). ``elastic``: the feasibility version used to
    explain infeasibility: the objective is the sum of normalized slacks on the latency, memory, K and load
    rows, and instance counts are bounded by the demand instead of by K and memory."""
    milp = _Milp()
    var = {v.key: v for v in inst.variants}
    alpha = inst.alpha
    total_rate = sum(d.rate_rps for d in inst.demands)
    model_rate: dict[str, float] = {}
    for d in inst.demands:
        model_rate[d.model] = model_rate.get(d.model, 0.0) + d.rate_rps
    slacks: list[_Slack] = []

    # n[e, m, v] (Eq. 10-12): integer. A model nobody asks for gets no instances (they could only add
    # memory cost and interference).
    ub_n: dict[tuple[str, str, str], int] = {}
    n: dict[tuple[str, str, str], int] = {}
    for e in inst.edges:
        for v in inst.variants:
            rate = model_rate.get(v.model, 0.0)
            if rate <= 0:
                continue
            ub = _needed(rate, v.max_load_rps) if elastic else _fits(inst, v, e)
            if ub >= 1:
                ub_n[(e.name, *v.key)] = ub
                n[(e.name, *v.key)] = milp.col(0.0, float(ub), integer=True)

    # W[e] = sum_{m,v} alpha_mv L^e_mv n^e_mv: the interference every request on e suffers (Eq. 3 rewritten:
    # IL^e_mv = (1 - alpha_mv) L^e_mv + W[e], since the own-variant term alpha L (n - 1) and the others'
    # terms add up to W minus alpha L).
    work: dict[str, int] = {}
    w_max: dict[str, float] = {}
    for e in inst.edges:
        keys = [(e.name, *v.key) for v in inst.variants if (e.name, *v.key) in n]
        vs = [var[k[1:]] for k in keys]
        a = [v.interference * inst.exclusive_ms(v, e) for v in vs]
        if elastic:
            w_max[e.name] = _max_work(a, [v.memory_mb for v in vs], [ub_n[k] for k in keys], None, None)
        else:
            w_max[e.name] = _max_work(a, [v.memory_mb for v in vs], [ub_n[k] for k in keys], e.memory_mb,
                                      inst.k if inst.k_scope == "node" else None)
        work[e.name] = milp.col(0.0, w_max[e.name])
        milp.row([(work[e.name], 1.0)] + [(n[k], -aa) for k, aa in zip(keys, a)], 0.0, 0.0)

    # memory (Eq. 8, 12) and K per node (Eq. 11 with k_scope="node")
    for e in inst.edges:
        keys = [k for k in n if k[0] == e.name]
        mem = [(n[k], var[k[1:]].memory_mb) for k in keys]
        if elastic:
            s = milp.col(0.0, _INF, 1.0 / e.memory_mb)
            slacks.append(_Slack(s, "memory", (e.name,), e.memory_mb))
            milp.row(mem + [(s, -1.0)], -_INF, e.memory_mb)
        elif sum(a * ub_n[k] for (_, a), k in zip(mem, keys)) > e.memory_mb:
            milp.row(mem, -_INF, e.memory_mb)
        if inst.k_scope == "node":
            if elastic:
                s = milp.col(0.0, _INF, 1.0 / inst.k)
                slacks.append(_Slack(s, "k-node", (e.name,), float(inst.k)))
                milp.row([(n[k], 1.0) for k in keys] + [(s, -1.0)], -_INF, float(inst.k))
            elif sum(ub_n[k] for k in keys) > inst.k:
                milp.row([(n[k], 1.0) for k in keys], -_INF, float(inst.k))
        elif elastic:
            for k in keys:
                if ub_n[k] > inst.k:
                    s = milp.col(0.0, _INF, 1.0 / inst.k)
                    slacks.append(_Slack(s, "k-variant", k, float(inst.k)))
                    milp.row([(n[k], 1.0), (s, -1.0)], -_INF, float(inst.k))

    # utilization cost z[e] >= every tangent of phi at u_e (Eq. 6-8), z >= 0; weight (1 - alpha) / N_E
    if not elastic and alpha < 1.0:
        for e in inst.edges:
            keys = [k for k in n if k[0] == e.name]
            z = milp.col(0.0, _INF, (1.0 - alpha) / len(inst.edges))
            for slope, intercept in inst.cost.tangents():
                terms = [(n[k], -slope * var[k[1:]].memory_mb
                          / e.memory_mb) for k in keys]
                milp.row([(z, 1.0)] + terms, intercept, _INF)

    # x[i, m, e, v] and the rows per demand
    x: dict[tuple[int, str, str], int] = {}
    load_terms: dict[tuple[str, str, str], list[tuple[int, float]]] = {}
    for di, d in enumerate(inst.demands):
        lat_slack = None
        if elastic:
            lat_slack = milp.col(0.0, _INF, 1.0 / d.max_latency_ms)
            slacks.append(_Slack(lat_slack, "latency", (d.iot, d.model), d.max_latency_ms))
        weight = alpha * d.rate_rps / total_rate  # Eq. 1's share of this demand in the objective
        assign: list[tuple[int, float]] = []
        for e in inst.edges:
            cl = inst.comm_ms.get((d.iot, e.name))
            if cl is None:
                continue
            cands: list[tuple[Variant, float]] = []
            for v in inst.variants_of(d.model):
                k = (e.name, *v.key)
                if k not in n:
                    continue
                le = inst.exclusive_ms(v, e)
                if not elastic:
                    need = _needed(d.rate_rps, v.max_load_rps)
                    if need > ub_n[k]:
                        continue  # Eq. 9 cannot hold even with every allowed instance
                    if cl + le * (1 + v.interference * (need - 1)) > d.max_latency_ms * (1 + 1e-9) + 1e-9:
                        continue  # Eq. 4 cannot hold even with no other instance on e
                cands.append((v, (1 - v.interference) * le))
            if not cands:
                continue
            xs = []
            for v, c in cands:
                col = milp.col(0.0, 1.0, weight * (cl + c), integer=True)
                x[(di, e.name, v.name)] = col
                xs.append((col, v, c))
                assign.append((col, 1.0))
                k = (e.name, *v.key)
                load_terms.setdefault(k, []).append((col, d.rate_rps))
                milp.row([(n[k], 1.0), (col, -1.0)], 0.0, _INF)  # Eq. 10
            wm = w_max[e.name]
            if not elastic and alpha > 0:
                # w >= W[e] when the demand goes to e (Eq. 1's IL x product), and w >= its own variant's
                # alpha L (a valid cut: a used variant has >= 1 instance)
                w = milp.col(0.0, wm, weight)
                milp.row([(w, 1.0), (work[e.name], -1.0)] + [(col, -wm) for col, _, _ in xs], -wm, _INF)
                milp.row([(w, 1.0)] + [(col, -v.interference * inst.exclusive_ms(v, e)) for col, v, _ in xs],
                         0.0, _INF)
            # Eq. 4 for (i, m, e), all variants in one row (Eq. 13 allows at most one x = 1 here):
            # sum_v (CL + c_v) x_v + W[e] <= Lmax + M (1 - sum_v x_v), M = max(0, W_max - Lmax)
            worst = cl + max(c for _, _, c in xs) + wm
            if elastic or worst > d.max_latency_ms:
                big = max(0.0, wm - d.max_latency_ms)
                terms = [(col, cl + c + big) for col, _, c in xs] + [(work[e.name], 1.0)]
                if lat_slack is not None:
                    terms.append((lat_slack, -1.0))
                milp.row(terms, -_INF, d.max_latency_ms + big)
        milp.row(assign, 1.0, 1.0)  # Eq. 13 (empty only when the cheap checks would have failed)

    # Eq. 9: load on each (e, m, v) within n Load_mv
    for k, terms in load_terms.items():
        v = var[k[1:]]
        row = terms + [(n[k], -v.max_load_rps)]
        if elastic:
            s = milp.col(0.0, _INF, 1.0 / v.max_load_rps)
            slacks.append(_Slack(s, "load", k, v.max_load_rps))
            row.append((s, -1.0))
        milp.row(row, -_INF, 0.0)
    return _Built(milp=milp, x=x, n={k: [(c, 1)] for k, c in n.items()}, slacks=slacks)


# Most configurations the configuration formulation enumerates (over all edge nodes) before it gives way to
# the big-M one. P1 at K = 3 and 4 enumerates about 16,000 (47,000 columns) and is proven optimal in the
# configuration form where the big-M form stops at 2.5-3.7 % gaps after 10 s (measured at this commit).
_CONFIG_LIMIT = 60000
# HiGHS's RINS/RENS sub-MIPs cost seconds at the root but find the incumbents that let it fix most columns
# by reduced cost; measured on P1/P2-like instances they pay for themselves (on = HiGHS's default)
_SUB_MIP_HEURISTICS = True


def _candidates(inst: MvspInstance) -> dict[tuple[int, str], list[tuple[Variant, float, float]]]:
    """(demand index, edge) -> [(variant, CL ms, (1 - alpha_mv) L^e_mv ms)] for the (e, v) a demand could use
    at all: reachable, fits (K, memory), carries the rate (Eq. 9) and meets Eq. 4 with no other instance."""
    edges = {e.name: e for e in inst.edges}
    out: dict[tuple[int, str], list[tuple[Variant, float, float]]] = {}
    for di, d in enumerate(inst.demands):
        for e in inst.edges:
            cl = inst.comm_ms.get((d.iot, e.name))
            if cl is None:
                continue
            for v in inst.variants_of(d.model):
                ub = _fits(inst, v, edges[e.name])
                need = _needed(d.rate_rps, v.max_load_rps)
                le = inst.exclusive_ms(v, e)
                if ub < 1 or need > ub:
                    continue
                if cl + le * (1 + v.interference * (need - 1)) > d.max_latency_ms * (1 + 1e-9) + 1e-9:
                    continue
                out.setdefault((di, e.name), []).append((v, cl, (1 - v.interference) * le))
    return out


def _configurations(inst: MvspInstance, e: EdgeNode, caps: Mapping[tuple[str, str], int],
                    limit: int) -> list[dict[tuple[str, str], int]] | None:
    """Every instance vector of node ``e`` (variant key -> count >= 1) within per-variant caps, memory
    (Eq. 12) and K per node (k_scope "node"), the empty one included; None past ``limit``."""
    keys = sorted(caps)
    mem = {v.key: v.memory_mb for v in inst.variants}
    total_cap = inst.k if inst.k_scope == "node" else sum(caps.values())
    out: list[dict[tuple[str, str], int]] = []
    cur: dict[tuple[str, str], int] = {}

    def rec(j: int, used_mb: float, count: int) -> bool:
        if j == len(keys):
            out.append(dict(cur))
            return len(out) <= limit
        k = keys[j]
        for c in range(0, caps[k] + 1):
            if c and (used_mb + c * mem[k] > e.memory_mb * (1 + 1e-9) or count + c > total_cap):
                break
            if c:
                cur[k] = c
            ok = rec(j + 1, used_mb + c * mem[k], count + c)
            cur.pop(k, None)
            if not ok:
                return False
        return True

    return out if rec(0, 0.0, 0) else None


def _build_configurations(inst: MvspInstance, limit: int | None = None) -> _Built | None:
    """The same MILP in configuration form: a binary y[e, c] picks node e's whole instance vector c from an
    enumeration (memory, K and per-variant counts within what the demands could use: an instance no demand
    can use only adds cost and interference). With c fixed, W[e] = W_c and the node's cost phi~(u_c) are
    constants, so Eq. 1's IL x product is linear in R[e, c, v], the rate v serves on e while e runs c:
    exact, no big-M. None when the enumeration exceeds ``limit`` (default ``_CONFIG_LIMIT``)
    configurations: the big-M form is used then.

    Rows: one configuration per node; Eq. 13; x[d, e, v] <= the sum of y[e, c] over the configurations c
    that hold v with instances enough for d alone (Eq. 9) and a round trip CL + (1 - alpha_mv) L + W_c
    within d's bound (Eq. 4); sum_c R[e, c, v] = sum_d r_d x[d, e, v]; R[e, c, v] <= n_v(c) Load_v y[e, c]
    (Eq. 9). A form with a column per (demand, configuration, variant) instead of R (commit b2b688b) has a
    tighter LP but several times the columns; at P2's size HiGHS spent most of its 10 s on that root LP."""
    if limit is None:
        limit = _CONFIG_LIMIT
    cands = _candidates(inst)
    var = {v.key: v for v in inst.variants}
    alpha = inst.alpha
    total_rate = sum(d.rate_rps for d in inst.demands)
    configs: dict[str, list[dict[tuple[str, str], int]]] = {}
    room = limit
    for e in inst.edges:
        rate: dict[tuple[str, str], float] = {}
        for (di, en), lst in cands.items():
            if en == e.name:
                for v, _, _ in lst:
                    rate[v.key] = rate.get(v.key, 0.0) + inst.demands[di].rate_rps
        caps = {k: min(_fits(inst, var[k], e), _needed(r, var[k].max_load_rps)) for k, r in rate.items()}
        found = _configurations(inst, e, caps, room)
        if found is None:
            return None
        configs[e.name] = found
        room -= len(found)
        if room < 0:
            return None
    milp = _Milp()
    x: dict[tuple[int, str, str], int] = {}
    n_terms: dict[tuple[str, str, str], list[tuple[int, int]]] = {}
    y: dict[str, list[int]] = {}
    work: dict[str, list[float]] = {}
    for e in inst.edges:
        y[e.name] = []
        work[e.name] = []
        for c in configs[e.name]:
            u = sum(var[k].memory_mb * cnt for k, cnt in c.items()) / e.memory_mb
            col = milp.col(0.0, 1.0, (1 - alpha) / len(inst.edges) * inst.cost.approx(u), integer=True)
            y[e.name].append(col)
            work[e.name].append(sum(var[k].interference * inst.exclusive_ms(var[k], e) * cnt for k, cnt in c.items()))
            for k, cnt in c.items():
                n_terms.setdefault((e.name, *k), []).append((col, cnt))
        milp.row(((col, 1.0) for col in y[e.name]), 1.0, 1.0)  # one configuration per node
    holding: dict[tuple[str, tuple[str, str]], list[int]] = {}  # (e, v) -> indices of the configurations with v
    for e in inst.edges:
        for ci, conf in enumerate(configs[e.name]):
            for k in conf:
                holding.setdefault((e.name, k), []).append(ci)
    flow: dict[tuple[str, tuple[str, str]], list[tuple[int, float]]] = {}
    for di, d in enumerate(inst.demands):
        weight = alpha * d.rate_rps / total_rate
        assign = []
        for e in inst.edges:
            for v, cl, own in cands.get((di, e.name), []):
                allowed = [y[e.name][ci] for ci in holding.get((e.name, v.key), [])
                           if v.max_load_rps * configs[e.name][ci][v.key] >= d.rate_rps * (1 - 1e-9)
                           and cl + own + work[e.name][ci] <= d.max_latency_ms * (1 + 1e-9) + 1e-9]
                if not allowed:
                    continue  # no configuration of e lets v serve d (Eq. 4 or 9)
                col = milp.col(0.0, 1.0, weight * (cl + own), integer=True)
                x[(di, e.name, v.name)] = col
                assign.append((col, 1.0))
                flow.setdefault((e.name, v.key), []).append((col, d.rate_rps))
                milp.row([(col, 1.0)] + [(yc, -1.0) for yc in allowed], -_INF, 0.0)
        milp.row(assign, 1.0, 1.0)  # Eq. 13
    for (en, key), terms in flow.items():
        parts = []
        for ci in holding[(en, key)]:
            cap = var[key].max_load_rps * configs[en][ci][key]
            r = milp.col(0.0, cap, alpha / total_rate * work[en][ci])  # Eq. 1's W_c part, per req/s served
            milp.row([(r, 1.0), (y[en][ci], -cap)], -_INF, 0.0)  # Eq. 9 under c
            parts.append(r)
        milp.row(terms + [(r, -1.0) for r in parts], 0.0, 0.0)
    ymap = {e.name: {frozenset(conf.items()): y[e.name][ci] for ci, conf in enumerate(configs[e.name])}
            for e in inst.edges}
    return _Built(milp=milp, x=x, n=n_terms, slacks=[], form="configurations", y=ymap)


def _start(inst: MvspInstance, built: _Built, assignment: Mapping[tuple[str, str], tuple[str, str]],
           instances: Mapping[tuple[str, str, str], int]) -> tuple[list[int], list[float]] | None:
    """The integer columns of ``built`` for a given solution (HiGHS completes the continuous ones)."""
    cols: dict[int, float] = {}
    for (di, e, v), col in built.x.items():
        cols[col] = 1.0 if assignment.get(inst.demands[di].key) == (e, v) else 0.0
    if built.form == "configurations":
        for e, table in built.y.items():
            conf = frozenset(((m, v), c) for (ee, m, v), c in instances.items() if ee == e)
            if conf not in table:
                return None
            for key, col in table.items():
                cols[col] = 1.0 if key == conf else 0.0
    else:
        for k, terms in built.n.items():
            for col, _ in terms:
                cols[col] = float(instances.get(k, 0))
    if any(col not in cols for col in built.x.values()):
        return None
    idx = sorted(cols)
    return idx, [cols[j] for j in idx]


def _cheap_causes(inst: MvspInstance) -> list[str]:
    """Demands that no (edge, variant) can serve even alone: sound reasons for infeasibility, found without a
    solver. Checks, per demand: a variant fits on some reachable node; some reachable (edge, variant) meets
    the latency bound alone (CL + L^e_mv); some carries the rate within K and memory (Eq. 9, 11, 12); some
    does both at once (the instances the rate needs interfere with each other, Eq. 3)."""
    causes: list[str] = []
    for d in inst.demands:
        reach = [(e, inst.comm_ms[(d.iot, e.name)]) for e in inst.edges if (d.iot, e.name) in inst.comm_ms]
        fit = [(e, cl, v, _fits(inst, v, e)) for e, cl in reach for v in inst.variants_of(d.model)]
        fit = [t for t in fit if t[3] >= 1]
        if not fit:
            causes.append(f"IoT node '{d.iot}' cannot run model '{d.model}' on any edge node it reaches "
                          f"({', '.join(e.name for e, _ in reach)}): no variant fits in their memory within K = {inst.k}")
            continue
        e, cl, v, _ = min(fit, key=lambda t: (t[1] + inst.exclusive_ms(t[2], t[0]), t[0].name, t[2].name))
        best = cl + inst.exclusive_ms(v, e)
        if best > d.max_latency_ms * (1 + 1e-9) + 1e-9:
            causes.append(f"IoT node '{d.iot}' cannot meet its latency bound {d.max_latency_ms:g} ms for model "
                          f"'{d.model}': the best round trip is {best:.2f} ms via edge '{e.name}', variant '{v.name}'")
            continue
        e, cl, v, ub = max(fit, key=lambda t: (t[2].max_load_rps * t[3], t[0].name, t[2].name))
        if d.rate_rps > v.max_load_rps * ub * (1 + 1e-9) + 1e-9:
            causes.append(f"IoT node '{d.iot}' sends {d.rate_rps:g} req/s for model '{d.model}', more than any edge "
                          f"node it reaches can carry: at most {v.max_load_rps * ub:g} req/s ({ub} instance(s) of "
                          f"variant '{v.name}' on '{e.name}')")
            continue
        both = []
        for e, cl, v, ub in fit:
            need = _needed(d.rate_rps, v.max_load_rps)
            if need <= ub:
                both.append((cl + inst.exclusive_ms(v, e) * (1 + v.interference * (need - 1)), e.name, v.name, need))
        best_both = min(both)
        if best_both[0] > d.max_latency_ms * (1 + 1e-9) + 1e-9:
            rt, en, vn, need = best_both
            causes.append(f"IoT node '{d.iot}' cannot meet its latency bound {d.max_latency_ms:g} ms for model "
                          f"'{d.model}' at {d.rate_rps:g} req/s: the best round trip is {rt:.2f} ms via edge '{en}', "
                          f"variant '{vn}' ({need} instances, which slow each other down)")
    return causes


def _elastic_causes(inst: MvspInstance, *, time_limit_s: float, threads: int | None) -> list[str]:
    """Solve the elastic MILP (slack on each demand's latency rows, each node's memory and K rows, each
    variant's load row; minimize the normalized slack) and name each group whose slack is positive."""
    built = _build(inst, elastic=True)
    h = built.milp.highs(time_limit_s=time_limit_s, mip_gap=1e-6, threads=threads)
    h.run()
    if h.getInfo().primal_solution_status != 2:  # 2 = kSolutionStatusFeasible
        return []
    values = h.getSolution().col_value
    causes = []
    for s in built.slacks:
        amount = values[s.col]
        if amount <= 1e-6 * max(1.0, s.scale):
            continue
        if s.kind == "latency":
            causes.append(f"IoT node '{s.key[0]}' cannot meet its latency bound {s.scale:g} ms for model '{s.key[1]}' "
                          f"alongside the other demands (short by {amount:.2f} ms at best)")
        elif s.kind == "memory":
            causes.append(f"memory of edge node '{s.key[0]}' ({s.scale:g} MB) cannot hold the instances the demands "
                          f"need (short by {amount:.3g} MB)")
        elif s.kind == "k-node":
            causes.append(f"edge node '{s.key[0]}' would need {int(round(s.scale + amount))} instances, more than "
                          f"K = {inst.k}")
        elif s.kind == "k-variant":
            causes.append(f"variant '{s.key[1]}/{s.key[2]}' on edge node '{s.key[0]}' would need "
                          f"{int(round(s.scale + amount))} instances, more than K = {inst.k}")
        else:
            causes.append(f"variant '{s.key[1]}/{s.key[2]}' on edge node '{s.key[0]}' cannot carry the load forwarded "
                          f"to it (short by {amount:.3g} req/s)")
    return causes


def infeasibility_causes(instance: MvspInstance, *, time_limit_s: float = 10.0) -> tuple[str, ...]:
    """Why ``instance`` has no feasible solution: the cheap per-demand checks first, then the elastic MILP.
    Empty when no cause was found (a feasible instance, or the elastic solve ran out of time)."""
    causes = _cheap_causes(instance)
    if causes:
        return tuple(causes)
    return tuple(_elastic_causes(instance, time_limit_s=time_limit_s, threads=None))


def _check_options(time_limit_s: float, mip_gap: float, threads: int | None, max_nodes: int | None = None) -> None:
    if max_nodes is not None and (not isinstance(max_nodes, int) or isinstance(max_nodes, bool) or max_nodes < 1):
        raise InputError("max_nodes", f"must be an integer >= 1, got {max_nodes!r}")
    if not (isinstance(time_limit_s, (int, float)) and math.isfinite(time_limit_s) and time_limit_s > 0):
        raise InputError("time_limit_s", f"must be > 0 s, got {time_limit_s!r}")
    if not (isinstance(mip_gap, (int, float)) and 0.0 <= mip_gap < 1.0):
        raise InputError("mip_gap", f"must be in [0, 1), got {mip_gap!r}")
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
        raise InputError("threads", f"must be an integer >= 1, got {threads!r}")


def _heuristic_start(inst: MvspInstance, start: Mapping[tuple[str, str], tuple[str, str]] | None
                     ) -> tuple[MvspSolution | None, MvspSolution | None, str]:
    """The MILP's start: the heuristic's solution (``mvsp_greedy``), and when ``start`` is given, the better
    of that and ``start`` polished by the heuristic's local search. Returns (the start, None when the
    heuristic places nothing and no start is given: the MILP may still find a solution; the heuristic's
    own solution or None; why it placed nothing, or ""). A bad ``start`` raises ``InputError``."""
    from edgemux.policies.mvsp_greedy import MvspPlacementError, greedy  # the heuristic builds on this module

    found = []
    if start is not None:
        found.append(greedy(inst, start=start))
    plain: MvspSolution | None = None
    note = ""
    try:
        plain = greedy(inst)
        found.append(plain)
    except MvspPlacementError as exc:
        note = str(exc)
    best = min(found, key=lambda sol: sol.evaluation.objective) if found else None
    return best, plain, note


def solve(instance: MvspInstance, *, time_limit_s: float = 10.0, mip_gap: float = 1e-4,
          threads: int | None = None, start: Mapping[tuple[str, str], tuple[str, str]] | None = None,
          max_nodes: int | None = None) -> MvspSolution:
    """The MVSP optimum by MILP (paper 001, Eq. 1-13) with HiGHS.

    Variables: binary x[i,m,e,v] for reachable (i, e) only, integer n[e,m,v] in [0, min(K, floor(C^e/R_mv))],
    z[e] >= 0 (Eq. 7), W[e] = sum alpha_mv L^e_mv n^e_mv (the interference on e: Eq. 3 is IL^e_mv =
    (1 - alpha_mv) L^e_mv + W[e]) and w[i,m,e] >= W[e] - M (1 - sum_v x[i,m,e,v]), w >= 0, which equals
    IL x's W part at the optimum (Eq. 1 multiplies IL, linear in n, by x). M = the most interference e can
    host (a tiny knapsack over K and memory, solved exactly). Eq. 4 is one row per (i, m, e):
    sum_v (CL + (1 - alpha_mv) L) x + W[e] <= Lmax + max(0, M - Lmax) (1 - sum_v x). (e, v) pairs that
    cannot meet Eq. 4 or Eq. 9 even alone are left out. Objective alpha L + (1 - alpha) (1/N_E) sum z.
    That is the big-M form. Where a node's instance vectors can be enumerated (K <= 4 on the paper's sizes)
    the configuration form of ``_build_configurations`` is solved instead: the same optimum, no big-M.

    ``time_limit_s`` (s) and ``mip_gap`` (relative) are HiGHS options; ``threads`` HiGHS's thread count.
    ``max_nodes``: HiGHS's branch-and-bound node limit, a limit on work rather than time, so that where it
    binds first the result is the same on any host (tests use it; a wall-clock limit is for experiments).
    The MILP starts from the heuristic's solution (``mvsp_greedy.greedy``, ruin-and-recreate included), or
    from ``start`` polished by the heuristic's local search when that is better: ``start`` is a feasible
    forwarding ``{(iot, model): (edge, variant)}``, e.g. the optimum of a neighbouring instance in a sweep
    (K - 1, a higher load, another alpha); one that is incomplete or infeasible raises ``InputError``.
    Returns status "optimal" (gap <= mip_gap proven), "time-limit" or "work-limit" (``max_nodes`` reached):
    the incumbent, with its gap and bound.
    Raises ``MvspInfeasible`` naming the causes when no solution exists, ``MvspNoSolution`` when the time
    limit passed with no incumbent, and ``RuntimeError`` if the solution disagrees with ``evaluate`` (a bug)."""
    _check_options(time_limit_s, mip_gap, threads, max_nodes)
    inst = instance
    causes = _cheap_causes(inst)
    if causes:
        raise MvspInfeasible(causes)
    built = _build_configurations(inst) or _build(inst, elastic=False)
    h = built.milp.highs(time_limit_s=time_limit_s, mip_gap=mip_gap, threads=threads)
    h.setOptionValue("mip_heuristic_run_rins", _SUB_MIP_HEURISTICS)
    h.setOptionValue("mip_heuristic_run_rens", _SUB_MIP_HEURISTICS)
    if max_nodes is not None:
        h.setOptionValue("mip_max_nodes", int(max_nodes))
    found, plain, note = _heuristic_start(inst, start)
    if found is not None:
        cols = _start(inst, built, dict(found.assignment), dict(found.instances))
        if cols is not None:
            h.setSolution(len(cols[0]), np.array(cols[0], dtype=np.int32), np.array(cols[1], dtype=np.float64))
    h.run()
    status = h.getModelStatus()
    info = h.getInfo()
    solver_s = float(h.getRunTime())
    ms = highspy.HighsModelStatus
    if status in (ms.kInfeasible, ms.kUnboundedOrInfeasible):
        causes = _elastic_causes(inst, time_limit_s=time_limit_s, threads=threads)
        raise MvspInfeasible(causes or ["the constraints cannot all hold together (HiGHS proved it; the elastic "
                                        "solve named no single group within the time limit)"])
    has_incumbent = info.primal_solution_status == 2  # kSolutionStatusFeasible
    if status == ms.kOptimal:
        label = "optimal"
    elif status in (ms.kTimeLimit, ms.kInterrupt, ms.kIterationLimit, ms.kSolutionLimit):
        work = status != ms.kTimeLimit and status != ms.kInterrupt
        if not has_incumbent:
            limit = f"the node limit of {max_nodes}" if work else f"the time limit of {time_limit_s:g} s"
            raise MvspNoSolution(f"HiGHS found no feasible solution within {limit}")
        label = "work-limit" if work else "time-limit"
    else:
        raise RuntimeError(f"HiGHS ended with status '{h.modelStatusToString(status)}' on an MVSP instance")
    values = list(h.getSolution().col_value)
    assignment: dict[tuple[str, str], tuple[str, str]] = {}
    for (di, e, v), col in built.x.items():
        if values[col] > 0.5:
            d = inst.demands[di]
            assignment[d.key] = (e, v)
    instances = {}
    for k, terms in built.n.items():
        count = int(round(sum(values[col] * mult for col, mult in terms)))
        if count >= 1:
            instances[k] = count
    ev = evaluate(inst, assignment, instances)
    if not ev.feasible:
        raise RuntimeError("MVSP MILP returned a solution evaluate() rejects: " + "; ".join(ev.violations))
    # The MILP's objective at the rounded integer point: fix the integers and re-solve the LP (HiGHS accepts
    # integers within 1e-6, and a big-M times that would blur the comparison).
    ints = np.array(built.milp.integer, dtype=np.int32)
    fixed = np.array([round(values[j]) for j in built.milp.integer], dtype=np.float64)
    h.changeColsIntegrality(len(ints), ints, np.zeros(len(ints), dtype=np.uint8))
    h.changeColsBounds(len(ints), ints, fixed, fixed)
    h.setOptionValue("time_limit", _INF)  # HiGHS counts its run time from the first solve on
    h.run()
    if h.getModelStatus() != ms.kOptimal:
        raise RuntimeError(f"MVSP MILP: re-solving at the rounded solution gave '{h.modelStatusToString(h.getModelStatus())}'")
    milp_obj = h.getInfo().objective_function_value
    if abs(milp_obj - ev.objective) > 1e-6 * max(abs(milp_obj), abs(ev.objective)) + 1e-12:
        raise RuntimeError(f"MVSP MILP objective {milp_obj!r} differs from evaluate()'s {ev.objective!r}")
    gap = float(info.mip_gap) if math.isfinite(info.mip_gap) else None
    bound = float(info.mip_dual_bound) if math.isfinite(info.mip_dual_bound) else None
    return MvspSolution(assignment=assignment, instances=instances, evaluation=ev, method="milp", status=label,
                        mip_gap=max(0.0, gap) if gap is not None else None, bound=bound, solver_s=solver_s,
                        heuristic=plain, heuristic_note=note)
