"""TF Serving REST: `:predict` in row (`instances`) and columnar (`inputs`) form, status, metadata.

The JSON carries no dtypes, so values are read with the model's input dtypes. Row form lists one
value per example (or one object per example when the model has several inputs); columnar form
gives each input whole. Responses mirror the request's form: `predictions` or `outputs`.
"""

from __future__ import annotations

import binascii
from typing import Any

import numpy as np
import orjson

from pipeline.artifact.datatypes import V2_TO_TF
from pipeline.serve.detections import SETTINGS, asked
from pipeline.serve.errors import RequestError
from pipeline.serve.protocols.base import Decoded, Encoded, ModelIO, Protocol
from pipeline.serve.protocols.bounds import check_counts
from pipeline.serve.protocols.datatypes import IOSpec, json_text
from pipeline.serve.protocols.jsonvalues import decode_base64, json_array
from pipeline.serve.protocols.keyed import feature_list, feature_rows
from pipeline.serve.protocols.v2 import parse_json

SIGNATURE = "serving_default"
_KEYS = {"signature_name", "instances", "inputs", "detections", *SETTINGS}
_JSON = {"content-type": "application/json"}


def parse_request(body: bytes, keys: set[str], what: str) -> dict[str, Any]:
    """A TF Serving request body: a JSON object of `keys` only, naming the one signature there is."""
    request = parse_json(body)
    if not isinstance(request, dict):
        raise RequestError(f"the {what} request must be a JSON object, got {type(request).__name__}")
    unknown = sorted(set(request) - keys)
    if unknown:
        raise RequestError(f"unknown key(s) {unknown} in the {what} request; valid keys are {sorted(keys)}")
    signature = request.get("signature_name", SIGNATURE)
    if signature != SIGNATURE:
        raise RequestError(f"signature_name {signature!r:.60} does not exist; the only signature is {SIGNATURE!r}")
    return request


class TFServing(Protocol):
    """`POST /v1/models/{m}[/versions/{v}]:predict`; `Decoded.options` names the form: "instances" or "inputs"."""

    def decode(self, body: bytes, headers: dict[str, str], model: ModelIO) -> Decoded:
        check_counts(body, model)
        request = parse_request(body, _KEYS, "predict")
        if ("instances" in request) == ("inputs" in request):
            raise RequestError("send exactly one of 'instances' (row form) or 'inputs' (columnar form)")
        detections = asked(request, "")
        if "instances" in request:
            inputs, form = row_inputs(request["instances"], model.inputs), "instances"
        else:
            inputs, form = _columns(request["inputs"], model.inputs), "inputs"
        return Decoded(inputs, outputs=None, options=form, detections=detections)

    def encode(self, model: ModelIO, decoded: Decoded, results: dict[str, np.ndarray]) -> Encoded:
        """Outputs -> `{"predictions": ...}` (row form) or `{"outputs": ...}` (columnar); detections per picture."""
        if decoded.coordinates is not None:
            return _detections(decoded, results)
        values = {k: _jsonable(v) for k, v in results.items()}
        if decoded.options == "instances":  # row form: answer per example
            if len(values) == 1:
                body: dict[str, Any] = {"predictions": next(iter(values.values()))}
            else:
                rows = _rows_of_every_output(values)
                body = {"predictions": [{k: v[i] for k, v in values.items()} for i in range(rows)]}
        else:
            body = {"outputs": next(iter(values.values())) if len(values) == 1 else values}
        return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), _JSON


def _detections(decoded: Decoded, results: dict[str, np.ndarray]) -> Encoded:
    """A detections answer: per picture its `boxes` [[x1, y1, x2, y2], ...], `scores`, `classes` and `labels`
    (row form: one object per picture in `predictions`; columnar: each key's list of pictures in
    `outputs`), and `coordinates` beside them."""
    pictures = []
    for i, n in enumerate(results["count"].tolist()):
        pictures.append({key: results[key][i, :n].tolist() for key in ("boxes", "scores", "classes", "labels")})
    if decoded.options == "instances":
        body: dict[str, Any] = {"predictions": pictures}
    else:
        body = {"outputs": {key: [p[key] for p in pictures] for key in ("boxes", "scores", "classes", "labels")}}
    body["coordinates"] = decoded.coordinates
    return orjson.dumps(body), _JSON


def row_inputs(instances: Any, specs: list[IOSpec], key: str = "instances") -> dict[str, np.ndarray]:
    """Row form: one value per example, or one object {input: value} per example; `key` is the
    request field they came in (`instances`, or `:classify`'s `examples`), for the errors."""
    if not isinstance(instances, list) or not instances:
        raise RequestError(f"{key} must be a non-empty list, got {instances!r:.80}")
    if (text := _text_input(specs)) is not None:  # a model with a tokenizer: strings, or {text: string}
        if all(isinstance(x, str) for x in instances):
            return {text.name: _array(instances, text)}
        if all(isinstance(x, dict) and list(x) == [text.name] for x in instances):
            return {text.name: _array([x[text.name] for x in instances], text)}
        specs = [s for s in specs if s is not text]
    names = [s.name for s in specs]
    if len(specs) == 1 and specs[0].features is not None:  # objects keyed by column, category names
        instances = feature_rows(instances, names[0], specs[0].features, key)
    if len(specs) == 1 and not all(isinstance(x, dict) and not _is_b64(x) for x in instances):
        columns = {names[0]: instances}
    else:
        if not all(isinstance(x, dict) and sorted(x) == sorted(names) for x in instances):
            raise RequestError(f"each entry of {key} must be an object with exactly the inputs {names}")
        columns = {n: [x[n] for x in instances] for n in names}
    return {s.name: _array(columns[s.name], s) for s in specs}


def _columns(inputs: Any, specs: list[IOSpec]) -> dict[str, np.ndarray]:
    """Columnar form: the single input's whole value, or an object keyed by input name."""
    text = _text_input(specs)
    if text is not None and isinstance(inputs, list) and inputs and all(isinstance(x, str) for x in inputs):
        inputs = {text.name: inputs}  # a model with a tokenizer: the texts, one per row
    names = [s.name for s in specs]
    if len(specs) == 1 and not isinstance(inputs, dict):
        inputs = {names[0]: inputs}
    if not isinstance(inputs, dict):
        raise RequestError(f"inputs must be an object keyed by input name {names}")
    return {name: _array(value, _spec(specs, name)) for name, value in inputs.items()}


def _text_input(specs: list[IOSpec]) -> IOSpec | None:
    """The text input of a model that carries its tokenizer (pipeline/serve/text.py), or None."""
    return next((s for s in specs if s.tokenized_into), None)


def _spec(specs: list[IOSpec], name: str) -> IOSpec:
    for spec in specs:
        if spec.name == name:
            return spec
    raise RequestError(f"unknown input {name!r}; the model expects {[s.describe() for s in specs]}")


def _array(value: Any, spec: IOSpec) -> np.ndarray:
    if _is_b64(value) or (isinstance(value, list) and value and _is_b64(value[0])):
        return _b64_array(value, spec)
    if spec.tokens is not None:
        value = _padded(value, spec)
    try:
        return json_array(value, spec.dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        raise RequestError(
            f"input {spec.name!r}: values do not form a {spec.datatype} tensor ({exc}); the model expects "
            f"{spec.describe()}"
        ) from None


def _padded(rows: Any, spec: IOSpec) -> Any:
    """Token sequences of different lengths, one per row, padded to the longest with the recorded padding
    id (JSON has no ragged tensors); a model without one (imported) takes rows of equal length only."""
    if not isinstance(rows, list) or not all(isinstance(row, list) for row in rows):
        return rows
    lengths = sorted({len(row) for row in rows})
    if len(lengths) < 2:
        return rows
    pad = spec.tokens.padding_id if spec.tokens is not None else None
    if pad is None:
        raise RequestError(
            f"input {spec.name!r}: rows hold {lengths[0]} to {lengths[-1]} tokens, and this model records no "
            "padding id to fill the shorter ones with; send rows of equal length"
        )
    return [row + [pad] * (lengths[-1] - len(row)) for row in rows]


def _is_b64(value: Any) -> bool:
    """TF Serving's binary value: `{"b64": "<base64>"}` (an encoded picture, or any binary string)."""
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str)


def _b64_array(value: Any, spec: IOSpec) -> np.ndarray:
    """`{"b64": ...}` values (one, or a list of them) -> an object array of their bytes, shape [] or [n]."""
    items = value if isinstance(value, list) else [value]
    decoded = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        if not _is_b64(item):
            raise RequestError(f"input {spec.name!r}: element {i} is {item!r:.60}; mix no other values with b64 ones")
        try:
            decoded[i] = decode_base64(item["b64"])
        except (binascii.Error, ValueError):
            raise RequestError(f"input {spec.name!r}: element {i}'s b64 is not base64: {item['b64'][:40]!r}") from None
    return decoded if isinstance(value, list) else decoded.reshape(())


def _rows_of_every_output(results: dict[str, Any]) -> int:
    """Row form splits every output by example: each needs the same leading (batch) dimension."""
    rows = {k: len(v) if np.ndim(v) else None for k, v in results.items()}
    if None in rows.values() or len(set(rows.values())) != 1:
        shapes = {k: list(np.shape(v)) for k, v in results.items()}
        raise RequestError(
            f"the row form ('instances') answers one object per example, but this model's outputs do not "
            f"share a batch dimension (shapes {shapes}); send the columnar form ('inputs') instead"
        )
    return next(iter(rows.values()))


def _jsonable(array: np.ndarray) -> Any:
    if array.dtype.kind in "OSU":
        return json_text(array).tolist()
    if array.ndim == 0:
        return array.item()  # orjson writes a 0-d array as a one-element list
    return np.ascontiguousarray(array)


def status(versions: dict[int, tuple[bool, str]]) -> dict[str, Any]:
    """Model status: each version AVAILABLE or UNAVAILABLE, with its message (the load error of an
    unavailable one; for an available one, why its changed manifest was refused, if it was)."""
    return {
        "model_version_status": [
            {
                "version": str(v),
                "state": "AVAILABLE" if served else "UNAVAILABLE",
                "status": {"error_code": "UNKNOWN" if message else "OK", "error_message": message},
            }
            for v, (served, message) in sorted(versions.items())
        ]
    }


def metadata(model: ModelIO, preprocessing: dict[str, Any] | None = None) -> dict[str, Any]:
    """Model metadata in TF Serving's shape: one `serving_default` signature, and beside it each input's
    recorded `preprocessing` (how an image input takes encoded pictures), when there is any."""

    def tensors(specs: list[IOSpec]) -> dict[str, Any]:
        return {
            s.name: {
                "dtype": V2_TO_TF[s.datatype],
                "tensor_shape": {"dim": [{"size": str(d), "name": ""} for d in s.shape], "unknown_rank": False},
                "name": s.name,
            }
            for s in specs
        }

    signature = {
        "inputs": tensors(model.inputs),
        "outputs": tensors(model.outputs),
        "method_name": "tensorflow/serving/predict",
    }
    described: dict[str, Any] = {"signature_def": {"signature_def": {SIGNATURE: signature}}}
    if preprocessing:
        described["preprocessing"] = preprocessing
    if labels := {s.name: list(s.labels) for s in model.outputs if s.labels}:
        described["labels"] = labels  # a classifier output's class names, index = class (also in :classify)
    if tokens := {s.name: s.token_limits() for s in model.inputs if s.tokens is not None}:
        described["tokens"] = tokens
    if features := {s.name: feature_list(s.features) for s in model.inputs if s.features}:
        described["features"] = features  # a table input's columns, and the categories a column takes by name
    if text := _text_input(model.inputs):
        described["text"] = {"input": text.name, "tokenized_into": list(text.tokenized_into)}
    return {
        "model_spec": {"name": model.name, "signature_name": "", "version": str(model.version)},
        "metadata": described,
    }
