"""A detector's raw output -> boxes, and two sets of boxes matched: numpy only, shared by the verifier and serving.

The layout is Ultralytics' detection head (YOLOv8 and later, exported without NMS): one output
[batch, 4 + k, anchors] whose rows 0..3 are each anchor's box as centre x, centre y, width and
height in input pixels, and rows 4..4+k its k class scores (already sigmoid). `decode` does what
Ultralytics' `non_max_suppression` does with its defaults (one class per box, not class-agnostic):
a box's class is its best score, boxes whose best score is not above `confidence` are dropped, the
best `MAX_CANDIDATES` remain, NMS runs per class (a box overlapping a higher-scored box of its class
by more than `iou` is dropped), and the best `max_detections` are kept, highest score first.

`detect` is what a client is given (`pipe serve` with `detections`, `pipe predict`): each picture's
boxes mapped back from the model's input pixels to the picture's (`Placement`, recorded when the
picture was converted: a letterbox undone), named by the model's labels (`Boxes.as_dict`).

`match` pairs the boxes of two decodings of one picture, class by class, greedily by IoU (highest
first, each box used once), keeping pairs at `threshold` IoU or more: what `BoxAgreement`
(pipeline/verify/policies.py) judges a quantized or converted detector by.

This module is the one decoding of a detector's output: the server, `pipe predict` and the verifier
all call it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from pipeline.runtime.images import Placement

MAX_CANDIDATES = 30_000  # boxes entering NMS per picture, best first (Ultralytics' max_nms)
MATRIX_BOXES = 2_048  # NMS over at most this many boxes computes all their IoUs at once (32 MB)


@dataclass(frozen=True)
class Boxes:
    """The detections of one picture, highest score first."""

    xyxy: np.ndarray  # [n, 4] float32: x1, y1, x2, y2 in input pixels
    scores: np.ndarray  # [n] float32: the class score of each box
    classes: np.ndarray  # [n] int64: the class index of each box

    def __len__(self) -> int:
        return len(self.scores)

    def mapped(self, placement: Placement | None) -> Boxes:
        """These boxes in the picture's pixels (`placement`: where the picture lay in the input); as they
        are when None (the input was given as a tensor: boxes stay in input pixels)."""
        if placement is None:
            return self
        return Boxes(placement.to_original(self.xyxy).astype(np.float32), self.scores, self.classes)

    def labels(self, names: Sequence[str]) -> list[str]:
        """Each box's class name: `names[class]`, or the class index as text where `names` has none."""
        return [names[c] if 0 <= c < len(names) else str(c) for c in self.classes.tolist()]

    def as_dict(self, names: Sequence[str]) -> dict[str, Any]:
        """JSON-ready: `boxes` [[x1, y1, x2, y2], ...], `scores`, `classes` and `labels`, highest score first."""
        return {
            "boxes": self.xyxy.astype(np.float64).tolist(),
            "scores": self.scores.astype(np.float64).tolist(),
            "classes": self.classes.tolist(),
            "labels": self.labels(names),
        }


@dataclass(frozen=True)
class BoxMatch:
    """Two decodings of the same pictures compared: how many boxes each has and how many were paired."""

    reference: int  # boxes the reference found
    candidate: int  # boxes the candidate found
    matched: int  # pairs of one class at IoU >= the threshold, each box in one pair at most
    iou_sum: float  # the IoUs of those pairs, summed

    @property
    def agreement(self) -> float:
        """Pairs over the larger box count: a missed box and an extra box both count against it (1.0: both empty)."""
        larger = max(self.reference, self.candidate)
        return self.matched / larger if larger else 1.0

    @property
    def recall(self) -> float:
        """The fraction of the reference's boxes the candidate matched (1.0 when the reference has none)."""
        return self.matched / self.reference if self.reference else 1.0

    @property
    def mean_iou(self) -> float:
        """Mean IoU of the matched pairs (NaN when none matched)."""
        return self.iou_sum / self.matched if self.matched else float("nan")

    def __add__(self, other: BoxMatch) -> BoxMatch:
        return BoxMatch(
            self.reference + other.reference,
            self.candidate + other.candidate,
            self.matched + other.matched,
            self.iou_sum + other.iou_sum,
        )


def head_problem(shape: tuple[int, ...] | list[int]) -> str | None:
    """Why an array of `shape` is not an Ultralytics detection head's output, or None when it is one."""
    if len(shape) != 3 or shape[1] < 5:
        return f"shape {list(shape)} is not [batch, 4 + classes, anchors] with at least one class"
    return None


def decode(output: np.ndarray, confidence: float = 0.25, iou: float = 0.7, max_detections: int = 300) -> list[Boxes]:
    """Boxes per picture from a head output [batch, 4 + k, anchors] (see the module doc)."""
    if problem := head_problem(output.shape):
        raise ValueError(problem)
    return [_decode_one(np.asarray(rows, np.float32), confidence, iou, max_detections) for rows in output]


def detect(
    output: np.ndarray,
    confidence: float,
    iou: float,
    max_detections: int,
    placements: Sequence[Placement | None] | None = None,
) -> list[Boxes]:
    """Each picture's boxes from a head output [batch, 4 + k, anchors], in the picture's pixels where its
    `placements[i]` says where it lay in the input (a letterbox undone), else in input pixels."""
    decoded = decode(output, confidence, iou, max_detections)
    if placements is None:
        return decoded
    if len(placements) != len(decoded):
        raise ValueError(f"{len(placements)} placements for {len(decoded)} pictures")
    return [boxes.mapped(placement) for boxes, placement in zip(decoded, placements, strict=True)]


def _decode_one(rows: np.ndarray, confidence: float, iou: float, max_detections: int) -> Boxes:
    """rows [4 + k, N] (one picture's head output) -> the picture's boxes."""
    best = rows[4:].max(axis=0)  # [N]: along the contiguous rows, cheaper than an argmax over anchors first
    keep = np.flatnonzero(best > confidence)
    keep = keep[np.argsort(-best[keep], kind="stable")][:MAX_CANDIDATES]
    classes = rows[4:, keep].argmax(axis=0)  # the first best class, as argmax over each anchor's scores
    xyxy = cxcywh_to_xyxy(rows[:4, keep].T)
    kept = nms(xyxy, best[keep], classes, iou)[:max_detections]
    return Boxes(xyxy[kept], best[keep][kept], classes[kept].astype(np.int64))


def cxcywh_to_xyxy(boxes: np.ndarray) -> np.ndarray:
    """[n, 4] centre x, centre y, width, height -> [n, 4] x1, y1, x2, y2."""
    half = boxes[:, 2:4] / 2
    return np.concatenate([boxes[:, :2] - half, boxes[:, :2] + half], axis=1)


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box of `a` [n, 4] with every box of `b` [m, 4] (xyxy) -> [n, m]; an empty union gives 0."""
    a64, b64 = a.astype(np.float64)[:, None, :], b.astype(np.float64)[None, :, :]
    width = np.clip(np.minimum(a64[..., 2], b64[..., 2]) - np.maximum(a64[..., 0], b64[..., 0]), 0, None)
    height = np.clip(np.minimum(a64[..., 3], b64[..., 3]) - np.maximum(a64[..., 1], b64[..., 1]), 0, None)
    inter = width * height
    area_a = np.clip(a64[..., 2] - a64[..., 0], 0, None) * np.clip(a64[..., 3] - a64[..., 1], 0, None)
    area_b = np.clip(b64[..., 2] - b64[..., 0], 0, None) * np.clip(b64[..., 3] - b64[..., 1], 0, None)
    union = area_a + area_b - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def nms(xyxy: np.ndarray, scores: np.ndarray, classes: np.ndarray, iou: float) -> np.ndarray:
    """Indices of the boxes kept by greedy NMS within each class, highest score first (ties: lower index first).

    As Ultralytics does it: each class's boxes are shifted apart (by class x the boxes' whole span) so
    boxes of different classes never overlap, and one greedy pass runs over all of them, best first.
    Up to MATRIX_BOXES boxes every pair's IoU is computed at once and the pass only reads rows (0.1 ms
    for 300 boxes); past that, one IoU row per kept box.
    """
    order = np.argsort(-scores, kind="stable")
    boxes = xyxy.astype(np.float64)[order]
    if len(boxes):
        span = float(boxes.max() - boxes.min()) + 1.0
        boxes += (classes[order].astype(np.float64) * span)[:, None]
    kept: list[int] = []
    if len(boxes) <= MATRIX_BOXES:
        overlaps = iou_matrix(boxes, boxes) > iou  # [n, n]
        suppressed = np.zeros(len(boxes), dtype=bool)
        for i in range(len(boxes)):
            if not suppressed[i]:
                kept.append(i)
                suppressed |= overlaps[i]
    else:
        remaining = np.arange(len(boxes))
        while len(remaining):
            best, remaining = remaining[0], remaining[1:]
            kept.append(int(best))
            if len(remaining):
                remaining = remaining[iou_matrix(boxes[best : best + 1], boxes[remaining])[0] <= iou]
    return order[np.asarray(kept, dtype=np.int64)]


def match(reference: Boxes, candidate: Boxes, threshold: float = 0.5) -> BoxMatch:
    """Pair the boxes of two decodings of one picture, class by class (see the module doc)."""
    matched, iou_sum = 0, 0.0
    for cls in np.intersect1d(reference.classes, candidate.classes):
        ref = np.flatnonzero(reference.classes == cls)
        cand = np.flatnonzero(candidate.classes == cls)
        overlaps = iou_matrix(reference.xyxy[ref], candidate.xyxy[cand])
        pairs = np.argwhere(overlaps >= threshold)
        used_ref: set[int] = set()
        used_cand: set[int] = set()
        for i, j in pairs[np.argsort(-overlaps[pairs[:, 0], pairs[:, 1]], kind="stable")]:
            if i in used_ref or j in used_cand:
                continue
            used_ref.add(int(i))
            used_cand.add(int(j))
            matched += 1
            iou_sum += float(overlaps[i, j])
    return BoxMatch(len(reference), len(candidate), matched, iou_sum)


def compare_outputs(
    got: np.ndarray, want: np.ndarray, confidence: float, iou: float, max_detections: int, threshold: float = 0.5
) -> BoxMatch:
    """Decode both head outputs [batch, 4 + k, anchors] and match them picture by picture, summed."""
    total = BoxMatch(0, 0, 0, 0.0)
    for ref, cand in zip(
        decode(want, confidence, iou, max_detections), decode(got, confidence, iou, max_detections), strict=True
    ):
        total = total + match(ref, cand, threshold)
    return total
