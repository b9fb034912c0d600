"""The gRPC floor: the least an Open Inference Protocol server over gRPC can do per request on grpcio.

One ``ModelInfer`` rpc on ``grpc.aio`` (uvloop when installed, as edgemux's processes are): the request is
parsed by protobuf (edgemux's message classes, ``runtime.dataplane.grpcwire``: the same wire as KServe's and
Triton's), the one input's ``raw_input_contents`` viewed as the tensor, the ONNX Runtime session run on the
event loop itself, and the output answered as ``raw_output_contents``. It checks nothing, polices nothing and
counts nothing: it is what a gRPC server on grpcio, protobuf and ONNX Runtime costs before it does any of a
server's own work, the floor ``bench_peers.py`` reads edgemux's gRPC paths against.

    python benchmarks/peers/floor_grpc.py --model FILE.onnx --name APP --port N
"""

from __future__ import annotations

import asyncio

import grpc
import numpy as np

from edgemux.runtime.dataplane.grpcwire import METHODS, SERVICE, messages
from onnx_session import open_session, server_args


async def serve(args: object) -> None:
    session, input_name, output_name = open_session(args.model)  # type: ignore[attr-defined]
    shape = [1 if not isinstance(d, int) else d for d in session.get_inputs()[0].shape]

    async def infer(request: object, context: object) -> object:
        x = np.frombuffer(request.raw_input_contents[0], dtype=np.float32).reshape(shape)  # type: ignore[attr-defined]
        y = np.ascontiguousarray(session.run([output_name], {input_name: x})[0], dtype=np.float32)
        resp = messages.ModelInferResponse(model_name=args.name)  # type: ignore[attr-defined]
        resp.outputs.add(name=output_name, datatype="FP32", shape=y.shape)
        resp.raw_output_contents.append(y.tobytes())
        return resp

    req, resp = METHODS["ModelInfer"]
    handler = grpc.unary_unary_rpc_method_handler(infer, request_deserializer=req.FromString,
                                                  response_serializer=resp.SerializeToString)
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"ModelInfer": handler}),))
    server.add_insecure_port(f"127.0.0.1:{args.port}")  # type: ignore[attr-defined]
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.run(serve(server_args()))
    except ImportError:
        asyncio.run(serve(server_args()))
