"""The KServe V2 routes' handlers: server metadata, a model's metadata and readiness, and inference.

Each is a function `(state, request)` that the route table (`app.ROUTES`) holds; the body codec is
`v2.py`, and inference goes through the one path every protocol takes (`inference.infer`).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from pipeline import __version__
from pipeline.serve.inference import infer
from pipeline.serve.protocols import v2
from pipeline.serve.protocols.v2 import V2
from pipeline.serve.responses import Response, json_response
from pipeline.serve.routes import Request
from pipeline.serve.state import ServeState

EXTENSIONS = ["binary_tensor_data", "classification"]  # the V2 extensions implemented here, by their Triton names
_V2 = V2()


async def server_metadata(state: ServeState, request: Request) -> Response:
    return json_response({"name": "pipe", "version": __version__, "extensions": EXTENSIONS})


async def model_metadata(state: ServeState, request: Request) -> Response:
    repo, name = state.repo(), request.model_name
    model = repo.get(name, request.version, request.label)
    unversioned = request.version is None and request.label is None
    versions = [str(v) for v in repo.models[name]] if unversioned else [str(model.version)]
    parameters = {
        "version": str(model.version),
        "variant": model.variant,
        "file": model.file,
        "providers": model.session.providers,
        "max_batch_size": state.config.batching.max_batch_size if model.session.batchable else 0,
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


async def model_ready(state: ServeState, request: Request) -> Response:
    repo = state.repo()
    repo.get(request.model_name, request.version, request.label)
    state.check_serving()
    answer: dict[str, Any] = {"name": request.model_name, "ready": True}
    if (labels_error := repo.label_errors.get(request.model_name or "")) is not None:
        answer["labels_error"] = labels_error  # ready, on the labels read before the file was refused
    return json_response(answer)


def model_infer(state: ServeState, request: Request) -> Awaitable[Response]:
    return infer(state, request, _V2)
