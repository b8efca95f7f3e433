"""`--access-log PATH|-`: one JSON line per HTTP request, written by a wrapper around the app.

Each line: `time` (UTC, ISO 8601), `method`, `route` (the path), `model`, `version`, `status`,
`rows`, `queue_ms`, `compute_ms` (its batch's run), `tokens_in` and `tokens_out` (a generation
request's prompt and generated tokens), `total_ms` (first byte of the app to the last
byte sent), `pid` (the worker) and `request_id` (request_id.py: the X-Request-ID echoed). Fields
a request never reached are null (a 404 has no model). Every worker appends to the same file;
each line is one `write` on a file opened with O_APPEND, so lines from several processes never
interleave.
"""

from __future__ import annotations

import datetime
import os
import time

import orjson

from pipeline.serve.asgi import App, Message, Receive, Scope, Send
from pipeline.serve.request_id import current_id
from pipeline.serve.timing import RequestRecord, current_request

STDOUT = "-"


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


class AccessLog:
    """An ASGI wrapper writing the access log line of every HTTP request the wrapped app answers."""

    def __init__(self, app: App, target: str) -> None:
        self.app = app
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        self._fd = 1 if target == STDOUT else os.open(target, flags, 0o644)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record, status = RequestRecord(), 0
        token = current_request.set(record)
        started = time.perf_counter()

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            current_request.reset(token)
            line = {
                "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds"),
                "method": scope["method"],
                "route": scope["path"],
                "model": record.model,
                "version": record.version,
                "status": status,
                "rows": record.rows,
                "queue_ms": _ms(record.queue_s),
                "compute_ms": _ms(record.compute_s),
                "tokens_in": record.prompt_tokens,
                "tokens_out": record.completion_tokens,
                "total_ms": _ms(time.perf_counter() - started),
                "pid": os.getpid(),
                "request_id": current_id.get(),
            }
            os.write(self._fd, orjson.dumps(line) + b"\n")
