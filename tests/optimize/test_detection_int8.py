"""A detector's int8 variants, judged as detections: the YOLOv8-layout colour detector (tests/export/real_models.py)
quantized by static QDQ keeps its boxes only with its decode tail in fp32 (one int8 scale over the head's
Concat of pixel boxes and 0..1 scores makes every score 0 or one step); both int8 modes keep the output's
free `anchors` dim; `pipe optimize` judges the variant by box agreement and says so in its report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.optimize.graph import signature
from pipeline.optimize.nodes import decode_tail
from pipeline.optimize.quantize import QuantSettings
from pipeline.optimize.quantizers import quantize
from pipeline.runtime.detection import compare_outputs
from pipeline.runtime.runners import ort_runner
from tests.export.real_models import SIZES, colour_detector, letterboxed, shapes_picture


@pytest.fixture(scope="module")
def detector(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    """The colour detector and eight letterboxed pictures of shapes (its calibration and test inputs)."""
    root = tmp_path_factory.mktemp("detector")
    samples = [letterboxed(shapes_picture(SIZES[i % len(SIZES)], seed=i))[0] for i in range(8)]
    return colour_detector(root / "colour.onnx"), {"images": np.stack(samples)}


def test_the_decode_tail_is_everything_after_the_last_convolution(detector) -> None:
    model = onnx.load(str(detector[0]))
    from pipeline.optimize.nodes import name_nodes

    name_nodes(model)
    tail = set(decode_tail(model))
    nodes = {node.name: node for node in model.graph.node}
    assert not any(nodes[name].op_type == "Conv" for name in tail)
    producer = {o: n for n in model.graph.node for o in n.output}
    final = producer[model.graph.output[0].name]
    assert final.op_type == "Concat" and final.name in tail  # the output's own Concat
    sigmoids = [n.name for n in model.graph.node if n.op_type == "Sigmoid"]
    assert sigmoids and set(sigmoids) <= tail  # every score and box activation after the convs
    assert {n.name for n in model.graph.node if n.op_type == "Conv"}.isdisjoint(tail)


def test_static_int8_keeps_the_boxes_only_with_the_tail_in_fp32(detector, tmp_path: Path) -> None:
    src, inputs = detector
    want = ort_runner(src)(inputs)["output0"]
    agreement = {}
    for float_tail in (False, True):
        dst = tmp_path / f"int8-{float_tail}.onnx"
        report = quantize(src, dst, QuantSettings("static", per_channel=True, float_tail=float_tail), inputs)
        assert report.quant_ops.get("QuantizeLinear", 0) > 0
        assert bool(report.float_tail) == float_tail
        got = ort_runner(dst)(inputs)["output0"]
        boxes = compare_outputs(got, want, 0.25, 0.7, 300)
        agreement[float_tail] = (boxes.agreement, boxes.mean_iou, float(np.abs(got[:, 4:] - want[:, 4:]).max()))
        assert signature(onnx.load(str(dst))) == signature(onnx.load(str(src)))  # 'anchors' kept by name
    assert agreement[True][0] >= 0.95 and agreement[True][1] >= 0.99 and agreement[True][2] < 0.05, agreement
    assert agreement[False][0] < 0.9 and agreement[False][2] > 0.2, agreement  # the scores are one int8 step apart
    described = QuantSettings("static", float_tail=True).describe()
    assert described.endswith("decode tail in fp32")


def test_dynamic_int8_keeps_the_free_anchors_dim(detector, tmp_path: Path) -> None:
    src, _ = detector
    quantize(src, tmp_path / "dynamic.onnx", QuantSettings("dynamic"))
    dims = signature(onnx.load(str(tmp_path / "dynamic.onnx")))["outputs"][0][2]
    assert dims == ["batch", 7, "anchors"]


@pytest.mark.slow
def test_pipe_optimize_judges_a_detector_by_box_agreement(detector, tmp_path: Path) -> None:
    pictures = tmp_path / "pictures"
    pictures.mkdir()
    for i in range(6):
        shapes_picture(SIZES[i % len(SIZES)], seed=i).save(pictures / f"{i}.{'jpg' if i % 3 == 2 else 'png'}")
    runner = CliRunner()
    made = runner.invoke(main, ["import", str(detector[0]), "--name", "shapes", "--eval-data", str(pictures),
                                "--repository", str(tmp_path / "artifacts")])  # fmt: skip
    assert made.exit_code == 0, made.output
    version = tmp_path / "artifacts" / "shapes" / "1"
    result = runner.invoke(main, ["optimize", str(version), "--quantize", "static", "--graph", "none"])
    assert result.exit_code == 0, result.output
    assert "budget box agreement" in result.output
    assert "[optimize] int8-static: passed: box agreement" in result.output
    manifest = json.loads((version / "manifest.json").read_text())
    variant = manifest["variants"]["int8-static"]
    assert variant["status"] == "passed" and variant["metrics"]["box_agreement"] >= 0.9
    assert variant["settings"]["float_tail"] is True
    report = (version / "reports" / "optimize.md").read_text()
    assert "- judged as detections: each model's head output decoded into boxes (confidence > 0.25" in report
    assert "int8-static: the" in report and "(the decode tail) were left in fp32" in report
