"""`pipe export --target edge` end to end: TFLite models converted, verified on LiteRT, recorded for devices."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from onnx import TensorProto, helper
from test_edge_convert import cnn, digits

from pipeline.artifact.directory import Artifact
from pipeline.artifact.golden import Golden, save_golden
from pipeline.artifact.manifest import Manifest, TensorSpec
from pipeline.artifact.variants import FP32, Variant, variant_file
from pipeline.cli import main

pytestmark = pytest.mark.slow  # onnx2tf converts in a subprocess: seconds per model

TINY_MLP = {
    "name": "edge-mlp",
    "model": {"arch": "mlp", "hidden": [32]},
    "data": {"source": "digits"},
    "train": {"epochs": 3, "batch_size": 64, "lr": 0.01},
    "optimize": {"quantize": ["dynamic"]},
}


def test_a_trained_mlp_becomes_three_verified_edge_models_that_pipe_run_keeps(tmp_path: Path) -> None:
    recipe = tmp_path / "edge-mlp.yaml"
    recipe.write_text(yaml.safe_dump(TINY_MLP))
    out = tmp_path / "artifacts"
    first = CliRunner().invoke(main, ["run", str(recipe), "--out", str(out)])
    assert first.exit_code == 0, first.output
    assert "[edge] done" in first.output
    manifest = Artifact.load(out / "edge-mlp" / "1").manifest  # every .tflite is listed with its hash
    parent = manifest.files["model.onnx"].sha256
    for precision in ("fp32", "fp16", "int8"):
        v = manifest.variants[f"tflite-{precision}"]
        assert v.passed and v.format == "tflite" and v.parent == parent, (precision, v.reason)
        assert v.file == variant_file(f"tflite-{precision}") == f"edge/model.{precision}.tflite"
        assert v.edge is not None and v.edge.inputs[0].shape[1:] == [64] and v.edge.runtimes
        assert all(v.edge.runtimes.values())  # LiteRT, and the device-like runtime when it is built
        assert abs(v.metrics["accuracy"] - manifest.metrics["accuracy"]) <= 0.015  # int8: within 1.5 points
    int8 = manifest.variants["tflite-int8"].edge
    assert int8.inputs[0].dtype == "int8" and int8.inputs[0].scale and int8.inputs[0].zero_point is not None
    record = manifest.stages.edge
    assert record is not None and record.parent == parent and set(record.seconds) == set(record.variants)

    again = CliRunner().invoke(main, ["run", str(recipe), "--out", str(out)])
    assert "[edge] up to date" in again.output, again.output


def test_an_imported_model_with_names_other_exporters_write_converts_and_passes(tmp_path: Path) -> None:
    source = cnn(tmp_path / "odd.onnx", odd_names=True)
    data = tmp_path / "eval.npz"
    x = digits(64)
    np.savez(data, x=x)
    repo = tmp_path / "artifacts"
    imported = CliRunner().invoke(main, ["import", str(source), "--name", "odd", "--eval-data", str(data),
                                         "--repository", str(repo), "--task", "embedding"])  # fmt: skip
    assert imported.exit_code == 0, imported.output
    root = repo / "odd" / "1"
    result = CliRunner().invoke(main, ["export", str(root), "--target", "edge", "--precision", "fp32",
                                       "--precision", "fp16"])  # fmt: skip
    assert result.exit_code == 0, result.output
    fp32 = Artifact.load(root).manifest.variants["tflite-fp32"]
    assert fp32.passed and fp32.edge is not None
    assert "probs@out" in {o.name for o in fp32.edge.outputs}  # model.onnx's names, mapped back
    assert fp32.parity["max_abs"] < 1e-4


def test_a_model_onnx2tf_cannot_convert_exits_1_with_its_reason_and_leaves_the_rest(tmp_path: Path) -> None:
    root = tmp_path / "artifacts" / "odd-op" / "1"
    root.mkdir(parents=True)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    node = helper.make_node("Frobnicate", ["x"], ["y"], "odd", domain="com.example")
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.example", 1)]
    model = helper.make_model(helper.make_graph([node], "g", [x], [y]), ir_version=9, opset_imports=opsets)
    spec = [TensorSpec("x", "float32", ["batch", 4])], [TensorSpec("y", "float32", ["batch", 4])]
    manifest = Manifest(name="odd-op", version=1, task="embedding", inputs=spec[0], outputs=spec[1])
    artifact = Artifact(root, manifest)
    artifact.write_file("model.onnx", model.SerializeToString())
    artifact.add_variant(FP32, Variant(file="model.onnx", precision="fp32", format="onnx", stage="import"))
    artifact.write_file(variant_file("opt"), model.SerializeToString())  # another variant, already there
    artifact.add_variant("opt", Variant(file=variant_file("opt"), precision="fp32", format="onnx", stage="optimize",
                                        parent=manifest.files["model.onnx"].sha256))  # fmt: skip
    samples = {"x": np.ones((4, 4), np.float32)}
    save_golden(artifact, Golden(samples, {"y": samples["x"]}))
    artifact.save()
    before = {rel: e.sha256 for rel, e in Artifact.load(root).manifest.files.items()}

    result = CliRunner().invoke(main, ["export", str(root), "--target", "edge", "--precision", "fp32"])
    assert result.exit_code == 1, result.output
    assert "onnx2tf could not convert" in result.output and "Frobnicate" in result.output
    after = Artifact.load(root).manifest
    kept = {rel: e.sha256 for rel, e in after.files.items() if rel != "reports/edge-convert.log"}
    assert kept == before  # the other variants intact
    assert "reports/edge-convert.log" in result.output and (root / "reports" / "edge-convert.log").is_file()
    assert after.stages.edge is not None and after.stages.edge.failed == ["tflite-fp32"]
    assert "Frobnicate" in json.dumps(after.stages.edge.settings)
    assert not (root / "edge").exists()


def test_int8_asked_for_by_name_without_real_samples_is_refused(tmp_path: Path) -> None:
    """An import without --eval-data has no samples to calibrate on: int8 named on the command line is exit 2."""
    source = cnn(tmp_path / "plain.onnx")
    repo = tmp_path / "artifacts"
    imported = CliRunner().invoke(main, ["import", str(source), "--name", "plain", "--repository", str(repo),
                                         "--task", "embedding"])  # fmt: skip
    assert imported.exit_code == 0, imported.output
    result = CliRunner().invoke(main, ["export", str(repo / "plain" / "1"), "--target", "edge",
                                       "--precision", "fp32", "--precision", "int8", "--layout", "NHWC"])  # fmt: skip
    assert result.exit_code == 2 and "--eval-data" in result.output, result.output
