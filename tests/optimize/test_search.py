"""The auto search on real onnxruntime quantization, judged by the real verifier (pipeline.optimize.judge).

The quantization-sensitive model is an MLP whose second hidden layer has one outlier channel, a
bias of 1e4 against activations of about 1 (LLM.int8's outlier features, in miniature). The last
layer reads that channel with zero weight, so fp32 is unaffected, but a per-tensor int8 range for
its input spans 0..1e4: every other channel rounds to zero and the logits are noise. The node to
blame is therefore known: `fc3`, the MatMul reading the outlier.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.artifact.directory import Artifact
from pipeline.artifact.manifest import Manifest
from pipeline.artifact.tensors import TensorSpec
from pipeline.core.errors import ArtifactError
from pipeline.optimize.judge import Judge, Verdict
from pipeline.optimize.plan import Family
from pipeline.optimize.quantize import QuantSettings
from pipeline.optimize.quantizers import quantize
from pipeline.optimize.search import SearchResult, auto_search
from pipeline.optimize.sensitivity import sensitivity
from pipeline.optimize.speed import choose
from pipeline.optimize.trial import Trial
from pipeline.runtime.runners import ort_runner
from pipeline.samples.evaluation import EvaluationSet
from pipeline.verify.budgets import CosineAgreement, MetricDrop
from pipeline.verify.policies import Policy
from pipeline.verify.report import GateReport

FEATURES, HIDDEN, CLASSES = 16, 32, 4
OUTLIER = 1e4  # the outlier channel's bias: ~10^4 times the other activations
QUICK = 0.05  # seconds of timing per model and batch: the tests assert orderings, never milliseconds


def mlp(path: Path, outlier: float) -> Path:
    """x -> fc1 -> relu -> fc2 -> relu -> fc3 -> logits, MatMul + Add per layer, named nodes."""
    rng = np.random.default_rng(0)
    w1 = rng.normal(0, 1 / np.sqrt(FEATURES), (FEATURES, HIDDEN))
    w2 = rng.normal(0, 1 / np.sqrt(HIDDEN), (HIDDEN, HIDDEN))
    w3 = rng.normal(0, 1 / np.sqrt(HIDDEN), (HIDDEN, CLASSES))
    b2 = np.zeros(HIDDEN)
    b2[0], w3[0] = outlier, 0.0  # channel 0 of h2 is huge and read by nobody
    h2 = np.maximum(np.maximum(rng.normal(size=(1000, FEATURES)) @ w1, 0) @ w2 + b2, 0)
    b3 = -(h2 @ w3).mean(axis=0)  # centred logits: every class is predicted, none wins by default
    weights = {"w1": w1, "b1": np.zeros(HIDDEN), "w2": w2, "b2": b2, "w3": w3, "b3": b3}
    nodes = []
    for i, (x, out) in enumerate((("x", "h1"), ("h1", "h2"), ("h2", "logits")), 1):
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"], name=f"fc{i}"))
        added = out if i == 3 else f"a{i}"
        nodes.append(helper.make_node("Add", [f"m{i}", f"b{i}"], [added], name=f"fc{i}_bias"))
        if i < 3:
            nodes.append(helper.make_node("Relu", [added], [out], name=f"relu{i}"))
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", FEATURES])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
        [numpy_helper.from_array(w.astype(np.float32), name) for name, w in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def judge_for(tmp_path: Path, model: Path, policy: Policy) -> Judge:
    """The stage's own judge against `model`, on 512 generated samples labelled by the fp32 model itself."""
    data = {"x": np.random.default_rng(1).normal(size=(512, FEATURES)).astype(np.float32)}
    logits = ort_runner(model)(data)["logits"]
    samples = {"x": data["x"][:16]}
    manifest = Manifest(
        name="sensitive",
        version=1,
        task="classification",
        inputs=[TensorSpec("x", "float32", ["batch", FEATURES])],
        outputs=[TensorSpec("logits", "float32", ["batch", CLASSES])],
    )
    evaluation = EvaluationSet(samples, {"logits": logits[:16]}, data, logits.argmax(-1), "generated")
    return Judge(Artifact(tmp_path / "artifact", manifest), model, evaluation, policy)


def alone(*candidates: QuantSettings) -> list[Family]:
    """Each candidate as a family of its own: every one is tried, whatever the others did."""
    return [Family(c.describe(), (c,), "a test") for c in candidates]


def search(tmp_path: Path, model: Path, candidates: list[QuantSettings], policy: Policy, **kw: object) -> SearchResult:
    judge = judge_for(tmp_path, model, policy)
    workdir = tmp_path / "search"
    messages: list[str] = []
    calibration = {"x": np.random.default_rng(2).normal(size=(64, FEATURES)).astype(np.float32)}
    result = auto_search(
        model,
        workdir,
        alone(*candidates),
        kw.pop("calibration", calibration),  # type: ignore[arg-type]
        lambda path: judge(path, None, workdir),
        calibration,
        progress=messages.append,
        seconds=QUICK,
        **kw,  # type: ignore[arg-type]
    )
    json.dumps(result.to_dict(), allow_nan=False)  # the report's record is strict JSON
    assert messages, "the search said nothing while it worked"
    return result


def test_plain_int8_misses_then_the_search_excludes_the_outlier_node_and_meets_the_budget(tmp_path: Path) -> None:
    model = mlp(tmp_path / "sensitive.onnx", OUTLIER)
    result = search(tmp_path, model, [QuantSettings("dynamic")], MetricDrop(0.05))

    plain, repaired = result.tried
    assert not plain.verdict.passed and plain.verdict.figure > 0.3, plain.verdict.detail  # accuracy collapses
    assert [e.node for e in result.exclusions] == ["fc3"]
    assert "relative error" in result.exclusions[0].why and result.exclusions[0].score > 0.5
    assert repaired.excluded == ("fc3",) and repaired.settings.nodes_to_exclude == ("fc3",)
    assert repaired.verdict.passed and repaired.verdict.figure <= 0.05, repaired.verdict.detail
    assert result.passed and result.chosen is repaired and result.chosen.path.exists()
    assert repaired.latency is not None and repaired.fp32_latency is not None and repaired.speedup


def test_sensitivity_blames_the_node_reading_the_outlier_in_dynamic_and_static_int8(tmp_path: Path) -> None:
    """Static QDQ folds the Relus into the MatMuls before them; the ranking must see through that too."""
    model = mlp(tmp_path / "sensitive.onnx", OUTLIER)
    x = {"x": np.random.default_rng(3).normal(size=(48, FEATURES)).astype(np.float32)}
    for settings in (QuantSettings("dynamic"), QuantSettings("static", per_channel=True)):
        scratch = tmp_path / settings.mode
        report = quantize(model, tmp_path / f"{settings.mode}.onnx", settings, x, scratch)
        source = scratch / ("preprocessed.onnx" if report.preprocessed else "named.onnx")
        ranked = sensitivity(source, tmp_path / f"{settings.mode}.onnx", x, tmp_path)
        worst, runner_up = ranked[0], ranked[1]
        assert worst.node.split("/")[0] == "fc3", [(s.node, s.score) for s in ranked]
        assert worst.output_error > 0.5 and worst.input_error < 0.05
        assert runner_up.score < 0.05  # nothing else adds more than rounding noise


def test_the_kept_candidate_is_the_fastest_faster_one_else_the_smallest_and_every_one_is_reported(
    tmp_path: Path,
) -> None:
    model = mlp(tmp_path / "benign.onnx", 0.0)
    candidates = [QuantSettings("dynamic"), QuantSettings("dynamic", per_channel=True), QuantSettings("fp16")]
    result = search(tmp_path, model, candidates, MetricDrop(0.05))

    passing = [t for t in result.tried if t.verdict.passed]
    assert len(passing) >= 2 and result.passed and not result.exclusions
    assert all(t.speedup and t.fp32_latency for t in passing)  # each timed beside fp32 in its group
    faster = [t for t in passing if t.speed == "faster"]
    if faster:  # which it is depends on this CPU; the rule must hold either way
        assert result.chosen is max(faster, key=lambda t: t.speedup[1]) and result.speed == "faster"
    else:
        assert result.chosen.size == min(t.size for t in passing if t.speed != "slower" or t is result.chosen)
        assert result.speed == "not faster" and "not faster" in result.why_not_faster and result.profile
    assert [t.settings for t in result.tried] == candidates


def trial(tmp_path: Path, name: str, passed: bool, speedup: float, size: int) -> Trial:
    verdict = Verdict(passed, 0.0, 0.01 if passed else -0.01, name, GateReport())
    return Trial(name, QuantSettings("dynamic"), verdict, tmp_path / f"{name}.onnx", size, speedup={1: speedup})


def test_a_candidate_slower_than_fp32_is_not_best_and_the_smallest_is_kept_when_none_is_faster(
    tmp_path: Path,
) -> None:
    smallest_but_slower = trial(tmp_path, "slower", True, 0.5, 100)
    quick = trial(tmp_path, "quick", True, 1.30, 300)
    quicker_but_failed = trial(tmp_path, "failed", False, 3.0, 100)
    fast = trial(tmp_path, "fast", True, 1.10, 200)
    on_par = trial(tmp_path, "on-par", True, 1.02, 250)  # within the 5% band: not faster
    assert choose([smallest_but_slower, fast, quick, quicker_but_failed, on_par]).trial is quick
    assert choose([smallest_but_slower, fast, quicker_but_failed]).trial is fast
    nothing_faster = choose([smallest_but_slower, on_par, quicker_but_failed])
    assert nothing_faster.trial is on_par and nothing_faster.speed == "not faster"  # smallest that is not slower
    only_slower = choose([smallest_but_slower, quicker_but_failed])
    assert only_slower.trial is smallest_but_slower and only_slower.speed == "not faster"
    assert choose([quicker_but_failed]).trial is None


def test_a_candidate_that_cannot_be_made_is_a_failed_trial_not_a_silent_gap(tmp_path: Path) -> None:
    model = mlp(tmp_path / "benign.onnx", 0.0)
    candidates = [QuantSettings("static"), QuantSettings("dynamic")]
    result = search(tmp_path, model, candidates, MetricDrop(0.05), calibration=None)

    static, dynamic = result.tried
    assert not static.verdict.passed and "calibration" in static.verdict.detail and static.size == 0
    assert not static.speedup and dynamic.speedup  # nothing to time for the one that made no file
    assert static.to_dict()["verdict"]["figure"] is None
    assert result.chosen is dynamic and result.passed


def test_a_budget_nothing_meets_leaves_the_closest_model_and_says_what_was_tried(tmp_path: Path) -> None:
    model = mlp(tmp_path / "sensitive.onnx", OUTLIER)
    result = search(tmp_path, model, [QuantSettings("dynamic")], MetricDrop(0.0), max_exclusions=1)

    assert not result.passed
    assert len(result.tried) == 2 and [e.node for e in result.exclusions] == ["fc3"]
    assert result.chosen is max(result.tried, key=lambda t: t.verdict.margin) is result.tried[1]
    assert result.chosen.path.exists() and not result.chosen.verdict.passed
    assert any("max_exclusions is 1" in note for note in result.notes)
    record = result.to_dict()
    assert record["passed"] is False and record["chosen"] == result.chosen.name and len(record["tried"]) == 2


def test_no_candidate_at_all_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="no candidate"):
        auto_search(tmp_path / "unused.onnx", tmp_path, [], None, lambda _: None, {})  # type: ignore[arg-type,return-value]


def test_a_model_with_every_node_left_in_fp32_is_not_an_int8_model_that_met_the_budget(tmp_path: Path) -> None:
    """A budget only fp32 itself meets: excluding every quantized node would "pass" with an fp32 copy."""
    model = mlp(tmp_path / "benign.onnx", 0.0)
    result = search(tmp_path, model, [QuantSettings("dynamic")], CosineAgreement(1 - 1e-9, 1 - 1e-9))

    assert not result.passed and not result.chosen.verdict.passed
    assert all(not t.verdict.passed for t in result.tried)
    last = result.tried[-1]
    assert "nothing" in last.verdict.detail and "quantized" in last.verdict.detail, last.verdict.detail
