"""The OpenAPI 3 document of the HTTP API, written by hand beside the routes it describes.

`tests/serve/test_openapi_and_imports.py` checks that every documented operation answers, and
`test_fuzz.py` sends generated requests to each one (none may get a 5xx). Model names are listed
as an enum of what is being served, so a fuzzer exploring the document reaches real models.
"""

from __future__ import annotations

from typing import Any

from pipeline import __version__
from pipeline.artifact.datatypes import V2_TO_NUMPY
from pipeline.serve.detections import MAX_DETECTIONS

_ERROR = {"type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]}
_TENSOR_IN = {
    "type": "object",
    "required": ["name", "shape", "datatype"],
    "properties": {
        "name": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "datatype": {"type": "string", "enum": list(V2_TO_NUMPY)},  # every datatype decode_infer reads
        "parameters": {"type": "object", "properties": {"binary_data_size": {"type": "integer", "minimum": 0}}},
        "data": {"type": "array", "items": {}},
    },
}
# Detections asked of a detector (task detection) instead of its raw head output: serve/detections.py.
_DETECTIONS = {
    "detections": {"type": "boolean"},
    "confidence": {"type": "number", "minimum": 0, "maximum": 1},
    "iou": {"type": "number", "minimum": 0, "maximum": 1},
    "max_detections": {"type": "integer", "minimum": 1, "maximum": MAX_DETECTIONS},
}
_INFER_REQUEST = {
    "type": "object",
    "required": ["inputs"],
    "properties": {
        "id": {"type": "string"},
        "parameters": {
            "type": "object",
            "properties": {
                "binary_data_output": {"type": "boolean"},
                "probabilities": {"type": "boolean"},
                **_DETECTIONS,
            },
        },
        "inputs": {"type": "array", "items": _TENSOR_IN},
        "outputs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string"},
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "binary_data": {"type": "boolean"},
                            "classification": {"type": "integer", "minimum": 1},  # top-k "score:index:label"
                            "probabilities": {"type": "boolean"},  # softmax of the scores, when asked
                        },
                    },
                },
            },
        },
    },
}
_PREDICT_REQUEST = {
    "type": "object",
    "properties": {"signature_name": {"type": "string"}, "instances": {"type": "array"}, "inputs": {}, **_DETECTIONS},
}
_CLASSIFY_REQUEST = {
    "type": "object",
    "properties": {
        "signature_name": {"type": "string"},
        "context": {"type": "object"},
        "examples": {"type": "array"},
        "instances": {"type": "array"},
        "probabilities": {"type": "boolean"},
    },
}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    text = {400: "bad request", 401: "missing or wrong API key", 404: "unknown model or version",
            408: "request not received in time", 413: "body too large", 503: "overloaded or not ready"}  # fmt: skip
    return {str(c): _json(_ERROR, text[c]) for c in codes}


def _get(summary: str, ok: str, *errors: int) -> dict[str, Any]:
    return {"get": {"summary": summary, "responses": {"200": _json({"type": "object"}, ok), **_errors(*errors)}}}


def _post(summary: str, schema: dict[str, Any], *errors: int, binary: bool = False) -> dict[str, Any]:
    body = {"required": True, "content": {"application/json": {"schema": schema}}}
    ok = _json({"type": "object"}, "outputs")
    if binary:  # binary outputs: the JSON header, then raw tensors (Inference-Header-Content-Length)
        ok["content"]["application/octet-stream"] = {"schema": {"type": "string", "format": "binary"}}
    responses = {"200": ok, **_errors(*errors)}
    return {"post": {"summary": summary, "requestBody": body, "responses": responses}}


def document(models: list[str]) -> dict[str, Any]:
    """The OpenAPI document, with `model_name` limited to the served models."""
    model = {"name": "model_name", "in": "path", "required": True, "schema": {"type": "string", "enum": models or [""]}}
    version = {"name": "version", "in": "path", "required": True, "schema": {"type": "string", "pattern": "^[0-9]+$"}}

    def with_params(item: dict[str, Any], *params: dict[str, Any]) -> dict[str, Any]:
        return {"parameters": list(params), **item}

    paths: dict[str, Any] = {
        "/v2": _get("Server metadata: name, version, supported extensions", "server metadata"),
        "/v2/health/live": _get("Liveness", "live"),
        "/v2/health/ready": _get("Readiness: a model version served and not shutting down", "ready", 400),
        "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": {
            "description": "text exposition format", "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
        "/openapi.json": _get("This document", "OpenAPI document"),
    }  # fmt: skip
    for prefix, params in (
        ("/v2/models/{model_name}", (model,)),
        ("/v2/models/{model_name}/versions/{version}", (model, version)),
    ):
        paths[prefix] = with_params(_get("V2 model metadata", "model metadata", 400, 404), *params)
        paths[f"{prefix}/ready"] = with_params(_get("V2 model readiness", "ready", 400, 404), *params)
        paths[f"{prefix}/infer"] = with_params(
            _post("V2 inference (JSON, or binary tensors with Inference-Header-Content-Length)",
                  _INFER_REQUEST, 400, 404, 408, 413, 503, binary=True), *params)  # fmt: skip
    for prefix, params in (
        ("/v1/models/{model_name}", (model,)),
        ("/v1/models/{model_name}/versions/{version}", (model, version)),
    ):
        paths[prefix] = with_params(_get("TF Serving model status", "version states", 400, 404), *params)
        paths[f"{prefix}/metadata"] = with_params(_get("TF Serving model metadata", "signature", 400, 404), *params)
        paths[f"{prefix}:predict"] = with_params(
            _post("TF Serving predict (instances or inputs)", _PREDICT_REQUEST, 400, 404, 408, 413, 503), *params
        )
        paths[f"{prefix}:classify"] = with_params(
            _post("TF Serving classify: [label, score] per class", _CLASSIFY_REQUEST, 400, 404, 408, 413, 503), *params
        )
    return {
        "openapi": "3.0.3",
        "info": {"title": "pipe serve", "version": __version__,
                 "description": "KServe V2 (Open Inference Protocol) with binary tensors, and TF Serving REST."},
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "paths": paths,
    }  # fmt: skip
