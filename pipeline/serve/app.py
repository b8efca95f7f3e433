"""The ASGI application: dispatch over the route table, the handlers, error mapping and lifespan.

A plain ASGI callable on purpose: a framework's per-request validation costs more than the model
for small networks (see bench/bench_serve.py). `create_app` composes the server: the app, wrapped
by the body limit (`body.py`), the API key when one is set (`auth.py`), the response counter
(`metrics.py`) and the access log when asked for (`access_log.py`). Every handler, named in
`routes.ROUTES`, returns `(status, body, headers)`; a `RequestError` becomes `{"error": "..."}`
with its 4xx/503, and anything else is logged with its traceback and answered 500 (a real server
fault), never a dropped connection.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from pipeline import __version__
from pipeline.artifact.manifest import Detection
from pipeline.serve import logs, triton
from pipeline.serve.access_log import AccessLog
from pipeline.serve.auth import ApiKey
from pipeline.serve.body import BODY_METHODS, BodyLimit, read_body
from pipeline.serve.config import ServeConfig
from pipeline.serve.detections import not_a_detector, placements_of
from pipeline.serve.drain import CloseWhileDraining, Drain
from pipeline.serve.errors import NotFound, RequestError, Unavailable
from pipeline.serve.generation.handlers import GenerationRoutes
from pipeline.serve.generation.stream import Streaming
from pipeline.serve.metrics import CONTENT_TYPE, CountResponses, Metrics
from pipeline.serve.openapi import document
from pipeline.serve.protocols import tfserving, v2
from pipeline.serve.protocols.base import Decoded, Protocol
from pipeline.serve.protocols.tfclassify import TFClassify
from pipeline.serve.protocols.tfserving import TFServing
from pipeline.serve.protocols.v2 import V2
from pipeline.serve.recognition import OUTPUTS as TEXTS
from pipeline.serve.repository import Repository
from pipeline.serve.request_id import RequestId
from pipeline.serve.responses import Response, error_body, error_response, json_response, send_response
from pipeline.serve.routes import PUBLIC_PATHS, ROUTES, Request, Router
from pipeline.serve.served_version import LoadedVersion, version_number
from pipeline.serve.timing import current_request

log = logging.getLogger("pipe.serve")

EXTENSIONS = ["binary_tensor_data", "classification"]  # the V2 extensions implemented here, by their Triton names
# Bodies larger than this are decoded in the inference pool, off the event loop: parsing 64 MB of JSON
# takes seconds that health probes and other requests must not wait; a small body decodes inline
# (about 50 us for a 1x784 FP32 request) rather than pay a thread hand-off.
INLINE_DECODE_BYTES = 256 * 1024
_V2, _TF_SERVING, _TF_CLASSIFY = V2(), TFServing(), TFClassify()


class ServeApp:
    """`pipe serve` as an ASGI app; the repository loads on lifespan startup."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.repository: Repository | None = None
        self.ready = False
        self.drain = Drain(config.http.drain_s)
        self._generation = GenerationRoutes(self._repo)  # text-generation models: OpenAI, Triton generate
        self._router = Router(ROUTES, self)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            response = await self._handle(scope, receive)
            if isinstance(response, Streaming):  # tokens as they are made (generation/stream.py)
                await response.send(send, receive)
            else:
                await send_response(send, response)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self._start()
                except Exception as exc:  # report why startup failed instead of a bare traceback
                    log.exception("startup failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                self.drain.install()  # uvicorn's signal handlers are in place by now: wrap them
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.ready = False
                if self.repository:
                    await self.repository.stop()
                self._executor.shutdown(wait=True)
                self.metrics.flush()  # the last requests' counts, before the process exits
                log.info("stopped: every accepted request was answered")
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _start(self) -> None:
        c = self.config
        # Compute threads: batches of different models run side by side; onnxruntime parallelizes
        # inside each run with its own intra-op threads.
        self._executor = ThreadPoolExecutor(max_workers=max(4, c.batching.instances * 2), thread_name_prefix="ort")
        self.repository = Repository(c.repository, c.session, c.batching, self.metrics, self._executor, c.generation)
        await self.repository.start()
        served = {name: sorted(vs) for name, vs in self.repository.models.items()}
        log.info("serving %s on http://%s:%d", served or "no models yet", c.http.host, c.http.port)
        self.ready = True

    async def _handle(self, scope: dict[str, Any], receive: Any) -> Response | Streaming:
        method: str = scope["method"]
        try:
            # ASGI servers lower-case header names (uvicorn does), as the wrappers also rely on
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            body = await read_body(receive) if method in BODY_METHODS else b""
            handler, params = self._router.match(method, scope["path"])
            return await handler(Request(headers, body, receive=receive, **params))
        except RequestError as exc:
            return error_response(exc)
        except Exception:
            log.exception("internal error on %s %s", method, scope["path"])
            return error_body("internal server error; the server log has the traceback (find it by request_id)", 500)

    # -- handlers of the fixed routes -------------------------------------------------------------

    async def server_metadata(self, request: Request) -> Response:
        return json_response({"name": "pipe", "version": __version__, "extensions": EXTENSIONS})

    async def health_live(self, request: Request) -> Response:
        return json_response({"live": True})

    async def health_ready(self, request: Request) -> Response:
        # KServe V2: 200 is ready, a 4xx is not (Triton answers 400). Ready means serving at least one
        # model version: a server whose every version was refused, or whose repository is still empty,
        # must not receive traffic.
        self._check_serving()
        if not self._repo().models:
            failed = sorted(f"{n} v{v}" for n, v in self._repo().failed)
            why = f"every version was refused ({', '.join(failed)}; see GET /v2/models/NAME/ready)" if failed else (
                "the repository holds no model version yet")  # fmt: skip
            raise RequestError(f"not ready: no model is loaded: {why}", 400, {"retry-after": "1"})
        if self.config.http.strict_readiness:  # Triton's default: every model found must be ready
            repo = self._repo()
            unready = sorted({name for name, _ in [*repo.failed, *repo.held]} - set(repo.models))
            if unready:
                raise RequestError(
                    f"not ready (--strict-readiness): no version of {', '.join(unready[:10])} is served; "
                    "see GET /v2/models/NAME/ready for why",
                    400,
                    {"retry-after": "1"},
                )
        return json_response({"ready": True})

    def _check_serving(self) -> None:
        """Not ready (400, as Triton) while starting up, draining or stopping."""
        if self.drain.draining:
            raise RequestError("not ready: draining before shutdown; send new requests elsewhere", 400)
        if not self.ready:
            raise RequestError("not ready: starting up or shutting down", 400, {"retry-after": "1"})

    async def prometheus_metrics(self, request: Request) -> Response:
        return 200, self.metrics.render(self._repo().ready_map()), {"content-type": CONTENT_TYPE}

    async def openapi_document(self, request: Request) -> Response:
        return json_response(document(sorted(self._repo().models)))

    def _repo(self) -> Repository:
        if self.repository is None:
            raise RequestError("the server is still starting", 503, {"retry-after": "1"})
        return self.repository

    # -- KServe V2 ---------------------------------------------------------------------------------

    async def model_metadata(self, request: Request) -> Response:
        repo, name = self._repo(), request.model_name
        model = repo.get(name, request.version, request.label)
        unversioned = request.version is None and request.label is None
        versions = [str(v) for v in repo.models[name]] if unversioned else [str(model.version)]
        parameters = {
            "version": str(model.version),
            "variant": model.variant,
            "file": model.file,
            "providers": model.session.providers,
            "max_batch_size": self.config.batching.max_batch_size if model.session.batchable else 0,
        }
        if labels := {label: v for label, v in repo.labels.get(model.name, {}).items() if v == model.version}:
            parameters["labels"] = sorted(labels)  # the labels naming this version (pipe promote)
        if model.reload_error is not None:  # still serving what it had; its changed manifest was refused
            parameters["reload_error"] = model.reload_error
        if (labels_error := repo.label_errors.get(name)) is not None:  # its labels file was refused
            parameters["labels_error"] = labels_error
        if model.images.recorded:  # input name -> its recorded preprocessing (image inputs: how pictures feed them)
            parameters["preprocessing"] = model.images.recorded
        return json_response(v2.metadata(model.io, versions, parameters))

    async def model_ready(self, request: Request) -> Response:
        repo = self._repo()
        repo.get(request.model_name, request.version, request.label)
        self._check_serving()
        answer: dict[str, Any] = {"name": request.model_name, "ready": True}
        if (labels_error := repo.label_errors.get(request.model_name or "")) is not None:
            answer["labels_error"] = labels_error  # ready, on the labels read before the file was refused
        return json_response(answer)

    # -- Triton's repository extension (read-only): config, statistics, index ---------------------

    async def model_config(self, request: Request) -> Response:
        model = self._repo().get(request.model_name, request.version, request.label)
        kind = "KIND_GPU" if "CUDAExecutionProvider" in model.session.providers else "KIND_CPU"
        config = triton.model_config(
            model.name, model.session.inputs, model.session.outputs, model.session.batchable, self.config.batching,
            model.file, self.config.repository.latest, kind,
        )  # fmt: skip
        return json_response(config)

    async def model_stats(self, request: Request) -> Response:
        repo, name = self._repo(), request.model_name
        assert name is not None
        if request.version is None and request.label is None:
            versions = sorted(repo.get_all(name))
        else:
            versions = [repo.get(name, request.version, request.label).version]
        return self._stats({name: versions})

    async def every_model_stats(self, request: Request) -> Response:
        return self._stats({name: sorted(versions) for name, versions in sorted(self._repo().models.items())})

    def _stats(self, versions: dict[str, list[int]]) -> Response:
        totals = self.metrics.totals()
        entries = [triton.model_stats(name, v, totals.get((name, v), {})) for name, vs in versions.items() for v in vs]
        return json_response({"model_stats": entries})

    async def repository_index(self, request: Request) -> Response:
        asked = v2.parse_json(request.body, "the repository index request") if request.body.strip() else {}
        if not isinstance(asked, dict) or not isinstance(asked.get("ready", False), bool):
            raise RequestError(
                f'the repository index request must be {{}} or {{"ready": true|false}}, got {asked!r:.80}'
            )
        repo = self._repo()
        entries = [
            triton.index_entry(name, version, served, reason)
            for name in sorted(repo.names())
            for version, (served, reason) in sorted(repo.states(name).items())
            if served or not asked.get("ready", False)
        ]
        return json_response(entries)

    def model_infer(self, request: Request) -> Awaitable[Response]:
        return self._infer(_V2, request)

    # -- text generation: the OpenAI API and Triton's generate (generation/handlers.py) -------------

    def openai_chat(self, request: Request) -> Awaitable[Response | Streaming]:
        return self._generation.chat(request)

    def openai_completions(self, request: Request) -> Awaitable[Response | Streaming]:
        return self._generation.completions(request)

    def openai_models(self, request: Request) -> Awaitable[Response]:
        return self._generation.models(request)

    def triton_generate(self, request: Request) -> Awaitable[Response | Streaming]:
        return self._generation.generate(request)

    def triton_generate_stream(self, request: Request) -> Awaitable[Response | Streaming]:
        return self._generation.generate_stream(request)

    # -- inference, every protocol ----------------------------------------------------------------

    async def _infer(self, protocol: Protocol, request: Request) -> Response:
        """The one inference path: decode, check, batch and run, select the outputs asked for, encode.

        Counted in the model's metrics: a success with its time, or a failure (refused with a
        4xx/503, or a server fault); inline, a generator context manager cost ~1 us a request."""
        model = self._repo().get(request.model_name, request.version, request.label)
        stats = self.metrics.model(model.name, model.version)
        if (record := current_request.get()) is not None:  # the access log's record of this request
            record.model, record.version = model.name, model.version
        started, arrived = time.perf_counter(), asyncio.get_running_loop().time()
        try:
            if len(request.body) > INLINE_DECODE_BYTES:  # parsed in the inference pool: the loop answers others
                body, headers, io = request.body, request.headers, model.io
                decode = lambda: protocol.decode(body, headers, io)  # noqa: E731
                decoded = await model.batcher.prepare(decode, arrived, inference_pool=False)
            else:
                decoded = protocol.decode(request.body, request.headers, model.io)
            settings = None
            if decoded.detections is not None:
                if model.detector is None:
                    raise not_a_detector(model.name, model.task)
                settings = model.detector.settings_for(decoded.detections)
            # texts first: strings sent under a token ids input are texts, not pictures
            decoded.inputs = await model.text.converted(decoded.inputs, model.batcher, arrived)
            decoded.inputs, decoded.placements = await model.images.converted(
                decoded.inputs, model.session.input_by_name, model.batcher, arrived
            )
            wanted = model.output_names(decoded.outputs, detections=settings is not None)
            rows = model.session.check_inputs(decoded.inputs)
            results = await model.batcher.infer(decoded.inputs, rows, arrived)
            if settings is not None:
                results = await self._detections(model, decoded, results, settings, arrived)
            if model.recognizer is not None and not set(wanted).isdisjoint(TEXTS):  # the output read as text
                results = {**results, **model.recognizer.read(results[model.recognizer.output])}
            payload, out_headers = protocol.encode(model.io, decoded, {name: results[name] for name in wanted})
        except Exception:
            stats.failed()
            raise
        stats.answered(time.perf_counter() - started)
        return 200, payload, out_headers

    async def _detections(
        self,
        model: LoadedVersion,
        decoded: Decoded,
        results: dict[str, np.ndarray],
        settings: Detection,
        arrived: float,
    ) -> dict[str, np.ndarray]:
        """`results` with the detections outputs (boxes, scores, classes, labels, count) beside the raw ones:
        the head decoded (in a worker thread: NMS over thousands of anchors takes milliseconds), each
        picture's boxes mapped back to it; within the request's --timeout (the decoding stops there, 503)."""
        assert model.detector is not None
        placements = placements_of(decoded.placements, list(model.session.input_by_name))
        deadline = time.monotonic() + model.batcher.time_left(arrived)
        head = results[model.detector.output]
        try:
            detected = await asyncio.to_thread(model.detector.detect, head, placements, settings, deadline)
        except TimeoutError:
            raise Unavailable(
                f"decoding the detections did not finish within the {model.batcher.settings.timeout_s:g}s timeout; "
                "ask for fewer boxes (a higher confidence, a lower iou, a smaller max_detections) or fewer pictures"
            ) from None
        decoded.coordinates = detected.coordinates
        return {**results, **detected.arrays()}

    # -- TF Serving REST ---------------------------------------------------------------------------

    def tf_predict(self, request: Request) -> Awaitable[Response]:
        return self._infer(_TF_SERVING, request)

    def tf_classify(self, request: Request) -> Awaitable[Response]:
        return self._infer(_TF_CLASSIFY, request)

    async def tf_metadata(self, request: Request) -> Response:
        model = self._repo().get(request.model_name, request.version, request.label)
        return json_response(tfserving.metadata(model.io, model.images.recorded))

    async def tf_status(self, request: Request) -> Response:
        name, version = request.model_name, request.version
        states = self._repo().states(name)
        if request.label is not None:
            version = str(self._repo().get(name, None, request.label).version)
        if version is not None:
            number = version_number(version)
            if number not in states:
                raise NotFound(f"model {name!r} has no version {version[:40]}; known: {sorted(states)}")
            states = {number: states[number]}
        answer = tfserving.status(states)
        if request.version is None and request.label is None and name in self._generation.generation_models():
            answer = {**self._generation.model_object(name), **answer}  # OpenAI's retrieve reads the same path
        return json_response(answer)


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
    served = CloseWhileDraining(CountResponses(served, app.metrics), app.drain)
    served = AccessLog(served, http.access_log) if http.access_log else served
    return RequestId(served)
