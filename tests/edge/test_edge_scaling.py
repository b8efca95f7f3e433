"""pipeline/edge/scaling.py on real ONNX graphs run by onnxruntime: the copy onnx2tf converts answers as model.onnx
does once the caller normalizes the inputs and multiplies the boxes back (the conversions: test_edge_conversion)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from pipeline.edge.graphcopy import write_input_dims
from pipeline.edge.scaling import normalize_boxes, take_normalization
from tests.edge.test_edge_conversion import houses
from tests.export.real_models import colour_detector


def run(model: onnx.ModelProto | Path, **inputs: np.ndarray) -> np.ndarray:
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, inputs)[0]


def test_the_detectors_boxes_are_divided_before_the_scores_join_them(tmp_path: Path) -> None:
    path = colour_detector(tmp_path / "colour.onnx")
    model = onnx.load(str(path))
    write_input_dims(model.graph, {"images": ["batch", 3, 320, 256]})
    assert normalize_boxes(model, "output0", 256, 320) == "before the scores are concatenated"
    onnx.checker.check_model(model)
    images = np.random.default_rng(0).random((2, 3, 320, 256), dtype=np.float32)
    pixels, normalized = run(path, images=images), run(model, images=images)
    assert normalized[:, :4].max() <= 1.5 and pixels[:, :4].max() > 100  # boxes in image sizes, not pixels
    np.testing.assert_array_equal(normalized[:, 4:], pixels[:, 4:])  # the scores untouched
    back = normalized[:, :4] * np.float32([256, 320, 256, 320]).reshape(1, 4, 1)
    np.testing.assert_allclose(back, pixels[:, :4], rtol=1e-5, atol=1e-3)


def test_a_leading_per_column_normalization_is_taken_out_and_a_shared_one_is_left(tmp_path: Path) -> None:
    path, x = houses(tmp_path / "houses.onnx")
    model = onnx.load(str(path))
    stats = take_normalization(model, ["x"])["x"]
    np.testing.assert_allclose(stats["mean"], x.mean(0), rtol=1e-5)
    assert [n.op_type for n in model.graph.node] == ["Gemm", "Relu", "Gemm"]
    z = (x - np.float32(stats["mean"])) / np.float32(stats["std"])
    np.testing.assert_array_equal(run(model, x=z), run(path, x=x))  # the caller's float ops are model.onnx's
    shared = onnx.load(str(path))  # the centred features also feed another node: nothing may be taken out
    shared.graph.node.append(helper.make_node("Relu", ["c"], ["c_relu"]))
    assert take_normalization(shared, ["x"]) == {} and len(shared.graph.node) == 6
