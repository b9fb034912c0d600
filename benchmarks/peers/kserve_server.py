"""KServe's ModelServer serving the benchmark's ONNX model (run by ``bench_peers.py`` in KServe's own virtual
environment).

A custom ``kserve.Model`` whose ``predict`` takes the decoded ``InferRequest`` (JSON or binary tensor data:
KServe's v2 REST endpoint reads both) and answers as the request asked for (``binary_data`` per requested
output). ``predict`` is synchronous, so KServe calls it on its event loop with no thread hop, its fastest
configuration for a sub-millisecond model; one uvicorn worker, no per-request log lines, KServe's v2 gRPC
server on ``--grpc-port`` when given.

    python kserve_server.py --model FILE.onnx --name sq --port N [--grpc-port M]
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from onnx_session import open_session, server_args  # beside this file

# ModelServer parses sys.argv at import time (parse_known_args): parse ours first, then hide them.
args = server_args()
sys.argv = sys.argv[:1]

from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer  # noqa: E402
from kserve.utils.utils import generate_uuid  # noqa: E402


class OnnxModel(Model):  # type: ignore[misc]
    def __init__(self, name: str, path: str) -> None:
        super().__init__(name)
        self.session, self.input_name, self.output_name = open_session(path)
        self.ready = True

    def predict(self, payload: InferRequest, headers: Any = None, response_headers: Any = None) -> InferResponse:
        x = payload.inputs[0].as_numpy()
        (y,) = self.session.run([self.output_name], {self.input_name: x})
        out = InferOutput(name=self.output_name, shape=list(y.shape), datatype="FP32")
        out.set_data_from_numpy(y, binary_data=False)  # to_rest() turns it binary when the request asked
        return InferResponse(response_id=payload.id or generate_uuid(), model_name=self.name,
                             infer_outputs=[out], use_binary_outputs=payload.use_binary_outputs,
                             requested_outputs=payload.request_outputs)


if __name__ == "__main__":
    grpc = {"enable_grpc": True, "grpc_port": args.grpc_port} if args.grpc_port else {"enable_grpc": False}
    server = ModelServer(http_port=args.port, workers=1, enable_latency_logging=False, **grpc)
    # The constructor configures logging; a line per request (access log, timing trace) is not what a tuned
    # deployment keeps, and edgemux's agent logs none either.
    for name in ("uvicorn.access", "kserve.trace"):
        logging.getLogger(name).setLevel(logging.WARNING)
    server.start([OnnxModel(args.name, args.model)])
