"""The agent's Open Inference Protocol over gRPC (``edgemux agent --grpc-port``): KServe's
``GRPCInferenceService`` with Triton's statistics and repository index, beside the HTTP listener and through
the same request path (``requestpath.RequestPath``): the same policing, validation, queues, counting and
errors, each error's HTTP status given as a gRPC status code (``runtime.grpcserver.CODES``).

Credentials are the HTTP ones, in the call metadata (``authorization: Bearer <secret>``): health and server
metadata are open, an app's rpcs (``ModelReady``, ``ModelMetadata``, ``ModelInfer``, ``ModelStatistics`` with a
name) take its key or the admin token, the shared-memory rpcs any valid credential (each sees its own regions:
``dataplane.shm``), the rest (every app's statistics, the repository index) the admin token.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from edgemux import __version__
from edgemux.runtime.auth import ADMIN, OPEN, Need, mark_believed
from edgemux.runtime.dataplane.grpcwire import (
    METHODS,
    SERVICE,
    decode_infer_request,
    from_json,
    infer_response,
    messages,
    metadata_response,
)
from edgemux.runtime.dataplane.pieces import Piece
from edgemux.runtime.dataplane.protocol import InferRequest
from edgemux.runtime.dataplane.requestpath import ERRORS, MODEL_VERSION, RequestPath
from edgemux.runtime.dataplane.shm import FORWARDED_PRINCIPAL, principal
from edgemux.runtime.dataplane.shmapi import ShmApi
from edgemux.runtime.grpcserver import GrpcSite, Handler, authorization, metadata, start_grpc

if TYPE_CHECKING:
    from edgemux.runtime.dataplane.agent import Agent

__all__ = ["POLICED_METADATA", "AgentService", "start_agent_grpc"]

POLICED_METADATA = "edgemux-policed"  # runtime.auth.POLICED_HEADER as gRPC metadata (keys are lowercase)


class AgentService:
    """The rpcs of one agent (each ``async (request, call) -> response``; see the module docstring)."""

    def __init__(self, agent: Agent, extensions: tuple[str, ...], server_name: str) -> None:
        self.agent = agent
        self.path = RequestPath(agent)
        self.server_meta = messages.ServerMetadataResponse(name=server_name, version=__version__,
                                                           extensions=list(extensions))

    def handlers(self) -> dict[str, tuple[Handler, Any, Any]]:
        """rpc name -> (handler, request class, response class), for ``runtime.grpcserver.start_grpc``."""
        mine = {"ServerLive": self.server_live, "ServerReady": self.server_ready,
                "ServerMetadata": self.server_metadata, "ModelReady": self.model_ready,
                "ModelMetadata": self.model_metadata, "ModelInfer": self.model_infer,
                "ModelStatistics": self.model_statistics, "RepositoryIndex": self.repository_index}
        return {**{name: (fn, *METHODS[name]) for name, fn in mine.items()},
                **ShmApi(self.agent.regions, self.agent.guard).rpcs()}

    def _allow(self, need: Need, call: Any) -> None:
        self.agent.guard.check(need, authorization(call))  # AuthError: UNAUTHENTICATED / PERMISSION_DENIED

    async def server_live(self, request: Any, call: Any) -> Any:
        return messages.ServerLiveResponse(live=True)

    async def server_ready(self, request: Any, call: Any) -> Any:
        return messages.ServerReadyResponse(ready=self.agent.ready)

    async def server_metadata(self, request: Any, call: Any) -> Any:
        return self.server_meta

    async def model_ready(self, request: Any, call: Any) -> Any:
        self._allow(Need(app=request.name), call)
        piece = self.path.piece(request.name, request.version)
        return messages.ModelReadyResponse(ready=not self.path.not_serving(piece.app))

    async def model_metadata(self, request: Any, call: Any) -> Any:
        self._allow(Need(app=request.name), call)
        piece = self.path.piece(request.name, request.version)
        served = piece.interface
        return metadata_response(piece.app, [MODEL_VERSION], piece.info.platform, served.inputs, served.outputs)

    async def model_statistics(self, request: Any, call: Any) -> Any:
        """One app's statistics (its key or the admin token), or every app's (a request without a name: the
        admin token's), as HTTP's ``/v2/models[/{app}]/stats``."""
        if request.name:
            self._allow(Need(app=request.name), call)
            apps = [self.path.piece(request.name, request.version).app]
        else:
            self._allow(ADMIN, call)
            apps = sorted({p.app for p in self.agent.all_pieces()})
        return from_json(messages.ModelStatisticsResponse, self.agent.stats.view(apps, MODEL_VERSION))

    async def repository_index(self, request: Any, call: Any) -> Any:
        self._allow(ADMIN, call)
        return from_json(messages.RepositoryIndexResponse, {"models": self.path.index(request.ready)})

    async def model_infer(self, request: Any, call: Any) -> Any:
        """An inference request through the agent's request path (policed here unless a gateway's mark,
        believed only beside the admin token, says it was policed there)."""
        need = Need(app=request.model_name) if request.model_name else OPEN
        credential = authorization(call)
        self.agent.guard.check(need, credential)
        upstream = mark_believed(metadata(call, POLICED_METADATA) is not None, credential, self.agent.guard)

        async def decode(piece: Piece) -> tuple[InferRequest, float]:
            return decode_infer_request(request), time.perf_counter()

        # a gateway never passes shared memory on over gRPC: what it forwards may use no region here
        return await self.path.serve(request.model_name, request.model_version, upstream, decode, _encode,
                                     lambda: FORWARDED_PRINCIPAL if upstream else principal(self.agent.guard, credential))


async def _encode(piece: Piece, req: InferRequest, outputs: Mapping[str, np.ndarray], params: dict[str, Any]) -> Any:
    return infer_response(piece.app, MODEL_VERSION, outputs, [o.name for o in req.outputs], id=req.id,
                          parameters=params, slots={o.name: o.shm for o in req.outputs if o.shm is not None})


async def start_agent_grpc(agent: Agent, host: str, port: int, *, extensions: tuple[str, ...], server_name: str,
                           tls: tuple[str, str] | None = None) -> GrpcSite:
    """Serve ``agent``'s gRPC service on ``host``:``port`` (0: ephemeral), TLS with ``tls`` = (certificate
    file, key file); messages up to the agent's ``max_body_bytes``. ``OSError`` when it cannot bind."""
    service = AgentService(agent, extensions, server_name)
    return await start_grpc(SERVICE, service.handlers(), ERRORS, host, port, tls=tls,
                            max_message_bytes=agent.max_body_bytes)
