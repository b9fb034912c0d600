"""The data plane: the node agent, its device workers (one queue per device, its sharing discipline), the
backends that execute a model (onnxruntime, or emulated from a profile), the Open Inference Protocol codec
and pre-processing."""
