"""Dynamic int8's per-tensor fallback: where per channel is the default and misses its budget, per tensor is judged too.

The models: one MatMul x [batch, 16] @ w [16, 8] whose weights are integers in [-2, 2] but one, `top`. With
top 127 every weight lies on per tensor's int8 grid (scale 1) while per channel rounds the small columns
(scale 2/127): per tensor is exact and per channel is not (worst row's cosine 1 - 3.2e-6). With top 300.3
both round, per tensor worse (worst row 0.856 against per channel's 0.937). Every input row holds 0 and 255,
so the activations' uint8 scale is 1 at any batch and only the weights' rounding differs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.optimize.int8_dynamic import INT8_DYNAMIC
from pipeline.recipe.schema import OptimizeSpec

SEPARATES = "0.999999"  # per tensor (exact) meets this worst-row cosine on the top-127 model, per channel does not


def grid_model(root: Path, name: str, top: float) -> Path:
    """`name` imported as an embedding model with 64 rows of eval data: the artifact root."""
    rng = np.random.default_rng(0)
    w = rng.integers(-2, 3, (16, 8)).astype(np.float32)
    w[0, 0] = top
    x = rng.integers(0, 256, (64, 16)).astype(np.float32)
    x[:, 0], x[:, 1] = 0.0, 255.0
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "grid",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 16])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 8])],
        [onnx.numpy_helper.from_array(w, "w")],
    )  # fmt: skip
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)], producer_name="handwritten")
    model.ir_version = 9
    onnx.save(model, str(root / f"{name}.onnx"))
    np.savez(root / f"{name}.npz", x=x)
    args = ["import", str(root / f"{name}.onnx"), "--name", name, "--task", "embedding",
            "--eval-data", str(root / f"{name}.npz"), "--repository", str(root / "repo")]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return root / "repo" / name / "1"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("int8-fallback")
    return {"exact": grid_model(root, "exact", 127.0), "coarse": grid_model(root, "coarse", 300.3)}


def optimize(root: Path, *flags: str) -> tuple[str, dict]:
    """`pipe optimize --quantize dynamic --graph none` with `flags`: (its output, int8-dynamic's manifest record)."""
    result = CliRunner().invoke(main, ["optimize", str(root), "--quantize", "dynamic", "--graph", "none", *flags])
    assert result.exit_code == 0, result.output
    return result.output, json.loads((root / "manifest.json").read_text())["variants"]["int8-dynamic"]


def test_the_fallback_is_only_for_a_per_channel_left_unset() -> None:
    assert INT8_DYNAMIC.config(OptimizeSpec(), "embedding").fallback is True
    for asked in (True, False):
        settings = INT8_DYNAMIC.config(OptimizeSpec(per_channel=asked), "embedding")
        assert settings.per_channel is asked and settings.fallback is False
    assert "fallback" not in INT8_DYNAMIC.config(OptimizeSpec(), "embedding").to_dict()  # recorded: what was made


def test_per_tensor_is_kept_where_the_default_per_channel_misses_and_it_passes(models: dict[str, Path]) -> None:
    output, variant = optimize(models["exact"], "--min-cosine", SEPARATES)
    assert "per channel (the default) missed its budget; trying per tensor" in output
    assert variant["status"] == "passed", variant["reason"]
    assert variant["settings"]["per_channel"] is False and variant["settings"]["kept"] == "per-tensor"
    assert variant["note"].startswith("per-tensor kept (passed); per channel failed: ")
    assert "worst row 0.999997" in variant["note"]  # per channel's own verdict, figure and budget
    assert variant["parity"]["budget_figure"] == pytest.approx(1.0, abs=1e-6)  # the kept file's figure
    files = {p.name for p in (models["exact"] / "variants").iterdir()}
    assert files == {"model.int8-dynamic.onnx"}  # the candidate set aside is not left behind


def test_an_explicit_per_channel_is_obeyed_and_a_passing_default_makes_one_candidate(models: dict[str, Path]) -> None:
    output, variant = optimize(models["exact"], "--min-cosine", SEPARATES, "--per-channel")
    assert variant["status"] == "failed" and "worst row 0.999997" in variant["reason"]
    assert variant["settings"]["per_channel"] is True and "kept" not in variant["settings"]
    assert "trying per tensor" not in output

    output, variant = optimize(models["exact"])  # the default budget: per channel passes, per tensor never made
    assert variant["status"] == "passed" and variant["settings"]["per_channel"] is True
    assert "kept" not in variant["settings"] and "trying per tensor" not in output


def test_when_neither_passes_the_closer_is_recorded_as_failed_with_the_others_verdict(models: dict[str, Path]) -> None:
    output, variant = optimize(models["coarse"], "--min-cosine", "0.99")
    assert "trying per tensor" in output
    assert variant["status"] == "failed"
    assert variant["settings"]["per_channel"] is True and variant["settings"]["kept"] == "per-channel"
    assert variant["note"].startswith("per-channel kept (closer to the budget); per tensor failed: ")
    assert variant["parity"]["budget_figure"] > 0.98  # per channel's mean cosine 0.992; per tensor's is 0.957
