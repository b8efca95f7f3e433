"""`--quantize auto` on conv nets: candidates chosen by what the graph holds, timed in groups, bounded in time.

The conv net is `mobile_cnn`: a MobileNet-like stack (depthwise convs, hard-swish, a global mean and
a Gemm head) on 32x32 pictures, its head fitted to a pattern per class. On it, static int8 runs at
about half fp32's speed at batch 1 (the quantize/dequantize pairs around the float ops cost more
than the int8 convs save on maps this small) and int8 activations at about a quarter: both
families are slower than fp32 far beyond the noise band.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from pipeline.artifact.directory import Artifact
from pipeline.artifact.manifest import Manifest
from pipeline.artifact.tensors import TensorSpec
from pipeline.core.errors import InputError
from pipeline.optimize.judge import Judge
from pipeline.optimize.nodes import quantizable_nodes
from pipeline.optimize.plan import Family, plan_for
from pipeline.optimize.quantize import QuantSettings
from pipeline.optimize.quantizers import quantize
from pipeline.optimize.search import SearchResult, auto_search
from pipeline.runtime.runners import ort_runner
from pipeline.samples.evaluation import EvaluationSet
from pipeline.verify.budgets import MetricDrop
from tests.optimize.transform_models import mlp, mobile_classifier, transformer

QUICK = 0.05  # seconds of timing per model, batch and group: the tests read ratios far from 1, never milliseconds


@pytest.fixture(scope="module")
def mobile(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    """The fitted conv net and its labelled pictures (x, target)."""
    path, data = mobile_classifier(tmp_path_factory.mktemp("mobile"))
    return path, dict(np.load(data))


def test_a_conv_net_with_samples_gets_static_candidates_and_no_dynamic_one(mobile) -> None:
    plan = plan_for(mobile[0], has_calibration=True)
    assert plan.conv_share > 0.9 and plan.depthwise == 2
    assert {c.mode for c in plan.candidates()} == {"static"}
    assert [f.name for f in plan.families] == ["static int8, uint8 activations", "static int8, int8 activations"]
    assert all(c.per_channel for c in plan.candidates())  # per-channel weights: what conv nets need
    assert any("no dynamic int8" in note and "Conv" in note for note in plan.notes)


def test_without_samples_a_conv_net_gets_dynamic_int8_of_its_head_only_and_conv_stays_fp32(
    mobile, tmp_path: Path
) -> None:
    plan = plan_for(mobile[0], has_calibration=False)
    assert [f.name for f in plan.families] == ["dynamic int8"]
    assert any("--eval-data" in note for note in plan.notes)
    report = quantize(mobile[0], tmp_path / "dynamic.onnx", plan.families[0].candidates[0])
    ops = [n.op_type for n in onnx.load(str(tmp_path / "dynamic.onnx")).graph.node]
    assert "ConvInteger" not in ops and ops.count("Conv") == 5  # every conv still fp32
    assert report.quantized == {"Gemm": 1} and "MatMulInteger" in report.quant_ops
    assert not [n for n in quantizable_nodes(mobile[0], "dynamic") if n.startswith("Conv")]


def test_a_matmul_model_tries_dynamic_int8_first_and_static_after(tmp_path: Path) -> None:
    for model in (mlp(tmp_path), transformer(tmp_path)):
        plan = plan_for(model, has_calibration=True)
        assert plan.conv_share == 0
        assert [f.name for f in plan.families] == [
            "dynamic int8", "static int8, uint8 activations", "static int8, int8 activations"
        ]  # fmt: skip
        assert [f.name for f in plan_for(model, has_calibration=False).families] == ["dynamic int8"]


def test_a_conv_net_without_weights_int8_could_take_dynamically_and_no_samples_is_refused(tmp_path: Path) -> None:
    graph = onnx.parser.parse_graph(
        "g (float[N, 3, 8, 8] x) => (float[N, 4, 8, 8] y) { y = Conv <pads = [1, 1, 1, 1]> (x, k) }"
    )
    graph.initializer.append(onnx.numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "k"))
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)], ir_version=9)
    onnx.save(model, str(tmp_path / "conv.onnx"))
    with pytest.raises(InputError, match=r"no int8 candidate for conv.onnx.*--eval-data"):
        plan_for(tmp_path / "conv.onnx", has_calibration=False)


def search(
    tmp_path: Path, mobile: tuple[Path, dict[str, np.ndarray]], families: list[Family], **kw: object
) -> tuple[SearchResult, list[str]]:
    """The search on the conv net, judged by the stage's judge (accuracy may drop by `drop`, 0.05)."""
    path, data = mobile
    x, target = data["x"], data["target"]
    manifest = Manifest(
        name="mobile", version=1, task="classification",
        inputs=[TensorSpec("x", "float32", ["N", 3, 32, 32])], outputs=[TensorSpec("y", "float32", ["N", 4])],
    )  # fmt: skip
    outputs = ort_runner(path)({"x": x[:16]})
    evaluation = EvaluationSet({"x": x[:16]}, outputs, {"x": x}, target, "generated pictures")
    judge = Judge(Artifact(tmp_path / "artifact", manifest), path, evaluation, MetricDrop(kw.pop("drop", 0.05)))  # type: ignore[arg-type]
    messages: list[str] = []
    workdir = tmp_path / "search"
    calibration = kw.pop("calibration", {"x": x})
    result = auto_search(path, workdir, families, calibration, lambda p: judge(p, None, workdir),  # type: ignore[arg-type]
                         {"x": x[:8]}, progress=messages.append, seconds=QUICK, **kw)  # type: ignore[arg-type]  # fmt: skip
    return result, messages


def static(activations: str, *methods: str) -> Family:
    settings = tuple(QuantSettings("static", per_channel=True, activation_type=activations, calibration=m)  # type: ignore[arg-type]
                     for m in methods)  # fmt: skip
    return Family(f"static {activations}", settings, "a test")


def test_a_slower_family_is_not_widened_ranges_are_calibrated_once_and_the_smallest_is_kept_with_the_reason(
    mobile, tmp_path: Path
) -> None:
    families = [static("uint8", "minmax", "entropy", "percentile"), static("int8", "minmax", "entropy")]
    result, messages = search(tmp_path, mobile, families)

    # each family's first candidate is slower than fp32 beyond noise: its others (same kernels) are not tried
    assert [t.name for t in result.tried] == [
        families[0].candidates[0].describe(),
        families[1].candidates[0].describe(),
    ]
    assert all(t.speed == "slower" and t.speedup[1] < 0.9 for t in result.tried), [t.speedup for t in result.tried]
    assert sum("not widened" in note for note in result.notes) == 2
    # the ranges of minmax were computed once, for the first candidate; the second (int8 activations) reused them
    assert result.calibrations == ["minmax"]
    calibrating = {message.split("]")[0] for message in messages if "calibrating" in message}
    assert calibrating == {"[1"}
    # nothing is faster: the smallest passed one is kept, and the report says why from the op profile
    assert result.passed and result.speed == "not faster"
    assert result.chosen.size == min(t.size for t in result.tried if t.verdict.passed)
    why, size = result.why_not_faster, result.chosen.size / mobile[0].stat().st_size
    # this net's weights are 15 kB: the quantization parameters weigh about as much as the bytes int8 saves
    assert why.startswith(f"smaller ({size:.2f}x" if size < 1 else f"neither smaller ({size:.2f}x"), why
    assert "not faster on this CPU" in why or "nor faster on this CPU" in why
    assert "x fp32's speed at batch 1" in why
    assert "QuantizeLinear/DequantizeLinear" in why and "ops left in float" in why and "HardSigmoid" in why, why
    kinds = {row["kind"]: row for row in (result.profile or {})["rows"]}
    assert kinds["Conv (depthwise)"]["quantized_ops"] == ["QLinearConv"] and kinds["Conv (dense)"]["fp32_ms"] > 0
    assert kinds["HardSigmoid"]["role"] == "float" and kinds["QuantizeLinear"]["role"] == "conversion"


def test_the_time_budget_cuts_the_search_and_keeps_what_passed(mobile, tmp_path: Path) -> None:
    families = [static("uint8", "minmax"), static("int8", "minmax", "entropy")]
    result, _ = search(tmp_path, mobile, families, budget=0.0)

    assert len(result.tried) == 1 and result.cut  # the first candidate always runs; nothing after it
    assert result.untried == [c.describe() for c in families[1].candidates]
    assert any("was cut" in note and "search_seconds 0" in note for note in result.notes), result.notes
    assert result.chosen is result.tried[0] and result.passed
    assert result.to_dict()["cut"] is True


def test_when_nothing_passes_a_family_set_aside_for_speed_is_tried_for_the_smallest_model(
    mobile, tmp_path: Path
) -> None:
    """One calibration pixel at 100 (the pictures are within about 3): MinMax stretches the input's range
    over it and accuracy drops by 0.17; Percentile leaves it out (0.06). MinMax, slower than fp32 and
    failed, set its family aside."""
    x = mobile[1]["x"].copy()
    x[5, 0, 10, 10] = 100.0
    families = [static("uint8", "minmax", "percentile")]
    result, _ = search(tmp_path, mobile, families, calibration={"x": x}, drop=0.1)

    minmax, percentile = result.tried
    assert not minmax.verdict.passed and minmax.speed == "slower", minmax.verdict.detail
    assert percentile.verdict.passed and percentile.speedup and result.chosen is percentile
    assert not result.exclusions  # no node had to be left in fp32
    assert any("not widened" in note for note in result.notes)
    assert any("once nothing else had" in note for note in result.notes), result.notes
    assert result.calibrations == ["minmax", "percentile"]
