"""What a route is and how a request finds one: `Route`, the `Request` its handler reads, and `Router`.

A `Route` is a method, a path template, the handler answering it (a function `(state, request)`,
held as Starlette's `Route(path, endpoint)` holds its endpoint), and what the OpenAPI document says
of it; the table of every route is `app.ROUTES`, read by dispatch and by `openapi.py`. Templates
are OpenAPI's `{parameter}` (one path segment) plus `[...]` for an optional part, whose
alternatives `|` separates: `/v2/models/{model_name}[/versions/{version}|/labels/{label}]/infer`
is one pattern and three documented paths.

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
from typing import TYPE_CHECKING, Any, TypeAlias

from pipeline.serve.asgi import Receive
from pipeline.serve.errors import NotFound, RequestError
from pipeline.serve.generation.stream import Streaming
from pipeline.serve.responses import Response

if TYPE_CHECKING:  # the state holds the generation handlers, which read `Request` from here
    from pipeline.serve.state import ServeState

JSON = "application/json"
BINARY = "application/octet-stream"
TEXT = "text/plain"
EVENTS = "text/event-stream"  # Server-Sent Events: a generation streamed


@dataclass(frozen=True)
class Route:
    """One operation: `method path`, answered by `handler`, and its OpenAPI entry."""

    method: str
    path: str  # a template: {model_name} and {version} are one path segment each, [...] is optional
    handler: Handler  # the function answering it, given the server's state and the request
    summary: str
    ok: str  # what a 200 answer holds
    errors: tuple[int, ...] = ()  # the refusals the document declares, by status
    body: dict[str, Any] | None = None  # the request body's JSON Schema; None: no body
    body_required: bool = True  # False where clients may send none (Triton's repository index)
    answers: tuple[str, ...] = (JSON,)  # media types of a 200 answer
    public: bool = False  # answered without the API key (the health probes)
    returns: dict[str, Any] | None = None  # the 200 JSON body's schema when it is not an object


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
    # ASGI receive, after the body: a handler that waits long watches it for the client leaving
    receive: Receive | None = None


# A route's handler: the server's state and the request in, the answer out (a stream for a generation).
Handler: TypeAlias = "Callable[[ServeState, Request], Awaitable[Response | Streaming]]"


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
    """Dispatch over a route table: a request's path and method find the route's handler."""

    def __init__(self, routes: Sequence[Route]) -> None:
        fixed: dict[str, dict[str, Handler]] = {}
        by_head: dict[str, dict[str, dict[str, Handler]]] = {}  # head -> tail -> method -> handler
        for route in routes:
            if "{" in route.path:
                head, tail = _split(route.path)
                by_head.setdefault(head, {}).setdefault(tail, {})[route.method] = route.handler
            else:
                fixed.setdefault(route.path, {})[route.method] = route.handler
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
