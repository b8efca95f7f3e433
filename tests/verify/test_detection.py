"""Detections: decoding and NMS against a reference written plainly here, and the box-agreement budget in the gate.

The detector is the YOLOv8-layout model of tests/export/real_models.py run in onnxruntime; the
perturbed one is the same network with every box 1.6 times larger (its boxes' IoU with the
original's is 1/1.6^2 = 0.39 < 0.5), and a slightly perturbed one 1.02 times larger.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.artifact.directions import HIGHER_IS_BETTER, metric_drop
from pipeline.artifact.manifest import ModelSpec
from pipeline.artifact.tensors import TensorSpec
from pipeline.runtime.detection import Boxes, decode, iou_matrix, match
from pipeline.runtime.runners import ort_runner
from pipeline.samples.evaluation import EvaluationSet
from pipeline.verify.budgets import BoxAgreement
from pipeline.verify.gate import verify
from tests.export.real_models import plain_decode, yolo_detector

SPEC = ModelSpec(
    [TensorSpec("images", "float32", ["batch", 3, "height", "width"], "NCHW")],
    [TensorSpec("output0", "float32", ["batch", 7, "anchors"])],
    "detection",
)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("detectors")
    return {
        "reference": yolo_detector(root / "reference.onnx"),
        "perturbed": yolo_detector(root / "perturbed.onnx", box_scale=1.6),
        "nudged": yolo_detector(root / "nudged.onnx", box_scale=1.02),
    }


@pytest.fixture(scope="module")
def pictures() -> dict[str, np.ndarray]:
    return {"images": np.random.default_rng(0).standard_normal((4, 3, 320, 320)).astype(np.float32)}


def given(pictures: dict[str, np.ndarray]) -> EvaluationSet:
    """The pictures as the gate's samples and as its evaluation split (no targets: a detector has no metric)."""
    return EvaluationSet.of(pictures, (pictures, None), source="noise pictures")


@pytest.mark.parametrize(("confidence", "iou", "max_detections"), [(0.25, 0.7, 300), (0.25, 0.2, 300), (0.3, 0.3, 5)])
def test_decode_equals_a_plain_reference_decoding(
    models: dict[str, Path], pictures: dict[str, np.ndarray], confidence: float, iou: float, max_detections: int
) -> None:
    output = ort_runner(models["reference"])(pictures)["output0"]
    assert output.shape == (4, 7, 2100)
    decoded = decode(output, confidence, iou, max_detections)
    suppressed = 0
    for boxes, head in zip(decoded, output, strict=True):
        want = plain_decode(head, confidence, iou, max_detections)  # [(class, score, box)], best first
        suppressed += int((head[4:].max(axis=0) > confidence).sum()) - len(want)
        assert len(boxes) == len(want) > 0
        assert list(boxes.classes) == [c for c, _, _ in want]
        np.testing.assert_allclose(boxes.scores, [s for _, s, _ in want], rtol=1e-6)
        ious = iou_matrix(boxes.xyxy, np.array([b for _, _, b in want])).diagonal()
        assert ious.min() >= 0.99, ious.min()
        assert np.all(np.diff(boxes.scores) <= 0)  # best first
    if iou < 0.7 or max_detections < 300:
        assert suppressed > 0  # NMS or the cap really dropped boxes in these settings


def test_match_pairs_boxes_of_one_class_by_iou() -> None:
    ref = Boxes(np.array([[0, 0, 10, 10], [20, 20, 30, 30]], np.float32), np.array([0.9, 0.8]), np.array([0, 1]))
    same_place_other_class = Boxes(ref.xyxy.copy(), ref.scores, np.array([1, 0]))
    shifted = Boxes(ref.xyxy + np.float32(1), ref.scores, ref.classes)  # IoU 81/119 = 0.68
    assert match(ref, ref).agreement == 1.0 and match(ref, ref).mean_iou == pytest.approx(1.0)
    assert match(ref, same_place_other_class).matched == 0
    shifted_match = match(ref, shifted)
    assert shifted_match.matched == 2 and shifted_match.mean_iou == pytest.approx(81 / 119)
    extra = Boxes(np.vstack([ref.xyxy, [[50, 50, 60, 60]]]), np.array([0.9, 0.8, 0.7]), np.array([0, 1, 0]))
    counted = match(ref, extra)
    assert (counted.matched, counted.recall, counted.agreement) == (2, 1.0, pytest.approx(2 / 3))  # extras count


def test_box_agreement_passes_a_model_against_itself_and_fails_a_perturbed_box_head(
    models: dict[str, Path], pictures: dict[str, np.ndarray]
) -> None:
    reference = ort_runner(models["reference"])
    policy = BoxAgreement()

    itself = verify(models["reference"], reference, given(pictures), SPEC, policy)
    assert itself.passed, itself.table()
    assert itself.metric == {"name": "box_agreement", "reference": 1.0, "onnx": 1.0, "difference": 0.0, "samples": 4}
    split = next(r for r in itself.rows if r.check == "evaluation split")
    assert "agreement 1.0000, mean IoU 1.0000, budget >= 0.9" in split.detail

    nudged = verify(models["nudged"], reference, given(pictures), SPEC, policy)
    assert nudged.passed, nudged.table()  # 2% larger boxes: IoU 0.96, every box found again

    perturbed = verify(models["perturbed"], reference, given(pictures), SPEC, policy)
    assert not perturbed.passed
    # a budget is judged on the largest sample, the split; the batch cases show their figure without deciding
    assert {row.check for row in perturbed.failures} == {"evaluation split"}
    batch = next(r for r in perturbed.rows if r.check == "batch 16")
    assert batch.passed and "(shown: the budget is judged on the evaluation split)" in batch.detail
    row = next(r for r in perturbed.failures if r.check == "evaluation split")
    assert "boxes matched 0 of" in row.detail and "reference (0.0000)" in row.detail
    assert "agreement 0.0000" in row.detail
    assert perturbed.metric["name"] == "box_agreement" and perturbed.metric["onnx"] == 0.0
    agreement, margin, detail = policy.statistic(reference(pictures)["output0"], reference(pictures)["output0"])
    assert (agreement, margin) == (1.0, pytest.approx(0.1)) and "box agreement 1.0000" in detail


def test_box_agreement_with_no_reference_box_is_unmeasured(
    models: dict[str, Path], pictures: dict[str, np.ndarray]
) -> None:
    never = BoxAgreement(confidence=0.9999)  # no anchor scores above it
    report = verify(models["perturbed"], ort_runner(models["reference"]), given(pictures), SPEC, never)
    assert not report.passed and report.metric == {}
    (row,) = report.failures
    assert row.check == "metric box_agreement"
    assert "nothing to measure box_agreement on over the 4 samples" in row.detail and "--eval-data" in row.detail
    batch = next(r for r in report.rows if r.check == "batch 1")
    assert batch.passed and "nothing to match" in batch.detail
    assert not never.compare(np.zeros((2, 5)), np.zeros((2, 5))).passed  # not a head's shape: refused


def test_pipe_check_knows_box_agreement_improves_upwards() -> None:
    assert HIGHER_IS_BETTER["box_agreement"] is True
    assert metric_drop("box_agreement", 0.98, 0.9) == pytest.approx(0.08)


def test_nms_row_by_row_past_the_matrix_bound_keeps_the_same_boxes(
    models: dict[str, Path], pictures: dict[str, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.runtime import detection

    output = ort_runner(models["reference"])(pictures)["output0"]
    at_once = decode(output, 0.25, 0.3, 300)
    monkeypatch.setattr(detection, "MATRIX_BOXES", 0)  # every picture's boxes past the bound
    row_by_row = decode(output, 0.25, 0.3, 300)
    for a, b in zip(at_once, row_by_row, strict=True):
        assert len(a) > 0 and np.array_equal(a.xyxy, b.xyxy) and np.array_equal(a.classes, b.classes)
