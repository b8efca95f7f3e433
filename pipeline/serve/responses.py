"""An answer as the app and its wrappers write it: `(status, body, headers)`, sent as two ASGI messages.

A refusal (`RequestError`) is answered `{"error": "..."}` with its status and extra headers; every
answer carries its Content-Length.
"""

from __future__ import annotations

from typing import Any

import orjson

from pipeline.serve.errors import RequestError

Response = tuple[int, bytes, dict[str, str]]  # status, body, headers
JSON_HEADERS = {"content-type": "application/json"}


def json_response(data: Any, status: int = 200) -> Response:
    return status, orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY), JSON_HEADERS


def error_response(exc: RequestError) -> Response:
    return exc.status, orjson.dumps({"error": str(exc)}), {**JSON_HEADERS, **exc.headers}


async def send_response(send: Any, response: Response) -> None:
    status, body, headers = response
    raw_headers = [(k.encode(), v.encode()) for k, v in headers.items()]
    raw_headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})
