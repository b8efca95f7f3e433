"""Gate policies: what "the candidate computes what its reference computes" means for one hop.

A policy judges a candidate's outputs against its reference's, one comparison at a time (`compare`),
and the task metric over the evaluation split (`judge_metric`). A lossless hop (torch -> ONNX, an
import, a graph-only optimization, fp32 TFLite) is held to `Exact`, here: each output's values within
atol x the output's scale + rtol x |value|, but for at most 1 in 10,000 of them and none beyond 10x,
and the task metric within a small tolerance. A lossy hop (int8, fp16 on every target) is held to a
budget of the task over the evaluation split (budgets.py). `pipeline/verify/choose.py:hop_policy`
picks the policy of a hop.

NaN or Inf on either side fails whatever the policy: the gate checks that before a policy judges.
"""

from __future__ import annotations

import math
import warnings
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np

from pipeline.artifact.directions import IN_TARGET_UNITS
from pipeline.core.errors import InputError

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
        non_negative(self, "atol", "rtol", "metric")
        within(self, "max_share", 0.0, 1.0)
        within(self, "hard", 1.0, math.inf)

    def compare(self, got: np.ndarray, want: np.ndarray) -> Judgement:
        # Two output-sized float64 temporaries at most (a 64 x 40 x 6625 softmax is 136 MB each): in place where
        # an array is not needed again, and the ratio to the tolerance only for the values out of it.
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            diff = np.subtract(got, want)
            np.abs(diff, out=diff)
            scale = output_scale(want)
            tolerance = np.abs(want)
            max_rel = max_ratio(diff, np.maximum(tolerance, self.atol, out=tolerance))
            np.abs(want, out=tolerance)
            tolerance *= self.rtol
            tolerance += self.atol * scale
            over = diff > tolerance
            ratio = diff[over] / tolerance[over]  # a zero tolerance gives inf for a value over it
        count, size = int(over.sum()), int(over.size)
        share = count / size if size else 0.0
        worst = largest(ratio) if count else 0.0
        passed = share <= self.max_share and worst <= self.hard
        detail = ""
        if count:
            bound = f"atol {self.atol:g}" + (f" x scale {scale:.4g}" if scale != 1.0 else "")
            detail = (
                f"{count} of {size} values ({share:.2g}) exceed {bound} + rtol {self.rtol:g}*|ref|, the worst "
                f"{worst:.3g}x its tolerance; allowed: at most {self.max_share:g} of the values, none beyond "
                f"{self.hard:g}x"
            )
        return Judgement(passed, detail, largest(diff), max_rel, share, worst)

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


def unmeasured(policy: Policy, want: np.ndarray) -> Judgement | None:
    """A failed judgement when there is nothing to judge: a statistic over no values passes nothing."""
    if want.size:
        return None
    return Judgement(False, f"no values to judge (shape {list(want.shape)}): the {policy.name} budget is unmeasured")


def figures(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """Max abs and max rel difference, the figures every comparison row shows."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        diff = np.subtract(got, want)
        np.abs(diff, out=diff)
        floor = np.abs(want)
        return largest(diff), max_ratio(diff, np.maximum(floor, REL_FLOOR, out=floor))


def max_ratio(values: np.ndarray, by: np.ndarray) -> float:
    """The largest of values / by ignoring NaN, without a third output-sized array: `by` is overwritten."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        return largest(np.divide(values, by, out=by))


def largest(values: np.ndarray) -> float:
    """The largest value ignoring NaN (NaN if all are); 0 for no values."""
    if not values.size:
        return 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN array: the gate already failed the row
        return float(np.nanmax(values))


def non_negative(policy: Policy, *fields: str) -> None:
    """InputError naming a bound of `policy` that is negative (or NaN)."""
    for name in fields:
        value = getattr(policy, name)
        if not value >= 0:  # also refuses NaN
            raise InputError(f"{type(policy).__name__}.{name} is {value!r}; give a number >= 0")


def within(policy: Policy, field: str, low: float, high: float) -> None:
    """InputError naming a bound of `policy` outside [low, high]."""
    value = getattr(policy, field)
    if not low <= value <= high:
        raise InputError(f"{type(policy).__name__}.{field} is {value!r}; give a number from {low:g} to {high:g}")
