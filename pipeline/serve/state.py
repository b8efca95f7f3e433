"""What every handler reads: the server's settings, metrics and drain, and the repository once loaded.

A route's handler is a function `(state, request)` (`routes.Route`); dispatch gives each one the
app's single `ServeState`, so a handler says in its signature what it reads instead of reaching into
the app. The app makes it; the lifespan fills `repository` and turns `ready` on and off.
"""

from __future__ import annotations

from pipeline.serve.config import ServeConfig
from pipeline.serve.drain import Drain
from pipeline.serve.errors import RequestError
from pipeline.serve.generation.handlers import GenerationRoutes
from pipeline.serve.metrics import Metrics
from pipeline.serve.repository import Repository


class ServeState:
    """The server's state as the handlers see it."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.drain = Drain(config.http.drain_s)
        self.repository: Repository | None = None  # made on the lifespan's startup
        self.ready = False  # started and not shutting down
        self.generation = GenerationRoutes(self.repo)  # text-generation models: OpenAI, Triton generate

    def repo(self) -> Repository:
        """The repository; a 503 while the server is still starting."""
        if self.repository is None:
            raise RequestError("the server is still starting", 503, {"retry-after": "1"})
        return self.repository

    def check_serving(self) -> None:
        """Not ready (400, as Triton) while starting up, draining or stopping."""
        if self.drain.draining:
            raise RequestError("not ready: draining before shutdown; send new requests elsewhere", 400)
        if not self.ready:
            raise RequestError("not ready: starting up or shutting down", 400, {"retry-after": "1"})
