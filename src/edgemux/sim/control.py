"""Control variates: sharper simulation estimates of a device's mean latencies at high load.

Near saturation a queue's sample mean converges slowly (its variance grows like 1/(1-rho)^4), so checking
a formula to 2 % at rho = 0.9 by brute force would take minutes per case on the event engine. Every
replication here also runs, on the *same* sampled arrivals and execution times, a single FCFS server that
is c times faster (the "control"). Its exact mean latency per tenant is known from Pollaczek-Khinchine
(W + S_i/c), and its sample mean moves with the studied device's because both are driven by the same busy
periods. The regression estimator

    Y_cv = mean(Y) - beta * (mean(X) - E[X]),   beta = Cov(Y, X) / Var(X)

is unbiased for E[Y] up to O(1/R) from estimating beta, and its confidence interval comes from the
regression's residual variance with a Student t on R - 2 degrees of freedom (standard control-variate
theory, e.g. Law & Kelton, "Simulation Modeling and Analysis", §11.4). Units: ms, req/s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats as _st

from edgemux.cluster.disciplines import capacity
from edgemux.cluster.workload import DeviceSpec, Discipline, Tenant
from edgemux.profiles.distributions import second_moment
from edgemux.profiles.types import DeviceKind
from edgemux.sim.run import run_workload, sample_workload
from edgemux.sim.stats import CI


@dataclass(frozen=True)
class ControlledMean:
    """A tenant's mean latency (ms) estimated with and without the control variate."""

    controlled: CI
    plain: CI
    correlation: float


def control_expectations(tenants: Sequence[Tenant], speed: float) -> list[float]:
    """Exact mean latency (ms) per tenant of an FCFS server ``speed`` times faster, without switch costs
    or CPU stages, fed the tenants' Poisson streams (P-K: W + S_i/speed)."""
    lam = sum(t.rate_rps for t in tenants) / 1000.0
    if lam <= 0:
        return [t.service.mean / speed for t in tenants]
    es = sum(t.rate_rps / 1000.0 * t.service.mean for t in tenants) / lam / speed
    es2 = sum(t.rate_rps / 1000.0 * second_moment(t.service) for t in tenants) / lam / speed**2
    rho = lam * es
    if rho >= 1:
        raise ValueError(f"control server is unstable (rho={rho:.3f}); it needs rho < 1")
    w = lam * es2 / (2.0 * (1.0 - rho))
    return [w + t.service.mean / speed for t in tenants]


def simulate_controlled(device: DeviceSpec, tenants: Sequence[Tenant], *, requests: int, replications: int,
                        seed: int = 0, warmup: float = 0.1, confidence: float = 0.95) -> dict[str, ControlledMean]:
    """Mean latency per tenant on ``device`` (simulated) with an FCFS control of speed ``device.servers``.

    Only for tenants without CPU stages or network latency (the control models the device alone) and
    Poisson arrivals (the control's expectation assumes them).
    """
    if replications < 3:
        raise ValueError(f"control variates need >= 3 replications, got {replications}")
    for t in tenants:
        if t.cpu is not None or t.network_ms:
            raise ValueError(f"tenant {t.name!r}: control variates model the device alone (no CPU stage/network)")
    speed = capacity(device)
    ctl_dev = DeviceSpec("control", DeviceKind.EDGETPU, Discipline.FCFS)
    ctl_tenants = [replace(t, switch_ms=0.0) for t in tenants]
    expect = control_expectations(tenants, speed)
    names = [t.name for t in tenants]
    y = np.empty((replications, len(tenants)))
    x = np.empty_like(y)
    for r, ss in enumerate(np.random.SeedSequence(seed).spawn(replications)):
        w = sample_workload(tenants, requests, seed=ss)
        run = run_workload(device, tenants, w)  # the sweep: the same departures as the event engine, faster
        ctl = run_workload(ctl_dev, ctl_tenants, replace(w, service_ms=w.service_ms / speed), engine="lindley")
        y[r] = [run.latencies_of(n, warmup=warmup).mean() for n in names]
        x[r] = [ctl.latencies_of(n, warmup=warmup).mean() for n in names]
    out = {}
    for i, n in enumerate(names):
        out[n] = _regress(y[:, i], x[:, i], expect[i], confidence)
    return out


def _regress(y: np.ndarray, x: np.ndarray, mu_x: float, confidence: float) -> ControlledMean:
    r = y.size
    tq_plain = _st.t.ppf(0.5 + confidence / 2, r - 1)
    ybar, xbar = float(y.mean()), float(x.mean())
    half = tq_plain * float(y.std(ddof=1)) / math.sqrt(r)
    plain = CI(ybar, ybar - half, ybar + half)
    sxx = float(((x - xbar) ** 2).sum())
    if sxx == 0.0:  # deterministic control (e.g. no queueing at all): nothing to learn from it
        return ControlledMean(plain, plain, 0.0)
    beta = float(((x - xbar) * (y - ybar)).sum()) / sxx
    est = ybar - beta * (xbar - mu_x)
    resid = y - ybar - beta * (x - xbar)
    s2 = float((resid**2).sum()) / (r - 2)
    se = math.sqrt(s2 * (1.0 / r + (xbar - mu_x) ** 2 / sxx))
    tq = _st.t.ppf(0.5 + confidence / 2, r - 2)
    corr = float(np.corrcoef(y, x)[0, 1]) if y.std() > 0 else 0.0
    return ControlledMean(CI(est, est - tq * se, est + tq * se), plain, corr)
