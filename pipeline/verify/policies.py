"""Gate policies: what "the candidate computes what its reference computes" means for one hop.

A lossless hop (torch -> ONNX, an import, a graph-only optimization, fp32 TFLite) is held to
`Exact`: each output's values within atol x the output's scale + rtol x |value|, but for at most
1 in 10,000 of them and none beyond 10x, and the task metric within a small tolerance. A lossy
hop (int8, fp16 on every target) is held to a budget against its parent, over the evaluation
split: `MetricDrop` (the task metric may drop by at most so much), `Top1Agreement` (classifiers
pick the same class), `MinCosine` (embeddings point the same way), `RelativeError` (regression values stay
close as a whole), `BoxAgreement` (a detector finds the same boxes: decoded, then matched per
class by IoU) and `TensorAgreement` (any other model, output by output: cosine for unit-vector
outputs, relative error otherwise). `pipeline/verify/choose.py:hop_policy` picks the policy of a
hop, with the defaults below.

NaN or Inf on either side fails whatever the policy: the gate checks that before a policy judges.
"""

from __future__ import annotations

import math
import warnings
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np

from pipeline.artifact.directions import IN_TARGET_UNITS, metric_drop
from pipeline.core.errors import InputError
from pipeline.runtime.detection import compare_outputs, head_problem
from pipeline.verify.metrics import SLACK

DEFAULT_MAX_DROP = 0.01  # task metric: at most 1 accuracy point lost
DEFAULT_MIN_AGREEMENT = 0.99  # classifiers: at most 1 sample in 100 changes its predicted class
DEFAULT_MIN_COSINE = 0.99  # embeddings: every row within about 8 degrees of the reference's
DEFAULT_MAX_REL = 0.01  # regression: error at most 1% of the reference outputs' size
DEFAULT_MIN_MATCHED = 0.9  # detectors: at least 9 boxes in 10 found again (same class, IoU >= 0.5)
MATCH_IOU = 0.5  # detectors: two boxes of one class are the same object at this IoU or more
UNIT_NORM = 1e-3  # tensor outputs: rows whose L2 norm is within this of 1 are directions (cosine judges them)
# lossless hops: at most 1 value in 10,000 of an output out of tolerance, and none beyond 10x it. A real
# recognizer's fp32 TFLite had 2 of 4,240,000 softmax values (5e-7) just past 1e-4, texts identical
DEFAULT_MAX_SHARE = 1e-4
DEFAULT_HARD = 10.0
REL_FLOOR = 1e-4  # the max-rel figure of budgeted policies divides by at least this (as Exact's atol)


@dataclass(frozen=True)
class Judgement:
    """A policy's verdict on one comparison, with the figures every row shows."""

    passed: bool
    detail: str = ""  # the policy's statistic and its bound; empty for a passing Exact comparison
    max_abs: float | None = None
    max_rel: float | None = None
    share: float | None = None  # element-wise policies: the share of values out of tolerance
    worst: float | None = None  # element-wise policies: the worst value's difference over its tolerance


class Policy(ABC):
    """How the gate judges a candidate's outputs and its task metric against the reference."""

    name: ClassVar[str]
    # Whether the output statistic is also judged over the whole evaluation split: budgets are
    # statistics over many samples, and the split is the largest sample the gate has.
    over_split: ClassVar[bool] = False
    # Whether the budget is the task metric itself: without targets (or for a task with no metric)
    # the gate then fails, rather than pass a candidate nothing measured.
    needs_metric: ClassVar[bool] = False

    @abstractmethod
    def compare(self, got: np.ndarray, want: np.ndarray) -> Judgement:
        """Judge one output on one batch (float64 arrays of the same shape)."""

    def judge_metric(self, metric: str, reference: float, candidate: float) -> Judgement:
        """Judge the task metric over the evaluation split; by default it is reported, not judged."""
        return Judgement(True, f"reported; the {self.name} policy judges the outputs")

    def split_metric(self, got: np.ndarray, want: np.ndarray) -> tuple[str, float] | None:
        """The policy's own figure over the whole split, recorded as the candidate's metric where the task has
        none (BoxAgreement: `box_agreement`); NaN when the split gives it nothing to measure. None: no figure."""
        return None

    def to_dict(self) -> dict[str, Any]:
        """The policy as a stage record stores it: its name and its bounds."""
        return {"policy": self.name, **asdict(self)}  # every concrete policy is a dataclass


@dataclass(frozen=True)
class Exact(Policy):
    """Lossless hops: every output's values within atol x its scale + rtol x |value|, but for a documented few.

    Each value's tolerance is `atol * scale + rtol * |want|`, where `scale` is the output's own size
    (its largest |reference| value, at least 1: a softmax's 1, logits' 20, a price's 500,000), so
    float32's rounding of a large output is not held to an absolute 1e-4. A lossless hop passes when at
    most `max_share` of an output's values are out of tolerance and none is beyond `hard` times its
    tolerance: 2 of 4,240,000 softmax values of a real recognizer's fp32 TFLite just past 1e-4 (texts
    identical) pass; a wrong conversion (a transposed axis, a broken op) moves far more values, and
    far further. The task metric stays within `metric` on the evaluation split (`judge_metric`).
    """

    name: ClassVar[str] = "exact"
    atol: float = 1e-4  # a value's absolute difference allowed, in units of its output's scale (largest |value|, >= 1)
    rtol: float = 1e-3  # plus this fraction of the value's own magnitude
    metric: float = 1e-3  # |metric(candidate) - metric(reference)| allowed
    max_share: float = DEFAULT_MAX_SHARE  # of an output's values, at most this share may be out of tolerance
    hard: float = DEFAULT_HARD  # and none may be beyond this many times its tolerance

    def __post_init__(self) -> None:
        _non_negative(self, "atol", "rtol", "metric")
        _within(self, "max_share", 0.0, 1.0)
        _within(self, "hard", 1.0, math.inf)

    def compare(self, got: np.ndarray, want: np.ndarray) -> Judgement:
        # Two output-sized float64 temporaries at most (a 64 x 40 x 6625 softmax is 136 MB each): in place where
        # an array is not needed again, and the ratio to the tolerance only for the values out of it.
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            diff = np.subtract(got, want)
            np.abs(diff, out=diff)
            scale = output_scale(want)
            tolerance = np.abs(want)
            max_rel = _max_ratio(diff, np.maximum(tolerance, self.atol, out=tolerance))
            np.abs(want, out=tolerance)
            tolerance *= self.rtol
            tolerance += self.atol * scale
            over = diff > tolerance
            ratio = diff[over] / tolerance[over]  # a zero tolerance gives inf for a value over it
        count, size = int(over.sum()), int(over.size)
        share = count / size if size else 0.0
        worst = _max(ratio) if count else 0.0
        passed = share <= self.max_share and worst <= self.hard
        detail = ""
        if count:
            bound = f"atol {self.atol:g}" + (f" x scale {scale:.4g}" if scale != 1.0 else "")
            detail = (
                f"{count} of {size} values ({share:.2g}) exceed {bound} + rtol {self.rtol:g}*|ref|, the worst "
                f"{worst:.3g}x its tolerance; allowed: at most {self.max_share:g} of the values, none beyond "
                f"{self.hard:g}x"
            )
        return Judgement(passed, detail, _max(diff), max_rel, share, worst)

    def judge_metric(self, metric: str, reference: float, candidate: float) -> Judgement:
        # a metric in the target's units (a house price's MAE in USD) gets rtol of its size on top, as an
        # element does: float32 alone moves an MAE of 21,396.50 by 0.002, past any fixed 0.001
        scaled = metric in IN_TARGET_UNITS and self.rtol > 0
        tolerance = self.metric + (self.rtol * abs(reference) if scaled else 0.0)
        difference = abs(candidate - reference)
        if difference <= tolerance:
            return Judgement(True)
        shown = f"{tolerance:.4g} ({self.metric:g} + rtol {self.rtol:g}*|ref|)" if scaled else f"{self.metric:g}"
        return Judgement(False, f"differs by {difference:.4g} > tolerance {shown}")


def output_scale(want: np.ndarray) -> float:
    """An output's own size, which a lossless hop's atol is in units of: its largest |value|, at least 1."""
    if not want.size:
        return 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        finite = np.isfinite(want)
        if finite.all():  # no copy of a large output: its largest |value| from its max and min
            peak = max(float(want.max()), -float(want.min()))
        else:
            peak = float(np.nanmax(np.abs(np.where(finite, want, np.nan)))) if finite.any() else 0.0
    return max(1.0, peak)


@dataclass(frozen=True)
class MetricDrop(Policy):
    """Lossy hops with targets: the task metric may drop by at most `max_drop` (for MAE, rise).

    The outputs are checked for shape and NaN/Inf only: the metric over the split is the budget.
    """

    name: ClassVar[str] = "metric drop"
    needs_metric: ClassVar[bool] = True
    max_drop: float = DEFAULT_MAX_DROP

    def __post_init__(self) -> None:
        _non_negative(self, "max_drop")

    def compare(self, got: np.ndarray, want: np.ndarray) -> Judgement:
        return Judgement(True, "", *_figures(got, want))

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
        _within(self, "min_agreement", 0.0, 1.0)

    def compare(self, got: np.ndarray, want: np.ndarray) -> Judgement:
        if unmeasured := _unmeasured(self, want):
            return unmeasured
        # [batch, classes] or [batch, sequence, classes]: one prediction per position; [batch]: labels already
        top_got = got.argmax(axis=-1) if got.ndim >= 2 else got
        top_want = want.argmax(axis=-1) if want.ndim >= 2 else want
        differ = int((top_got != top_want).sum())
        agreement = 1.0 - differ / top_want.size
        passed = agreement >= self.min_agreement
        detail = f"agreement {agreement:.4f} ({differ} of {top_want.size} differ), budget >= {self.min_agreement:g}"
        return Judgement(passed, detail, *_figures(got, want))


@dataclass(frozen=True)
class MinCosine(Policy):
    """Embeddings: per-row cosine similarity to the reference; its `percentile` (0: the minimum) reaches the bound."""

    name: ClassVar[str] = "min cosine"
    over_split: ClassVar[bool] = True
    min_cosine: float = DEFAULT_MIN_COSINE
    percentile: float = 0.0  # 0 judges the worst row; 1 ignores the worst 1% of rows

    def __post_init__(self) -> None:
        _within(self, "min_cosine", -1.0, 1.0)
        _within(self, "percentile", 0.0, 100.0)

    def compare(self, got: np.ndarray, want: np.ndarray) -> Judgement:
        if unmeasured := _unmeasured(self, want):
            return unmeasured
        cosines = row_cosines(got, want)
        worst = float(cosines.min())
        value = float(np.percentile(cosines, self.percentile)) if self.percentile else worst
        stat = f"cosine min {worst:.6f}"
        if self.percentile:
            stat = f"cosine p{self.percentile:g} {value:.6f}, min {worst:.6f}"
        return Judgement(value >= self.min_cosine, f"{stat}, budget >= {self.min_cosine:g}", *_figures(got, want))


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
        _non_negative(self, "max_rel")

    def compare(self, got: np.ndarray, want: np.ndarray) -> Judgement:
        if unmeasured := _unmeasured(self, want):
            return unmeasured
        error = float(np.linalg.norm(got - want))
        scale = float(np.linalg.norm(want))
        relative = error / scale if scale else (0.0 if error == 0 else float("inf"))
        detail = f"relative error {relative:.4g} (L2), budget <= {self.max_rel:g}"
        return Judgement(relative <= self.max_rel, detail, *_figures(got, want))


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
        _within(self, "min_matched", 0.0, 1.0)
        _within(self, "match_iou", 0.0, 1.0)

    def compare(self, got: np.ndarray, want: np.ndarray) -> Judgement:
        if problem := head_problem(want.shape):
            return Judgement(False, f"the box agreement budget cannot judge it: {problem}")
        boxes = compare_outputs(got, want, self.confidence, self.iou, self.max_detections, self.match_iou)
        if not boxes.reference and not boxes.candidate:
            nothing = f"no box above confidence {self.confidence:g} on either side: nothing to match"
            return Judgement(True, nothing, *_figures(got, want))
        detail = (
            f"boxes matched {boxes.matched} of {boxes.reference} reference ({boxes.recall:.4f}), {boxes.candidate} "
            f"candidate (IoU >= {self.match_iou:g}, same class): agreement {boxes.agreement:.4f}, mean IoU "
            f"{boxes.mean_iou:.4f}, budget >= {self.min_matched:g}"
        )
        return Judgement(boxes.agreement >= self.min_matched - SLACK, detail, *_figures(got, want))

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

    def __post_init__(self) -> None:
        _non_negative(self, "max_rel")
        _within(self, "min_cosine", -1.0, 1.0)

    def chosen(self, want: np.ndarray) -> Policy:
        """The budget that fits this output: MinCosine for unit-vector rows, else RelativeError."""
        rows = want.reshape(len(want), -1) if want.ndim else want.reshape(1, -1)
        norms = np.linalg.norm(rows, axis=1)
        unit = rows.shape[1] >= 2 and bool(np.all(np.abs(norms - 1.0) <= UNIT_NORM))
        return MinCosine(self.min_cosine) if unit else RelativeError(self.max_rel)

    def compare(self, got: np.ndarray, want: np.ndarray) -> Judgement:
        if unmeasured := _unmeasured(self, want):
            return unmeasured
        return self.chosen(want).compare(got, want)

    def statistic(self, got: np.ndarray, want: np.ndarray) -> tuple[float, float, str]:
        """(figure, margin over the budget, one line) on one output, by the budget that fits it."""
        chosen = self.chosen(want)
        if isinstance(chosen, MinCosine):
            cosine = float(row_cosines(got, want).min()) if want.size else float("nan")
            return cosine, cosine - self.min_cosine, f"min cosine {cosine:.6f} (budget >= {self.min_cosine:g})"
        scale = float(np.linalg.norm(want)) or 1.0
        relative = float(np.linalg.norm(got - want)) / scale
        return relative, self.max_rel - relative, f"relative error {relative:.4g} (budget <= {self.max_rel:g})"


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


def _unmeasured(policy: Policy, want: np.ndarray) -> Judgement | None:
    """A failed judgement when there is nothing to judge: a statistic over no values passes nothing."""
    if want.size:
        return None
    return Judgement(False, f"no values to judge (shape {list(want.shape)}): the {policy.name} budget is unmeasured")


def _figures(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """Max abs and max rel difference, the figures every comparison row shows."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        diff = np.subtract(got, want)
        np.abs(diff, out=diff)
        floor = np.abs(want)
        return _max(diff), _max_ratio(diff, np.maximum(floor, REL_FLOOR, out=floor))


def _max_ratio(values: np.ndarray, by: np.ndarray) -> float:
    """The largest of values / by ignoring NaN, without a third output-sized array: `by` is overwritten."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        return _max(np.divide(values, by, out=by))


def _max(values: np.ndarray) -> float:
    """The largest value ignoring NaN (NaN if all are); 0 for no values."""
    if not values.size:
        return 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN array: the gate already failed the row
        return float(np.nanmax(values))


def _non_negative(policy: Policy, *fields: str) -> None:
    for name in fields:
        value = getattr(policy, name)
        if not value >= 0:  # also refuses NaN
            raise InputError(f"{type(policy).__name__}.{name} is {value!r}; give a number >= 0")


def _within(policy: Policy, field: str, low: float, high: float) -> None:
    value = getattr(policy, field)
    if not low <= value <= high:
        raise InputError(f"{type(policy).__name__}.{field} is {value!r}; give a number from {low:g} to {high:g}")


DEFAULT_MIN_TEXT_AGREEMENT = 0.95  # text recognizers: at most 1 text in 20 read otherwise (docs/optimize.md)


@dataclass(frozen=True)
class TextAgreement(Policy):
    """Text recognizers (task text-recognition): both outputs read as text (greedy CTC decoding, blank 0;
    pipeline/runtime/ctc.py) and compared text by text; the share read the same reaches `min_agreement`.

    The budget is a share: a batch too small for it to allow one changed text (fewer than 1 / (1 -
    min_agreement) texts: batch 1 and 2 of the gate) is allowed one, so a text the split's budget
    accepts does not fail the one-sample batch it happens to sit in; `min_agreement` 1 allows none.
    """

    name: ClassVar[str] = "text agreement"
    over_split: ClassVar[bool] = True
    min_agreement: float = DEFAULT_MIN_TEXT_AGREEMENT

    def __post_init__(self) -> None:
        _within(self, "min_agreement", 0.0, 1.0)

    def compare(self, got: np.ndarray, want: np.ndarray) -> Judgement:
        if unmeasured := _unmeasured(self, want):
            return unmeasured
        if want.ndim != 3:
            shape = list(want.shape)
            return Judgement(False, f"the text agreement budget reads [batch, positions, classes], got {shape}")
        figures = _texts(got, want)
        allowed = max(int((1.0 - self.min_agreement) * figures.texts + SLACK), int(self.min_agreement < 1.0))
        differ = figures.texts - figures.exact
        detail = (f"texts equal {figures.exact} of {figures.texts} ({figures.agreement:.4f}), character error rate "
                  f"{figures.cer:.4f}; budget >= {self.min_agreement:g}")  # fmt: skip
        return Judgement(differ <= allowed, detail, *_figures(got, want))

    def split_metric(self, got: np.ndarray, want: np.ndarray) -> tuple[str, float] | None:
        return ("text_agreement", _texts(got, want).agreement) if want.ndim == 3 else None

    def statistic(self, got: np.ndarray, want: np.ndarray) -> tuple[float, float, str]:
        """(agreement, margin over the budget, one line) on one output: what `pipe optimize` ranks candidates by."""
        figures = _texts(got, want)
        detail = f"text agreement {figures.agreement:.4f}, CER {figures.cer:.4f} (budget >= {self.min_agreement:g})"
        return figures.agreement, figures.agreement - self.min_agreement, detail


def _texts(got: np.ndarray, want: np.ndarray) -> Any:
    """The candidate's texts against the reference's (pipeline/runtime/ctc.py `TextFigures`)."""
    from pipeline.runtime.ctc import greedy, text_figures

    return text_figures([r.classes for r in greedy(got)], [r.classes for r in greedy(want)])
