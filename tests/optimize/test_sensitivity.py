"""Node sensitivity: the error each quantized node adds, measured channel by channel."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from pipeline.optimize.quantize import QuantSettings, quantize
from pipeline.optimize.sensitivity import sensitivity


def test_a_layer_whose_one_wide_output_channel_ruins_the_others_is_scored_high(tmp_path: Path) -> None:
    """fc1's weights give output channel 0 a range 3000x the rest: one int8 scale per tensor rounds every
    other channel away. Over the whole tensor that error hides under channel 0's size; per channel it shows.
    """
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((16, 32)).astype(np.float32)
    w2 = rng.standard_normal((32, 8)).astype(np.float32)
    w1[:, 0] *= 3000.0
    w2[0, :] /= 3000.0
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
         helper.make_node("Relu", ["h"], ["r"], name="relu"),
         helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2")],
        "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    src, dst = tmp_path / "wide.onnx", tmp_path / "int8.onnx"
    onnx.save(model, str(src))
    quantize(src, dst, QuantSettings("dynamic", preprocess=False), scratch=tmp_path / "scratch")
    inputs = {"x": rng.standard_normal((64, 16)).astype(np.float32)}
    (tmp_path / "sensitivity").mkdir()
    scores = {s.node: s for s in sensitivity(src, dst, inputs, tmp_path / "sensitivity")}
    assert scores["fc1"].output_error > 0.2, scores["fc1"]  # the 31 narrow channels are mostly rounding noise
