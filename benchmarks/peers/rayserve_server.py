"""Ray Serve serving the benchmark's ONNX model (run by ``bench_peers.py`` in Ray's own virtual environment).

Ray Serve has no Open Inference Protocol codec of its own, so the deployment does what its documentation's
HTTP examples do: ``await request.json()`` (Starlette, the standard library's ``json``), the tensor built with
``numpy.asarray``, and a ``JSONResponse`` back in the protocol's JSON form. Binary tensor data is not offered.
One replica, ``num_cpus=0`` so that it is scheduled on a 2-core host beside the HTTP proxy; a local Ray
instance with no dashboard. Ready when the route answers (``bench_peers.py`` polls it).

    python rayserve_server.py --model FILE.onnx --name sq --port N
"""

from __future__ import annotations

import os
import signal
from typing import Any

from onnx_session import server_args  # beside this file

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    args = server_args()

    import ray
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    @serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0})
    class OnnxDeployment:
        def __init__(self, path: str, name: str) -> None:
            from onnx_session import open_session  # on the replica's PYTHONPATH (runtime_env below)

            self.session, self.input_name, self.output_name = open_session(path)
            self.name = name

        async def __call__(self, request: Request) -> Any:
            import numpy as np

            doc = await request.json()
            entry = doc["inputs"][0]
            x = np.asarray(entry["data"], dtype=np.float32).reshape(entry["shape"])
            (y,) = self.session.run([self.output_name], {self.input_name: x})
            return JSONResponse({"model_name": self.name, "outputs": [
                {"name": self.output_name, "shape": list(y.shape), "datatype": "FP32", "data": y.ravel().tolist()}]})

    ray.init(include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": HERE}})
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    serve.run(OnnxDeployment.bind(args.model, args.name), name=args.name,
              route_prefix=f"/v2/models/{args.name}/infer")
    # Wait for SIGINT/SIGTERM here (blocked, so that the default action does not end the process before
    # Ray's own processes are shut down).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    signal.sigwait({signal.SIGINT, signal.SIGTERM})
    serve.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
