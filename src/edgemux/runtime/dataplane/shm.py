"""System shared memory (Triton's extension): a client on the same host hands tensors over in POSIX
shared-memory regions instead of the request body, and takes outputs from them.

A client creates a region (``/dev/shm/NAME``, e.g. with ``tritonclient.utils.shared_memory``), registers it
under a name of its choosing with its key ``/NAME``, an offset and a size, then names ``(region, offset,
size)`` slots in its requests' inputs and outputs. The server maps the region once, at registration, and
closes its mapping when the region is unregistered; it never creates or removes a region file (the client
that made it does).

Safe by construction:

- a region is a regular file directly under ``/dev/shm`` (the key is ``/`` and one name, no link followed);
- every offset and size is checked, the region's against the file at registration and each slot's against
  the region at every request;
- a region belongs to the credential that registered it (:func:`principal`): an app's key sees, uses and
  unregisters only its app's regions (another app's region is, to it, not registered), the admin token its
  own; on an open service everyone shares one set;
- the regions of one credential map at most ``limit_bytes`` together;
- an app's regions are released when the app is deleted (:meth:`RegionTable.release`).

An input is read where the client wrote it (a read-only view, no copy: as in Triton, a client must not
change a slot until its request is answered); an output is written into its slot, and the answer names the
slot instead of carrying the bytes. A mapping still read by a request when its region is unregistered is
unmapped when that request is done.

A gateway on the caller's host passes the caller's slots on to an agent on the same host by their objects
(``ShmSlot.key``: ``edgemux_shm_key``, honoured only in a request with the gateway's mark beside the admin
token, ``PASSED_ON_HEADER``, which the gateway writes itself and never passes on from a caller): the agent
checks the object as a registration does and keeps the last ``_OBJECTS_KEPT`` objects mapped, so that the
frames a camera hands over in one slot cost neither a copy nor a mapping per request.
"""

from __future__ import annotations

import collections
import math
import mmap
import os
import re
import stat
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgemux.errors import EdgemuxError
from edgemux.runtime.auth import Guard, bearer, digest
from edgemux.runtime.dataplane.protocol import (
    DATATYPES,
    InferRequest,
    ShmSlot,
    datatype_of,
    tensor_bytes,
    tensor_from_bytes,
)

__all__ = ["ADMIN_PRINCIPAL", "DEFAULT_LIMIT_BYTES", "FORWARDED_PRINCIPAL", "GATEWAY_PRINCIPAL", "PASSED_ON_HEADER", "SHM_DIR", "SHM_MIN_BYTES", "OwnRegion", "RegionTable", "ShmError", "on_this_host",
           "principal"]

SHM_DIR = Path("/dev/shm")
DEFAULT_LIMIT_BYTES = 256 * 2**20  # 256 MiB per credential: a few hundred 1080p frames' worth
ADMIN_PRINCIPAL = "@admin"
# Who may name a slot by its object (ShmSlot.key): a gateway passing its caller's slots on, and nobody else.
# A request is that only with the gateway's mark beside the admin token (the gateway writes the mark itself
# on the requests it builds so, and never passes a caller's header of that name on), or at an open agent.
GATEWAY_PRINCIPAL = "@gateway"
PASSED_ON_HEADER = "Edgemux-Shm-Passed-On"
# A request a gateway forwarded as it came (its caller's body, with the gateway's credential): it may use no
# region here, since the gateway's credential is not its caller's (a caller cannot reach the admin's regions
# by sending a slot through a gateway).
FORWARDED_PRINCIPAL = "@forwarded"
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux: fault the mapping's pages in at once  # the admin token's regions (no app name has an "@")
# Below this many bytes of tensors a client sends binary even to a server on its host (edgemux's load
# generator and Python client): shared memory's fixed cost (the gateway decodes the request and the answer)
# outweighs what it saves on the copies. Measured by `python benchmarks/bench_transport.py` through a gateway
# on a 2-core host: binary costs 0.1 ms less at 150 kB of input, shared memory 0.3 ms less at 300 kB
# (docs/results.md).
SHM_MIN_BYTES = 256 * 1024
_KEY = re.compile(r"/[A-Za-z0-9._-]{1,200}")
_NAME = re.compile(r"[^\x00-\x1f\x7f/]{1,128}")


class ShmError(EdgemuxError):
    """A shared-memory request that cannot be honoured: ``status`` 400 (bad key, slot or size), 404 (no
    such region here), 409 (the name is taken), 413 (over the credential's limit)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def principal(guard: Guard, authorization: str | None) -> str:
    """Who owns the regions a request may use, from its credential (already checked): ``ADMIN_PRINCIPAL``
    for the admin token, the app's name for an app key, "" on an open service (one shared set)."""
    if not guard.enabled:
        return ""
    if guard.is_admin(authorization):
        return ADMIN_PRINCIPAL
    secret = bearer(authorization)
    owner = guard.owner_of(digest(secret)) if secret else None
    if owner is None:  # the guard let it through, so this is unreachable unless the caller skipped the check
        raise ShmError("shared memory needs a credential: the admin token or an app's key", 403)
    return owner


@dataclass
class _Region:
    name: str
    key: str
    offset: int
    byte_size: int
    view: mmap.mmap

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


class RegionTable:
    """The registered regions of one server, by (owner, name), and the objects gateways passed on, kept
    mapped. Thread-safe; no call blocks for long (a registration opens and maps a file, a request reads its
    inputs in place and copies its outputs in)."""

    def __init__(self, limit_bytes: int = DEFAULT_LIMIT_BYTES, directory: Path = SHM_DIR) -> None:
        self.limit_bytes = limit_bytes
        self.directory = Path(directory)
        self._regions: dict[tuple[str, str], _Region] = {}
        # objects named by key (a gateway's pass-through): key -> ((inode, size), mapping), least recent first
        self._objects: collections.OrderedDict[str, tuple[tuple[int, int], mmap.mmap]] = collections.OrderedDict()
        self._lock = threading.Lock()

    # -- the extension's endpoints ------------------------------------------------------------------

    def register(self, owner: str, name: str, key: Any, offset: Any, byte_size: Any) -> None:
        """Map ``byte_size`` bytes at ``offset`` of the region file ``key`` (``/NAME``, under /dev/shm) as
        ``owner``'s region ``name``. ``ShmError`` naming what is wrong; nothing is kept then."""
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ShmError(f"a region's name is 1 to 128 characters, no '/' or control characters, got {name!r:.60}")
        self._check_key(f"region '{name}'", key)
        for what, value in (("offset", offset), ("byte_size", byte_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ShmError(f"region '{name}': {what} must be a non-negative integer (bytes), got {value!r:.40}")
        if byte_size == 0:
            raise ShmError(f"region '{name}': byte_size must be > 0")
        with self._lock:
            if (owner, name) in self._regions:
                raise ShmError(f"region '{name}' is registered already: unregister it first", 409)
            used = sum(r.byte_size for (o, _), r in self._regions.items() if o == owner)
            if used + byte_size > self.limit_bytes:
                raise ShmError(f"region '{name}': {byte_size} bytes more would map {used + byte_size} bytes, over "
                               f"the limit of {self.limit_bytes} bytes per credential", 413)
            view = self._map(key, offset, byte_size, f"region '{name}'")
            self._regions[(owner, name)] = _Region(name, key, offset, byte_size, view)

    def _check_key(self, what: str, key: Any) -> None:
        if not isinstance(key, str) or not _KEY.fullmatch(key) or key in ("/.", "/.."):
            raise ShmError(f"{what}: key must be '/' and a name of letters, digits, '.', '_' or '-' (a "
                           f"POSIX shared memory object under {self.directory}), got {key!r:.80}")

    def _open(self, key: str, offset: int, byte_size: int, what: str) -> int:
        """A descriptor of the object ``key`` (read and write), checked: a regular file directly under the
        directory, no link followed, ``offset + byte_size`` within it."""
        path = self.directory / key[1:]
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise ShmError(f"{what}: no shared memory object {key} ({path})") from None
        except OSError as e:  # a link (ELOOP), no permission, ...
            raise ShmError(f"{what}: cannot open {key}: {e.strerror or e}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ShmError(f"{what}: {key} is not a shared memory object")
            if offset + byte_size > st.st_size:
                raise ShmError(f"{what}: offset {offset} + byte_size {byte_size} runs past the end of "
                               f"{key} ({st.st_size} bytes)")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _map(self, key: str, offset: int, byte_size: int, what: str) -> mmap.mmap:
        """The first ``offset + byte_size`` bytes of the object ``key``, mapped with its pages populated at
        once (one call, instead of a fault per page at first touch); ``what`` names it in errors."""
        fd = self._open(key, offset, byte_size, what)
        try:
            return mmap.mmap(fd, max(1, offset + byte_size), flags=mmap.MAP_SHARED | _POPULATE)
        finally:
            os.close(fd)

    def unregister(self, owner: str, name: str | None) -> list[str]:
        """Unmap ``owner``'s region ``name`` (None: every one of its regions); the names unmapped.
        ``ShmError`` 404 for a name it has not registered."""
        with self._lock:
            if name is None:
                names = [n for (o, n) in self._regions if o == owner]
            elif (owner, name) in self._regions:
                names = [name]
            else:
                raise ShmError(f"no shared memory region '{name}' is registered with this credential", 404)
            for n in names:
                _release(self._regions.pop((owner, n)).view)
        return names

    def status(self, owner: str, name: str | None) -> list[dict[str, Any]]:
        """``owner``'s regions (name, key, offset, byte_size), or the one named; 404 for one it has not."""
        with self._lock:
            if name is None:
                return [r.status() for (o, _), r in sorted(self._regions.items()) if o == owner]
            region = self._regions.get((owner, name))
        if region is None:
            raise ShmError(f"no shared memory region '{name}' is registered with this credential", 404)
        return [region.status()]

    def __bool__(self) -> bool:
        """Whether any region is registered (the gateway decodes nothing while none is)."""
        return bool(self._regions)

    def holds(self, owner: str) -> bool:
        """Whether ``owner`` has registered a region."""
        with self._lock:
            return any(o == owner for o, _ in self._regions)

    def release(self, owner: str) -> int:
        """Unmap every region of ``owner`` (an app deleted); how many there were."""
        return len(self.unregister(owner, None))

    def close(self) -> None:
        """Unmap every region (the server stops)."""
        with self._lock:
            for region in self._regions.values():
                _release(region.view)
            self._regions.clear()
            for _, view in self._objects.values():
                _release(view)
            self._objects.clear()

    # -- inference ----------------------------------------------------------------------------------

    def read_inputs(self, owner: str, req: InferRequest) -> None:
        """Give each input of ``req`` that lies in shared memory its data, read from ``owner``'s region."""
        for t in req.inputs:
            if t.shm is None:
                continue
            where = f"input '{t.name}'"
            if t.datatype != "BYTES":
                need = math.prod(t.shape) * DATATYPES[t.datatype].itemsize
                if t.shm.byte_size != need:
                    raise ShmError(f"{where}: shared_memory_byte_size {t.shm.byte_size} does not match shape "
                                   f"[{','.join(map(str, t.shape))}] of {t.datatype} (expected {need} bytes)")
            data = self._slot(owner, t.shm, t.shm.byte_size, where)
            t.data = tensor_from_bytes(memoryview(data), t.datatype, t.shape, math.prod(t.shape), where)

    def write_outputs(self, owner: str, req: InferRequest, outputs: Mapping[str, np.ndarray]) -> dict[str, ShmSlot]:
        """Write each output ``req`` asks for in shared memory into its slot; the slots written, by output.
        ``ShmError`` 400 when an output does not fit its slot (nothing of it is written)."""
        written = {}
        for o in req.outputs:
            if o.shm is None or o.name not in outputs:
                continue
            array = np.asarray(outputs[o.name])
            datatype = datatype_of(array.dtype, o.name)
            # the array's own bytes where they are contiguous already (no copy), else serialized
            data: Any = (tensor_bytes(array, datatype) if datatype == "BYTES" else
                         np.ascontiguousarray(array, dtype=DATATYPES[datatype]).data.cast("B"))
            where = f"output '{o.name}'"
            if len(data) > o.shm.byte_size:
                raise ShmError(f"{where} is {len(data)} bytes, more than its shared memory slot of "
                               f"{o.shm.byte_size} bytes in region '{o.shm.region}'")
            self._slot(owner, o.shm, len(data), where, data)
            written[o.name] = o.shm
        return written

    def locate(self, owner: str, slot: ShmSlot, where: str) -> ShmSlot:
        """``owner``'s ``slot`` as the object it lies in (its ``key``, ``offset`` from the object's start), for
        a gateway to pass on to an agent on its host: checked against the region as a read would be."""
        with self._lock:
            region = self._region(owner, slot, where)
            return ShmSlot(region.key, region.offset + slot.offset, slot.byte_size, region.key)

    def _region(self, owner: str, slot: ShmSlot, where: str) -> _Region:
        """The region ``slot`` names among ``owner``'s, the slot checked to lie within it (under the lock)."""
        region = self._regions.get((owner, slot.region))
        if region is None:
            raise ShmError(f"{where}: no shared memory region '{slot.region}' is registered with this credential")
        if slot.offset + slot.byte_size > region.byte_size:
            raise ShmError(f"{where}: offset {slot.offset} + byte_size {slot.byte_size} runs past region "
                           f"'{slot.region}' ({region.byte_size} bytes)")
        return region

    def _slot(self, owner: str, slot: ShmSlot, size: int, where: str, data: Any = None) -> Any:
        """Read ``size`` bytes of ``slot`` (``data`` None) or write ``data`` into it, under the lock (an
        unregistration waits for it)."""
        if slot.key is not None:
            return self._by_key(owner, slot, size, where, data)
        with self._lock:
            region = self._region(owner, slot, where)
            start = region.offset + slot.offset
            if data is None:  # a view, no copy: the input is read where the client wrote it
                return memoryview(region.view)[start:start + size].toreadonly()
            region.view[start:start + size] = data
            return data

    def _by_key(self, owner: str, slot: ShmSlot, size: int, where: str, data: Any) -> Any:
        """A slot a gateway passed on (``ShmSlot.key``): the gateway checked it against its caller's region;
        here only a gateway's request (``GATEWAY_PRINCIPAL``) may name an object directly, and the object is
        checked as a registration is (under /dev/shm, no link, a regular file, the slot within it)."""
        if owner != GATEWAY_PRINCIPAL:
            raise ShmError(f"{where}: a slot named by its object's key is a gateway's, passing its caller's "
                           "regions on; register the region and name it", 403)
        assert slot.key is not None
        self._check_key(where, slot.key)
        view = self._object(slot.key, slot.offset + slot.byte_size, where)
        if data is None:
            return memoryview(view)[slot.offset:slot.offset + size].toreadonly()
        view[slot.offset:slot.offset + len(data)] = data
        return data

    def _object(self, key: str, need: int, where: str) -> mmap.mmap:
        """The whole object ``key``, mapped, from the cache while it is the same file (inode and size; a
        client that makes its object anew gets a new mapping): a camera hands every frame over in the same
        slot, and a mapping made per request would fault on each of its pages at first touch."""
        path = self.directory / key[1:]
        try:
            st = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            raise ShmError(f"{where}: no shared memory object {key} ({path})") from None
        except OSError as e:
            raise ShmError(f"{where}: cannot open {key}: {e.strerror or e}") from None
        if not stat.S_ISREG(st.st_mode):
            raise ShmError(f"{where}: {key} is not a shared memory object")
        if need > st.st_size:
            raise ShmError(f"{where}: the slot's {need} bytes run past the end of {key} ({st.st_size} bytes)")
        with self._lock:
            hit = self._objects.get(key)
            if hit is not None and hit[0] == (st.st_ino, st.st_size):
                self._objects.move_to_end(key)
                return hit[1]
        view = self._map(key, 0, st.st_size, where)
        with self._lock:
            self._objects[key] = ((st.st_ino, st.st_size), view)
            self._objects.move_to_end(key)
            while len(self._objects) > _OBJECTS_KEPT:
                _release(self._objects.popitem(last=False)[1][1])
        return view


_OBJECTS_KEPT = 32  # objects a gateway passed on, kept mapped (a few per camera or client on this host)


def _release(view: mmap.mmap) -> None:
    """Unmap ``view``, or leave that to its last reader: a request still holding an input read out of it (a
    zero-copy view) keeps the mapping alive until it is done."""
    try:
        view.close()
    except BufferError:
        pass


class OwnRegion:
    """The client's half: a shared-memory object this process makes under /dev/shm (``key`` ``/PREFIX-PID-
    RANDOM``, mode 600, ``size`` bytes), written with :meth:`write` and removed by :meth:`close` (the server
    only maps what a client registers; the client that made an object removes it)."""

    def __init__(self, size: int, prefix: str = "edgemux", directory: Path = SHM_DIR) -> None:
        self.key = f"/{prefix}-{os.getpid()}-{os.urandom(4).hex()}"
        self.size = size
        self.path = Path(directory) / self.key[1:]
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, max(1, size))
            self.view = mmap.mmap(fd, max(1, size))
        except BaseException:
            os.unlink(self.path)
            raise
        finally:
            os.close(fd)
        # removed when this object goes, or at exit, if nobody closed it: /dev/shm is memory
        self._finalizer = weakref.finalize(self, _remove, self.path)

    def write(self, offset: int, data: bytes) -> None:
        """Write ``data`` at ``offset`` (bytes)."""
        self.view[offset:offset + len(data)] = data

    def read(self, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset``."""
        return self.view[offset:offset + size]

    def close(self) -> None:
        """Unmap and remove the object (idempotent)."""
        if not self.view.closed:
            self.view.close()
        self._finalizer()

    def __enter__(self) -> OwnRegion:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)


def on_this_host(url: str) -> bool:
    """Whether a server at ``url`` runs on this host and shares its /dev/shm: its address is a loopback one
    and /dev/shm exists (a server reached over the network never is, whatever its host)."""
    import urllib.parse

    from edgemux.runtime.auth import is_loopback

    return SHM_DIR.is_dir() and is_loopback(urllib.parse.urlsplit(url).hostname or "")
