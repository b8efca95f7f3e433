"""uvicorn's httptools protocol with a deadline on request headers (slowloris).

uvicorn bounds idle keep-alive connections but not a request whose headers trickle in a byte at
a time: each byte resets nothing and the connection is held forever. Here the headers of every
request must be complete within `--read-timeout` seconds of the connection opening (first
request) or of the request's first byte (later ones); past it the server answers 408 and closes.
The body has its own deadline, in the `BodyLimit` wrapper (`body.py`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from pipeline.serve.config import CONFIG_ENV


@functools.cache
def _read_timeout_s() -> float:
    """This server's --read-timeout, from the config every worker reads (PIPE_SERVE_CONFIG)."""
    return float(json.loads(os.environ[CONFIG_ENV])["http"]["read_timeout_s"])


class HeaderDeadlineProtocol(HttpToolsProtocol):
    """HttpToolsProtocol that answers 408 and closes when a request's headers are not complete in time."""

    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._header_timer is None:
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._header_timer = self.loop.call_later(_read_timeout_s(), self._expired)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expired(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        body = json.dumps(
            {"error": f"the request headers did not arrive within {_read_timeout_s():g}s (--read-timeout)"}
        ).encode()
        head = (
            "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        )
        self.transport.write(head.encode() + body)
        self.transport.close()
