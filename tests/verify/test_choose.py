"""hop_policy, the one place a hop's policy is chosen: each hop and precision, the task defaults, the
settings every hop takes, and the budgets refused because nothing would measure them."""

from __future__ import annotations

import pytest

from pipeline.artifact.manifest import Detection
from pipeline.core.errors import InputError
from pipeline.recipe.schema import EdgeSpec, ExportSpec, OptimizeSpec
from pipeline.report.policy import describe
from pipeline.verify.budgets import (
    BoxAgreement,
    CosineAgreement,
    MetricDrop,
    RelativeError,
    TensorAgreement,
    TextAgreement,
    Top1Agreement,
)
from pipeline.verify.choose import HOPS, GateSettings, describe_held, hop_policy, refuse_unread_budgets
from pipeline.verify.policies import Exact

NONE = GateSettings()


def gate(**given: float) -> GateSettings:
    return GateSettings(**given)


@pytest.mark.parametrize("hop", HOPS)
def test_a_lossless_candidate_of_every_hop_is_held_to_exact_with_the_hops_tolerances(hop: str) -> None:
    assert hop_policy(hop, "fp32", "classification", True, NONE) == Exact(1e-4, 1e-3, 1e-3)
    given = gate(atol=0.5, rtol=0.25, metric_tolerance=0.125)
    assert hop_policy(hop, "fp32", "detection", False, given) == Exact(0.5, 0.25, 0.125)


def test_the_task_defaults_of_a_lossy_candidate() -> None:
    assert hop_policy("optimize", "int8", "classification", True, NONE) == MetricDrop(0.01)
    assert hop_policy("optimize", "int8", "classification", False, NONE) == Top1Agreement(0.99)
    assert hop_policy("optimize", "int8", "regression", True, NONE) == RelativeError(0.01)
    assert hop_policy("optimize", "fp16", "embedding", False, NONE) == CosineAgreement(min_cosine=0.9, mean_cosine=0.99)
    assert hop_policy("optimize", "int8", "detection", False, NONE) == BoxAgreement(0.9)
    detection = Detection(confidence=0.5, iou=0.6, max_detections=10)
    assert hop_policy("edge", "int8", "detection", True, NONE, detection) == BoxAgreement(
        0.9, confidence=0.5, iou=0.6, max_detections=10
    )
    tensor = TensorAgreement(max_rel=0.01, min_cosine=0.9, mean_cosine=0.99)
    assert hop_policy("edge", "int8", "tensor", True, NONE) == tensor
    with pytest.raises(InputError, match="task 'segmentation' has no budget"):
        hop_policy("optimize", "int8", "segmentation", True, NONE)
    with pytest.raises(InputError, match="no gate for hop 'serve'"):
        hop_policy("serve", "fp32", "classification", True, NONE)  # type: ignore[arg-type]


def test_the_hops_own_defaults_edge_int8_and_fp16() -> None:
    # edge's lossy classifier may lose 1.5 points (LiteRT rounds more), optimize's 1; fp16 TFLite is lossy like int8:
    # judged by the task's budget, never element by element (a real YOLOv8n's fp16 is 0.0035 off, as fp16 is)
    assert hop_policy("edge", "int8", "classification", True, NONE) == MetricDrop(0.015)
    assert hop_policy("edge", "int8", "classification", False, NONE) == Top1Agreement(0.99)
    assert hop_policy("edge", "fp16", "classification", True, NONE) == MetricDrop(0.015)
    assert hop_policy("edge", "fp16", "regression", True, NONE) == RelativeError(0.01)
    assert hop_policy("edge", "fp16", "detection", False, NONE) == BoxAgreement(0.9)
    assert hop_policy("edge", "fp16", "embedding", False, gate(min_cosine=0.95)) == CosineAgreement(0.95, 0.99)
    assert hop_policy("optimize", "fp16", "classification", True, NONE) == MetricDrop(0.01)


def test_a_lossless_share_out_of_tolerance_is_a_setting_of_every_hop() -> None:
    for hop in HOPS:
        assert hop_policy(hop, "fp32", "tensor", False, gate(max_out_of_tolerance=0.01)) == Exact(max_share=0.01)


def test_atol_fp16_is_refused_naming_what_replaced_it() -> None:
    with pytest.raises(ValueError, match="atol_fp16 is gone: fp16 is lossy and judged by the task's budget"):
        EdgeSpec.model_validate({"atol_fp16": 0.01})


def test_a_lossy_budget_for_a_run_of_lossless_candidates_only_is_refused_naming_the_flag() -> None:
    refuse_unread_budgets("edge", ["fp32", "fp16"], gate(max_accuracy_drop=0.1))  # fp16 reads it
    with pytest.raises(InputError, match="--max-accuracy-drop: a budget of lossy candidates .* only fp32"):
        refuse_unread_budgets("edge", ["fp32"], gate(max_accuracy_drop=0.1))


def test_every_budget_is_taken_by_every_hop_where_it_means_something() -> None:
    for hop in ("optimize", "edge"):
        assert hop_policy(hop, "int8", "classification", True, gate(max_accuracy_drop=0.05)) == MetricDrop(0.05)
        assert hop_policy(hop, "int8", "regression", True, gate(max_accuracy_drop=2.0)) == MetricDrop(2.0)
        cosine = gate(min_cosine=0.8, mean_cosine=0.95)
        assert hop_policy(hop, "int8", "embedding", False, cosine) == CosineAgreement(0.8, 0.95)
        assert hop_policy(hop, "int8", "tensor", False, gate(mean_cosine=0.95)) == TensorAgreement(mean_cosine=0.95)
    # a lossless candidate of a classifier reads no cosine: the cosine is the lossy candidates' budget
    assert hop_policy("optimize", "fp32", "classification", True, gate(min_cosine=0.9)) == Exact()


@pytest.mark.parametrize("hop", ["optimize", "edge"])
def test_a_budget_nothing_could_measure_is_refused_naming_what_is_read_instead(hop: str) -> None:
    with pytest.raises(InputError, match="the evaluation set has no targets"):
        hop_policy(hop, "int8", "classification", False, gate(max_accuracy_drop=0.01))
    with pytest.raises(InputError, match="an embedding model has no task metric; its budget is cosine: mean_cosine"):
        hop_policy(hop, "int8", "embedding", True, gate(max_accuracy_drop=0.01))
    for task in ("detection", "tensor"):
        with pytest.raises(InputError, match=f"a {task} model has no task metric"):
            hop_policy(hop, "int8", task, True, gate(max_accuracy_drop=0.01))
    with pytest.raises(InputError, match="min_cosine 0.9 is a budget of embedding and tensor models"):
        hop_policy(hop, "int8", "classification", True, gate(min_cosine=0.9))
    with pytest.raises(InputError, match="mean_cosine 0.95 is a budget of embedding and tensor models"):
        hop_policy(hop, "int8", "detection", False, gate(mean_cosine=0.95))


def test_the_settings_are_read_from_every_section_and_from_old_records() -> None:
    assert GateSettings.read(ExportSpec(atol=0.5).model_dump()) == gate(atol=0.5)
    assert GateSettings.read(OptimizeSpec(min_cosine=0.9).model_dump()) == gate(min_cosine=0.9)
    assert GateSettings.read(EdgeSpec(mean_cosine=0.95).model_dump()) == gate(mean_cosine=0.95)
    edge = EdgeSpec.model_validate({"atol_fp32": 0.5, "max_accuracy_drop": 0.1})  # the key's name before
    assert edge.atol == 0.5
    assert GateSettings.read(edge.model_dump()) == gate(atol=0.5, max_accuracy_drop=0.1)
    assert GateSettings.read({"atol_fp32": 0.25, "rtol": 0.0, "precisions": ["fp32"]}) == gate(atol=0.25, rtol=0.0)


def test_a_record_is_described_by_the_same_choice() -> None:
    record = EdgeSpec(max_accuracy_drop=0.02).model_dump()
    assert describe_held("edge", "int8", "classification", True, record) == MetricDrop(0.02)
    assert describe_held("edge", "fp32", "classification", True, {"atol_fp32": 0.5}) == Exact(0.5)
    # a record edited by hand with a budget that could not have been measured: the stage's defaults
    assert describe_held("edge", "int8", "classification", False, {"max_accuracy_drop": 0.02}) == Top1Agreement()


def test_the_card_says_what_a_detector_and_a_tensor_model_were_held_to() -> None:
    assert describe(BoxAgreement().to_dict()) == (
        "boxes matched (same class, IoU >= 0.5) >= 0.9, decoded at confidence 0.25, NMS IoU 0.7"
    )
    assert describe(TensorAgreement().to_dict()) == (
        "per output: cosine mean >= 0.99, worst row >= 0.9 (unit-vector rows) or relative error <= 0.01"
    )


def test_a_record_written_before_the_share_rule_reads_as_its_stage_judged_it() -> None:
    # an edge record of fp16 held by element (atol_fp16) reads as today's budget; the key is ignored, not an error
    assert describe_held("edge", "fp16", "classification", True, {"atol_fp16": 0.01}) == MetricDrop(0.015)
    assert describe(Exact().to_dict()) == (
        "exact: |diff| <= 0.0001·scale + 0.001·|ref| but for 0.0001 of the values (none past 10x), metric within 0.001"
    )
    old = {"policy": "exact", "atol": 1e-4, "rtol": 1e-3, "metric": 1e-3}  # every value was held then
    assert describe(old) == "exact: |diff| <= 0.0001 + 0.001·|ref|, metric within 0.001"


@pytest.mark.parametrize("hop", ["optimize", "edge"])
def test_the_agreement_of_a_classifier_without_targets_and_of_a_recognizer_can_be_set(hop: str) -> None:
    """Magika (80 real files, no labels) changed 2 of 80 answers under per-channel int8 against 0.99: the share
    was no setting before, so nothing but --per-tensor could loosen it."""
    given = gate(min_agreement=0.97)
    assert hop_policy(hop, "int8", "classification", False, given) == Top1Agreement(0.97)
    assert hop_policy(hop, "int8", "text-recognition", True, given) == TextAgreement(0.97)
    with pytest.raises(InputError, match="min_agreement 0.97 is not read: the evaluation set has targets"):
        hop_policy(hop, "int8", "classification", True, given)
    with pytest.raises(InputError, match="min_agreement 0.97 is not read"):
        hop_policy(hop, "int8", "text-recognition", True, gate(min_agreement=0.97, max_accuracy_drop=0.02))
    with pytest.raises(InputError, match="min_agreement 0.97 is a budget of classifiers without targets"):
        hop_policy(hop, "int8", "embedding", False, given)
    assert hop_policy(hop, "fp32", "embedding", False, given) == Exact()  # lossless: no budget read
    with pytest.raises(InputError, match="--min-agreement: a budget of lossy candidates"):
        refuse_unread_budgets(hop, ["fp32"], given)
