"""The ASGI application: the route table, dispatch over it, error mapping, lifespan and the server's basics.

A plain ASGI callable on purpose: a framework's per-request validation costs more than the model
for small networks (see bench/bench_serve.py). `create_app` composes the server: the app, wrapped
by the body limit (`body.py`), the API key when one is set (`auth.py`), the response counter
(`metrics.py`) and the access log when asked for (`access_log.py`). Every route of `ROUTES` holds
its handler, a function `(state, request)` beside its protocol (`protocols/v2_handlers.py`,
`protocols/tfserving_handlers.py`, `triton.py`, `generation/handlers.py`; the health, metrics and
document routes here) returning `(status, body, headers)`; a `RequestError` becomes
`{"error": "..."}` with its 4xx/503, and anything else is logged with its traceback and answered
500 (a real server fault), never a dropped connection.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pipeline.serve import logs, triton
from pipeline.serve.access_log import AccessLog
from pipeline.serve.asgi import Receive, Scope, Send
from pipeline.serve.auth import ApiKey
from pipeline.serve.body import BODY_METHODS, BodyLimit, read_body
from pipeline.serve.config import ServeConfig
from pipeline.serve.drain import CloseWhileDraining
from pipeline.serve.errors import RequestError
from pipeline.serve.generation.handlers import GenerationRoutes
from pipeline.serve.generation.stream import Streaming
from pipeline.serve.metrics import CONTENT_TYPE, CountResponses
from pipeline.serve.openapi import document
from pipeline.serve.protocols import tfserving_handlers as tfserving
from pipeline.serve.protocols import v2_handlers as v2
from pipeline.serve.repository import Repository
from pipeline.serve.request_id import RequestId
from pipeline.serve.responses import Response, error_body, error_response, json_response, send_response
from pipeline.serve.routes import BINARY, EVENTS, JSON, TEXT, Handler, Request, Route, Router
from pipeline.serve.schemas import (
    CHAT_REQUEST,
    CLASSIFY_REQUEST,
    COMPLETION_REQUEST,
    GENERATE_REQUEST,
    INDEX,
    INDEX_REQUEST,
    INFER_REQUEST,
    PREDICT_REQUEST,
)
from pipeline.serve.state import ServeState

log = logging.getLogger("pipe.serve")

# -- the server's basics: health, metrics, this API's document ----------------------------------------


async def health_live(state: ServeState, request: Request) -> Response:
    return json_response({"live": True})


async def health_ready(state: ServeState, request: Request) -> Response:
    # KServe V2: 200 is ready, a 4xx is not (Triton answers 400). Ready means serving at least one
    # model version: a server whose every version was refused, or whose repository is still empty,
    # must not receive traffic.
    state.check_serving()
    if not state.repo().models:
        failed = sorted(f"{n} v{v}" for n, v in state.repo().failed)
        why = f"every version was refused ({', '.join(failed)}; see GET /v2/models/NAME/ready)" if failed else (
            "the repository holds no model version yet")  # fmt: skip
        raise RequestError(f"not ready: no model is loaded: {why}", 400, {"retry-after": "1"})
    if state.config.http.strict_readiness:  # Triton's default: every model found must be ready
        repo = state.repo()
        unready = sorted({name for name, _ in [*repo.failed, *repo.held]} - set(repo.models))
        if unready:
            raise RequestError(
                f"not ready (--strict-readiness): no version of {', '.join(unready[:10])} is served; "
                "see GET /v2/models/NAME/ready for why",
                400,
                {"retry-after": "1"},
            )
    return json_response({"ready": True})


async def prometheus_metrics(state: ServeState, request: Request) -> Response:
    return 200, state.metrics.render(state.repo().ready_map()), {"content-type": CONTENT_TYPE}


async def openapi_document(state: ServeState, request: Request) -> Response:
    return json_response(document(ROUTES, sorted(state.repo().models)))


def _generation(handler: Callable[[GenerationRoutes, Request], Awaitable[Response | Streaming]]) -> Handler:
    """A generation route's handler (`generation/handlers.py`), answered by the state's `GenerationRoutes`."""

    @functools.wraps(handler)
    def answer(state: ServeState, request: Request) -> Awaitable[Response | Streaming]:
        return handler(state.generation, request)

    return answer


# -- the route table -----------------------------------------------------------------------------------

_V2_MODEL = "/v2/models/{model_name}[/versions/{version}|/labels/{label}]"
_TF_MODEL = "/v1/models/{model_name}[/versions/{version}|/labels/{label}]"
_BODY_ERRORS = (400, 404, 408, 413, 503)  # a body is read under --read-timeout and --max-body-mb; queues fill

# The document lists the paths in this order, and a 404 under a model the actions valid there.
ROUTES = (
    Route("GET", "/v2", v2.server_metadata, "Server metadata: name, version, supported extensions", "server metadata"),
    Route("GET", "/v2/health/live", health_live, "Liveness", "live", public=True),
    Route("GET", "/v2/health/ready", health_ready, "Readiness: a model version served and not shutting down",
          "ready", (400,), public=True),
    Route("GET", "/metrics", prometheus_metrics, "Prometheus metrics", "text exposition format", answers=(TEXT,)),
    Route("GET", "/openapi.json", openapi_document, "This document", "OpenAPI document"),
    Route("GET", "/v2/models/stats", triton.every_model_stats, "Triton statistics of every served model version",
          "statistics"),
    Route("POST", "/v2/repository/index", triton.repository_index,
          "Triton repository index: every version found, READY or UNAVAILABLE with the reason", "index",
          _BODY_ERRORS, INDEX_REQUEST, body_required=False, returns=INDEX),
    Route("GET", _V2_MODEL, v2.model_metadata, "V2 model metadata", "model metadata", (400, 404)),
    Route("GET", f"{_V2_MODEL}/ready", v2.model_ready, "V2 model readiness", "ready", (400, 404)),
    Route("GET", f"{_V2_MODEL}/config", triton.model_config, "Triton model configuration (JSON)", "model config",
          (400, 404)),
    Route("GET", f"{_V2_MODEL}/stats", triton.model_stats, "Triton statistics of the model's versions", "statistics",
          (400, 404)),
    Route("POST", f"{_V2_MODEL}/infer", v2.model_infer,
          "V2 inference (JSON, or binary tensors with Inference-Header-Content-Length)", "outputs", _BODY_ERRORS,
          INFER_REQUEST, answers=(JSON, BINARY)),
    Route("POST", f"{_V2_MODEL}/generate", _generation(GenerationRoutes.generate),
          "Triton generate: text_input in, text_output (JSON, or SSE with stream: true)", "generated text",
          _BODY_ERRORS, GENERATE_REQUEST, answers=(JSON, EVENTS)),
    Route("POST", f"{_V2_MODEL}/generate_stream", _generation(GenerationRoutes.generate_stream),
          "Triton generate_stream: text_output pieces as Server-Sent Events", "events", _BODY_ERRORS,
          GENERATE_REQUEST, answers=(EVENTS,)),
    Route("POST", f"{_TF_MODEL}:predict", tfserving.tf_predict, "TF Serving predict (instances or inputs)", "outputs",
          _BODY_ERRORS, PREDICT_REQUEST),
    Route("POST", f"{_TF_MODEL}:classify", tfserving.tf_classify, "TF Serving classify: [label, score] per class",
          "outputs", _BODY_ERRORS, CLASSIFY_REQUEST),
    Route("GET", f"{_TF_MODEL}/metadata", tfserving.tf_metadata, "TF Serving model metadata", "signature", (400, 404)),
    Route("GET", _TF_MODEL, tfserving.tf_status, "TF Serving model status", "version states", (400, 404)),
    Route("POST", "/v1/chat/completions", _generation(GenerationRoutes.chat),
          "OpenAI chat completion (stream: true for SSE chunks)", "chat completion", _BODY_ERRORS, CHAT_REQUEST,
          answers=(JSON, EVENTS)),
    Route("POST", "/v1/completions", _generation(GenerationRoutes.completions),
          "OpenAI text completion (stream: true for SSE chunks)", "completion", _BODY_ERRORS, COMPLETION_REQUEST,
          answers=(JSON, EVENTS)),
    Route("GET", "/v1/models", _generation(GenerationRoutes.models),
          "OpenAI model list: the served text-generation models", "models"),
)  # fmt: skip
PUBLIC_PATHS = frozenset(route.path for route in ROUTES if route.public)


class ServeApp:
    """`pipe serve` as an ASGI app; the repository loads on lifespan startup."""

    def __init__(self, config: ServeConfig) -> None:
        self.state = ServeState(config)
        self._router = Router(ROUTES)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            response = await self._handle(scope, receive)
            if isinstance(response, Streaming):  # tokens as they are made (generation/stream.py)
                await response.send(send, receive)
            else:
                await send_response(send, response)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self._start()
                except Exception as exc:  # report why startup failed instead of a bare traceback
                    log.exception("startup failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                self.state.drain.install()  # uvicorn's signal handlers are in place by now: wrap them
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.state.ready = False
                if self.state.repository:
                    await self.state.repository.stop()
                self._executor.shutdown(wait=True)
                self.state.metrics.flush()  # the last requests' counts, before the process exits
                log.info("stopped: every accepted request was answered")
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _start(self) -> None:
        state, c = self.state, self.state.config
        # Compute threads: batches of different models run side by side; onnxruntime parallelizes
        # inside each run with its own intra-op threads.
        self._executor = ThreadPoolExecutor(max_workers=max(4, c.batching.instances * 2), thread_name_prefix="ort")
        repository = Repository(c.repository, c.session, c.batching, state.metrics, self._executor, c.generation)
        state.repository = repository
        await repository.start()
        served = {name: sorted(vs) for name, vs in repository.models.items()}
        log.info("serving %s on http://%s:%d", served or "no models yet", c.http.host, c.http.port)
        state.ready = True

    async def _handle(self, scope: Scope, receive: Receive) -> Response | Streaming:
        method: str = scope["method"]
        try:
            # ASGI servers lower-case header names (uvicorn does), as the wrappers also rely on
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            body = await read_body(receive) if method in BODY_METHODS else b""
            handler, params = self._router.match(method, scope["path"])
            return await handler(self.state, Request(headers, body, receive=receive, **params))
        except RequestError as exc:
            return error_response(exc)
        except Exception:
            log.exception("internal error on %s %s", method, scope["path"])
            return error_body("internal server error; the server log has the traceback (find it by request_id)", 500)


def create_app() -> Any:
    """uvicorn factory for worker processes: the config arrives in PIPE_SERVE_CONFIG.

    The app wrapped, from the inside out: the body limit, the API key when one is set (refusing
    before any body is read), the response counter (it counts every layer's answers), the drain's
    `Connection: close`, the access log when asked for, and the request id (outermost: every layer's
    answer and log line carries it)."""
    config = ServeConfig.from_env()
    logs.configure(config.http.log_level, config.http.log_format)
    http = config.http
    app = ServeApp(config)
    served: Any = BodyLimit(app, http.max_body_bytes, http.read_timeout_s)
    if http.api_key_env:
        served = ApiKey.from_env(served, http.api_key_env, PUBLIC_PATHS)
    served = CloseWhileDraining(CountResponses(served, app.state.metrics), app.state.drain)
    served = AccessLog(served, http.access_log) if http.access_log else served
    return RequestId(served)
