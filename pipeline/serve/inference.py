"""The one inference path, every protocol's: decode, check, batch and run, select the outputs asked for, encode.

A protocol owns only the two ends (`protocols/base.py`); its handlers (`protocols/v2_handlers.py`,
`protocols/tfserving_handlers.py`) call `infer` with it, so V2, `:predict` and `:classify` requests
are counted, batched, timed and refused the same way.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from pipeline.artifact.manifest import Detection
from pipeline.serve.detections import not_a_detector, placements_of
from pipeline.serve.errors import Unavailable
from pipeline.serve.protocols.base import Decoded, Protocol
from pipeline.serve.recognition import OUTPUTS as TEXTS
from pipeline.serve.responses import Response
from pipeline.serve.routes import Request
from pipeline.serve.served_version import LoadedVersion
from pipeline.serve.state import ServeState
from pipeline.serve.timing import current_request

# Bodies larger than this are decoded in the inference pool, off the event loop: parsing 64 MB of JSON
# takes seconds that health probes and other requests must not wait; a small body decodes inline
# (about 50 us for a 1x784 FP32 request) rather than pay a thread hand-off.
INLINE_DECODE_BYTES = 256 * 1024


async def infer(state: ServeState, request: Request, protocol: Protocol) -> Response:
    """The one inference path: decode, check, batch and run, select the outputs asked for, encode.

    Counted in the model's metrics: a success with its time, or a failure (refused with a
    4xx/503, or a server fault); inline, a generator context manager cost ~1 us a request."""
    model = state.repo().get(request.model_name, request.version, request.label)
    stats = state.metrics.model(model.name, model.version)
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
            results = await _detections(model, decoded, results, settings, arrived)
        if model.recognizer is not None and not set(wanted).isdisjoint(TEXTS):  # the output read as text
            results = {**results, **model.recognizer.read(results[model.recognizer.output])}
        payload, out_headers = protocol.encode(model.io, decoded, {name: results[name] for name in wanted})
    except Exception:
        stats.failed()
        raise
    stats.answered(time.perf_counter() - started)
    return 200, payload, out_headers


async def _detections(
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
