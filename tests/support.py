"""Helpers several runtime test files share (imported as ``support``: pytest puts this folder on sys.path)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any

# Two nodes with one emulated Edge TPU each. A shared mobilenet_v2 app at 200 req/s fits on neither TPU
# alone, so the edgemux policy partitions it over both (about 0.92 / 0.08); a 10 req/s one fits on one.
TWO_TPUS_YAML = """\
apiVersion: edgemux/v1alpha1
kind: Cluster
metadata: {name: two-tpus}
spec:
  nodes:
    - {name: n1, cpuCores: 4, memoryMb: 4096, devices: [{name: tpu0, kind: edgetpu, memoryMb: 6.9, profiles: ibis-edgetpu}]}
    - {name: n2, cpuCores: 4, memoryMb: 4096, devices: [{name: tpu0, kind: edgetpu, memoryMb: 6.9, profiles: ibis-edgetpu}]}
"""


class LoopThread:
    """An asyncio event loop on a daemon thread: servers live there; tests submit coroutines to it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 30.0) -> Any:
        """Run ``coro`` on the loop and wait (at most ``timeout`` s) for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5.0)


def strict_json(text: str) -> Any:
    """Parse ``text`` as exactly one JSON document, refusing NaN and Infinity (Python writes them; JSON has
    no such values, and strict parsers reject them)."""
    import json

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=no_constant)


async def serve_app(app: Any, shutdown_timeout_s: float = 1.0) -> tuple[Any, str]:
    """Serve an application (``runtime.httpserver.Application``) on 127.0.0.1 (an ephemeral port): (its site,
    whose ``stop()`` stops it, its base URL)."""
    from edgemux.runtime.httputil import start_site

    site = await start_site(app, "127.0.0.1", 0, shutdown_timeout_s=shutdown_timeout_s)
    return site, site.url


def put_json(url: str, doc: Any, timeout_s: float = 120.0) -> tuple[int, Any]:
    """``PUT`` ``doc`` as JSON to ``url``: (status, the answer's JSON), errors included (4xx/5xx are data)."""
    import json
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, method="PUT", data=json.dumps(doc).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


class ServedAgent:
    """An agent (``runtime.dataplane.agent.Agent``) served on 127.0.0.1 by an event loop in a thread, HTTP
    and, with ``grpc``, gRPC on ephemeral ports, for blocking clients: ``url`` and ``grpc_address`` say
    where; :meth:`put` routes an app to it with the admin ``token``; :meth:`stop` stops it all."""

    def __init__(self, agent: Any, *, grpc: bool = False, token: str | None = None) -> None:
        from edgemux.runtime.dataplane.agent import start_server

        self.agent, self.token = agent, token
        self.lt = LoopThread()
        self.server = self.lt.run(start_server(agent, "127.0.0.1", 0, grpc_port=0 if grpc else None))
        self.url = self.server.url
        self.grpc_address = self.server.grpc.address if self.server.grpc is not None else None

    def put(self, app: str, spec: Any, timeout_s: float = 120.0) -> int:
        """``PUT /v1/apps/{app}`` with ``spec`` (the admin token's): its status, 201 or 200 (else it raises)."""
        import json
        import urllib.request

        req = urllib.request.Request(f"{self.url}/v1/apps/{app}", method="PUT", data=json.dumps(spec).encode(),
                                     headers={"Authorization": f"Bearer {self.token}"} if self.token else {})
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            assert r.status in (200, 201)
            return int(r.status)

    def stop(self) -> None:
        self.lt.run(self.server.stop())
        self.agent.close(drain=False, timeout_s=5)
        self.lt.stop()
