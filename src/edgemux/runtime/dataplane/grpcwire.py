"""Open Inference Protocol over gRPC: its messages, and the codec between them and the HTTP codec's values.

The messages are those of KServe's ``grpc_predict_v2.proto`` (package ``inference``, service
``GRPCInferenceService``) and of the Triton extensions edgemux serves (statistics, repository index, system
shared memory), with the same field numbers, so that ``tritonclient.grpc`` and any client built from either
proto talk to edgemux unmodified (``tests/test_runtime_grpc.py`` checks every field against tritonclient's own
descriptors). They are written below as proto text and built at import into a descriptor pool of their own
(``protobuf``'s runtime, no generated code and no ``protoc``): a process that also holds tritonclient's
classes, which live in the default pool under the same names, does not collide with them.

The codec is pure, like :mod:`edgemux.runtime.dataplane.protocol`: :func:`decode_infer_request` turns a
``ModelInferRequest`` into the same :class:`~edgemux.runtime.dataplane.protocol.InferRequest` an HTTP body
decodes to (typed ``contents`` or ``raw_input_contents``), and :func:`infer_response` writes outputs as
``raw_output_contents``, as Triton answers. Problems are ``ProtocolError`` with an HTTP status, which the
servers turn into gRPC status codes (``runtime.grpcserver.CODES``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory

from edgemux.runtime.dataplane.protocol import (
    DATATYPES,
    InferRequest,
    NO_DATA,
    InputTensor,
    ProtocolError,
    RequestedOutput,
    ShmSlot,
    TensorSpec,
    datatype_of,
    shm_slot,
    tensor_bytes,
    tensor_from_bytes,
    tensor_size,
)

__all__ = ["METHODS", "PROTO", "SERVICE", "decode_infer_request", "from_json", "infer_response", "messages",
           "metadata_response", "parameters_of", "set_parameters"]

PACKAGE = "inference"
SERVICE = "inference.GRPCInferenceService"

# The wire contract. Field numbers are the protocol's: never renumber one.
PROTO = """
syntax = "proto3";
package inference;

message ServerLiveRequest {}
message ServerLiveResponse { bool live = 1; }
message ServerReadyRequest {}
message ServerReadyResponse { bool ready = 1; }
message ModelReadyRequest { string name = 1; string version = 2; }
message ModelReadyResponse { bool ready = 1; }
message ServerMetadataRequest {}
message ServerMetadataResponse { string name = 1; string version = 2; repeated string extensions = 3; }
message ModelMetadataRequest { string name = 1; string version = 2; }
message ModelMetadataResponse {
  message TensorMetadata { string name = 1; string datatype = 2; repeated int64 shape = 3; }
  string name = 1;
  repeated string versions = 2;
  string platform = 3;
  repeated TensorMetadata inputs = 4;
  repeated TensorMetadata outputs = 5;
}
message InferParameter {
  oneof parameter_choice {
    bool bool_param = 1;
    int64 int64_param = 2;
    string string_param = 3;
    double double_param = 4;
    uint64 uint64_param = 5;
  }
}
message InferTensorContents {
  repeated bool bool_contents = 1;
  repeated int32 int_contents = 2;
  repeated int64 int64_contents = 3;
  repeated uint32 uint_contents = 4;
  repeated uint64 uint64_contents = 5;
  repeated float fp32_contents = 6;
  repeated double fp64_contents = 7;
  repeated bytes bytes_contents = 8;
}
message ModelInferRequest {
  message InferInputTensor {
    string name = 1;
    string datatype = 2;
    repeated int64 shape = 3;
    map<string, InferParameter> parameters = 4;
    InferTensorContents contents = 5;
  }
  message InferRequestedOutputTensor {
    string name = 1;
    map<string, InferParameter> parameters = 2;
  }
  string model_name = 1;
  string model_version = 2;
  string id = 3;
  map<string, InferParameter> parameters = 4;
  repeated InferInputTensor inputs = 5;
  repeated InferRequestedOutputTensor outputs = 6;
  repeated bytes raw_input_contents = 7;
}
message ModelInferResponse {
  message InferOutputTensor {
    string name = 1;
    string datatype = 2;
    repeated int64 shape = 3;
    map<string, InferParameter> parameters = 4;
    InferTensorContents contents = 5;
  }
  string model_name = 1;
  string model_version = 2;
  string id = 3;
  map<string, InferParameter> parameters = 4;
  repeated InferOutputTensor outputs = 5;
  repeated bytes raw_output_contents = 6;
}
message StatisticDuration { uint64 count = 1; uint64 ns = 2; }
message InferStatistics {
  StatisticDuration success = 1;
  StatisticDuration fail = 2;
  StatisticDuration queue = 3;
  StatisticDuration compute_input = 4;
  StatisticDuration compute_infer = 5;
  StatisticDuration compute_output = 6;
  StatisticDuration cache_hit = 7;
  StatisticDuration cache_miss = 8;
}
message InferBatchStatistics {
  uint64 batch_size = 1;
  StatisticDuration compute_input = 2;
  StatisticDuration compute_infer = 3;
  StatisticDuration compute_output = 4;
}
message ModelStatistics {
  string name = 1;
  string version = 2;
  uint64 last_inference = 3;
  uint64 inference_count = 4;
  uint64 execution_count = 5;
  InferStatistics inference_stats = 6;
  repeated InferBatchStatistics batch_stats = 7;
}
message ModelStatisticsRequest { string name = 1; string version = 2; }
message ModelStatisticsResponse { repeated ModelStatistics model_stats = 1; }
message RepositoryIndexRequest { string repository_name = 1; bool ready = 2; }
message RepositoryIndexResponse {
  message ModelIndex { string name = 1; string version = 2; string state = 3; string reason = 4; }
  repeated ModelIndex models = 1;
}
message SystemSharedMemoryStatusRequest { string name = 1; }
message SystemSharedMemoryStatusResponse {
  message RegionStatus { string name = 1; string key = 2; uint64 offset = 3; uint64 byte_size = 4; }
  map<string, RegionStatus> regions = 1;
}
message SystemSharedMemoryRegisterRequest { string name = 1; string key = 2; uint64 offset = 3; uint64 byte_size = 4; }
message SystemSharedMemoryRegisterResponse {}
message SystemSharedMemoryUnregisterRequest { string name = 1; }
message SystemSharedMemoryUnregisterResponse {}

service GRPCInferenceService {
  rpc ServerLive(ServerLiveRequest) returns (ServerLiveResponse) {}
  rpc ServerReady(ServerReadyRequest) returns (ServerReadyResponse) {}
  rpc ModelReady(ModelReadyRequest) returns (ModelReadyResponse) {}
  rpc ServerMetadata(ServerMetadataRequest) returns (ServerMetadataResponse) {}
  rpc ModelMetadata(ModelMetadataRequest) returns (ModelMetadataResponse) {}
  rpc ModelInfer(ModelInferRequest) returns (ModelInferResponse) {}
  rpc ModelStatistics(ModelStatisticsRequest) returns (ModelStatisticsResponse) {}
  rpc RepositoryIndex(RepositoryIndexRequest) returns (RepositoryIndexResponse) {}
  rpc SystemSharedMemoryStatus(SystemSharedMemoryStatusRequest) returns (SystemSharedMemoryStatusResponse) {}
  rpc SystemSharedMemoryRegister(SystemSharedMemoryRegisterRequest) returns (SystemSharedMemoryRegisterResponse) {}
  rpc SystemSharedMemoryUnregister(SystemSharedMemoryUnregisterRequest) returns (SystemSharedMemoryUnregisterResponse) {}
}
"""

# ------------------------------------------------------------------------------------ proto text -> classes

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    "bool": _F.TYPE_BOOL, "string": _F.TYPE_STRING, "bytes": _F.TYPE_BYTES, "int32": _F.TYPE_INT32,
    "int64": _F.TYPE_INT64, "uint32": _F.TYPE_UINT32, "uint64": _F.TYPE_UINT64, "float": _F.TYPE_FLOAT,
    "double": _F.TYPE_DOUBLE,
}
_TOKEN = re.compile(r'"[^"]*"|[A-Za-z_][\w.]*|\d+|[{}<>=;,()]')


class _Reader:
    """The proto text's tokens, read in order by a recursive descent over the subset written above
    (messages, nested messages, ``oneof``, ``map<,>``, ``repeated``, one service)."""

    def __init__(self, text: str) -> None:
        self.tokens = _TOKEN.findall(re.sub(r"//[^\n]*", "", text))
        self.pos = 0

    def take(self, want: str | None = None) -> str:
        tok = self.tokens[self.pos]
        if want is not None and tok != want:
            raise ValueError(f"proto text: expected {want!r} at token {self.pos}, got {tok!r}")
        self.pos += 1
        return tok

    def peek(self) -> str:
        return self.tokens[self.pos]

    def done(self) -> bool:
        return self.pos >= len(self.tokens)


def _file_proto(text: str) -> descriptor_pb2.FileDescriptorProto:
    """The ``FileDescriptorProto`` of the proto text (``PROTO``), type names resolved as protoc resolves
    them: innermost scope first."""
    r = _Reader(text)
    fdp = descriptor_pb2.FileDescriptorProto(name="edgemux_inference.proto")
    pending: list[tuple[str, Any, str]] = []  # (scope, field, type name as written), resolved at the end
    while not r.done():
        tok = r.take()
        if tok == "syntax":
            r.take("=")
            fdp.syntax = r.take().strip('"')
            r.take(";")
        elif tok == "package":
            fdp.package = r.take()
            r.take(";")
        elif tok == "message":
            _message(r, fdp.message_type.add(), fdp.package, pending)
        elif tok == "service":
            svc = fdp.service.add(name=r.take())
            r.take("{")
            while r.peek() != "}":
                r.take("rpc")
                m = svc.method.add(name=r.take())
                r.take("(")
                m.input_type = f".{fdp.package}.{r.take()}"
                r.take(")")
                r.take("returns")
                r.take("(")
                m.output_type = f".{fdp.package}.{r.take()}"
                r.take(")")
                r.take("{")
                r.take("}")
            r.take("}")
        else:
            raise ValueError(f"proto text: unexpected {tok!r}")
    known = {f".{fdp.package}.{n}" for n in _names(fdp.message_type)}
    for scope, fld, written in pending:
        parts = scope.split(".")
        for i in range(len(parts), 0, -1):
            candidate = "." + ".".join(parts[:i] + [written])
            if candidate in known:
                fld.type_name = candidate
                break
        else:
            raise ValueError(f"proto text: unknown type {written!r} in {scope}")
    return fdp


def _names(messages: Any, prefix: str = "") -> list[str]:
    out = []
    for m in messages:
        out.append(prefix + m.name)
        out += _names(m.nested_type, prefix + m.name + ".")
    return out


def _message(r: _Reader, msg: descriptor_pb2.DescriptorProto, scope: str,
             pending: list[tuple[str, Any, str]]) -> None:
    msg.name = r.take()
    here = f"{scope}.{msg.name}"
    r.take("{")
    oneof: int | None = None
    while True:
        tok = r.take()
        if tok == "}":
            if oneof is None:
                return
            oneof = None  # the end of a oneof block; the message goes on
            continue
        if tok == "message":
            _message(r, msg.nested_type.add(), here, pending)
            continue
        if tok == "oneof":
            msg.oneof_decl.add(name=r.take())
            oneof = len(msg.oneof_decl) - 1
            r.take("{")
            continue
        fld = msg.field.add(label=_F.LABEL_OPTIONAL)
        if tok == "map":
            r.take("<")
            key = r.take()
            r.take(",")
            value = r.take()
            r.take(">")
            fld.name = r.take()
            entry = msg.nested_type.add(name="".join(p.title() for p in fld.name.split("_")) + "Entry")
            entry.options.map_entry = True
            entry.field.add(name="key", number=1, label=_F.LABEL_OPTIONAL, type=_SCALARS[key])
            v = entry.field.add(name="value", number=2, label=_F.LABEL_OPTIONAL)
            _type(v, value, f"{here}.{entry.name}", pending)
            fld.label = _F.LABEL_REPEATED
            fld.type = _F.TYPE_MESSAGE
            fld.type_name = f".{here}.{entry.name}"
        else:
            if tok == "repeated":
                fld.label = _F.LABEL_REPEATED
                tok = r.take()
            _type(fld, tok, here, pending)
            fld.name = r.take()
        r.take("=")
        fld.number = int(r.take())
        fld.json_name = fld.name  # Triton's JSON (statistics, index) uses the proto's own names
        if oneof is not None:
            fld.oneof_index = oneof
        r.take(";")


def _type(fld: Any, written: str, scope: str, pending: list[tuple[str, Any, str]]) -> None:
    if written in _SCALARS:
        fld.type = _SCALARS[written]
    else:
        fld.type = _F.TYPE_MESSAGE
        pending.append((scope, fld, written))


class _Messages:
    """The message classes by name (``messages.ModelInferRequest``), built once from ``PROTO``."""

    def __init__(self) -> None:
        fdp = _file_proto(PROTO)
        pool = descriptor_pool.DescriptorPool()  # not the default pool: tritonclient's classes live there
        pool.Add(fdp)
        self.file = pool.FindFileByName(fdp.name)
        for name in self.file.message_types_by_name:
            setattr(self, name, message_factory.GetMessageClass(self.file.message_types_by_name[name]))
        self.methods: dict[str, tuple[Any, Any]] = {
            m.name: (message_factory.GetMessageClass(m.input_type), message_factory.GetMessageClass(m.output_type))
            for m in self.file.services_by_name["GRPCInferenceService"].methods
        }

    def __getattr__(self, name: str) -> Any:  # for the type checker: classes are set in __init__
        raise AttributeError(f"no message {name!r} in edgemux's inference proto")


messages = _Messages()
# rpc name -> (request class, response class), in the service's order
METHODS: dict[str, tuple[Any, Any]] = messages.methods

# ------------------------------------------------------------------------------------------------- codec

# the typed contents field of each datatype (FP16 has none: it travels as raw bytes only)
_CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
             "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
             "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
             "FP64": "fp64_contents", "BYTES": "bytes_contents"}


def parameters_of(params: Any) -> dict[str, Any]:
    """A ``map<string, InferParameter>`` as a dict of Python values (a parameter with no value set: None)."""
    out: dict[str, Any] = {}
    for key, p in params.items():
        which = p.WhichOneof("parameter_choice")
        out[key] = getattr(p, which) if which else None
    return out


def set_parameters(target: Any, values: Mapping[str, Any]) -> None:
    """Write ``values`` into a ``map<string, InferParameter>`` (bool, int, float or str each; a value of
    another type is written as its text)."""
    for key, v in values.items():
        p = target[key]
        if isinstance(v, bool):
            p.bool_param = v
        elif isinstance(v, int):
            if v >= 2**63:
                p.uint64_param = v
            else:
                p.int64_param = v
        elif isinstance(v, float):
            p.double_param = v
        else:
            p.string_param = str(v)


def decode_infer_request(msg: Any) -> InferRequest:
    """The :class:`InferRequest` a ``ModelInferRequest`` carries: each input from its ``raw_input_contents``
    entry (then every input has one, in order) or from its typed ``contents``; every output asked for comes
    back as raw bytes. ``ProtocolError`` 400 naming what was expected and what came."""
    raw = msg.raw_input_contents
    slots = [shm_slot(parameters_of(t.parameters), f"input '{t.name}'") for t in msg.inputs]
    in_request = sum(slot is None for slot in slots)  # inputs in shared memory have no raw contents
    if raw and len(raw) != in_request:
        raise ProtocolError(f"raw_input_contents has {len(raw)} entries for {in_request} inputs: give every "
                            "input's raw contents (but those in shared memory), in the inputs' order, or none")
    inputs = []
    next_raw = 0
    for t, slot in zip(msg.inputs, slots):
        where = f"input '{t.name}'"
        if t.datatype not in DATATYPES:
            raise ProtocolError(f"{where}: unsupported datatype '{t.datatype[:40]}' "
                                f"(supported: {', '.join(DATATYPES)})")
        shape = tuple(t.shape)
        if any(d < 0 for d in shape):
            raise ProtocolError(f"{where}: 'shape' must be non-negative integers, got {list(shape)}")
        params = parameters_of(t.parameters)
        count = math.prod(shape)
        if slot is not None:
            if t.HasField("contents"):
                raise ProtocolError(f"{where}: has both a shared memory region and contents")
            array = NO_DATA
        elif raw:
            if t.HasField("contents"):
                raise ProtocolError(f"{where}: has both contents and raw_input_contents")
            array = tensor_from_bytes(memoryview(raw[next_raw]), t.datatype, shape, count, where)
            next_raw += 1
        else:
            array = _from_contents(t, shape, count, where)
        inputs.append(InputTensor(t.name, t.datatype, shape, array, params, slot))
    outputs = [RequestedOutput(o.name, True, shm_slot(parameters_of(o.parameters), f"output '{o.name}'"))
               for o in msg.outputs]
    return InferRequest(id=msg.id or None, parameters=parameters_of(msg.parameters), inputs=inputs,
                        outputs=outputs, binary_data_output=True)


def _from_contents(t: Any, shape: tuple[int, ...], count: int, where: str) -> np.ndarray:
    """An input's array from its typed ``contents`` (the field its datatype uses, and no other)."""
    field = _CONTENTS.get(t.datatype)
    if field is None:
        raise ProtocolError(f"{where}: datatype {t.datatype} has no typed contents; send it in raw_input_contents")
    contents = t.contents
    others = [f.name for f, _ in contents.ListFields() if f.name != field]
    if others:
        raise ProtocolError(f"{where}: datatype {t.datatype} goes in contents.{field}, got {', '.join(others)}")
    values = getattr(contents, field)
    if len(values) != count:
        raise ProtocolError(f"{where}: contents.{field} has {len(values)} elements but shape "
                            f"[{','.join(map(str, shape))}] needs {count}")
    if t.datatype == "BYTES":
        out = np.empty(count, dtype=object)
        out[:] = list(values)
        return out.reshape(shape)
    dtype = DATATYPES[t.datatype]
    if dtype.kind in "iu" and dtype.itemsize < 4 and count:
        array = np.asarray(values, dtype=np.int64)
        info = np.iinfo(dtype)
        if array.min() < info.min or array.max() > info.max:
            raise ProtocolError(f"{where}: contents.{field} has a value outside {t.datatype}'s range "
                                f"[{info.min}, {info.max}]")
        return array.astype(dtype).reshape(shape)
    return np.asarray(values, dtype=dtype).reshape(shape)


def infer_response(model_name: str, model_version: str, outputs: Mapping[str, np.ndarray],
                   names: Sequence[str] = (), *, id: str | None = None,
                   parameters: Mapping[str, Any] | None = None, slots: Mapping[str, ShmSlot] | None = None) -> Any:
    """A ``ModelInferResponse`` with ``outputs`` as ``raw_output_contents`` (as Triton answers): those named
    in ``names``, in that order, or every one when ``names`` is empty. An output in ``slots`` was written
    into shared memory (``dataplane.shm``): its entry names the region and its contents are empty.
    ``ProtocolError`` 400 for a name the model does not produce."""
    resp = messages.ModelInferResponse(model_name=model_name, model_version=model_version, id=id or "")
    for n in names:
        if n not in outputs:
            raise ProtocolError(f"unexpected output '{n}': model '{model_name}' produces {', '.join(outputs)}")
    slots = slots or {}
    for name in names or list(outputs):
        array = np.asarray(outputs[name])
        datatype = datatype_of(array.dtype, name)
        out = resp.outputs.add(name=name, datatype=datatype, shape=array.shape)
        slot = slots.get(name)
        if slot is None:
            resp.raw_output_contents.append(tensor_bytes(array, datatype))
            continue
        set_parameters(out.parameters, slot.parameters(tensor_size(array, datatype)))
        resp.raw_output_contents.append(b"")  # keeps the others' contents at their outputs' index
    if parameters:
        set_parameters(resp.parameters, parameters)
    return resp


def metadata_response(name: str, versions: Sequence[str], platform: str, inputs: Sequence[TensorSpec],
                      outputs: Sequence[TensorSpec]) -> Any:
    """A ``ModelMetadataResponse`` (the tensors' quantization, which the proto has no field for, is in the
    HTTP metadata's tensor ``parameters`` only)."""
    resp = messages.ModelMetadataResponse(name=name, versions=list(versions), platform=platform)
    for t in inputs:
        resp.inputs.add(name=t.name, datatype=t.datatype, shape=t.shape)
    for t in outputs:
        resp.outputs.add(name=t.name, datatype=t.datatype, shape=t.shape)
    return resp


def from_json(cls: Any, doc: Mapping[str, Any]) -> Any:
    """A message of ``cls`` from the JSON an HTTP endpoint answers with the same content (statistics,
    metadata, the repository index: Triton names their fields alike); fields the proto lacks are left out."""
    return json_format.ParseDict(doc, cls(), ignore_unknown_fields=True)
