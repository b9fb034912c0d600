"""A greedy heuristic with local search for MVSP instances too large for the MILP.

Key fact it relies on (Eq. 3 with ``n_mv^e >= 1``): a request served by variant ``j`` on node ``e`` sees

    IL = L_j^e + a_j L_j^e (n_j - 1) + (W_e - a_j L_j^e n_j) = L_j^e (1 - a_j) + W_e,

where ``W_e = sum_j' a_j' L_j'^e n_j'^e`` is the node's total interference work. So every instance added
to a node delays *every* request already there by ``a_j L_j^e``: the heuristic checks each assigned
demand's bound (Eq. 4) through the node's smallest slack. Extra instances never lower a latency in this
model, so each (node, variant) runs the fewest instances its load needs, ``ceil(load / Load_mv)`` (Eq. 9).

1. **Construction**: demands in decreasing rate order (ties: tighter bound first), each to the (node,
   variant) with the smallest increase of the objective ``alpha L + (1 - alpha) C`` (tangent cost, as the
   MILP counts it) that keeps every constraint: K, memory, load, and every bound on that node. Then the
   tightest-bound-first and fewest-options-first orders, and fewest-options-first placing each demand on
   the feasible variant with the largest Load_mv (room for the demands still to come when capacity binds).
   Small instances improve every construction that succeeds and keep the best; large ones take the first.
2. **Local search** (``improve``): move single demands to their best (node, variant); switch all demands of
   one (node, variant) to another variant of the same model on that node; repeat while the objective falls
   (at most ``max_passes`` passes). Instances left without load are dropped as they empty.
3. **Ruin and recreate** (small instances by default): close one (node, variant) group, or empty one or
   two nodes, and re-place those demands by regret (the demand whose best and second-best nodes differ
   most goes first), by cost and then by the largest Load_mv (with K = 1 a node's first variant must
   carry everything that comes later); keep the result only if the objective falls. These moves change
   which instances run, which single moves cannot do once the other instances are full.

The MILP (``mvsp.solve``) starts from this heuristic's solution.

Pure and deterministic (no clocks, no randomness). Units: ms, req/s, MB.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from edgemux.errors import InputError
from edgemux.policies.mvsp import MvspInstance, MvspSolution, evaluate

__all__ = ["greedy", "MvspPlacementError"]

_EPS = 1e-9
# ruin-and-recreate (and improving every construction) by default up to this size: the P1/P2 sizes of the
# paper and well beyond, while a 100-node, 3,000-demand instance keeps to construction and single moves
_RUIN_EDGES = 16
_RUIN_DEMANDS = 400


class MvspPlacementError(InputError):
    """The heuristic found no (edge node, variant) for a demand under every constraint; names the demand.
    (The instance may still be feasible: the heuristic is not exact; the MILP decides.)"""


class _State:
    """Decision state as arrays: nodes e = 0..E-1, variants j = 0..J-1 (all models), demands d = 0..D-1."""

    def __init__(self, inst: MvspInstance) -> None:
        self.inst = inst
        self.edges = list(inst.edges)
        self.variants = list(inst.variants)
        self.demands = list(inst.demands)
        E, J, D = len(self.edges), len(self.variants), len(self.demands)
        self.E, self.J, self.D = E, J, D
        speed = np.array([e.speed for e in self.edges])
        self.lat = np.array([v.latency_ms for v in self.variants])[None, :] / speed[:, None]  # L_j^e (E x J)
        self.a = np.array([v.interference for v in self.variants])  # alpha_j
        self.mem = np.array([v.memory_mb for v in self.variants])
        self.cap = np.array([v.max_load_rps for v in self.variants])
        self.cmem = np.array([e.memory_mb for e in self.edges])
        self.own = self.lat * (1.0 - self.a)[None, :]  # L(1 - a): a request's own part of IL
        self.work_unit = self.lat * self.a[None, :]  # interference work one instance adds
        models = sorted({v.model for v in self.variants})
        self.vidx = {m: np.array([j for j, v in enumerate(self.variants) if v.model == m]) for m in models}
        edge_pos = {e.name: k for k, e in enumerate(self.edges)}
        self.cl = np.full((D, E), np.inf)  # CL (ms) per demand and node; inf = unreachable
        for d, dem in enumerate(self.demands):
            for e in self.edges:
                c = inst.comm_ms.get((dem.iot, e.name))
                if c is not None:
                    self.cl[d, edge_pos[e.name]] = c
        self.rate = np.array([dm.rate_rps for dm in self.demands])
        self.lmax = np.array([dm.max_latency_ms for dm in self.demands])
        self.total_rate = float(self.rate.sum())
        self.w_lat = inst.alpha / self.total_rate if self.total_rate > 0 else 0.0
        self.w_cost = (1.0 - inst.alpha) / E
        tang = inst.cost.tangents()
        self.t_slope = np.array([s for s, _ in tang])
        self.t_icpt = np.array([b for _, b in tang])
        self.node_scope = inst.k_scope == "node"
        self.reset()

    def reset(self) -> None:
        E, J = self.E, self.J
        self.n = np.zeros((E, J), dtype=np.int64)
        self.load = np.zeros((E, J))
        self.work = np.zeros(E)
        self.count = np.zeros(E, dtype=np.int64)
        self.used = np.zeros(E)
        self.rate_on = np.zeros(E)
        self.base = 0.0  # sum over assigned demands of r (CL + L(1-a)); latency sum = base + sum rate_on * work
        self.where: list[tuple[int, int] | None] = [None] * self.D
        self.on: list[dict[int, float]] = [dict() for _ in range(E)]  # node -> {demand: its static slack b_d}
        self.bmin = np.full(E, np.inf)  # min over the node's demands of b_d = Lmax - CL - L(1-a)

    # ---------------------------------------------------------------------------------------- figures

    def phi_t(self, u: np.ndarray) -> np.ndarray:
        """Tangent cost max(0, max_y y(u)) per entry (Eq. 6-7)."""
        return np.maximum(0.0, (u[..., None] * self.t_slope + self.t_icpt).max(axis=-1))

    def objective(self) -> float:
        lat = self.base + float(self.rate_on @ self.work)
        return self.w_lat * lat + self.w_cost * float(self.phi_t(self.used / self.cmem).sum())

    def _needed(self, load: np.ndarray, cap: np.ndarray) -> np.ndarray:
        """Instances a load needs (Eq. 9), per entry; at least one wherever there is load."""
        return np.where(load > _EPS, np.ceil(load / cap * (1.0 - 1e-12)), 0).astype(np.int64)

    # ------------------------------------------------------------------------------------- options

    def options(self, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For demand ``d`` (not assigned): the objective increase of every (node, variant of its model),
        +inf where infeasible; returns (delta E x Jm, instances added E x Jm, the variant indices Jm)."""
        dem = self.demands[d]
        js = self.vidx[dem.model]
        r = self.rate[d]
        load = self.load[:, js] + r
        n_old = self.n[:, js]
        add = np.maximum(self._needed(load, self.cap[js][None, :]), 1) - n_old
        add = np.maximum(add, 0)
        unit = self.work_unit[:, js]
        dwork = add * unit
        new_work = self.work[:, None] + dwork
        own = self.own[:, js]
        rt = self.cl[d][:, None] + own + new_work
        ok = rt <= self.lmax[d] + 1e-9 * self.lmax[d]
        ok &= np.isfinite(self.cl[d])[:, None]
        # bounds of demands already on the node (their slack shrinks by the work added)
        ok &= (add == 0) | (self.bmin[:, None] - self.work[:, None] - dwork >= -1e-9)
        if self.node_scope:
            ok &= self.count[:, None] + add <= self.inst.k
        else:
            ok &= n_old + add <= self.inst.k
        new_used = self.used[:, None] + add * self.mem[js][None, :]
        ok &= new_used <= self.cmem[:, None] * (1 + 1e-12)
        u_old = self.used / self.cmem
        dcost = self.phi_t(new_used / self.cmem[:, None]) - self.phi_t(u_old)[:, None]
        dlat = r * rt + self.rate_on[:, None] * dwork
        with np.errstate(invalid="ignore"):  # 0 x inf where alpha = 0 and the node is unreachable: not ok anyway
            delta = np.where(ok, self.w_lat * dlat + self.w_cost * dcost, np.inf)
        return delta, add, js

    def fits(self, d: int, e: int, j: int) -> bool:
        """Whether demand ``d`` (not assigned) may go to variant ``j`` on node ``e`` (the scalar form of
        ``options`` for one candidate)."""
        r = self.rate[d]
        if not math.isfinite(self.cl[d, e]):
            return False
        load = self.load[e, j] + r
        need = max(int(math.ceil(load / self.cap[j] * (1.0 - 1e-12))), 1)
        add = max(need - int(self.n[e, j]), 0)
        dwork = add * self.work_unit[e, j]
        if self.cl[d, e] + self.own[e, j] + self.work[e] + dwork > self.lmax[d] * (1 + 1e-9):
            return False
        if add and self.bmin[e] - self.work[e] - dwork < -1e-9:
            return False
        if (self.count[e] if self.node_scope else self.n[e, j]) + add > self.inst.k:
            return False
        return self.used[e] + add * self.mem[j] <= self.cmem[e] * (1 + 1e-12)

    # ---------------------------------------------------------------------------------------- moves

    def _need(self, e: int, j: int) -> int:
        load = self.load[e, j]
        return int(math.ceil(load / self.cap[j] * (1.0 - 1e-12))) if load > _EPS else 0

    def _set_n(self, e: int, j: int, n: int) -> None:
        """Set an instance count and update the node's aggregates (scalar: this runs in the inner loops)."""
        dn = n - int(self.n[e, j])
        if dn:
            self.n[e, j] = n
            self.work[e] += dn * self.work_unit[e, j]
            self.count[e] += dn
            self.used[e] += dn * self.mem[j]
            if self.count[e] == 0:  # no instance left: clear the rounding residue of the sums
                self.work[e] = 0.0
                self.used[e] = 0.0

    def place(self, d: int, e: int, j: int) -> None:
        r = self.rate[d]
        self.load[e, j] += r
        self._set_n(e, j, max(self._need(e, j), 1))
        self.rate_on[e] += r
        self.base += r * (self.cl[d, e] + self.own[e, j])
        self.where[d] = (e, j)
        b = self.lmax[d] - self.cl[d, e] - self.own[e, j]
        self.on[e][d] = b
        if b < self.bmin[e]:
            self.bmin[e] = b

    def unplace(self, d: int) -> tuple[int, int]:
        where = self.where[d]
        assert where is not None
        e, j = where
        r = self.rate[d]
        self.load[e, j] -= r
        if self.load[e, j] < _EPS:
            self.load[e, j] = 0.0
        self._set_n(e, j, self._need(e, j))
        self.rate_on[e] -= r
        self.base -= r * (self.cl[d, e] + self.own[e, j])
        self.where[d] = None
        b = self.on[e].pop(d)
        if b <= self.bmin[e]:
            self.bmin[e] = min(self.on[e].values()) if self.on[e] else np.inf
        return e, j

    def ranked(self, d: int, rule: str = "delta", forbid: tuple[int, int] | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """Demand ``d``'s options ranked (lower is better; +inf infeasible) as (score E x Jm, variant
        indices Jm). ``rule`` "delta": the objective's increase; "capacity": the variant's Load_mv first, the
        increase breaking ties (it leaves room for the demands still to come when capacity binds; a
        Load_mv differs by far more than 1e-6 of any increase). ``forbid``: a (node, variant) not offered."""
        delta, _add, js = self.options(d)
        if forbid is not None:
            hit = np.flatnonzero(js == forbid[1])
            if hit.size:
                delta[forbid[0], hit[0]] = np.inf
        if rule == "capacity":
            delta = np.where(np.isfinite(delta), delta - self.cap[js][None, :] * 1e6, np.inf)
        return delta, js

    def best(self, d: int) -> tuple[float, int, int]:
        delta, _add, js = self.options(d)
        k = int(np.argmin(delta))
        e, jj = divmod(k, len(js))
        return float(delta[e, jj]), e, int(js[jj])


def _construct(st: _State, order: Sequence[int], rule: str = "delta") -> int | None:
    """Place demands in ``order``, each at its best option by ``rule`` (``_State.ranked``); the index of
    the first one that fits nowhere, or None."""
    st.reset()
    for d in order:
        score, js = st.ranked(d, rule)
        e, jj = divmod(int(np.argmin(score)), len(js))
        if not math.isfinite(score[e, jj]):
            return d
        st.place(d, e, int(js[jj]))
    return None


def _reinsert(st: _State, pending: list[int], forbid: tuple[int, int] | None = None,
              rule: str = "delta") -> bool:
    """Place the unassigned demands ``pending`` by regret: each step places the demand whose best and
    second-best nodes differ most (by ``rule``, see ``_State.ranked``; a demand with one node left goes
    first), at its best spot. ``forbid``: a (node, variant) none may use. False if some demand fits
    nowhere (the state is then partial)."""
    pending = list(pending)
    while pending:
        pick: tuple[tuple[float, float, int], int, int, int] | None = None
        for d in pending:
            score, js = st.ranked(d, rule, forbid)
            per_node = score.min(axis=1)
            if not np.isfinite(per_node).any():
                return False
            e, jj = divmod(int(np.argmin(score)), len(js))
            others = np.delete(per_node, e)
            second = float(others.min()) if others.size else np.inf
            regret = second - float(score[e, jj]) if math.isfinite(second) else np.inf
            key = (regret, st.rate[d], -d)
            if pick is None or key > pick[0]:
                pick = (key, d, e, int(js[jj]))
        assert pick is not None  # pending is not empty: the loop set it, or returned
        _key, d, e, j = pick
        st.place(d, e, j)
        pending.remove(d)
    return True


def _ruin_recreate(st: _State, rounds: int, pairs: bool) -> None:
    """Large moves the single-demand moves cannot make: (1) close one (node, variant) group (its demands
    re-placed elsewhere by regret, the group forbidden); (2) empty a node, or (``pairs``) two nodes, and
    re-place their demands by regret. Each move is kept only if the objective falls after a local-search
    pass; otherwise the previous solution is restored. Up to ``rounds`` rounds, while any move is kept."""
    def snapshot() -> list[tuple[int, int] | None]:
        return list(st.where)

    def restore(saved: list[tuple[int, int] | None]) -> None:
        st.reset()
        for d, w in enumerate(saved):
            if w is not None:
                st.place(d, *w)

    def attempt(removed: list[int], forbid: tuple[int, int] | None) -> bool:
        cur = st.objective()
        saved = snapshot()
        for rule in ("delta", "capacity"):
            for d in removed:
                st.unplace(d)
            if _reinsert(st, removed, forbid, rule):
                _improve(st, 1)
                if st.objective() < cur - 1e-9 * max(1.0, abs(cur)):
                    return True
            restore(saved)
        return False

    for _ in range(rounds):
        kept = False
        for e in range(st.E):
            for j in np.flatnonzero(st.n[e]).tolist():
                group = [d for d in st.on[e] if st.where[d] == (e, j)]
                if group and st.n[e, j] > 0:
                    kept |= attempt(group, (e, j))
        nodes: list[tuple[int, ...]] = [(e,) for e in range(st.E)]
        if pairs:
            nodes += [(a, b) for a in range(st.E) for b in range(a + 1, st.E)]
        for sel in nodes:
            removed = [d for e in sel for d in st.on[e]]
            if removed:
                kept |= attempt(removed, None)
        if not kept:
            break


def _improve(st: _State, max_passes: int) -> None:
    for _ in range(max_passes):
        before = st.objective()
        # 1. move single demands (re-inserting at the best spot never does worse: the old one is a candidate)
        for d in range(st.D):
            e0, j0 = st.unplace(d)
            delta, e, j = st.best(d)
            if not math.isfinite(delta):  # cannot happen (its old place is feasible); stay safe
                e, j = e0, j0
            st.place(d, e, j)
        # 2. switch the variant of a whole (node, variant) group
        for e in range(st.E):
            for j in np.flatnonzero(st.n[e]).tolist():
                model = st.variants[j].model
                group = [d for d in st.on[e] if st.where[d] == (e, j)]
                for j2 in st.vidx[model].tolist():
                    if j2 == j or not group:
                        continue
                    cur = st.objective()
                    for d in group:
                        st.unplace(d)
                    done = []
                    ok = True
                    for d in sorted(group, key=lambda x: -st.rate[x]):
                        if not st.fits(d, e, j2):
                            ok = False
                            break
                        st.place(d, e, j2)
                        done.append(d)
                    if ok and st.objective() < cur - 1e-12 * max(1.0, abs(cur)):
                        j = j2  # the group now runs j2; keep trying the remaining variants from there
                        continue
                    for d in done:
                        st.unplace(d)
                    for d in group:
                        st.place(d, e, j)
        after = st.objective()
        if not after < before - 1e-12 * max(1.0, abs(before)):
            break


def greedy(instance: MvspInstance, *, improve: bool = True, max_passes: int = 10,
           start: Mapping[tuple[str, str], tuple[str, str]] | None = None,
           ruin_rounds: int | None = None) -> MvspSolution:
    """A feasible MVSP solution by greedy construction and (``improve``) local search; see the module
    docstring. Returns ``MvspSolution`` with method "heuristic", status "feasible", ``mip_gap``/``bound``
    None; its ``evaluation`` comes from :func:`edgemux.policies.mvsp.evaluate`.

    ``start``: a feasible forwarding ``{(iot, model): (edge, variant)}`` to begin from instead of
    constructing one (each variant gets the fewest instances its load needs, which keeps it feasible);
    the local search then improves it. ``ruin_rounds``: rounds of ruin-and-recreate moves (close a group,
    empty one or two nodes, re-place by regret); None = 3 on instances of at most ``_RUIN_EDGES`` edge nodes
    and ``_RUIN_DEMANDS`` demands (where every construction is also improved and the best kept), else 0.

    Raises ``MvspPlacementError`` (an ``InputError``) naming the IoT node and model of a demand it could not
    place in any construction, and ``InputError`` for a ``start`` that is incomplete or infeasible, or bad
    ``max_passes``/``ruin_rounds``."""
    for name, val in (("max_passes", max_passes), ("ruin_rounds", 0 if ruin_rounds is None else ruin_rounds)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 0:
            raise InputError(name, f"must be an integer >= 0, got {val!r}")
    st = _State(instance)
    small = st.E <= _RUIN_EDGES and st.D <= _RUIN_DEMANDS
    rounds = (3 if small else 0) if ruin_rounds is None else ruin_rounds
    if not improve:
        rounds = 0
    if start is not None:
        _seed(st, start)
        return _finish(st, instance, improve, max_passes, rounds, seeded=True)
    D = st.D
    n_opts = np.array([int(np.isfinite(st.cl[d]).sum()) * len(st.vidx[st.demands[d].model]) for d in range(D)])
    by_options = sorted(range(D), key=lambda d: (n_opts[d], st.lmax[d], -st.rate[d], d))
    constructions = [
        (sorted(range(D), key=lambda d: (-st.rate[d], st.lmax[d], d)), "delta"),
        (sorted(range(D), key=lambda d: (st.lmax[d] - float(np.min(st.cl[d])), -st.rate[d], d)), "delta"),
        (by_options, "delta"),
        (by_options, "capacity"),
    ]
    best: MvspSolution | None = None
    failed: int | None = None
    for order, rule in constructions:
        failed = _construct(st, order, rule)
        if failed is not None:
            continue
        sol = _finish(st, instance, improve, max_passes, 0 if small else rounds)
        if best is None or sol.evaluation.objective < best.evaluation.objective - 1e-12:
            best = sol
        if not small:
            break  # large instances: the first construction that works
    if best is not None:
        if small and rounds:  # the large moves from the best construction only (they cost the most)
            _seed(st, best.assignment)
            return _finish(st, instance, improve, max_passes, rounds)
        return best
    assert failed is not None
    dem = st.demands[failed]
    raise MvspPlacementError(
        "demands", f"heuristic: IoT node '{dem.iot}', model '{dem.model}' ({dem.rate_rps:g} req/s, bound "
                   f"{dem.max_latency_ms:g} ms) fits on no edge node within its latency bound, K = "
                   f"{instance.k}, memory and load (tried {len(constructions)} constructions; the MILP may "
                   f"still find a placement)")


def _seed(st: _State, start: Mapping[tuple[str, str], tuple[str, str]]) -> None:
    """Place every demand where ``start`` forwards it (``InputError`` when one is missing or unknown)."""
    edge_pos = {e.name: k for k, e in enumerate(st.edges)}
    var_pos = {v.key: j for j, v in enumerate(st.variants)}
    st.reset()
    for d, dem in enumerate(st.demands):
        target = start.get(dem.key)
        e = edge_pos.get(target[0]) if target else None
        j = var_pos.get((dem.model, target[1])) if target else None
        if e is None or j is None or not math.isfinite(st.cl[d, e]):
            raise InputError("start", f"demand {dem.iot}/{dem.model} is not forwarded to a reachable edge node "
                                      f"and a variant of its model: {target!r}")
        st.place(d, e, j)


def _finish(st: _State, instance: MvspInstance, improve: bool, max_passes: int, ruin_rounds: int = 0,
            seeded: bool = False) -> MvspSolution:
    if improve and st.D:
        _improve(st, max_passes)
        if ruin_rounds:
            _ruin_recreate(st, ruin_rounds, pairs=st.E <= _RUIN_EDGES)
    assignment = {}
    for d, dem in enumerate(st.demands):
        where = st.where[d]
        assert where is not None
        e, j = where
        assignment[dem.key] = (st.edges[e].name, st.variants[j].name)
    instances = {(st.edges[e].name, st.variants[j].model, st.variants[j].name): int(st.n[e, j])
                 for e, j in zip(*np.nonzero(st.n))}
    ev = evaluate(instance, assignment, instances)
    if not ev.feasible:
        if seeded:  # the start was infeasible, and moves keep what they cannot repair
            raise InputError("start", f"infeasible: {'; '.join(ev.violations[:3])}")
        raise AssertionError(f"mvsp greedy produced an infeasible solution: {ev.violations[:3]}")  # a bug
    return MvspSolution(assignment=assignment, instances=instances, evaluation=ev, method="heuristic",
                        status="feasible", mip_gap=None, bound=None)
