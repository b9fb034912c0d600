"""``dynamic-trace`` and its trace generator (``sim.diurnal``): the daily curve, the trace's shape, and one
small comparison (3 Edge TPUs, 6 apps for 30 min at the afternoon peak, each sending 1.4-1.8x its
contract) of static placement, adaptation and the oracle. About 3 s; the full 24 h run is the experiment's
(``edgemux experiment dynamic-trace``)."""

from __future__ import annotations


import pytest

from edgemux.adapt.settings import AdaptSettings
from edgemux.experiments.dynamic_trace import Comparison, compare, figures, migrations, oracle_trace, tpus
from edgemux.sim.cluster import Arrive, Leave, Place, Rate
from edgemux.sim.diurnal import DailyApps, daily_apps, daily_level
from edgemux.sim.trace import check_trace

PEAK = DailyApps(horizon_s=1800.0, start_hour=14.5, initial=6, arrivals_per_hour=0.0, peak_ratio=(1.4, 1.8),
                 step_s=600.0)
WINDOWS = AdaptSettings(window_s=30.0)


def test_the_daily_curve_peaks_at_its_hour_and_bottoms_twelve_hours_away() -> None:
    p = DailyApps()
    assert daily_level(p, 15 * 3600.0) == pytest.approx(1.0)
    assert daily_level(p, 3 * 3600.0) == pytest.approx(p.night_level)
    assert daily_level(p, 9 * 3600.0) == pytest.approx((1 + p.night_level) / 2)
    shifted = DailyApps(start_hour=10.0)  # t = 5 h is 15:00
    assert daily_level(shifted, 5 * 3600.0) == pytest.approx(1.0)


def test_the_trace_is_seeded_valid_and_follows_the_curve() -> None:
    p = DailyApps(horizon_s=6 * 3600.0, arrivals_per_hour=6.0)
    trace = daily_apps(1, p)
    assert trace == daily_apps(1, p) and trace != daily_apps(2, p)
    assert [e.time_s for e in trace] == sorted(e.time_s for e in trace)
    arrivals = [e for e in trace if isinstance(e, Arrive)]
    assert sum(e.time_s == 0.0 for e in arrivals) == p.initial and len(arrivals) > p.initial
    declared = {e.app.name: e.app for e in arrivals}
    # every rate step is contract x the app's own ratio x the curve at the step's middle
    for e in trace:
        if isinstance(e, Rate):
            ratio = e.rate_rps / declared[e.app_name].rate_rps / daily_level(p, min(e.time_s + 450.0, p.horizon_s))
            assert p.peak_ratio[0] - 1e-3 <= ratio <= p.peak_ratio[1] + 1e-3
    for a in declared.values():
        assert a.slo.stat == "p99" and a.model in p.models and a.rate_rps > 0
    # the simulator's own trace checks accept it (sorted, within the horizon, apps named only while present)
    check_trace(trace, p.horizon_s, nodes=())


@pytest.mark.parametrize("kw, message", [
    ({"horizon_s": 0.0}, "horizon_s must be a finite number of seconds > 0"),
    ({"night_level": 0.0}, r"night_level must be in \(0, 1\]"),
    ({"peak_ratio": (2.0, 1.0)}, "peak_ratio must be a range 0 < low <= high"),
    ({"models": ()}, "models must name at least one model"),
])
def test_bad_trace_parameters_are_named(kw: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DailyApps(**kw)


@pytest.fixture(scope="module")
def peak() -> Comparison:
    return compare(daily_apps(3, PEAK), tpus(3), PEAK.horizon_s, seed=0, settings=WINDOWS, period_s=900.0)


def test_adaptation_recovers_what_static_placement_loses_and_the_oracle_bounds_it(peak: Comparison) -> None:
    fig = figures(peak, PEAK.horizon_s)
    s, a, o = fig["static"], fig["adapt"], fig["oracle"]
    assert s["requests"] == a["requests"] == o["requests"]  # same seed, same apps: the same requests
    assert s["admitted"] == a["admitted"] == o["admitted"] == peak.arrived == 6
    # static polices each app at its declared contract: a quarter of the requests are refused, and the
    # devices it packed at the contracts are overloaded by what the buckets let through
    assert s["refused"] > 0.2 * s["requests"] and s["attainment"] < 0.5
    # adaptation raises the contracts (here in place: the policy finds room where the apps are) within the
    # first minutes; the oracle, which knew the rates from the start, refuses nothing
    assert a["attainment"] > 0.9 and a["refused"] < 0.02 * a["requests"] and a["in_place"] >= 6
    assert o["refused"] == 0 and o["attainment"] >= 0.99 and o["attainment"] >= a["attainment"]
    assert a["max_per_app_hour"] <= 1 and set(peak.oracle.statuses) == {"optimal"}


def test_the_oracle_places_every_arrival_and_re_places_each_period(peak: Comparison) -> None:
    events = peak.oracle.events
    arrivals = [e for e in events if isinstance(e, Arrive)]
    assert len(arrivals) == 6 and all(e.placement is not None for e in arrivals)
    # contracts at each app's peak rate in the first period, plus the headroom
    trace = daily_apps(3, PEAK)
    first = {e.app_name: e.rate_rps for e in trace if isinstance(e, Rate) and e.time_s < 900.0}
    for e in arrivals:
        assert e.app.rate_rps == pytest.approx(first[e.app.name] * 1.1)
    assert all(e.time_s == 900.0 for e in events if isinstance(e, Place))
    assert not any(isinstance(e, Leave) for e in events) and not peak.oracle.rejected
    assert migrations(peak.runs["oracle"], peak.oracle) == [(e.time_s, e.app_name) for e in events
                                                             if isinstance(e, Place) and e.placement.shares[0].device
                                                             != next(a.placement.shares[0].device for a in arrivals
                                                                     if a.app.name == e.app_name)]


def test_an_app_the_oracle_cannot_place_is_left_out_of_its_replay() -> None:
    """One TPU and an app whose peak rate alone overloads it: the optimum rejects it, and its later events
    go with it."""
    p = DailyApps(horizon_s=600.0, start_hour=15.0, initial=2, arrivals_per_hour=0.0, peak_ratio=(40.0, 40.0),
                  step_s=300.0)
    trace = daily_apps(0, p)
    res = oracle_trace(trace, tpus(1), p.horizon_s, period_s=600.0)
    assert res.rejected and all(getattr(e, "app_name", None) not in res.rejected for e in res.events)
