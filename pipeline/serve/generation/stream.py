"""A streamed answer: Server-Sent Events sent as they are made, and a client's disconnect noticed.

A handler returns a `Streaming` instead of `(status, body, headers)` once the request has its first token
(every refusal before that, a wait past --timeout included, is an ordinary answer with its status). The app
sends its headers, then each chunk as it comes, with no Content-Length (chunked transfer). While it streams,
the request's `receive` is watched: `http.disconnect` (the client closed the connection) calls
`on_disconnect`, which cancels the sequence, so the engine frees its place at its next step, and the stream
ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from pipeline.serve.asgi import Receive, Send

SSE_HEADERS = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"}
DONE = b"data: [DONE]\n\n"


def event(data: Any) -> bytes:
    """One SSE event holding `data` as JSON."""
    return b"data: " + orjson.dumps(data) + b"\n\n"


@dataclass
class Streaming:
    """A streamed 200 answer."""

    chunks: AsyncIterator[bytes]
    on_disconnect: Callable[[], None]
    headers: dict[str, str] = field(default_factory=lambda: dict(SSE_HEADERS))
    status: int = 200

    async def send(self, send: Send, receive: Receive) -> None:
        raw = [(k.encode(), v.encode()) for k, v in self.headers.items()]
        await send({"type": "http.response.start", "status": self.status, "headers": raw})
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()
            self.on_disconnect()

        watcher = asyncio.get_running_loop().create_task(watch())
        try:
            async for chunk in self.chunks:
                if gone.is_set():
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if not gone.is_set():
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            aclose = getattr(self.chunks, "aclose", None)
            if aclose is not None:
                await aclose()
