"""Detections as clients ask for them: a detector's raw head output decoded into boxes, scores and labels.

A request to a task `detection` model may ask for detections instead of the raw head tensor
([batch, 4 + classes, anchors]), which clients that decode themselves still get by default:

- KServe V2: request-level `"parameters": {"detections": true}`, optionally with `confidence`,
  `iou` and `max_detections` (scalars, as V2 parameters are);
- TF Serving `:predict`: the same four keys beside `instances` or `inputs`.

Each picture's boxes come from the one decoding (`pipeline/runtime/detection.py`: confidence,
per-class NMS, max detections, with the artifact's recorded settings unless the request overrides
them), mapped back to the picture's pixels through where it lay in the input (`Placement`: the
letterbox undone). A picture sent as a tensor has no placement: its boxes stay in input pixels, and
the answer says which (`coordinates`: `picture` or `input`).

V2 answers a batch of pictures with five outputs, padded to the most boxes any picture has (as the
TF Object Detection API answers): `boxes` FP32 [batch, n, 4] (x1, y1, x2, y2), `scores` FP32
[batch, n], `classes` INT64 [batch, n], `labels` BYTES [batch, n] and `count` INT64 [batch]; picture
i's boxes are its first `count[i]` rows, highest score first, and the padding is 0, -1 for a class
and "" for a label. TF Serving answers each picture's own lists (`Detected.per_picture`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import orjson

from pipeline.artifact.manifest import Detection, Manifest
from pipeline.runtime.detection import Boxes, detect
from pipeline.runtime.images import Placement
from pipeline.serve.errors import RequestError

OUTPUTS = ("boxes", "scores", "classes", "labels", "count")  # the V2 outputs of a detections answer, in order
SETTINGS = ("confidence", "iou", "max_detections")  # what a request may override
MAX_DETECTIONS = 100_000  # the most boxes a request may ask for per picture (pipe import's bound too)
PICTURE, INPUT = "picture", "input"  # the coordinates boxes are given in


@dataclass(frozen=True)
class Asked:
    """A request's ask for detections: the settings it overrides (None: the artifact's)."""

    confidence: float | None = None
    iou: float | None = None
    max_detections: int | None = None


def asked(values: dict[str, Any], where: str) -> Asked | None:
    """The detections a request asks for from its `values` (V2 request parameters, or a TF Serving request
    object; `where` prefixes the key names in errors), None when it asks for none; a 400 for a bad value."""
    wanted = values.get("detections", False)
    if not isinstance(wanted, bool):
        raise RequestError(f"{where}detections must be true or false, got {_shown(wanted)}")
    given = {key: values[key] for key in SETTINGS if key in values}
    if not wanted:
        if given:
            named = " and ".join(f"{where}{key}" for key in given)
            raise RequestError(
                f"{named} set how detections are decoded, and the request asks for none: add {where}detections: "
                "true, or leave them out"
            )
        return None
    for key in ("confidence", "iou"):
        if key in given:
            value = given[key]
            if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= 1:
                raise RequestError(f"{where}{key} must be a number from 0 to 1, got {_shown(value)}")
            given[key] = float(value)
    if "max_detections" in given:
        count = given["max_detections"]
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_DETECTIONS:
            raise RequestError(
                f"{where}max_detections must be a whole number from 1 to {MAX_DETECTIONS}, got {_shown(count)}"
            )
    return Asked(**given)


@dataclass(frozen=True)
class Detected:
    """The boxes of each picture of one request, and the coordinates they are in."""

    boxes: list[Boxes]
    labels: tuple[str, ...]  # class names, index = class
    coordinates: str  # PICTURE (the letterbox undone) or INPUT (the model's input pixels)

    def arrays(self) -> dict[str, np.ndarray]:
        """The V2 outputs (see the module doc): padded to the most boxes of any picture, with `count`."""
        batch, most = len(self.boxes), max((len(b) for b in self.boxes), default=0)
        boxes = np.zeros((batch, most, 4), np.float32)
        scores = np.zeros((batch, most), np.float32)
        classes = np.full((batch, most), -1, np.int64)
        labels = np.full((batch, most), "", dtype=object)
        for i, found in enumerate(self.boxes):
            n = len(found)
            boxes[i, :n], scores[i, :n], classes[i, :n] = found.xyxy, found.scores, found.classes
            labels[i, :n] = found.labels(self.labels)
        count = np.array([len(b) for b in self.boxes], np.int64)
        return {"boxes": boxes, "scores": scores, "classes": classes, "labels": labels, "count": count}

    def per_picture(self) -> list[dict[str, Any]]:
        """Each picture's `boxes`, `scores`, `classes` and `labels` as JSON lists (TF Serving's answer)."""
        return [found.as_dict(self.labels) for found in self.boxes]


@dataclass(frozen=True)
class Detector:
    """How a served detector's output becomes boxes: its head output, recorded settings and class names."""

    output: str  # the head output [batch, 4 + classes, anchors]
    settings: Detection  # the artifact's confidence, IoU and max detections: a request's defaults
    labels: tuple[str, ...]

    @classmethod
    def of(cls, manifest: Manifest) -> Detector | None:
        """The detector a task `detection` manifest describes; None for any other task."""
        if manifest.task != "detection" or manifest.detection is None:
            return None
        return cls(manifest.outputs[0].name, manifest.detection, tuple(manifest.labels))

    def settings_for(self, ask: Asked) -> Detection:
        """The recorded settings with the request's overrides on top."""
        given = {key: getattr(ask, key) for key in SETTINGS if getattr(ask, key) is not None}
        return replace(self.settings, **given)

    def detect(
        self, head: np.ndarray, placements: list[Placement] | None, settings: Detection, deadline: float | None = None
    ) -> Detected:
        """The head output's boxes, per picture, in the pictures' pixels when `placements` says where each lay;
        TimeoutError past `deadline` (time.monotonic())."""
        boxes = detect(head, settings.confidence, settings.iou, settings.max_detections, placements, deadline)
        return Detected(boxes, self.labels, PICTURE if placements is not None else INPUT)


def placements_of(placements: dict[str, list[Placement]], inputs: list[str]) -> list[Placement] | None:
    """Where each picture lay in the model's image input: the first input (in the model's order) that was
    sent as pictures; None when every input was sent as a tensor."""
    return next((placements[name] for name in inputs if name in placements), None)


def not_a_detector(name: str, task: str) -> RequestError:
    """The 400 for detections asked of a model that is not a detector."""
    return RequestError(
        f"model {name!r} is a {task} model; detections are answered by task detection models only (one "
        "output [batch, 4 + classes, anchors]): leave detections out"
    )


def _shown(value: Any) -> str:
    """A request's value as JSON writes it (true, not True), cut short."""
    try:
        return orjson.dumps(value).decode()[:40]
    except TypeError:
        return repr(value)[:40]
