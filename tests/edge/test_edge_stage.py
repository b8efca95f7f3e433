"""`pipe export --target edge` end to end: TFLite models converted, verified on LiteRT, recorded for devices."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from onnx import TensorProto, helper

from pipeline.artifact.directory import Artifact
from pipeline.artifact.golden import Golden, save_golden
from pipeline.artifact.manifest import Manifest
from pipeline.artifact.tensors import TensorSpec
from pipeline.artifact.variants import FP32, Variant, variant_file
from pipeline.cli import main
from pipeline.core.host import host_line
from pipeline.edge.feeding import read_metadata
from pipeline.report.variants import edge_section
from tests.edge.test_edge_convert import cnn, digits
from tests.edge.test_edge_device import ABORTS, house
from tests.edge.test_edge_runner import EDGE_PYTHON

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
    int8 = manifest.variants["tflite-int8"]  # rows of 64 columns, not pictures: float I/O, int8 inside
    assert int8.settings["int8_io"] == "float" and int8.edge.inputs[0].dtype == "float32"
    assert int8.edge.inputs[0].scale is None and int8.edge.outputs[0].dtype == "float32"
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
    kept = {rel: e.sha256 for rel, e in after.files.items() if not rel.startswith("reports/edge-convert.")}
    assert kept == before  # the other variants intact
    assert "reports/edge-convert.log" in result.output and (root / "reports" / "edge-convert.log").is_file()
    assert after.stages.edge is not None and after.stages.edge.failed == ["tflite-fp32"]
    attempts = after.stages.edge.attempts  # every onnx2tf setting was tried, and each says why it was left
    assert attempts[0].name == "onnxslim" and not attempts[-1].slim and not any(a.used for a in attempts)
    assert all(a.reason for a in attempts) and "onnx2tf attempts (5):" in result.output
    assert "onnx2tf alone" in (root / "reports" / "edge-convert.md").read_text()
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


def test_house_prices_pass_the_device_at_fp32_and_fp16_is_refused_naming_the_constant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outputs ~2e5: fp32 runs on the device runtime within its own scale (a bare 1e-3 failed it); fp16 holds the
    target mean 206,070 as inf, named before the budget it fails; a runtime that aborts on fp16 is a crash with its
    signal.
    """
    source = house(tmp_path / "house.onnx")
    x = np.random.default_rng(2).normal(size=(64, 8)).astype(np.float32)
    np.savez(tmp_path / "eval.npz", x=x, target=np.zeros(64, np.float32))
    repo = tmp_path / "artifacts"
    args = ["import", str(source), "--name", "house", "--eval-data", str(tmp_path / "eval.npz"), "--task",
            "regression", "--repository", str(repo)]  # fmt: skip
    imported = CliRunner().invoke(main, args)
    assert imported.exit_code == 0, imported.output
    real = EDGE_PYTHON if EDGE_PYTHON.exists() else Path(sys.executable)  # without .venv-edge, LiteRT stands in
    wrapper = tmp_path / "device-python"  # aborts on the fp16 model as tflite-runtime 2.14 aborts on some models
    wrapper.write_text(f'#!/bin/sh\ncase "$*" in *model.fp16.tflite*) {ABORTS.split(chr(10), 1)[1]};; esac\n'
                       f'exec {shlex.quote(str(real))} "$@"\n')  # fmt: skip
    wrapper.chmod(0o755)
    monkeypatch.setenv("PIPE_EDGE_PYTHON", str(wrapper))
    root = repo / "house" / "1"
    result = CliRunner().invoke(main, ["export", str(root), "--target", "edge", "--precision", "fp32",
                                       "--precision", "fp16"])  # fmt: skip
    assert result.exit_code == 1, result.output
    manifest = Artifact.load(root).manifest
    fp32, fp16 = manifest.variants["tflite-fp32"], manifest.variants["tflite-fp16"]
    assert fp32.passed and all(fp32.edge.runtimes.values()) and len(fp32.edge.runtimes) == 2, fp32.reason
    assert fp32.parity["max_abs"] > 1e-3  # a few fp32 steps at 2e5: what the bare 1e-3 refused
    assert fp16.reason.startswith(
        "fp16 range target_mean: constant 'target_mean' (used by node 'add_mean') holds 206,070"
    )
    table = result.output[result.output.index("tflite-fp16:\ncheck") :]  # the failure table
    first = table.splitlines()[2]  # after the model's name and the table's head: the cause first
    assert first.startswith("fp16 range") and "target_mean" in first
    assert "evaluation split" in table  # then its symptom: fp16's budget (relative error) over the split
    (device,) = [line for line in table.splitlines() if line.startswith("device ")]  # the device's row, listed
    assert " FAIL " in device and "crashed (SIGABRT) running model.fp16.tflite; last output: " in device
    assert device.endswith("malloc(): unaligned tcache chunk detected")

    feeding = json.loads((root / "edge" / "feeding.json").read_text())  # beside the models, hashed like them
    assert "edge/feeding.json" in manifest.files and "edge/labels.txt" not in manifest.files  # no labels
    entry = feeding["models"]["model.fp32.tflite"]
    assert (
        entry["names"] == fp32.edge.names and entry["inputs"][0]["name"] == "x" and entry["layout"] == "NC"
    )  # no image input: not NCHW
    assert read_metadata(root / "edge" / "model.fp32.tflite")["feeding"] == entry  # the same, inside the .tflite
    assert manifest.stages.edge.host["cpus"]
    section = "\n".join(edge_section(Artifact.load(root)))
    assert "measured on this host, not on a device: " + host_line(manifest.stages.edge.host) in section
