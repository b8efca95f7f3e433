"""Each policy's statistic on plain arrays and refused bounds (tests/verify/test_choose.py: which one a hop gets)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.core.errors import InputError
from pipeline.verify.budgets import (
    CosineAgreement,
    MetricDrop,
    RelativeError,
    TensorAgreement,
    Top1Agreement,
    neighbours_kept,
    row_cosines,
)
from pipeline.verify.policies import Exact

LOGITS = np.random.default_rng(0).standard_normal((100, 5))


def test_exact_holds_each_value_to_atol_in_units_of_the_outputs_scale_plus_rtol() -> None:
    want = np.array([1.0, 0.5, 0.0])  # scale 1: atol is absolute
    inside = want + np.array([1e-4 + 1e-3, 1e-4 + 5e-4, 1e-4])  # atol + rtol * |value|
    assert Exact(atol=1e-4, rtol=1e-3).compare(inside * (1 - 1e-9), want).share == 0
    outside = Exact(atol=1e-4, rtol=1e-3).compare(want + np.array([0, 0, 2e-4]), want)
    assert not outside.passed and outside.share == pytest.approx(1 / 3) and outside.worst == pytest.approx(2.0)
    assert outside.detail == ("1 of 3 values (0.33) exceed atol 0.0001 + rtol 0.001*|ref|, the worst 2x its "
                              "tolerance; allowed: at most 0.0001 of the values, none beyond 10x")  # fmt: skip
    # a price output of 500,000: its near-zero values are held to 1e-4 x 500,000, what float32 rounds there
    prices = np.array([500_000.0, 3.0, 0.0])
    assert Exact().compare(prices + np.array([0.0, 20.0, 40.0]), prices).passed
    assert not Exact().compare(prices + np.array([0.0, 60.0, 0.0]), prices).passed


def test_exact_lets_a_documented_few_values_out_but_none_far_out() -> None:
    # the real case: PP-OCRv4's recognizer, fp32 TFLite, softmax [16, 40, 6625]: 2 of 4,240,000 values past 1e-4
    rng = np.random.default_rng(0)
    want = rng.random((16, 40, 6625))
    want /= want.sum(axis=-1, keepdims=True)  # softmax-like rows: values in [0, 1], scale 1
    got = want.copy()
    got[3, 7, 11] += 1.5e-4
    got[9, 2, 40] -= 1.2e-4
    few = Exact().compare(got, want)
    assert few.passed and few.share == pytest.approx(2 / 4_240_000), few.detail
    assert few.detail.startswith("2 of 4240000 values (4.7e-07) exceed atol 0.0001")
    one = want[:1]  # one sample, 265,000 values, for the rest
    far = one.copy()
    far[0, 0, 0] += 1.2e-3  # one value 11x its tolerance: a broken value, not rounding
    assert not Exact().compare(far, one).passed
    many = one + 2e-4 * (rng.random(one.shape) < 2e-4)  # about 53 values, 2e-4 of them
    assert not Exact().compare(many, one).passed
    assert Exact(max_share=1e-3).compare(many, one).passed


def test_exact_metric_tolerance_is_two_sided_and_metric_drop_is_one_sided() -> None:
    assert not Exact(metric=1e-3).judge_metric("accuracy", 0.90, 0.95).passed  # better is still a difference
    assert MetricDrop(0.01).judge_metric("accuracy", 0.90, 0.95).passed
    assert not MetricDrop(0.01).judge_metric("accuracy", 0.90, 0.88).passed
    assert not MetricDrop(0.01).judge_metric("mae", 0.50, 0.52).passed  # MAE up is worse
    assert MetricDrop(0.01).judge_metric("mae", 0.50, 0.40).passed
    assert not MetricDrop(0.01).judge_metric("accuracy", 0.90, float("nan")).passed


def test_top1_agreement_counts_changed_predictions() -> None:
    flipped = LOGITS.copy()
    flipped[:2] = -flipped[:2]  # two rows now predict another class
    judged = Top1Agreement(0.98).compare(flipped, LOGITS)
    assert judged.passed and judged.detail.startswith("agreement 0.9800 (2 of 100 differ)")
    assert not Top1Agreement(0.99).compare(flipped, LOGITS).passed
    labels = LOGITS.argmax(axis=1).astype(np.float64)  # outputs that are labels already
    assert Top1Agreement(1.0).compare(labels, labels).passed


def test_cosine_judges_the_rows_mean_and_the_worst_row() -> None:
    noisy = LOGITS.copy()
    noisy[0] = -noisy[0]  # one row points the other way: the mean of 100 rows is still 0.98
    assert row_cosines(noisy, LOGITS)[0] == pytest.approx(-1.0)
    judged = CosineAgreement(min_cosine=0.9, mean_cosine=0.95).compare(noisy, LOGITS)
    assert not judged.passed and "cosine mean 0.980000 (budget >= 0.95), worst row -1.000000" in judged.detail
    assert CosineAgreement(min_cosine=-1.0, mean_cosine=0.95).compare(noisy, LOGITS).passed
    assert not CosineAgreement(min_cosine=-1.0, mean_cosine=0.99).compare(noisy, LOGITS).passed  # the mean decides
    mean, margin, _ = CosineAgreement(min_cosine=-0.5, mean_cosine=0.95).statistic(noisy, LOGITS)
    assert mean == pytest.approx(0.98) and margin == pytest.approx(-0.5)  # the nearer bound: the worst row's
    zeros = np.zeros((2, 3))
    assert row_cosines(zeros, zeros).tolist() == [1.0, 1.0]
    one_zero = np.array([[1.0, 0, 0], [0, 0, 0]])
    assert row_cosines(one_zero, zeros).tolist() == [0.0, 1.0]


def test_neighbours_kept_is_shown_beside_the_cosine_and_does_not_decide() -> None:
    """Each row's nearest other row: a search over the rows. Two rows swapped with their neighbours' places read
    as 2 of 4 kept; fewer than 3 rows have no neighbour to lose."""
    rows = np.array([[1.0, 0.0, 0.0], [0.9, 0.1, 0.0], [0.0, 1.0, 0.0], [0.0, 0.9, 0.1]])
    assert neighbours_kept(rows, rows) == 1.0
    moved = rows.copy()
    moved[1] = [0.1, 0.9, 0.0]  # row 1 now nearest row 2
    assert neighbours_kept(moved, rows) == pytest.approx(0.5)
    assert np.isnan(neighbours_kept(rows[:2], rows[:2]))
    judged = CosineAgreement().compare(rows * 1.01, rows)
    assert judged.passed and judged.detail.endswith("nearest other row kept by 4 of 4 rows")


def test_relative_error_is_relative_to_the_whole_output() -> None:
    want = np.array([[10.0], [0.001]])
    got = want + 0.01  # a thousand percent off on the small value, 0.1% of the whole
    judged = RelativeError(0.01).compare(got, want)
    assert judged.passed and judged.detail.startswith("relative error 0.00141")
    assert not RelativeError(0.001).compare(got, want).passed
    assert not RelativeError(0.5).compare(np.ones((2, 1)), np.zeros((2, 1))).passed


def test_tensor_agreement_judges_unit_rows_by_cosine_and_the_rest_by_relative_error() -> None:
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((8, 16))
    unit = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    policy = TensorAgreement()
    assert isinstance(policy.chosen(unit), CosineAgreement) and isinstance(policy.chosen(rows), RelativeError)
    assert isinstance(policy.chosen(unit[:, :1] / np.abs(unit[:, :1])), RelativeError)  # one value a row: no direction
    # A unit-vector output is judged by its direction: a small rotation fails, a tiny rescale passes.
    judged = policy.compare(unit * 1.0005, unit)
    assert judged.passed and judged.detail.startswith("cosine mean")
    rotated = unit + 0.3 * rng.standard_normal(unit.shape)
    assert not policy.compare(rotated / np.linalg.norm(rotated, axis=1, keepdims=True), unit).passed
    # Any other output keeps its scale: 3x is 200% off.
    judged = policy.compare(rows * 3, rows)
    assert not judged.passed and judged.detail.startswith("relative error 2 ")
    assert policy.compare(rows * 1.001, rows).passed
    figure, margin, detail = policy.statistic(rows * 1.005, rows)
    assert figure == pytest.approx(0.005) and margin == pytest.approx(0.005) and "budget <= 0.01" in detail
    assert not policy.compare(np.zeros((0, 3)), np.zeros((0, 3))).passed  # nothing to judge: unmeasured


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Exact(atol=-1.0), r"Exact.atol is -1.0; give a number >= 0"),
        (lambda: MetricDrop(float("nan")), r"MetricDrop.max_drop is nan"),
        (lambda: Top1Agreement(1.5), r"Top1Agreement.min_agreement is 1.5; give a number from 0 to 1"),
        (lambda: CosineAgreement(0.9, mean_cosine=1.5), r"CosineAgreement.mean_cosine is 1.5"),
    ],
)
def test_a_bound_outside_its_range_is_refused_by_name(make, message: str) -> None:
    with pytest.raises(InputError, match=message):
        make()


def test_a_policy_records_its_name_and_bounds() -> None:
    assert Exact().to_dict() == {"policy": "exact", "atol": 1e-4, "rtol": 1e-3, "metric": 1e-3, "max_share": 1e-4,
                                 "hard": 10.0}  # fmt: skip
    assert CosineAgreement(0.95, 0.99).to_dict() == {"policy": "cosine", "min_cosine": 0.95, "mean_cosine": 0.99}


@pytest.mark.parametrize("policy", [Top1Agreement(), CosineAgreement(), RelativeError()], ids=lambda p: p.name)
@pytest.mark.parametrize("shape", [(0, 5), (5, 0)], ids=["no-rows", "no-columns"])
def test_a_budget_over_no_values_fails_as_unmeasured(policy, shape: tuple[int, int]) -> None:
    empty = np.zeros(shape)
    judged = policy.compare(empty, empty)
    assert not judged.passed and "no values" in judged.detail


def test_a_drop_of_exactly_the_budget_meets_it() -> None:
    """4 of 400 samples is exactly 1 point, though 1.0 - 0.99 is 0.010000000000000009 in floats."""
    from pipeline.verify.budgets import MetricDrop

    assert MetricDrop(0.01).judge_metric("accuracy", 1.0, 0.99).passed
    assert not MetricDrop(0.01).judge_metric("accuracy", 1.0, 0.9875).passed


def test_a_probability_maps_mask_iou_is_shown_beside_its_relative_error() -> None:
    """PP-OCRv4's text detector (task tensor) outputs a [N, 1, H, W] probability map: the masks thresholded at
    0.5 are what its user reads. Shown, not judged: the relative error decides."""
    want = np.zeros((1, 1, 4, 4))
    want[0, 0, :2] = 0.9  # 8 pixels of text
    got = want.copy()
    got[0, 0, 0, :2] = 0.1  # 2 of them lost
    judged = TensorAgreement().compare(got, want)
    assert not judged.passed and judged.detail.endswith("thresholded at 0.5, the masks' IoU 0.7500")
    assert TensorAgreement().statistic(got, want)[2].endswith("the masks' IoU 0.7500")
    assert "IoU" not in TensorAgreement().compare(want * 3, want * 2).detail  # not a probability map
