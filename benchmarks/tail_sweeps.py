"""The sweeps behind ``perf.sojourn``'s design and the figures docs/estimators.md quotes beyond the
validation grid, each against seeded simulations (errors in % of the simulated quantile):

  * ``md1ps``: the sojourn variance of M/D/1-PS at the mean size, over the M/M/1-PS value and over the
    long-request slope form (why the variance takes the larger of the two);
  * ``batch``: the batching envelope's p95/p99 over k1, k2 in {(2, 8), (1, 20)} ms, B in {4, 8},
    timeout in {0, 2, 10, 50} ms, load at full batches 0.1-0.8;
  * ``tandem``: a CPU stage convolved with an FCFS or PS device, cores 0.5-2, load 0.3-0.8.

    .venv/bin/python benchmarks/tail_sweeps.py [--only md1ps|batch|tandem] [--quick]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

import numpy as np

from edgemux.cluster.workload import Arrival, BatchLaw, CpuStage, DeviceSpec, Discipline, Tenant
from edgemux.experiments.validation import tenants_at
from edgemux.perf.device import predict_device
from edgemux.perf.result import Unstable
from edgemux.perf.sojourn import batch_laws
from edgemux.profiles.distributions import Deterministic, Exponential
from edgemux.profiles.types import DeviceKind
from edgemux.sim.run import simulate_device, simulate_raw


def _dev(disc: Discipline, **kw: float) -> DeviceSpec:
    return DeviceSpec("d0", DeviceKind.GPU_EMBEDDED, disc, **kw)  # type: ignore[arg-type]


def _err(pred: float, sim: float) -> float:
    return 100.0 * (pred - sim) / sim


def md1ps(requests: int) -> None:
    """Var T(x) of M/D/1-PS (x = 10 ms) from one long seeded run, over the two variance forms."""
    x = 10.0
    print("M/D/1-PS sojourn variance at the mean size, x = 10 ms")
    for rho in (0.1, 0.5, 0.8):
        lat = simulate_raw(_dev(Discipline.PS), tenants_at(rho, 1, "det"), requests=requests,
                           seed=3).latencies_of("t0", warmup=0.1)
        a = x / (1 - rho)
        shape = x - a * (1 - np.exp(-x / a))
        mm1 = (rho / x) * 2 * x * x / (1 - rho) ** 3 * shape       # lam * 2 E[S]^2 (M/M/1-PS, exact)
        slope = (rho / x) * x * x / (1 - rho) ** 3 * shape         # lam * E[S^2] of the deterministic size
        v = float(lat.var())
        print(f"  rho {rho}: simulated {v:.1f} ms^2, / M/M/1 form {v / mm1:.2f}, / slope form {v / slope:.2f}")


def batch(requests: int, reps: int) -> None:
    lo, hi = np.inf, -np.inf
    print("batching envelope law, p95 / p99 error")
    for k1, k2 in ((2.0, 8.0), (1.0, 20.0)):
        law = BatchLaw(k1_ms=k1, k2_ms=k2)
        for B, tau in ((4, 10.0), (8, 2.0), (4, 0.0), (8, 50.0)):
            for rho in (0.1, 0.3, 0.6, 0.8):
                lam = 1000.0 * rho / law.per_request_ms(B)
                ts = [Tenant("t0", "m", Arrival.poisson(lam), Deterministic(law.per_request_ms(1)), batch=law)]
                laws = batch_laws(ts, B, tau)
                assert not isinstance(laws, Unstable) and laws[0] is not None
                p95, p99 = laws[0].quantiles((0.95, 0.99))
                sim = simulate_device(_dev(Discipline.BATCH, max_batch=B, batch_timeout_ms=tau), ts,
                                      requests=requests, replications=reps, seed=1).tenants["t0"]
                e95, e99 = _err(p95, sim.p95_ms.value), _err(p99, sim.p99_ms.value)
                lo, hi = min(lo, e95, e99), max(hi, e95, e99)
                print(f"  k=({k1:g},{k2:g}) B={B} tau={tau:g} rho={rho}: {e95:+.1f} % / {e99:+.1f} %")
    print(f"  range {lo:+.1f} % to {hi:+.1f} %")


def tandem(requests: int, reps: int) -> None:
    lo, hi = np.inf, -np.inf
    print("CPU stage convolved with the device law, p95 / p99 error (worst tenant)")
    for disc in (Discipline.FCFS, Discipline.PS):
        for cores, cpu in ((2.0, Exponential(8.0)), (1.0, Deterministic(4.0)), (0.5, Exponential(2.0))):
            for rho in (0.3, 0.6, 0.8):
                ts = [replace(t, cpu=CpuStage(cores, cpu)) for t in tenants_at(rho, 2, "exp")]
                est = predict_device(_dev(disc), ts)
                sim = simulate_device(_dev(disc), ts, requests=requests, replications=reps, seed=2).tenants
                errs = [(_err(est[t.name].p95_ms, sim[t.name].p95_ms.value),  # type: ignore[arg-type]
                         _err(est[t.name].p99_ms, sim[t.name].p99_ms.value)) for t in ts]  # type: ignore[arg-type]
                flat = [e for pair in errs for e in pair]
                lo, hi = min(lo, *flat), max(hi, *flat)
                print(f"  {disc.value} cores={cores:g} {cpu} rho={rho}: "
                      + ", ".join(f"{a:+.1f} / {b:+.1f} %" for a, b in errs))
    print(f"  range {lo:+.1f} % to {hi:+.1f} %")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("md1ps", "batch", "tandem"))
    ap.add_argument("--quick", action="store_true", help="short runs (a smoke test, not the figures)")
    args = ap.parse_args(argv)
    requests, reps, long = (20_000, 2, 200_000) if args.quick else (200_000, 4, 2_000_000)
    if args.only in (None, "md1ps"):
        md1ps(long)
    if args.only in (None, "batch"):
        batch(requests, reps)
    if args.only in (None, "tandem"):
        tandem(requests, reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
