"""A discipline is a value: every per-discipline table covers every member of ``Discipline``, the rows
agree with one another, and the code outside the tables reads them instead of naming disciplines."""

from __future__ import annotations

import ast
import math
from pathlib import Path
from typing import Any

import pytest

from edgemux.cluster.disciplines import DEFAULT_DISCIPLINE, TRAITS, capacity, traits
from edgemux.cluster.state import Device
from edgemux.cluster.workload import Arrival, DeviceSpec, Discipline, Tenant
from edgemux.perf.device import device_utilization
from edgemux.perf.estimators import ESTIMATORS
from edgemux.perf.paper_forms import PAPER_FORMS
from edgemux.profiles.distributions import Deterministic
from edgemux.profiles.types import DeviceKind
from edgemux.runtime.dataplane.queues import QUEUES
from edgemux.sim.devices import STATIONS, Station, station_for
from edgemux.sim.engine import PRIO_ARRIVAL, Engine

SRC = Path(__file__).resolve().parent.parent / "src" / "edgemux"

TABLES: dict[str, dict[Any, Any]] = {
    "cluster.disciplines.TRAITS": TRAITS,
    "perf.estimators.ESTIMATORS": ESTIMATORS,
    "perf.paper_forms.PAPER_FORMS": PAPER_FORMS,
    "sim.devices.STATIONS": STATIONS,
    "runtime.dataplane.queues.QUEUES": QUEUES,
}

# The modules whose job is a per-discipline table (and the enum's own): naming disciplines is what they do.
TABLE_MODULES = {
    "cluster/workload.py",
    "cluster/disciplines.py",
    "perf/estimators.py",
    "perf/paper_forms.py",
    "sim/devices.py",
    "runtime/dataplane/queues.py",
}
MAX_BRANCHES = 10   # issue 33: at most 10 left outside the tables (65 before)


@pytest.mark.parametrize("name", sorted(TABLES))
def test_every_table_has_a_row_for_every_discipline(name: str) -> None:
    table = TABLES[name]
    missing = [d.value for d in Discipline if d not in table]
    assert not missing, f"{name} has no row for {missing}"
    assert set(table) == set(Discipline), f"{name} has keys that are not disciplines"


def test_rows_say_which_discipline_they_are() -> None:
    for d in Discipline:
        assert TRAITS[d].discipline is d and traits(d) is TRAITS[d]
        assert ESTIMATORS[d].discipline is d


def test_every_device_kind_has_a_default_discipline() -> None:
    assert set(DEFAULT_DISCIPLINE) == set(DeviceKind)


def _station(d: Discipline) -> Station:
    return station_for(Engine(), lambda now, req: None, d, servers=2.0, service=[], model=[], switch=[], tenant=[],
                       n_tenants=1, arrival=[], laws=[None], n_models=1)


def test_each_queue_mirrors_the_station_of_its_discipline() -> None:
    for d in Discipline:
        assert type(_station(d)) is QUEUES[d].station, d.value


def test_capacity_is_the_servers_only_where_the_discipline_offers_several() -> None:
    for d in Discipline:
        got = capacity(Device("n", "d", DeviceKind.GPU_DISCRETE, d, 100.0, servers=2.5))
        assert got == (2.5 if d is Discipline.MPS else 1.0), d.value


def test_shares_means_additive_utilization_in_the_estimator() -> None:
    ts = [Tenant("a", "m", Arrival.poisson(100.0), Deterministic(2.0)),
          Tenant("b", "n", Arrival.poisson(50.0), Deterministic(4.0))]
    for d in Discipline:
        spec = DeviceSpec("x", DeviceKind.GPU_DISCRETE, d, servers=2.0 if TRAITS[d].multi_server else 1.0)
        work = math.fsum(t.rate_rps / 1000.0 * t.service.mean for t in ts)
        if TRAITS[d].shares:
            assert device_utilization(spec, ts) == pytest.approx(work / capacity(spec)), d.value


@pytest.mark.parametrize("d", list(Discipline), ids=lambda d: d.value)
def test_pays_switch_is_what_the_station_charges(d: Discipline) -> None:
    """Two tenants of different models, requests far apart (no queueing): a request takes its 1 ms, plus the
    5 ms switch exactly where the discipline ``pays_switch``."""
    arrivals = [0.0, 100.0, 200.0]
    tenant = [0, 1, 0]
    done: dict[int, float] = {}
    eng = Engine()
    st = station_for(eng, lambda now, req: done.__setitem__(req, now), d, servers=1.0, service=[1.0] * 3,
                     model=tenant, switch=[5.0] * 3, tenant=tenant, n_tenants=2, arrival=arrivals,
                     laws=[None, None], n_models=2)
    for i, t in enumerate(arrivals):
        eng.schedule(t, PRIO_ARRIVAL, st.arrive, i)
    eng.run()
    want = 6.0 if TRAITS[d].pays_switch else 1.0
    assert [done[i] - arrivals[i] for i in range(3)] == [want] * 3


# ------------------------------------------------------------------------------- branches outside the tables


def _branches(root: Path = SRC) -> list[str]:
    """Every ``Discipline.X`` under ``root`` outside the table modules, except as an argument of a call
    (constructing a device with a discipline decides nothing): comparisons, ``in`` tuples, dict keys and match
    cases."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in TABLE_MODULES:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                parents[child] = node
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id == "Discipline" and node.attr in Discipline.__members__):
                continue
            parent = parents.get(node)
            if isinstance(parent, ast.keyword) or (isinstance(parent, ast.Call) and node in parent.args):
                continue
            out.append(f"{rel}:{node.lineno} Discipline.{node.attr}")
    return out


def test_few_branches_on_the_discipline_remain_outside_the_tables() -> None:
    found = _branches()
    assert len(found) <= MAX_BRANCHES, "branches on Discipline outside the tables:\n" + "\n".join(found)


def test_the_branch_count_sees_a_branch(tmp_path: Path) -> None:
    """The counter is not blind: a comparison, an ``in`` tuple and a dict key count; a constructor's argument
    does not."""
    (tmp_path / "m.py").write_text(
        "from edgemux.cluster.workload import Discipline, DeviceSpec\n"
        "def f(d):\n"
        "    if d.discipline is Discipline.MPS or d.discipline in (Discipline.PS, Discipline.FCFS):\n"
        "        return {Discipline.BATCH: 1}\n"
        "    return DeviceSpec('x', None, Discipline.FCFS), DeviceSpec('y', None, discipline=Discipline.PS)\n")
    found = sorted(b.split(" ")[1] for b in _branches(tmp_path))
    assert found == ["Discipline.BATCH", "Discipline.FCFS", "Discipline.MPS", "Discipline.PS"]


def test_the_mps_servers_expression_is_written_once() -> None:
    hits = [p.relative_to(SRC).as_posix() for p in SRC.rglob("*.py")
            if "servers if" in p.read_text(encoding="utf-8") and "MPS else" in p.read_text(encoding="utf-8")]
    assert hits == []
