"""perf.tailbounds: rigorous quantile bounds against closed forms, against the DFT inversion of perf.tails,
and the Ibis latency check that uses them (same outcome as the full inversion)."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from edgemux.cluster.state import App, Cluster, Device, Node, Slo
from edgemux.cluster.workload import Arrival, DeviceSpec, Discipline, Tenant
from edgemux.perf.device import predict_device
from edgemux.perf.result import Unstable
from edgemux.perf.tailbounds import (
    DFT_CELLS_TOL,
    DFT_REL_TOL,
    adjustment_bracket,
    edgetpu_decision_bounds,
    edgetpu_quantile_bounds,
    mg1_quantile_bounds,
    service_law,
)
from edgemux.perf.tails import (
    edgetpu_response_quantiles,
    md1_waiting_cdf,
    mg1_response_quantiles,
    mm1_response_quantile,
)
from edgemux.policies import Snapshot
from edgemux.policies.feasibility import Fit, Pending, fcfs_values, slo_value, tails_only
from edgemux.policies.ibis import Ibis
from edgemux.profiles.distributions import Deterministic, Empirical, Exponential, Gamma, Mixture, Shifted
from edgemux.profiles.types import DeviceKind

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _tol(value: float, mean: float) -> float:
    """The allowance for the DFT estimate the policy uses (``DecisionBounds.tolerance_ms``)."""
    return DFT_REL_TOL * abs(value) + DFT_CELLS_TOL * mean / 64.0


# ---------------------------------------------------------------------------------------- closed forms


@pytest.mark.parametrize("rho", [0.1, 0.3, 0.5, 0.7, 0.9, 0.97])
def test_mm1_bounds_bracket_closed_form(rho: float) -> None:
    lam = 1000.0 * rho / 10.0
    qs = (0.5, 0.9, 0.95, 0.99, 0.999)
    b = mg1_quantile_bounds(lam, Exponential(10.0), qs=qs)
    assert b is not None
    for q, x in zip(qs, b):
        exact = mm1_response_quantile(lam, 10.0, q)
        assert x.lower <= exact <= x.upper
    # the adjustment coefficient of M/M/1 is mu - lam; Kingman's upper bound is (ln(1/rho) + ln(1/(1-q)))
    # / (mu - lam) for the wait, within ln(1/rho) / (mu - lam) of the exact response quantile
    lo, hi = adjustment_bracket(lam / 1000.0, service_law(Exponential(10.0)))  # type: ignore[arg-type, misc]
    assert lo <= 0.1 - lam / 1000.0 <= hi
    assert hi - lo <= 1e-4 * hi
    for q, x in zip(qs, b):
        slack = (math.log(1.0 / rho) + 1e-6) / (0.1 - lam / 1000.0)
        assert x.upper <= (mm1_response_quantile(lam, 10.0, q) + slack) * (1.0 + 1e-4)


def _md1_wait_quantile(lam: float, d: float, q: float) -> float:
    lo, hi = 0.0, d
    while md1_waiting_cdf(lam, d, hi) < q:
        hi *= 2.0
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if md1_waiting_cdf(lam, d, mid) >= q:
            hi = mid
        else:
            lo = mid
    return hi


@pytest.mark.parametrize("rho", [0.3, 0.6, 0.9])
def test_md1_waiting_bounds_bracket_erlang(rho: float) -> None:
    lam = 1000.0 * rho / 10.0
    qs = (0.9, 0.95, 0.99)
    b = mg1_quantile_bounds(lam, Deterministic(10.0), Deterministic(0.0), qs=qs)
    assert b is not None
    for q, x in zip(qs, b):
        exact = _md1_wait_quantile(lam, 10.0, q)
        assert x.lower <= exact + 1e-6 <= x.upper + 2e-6


def test_no_bounds_outside_stability_or_for_unknown_laws() -> None:
    assert mg1_quantile_bounds(100.0, Deterministic(10.0)) is None       # rho = 1
    assert mg1_quantile_bounds(0.0, Deterministic(10.0)) is None         # rho = 0
    assert service_law(object()) is None  # type: ignore[arg-type]


# -------------------------------------------------------------------------- against the DFT inversion

atoms_st = st.lists(st.tuples(st.floats(2.0, 60.0), st.floats(0.05, 1.0)), min_size=1, max_size=4)


def _discrete(atoms: list[tuple[float, float]]) -> Mixture:
    tot = sum(p for _, p in atoms)
    return Mixture(tuple(Deterministic(x) for x, _ in atoms), tuple(p / tot for _, p in atoms))


@SETTINGS
@given(agg=atoms_st, own=st.one_of(st.none(), atoms_st), rho=st.floats(0.05, 0.9))
def test_discrete_bounds_contain_dft_estimate(agg, own, rho) -> None:
    s = _discrete(agg)
    o = None if own is None else _discrete(own)
    lam = 1000.0 * rho / s.mean
    qs = (0.5, 0.95, 0.99)
    b = mg1_quantile_bounds(lam, s, o, qs=qs)
    assert b is not None
    est = mg1_response_quantiles(lam, s, o, qs=qs)
    scale = min(s.mean, (s if o is None else o).mean)
    for x, e in zip(b, est):
        assert x.lower <= x.upper
        assert x.lower - _tol(x.lower, scale) <= e <= x.upper + _tol(x.upper, scale)


@SETTINGS
@given(mean=st.floats(2.0, 50.0), scv=st.floats(0.2, 2.0), rho=st.floats(0.05, 0.9),
       shift=st.floats(0.0, 20.0))
def test_continuous_bounds_contain_dft_estimate(mean, scv, rho, shift) -> None:
    s = Mixture((Gamma(mean, scv), Shifted(Exponential(mean), shift)), (0.7, 0.3))
    lam = 1000.0 * rho / s.mean
    qs = (0.95, 0.99)
    b = mg1_quantile_bounds(lam, s, qs=qs)
    assert b is not None
    est = mg1_response_quantiles(lam, s, qs=qs)
    for x, e in zip(b, est):
        assert x.lower - _tol(x.lower, s.mean) <= e <= x.upper + _tol(x.upper, s.mean)


_EXEC = (4.55, 4.91, 9.83, 15.85, 18.03, 19.23, 42.18, 62.95, 125.13)
_SWITCH = (10.43, 15.12, 17.33, 22.63, 23.93, 24.63, 17.53, 19.39, 19.43)


@st.composite
def tpu_tenants(draw) -> list[Tenant]:
    k = draw(st.integers(1, 7))
    periodic = draw(st.booleans())
    out = []
    for i in range(k):
        j = draw(st.integers(0, len(_EXEC) - 1))
        model = f"m{draw(st.integers(0, 3))}"
        rate = draw(st.floats(0.2, 6.0))
        arrival = Arrival.periodic(rate) if periodic and draw(st.booleans()) else Arrival.poisson(rate)
        svc = Deterministic(_EXEC[j]) if draw(st.booleans()) else Empirical((_EXEC[j], 1.2 * _EXEC[j]))
        out.append(Tenant(f"t{i}", model, arrival, svc, switch_ms=_SWITCH[j],
                          network_ms=draw(st.sampled_from([0.0, 5.0]))))
    return out


@SETTINGS
@given(tenants=tpu_tenants())
def test_edgetpu_bounds_contain_dft_estimate(tenants) -> None:
    qs = (0.95, 0.99)
    est = edgetpu_response_quantiles(tenants, qs)
    assume(all(isinstance(v, float) for row in est for v in row))
    db = edgetpu_decision_bounds(tenants, qs)
    assume(db is not None)
    plain = edgetpu_quantile_bounds(tenants, qs)
    assert plain is not None
    for i, (row, brow, prow) in enumerate(zip(est, db.bounds, plain)):  # type: ignore[union-attr]
        assert brow == prow
        for e, x in zip(row, brow):  # type: ignore[arg-type]
            assert x.lower - db.tolerance_ms(x.lower) <= e <= x.upper + db.tolerance_ms(x.upper)  # type: ignore[union-attr]
            ref = db.refined_upper(i, x.q)  # type: ignore[union-attr]
            assert e <= ref + db.tolerance_ms(ref) and ref <= x.upper  # type: ignore[union-attr]
            cheap = db.bound(i, x.q, tight=False)  # type: ignore[union-attr]
            assert cheap.lower == x.lower and x.upper <= cheap.upper
            assert e <= cheap.upper + db.tolerance_ms(cheap.upper)  # type: ignore[union-attr]


def test_which_selects_tenants_without_changing_them() -> None:
    ts = [Tenant("a", "m1", Arrival.poisson(15.0), Deterministic(20.0), switch_ms=10.0),
          Tenant("b", "m2", Arrival.poisson(45.0), Deterministic(5.0), switch_ms=4.0),
          Tenant("c", "m2", Arrival.periodic(5.0), Deterministic(9.83), switch_ms=17.33)]
    full = edgetpu_quantile_bounds(ts)
    part = edgetpu_quantile_bounds(ts, which=[2])
    assert full is not None and part is not None
    assert part[0] is None and part[1] is None and part[2] == full[2]


# --------------------------------------------------------------------------------- the Ibis latency check

_FLOORS = {"mobilenet_v1": 4.55, "efficientnet-S": 9.83, "efficientnet-M": 15.85, "ssd_mobilenet_v2": 19.23,
           "inception_v3": 62.95, "efficientnet-L": 42.18}


def _cluster(nodes: int) -> Cluster:
    out = []
    for i in range(nodes):
        name = f"n{i}"
        devs = tuple(Device(name, f"tpu{k}", DeviceKind.EDGETPU, Discipline.FCFS, 64.0, "ibis-edgetpu")
                     for k in range(2))
        out.append(Node(name, 16.0, 65536.0, devs))
    return Cluster(tuple(out))


def _app(r: random.Random, name: str, p_tail: float) -> App:
    model = r.choice(sorted(_FLOORS))
    periodic = r.random() < 0.3
    rate = r.uniform(1.0, 5.0) if periodic else r.uniform(0.2, 3.0)
    stat = r.choice(("p95", "p99")) if r.random() < p_tail else "mean"
    slo = _FLOORS[model] * r.uniform(2.0, 8.0) + r.uniform(0.0, 80.0)
    return App(name=name, model=model, rate_rps=rate, slo=Slo(slo, stat), periodic=periodic,
               shared=r.random() < 0.5, network_ms=r.choice((0.0, 3.0)))


@pytest.fixture(scope="module")
def full_snapshot() -> Snapshot:
    r = random.Random(5)
    pol = Ibis()
    snap = Snapshot(_cluster(6))
    for i in range(120):
        app = _app(r, f"t{i}", 0.5)
        d = pol.decide(app, snap)
        if not hasattr(d, "constraint"):
            snap = snap.with_placement(app, d)  # type: ignore[arg-type]
    assert len(snap.placements) >= 20
    return snap


def test_check_outcome_equals_full_inversion(full_snapshot: Snapshot) -> None:
    """``_check`` (bounds, then the inversion only where they do not settle it) reaches the outcome of
    ``_latency`` on every candidate: Fit vs Rejection, and the constraint; settled often enough to matter."""
    r = random.Random(11)
    pol = Ibis()
    settled = 0
    total = 0
    for i in range(40):
        app = _app(r, f"new{i}", 0.6)
        cands, _, _ = pol._cheap_all(app, full_snapshot)
        for c in cands:
            exact = pol._latency(app, full_snapshot, c)
            got = pol._check(app, full_snapshot, c)
            total += 1
            if isinstance(exact, Fit):
                assert isinstance(got, Fit), (exact, got)
            else:
                assert not isinstance(got, Fit), (exact, got)
                assert got.constraint == exact.constraint
                if isinstance(got, Pending):
                    settled += 1
    assert total > 50 and settled > 0


def test_fcfs_values_equal_predict_device(full_snapshot: Snapshot) -> None:
    """The subset inversion of ``_latency`` gives ``predict_device``'s numbers (where it computes them)."""
    r = random.Random(12)
    pol = Ibis()
    checked = 0
    for i in range(25):
        app = _app(r, f"new{i}", 0.7)
        cands, _, _ = pol._cheap_all(app, full_snapshot)
        for c in cands[:6]:
            owners = [app if t.name == app.name else full_snapshot.apps[t.name] for t in c.tenants]
            spec = DeviceSpec(name=c.device.path, kind=c.device.kind, discipline=c.device.discipline)
            if not tails_only(spec, c.tenants, owners):
                continue
            verdicts = ["pass" if o.slo.stat == "mean" else "open" for o in owners]  # invert every tail
            values = fcfs_values(app, spec, c.tenants, owners, verdicts=verdicts, upper={})
            est = predict_device(spec, c.tenants)
            for t, o in zip(c.tenants, owners):  # up to the first tenant over its SLO (the check stops)
                ref = slo_value(est[t.name], o.slo.stat)
                assert values[t.name] == ref, (t.name, o.slo.stat, values[t.name], ref)
                checked += 1
                if isinstance(ref, Unstable) or ref > o.slo.latency_ms:  # type: ignore[operator]
                    break
    assert checked > 20
