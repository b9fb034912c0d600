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

from typing import TYPE_CHECKING

from edgemux.runtime.dataplane.protocol import (
    HEADER_LENGTH_HEADER,
    InferRequest,
    InferResponse,
    ProtocolError,
    decode_infer_request,
    decode_infer_response,
    encode_infer_request,
    encode_infer_response,
)
from edgemux.runtime.dataplane.shm import principal
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
    """Carry ``req`` to ``app``'s agents through ``Gateway.infer`` (policed, routed, counted, failed over) as
    the binary HTTP request it is equivalent to, its shared-memory inputs read from ``owner``'s regions
    first; the agent's answer, decoded, its shared-memory outputs written into ``owner``'s regions.
    ``Answered`` for any answer but a 200 (the gateway's or an agent's), ``ShmError`` for a slot it cannot
    use."""
    if req.uses_shm:
        gateway.regions.read_inputs(owner, req)
    inputs = {t.name: t.data for t in req.inputs}
    body, headers = encode_infer_request(inputs, binary=True, request_id=req.id,
                                         outputs=[o.name for o in req.outputs], parameters=req.parameters)
    raw = tuple((k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items())
    reply = reply_of(await gateway.infer(app, version, WholeBody(body, raw)))
    if reply.status != 200:
        raise refused(reply)
    try:
        answer = decode_infer_response(reply.body, reply.headers.get(HEADER_LENGTH_HEADER))
    except ProtocolError as e:  # the framing held (the gateway checked it) but the tensors did not
        raise Answered(Answer(502, f"app '{app}': {e.message}")) from None
    if req.uses_shm:
        gateway.regions.write_outputs(owner, req, answer.outputs)
    return answer


async def infer_http(gateway: Gateway, app: str, version: str, request: Request) -> Response:
    """An HTTP inference request of a caller who has shared-memory regions here: decoded, and through
    :func:`infer_decoded` when it uses them (else passed on as it came, its body read whole)."""
    body = await read_body(request, gateway.max_body_bytes, ProtocolError)
    header_length = request.headers.get(HEADER_LENGTH_HEADER)
    try:
        req = decode_infer_request(body, header_length, max_body_bytes=gateway.max_body_bytes)
    except ProtocolError:
        req = None  # the agent says what is wrong with it, as for any other request
    if req is None or not req.uses_shm:
        return await gateway.infer(app, version, WholeBody(body, tuple(request.raw_headers)))
    try:
        answer = await infer_decoded(gateway, app, version, req,
                                     principal(gateway.guard, request.headers.get("Authorization")))
    except Answered as e:
        return e.answer.response()
    payload, headers = encode_infer_response(app, answer.model_version, answer.outputs, req, id=answer.id,
                                             parameters=answer.parameters)
    return Response(body=payload, headers=headers)
