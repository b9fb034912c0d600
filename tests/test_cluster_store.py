"""The durable store (``edgemux.cluster.store``): round trips through a restart, failed admissions leave it
unchanged, reclamation unloads unused models, and a kill -9 during a stream of admissions loses nothing that
was committed and leaves nothing half-written."""

from __future__ import annotations

import os
import queue
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import EXAMPLES, REPO
from edgemux.cluster.specs import load_apps, load_cluster
from edgemux.cluster.state import App, Cluster, Device, Node, Placement, Share, Slo
from edgemux.cluster.store import SCHEMA_VERSION, Store, StoreError
from edgemux.cluster.workload import Discipline
from edgemux.errors import EdgemuxError
from edgemux.profiles.types import DeviceKind

CLUSTER = load_cluster(EXAMPLES / "cluster" / "cluster.yaml")
APPS = load_apps(EXAMPLES / "cluster" / "apps.yaml")


def _app(name: str, **kw) -> App:
    return App(name, kw.pop("model", "mobilenet_v2"), kw.pop("rate", 5.0), Slo(100.0, "p95"), **kw)


def _one(app: str, device: str, profile: str, cpu_node: str | None = None) -> Placement:
    return Placement(app, (Share(device, 1.0, profile),), cpu_node)


@pytest.fixture
def store(tmp_path: Path):
    s = Store.open(tmp_path / "edgemux.db")
    s.set_cluster(CLUSTER)
    yield s
    s.close()


def _populate(s: Store) -> dict[str, Placement]:
    """The example apps, one with workload partitioning and a CPU slot."""
    placements = {
        "cam-entrance": Placement("cam-entrance", (Share("node-1/tpu0", 0.6, "ibis-edgetpu/ssd_mobilenet_v2"),
                                                   Share("node-2/tpu0", 0.4, "microedge/ssd_mobilenet_v2"))),
        "cam-dock": _one("cam-dock", "node-2/tpu0", "microedge/bodypix"),
        "ar-overlay": _one("ar-overlay", "node-1/gpu0", "ibis-jetson-nano/resnet50", cpu_node="node-1"),
        "classify-shared": _one("classify-shared", "node-1/gpu0", "ibis-jetson-nano/mobilenet_v2"),
        "detect-people": _one("detect-people", "node-2/gpu0", "ibis-jetson-nano/yolov4_tiny"),
    }
    for a in APPS:
        s.admit(a, placements[a.name])
    return placements


def test_open_sets_wal_full_and_foreign_keys(store):
    c = store._conn
    assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert c.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert c.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert store.cluster() == CLUSTER and store.apps() == {} and store.placements() == {}
    assert issubclass(StoreError, EdgemuxError)


def test_round_trip_survives_restart(tmp_path):
    path = tmp_path / "s.db"
    with Store.open(path) as s:
        s.set_cluster(CLUSTER)
        placements = _populate(s)
        before = (s.cluster(), s.apps(), s.placements(), s.dump())
        assert s.loaded_models("node-1/gpu0") == {"ibis-jetson-nano/mobilenet_v2": 1, "ibis-jetson-nano/resnet50": 1}
        assert s.check() == []
    with Store.open(path) as s:
        assert (s.cluster(), s.apps(), s.placements(), s.dump()) == before
    assert list(before[1].values()) == APPS  # values and admission order
    assert before[2] == placements
    assert before[3]["cpu_slots"] == [("ar-overlay", "node-1", 1.0)]


def test_refcounts_and_reclamation(store):
    p = "ibis-edgetpu/mobilenet_v2"
    for n in ("a", "b", "c"):
        store.admit(_app(n, shared=True), _one(n, "node-1/tpu0", p))
    store.admit(_app("d"), Placement("d", (Share("node-1/tpu0", 0.5, "x"), Share("node-2/tpu0", 0.5, "x"))))
    assert store.loaded_models("node-1/tpu0") == {p: 3, "x": 1}
    assert store.loaded_models("node-2/tpu0") == {"x": 1}
    assert store.remove("a") == [] and store.loaded_models("node-1/tpu0") == {p: 2, "x": 1}
    assert store.remove("d") == [("node-1/tpu0", "x"), ("node-2/tpu0", "x")]
    assert store.loaded_models("node-2/tpu0") == {}
    store.remove("b")
    assert store.remove("c") == [("node-1/tpu0", p)]
    assert store.loaded_models("node-1/tpu0") == {} and store.apps() == {} and store.placements() == {}
    assert store.check() == []
    with pytest.raises(StoreError, match="unknown device"):
        store.loaded_models("node-9/tpu0")


def _bad_admissions():
    ok = _app("new")
    return {
        "duplicate name": (_app("cam-dock", model="bodypix"), _one("cam-dock", "node-1/tpu0", "x")),
        "unknown device": (ok, Placement("new", (Share("node-1/tpu0", 0.5, "x"), Share("node-3/tpu0", 0.5, "x")))),
        "unknown cpu node": (ok, _one("new", "node-1/tpu0", "x", cpu_node="node-7")),
        "placement of another app": (ok, _one("other", "node-1/tpu0", "x")),
    }


@pytest.mark.parametrize("case", list(_bad_admissions()))
def test_failed_admission_leaves_store_unchanged(store, case):
    _populate(store)
    before = store.dump()
    app, placement = _bad_admissions()[case]
    with pytest.raises(StoreError):
        store.admit(app, placement)
    assert store.dump() == before
    # and the store still works
    store.admit(_app("after"), _one("after", "node-1/tpu0", "ibis-edgetpu/ssd_mobilenet_v2"))
    assert store.loaded_models("node-1/tpu0")["ibis-edgetpu/ssd_mobilenet_v2"] == 2


def test_remove_unknown_app_is_refused(store):
    _populate(store)
    before = store.dump()
    with pytest.raises(StoreError, match="no app 'ghost'"):
        store.remove("ghost")
    assert store.dump() == before


def test_set_cluster_refuses_to_drop_used_devices(store):
    _populate(store)
    before = store.dump()
    node2_without_gpu = Node("node-2", 4, 4096, (CLUSTER.devices["node-2/tpu0"],))
    with pytest.raises(StoreError, match="node-2/gpu0.*detect-people"):
        store.set_cluster(Cluster((CLUSTER.nodes[0], node2_without_gpu)))
    with pytest.raises(StoreError, match="node-1.*ar-overlay"):
        store.set_cluster(Cluster((CLUSTER.nodes[1],)))
    assert store.dump() == before
    # removing an unused device, adding a node and resizing one are fine
    store.remove("detect-people")
    extra = Node("node-3", 8, 8192, (Device("node-3", "gpu0", DeviceKind.GPU_DISCRETE, Discipline.MPS, 16000,
                                            None, 2.0),))
    bigger = Node("node-1", 16, 8192, CLUSTER.nodes[0].devices)
    new = Cluster((bigger, node2_without_gpu, extra))
    store.set_cluster(new)
    assert store.cluster() == new and store.check() == []
    assert len(store.apps()) == 4


def test_schema_version_mismatch_is_refused(tmp_path):
    path = tmp_path / "s.db"
    Store.open(path).close()
    with sqlite3.connect(path) as c:
        c.execute("UPDATE schema_version SET version = 99")
    with pytest.raises(StoreError, match="schema version"):
        Store.open(path)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database" * 100)
    with pytest.raises(StoreError):
        Store.open(junk)


def test_a_nodes_serving_path_survives_a_restart_and_a_version_4_store_gets_none(tmp_path):
    """A node's serving path (ms) is kept with the node; a version-4 store (no such column) opens with 0 on
    every node and says the current version from then on."""
    path = tmp_path / "s.db"
    served = CLUSTER.with_serving({"node-1": 2.5})
    assert served.devices["node-1/tpu0"].serving_ms == 2.5 and served.node("node-2").serving_ms == 0.0
    with Store.open(path) as s:
        s.set_cluster(served)
    with Store.open(path) as s:
        assert s.cluster() == served
    with sqlite3.connect(path) as c:
        c.execute("ALTER TABLE nodes DROP COLUMN serving_ms")
        c.execute("UPDATE schema_version SET version = 4")
    with Store.open(path) as s:
        assert s.cluster() == CLUSTER
    with sqlite3.connect(path) as c:
        assert c.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]


# the apps table of a version-1 store (before declared contracts), as that version created it
V1_APPS = """CREATE TABLE apps_v1 (name TEXT PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, model TEXT NOT NULL,
    variants TEXT NOT NULL, rate_rps REAL NOT NULL, periodic INTEGER NOT NULL, burst REAL NOT NULL,
    slo_ms REAL NOT NULL, slo_stat TEXT NOT NULL, cpu_cores REAL NOT NULL, cpu_ms REAL NOT NULL,
    memory_mb REAL NOT NULL, network_ms REAL NOT NULL, shared INTEGER NOT NULL)"""


def test_a_version_1_store_is_migrated_keeping_every_app(tmp_path):
    """A store written by version 1 (no declared contracts) opens: the contract in force becomes the
    declared one, nothing else changes, no app has a key, and the file says the current version from then
    on."""
    path = tmp_path / "v1.db"
    with Store.open(path) as s:
        s.set_cluster(CLUSTER)
        placements = _populate(s)
        apps = s.apps()
    with sqlite3.connect(path) as c:  # rewrite the apps table as version 1 had it
        c.execute("PRAGMA foreign_keys = OFF")
        c.execute(V1_APPS)
        c.execute("INSERT INTO apps_v1 SELECT name, seq, model, variants, rate_rps, periodic, burst, slo_ms,"
                  " slo_stat, cpu_cores, cpu_ms, memory_mb, network_ms, shared FROM apps")
        c.execute("DROP TABLE apps")
        c.execute("ALTER TABLE apps_v1 RENAME TO apps")  # the other tables' references name "apps" still
        _shares_as_v2(c)
        c.execute("UPDATE schema_version SET version = 1")
    with Store.open(path) as s:
        assert s.apps() == apps and s.placements() == placements and s.check() == []
        assert s.declared_rates() == {n: a.rate_rps for n, a in apps.items()}
        assert s.keys() == {}  # version 1 issued no keys
    with sqlite3.connect(path) as c:
        assert c.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]


def _shares_as_v2(c: sqlite3.Connection) -> None:
    """Rewrite the shares table as versions 1 and 2 had it: no fraction, no instances."""
    c.execute("CREATE TABLE shares_v2 (app TEXT NOT NULL REFERENCES apps(name), ord INTEGER NOT NULL, device TEXT "
              "NOT NULL REFERENCES devices(path), weight REAL NOT NULL, profile TEXT NOT NULL, PRIMARY KEY (app, device))")
    c.execute("INSERT INTO shares_v2 SELECT app, ord, device, weight, profile FROM shares")
    c.execute("DROP TABLE shares")
    c.execute("ALTER TABLE shares_v2 RENAME TO shares")


def test_a_version_2_store_is_migrated_and_keeps_spatial_shares_after(tmp_path):
    """A version-2 store (no spatial shares) opens as the current version with every share whole and single; a share
    with a fraction and several instances then survives a restart, in the shares and in a transition."""
    path = tmp_path / "v2.db"
    with Store.open(path) as s:
        s.set_cluster(CLUSTER)
        placements = _populate(s)
    with sqlite3.connect(path) as c:
        c.execute("PRAGMA foreign_keys = OFF")
        _shares_as_v2(c)
        c.execute("ALTER TABLE apps DROP COLUMN key_sha256")  # versions 1 to 3 kept no app keys
        c.execute("UPDATE schema_version SET version = 2")
    with Store.open(path) as s:
        assert s.placements() == placements and s.check() == []
        name, old = next(iter(placements.items()))
        first = old.shares[0]
        new = Placement(name, (Share(first.device, 1.0, first.profile, 0.25, 3),), old.cpu_node)
        s.begin_transition(old, new)
        assert s.keys() == {}
    with sqlite3.connect(path) as c:
        assert c.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
    with Store.open(path) as s:
        assert s.transitions()[name].new.shares[0] == Share(first.device, 1.0, first.profile, 0.25, 3)


def test_declared_contract_survives_a_raised_one_and_a_restart(tmp_path):
    path = tmp_path / "s.db"
    with Store.open(path) as s:
        s.set_cluster(CLUSTER)
        placements = _populate(s)
        declared = s.declared_rates()["cam-dock"]
        s.begin_transition(placements["cam-dock"], placements["cam-dock"])
        s.switch_transition("cam-dock", declared * 3)  # adaptation raises the contract in place
        s.end_transition("cam-dock")
    with Store.open(path) as s:
        assert s.apps()["cam-dock"].rate_rps == declared * 3 and s.declared_rates()["cam-dock"] == declared
        app = s.apps()["cam-dock"]
        s.remove("cam-dock")  # a re-admission (an apply that changed the app) can keep the declared rate
        s.admit(app, placements["cam-dock"], declared_rps=declared)
        assert s.declared_rates()["cam-dock"] == declared and s.apps()["cam-dock"].rate_rps == declared * 3
        with pytest.raises(StoreError, match="declared rate"):
            s.admit(_app("x"), _one("x", "node-1/tpu0", "ibis-edgetpu/bodypix"), declared_rps=0.0)
        assert "x" not in s.apps()


# ------------------------------------------------------------------------------------------- durability

WRITER = r"""
import sys
from edgemux.cluster.state import App, Placement, Share, Slo
from edgemux.cluster.store import Store

s = Store.open(sys.argv[1])
devices = list(s.cluster().devices)
profiles = ["p0", "p1", "p2"]
for i in range(1_000_000):
    name = f"app-{i:06d}"
    dev = devices[i % len(devices)]
    prof = profiles[i % len(profiles)]
    if i % 3 == 0:
        shares = (Share(dev, 0.5, prof), Share(devices[(i + 1) % len(devices)], 0.5, prof))
    else:
        shares = (Share(dev, 1.0, prof),)
    s.admit(App(name, "mobilenet_v2", 1.0, Slo(100.0)), Placement(name, shares, dev.split("/")[0]))
    print(name, flush=True)          # only after the commit returned
    if i % 4 == 1:                   # an admission and removal nobody is told about
        tmp = f"tmp-{i:06d}"
        s.admit(App(tmp, "mobilenet_v2", 1.0, Slo(100.0)), Placement(tmp, (Share(dev, 1.0, "p-tmp"),)))
        s.remove(tmp)
"""


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_kill_9_during_admissions_loses_nothing_committed(tmp_path):
    path = tmp_path / "s.db"
    with Store.open(path) as s:
        s.set_cluster(CLUSTER)
    env = dict(os.environ, PYTHONPATH=str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.strip())
        lines.put(None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    printed: list[str] = []
    deadline = time.monotonic() + 30
    try:
        while len(printed) < 40:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"writer printed only {len(printed)} names in 30 s")
            if line is None:
                pytest.fail(f"writer exited early: {proc.wait(5)} {proc.stderr.read() if proc.stderr else ''}")
            printed.append(line)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        reader.join(timeout=10)
    while True:  # names printed between our last read and the kill were committed too
        line = lines.get(timeout=5)
        if line is None:
            break
        printed.append(line)
    assert proc.returncode == -signal.SIGKILL
    assert len(printed) == len(set(printed)) and printed == sorted(printed)

    # the raw file, before edgemux opens it: SQLite recovers the WAL, integrity holds
    with sqlite3.connect(path) as c:
        assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        names = [r[0] for r in c.execute("SELECT name FROM apps")]
        assert len(names) == len(set(names))
        orphan_shares = c.execute("SELECT COUNT(*) FROM shares WHERE app NOT IN (SELECT name FROM apps)").fetchone()
        apps_without = c.execute("SELECT COUNT(*) FROM apps WHERE name NOT IN (SELECT app FROM shares)").fetchone()
        assert orphan_shares[0] == 0 and apps_without[0] == 0
        refs = dict(((d, p), n) for d, p, n in c.execute("SELECT device, profile, refcount FROM loaded_models"))
        used = dict(((d, p), n) for d, p, n in c.execute(
            "SELECT device, profile, COUNT(*) FROM shares GROUP BY device, profile"))
        assert refs == used

    with Store.open(path) as s:
        assert s.check() == []
        apps = s.apps()
        placements = s.placements()
    assert set(placements) == set(apps)
    stored = [n for n in apps if n.startswith("app-")]
    # every printed app is there; at most the one being admitted when killed is there without being printed
    assert stored[: len(printed)] == printed
    assert len(stored) - len(printed) in (0, 1)
    if len(stored) > len(printed):
        assert stored[-1] == f"app-{len(printed):06d}"
    assert len([n for n in apps if n.startswith("tmp-")]) <= 1  # killed between its admit and remove
    for name in stored:
        i = int(name.split("-")[1])
        assert len(placements[name].shares) == (2 if i % 3 == 0 else 1)


def test_failure_after_partial_writes_rolls_back(store):
    """A constraint that fails on the last write of an admission (here a trigger on the CPU slot) undoes the
    app row, shares and ref-counts already written in the same transaction."""
    _populate(store)
    store._conn.execute("CREATE TRIGGER no_slot BEFORE INSERT ON cpu_slots WHEN NEW.app = 'late' "
                        "BEGIN SELECT RAISE(ABORT, 'slot refused'); END")
    before = store.dump()
    placement = Placement("late", (Share("node-1/tpu0", 0.5, "ibis-edgetpu/ssd_mobilenet_v2"),
                                   Share("node-2/gpu0", 0.5, "new-profile")), "node-2")
    with pytest.raises(StoreError, match="slot refused"):
        store.admit(_app("late"), placement)
    assert store.dump() == before and store.check() == []


# ------------------------------------------------------------------------------------- moves and transitions


def test_move_replaces_the_placement_in_one_transaction_and_keeps_the_order(store):
    placements = _populate(store)
    new = _one("cam-dock", "node-1/tpu0", "ibis-edgetpu/bodypix")
    store.move(new)
    assert store.placements()["cam-dock"] == new
    assert list(store.apps()) == [a.name for a in APPS]  # admission order kept
    assert store.loaded_models("node-1/tpu0")["ibis-edgetpu/bodypix"] == 1
    assert "microedge/bodypix" not in store.loaded_models("node-2/tpu0")  # reclaimed with its last user
    assert store.check() == []
    before = store.dump()
    with pytest.raises(StoreError, match="unknown device"):
        store.move(_one("cam-dock", "node-9/tpu0", "ibis-edgetpu/bodypix"))
    with pytest.raises(StoreError, match="no app 'nope'"):
        store.move(_one("nope", "node-1/tpu0", "ibis-edgetpu/bodypix"))
    assert store.dump() == before
    assert placements["cam-entrance"] == store.placements()["cam-entrance"]


def test_transition_phases_survive_a_restart(tmp_path):
    path = tmp_path / "s.db"
    with Store.open(path) as s:
        s.set_cluster(CLUSTER)
        placements = _populate(s)
        old = placements["cam-dock"]
        new = _one("cam-dock", "node-1/tpu0", "ibis-edgetpu/bodypix")
        s.begin_transition(old, new)
        with pytest.raises(StoreError, match="already moving"):
            s.begin_transition(old, new)
    with Store.open(path) as s:  # a restarted control plane finds the move where it was
        rec = s.transitions()["cam-dock"]
        assert (rec.old, rec.new, rec.phase) == (old, new, "loading")
        assert s.placements()["cam-dock"] == old  # loading: the app still runs where it was
        s.switch_transition("cam-dock")
    with Store.open(path) as s:
        rec = s.transitions()["cam-dock"]
        assert rec.phase == "draining" and s.placements()["cam-dock"] == new
        with pytest.raises(StoreError, match="no transition in phase 'loading'"):
            s.switch_transition("cam-dock")
        s.end_transition("cam-dock")
        assert s.transitions() == {} and s.check() == []


def test_transition_refusals_change_nothing(store):
    placements = _populate(store)
    before = store.dump()
    old = placements["cam-dock"]
    stale = _one("cam-dock", "node-1/tpu0", "ibis-edgetpu/bodypix")
    with pytest.raises(StoreError, match="no longer where"):
        store.begin_transition(stale, old)
    with pytest.raises(StoreError, match="unknown device"):
        store.begin_transition(old, _one("cam-dock", "node-9/tpu0", "x"))
    with pytest.raises(StoreError, match="no app"):
        store.begin_transition(_one("gone", "node-1/tpu0", "x"), _one("gone", "node-2/tpu0", "x"))
    assert store.dump() == before


def test_removing_a_moving_app_forgets_its_transition_and_its_target_device_is_kept(store):
    placements = _populate(store)
    store.begin_transition(placements["cam-dock"], _one("cam-dock", "node-1/tpu0", "ibis-edgetpu/bodypix"))
    # the target device of a move cannot leave the cluster while the move is under way
    smaller = Cluster(tuple(n if n.name != "node-1" else Node(n.name, n.cpu_cores, n.memory_mb,
                                                              tuple(d for d in n.devices if d.name != "tpu0"))
                            for n in CLUSTER.nodes))
    store.remove("cam-entrance")  # (its share on node-1/tpu0 would block the change too)
    with pytest.raises(StoreError, match="moving there"):
        store.set_cluster(smaller)
    store.remove("cam-dock")
    assert store.transitions() == {} and store.check() == []


def test_app_keys_are_kept_replaced_and_removed_with_their_app(tmp_path):
    with Store.open(tmp_path / "k.db") as s:
        s.set_cluster(CLUSTER)
        s.admit(_app("a"), _one("a", "node-1/tpu0", "ibis-edgetpu/mobilenet_v2"), key_sha256="1" * 64)
        s.admit(_app("b"), _one("b", "node-1/tpu0", "ibis-edgetpu/mobilenet_v2"))
        assert s.keys() == {"a": "1" * 64}
        s.set_key("b", "2" * 64)
        s.set_key("a", "3" * 64)
        assert s.keys() == {"a": "3" * 64, "b": "2" * 64}
        with pytest.raises(StoreError, match="no app 'c' is admitted"):
            s.set_key("c", "4" * 64)
        s.remove("a")
        assert s.keys() == {"b": "2" * 64} and s.check() == []
