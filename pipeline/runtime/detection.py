"""A detector's raw output -> boxes, and two sets of boxes matched: numpy only, shared by the verifier and serving.

The layout is Ultralytics' detection head (YOLOv8 and later, exported without NMS): one output
[batch, 4 + k, anchors] whose rows 0..3 are each anchor's box as centre x, centre y, width and
height in input pixels, and rows 4..4+k its k class scores (already sigmoid). `decode` does what
Ultralytics' `non_max_suppression` does with its defaults (one class per box, not class-agnostic):
a box's class is its best score, boxes whose best score is not above `confidence` are dropped, the
best `MAX_CANDIDATES` remain, NMS runs per class (a box overlapping a higher-scored box of its class
by more than `iou` is dropped), and the best `max_detections` are kept, highest score first.

NMS is bounded in time and memory whatever the settings (confidence 0 and iou 1 send every anchor
through it): it walks the boxes best first in blocks of `MATRIX_BOXES`, each block's IoUs with the
boxes kept so far and with itself computed at once (a few MB), and stops as soon as `max_detections`
are kept; a `deadline` (time.monotonic()) is checked between blocks and pictures, past which it
raises TimeoutError (the server's --timeout; 64 pictures at confidence 0 and iou 1 took 14.9 s and
+490 MB before).

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

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from pipeline.runtime.images import Placement

MAX_CANDIDATES = 30_000  # boxes entering NMS per picture, best first (Ultralytics' max_nms)
MATRIX_BOXES = 512  # NMS compares boxes in blocks of this many: each IoU matrix 512 x 512 (2 MB)
KEPT_ROWS = 4_096  # kept boxes compared with a block at once (an IoU matrix of at most 16 MB)


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


def decode(
    output: np.ndarray,
    confidence: float = 0.25,
    iou: float = 0.7,
    max_detections: int = 300,
    deadline: float | None = None,
) -> list[Boxes]:
    """Boxes per picture from a head output [batch, 4 + k, anchors] (see the module doc); TimeoutError once
    time.monotonic() passes `deadline`."""
    if problem := head_problem(output.shape):
        raise ValueError(problem)
    decoded = []
    for rows in output:
        _check_deadline(deadline)
        decoded.append(_decode_one(np.asarray(rows, np.float32), confidence, iou, max_detections, deadline))
    return decoded


def detect(
    output: np.ndarray,
    confidence: float,
    iou: float,
    max_detections: int,
    placements: Sequence[Placement | None] | None = None,
    deadline: float | None = None,
) -> list[Boxes]:
    """Each picture's boxes from a head output [batch, 4 + k, anchors], in the picture's pixels where its
    `placements[i]` says where it lay in the input (a letterbox undone), else in input pixels."""
    decoded = decode(output, confidence, iou, max_detections, deadline)
    if placements is None:
        return decoded
    if len(placements) != len(decoded):
        raise ValueError(f"{len(placements)} placements for {len(decoded)} pictures")
    return [boxes.mapped(placement) for boxes, placement in zip(decoded, placements, strict=True)]


def _decode_one(
    rows: np.ndarray, confidence: float, iou: float, max_detections: int, deadline: float | None = None
) -> Boxes:
    """rows [4 + k, N] (one picture's head output) -> the picture's boxes."""
    best = rows[4:].max(axis=0)  # [N]: along the contiguous rows, cheaper than an argmax over anchors first
    keep = np.flatnonzero(best > confidence)
    keep = keep[np.argsort(-best[keep], kind="stable")][:MAX_CANDIDATES]
    classes = rows[4:, keep].argmax(axis=0)  # the first best class, as argmax over each anchor's scores
    xyxy = cxcywh_to_xyxy(rows[:4, keep].T)
    kept = nms(xyxy, best[keep], classes, iou, max_detections, deadline)[:max_detections]
    return Boxes(xyxy[kept], best[keep][kept], classes[kept].astype(np.int64))


def _check_deadline(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise TimeoutError("decoding the detections ran past the request's deadline")


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


def nms(
    xyxy: np.ndarray,
    scores: np.ndarray,
    classes: np.ndarray,
    iou: float,
    limit: int | None = None,
    deadline: float | None = None,
) -> np.ndarray:
    """Indices of the boxes kept by greedy NMS within each class, highest score first (ties: lower index first);
    the first `limit` of them when given (the walk stops there).

    As Ultralytics does it: each class's boxes are shifted apart (by class x the boxes' whole span) so
    boxes of different classes never overlap, and one greedy pass runs over all of them, best first.
    The pass goes block by block (MATRIX_BOXES boxes): a box of the block is dropped when a box kept
    before the block overlaps it (one vectorized comparison), and then within the block by `_greedy`
    over the block's IoU matrix; every box of earlier blocks scores higher, so this is exactly the
    one-by-one greedy pass.
    """
    order = np.argsort(-scores, kind="stable")
    boxes = xyxy.astype(np.float64)[order]
    if len(boxes):
        span = float(boxes.max() - boxes.min()) + 1.0
        boxes += (classes[order].astype(np.float64) * span)[:, None]
    block = max(1, MATRIX_BOXES)
    kept: list[np.ndarray] = []  # indices into `boxes`, block by block
    kept_boxes = np.zeros((0, 4))
    for start in range(0, len(boxes), block):
        _check_deadline(deadline)
        candidates = np.arange(start, min(start + block, len(boxes)))
        candidates = candidates[~_overlapped(kept_boxes, boxes[candidates], iou)]
        chosen = candidates[_greedy(_overlaps(boxes[candidates], boxes[candidates], iou))]
        kept.append(chosen)
        kept_boxes = np.concatenate([kept_boxes, boxes[chosen]])
        if limit is not None and len(kept_boxes) >= limit:
            break
    taken = np.concatenate(kept) if kept else np.zeros(0, np.int64)
    return order[taken.astype(np.int64)][:limit]


def _overlapped(kept: np.ndarray, block: np.ndarray, iou: float) -> np.ndarray:
    """[len(block)] bool: whether any box of `kept` overlaps each box of `block` by more than `iou`."""
    hit = np.zeros(len(block), dtype=bool)
    for start in range(0, len(kept), KEPT_ROWS):
        hit |= _overlaps(kept[start : start + KEPT_ROWS], block, iou).any(axis=0)
    return hit


def _overlaps(a: np.ndarray, b: np.ndarray, iou: float) -> np.ndarray:
    """[n, m] bool: `iou_matrix(a, b) > iou`, as intersection > iou x union (no division, in place: about a
    third of iou_matrix's time, which NMS spends most of its time in)."""
    width = np.minimum(a[:, None, 2], b[None, :, 2])
    width -= np.maximum(a[:, None, 0], b[None, :, 0])
    np.maximum(width, 0, out=width)
    height = np.minimum(a[:, None, 3], b[None, :, 3])
    height -= np.maximum(a[:, None, 1], b[None, :, 1])
    np.maximum(height, 0, out=height)
    width *= height  # the intersections
    union = _area(a)[:, None] + _area(b)[None, :]
    union -= width
    return (width > iou * union) & (union > 0)


def _area(boxes: np.ndarray) -> np.ndarray:
    return np.clip(boxes[:, 2] - boxes[:, 0], 0, None) * np.clip(boxes[:, 3] - boxes[:, 1], 0, None)


def _greedy(overlaps: np.ndarray) -> np.ndarray:
    """Which boxes greedy NMS keeps, best first, given `overlaps` [n, n] (box i suppresses box j when
    overlaps[i, j]): each box in turn, kept unless a kept box suppressed it (one row read per kept box)."""
    suppressed = np.zeros(len(overlaps), dtype=bool)
    kept = []
    for i in range(len(overlaps)):
        if not suppressed[i]:
            kept.append(i)
            suppressed |= overlaps[i]
    return np.asarray(kept, dtype=np.int64)


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
