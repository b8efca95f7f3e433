"""A ConvTranspose converts only at a fixed batch: the copy's batch fixed at 1, fed one sample a call.

onnx2tf 1.28.8 writes TFLite's TRANSPOSE_CONV output shape from the ONNX one and stops on a free batch
(`Expected int32 ... got ['unk__6', 160, 160, 24]`): PP-OCRv4's text detector was refused at every setting,
3.5 min, and converts with its batch fixed at 1 (docs/edge.md, "Known limits"). A model holding a
ConvTranspose now tries that first; the gate and the runner feed such a model one sample a call.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.core.errors import InputError
from pipeline.edge.attempts import ATTEMPTS, BATCH_ONE, attempts_for, convert_in_turn, op_types
from pipeline.edge.convert import Converted, EdgeSettings
from pipeline.runtime.runners import fixed_batch, in_fixed_batches, ort_runner, tflite_candidate


def upsampler(path: Path) -> Path:
    """x [batch, 2, 6, 6] -> Conv 3x3 -> ConvTranspose 2x2, stride 2 -> Relu -> y [batch, 3, 12, 12]."""
    rng = np.random.default_rng(0)
    c = numpy_helper.from_array(rng.normal(0, 0.5, (2, 2, 3, 3)).astype(np.float32), "c")
    w = numpy_helper.from_array(rng.normal(0, 0.5, (2, 3, 2, 2)).astype(np.float32), "w")
    nodes = [  # as PP-OCRv4's detector upsamples: a conv, then a 2x2 ConvTranspose of stride 2, no bias
        helper.make_node("Conv", ["x", "c"], ["h"], "conv", pads=[1] * 4),
        helper.make_node(
            "ConvTranspose",
            ["h", "w"],
            ["u"],
            "up",
            kernel_shape=[2, 2],
            strides=[2, 2],
            pads=[0] * 4,
            dilations=[1, 1],
            group=1,
        ),
        helper.make_node("Relu", ["u"], ["y"], "relu"),
    ]
    graph = helper.make_graph(
        nodes, "up", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, 12, 12])], [c, w],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_a_model_holding_a_conv_transpose_tries_the_fixed_batch_first(tmp_path: Path) -> None:
    ops = op_types(upsampler(tmp_path / "up.onnx"))
    assert {"ConvTranspose", "Relu"} <= ops
    assert attempts_for("tensor", ops) == (BATCH_ONE, *ATTEMPTS)
    assert attempts_for("classification", {"Conv", "Relu"}) == ATTEMPTS
    assert attempts_for("detection", ops)[:2] == (BATCH_ONE, ATTEMPTS[1])  # then the Ultralytics settings


def test_a_fixed_batch_runner_is_fed_that_many_samples_a_call() -> None:
    calls: list[int] = []

    def run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        calls.append(len(inputs["x"]))
        return {"y": inputs["x"] * 2}

    x = np.arange(10, dtype=np.float32).reshape(5, 2)
    got = in_fixed_batches(run, 1)({"x": x})
    np.testing.assert_array_equal(got["y"], x * 2)
    assert calls == [1] * 5
    assert in_fixed_batches(run, None) is run
    with pytest.raises(InputError, match="5 samples do not fill batches of 2"):
        in_fixed_batches(run, 2)({"x": x})
    assert fixed_batch([{"shape_signature": np.array([1, 12, 12, 3]), "shape": np.array([1, 12, 12, 3])}]) == 1
    assert fixed_batch([{"shape_signature": np.array([-1, 12, 12, 3]), "shape": np.array([1, 12, 12, 3])}]) is None


@pytest.mark.slow
def test_a_conv_transpose_converts_at_batch_1_and_answers_every_batch_as_onnxruntime(tmp_path: Path) -> None:
    model = upsampler(tmp_path / "up.onnx")
    settings = EdgeSettings(("fp32",), input_dims={"x": ["batch", 2, 6, 6]}, timeout_s=900)
    x = np.random.default_rng(1).normal(0, 1, (5, 2, 6, 6)).astype(np.float32)

    def judge(made: list[Converted]) -> object:
        (fp32,) = made
        assert fp32.fixed_batch == 1
        with pytest.raises(RuntimeError, match="only allows mutating unknown dimensions"):  # fed whole: refused
            tflite_candidate(fp32.path, names=fp32.names, layout=fp32.input_layout).run({"x": x})
        got = tflite_candidate(fp32.path, names=fp32.names, layout=fp32.input_layout, batch=1).run({"x": x})["y"]
        np.testing.assert_allclose(got, ort_runner(model)({"x": x})["y"], atol=1e-5)
        return type("Passed", (), {"failure": None, "stopped": None, "made": made})()

    judged, tried = convert_in_turn(model, tmp_path / "work", settings, None, judge, (BATCH_ONE,))
    assert tried[0].name == BATCH_ONE.name and tried[0].used and tried[0].options == {"fixed_batch": 1}
    assert judged.made[0].inputs[0]["shape"] == [1, 6, 6, 2]  # NHWC, one sample a call
