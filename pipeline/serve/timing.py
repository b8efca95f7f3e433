"""What one request spent where, filled in along its path and read by the access log.

The access log wrapper opens a `RequestRecord` for each HTTP request and puts it in a context
variable; the inference path fills in the model, version and rows, and the batcher the time the
request waited in the queue and the time its batch computed. asyncio gives every request task its
own context, so concurrent requests never see each other's record.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass


@dataclass
class RequestRecord:
    """One request's facts; fields stay None when the request never reached a model."""

    model: str | None = None
    version: int | None = None
    rows: int | None = None  # the request's batch dim (rows it contributed to its batch)
    queue_s: float | None = None  # waiting before its batch started
    compute_s: float | None = None  # its batch's onnxruntime time
    prompt_tokens: int | None = None  # a generation request's prompt, in tokens
    completion_tokens: int | None = None  # and the tokens it generated


current_request: contextvars.ContextVar[RequestRecord | None] = contextvars.ContextVar("pipe_request", default=None)
