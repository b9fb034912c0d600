"""The ingress core (runtime/ingress/dispatch.py) that the client and the gateway share: the route table keeps an app's
bucket and cooldowns across a republish, policing refuses beyond the wait it may take, and one request's
attempts try each endpoint at most once, mark failures down and name every endpoint when none is left. Driven
with a fake clock; no I/O."""

from __future__ import annotations

import pytest

from edgemux.adapt.police import Policing
from edgemux.runtime.ingress.client import AppRoute, Client
from edgemux.runtime.ingress.dispatch import Attempts, RateLimited, RouteTable, Unavailable, police, verdict
from edgemux.runtime.ingress.gateway import Gateway


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def route(*urls: str, weights: tuple[float, ...] = (), rate: float = 10.0, burst: float = 2.0) -> AppRoute:
    return AppRoute("cam", "cam", list(zip(urls, weights or (1.0,) * len(urls))), rate, burst)


def test_verdicts() -> None:
    assert [verdict(s) for s in (200, 500, 503, 429, 400, 404)] == [
        "ok", "retry", "retry", "rate-limited", "refused", "refused"]


def test_police_waits_then_refuses_beyond_max_wait() -> None:
    clock = Clock()
    table = RouteTable(clock, cooldown_s=1.0, policing=Policing.exact())
    table.update("cam", route("http://a:1", rate=10.0, burst=2.0))
    state = table.get("cam")
    assert state is not None
    assert police("cam", state, 0.5) == 0.0 and police("cam", state, 0.5) == 0.0  # the burst
    assert police("cam", state, 0.5) == pytest.approx(0.1)                     # the next token, 1/10 s on
    with pytest.raises(RateLimited) as e:
        police("cam", state, 0.05, source="gateway")
    assert e.value.source == "gateway" and e.value.retry_after_s > 0.05


def test_republish_keeps_tokens_and_cooldowns_of_endpoints_that_stay() -> None:
    clock = Clock()
    table = RouteTable(clock, cooldown_s=5.0, policing=Policing.exact())
    table.update("cam", route("http://a:1", "http://b:1"))
    state = table.get("cam")
    assert state is not None
    police("cam", state, 0.0)
    police("cam", state, 0.0)  # the burst is spent
    a = Attempts("cam", state, clock)
    first = a.next()
    assert first is not None
    a.failed(first, "connection refused")
    table.update("cam", route("http://a:1", "http://b:1", weights=(1.0, 3.0), burst=5.0))
    assert table.get("cam") is state  # the same state, updated in place
    with pytest.raises(RateLimited):
        police("cam", state, 0.0)  # no fresh burst from a republish
    assert state.router.is_down(first, clock()) and state.last_failure[first] == "connection refused"
    table.update("cam", route("http://c:1"))  # the failed endpoint left: its failure is forgotten
    assert state.last_failure == {}


def test_attempts_try_each_endpoint_once_then_name_every_endpoint() -> None:
    clock = Clock()
    table = RouteTable(clock, cooldown_s=5.0, policing=Policing.exact())
    table.update("cam", route("http://a:1", "http://b:1", "http://c:1"))
    state = table.get("cam")
    assert state is not None
    earlier = Attempts("cam", state, clock)
    ep = earlier.next()
    assert ep is not None
    earlier.failed(ep, "HTTP 503: busy", retry_after_s=2.0)  # down for 2 s, not the 5 s cooldown
    now = Attempts("cam", state, clock)
    seen = []
    while (e := now.next()) is not None:
        seen.append(e)
        now.failed(e, "timeout")
    assert len(seen) == 2 and ep not in seen and len(set(seen)) == 2
    err = now.unavailable()
    assert isinstance(err, Unavailable)
    assert err.failures[ep.url] == "skipped during its cooldown after HTTP 503: busy"
    assert all(err.failures[e.url] == "timeout" for e in seen)
    assert err.retry_after_s == pytest.approx(2.0)  # the first endpoint back is the one the server named
    clock.t = 2.5
    again = Attempts("cam", state, clock)
    assert again.next() == ep
    again.succeeded(ep)
    assert ep not in state.last_failure


def test_a_lookup_does_not_replace_a_route_installed_meanwhile() -> None:
    clock = Clock()
    table = RouteTable(clock, cooldown_s=1.0, policing=Policing.exact())
    table.update("cam", route("http://a:1"))
    kept = table.install("cam", route("http://b:1"))
    assert [ep.url for ep, _ in kept.route.endpoints] == ["http://a:1"]
    with pytest.raises(ValueError, match="given as the route of app"):
        table.update("dog", route("http://a:1"))


def test_client_and_gateway_run_the_same_core() -> None:
    c = Client([route("http://a:1")])
    g = Gateway({"cam": route("http://a:1")})
    assert type(c._table) is RouteTable and type(g._table) is RouteTable  # noqa: SLF001 - the point of the test
    assert c.route("cam") == g.routes()["cam"]


def test_default_policing_is_the_simulators_rule() -> None:
    """Without a policing given, a route's contract becomes the bucket ``adapt.police.Policing()`` makes of it,
    the one ``sim.cluster`` runs: 1.1x the contract, 4 s of that deep (or the app's burst when larger)."""
    table = RouteTable(Clock(), cooldown_s=1.0)
    table.update("cam", route("http://a:1", rate=10.0, burst=2.0))
    bucket = table.get("cam").bucket
    assert (bucket.rate_rps, bucket.burst) == pytest.approx((11.0, 44.0))
    assert Policing().contract(10.0, 2.0) == pytest.approx((11.0, 44.0))
    assert Policing().contract(10.0, 100.0) == pytest.approx((11.0, 100.0))  # the app's own burst when larger
    assert Policing.exact().contract(10.0, 2.0) == (10.0, 2.0)
    # a republished contract is policed by the same rule
    table.update("cam", route("http://a:1", rate=30.0, burst=2.0))
    assert (bucket.rate_rps, bucket.burst) == pytest.approx((33.0, 132.0))
