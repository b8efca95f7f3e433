"""`--api-key-env NAME`: the ASGI wrapper refusing requests without `Authorization: Bearer <token>`.

The token is read once from the environment variable NAME; an empty or unset one is a startup
error. Every HTTP request must carry it except on the public paths (the health probes, which
orchestrators call without credentials); it is compared in constant time. A refusal is 401 with
`WWW-Authenticate: Bearer`.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Set

from pipeline.core.errors import InputError
from pipeline.serve.asgi import App, Receive, Scope, Send
from pipeline.serve.errors import RequestError
from pipeline.serve.responses import error_response, send_response

_REFUSED = RequestError(
    "missing or wrong API key; send 'Authorization: Bearer <token>'", 401, {"www-authenticate": "Bearer"}
)


class ApiKey:
    """An ASGI wrapper answering 401 to an HTTP request without the bearer token, unless its path is public."""

    def __init__(self, app: App, token: str, public: Set[str]) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()
        self._public = public

    @classmethod
    def from_env(cls, app: App, name: str, public: Set[str]) -> ApiKey:
        token = os.environ.get(name, "")
        if not token:
            raise InputError(
                f"--api-key-env {name} names an empty or unset environment variable; "
                "export it with the token clients must send as 'Authorization: Bearer <token>'"
            )
        return cls(app, token, public)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in self._public:
            given = b""
            for key, value in scope["headers"]:  # ASGI header names are lower-case; the last one counts
                if key == b"authorization":
                    given = value
            if not hmac.compare_digest(given, self._expected):
                await send_response(send, error_response(_REFUSED))
                return
        await self.app(scope, receive, send)
