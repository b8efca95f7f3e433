"""End to end: train each zoo family briefly with `pipe train`'s stage, then `pipe export` it through the gate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest
import yaml
from click.testing import CliRunner
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from pipeline.artifact.directory import Artifact
from pipeline.cli import main
from pipeline.export.metadata import read_metadata
from pipeline.export.opset import default_opset

TOKENS = Path(__file__).resolve().parents[2] / "models" / "data" / "tokens.npz"
TINY_TRAIN = {"epochs": 1, "batch_size": 128, "seed": 0, "device": "cpu", "warmup_steps": 0}
DIGITS = {"source": "digits"}
SEQUENCE = {"source": "tokens", "path": str(TOKENS)}
RECIPES: dict[str, dict[str, Any]] = {
    "mlp": {"model": {"arch": "mlp", "hidden": [32]}, "data": DIGITS},
    "cnn": {"model": {"arch": "cnn", "channels": [8], "hidden": 16}, "data": {**DIGITS, "as_image": True}},
    "transformer": {
        "model": {"arch": "transformer", "d_model": 16, "heads": 2, "layers": 1, "max_len": 32},
        "data": SEQUENCE,
    },
    "moe": {
        "model": {"arch": "moe", "d_model": 16, "heads": 2, "layers": 1, "max_len": 32, "experts": 4, "top_k": 2},
        "data": SEQUENCE,
    },
    "broken": {"model": {"arch": "custom", "factory": "tests.export.export_models:branching_digits"}, "data": DIGITS},
}


def trained(family: str, tmp_path: Path) -> Path:
    """Train the tiny recipe in-process (the train stage's own function) and return the artifact root."""
    from pipeline.train.stage import train_recipe

    recipe = {"name": f"zoo-{family}", **RECIPES[family], "train": TINY_TRAIN}
    path = tmp_path / f"zoo-{family}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return train_recipe(path, out_root=tmp_path / "artifacts", quiet=True)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["mlp", "cnn", "transformer", "moe"])
def test_trained_zoo_model_exports_through_the_gate(family: str, tmp_path: Path) -> None:
    root = trained(family, tmp_path)
    result = CliRunner().invoke(main, ["export", str(root)])
    assert result.exit_code == 0, result.output

    artifact = Artifact.load(root)  # model.onnx is listed with its hash
    record = artifact.manifest.stages.export
    assert record.exporter == "dynamo" and record.opset == 18 and record.parity["passed"]
    checks = {row["check"] for row in record.parity["rows"]}
    assert {"batch 1", "batch 2", "batch 16", "golden (recorded)", "metric accuracy"} <= checks
    if family in ("transformer", "moe"):  # two sequence lengths: the golden length and half of it
        assert "batch 2, sequence 16" in checks
    assert record.metric["onnx"] == pytest.approx(artifact.manifest.metrics["accuracy"], abs=1e-3)
    assert read_metadata(artifact.path("model.onnx"))["pipe.identity_digest"] == artifact.manifest.identity_digest()
    graph_input = onnx.load(str(artifact.path("model.onnx"))).graph.input[0]
    assert [d.dim_param or d.dim_value for d in graph_input.type.tensor_type.shape.dim] == artifact.manifest.inputs[
        0
    ].shape

    if family == "mlp":  # another opset on request: converted down and gated again
        again = CliRunner().invoke(main, ["export", str(root), "--opset", "17"])
        assert again.exit_code == 0, again.output
        assert Artifact.load(root).manifest.stages.export.opset == 17
        assert default_opset(onnx.load(str(root / "model.onnx"))) == 17

    if family == "cnn":  # the same verified file, handed to Triton
        out = tmp_path / "triton"
        triton = CliRunner().invoke(main, ["export", str(root), "--target", "triton", "--out", str(out)])
        assert triton.exit_code == 0, triton.output
        config = text_format.Parse((out / "zoo-cnn" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
        assert [list(t.dims) for t in config.input] == [[1, 8, 8]] and config.max_batch_size == 64
        assert (out / "zoo-cnn" / "1" / "model.onnx").read_bytes() == artifact.path("model.onnx").read_bytes()


@pytest.mark.slow
def test_model_branching_on_batch_size_exits_1_and_is_not_marked_exported(tmp_path: Path) -> None:
    root = trained("broken", tmp_path)
    before = (root / "manifest.json").read_bytes()
    result = CliRunner().invoke(main, ["export", str(root)])
    assert result.exit_code == 1, result.output
    assert "failed the parity gate" in result.output
    failing = [line for line in result.output.splitlines() if line.startswith("batch 1 ")]
    assert failing and "logits" in failing[0] and "FAIL" in failing[0] and "exceed atol" in failing[0]
    assert (root / "manifest.json").read_bytes() == before  # not marked exported
    assert not (root / "model.onnx").exists() and not [p for p in root.iterdir() if p.name.startswith(".export-")]


@pytest.mark.slow
def test_an_export_interrupted_after_moving_its_file_is_repaired_by_exporting_again(tmp_path: Path) -> None:
    root = trained("mlp", tmp_path)
    assert CliRunner().invoke(main, ["export", str(root)]).exit_code == 0
    # The crash window of a commit: a new model.onnx is in place, the manifest still lists the old one.
    (root / "model.onnx").write_bytes((root / "model.onnx").read_bytes() + b"\0")
    refused = CliRunner().invoke(main, ["info", str(root)])
    assert refused.exit_code == 2 and "model.onnx: size" in refused.output  # readers refuse it
    again = CliRunner().invoke(main, ["export", str(root)])
    assert again.exit_code == 0, again.output  # export replaces what it writes instead of refusing it
    assert Artifact.load(root).manifest.variants["fp32"].passed
