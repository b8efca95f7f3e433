"""KServe V2 (Open Inference Protocol) infer requests and responses, JSON and binary.

The request is always a JSON document; each tensor in it travels one of two ways:
- JSON: the input's `data` holds its elements (flat or nested) -> `_json_tensor`;
- binary (the binary tensor data extension, `binary.py`): the input declares
  `parameters.binary_data_size` and its raw bytes follow the JSON header in the body.
Outputs likewise: JSON `data`, or raw bytes after the header when the output (or the request's
`binary_data_output`) asks for binary. Shapes, datatypes and element counts are checked here;
whether they fit the model is the session's check, the same for every protocol.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from pipeline.serve.detections import asked
from pipeline.serve.errors import RequestError
from pipeline.serve.protocols import binary
from pipeline.serve.protocols.base import Decoded, Encoded, ModelIO, Protocol
from pipeline.serve.protocols.bounds import check_counts
from pipeline.serve.protocols.classify import check_scores, softmax, top_classes
from pipeline.serve.protocols.datatypes import IOSpec, json_text, numpy_dtype, v2_datatype
from pipeline.serve.protocols.jsonvalues import json_array
from pipeline.serve.protocols.keyed import feature_list
from pipeline.serve.request_id import current_id, new_id

MAX_RANK = 16
MAX_ELEMENTS = 2**48  # far past any body --max-body-mb allows, far below numpy's 2**63 bytes


@dataclass(frozen=True)
class V2Options:
    """What a V2 response needs to remember from its request."""

    id: str  # echoed, else the HTTP request's id (X-Request-ID, request_id.py)
    binary_outputs: dict[str, bool] | None  # output name -> answer in binary? ; None: every output
    binary_default: bool  # request-level parameters.binary_data_output
    classes: dict[str, int] = field(default_factory=dict)  # output -> top-k asked for (classification extension)
    probabilities: frozenset[str] = frozenset()  # outputs answered as softmax probabilities (asked for)


class V2(Protocol):
    """`POST /v2/models/{m}[/versions/{v}]/infer`."""

    def decode(self, body: bytes, headers: dict[str, str], model: ModelIO) -> Decoded:
        raw_json, tensors = binary.split_body(body, headers)
        check_counts(raw_json, model)  # millions of values for a model that takes hundreds: refused unparsed
        request = _object(parse_json(raw_json, "the inference request header"), "the inference request")
        request_id = request.get("id")
        if request_id is not None and not isinstance(request_id, str):
            raise RequestError(f"id must be a string, got {request_id!r}")
        parameters = _parameters(request, "request")
        inputs = _inputs(request.get("inputs"), tensors, raw_json, model)
        binary_default = parameters.get("binary_data_output", False)
        if not isinstance(binary_default, bool):
            raise RequestError(f"parameters.binary_data_output must be true or false, got {binary_default!r}")
        outputs, classes, softmaxed = _outputs(request.get("outputs"), binary_default)
        every = parameters.get("probabilities", False)  # request-level: every output answered
        if not isinstance(every, bool):
            raise RequestError(f"parameters.probabilities must be true or false, got {every!r:.40}")
        if every:
            softmaxed = set(outputs) if outputs is not None else {s.name for s in model.outputs}
        detections = asked(parameters, "parameters.")
        if detections is not None and (classes or softmaxed):
            raise RequestError(
                "classification and probabilities rank a classifier's scores; a detections answer carries its "
                "own scores and labels: leave them out, or leave out parameters.detections for the raw output"
            )
        specs = {s.name: s for s in model.outputs}  # an unknown output name is refused by the app
        for name in (classes.keys() | softmaxed) & specs.keys():
            check_scores(specs[name], name in classes, name in softmaxed)
        request_id = request_id or current_id.get() or new_id()
        options = V2Options(request_id, outputs, binary_default, classes, frozenset(softmaxed))
        return Decoded(inputs, None if outputs is None else list(outputs), options, detections=detections)

    def encode(self, model: ModelIO, decoded: Decoded, results: dict[str, np.ndarray]) -> Encoded:
        options: V2Options = decoded.options
        entries, tensors = [], []
        specs = {s.name: s for s in model.outputs}
        for name, array in results.items():
            if name in options.probabilities:
                array = softmax(array)
            if name in options.classes:  # a BYTES tensor [batch, k] of "score:index[:label]"
                array = top_classes(array, options.classes[name], specs[name].labels)
            as_binary = options.binary_default if options.binary_outputs is None else options.binary_outputs[name]
            entry: dict[str, Any] = {"name": name, "datatype": v2_datatype(array.dtype), "shape": list(array.shape)}
            if as_binary:
                raw = binary.encode_tensor(array)
                entry["parameters"] = {"binary_data_size": len(raw)}
                tensors.append(raw)
            else:
                entry["data"] = _json_data(array)
            entries.append(entry)
        response: dict[str, Any] = {"id": options.id, "model_name": model.name, "model_version": str(model.version)}
        if decoded.coordinates is not None:  # a detections answer: which pixels its boxes are in
            response["parameters"] = {"coordinates": decoded.coordinates}
        header = orjson.dumps({**response, "outputs": entries}, option=orjson.OPT_SERIALIZE_NUMPY)
        return binary.join_body(header, tensors)


def metadata(model: ModelIO, versions: list[str], parameters: dict[str, Any]) -> dict[str, Any]:
    """Model metadata (`GET /v2/models/{m}[/versions/{v}]`): its tensors, -1 for dynamic dims, and the
    server's facts about the version in `parameters`."""

    def tensors(specs: list[IOSpec]) -> list[dict[str, Any]]:
        return [{"name": s.name, "datatype": s.datatype, "shape": list(s.shape), **_declared(s)} for s in specs]

    return {
        "name": model.name,
        "versions": versions,
        "platform": "onnxruntime_onnx",
        "inputs": tensors(model.inputs),
        "outputs": tensors(model.outputs),
        "parameters": parameters,
    }


def _declared(spec: IOSpec) -> dict[str, Any]:
    """What the manifest adds to a tensor's metadata, as its `parameters`: an output's class names
    (`labels`, index = class), a token input's `vocab_size`, `max_sequence_length` and `padding_id`, a
    table input's columns (`features`: name, and a categorical column's categories, in input order)."""
    parameters: dict[str, Any] = {}
    if spec.labels:
        parameters["labels"] = list(spec.labels)
    if spec.features:
        parameters["features"] = feature_list(spec.features)
    if spec.tokens is not None:
        parameters.update(spec.token_limits())
    if spec.tokenized_into:  # texts, one per row, tokenized by the server into these inputs
        parameters["tokenized_into"] = list(spec.tokenized_into)
    return {"parameters": parameters} if parameters else {}


def parse_json(raw: bytes, what: str = "request body") -> Any:
    """orjson.loads with a 400 that quotes the parser's complaint."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"{what} is not valid JSON: {exc}; send a JSON object") from None


def _inputs(raw_inputs: Any, tensors: memoryview, raw_json: bytes, model: ModelIO) -> dict[str, np.ndarray]:
    """The request's `inputs` list -> named arrays, each from JSON `data` or from the binary tail.

    Every input's name, datatype and shape is checked against the model before any input's data is
    decoded (`_check_declared`): a body of millions of elements for an input that cannot take them is
    refused for the few bytes of its header."""
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise RequestError(f"inputs must be a non-empty list of tensors, got {raw_inputs!r:.80}")
    declared: list[tuple[str, str, np.dtype, list[int], dict[str, Any]]] = []
    for i, entry in enumerate(raw_inputs):
        entry = _object(entry, f"inputs[{i}]")
        name, datatype = entry.get("name"), entry.get("datatype")
        if not isinstance(name, str):
            raise RequestError(f"inputs[{i}].name must be a string, got {name!r}")
        if any(name == seen for seen, *_ in declared):
            raise RequestError(f"input {name!r} is given twice")
        declared.append((name, datatype, numpy_dtype(datatype), _shape(entry.get("shape"), f"inputs[{i}]"), entry))
    _check_declared([(name, datatype, shape) for name, datatype, _, shape, _ in declared], model)
    inputs: dict[str, np.ndarray] = {}
    offset = 0  # where the next binary input starts in `tensors`
    for i, (name, datatype, dtype, shape, entry) in enumerate(declared):
        size = _parameters(entry, f"inputs[{i}]").get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise RequestError(f"input {name!r}: binary_data_size must be a non-negative integer, got {size!r}")
            if "data" in entry:
                raise RequestError(f"input {name!r} has both data and binary_data_size; send one")
            if offset + size > len(tensors):
                raise RequestError(
                    f"input {name!r}: binary_data_size {size} runs past the end of the binary data "
                    f"({len(tensors)} bytes after the {len(raw_json)}-byte JSON header)"
                )
            inputs[name] = binary.decode_tensor(tensors[offset : offset + size], name, dtype, shape)
            offset += size
        elif "data" in entry:
            inputs[name] = _json_tensor(entry["data"], name, datatype, dtype, shape, raw_json)
        else:
            raise RequestError(f"input {name!r} has neither data nor parameters.binary_data_size")
    if offset != len(tensors):
        raise RequestError(
            f"the body holds {len(tensors)} bytes of binary tensor data but the inputs declare {offset}; "
            "binary_data_size values must add up to the bytes after the JSON header"
        )
    return inputs


def _check_declared(declared: list[tuple[str, str, list[int]]], model: ModelIO) -> None:
    """Refuse what the model cannot take, from the inputs' names, datatypes and shapes alone: an unknown
    name, another datatype (BYTES aside: encoded pictures, or texts under a token ids input, one per
    row), a shape that does not fit, more rows than one request may hold. The session checks the
    decoded arrays again (every protocol); this check only comes first, before any data is decoded."""
    specs = {s.name: s for s in model.inputs}
    expected = ", ".join(s.describe() for s in model.inputs)
    if unknown := [name for name, _, _ in declared if name not in specs and name not in model.pinned]:
        raise RequestError(f"unknown input(s) {unknown}; the model expects {expected}")
    for name, datatype, shape in declared:
        if name in model.pinned:  # a constant of the model: the session compares the value sent with its own
            if math.prod(shape) > 1 << 16:
                raise RequestError(f"input {name!r} is pinned in this model; send its value alone, or leave it out")
            continue
        spec = specs[name]
        if datatype == spec.datatype and not spec.tokenized_into:
            fits = len(shape) == len(spec.shape) and all(w in (-1, g) for w, g in zip(spec.shape, shape, strict=True))
            if not fits:
                raise RequestError(
                    f"input {name!r} has shape {shape}, the model expects {spec.describe()} (-1: any size)"
                )
            rows = shape[0] if spec.shape and spec.shape[0] == -1 else None
        elif datatype == "BYTES":  # texts, or encoded pictures / texts for a tensor input: one per row
            if len(shape) > 2 or math.prod(shape[1:]) != 1:
                raise RequestError(
                    f"input {name!r} has datatype BYTES and shape {shape}; the model expects {spec.describe()} "
                    "(BYTES for it are texts or encoded pictures, one per row: shape [n] or [n, 1])"
                )
            rows = shape[0] if shape else 1
            if spec.shape and spec.shape[0] > 0 and rows > spec.shape[0]:  # a fixed batch dim
                raise RequestError(f"input {name!r} holds {rows} rows, the model expects {spec.describe()}")
        else:
            raise RequestError(f"input {name!r} has datatype {datatype}, the model expects {spec.describe()}")
        if rows is not None and model.max_rows is not None and rows > model.max_rows:
            raise RequestError(
                f"the request holds {rows} rows, more than this model's max batch size {model.max_rows}; split "
                "it into smaller requests"
            )


def _outputs(raw_outputs: Any, binary_default: bool) -> tuple[dict[str, bool] | None, dict[str, int], set[str]]:
    """The request's `outputs` list -> (output name -> binary?, or None when it asks for every output;
    output name -> classes asked for; outputs asked for as probabilities)."""
    classes: dict[str, int] = {}
    softmaxed: set[str] = set()
    if raw_outputs is None:
        return None, classes, softmaxed
    if not isinstance(raw_outputs, list):
        raise RequestError(f"outputs must be a list, got {type(raw_outputs).__name__}")
    outputs = {}
    for i, entry in enumerate(raw_outputs):
        entry = _object(entry, f"outputs[{i}]")
        name = entry.get("name")
        if not isinstance(name, str):
            raise RequestError(f"outputs[{i}].name must be a string, got {name!r}")
        parameters = _parameters(entry, f"outputs[{i}]")
        if "classification" in parameters:
            count = parameters["classification"]
            if not isinstance(count, int) or isinstance(count, bool) or count < 1:
                raise RequestError(
                    f"outputs[{i}].parameters.classification must be the number of classes to return "
                    f"(an integer >= 1), got {count!r:.40}"
                )
            classes[name] = count
        probabilities = parameters.get("probabilities", False)
        if not isinstance(probabilities, bool):
            raise RequestError(
                f"outputs[{i}].parameters.probabilities must be true or false, got {probabilities!r:.40}"
            )
        if probabilities:
            softmaxed.add(name)
        as_binary = parameters.get("binary_data", binary_default)
        if not isinstance(as_binary, bool):
            raise RequestError(f"outputs[{i}].parameters.binary_data must be true or false, got {as_binary!r}")
        outputs[name] = as_binary
    return outputs, classes, softmaxed


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
    # Checked even when a zero dim leaves no elements: numpy cannot shape an array whose other dims overflow.
    if math.prod(d for d in value if d) > MAX_ELEMENTS:
        raise RequestError(
            f"{where}.shape {value!r:.80} describes more elements than a tensor can hold (its nonzero dims "
            f"multiply past {MAX_ELEMENTS}); give the tensor's real shape"
        )
    return value


def _json_tensor(data: Any, name: str, datatype: str, dtype: np.dtype, shape: list[int], raw_json: bytes) -> np.ndarray:
    count = math.prod(shape)
    try:
        array = json_array(data, dtype, text=raw_json).ravel()
    except (TypeError, ValueError, OverflowError) as exc:
        raise RequestError(f"input {name!r}: data does not fit datatype {datatype} ({exc})") from None
    if array.size != count:
        raise RequestError(f"input {name!r}: shape {shape} needs {count} elements, the data holds {array.size}")
    return array.reshape(shape)


def _json_data(array: np.ndarray) -> Any:
    if array.dtype.kind in "OSU":
        return json_text(array).ravel().tolist()
    return np.ascontiguousarray(array).ravel()
