"""Network topology of IoT and edge nodes, and the communication latency ``CL`` between them (MVSP Eq. 2).

A ``Topology`` wraps an undirected ``networkx.Graph``: every node carries ``kind`` ("iot" or "edge"), every
link ``delay_ms`` (>= 0). ``communication_ms()`` gives, for each (IoT node, edge node) pair that can reach
each other, the sum of link delays along the shortest path (Dijkstra on ``delay_ms``).

Round trip and the mean link delay: MVSP (paper 001, §II-B) defines ``CL_i^e`` as "the sum of the delay on
each link in the shortest path in both directions", with a mean link delay of 12.23 ms taken from the MANIAC
ad hoc network (§III; constants.yaml key ``mvsp.link_delay_ms``). Read literally, a one-hop IoT node would
see 2 x 12.23 = 24.5 ms of communication alone, yet Table III reports mean round trips of 13.4 ms (P2,
communication plus inference). So each link's ``delay_ms`` here is its *round-trip* contribution (the 12.23
ms mean is per link and both directions), and ``CL`` is the plain sum over the path's links.

IoT nodes are endpoints: paths relay through edge nodes only (IoT devices "do not have enough capability
to run DNN models", §II, and we do not let them forward others' traffic), unless ``iot_relays=True``.

Units: ms. Pure apart from the seeded generator ``maniac_like``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import networkx as nx
import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import dijkstra

from edgemux.errors import InputError

__all__ = ["Topology", "maniac_like", "MVSP_LINK_DELAY_MS"]

# MVSP paper 001 §III (extraction line 169), from its reference [15] (MANIAC): mean link delay 12.23 ms.
# The same number is the catalog constant ``mvsp.link_delay_ms``; tests check that they agree.
MVSP_LINK_DELAY_MS = 12.23

_KINDS = ("iot", "edge")


class Topology:
    """IoT and edge nodes linked by delays (ms). ``graph`` is copied; its nodes need ``kind`` in
    {"iot", "edge"} and its links ``delay_ms`` >= 0. ``iot_relays``: whether shortest paths may pass
    through other IoT nodes (default no: only edge nodes forward).

    Raises ``InputError`` on an unknown node kind, a missing/negative/non-finite link delay, no edge node,
    or an IoT node that reaches no edge node (naming it)."""

    def __init__(self, graph: nx.Graph, *, iot_relays: bool = False) -> None:
        if graph.is_directed() or graph.is_multigraph():
            raise InputError("topology", "the graph must be undirected and simple (networkx.Graph)")
        g = nx.Graph()
        for node, attrs in graph.nodes(data=True):
            kind = attrs.get("kind")
            if kind not in _KINDS:
                raise InputError(f"topology.nodes[{node}].kind", f"must be 'iot' or 'edge', got {kind!r}")
            g.add_node(node, **attrs)
        for a, b, attrs in graph.edges(data=True):
            if a == b:
                raise InputError(f"topology.links[{a}-{b}]", "a link must join two different nodes")
            d = attrs.get("delay_ms")
            if d is None or isinstance(d, bool) or not isinstance(d, (int, float)) or not math.isfinite(d) or d < 0:
                raise InputError(f"topology.links[{a}-{b}].delay_ms", f"must be a finite number >= 0 ms, got {d!r}")
            g.add_edge(a, b, **{**attrs, "delay_ms": float(d)})
        self._graph = g
        self.iot_relays = iot_relays
        self.iot_nodes: tuple[str, ...] = tuple(n for n, k in g.nodes(data="kind") if k == "iot")
        self.edge_nodes: tuple[str, ...] = tuple(n for n, k in g.nodes(data="kind") if k == "edge")
        if not self.edge_nodes:
            raise InputError("topology", "needs at least one edge node")
        self._cl = self._shortest()
        for i in self.iot_nodes:
            if not any((i, e) in self._cl for e in self.edge_nodes):
                raise InputError(f"topology.nodes[{i}]", f"IoT node '{i}' reaches no edge node")

    @classmethod
    def from_links(cls, iot: Iterable[str], edges: Iterable[str], links: Iterable[tuple[str, str, float]],
                   *, iot_relays: bool = False) -> Topology:
        """Build from node names and ``(a, b, delay_ms)`` links; a link naming an undeclared node is an error."""
        g = nx.Graph()
        for n in iot:
            g.add_node(n, kind="iot")
        for n in edges:
            if n in g:
                raise InputError(f"topology.nodes[{n}]", "declared both as an IoT node and an edge node")
            g.add_node(n, kind="edge")
        for a, b, d in links:
            for end in (a, b):
                if end not in g:
                    raise InputError(f"topology.links[{a}-{b}]", f"names undeclared node '{end}'")
            if g.has_edge(a, b):
                raise InputError(f"topology.links[{a}-{b}]", "link given twice")
            g.add_edge(a, b, delay_ms=d)
        return cls(g, iot_relays=iot_relays)

    @property
    def graph(self) -> nx.Graph:
        """A copy of the validated graph (mutating it does not change this topology)."""
        return self._graph.copy()

    def _view(self, iot: str) -> nx.Graph:
        """The graph IoT node ``iot``'s paths may use: without the other IoT nodes unless they relay."""
        g = self._graph
        if self.iot_relays:
            return g
        return nx.subgraph_view(g, filter_node=lambda n: n == iot or g.nodes[n]["kind"] == "edge")

    def _shortest(self) -> dict[tuple[str, str], float]:
        """Shortest-path delays (ms) from every IoT node to every edge node it reaches: one scipy Dijkstra
        from all IoT nodes over a directed copy of the graph in which no arc enters an IoT node (unless IoT
        nodes relay), so a path touches an IoT node only at its source. scipy's C loop relaxes
        ``dist[u] + delay`` as networkx's per-source Dijkstra over ``_view`` did, so the figures are the same
        to the bit (tests/test_cluster_topology.py compares them), about 50 times faster on MVSP's sizes."""
        g = self._graph
        names = list(g.nodes)
        pos = {n: k for k, n in enumerate(names)}
        rows: list[int] = []
        cols: list[int] = []
        delay: list[float] = []
        for a, b, d in g.edges(data="delay_ms"):
            for u, v in ((a, b), (b, a)):
                if self.iot_relays or g.nodes[v]["kind"] == "edge":
                    rows.append(pos[u])
                    cols.append(pos[v])
                    delay.append(d)
        # explicit zeros stay arcs in a sparse csgraph (a 0 ms link is a link)
        arcs = csr_matrix((delay, (rows, cols)), shape=(len(names), len(names)))
        dist = dijkstra(arcs, directed=True, indices=[pos[i] for i in self.iot_nodes])
        out: dict[tuple[str, str], float] = {}
        for r, i in enumerate(self.iot_nodes):
            for e in self.edge_nodes:
                d = float(dist[r, pos[e]])
                if math.isfinite(d):
                    out[(i, e)] = d
        return out

    def communication_ms(self) -> dict[tuple[str, str], float]:
        """``CL^{ie}`` (Eq. 2) in ms for every (IoT node, edge node) pair joined by a path: the sum of the link
        delays on the shortest path; each link's ``delay_ms`` counts both directions (see the module
        docstring). Unreachable pairs are absent."""
        return dict(self._cl)

    def hops(self) -> dict[tuple[str, str], int]:
        """Number of links on the ``communication_ms`` shortest path of each reachable pair."""
        g = self._graph
        out: dict[tuple[str, str], int] = {}
        for i in self.iot_nodes:
            paths = nx.single_source_dijkstra_path(self._view(i), i, weight="delay_ms")
            for node, p in paths.items():
                if g.nodes[node]["kind"] == "edge":
                    out[(i, node)] = len(p) - 1
        return out


def maniac_like(n_iot: int, n_edge: int, *, seed: int, mean_delay_ms: float = MVSP_LINK_DELAY_MS,
                delay_dist: str = "exponential", mesh_radius: float = 0.45,
                second_link_prob: float = 0.5) -> Topology:
    """A seeded random connected topology in the spirit of MANIAC (the mobile ad hoc network MVSP's
    evaluation uses, paper 001 §III): nodes ``I1..In`` and ``E1..Em``.

    Edge nodes are points uniform in the unit square, linked as a random geometric graph (pairs closer than
    ``mesh_radius``) plus a Euclidean minimum spanning tree so the mesh is always connected. Each IoT node
    is a uniform point linked to its nearest edge node and, with probability ``second_link_prob``, also to
    the second nearest. Every link's delay (ms, round-trip contribution; see the module docstring) is drawn
    from ``delay_dist``: "exponential" with mean ``mean_delay_ms`` (MANIAC gives only the mean; an
    exponential is the maximum-entropy law for a positive delay of known mean) or "uniform" on
    [0, 2 * mean_delay_ms]. Same arguments, same topology."""
    for what, v in (("n_iot", n_iot), ("n_edge", n_edge)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise InputError(what, f"must be an integer >= 0, got {v!r}")
    if n_edge < 1:
        raise InputError("n_edge", "needs at least one edge node")
    if not (math.isfinite(mean_delay_ms) and mean_delay_ms >= 0):
        raise InputError("mean_delay_ms", f"must be >= 0 ms, got {mean_delay_ms}")
    if delay_dist not in ("exponential", "uniform"):
        raise InputError("delay_dist", f"must be 'exponential' or 'uniform', got {delay_dist!r}")
    if not (0.0 <= second_link_prob <= 1.0):
        raise InputError("second_link_prob", f"must be in [0, 1], got {second_link_prob}")
    if not (math.isfinite(mesh_radius) and mesh_radius >= 0):
        raise InputError("mesh_radius", f"must be >= 0, got {mesh_radius}")
    rng = np.random.default_rng(seed)

    def delay() -> float:
        if delay_dist == "exponential":
            return float(rng.exponential(mean_delay_ms))
        return float(rng.uniform(0.0, 2.0 * mean_delay_ms))

    edges = [f"E{k + 1}" for k in range(n_edge)]
    iots = [f"I{k + 1}" for k in range(n_iot)]
    epos = rng.uniform(0.0, 1.0, size=(n_edge, 2))
    ipos = rng.uniform(0.0, 1.0, size=(n_iot, 2))
    g = nx.Graph()
    for name in edges:
        g.add_node(name, kind="edge")
    for name in iots:
        g.add_node(name, kind="iot")
    full = nx.Graph()
    full.add_nodes_from(range(n_edge))
    for a in range(n_edge):
        for b in range(a + 1, n_edge):
            full.add_edge(a, b, dist=float(np.hypot(*(epos[a] - epos[b]))))
    mesh = {tuple(sorted(e)) for e in nx.minimum_spanning_edges(full, weight="dist", data=False)}
    mesh |= {(a, b) for a, b, d in full.edges(data="dist") if d < mesh_radius}
    for a, b in sorted(mesh):  # sorted: the draw order, hence the delays, depend only on the seed
        g.add_edge(edges[a], edges[b], delay_ms=delay())
    for k in range(n_iot):
        order = np.argsort(np.hypot(*(epos - ipos[k]).T), kind="stable")
        g.add_edge(iots[k], edges[int(order[0])], delay_ms=delay())
        if n_edge > 1 and rng.uniform() < second_link_prob:
            g.add_edge(iots[k], edges[int(order[1])], delay_ms=delay())
    return Topology(g)

