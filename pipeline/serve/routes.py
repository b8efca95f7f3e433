"""The route table: every HTTP route of `pipe serve` once, read by dispatch and by the OpenAPI document.

A `Route` is a method, a path template, the name of the `ServeApp` method answering it, and what
the document says of it. Templates are OpenAPI's `{parameter}` (one path segment) plus `[...]` for
an optional part, whose alternatives `|` separates: `/v2/models/{model_name}[/versions/{version}|
/labels/{label}]/infer` is one pattern and three documented paths.

`Router` finds a request's handler. Trailing slashes are ignored. Templates that differ only in
their literal tail (`/ready`, `/infer`) share one compiled pattern that captures the tail, so a
model route costs one regular expression match the first time its path is seen; after that, as for
the fixed paths from the start, it is one dict lookup (the server is benchmarked: a request to a
small model costs tens of microseconds, a match a few). A parameter
takes the shortest text that lets the path match, so a tail is never read as part of a name:
`/v1/models/m:predict` is model `m`'s `:predict`, not the status of a model named `m:predict`. A
path that matches with another method is a 405 naming the allowed ones (`Allow`); a path that
matches nothing is a 404 saying what was wrong: under a model, a missing version number or the
actions valid there.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.serve.errors import NotFound, RequestError
from pipeline.serve.responses import Response
from pipeline.serve.schemas import (
    CHAT_REQUEST,
    CLASSIFY_REQUEST,
    COMPLETION_REQUEST,
    GENERATE_REQUEST,
    INDEX,
    INDEX_REQUEST,
    INFER_REQUEST,
    PREDICT_REQUEST,
)

JSON = "application/json"
BINARY = "application/octet-stream"
TEXT = "text/plain"
EVENTS = "text/event-stream"  # Server-Sent Events: a generation streamed


@dataclass(frozen=True)
class Route:
    """One operation: `method path`, answered by the app's method named `handler`, and its OpenAPI entry."""

    method: str
    path: str  # a template: {model_name} and {version} are one path segment each, [...] is optional
    handler: str  # the ServeApp method answering it
    summary: str
    ok: str  # what a 200 answer holds
    errors: tuple[int, ...] = ()  # the refusals the document declares, by status
    body: dict[str, Any] | None = None  # the request body's JSON Schema; None: no body
    body_required: bool = True  # False where clients may send none (Triton's repository index)
    answers: tuple[str, ...] = (JSON,)  # media types of a 200 answer
    public: bool = False  # answered without the API key (the health probes)
    returns: dict[str, Any] | None = None  # the 200 JSON body's schema when it is not an object


_V2_MODEL = "/v2/models/{model_name}[/versions/{version}|/labels/{label}]"
_TF_MODEL = "/v1/models/{model_name}[/versions/{version}|/labels/{label}]"
_BODY_ERRORS = (400, 404, 408, 413, 503)  # a body is read under --read-timeout and --max-body-mb; queues fill

# The document lists the paths in this order, and a 404 under a model the actions valid there.
ROUTES = (
    Route("GET", "/v2", "server_metadata", "Server metadata: name, version, supported extensions", "server metadata"),
    Route("GET", "/v2/health/live", "health_live", "Liveness", "live", public=True),
    Route("GET", "/v2/health/ready", "health_ready", "Readiness: a model version served and not shutting down",
          "ready", (400,), public=True),
    Route("GET", "/metrics", "prometheus_metrics", "Prometheus metrics", "text exposition format", answers=(TEXT,)),
    Route("GET", "/openapi.json", "openapi_document", "This document", "OpenAPI document"),
    Route("GET", "/v2/models/stats", "every_model_stats", "Triton statistics of every served model version",
          "statistics"),
    Route("POST", "/v2/repository/index", "repository_index",
          "Triton repository index: every version found, READY or UNAVAILABLE with the reason", "index",
          _BODY_ERRORS, INDEX_REQUEST, body_required=False, returns=INDEX),
    Route("GET", _V2_MODEL, "model_metadata", "V2 model metadata", "model metadata", (400, 404)),
    Route("GET", f"{_V2_MODEL}/ready", "model_ready", "V2 model readiness", "ready", (400, 404)),
    Route("GET", f"{_V2_MODEL}/config", "model_config", "Triton model configuration (JSON)", "model config",
          (400, 404)),
    Route("GET", f"{_V2_MODEL}/stats", "model_stats", "Triton statistics of the model's versions", "statistics",
          (400, 404)),
    Route("POST", f"{_V2_MODEL}/infer", "model_infer",
          "V2 inference (JSON, or binary tensors with Inference-Header-Content-Length)", "outputs", _BODY_ERRORS,
          INFER_REQUEST, answers=(JSON, BINARY)),
    Route("POST", f"{_V2_MODEL}/generate", "triton_generate",
          "Triton generate: text_input in, text_output (JSON, or SSE with stream: true)", "generated text",
          _BODY_ERRORS, GENERATE_REQUEST, answers=(JSON, EVENTS)),
    Route("POST", f"{_V2_MODEL}/generate_stream", "triton_generate_stream",
          "Triton generate_stream: text_output pieces as Server-Sent Events", "events", _BODY_ERRORS,
          GENERATE_REQUEST, answers=(EVENTS,)),
    Route("POST", f"{_TF_MODEL}:predict", "tf_predict", "TF Serving predict (instances or inputs)", "outputs",
          _BODY_ERRORS, PREDICT_REQUEST),
    Route("POST", f"{_TF_MODEL}:classify", "tf_classify", "TF Serving classify: [label, score] per class",
          "outputs", _BODY_ERRORS, CLASSIFY_REQUEST),
    Route("GET", f"{_TF_MODEL}/metadata", "tf_metadata", "TF Serving model metadata", "signature", (400, 404)),
    Route("GET", _TF_MODEL, "tf_status", "TF Serving model status", "version states", (400, 404)),
    Route("POST", "/v1/chat/completions", "openai_chat", "OpenAI chat completion (stream: true for SSE chunks)",
          "chat completion", _BODY_ERRORS, CHAT_REQUEST, answers=(JSON, EVENTS)),
    Route("POST", "/v1/completions", "openai_completions", "OpenAI text completion (stream: true for SSE chunks)",
          "completion", _BODY_ERRORS, COMPLETION_REQUEST, answers=(JSON, EVENTS)),
    Route("GET", "/v1/models", "openai_models", "OpenAI model list: the served text-generation models", "models"),
)  # fmt: skip
PUBLIC_PATHS = frozenset(route.path for route in ROUTES if route.public)

_KNOWN_PATHS = 10_000  # paths remembered with their route; past it, new ones are matched every time

# What each parameter may be: one path segment, as short as the match allows. A model name may be
# empty, so "/v2/models//infer" is answered "unknown model ''" with the served models listed; a
# version may not ("missing version number").
_SEGMENT = {"model_name": "[^/]*?", "version": "[^/]+?", "label": "[^/]+?"}


@dataclass(slots=True)
class Request:
    """A routed request as its handler reads it."""

    headers: dict[str, str]  # names lower-cased
    body: bytes
    model_name: str | None = None  # {model_name}; None on routes without one
    version: str | None = None  # {version} as sent; None: not in the path (the default version)
    label: str | None = None  # {label} as sent (/labels/{label}): the version a label names
    receive: Any = None  # ASGI receive, after the body: a handler that waits long watches it for the client leaving


Handler = Callable[[Request], Awaitable[Response]]


def expand(template: str) -> list[str]:
    """The paths a template stands for: without its optional part, then with each of its alternatives."""
    if "[" not in template:
        return [template]
    head, rest = template.split("[", 1)
    optional, tail = rest.split("]", 1)
    return [head + tail, *(head + alternative + tail for alternative in optional.split("|"))]


def _split(template: str) -> tuple[str, str]:
    """A template's parameter part and its literal tail: ("/v2/models/{model_name}[...]", "/infer")."""
    end = max(template.rfind("}"), template.rfind("]")) + 1
    return template[:end], template[end:]


def _pattern(head: str, tails: Sequence[str]) -> re.Pattern[str]:
    """One pattern for the templates `head + tail`; the tail matched is the group `_tail`."""
    parts = []
    for token in re.split(r"(\{\w+\}|\[|\]|\|)", head):
        if token == "[":
            parts.append("(?:(?:")
        elif token == "|":
            parts.append(")|(?:")
        elif token == "]":
            parts.append("))?")
        elif token.startswith("{"):
            parts.append(f"(?P<{token[1:-1]}>{_SEGMENT[token[1:-1]]})")
        else:
            parts.append(re.escape(token))
    parts.append(f"(?P<_tail>{'|'.join(re.escape(tail) for tail in tails if tail)})")
    if "" in tails:  # the head alone is a route too
        parts.append("?")
    return re.compile("".join(parts))


class Router:
    """Dispatch over a route table: each route's handler is the method of `app` it names."""

    def __init__(self, routes: Sequence[Route], app: object) -> None:
        fixed: dict[str, dict[str, Handler]] = {}
        by_head: dict[str, dict[str, dict[str, Handler]]] = {}  # head -> tail -> method -> handler
        for route in routes:
            handler = getattr(app, route.handler)
            if "{" in route.path:
                head, tail = _split(route.path)
                by_head.setdefault(head, {}).setdefault(tail, {})[route.method] = handler
            else:
                fixed.setdefault(route.path, {})[route.method] = handler
        # path -> (method -> handler, the path's parameters): the fixed paths, then each path matched
        self._known: dict[str, tuple[dict[str, Handler], dict[str, str | None]]] = {
            path: (methods, {}) for path, methods in fixed.items()
        }
        self._patterns = [(_pattern(head, list(tails)), tails) for head, tails in by_head.items()]
        # For the 404s: under each model prefix ("/v2/models/"), the actions after the model (or its
        # version), in table order: "ready", "infer"; ":predict", ":classify", "metadata".
        self._actions = {
            head.partition("{")[0]: [tail.removeprefix("/") for tail in tails if tail]
            for head, tails in by_head.items()
        }

    def match(self, method: str, path: str) -> tuple[Handler, dict[str, str | None]]:
        """The handler of `method path` and the path's parameters (read-only: shared by every request to
        the path); a 404 or 405 RequestError otherwise."""
        normalized = path.rstrip("/") or "/"
        known = self._known.get(normalized)
        if known is None:
            known = self._match(path, normalized)
            if len(self._known) < _KNOWN_PATHS:
                self._known[normalized] = known
        methods, params = known
        handler = methods.get(method)
        if handler is None:
            last = params.get("version") or params.get("model_name") or ""
            if ":" in last:  # `m:regress` (or `2:regress`) read as a name on a GET route: an unknown action
                raise self._unknown_action(normalized, params["model_name"] or "", last.partition(":")[2])
            allowed = list(methods)
            raise RequestError(
                f"method {method} is not allowed here; use {' or '.join(allowed)}", 405, {"allow": ", ".join(allowed)}
            )
        return handler, params

    def _match(self, path: str, normalized: str) -> tuple[dict[str, Handler], dict[str, str | None]]:
        for pattern, tails in self._patterns:
            found = pattern.fullmatch(normalized)
            if found is not None:
                params = found.groupdict()
                return tails[params.pop("_tail") or ""], params
        raise self._not_found(path, normalized)

    def _unknown_action(self, normalized: str, name: str, action: str) -> NotFound:
        """`/v1/models/m:regress` (or `m:Classify`): the path names an action this server does not have."""
        model = name.partition(":")[0]
        prefix = next((p for p in self._actions if normalized.startswith(p)), "")
        valid = [a for a in self._actions.get(prefix, []) if a.startswith(":")]
        return NotFound(
            f"no action ':{action}' for model {model!r}; use {' or '.join(valid)} (actions are case-sensitive)"
        )

    def _not_found(self, path: str, normalized: str) -> NotFound:
        """What was wrong with a path no route matches: under a model, the version or the action."""
        for prefix, actions in self._actions.items():
            if not normalized.startswith(prefix):
                continue
            relative = normalized.removeprefix(prefix)
            name, *rest = relative.split("/")
            if rest[:1] in (["versions"], ["labels"]):
                if len(rest) < 2 or not rest[1]:
                    what = "version number" if rest[0] == "versions" else "label"
                    return NotFound(f"missing {what} after /models/{name}/{rest[0]}/")
                rest = rest[2:]
            if len(rest) == 1:
                choices = " or ".join([", ".join(actions[:-1]), actions[-1]] if len(actions) > 1 else actions)
                return NotFound(f"no route for {rest[0]!r} under {prefix}{name}; use {choices}")
            return NotFound(f"no route /{relative}; see GET /openapi.json for the API")
        return NotFound(f"no route {path!r}; see GET /openapi.json for the API")
