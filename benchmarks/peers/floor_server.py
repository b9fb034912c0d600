"""The floor: the least an Open Inference Protocol server written on edgemux's stack can do per request.

One route on edgemux's own HTTP server core (``edgemux.runtime.httpserver``: asyncio and httptools, on
uvloop when it is installed, as edgemux's processes are) that reads the body, parses it with orjson (JSON
form) or views the bytes (binary form), runs the ONNX Runtime session on the event loop itself (no hand-off
to a device thread), and answers with orjson or the raw output bytes. It checks nothing, polices nothing,
counts nothing and supports one model with one input and one output: it is not a server anyone should run,
it is what a server built from edgemux's server core, orjson and ONNX Runtime costs before it does any of a
server's own work. ``bench_peers.py`` runs it with edgemux's interpreter beside the peers so that a target
below it is seen to be below what this stack can reach on this host.

``--stack aiohttp`` serves the same route from an aiohttp application instead (edgemux's servers ran on
aiohttp's server before the core), to see what the core saves (``bench_peers.py --aiohttp-floor``).

    python benchmarks/peers/floor_server.py --model FILE.onnx --name APP --port N [--stack core|aiohttp]
"""

from __future__ import annotations

import argparse
import array
import asyncio
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from onnx_session import open_session, server_args

HEADER_LENGTH = "Inference-Header-Content-Length"


def answerer(args: Any) -> Callable[[bytes, str | None], tuple[bytes, dict[str, str]]]:
    """The floor's work on one request: (body, its Inference-Header-Content-Length) -> (answer, headers)."""
    session, input_name, output_name = open_session(args.model)
    shape = [1 if not isinstance(d, int) else d for d in session.get_inputs()[0].shape]

    def run(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(session.run([output_name], {input_name: x})[0], dtype=np.float32)

    def answer(body: bytes, hlen: str | None) -> tuple[bytes, dict[str, str]]:
        if hlen is None:  # JSON: the tensor is the one input's flat 'data' list
            data = orjson.loads(body)["inputs"][0]["data"]
            x = np.frombuffer(array.array("d", data), dtype=np.float64).astype(np.float32).reshape(shape)
            y = run(x)
            doc = {"model_name": args.name, "outputs": [
                {"name": output_name, "datatype": "FP32", "shape": list(y.shape), "data": y.ravel()}]}
            return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY), {"Content-Type": "application/json"}
        n = int(hlen)  # binary: a JSON header, then the tensor's raw bytes
        y = run(np.frombuffer(body, dtype=np.float32, offset=n).reshape(shape))
        raw = y.tobytes()
        head = json.dumps({"model_name": args.name, "outputs": [
            {"name": output_name, "datatype": "FP32", "shape": list(y.shape),
             "parameters": {"binary_data_size": len(raw)}}]}).encode()
        return head + raw, {HEADER_LENGTH: str(len(head)), "Content-Type": "application/octet-stream"}

    return answer


def serve_core(args: Any, answer: Callable[[bytes, str | None], tuple[bytes, dict[str, str]]]) -> None:
    from edgemux.runtime.httpserver import Application, Request, Response, post
    from edgemux.runtime.httputil import start_site
    from edgemux.runtime.process import run

    async def infer(request: Request) -> Response:
        body, headers = answer(await request.read(), request.headers.get(HEADER_LENGTH))
        return Response(body, headers=headers)

    async def main() -> None:
        app = Application([post(f"/v2/models/{args.name}/infer", infer)], client_max_size=64 * 2**20)
        await start_site(app, "127.0.0.1", args.port)
        await asyncio.Event().wait()

    run(main())


def serve_aiohttp(args: Any, answer: Callable[[bytes, str | None], tuple[bytes, dict[str, str]]]) -> None:
    from aiohttp import web

    async def infer(request: web.Request) -> web.Response:
        body, headers = answer(await request.read(), request.headers.get(HEADER_LENGTH))
        return web.Response(body=body, headers=headers)

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_post(f"/v2/models/{args.name}/infer", infer)
    try:
        import uvloop
    except ImportError:
        loop: Any = asyncio.new_event_loop()
    else:
        loop = uvloop.new_event_loop()
    web.run_app(app, host="127.0.0.1", port=args.port, access_log=None, print=None, loop=loop)


def main() -> None:
    ap = argparse.ArgumentParser()  # beside the arguments every peer server takes (onnx_session.server_args)
    ap.add_argument("--stack", choices=("core", "aiohttp"), default="core")
    own, rest = ap.parse_known_args()
    args = server_args(rest)
    serve = serve_core if own.stack == "core" else serve_aiohttp
    serve(args, answerer(args))


if __name__ == "__main__":
    main()
