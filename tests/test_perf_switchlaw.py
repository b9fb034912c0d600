"""``perf.switchlaw``: the Edge TPU response law with the switch decided by the request served before.

Against the P-K law where no switch is paid (they must agree), the fixed point of the recursion by power
iteration (the one-pass solve must equal it), and the simulator's Edge TPU (mean, p95 and p99 within the
confidence intervals of seeded replications, where the i.i.d. reading of ``perf.tails`` is off)."""

from __future__ import annotations


import numpy as np
import pytest
from scipy.signal import lfilter

from edgemux.cluster.workload import Arrival, DeviceSpec, Discipline, Tenant
from edgemux.perf.edgetpu import request_shares
from edgemux.perf.result import Unstable
from edgemux.perf.switchlaw import switch_response_laws, switch_response_quantiles
from edgemux.perf.tails import edgetpu_response_quantiles
from edgemux.profiles.distributions import Deterministic, Gamma, Shifted
from edgemux.profiles.types import DeviceKind
from edgemux.sim.run import simulate_device

TPU = DeviceSpec("tpu0", DeviceKind.EDGETPU, Discipline.FCFS)


def _pair(rate_long: float, rate_short: float) -> list[Tenant]:
    """The shape of the real file's inception_v4 + mobilenet_v2 pair (Edge TPU profiles' scale)."""
    return [Tenant("long", "big", Arrival.poisson(rate_long), Deterministic(140.0), switch_ms=20.0),
            Tenant("short", "small", Arrival.poisson(rate_short), Gamma(3.5, 0.04), switch_ms=12.0)]


def test_without_switches_it_is_the_pk_law() -> None:
    # one model, or switches that cost nothing: the recursion is plain M/G/1-FCFS
    same = [Tenant("a", "m", Arrival.poisson(20.0), Deterministic(10.0)),
            Tenant("b", "m", Arrival.poisson(30.0), Gamma(8.0, 0.25))]
    free = [Tenant("a", "m1", Arrival.poisson(20.0), Deterministic(10.0)),
            Tenant("b", "m2", Arrival.poisson(30.0), Gamma(8.0, 0.25))]
    for tenants in (same, free):
        ours = switch_response_quantiles(tenants)
        pk = edgetpu_response_quantiles(tenants)
        for a, b in zip(ours, pk):
            assert a == pytest.approx(b, rel=2e-3), (a, b)


def _power_iteration(tenants: list[Tenant], dt: float, n: int, steps: int) -> list[np.ndarray]:
    """The recursion R_c' = sum_c p_c (R_c - A)^+ (*) S(c', c) iterated on the same lattice."""
    lam = sum(t.rate_rps for t in tenants) / 1000.0
    g = 1.0 / (1.0 + lam * dt)
    p = request_shares(tenants)

    def lat(d: object) -> np.ndarray:
        m = np.asarray(d.lattice(dt, n), dtype=float)  # type: ignore[attr-defined]
        return np.fft.rfft(m / m.sum())

    def reflect(x: np.ndarray) -> np.ndarray:  # (X - A)^+ with P(A >= j) = g^j
        tail = lfilter([0.0, g], [1.0, -g], x[::-1])[::-1]
        return np.diff(np.r_[0.0, np.cumsum(x) + tail])

    u = [lat(t.service) for t in tenants]
    v = [lat(Shifted(t.service, t.switch_ms)) for t in tenants]
    r = [np.fft.irfft(u[c], n) for c in range(len(tenants))]
    for _ in range(steps):
        prev = [np.fft.rfft(reflect(p[c] * r[c])) for c in range(len(tenants))]
        r = [np.fft.irfft(sum(prev[c] * (u[c2] if tenants[c].cache_key == tenants[c2].cache_key else v[c2])
                              for c in range(len(tenants))), n) for c2 in range(len(tenants))]
    return r


def test_one_pass_equals_the_fixed_point_of_the_recursion() -> None:
    tenants = _pair(0.69, 6.0)
    laws = switch_response_laws(tenants)
    assert not isinstance(laws, Unstable)
    iterated = _power_iteration(tenants, laws[0].dt_ms, laws[0].pmf.size, 400)
    for law, pmf in zip(laws, iterated):
        assert np.abs(np.cumsum(law.pmf) - np.cumsum(pmf)).max() < 1e-6


@pytest.mark.parametrize("rates", [(0.69, 6.0), (2.4, 24.0)])
def test_mean_and_tails_agree_with_the_simulated_edge_tpu(rates: tuple[float, float]) -> None:
    """The simulator runs the device request by request (the switch decided by the request before); the law
    must sit within 99.9 % intervals of 20 seeded replications on mean, p95 and p99 for both tenants (a
    Bonferroni 0.6 % for the six), where the i.i.d. reading misses at least one."""
    tenants = _pair(*rates)
    sim = simulate_device(TPU, tenants, requests=60_000, replications=20, seed=3, confidence=0.999).tenants
    laws = switch_response_laws(tenants)
    assert not isinstance(laws, Unstable)
    iid = edgetpu_response_quantiles(tenants)
    iid_outside = 0
    for t, law, (i95, i99) in zip(tenants, laws, iid):
        s = sim[t.name]
        q95, q99 = law.quantiles((0.95, 0.99))
        for ours, ci in ((law.mean, s.mean_ms), (q95, s.p95_ms), (q99, s.p99_ms)):
            assert abs(ours - ci.value) <= ci.half_width + 0.05, (t.name, ours, ci)
        iid_outside += abs(i95 - s.p95_ms.value) > s.p95_ms.half_width
        iid_outside += abs(i99 - s.p99_ms.value) > s.p99_ms.half_width
    assert iid_outside >= 1  # the test can tell the two laws apart


def test_refusals_and_overload() -> None:
    tenants = _pair(0.69, 6.0)
    periodic = [tenants[0], Tenant("cam", "small", Arrival.periodic(15.0), Deterministic(3.5), switch_ms=12.0)]
    with pytest.raises(ValueError, match="Poisson arrivals"):
        switch_response_laws(periodic)
    idle = [Tenant(t.name, t.model, Arrival.poisson(0.0), t.service, switch_ms=t.switch_ms) for t in tenants]
    with pytest.raises(ValueError, match="needs traffic"):
        switch_response_laws(idle)
    over = _pair(5.0, 60.0)
    assert isinstance(switch_response_laws(over), Unstable)
    assert all(isinstance(q, Unstable) for row in switch_response_quantiles(over) for q in row)
    assert switch_response_laws([]) == []


def test_a_system_too_large_for_memory_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import edgemux.perf.switchlaw as law

    monkeypatch.setattr(law, "_MAX_ENTRIES", 1000)
    with pytest.raises(ValueError, match="needs more than 1000 matrix entries"):
        law.switch_response_laws(_pair(0.69, 6.0))
