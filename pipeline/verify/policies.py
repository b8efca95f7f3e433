"""Gate policies: what "the candidate computes what its reference computes" means for one hop.

A lossless hop (torch -> ONNX, an import, a graph-only optimization) is held to `Exact`: every
element within numpy's allclose rule, and the task metric within a small tolerance. A lossy hop
(int8, fp16, TFLite) is held to a budget against its parent: `MetricDrop` (the task metric over
the evaluation split may drop by at most so much), `Top1Agreement` (classifiers pick the same
class), `MinCosine` (embeddings point the same way), `RelativeError` (regression values stay
close as a whole). `budget_for` picks the budget from the task, with the defaults below.

NaN or Inf on either side fails whatever the policy: the gate checks that before a policy judges.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np

from pipeline.artifact.directions import metric_drop
from pipeline.core.errors import InputError
from pipeline.verify.metrics import SLACK

DEFAULT_MAX_DROP = 0.01  # task metric: at most 1 accuracy point lost
DEFAULT_MIN_AGREEMENT = 0.99  # classifiers: at most 1 sample in 100 changes its predicted class
DEFAULT_MIN_COSINE = 0.99  # embeddings: every row within about 8 degrees of the reference's
DEFAULT_MAX_REL = 0.01  # regression: error at most 1% of the reference outputs' size
REL_FLOOR = 1e-4  # the max-rel figure of budgeted policies divides by at least this (as Exact's atol)


@dataclass(frozen=True)
class Judgement:
    """A policy's verdict on one comparison, with the figures every row shows."""

    passed: bool
    detail: str = ""  # the policy's statistic and its bound; empty for a passing Exact comparison
    max_abs: float | None = None
    max_rel: float | None = None


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

    def to_dict(self) -> dict[str, Any]:
        """The policy as a stage record stores it: its name and its bounds."""
        return {"policy": self.name, **asdict(self)}  # every concrete policy is a dataclass


@dataclass(frozen=True)
class Exact(Policy):
    """Lossless hops: |got - want| <= atol + rtol*|want| element-wise, and the metric within `metric`."""

    name: ClassVar[str] = "exact"
    atol: float = 1e-4  # per-element absolute difference allowed
    rtol: float = 1e-3  # plus this fraction of the reference's magnitude
    metric: float = 1e-3  # |metric(candidate) - metric(reference)| allowed

    def __post_init__(self) -> None:
        _non_negative(self, "atol", "rtol", "metric")

    def compare(self, got: np.ndarray, want: np.ndarray) -> Judgement:
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            diff = np.abs(got - want)
            max_rel = _max(diff / np.maximum(np.abs(want), self.atol))
            over = diff > self.atol + self.rtol * np.abs(want)
        detail = ""
        if over.any():
            detail = f"{int(over.sum())} of {over.size} values exceed atol {self.atol:g} + rtol {self.rtol:g}*|ref|"
        return Judgement(not detail, detail, _max(diff), max_rel)

    def judge_metric(self, metric: str, reference: float, candidate: float) -> Judgement:
        difference = abs(candidate - reference)
        if difference <= self.metric:
            return Judgement(True)
        return Judgement(False, f"differs by {difference:.4g} > tolerance {self.metric:g}")


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


def budget_for(task: str, has_target: bool, max_drop: float | None = None) -> Policy:
    """The budget a lossy hop of a `task` model is held to (lossless hops use Exact()).

    - classification: MetricDrop(max_drop, default 0.01) when the evaluation set has targets,
      else Top1Agreement(0.99);
    - regression: MetricDrop(max_drop) when `max_drop` is given (MAE, in the target's units),
      else RelativeError(0.01), which needs no units;
    - embedding: MinCosine(0.99), the minimum over rows.

    A `max_drop` without targets, or for embeddings, is refused: nothing could measure it.
    """
    if task not in ("classification", "regression", "embedding"):
        raise InputError(f"task {task!r} has no budget; tasks are classification, regression, embedding")
    if max_drop is not None and (task == "embedding" or not has_target):
        why = "embeddings have no task metric" if task == "embedding" else "the evaluation set has no targets"
        raise InputError(f"a metric budget (max drop {max_drop:g}) cannot be measured: {why}; leave it unset")
    if task == "classification":
        return MetricDrop(DEFAULT_MAX_DROP if max_drop is None else max_drop) if has_target else Top1Agreement()
    if task == "regression":
        return RelativeError() if max_drop is None else MetricDrop(max_drop)
    return MinCosine()


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
        diff = np.abs(got - want)
        return _max(diff), _max(diff / np.maximum(np.abs(want), REL_FLOOR))


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
