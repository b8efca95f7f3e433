"""The JSON Schemas of request bodies and of the error body, as the OpenAPI document states them.

The route table (`app.ROUTES`) names each route's request body schema; `openapi.py` writes them into
the document. They describe what the protocols accept; the protocols themselves check every field.
"""

from __future__ import annotations

from pipeline.artifact.datatypes import V2_TO_NUMPY
from pipeline.serve.detections import MAX_DETECTIONS

# pipe's `{"error": "..."}`, or on the OpenAI routes OpenAI's `{"error": {"message", "type", "param", "code"}}`
ERROR = {
    "type": "object",
    "properties": {
        "error": {"anyOf": [{"type": "string"}, {"type": "object", "required": ["message", "type"]}]},
        "request_id": {"type": "string"},
    },
    "required": ["error"],
}
# a generation's settings; each may be null, read as left out (OpenAI's schema makes them nullable)
_SAMPLING = {
    "max_tokens": {"type": "integer", "minimum": 1, "nullable": True},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2, "nullable": True},
    "top_p": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1, "nullable": True},
    "top_k": {"type": "integer", "minimum": -1, "nullable": True},
    "seed": {"type": "integer", "nullable": True},
    "stop": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 4}],
             "nullable": True},
    "stream": {"type": "boolean", "nullable": True},
    "repetition_penalty": {"type": "number", "minimum": 0.01, "maximum": 10, "nullable": True},
    "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2, "nullable": True},
    "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2, "nullable": True},
}  # fmt: skip
_OPENAI = {"model": {"type": "string"}, "n": {"type": "integer", "enum": [1], "nullable": True}, **_SAMPLING,
           "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}},
                              "nullable": True}}  # fmt: skip
CHAT_REQUEST = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {**_OPENAI, "messages": {"type": "array", "minItems": 1, "items": {
        "type": "object", "required": ["role", "content"],
        "properties": {"role": {"type": "string"}, "content": {"type": "string"}}}}},
}  # fmt: skip
COMPLETION_REQUEST = {
    "type": "object",
    "required": ["model", "prompt"],
    "properties": {
        **_OPENAI,
        "prompt": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "integer"}}]},
    },
}
GENERATE_REQUEST = {  # Triton's generate: the settings at the top or under parameters
    "type": "object",
    "required": ["text_input"],
    "properties": {
        "text_input": {"type": "string"},
        **_SAMPLING,
        "parameters": {"type": "object", "properties": _SAMPLING},
    },
}
# Triton's repository index: the request may ask for the ready versions only; the answer lists versions.
INDEX_REQUEST = {"type": "object", "properties": {"ready": {"type": "boolean"}}}
INDEX = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["name", "version", "state"],
        "properties": {
            "name": {"type": "string"},
            "version": {"type": "string"},
            "state": {"type": "string", "enum": ["READY", "UNAVAILABLE"]},
            "reason": {"type": "string"},
        },
    },
}
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
INFER_REQUEST = {
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
# TF Serving's binary value: an encoded picture (PNG, JPEG, ...) for an image input, standard or
# URL-safe base64, wrapped or not (pipeline/serve/images.py).
B64 = {"type": "object", "required": ["b64"], "properties": {"b64": {"type": "string", "format": "byte"}},
       "additionalProperties": False}  # fmt: skip
_ROWS = {"type": "array", "items": {"anyOf": [B64, {}]}}  # a value, an object of inputs, or a b64 picture
PREDICT_REQUEST = {
    "type": "object",
    "properties": {"signature_name": {"type": "string"}, "instances": _ROWS, "inputs": {}, **_DETECTIONS},
}
CLASSIFY_REQUEST = {
    "type": "object",
    "properties": {
        "signature_name": {"type": "string"},
        "context": {"type": "object"},
        "examples": _ROWS,
        "instances": _ROWS,
        "probabilities": {"type": "boolean"},
    },
}
