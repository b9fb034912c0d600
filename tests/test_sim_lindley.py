"""The vectorized FCFS path against a plain loop, blocks, and model-switch overhead rules."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgemux.sim.lindley import fcfs_lindley, lindley_waits, switch_overheads


def loop_waits(a: np.ndarray, s: np.ndarray) -> np.ndarray:
    w = np.zeros(a.size)
    for i in range(1, a.size):
        w[i] = max(0.0, w[i - 1] + s[i - 1] - (a[i] - a[i - 1]))
    return w


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 10), st.floats(0, 10)), min_size=1, max_size=80),
    st.integers(2, 9),
)
def test_matches_loop_for_any_block_size(rows: list[tuple[float, float]], block: int) -> None:
    gaps, svc = (np.array(c) for c in zip(*rows))
    a = np.cumsum(gaps)
    s = np.array(svc)
    np.testing.assert_allclose(lindley_waits(a, s, block=block), loop_waits(a, s), rtol=0, atol=1e-9)
    np.testing.assert_allclose(lindley_waits(a, s), loop_waits(a, s), rtol=0, atol=1e-9)


def test_long_run_matches_loop() -> None:
    rng = np.random.default_rng(5)
    a = np.cumsum(rng.exponential(1.0, 300_000))
    s = rng.exponential(0.9, a.size)
    np.testing.assert_allclose(lindley_waits(a, s), loop_waits(a, s), rtol=0, atol=1e-8)


def test_empty_and_shape_errors() -> None:
    assert lindley_waits(np.array([]), np.array([])).size == 0
    with pytest.raises(ValueError, match="same length"):
        lindley_waits(np.array([1.0, 2.0]), np.array([1.0]))


def test_switch_cold_start_and_shared_models() -> None:
    models = np.array([0, 0, 1, 1, 0, 2, 2])
    sw = np.array([5.0, 5.0, 7.0, 7.0, 5.0, 9.0, 9.0])
    np.testing.assert_array_equal(switch_overheads(models, sw), [5, 0, 7, 0, 5, 9, 0])
    np.testing.assert_array_equal(switch_overheads(models, sw, cold_start=False), [0, 0, 7, 0, 5, 9, 0])


def test_fcfs_lindley_switch_persists_across_idle_and_shared_model_never_switches() -> None:
    # tenants 0 and 1 share model id 0; tenant 2 has model 1
    a = np.array([0.0, 100.0, 200.0, 300.0, 301.0])
    t = np.array([0, 1, 0, 2, 1])
    s = np.array([1.0, 1.0, 1.0, 2.0, 1.0])
    run = fcfs_lindley(a, t, s, tenant_model=np.array([0, 0, 1]), tenant_switch_ms=np.array([3.0, 4.0, 10.0]))
    # request 0 cold start pays 3; 1 and 2: same model after long idle, no switch; 3 switches (10); 4 back (4)
    np.testing.assert_array_equal(run.occupation_ms, [4.0, 1.0, 1.0, 12.0, 5.0])
    np.testing.assert_array_equal(run.wait_ms, [0, 0, 0, 0, 11.0])
    np.testing.assert_array_equal(run.departure_ms, [4.0, 101.0, 201.0, 312.0, 317.0])
