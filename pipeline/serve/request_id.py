"""A request id on every HTTP request: accepted from `X-Request-ID`, else made; echoed, logged, in errors.

The id ties one request's answer, its access log line, its error body (`request_id`) and the
server's log lines about it together, across a proxy that sets `X-Request-ID` and the server.
An incoming id is kept when it is 1-128 visible ASCII characters (what proxies send: a UUID, a
trace id); anything else is replaced rather than refused, so a client's odd header never costs it
its answer. Made ids are a random per-process prefix and a counter: unique across workers and
restarts like `uuid4().hex`, without its getrandom syscall per request.
"""

from __future__ import annotations

import contextvars
import itertools
import os
from collections.abc import Awaitable

from pipeline.serve.asgi import App, Message, Receive, Scope, Send

HEADER = "x-request-id"
MAX_LENGTH = 128

current_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("pipe_request_id", default=None)


class _Ids:
    """A random prefix drawn per process (a forked child draws its own) and a counter."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._prefix = os.urandom(8).hex() + "-"
        self._counter = itertools.count(1)

    def next(self) -> str:
        return f"{self._prefix}{next(self._counter)}"


_ids = _Ids()
new_id = _ids.next


def _acceptable(value: str) -> bool:
    return 0 < len(value) <= MAX_LENGTH and value.isascii() and value.isprintable() and " " not in value


def incoming(headers: list[tuple[bytes, bytes]]) -> str:
    """The request's `X-Request-ID` when it is acceptable, else a new id."""
    for name, value in headers:
        if name.lower() == b"x-request-id":
            text = value.decode("latin-1")
            return text if _acceptable(text) else new_id()
    return new_id()


class RequestId:
    """An ASGI wrapper giving each HTTP request its id (`current_id`) and echoing it in `X-Request-ID`."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = incoming(scope["headers"])
        header = (b"x-request-id", request_id.encode())
        token = current_id.set(request_id)

        def echoing(message: Message) -> Awaitable[None]:  # send's own awaitable: no coroutine of its own
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), header]}
            return send(message)

        try:
            await self.app(scope, receive, echoing)
        finally:
            current_id.reset(token)
