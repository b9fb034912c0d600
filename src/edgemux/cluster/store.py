"""The durable store: an SQLite file (standard library, WAL journal, ``synchronous=FULL``, foreign keys on)
holding the cluster (nodes, devices), the admitted apps, their placements (shares and CPU slot) and the
models loaded on each device with the number of apps using each.

Every change is one transaction: ``admit`` writes an app, its shares, its CPU slot and the loaded-model
ref-counts together or not at all; ``remove`` takes them away together and unloads (deletes) a model that no
app uses any more. A failed call leaves the store exactly as it was, and whatever was committed survives a
crash: reopening the file gives the same values back.

The store records decisions; it does not make them (capacity and SLO checks belong to ``edgemux.policies``).
A loaded model is keyed by (device path, profile name); its ref-count is the number of apps with a share on
that device running that profile.
"""

from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, TypeVar

from edgemux.cluster.state import App, Cluster, Device, Node, Placement, Share, Slo
from edgemux.cluster.workload import Discipline
from edgemux.errors import EdgemuxError
from edgemux.profiles.types import DeviceKind

# 2: apps.declared_rps (the contract the app was applied with; rate_rps is the one in force, which the adapt
# loop may raise and later reclaim). 3: shares.fraction and shares.instances (a spatial device's share per
# instance and instance count). 4: apps.key_sha256 (the SHA-256 digest of the app's key, runtime.auth; NULL:
# none issued). 5: nodes.serving_ms (the serving path per request, ms). An older store is migrated when opened
# (see _MIGRATIONS).
SCHEMA_VERSION = 5
T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS nodes (
    name TEXT PRIMARY KEY,
    ord INTEGER NOT NULL,
    cpu_cores REAL NOT NULL,
    memory_mb REAL NOT NULL,
    serving_ms REAL NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS devices (
    path TEXT PRIMARY KEY,
    node TEXT NOT NULL REFERENCES nodes(name),
    name TEXT NOT NULL,
    ord INTEGER NOT NULL,
    kind TEXT NOT NULL,
    discipline TEXT NOT NULL,
    memory_mb REAL NOT NULL,
    profile_set TEXT,
    servers REAL NOT NULL,
    max_batch INTEGER NOT NULL,
    batch_timeout_ms REAL NOT NULL,
    UNIQUE (node, name)
);
CREATE TABLE IF NOT EXISTS apps (
    name TEXT PRIMARY KEY,
    seq INTEGER NOT NULL UNIQUE,
    model TEXT NOT NULL,
    variants TEXT NOT NULL,
    rate_rps REAL NOT NULL,
    declared_rps REAL NOT NULL,
    periodic INTEGER NOT NULL,
    burst REAL NOT NULL,
    slo_ms REAL NOT NULL,
    slo_stat TEXT NOT NULL,
    cpu_cores REAL NOT NULL,
    cpu_ms REAL NOT NULL,
    memory_mb REAL NOT NULL,
    network_ms REAL NOT NULL,
    shared INTEGER NOT NULL,
    key_sha256 TEXT
);
CREATE TABLE IF NOT EXISTS shares (
    app TEXT NOT NULL REFERENCES apps(name),
    ord INTEGER NOT NULL,
    device TEXT NOT NULL REFERENCES devices(path),
    weight REAL NOT NULL CHECK (weight > 0 AND weight <= 1),
    profile TEXT NOT NULL,
    fraction REAL NOT NULL DEFAULT 1 CHECK (fraction > 0 AND fraction <= 1),
    instances INTEGER NOT NULL DEFAULT 1 CHECK (instances >= 1),
    PRIMARY KEY (app, device)
);
CREATE INDEX IF NOT EXISTS shares_by_device ON shares(device, profile);
CREATE TABLE IF NOT EXISTS cpu_slots (
    app TEXT PRIMARY KEY REFERENCES apps(name),
    node TEXT NOT NULL REFERENCES nodes(name),
    cores REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS loaded_models (
    device TEXT NOT NULL REFERENCES devices(path),
    profile TEXT NOT NULL,
    refcount INTEGER NOT NULL CHECK (refcount > 0),
    PRIMARY KEY (device, profile)
);
CREATE TABLE IF NOT EXISTS transitions (
    app TEXT PRIMARY KEY REFERENCES apps(name),
    old TEXT NOT NULL,
    new TEXT NOT NULL,
    phase TEXT NOT NULL CHECK (phase IN ('loading', 'draining'))
);
"""

TABLES = ("schema_version", "nodes", "devices", "apps", "shares", "cpu_slots", "loaded_models", "transitions")
TRANSITION_PHASES = ("loading", "draining")


@dataclass(frozen=True)
class TransitionRecord:
    """A move of an app under way, as the store keeps it so that a restarted control plane can finish it.

    ``phase`` ``loading``: the app still runs on ``old`` (the store's placement); the new pieces may be loading.
    ``draining``: the placement is already ``new`` (switched in the same transaction that set this phase);
    the old pieces may still be finishing requests."""

    app: str
    old: Placement
    new: Placement
    phase: str


class StoreError(EdgemuxError):
    """A store operation that was refused (duplicate app, unknown device, ...) or a store file that cannot be
    used; the store is unchanged."""


class Store:
    """The control plane's durable state in one SQLite file. Use ``Store.open(path)``; close it (or use it as a
    context manager) when done. Not shared between threads."""

    def __init__(self, conn: sqlite3.Connection, path: str) -> None:
        self._conn = conn
        self.path = path

    # ----------------------------------------------------------------------------------------- lifecycle

    @classmethod
    def open(cls, path: str | Path) -> "Store":
        """Open (creating when missing) the store at ``path``: WAL journal, ``synchronous=FULL``, foreign keys
        on, schema created. ``StoreError`` for a file that is not a store of this schema version."""
        try:
            conn = sqlite3.connect(str(path), isolation_level=None, timeout=30.0)
        except sqlite3.Error as e:
            raise StoreError(f"{path}: cannot open store: {e}") from None
        try:
            conn.execute("PRAGMA foreign_keys = ON")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"{path}: cannot use a WAL journal (got {mode!r})")
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("BEGIN IMMEDIATE")
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    conn.execute(stmt)
            rows = conn.execute("SELECT version FROM schema_version").fetchall()
            if not rows:
                conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
            elif len(rows) != 1 or not (isinstance(rows[0][0], int) and 1 <= rows[0][0] <= SCHEMA_VERSION):
                conn.execute("ROLLBACK")
                raise StoreError(f"{path}: store schema version {[r[0] for r in rows]}, "
                                 f"this edgemux reads versions 1 to {SCHEMA_VERSION}")
            else:  # an older store: each step in the same transaction, so a failed migration changes nothing
                for version in range(rows[0][0], SCHEMA_VERSION):
                    _MIGRATIONS[version](conn)
                conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))
            conn.execute("COMMIT")
        except sqlite3.DatabaseError as e:
            conn.close()
            raise StoreError(f"{path}: not a usable store: {e}") from None
        except StoreError:
            conn.close()
            raise
        return cls(conn, str(path))

    def close(self) -> None:
        """Close the file (everything committed is already durable)."""
        self._conn.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _tx(self, body: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``body`` in one write transaction: committed when it returns, rolled back when it raises."""
        c = self._conn
        c.execute("BEGIN IMMEDIATE")
        try:
            out = body(c)
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")
        return out

    # ----------------------------------------------------------------------------------------- cluster

    def set_cluster(self, cluster: Cluster) -> None:
        """Replace the cluster (nodes and devices) in one transaction. Refused (``StoreError``, nothing
        changed) when an app has a share on a device, or its CPU slot on a node, that would disappear, or a
        device holding apps would change kind."""
        new_nodes = {n.name for n in cluster.nodes}
        new_devs = cluster.devices

        def body(c: sqlite3.Connection) -> None:
            lost = c.execute("SELECT app, device FROM shares ORDER BY app, device").fetchall()
            lost = [(a, d) for a, d in lost if d not in new_devs]
            if lost:
                raise StoreError(f"cannot remove device {lost[0][1]!r}: app {lost[0][0]!r} is placed on it"
                                 + (f" ({len(lost)} shares in all)" if len(lost) > 1 else ""))
            for app, new in c.execute("SELECT app, new FROM transitions ORDER BY app").fetchall():
                gone = [sh.device for sh in _placement_from_json(app, new).shares if sh.device not in new_devs]
                if gone:
                    raise StoreError(f"cannot remove device {gone[0]!r}: app {app!r} is moving there")
            slots = [(a, n) for a, n in c.execute("SELECT app, node FROM cpu_slots ORDER BY app")
                     if n not in new_nodes]
            if slots:
                raise StoreError(f"cannot remove node {slots[0][1]!r}: app {slots[0][0]!r} has its CPU slot there")
            for path, kind in c.execute("SELECT DISTINCT d.path, d.kind FROM devices d JOIN shares s "
                                        "ON s.device = d.path ORDER BY d.path").fetchall():
                if new_devs[path].kind.value != kind:
                    raise StoreError(f"cannot change device {path!r} from {kind} to {new_devs[path].kind.value}: "
                                     "apps are placed on it")
            for (path,) in c.execute("SELECT path FROM devices").fetchall():
                if path not in new_devs:
                    c.execute("DELETE FROM loaded_models WHERE device = ?", (path,))
                    c.execute("DELETE FROM devices WHERE path = ?", (path,))
            for (name,) in c.execute("SELECT name FROM nodes").fetchall():
                if name not in new_nodes:
                    c.execute("DELETE FROM devices WHERE node = ?", (name,))
                    c.execute("DELETE FROM nodes WHERE name = ?", (name,))
            for i, n in enumerate(cluster.nodes):
                c.execute("INSERT INTO nodes (name, ord, cpu_cores, memory_mb, serving_ms) VALUES (?, ?, ?, ?, ?) "
                          "ON CONFLICT(name) DO UPDATE SET ord = excluded.ord, cpu_cores = excluded.cpu_cores, "
                          "memory_mb = excluded.memory_mb, serving_ms = excluded.serving_ms",
                          (n.name, i, n.cpu_cores, n.memory_mb, n.serving_ms))
            for j, d in enumerate(new_devs.values()):
                c.execute(
                    "INSERT INTO devices (path, node, name, ord, kind, discipline, memory_mb, profile_set, servers,"
                    " max_batch, batch_timeout_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT(path) DO UPDATE SET ord = excluded.ord, kind = excluded.kind,"
                    " discipline = excluded.discipline, memory_mb = excluded.memory_mb,"
                    " profile_set = excluded.profile_set, servers = excluded.servers,"
                    " max_batch = excluded.max_batch, batch_timeout_ms = excluded.batch_timeout_ms",
                    (d.path, d.node, d.name, j, d.kind.value, d.discipline.value, d.memory_mb, d.profile_set,
                     d.servers, d.max_batch, d.batch_timeout_ms))

        self._tx(body)

    def cluster(self) -> Cluster:
        """The stored cluster (nodes and devices in the order they were set; no nodes before ``set_cluster``)."""
        c = self._conn
        devs: dict[str, list[Device]] = {}
        serving = dict(c.execute("SELECT name, serving_ms FROM nodes").fetchall())
        for row in c.execute("SELECT node, name, kind, discipline, memory_mb, profile_set, servers, max_batch, "
                             "batch_timeout_ms FROM devices ORDER BY ord"):
            node, name, kind, disc, mem, pset, servers, max_batch, timeout = row
            devs.setdefault(node, []).append(Device(node, name, DeviceKind(kind), Discipline(disc), mem, pset,
                                                    servers, max_batch, timeout, serving[node]))
        nodes = tuple(Node(name, cores, mem, tuple(devs.get(name, ())))
                      for name, cores, mem in c.execute("SELECT name, cpu_cores, memory_mb FROM nodes ORDER BY ord"))
        return Cluster(nodes)

    # ----------------------------------------------------------------------------------------- apps

    def admit(self, app: App, placement: Placement, *, declared_rps: float | None = None,
              key_sha256: str | None = None) -> None:
        """Record an admitted app with its placement in ONE transaction: the app, its shares, its CPU slot
        (``placement.cpu_node``, ``app.cpu_cores`` cores) and +1 on the ref-count of each (device, profile) it
        uses (loading the model when it is the first user). The app's declared contract is ``app.rate_rps``
        unless ``declared_rps`` (req/s) says otherwise (putting back an app whose contract adaptation had
        raised); ``key_sha256`` is the digest of the app's key, if it has one. ``StoreError``, with the store
        unchanged, for a placement of another app, a duplicate app name, a share on an unknown device or a CPU
        slot on an unknown node."""
        if placement.app != app.name:
            raise StoreError(f"placement is for app {placement.app!r}, not {app.name!r}")
        if declared_rps is not None and not (0 < declared_rps < math.inf):
            raise StoreError(f"app {app.name!r}: a declared rate must be a finite number > 0 req/s, "
                             f"got {declared_rps!r}")

        def body(c: sqlite3.Connection) -> None:
            if c.execute("SELECT 1 FROM apps WHERE name = ?", (app.name,)).fetchone():
                raise StoreError(f"app {app.name!r} is already admitted")
            _check_placement(c, placement)
            seq = c.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM apps").fetchone()[0]
            c.execute("INSERT INTO apps (name, seq, model, variants, rate_rps, declared_rps, periodic, burst,"
                      " slo_ms, slo_stat, cpu_cores, cpu_ms, memory_mb, network_ms, shared, key_sha256)"
                      " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                      (app.name, seq, app.model, json.dumps(list(app.variants)), app.rate_rps,
                       app.rate_rps if declared_rps is None else declared_rps, int(app.periodic), app.burst,
                       app.slo.latency_ms, app.slo.stat, app.cpu_cores, app.cpu_ms, app.memory_mb, app.network_ms,
                       int(app.shared), key_sha256))
            _insert_placement(c, placement, app.cpu_cores)

        try:
            self._tx(body)
        except sqlite3.IntegrityError as e:  # a constraint the checks above did not foresee
            raise StoreError(f"app {app.name!r}: refused by the store: {e}") from None

    def move(self, placement: Placement) -> None:
        """Replace an admitted app's placement in ONE transaction (its shares, CPU slot and the ref-counts of
        the models it uses), keeping the app and its admission order; a transition of the app under way is
        left as it is. ``StoreError``, store unchanged, for an unknown app, device or node."""
        self._tx(lambda c: self._move(c, placement))

    def _move(self, c: sqlite3.Connection, placement: Placement) -> None:
        name = placement.app
        row = c.execute("SELECT cpu_cores FROM apps WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise StoreError(f"no app {name!r} is admitted")
        _check_placement(c, placement)
        _delete_placement(c, name)
        try:
            _insert_placement(c, placement, row[0])
        except sqlite3.IntegrityError as e:
            raise StoreError(f"app {name!r}: refused by the store: {e}") from None

    # ------------------------------------------------------------------------------------- transitions

    def begin_transition(self, old: Placement, new: Placement) -> None:
        """Record that the app of ``old`` (its current placement) is to move to ``new``, phase ``loading``.
        ``StoreError`` when the app is unknown, ``old`` is not its placement, a device or node of ``new`` is
        unknown, or a transition of the app is already under way."""
        if old.app != new.app:
            raise StoreError(f"a transition moves one app: {old.app!r} != {new.app!r}")

        def body(c: sqlite3.Connection) -> None:
            current = self._placement(c, old.app)
            if current is None:
                raise StoreError(f"no app {old.app!r} is admitted")
            if current != old:
                raise StoreError(f"app {old.app!r} is no longer where the transition starts from")
            if c.execute("SELECT 1 FROM transitions WHERE app = ?", (old.app,)).fetchone():
                raise StoreError(f"app {old.app!r} is already moving")
            _check_placement(c, new)
            c.execute("INSERT INTO transitions (app, old, new, phase) VALUES (?, ?, ?, 'loading')",
                      (old.app, _placement_json(old), _placement_json(new)))

        self._tx(body)

    def switch_transition(self, app: str, rate_rps: float | None = None) -> None:
        """In ONE transaction: the app's placement becomes the transition's ``new`` and its phase ``draining``,
        and with ``rate_rps`` its contracted rate that (req/s). ``StoreError`` when no transition of the app
        is in phase ``loading``."""
        if rate_rps is not None and not (0 < rate_rps < math.inf):
            raise StoreError(f"app {app!r}: a contract rate must be a finite number > 0 req/s, got {rate_rps!r}")

        def body(c: sqlite3.Connection) -> None:
            row = c.execute("SELECT new, phase FROM transitions WHERE app = ?", (app,)).fetchone()
            if row is None or row[1] != "loading":
                raise StoreError(f"app {app!r} has no transition in phase 'loading'")
            self._move(c, _placement_from_json(app, row[0]))
            if rate_rps is not None:
                c.execute("UPDATE apps SET rate_rps = ? WHERE name = ?", (float(rate_rps), app))
            c.execute("UPDATE transitions SET phase = 'draining' WHERE app = ?", (app,))

        self._tx(body)

    def end_transition(self, app: str) -> None:
        """Forget the app's transition (finished, or rolled back while ``loading``); no-op when there is none."""
        self._tx(lambda c: c.execute("DELETE FROM transitions WHERE app = ?", (app,)))

    def transitions(self) -> dict[str, TransitionRecord]:
        """The transitions under way, by app name."""
        return {app: TransitionRecord(app, _placement_from_json(app, old), _placement_from_json(app, new), phase)
                for app, old, new, phase in self._conn.execute(
                    "SELECT app, old, new, phase FROM transitions ORDER BY app")}

    def _placement(self, c: sqlite3.Connection, app: str) -> Placement | None:
        shares = [Share(d, w, p, f, k) for d, w, p, f, k in c.execute(
            "SELECT device, weight, profile, fraction, instances FROM shares WHERE app = ? ORDER BY ord", (app,))]
        if not shares:
            return None
        slot = c.execute("SELECT node FROM cpu_slots WHERE app = ?", (app,)).fetchone()
        return Placement(app, tuple(shares), slot[0] if slot else None)

    def remove(self, app_name: str) -> list[tuple[str, str]]:
        """Remove an app in ONE transaction: its shares, CPU slot and row; -1 on the ref-count of each model it
        used, unloading (deleting) a model no app uses any more. Returns the (device, profile) pairs unloaded.
        ``StoreError`` for an unknown app."""

        def body(c: sqlite3.Connection) -> list[tuple[str, str]]:
            if not c.execute("SELECT 1 FROM apps WHERE name = ?", (app_name,)).fetchone():
                raise StoreError(f"no app {app_name!r} is admitted")
            unloaded = _delete_placement(c, app_name)
            c.execute("DELETE FROM transitions WHERE app = ?", (app_name,))
            c.execute("DELETE FROM apps WHERE name = ?", (app_name,))
            return unloaded

        return self._tx(body)

    def apps(self) -> dict[str, App]:
        """Admitted apps by name, in admission order."""
        out = {}
        for row in self._conn.execute(
                "SELECT name, model, variants, rate_rps, periodic, burst, slo_ms, slo_stat, cpu_cores, cpu_ms,"
                " memory_mb, network_ms, shared FROM apps ORDER BY seq"):
            name, model, variants, rate, periodic, burst, slo_ms, stat, cores, cpu_ms, mem, net, shared = row
            out[name] = App(name=name, model=model, rate_rps=rate, slo=Slo(slo_ms, stat),
                            variants=tuple(json.loads(variants)), periodic=bool(periodic), burst=burst,
                            cpu_cores=cores, cpu_ms=cpu_ms, memory_mb=mem, network_ms=net, shared=bool(shared))
        return out

    def set_key(self, app_name: str, key_sha256: str) -> None:
        """Replace an admitted app's key digest (the old key stops counting); ``StoreError`` for an unknown
        app."""

        def body(c: sqlite3.Connection) -> None:
            if c.execute("UPDATE apps SET key_sha256 = ? WHERE name = ?", (key_sha256, app_name)).rowcount != 1:
                raise StoreError(f"no app {app_name!r} is admitted")

        self._tx(body)

    def keys(self) -> dict[str, str]:
        """Each admitted app's key digest, by name (apps without a key left out)."""
        return dict(self._conn.execute("SELECT name, key_sha256 FROM apps WHERE key_sha256 IS NOT NULL "
                                       "ORDER BY seq").fetchall())

    def declared_rates(self) -> dict[str, float]:
        """Each admitted app's declared contract (req/s, the rate it was applied with), by name, in admission
        order; ``apps()`` gives the contract in force, which adaptation may have raised above it."""
        return dict(self._conn.execute("SELECT name, declared_rps FROM apps ORDER BY seq").fetchall())

    def placements(self) -> dict[str, Placement]:
        """Each admitted app's placement, by app name, in admission order."""
        c = self._conn
        shares: dict[str, list[Share]] = {}
        for app, dev, weight, prof, frac, k in c.execute("SELECT s.app, s.device, s.weight, s.profile, s.fraction, "
                                                         "s.instances FROM shares s "
                                                "JOIN apps a ON a.name = s.app ORDER BY a.seq, s.ord"):
            shares.setdefault(app, []).append(Share(dev, weight, prof, frac, k))
        slots = dict(c.execute("SELECT app, node FROM cpu_slots").fetchall())
        return {a: Placement(a, tuple(s), slots.get(a)) for a, s in shares.items()}

    def loaded_models(self, device_path: str) -> dict[str, int]:
        """Models loaded on a device: profile name -> number of apps using it. ``StoreError`` for an unknown
        device."""
        c = self._conn
        if not c.execute("SELECT 1 FROM devices WHERE path = ?", (device_path,)).fetchone():
            raise StoreError(f"unknown device {device_path!r}")
        return dict(c.execute("SELECT profile, refcount FROM loaded_models WHERE device = ? ORDER BY profile",
                              (device_path,)).fetchall())

    def dump(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every row of every table, sorted (for comparing two states of the store)."""
        return {t: sorted(self._conn.execute(f"SELECT * FROM {t}").fetchall(), key=repr) for t in TABLES}

    def check(self) -> list[str]:
        """Problems found by SQLite's integrity and foreign-key checks and by the store's own invariants (every
        app has shares and every share an app; ref-counts equal the number of apps using each model); empty
        when the store is sound."""
        c = self._conn
        problems = [r[0] for r in c.execute("PRAGMA integrity_check") if r[0] != "ok"]
        problems += [f"foreign key: {r}" for r in c.execute("PRAGMA foreign_key_check")]
        problems += [f"app {a!r} has no shares" for (a,) in c.execute(
            "SELECT name FROM apps WHERE name NOT IN (SELECT app FROM shares)")]
        problems += [f"share of missing app {a!r}" for (a,) in c.execute(
            "SELECT DISTINCT app FROM shares WHERE app NOT IN (SELECT name FROM apps)")]
        used = dict(((d, p), n) for d, p, n in c.execute(
            "SELECT device, profile, COUNT(*) FROM shares GROUP BY device, profile"))
        loaded = dict(((d, p), n) for d, p, n in c.execute("SELECT device, profile, refcount FROM loaded_models"))
        problems += [f"loaded model {k}: refcount {loaded.get(k)} but {used.get(k)} apps use it"
                     for k in sorted(set(used) | set(loaded)) if used.get(k) != loaded.get(k)]
        return problems


# ------------------------------------------------------------------------------- placement rows (one tx)


def _check_placement(c: sqlite3.Connection, placement: Placement) -> None:
    """``StoreError`` when a share's device or the CPU slot's node is not in the stored cluster."""
    for s in placement.shares:
        if not c.execute("SELECT 1 FROM devices WHERE path = ?", (s.device,)).fetchone():
            raise StoreError(f"app {placement.app!r}: share on unknown device {s.device!r}")
    if placement.cpu_node is not None and not c.execute(
            "SELECT 1 FROM nodes WHERE name = ?", (placement.cpu_node,)).fetchone():
        raise StoreError(f"app {placement.app!r}: CPU slot on unknown node {placement.cpu_node!r}")


def _insert_placement(c: sqlite3.Connection, placement: Placement, cpu_cores: float) -> None:
    """The app's shares, +1 on each (device, profile) ref-count, and its CPU slot."""
    for i, s in enumerate(placement.shares):
        c.execute("INSERT INTO shares (app, ord, device, weight, profile, fraction, instances) "
                  "VALUES (?, ?, ?, ?, ?, ?, ?)",
                  (placement.app, i, s.device, s.weight, s.profile, s.fraction, s.instances))
        c.execute("INSERT INTO loaded_models (device, profile, refcount) VALUES (?, ?, 1) "
                  "ON CONFLICT(device, profile) DO UPDATE SET refcount = refcount + 1", (s.device, s.profile))
    if placement.cpu_node is not None:
        c.execute("INSERT INTO cpu_slots (app, node, cores) VALUES (?, ?, ?)", (placement.app, placement.cpu_node,
                                                                               cpu_cores))


def _delete_placement(c: sqlite3.Connection, app: str) -> list[tuple[str, str]]:
    """Remove the app's shares and CPU slot, -1 on each model's ref-count (deleting a model no app uses any
    more); returns the (device, profile) pairs deleted."""
    used = c.execute("SELECT device, profile FROM shares WHERE app = ? ORDER BY ord", (app,)).fetchall()
    unloaded = []
    for dev, prof in used:
        c.execute("UPDATE loaded_models SET refcount = refcount - 1 WHERE device = ? AND profile = ? "
                  "AND refcount > 1", (dev, prof))
        if c.execute("SELECT changes()").fetchone()[0] == 0:
            c.execute("DELETE FROM loaded_models WHERE device = ? AND profile = ?", (dev, prof))
            unloaded.append((dev, prof))
    c.execute("DELETE FROM shares WHERE app = ?", (app,))
    c.execute("DELETE FROM cpu_slots WHERE app = ?", (app,))
    return unloaded


def _placement_json(p: Placement) -> str:
    return json.dumps({"cpu_node": p.cpu_node, "shares": [[s.device, s.weight, s.profile, s.fraction, s.instances]
                                                          for s in p.shares]})


def _placement_from_json(app: str, text: str) -> Placement:
    d = json.loads(text)
    # a version-2 transition row has three fields per share (no fraction, no instances)
    return Placement(app, tuple(Share(str(x[0]), float(x[1]), str(x[2]), *((float(x[3]), int(x[4])) if len(x) > 3
                                                                            else ()))
                                for x in d["shares"]), d["cpu_node"])


def _v1_to_v2(c: sqlite3.Connection) -> None:
    """Version 1 kept one contract per app; the one in force is the best there is for the declared one (a
    version-1 control plane that had raised a contract left no trace of the declared rate)."""
    c.execute("ALTER TABLE apps ADD COLUMN declared_rps REAL NOT NULL DEFAULT 0")
    c.execute("UPDATE apps SET declared_rps = rate_rps")


def _v2_to_v3(c: sqlite3.Connection) -> None:
    """Version 2 had no spatial devices: every share held the whole device with one instance."""
    c.execute("ALTER TABLE shares ADD COLUMN fraction REAL NOT NULL DEFAULT 1 CHECK (fraction > 0 AND fraction <= 1)")
    c.execute("ALTER TABLE shares ADD COLUMN instances INTEGER NOT NULL DEFAULT 1 CHECK (instances >= 1)")


def _v3_to_v4(c: sqlite3.Connection) -> None:
    """Version 3 issued no app keys: every app has none (the admin token still opens it)."""
    c.execute("ALTER TABLE apps ADD COLUMN key_sha256 TEXT")


def _v4_to_v5(c: sqlite3.Connection) -> None:
    """Version 4 had no serving path per node: every node's is 0 (the estimators' device time alone)."""
    # the schema's CREATE TABLE IF NOT EXISTS ran first: a store whose nodes table was made after it has it
    if "serving_ms" not in {row[1] for row in c.execute("PRAGMA table_info(nodes)")}:
        c.execute("ALTER TABLE nodes ADD COLUMN serving_ms REAL NOT NULL DEFAULT 0")


# from version v to v + 1, run by Store.open in the transaction that opens the store
_MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4,
                                                                4: _v4_to_v5}
