"""MVSP MILP: configuration form vs big-M form, and the heuristic start, on the hard instances.

Instances: the experiment's (``edgemux.experiments.mvsp.make_instance``, seeded): P1 and P2 at E(r) = 33
(Table III, K = 2, C^e = 8) and P1 at E(r) = 33 with K = 3 and 4 (Fig. 3). For each instance and form,
``policies.mvsp.solve`` runs with the experiment's 10 s limit; the big-M form is forced by setting the
configuration limit to zero. Printed per solve: status, HiGHS's own run time, the final gap, the objective,
and the wall time of the whole ``solve`` (instance building and the heuristic start included). Then the
heuristic alone (``mvsp_greedy.greedy``): its objective's gap to the proven optimum, with and without
ruin-and-recreate, and its CPU time.

HiGHS's limit is wall clock: on a loaded host fewer solves finish. ``hostload`` reports other processes'
CPU use during the run.

    .venv/bin/python benchmarks/bench_mvsp_forms.py [--seeds 0 1 2] [--time-limit 10] [--quiet-wait 60]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hostload import host_busy_s, wait_quiet  # noqa: E402

from edgemux.experiments.mvsp import jetson_variants, make_instance  # noqa: E402
from edgemux.policies import mvsp  # noqa: E402
from edgemux.policies.mvsp_greedy import greedy  # noqa: E402


def _solve(inst: mvsp.MvspInstance, form: str, limit_s: float) -> tuple[mvsp.MvspSolution, float]:
    saved = mvsp._CONFIG_LIMIT
    if form == "big-M":
        mvsp._CONFIG_LIMIT = 0
    try:
        t0 = time.perf_counter()
        sol = mvsp.solve(inst, time_limit_s=limit_s)
        return sol, time.perf_counter() - t0
    finally:
        mvsp._CONFIG_LIMIT = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--time-limit", type=float, default=10.0, help="HiGHS time limit per solve (s)")
    ap.add_argument("--quiet-wait", type=float, default=0.0, help="wait up to this many s for a quiet host")
    args = ap.parse_args()
    if args.quiet_wait > 0:
        waited, cores = wait_quiet(args.quiet_wait)
        print(f"waited {waited:.1f} s for a quiet host (others' use then: {cores} cores)")
    variants = jetson_variants()
    cases = [(f"P{p[1]} E(r)=33 K={k} seed {s}", make_instance(p, 33.0, s, variants=variants, k=k))
             for s in args.seeds for p, k in (("P1", 2), ("P2", 2), ("P1", 3), ("P1", 4))]
    busy0, wall0 = host_busy_s(), time.perf_counter()
    print(f"{'instance':24s} {'form':15s} {'status':10s} {'HiGHS s':>8s} {'wall s':>7s} {'gap':>8s} {'objective':>10s}")
    proven = {"configurations": 0, "big-M": 0}
    optimum: dict[str, float] = {}
    for name, inst in cases:
        for form in ("configurations", "big-M"):
            sol, wall = _solve(inst, form, args.time_limit)
            proven[form] += sol.status == "optimal"
            if sol.status == "optimal":
                optimum.setdefault(name, sol.evaluation.objective)
            gap = "-" if sol.mip_gap is None else f"{sol.mip_gap:.2%}"
            print(f"{name:24s} {form:15s} {sol.status:10s} {sol.solver_s or 0:8.2f} {wall:7.2f} {gap:>8s} "
                  f"{sol.evaluation.objective:10.5f}", flush=True)
    print(f"proven optimal within {args.time_limit:g} s: configuration form {proven['configurations']}/{len(cases)}, "
          f"big-M form {proven['big-M']}/{len(cases)}")
    print(f"\nheuristic alone, gap to the proven optimum ({len(optimum)} instances with one)")
    print(f"{'instance':24s} {'no ruin':>8s} {'ruin':>8s} {'CPU s':>6s}")
    gaps = []
    for name, inst in cases:
        if name not in optimum:
            continue
        plain = greedy(inst, ruin_rounds=0).evaluation.objective
        t0 = time.process_time()
        ruined = greedy(inst).evaluation.objective
        cpu = time.process_time() - t0
        g0, g1 = plain / optimum[name] - 1, ruined / optimum[name] - 1
        gaps.append(g1)
        print(f"{name:24s} {g0:8.2%} {g1:8.2%} {cpu:6.2f}")
    if gaps:
        print(f"heuristic with ruin-and-recreate: median gap {sorted(gaps)[len(gaps) // 2]:.2%}, max {max(gaps):.2%}")
    busy1, wall1 = host_busy_s(), time.perf_counter()
    if busy0 is not None and busy1 is not None:
        print(f"host CPU busy (all processes, this one included): {(busy1 - busy0) / (wall1 - wall0):.2f} cores on average")


if __name__ == "__main__":
    main()
