"""The ASGI interface's types, named once: what the server's wrappers, the app and a stream pass around.

`pipe serve` is an ASGI application (uvicorn calls it) wrapped by small ASGI wrappers (body limit, API key,
request id, drain, metrics, access log), each one `app(scope, receive, send)`. Plain dicts and callables,
as the ASGI specification has them; these names only say which is which.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

Scope = dict[str, Any]  # a connection's scope: {"type": "http" | "lifespan", "method", "path", "headers", ...}
Message = dict[str, Any]  # an ASGI message: {"type": "http.request" | "http.disconnect" | ..., ...}
Receive = Callable[[], Awaitable[Message]]  # the next message from the client's side
Send = Callable[[Message], Awaitable[None]]  # a message to the client
App = Callable[[Scope, Receive, Send], Awaitable[None]]  # an ASGI application, or a wrapper around one
