"""The TF Serving REST routes' handlers: `:predict`, `:classify`, a model's metadata and its status.

Each is a function `(state, request)` that the route table (`app.ROUTES`) holds; the body codecs are
`tfserving.py` and `tfclassify.py`, and inference goes through the one path every protocol takes
(`inference.infer`). A text-generation model's status is also OpenAI's model object, so the OpenAI
client's `models.retrieve`, which reads the same path, works.
"""

from __future__ import annotations

from collections.abc import Awaitable

from pipeline.serve.errors import NotFound
from pipeline.serve.inference import infer
from pipeline.serve.protocols import tfserving
from pipeline.serve.protocols.tfclassify import TFClassify
from pipeline.serve.protocols.tfserving import TFServing
from pipeline.serve.responses import Response, json_response
from pipeline.serve.routes import Request
from pipeline.serve.served_version import version_number
from pipeline.serve.state import ServeState

_TF_SERVING, _TF_CLASSIFY = TFServing(), TFClassify()


def tf_predict(state: ServeState, request: Request) -> Awaitable[Response]:
    return infer(state, request, _TF_SERVING)


def tf_classify(state: ServeState, request: Request) -> Awaitable[Response]:
    return infer(state, request, _TF_CLASSIFY)


async def tf_metadata(state: ServeState, request: Request) -> Response:
    model = state.repo().get(request.model_name, request.version, request.label)
    return json_response(tfserving.metadata(model.io, model.images.recorded))


async def tf_status(state: ServeState, request: Request) -> Response:
    name, version = request.model_name, request.version
    versions = state.repo().states(name)  # version -> (served, why not)
    if request.label is not None:
        version = str(state.repo().get(name, None, request.label).version)
    if version is not None:
        number = version_number(version)
        if number not in versions:
            raise NotFound(f"model {name!r} has no version {version[:40]}; known: {sorted(versions)}")
        versions = {number: versions[number]}
    answer = tfserving.status(versions)
    generation = state.generation
    if request.version is None and request.label is None and name in generation.generation_models():
        answer = {**generation.model_object(name), **answer}  # OpenAI's retrieve reads the same path
    return json_response(answer)
