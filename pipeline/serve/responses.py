"""An answer as the app and its wrappers write it: `(status, body, headers)`, sent as two ASGI messages.

A refusal (`RequestError`) is answered `{"error": "...", "request_id": "..."}` with its status and
extra headers; every
answer carries its Content-Length.
"""

from __future__ import annotations

from typing import Any

import orjson

from pipeline.serve.asgi import Send
from pipeline.serve.errors import RequestError
from pipeline.serve.request_id import current_id

Response = tuple[int, bytes, dict[str, str]]  # status, body, headers
JSON_HEADERS = {"content-type": "application/json"}


def json_response(data: Any, status: int = 200) -> Response:
    return status, orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY), JSON_HEADERS


def error_response(exc: RequestError) -> Response:
    return error_body(str(exc), exc.status, exc.headers)


def error_body(message: str, status: int, headers: dict[str, str] | None = None) -> Response:
    """`{"error": message, "request_id": ...}`: the id (request_id.py) quoted in a bug report finds the log lines."""
    body: dict[str, str] = {"error": message}
    if (request_id := current_id.get()) is not None:
        body["request_id"] = request_id
    return status, orjson.dumps(body), {**JSON_HEADERS, **(headers or {})}


async def send_response(send: Send, response: Response) -> None:
    status, body, headers = response
    raw_headers = [(k.encode(), v.encode()) for k, v in headers.items()]
    raw_headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})
