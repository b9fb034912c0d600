"""The gateway's Open Inference Protocol over gRPC (``edgemux gateway --grpc-port``): health, metadata and
inference, routed, policed, counted and failed over exactly as on HTTP, because they go through the same
:meth:`Gateway.infer <edgemux.runtime.ingress.gateway.Gateway.infer>`: a ``ModelInferRequest`` is checked
(``grpcwire.decode_infer_request``: a malformed one never reaches an agent) and carried to the agents as the
binary HTTP request it is equivalent to; the agent's answer comes back as a ``ModelInferResponse`` with raw
outputs. Every answer the gateway gives on HTTP (404 unknown app, 429 policed with ``Retry-After``, 503 no
endpoint serving, an agent's 4xx passed on) becomes its gRPC status code (``runtime.grpcserver.CODES``), with
the same message and, for a wait, the trailing metadata ``retry-after``.

Credentials are the HTTP ones, in the call metadata (``authorization: Bearer <secret>``): an app's rpcs take
its key or the admin token; health and server metadata are open.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from edgemux import __version__
from edgemux.runtime.auth import Need
from edgemux.runtime.dataplane.grpcwire import METHODS, SERVICE, decode_infer_request, from_json, infer_response, messages
from edgemux.runtime.dataplane.protocol import ProtocolError
from edgemux.runtime.dataplane.shm import ShmError, principal
from edgemux.runtime.dataplane.shmapi import ShmApi
from edgemux.runtime.grpcserver import GrpcSite, Handler, authorization, start_grpc
from edgemux.runtime.httputil import Answer, ErrorTable
from edgemux.runtime.ingress.decoded import Answered, infer_decoded, refused, reply_of
from edgemux.runtime.ingress.gateway import EXTENSIONS, Gateway

__all__ = ["GatewayService", "start_gateway_grpc"]

logger = logging.getLogger("edgemux.gateway")


ERRORS = ErrorTable((
    (Answered, lambda e: e.answer),
    ((ProtocolError, ShmError), lambda e: Answer(e.status, e.message)),
), logger)


class GatewayService:
    """The rpcs of one gateway (each ``async (request, call) -> response``; see the module docstring)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.server_meta = messages.ServerMetadataResponse(name="edgemux-gateway", version=__version__,
                                                           extensions=list(EXTENSIONS))

    def handlers(self) -> dict[str, tuple[Handler, Any, Any]]:
        """rpc name -> (handler, request class, response class), for ``runtime.grpcserver.start_grpc``."""
        mine = {"ServerLive": self.server_live, "ServerReady": self.server_ready,
                "ServerMetadata": self.server_metadata, "ModelReady": self.model_ready,
                "ModelMetadata": self.model_metadata, "ModelInfer": self.model_infer}
        return {**{name: (fn, *METHODS[name]) for name, fn in mine.items()},
                **ShmApi(self.gateway.regions, self.gateway.guard).rpcs()}

    async def _allow(self, app: str, call: Any) -> None:
        need = Need(app=app)
        await self.gateway.known(need)  # the app's route, and with it its key's digest
        self.gateway.guard.check(need, authorization(call))

    async def server_live(self, request: Any, call: Any) -> Any:
        return messages.ServerLiveResponse(live=True)

    async def server_ready(self, request: Any, call: Any) -> Any:
        return messages.ServerReadyResponse(ready=self.gateway.ready)

    async def server_metadata(self, request: Any, call: Any) -> Any:
        return self.server_meta

    async def model_ready(self, request: Any, call: Any) -> Any:
        """Ready when an endpoint says so, not ready when the endpoints answer that it is not (HTTP's 400);
        an unknown app or no endpoint answering is the call's failure."""
        await self._allow(request.name, call)
        reply = reply_of(await self.gateway.model_ready(request.name, request.version))
        if reply.status not in (200, 400):
            raise refused(reply)
        return messages.ModelReadyResponse(ready=reply.status == 200)

    async def model_metadata(self, request: Any, call: Any) -> Any:
        await self._allow(request.name, call)
        reply = reply_of(await self.gateway.model_metadata(request.name, request.version))
        if reply.status != 200:
            raise refused(reply)
        return from_json(messages.ModelMetadataResponse, json.loads(reply.body))

    async def model_infer(self, request: Any, call: Any) -> Any:
        """Checked here (a malformed request never reaches an agent), then ``decoded.infer_decoded``: its
        shared-memory inputs read, carried to the agents, its shared-memory outputs written."""
        app = request.model_name
        await self._allow(app, call)
        req = decode_infer_request(request)
        owner = principal(self.gateway.guard, authorization(call)) if req.uses_shm else ""
        answer = await infer_decoded(self.gateway, app, request.model_version, req, owner)
        return infer_response(app, answer.model_version, answer.outputs, [o.name for o in req.outputs],
                              id=answer.id, parameters=answer.parameters,
                              slots={o.name: o.shm for o in req.outputs if o.shm is not None})


async def start_gateway_grpc(gateway: Gateway, host: str, port: int, *,
                             tls: tuple[str, str] | None = None) -> GrpcSite:
    """Serve ``gateway``'s gRPC service on ``host``:``port`` (0: ephemeral), TLS with ``tls`` = (certificate
    file, key file); messages up to the gateway's ``max_body_bytes``. ``OSError`` when it cannot bind. The
    gateway's connection pool must be open (its HTTP application's startup opens it)."""
    return await start_grpc(SERVICE, GatewayService(gateway).handlers(), ERRORS, host, port, tls=tls,
                            max_message_bytes=gateway.max_body_bytes)
