"""KServe V2 (Open Inference Protocol) infer requests and responses, JSON and binary.

`decode_infer` turns a body into named numpy arrays plus the outputs asked for; `encode_infer`
turns outputs back into a JSON body, or JSON followed by raw tensors for outputs asked for in
binary. Shapes, datatypes and element counts are checked here; whether they fit the model is the
session's check.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from pipeline.serve.errors import RequestError
from pipeline.serve.protocols.binary import HEADER, decode_tensor, encode_tensor, split_body
from pipeline.serve.protocols.datatypes import json_array, json_text, numpy_dtype, v2_datatype

MAX_RANK = 16


@dataclass
class InferRequest:
    """A decoded V2 infer request."""

    id: str
    inputs: dict[str, np.ndarray]
    outputs: dict[str, bool] | None  # output name -> binary? ; None: all outputs
    binary_default: bool  # request-level binary_data_output


def parse_json(raw: bytes, what: str = "request body") -> Any:
    """orjson.loads with a 400 that quotes the parser's complaint."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"{what} is not valid JSON: {exc}; send a JSON object") from None


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RequestError(f"{where} must be a JSON object, got {type(value).__name__}")
    return value


def _parameters(entry: dict[str, Any], where: str) -> dict[str, Any]:
    return _object(entry.get("parameters") or {}, f"{where}.parameters")


def _shape(value: Any, where: str) -> list[int]:
    if (
        not isinstance(value, list)
        or len(value) > MAX_RANK
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value)
    ):
        raise RequestError(f"{where}.shape must be a list of at most {MAX_RANK} non-negative integers, got {value!r}")
    return value


def _json_tensor(data: Any, name: str, datatype: str, dtype: np.dtype, shape: list[int]) -> np.ndarray:
    count = math.prod(shape)
    try:
        array = json_array(data, dtype).ravel()
    except (TypeError, ValueError, OverflowError) as exc:
        raise RequestError(f"input {name!r}: data does not fit datatype {datatype} ({exc})") from None
    if array.size != count:
        raise RequestError(f"input {name!r}: shape {shape} needs {count} elements, the data holds {array.size}")
    return array.reshape(shape)


def decode_infer(body: bytes, headers: dict[str, str]) -> InferRequest:
    """Decode a V2 infer body (JSON, or JSON header + binary tensors)."""
    if HEADER in headers:
        raw_json, binary = split_body(body, headers[HEADER])
    else:
        raw_json, binary = body, memoryview(b"")
    request = _object(parse_json(raw_json, "the inference request header"), "the inference request")
    request_id = request.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise RequestError(f"id must be a string, got {request_id!r}")
    parameters = _parameters(request, "request")
    raw_inputs = request.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise RequestError(f"inputs must be a non-empty list of tensors, got {raw_inputs!r:.80}")
    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for i, entry in enumerate(raw_inputs):
        entry = _object(entry, f"inputs[{i}]")
        name, datatype = entry.get("name"), entry.get("datatype")
        if not isinstance(name, str):
            raise RequestError(f"inputs[{i}].name must be a string, got {name!r}")
        if name in inputs:
            raise RequestError(f"input {name!r} is given twice")
        dtype = numpy_dtype(datatype)
        shape = _shape(entry.get("shape"), f"inputs[{i}]")
        size = _parameters(entry, f"inputs[{i}]").get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise RequestError(f"input {name!r}: binary_data_size must be a non-negative integer, got {size!r}")
            if "data" in entry:
                raise RequestError(f"input {name!r} has both data and binary_data_size; send one")
            if offset + size > len(binary):
                raise RequestError(
                    f"input {name!r}: binary_data_size {size} runs past the end of the binary data "
                    f"({len(binary)} bytes after the {len(raw_json)}-byte JSON header)"
                )
            inputs[name] = decode_tensor(binary[offset : offset + size], name, dtype, shape)
            offset += size
        elif "data" in entry:
            inputs[name] = _json_tensor(entry["data"], name, datatype, dtype, shape)
        else:
            raise RequestError(f"input {name!r} has neither data nor parameters.binary_data_size")
    if offset != len(binary):
        raise RequestError(
            f"the body holds {len(binary)} bytes of binary tensor data but the inputs declare {offset}; "
            "binary_data_size values must add up to the bytes after the JSON header"
        )
    binary_default = parameters.get("binary_data_output", False)
    if not isinstance(binary_default, bool):
        raise RequestError(f"parameters.binary_data_output must be true or false, got {binary_default!r}")
    outputs = None
    if (raw_outputs := request.get("outputs")) is not None:
        if not isinstance(raw_outputs, list):
            raise RequestError(f"outputs must be a list, got {type(raw_outputs).__name__}")
        outputs = {}
        for i, entry in enumerate(raw_outputs):
            entry = _object(entry, f"outputs[{i}]")
            name = entry.get("name")
            if not isinstance(name, str):
                raise RequestError(f"outputs[{i}].name must be a string, got {name!r}")
            output_parameters = _parameters(entry, f"outputs[{i}]")
            if "classification" in output_parameters:
                raise RequestError("the classification extension is not supported; request raw outputs")
            binary = output_parameters.get("binary_data", binary_default)
            if not isinstance(binary, bool):
                raise RequestError(f"outputs[{i}].parameters.binary_data must be true or false, got {binary!r}")
            outputs[name] = binary
    return InferRequest(request_id or uuid.uuid4().hex, inputs, outputs, binary_default)


def encode_infer(
    model: str, version: int, request: InferRequest, results: dict[str, np.ndarray]
) -> tuple[bytes, dict[str, str]]:
    """Encode outputs as a V2 response body and its headers (binary tail when asked for)."""
    entries, tails = [], []
    for name, array in results.items():
        binary = request.binary_default if request.outputs is None else request.outputs[name]
        entry: dict[str, Any] = {"name": name, "datatype": v2_datatype(array.dtype), "shape": list(array.shape)}
        if binary:
            raw = encode_tensor(array)
            entry["parameters"] = {"binary_data_size": len(raw)}
            tails.append(raw)
        else:
            entry["data"] = _json_data(array)
        entries.append(entry)
    header = orjson.dumps(
        {"id": request.id, "model_name": model, "model_version": str(version), "outputs": entries},
        option=orjson.OPT_SERIALIZE_NUMPY,
    )
    if not tails:
        return header, {"content-type": "application/json"}
    return b"".join([header, *tails]), {
        "content-type": "application/octet-stream",
        HEADER: str(len(header)),
    }


def _json_data(array: np.ndarray) -> Any:
    if array.dtype.kind in "OSU":
        return json_text(array).ravel().tolist()
    return np.ascontiguousarray(array).ravel()
