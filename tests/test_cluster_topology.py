"""Topology: shortest-path communication latency (MVSP Eq. 2), validation, the MANIAC-like generator."""

from __future__ import annotations

import math

import networkx as nx
import pytest

from edgemux.cluster.topology import MVSP_LINK_DELAY_MS, Topology, maniac_like
from edgemux.errors import InputError


def test_shortest_paths_by_hand() -> None:
    # I1 - E1 (5), E1 - E2 (3), I1 - E2 (10), E2 - E3 (1): I1->E2 via E1 = 8 < 10, I1->E3 = 9
    t = Topology.from_links(["I1", "I2"], ["E1", "E2", "E3"],
                            [("I1", "E1", 5.0), ("E1", "E2", 3.0), ("I1", "E2", 10.0), ("E2", "E3", 1.0),
                             ("I2", "E3", 2.5)])
    cl = t.communication_ms()
    assert cl[("I1", "E1")] == pytest.approx(5.0)
    assert cl[("I1", "E2")] == pytest.approx(8.0)
    assert cl[("I1", "E3")] == pytest.approx(9.0)
    assert cl[("I2", "E3")] == pytest.approx(2.5)
    assert cl[("I2", "E1")] == pytest.approx(6.5)
    assert t.hops()[("I1", "E3")] == 3


def test_iot_nodes_do_not_relay_unless_asked() -> None:
    # I2 sits between I1 and E2: I1 reaches E2 only through I2
    links = [("I1", "E1", 1.0), ("I1", "I2", 1.0), ("I2", "E2", 1.0), ("E1", "E2", 50.0)]
    closed = Topology.from_links(["I1", "I2"], ["E1", "E2"], links).communication_ms()
    assert closed[("I1", "E2")] == pytest.approx(51.0)
    relayed = Topology.from_links(["I1", "I2"], ["E1", "E2"], links, iot_relays=True).communication_ms()
    assert relayed[("I1", "E2")] == pytest.approx(2.0)


def _networkx_reference(t: Topology) -> dict[tuple[str, str], float]:
    """What networkx's Dijkstra from each IoT node gives over the nodes its paths may use."""
    g = t.graph
    out = {}
    for i in t.iot_nodes:
        view = g if t.iot_relays else g.subgraph([i, *t.edge_nodes])
        for node, d in nx.single_source_dijkstra_path_length(view, i, weight="delay_ms").items():
            if g.nodes[node]["kind"] == "edge":
                out[(i, node)] = float(d)
    return out


@pytest.mark.parametrize("relays", [False, True])
def test_communication_equals_networkx_dijkstra_to_the_bit(relays: bool) -> None:
    for seed in range(6):
        base = maniac_like(25, 9, seed=seed, delay_dist="uniform" if seed % 2 else "exponential")
        t = Topology(base.graph, iot_relays=relays)
        assert t.communication_ms() == _networkx_reference(t)  # dict equality: same floats, same pairs


def test_zero_delay_links_are_links() -> None:
    t = Topology.from_links(["I1", "I2"], ["E1", "E2"], [("I1", "E1", 0.0), ("E1", "E2", 0.0), ("I2", "E2", 1.5)])
    assert t.communication_ms() == {("I1", "E1"): 0.0, ("I1", "E2"): 0.0, ("I2", "E2"): 1.5, ("I2", "E1"): 1.5}


def test_partly_reachable_pairs_are_absent() -> None:
    t = Topology.from_links(["I1"], ["E1", "E2"], [("I1", "E1", 4.0)])
    assert t.communication_ms() == {("I1", "E1"): 4.0}


def test_unreachable_iot_node_is_named() -> None:
    with pytest.raises(InputError, match="IoT node 'I9' reaches no edge node"):
        Topology.from_links(["I1", "I9"], ["E1"], [("I1", "E1", 4.0)])


@pytest.mark.parametrize("delay", [-1.0, math.nan, math.inf, None, "3"])
def test_bad_delay(delay: object) -> None:
    g = nx.Graph()
    g.add_node("I1", kind="iot")
    g.add_node("E1", kind="edge")
    if delay is None:
        g.add_edge("I1", "E1")
    else:
        g.add_edge("I1", "E1", delay_ms=delay)
    with pytest.raises(InputError, match="delay_ms"):
        Topology(g)


def test_unknown_kind_and_undeclared_node() -> None:
    g = nx.Graph()
    g.add_node("X", kind="router")
    with pytest.raises(InputError, match="must be 'iot' or 'edge'"):
        Topology(g)
    with pytest.raises(InputError, match="undeclared node 'E7'"):
        Topology.from_links(["I1"], ["E1"], [("I1", "E7", 1.0)])
    with pytest.raises(InputError, match="at least one edge node"):
        Topology.from_links(["I1"], [], [])


def test_maniac_like_is_deterministic_and_connected() -> None:
    a = maniac_like(10, 5, seed=7)
    b = maniac_like(10, 5, seed=7)
    c = maniac_like(10, 5, seed=8)
    assert a.communication_ms() == b.communication_ms()
    assert a.communication_ms() != c.communication_ms()
    for t in (a, c, maniac_like(11, 4, seed=3), maniac_like(30, 12, seed=1, delay_dist="uniform")):
        g = t.graph
        assert nx.is_connected(g.subgraph(t.edge_nodes))
        cl = t.communication_ms()
        # the edge mesh is connected, so every IoT node reaches every edge node
        assert set(cl) == {(i, e) for i in t.iot_nodes for e in t.edge_nodes}
        for i in t.iot_nodes:
            assert 1 <= g.degree(i) <= 2
            assert all(g.nodes[nb]["kind"] == "edge" for nb in g.neighbors(i))
    assert maniac_like(10, 5, seed=7).iot_nodes == tuple(f"I{k}" for k in range(1, 11))


def test_maniac_like_mean_delay() -> None:
    delays = [d for s in range(20) for _, _, d in maniac_like(20, 8, seed=s).graph.edges(data="delay_ms")]
    mean = sum(delays) / len(delays)
    # ~ 1000 exponential draws: the sample mean is within 10% of 12.23 ms with overwhelming probability
    assert mean == pytest.approx(MVSP_LINK_DELAY_MS, rel=0.1)
    uni = [d for s in range(5) for _, _, d in maniac_like(20, 8, seed=s, delay_dist="uniform").graph.edges(data="delay_ms")]
    assert max(uni) <= 2 * MVSP_LINK_DELAY_MS


def test_link_delay_matches_catalog() -> None:
    from edgemux.profiles.catalog import load_builtin_catalog
    assert load_builtin_catalog().constant("mvsp.link_delay_ms").value == MVSP_LINK_DELAY_MS


def test_maniac_like_bad_input() -> None:
    with pytest.raises(InputError, match="n_edge"):
        maniac_like(3, 0, seed=1)
    with pytest.raises(InputError, match="delay_dist"):
        maniac_like(3, 2, seed=1, delay_dist="pareto")
    with pytest.raises(InputError, match="mean_delay_ms"):
        maniac_like(3, 2, seed=1, mean_delay_ms=-1.0)
