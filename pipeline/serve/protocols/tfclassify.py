"""TF Serving REST `:classify`: examples in, `{"results": [[[label, score], ...], ...]}` out.

`POST /v1/models/{m}[/versions/{v}]:classify` takes `examples` (TF Serving's name) or `instances`:
one object `{input: value}` per example (a bare value per example when the model has one input),
plus an optional `context` object whose inputs every example shares. The answer lists, per example,
every class of the model's classifier output in the model's order, as `[label, score]`; the label
is "" when the model has no class names (as in TF Serving). `"probabilities": true` (not part of TF
Serving's API) asks for softmax probabilities instead of the raw scores.

The classifier output is the one the manifest's labels name, else the model's only output.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from pipeline.serve.errors import RequestError
from pipeline.serve.protocols.base import Decoded, Encoded, ModelIO, Protocol
from pipeline.serve.protocols.bounds import check_counts
from pipeline.serve.protocols.classify import check_scores, label_scores, softmax
from pipeline.serve.protocols.datatypes import IOSpec
from pipeline.serve.protocols.tfserving import parse_request, row_inputs

_KEYS = {"signature_name", "context", "examples", "instances", "probabilities"}


class TFClassify(Protocol):
    """`:classify`; `Decoded.outputs` is the classifier output, `Decoded.options` whether to softmax it."""

    def decode(self, body: bytes, headers: dict[str, str], model: ModelIO) -> Decoded:
        check_counts(body, model)
        request = parse_request(body, _KEYS, "classify")
        if ("examples" in request) == ("instances" in request):
            raise RequestError("send exactly one of 'examples' or 'instances': a list with one entry per example")
        probabilities = request.get("probabilities", False)
        if not isinstance(probabilities, bool):
            raise RequestError(f"probabilities must be true or false, got {probabilities!r:.40}")
        output = _classifier(model.outputs)
        check_scores(output, classify=True, probabilities=probabilities)
        key = "examples" if "examples" in request else "instances"
        examples = _with_context(request[key], request.get("context"), model.inputs, key)
        return Decoded(row_inputs(examples, model.inputs, key), outputs=[output.name], options=probabilities)

    def encode(self, model: ModelIO, decoded: Decoded, results: dict[str, np.ndarray]) -> Encoded:
        ((name, scores),) = results.items()
        if decoded.options:
            scores = softmax(scores)
        labels = next(s.labels for s in model.outputs if s.name == name)
        body = {"results": label_scores(scores, labels)}
        return orjson.dumps(body), {"content-type": "application/json"}


def _classifier(outputs: list[IOSpec]) -> IOSpec:
    labeled = [s for s in outputs if s.labels]
    if labeled:
        return labeled[0]
    if len(outputs) == 1:
        return outputs[0]
    raise RequestError(
        f"this model has {len(outputs)} outputs ({[s.name for s in outputs]}) and no class names say which "
        "one classifies; use :predict, or the V2 classification extension on the output you want"
    )


def _with_context(examples: Any, context: Any, inputs: list[IOSpec], key: str) -> Any:
    """Each example with the context's inputs added (an input may be in the context or the examples, not both)."""
    if context is None:
        return examples
    names = {s.name for s in inputs}
    if not isinstance(context, dict) or not set(context) <= names:
        raise RequestError(f"context must be an object holding some of the inputs {sorted(names)}, got {context!r:.80}")
    if not isinstance(examples, list) or not all(isinstance(x, dict) for x in examples):
        raise RequestError(f"with a context, {key} must be a list of objects keyed by input name")
    for i, example in enumerate(examples):
        if shared := sorted(set(example) & set(context)):
            raise RequestError(f"{key}[{i}] repeats {shared}, which the context already gives; give each once")
    return [{**example, **context} for example in examples]
