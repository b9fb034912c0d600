"""PyTriton serving the benchmark's ONNX model (run by ``bench_peers.py`` in PyTriton's own virtual
environment, with LD_LIBRARY_PATH naming the interpreter's lib/ directory, which Triton's Python backend stub
links against).

PyTriton runs NVIDIA's Triton Inference Server core (its C++ HTTP front end, JSON and binary tensor data) and
hands each request to the Python callable below over its own IPC. The callable gets numpy arrays and returns
numpy arrays, so no user code decodes anything. ``max_batch_size=1`` with the ``@batch`` decorator (the
documented pattern; no dynamic batcher), one model instance, the metrics listener off, Triton's gRPC front end
on ``--grpc-port`` when given, its system shared memory API open (PyTriton guards it with a token by default).

    python pytriton_server.py --model FILE.onnx --name sq --port N [--grpc-port M]
"""

from __future__ import annotations

from typing import Any

from onnx_session import open_session, server_args  # beside this file


def main() -> None:
    args = server_args()

    import numpy as np
    from pytriton.decorators import batch
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.triton import DEFAULT_PROTECTED_ENDPOINTS, Triton, TritonConfig, TritonSecurityConfig

    session, input_name, output_name = open_session(args.model)
    in_shape = tuple(int(d) for d in session.get_inputs()[0].shape[1:])
    out_shape = tuple(int(d) for d in session.get_outputs()[0].shape[1:])

    @batch  # type: ignore[misc]
    def infer(**inputs: Any) -> dict[str, Any]:
        (y,) = session.run([output_name], {input_name: inputs[input_name]})
        return {output_name: y}

    grpc = {"allow_grpc": True, "grpc_address": "127.0.0.1", "grpc_port": args.grpc_port} if args.grpc_port \
        else {"allow_grpc": False}
    config = TritonConfig(http_address="127.0.0.1", http_port=args.port, allow_metrics=False, log_verbose=0, **grpc)
    # PyTriton guards Triton's shared-memory API with a token of its own by default; the benchmark's client,
    # like edgemux's callers, registers its regions plainly (the other guarded APIs stay guarded)
    security = TritonSecurityConfig(restricted_endpoints=[e for e in DEFAULT_PROTECTED_ENDPOINTS
                                                          if e != "shared-memory"])
    with Triton(config=config, security_config=security) as triton:
        triton.bind(model_name=args.name, infer_func=infer,
                    inputs=[Tensor(name=input_name, dtype=np.float32, shape=in_shape)],
                    outputs=[Tensor(name=output_name, dtype=np.float32, shape=out_shape)],
                    config=ModelConfig(max_batch_size=1))
        triton.serve()


if __name__ == "__main__":
    main()
