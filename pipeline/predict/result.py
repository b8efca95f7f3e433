"""What a prediction shows: top-k labels for a classifier, boxes for a detector, otherwise each output's
shape and values.

A classifier's first output ([batch, classes]) is turned into probabilities with a softmax, unless
its rows already are a distribution (non-negative, summing to 1: a model ending in Softmax), and
each sample lists its k most likely classes by the manifest's labels (class indexes without them).
A detector's head output is decoded (pipeline/runtime/detection.py) into each sample's boxes, with
their scores and labels, in the picture's pixels when the input was a picture. A text recognizer's
output is read as each sample's text and confidence (pipeline/runtime/ctc.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.artifact.manifest import Detection, Manifest
from pipeline.core.arrays import Arrays
from pipeline.runtime.detection import Boxes

FIRST_VALUES = 8  # values of each output shown in the text view


@dataclass(frozen=True)
class Detections:
    """A detector's head output decoded: each sample's boxes, and how."""

    output: str  # the head output they were decoded from
    boxes: list[Boxes]  # per sample, highest score first
    coordinates: str  # "picture" (the letterbox undone) or "input" (the model's input pixels)
    settings: Detection  # the confidence, NMS IoU and max detections used

    def describe(self) -> str:
        s = self.settings
        return f"confidence > {s.confidence:g}, NMS IoU {s.iou:g}, at most {s.max_detections} per sample"


@dataclass(frozen=True)
class Texts:
    """A text recognizer's output read: each sample's text and confidence (greedy CTC decoding)."""

    output: str  # the output they were read from
    read: list[tuple[str, float]]  # per sample: (text, mean probability of its characters)


@dataclass
class Prediction:
    """The outputs of one run of one variant, and what is needed to read them."""

    artifact: str  # the version directory
    variant: str
    file: str
    format: str  # onnx | tflite
    manifest: Manifest
    outputs: Arrays
    notes: list[str] = field(default_factory=list)
    detections: Detections | None = None  # a detector's boxes
    texts: Texts | None = None  # a text recognizer's texts

    @property
    def classifier_output(self) -> str | None:
        """The output holding class scores, when the model is a classifier with [batch, classes] scores."""
        if self.manifest.task != "classification" or not self.outputs:
            return None
        name = self.manifest.outputs[0].name
        name = name if name in self.outputs else next(iter(self.outputs))  # a runner naming outputs its own way
        scores = self.outputs[name]
        return name if scores.ndim == 2 and scores.dtype.kind == "f" else None

    def top_k(self, k: int) -> list[list[dict[str, Any]]]:
        """Per sample, the k most likely classes: label, index, probability (most likely first)."""
        name = self.classifier_output
        if name is None:
            return []
        probs = probabilities(self.outputs[name])
        labels = self.manifest.labels
        k = min(k, probs.shape[1])
        ranked = np.argsort(-probs, axis=1, kind="stable")[:, :k]
        return [
            [
                {"label": labels[i] if i < len(labels) else str(i), "index": int(i), "probability": float(row[i])}
                for i in order
            ]
            for row, order in zip(probs, ranked, strict=True)
        ]

    def text(self, k: int) -> str:
        """The terminal view: a header, then top-k per sample or each output's shape and first values."""
        lines = [f"{self.artifact}: variant {self.variant} ({self.file}, {self.format})"]
        shown = self.classifier_output
        for i, classes in enumerate(self.top_k(k)):
            width = max(len(c["label"]) for c in classes)
            lines.append(f"sample {i}")
            lines += [f"  {c['label']:<{width}}  {c['probability']:.4f}" for c in classes]
        if (found := self.detections) is not None:
            lines += self._boxes_text(found)
            shown = found.output
        if (texts := self.texts) is not None:
            lines += [f"sample {i}: {text!r}  confidence {score:.4f}" for i, (text, score) in enumerate(texts.read)]
            shown = texts.output
        for name, array in self.outputs.items():
            if name == shown and texts is not None:
                lines.append(f"{name}: {array.dtype}{list(array.shape)}  (read above as text: greedy CTC decoding)")
            elif name == shown and found is not None:
                lines.append(f"{name}: {array.dtype}{list(array.shape)}  (decoded above: {found.describe()})")
            elif name != shown:
                values = ", ".join(_short(v) for v in array.reshape(-1)[:FIRST_VALUES].tolist())
                more = " ..." if array.size > FIRST_VALUES else ""
                lines.append(f"{name}: {array.dtype}{list(array.shape)}  {values}{more}")
        return "\n".join(lines)

    def _boxes_text(self, found: Detections) -> list[str]:
        where = "picture pixels, the letterbox undone" if found.coordinates == "picture" else "input pixels"
        lines = []
        for i, boxes in enumerate(found.boxes):
            lines.append(f"sample {i}: {len(boxes)} box{'es' if len(boxes) != 1 else ''} (x1, y1, x2, y2 in {where})")
            labels = boxes.labels(self.manifest.labels)
            width = max((len(label) for label in labels), default=0)
            for label, score, box in zip(labels, boxes.scores.tolist(), boxes.xyxy.tolist(), strict=True):
                lines.append(f"  {label:<{width}}  {score:.4f}  " + "  ".join(f"{v:8.1f}" for v in box))
        return lines

    def to_json(self, k: int) -> str:
        """Machine-readable: the variant, top_k per sample (classifiers), detections per sample (detectors),
        texts per sample (recognizers: text and confidence), and every output in full, but for the output
        detections or texts were read from (dtype and shape).

        Non-finite floats are written as null (JSON has no NaN).
        """
        found = self.detections
        described: dict[str, Any] = {
            "artifact": self.artifact,
            "variant": self.variant,
            "file": self.file,
            "format": self.format,
            "notes": self.notes,
            "top_k": self.top_k(k),
        }
        if found is not None:
            described["detections"] = [boxes.as_dict(self.manifest.labels) for boxes in found.boxes]
            described["coordinates"] = found.coordinates
            s = found.settings
            described["detection"] = {"confidence": s.confidence, "iou": s.iou, "max_detections": s.max_detections}
        if (texts := self.texts) is not None:
            described["texts"] = [{"text": text, "confidence": score} for text, score in texts.read]
        decoded = {found.output} if found is not None else {texts.output} if texts is not None else set()
        described["outputs"] = {
            name: {"dtype": str(a.dtype), "shape": list(a.shape)}
            | ({} if name in decoded else {"values": _json_values(a)})
            for name, a in self.outputs.items()
        }
        return json.dumps(described, indent=2)


def probabilities(scores: np.ndarray) -> np.ndarray:
    """Class probabilities per row: the rows themselves if they are a distribution, else a softmax."""
    scores = scores.astype(np.float64)
    if (scores >= 0).all() and np.allclose(scores.sum(axis=1), 1.0, atol=1e-3):
        return scores
    shifted = np.exp(scores - scores.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def _short(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _json_values(array: np.ndarray) -> Any:
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        values = array.astype(np.float64).astype(object)  # Python floats, and room for None
        values[~np.isfinite(array)] = None
        return values.tolist()
    if array.dtype.kind in "OS":
        return np.vectorize(lambda v: v.decode(errors="replace") if isinstance(v, bytes) else str(v))(array).tolist()
    return array.tolist()
