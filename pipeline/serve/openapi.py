"""The OpenAPI 3 document of the HTTP API, written from the route table dispatch reads (`app.ROUTES`).

`tests/serve/test_openapi_and_imports.py` checks that every documented operation answers, and
`test_fuzz.py` sends generated requests to each one (none may get a 5xx). Model names are listed
as an enum of what is being served, in paths and in the OpenAI bodies' `model`, so a fuzzer exploring
the document reaches real models (`tests/serve/test_generation_fuzz.py`: a served language model).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pipeline import __version__
from pipeline.serve.routes import BINARY, EVENTS, JSON, TEXT, Route, expand
from pipeline.serve.schemas import ERROR

_ERRORS = {400: "bad request", 401: "missing or wrong API key (only with --api-key-env)",
           404: "unknown model or version", 405: "method not allowed here (the Allow header lists the allowed ones)",
           408: "request not received in time", 413: "body too large",
           415: "a Content-Encoding other than identity (send the body uncompressed)",
           503: "overloaded or not ready: retry after the Retry-After header's seconds"}  # fmt: skip
_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "integer"}}}
_EVENT_FIELDS = {
    "data": {"type": "string", "description": "a JSON chunk, or [DONE] at the end"},
    "event": {"type": "string"},
    "id": {"type": "string"},
    "retry": {"type": "integer"},
}
_ANSWERS = {
    JSON: {"type": "object"},
    TEXT: {"type": "string"},
    BINARY: {"type": "string", "format": "binary"},
    # one Server-Sent Event, as OpenAPI 3.2 writes a text/event-stream item (and tools read 3.0's schema): its
    # data a JSON chunk of the route's answer, or OpenAI's closing [DONE]
    EVENTS: {"type": "object", "required": ["data"], "properties": _EVENT_FIELDS},
}


def _operation(route: Route, model: dict[str, Any]) -> dict[str, Any]:
    error = {JSON: {"schema": ERROR}}
    answers = {kind: {"schema": _ANSWERS[kind]} for kind in route.answers}
    if route.returns is not None:
        answers[JSON] = {"schema": route.returns}
    responses = {"200": {"description": route.ok, "content": answers}}
    # Every route may answer 405 (another method) and 415 (a compressed body); a protected one 401.
    codes = sorted({*route.errors, 405, 415, *(() if route.public else (401,))})
    responses.update({str(code): {"description": _ERRORS[code], "content": error} for code in codes})
    if "503" in responses:
        responses["503"]["headers"] = _RETRY_AFTER
    operation: dict[str, Any] = {"summary": route.summary}
    if route.body is not None:
        body = route.body
        if "model" in body.get("properties", {}):  # the OpenAI routes name their model in the body
            body = {**body, "properties": {**body["properties"], "model": model}}
        operation["requestBody"] = {"required": route.body_required, "content": {JSON: {"schema": body}}}
    operation["responses"] = responses
    return operation


def document(routes: Sequence[Route], models: list[str]) -> dict[str, Any]:
    """The OpenAPI document of `routes`, with model names (`model_name`, the OpenAI bodies' `model`) limited to
    the served models. The table is given, as Starlette's schema generator is given the app's routes: the
    route answering with this document is in it."""
    model = {"type": "string", "enum": models or [""]}
    parameters = {
        "model_name": {"name": "model_name", "in": "path", "required": True, "schema": model},
        "version": {"name": "version", "in": "path", "required": True,
                    "schema": {"type": "string", "pattern": "^[0-9]+$"}},
        "label": {"name": "label", "in": "path", "required": True,
                  "schema": {"type": "string", "pattern": "^[a-z][a-z0-9_-]{0,63}$"}},
    }  # fmt: skip
    paths: dict[str, Any] = {}
    for route in routes:
        for path in expand(route.path):
            item = paths.setdefault(path, {})
            if names := re.findall(r"\{(\w+)\}", path):
                item["parameters"] = [parameters[name] for name in names]
            item[route.method.lower()] = _operation(route, model)
    return {
        "openapi": "3.0.3",
        "info": {"title": "pipe serve", "version": __version__,
                 "description": "KServe V2 (Open Inference Protocol) with binary tensors, TF Serving REST, "
                                "the OpenAI API and Triton's generate for text-generation models."},
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "paths": paths,
    }  # fmt: skip
