"""The control plane's store on a thread of its own: the durable :class:`~edgemux.cluster.store.Store` (SQLite,
the source of truth) is opened, read, written and closed on one thread (an SQLite connection belongs to the
thread that opened it), so that a commit's fsync or a policy that bisects for a while never blocks the event
loop. Every manager reaches the store through :class:`StoreThread`, each calling only its own part of it
(admission: admit and remove; transitions: begin, switch and end a move; keys: set a key).

Units: none.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from edgemux.cluster.state import App, Cluster, Placement
from edgemux.cluster.store import Store, StoreError, TransitionRecord
from edgemux.errors import InputError

__all__ = ["Stored", "StoreThread"]

T = TypeVar("T")


@dataclass(frozen=True)
class Stored:
    """What a store holds when the control plane starts: apps (in admission order), their placements, the
    moves under way, the declared contracts (req/s) and the app keys' digests."""

    apps: dict[str, App]
    placements: dict[str, Placement]
    transitions: dict[str, TransitionRecord]
    declared: dict[str, float]
    keys: dict[str, str]


class StoreThread:
    """The store at ``path``, used from one thread (module doc)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._store: Store | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="edgemux-store")

    async def open(self, cluster: Cluster) -> Stored:
        """Open the store, reconcile its cluster with ``cluster`` (an empty store takes it; a changed one is
        accepted only when it keeps every placed app's devices and CPU nodes: ``InputError`` otherwise) and
        read what it holds. A store that cannot be opened stops the thread (nothing else will run there)."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, self._open, cluster)
        except BaseException:
            self._pool.shutdown(wait=False)
            raise

    def _open(self, cluster: Cluster) -> Stored:
        store = Store.open(self.path)
        try:
            if store.cluster() != cluster:
                try:
                    store.set_cluster(cluster)
                except StoreError as e:
                    raise InputError("cluster", f"store {self.path} holds another cluster: {e}") from None
            stored = Stored(store.apps(), store.placements(), store.transitions(), store.declared_rates(),
                            store.keys())
        except BaseException:
            store.close()
            raise
        self._store = store
        return stored

    async def call(self, method: str, *args: Any) -> Any:
        """One store method by name, on the store thread."""
        return await self.run(lambda store: getattr(store, method)(*args))

    async def run(self, fn: Callable[[Store], T]) -> T:
        """``fn(store)`` on the store thread (a decision and its commit, in one go)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._with_store, fn)

    def _with_store(self, fn: Callable[[Store], T]) -> T:
        assert self._store is not None, "open() first"
        return fn(self._store)

    async def close(self) -> None:
        """Close the store (on its thread) and stop the thread."""
        if self._store is not None:
            store, self._store = self._store, None
            await asyncio.get_running_loop().run_in_executor(self._pool, store.close)
        self._pool.shutdown(wait=True)
