"""A candidate that fails says which node and what to do, and never costs the run its other variants (issue 28).

Real failures, not injected ones: onnxruntime's fp16 converter leaves a Celu reading fp16, which the
ONNX type rules refuse (Celu takes float only); shape inference writes a free output dim as the size it
computes, which pipe's own pre-processing used to count as a changed signature.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from pipeline.artifact.directory import Artifact
from pipeline.cli import main
from pipeline.core.errors import ArtifactError
from pipeline.optimize.graph import error_line, failing_nodes, optimize_graph, signature
from pipeline.optimize.quantize import QuantSettings
from pipeline.optimize.quantizers import quantize

LONG = "encoder.block_3.activation_celu_" + "x" * 300  # longer than an error line's cut


def mlp(path: Path, activation: str = "Relu", output_dims: tuple[str | int, ...] = ("batch", 8)) -> Path:
    """x [batch, 16] -> MatMul -> `activation` (named LONG) -> MatMul -> y, declared `output_dims`."""
    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((16, 32)).astype(np.float32), rng.standard_normal((32, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
         helper.make_node(activation, ["h"], ["a"], name=LONG),
         helper.make_node("MatMul", ["a", "w2"], ["y"], name="fc2")],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(output_dims))],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), str(path))
    return path


def test_a_candidate_onnxruntime_cannot_load_names_its_node_whole_and_the_one_to_exclude(tmp_path: Path) -> None:
    src = mlp(tmp_path / "celu.onnx", "Celu")
    with pytest.raises(ArtifactError) as refused:
        quantize(src, tmp_path / "fp16.onnx", QuantSettings("fp16"))
    message = str(refused.value)
    assert f"in node ({LONG})" in message  # whole, not cut mid-name at 300 characters
    assert f"exclude '{LONG}' (nodes_to_exclude)" in message, message  # the advice names the node
    assert not (tmp_path / "fp16.onnx").exists()
    excluded = quantize(src, tmp_path / "fp16.onnx", QuantSettings("fp16", nodes_to_exclude=(LONG,)))
    assert excluded.excluded == [LONG]  # the advice works


def test_an_error_line_is_cut_after_the_node_names_it_gives() -> None:
    line = f'[ONNXRuntimeError] : 10 : INVALID_GRAPH : In Node, ("{LONG}", Celu, "", -1) : ("h": tensor(float16),) ...'
    assert error_line(RuntimeError(line + "\nsecond line")).endswith(f'("{LONG}"')
    assert failing_nodes(line) == [LONG] and failing_nodes(f"in node ({LONG}) and in node (fc2)") == [LONG, "fc2"]
    assert error_line(RuntimeError("x" * 500)) == "x" * 300


@pytest.mark.parametrize("mode", ["dynamic", "static", "fp16"])
def test_a_free_output_dim_that_shape_inference_computes_costs_no_candidate(tmp_path: Path, mode: str) -> None:
    """MiniLM imported from its directory: `embedding` [batch, Divembedding_dim_1], which is 384 when run."""
    src = mlp(tmp_path / "embedding.onnx", output_dims=("batch", "Divembedding_dim_1"))
    samples = {"x": np.random.default_rng(1).standard_normal((32, 16)).astype(np.float32)}
    dst = tmp_path / f"{mode}.onnx"
    quantize(src, dst, QuantSettings(mode), samples if mode == "static" else None)  # refused before
    assert signature(onnx.load(str(dst))) == signature(onnx.load(str(src)))  # declared as the original declares it
    for level in ("basic", "extended"):
        report = optimize_graph(src, tmp_path / f"opt-{level}.onnx", level)  # type: ignore[arg-type]
        assert all(step.kept for step in report.steps), report.steps  # onnxslim's result no longer refused


def test_one_kind_that_fails_is_recorded_failed_and_the_others_are_kept(tmp_path: Path) -> None:
    src = mlp(tmp_path / "celu.onnx", "Celu")
    rng = np.random.default_rng(2)
    np.savez(tmp_path / "eval.npz", x=rng.standard_normal((48, 16)).astype(np.float32))
    repo = tmp_path / "artifacts"
    imported = CliRunner().invoke(main, ["import", str(src), "--name", "celu", "--eval-data",
                                         str(tmp_path / "eval.npz"), "--repository", str(repo)])  # fmt: skip
    assert imported.exit_code == 0, imported.output
    root = repo / "celu" / "1"

    args = ["optimize", str(root), "--quantize", "fp16", "--quantize", "dynamic", "--quantize", "auto"]
    result = CliRunner().invoke(main, args)

    assert result.exit_code == 0, result.output  # before: the fp16 failure ended the run, nothing written
    manifest = Artifact.load(root).manifest
    fp16 = manifest.variants["fp16"]
    assert not fp16.passed and fp16.file not in manifest.files and not (root / fp16.file).exists()
    assert f"exclude '{LONG}'" in fp16.reason, fp16.reason
    assert manifest.variants["opt"].passed
    for name in ("opt", "int8-dynamic", "int8"):  # made before fp16 and after it, each written, judged, timed
        variant = manifest.variants[name]
        assert variant.file in manifest.files and variant.latency and variant.parity, (name, variant.reason)
    record = manifest.stages.optimize
    assert record is not None and record.variants == ["opt", "int8-dynamic", "fp16", "int8"] and "fp16" in record.failed
    assert "| fp16 | failed |" in (root / "reports" / "optimize.md").read_text()


LAYER_NORM_OPSET_12 = """
<ir_version: 7, opset_import: ["" : 12]>
ln (float[N, 8] x) => (float[N, 8] y)
<float[8] gamma = {1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0}, float[8] beta = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0},
 float two = {2.0}, float eps = {0.00001}>
{
  mean = ReduceMean <axes = [-1]> (x)
  d = Sub(x, mean)
  sq = Pow(d, two)
  var = ReduceMean <axes = [-1]> (sq)
  ve = Add(var, eps)
  sd = Sqrt(ve)
  n = Div(d, sd)
  g = Mul(n, gamma)
  y = Add(g, beta)
}
"""


def test_a_fusion_the_models_opset_lacks_is_retried_at_basic_and_the_level_recorded(tmp_path: Path) -> None:
    """PP-OCRv4's recognizer (opset 12) at extended: onnxruntime fuses its layer norms into LayerNormalization,
    an opset-17 op the checker refuses. `opt` was then not made at all; now basic, the next lower level, makes
    it, and the report says extended was asked, why it was refused and that basic made it."""
    src = tmp_path / "ln.onnx"
    onnx.save(onnx.parser.parse_model(LAYER_NORM_OPSET_12), str(src))
    report = optimize_graph(src, tmp_path / "opt.onnx", "extended")
    assert (report.asked, report.level) == ("extended", "basic")
    assert "LayerNormalization" not in report.ops_after and (tmp_path / "opt.onnx").exists()
    ort_step = report.steps[0]
    assert ort_step.setting == "level=basic" and "level extended refused: onnx's checker" in ort_step.note
    assert any("No Op registered for LayerNorm" in w and "made at basic" in w for w in report.warnings)
    onnx.checker.check_model(str(tmp_path / "opt.onnx"))


def test_a_model_shipped_quantized_gets_no_int8_kind_and_a_note_that_says_why(tmp_path: Path) -> None:
    """ddddocr's recognizer ships dynamically quantized (ConvInteger, MatMulInteger, DynamicQuantizeLSTM): static
    int8 of it stopped in onnxruntime (`KeyError: '140_scale'`). Its int8 kinds are skipped with a note."""
    from onnxruntime.quantization import quantize_dynamic

    from pipeline.optimize.fp16 import FP16
    from pipeline.optimize.int8_auto import AutoInt8
    from pipeline.optimize.int8_dynamic import INT8_DYNAMIC
    from pipeline.optimize.int8_static import INT8_STATIC

    fp32 = mlp(tmp_path / "mlp.onnx")
    shipped = tmp_path / "shipped.onnx"
    quantize_dynamic(str(fp32), str(shipped))
    settings = QuantSettings("static")
    assert INT8_STATIC.skip(fp32, settings) == "" and INT8_DYNAMIC.skip(fp32, settings) == ""
    why = INT8_STATIC.skip(shipped, settings)
    assert why.startswith("int8-static not made: the model is quantized already (") and "MatMulInteger" in why
    assert INT8_DYNAMIC.skip(shipped, settings).startswith("int8-dynamic not made: the model is quantized already")
    assert AutoInt8().skip(shipped, None).startswith("int8 not made: the model is quantized already")  # type: ignore[arg-type]
    assert FP16.skip(shipped, QuantSettings("fp16")) == ""  # fp16 of the float parts is still asked for
