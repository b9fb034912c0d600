"""MVSP interference and network latency (Bensalem et al., paper 001, Eq. 2, 3 and 14).

MVSP does not model queues: it assumes the inference latency of a model variant grows *linearly* with the
latency of what is co-located with it, through interference coefficients alpha measured (or assumed,
0.1 in the paper's evaluation) per variant. The communication latency is the sum of per-link delays along
the shortest path between the IoT node and the edge node.

Units: ms. Pure functions.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable, Iterable, Mapping, Sequence

__all__ = [
    "colocated_latency",
    "replicated_latency",
    "path_latency",
    "shortest_path_latency",
    "average_latency",
]


def _nonneg(name: str, x: float) -> None:
    if not (x >= 0 and math.isfinite(x)):
        raise ValueError(f"{name} must be a finite number >= 0, got {x}")


def colocated_latency(alone_ms: float, others: Iterable[tuple[float, float]]) -> float:
    """MVSP Eq. 14: ``L_mv1^{mv2..mvK} = L_mv1 + sum_{k>=2} alpha_k L_mvk`` (ms).

    ``alone_ms`` is the latency of variant mv1 running exclusively on the device; ``others`` gives, for
    each co-located variant k, ``(alpha_k, L_mvk)``: the interference coefficient of mv1 in presence of k
    (dimensionless) and k's exclusive latency (ms).
    """
    _nonneg("latency", alone_ms)
    total = alone_ms
    for alpha, lat in others:
        _nonneg("interference coefficient", alpha)
        _nonneg("latency", lat)
        total += alpha * lat
    return total


def replicated_latency(alone_ms: float, alpha: float, replicas: int,
                       others: Iterable[tuple[float, float, int]] = ()) -> float:
    """MVSP Eq. 3: ``IL = L + alpha L (n - 1) + sum_{m'v' != mv} alpha' L' n'`` (ms).

    ``alone_ms`` = L (the variant alone on the node), ``alpha`` its interference coefficient, ``replicas``
    = n its instances on the node (>= 1); ``others`` gives ``(alpha', L', n')`` for every other variant
    deployed there (coefficient, exclusive latency in ms, instances).
    """
    _nonneg("latency", alone_ms)
    _nonneg("interference coefficient", alpha)
    if replicas < 1:
        raise ValueError(f"a deployed variant has at least one replica, got {replicas}")
    total = alone_ms + alpha * alone_ms * (replicas - 1)
    for a, lat, n in others:
        _nonneg("interference coefficient", a)
        _nonneg("latency", lat)
        if n < 0:
            raise ValueError(f"instance count must be >= 0, got {n}")
        total += a * lat * n
    return total


def path_latency(link_delays_ms: Iterable[float]) -> float:
    """MVSP Eq. 2: ``CL_i^e = sum_{l in P_ie} d_l`` (ms), the delays of the links on the path."""
    total = 0.0
    for d in link_delays_ms:
        _nonneg("link delay", d)
        total += d
    return total


def shortest_path_latency(links: Mapping[tuple[Hashable, Hashable], float], src: Hashable, dst: Hashable, *,
                          round_trip: bool = True, directed: bool = False) -> float:
    """MVSP Eq. 2 on a topology: the delay (ms) of the minimum-delay path from ``src`` to ``dst``.

    ``links`` maps ``(u, v)`` to the link's mean delay ``d_l`` (ms); undirected unless ``directed``.
    MVSP counts the path "in both directions (sending request and receiving response)": with
    ``round_trip`` the path back from ``dst`` to ``src`` is added (twice the one-way delay on an undirected
    graph). ``math.inf`` when ``dst`` is unreachable. Dijkstra's algorithm.
    """
    adj: dict[Hashable, list[tuple[Hashable, float]]] = {}
    for (u, v), d in links.items():
        _nonneg("link delay", d)
        adj.setdefault(u, []).append((v, d))
        if not directed:
            adj.setdefault(v, []).append((u, d))

    def one_way(a: Hashable, b: Hashable) -> float:
        if a == b:
            return 0.0
        dist = {a: 0.0}
        heap: list[tuple[float, int, Hashable]] = [(0.0, 0, a)]
        tie = 1
        while heap:
            du, _, u = heapq.heappop(heap)
            if u == b:
                return du
            if du > dist.get(u, math.inf):
                continue
            for v, d in adj.get(u, ()):
                nd = du + d
                if nd < dist.get(v, math.inf):
                    dist[v] = nd
                    heapq.heappush(heap, (nd, tie, v))
                    tie += 1
        return math.inf

    there = one_way(src, dst)
    if not round_trip:
        return there
    return there + one_way(dst, src)


def average_latency(rates: Sequence[float], latencies_ms: Sequence[float]) -> float:
    """MVSP Eq. 1: the request-weighted average latency ``sum r (CL + IL) / sum r`` (ms), given each
    assignment's request rate and its ``CL + IL`` (ms). 0.0 without requests."""
    if len(rates) != len(latencies_ms):
        raise ValueError("need one latency per request rate")
    total = math.fsum(rates)
    if total <= 0:
        return 0.0
    return math.fsum(r * lat for r, lat in zip(rates, latencies_ms)) / total
