"""Every place that picks a lossy hop's budget from the task gives detection and tensor models theirs."""

from __future__ import annotations

import pytest

from pipeline.artifact.manifest import Detection
from pipeline.core.errors import InputError
from pipeline.edge.stage import policy_for
from pipeline.optimize.judge import budget_policy
from pipeline.recipe.schema import EdgeSpec, OptimizeSpec
from pipeline.report.policy import describe
from pipeline.verify.policies import BoxAgreement, Exact, MetricDrop, TensorAgreement


def test_edge_int8_of_a_detector_or_tensor_model_is_judged_by_its_outputs_not_a_metric() -> None:
    settings, detection = EdgeSpec(), Detection(confidence=0.4, iou=0.5, max_detections=50)
    want = BoxAgreement(confidence=0.4, iou=0.5, max_detections=50)
    assert policy_for("int8", settings, "detection", True, detection) == want  # targets or not: no metric to drop
    assert policy_for("int8", settings, "tensor", True) == TensorAgreement()
    assert policy_for("int8", settings, "classification", True) == MetricDrop(0.015)
    assert policy_for("fp32", settings, "detection", False, detection) == Exact(atol=1e-4, rtol=1e-3)


def test_optimize_budget_of_a_detector_decodes_with_its_settings() -> None:
    detection = Detection(confidence=0.3)
    assert budget_policy("detection", False, OptimizeSpec(), detection) == BoxAgreement(confidence=0.3)
    assert budget_policy("tensor", True, OptimizeSpec()) == TensorAgreement()
    with pytest.raises(InputError, match="a detection model has no task metric"):
        budget_policy("detection", True, OptimizeSpec(max_accuracy_drop=0.01), detection)


def test_the_card_says_what_a_detector_and_a_tensor_model_were_held_to() -> None:
    assert describe(BoxAgreement().to_dict()) == (
        "boxes matched (same class, IoU >= 0.5) >= 0.9, decoded at confidence 0.25, NMS IoU 0.7"
    )
    assert describe(TensorAgreement().to_dict()) == (
        "per output: cosine >= 0.99 (unit-vector rows) or relative error <= 0.01"
    )
