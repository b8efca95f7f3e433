"""Shutdown drain: readiness goes false first, requests keep being answered, then the server stops.

A load balancer learns that a backend is leaving from its readiness probe, and needs time to take
it out of rotation. Stopping at once (uvicorn's own SIGTERM handling closes every idle keep-alive
connection and the listening socket) resets the requests clients were sending on those
connections: 3-8 of ~10,000 with one worker, 19-23 with two (16 keep-alive clients, issue 22).

So on SIGTERM, or Ctrl-C, each server process first drains for `--drain-seconds`:
- `GET /v2/health/ready` and every model's readiness answer "not ready" (400, as Triton does);
- requests keep being answered, on open connections and new ones alike;
- every response carries `Connection: close`, so each keep-alive connection's next answer is its
  last and a client that honours it reconnects (through the balancer, to another backend);
then uvicorn's graceful stop runs: stop accepting, finish what is in flight (`--graceful-timeout`),
drain every batcher. A second Ctrl-C during the drain stops at once; a SIGTERM during it (the
supervisor of `--workers N` forwards one after the terminal's Ctrl-C) changes nothing.

The drain hooks uvicorn's signal handling from the app's lifespan startup, in each worker's main
thread: uvicorn has installed its handler by then (`Server.capture_signals`), and the drain wraps
it, calling it when the drain ends. uvicorn restores the original handlers when it stops.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any

from pipeline.serve.asgi import App, Message, Receive, Scope, Send

log = logging.getLogger("pipe.serve")

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_CLOSE = (b"connection", b"close")


class Drain:
    """This process's drain: whether it is draining, and the signal hook that starts it."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds  # how long requests keep being answered after the signal; 0: stop at once
        self.draining = False
        self._stopped = False  # the drain ended: signals go to uvicorn as they came (Ctrl-C again forces)
        self._stop: Callable[[], None] | None = None  # the stop the drain postpones (uvicorn's handler, bound)
        self._timer: asyncio.TimerHandle | None = None

    def install(self) -> None:
        """Wrap the SIGINT and SIGTERM handlers in force now (uvicorn's), from the running loop's thread."""
        loop = asyncio.get_running_loop()
        for sig in _SIGNALS:
            previous = signal.getsignal(sig)
            if callable(previous):
                signal.signal(sig, self._handler(loop, previous))

    def _handler(self, loop: asyncio.AbstractEventLoop, stop: Callable[[int, FrameType | None], Any]) -> Any:
        def on_signal(sig: int, frame: FrameType | None) -> None:
            if self.seconds <= 0 or self._stopped:
                stop(sig, frame)
            elif not self.draining:
                self.draining = True
                self._stop = lambda: stop(sig, frame)
                # A signal handler runs between two bytecodes of the loop's own thread: hand the timer to
                # the loop through its thread-safe door rather than touch its scheduler from here.
                loop.call_soon_threadsafe(self._start)
            elif sig == signal.SIGINT:  # Ctrl-C again: stop now
                loop.call_soon_threadsafe(self._end, "a second Ctrl-C")

        return on_signal

    def _start(self) -> None:
        log.info(
            "draining for %gs: readiness is false, requests are still answered and each response closes its "
            "connection; Ctrl-C again to stop now",
            self.seconds,
        )
        self._timer = asyncio.get_running_loop().call_later(self.seconds, self._end, "the drain period ended")

    def _end(self, why: str) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._stop is not None:
            stop, self._stop = self._stop, None
            self._stopped = True
            log.info("stopping: %s", why)
            stop()


class CloseWhileDraining:
    """An ASGI wrapper adding `Connection: close` to every response while the drain runs."""

    def __init__(self, app: App, drain: Drain) -> None:
        self.app = app
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        drain = self.drain

        def closing(message: Message) -> Awaitable[None]:  # send's own awaitable: no coroutine of its own
            if drain.draining and message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), _CLOSE]}
            return send(message)

        await self.app(scope, receive, closing)
