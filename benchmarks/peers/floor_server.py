"""The floor: the least an Open Inference Protocol server written on edgemux's stack can do per request.

An aiohttp application (on uvloop when it is installed, as edgemux's processes are) with one route that reads
the body, parses it with orjson (JSON form) or views the bytes (binary form), runs the ONNX Runtime session
on the event loop itself (no hand-off to a device thread), and answers with orjson or the raw output bytes.
It checks nothing, polices nothing, counts nothing and supports one model with one input and one output: it
is not a server anyone should run, it is what a server built from aiohttp, orjson and ONNX Runtime costs
before it does any of a server's own work. ``bench_peers.py`` runs it with edgemux's interpreter beside the
peers so that a target below it is seen to be below what this stack can reach on this host.

    python benchmarks/peers/floor_server.py --model FILE.onnx --name APP --port N
"""

from __future__ import annotations

import array
import asyncio
import json
from typing import Any

import numpy as np
import orjson
from aiohttp import web

from onnx_session import open_session, server_args

HEADER_LENGTH = "Inference-Header-Content-Length"


def main() -> None:
    args = server_args()
    session, input_name, output_name = open_session(args.model)
    shape = [1 if not isinstance(d, int) else d for d in session.get_inputs()[0].shape]

    def run(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(session.run([output_name], {input_name: x})[0], dtype=np.float32)

    async def infer(request: web.Request) -> web.Response:
        body = await request.read()
        hlen = request.headers.get(HEADER_LENGTH)
        if hlen is None:  # JSON: the tensor is the one input's flat 'data' list
            data = orjson.loads(body)["inputs"][0]["data"]
            x = np.frombuffer(array.array("d", data), dtype=np.float64).astype(np.float32).reshape(shape)
            y = run(x)
            answer = {"model_name": args.name, "outputs": [
                {"name": output_name, "datatype": "FP32", "shape": list(y.shape), "data": y.ravel()}]}
            return web.Response(body=orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY),
                                content_type="application/json")
        n = int(hlen)  # binary: a JSON header, then the tensor's raw bytes
        y = run(np.frombuffer(body, dtype=np.float32, offset=n).reshape(shape))
        raw = y.tobytes()
        head = json.dumps({"model_name": args.name, "outputs": [
            {"name": output_name, "datatype": "FP32", "shape": list(y.shape),
             "parameters": {"binary_data_size": len(raw)}}]}).encode()
        return web.Response(body=head + raw, headers={HEADER_LENGTH: str(len(head))},
                            content_type="application/octet-stream")

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_post(f"/v2/models/{args.name}/infer", infer)
    try:
        import uvloop
    except ImportError:
        loop: Any = asyncio.new_event_loop()
    else:
        loop = uvloop.new_event_loop()
    web.run_app(app, host="127.0.0.1", port=args.port, access_log=None, print=None, loop=loop)


if __name__ == "__main__":
    main()
