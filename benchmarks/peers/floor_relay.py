"""The relay floor: the least a proxy written on edgemux's stack can do per request, the gateway's counterpart
of ``floor_server.py``.

It parses each request with httptools (llhttp, what edgemux's server core parses with), sends its method,
target, headers (less ``Host``) and body to one upstream server over a keep-alive connection of its own,
parses the reply with httptools to find where it ends, and writes the reply's bytes back as they came, on
uvloop. It polices nothing, routes nothing, counts nothing, checks no framing and fails over nowhere: it is
not a gateway anyone should run, it is what one hop through a Python process costs on this host before a
gateway does any of its own work. ``bench_peers.py`` runs it in front of the edgemux agent, beside the
gateway, so that the gateway's added overhead can be read against the hop's own.

    python benchmarks/peers/floor_relay.py --upstream-port N --port M
"""

from __future__ import annotations

import argparse
import asyncio

import httptools


class _Upstream(asyncio.Protocol):
    """One keep-alive connection to the upstream server; one exchange at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._reply = bytearray()
        self.waiter: asyncio.Future[bytes] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._reply += data
        self._parser.feed_data(data)

    def on_message_complete(self) -> None:
        reply, self._reply = bytes(self._reply), bytearray()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionResetError("the upstream closed the connection"))


class _Client(asyncio.Protocol):
    """One client connection: each request, once whole, is relayed and its reply written back."""

    def __init__(self, upstream_port: int) -> None:
        self._upstream_port = upstream_port
        self._upstream: _Upstream | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._head: list[bytes] = []
        self._body: list[bytes] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self._head = [self._parser.get_method(), b" ", url, b" HTTP/1.1\r\nHost: upstream\r\n"]

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() != b"host":
            self._head += (name, b": ", value, b"\r\n")

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._head.append(b"\r\n")
        request = b"".join(self._head) + b"".join(self._body)
        self._body = []
        asyncio.get_running_loop().create_task(self._relay(request))

    async def _relay(self, request: bytes) -> None:
        if self._upstream is None:
            loop = asyncio.get_running_loop()
            _, self._upstream = await loop.create_connection(_Upstream, "127.0.0.1", self._upstream_port)
        upstream = self._upstream
        upstream.waiter = asyncio.get_running_loop().create_future()
        assert upstream.transport is not None and self.transport is not None
        upstream.transport.write(request)
        self.transport.write(await upstream.waiter)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._upstream is not None and self._upstream.transport is not None:
            self._upstream.transport.close()


async def _serve(port: int, upstream_port: int) -> None:
    server = await asyncio.get_running_loop().create_server(lambda: _Client(upstream_port), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True, help="port to listen on (127.0.0.1)")
    ap.add_argument("--upstream-port", type=int, required=True, help="the upstream server's port (127.0.0.1)")
    args = ap.parse_args()
    try:
        import uvloop
        uvloop.install()  # as edgemux's processes do when it is installed
    except ImportError:
        pass
    asyncio.run(_serve(args.port, args.upstream_port))


if __name__ == "__main__":
    main()
