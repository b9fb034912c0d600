"""Open Inference Protocol (KServe v2) codec over HTTP, with Triton's binary tensor data extension.

Pure functions from bytes to typed values and back, so that ``tritonclient.http`` works unmodified against
the edgemux agent and gateway. No I/O happens here: the HTTP layer reads the body and the
``Inference-Header-Content-Length`` header, calls :func:`decode_infer_request`, checks the request with
:func:`validate_request`, and writes what :func:`encode_infer_response` returns. Any problem with what a
client sent is a :class:`ProtocolError` carrying the HTTP status to answer with and a Triton-style message.

Wire format (https://github.com/kserve/open-inference-protocol, Triton's ``binary_tensor_data`` extension):
a JSON header, optionally followed by the raw bytes of tensors whose JSON entry carries
``parameters.binary_data_size`` instead of ``data``; the header's length in bytes is then sent in the
``Inference-Header-Content-Length`` HTTP header. Binary tensors are little-endian, row-major; BOOL is one
byte per element; BYTES is each element as a 4-byte little-endian length followed by its bytes.
"""

from __future__ import annotations

import array
import json
import math
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from edgemux.errors import EdgemuxError

# Name of the HTTP header that carries the JSON header's length when binary tensor data follows it.
HEADER_LENGTH_HEADER = "Inference-Header-Content-Length"
# Largest request body accepted unless the server says otherwise: a 4K RGB FP32 frame is ~100 MB, the edge
# models we serve take far less; a bound keeps one client from exhausting an agent's memory.
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024

# Triton datatype name -> numpy dtype (little-endian, as on the wire). BYTES elements are Python ``bytes``.
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}
_INT_TYPES = {"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"}
_FLOAT_TYPES = {"FP16", "FP32", "FP64"}
_LEN_PREFIX = struct.Struct("<I")


class ProtocolError(EdgemuxError):
    """A request the protocol cannot accept: ``status`` is the HTTP status to answer with (400 bad request,
    413 body too large, 500 when the server itself produced something it cannot encode)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass(frozen=True)
class TensorSpec:
    """A model's declared input or output: ``shape`` uses -1 for a variable dimension (e.g. the batch)."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.datatype not in DATATYPES:
            raise ValueError(f"tensor {self.name!r}: unsupported datatype {self.datatype!r} (supported: {_known()})")
        if any(not isinstance(d, int) or d < -1 for d in self.shape):
            raise ValueError(f"tensor {self.name!r}: shape dims must be integers >= -1, got {list(self.shape)}")


@dataclass(frozen=True)
class ShmSlot:
    """Where a tensor lies in a registered system shared-memory region (Triton's extension): the region's
    name, ``offset`` bytes into it, ``byte_size`` bytes long. With ``key`` (a gateway passing a caller's
    slot on to an agent on its host: ``edgemux_shm_key`` and ``edgemux_shm_offset``) the slot is
    ``offset`` bytes into that shared-memory object itself, registered nowhere (``dataplane.shm``)."""

    region: str
    offset: int
    byte_size: int
    key: str | None = None

    def parameters(self, byte_size: int) -> dict[str, Any]:
        """The tensor parameters naming this slot, with ``byte_size`` bytes in it."""
        if self.key is not None:
            return {"edgemux_shm_key": self.key, "edgemux_shm_offset": self.offset, "shared_memory_byte_size": byte_size}
        out: dict[str, Any] = {"shared_memory_region": self.region, "shared_memory_byte_size": byte_size}
        if self.offset:
            out["shared_memory_offset"] = self.offset
        return out


@dataclass
class InputTensor:
    """One decoded input: ``data`` already has ``shape`` and the numpy dtype of ``datatype`` (BYTES: an object
    array of ``bytes``). Binary inputs are read-only views on the request body (no copy). An input in shared
    memory has its ``shm`` slot and no data yet (an empty array) until ``dataplane.shm`` reads it."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray
    parameters: dict[str, Any] = field(default_factory=dict)
    shm: ShmSlot | None = None


@dataclass(frozen=True)
class RequestedOutput:
    """An output the client asked for; ``binary_data`` is None when the client did not say (then the
    request-level ``binary_data_output`` parameter decides); ``shm``: written into that shared-memory slot
    instead of the answer."""

    name: str
    binary_data: bool | None = None
    shm: ShmSlot | None = None


@dataclass
class InferRequest:
    """A decoded inference request. ``outputs`` empty means "every output the model produces"."""

    id: str | None
    parameters: dict[str, Any]
    inputs: list[InputTensor]
    outputs: list[RequestedOutput]
    binary_data_output: bool = False

    def input(self, name: str) -> np.ndarray:
        """The array of input ``name`` (KeyError if the request has no such input)."""
        for t in self.inputs:
            if t.name == name:
                return t.data
        raise KeyError(name)

    @property
    def uses_shm(self) -> bool:
        """Whether an input or an output of it lies in shared memory."""
        return any(t.shm is not None for t in self.inputs) or any(o.shm is not None for o in self.outputs)

    def wants_binary(self, name: str) -> bool:
        """Whether output ``name`` goes back as binary data: its own ``binary_data`` flag if the client set
        one, else the request-level ``binary_data_output`` parameter (default JSON, as in Triton)."""
        for o in self.outputs:
            if o.name == name and o.binary_data is not None:
                return o.binary_data
        return self.binary_data_output


# ----------------------------------------------------------------------------------------------- decoding


def check_content_length(value: str | int | None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> int | None:
    """Check an HTTP ``Content-Length`` before reading the body, so an oversized request is refused (413)
    without buffering it. Returns the length in bytes, or None when the header is absent."""
    if value is None:
        return None
    n = _parse_length(value, "Content-Length")
    if n > max_body_bytes:
        raise ProtocolError(f"request body of {n} bytes exceeds the limit of {max_body_bytes} bytes", 413)
    return n


def decode_infer_request(
    body: bytes,
    header_length: str | int | None = None,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> InferRequest:
    """Decode an inference request body.

    ``header_length`` is the value of the ``Inference-Header-Content-Length`` HTTP header (None when the body
    is pure JSON); ``max_body_bytes`` bounds the body size in bytes (413 above it). Raises only
    :class:`ProtocolError`, whatever the bytes.
    """
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise ProtocolError(f"request body must be bytes, got {type(body).__name__}")
    body = bytes(body)
    if len(body) > max_body_bytes:
        raise ProtocolError(f"request body of {len(body)} bytes exceeds the limit of {max_body_bytes} bytes", 413)
    if header_length is None:
        hlen = len(body)
    else:
        hlen = _parse_length(header_length, HEADER_LENGTH_HEADER)
        if hlen > len(body):
            raise ProtocolError(
                f"{HEADER_LENGTH_HEADER} {hlen} is larger than the request body ({len(body)} bytes)"
            )
    header = _parse_json(body[:hlen], "request")
    if not isinstance(header, dict):
        raise ProtocolError(f"request JSON must be an object, got {json_type(header)}")
    binary = memoryview(body)[hlen:]

    req_id = header.get("id")
    if req_id is not None and not isinstance(req_id, str):
        raise ProtocolError(f"request 'id' must be a string, got {json_type(req_id)}")
    params = _parameters(header.get("parameters"), "request")
    bdo = params.get("binary_data_output", False)
    if not isinstance(bdo, bool):
        raise ProtocolError(f"request parameter 'binary_data_output' must be true or false, got {bdo!r}")

    raw_inputs = header.get("inputs")
    if not isinstance(raw_inputs, list):
        raise ProtocolError(f"request 'inputs' must be a list, got {json_type(raw_inputs)}")
    inputs: list[InputTensor] = []
    offset = 0
    seen: set[str] = set()
    for i, raw in enumerate(raw_inputs):
        tensor, offset = _decode_input(raw, i, binary, offset, header_length is not None)
        if tensor.name in seen:
            raise ProtocolError(f"input '{tensor.name}' appears more than once")
        seen.add(tensor.name)
        inputs.append(tensor)
    if offset != len(binary):
        # Leftover bytes mean the client and we disagree about the layout: refuse rather than guess.
        raise ProtocolError(
            f"{len(binary) - offset} bytes of binary data after the inputs' binary_data_size total of {offset}"
        )

    raw_outputs = header.get("outputs", [])
    if not isinstance(raw_outputs, list):
        raise ProtocolError(f"request 'outputs' must be a list, got {json_type(raw_outputs)}")
    outputs = [_decode_requested_output(raw, i) for i, raw in enumerate(raw_outputs)]
    asked: set[str] = set()
    for o in outputs:
        if o.name in asked:
            raise ProtocolError(f"output '{o.name}' requested more than once")
        asked.add(o.name)
    return InferRequest(id=req_id, parameters=params, inputs=inputs, outputs=outputs, binary_data_output=bdo)


def _decode_input(
    raw: Any, index: int, binary: memoryview, offset: int, has_binary: bool
) -> tuple[InputTensor, int]:
    """Decode ``inputs[index]``; binary data starts at ``offset`` of ``binary``. Returns the new offset."""
    if not isinstance(raw, dict):
        raise ProtocolError(f"inputs[{index}] must be an object, got {json_type(raw)}")
    name = raw.get("name")
    if not isinstance(name, str):
        raise ProtocolError(f"inputs[{index}]: 'name' must be a string, got {json_type(name)}")
    where = f"input '{name}'"
    datatype = raw.get("datatype")
    if not isinstance(datatype, str):
        raise ProtocolError(f"{where}: 'datatype' must be a string, got {json_type(datatype)}")
    if datatype not in DATATYPES:
        raise ProtocolError(f"{where}: unsupported datatype '{datatype}' (supported: {_known()})")
    shape = _shape(raw.get("shape"), where)
    params = _parameters(raw.get("parameters"), where)
    count = math.prod(shape)
    slot = shm_slot(params, where)
    if slot is not None:
        if "data" in raw or "binary_data_size" in params:
            raise ProtocolError(f"{where}: has both a shared memory region and data in the request")
        return InputTensor(name, datatype, shape, NO_DATA, params, slot), offset
    size = params.get("binary_data_size")
    if size is not None:
        if "data" in raw:
            raise ProtocolError(f"{where}: has both 'data' and parameters.binary_data_size")
        if not has_binary:
            raise ProtocolError(f"{where}: binary_data_size given but the request has no {HEADER_LENGTH_HEADER} header")
        if not _is_int(size) or size < 0:
            raise ProtocolError(f"{where}: binary_data_size must be a non-negative integer, got {size!r}")
        remain = len(binary) - offset
        if size > remain:
            raise ProtocolError(f"{where}: binary_data_size {size} but {remain} bytes remain")
        chunk = binary[offset : offset + size]
        array = tensor_from_bytes(chunk, datatype, shape, count, where)
        return InputTensor(name, datatype, shape, array, params), offset + size
    if "data" not in raw:
        raise ProtocolError(f"{where}: no 'data' and no parameters.binary_data_size")
    array = _from_json(raw["data"], datatype, shape, count, where)
    return InputTensor(name, datatype, shape, array, params), offset


def tensor_from_bytes(chunk: memoryview, datatype: str, shape: tuple[int, ...], count: int, where: str) -> np.ndarray:
    """Array of ``shape`` (``count`` elements) from the raw little-endian bytes of one tensor, as the binary
    extension and gRPC's ``raw_input_contents`` carry it (a read-only view, no copy; BYTES: an object array).
    ``ProtocolError`` naming ``where`` when the size does not fit."""
    if datatype == "BYTES":
        items = _split_bytes(chunk, where)
        if len(items) != count:
            raise ProtocolError(f"{where}: BYTES data has {len(items)} elements but shape {_fmt(shape)} needs {count}")
        out = np.empty(count, dtype=object)
        out[:] = items
        return out.reshape(shape)
    dtype = DATATYPES[datatype]
    need = count * dtype.itemsize
    if len(chunk) != need:
        raise ProtocolError(
            f"{where}: binary_data_size {len(chunk)} does not match shape {_fmt(shape)} of {datatype} "
            f"(expected {need} bytes)"
        )
    if datatype == "BOOL":
        # Any non-zero byte is true; viewing arbitrary bytes as np.bool_ would give invalid booleans.
        return (np.frombuffer(chunk, dtype=np.uint8) != 0).reshape(shape)
    return np.frombuffer(chunk, dtype=dtype).reshape(shape)


def _split_bytes(chunk: memoryview, where: str) -> list[bytes]:
    """Split Triton's BYTES serialization: each element is a 4-byte little-endian length, then the bytes."""
    items: list[bytes] = []
    pos, end = 0, len(chunk)
    while pos < end:
        if end - pos < 4:
            raise ProtocolError(
                f"{where}: BYTES element {len(items)} has a truncated length prefix ({end - pos} bytes)"
            )
        (n,) = _LEN_PREFIX.unpack_from(chunk, pos)
        pos += 4
        if n > end - pos:
            raise ProtocolError(f"{where}: BYTES element {len(items)} claims {n} bytes but {end - pos} remain")
        items.append(bytes(chunk[pos : pos + n]))
        pos += n
    return items


_NONE = object()  # "no bad element": None itself is a JSON null a client may send


def _from_json(data: Any, datatype: str, shape: tuple[int, ...], count: int, where: str) -> np.ndarray:
    """Array of ``shape`` from a JSON ``data`` value (flat or nested lists, row-major)."""
    if type(data) is list and len(data) == count and (datatype in _FLOAT_TYPES or datatype in _INT_TYPES):
        typed = _typed_list(data, datatype)
        if typed is not None:
            return typed.reshape(shape)
    return _from_json_general(data, datatype, shape, count, where)


def _from_json_general(data: Any, datatype: str, shape: tuple[int, ...], count: int, where: str) -> np.ndarray:
    """``_from_json`` for any value: nested lists, every datatype, and the message naming what is wrong."""
    flat, types = _flatten(data)
    if len(flat) != count:
        raise ProtocolError(f"{where}: 'data' has {len(flat)} elements but shape {_fmt(shape)} needs {count}")
    if datatype == "BYTES":
        bad = _first_not(flat, types, (str,), lambda v: isinstance(v, str))
        if bad is not _NONE:
            raise ProtocolError(f"{where}: BYTES data must be strings, got {json_type(bad)} {short_repr(bad)}")
        out = np.empty(count, dtype=object)
        out[:] = [v.encode("utf-8", "surrogatepass") for v in flat]
        return out.reshape(shape)
    if datatype == "BOOL":
        bad = _first_not(flat, types, (bool,), lambda v: isinstance(v, bool))
        if bad is not _NONE:
            raise ProtocolError(f"{where}: BOOL data must be true or false, got {short_repr(bad)}")
        return np.array(flat, dtype=np.bool_).reshape(shape)
    dtype = DATATYPES[datatype]
    if datatype in _INT_TYPES:
        info = np.iinfo(dtype)
        bad = _first_not(flat, types, (int,), _is_int)
        if isinstance(bad, float) and bad.is_integer() and not info.min <= bad <= info.max:
            # a whole number beyond the type's range: an integer literal beyond 64 bits reaches here as a
            # float (orjson reads it so), and "out of range" is true of it whichever way it was written
            raise ProtocolError(f"{where}: value {bad:.17g} is out of range for {datatype} [{info.min}, {info.max}]")
        if bad is not _NONE:
            raise ProtocolError(f"{where}: {datatype} data must be integers, got {short_repr(bad)}")
        if flat:
            lo, hi = min(flat), max(flat)
            if lo < info.min or hi > info.max:
                v = lo if lo < info.min else hi
                raise ProtocolError(f"{where}: value {v} is out of range for {datatype} [{info.min}, {info.max}]")
        return np.array(flat, dtype=dtype).reshape(shape)
    bad = _first_not(flat, types, (int, float), lambda v: _is_int(v) or isinstance(v, float))
    if bad is not _NONE:
        raise ProtocolError(f"{where}: {datatype} data must be numbers, got {short_repr(bad)}")
    try:
        with np.errstate(over="ignore"):  # a JSON number beyond FP16/FP32 becomes inf, as a C cast would
            return np.array(flat, dtype=dtype).reshape(shape)
    except OverflowError:  # an integer too large even for a double
        raise ProtocolError(f"{where}: a value is out of range for {datatype}") from None


def _typed_list(data: list[Any], datatype: str) -> np.ndarray | None:
    """The flat list ``data`` of a numeric datatype as an array, read in one C loop, or None to leave it to
    the general path (which then decides, and names the problem when there is one).

    The common case, a flat list of numbers straight from the JSON parser, costs a Python object per element
    to check and another pass to convert (``_flatten``'s type set, then ``numpy.array``): half of a JSON
    request's decoding. ``array.array`` does both at once: 'd' takes ints and floats and refuses strings,
    null, lists and objects (TypeError) and integers beyond a double (OverflowError); 'q'/'Q' refuse floats
    too and integers beyond 64 bits. Both take booleans as 0 and 1 (a bool is an int in Python), which JSON
    keeps apart: only the elements equal to 0 or 1 are looked at. An integer outside a narrower type's range
    goes to the general path too. What it returns is what the general path gives, element for element: the
    same conversions (a Python float or int to a double or a 64-bit int, then numpy's cast; numpy too takes
    a Python int to FP32 through a double).
    """
    float_type = datatype in _FLOAT_TYPES
    try:
        raw = array.array("d" if float_type else ("Q" if datatype == "UINT64" else "q"), data)
    except (TypeError, OverflowError):
        return None
    values = np.frombuffer(raw, dtype=raw.typecode)  # numpy reads array's typecodes: double, int64, uint64
    suspects = np.flatnonzero((values == 0) | (values == 1))
    if suspects.size and any(type(data[i]) is bool for i in suspects.tolist()):
        return None
    dtype = DATATYPES[datatype]
    if float_type:
        with np.errstate(over="ignore"):  # a JSON number beyond FP16/FP32 becomes inf, as a C cast would
            return values.astype(dtype)
    info = np.iinfo(dtype)
    if values.size and (values.min() < info.min or values.max() > info.max):
        return None
    return values.astype(dtype)


def _first_not(flat: list[Any], types: set[type], allowed: tuple[type, ...], ok: Callable[[Any], bool]) -> Any:
    """The first element of ``flat`` that ``ok`` refuses, or ``_NONE``; ``types`` (the set of the elements'
    exact types) answers at once when every one is ``allowed`` (exact types: a bool is not an int here)."""
    if types.issubset(allowed):
        return _NONE
    return next((v for v in flat if not ok(v)), _NONE)


def _flatten(data: Any) -> tuple[list[Any], set[type]]:
    """Row-major flattening of nested lists, iteratively so that deep nesting cannot exhaust the stack, and
    the set of the elements' exact types. The types are found in C (``set(map(type, ...))``, a few ns per
    element where a Python check took ten times that), once: the callers' checks read the set and look for
    a bad element only to name it. Decoded JSON's lists are exactly ``list``."""
    if not isinstance(data, list):
        return [data], {type(data)}
    types = set(map(type, data))
    if list not in types:
        return data, types  # the common flat case, without copying
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for v in stack[-1]:
            if isinstance(v, list):
                stack.append(iter(v))
                break
            out.append(v)
        else:
            stack.pop()
    return out, set(map(type, out))


def _decode_requested_output(raw: Any, index: int) -> RequestedOutput:
    if not isinstance(raw, dict):
        raise ProtocolError(f"outputs[{index}] must be an object, got {json_type(raw)}")
    name = raw.get("name")
    if not isinstance(name, str):
        raise ProtocolError(f"outputs[{index}]: 'name' must be a string, got {json_type(name)}")
    params = _parameters(raw.get("parameters"), f"output '{name}'")
    slot = shm_slot(params, f"output '{name}'")
    if params.get("classification", 0) not in (0, None):
        # Refuse instead of silently returning raw scores where the client expects top-k labels.
        raise ProtocolError(f"output '{name}': the classification extension is not supported")
    flag = params.get("binary_data")
    if flag is not None and not isinstance(flag, bool):
        raise ProtocolError(f"output '{name}': binary_data must be true or false, got {flag!r}")
    return RequestedOutput(name, flag, slot)


NO_DATA = np.empty(0, dtype=np.uint8)  # an input in shared memory, until it is read
_SLOT_KEYS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset", "edgemux_shm_key",
              "edgemux_shm_offset")


def shm_slot(params: Mapping[str, Any], where: str) -> ShmSlot | None:
    """The shared-memory slot a tensor's ``parameters`` name (``shared_memory_region``,
    ``shared_memory_byte_size``, optional ``shared_memory_offset``, as tritonclient writes them; or a
    gateway's ``edgemux_shm_key`` and ``edgemux_shm_offset``), None when they name none; ``ProtocolError``
    400 for a slot that is not a region name and two non-negative sizes."""
    if not any(k in params for k in _SLOT_KEYS):
        return None
    key = params.get("edgemux_shm_key")
    if key is not None:  # a gateway's pass-through: the object itself (dataplane.shm checks who may)
        if not isinstance(key, str) or "shared_memory_region" in params or "shared_memory_offset" in params:
            raise ProtocolError(f"{where}: edgemux_shm_key must be a shared memory object's key, alone, got "
                                f"{short_repr(key)}")
        region, offset_name = key, "edgemux_shm_offset"
    else:
        named = params.get("shared_memory_region")
        if not isinstance(named, str) or not named:
            raise ProtocolError(f"{where}: shared_memory_region must be a region's name, got {short_repr(named)}")
        region, offset_name = named, "shared_memory_offset"
    sizes: list[int] = []
    for key_name, value in ((offset_name, params.get(offset_name, 0)),
                       ("shared_memory_byte_size", params.get("shared_memory_byte_size"))):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ProtocolError(f"{where}: {key_name} must be a non-negative integer (bytes), got {short_repr(value)}")
        sizes.append(value)
    return ShmSlot(region, sizes[0], sizes[1], key)


# --------------------------------------------------------------------------------------------- validation


def validate_request(
    request: InferRequest,
    model_name: str,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec] | None = None,
) -> None:
    """Check a decoded request against the model's declared inputs (and outputs, when given): names,
    datatypes, shapes (-1 matches any size). Raises :class:`ProtocolError` (400) naming what was expected and
    what came."""
    declared = {s.name: s for s in inputs}
    for t in request.inputs:
        spec = declared.get(t.name)
        if spec is None:
            raise ProtocolError(f"unexpected input '{t.name}': model '{model_name}' expects {_names(inputs)}")
        if t.datatype != spec.datatype:
            raise ProtocolError(
                f"unexpected datatype for input '{t.name}': expected {spec.datatype}, got {t.datatype}"
            )
        if not _shape_matches(t.shape, spec.shape):
            raise ProtocolError(
                f"unexpected shape for input '{t.name}': expected {_fmt(spec.shape)}, got {_fmt(t.shape)}"
            )
    given = {t.name for t in request.inputs}
    for s in inputs:
        if s.name not in given:
            raise ProtocolError(f"missing input '{s.name}'")
    if outputs is not None:
        produced = {s.name for s in outputs}
        for o in request.outputs:
            if o.name not in produced:
                raise ProtocolError(f"unexpected output '{o.name}': model '{model_name}' produces {_names(outputs)}")


def _shape_matches(got: Sequence[int], expected: Sequence[int]) -> bool:
    return len(got) == len(expected) and all(e == -1 or e == g for g, e in zip(got, expected))


# ----------------------------------------------------------------------------------------------- encoding


def encode_infer_response(
    model_name: str,
    model_version: str,
    outputs: Mapping[str, np.ndarray] | Iterable[tuple[str, np.ndarray]],
    request: InferRequest | None = None,
    *,
    id: str | None = None,
    parameters: Mapping[str, Any] | None = None,
) -> tuple[bytes, dict[str, str]]:
    """Encode an inference response; returns (body bytes, HTTP headers).

    ``outputs`` maps output names to arrays (dtype decides the datatype; object/str/bytes arrays are BYTES).
    With a ``request``, only the outputs it asked for are sent, in its order, each as binary data or JSON as
    it asked (:meth:`InferRequest.wants_binary`), and its ``id`` is echoed unless ``id`` is given. Headers
    carry Content-Type and, when binary data follows the JSON, ``Inference-Header-Content-Length``.
    """
    produced = dict(outputs.items() if isinstance(outputs, Mapping) else outputs)
    if request is not None and request.outputs:
        names = [o.name for o in request.outputs]
        for n in names:
            if n not in produced:
                raise ProtocolError(
                    f"unexpected output '{n}': model '{model_name}' produces {_names_str(list(produced))}"
                )
    else:
        names = list(produced)
    if id is None and request is not None:
        id = request.id
    header: dict[str, Any] = {"model_name": model_name, "model_version": str(model_version)}
    if id:
        header["id"] = id
    if parameters:
        header["parameters"] = dict(parameters)
    entries: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    slots = {o.name: o.shm for o in request.outputs if o.shm is not None} if request is not None else {}
    for name in names:
        array = np.asarray(produced[name])
        datatype = datatype_of(array.dtype, name)
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        slot = slots.get(name)
        if slot is not None:  # written into the region already (dataplane.shm): the answer says where
            entry["parameters"] = slot.parameters(tensor_size(array, datatype))
        elif request is not None and request.wants_binary(name):
            blob = tensor_bytes(array, datatype)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = _to_json_data(array, datatype, name)
        entries.append(entry)
    header["outputs"] = entries
    text = _dump(header)
    if not blobs:
        return text, {"Content-Type": "application/json"}
    headers = {"Content-Type": "application/octet-stream", HEADER_LENGTH_HEADER: str(len(text))}
    return b"".join([text, *blobs]), headers


def datatype_of(dtype: np.dtype, name: str = "tensor") -> str:
    """The Triton datatype name of a numpy dtype (object, bytes and str arrays are BYTES)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "OSU":
        return "BYTES"
    for dt_name, dt in DATATYPES.items():
        if dt_name != "BYTES" and dtype.kind == dt.kind and dtype.itemsize == dt.itemsize:
            return dt_name
    raise ProtocolError(f"output '{name}': numpy dtype {dtype} has no Open Inference Protocol datatype", 500)


def _bytes_items(array: np.ndarray) -> list[bytes]:
    """Elements of a BYTES array as bytes: bytes stay, anything else is its UTF-8 string (as tritonclient)."""
    out = []
    for v in array.ravel(order="C").tolist():
        out.append(v if isinstance(v, bytes) else str(v).encode("utf-8"))
    return out


def tensor_size(array: np.ndarray, datatype: str) -> int:
    """The size in bytes of :func:`tensor_bytes` (without writing them, but for BYTES)."""
    return len(tensor_bytes(array, datatype)) if datatype == "BYTES" else int(array.size) * DATATYPES[datatype].itemsize


def tensor_bytes(array: np.ndarray, datatype: str) -> bytes:
    """The raw little-endian, row-major bytes of ``array`` as ``datatype`` (BYTES: each element's 4-byte
    length, then its bytes), as the binary extension and gRPC's ``raw_output_contents`` carry a tensor."""
    if datatype == "BYTES":
        return b"".join(_LEN_PREFIX.pack(len(b)) + b for b in _bytes_items(array))
    return np.ascontiguousarray(array, dtype=DATATYPES[datatype]).tobytes(order="C")


def _to_json_data(array: np.ndarray, datatype: str, name: str, kind: str = "output") -> list[Any] | np.ndarray:
    """A tensor's flat row-major JSON ``data`` (``kind``: "input" or "output", for the message): a list of
    strings for BYTES, else the array itself, flat, contiguous and native, which ``_dump`` writes in C."""
    if datatype == "BYTES":
        try:
            return [b.decode("utf-8") for b in _bytes_items(array)]
        except UnicodeDecodeError:
            raise ProtocolError(
                f"{kind} '{name}': BYTES data is not valid UTF-8 and cannot go in JSON; request binary_data"
            ) from None
    return np.ascontiguousarray(array.ravel(order="C"), dtype=DATATYPES[datatype])


# ----------------------------------------------------- the client side: requests out, responses in


def encode_infer_request(
    inputs: Mapping[str, np.ndarray],
    *,
    binary: bool = True,
    request_id: str | None = None,
    outputs: Sequence[str] = (),
    parameters: Mapping[str, Any] | None = None,
) -> tuple[bytes, dict[str, str]]:
    """Encode an Open Inference Protocol request; returns (body bytes, HTTP headers).

    The body is what ``tritonclient.http.InferenceServerClient.generate_request_body`` builds: a JSON header
    and, with ``binary=True``, each input's raw little-endian bytes after it (``parameters.binary_data_size``
    per input, the header's length in the ``Inference-Header-Content-Length`` HTTP header); with
    ``binary=False`` each input goes as JSON ``data``. Outputs are asked for in the same form as the inputs
    (request-level ``binary_data_output``); ``outputs`` empty asks for every output. Raises ValueError for
    an input no datatype fits (e.g. complex numbers) or BYTES that are not UTF-8 in JSON mode.
    """
    header: dict[str, Any] = {}
    if request_id:
        header["id"] = request_id
    params = dict(parameters or {})
    params["binary_data_output"] = bool(binary)
    header["parameters"] = params
    entries: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for name, value in inputs.items():
        array = np.asarray(value)
        try:
            datatype = datatype_of(array.dtype, name)
        except ProtocolError:
            raise ValueError(
                f"input '{name}': numpy dtype {array.dtype} has no Open Inference Protocol datatype"
            ) from None
        entry: dict[str, Any] = {"name": name, "shape": list(array.shape), "datatype": datatype}
        if binary:
            blob = tensor_bytes(array, datatype)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            try:
                entry["data"] = _to_json_data(array, datatype, name, "input")
            except ProtocolError as e:
                raise ValueError(f"{e.message}; use binary=True") from None
        entries.append(entry)
    header["inputs"] = entries
    if outputs:
        header["outputs"] = [{"name": n, "parameters": {"binary_data": bool(binary)}} for n in outputs]
    text = _dump(header)
    if not blobs:
        return text, {"Content-Type": "application/json"}
    return b"".join([text, *blobs]), {
        "Content-Type": "application/octet-stream",
        HEADER_LENGTH_HEADER: str(len(text)),
    }


@dataclass
class InferResponse:
    """A decoded inference response: ``outputs`` maps names to arrays (binary outputs are read-only views on
    the response body; BYTES outputs are object arrays of ``bytes``)."""

    model_name: str
    model_version: str
    id: str | None
    parameters: dict[str, Any]
    outputs: dict[str, np.ndarray]
    # outputs the server wrote into shared memory: their arrays have the shape and datatype and no data
    # (a zero-strided view of one zero element), their slots are where they are
    in_shm: dict[str, ShmSlot] = field(default_factory=dict)


def decode_infer_response(body: bytes, header_length: str | int | None = None) -> InferResponse:
    """Decode an inference response body (``header_length``: the ``Inference-Header-Content-Length`` HTTP
    header, None when the body is pure JSON), as ``tritonclient.http.InferResult`` reads it. Raises only
    :class:`~edgemux.runtime.dataplane.protocol.ProtocolError` (status 502: the server sent something unreadable)."""
    try:
        return _decode_response(bytes(body), header_length)
    except ProtocolError as e:
        raise ProtocolError(f"malformed response: {e.message}", 502) from None


def _decode_response(body: bytes, header_length: str | int | None) -> InferResponse:
    if header_length is None:
        hlen = len(body)
    else:
        text = str(header_length).strip()
        if not text.isdigit() or int(text) > len(body):
            raise ProtocolError(f"{HEADER_LENGTH_HEADER} {header_length!r} does not fit a body of {len(body)} bytes")
        hlen = int(text)
    header = _parse_json(body[:hlen], "response")
    if not isinstance(header, dict):
        raise ProtocolError("response JSON must be an object")
    raw_outputs = header.get("outputs", [])
    if not isinstance(raw_outputs, list):
        raise ProtocolError("response 'outputs' must be a list")
    binary = memoryview(body)[hlen:]
    offset = 0
    outputs: dict[str, np.ndarray] = {}
    in_shm: dict[str, ShmSlot] = {}
    for i, raw in enumerate(raw_outputs):
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise ProtocolError(f"outputs[{i}] must be an object with a string 'name'")
        name = raw["name"]
        where = f"output '{name}'"
        datatype = raw.get("datatype")
        if not isinstance(datatype, str) or datatype not in DATATYPES:
            raise ProtocolError(f"{where}: unsupported datatype {datatype!r}")
        shape = _shape(raw.get("shape"), where)
        count = math.prod(shape)
        params = _parameters(raw.get("parameters"), where)
        size = params.get("binary_data_size")
        slot = shm_slot(params, where) if size is None and "data" not in raw else None
        if slot is not None:  # written into shared memory: only its shape and datatype come back
            if datatype == "BYTES":
                raise ProtocolError(f"{where}: BYTES in shared memory cannot say its elements' shape here")
            outputs[name] = np.broadcast_to(np.zeros((), DATATYPES[datatype]), shape)
            in_shm[name] = slot
        elif size is not None:
            if isinstance(size, bool) or not isinstance(size, int) or size < 0 or size > len(binary) - offset:
                raise ProtocolError(f"{where}: binary_data_size {size!r} but {len(binary) - offset} bytes remain")
            outputs[name] = tensor_from_bytes(binary[offset : offset + size], datatype, shape, count, where)
            offset += size
        elif "data" in raw:
            outputs[name] = _from_json(raw["data"], datatype, shape, count, where)
        else:
            raise ProtocolError(f"{where}: no 'data' and no parameters.binary_data_size")
    if offset != len(binary):
        raise ProtocolError(f"{len(binary) - offset} bytes of binary data after the outputs")
    model_id = header.get("id")
    return InferResponse(
        model_name=str(header.get("model_name", "")),
        model_version=str(header.get("model_version", "")),
        id=model_id if isinstance(model_id, str) else None,
        parameters=_parameters(header.get("parameters"), "response"),
        outputs=outputs,
        in_shm=in_shm,
    )



# ----------------------------------------------------------------------------------------- metadata bodies


def server_metadata_body(
    name: str = "edgemux", version: str = "0.1.0", extensions: Sequence[str] = ("binary_tensor_data",)
) -> bytes:
    """JSON body of ``GET /v2``: server name, version and the protocol extensions it supports."""
    return _dump({"name": name, "version": version, "extensions": list(extensions)})


def model_metadata_body(
    name: str,
    versions: Sequence[str],
    platform: str,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    parameters: Mapping[str, Mapping[str, Any]] | None = None,
) -> bytes:
    """JSON body of ``GET /v2/models/{name}``: versions, platform (e.g. ``onnxruntime_onnx``), and each
    input/output with its datatype and shape (-1 for a variable dimension); ``parameters`` by tensor name
    become that tensor's ``parameters`` (the protocol's place for extra properties: a quantized tensor's
    ``{"quantization": {"scale": s, "zero_point": z}}``)."""
    extra = parameters or {}
    return _dump(
        {
            "name": name,
            "versions": [str(v) for v in versions],
            "platform": platform,
            "inputs": [_spec_json(s, extra.get(s.name)) for s in inputs],
            "outputs": [_spec_json(s, extra.get(s.name)) for s in outputs],
        }
    )


@dataclass(frozen=True)
class ModelMetadata:
    """What ``GET /v2/models/{name}`` says about a model: its declared inputs and outputs, and the
    (scale, zero point) of each quantized tensor by name (``quantization``: from the tensors'
    ``parameters``; empty for a float model)."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    quantization: Mapping[str, tuple[float, int]] = field(default_factory=dict)


def decode_model_metadata(body: bytes) -> ModelMetadata:
    """Parse a ``GET /v2/models/{name}`` body (what :func:`model_metadata_body` writes, or Triton's); a
    malformed one raises :class:`ProtocolError` naming the field."""
    doc = _parse_json(body, "model metadata")
    if not isinstance(doc, dict):
        raise ProtocolError(f"model metadata: expected a JSON object, got {json_type(doc)}")
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise ProtocolError(f"model metadata: 'name' must be a non-empty string, got {short_repr(name)}")

    quantization: dict[str, tuple[float, int]] = {}

    def specs(key: str) -> tuple[TensorSpec, ...]:
        raw = doc.get(key, [])
        if not isinstance(raw, list):
            raise ProtocolError(f"model metadata: '{key}' must be an array, got {json_type(raw)}")
        out = []
        for i, t in enumerate(raw):
            where = f"model metadata: {key}[{i}]"
            if not isinstance(t, dict):
                raise ProtocolError(f"{where}: expected an object, got {json_type(t)}")
            tname, dtype, shape = t.get("name"), t.get("datatype"), t.get("shape")
            if not isinstance(tname, str) or not isinstance(dtype, str):
                raise ProtocolError(f"{where}: 'name' and 'datatype' must be strings")
            if not isinstance(shape, list) or not all(_is_int(d) and d >= -1 for d in shape):
                raise ProtocolError(f"{where}: 'shape' must be a list of integers >= -1 (-1: variable), "
                                    f"got {short_repr(shape)}")
            try:
                out.append(TensorSpec(tname, dtype, tuple(shape)))
            except ValueError as e:
                raise ProtocolError(f"{where}: {e}") from None
            quant = tensor_quantization(t, where)
            if quant is not None:
                quantization[tname] = quant
        return tuple(out)

    return ModelMetadata(name, specs("inputs"), specs("outputs"), quantization)


def tensor_quantization(tensor: Mapping[str, Any], where: str) -> tuple[float, int] | None:
    """A metadata tensor's (scale, zero point) from its ``parameters.quantization`` (None without one);
    :class:`ProtocolError` naming ``where`` when it is not ``{"scale": a number > 0, "zero_point": an integer}``."""
    params = tensor.get("parameters")
    quant = params.get("quantization") if isinstance(params, dict) else None
    if quant is None:
        return None
    scale = quant.get("scale") if isinstance(quant, dict) else None
    zero = quant.get("zero_point") if isinstance(quant, dict) else None
    if not (isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale > 0 and math.isfinite(scale)
            and _is_int(zero)):
        raise ProtocolError(f"{where}: parameters.quantization must be {{\"scale\": a number > 0, "
                            f"\"zero_point\": an integer}}, got {short_repr(quant)}")
    return float(scale), int(zero)  # type: ignore[arg-type]  # _is_int checked it


def error_body(message: str) -> bytes:
    """JSON body of an error response, ``{"error": message}``, as tritonclient expects it."""
    return _dump({"error": message})


def _spec_json(s: TensorSpec, parameters: Mapping[str, Any] | None = None) -> dict[str, Any]:
    doc = {"name": s.name, "datatype": s.datatype, "shape": list(s.shape)}
    return doc if not parameters else {**doc, "parameters": dict(parameters)}


def _dump(obj: Any) -> bytes:
    """Compact JSON of ``obj``, whose tensors' ``data`` may be numpy arrays (``_to_json_data``): written by
    orjson, numbers included, with no Python object per element. orjson writes NaN and infinities as null;
    Python's json writes them as NaN and Infinity, which tritonclient and our decoder read back, so a body
    with one goes through the standard library, as every body did before (arrays as lists)."""
    try:
        if not _special_floats(obj):
            return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError:  # something orjson does not write (e.g. an integer beyond 64 bits): the stdlib decides
        pass
    return json.dumps(obj, separators=(",", ":"), default=_as_list).encode("utf-8")


def _as_list(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return v.tolist()
    raise TypeError(f"{type(v).__name__} is not JSON serializable")


def _special_floats(obj: Any) -> bool:
    """Whether a tensor array or a float in ``obj`` (dicts and lists of a header) is NaN or infinite."""
    if isinstance(obj, np.ndarray):
        return obj.dtype.kind == "f" and not bool(np.isfinite(obj).all())
    if isinstance(obj, float):
        return not math.isfinite(obj)
    if isinstance(obj, dict):
        return any(_special_floats(v) for v in obj.values())
    if isinstance(obj, list):
        # a header's lists are short (shapes, entries); long ones are BYTES strings, which are not floats
        return any(_special_floats(v) for v in obj if isinstance(v, (np.ndarray, float, dict, list)))
    return False


# ------------------------------------------------------------------------------------------------ helpers


def _parse_json(raw: bytes, what: str) -> Any:
    """Parse JSON bytes, turning every failure into a ProtocolError that says where it went wrong."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProtocolError(f"malformed {what} JSON: invalid UTF-8 at byte {e.start}") from None
    try:
        # orjson parses in C several times faster; what it refuses (malformed JSON, but also NaN and
        # Infinity, integers beyond 64 bits, nesting past 1024) goes to the standard library, whose answer
        # (a value, or the error it locates) stays the reference.
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ProtocolError(
            f"malformed {what} JSON at line {e.lineno} column {e.colno} (char {e.pos}): {e.msg}"
        ) from None
    except RecursionError:
        raise ProtocolError(f"malformed {what} JSON: nested too deeply") from None
    except ValueError as e:  # e.g. an integer literal longer than Python's int-conversion limit
        raise ProtocolError(f"malformed {what} JSON: {e}") from None


def _parse_length(value: str | int, header: str) -> int:
    if isinstance(value, bool):
        raise ProtocolError(f"{header} must be a non-negative integer, got {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str) and value.strip().isascii() and value.strip().isdigit() and len(value) < 20:
        n = int(value.strip())  # under 20 digits: beyond any body size, and within int()'s digit limit
    else:
        raise ProtocolError(f"{header} must be a non-negative integer, got {short_repr(value)}")
    if n < 0:
        raise ProtocolError(f"{header} must be a non-negative integer, got {n}")
    return n


def _parameters(raw: Any, where: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ProtocolError(f"{where}: 'parameters' must be an object, got {json_type(raw)}")
    return raw


def _shape(raw: Any, where: str) -> tuple[int, ...]:
    if not isinstance(raw, list) or not all(_is_int(d) and d >= 0 for d in raw):
        raise ProtocolError(f"{where}: 'shape' must be a list of non-negative integers, got {short_repr(raw)}")
    return tuple(raw)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def json_type(v: Any) -> str:
    """The JSON type name of a decoded value ("null", "boolean", "number", "string", "array", "object")."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return type(v).__name__


def short_repr(v: Any, limit: int = 60) -> str:
    """JSON text of a client-sent value, cut so that an error message stays one readable line."""
    try:
        text = json.dumps(v)
    except (TypeError, ValueError, RecursionError):
        text = f"<{json_type(v)}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fmt(shape: Sequence[int]) -> str:
    """Triton's way of printing a shape: ``[1,3,224,224]``."""
    return "[" + ",".join(str(d) for d in shape) + "]"


def _names(specs: Sequence[TensorSpec]) -> str:
    return _names_str([s.name for s in specs])


def _names_str(names: Sequence[str]) -> str:
    return ", ".join(f"'{n}'" for n in names) if names else "nothing"


def _known() -> str:
    return ", ".join(DATATYPES)
