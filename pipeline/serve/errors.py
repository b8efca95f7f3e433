"""The errors a request can hit, each carrying the HTTP status it maps to.

They belong to the one family (`PipelineError`); `app` is the single place turning them into an
`{"error": "..."}` response. Anything else that escapes a handler is a real server fault (500).
"""

from __future__ import annotations

from pipeline.core.errors import PipelineError


class RequestError(PipelineError):
    """A request the server refuses; `status` is the HTTP code, `headers` extra response headers."""

    status = 400

    def __init__(
        self, message: str, status: int | None = None, headers: dict[str, str] | None = None, param: str | None = None
    ) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status
        self.headers = headers or {}
        self.param = param  # the request field at fault, when one is (OpenAI's error `param`)

    def with_param(self, param: str) -> RequestError:
        """This refusal, naming the request field at fault."""
        self.param = param
        return self


class NotFound(RequestError):
    """Unknown model, version or route."""

    status = 404


class Unavailable(RequestError):
    """The server cannot take the request now (queue full, timed out, shutting down): retry later."""

    status = 503

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message, headers={"retry-after": str(retry_after_s)})
