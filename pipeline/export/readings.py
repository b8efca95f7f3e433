"""What `pipe import` records about what a model means: flags over the exporter's metadata, each with its source.

From the command line (`--task`, `--labels`, `--image-preprocessing`, `--input-shape`, the
detection settings) and what the exporter recorded (pipeline/export/conventions.py), this module
decides the task (pipeline/export/tasks.py), the labels, how pictures feed the image input, the
size generated golden inputs take, and the detection settings. A flag always wins over metadata.
Every decision is kept as a `Reading` (value and source) for `stages.import.read`, and every
metadata value set aside gets a one-line note. Labels are checked against the outputs once the
model has run (`check_labels`): a flag that does not fit is refused; metadata that does not fit
is ignored with a note.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline.artifact.manifest import Ctc, Detection
from pipeline.artifact.records import Reading
from pipeline.artifact.tensors import TensorSpec
from pipeline.core.arrays import Arrays
from pipeline.core.errors import InputError
from pipeline.export.conventions import LETTERBOX_PAD, Found
from pipeline.export.recognizer import paddle_dictionary, paddle_task, recognizer
from pipeline.export.tasks import DEFAULT_TASK, LABELLED, TEXT, choose_task, fit_problem, labels_problem
from pipeline.runtime.detection import head_problem
from pipeline.runtime.images import image_input, record_image_option

DETECTION_FLAGS = {"confidence": "--confidence", "iou": "--iou", "max_detections": "--max-detections"}


@dataclass
class Readings:
    """The import's decisions, with the source of each, and the notes to show."""

    task: str
    labels: list[str]
    detection: Detection | None
    ctc: Ctc | None = None  # a text recognizer's dictionary convention (task text-recognition)
    hints: dict[str, int] = field(default_factory=dict)  # symbolic dim -> the first size generated inputs try
    read: dict[str, Reading] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def check_labels(self, outputs: list[TensorSpec], golden: Arrays) -> None:
        """Labels against the classes the model really gives: a flag's refused, metadata's dropped with a note."""
        first = golden[outputs[0].name]
        if self.task == "detection" and (problem := head_problem(first.shape)):
            raise InputError(f"task detection: output {outputs[0].name!r} gives {problem}; the model is no detector "
                             "pipe can decode: pass --task tensor")  # fmt: skip
        classes = self.ctc.classes(len(self.labels)) if self.ctc is not None else None
        if classes is not None and first.ndim == 3 and first.shape[2] != classes:
            raise InputError(f"task text-recognition: output {outputs[0].name!r} gives {first.shape[2]} classes, but "
                             f"its dictionary makes {classes}; fix the graph's declared output shape")  # fmt: skip
        problem = labels_problem(self.task, self.labels, outputs, golden)
        if problem is None:
            return
        source = self.read["labels"].source
        if source.startswith("--"):
            raise InputError(problem)
        self.notes.append(f"{source} ignored: {problem}")
        self.labels = []
        del self.read["labels"]


def decide(
    found: Found,
    inputs: list[TensorSpec],
    outputs: list[TensorSpec],
    task: str | None,
    labels: list[str] | None,
    image_preprocessing: str | None,
    detection: dict[str, Any] | None,
) -> Readings:
    """Resolve flags over metadata (see the module doc); the specs' image preprocessing is set in place."""
    notes = list(found.notes)
    read: dict[str, Reading] = {}
    hints = _image(found, inputs, image_preprocessing, read, notes)
    metadata = (found.task, found.sources["task"]) if found.task else paddle_task(found, outputs)
    choice = choose_task(task, metadata, outputs)
    if labels and task is None and choice.task not in (*LABELLED, TEXT):  # labels name classes: the outputs hold none
        raise InputError(f"--labels given, but {fit_problem(DEFAULT_TASK, outputs)}; pass --task to say what it is")
    read["task"] = Reading(value=choice.task, source=choice.source)
    notes += choice.notes
    chosen: list[str] = []
    if labels:
        chosen = labels
        read["labels"] = Reading(value=len(labels), source="--labels")
    elif choice.task == TEXT:
        chosen = paddle_dictionary(found, read, notes)
    elif found.labels is not None and choice.task in LABELLED:
        chosen = found.labels
        read["labels"] = Reading(value=len(found.labels), source=found.sources["labels"])
    elif found.labels is not None:
        notes.append(f"{found.sources['labels']} ignored: a {choice.task} model's outputs hold no classes")
    if found.stride is not None:
        read["stride"] = Reading(value=found.stride, source=found.sources["stride"])
    settings = _detection(choice.task, detection or {}, found, read)
    ctc = None
    if choice.task == TEXT:
        source = read["labels"].source if "labels" in read else "the dictionary"
        ctc = recognizer(chosen, source, outputs, read, notes)
    order = ("task", "labels", "ctc", "image_size", "image", "stride", "detection")
    return Readings(choice.task, chosen, settings, ctc, hints, {k: read[k] for k in order if k in read}, notes)


def _detection(task: str, given: dict[str, Any], found: Found, read: dict[str, Reading]) -> Detection | None:
    """The detection settings: flags over Ultralytics' prediction defaults; flags for another task are refused."""
    given = {k: v for k, v in given.items() if v is not None}
    if task != "detection":
        if given:
            flags = ", ".join(DETECTION_FLAGS[k] for k in given)
            raise InputError(f"{flags} set how a detector's boxes are decoded; the task is {task}, not detection "
                             "(pass --task detection for a model with the Ultralytics head)")  # fmt: skip
        return None
    if unknown := sorted(set(given) - set(DETECTION_FLAGS)):
        raise InputError(f"unknown detection setting(s) {unknown}; the settings are {', '.join(DETECTION_FLAGS)}")
    for key in ("confidence", "iou"):
        value = given.get(key, 0.5)
        number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if not (number and 0 <= value <= 1):
            raise InputError(f"{DETECTION_FLAGS[key]} {value!r} is not a number from 0 to 1")
    if "max_detections" in given and not (type(given["max_detections"]) is int and given["max_detections"] >= 1):
        raise InputError(f"--max-detections {given['max_detections']!r} is not a whole number >= 1")
    settings = Detection(**given, stride=found.stride)
    flags = ", ".join(DETECTION_FLAGS[k] for k in given)
    rest = "Ultralytics' prediction defaults" if len(given) < len(DETECTION_FLAGS) else ""
    source = " and ".join(part for part in (flags, rest) if part)
    read["detection"] = Reading(value={k: v for k, v in asdict(settings).items() if v is not None}, source=source)
    return settings


def _image(
    found: Found, inputs: list[TensorSpec], flag: str | None, read: dict[str, Reading], notes: list[str]
) -> dict[str, int]:
    """How pictures feed the image input (the flag, else the exporter's letterbox) and the golden size hints."""
    if flag is not None:
        record_image_option(flag, inputs)
        (spec,) = [s for s in inputs if "image" in s.preprocessing]
        read["image"] = Reading(value=spec.preprocessing["image"], source="--image-preprocessing")
    if found.image_size is None:
        return {}
    if flag is not None:
        notes.append(f"{found.sources['image_size']} ignored: --image-preprocessing says how pictures are made")
        return {}
    images = [s for s in inputs if len(s.shape) == 4]
    if len(images) != 1:
        notes.append(f"{found.sources['image_size']} ignored: the model has {len(images)} four-dimensional inputs, "
                     "not one image input")  # fmt: skip
        return {}
    spec = images[0]
    axes = (1, 2) if spec.layout == "NHWC" else (2, 3)
    size = list(found.image_size)
    fixed = [spec.shape[a] for a in axes]
    if any(isinstance(d, int) and d != s for d, s in zip(fixed, size, strict=True)):
        notes.append(f"{found.sources['image_size']} ignored: input {spec.name!r} is fixed at "
                     f"{fixed[0]}x{fixed[1]}")  # fmt: skip
        if not all(isinstance(d, int) for d in fixed):
            return {}
        size = [int(d) for d in fixed]
    else:
        read["image_size"] = Reading(value=size, source=found.sources["image_size"])
    hints = {d: s for d, s in zip(fixed, size, strict=True) if isinstance(d, str)}
    if found.letterbox:
        _letterbox(spec, size, found, read, notes)
    return hints


def _letterbox(spec: TensorSpec, size: list[int], found: Found, read: dict[str, Reading], notes: list[str]) -> None:
    """Ultralytics' preprocessing on the image input: RGB, letterbox to `size` with pad 114, scale 1/255."""
    record = {"mode": "RGB", "letterbox": {"size": size, "pad": LETTERBOX_PAD}, "resize": "bilinear", "scale": 1 / 255}
    before = spec.preprocessing
    spec.preprocessing = {**before, "image": record}
    try:
        image_input(None, spec)
    except InputError as exc:
        spec.preprocessing = before
        notes.append(f"{found.sources['letterbox']} not recorded: {exc}")
        return
    read["image"] = Reading(value=record, source=found.sources["letterbox"])
