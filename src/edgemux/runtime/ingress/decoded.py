"""The gateway's path for a request it has to decode: one that came by gRPC, or one whose tensors lie in the
caller's shared memory (``dataplane.shm``, Triton's system shared memory extension). Everything else the
gateway passes on undecoded (``gateway.Gateway.infer``).

Shared memory is the caller's host's: the gateway, on that host, reads the inputs out of the caller's
regions, carries them to the agents as an ordinary binary request (the agents may be on other hosts), and
writes the outputs the caller asked for in shared memory into its regions; the answer names those slots
instead of carrying the bytes. An HTTP request is decoded only when its caller has registered a region
here: every other request keeps the undecoded path and its cost.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from edgemux.runtime.dataplane.protocol import (
    HEADER_LENGTH_HEADER,
    InferRequest,
    InferResponse,
    ProtocolError,
    ShmSlot,
    decode_infer_request,
    decode_infer_response,
    encode_infer_request,
    encode_infer_response,
    tensor_bytes,
)
from edgemux.runtime.httpserver import Request, Response
from edgemux.runtime.httputil import Answer, read_body
from edgemux.runtime.ingress.dispatch import Reply, reply_retry_after, server_message
from edgemux.runtime.ingress.forward import PassedOn, WholeBody

if TYPE_CHECKING:
    from edgemux.runtime.ingress.gateway import Gateway

__all__ = ["Answered", "infer_decoded", "infer_http", "reply_of"]


class Answered(Exception):
    """An answer other than success, to be said by the protocol at hand: ``answer``'s status and message."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(answer.message)
        self.answer = answer


def reply_of(response: Response) -> Reply:
    """The gateway's HTTP answer as a reply (an agent's passed on: its headers as they came)."""
    if isinstance(response, PassedOn):
        return response.reply
    return Reply(response.status, response.headers or {}, response.body)


def refused(reply: Reply) -> Answered:
    """A non-200 answer as a failure: its status, its message, its Retry-After."""
    wait = reply_retry_after(reply)
    headers = {"Retry-After": f"{wait:g}"} if wait is not None else {}
    return Answered(Answer(reply.status, server_message(reply), headers=headers))


async def infer_decoded(gateway: Gateway, app: str, version: str, req: InferRequest, owner: str) -> InferResponse:
    """Carry ``req`` to ``app``'s agents through ``Gateway.infer`` (policed, routed, counted, failed over);
    the agent's answer, decoded, its shared-memory outputs in ``owner``'s regions. ``Answered`` for any
    answer but a 200 (the gateway's or an agent's), ``ShmError`` for a slot it cannot use.

    A request with tensors in shared memory goes to an agent on this host as it is, its slots named by
    their objects (the agent reads and writes the caller's memory itself: the bytes never cross HTTP), and
    to another agent as the binary request it is equivalent to (the gateway reads the inputs out of the
    caller's regions, and writes the outputs into them)."""
    local = None
    if req.uses_shm:
        local = _passed_on(req, {t.name: gateway.regions.locate(owner, t.shm, f"input '{t.name}'")
                                 for t in req.inputs if t.shm is not None},
                           {o.name: gateway.regions.locate(owner, o.shm, f"output '{o.name}'")
                            for o in req.outputs if o.shm is not None})
    if local is not None and gateway.all_on_this_host(app):
        whole = local
    else:
        if req.uses_shm:
            gateway.regions.read_inputs(owner, req)
        inputs = {t.name: t.data for t in req.inputs}
        body, headers = encode_infer_request(inputs, binary=True, request_id=req.id,
                                             outputs=[o.name for o in req.outputs], parameters=req.parameters)
        whole = WholeBody(body, _raw(headers), local)
    reply = reply_of(await gateway.infer(app, version, whole))
    if reply.status != 200:
        raise refused(reply)
    try:
        answer = decode_infer_response(reply.body, reply.headers.get(HEADER_LENGTH_HEADER))
    except ProtocolError as e:  # the framing held (the gateway checked it) but the tensors did not
        raise Answered(Answer(502, f"app '{app}': {e.message}")) from None
    left = {o.name for o in req.outputs if o.shm is not None and o.name not in answer.in_shm}
    if left:  # what the agent did not write itself (it was not on this host)
        gateway.regions.write_outputs(owner, req, {n: a for n, a in answer.outputs.items() if n in left})
    return answer


_SLOT_WORDS = (b'"shared_memory_region"', b'"edgemux_shm_key"')


def _names_shared_memory(body: bytes, header_length: str | None) -> bool:
    """Whether the request's JSON header (the body, or its first ``header_length`` bytes) has a slot's
    parameter in it: a byte search, far cheaper than decoding a JSON tensor to find out that it has none
    (an escaped spelling of the name is read as a plain request, and the agent refuses what it cannot take)."""
    end = len(body)
    if header_length is not None and header_length.strip().isdigit():
        end = min(end, int(header_length))
    return any(body.find(word, 0, end) >= 0 for word in _SLOT_WORDS)


def _passed_on(req: InferRequest, inputs: dict[str, ShmSlot], outputs: dict[str, ShmSlot]) -> WholeBody:
    """``req`` as an agent on this host takes it: the tensors in shared memory named by their objects
    (``edgemux_shm_key``), the others binary."""
    entries, blobs = [], []
    for t in req.inputs:
        entry: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
        slot = inputs.get(t.name)
        if slot is not None:
            entry["parameters"] = slot.parameters(slot.byte_size)
        else:
            blob = tensor_bytes(t.data, t.datatype)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        entries.append(entry)
    header: dict[str, Any] = {"inputs": entries, "parameters": {**req.parameters, "binary_data_output": True}}
    if req.id:
        header["id"] = req.id
    if req.outputs:
        header["outputs"] = [{"name": o.name, "parameters": outputs[o.name].parameters(outputs[o.name].byte_size)
                              if o.name in outputs else {"binary_data": True}} for o in req.outputs]
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    headers = {"Content-Type": "application/octet-stream" if blobs else "application/json"}
    if blobs:
        headers[HEADER_LENGTH_HEADER] = str(len(text))
    return WholeBody(b"".join([text, *blobs]), _raw(headers), passes_on=True)


def _raw(headers: dict[str, str]) -> tuple[tuple[bytes, bytes], ...]:
    return tuple((k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items())


async def infer_http(gateway: Gateway, app: str, version: str, request: Request, owner: str) -> Response:
    """An HTTP inference request of a caller (``owner``, its credential's principal) who has shared-memory
    regions here: decoded, and through :func:`infer_decoded` when it names a slot (else passed on as it came,
    its body read whole)."""
    body = await read_body(request, gateway.max_body_bytes, ProtocolError)
    header_length = request.headers.get(HEADER_LENGTH_HEADER)
    req = None
    if _names_shared_memory(body, header_length):  # else not decoded: a JSON tensor costs ms to parse
        try:
            req = decode_infer_request(body, header_length, max_body_bytes=gateway.max_body_bytes)
        except ProtocolError:
            pass  # the agent says what is wrong with it, as for any other request
    if req is None or not req.uses_shm:
        return await gateway.infer(app, version, WholeBody(body, tuple(request.raw_headers)))
    try:
        answer = await infer_decoded(gateway, app, version, req, owner)
    except Answered as e:
        return e.answer.response()
    payload, headers = encode_infer_response(app, answer.model_version, answer.outputs, req, id=answer.id,
                                             parameters=answer.parameters)
    return Response(body=payload, headers=headers)
