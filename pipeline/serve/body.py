"""Request bodies: `read_body`, and `BodyLimit`, the ASGI wrapper bounding them in size and in time.

`BodyLimit` reads the whole body of a POST, PUT or PATCH before the app sees the request, and hands
it on as one message. It refuses, as `{"error": "..."}`:
- 415, on any request: a Content-Encoding other than identity (nothing here decompresses);
- 413: a body over `--max-body-mb`, on its Content-Length before reading, or while reading a body
  sent without one (chunked);
- 408, closing the connection: a body not whole within `--read-timeout`, so a client that stops
  sending mid-body (slowloris) cannot hold a connection (the headers have their own deadline, in
  `http_protocol.py`);
- 400: a client that disconnected before its body was whole.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pipeline.serve.asgi import App, Receive, Scope, Send
from pipeline.serve.errors import RequestError
from pipeline.serve.responses import error_response, send_response

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})  # the methods whose body is read


async def read_body(receive: Receive, limit: int | None = None) -> bytes:
    """The whole body from ASGI `receive`; a RequestError when the client leaves or it passes `limit` bytes."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise RequestError("the client disconnected before sending the whole body", 400)
        chunk = message.get("body", b"")
        size += len(chunk)
        if limit is not None and size > limit:
            raise RequestError(f"the body is over the {limit}-byte limit (--max-body-mb)", 413)
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


class BodyLimit:
    """An ASGI wrapper reading each request's whole body under `max_bytes` and `timeout_s` (see above)."""

    def __init__(self, app: App, max_bytes: int, timeout_s: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self._max_digits = len(str(max_bytes))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = None  # a method without a body: the app reads none
        try:
            self._check_headers(scope["headers"], scope["method"])
            if scope["method"] in BODY_METHODS:
                body = await self._read_within_deadline(receive)
        except RequestError as exc:
            await send_response(send, error_response(exc))
            return
        if body is None:
            await self.app(scope, receive, send)
            return
        delivered = False

        async def whole_body() -> dict[str, Any]:
            nonlocal delivered
            if delivered:  # after the body, what the server says next (a disconnect)
                return await receive()
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, whole_body, send)

    async def _read_within_deadline(self, receive: Receive) -> bytes:
        """The body, or a 408 once `timeout_s` has passed: asyncio.timeout's behaviour, on a bare timer.

        Measured with callgrind under uvloop, one awaited call under each: ~30,000 instructions with
        `asyncio.timeout`, ~11,000 with this (2,000 bare); per request to a small model, the saving
        is more than this wrapper, the response counter and the route lookup cost together."""
        task = asyncio.current_task()
        assert task is not None  # an ASGI app always runs in a task
        cancelling = task.cancelling()  # cancellations already requested, which are not ours to handle
        expired = False

        def expire() -> None:
            nonlocal expired
            expired = True
            task.cancel()

        timer = asyncio.get_running_loop().call_later(self.timeout_s, expire)
        try:
            return await read_body(receive, self.max_bytes)
        except asyncio.CancelledError:
            # Ours alone (no other cancellation requested meanwhile): the deadline passed. Otherwise the
            # task is being cancelled (shutdown) and must stay so.
            if expired and task.uncancel() <= cancelling:
                raise RequestError(
                    f"the body did not arrive within {self.timeout_s:g}s (--read-timeout); send it whole",
                    408,
                    {"connection": "close"},
                ) from None
            raise
        finally:
            timer.cancel()

    def _check_headers(self, headers: list[tuple[bytes, bytes]], method: str) -> None:
        """Refuse a compressed body (any method), or one whose Content-Length is over the limit."""
        encoding, declared = b"identity", None
        for key, value in headers:  # ASGI header names are lower-case
            if key == b"content-encoding":
                encoding = value
            elif key == b"content-length" and declared is None and value.isdigit():
                digits = value.lstrip(b"0")  # by length first: int() refuses 4,300 digits or more
                if len(digits) > self._max_digits or int(digits or b"0") > self.max_bytes:
                    declared = digits.decode()
        if encoding != b"identity":
            raise RequestError(
                f"Content-Encoding {encoding.decode('latin-1')!r} is not supported; send the body uncompressed", 415
            )
        if declared is not None and method in BODY_METHODS:
            raise RequestError(
                f"the body is {declared} bytes, over the {self.max_bytes}-byte limit (--max-body-mb)", 413
            )
