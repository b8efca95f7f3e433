"""The route table and the wrappers, in process: dispatch, the 404/405 answers, the document, the layers."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import orjson
import pytest

from pipeline.serve.app import PUBLIC_PATHS, ROUTES
from pipeline.serve.auth import ApiKey
from pipeline.serve.body import BodyLimit
from pipeline.serve.errors import RequestError
from pipeline.serve.metrics import CountResponses
from pipeline.serve.openapi import document
from pipeline.serve.routes import Request, Route, Router, expand


def answering_its_name(route: Route) -> Route:
    """`route` with its handler replaced by one answering the handler's name and the path's parameters."""
    name = route.handler.__name__

    async def handler(state: Any, request: Request) -> tuple[int, bytes, dict[str, str]]:
        return 200, orjson.dumps([name, request.model_name, request.version]), {}

    return dataclasses.replace(route, handler=handler)


ROUTER = Router([answering_its_name(route) for route in ROUTES])


def answered(method: str, path: str) -> list[str | None]:
    handler, params = ROUTER.match(method, path)
    _, body, _ = asyncio.run(handler(None, Request({}, b"", **params)))
    return orjson.loads(body)


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        ("GET", "/v2", ["server_metadata", None, None]),
        ("GET", "/v2/health/ready/", ["health_ready", None, None]),
        ("GET", "/v2/models/m", ["model_metadata", "m", None]),
        ("GET", "/v2/models/m/versions/3/ready", ["model_ready", "m", "3"]),
        ("POST", "/v2/models/m/infer", ["model_infer", "m", None]),
        ("POST", "/v2/models/ready/infer", ["model_infer", "ready", None]),  # a model may be named like an action
        ("GET", "/v2/models/m/versions/x", ["model_metadata", "m", "x"]),  # the handler refuses the version
        ("POST", "/v1/models/m:predict", ["tf_predict", "m", None]),
        ("POST", "/v1/models/m/versions/2:classify", ["tf_classify", "m", "2"]),
        ("GET", "/v1/models/m/versions/2/metadata", ["tf_metadata", "m", "2"]),
        ("GET", "/v1/models/a:b", ["tf_status", "a:b", None]),
        ("GET", "/v2/models//ready", ["model_ready", "", None]),  # "unknown model ''" from the repository
    ],
)
def test_dispatch(method: str, path: str, expected: list[str | None]) -> None:
    assert answered(method, path) == expected


def test_a_route_holds_its_handler_and_dispatch_finds_that_function() -> None:
    """Starlette's `Route(path, endpoint)`: the table holds each handler itself, not a name looked up later."""
    router = Router(ROUTES)
    for route in ROUTES:
        assert callable(route.handler) and not isinstance(route.handler, str), route
        for path in expand(route.path):
            concrete = path.replace("{model_name}", "m").replace("{version}", "2").replace("{label}", "stable")
            assert router.match(route.method, concrete)[0] is route.handler, (route.method, concrete)


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [("POST", "/v2", "GET"), ("GET", "/v2/models/m/infer", "POST"), ("GET", "/v1/models/m:predict", "POST")],
)
def test_a_known_path_with_another_method_is_405_naming_the_allowed_one(method: str, path: str, allow: str) -> None:
    with pytest.raises(RequestError) as refused:
        ROUTER.match(method, path)
    assert refused.value.status == 405 and refused.value.headers == {"allow": allow}
    assert str(refused.value) == f"method {method} is not allowed here; use {allow}"


@pytest.mark.parametrize(
    ("path", "action"), [("/v1/models/m:regress", ":regress"), ("/v1/models/m/versions/2:Classify", ":Classify")]
)
def test_an_action_this_server_lacks_is_404_naming_the_valid_ones_not_405_use_get(path: str, action: str) -> None:
    """`m:regress` parses as a model name on the status route (GET only): it must not read "use GET"."""
    with pytest.raises(RequestError) as refused:
        ROUTER.match("POST", path)
    assert refused.value.status == 404, str(refused.value)
    expected = f"no action '{action}' for model 'm'; use :predict or :classify (actions are case-sensitive)"
    assert str(refused.value) == expected


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/v3", "no route '/v3'; see GET /openapi.json for the API"),
        (
            "/v2/models/m/explain",
            "no route for 'explain' under /v2/models/m; use ready, config, stats, infer, generate or generate_stream",
        ),
        ("/v1/models/m/x", "no route for 'x' under /v1/models/m; use :predict, :classify or metadata"),
        ("/v2/models/m/versions/", "missing version number after /models/m/versions/"),
        (
            "/v2/models/m/versions/1/ready/extra",
            "no route /m/versions/1/ready/extra; see GET /openapi.json for the API",
        ),
    ],
)
def test_a_path_no_route_matches_is_404_saying_what_was_wrong(path: str, message: str) -> None:
    with pytest.raises(RequestError) as refused:
        ROUTER.match("GET", path)
    assert refused.value.status == 404 and str(refused.value) == message


def test_the_document_lists_every_route_of_the_table() -> None:
    paths = document(ROUTES, ["m"])["paths"]
    listed = {(method.upper(), path) for path, item in paths.items() for method in item if method != "parameters"}
    assert listed == {(route.method, path) for route in ROUTES for path in expand(route.path)}
    assert PUBLIC_PATHS == {"/v2/health/live", "/v2/health/ready"}


def test_the_document_declares_401_405_415_retry_after_and_b64() -> None:
    """What the server really answers besides the route's own errors: 401 where a key is needed, 405 for
    another method, 415 for a compressed body, Retry-After on every 503; and b64 pictures in a body."""
    doc = document(ROUTES, ["m"])
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            if method == "parameters":
                continue
            codes = set(operation["responses"])
            assert {"405", "415"} <= codes, (method, path)
            assert ("401" in codes) == (path not in PUBLIC_PATHS), (method, path)
            if "503" in codes:
                assert "Retry-After" in operation["responses"]["503"]["headers"], (method, path)
    # No `security` requirement: the key is optional (--api-key-env), and a document requiring it would
    # tell a conformance checker that a request without one must be refused.
    assert "security" not in doc
    predict = doc["paths"]["/v1/models/{model_name}:predict"]["post"]["requestBody"]["content"]["application/json"]
    rows = predict["schema"]["properties"]["instances"]["items"]["anyOf"]
    assert {"type": "string", "format": "byte"} in [row.get("properties", {}).get("b64") for row in rows]


# -- the wrappers ----------------------------------------------------------------------------------


async def inner(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An app answering 200 with the body it received."""
    message = await receive() if scope["method"] == "POST" else {"body": b""}
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": message["body"]})


def call(
    app: Any, method: str, path: str, headers: dict[str, str], chunks: list[bytes], stall: bool = False
) -> tuple[int, dict[str, str], bytes]:
    """One request through `app`: (status, headers, body). `stall`: the client stops after the chunks."""
    scope = {"type": "http", "method": method, "path": path,
             "headers": [(k.encode(), v.encode()) for k, v in headers.items()]}  # fmt: skip
    last = len(chunks) - 1
    pending = [{"type": "http.request", "body": c, "more_body": stall or i < last} for i, c in enumerate(chunks)]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop(0)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    headers_sent = {k.decode(): v.decode() for k, v in sent[0]["headers"]}
    return sent[0]["status"], headers_sent, b"".join(m.get("body", b"") for m in sent[1:])


def test_the_api_key_wrapper_refuses_all_but_the_public_paths() -> None:
    app = ApiKey(inner, "s3cret", PUBLIC_PATHS)
    status, headers, body = call(app, "GET", "/metrics", {}, [b""])
    assert status == 401 and headers["www-authenticate"] == "Bearer"
    assert orjson.loads(body) == {"error": "missing or wrong API key; send 'Authorization: Bearer <token>'"}
    assert call(app, "GET", "/metrics", {"authorization": "Bearer wrong"}, [b""])[0] == 401
    assert call(app, "GET", "/metrics", {"authorization": "Bearer s3cret"}, [b""])[0] == 200
    assert call(app, "GET", "/v2/health/live", {}, [b""])[0] == 200


def test_the_body_wrapper_hands_on_the_whole_body_or_refuses_it() -> None:
    app = BodyLimit(inner, max_bytes=10, timeout_s=0.05)
    assert call(app, "POST", "/x", {}, [b"01234", b"56789"])[::2] == (200, b"0123456789")  # chunked, one message on
    status, _, body = call(app, "POST", "/x", {"content-length": "11"}, [b"0" * 11])
    assert (
        status == 413 and orjson.loads(body)["error"] == "the body is 11 bytes, over the 10-byte limit (--max-body-mb)"
    )
    assert call(app, "POST", "/x", {}, [b"012345", b"678901"])[0] == 413  # no length: counted while read
    status, _, body = call(app, "GET", "/x", {"content-encoding": "gzip"}, [b""])
    assert status == 415 and "'gzip' is not supported" in orjson.loads(body)["error"]


def test_a_body_that_stops_arriving_is_408_and_closes_the_connection() -> None:
    app = BodyLimit(inner, max_bytes=10, timeout_s=0.05)
    status, headers, body = call(app, "POST", "/x", {}, [b"01"], stall=True)
    assert status == 408 and headers["connection"] == "close"
    assert orjson.loads(body)["error"] == "the body did not arrive within 0.05s (--read-timeout); send it whole"


def test_count_responses_counts_every_layer_answer() -> None:
    class Counts:
        def __init__(self) -> None:
            self.seen: list[int] = []
            self.in_flight: list[int] = []

        def count_response(self, status: int) -> None:
            self.seen.append(status)

        def started(self, change: int) -> None:
            self.in_flight.append(change)

    counts = Counts()
    app = CountResponses(ApiKey(BodyLimit(inner, 10, 1.0), "k", PUBLIC_PATHS), counts)
    call(app, "GET", "/metrics", {}, [b""])
    call(app, "POST", "/x", {"authorization": "Bearer k"}, [b"0" * 20])
    call(app, "POST", "/x", {"authorization": "Bearer k"}, [b"ok"])
    assert counts.seen == [401, 413, 200]
    assert counts.in_flight == [1, -1] * 3  # each request in flight while it was answered
