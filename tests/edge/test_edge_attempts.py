"""Edge stops trying other onnx2tf settings when the fp32 verdict is about accuracy, not conversion.

Before: any fp32 failure left the attempt, so one softmax value over atol (of 4,240,000) sent onnx2tf through
four more attempts, 21 minutes, each converting the same graph to the same arithmetic. The verdicts here are
the gate's own, on real onnxruntime runs of a tiny classifier, through candidates that go wrong in the ways a
conversion does (a transposed axis, a lost column, NaN) and in the way rounding does (a value a little off).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from pipeline.artifact.manifest import ModelSpec
from pipeline.artifact.records import ConvertAttempt
from pipeline.core.arrays import Arrays
from pipeline.edge.attempts import attempts_markdown, attempts_text
from pipeline.edge.convert import Converted
from pipeline.edge.litert_gate import EdgeMade, Judged, conversion_fault
from pipeline.runtime.runners import Candidate, ort_runner
from pipeline.samples.evaluation import EvaluationSet
from pipeline.verify.gate import verify
from pipeline.verify.policies import Exact
from tests.verify.verify_models import X, inputs, linear, spec, weights

W = weights(3)


def judged(tmp_path: Path, change: Callable[[np.ndarray], np.ndarray]) -> Judged:
    """The gate's fp32 verdict on a candidate whose output is the reference's, changed."""
    reference = ort_runner(linear(tmp_path, W))

    def candidate(arrays: Arrays) -> Arrays:
        return {"y": change(reference(arrays)["y"].copy())}

    split = inputs(64, seed=3)
    evaluation = EvaluationSet.of(inputs(20), (split, (split["x"] @ W).argmax(axis=1)))
    report = verify(Candidate(candidate, "TFLite", "LiteRT"), reference, evaluation, ModelSpec([X], [spec(3)]), Exact())
    converted = Converted("fp32", tmp_path / "model.fp32.tflite", "NC", [], [])
    return Judged([EdgeMade("tflite-fp32", converted, report, report.passed, Exact())])


def one_value_off(y: np.ndarray) -> np.ndarray:
    y[0, 0] += 3e-4  # 3x its tolerance, one value per run: rounding's kind of error
    return y


def test_a_verdict_about_accuracy_keeps_the_attempt_and_says_why_none_other_was_tried(tmp_path: Path) -> None:
    verdict = judged(tmp_path, one_value_off)
    assert not verdict.made[0].passed
    assert verdict.failure is None  # kept: no other onnx2tf setting is tried
    assert verdict.stopped is not None
    assert verdict.stopped.startswith("kept, no other onnx2tf setting tried: tflite-fp32 failed on accuracy, not ")
    assert "values (0.33) exceed atol 0.0001" in verdict.stopped


@pytest.mark.parametrize(
    "change",
    [lambda y: y[:, ::-1], lambda y: y[:, :2], lambda y: np.where(y > 0, np.nan, y)],
    ids=["transposed", "a-column-lost", "nan"],
)
def test_a_verdict_a_conversion_explains_leaves_the_attempt(tmp_path: Path, change) -> None:
    verdict = judged(tmp_path, change)
    assert verdict.failure is not None and verdict.failure.startswith("tflite-fp32: batch 1 y: ")
    assert verdict.stopped is None
    assert conversion_fault(verdict.made[0].report) == verdict.failure.removeprefix("tflite-fp32: ")


def test_a_passing_fp32_is_kept_silently(tmp_path: Path) -> None:
    verdict = judged(tmp_path, lambda y: y)
    assert verdict.failure is None and verdict.stopped is None


def test_the_record_says_why_the_search_stopped() -> None:
    why = "kept, no other onnx2tf setting tried: tflite-fp32 failed on accuracy, not conversion (...)"
    tried = [ConvertAttempt(name="onnxslim", used=True, reason=why, seconds=2.0)]
    assert f"1. onnxslim (2.0 s): used; {why}" in attempts_text(tried)
    assert f"| used; {why} |" in attempts_markdown(tried, [])


def test_a_conversion_out_of_time_names_the_setting_that_gives_more(tmp_path: Path) -> None:
    """A real onnx2tf child stopped by edge.timeout_s: every attempt says it ran out of time (or was skipped for
    it) and how to give more, so a run that ends on time is not read as a model onnx2tf refused."""
    from pipeline.edge.attempts import ATTEMPTS, NotConverted, convert_in_turn
    from pipeline.edge.convert import EdgeSettings

    settings = EdgeSettings(("fp32",), timeout_s=1.5)  # a third of it per attempt: tensorflow alone takes longer

    def never(_made: list[Converted]) -> Judged:
        raise AssertionError("nothing converts in 0.5 s")

    with pytest.raises(NotConverted) as refused:
        convert_in_turn(linear(tmp_path, W), tmp_path / "work", settings, None, never, ATTEMPTS[:4])
    reasons = [a.reason for a in refused.value.attempts]
    assert reasons[0].startswith("onnx2tf did not finish within 0.5 s (a third of edge.timeout_s, 1.5 s): raise ")
    assert all("--convert-timeout SECONDS" in r for r in reasons if not r.startswith("skipped: no earlier"))
    assert reasons[-1].startswith(("skipped: edge.timeout_s (1.5 s) was spent", "onnx2tf did not finish"))
    assert "log:" not in str(refused.value)  # the scratch log is gone when the message is read


def test_the_convert_timeout_is_an_edge_option_and_a_recipe_key(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from pipeline.cli import main
    from pipeline.recipe.schema import EdgeSpec

    result = CliRunner().invoke(main, ["export", str(tmp_path), "--target", "server", "--convert-timeout", "60"])
    assert result.exit_code == 2 and "--convert-timeout is an edge option" in result.output
    result = CliRunner().invoke(main, ["export", str(tmp_path), "--target", "edge", "--convert-timeout", "0"])
    assert result.exit_code == 2 and "--convert-timeout" in result.output
    assert EdgeSpec().timeout_s == 1800 and EdgeSpec(timeout_s=60).timeout_s == 60
    with pytest.raises(ValueError, match="timeout_s"):
        EdgeSpec(timeout_s=-1)
