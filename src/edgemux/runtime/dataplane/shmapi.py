"""The system shared memory extension's endpoints (``dataplane.shm``), one implementation for the agent and
the gateway and for both protocols: over HTTP ``/v2/systemsharedmemory/...`` (Triton's paths: status,
register, unregister; :meth:`ShmApi.routes`), over gRPC the three ``SystemSharedMemory*`` rpcs
(:meth:`ShmApi.rpcs`). Any valid credential may call them (``runtime.auth.ANYONE``: the HTTP middleware checks
it, the rpcs here), and each sees and changes only the regions it registered (``shm.principal``). A
refusal is a ``ShmError`` (or ``AuthError``), which both servers' error tables answer.
"""

from __future__ import annotations

from typing import Any

from edgemux.runtime.auth import ANYONE, Guard
from edgemux.runtime.dataplane.protocol import short_repr
from edgemux.runtime.dataplane.shm import RegionTable, ShmError, principal
from edgemux.runtime.httpserver import Request, Response, Route, get, post
from edgemux.runtime.httputil import json_response, parse_json, read_body

__all__ = ["ShmApi"]

_PATH = "/v2/systemsharedmemory"
_MAX_BODY_BYTES = 10**6  # a registration is a few dozen bytes


class ShmApi:
    """The extension's endpoints over ``regions``, a caller's regions being its credential's (``guard``)."""

    def __init__(self, regions: RegionTable, guard: Guard) -> None:
        self.regions = regions
        self.guard = guard

    # -- HTTP ------------------------------------------------------------------------------------------

    def routes(self) -> list[Route]:
        """The extension's HTTP routes (docs/reference/http.md, "System shared memory")."""
        return [get(_PATH + "/status", self.status), get(_PATH + "/region/{region}/status", self.status),
                post(_PATH + "/region/{region}/register", self.register),
                post(_PATH + "/region/{region}/unregister", self.unregister),
                post(_PATH + "/unregister", self.unregister)]

    def _owner(self, request: Request) -> str:
        return principal(self.guard, request.headers.get("Authorization"))

    async def status(self, request: Request) -> Response:
        """``GET /v2/systemsharedmemory[/region/{region}]/status``: the caller's regions."""
        return json_response(self.regions.status(self._owner(request), request.match_info.get("region")))

    async def register(self, request: Request) -> Response:
        """``POST /v2/systemsharedmemory/region/{region}/register`` with ``{"key", "offset", "byte_size"}``."""
        doc = parse_json(await read_body(request, _MAX_BODY_BYTES, ShmError), "shared memory registration", ShmError)
        if not isinstance(doc, dict) or not {"key", "byte_size"} <= set(doc) <= {"key", "offset", "byte_size"}:
            raise ShmError('a shared memory registration is {"key": "/NAME", "offset": BYTES, "byte_size": BYTES}, '
                           f"got {short_repr(doc)}")
        self.regions.register(self._owner(request), request.match_info["region"], doc["key"], doc.get("offset", 0),
                              doc["byte_size"])
        return json_response({})

    async def unregister(self, request: Request) -> Response:
        """``POST /v2/systemsharedmemory[/region/{region}]/unregister``: one of the caller's regions, or all."""
        self.regions.unregister(self._owner(request), request.match_info.get("region"))
        return json_response({})

    # -- gRPC ------------------------------------------------------------------------------------------

    def rpcs(self) -> dict[str, tuple[Any, Any, Any]]:
        """The three ``SystemSharedMemory*`` rpcs: name -> (handler, request class, response class), for
        ``runtime.grpcserver.start_grpc`` (grpcio is imported here, only by a gRPC listener)."""
        from edgemux.runtime.dataplane.grpcwire import METHODS, from_json, messages
        from edgemux.runtime.grpcserver import authorization

        def owner(call: Any) -> str:
            credential = authorization(call)
            self.guard.check(ANYONE, credential)  # AuthError: UNAUTHENTICATED / PERMISSION_DENIED
            return principal(self.guard, credential)

        async def status(request: Any, call: Any) -> Any:
            regions = self.regions.status(owner(call), request.name or None)
            return from_json(messages.SystemSharedMemoryStatusResponse, {"regions": {r["name"]: r for r in regions}})

        async def register(request: Any, call: Any) -> Any:
            self.regions.register(owner(call), request.name, request.key, request.offset, request.byte_size)
            return messages.SystemSharedMemoryRegisterResponse()

        async def unregister(request: Any, call: Any) -> Any:
            self.regions.unregister(owner(call), request.name or None)
            return messages.SystemSharedMemoryUnregisterResponse()

        mine = {"SystemSharedMemoryStatus": status, "SystemSharedMemoryRegister": register,
                "SystemSharedMemoryUnregister": unregister}
        return {name: (fn, *METHODS[name]) for name, fn in mine.items()}
