"""MLServer serving the benchmark's ONNX model: the custom runtime ``mlserver_model.OnnxModel`` (run by
``bench_peers.py`` as ``mlserver start DIR`` in MLServer's own virtual environment, this folder on PYTHONPATH).

MLServer decodes the Open Inference Protocol request into its pydantic types; ``predict`` reads the tensor
with MLServer's ``NumpyCodec`` and answers with ``NumpyCodec.encode_output``, as its custom-runtime
documentation shows. ``bench_peers.py`` writes the settings: ``parallel_workers: 0`` (inference in the server
process, no hop to a worker pool: the fastest setting for a sub-millisecond model) and ``debug: false``.
Binary tensor data is not part of MLServer's REST API.
"""

from __future__ import annotations

from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse

from onnx_session import open_session  # beside this file


class OnnxModel(MLModel):  # type: ignore[misc]
    async def load(self) -> bool:
        self.session, self.input_name, self.output_name = open_session(self.settings.parameters.uri)
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        (y,) = self.session.run([self.output_name], {self.input_name: x})
        return InferenceResponse(model_name=self.name, id=payload.id,
                                 outputs=[NumpyCodec.encode_output(self.output_name, y)])
