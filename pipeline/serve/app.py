"""The ASGI application: routing, body limit, API key, error mapping and lifespan.

A plain ASGI callable on purpose: a framework's per-request validation costs more than the model
for small networks (see bench/bench_serve.py). Every handler returns `(status, body, headers)`;
a `RequestError` becomes `{"error": "..."}` with its 4xx/503, and anything else is logged with its
traceback and answered 500 (a real server fault), never a dropped connection.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import orjson

from pipeline import __version__
from pipeline.artifact.manifest import Detection
from pipeline.core.errors import InputError
from pipeline.serve.access_log import AccessLog
from pipeline.serve.config import ServeConfig
from pipeline.serve.detections import OUTPUTS as DETECTIONS
from pipeline.serve.detections import not_a_detector, placements_of
from pipeline.serve.errors import NotFound, RequestError
from pipeline.serve.metrics import CONTENT_TYPE, Metrics
from pipeline.serve.openapi import document
from pipeline.serve.protocols import tfserving, v2
from pipeline.serve.protocols.base import Decoded, Protocol
from pipeline.serve.protocols.tfclassify import TFClassify
from pipeline.serve.protocols.tfserving import TFServing
from pipeline.serve.protocols.v2 import V2
from pipeline.serve.repository import LoadedVersion, Repository, version_number
from pipeline.serve.timing import current_request

log = logging.getLogger("pipe.serve")

Response = tuple[int, bytes, dict[str, str]]
EXTENSIONS = ["binary_tensor_data", "classification"]  # the V2 extensions implemented here, by their Triton names
_JSON = {"content-type": "application/json"}
_PUBLIC = {"/v2/health/live", "/v2/health/ready"}  # probes work without the API key
_V2, _TF_SERVING = V2(), TFServing()
_TF_VERBS: dict[str, Protocol] = {":predict": _TF_SERVING, ":classify": TFClassify()}


def _json(data: Any, status: int = 200) -> Response:
    return status, orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY), _JSON


class ServeApp:
    """`pipe serve` as an ASGI app; the repository loads on lifespan startup."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.repository: Repository | None = None
        self.ready = False
        self._api_key: bytes | None = None
        if config.http.api_key_env:
            key = os.environ.get(config.http.api_key_env, "")
            if not key:
                raise InputError(
                    f"--api-key-env {config.http.api_key_env} names an empty or unset environment variable; "
                    "export it with the token clients must send as 'Authorization: Bearer <token>'"
                )
            self._api_key = f"Bearer {key}".encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            status, body, headers = await self._handle(scope, receive)
            self.metrics.count_response(status)
            raw_headers = [(k.encode(), v.encode()) for k, v in headers.items()]
            raw_headers.append((b"content-length", str(len(body)).encode()))
            await send({"type": "http.response.start", "status": status, "headers": raw_headers})
            await send({"type": "http.response.body", "body": body})

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
        self.repository = Repository(c.repository, c.session, c.batching, self.metrics, self._executor)
        await self.repository.start()
        served = {name: sorted(vs) for name, vs in self.repository.models.items()}
        log.info("serving %s on http://%s:%d", served or "no models yet", c.http.host, c.http.port)
        self.ready = True

    async def _read_body(self, scope: dict[str, Any], receive: Any) -> bytes:
        limit = self.config.http.max_body_bytes
        for key, value in scope["headers"]:
            if key == b"content-length" and value.isdigit() and int(value) > limit:
                raise RequestError(f"the body is {int(value)} bytes, over the {limit}-byte limit (--max-body-mb)", 413)
        # A client that stops sending mid-body (slowloris) must not hold a connection forever.
        deadline = self.config.http.read_timeout_s
        try:
            async with asyncio.timeout(deadline):
                return await self._receive_body(receive, limit)
        except TimeoutError:
            raise RequestError(
                f"the body did not arrive within {deadline:g}s (--read-timeout); send it whole",
                408,
                {"connection": "close"},
            ) from None

    async def _receive_body(self, receive: Any, limit: int) -> bytes:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise RequestError("the client disconnected before sending the whole body", 400)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise RequestError(f"the body is over the {limit}-byte limit (--max-body-mb)", 413)
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    async def _handle(self, scope: dict[str, Any], receive: Any) -> Response:
        path: str = scope["path"]
        method: str = scope["method"]
        try:
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            if self._api_key is not None and path not in _PUBLIC:
                given = headers.get("authorization", "").encode("latin-1")
                if not hmac.compare_digest(given, self._api_key):
                    raise RequestError(
                        "missing or wrong API key; send 'Authorization: Bearer <token>'",
                        401,
                        {"www-authenticate": "Bearer"},
                    )
            if headers.get("content-encoding", "identity") != "identity":
                encoding = headers["content-encoding"]
                raise RequestError(f"Content-Encoding {encoding!r} is not supported; send the body uncompressed", 415)
            body = await self._read_body(scope, receive) if method in ("POST", "PUT", "PATCH") else b""
            return await self._route(method, path, headers, body)
        except RequestError as exc:
            return exc.status, orjson.dumps({"error": str(exc)}), {**_JSON, **exc.headers}
        except Exception:
            log.exception("internal error on %s %s", method, path)
            return _json({"error": "internal server error; the server log has the traceback"}, 500)

    async def _route(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Response:
        parts = path.strip("/").split("/")
        root = parts[0]
        if root == "v2" and len(parts) >= 3 and parts[1] == "models":
            return await self._v2_model(method, parts[2:], headers, body)
        if root == "v1" and len(parts) >= 3 and parts[1] == "models":
            return await self._v1_model(method, parts[2:], headers, body)
        fixed = {
            "/v2": self._server_metadata,
            "/v2/health/live": self._live,
            "/v2/health/ready": self._ready,
            "/metrics": self._metrics,
            "/openapi.json": self._openapi,
        }
        handler = fixed.get(path.rstrip("/") or "/")
        if handler is None:
            raise NotFound(f"no route {path!r}; see GET /openapi.json for the API")
        _allow(method, "GET")
        return handler()

    # -- fixed routes ------------------------------------------------------------------------------

    def _server_metadata(self) -> Response:
        return _json({"name": "pipe", "version": __version__, "extensions": EXTENSIONS})

    def _live(self) -> Response:
        return _json({"live": True})

    def _ready(self) -> Response:
        # KServe V2: 200 is ready, a 4xx is not (Triton answers 400). Ready means serving at least one
        # model version: a server whose every version was refused, or whose repository is still empty,
        # must not receive traffic.
        if not self.ready:
            raise RequestError("not ready: starting up or shutting down", 400, {"retry-after": "1"})
        if not self._repo().models:
            failed = sorted(f"{n} v{v}" for n, v in self._repo().failed)
            why = f"every version was refused ({', '.join(failed)}; see GET /v2/models/NAME/ready)" if failed else (
                "the repository holds no model version yet")  # fmt: skip
            raise RequestError(f"not ready: no model is loaded: {why}", 400, {"retry-after": "1"})
        return _json({"ready": True})

    def _metrics(self) -> Response:
        return 200, self.metrics.render(self._repo().ready_map()), {"content-type": CONTENT_TYPE}

    def _openapi(self) -> Response:
        return _json(document(sorted(self._repo().models)))

    def _repo(self) -> Repository:
        if self.repository is None:
            raise RequestError("the server is still starting", 503, {"retry-after": "1"})
        return self.repository

    # -- KServe V2 ---------------------------------------------------------------------------------

    async def _v2_model(self, method: str, parts: list[str], headers: dict[str, str], body: bytes) -> Response:
        name, version, action = _model_path(parts)
        repo = self._repo()
        if action is None:
            _allow(method, "GET")
            return _json(self._v2_metadata(repo, name, version))
        if action == "ready":
            _allow(method, "GET")
            repo.get(name, version)
            return _json({"name": name, "ready": True})
        if action == "infer":
            _allow(method, "POST")
            return await self._infer(_V2, repo.get(name, version), headers, body)
        raise NotFound(f"no route for {action!r} under /v2/models/{name}; use ready or infer")

    def _v2_metadata(self, repo: Repository, name: str, version: str | None) -> dict[str, Any]:
        model = repo.get(name, version)
        versions = [str(v) for v in repo.models[name]] if version is None else [str(model.version)]
        parameters = {
            "version": str(model.version),
            "variant": model.variant,
            "file": model.file,
            "providers": model.session.providers,
            "max_batch_size": self.config.batching.max_batch_size if model.session.batchable else 0,
        }
        if model.reload_error is not None:  # still serving what it had; its changed manifest was refused
            parameters["reload_error"] = model.reload_error
        if model.images.recorded:  # input name -> its recorded preprocessing (image inputs: how pictures feed them)
            parameters["preprocessing"] = model.images.recorded
        return v2.metadata(model.io, versions, parameters)

    # -- inference, every protocol ----------------------------------------------------------------

    async def _infer(self, protocol: Protocol, model: LoadedVersion, headers: dict[str, str], body: bytes) -> Response:
        """The one inference path: decode, check, batch and run, select the outputs asked for, encode.

        Counted in the model's metrics: a success with its time, or a failure (refused with a
        4xx/503, or a server fault); inline, a generator context manager cost ~1 us a request."""
        stats = self.metrics.model(model.name, model.version)
        if (record := current_request.get()) is not None:  # the access log's record of this request
            record.model, record.version = model.name, model.version
        started = time.perf_counter()
        try:
            decoded = protocol.decode(body, headers, model.io)
            settings = None
            if decoded.detections is not None:
                if model.detector is None:
                    raise not_a_detector(model.name, model.task)
                settings = model.detector.settings_for(decoded.detections)
            decoded.inputs, decoded.placements = await model.images.converted(
                decoded.inputs, model.session.input_by_name
            )
            wanted = _output_names(model, decoded.outputs, detections=settings is not None)
            rows = model.session.check_inputs(decoded.inputs)
            results = await model.batcher.infer(decoded.inputs, rows)
            if settings is not None:
                results = await self._detections(model, decoded, results, settings)
            payload, out_headers = protocol.encode(model.io, decoded, {name: results[name] for name in wanted})
        except Exception:
            stats.failed()
            raise
        stats.answered(time.perf_counter() - started)
        return 200, payload, out_headers

    async def _detections(
        self, model: LoadedVersion, decoded: Decoded, results: dict[str, np.ndarray], settings: Detection
    ) -> dict[str, np.ndarray]:
        """`results` with the detections outputs (boxes, scores, classes, labels, count) beside the raw ones:
        the head decoded (in a worker thread: NMS over thousands of anchors takes milliseconds), each
        picture's boxes mapped back to it."""
        assert model.detector is not None
        placements = placements_of(decoded.placements, list(model.session.input_by_name))
        detected = await asyncio.to_thread(model.detector.detect, results[model.detector.output], placements, settings)
        decoded.coordinates = detected.coordinates
        return {**results, **detected.arrays()}

    # -- TF Serving REST ---------------------------------------------------------------------------

    async def _v1_model(self, method: str, parts: list[str], headers: dict[str, str], body: bytes) -> Response:
        verb = next((v for v in _TF_VERBS if parts[-1].endswith(v)), None)  # ":predict" or ":classify"
        if verb:
            parts = [*parts[:-1], parts[-1].removesuffix(verb)]
        name, version, action = _model_path(parts)
        repo = self._repo()
        if verb and action is None:
            _allow(method, "POST")
            return await self._infer(_TF_VERBS[verb], repo.get(name, version), headers, body)
        if action is None:
            _allow(method, "GET")
            states = repo.states(name)
            if version is not None:
                number = version_number(version)
                if number not in states:
                    raise NotFound(f"model {name!r} has no version {version[:40]}; known: {sorted(states)}")
                states = {number: states[number]}
            return _json(tfserving.status(states))
        if action == "metadata":
            _allow(method, "GET")
            model = repo.get(name, version)
            return _json(tfserving.metadata(model.io, model.images.recorded))
        raise NotFound(f"no route for {action!r} under /v1/models/{name}; use :predict, :classify or metadata")


def _model_path(parts: list[str]) -> tuple[str, str | None, str | None]:
    """`[m]`, `[m, action]`, `[m, versions, v]`, `[m, versions, v, action]` -> (m, v, action)."""
    name, rest = parts[0], parts[1:]
    version = None
    if rest[:1] == ["versions"]:
        if len(rest) < 2 or not rest[1]:
            raise NotFound(f"missing version number after /models/{name}/versions/")
        version, rest = rest[1], rest[2:]
    if len(rest) > 1:
        raise NotFound(f"no route /{'/'.join(parts)}; see GET /openapi.json for the API")
    return name, version, rest[0] if rest else None


def _allow(method: str, allowed: str) -> None:
    if method != allowed:
        raise RequestError(f"method {method} is not allowed here; use {allowed}", 405, {"allow": allowed})


def _output_names(model: LoadedVersion, asked: list[str] | None, detections: bool = False) -> list[str]:
    """The outputs to answer with, in order: those asked for (each must exist), else every output; with
    detections, the detections outputs by default, and the raw ones by name too (a detections output's
    name wins over a raw output of the same name)."""
    valid = [s.name for s in model.session.outputs]
    if detections:
        valid = [*DETECTIONS, *(name for name in valid if name not in DETECTIONS)]
    if asked is None:
        return list(DETECTIONS) if detections else valid
    unknown = sorted(set(asked) - set(valid))
    if unknown:
        raise RequestError(f"unknown output(s) {unknown} requested; the model's outputs are {valid}")
    return asked


def create_app() -> ServeApp | AccessLog:
    """uvicorn factory for worker processes: the config arrives in PIPE_SERVE_CONFIG."""
    config = ServeConfig.from_env()
    logging.basicConfig(level=config.http.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = ServeApp(config)
    return AccessLog(app, config.http.access_log) if config.http.access_log else app
