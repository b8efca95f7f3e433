"""Budgets: what a lossy candidate (fp16, int8, on every target) is held to, by the task, over the evaluation split.

A lossy hop is never judged element by element: fp16 moves a YOLOv8n's outputs by 0.35% (relative),
fp16's rounding, not a fault. It is held to a statistic of the task against its parent: `MetricDrop`
(the task metric may drop by at most so much), `Top1Agreement` (classifiers pick the same class),
`CosineAgreement` (embeddings point the same way: the rows on average and the worst row),
`RelativeError` (regression values stay close as a whole), `BoxAgreement` (a detector finds the same
boxes: decoded, then matched per class by IoU), `TextAgreement` (a recognizer reads the same texts)
and `TensorAgreement` (any other model, output by output: cosine for unit-vector outputs, relative
error otherwise). A statistic over many samples decides on the whole split (`over_split`).
`pipeline/verify/choose.py:hop_policy` picks the budget of a hop, with the defaults below.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from pipeline.artifact.directions import metric_drop
from pipeline.runtime.detection import compare_outputs, head_problem
from pipeline.verify.metrics import SLACK
from pipeline.verify.policies import Judgement, Policy, figures, non_negative, unmeasured, within

DEFAULT_MAX_DROP = 0.01  # task metric: at most 1 accuracy point lost
DEFAULT_MIN_AGREEMENT = 0.99  # classifiers: at most 1 sample in 100 changes its predicted class
# embeddings: the rows on average within about 8 degrees of the reference's, and no row beyond 26 degrees
DEFAULT_MEAN_COSINE = 0.99
DEFAULT_MIN_COSINE = 0.9
DEFAULT_MAX_REL = 0.01  # regression: error at most 1% of the reference outputs' size
DEFAULT_MIN_MATCHED = 0.9  # detectors: at least 9 boxes in 10 found again (same class, IoU >= 0.5)
MATCH_IOU = 0.5  # detectors: two boxes of one class are the same object at this IoU or more
UNIT_NORM = 1e-3  # tensor outputs: rows whose L2 norm is within this of 1 are directions (cosine judges them)


@dataclass(frozen=True)
class MetricDrop(Policy):
    """Lossy hops with targets: the task metric may drop by at most `max_drop` (for MAE, rise).

    The outputs are checked for shape and NaN/Inf only: the metric over the split is the budget.
    """

    name: ClassVar[str] = "metric drop"
    needs_metric: ClassVar[bool] = True
    max_drop: float = DEFAULT_MAX_DROP

    def __post_init__(self) -> None:
        non_negative(self, "max_drop")

    def compare(self, got: np.ndarray, want: np.ndarray) -> Judgement:
        return Judgement(True, "", *figures(got, want))

    def judge_metric(self, metric: str, reference: float, candidate: float) -> Judgement:
        drop = metric_drop(metric, reference, candidate)
        if drop <= self.max_drop + SLACK:
            return Judgement(True, f"drop {drop:.4g} within budget {self.max_drop:g}")
        return Judgement(False, f"drops by {drop:.4g} > budget {self.max_drop:g}")


@dataclass(frozen=True)
class Top1Agreement(Policy):
    """Classifiers: the share of predictions (argmax of the last axis) equal to the reference's."""

    name: ClassVar[str] = "top-1 agreement"
    over_split: ClassVar[bool] = True
    min_agreement: float = DEFAULT_MIN_AGREEMENT

    def __post_init__(self) -> None:
        within(self, "min_agreement", 0.0, 1.0)

    def compare(self, got: np.ndarray, want: np.ndarray) -> Judgement:
        if empty := unmeasured(self, want):
            return empty
        # [batch, classes] or [batch, sequence, classes]: one prediction per position; [batch]: labels already
        top_got = got.argmax(axis=-1) if got.ndim >= 2 else got
        top_want = want.argmax(axis=-1) if want.ndim >= 2 else want
        differ = int((top_got != top_want).sum())
        agreement = 1.0 - differ / top_want.size
        passed = agreement >= self.min_agreement
        detail = f"agreement {agreement:.4f} ({differ} of {top_want.size} differ), budget >= {self.min_agreement:g}"
        return Judgement(passed, detail, *figures(got, want))


@dataclass(frozen=True)
class CosineAgreement(Policy):
    """Embeddings (and tensor outputs whose rows are unit vectors): each row's cosine to the reference's, the mean
    at least `mean_cosine` and the worst row at least `min_cosine`.

    An embedding's user compares rows with each other (search, clustering): what matters is that rows keep
    their directions as a whole, which the mean holds, and that no row is turned away from its text, which
    the worst row holds. Judged by the worst row alone at 0.99, no int8 of the real all-MiniLM-L6-v2 passed
    (per channel: mean 0.992, worst 0.955 on "Thank you very much"), while per tensor (mean 0.960, worst 0.805)
    and static int8 (mean 0.40) are refused by both bounds (docs/gates.md "Embeddings"). Each row's nearest
    other row, kept or not, is shown beside (`neighbours_kept`); it does not decide: on 64 unrelated sentences
    the runner-up is often within 0.001 of the nearest, and rounding swaps them.
    """

    name: ClassVar[str] = "cosine"
    over_split: ClassVar[bool] = True
    min_cosine: float = DEFAULT_MIN_COSINE
    mean_cosine: float = DEFAULT_MEAN_COSINE

    def __post_init__(self) -> None:
        within(self, "min_cosine", -1.0, 1.0)
        within(self, "mean_cosine", -1.0, 1.0)

    def compare(self, got: np.ndarray, want: np.ndarray) -> Judgement:
        if empty := unmeasured(self, want):
            return empty
        _, margin, detail = self.statistic(got, want)
        return Judgement(margin >= -SLACK, detail, *figures(got, want))

    def statistic(self, got: np.ndarray, want: np.ndarray) -> tuple[float, float, str]:
        """(mean cosine, margin over the nearer of the two bounds, one line) on one output."""
        cosines = row_cosines(got, want)
        mean, worst = float(cosines.mean()), float(cosines.min())
        margin = min(mean - self.mean_cosine, worst - self.min_cosine)
        kept = neighbours_kept(got, want)
        shown = "" if np.isnan(kept) else (f"; nearest other row kept by {round(kept * len(cosines))} of "
                                           f"{len(cosines)} rows")  # fmt: skip
        detail = (f"cosine mean {mean:.6f} (budget >= {self.mean_cosine:g}), worst row {worst:.6f} (budget >= "
                  f"{self.min_cosine:g}){shown}")  # fmt: skip
        return mean, margin, detail


@dataclass(frozen=True)
class RelativeError(Policy):
    """Regression: ||got - want|| / ||want|| over the whole output (L2) at most `max_rel`.

    Relative to the output as a whole, not per element: a value near zero does not make a
    small, harmless error look huge.
    """

    name: ClassVar[str] = "relative error"
    over_split: ClassVar[bool] = True
    max_rel: float = DEFAULT_MAX_REL

    def __post_init__(self) -> None:
        non_negative(self, "max_rel")

    def compare(self, got: np.ndarray, want: np.ndarray) -> Judgement:
        if empty := unmeasured(self, want):
            return empty
        error = float(np.linalg.norm(got - want))
        scale = float(np.linalg.norm(want))
        relative = error / scale if scale else (0.0 if error == 0 else float("inf"))
        detail = f"relative error {relative:.4g} (L2), budget <= {self.max_rel:g}"
        return Judgement(relative <= self.max_rel, detail, *figures(got, want))


@dataclass(frozen=True)
class BoxAgreement(Policy):
    """Detectors (task detection): both outputs decoded into boxes as the artifact records (confidence, per-class
    NMS at `iou`, `max_detections`; pipeline/runtime/detection.py) and matched per class at IoU >= `match_iou`;
    the pairs over the larger box count (a missed box and an extra one both count) reach `min_matched`.

    A batch where neither side finds a box passes (nothing to match); over the whole split, a reference
    with no box at all leaves the budget unmeasured, and the gate fails it (`split_metric`: NaN).
    """

    name: ClassVar[str] = "box agreement"
    over_split: ClassVar[bool] = True
    min_matched: float = DEFAULT_MIN_MATCHED
    match_iou: float = MATCH_IOU
    confidence: float = 0.25
    iou: float = 0.7
    max_detections: int = 300

    def __post_init__(self) -> None:
        within(self, "min_matched", 0.0, 1.0)
        within(self, "match_iou", 0.0, 1.0)

    def compare(self, got: np.ndarray, want: np.ndarray) -> Judgement:
        if problem := head_problem(want.shape):
            return Judgement(False, f"the box agreement budget cannot judge it: {problem}")
        boxes = compare_outputs(got, want, self.confidence, self.iou, self.max_detections, self.match_iou)
        if not boxes.reference and not boxes.candidate:
            nothing = f"no box above confidence {self.confidence:g} on either side: nothing to match"
            return Judgement(True, nothing, *figures(got, want))
        detail = (
            f"boxes matched {boxes.matched} of {boxes.reference} reference ({boxes.recall:.4f}), {boxes.candidate} "
            f"candidate (IoU >= {self.match_iou:g}, same class): agreement {boxes.agreement:.4f}, mean IoU "
            f"{boxes.mean_iou:.4f}, budget >= {self.min_matched:g}"
        )
        return Judgement(boxes.agreement >= self.min_matched - SLACK, detail, *figures(got, want))

    def split_metric(self, got: np.ndarray, want: np.ndarray) -> tuple[str, float] | None:
        if head_problem(want.shape):
            return None
        boxes = compare_outputs(got, want, self.confidence, self.iou, self.max_detections, self.match_iou)
        return "box_agreement", boxes.agreement if boxes.reference else float("nan")

    def statistic(self, got: np.ndarray, want: np.ndarray) -> tuple[float, float, str]:
        """(agreement, margin over the budget, one line) on one output: what `pipe optimize` ranks candidates by."""
        boxes = compare_outputs(got, want, self.confidence, self.iou, self.max_detections, self.match_iou)
        if not boxes.reference:
            return float("nan"), float("-inf"), f"no reference box above confidence {self.confidence:g}: unmeasured"
        detail = f"box agreement {boxes.agreement:.4f}, mean IoU {boxes.mean_iou:.4f} (budget >= {self.min_matched:g})"
        return boxes.agreement, boxes.agreement - self.min_matched, detail


@dataclass(frozen=True)
class TensorAgreement(Policy):
    """Any other model (task tensor), output by output, by what fits the output: one whose reference rows (first
    axis, the rest flattened) are all unit vectors (a normalized embedding: only its direction means
    anything) by per-row cosine, the minimum at least `min_cosine`; any other by relative error (L2 over
    the whole output, at most `max_rel`), which holds values and their scale.
    """

    name: ClassVar[str] = "tensor agreement"
    over_split: ClassVar[bool] = True
    max_rel: float = DEFAULT_MAX_REL
    min_cosine: float = DEFAULT_MIN_COSINE
    mean_cosine: float = DEFAULT_MEAN_COSINE

    def __post_init__(self) -> None:
        non_negative(self, "max_rel")
        within(self, "min_cosine", -1.0, 1.0)
        within(self, "mean_cosine", -1.0, 1.0)

    def chosen(self, want: np.ndarray) -> Policy:
        """The budget that fits this output: CosineAgreement for unit-vector rows, else RelativeError."""
        rows = want.reshape(len(want), -1) if want.ndim else want.reshape(1, -1)
        norms = np.linalg.norm(rows, axis=1)
        unit = rows.shape[1] >= 2 and bool(np.all(np.abs(norms - 1.0) <= UNIT_NORM))
        return CosineAgreement(self.min_cosine, self.mean_cosine) if unit else RelativeError(self.max_rel)

    def compare(self, got: np.ndarray, want: np.ndarray) -> Judgement:
        if empty := unmeasured(self, want):
            return empty
        judged = self.chosen(want).compare(got, want)
        return replace(judged, detail=judged.detail + mask_overlap(got, want))

    def statistic(self, got: np.ndarray, want: np.ndarray) -> tuple[float, float, str]:
        """(figure, margin over the budget, one line) on one output, by the budget that fits it."""
        chosen = self.chosen(want)
        if isinstance(chosen, CosineAgreement):
            return chosen.statistic(got, want)
        scale = float(np.linalg.norm(want)) or 1.0
        relative = float(np.linalg.norm(got - want)) / scale
        detail = f"relative error {relative:.4g} (budget <= {self.max_rel:g}){mask_overlap(got, want)}"
        return relative, self.max_rel - relative, detail


MASK_AT = 0.5  # a probability map's pixels at or above this are the mask a user thresholds it into


def mask_overlap(got: np.ndarray, want: np.ndarray) -> str:
    """Shown beside a probability map's relative error (a text detector's [N, 1, H, W] in 0..1): both thresholded at
    MASK_AT, the IoU of the two masks, a figure its user reads. '' for any other output (or no mask to compare)."""
    if want.ndim < 3 or not want.size or float(want.min()) < 0.0 or float(want.max()) > 1.0:
        return ""
    a, b = got >= MASK_AT, want >= MASK_AT
    union = int((a | b).sum())
    if not union:
        return ""
    return f"; thresholded at {MASK_AT:g}, the masks' IoU {int((a & b).sum()) / union:.4f}"


def row_cosines(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row (first axis, the rest flattened); two zero rows agree (1), one does not (0)."""
    a = got.reshape(len(got), -1) if got.ndim else got.reshape(1, -1)
    b = want.reshape(len(want), -1) if want.ndim else want.reshape(1, -1)
    norm_a, norm_b = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    norms = norm_a * norm_b
    dots = (a * b).sum(axis=1)
    both_zero = (norm_a == 0) & (norm_b == 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        cosines = np.where(norms > 0, dots / np.where(norms > 0, norms, 1.0), 0.0)
    return np.where(both_zero, 1.0, cosines)


def neighbours_kept(got: np.ndarray, want: np.ndarray) -> float:
    """The share of rows whose nearest other row (by cosine) is the same under `got` as under `want`: a search
    over the rows themselves. NaN with fewer than 3 rows (one other row is always the nearest)."""
    if len(want) < 3:
        return float("nan")

    def nearest(rows: np.ndarray) -> np.ndarray:
        flat = rows.reshape(len(rows), -1)
        norms = np.linalg.norm(flat, axis=1, keepdims=True)
        unit = flat / np.where(norms > 0, norms, 1.0)
        similarity = unit @ unit.T
        np.fill_diagonal(similarity, -np.inf)
        return similarity.argmax(axis=1)

    return float(np.mean(nearest(got) == nearest(want)))


DEFAULT_MIN_TEXT_AGREEMENT = 0.95  # text recognizers: at most 1 text in 20 read otherwise (docs/optimize.md)


@dataclass(frozen=True)
class TextAgreement(Policy):
    """Text recognizers (task text-recognition): both outputs read as text (greedy CTC decoding, blank 0;
    pipeline/runtime/ctc.py) and compared text by text; at most `allowed(texts)` texts read otherwise.

    One rule, `allowed`, for the gate's verdict (edge and optimize alike) and optimize's ranking: the
    budget's share of the texts, rounded down, and at least one while `min_agreement` is under 1. A split
    too small for the share to allow one changed text (under 1 / (1 - min_agreement) texts: 20 at 0.95)
    would otherwise demand every text read the same, a stricter budget than the one set; `min_agreement` 1
    allows none. The character error rate is shown beside.
    """

    name: ClassVar[str] = "text agreement"
    over_split: ClassVar[bool] = True
    min_agreement: float = DEFAULT_MIN_TEXT_AGREEMENT

    def __post_init__(self) -> None:
        within(self, "min_agreement", 0.0, 1.0)

    def allowed(self, texts: int) -> int:
        """How many of `texts` may read otherwise; see the class doc."""
        return max(int((1.0 - self.min_agreement) * texts + SLACK), int(self.min_agreement < 1.0))

    def compare(self, got: np.ndarray, want: np.ndarray) -> Judgement:
        if empty := unmeasured(self, want):
            return empty
        if want.ndim != 3:
            shape = list(want.shape)
            return Judgement(False, f"the text agreement budget reads [batch, positions, classes], got {shape}")
        _, margin, detail = self.statistic(got, want)
        return Judgement(margin >= 0, detail, *figures(got, want))

    def split_metric(self, got: np.ndarray, want: np.ndarray) -> tuple[str, float] | None:
        return ("text_agreement", _texts(got, want).agreement) if want.ndim == 3 else None

    def statistic(self, got: np.ndarray, want: np.ndarray) -> tuple[float, float, str]:
        """(agreement, margin, one line) on one output: the gate's verdict and what `pipe optimize` ranks by. The
        margin is the texts still allowed to differ, as a share of the texts (< 0: more differ than allowed)."""
        read = _texts(got, want)
        allowed, differ = self.allowed(read.texts), read.texts - read.exact
        margin = (allowed - differ) / read.texts if read.texts else float("-inf")
        detail = (f"texts equal {read.exact} of {read.texts} ({read.agreement:.4f}), character error rate "
                  f"{read.cer:.4f}; budget >= {self.min_agreement:g}: at most {allowed} of {read.texts} read "
                  "otherwise")  # fmt: skip
        return read.agreement, margin, detail


def _texts(got: np.ndarray, want: np.ndarray) -> Any:
    """The candidate's texts against the reference's (pipeline/runtime/ctc.py `TextFigures`)."""
    from pipeline.runtime.ctc import greedy, text_figures

    return text_figures([r.classes for r in greedy(got)], [r.classes for r in greedy(want)])
