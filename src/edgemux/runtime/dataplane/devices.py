"""A node agent's devices: each device of the node with its backend and its worker, the requests in flight on
each (device, model), power switching and the devices' status.

Each device runs on a :class:`~edgemux.runtime.dataplane.backends.Backend`: real onnxruntime for a device of
kind ``cpu`` (and CUDA for ``gpu-discrete`` where onnxruntime offers it), emulated from profiles for
``edgetpu``, ``gpu-embedded``, ``fpga`` (and ``gpu-discrete`` without CUDA), unless configured otherwise
(:func:`default_backend`), and its requests queue on a
:class:`~edgemux.runtime.dataplane.worker.DeviceWorker`. Units: ``*_s`` seconds, ``*_mb`` MB.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from edgemux.cluster.state import Device, Node
from edgemux.errors import InputError
from edgemux.profiles.types import DeviceKind
from edgemux.runtime.dataplane.backends import (
    Backend,
    BackendError,
    EmulatedBackend,
    FormatBackend,
    OnnxRuntimeBackend,
    make_backend,
)
from edgemux.runtime.dataplane.errors import AgentError
from edgemux.runtime.dataplane.protocol import json_type
from edgemux.runtime.dataplane.worker import DEFAULT_MAX_QUEUE, DeviceWorker, Result
from edgemux.runtime.httputil import clip

if TYPE_CHECKING:
    from edgemux.runtime.dataplane.pieces import Piece

__all__ = ["DeviceSet", "default_backend", "listing"]

logger = logging.getLogger("edgemux.agent")


def default_backend(device: Device, *, threads: int = 1, seed: int = 0) -> Backend:
    """The backend a device gets unless configured: for ``cpu``, the real one by file format (onnxruntime,
    LiteRT for ``.tflite``); for ``edgetpu``, LiteRT with libedgetpu's delegate when it loads on this host
    (the device is real), else emulated; CUDA for ``gpu-discrete`` when this onnxruntime offers it; emulated
    from profiles otherwise (``gpu-embedded``, ``fpga``)."""
    if device.kind is DeviceKind.CPU:
        return FormatBackend(OnnxRuntimeBackend(threads))
    if device.kind is DeviceKind.EDGETPU:
        from edgemux.runtime.dataplane.litert import edgetpu_delegate_available

        real, why = edgetpu_delegate_available()
        if real:
            return make_backend("litert", threads=threads, delegate="edgetpu")
        logger.info("device %s: libedgetpu does not load here (%s); emulating it from profiles", device.path, why)
    if device.kind is DeviceKind.GPU_DISCRETE:
        try:
            return make_backend("cuda", threads=threads)
        except BackendError as e:
            logger.info("device %s: %s; emulating it from profiles", device.path, e.message)
    return EmulatedBackend(seed=seed)


class DeviceSet:
    """The devices of ``node``, each with its backend (``backends``: by device name, a :class:`Backend` or a
    ``make_backend`` kind; the others get :func:`default_backend` with ``threads`` intra-op threads, emulation
    seeded with ``seed`` + the device's index) and its worker (``max_queue``: each device's bound on waiting
    requests, one int or a mapping by device name). ``InputError`` naming the argument for a bad one."""

    def __init__(self, node: Node, backends: Mapping[str, Backend | str] | None = None, *, threads: int = 1,
                 seed: int = 0, max_queue: int | Mapping[str, int] = DEFAULT_MAX_QUEUE) -> None:
        self.node = node
        self.devices: dict[str, Device] = {d.name: d for d in node.devices}
        # Futures submitted per (device, model), so that unloading a model waits for its in-flight requests.
        self._pending: dict[tuple[str, str], set[concurrent.futures.Future[Result]]] = {}
        self._pending_lock = threading.Lock()
        configured = dict(backends or {})
        unknown = sorted(set(configured) - set(self.devices))
        if unknown:
            raise InputError("backends", f"unknown device {unknown[0]!r} on node {node.name} "
                                         f"(devices: {listing(self.devices)})")
        queues = max_queue if isinstance(max_queue, Mapping) else {d: max_queue for d in self.devices}
        self.backends: dict[str, Backend] = {}
        self.workers: dict[str, DeviceWorker] = {}
        for i, (name, dev) in enumerate(self.devices.items()):
            b = configured.get(name)
            if b is None:
                backend = default_backend(dev, threads=threads, seed=seed + i)
            elif isinstance(b, Backend):
                backend = b
            else:
                try:
                    backend = make_backend(b, **({"seed": seed + i} if b == "emulated" else {"threads": threads}))
                except BackendError as e:
                    raise InputError(f"backends.{name}", e.message) from None
            self.backends[name] = backend
        try:
            for name, dev in self.devices.items():
                self.workers[name] = DeviceWorker(dev, self.backends[name],
                                                  max_queue=int(queues.get(name, DEFAULT_MAX_QUEUE)))
        except ValueError as e:
            self.close(drain=False)
            raise InputError("max_queue", str(e)) from None

    def device(self, name: Any) -> Device:
        """The device ``name`` (or ``node/name``); ``AgentError`` 404 listing the devices otherwise."""
        if not isinstance(name, str):
            raise AgentError(f"'device' must be a string, got {json_type(name)}")
        local = name
        prefix = self.node.name + "/"
        if name.startswith(prefix):
            local = name[len(prefix):]
        dev = self.devices.get(local)
        if dev is None:
            raise AgentError(f"unknown device '{clip(name)}' on node {self.node.name} "
                             f"(devices: {listing(self.devices)})", 404)
        return dev

    @property
    def running(self) -> bool:
        """True while every device worker runs (none closed)."""
        return all(not w.closed for w in self.workers.values())

    # -- requests --------------------------------------------------------------------------------------

    def submit(self, device: str, app: str, model: str,
               inputs: Mapping[str, np.ndarray]) -> concurrent.futures.Future[Result]:
        """Queue one request of ``app`` for ``model`` on ``device``'s worker (raises at once: ``Overloaded``,
        ``InvalidInput``, ``WorkerClosed``, ``ModelNotFound``), tracked until it is done."""
        key = (device, model)
        fut = self.workers[device].submit(app, model, inputs)
        with self._pending_lock:
            self._pending.setdefault(key, set()).add(fut)
        fut.add_done_callback(lambda f: self._done(key, f))
        return fut

    def _done(self, key: tuple[str, str], fut: concurrent.futures.Future[Result]) -> None:
        with self._pending_lock:
            s = self._pending.get(key)
            if s is not None:
                s.discard(fut)
                if not s:
                    del self._pending[key]

    def drain(self, device: str, model: str, timeout_s: float) -> None:
        """Wait (at most ``timeout_s`` seconds) for the requests in flight for ``model`` on ``device``."""
        with self._pending_lock:
            pending = list(self._pending.get((device, model), ()))
        if pending:
            concurrent.futures.wait(pending, timeout=timeout_s)

    # -- power and status ------------------------------------------------------------------------------

    def set_power(self, device: str, state: str) -> dict[str, Any]:
        """``PUT /v1/devices/{device}/power``: switch ``device`` (its name on this node) ``on`` or ``off``
        (``DeviceWorker.set_power``: refused, 409, while it holds a model); ``AgentError`` 404 for an unknown
        device. Returns the device's name and state."""
        worker = self.workers.get(device)
        if worker is None:
            raise AgentError(f"node {self.node.name} has no device {clip(device)!r} "
                             f"(it has {', '.join(sorted(self.workers))})", 404)
        return {"device": device, "path": worker.device.path, "state": worker.set_power(state)}

    def status(self, pieces: Sequence[Piece]) -> list[dict[str, Any]]:
        """Each device's backend, loaded models (with the apps of ``pieces`` using them), queue, utilization
        and power, as ``GET /v1/node`` shows them."""
        devices = []
        for name, dev in self.devices.items():
            st = self.workers[name].stats()
            loaded = self.backends[name].loaded()
            users: dict[str, list[str]] = {}
            shown: dict[str, tuple[str, str | None]] = {}   # load key -> (source, profile)
            for r in pieces:
                if r.device == name:
                    users.setdefault(r.model, []).append(r.app)
                    shown[r.model] = (r.source or r.model, r.profile)
            devices.append({
                "name": name, "path": dev.path, "kind": dev.kind.value, "discipline": st["discipline"],
                "backend": st["backend"], "emulated": st["emulated"], "memory_mb": dev.memory_mb,
                "profile_set": dev.profile_set, "servers": st["servers"], "max_queue": st["max_queue"],
                "queue_depth": st["queued"], "inflight": st["inflight"], "executions": st["executions"],
                "utilization": st["utilization"], "window_s": st["window_s"], "closed": st["closed"],
                "power_state": st["power_state"],
                **({k: st[k] for k in ("power_w", "energy_j", "app_energy_j")} if "power_w" in st else {}),
                "loaded_models": [{"model": shown.get(m, (m, None))[0], "profile": shown.get(m, (m, None))[1],
                                   "memory_mb": i.memory_mb, "apps": sorted(users.get(m, [])),
                                   "provenance": i.provenance} for m, i in sorted(loaded.items())],
                "loaded_memory_mb": sum(i.memory_mb for i in loaded.values()),
            })
        return devices

    def close(self, drain: bool = True, timeout_s: float = 30.0) -> bool:
        """Stop the workers: ``drain=True`` executes what is queued first. True when every worker ended within
        ``timeout_s`` (s, shared by all)."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        ok = True
        for w in self.workers.values():
            ok = w.close(drain=drain, timeout_s=max(0.0, deadline - time.monotonic())) and ok
        return ok


def listing(names: Mapping[str, Any] | list[str]) -> str:
    """Names for an error message: sorted, the first 12, "none" for none."""
    items = sorted(list(names))
    shown = ", ".join(items[:12]) + (", ..." if len(items) > 12 else "")
    return shown or "none"
