"""Open-loop load generator: offered load against an Open Inference Protocol endpoint, measured latency.

:func:`run_load` sends ``POST {url}/v2/models/{app}/infer`` requests (to a gateway, or straight to an agent)
at instants drawn from the app's arrival process (Poisson or periodic, seeded, from
:func:`edgemux.sim.arrivals.arrival_times`, the same generator the simulator uses) and reports what came
back as a :class:`LoadReport`: counts, errors by HTTP status or failure kind, latency percentiles with a
confidence interval for the mean, throughput, SLO attainment and the server-reported queue/service times.

Why open loop: the estimators (``perf``) and the simulator model requests that arrive whatever the state of
the server, so queueing shows up as latency. A closed loop (send the next request when the last one
returns) would slow down with the server and hide exactly the queueing we want to compare with the
predictions. Here each request is sent at its scheduled instant whether or not earlier ones have returned.

Timing (real time, ``time.perf_counter``):

* a request's latency (ms) runs from its *actual* send (just before the request is handed to aiohttp) to the
  last byte of the response body; connection set-up, when the pool has no idle connection, is included,
  as any client would pay it;
* the *lateness* of a send (ms) is actual send time minus scheduled time. The generator cannot send early,
  only late (event-loop wake-up jitter, a busy CPU); ``send_lateness_mean_ms``/``send_lateness_max_ms`` make a
  client that cannot keep up visible instead of silently turning the offered process into a smoother one.
  A lateness comparable to the latencies means the measurement says more about the client than the server.
  The floor is about 0.5-1 ms: asyncio's epoll waits round timeouts up to whole milliseconds (spinning
  instead would take a core from a server on the same host);
* throughput (req/s) is the successful requests divided by the span from the first scheduled instant to
  the last successful completion (at least ``duration_s``), so a run whose tail drains late is not flattered.

Bounds (nothing hangs, nothing is lost silently): every request carries a total timeout of ``timeout_s``;
at most ``concurrency_limit`` requests are outstanding, and a request scheduled while that many are pending
is not sent but counted as the error ``client_limit`` (an open loop must not wait, or it would stop being
open). Error kinds: the HTTP status as a string (``"429"``, ``"503"``, ...), ``timeout``, ``connection``
(refused, reset, closed before the answer), ``malformed`` (a 200 whose body is not a valid inference
response), ``client_limit``; every scheduled request is either ok or counted under exactly one kind.

Units: ``*_ms`` milliseconds, ``*_s`` seconds, ``*_rps`` requests per second.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

from edgemux.cluster.workload import Arrival
from edgemux.errors import EdgemuxError, InputError
from edgemux.runtime.auth import auth_headers
from edgemux.runtime.httputil import quote
from edgemux.runtime.ingress.dispatch import Reply, server_message
from edgemux.runtime.dataplane.protocol import (
    DATATYPES,
    HEADER_LENGTH_HEADER,
    ProtocolError,
    ModelMetadata,
    TensorSpec,
    datatype_of,
    decode_infer_response,
    decode_model_metadata,
    encode_infer_request,
    tensor_bytes,
)
from edgemux.runtime.dataplane.shm import SHM_MIN_BYTES, OwnRegion, on_this_host
from edgemux.sim.arrivals import arrival_times
from edgemux.sim.stats import confidence_interval

__all__ = ["ARRIVALS", "SHM_MIN_BYTES", "SLO_STATS", "LoadError", "LoadReport", "default_inputs", "fetch_model_inputs",
           "fetch_model_metadata", "run_load", "schedule_ms"]

ARRIVALS = ("poisson", "periodic")
SLO_STATS = ("mean", "p50", "p95", "p99")
# Batch means for the CI of the mean latency: consecutive requests are correlated (they queue behind each
# other), so the i.i.d. standard error would be too narrow; means of 10 contiguous batches are nearly
# independent for runs much longer than a busy period. Fewer samples: fewer batches (at least 2 per batch).
CI_BATCHES = 10
CI_CONFIDENCE = 0.95
# Delay (s) between fixing the run's time origin and the first possible send: lets the scheduler enter its
# loop before the first instant, so an arrival at offset ~0 is not born late.
_START_LEAD_S = 0.005
# Metadata fetch timeout (s) is at least this: a gateway may have to ask an agent first.
_MIN_METADATA_TIMEOUT_S = 5.0


class LoadError(EdgemuxError):
    """The load run could not start (metadata unreachable or unusable); the message says why."""


# ------------------------------------------------------------------------------------------------ report


@dataclass
class DeviceStats:
    """What the successful responses one device served say (from the agent's response parameters).

    ``ok``: requests it answered; ``mean_ms``: their mean client-side latency (ms); ``queue_ms`` and
    ``service_ms``: mean ``edgemux_queue_ms``/``edgemux_service_ms`` it reported (ms; None when absent);
    ``emulated``: its ``edgemux_emulated`` flag (None when not reported)."""

    ok: int = 0
    mean_ms: float = math.nan
    queue_ms: float | None = None
    service_ms: float | None = None
    emulated: bool | None = None


@dataclass
class LoadReport:
    """The result of one :func:`run_load`.

    Counts: ``scheduled`` arrivals in ``[0, duration_s)``; ``sent`` (scheduled minus ``client_limit``);
    ``ok`` (HTTP 200 with a valid inference response); ``errors`` by kind (see the module docstring).
    Latency of ok requests (ms, from the actual send): ``p50_ms``, ``p95_ms``, ``p99_ms``, ``mean_ms``,
    ``min_ms``, ``max_ms`` (NaN when nothing succeeded) and ``mean_ci_ms``, the 95 % batch-means
    confidence interval of the mean (None with fewer than 4 ok requests). ``offered_rps`` is the requested
    rate, ``throughput_rps`` the achieved one (ok / ``elapsed_s``), ``elapsed_s`` the run's span (s).
    ``send_lateness_*_ms``: how late sends left versus their schedule. SLO (when ``slo_ms`` was given):
    ``slo_attainment`` is the fraction of ok requests within ``slo_ms``, ``slo_attainment_sent`` the same
    over every sent request (a failure counts as a miss), ``slo_observed_ms`` the measured ``slo_stat``
    (mean or percentile) and ``slo_met`` whether it is <= ``slo_ms``. ``server_queue_ms`` and
    ``server_service_ms`` average the agents' ``edgemux_queue_ms``/``edgemux_service_ms`` over the
    ``server_reported`` ok responses that carried them; ``by_device`` splits them per ``edgemux_device``.
    ``offsets_ms`` are the scheduled send instants (ms from the run's start), ``kinds`` each one's outcome
    ("ok" or its error kind, as counted in ``errors``; ``ok_mask`` which of them succeeded),
    ``latencies_ms`` the ok latencies and ``done_ms`` the ok answers' arrival instants (ms from the run's
    start), both in send order (arrays, left out of :meth:`to_dict` unless asked for).
    ``start_perf_s`` is the run's start on ``time.perf_counter``'s clock (s), to line other events up with.
    ``transport``: how the tensors travelled, "shm" (system shared memory), "binary" or "json".
    ``device_ms``: each ok answer's own queue + service as its agent reported them (NaN where it did not),
    in the order of ``latencies_ms``: ``latencies_ms - device_ms`` is what delivering each request cost.
    """

    app: str
    url: str
    arrivals: str
    seed: int
    offered_rps: float
    duration_s: float
    timeout_s: float
    scheduled: int
    sent: int
    ok: int
    errors: dict[str, int]
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float
    mean_ci_ms: tuple[float, float] | None
    throughput_rps: float
    elapsed_s: float
    send_lateness_mean_ms: float
    send_lateness_max_ms: float
    slo_ms: float | None = None
    slo_stat: str = "mean"
    slo_attainment: float | None = None
    slo_attainment_sent: float | None = None
    slo_observed_ms: float | None = None
    slo_met: bool | None = None
    server_queue_ms: float | None = None
    server_service_ms: float | None = None
    server_reported: int = 0
    by_device: dict[str, DeviceStats] = field(default_factory=dict)
    offsets_ms: np.ndarray = field(default_factory=lambda: np.empty(0), repr=False)
    latencies_ms: np.ndarray = field(default_factory=lambda: np.empty(0), repr=False)
    kinds: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=object), repr=False)
    done_ms: np.ndarray = field(default_factory=lambda: np.empty(0), repr=False)
    start_perf_s: float = 0.0
    transport: str = "binary"
    device_ms: np.ndarray = field(default_factory=lambda: np.empty(0), repr=False)

    @property
    def ok_mask(self) -> np.ndarray:
        """Which scheduled requests succeeded (bool array, send order)."""
        return np.asarray(self.kinds == "ok", dtype=bool)

    @property
    def failed(self) -> int:
        """Requests that did not succeed, ``client_limit`` included (``scheduled - ok``)."""
        return sum(self.errors.values())

    def to_dict(self, samples: bool = False) -> dict[str, Any]:
        """Plain JSON-ready data (NaN becomes None); ``samples=True`` adds ``offsets_ms``/``latencies_ms``."""
        d: dict[str, Any] = {}
        for k in ("app", "url", "transport", "arrivals", "seed", "offered_rps", "duration_s", "timeout_s",
                  "scheduled", "sent", "ok"):
            d[k] = getattr(self, k)
        d["errors"] = dict(sorted(self.errors.items()))
        for k in ("p50_ms", "p95_ms", "p99_ms", "mean_ms", "min_ms", "max_ms"):
            d[k] = _jnum(getattr(self, k))
        d["mean_ci_ms"] = list(self.mean_ci_ms) if self.mean_ci_ms is not None else None
        for k in ("throughput_rps", "elapsed_s", "send_lateness_mean_ms", "send_lateness_max_ms"):
            d[k] = _jnum(getattr(self, k))
        d["slo"] = None if self.slo_ms is None else {
            "latency_ms": self.slo_ms, "stat": self.slo_stat, "observed_ms": _jnum(self.slo_observed_ms),
            "met": self.slo_met, "attainment": _jnum(self.slo_attainment),
            "attainment_sent": _jnum(self.slo_attainment_sent)}
        d["server"] = {"queue_ms": _jnum(self.server_queue_ms), "service_ms": _jnum(self.server_service_ms),
                       "reported": self.server_reported,
                       "by_device": {name: {"ok": s.ok, "mean_ms": _jnum(s.mean_ms), "queue_ms": _jnum(s.queue_ms),
                                            "service_ms": _jnum(s.service_ms), "emulated": s.emulated}
                                     for name, s in sorted(self.by_device.items())}}
        if samples:
            d["offsets_ms"] = [float(x) for x in self.offsets_ms]
            d["latencies_ms"] = [float(x) for x in self.latencies_ms]
        return d


def _jnum(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


# ------------------------------------------------------------------------------------------------ inputs


def schedule_ms(rate_rps: float, duration_s: float, arrivals: str = "poisson", seed: int = 0) -> np.ndarray:
    """The scheduled send instants (ms from the run's start, sorted) in ``[0, duration_s)``: a Poisson
    process at ``rate_rps`` req/s, or periodic frames at ``rate_rps`` fps with a random phase, drawn from
    ``numpy.random.default_rng(seed)`` exactly as the simulator draws them (so a seed fixes the offsets)."""
    _check_rate_duration(rate_rps, duration_s)
    if arrivals not in ARRIVALS:
        raise InputError("arrivals", f"expected one of {', '.join(ARRIVALS)}, got {arrivals!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError("seed", f"must be an integer >= 0, got {seed!r}")
    process = Arrival.poisson(rate_rps) if arrivals == "poisson" else Arrival.periodic(rate_rps)
    return arrival_times(process, np.random.default_rng(seed), horizon_ms=duration_s * 1000.0)


def default_inputs(specs: list[TensorSpec], seed: int = 0) -> dict[str, np.ndarray]:
    """One seeded random tensor per declared input: every variable dimension (-1, the batch one included)
    becomes 1; floats are standard normal, integers uniform in their type's range clipped to [0, 255]
    (image-like and valid as indices of small tables), BOOL fair coins, BYTES short ASCII strings."""
    # Its own stream (seed, 1): the inputs must not shift the arrival stream drawn from default_rng(seed).
    rng = np.random.default_rng([seed, 1])
    out: dict[str, np.ndarray] = {}
    for s in specs:
        shape = tuple(1 if d < 0 else d for d in s.shape)
        dtype = DATATYPES[s.datatype]
        if s.datatype == "BYTES":
            flat = [bytes(rng.integers(97, 123, 8, dtype=np.uint8)) for _ in range(math.prod(shape))]
            arr = np.empty(len(flat), dtype=object)
            arr[:] = flat
            out[s.name] = arr.reshape(shape)
        elif s.datatype == "BOOL":
            out[s.name] = rng.integers(0, 2, shape).astype(np.bool_)
        elif dtype.kind == "f":
            out[s.name] = rng.standard_normal(shape).astype(dtype)
        else:
            hi = min(int(np.iinfo(dtype).max), 255)
            out[s.name] = rng.integers(0, hi + 1, shape).astype(dtype)
    return out


async def fetch_model_inputs(session: aiohttp.ClientSession, url: str, app: str, timeout_s: float) -> list[TensorSpec]:
    """The declared inputs of ``app`` from ``GET {url}/v2/models/{app}`` (Open Inference Protocol model
    metadata); :class:`LoadError` when it cannot be fetched or declares no usable input."""
    return list((await fetch_model_metadata(session, url, app, timeout_s)).inputs)


async def fetch_model_metadata(session: aiohttp.ClientSession, url: str, app: str, timeout_s: float) -> ModelMetadata:
    """``app``'s model metadata from ``GET {url}/v2/models/{app}``; :class:`LoadError` when it cannot be
    fetched or declares no usable input."""
    meta_url = f"{url}/v2/models/{quote(app)}"
    try:
        async with session.get(meta_url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            reply = Reply(resp.status, resp.headers, await resp.read())
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        raise LoadError(f"cannot fetch model metadata from {meta_url}: {_exc_text(e)}") from None
    if reply.status != 200:
        raise LoadError(f"cannot fetch model metadata from {meta_url}: HTTP {reply.status}: "
                        f"{server_message(reply)}")
    try:
        meta = decode_model_metadata(reply.body)
    except ProtocolError as e:
        raise LoadError(f"cannot use the model metadata from {meta_url}: {e.message}") from None
    if not meta.inputs:
        raise LoadError(f"model metadata from {meta_url} lists no inputs")
    return meta


# --------------------------------------------------------------------------------------------------- run


@dataclass
class _Outcome:
    """One request's fate: ``kind`` "ok" or an error kind; times in ms."""

    index: int
    kind: str
    lateness_ms: float = math.nan
    latency_ms: float = math.nan
    done_s: float = math.nan  # perf_counter at completion (s)
    params: dict[str, Any] = field(default_factory=dict)


async def run_load(
    url: str,
    app: str,
    *,
    rate_rps: float,
    duration_s: float,
    arrivals: str = "poisson",
    inputs: Mapping[str, np.ndarray] | None = None,
    seed: int = 0,
    timeout_s: float = 5.0,
    binary: bool = True,
    slo_ms: float | None = None,
    slo_stat: str = "mean",
    concurrency_limit: int = 1000,
    key: str | None = None,
    shm: bool | None = None,
) -> LoadReport:
    """Offer ``app`` an open-loop load at ``rate_rps`` req/s for ``duration_s`` s and measure it.

    ``url``: the gateway's (or an agent's) base URL; requests go to ``{url}/v2/models/{app}/infer`` over one
    keep-alive ``aiohttp.ClientSession``. ``arrivals``: "poisson" or "periodic" (fps = ``rate_rps``), seeded
    by ``seed``. ``inputs``: name → array sent in every request; None fetches the model metadata and builds
    :func:`default_inputs`. ``timeout_s``: total per-request timeout (s). ``binary``: Triton's binary tensor
    extension (else JSON data). ``slo_ms``/``slo_stat`` ("mean", "p50", "p95", "p99"): the SLO to score.
    ``concurrency_limit``: most requests outstanding at once (see the module docstring). ``key``: the app's
    key or the cluster's admin token, sent as ``Authorization: Bearer`` with every request (``runtime.auth``;
    None: none, for an open cluster). ``shm``: hand the tensors over in system shared memory (Triton's
    extension; ``transport`` "shm" in the report): the inputs are written once into a region this run makes
    and registers, and the outputs of fixed size come back into another (every request writes the same
    slots: the load measures, it does not read answers); None: when the endpoint is on this host
    (``dataplane.shm.on_this_host``), the request's tensors are at least ``SHM_MIN_BYTES`` and the server
    takes the registration, else binary or JSON as ``binary`` says.

    Raises :class:`~edgemux.errors.InputError` for a bad argument and :class:`LoadError` when the metadata
    is needed and cannot be had; request failures never raise, they are counted in the report.
    """
    _check_rate_duration(rate_rps, duration_s)
    if arrivals not in ARRIVALS:
        raise InputError("arrivals", f"expected one of {', '.join(ARRIVALS)}, got {arrivals!r}")
    if not isinstance(app, str) or not app:
        raise InputError("app", f"must be a non-empty name, got {app!r}")
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
        raise InputError("timeout_s", f"must be a number > 0 s, got {timeout_s!r}")
    if slo_ms is not None and not (isinstance(slo_ms, (int, float)) and math.isfinite(slo_ms) and slo_ms > 0):
        raise InputError("slo_ms", f"must be a number > 0 ms, got {slo_ms!r}")
    if slo_stat not in SLO_STATS:
        raise InputError("slo_stat", f"expected one of {', '.join(SLO_STATS)}, got {slo_stat!r}")
    if isinstance(concurrency_limit, bool) or not isinstance(concurrency_limit, int) or concurrency_limit < 1:
        raise InputError("concurrency_limit", f"must be an integer >= 1, got {concurrency_limit!r}")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InputError("url", f"must be http(s)://host[:port], got {url!r}")
    url = url.rstrip("/")

    offsets = schedule_ms(rate_rps, duration_s, arrivals, seed)
    # The pool may open as many connections as requests may be outstanding: a smaller pool would queue
    # requests inside aiohttp, after their "send" was stamped, and count client waiting as server latency.
    connector = aiohttp.TCPConnector(limit=concurrency_limit, limit_per_host=0)
    async with aiohttp.ClientSession(connector=connector, headers=auth_headers(key)) as session, \
            contextlib.AsyncExitStack() as cleanup:
        meta = None
        metadata_timeout_s = max(timeout_s, _MIN_METADATA_TIMEOUT_S)
        if inputs is None:
            meta = await fetch_model_metadata(session, url, app, metadata_timeout_s)
        elif shm is True or (shm is None and on_this_host(url)):
            try:  # the outputs' sizes, for their region
                meta = await fetch_model_metadata(session, url, app, metadata_timeout_s)
            except LoadError:
                if shm:
                    raise  # asked for: say why it cannot be had
                # unreachable: the requests will say so, each counted
        if inputs is None:
            assert meta is not None
            inputs = default_inputs(list(meta.inputs), seed)
        try:
            # Every request carries the same tensors: encode once, so the client's CPU goes to sending.
            body, headers = encode_infer_request(inputs, binary=binary)
        except ValueError as e:
            raise InputError("inputs", str(e)) from None
        transport = "binary" if binary else "json"
        small = shm is None and sum(np.asarray(a).nbytes for a in inputs.values()) < SHM_MIN_BYTES
        if meta is not None and shm is not False and not small:
            shared = await _shared_memory(session, url, inputs, meta, timeout_s, cleanup, required=shm is True)
            if shared is not None:
                (body, headers), transport = shared, "shm"
        infer_url = f"{url}/v2/models/{quote(app)}/infer"
        per_request = aiohttp.ClientTimeout(total=timeout_s)
        outcomes: list[_Outcome] = []
        tasks: list[asyncio.Task[_Outcome]] = []
        outstanding = 0  # requests created and not finished; only touched on the event loop's thread

        async def one(index: int, scheduled_s: float) -> _Outcome:
            nonlocal outstanding
            sent_s = time.perf_counter()
            lateness_ms = (sent_s - scheduled_s) * 1000.0
            try:
                async with session.post(infer_url, data=body, headers=headers, timeout=per_request) as resp:
                    raw = await resp.read()
                    done_s = time.perf_counter()
                    status, hlen = resp.status, resp.headers.get(HEADER_LENGTH_HEADER)
            except asyncio.TimeoutError:  # first: aiohttp's timeouts are also ClientConnectionErrors
                return _Outcome(index, "timeout", lateness_ms)
            except (aiohttp.ClientError, OSError):  # refused, reset, closed early, a payload cut short
                return _Outcome(index, "connection", lateness_ms)
            finally:
                outstanding -= 1
            if status != 200:
                return _Outcome(index, str(status), lateness_ms)
            try:
                params = decode_infer_response(raw, hlen).parameters
            except ProtocolError:
                return _Outcome(index, "malformed", lateness_ms)
            return _Outcome(index, "ok", lateness_ms, (done_s - sent_s) * 1000.0, done_s, params)

        t0 = time.perf_counter() + _START_LEAD_S
        for i, off in enumerate(offsets):
            scheduled_s = t0 + float(off) / 1000.0
            delay = scheduled_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if outstanding >= concurrency_limit:
                outcomes.append(_Outcome(i, "client_limit"))
                continue
            outstanding += 1  # counted now, not when the task first runs, so a burst cannot overshoot
            tasks.append(asyncio.create_task(one(i, scheduled_s)))
        # Every request ends within timeout_s of its send (aiohttp's total timeout), so this wait is bounded.
        outcomes.extend(await asyncio.gather(*tasks))
    report = _report(url, app, arrivals, seed, rate_rps, duration_s, timeout_s, offsets, outcomes, t0,
                     slo_ms, slo_stat)
    report.transport = transport
    return report


async def _shared_memory(session: aiohttp.ClientSession, url: str, inputs: Mapping[str, np.ndarray],
                         meta: ModelMetadata, timeout_s: float, cleanup: contextlib.AsyncExitStack,
                         required: bool) -> tuple[bytes, dict[str, str]] | None:
    """Put ``inputs`` into a region made and registered for this run, and a region for the outputs of
    fixed size: the request body naming their slots (and its headers). Everything is unregistered and
    removed when ``cleanup`` closes. None when the server does not take the registration and shared memory
    was not ``required`` (``LoadError`` when it was)."""
    blobs = {n: tensor_bytes(np.asarray(a), datatype_of(np.asarray(a).dtype, n)) for n, a in inputs.items()}
    batch = next(iter(inputs.values())).shape[0] if inputs and next(iter(inputs.values())).ndim else 1
    sizes = {o.name: math.prod(batch if i == 0 and d < 0 else d for i, d in enumerate(o.shape))
             * DATATYPES[o.datatype].itemsize for o in meta.outputs
             if o.datatype != "BYTES" and all(d >= 0 for d in o.shape[1:])}
    tag = os.urandom(4).hex()
    regions = []
    for part, total in (("in", sum(len(b) for b in blobs.values())), ("out", sum(sizes.values()))):
        if total == 0:
            continue
        own = OwnRegion(total, prefix="edgemux-load")
        cleanup.callback(own.close)
        name = f"load-{tag}-{part}"
        register = f"{url}/v2/systemsharedmemory/region/{quote(name)}/register"
        try:
            async with session.post(register, json={"key": own.key, "offset": 0, "byte_size": total},
                                    timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                reply = Reply(resp.status, resp.headers, await resp.read())
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            reply = Reply(599, {}, _exc_text(e).encode())
        if reply.status != 200:
            if required:
                raise LoadError(f"cannot register shared memory at {url}: HTTP {reply.status}: {server_message(reply)}")
            return None
        cleanup.push_async_callback(_unregister, session, f"{url}/v2/systemsharedmemory/region/{quote(name)}/unregister")
        regions.append((part, own, name))
    named = {part: (own, name) for part, own, name in regions}
    entries, offset = [], 0
    for n, a in inputs.items():
        own, name = named["in"]
        own.write(offset, blobs[n])
        arr = np.asarray(a)
        entries.append({"name": n, "datatype": datatype_of(arr.dtype, n), "shape": list(arr.shape),
                        "parameters": {"shared_memory_region": name, "shared_memory_byte_size": len(blobs[n]),
                                       "shared_memory_offset": offset}})
        offset += len(blobs[n])
    outputs, offset = [], 0
    for o in meta.outputs:
        if o.name in sizes:
            own, name = named["out"]
            outputs.append({"name": o.name, "parameters": {"shared_memory_region": name, "shared_memory_offset":
                                                           offset, "shared_memory_byte_size": sizes[o.name]}})
            offset += sizes[o.name]
        else:
            outputs.append({"name": o.name, "parameters": {"binary_data": True}})
    header = {"inputs": entries, "outputs": outputs}
    return json.dumps(header, separators=(",", ":")).encode("utf-8"), {"Content-Type": "application/json"}


async def _unregister(session: aiohttp.ClientSession, url: str) -> None:
    """Unregister one of the run's regions (best effort: the server forgets them when the app goes)."""
    try:
        async with session.post(url, timeout=aiohttp.ClientTimeout(total=5.0)) as resp:
            await resp.read()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        pass


def _report(url: str, app: str, arrivals: str, seed: int, rate_rps: float, duration_s: float, timeout_s: float,
            offsets: np.ndarray, outcomes: list[_Outcome], t0: float, slo_ms: float | None,
            slo_stat: str) -> LoadReport:
    outcomes = sorted(outcomes, key=lambda o: o.index)
    ok = [o for o in outcomes if o.kind == "ok"]
    errors: dict[str, int] = {}
    for o in outcomes:
        if o.kind != "ok":
            errors[o.kind] = errors.get(o.kind, 0) + 1
    lat = np.array([o.latency_ms for o in ok], dtype=float)  # send order: what batch means need
    late = np.array([o.lateness_ms for o in outcomes if o.kind != "client_limit"], dtype=float)
    nan = math.nan
    if lat.size:
        p50, p95, p99 = (float(v) for v in np.percentile(lat, [50, 95, 99]))
        mean, lo_ms, hi_ms = float(lat.mean()), float(lat.min()), float(lat.max())
    else:
        p50 = p95 = p99 = mean = lo_ms = hi_ms = nan
    last_done = max((o.done_s for o in ok), default=t0)
    elapsed = max(duration_s, last_done - t0)

    slo_att = slo_att_sent = slo_obs = None
    slo_met = None
    sent = len(outcomes) - errors.get("client_limit", 0)
    if slo_ms is not None and lat.size:
        within = int(np.count_nonzero(lat <= slo_ms))
        slo_att = within / lat.size
        slo_att_sent = within / sent if sent else None
        slo_obs = {"mean": mean, "p50": p50, "p95": p95, "p99": p99}[slo_stat]
        slo_met = bool(slo_obs <= slo_ms)
    elif slo_ms is not None:
        slo_att, slo_att_sent, slo_met = 0.0, (0.0 if sent else None), False

    queue = [float(o.params["edgemux_queue_ms"]) for o in ok if _is_num(o.params.get("edgemux_queue_ms"))]
    service = [float(o.params["edgemux_service_ms"]) for o in ok if _is_num(o.params.get("edgemux_service_ms"))]
    by_device: dict[str, DeviceStats] = {}
    for name in sorted({str(o.params["edgemux_device"]) for o in ok if "edgemux_device" in o.params}):
        mine = [o for o in ok if str(o.params.get("edgemux_device")) == name]
        q = [float(o.params["edgemux_queue_ms"]) for o in mine if _is_num(o.params.get("edgemux_queue_ms"))]
        s = [float(o.params["edgemux_service_ms"]) for o in mine if _is_num(o.params.get("edgemux_service_ms"))]
        flags = {o.params.get("edgemux_emulated") for o in mine}
        emulated = flags.pop() if len(flags) == 1 else None  # a device that says both is not trusted either way
        by_device[name] = DeviceStats(
            ok=len(mine), mean_ms=float(np.mean([o.latency_ms for o in mine])),
            queue_ms=float(np.mean(q)) if q else None, service_ms=float(np.mean(s)) if s else None,
            emulated=emulated if isinstance(emulated, bool) else None)

    return LoadReport(
        app=app, url=url, arrivals=arrivals, seed=seed, offered_rps=float(rate_rps), duration_s=float(duration_s),
        timeout_s=float(timeout_s), scheduled=len(outcomes), sent=sent, ok=len(ok), errors=errors,
        p50_ms=p50, p95_ms=p95, p99_ms=p99, mean_ms=mean, min_ms=lo_ms, max_ms=hi_ms,
        mean_ci_ms=_batch_means_ci(lat), throughput_rps=len(ok) / elapsed, elapsed_s=elapsed,
        send_lateness_mean_ms=float(late.mean()) if late.size else nan,
        send_lateness_max_ms=float(late.max()) if late.size else nan,
        slo_ms=None if slo_ms is None else float(slo_ms), slo_stat=slo_stat, slo_attainment=slo_att,
        slo_attainment_sent=slo_att_sent, slo_observed_ms=slo_obs, slo_met=slo_met,
        server_queue_ms=float(np.mean(queue)) if queue else None,
        server_service_ms=float(np.mean(service)) if service else None,
        server_reported=max(len(queue), len(service)), by_device=by_device,
        offsets_ms=np.asarray(offsets, dtype=float), latencies_ms=lat,
        kinds=np.array([o.kind for o in outcomes], dtype=object),
        done_ms=np.array([(o.done_s - t0) * 1000.0 for o in ok], dtype=float), start_perf_s=t0,
        device_ms=np.array([float(o.params["edgemux_queue_ms"]) + float(o.params["edgemux_service_ms"])
                            if _is_num(o.params.get("edgemux_queue_ms")) and _is_num(o.params.get("edgemux_service_ms"))
                            else nan for o in ok], dtype=float))


def _batch_means_ci(lat: np.ndarray) -> tuple[float, float] | None:
    """95 % Student-t interval (ms) of the mean latency from the means of contiguous batches (in send
    order); None below 4 samples, where two batches of two are the least that says anything."""
    if lat.size < 4:
        return None
    batches = min(CI_BATCHES, lat.size // 2)
    means = [float(b.mean()) for b in np.array_split(lat, batches)]
    ci = confidence_interval(means, CI_CONFIDENCE)
    return (ci.lo, ci.hi)


# ------------------------------------------------------------------------------------------------ helpers


def _check_rate_duration(rate_rps: Any, duration_s: Any) -> None:
    if isinstance(rate_rps, bool) or not isinstance(rate_rps, (int, float)) or not (
        math.isfinite(rate_rps) and rate_rps > 0
    ):
        raise InputError("rate", f"must be a number > 0 req/s, got {rate_rps!r}")
    if isinstance(duration_s, bool) or not isinstance(duration_s, (int, float)) or not (
        math.isfinite(duration_s) and duration_s > 0
    ):
        raise InputError("duration", f"must be a number > 0 s, got {duration_s!r}")


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _exc_text(e: BaseException) -> str:
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
