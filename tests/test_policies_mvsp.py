"""MVSP: evaluate() by hand, the cost curve, input errors, and the HiGHS MILP against brute force."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from edgemux.errors import InputError
from edgemux.policies import mvsp
from edgemux.policies.mvsp import (CostCurve, Demand, EdgeNode, MvspInfeasible, MvspInstance, Variant, evaluate,
                                   infeasibility_causes, solve)


def _instance(**kw: object) -> MvspInstance:
    base: dict[str, object] = dict(
        edges=(EdgeNode("E1", 8.0), EdgeNode("E2", 8.0)),
        variants=(Variant("m", "small", 4.0, 2.0, 10.0), Variant("m", "big", 6.0, 3.0, 25.0)),
        demands=(Demand("I1", "m", 5.0, 100.0), Demand("I2", "m", 5.0, 100.0)),
        comm_ms={("I1", "E1"): 5.0, ("I1", "E2"): 20.0, ("I2", "E1"): 20.0, ("I2", "E2"): 5.0},
        k=2, alpha=0.5)
    base.update(kw)
    return MvspInstance(**base)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- evaluate


def test_evaluate_interference_by_hand() -> None:
    # E1 holds 2 x m/small (L 4, a 0.1) and 1 x m/big (L 6, a 0.1), speed 2 halves the latencies:
    # IL(small) = 2 + 0.1*2*(2-1) + 0.1*3*1 = 2.5 ms; IL(big) = 3 + 0 + 0.1*2*2 = 3.4 ms (Eq. 3)
    inst = _instance(edges=(EdgeNode("E1", 10.0, speed=2.0), EdgeNode("E2", 8.0)), k=3)
    ev = evaluate(inst, {("I1", "m"): ("E1", "small"), ("I2", "m"): ("E1", "big")},
                  {("E1", "m", "small"): 2, ("E1", "m", "big"): 1})
    assert ev.feasible, ev.violations
    assert ev.demand_ms[("I1", "m")] == pytest.approx(5.0 + 2.5)
    assert ev.demand_ms[("I2", "m")] == pytest.approx(20.0 + 3.4)
    assert ev.latency_ms == pytest.approx((7.5 * 5 + 23.4 * 5) / 10)  # Eq. 1, rate-weighted
    u1 = (2 * 2.0 + 3.0) / 10.0
    assert ev.utilization == pytest.approx((u1 + 0.0) / 2)
    cost = CostCurve.paper()
    assert ev.cost == pytest.approx((cost.value(u1) + 0.0) / 2)
    assert ev.cost_tangent == pytest.approx((cost.approx(u1) + 0.0) / 2)
    assert ev.objective == pytest.approx(0.5 * ev.latency_ms + 0.5 * ev.cost_tangent)


def test_evaluate_flags_each_violation() -> None:
    inst = _instance(k=1)
    ev = evaluate(inst, {("I1", "m"): ("E1", "small")}, {("E1", "m", "small"): 1, ("E2", "m", "big"): 3})
    text = " | ".join(ev.violations)
    assert "I2/m is not forwarded" in text
    assert "E2: 3 instances > K = 1" in text
    assert "memory 9 MB > capacity 8 MB" in text
    ev = evaluate(inst, {("I1", "m"): ("E1", "small"), ("I2", "m"): ("E1", "small")}, {("E1", "m", "small"): 1})
    assert ev.feasible, ev.violations  # 10 req/s on one 10 req/s instance is within Eq. 9
    ev = evaluate(_instance(demands=(Demand("I1", "m", 11.0, 100.0),)), {("I1", "m"): ("E1", "small")},
                  {("E1", "m", "small"): 1})
    assert any("Eq. 9" in v for v in ev.violations)
    ev = evaluate(_instance(demands=(Demand("I1", "m", 1.0, 8.0),)), {("I1", "m"): ("E1", "small")},
                  {("E1", "m", "small"): 1})
    assert any("Eq. 4" in v for v in ev.violations)  # 5 + 4 = 9 ms > 8 ms


# ---------------------------------------------------------------------------------------------- cost curve


def test_cost_curve_tangents_under_phi_and_touching() -> None:
    c = CostCurve.paper()
    tangents = c.tangents()
    assert len(tangents) == len(c.points)
    for (a, b), p in zip(tangents, c.points):
        assert a * p + b == pytest.approx(c.value(p), abs=1e-12)  # touches at its point
    for u in np.linspace(0.0, 1.0, 101):
        assert c.approx(u) <= c.value(u) + 1e-12  # convex phi: every tangent is below it
        assert c.approx(u) >= c.value(u) - 0.05  # and 11 tangents follow it closely
    assert c.value(0.38) == pytest.approx(0.05, rel=1e-6)  # the fit's anchor (§III-B)
    assert c.value(0.76) == pytest.approx(0.40, rel=1e-6)


# ---------------------------------------------------------------------------------------------- input errors


@pytest.mark.parametrize("kw, match", [
    (dict(demands=(Demand("I1", "m", -1.0, 100.0),)), "rate must be > 0"),
    (dict(demands=(Demand("I3", "m", 1.0, 100.0),)), "IoT node 'I3' reaches no edge node"),
    (dict(variants=(Variant("m", "huge", 4.0, 9.0, 10.0),)), "needs more memory \\(9 MB\\)"),
    (dict(demands=(Demand("I1", "other", 1.0, 100.0),)), "which has no variants"),
    (dict(demands=(Demand("I1", "m", 1.0, 100.0), Demand("I1", "m", 2.0, 100.0))), "twice"),
    (dict(demands=(Demand("I1", "m", 1.0, 0.0),)), "latency bound must be > 0"),
    (dict(comm_ms={("I1", "E9"): 1.0}), "unknown edge node 'E9'"),
    (dict(comm_ms={("I1", "E1"): -1.0, ("I2", "E1"): 1.0}), "must be >= 0 ms"),
    (dict(edges=(EdgeNode("E1", 0.0),)), "memory must be > 0"),
    (dict(edges=()), "at least one edge node"),
    (dict(variants=(Variant("m", "v", 0.0, 1.0, 1.0),)), "latency_ms must be > 0"),
    (dict(variants=(Variant("m", "v", 1.0, 1.0, 1.0, interference=-0.1),)), "interference must be >= 0"),
    (dict(k=0), "K must be an integer >= 1"),
    (dict(k_scope="gpu"), "must be 'node' or 'variant'"),
    (dict(alpha=1.5), "latency weight must be in"),
])
def test_instance_input_errors(kw: dict[str, object], match: str) -> None:
    with pytest.raises(InputError, match=match):
        _instance(**kw)


def test_solve_option_errors() -> None:
    for kw, match in ((dict(time_limit_s=0.0), "time_limit_s"), (dict(mip_gap=1.0), "mip_gap"),
                      (dict(threads=0), "threads")):
        with pytest.raises(InputError, match=match):
            solve(_instance(), **kw)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- brute force


def _brute_force(inst: MvspInstance) -> float:
    """Minimum objective over every assignment and every instance vector in [0, K]^keys, per evaluate()."""
    choices = []
    for d in inst.demands:
        choices.append([(e.name, v.name) for e in inst.edges if (d.iot, e.name) in inst.comm_ms
                        for v in inst.variants_of(d.model)])
    keys = [(e.name, *v.key) for e in inst.edges for v in inst.variants]
    vectors = []
    for counts in itertools.product(range(inst.k + 1), repeat=len(keys)):
        # cheap pre-filter of the per-node K bound (evaluate would reject these too)
        if inst.k_scope == "node" and any(
                sum(c for key, c in zip(keys, counts) if key[0] == e.name) > inst.k for e in inst.edges):
            continue
        vectors.append({k: c for k, c in zip(keys, counts) if c})
    best = math.inf
    for combo in itertools.product(*choices):
        assignment = {d.key: t for d, t in zip(inst.demands, combo)}
        for n in vectors:
            ev = evaluate(inst, assignment, n)
            if ev.feasible and ev.objective < best:
                best = ev.objective
    return best


def _random_tiny(seed: int) -> MvspInstance:
    rng = np.random.default_rng(seed)
    n_iot = 2 + seed % 2
    models = ["a", "b"][: 1 + (seed // 2) % 2]
    if len(models) == 2:
        n_iot = 2
    k = 1 + seed % 2 if len(models) == 2 else 2
    edges = (EdgeNode("E1", float(rng.uniform(4, 9))), EdgeNode("E2", float(rng.uniform(4, 9)), speed=float(rng.uniform(0.7, 1.5))))
    variants = tuple(Variant(m, name, latency_ms=float(rng.uniform(2, 8)) * f, memory_mb=float(rng.uniform(1, 3.5)) * f,
                             max_load_rps=float(rng.uniform(4, 10)) * f * 1.5, interference=float(rng.uniform(0.05, 0.4)))
                     for m in models for name, f in (("v1", 1.0), ("v2", 1.6)))
    iots = [f"I{i + 1}" for i in range(n_iot)]
    comm = {}
    for i in iots:
        for e in ("E1", "E2"):
            if rng.uniform() < 0.85 or e == "E1":
                comm[(i, e)] = float(rng.uniform(1, 30))
    demands = tuple(Demand(i, m, float(rng.uniform(1, 12)), float(rng.uniform(25, 60))) for i in iots for m in models)
    return MvspInstance(edges=edges, variants=variants, demands=demands, comm_ms=comm, k=k,
                        alpha=float(rng.choice([0.0, 0.1, 0.5, 1.0])), k_scope="node" if seed % 3 else "variant")


@pytest.mark.parametrize("seed", range(10))
def test_milp_matches_brute_force(seed: int) -> None:
    inst = _random_tiny(seed)
    best = _brute_force(inst)
    if math.isinf(best):
        with pytest.raises(MvspInfeasible):
            solve(inst)
        return
    sol = solve(inst)
    assert sol.status == "optimal"
    assert sol.evaluation.feasible
    assert sol.evaluation.objective == pytest.approx(best, rel=1e-6, abs=1e-9)
    assert sol.bound is not None and sol.bound <= best + 1e-6 * max(1.0, abs(best))


@pytest.mark.parametrize("seed", [0, 1, 4, 6, 7])
def test_big_m_formulation_matches_brute_force(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # no room for configurations: solve() falls back to the big-M linearization
    monkeypatch.setattr(mvsp, "_CONFIG_LIMIT", 0)
    assert mvsp._build_configurations(_random_tiny(seed)) is None
    inst = _random_tiny(seed)
    best = _brute_force(inst)
    assert not math.isinf(best)
    sol = solve(inst)
    assert sol.status == "optimal"
    assert sol.evaluation.objective == pytest.approx(best, rel=1e-6, abs=1e-9)


@pytest.mark.slow
def test_brute_force_sees_infeasible_and_feasible_seeds() -> None:
    # the parametrized comparison above is only meaningful if most seeds are feasible
    feasible = sum(1 for s in range(10) if not math.isinf(_brute_force(_random_tiny(s))))
    assert feasible >= 7


def test_latency_only_picks_the_nearest_edge() -> None:
    sol = solve(_instance(alpha=1.0))
    assert sol.assignment[("I1", "m")][0] == "E1"
    assert sol.assignment[("I2", "m")][0] == "E2"
    # alone on its node each request takes the faster variant: 5 + 4 ms
    assert sol.evaluation.latency_ms == pytest.approx(9.0)


def test_cost_only_packs_onto_least_memory() -> None:
    # alpha = 0: one 'big' instance (3 MB, 25 req/s) carries both 5 req/s demands on one node; the latency
    # bound is loose, so the far IoT node travels
    sol = solve(_instance(alpha=0.0))
    assert len(sol.instances) == 1 and list(sol.instances.values()) == [1]
    assert len(set(sol.assignment.values())) == 1
    (_, v), = set(sol.assignment.values())
    assert v == "small"  # 2 MB, and its 10 req/s hold both 5 req/s demands exactly
    assert sol.evaluation.utilization == pytest.approx(2.0 / 8.0 / 2)
    # alpha = 1 instead spreads them to the near nodes
    assert len(solve(_instance(alpha=1.0)).instances) == 2


def test_k1_node_scope_forbids_colocation() -> None:
    # two models, one IoT node, K = 1 per node: the two models must sit on different edge nodes
    inst = _instance(variants=(Variant("a", "v", 4.0, 2.0, 10.0), Variant("b", "v", 4.0, 2.0, 10.0)),
                     demands=(Demand("I1", "a", 1.0, 100.0), Demand("I1", "b", 1.0, 100.0)),
                     comm_ms={("I1", "E1"): 1.0, ("I1", "E2"): 30.0}, k=1, alpha=1.0)
    sol = solve(inst)
    assert {sol.assignment[("I1", "a")][0], sol.assignment[("I1", "b")][0]} == {"E1", "E2"}
    co = solve(_instance(variants=inst.variants, demands=inst.demands, comm_ms=inst.comm_ms, k=2, alpha=1.0))
    assert {co.assignment[("I1", "a")][0], co.assignment[("I1", "b")][0]} == {"E1"}
    # the variant-scope reading of Eq. 11 (n <= K per variant) allows the co-location with K = 1
    vs = solve(_instance(variants=inst.variants, demands=inst.demands, comm_ms=inst.comm_ms, k=1, alpha=1.0,
                         k_scope="variant"))
    assert {vs.assignment[("I1", "a")][0], vs.assignment[("I1", "b")][0]} == {"E1"}


def test_replication_when_one_instance_is_not_enough() -> None:
    # 18 req/s on 'small' (10 req/s each) needs 2 instances; 'big' is too slow for the 10 ms bound
    inst = _instance(demands=(Demand("I1", "m", 18.0, 10.0),), comm_ms={("I1", "E1"): 1.0}, alpha=1.0)
    sol = solve(inst)
    assert sol.instances == {("E1", "m", "small"): 2}
    assert sol.evaluation.demand_ms[("I1", "m")] == pytest.approx(1.0 + 4.0 + 0.1 * 4.0)


# ---------------------------------------------------------------------------------------------- infeasibility


def test_infeasible_latency_names_the_iot_node() -> None:
    inst = _instance(demands=(Demand("I1", "m", 1.0, 8.0),))
    with pytest.raises(MvspInfeasible, match=r"IoT node 'I1' cannot meet its latency bound 8 ms for model 'm': "
                                             r"the best round trip is 9.00 ms via edge 'E1', variant 'small'"):
        solve(inst)


def test_infeasible_rate_names_the_iot_node() -> None:
    inst = _instance(demands=(Demand("I1", "m", 60.0, 100.0),), k=2)
    with pytest.raises(MvspInfeasible, match=r"IoT node 'I1' sends 60 req/s for model 'm', more than any edge node "
                                             r"it reaches can carry: at most 50 req/s"):
        solve(inst)


def test_infeasible_rate_with_interference() -> None:
    # 18 req/s needs 2 x small: 1 + 4 * 1.1 = 5.4 ms > 5.2 ms, though one instance alone (5 ms) would do
    inst = _instance(demands=(Demand("I1", "m", 18.0, 5.2),), comm_ms={("I1", "E1"): 1.0})
    with pytest.raises(MvspInfeasible, match=r"at 18 req/s: the best round trip is 5.40 ms via edge 'E1', variant "
                                             r"'small' \(2 instances"):
        solve(inst)


def test_infeasible_memory_found_by_the_elastic_milp() -> None:
    # each demand alone fits, but together: three models x 3 MB on one 8 MB node that all IoT nodes reach
    variants = tuple(Variant(m, "v", 2.0, 3.0, 50.0) for m in ("a", "b", "c"))
    inst = _instance(edges=(EdgeNode("E1", 8.0),), variants=variants,
                     demands=tuple(Demand("I1", m, 1.0, 100.0) for m in ("a", "b", "c")),
                     comm_ms={("I1", "E1"): 2.0}, k=4)
    with pytest.raises(MvspInfeasible, match=r"memory of edge node 'E1' \(8 MB\) cannot hold the instances") as err:
        solve(inst)
    assert len(err.value.causes) == 1
    assert infeasibility_causes(inst) == err.value.causes


def test_infeasible_k_found_by_the_elastic_milp() -> None:
    variants = tuple(Variant(m, "v", 2.0, 1.0, 50.0) for m in ("a", "b", "c"))
    inst = _instance(edges=(EdgeNode("E1", 8.0),), variants=variants,
                     demands=tuple(Demand("I1", m, 1.0, 100.0) for m in ("a", "b", "c")),
                     comm_ms={("I1", "E1"): 2.0}, k=2)
    with pytest.raises(MvspInfeasible, match=r"edge node 'E1' would need 3 instances, more than K = 2"):
        solve(inst)


def test_infeasible_joint_latency_found_by_the_elastic_milp() -> None:
    # alone each model meets 10 ms on the one node (2 + 6 = 8 ms); together interference adds 0.5 * 6 = 3 ms
    variants = tuple(Variant(m, "v", 6.0, 1.0, 50.0, interference=0.5) for m in ("a", "b"))
    inst = _instance(edges=(EdgeNode("E1", 8.0),), variants=variants,
                     demands=(Demand("I1", "a", 1.0, 10.0), Demand("I1", "b", 1.0, 10.0)),
                     comm_ms={("I1", "E1"): 2.0}, k=2)
    with pytest.raises(MvspInfeasible, match=r"IoT node 'I1' cannot meet its latency bound 10 ms for model '[ab]' "
                                             r"alongside the other demands"):
        solve(inst)


def test_feasible_instance_has_no_causes() -> None:
    assert infeasibility_causes(_instance()) == ()


# ---------------------------------------------------------------------------------------------- time limit


def _p1_like(seed: int, k: int) -> MvspInstance:
    """P1-shaped (10 IoT, 5 edge, 3 models x 8 variants) with synthetic variants; a small seeded topology."""
    from edgemux.cluster.topology import maniac_like
    rng = np.random.default_rng(seed)
    topo = maniac_like(10, 5, seed=seed)
    variants = tuple(Variant(f"M{m}", f"b{2 ** j}", latency_ms=(2.0, 3.5, 5.0)[m] * (1 + 0.35 * j),
                             memory_mb=0.6 * 1.25 ** j, max_load_rps=4.0 * 1.5 ** j)
                     for m in range(3) for j in range(8))
    demands = tuple(Demand(i, f"M{m}", float(rng.exponential(5.5)) + 0.1, 60.0) for i in topo.iot_nodes for m in range(3))
    return MvspInstance(edges=tuple(EdgeNode(e, 8.0) for e in topo.edge_nodes), variants=variants, demands=demands,
                        comm_ms=topo.communication_ms(), k=k, alpha=0.1)


def test_tiny_time_limit_returns_the_incumbent() -> None:
    sol = solve(_p1_like(2, 4), time_limit_s=0.05)
    assert sol.status in ("time-limit", "optimal")
    assert sol.evaluation.feasible
    if sol.status == "time-limit" and sol.bound is not None:
        assert sol.bound <= sol.evaluation.objective + 1e-9


def test_a_start_is_used_and_a_bad_start_refused() -> None:
    """``solve(start=...)``: the optimum of the same instance as a start gives the same optimum; a start
    that leaves a demand out is an InputError naming it, before HiGHS runs."""
    inst = _random_tiny(1)
    best = solve(inst)
    again = solve(inst, start=best.assignment)
    assert again.status == "optimal"
    assert again.evaluation.objective == pytest.approx(best.evaluation.objective, rel=1e-9, abs=1e-12)
    partial = dict(best.assignment)
    gone = next(iter(partial))
    del partial[gone]
    with pytest.raises(InputError, match=f"{gone[0]}/{gone[1]}"):
        solve(inst, start=partial)
