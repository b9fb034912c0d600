"""The cluster simulator's requests: each admitted app's arrivals at its actual rate, its token bucket, the
routing of every request to a share of the placement in force when it is sent, the app's CPU stage and the
devices' stations, what the monitor sees of them in a window, the placements' switches, and the requests a
node failure loses. One part of ``sim.cluster`` (its module doc says what is modelled), owning the
per-request state. Times: ms inside (the engine's clock), s at the interface (``*_s``); rates req/s.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgemux.adapt.monitor import AppWindow, LatencySummary
from edgemux.adapt.police import Bucket, Policing
from edgemux.cluster.state import App, Cluster, Placement
from edgemux.cluster.disciplines import traits
from edgemux.policies.base import tenant_for
from edgemux.profiles.catalog import Catalog
from edgemux.profiles.distributions import Distribution
from edgemux.sim.devices import LimitedPsStation, SpatialStation, Station, station_for
from edgemux.sim.engine import PRIO_ARRIVAL, Engine
from edgemux.sim.nodes import Nodes
from edgemux.sim.outcome import AppTotals, NodeFailure, WindowRow

__all__ = ["AppRun", "Draws", "Route", "Traffic", "devices_of"]

_BLOCK = 256  # random numbers drawn per call: one numpy call per block instead of one per request


class Draws:
    """A block-buffered stream of floats from ``draw(n)``."""

    __slots__ = ("_buf", "_draw", "_pos")

    def __init__(self, draw: Callable[[int], np.ndarray]) -> None:
        self._draw = draw
        self._buf: list[float] = []
        self._pos = 0

    def next(self) -> float:
        if self._pos == len(self._buf):
            self._buf = self._draw(_BLOCK).tolist()
            self._pos = 0
        x = self._buf[self._pos]
        self._pos += 1
        return x


@dataclass
class Route:
    """Where a share of an app's requests goes: up to cumulative weight ``upto``, the ``entry`` station
    (the CPU stage or the device) and what the request carries there; ``node`` the device's node and
    ``cpu_node`` the CPU stage's (None without one)."""

    upto: float
    path: str
    entry: Callable[[float, int], None]
    device: Callable[[float, int], None]
    model: int
    switch_ms: float
    service: Draws
    network_ms: float
    cpu_ms: float
    node: str
    cpu_node: str | None


@dataclass
class AppRun:
    """An admitted app's state during the run."""

    index: int
    app: App
    rate_rps: float  # what it actually sends
    arrivals: Draws  # standard exponentials (Poisson) or uniforms (periodic phase)
    service_rng: np.random.Generator
    route_u: Draws
    routes: list[Route]
    bucket: Bucket | None
    admitted_s: float
    devices: list[tuple[float, tuple[str, ...]]]  # (time s, serving devices) from that time on
    contracts: list[tuple[float, float]]  # (time s, contract req/s) from that time on
    requests: list[int] = field(default_factory=list)
    left_s: float | None = None
    next_arrival: list[Any] | None = None
    generation: int = 0  # bumped by every transition and by leaving: a pending switch of an older one is void
    window_cursor: int = 0
    services: dict[str, Draws] = field(default_factory=dict)


def devices_of(placement: Placement) -> tuple[str, ...]:
    """The devices of ``placement``'s shares, in order."""
    return tuple(share.device for share in placement.shares)


class Traffic:
    """The requests of one run (module doc). ``seeds``: one ``SeedSequence`` per app of the trace, in arrival
    order; ``nodes``: where a request's device busy time is metered."""

    def __init__(self, engine: Engine, cluster: Cluster, policing: Policing, horizon_s: float,
                 seeds: list[np.random.SeedSequence], nodes: Nodes) -> None:
        self.engine, self.cluster, self.policing, self.horizon_s = engine, cluster, policing, horizon_s
        self.seeds, self.nodes = seeds, nodes
        self.apps: dict[str, AppRun] = {}
        self.runs: list[AppRun | None] = [None] * len(seeds)  # by app index (None: rejected or not yet arrived)
        self.order: list[str] = []  # admitted apps, in admission order
        self.models: dict[str, int] = {}
        self.served: dict[str, int] = {}  # device path -> requests sent to it
        self.stations: dict[str, Station] = {}
        # per request, indexed by request id (stations read service/model/switch/app/cpu by id)
        self.r_app: list[int] = []
        self.r_arrive: list[float] = []  # ms
        self.r_done: list[float] = []  # ms, nan until answered (and for refused and lost requests)
        self.r_refused: list[bool] = []
        self.r_service: list[float] = []
        self.r_model: list[int] = []
        self.r_switch: list[float] = []
        self.r_cpu: list[float] = []
        self.r_network: list[float] = []
        self.r_route: list[Route | None] = []  # None until sent (the device after a CPU stage is its route's)
        self.lost: set[int] = set()  # requests a node failure took
        self.failed_s: dict[str, float] = {}  # failed node -> when (s)
        self.in_flight_lost: dict[str, int] = {}  # failed node -> requests it held then
        self.routed_lost: dict[str, int] = {}  # failed node -> requests routed there afterwards

    # ------------------------------------------------------------------------------------------ placements

    def station(self, path: str) -> Station:
        st = self.stations.get(path)
        if st is not None:
            return st
        device = self.cluster.devices[path]
        if traits(device.discipline).batches:
            raise ValueError(f"device {path!r}: the cluster simulator does not simulate batch devices "
                             "(batching needs requests numbered in device-arrival order)")
        st = station_for(self.engine, self.done, device.discipline, servers=device.servers, service=self.r_service,
                         model=self.r_model, switch=self.r_switch, tenant=self.r_app, n_tenants=len(self.runs))
        self.stations[path] = st
        return st

    def routes(self, run: AppRun, placement: Placement, catalog: Catalog) -> list[Route]:
        """The routes of ``placement``: one per share, with the app's CPU stage (on the placement's node) in
        front of each device when it has one."""
        cpu: LimitedPsStation | None = None
        routes = []
        upto = 0.0
        for share in placement.shares:
            profile = catalog.get(share.profile)
            tenant = tenant_for(run.app, profile, share.weight, share.fraction, share.instances,
                                serving_ms=self.cluster.devices[share.device].serving_ms)
            device = self.station(share.device)
            if isinstance(device, SpatialStation):
                # from now on the app's requests here run on its instances at their share; requests the
                # old instances hold finish there (Overlapped-Execution: they served until this switch)
                device.set_instances(run.index, share.instances)
            entry = device.arrive
            if tenant.cpu is not None:
                if cpu is None:  # one CPU stage for the app, whatever device a request goes to next
                    cpu = LimitedPsStation(self.engine, self.to_device, self.r_cpu, capacity=tenant.cpu.cores)
                entry = cpu.arrive
            upto += share.weight
            routes.append(Route(upto, share.device, entry, device.arrive,
                                self.models.setdefault(tenant.cache_key, len(self.models)), tenant.switch_ms,
                                self.service_draws(run, share.profile, tenant.service), tenant.network_ms,
                                run.app.cpu_ms, self.cluster.devices[share.device].node,
                                placement.cpu_node if tenant.cpu is not None else None))
        routes[-1].upto = math.inf  # weights sum to 1 up to rounding: the last share takes the rest
        return routes

    def service_draws(self, run: AppRun, profile: str, dist: Distribution) -> Draws:
        draws = run.services.get(profile)
        if draws is None:
            draws = run.services[profile] = Draws(lambda n: dist.sample(run.service_rng, n))
        return draws

    def admit(self, index: int, app: App, placement: Placement, now_s: float, catalog: Catalog) -> None:
        """``app`` (the trace's ``index``-th arrival: its seeds) is admitted at ``placement`` at ``now_s``
        (s) and starts sending at its contract."""
        arrival_rng, service_rng, route_rng = (np.random.default_rng(s) for s in self.seeds[index].spawn(3))
        periodic = app.periodic
        run = AppRun(
            index=index, app=app, rate_rps=app.rate_rps,
            arrivals=Draws(arrival_rng.random if periodic else arrival_rng.standard_exponential),
            service_rng=service_rng, route_u=Draws(route_rng.random), routes=[],
            bucket=self.bucket(app, app.rate_rps, now_s, None), admitted_s=now_s,
            devices=[(now_s, devices_of(placement))], contracts=[(now_s, app.rate_rps)])
        run.routes = self.routes(run, placement, catalog)
        self.apps[app.name] = run
        self.runs[index] = run
        self.order.append(app.name)
        now = now_s * 1000.0
        if periodic:  # a camera's first frame comes at a random phase within one period
            self.schedule_at(run, now + run.arrivals.next() * 1000.0 / app.rate_rps)
        else:
            self.schedule_next(run, now)

    def bucket(self, app: App, contract_rps: float, now_s: float, old: Bucket | None) -> Bucket | None:
        if not self.policing.enabled:
            return None
        rate, burst = self.policing.contract(contract_rps, app.burst)
        return Bucket.full(rate, burst, now_s) if old is None else old.reconfigured(rate, burst, now_s)

    def leave(self, name: str, now_s: float) -> None:
        """``name`` stops sending at ``now_s`` (s); a switch of it still pending is void."""
        run = self.apps.get(name)
        if run is not None:
            run.left_s = now_s
            run.generation += 1
            self.cancel_next(run)

    def set_rate(self, name: str, rate_rps: float, now: float) -> None:
        """From ``now`` (ms) on ``name`` sends ``rate_rps`` (req/s)."""
        run = self.apps.get(name)
        if run is not None:
            run.rate_rps = rate_rps
            # Poisson arrivals are memoryless: a fresh gap at the new rate from now is exact
            self.cancel_next(run)
            self.schedule_next(run, now)

    def switch_at(self, serve_s: float, app: App, placement: Placement, catalog: Catalog) -> None:
        """``app`` (at its new contract) is served at ``placement`` from ``serve_s`` (s, now or later: an
        event either way, after the one running), unless it leaves or switches again before."""
        run = self.apps.get(app.name)
        if run is not None:
            run.generation += 1
            self.engine.schedule(serve_s * 1000.0, PRIO_ARRIVAL, self.switch,
                                 (run, run.generation, app, placement, catalog))

    def place_now(self, now: float, app: App, placement: Placement, catalog: Catalog) -> None:
        """``app`` is served at ``placement`` from ``now`` (ms) on, at once (an offline plan's re-placement)."""
        run = self.apps.get(app.name)
        if run is not None:
            run.generation += 1
            self.switch(now, (run, run.generation, app, placement, catalog))

    def switch(self, now: float, data: tuple[AppRun, int, App, Placement, Catalog]) -> None:
        """The new placement of a transition serves from now (its model is loaded), at the new contract."""
        run, generation, app, placement, catalog = data
        if generation != run.generation:  # the app left or moved again meanwhile
            return
        now_s = now / 1000.0
        run.app = app
        run.routes = self.routes(run, placement, catalog)
        run.bucket = self.bucket(app, app.rate_rps, now_s, run.bucket)
        run.devices.append((now_s, devices_of(placement)))
        run.contracts.append((now_s, app.rate_rps))

    def cancel_next(self, run: AppRun) -> None:
        if run.next_arrival is not None:
            self.engine.cancel(run.next_arrival)
            run.next_arrival = None

    def schedule_next(self, run: AppRun, now: float) -> None:
        """The app's next request after ``now`` (ms), if it sends and it comes before the horizon."""
        rate = run.rate_rps
        if rate <= 0:
            return
        gap_ms = 1000.0 / rate if run.app.periodic else run.arrivals.next() * 1000.0 / rate
        self.schedule_at(run, now + gap_ms)

    def schedule_at(self, run: AppRun, t: float) -> None:
        """The app's next request at ``t`` (ms), unless that is past the horizon (arrivals stop there)."""
        if t < self.horizon_s * 1000.0:
            run.next_arrival = self.engine.schedule(t, PRIO_ARRIVAL, self.request, run)
        else:
            run.next_arrival = None

    # --------------------------------------------------------------------------------------------- requests

    def request(self, now: float, run: AppRun) -> None:
        req = len(self.r_app)
        self.r_app.append(run.index)
        self.r_arrive.append(now)
        self.r_done.append(math.nan)
        self.r_service.append(0.0)
        self.r_model.append(0)
        self.r_switch.append(0.0)
        self.r_cpu.append(0.0)
        self.r_network.append(0.0)
        self.r_route.append(None)
        run.requests.append(req)
        self.schedule_next(run, now)
        wait_s = 0.0
        if run.bucket is not None:
            admission, run.bucket = run.bucket.admit(now / 1000.0, self.policing.max_wait_s)
            if not admission.admitted:
                self.r_refused.append(True)
                return
            wait_s = admission.wait_s
        self.r_refused.append(False)
        if wait_s > 0.0:
            self.engine.schedule(now + wait_s * 1000.0, PRIO_ARRIVAL, self.send, req)
        else:
            self.send(now, req)

    def send(self, now: float, req: int) -> None:
        """Route ``req`` by the placement serving now and hand it to its first station."""
        run = self.runs[self.r_app[req]]
        assert run is not None  # only admitted apps send
        routes = run.routes
        route = routes[0]
        if len(routes) > 1:
            u = run.route_u.next()
            route = next(r for r in routes if u < r.upto)
        self.r_route[req] = route
        if self.failed_s:
            node = self.down(route)
            if node is not None:  # a failed node answers nothing
                self.lost.add(req)
                self.routed_lost[node] += 1
                return
        self.r_service[req] = route.service.next()
        self.r_model[req] = route.model
        self.r_switch[req] = route.switch_ms
        self.r_cpu[req] = route.cpu_ms
        self.r_network[req] = route.network_ms
        self.served[route.path] = self.served.get(route.path, 0) + 1
        if self.nodes.power is not None:  # the device's busy time, counted in the meter interval it is sent
            self.nodes.busy(route.path, run.app.name, self.r_service[req])
        route.entry(now, req)

    def to_device(self, now: float, req: int) -> None:
        """A request leaving its app's CPU stage goes on to the device its route chose."""
        route = self.r_route[req]
        assert route is not None  # set by send
        if self.failed_s:
            if req in self.lost:  # its device's node failed meanwhile
                return
            cpu_node = route.cpu_node
            if cpu_node is not None and cpu_node in self.failed_s:  # its CPU stage's node failed while it was there
                self.lost.add(req)
                self.in_flight_lost[cpu_node] += 1
                return
        route.device(now, req)

    def done(self, now: float, req: int) -> None:
        if self.lost and req in self.lost:  # its device's node failed while it held it: never answered
            return
        self.r_done[req] = now

    def down(self, route: Route) -> str | None:
        """The failed node ``route`` passes through (its device's or its CPU stage's), None if neither failed."""
        for node in (route.node, route.cpu_node):
            if node in self.failed_s:
                return node
        return None

    def fail(self, node: str, now: float) -> None:
        """``node`` fails at ``now`` (ms): every request on its devices is lost now; one in a CPU stage there
        (bound for a device elsewhere) is lost when that stage would have passed it on (``to_device``), and
        counted with these."""
        in_flight = 0
        for req, route in enumerate(self.r_route):
            if route is None or req in self.lost or not math.isnan(self.r_done[req]):
                continue
            if route.node == node:
                self.lost.add(req)
                in_flight += 1
        self.failed_s[node] = now / 1000.0
        self.in_flight_lost[node] = in_flight
        self.routed_lost[node] = 0

    def failures(self) -> tuple[NodeFailure, ...]:
        """The failed nodes, in time order, with the requests each lost."""
        return tuple(NodeFailure(n, t, self.in_flight_lost[n], self.routed_lost[n]) for n, t in self.failed_s.items())

    # ------------------------------------------------------------------------------------------ the monitor

    def window(self, name: str, start_s: float, end_s: float, now: float) -> AppWindow:
        """What the monitor sees of ``name`` at ``now`` (ms) for ``[start_s, end_s)``: arrivals, refusals,
        failures and the latencies of the requests answered by now (``sim.cluster``'s module doc)."""
        run = self.apps[name]
        reqs = run.requests
        k = run.window_cursor
        end_ms = end_s * 1000.0
        arrivals = refused = failed = 0
        lost = self.lost
        lat: list[float] = []
        while k < len(reqs) and self.r_arrive[reqs[k]] < end_ms:
            r = reqs[k]
            arrivals += 1
            if self.r_refused[r]:
                refused += 1
            elif lost and r in lost:
                failed += 1
            elif self.r_done[r] <= now:  # False for nan: not answered yet
                lat.append(self.r_done[r] - self.r_arrive[r] + self.r_network[r])
            k += 1
        run.window_cursor = k
        return AppWindow(name, start_s, end_s, arrivals, refused, failed, LatencySummary.of(lat))

    # ---------------------------------------------------------------------------------------------- results

    def outcome(self, window_s: float, horizon_s: float) -> tuple[list[WindowRow], list[AppTotals]]:
        """Every admitted app's rows (windows of ``window_s`` s, by arrival time, from every request's final
        outcome) and totals, in admission order."""
        arrive = np.asarray(self.r_arrive) / 1000.0
        lat = np.asarray(self.r_done) - np.asarray(self.r_arrive) + np.asarray(self.r_network)  # ms, nan: none
        refused = np.asarray(self.r_refused, dtype=bool)
        lost = np.zeros(len(self.r_app), dtype=bool)
        lost[list(self.lost)] = True
        rows: list[WindowRow] = []
        totals: list[AppTotals] = []
        for name in self.order:
            run = self.apps[name]
            idx = np.asarray(run.requests, dtype=np.intp)
            a, x, rf = arrive[idx], lat[idx], refused[idx]
            slo = run.app.slo.latency_ms
            answered = ~np.isnan(x)
            within = answered & (np.nan_to_num(x, nan=np.inf) <= slo)
            totals.append(AppTotals(name, int(idx.size), int(rf.sum()), int(answered.sum()), int(within.sum()),
                                    int(lost[idx].sum())))
            end_s = run.left_s if run.left_s is not None else horizon_s
            first = math.floor(run.admitted_s / window_s + 1e-9)
            last = max(first + 1, math.ceil(end_s / window_s - 1e-9))
            # an app's requests are recorded in arrival order, so each window is a slice of them
            which = np.floor(a / window_s + 1e-12).astype(np.int64)
            cuts = np.searchsorted(which, np.arange(first, last + 1), side="left")
            for k, lo, hi in zip(range(first, last), cuts[:-1], cuts[1:]):
                ok = answered[lo:hi]
                xs = x[lo:hi][ok]
                t0, t1 = k * window_s, (k + 1) * window_s
                stats = (float(xs.mean()), *(float(v) for v in np.percentile(xs, [95.0, 99.0]))) if xs.size \
                    else (None, None, None)
                rows.append(WindowRow(t0, t1, name, int(hi - lo), int(rf[lo:hi].sum()), int(xs.size),
                                      int(within[lo:hi].sum()), stats[0], stats[1], stats[2],
                                      float(hi - lo) / window_s, _at(run.contracts, t1), _at(run.devices, t1)))
        return rows, totals


def _at(history: list[tuple[float, Any]], t_s: float) -> Any:
    """The value of a step history ``[(from time s, value), ...]`` just before ``t_s`` (the first value
    before the history starts)."""
    value = history[0][1]
    for since, v in history:
        if since >= t_s:
            break
        value = v
    return value
