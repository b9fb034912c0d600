"""An agent's request path, whatever protocol a request came by: HTTP (``agent._Handlers``) and gRPC
(``dataplane.grpcservice``) each decode a request into an ``InferRequest`` and encode the outputs their way;
everything between is here, once: the app's piece, policing (unless a gateway did), validation against the
served interface, the device's queue and its wait, the interface's conversions, and the counting (statistics,
metrics, observations). Also the answers both protocols give alike: readiness, the repository index, and the
error table that turns an exception into a status (HTTP) and, through it, a gRPC status code.

Units: ``*_s`` seconds, ``*_ms`` milliseconds.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from edgemux.errors import EdgemuxError
from edgemux.runtime.dataplane.backends import BackendError, ModelNotFound
from edgemux.runtime.dataplane.errors import AgentError, Fenced, OverContract
from edgemux.runtime.dataplane.pieces import Piece
from edgemux.runtime.dataplane.protocol import (
    DATATYPES,
    InferRequest,
    InputTensor,
    ProtocolError,
    short_repr,
    validate_request,
)
from edgemux.runtime.dataplane.shm import ShmError
from edgemux.runtime.dataplane.worker import Overloaded, Result, WorkerClosed
from edgemux.runtime.httputil import Answer, ErrorTable, clip, retry_after_header

if TYPE_CHECKING:
    from edgemux.runtime.dataplane.agent import Agent

__all__ = ["ERRORS", "MODEL_VERSION", "RequestPath", "raw_request", "result_within"]

logger = logging.getLogger("edgemux.agent")

MODEL_VERSION = "1"  # one version per app: re-registering an app replaces its model in place

# The agent's errors as answers (runtime.httputil.ErrorTable: the first matching row wins): a full queue
# (503), policing (429) and fencing (503: dataplane.lease) say when to come back.
ERRORS = ErrorTable((
    ((Overloaded, OverContract, Fenced), lambda e: Answer(e.status, e.message,
                                                  headers={"Retry-After": retry_after_header(e.retry_after_s)})),
    ((ProtocolError, BackendError, AgentError, ShmError), lambda e: Answer(e.status, e.message)),
    (EdgemuxError, lambda e: Answer(400, str(e))),  # InputError and friends: the request's fault
), logger)

T = TypeVar("T")
# (the piece) -> (the decoded request, perf_counter when decoding began: the transport's reading is not its cost)
Decode = Callable[[Piece], Awaitable[tuple[InferRequest, float]]]
# (the piece, the request, the outputs by name, the answer's parameters) -> the protocol's answer
Encode = Callable[[Piece, InferRequest, Mapping[str, np.ndarray], dict[str, Any]], Awaitable[T]]


class RequestPath:
    """What an agent does with one inference request between decoding it and encoding its answer."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def piece(self, app: str, version: str | None = None) -> Piece:
        """The piece that answers for ``app`` (a split app's pieces take the same tensors, so any does);
        ``AgentError`` 404 for an unknown app or a version other than ``MODEL_VERSION`` (None or "": any)."""
        piece = self.agent.next_piece(app)
        if version and version != MODEL_VERSION:
            raise AgentError(f"model '{piece.app}' has no version '{clip(version)}' (versions: {MODEL_VERSION})", 404)
        return piece

    def not_serving(self, app: str) -> str:
        """Why ``app`` is not served here now ("" when it is: the agent is ready, not fenced for the app, and
        every piece's model is loaded on a device that runs)."""
        agent = self.agent
        if not agent.ready:
            return "agent not ready"
        fenced = agent.lease.why(app)
        if fenced:
            return fenced
        down = [r.device for r in agent.pieces(app)
                if agent.workers[r.device].closed or r.model not in agent.backends[r.device].loaded()]
        return f"device {down[0]} does not serve it" if down else ""

    def index(self, ready_only: bool) -> list[dict[str, str]]:
        """Triton's repository index of the apps served here: each ``READY``, or ``UNAVAILABLE`` with the
        reason (``ready_only``: the ready ones alone)."""
        out = []
        for app in sorted({p.app for p in self.agent.all_pieces()}):
            why = self.not_serving(app)
            if ready_only and why:
                continue
            out.append({"name": app, "version": MODEL_VERSION, "state": "UNAVAILABLE" if why else "READY",
                        "reason": why})
        return out

    async def serve(self, app: str, version: str | None, upstream: bool, decode: Decode, encode: Encode[T],
                    owner: Callable[[], str] = lambda: "") -> T:
        """Answer one inference request for ``app``: police it (``upstream``: a gateway did, so it only takes
        its token), decode, run, encode, and count it (see the agent's module docstring). ``owner()``: whose
        shared-memory regions its tensors may lie in (``dataplane.shm.principal`` of its credential), asked
        only of a request that uses shared memory. A fenced agent (``dataplane.lease``) refuses it first:
        ``Fenced`` (503), before it takes a token or reads the body."""
        started = time.perf_counter()
        agent = self.agent
        if app not in agent.table:
            agent.metrics.unknown_app.inc()
        piece = self.piece(app, version)
        device_path = agent.devices[piece.device].path
        wait_s = 0.0
        try:
            fenced = agent.lease.why(piece.app)
            if fenced:
                agent.metrics.fenced.labels(piece.app).inc()
                raise Fenced(fenced, agent.heartbeat_s)
            if upstream:
                agent.contracts.charge(piece.app)
            else:
                wait_s = agent.contracts.police(piece.app)
                if wait_s > 0:
                    await asyncio.sleep(wait_s)
            answer, result, input_ms, output_ms = await self._run(piece, decode, encode, owner)
        except Exception as e:
            agent.stats.failed(piece.app, (time.perf_counter() - started) * 1000.0)
            status, reason = _rejection(e)
            agent.metrics.requests.labels(piece.app, device_path, str(status)).inc()
            if reason is not None:
                agent.metrics.rejections.labels(piece.app, reason).inc()
            if not upstream:
                if status in (429, 503):
                    agent.tally.refused(piece.app)
                elif status >= 500:
                    agent.tally.failed(piece.app)
                # other 4xx: the request was malformed, not served badly; it is the client's, not the app's load
            raise
        elapsed_s = time.perf_counter() - started
        agent.stats.succeeded(piece.app, result.batch_size, elapsed_s * 1000.0, input_ms, result.queue_ms,
                              result.service_ms, output_ms)
        ok, latency, queue_wait = agent.metrics.served(piece.app, device_path)
        ok.inc()
        latency.observe(elapsed_s)
        queue_wait.observe(result.queue_ms / 1000.0)
        if not upstream:
            agent.tally.answered(piece.app, elapsed_s * 1000.0, wait_s * 1000.0)
        agent.tally.served(piece.app, piece.profile or piece.model, result.queue_ms, result.service_ms,
                           result.switch_ms > 0)
        return answer

    async def _run(self, piece: Piece, decode: Decode, encode: Encode[T],
                   owner: Callable[[], str]) -> tuple[T, Result, float, float]:
        """Run one request on ``piece``: (the answer, the worker's result, ms spent decoding and converting the
        request, ms spent converting and encoding the answer)."""
        agent = self.agent
        loop = asyncio.get_running_loop()
        req, t_in = await decode(piece)
        shm = owner() if req.uses_shm else None
        if shm is not None:
            agent.regions.read_inputs(shm, req)
        for moved in (False, True):
            converter = piece.converter
            served = piece.info if converter is None else converter.interface
            validate_request(req, piece.app, served.inputs, served.outputs)
            timeout_s = _timeout_s(req, agent.request_timeout_s)  # after the inputs: their errors come first
            arrays = {t.name: t.data for t in req.inputs}
            if converter is not None and not converter.identity:  # resizing a picture takes ms: off the loop
                arrays = await loop.run_in_executor(None, converter.inputs, arrays)
            try:
                t_submit = time.perf_counter()
                fut = agent.submit(piece, arrays)
                break
            except ModelNotFound:
                # the app moved off this piece between its pick and now (a re-PUT elsewhere released it): make
                # before break means its new piece is in place, so the request goes there, once
                if moved or piece.app not in agent.table:
                    raise AgentError(f"app '{piece.app}' was removed from device {piece.device} while the "
                                     f"request arrived", 404) from None
                piece = agent.next_piece(piece.app)
        try:
            result = await result_within(fut, timeout_s)
        except TimeoutError:
            fut.cancel()  # still queued: the worker drops it; already executing: its result is discarded
            raise AgentError(f"app '{piece.app}': no result within {timeout_s:g} s on device "
                             f"{agent.devices[piece.device].path} (request timeout)", 504) from None
        t_out = time.perf_counter()
        params = {"edgemux_device": result.device, "edgemux_emulated": result.emulated,
                  "edgemux_queue_ms": round(result.queue_ms, 3), "edgemux_service_ms": round(result.service_ms, 3),
                  "edgemux_batch_size": result.batch_size}
        outputs = (result.outputs if converter is None or converter.identity
                   else await loop.run_in_executor(None, converter.outputs, result.outputs))
        if shm is not None:
            agent.regions.write_outputs(shm, req, outputs)
        answer = await encode(piece, req, outputs, params)
        return answer, result, (t_submit - t_in) * 1000.0, (time.perf_counter() - t_out) * 1000.0


def _rejection(e: BaseException) -> tuple[int, str | None]:
    """The status a failed inference gets, and its rejection reason for the metrics (None: a 500)."""
    status = ERRORS.answer(e).status
    if isinstance(e, Overloaded):
        return status, "queue_full"
    if isinstance(e, OverContract):
        return status, "rate_limited"
    if isinstance(e, Fenced):
        return status, "fenced"
    if isinstance(e, WorkerClosed):
        return status, "closed"
    reasons = {504: "timeout", 413: "too_large", 404: "not_loaded", 503: "closed"}
    if status in reasons:
        return status, reasons[status]
    if 400 <= status < 500:
        return status, "bad_request"
    return status, None


async def result_within(fut: concurrent.futures.Future[Result], timeout_s: float) -> Result:
    """The worker's result, awaited on the event loop; ``TimeoutError`` after ``timeout_s`` seconds. A
    cancelled wait (the client went away) cancels ``fut``, so a queued request is dropped.

    ``asyncio.wait_for(asyncio.wrap_future(fut))`` does the same with two more futures and their chained
    callbacks; on the agent's hot path one waiter and one timer are enough."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def wake(_: concurrent.futures.Future[Result]) -> None:  # on the worker's thread
        try:
            loop.call_soon_threadsafe(_settle, waiter)
        except RuntimeError:  # the loop closed meanwhile: nobody waits any more
            pass

    fut.add_done_callback(wake)
    timer = loop.call_later(timeout_s, _expire, waiter)
    try:
        await waiter
    except asyncio.CancelledError:
        fut.cancel()
        raise
    finally:
        timer.cancel()
    return fut.result()


def _settle(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


def raw_request(body: bytes, piece: Piece) -> InferRequest:
    """A raw binary request (``Inference-Header-Content-Length: 0``: the body is the bytes of the app's one
    input, no JSON): its input from the app's served tensors, a variable leading dimension deduced from the
    body's size, every output asked for as binary. ``AgentError`` 400 naming what was expected and what came."""
    inputs = piece.interface.inputs
    app = piece.app
    if len(inputs) != 1:
        raise AgentError(f"a raw binary request (Inference-Header-Content-Length: 0) needs a model with one input; "
                         f"app '{app}' takes {len(inputs)} ({', '.join(t.name for t in inputs)})")
    (spec,) = inputs
    if spec.datatype == "BYTES":
        raise AgentError(f"a raw binary request cannot carry input '{spec.name}' of datatype BYTES (its elements "
                         "have no fixed size): send it with a JSON header")
    dtype = np.dtype(DATATYPES[spec.datatype])
    fixed = math.prod(d for d in spec.shape if d >= 0) * dtype.itemsize
    variable = [i for i, d in enumerate(spec.shape) if d < 0]
    shape = list(spec.shape)
    want = "[" + ",".join(str(d) for d in spec.shape) + "]"
    if len(variable) > 1:
        raise AgentError(f"a raw binary request cannot say the shape of input '{spec.name}' {spec.datatype} {want}: "
                         "more than one variable dimension; send it with a JSON header")
    if variable:
        if fixed == 0 or len(body) % fixed or not body:
            raise AgentError(f"unexpected size of raw binary input '{spec.name}': expected a multiple of {fixed} "
                             f"bytes ({spec.datatype} {want}), got {len(body)}")
        shape[variable[0]] = len(body) // fixed
    elif len(body) != fixed:
        raise AgentError(f"unexpected size of raw binary input '{spec.name}': expected {fixed} bytes "
                         f"({spec.datatype} {want}), got {len(body)}")
    data = np.frombuffer(body, dtype=dtype.newbyteorder("<")).reshape(shape)
    return InferRequest(id=None, parameters={}, inputs=[InputTensor(spec.name, spec.datatype, tuple(shape), data)],
                        outputs=[], binary_data_output=True)


def _timeout_s(req: InferRequest, limit_s: float) -> float:
    """The request's wait bound (s): the agent's, or less when the request's ``timeout`` parameter (µs, as
    tritonclient sends it) asks for less; 0 means "no request-level bound"."""
    raw = req.parameters.get("timeout")
    if raw is None:
        return limit_s
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise ProtocolError(f"request parameter 'timeout' must be a non-negative integer (microseconds), "
                            f"got {short_repr(raw)}")
    return limit_s if raw == 0 else min(limit_s, raw / 1e6)
