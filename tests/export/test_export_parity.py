"""The parity gate on hand-written ONNX graphs: each kind of drift becomes a row, all rows are collected."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest

from pipeline.artifact.manifest import ModelSpec
from pipeline.artifact.tensors import TensorSpec
from pipeline.core.errors import CheckFailed
from pipeline.runtime.runners import Runner
from pipeline.samples.evaluation import EvaluationSet
from pipeline.verify.gate import verify
from pipeline.verify.policies import Exact
from pipeline.verify.report import GateReport

X = TensorSpec("x", "float32", ["batch", 4])
Y = TensorSpec("y", "float32", ["batch", 4])
SAMPLES = {"x": np.random.default_rng(0).standard_normal((20, 4)).astype(np.float32)}


def graph(tmp_path: Path, body: str, batch: str = "N", check: bool = True) -> Path:
    model = onnx.parser.parse_model(f"""
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[{batch}, 4] x) => (float[{batch}, 4] y) {{ {body} }}""")
    if check:
        onnx.checker.check_model(model)
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    return path


def reference(fn: Callable[[np.ndarray], np.ndarray]) -> Runner:
    """A numpy function as the gate's reference callable."""
    return lambda arrays: {"y": fn(arrays["x"])}


def gate(
    path: Path, ref: Runner, policy: Exact, evaluation: tuple[dict[str, np.ndarray], np.ndarray] | None = None
) -> GateReport:
    """The gate on `path` against `ref` over SAMPLES (and `evaluation`, a split with targets)."""
    return verify(path, ref, EvaluationSet.of(SAMPLES, evaluation), ModelSpec([X], [Y]), policy)


def test_matching_graph_passes_every_row(tmp_path: Path) -> None:
    report = gate(graph(tmp_path, "y = Relu(x)"), reference(lambda x: np.maximum(x, 0)), Exact())
    assert report.passed, report.table()
    assert [r.check for r in report.rows] == ["checker", "shape inference", "batch 1", "batch 2", "batch 16"]
    assert all(r.max_abs == 0.0 for r in report.rows[2:])


def test_nan_from_onnx_is_a_failure_even_where_values_are_close(tmp_path: Path) -> None:
    report = gate(graph(tmp_path, "y = Log(x)"), reference(lambda x: np.log(np.abs(x))), Exact())
    row = next(r for r in report.failures if r.check == "batch 16")
    assert row.output == "y" and "ONNX has" in row.detail and "NaN/Inf" in row.detail


def test_fixed_batch_axis_is_caught_at_the_sizes_it_was_not_fixed_to(tmp_path: Path) -> None:
    path = graph(tmp_path, "y = Relu(x)", batch="2")  # the manifest says "batch", the file says 2
    report = gate(path, reference(lambda x: np.maximum(x, 0)), Exact())
    failed = {r.check: r.detail for r in report.failures}
    assert set(failed) == {"batch 1", "batch 16"}
    assert all("onnxruntime refused the input" in d for d in failed.values())


def test_every_failure_is_collected_before_raising(tmp_path: Path) -> None:
    # Unsorted nodes (checker fails) that still run in onnxruntime, and a drift that flips the argmax.
    path = graph(tmp_path, "y = Neg(t)\n t = Identity(x)", check=False)
    target = SAMPLES["x"].argmax(1)
    report = gate(path, reference(lambda x: x), Exact(), evaluation=(SAMPLES, target))
    checks = [r.check for r in report.failures]
    assert checks[0] == "checker" and {"batch 1", "batch 2", "batch 16", "metric accuracy"} <= set(checks)
    metric = next(r for r in report.failures if r.check == "metric accuracy")
    assert "reference 1.0000" in metric.detail and "> tolerance 0.001" in metric.detail
    with pytest.raises(CheckFailed) as caught:
        report.raise_on_failure("model.onnx")
    assert caught.value.exit_code == 1
    assert str(caught.value).count("FAIL") == len(report.failures)


def test_tolerance_is_the_allclose_rule(tmp_path: Path) -> None:
    path = graph(tmp_path, "y = Identity(x)")
    nudged = reference(lambda x: x + np.float32(5e-5))
    assert gate(path, nudged, Exact(atol=1e-4)).passed
    report = gate(path, nudged, Exact(atol=1e-5, rtol=0.0))
    row = report.failures[0]
    assert row.max_abs == pytest.approx(5e-5, rel=0.05) and "exceed atol 1e-05" in row.detail


def test_a_reference_that_fails_on_the_evaluation_split_is_a_row_not_a_crash(tmp_path: Path) -> None:
    path = graph(tmp_path, "y = Identity(x)")
    samples = SAMPLES["x"]

    def small_batches_only(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if len(arrays["x"]) > len(samples):
            raise RuntimeError("out of memory")
        return {"y": arrays["x"]}

    evaluation = ({"x": np.concatenate([samples] * 3)}, np.zeros(3 * len(samples), np.int64))
    report = gate(path, small_batches_only, Exact(), evaluation=evaluation)
    (row,) = report.failures
    assert row.check == "metric accuracy" and "the reference failed on the evaluation split" in row.detail
    assert "out of memory" in row.detail
