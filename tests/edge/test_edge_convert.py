"""ONNX -> TFLite with onnx2tf (pipeline/edge/convert.py), run for real on tiny models built here.

Each conversion starts tensorflow in a child process (about 10 s), so these are few and marked slow.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_digits

from pipeline.core.errors import CheckFailed, InputError
from pipeline.edge.convert import SAMPLE_FILE, EdgeSettings, convert
from pipeline.edge.graphcopy import sanitize

pytestmark = pytest.mark.slow


def digits(n: int) -> np.ndarray:
    """The first `n` sklearn digits as [n, 1, 8, 8] float32 in [0, 1]."""
    return (load_digits().images[:n] / 16.0).astype(np.float32)[:, None]


def cnn(path: Path, x_name: str = "x", batch: int | str = "batch", channels: int = 1, odd_names: bool = False) -> Path:
    """A digits-shaped CNN: Conv 3x3 -> Relu -> Flatten -> MatMul -> Softmax, with fixed random weights.

    `odd_names` names things as other exporters do (`Softmax@0`, `/conv/Conv`, `r:0`), which
    onnx2tf rejects or rewrites.
    """
    rng = np.random.default_rng(0)

    def n(plain: str, odd: str) -> str:
        return odd if odd_names else plain

    weights = [
        numpy_helper.from_array(rng.normal(0, 0.5, (4, channels, 3, 3)).astype(np.float32), n("w", "conv.weight")),
        numpy_helper.from_array(rng.normal(0, 0.1, (4,)).astype(np.float32), n("b", "conv.bias")),
        numpy_helper.from_array(rng.normal(0, 0.2, (256, 10)).astype(np.float32), n("fc", "fc/weight:0")),
    ]
    w, b, fc = (t.name for t in weights)
    nodes = [
        helper.make_node(
            "Conv", [x_name, w, b], [n("c", "/conv/Conv_output_0")], n("conv", "/conv/Conv"), pads=[1] * 4
        ),
        helper.make_node("Relu", [n("c", "/conv/Conv_output_0")], [n("r", "r:0")], n("relu", "Relu@0")),
        helper.make_node("Flatten", [n("r", "r:0")], [n("f", "/flat/out")], n("flat", "/flat/Flatten")),
        helper.make_node("MatMul", [n("f", "/flat/out"), fc], [n("logits", "logits/0")], n("fc", "MatMul@1")),
        helper.make_node("Softmax", [n("logits", "logits/0")], [n("probs", "probs@out")], n("softmax", "Softmax@0")),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info(x_name, TensorProto.FLOAT, [batch, channels, 8, 8])],
        [
            helper.make_tensor_value_info(n("probs", "probs@out"), TensorProto.FLOAT, [batch, 10]),
            helper.make_tensor_value_info(n("logits", "logits/0"), TensorProto.FLOAT, [batch, 10]),
        ],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def run_tflite(path: Path, feed: dict[str, np.ndarray], outputs: list[dict], names: dict[str, str]) -> list:
    """Run the .tflite at `path` on `feed` (the edge model's layout, model.onnx's names); outputs in model.onnx's order.

    A tensor's own name is its signature key when the model has one signature (int8), else its
    tensor name; `names` maps model.onnx's names to those where they differ.
    """
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    details = {d["index"]: d for d in [*interpreter.get_input_details(), *interpreter.get_output_details()]}
    own = {d["name"]: i for i, d in details.items()}
    for signature in interpreter._get_full_signature_list().values():
        own = {**signature["inputs"], **signature["outputs"]}
    for name, x in feed.items():
        interpreter.resize_tensor_input(own[names.get(name, name)], list(x.shape))
    interpreter.allocate_tensors()
    for name, x in feed.items():
        d = details[own[names.get(name, name)]]
        if d["quantization"][0]:
            scale, zero_point = d["quantization"]
            x = np.clip(np.round(x / scale) + zero_point, -128, 127).astype(d["dtype"])
        interpreter.set_tensor(d["index"], x)
    interpreter.invoke()
    results = []
    for output in outputs:
        d = details[own[names.get(output["name"], output["name"])]]
        y = interpreter.get_tensor(d["index"]).astype(np.float32)
        if d["quantization"][0]:
            y = (y - d["quantization"][1]) * d["quantization"][0]
        results.append(y)
    return results


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_digits_cnn_converts_to_fp32_fp16_int8_and_fp32_matches_onnxruntime(tmp_path: Path) -> None:
    source = cnn(tmp_path / "model.onnx")
    before = sha256(source)
    calibration = {"x": digits(64)}
    made = convert(source, tmp_path / "work", EdgeSettings(), calibration)

    assert sha256(source) == before  # onnx2tf converted a copy
    assert [c.precision for c in made] == ["fp32", "fp16", "int8"]
    assert all(c.path.is_file() and c.input_layout == "NHWC" and c.seconds > 0 for c in made)
    assert (tmp_path / "work" / "onnx2tf" / SAMPLE_FILE).is_file()
    fp32, fp16, int8 = made
    assert fp32.inputs == [{"name": "x", "dtype": "float32", "shape": [-1, 8, 8, 1], "scale": None, "zero_point": None}]
    assert [o["name"] for o in fp32.outputs] == ["probs", "logits"]
    assert int8.inputs[0]["dtype"] == "int8" and int8.inputs[0]["scale"] > 0
    assert int8.outputs[0]["dtype"] == "int8" and isinstance(int8.outputs[0]["zero_point"], int)

    session = ort.InferenceSession(str(source))
    for batch in (1, 3):
        x = digits(3 + batch)[-batch:]
        expected = session.run(None, {"x": x})
        nhwc = {"x": x.transpose(0, 2, 3, 1)}
        for c, atol in ((fp32, 1e-5), (fp16, 1e-2), (int8, 0.05)):
            got = run_tflite(c.path, nhwc, c.outputs, c.names)
            for e, g in zip(expected, got, strict=True):
                assert g.shape == e.shape
                assert np.abs(g - e).max() <= atol * max(1.0, np.abs(e).max()), (c.precision, batch)


def test_nchw_layout_keeps_the_servers_input(tmp_path: Path) -> None:
    source = cnn(tmp_path / "model.onnx")
    (fp32,) = convert(source, tmp_path / "work", EdgeSettings(precisions=("fp32",), layout="nchw"), None)
    assert fp32.input_layout == "NCHW" and fp32.inputs[0]["shape"] == [-1, 1, 8, 8]
    x = digits(3)
    expected = ort.InferenceSession(str(source)).run(None, {"x": x})
    for e, g in zip(expected, run_tflite(fp32.path, {"x": x}, fp32.outputs, fp32.names), strict=True):
        np.testing.assert_allclose(g, e, atol=1e-5)


def test_names_other_exporters_write_are_sanitized_on_a_copy_and_mapped_back(tmp_path: Path) -> None:
    # A fixed batch of 3-channel images is the case where onnx2tf fetches sample pictures from the
    # internet; the child has no route to it, so this passes only with the sample file in place.
    source = cnn(tmp_path / "model.onnx", x_name="input/x:0", batch=1, channels=3, odd_names=True)
    before = sha256(source)
    x = np.stack([digits(3)[:, 0]] * 3, axis=1)[:1]  # [1, 3, 8, 8]
    (fp32,) = convert(source, tmp_path / "work", EdgeSettings(precisions=("fp32",)), {"input/x:0": x})

    assert sha256(source) == before
    assert [i["name"] for i in fp32.inputs] == ["input/x:0"] and [o["name"] for o in fp32.outputs] == [
        "probs@out",
        "logits/0",
    ]
    assert fp32.names["input/x:0"] == "input_x_0" and fp32.inputs[0]["shape"] == [1, 8, 8, 3]
    expected = ort.InferenceSession(str(source)).run(None, {"input/x:0": x})
    got = run_tflite(fp32.path, {"input/x:0": x.transpose(0, 2, 3, 1)}, fp32.outputs, fp32.names)
    for e, g in zip(expected, got, strict=True):
        np.testing.assert_allclose(g, e, atol=1e-5)


def test_a_model_onnx2tf_cannot_convert_fails_with_its_reason(tmp_path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    graph = helper.make_graph(
        [helper.make_node("Frobnicate", ["x"], ["y"], "odd", domain="com.example")], "g", [x], [y]
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.example", 1)], ir_version=9
    )
    source = tmp_path / "model.onnx"
    onnx.save(model, str(source))
    with pytest.raises(CheckFailed, match="onnx2tf could not convert") as caught:
        convert(source, tmp_path / "work", EdgeSettings(precisions=("fp32",)), None)
    assert "Frobnicate OP is not yet implemented" in str(caught.value) and "Traceback" not in str(caught.value)


def test_int8_of_a_token_model_is_refused_before_converting(tmp_path: Path) -> None:
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 5])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, ["batch", 5])
    graph = helper.make_graph([helper.make_node("Identity", ["ids"], ["y"])], "g", [ids], [y])
    source = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), str(source))
    with pytest.raises(InputError, match="int8 not made: full-integer int8 calibrates float inputs only"):
        convert(source, tmp_path / "work", EdgeSettings(precisions=("int8",)), {"ids": np.zeros((4, 5), np.int64)})


def test_sanitize_renames_consistently_and_keeps_empty_names() -> None:
    model = onnx.parser.parse_model("""
    <ir_version: 9, opset_import: ["" : 18]>
    g (float[N, 4] "in/x:0") => (float[N, 4] "out@0") {
        "/a/b" = Relu("in/x:0")
        "out@0" = Clip("/a/b", , )
    }
    """)
    mapping = sanitize(model.graph)
    assert mapping == {"in/x:0": "in_x_0", "/a/b": "a_b", "out@0": "out_0"}
    assert [n.input[:] for n in model.graph.node] == [["in_x_0"], ["a_b", ""]]
    assert model.graph.input[0].name == "in_x_0" and model.graph.output[0].name == "out_0"
    onnx.checker.check_model(model, full_check=True)


def test_a_table_input_is_recorded_as_nc_not_nchw(tmp_path: Path) -> None:
    """A model without image inputs is transposed nowhere; its record says its own layout, not NCHW."""
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])
    w = numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(4, 2) / 8, "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["input", "w"], ["logits"])], "table", [x], [y], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    onnx.save(model, str(tmp_path / "model.onnx"))
    (fp32,) = convert(tmp_path / "model.onnx", tmp_path / "work", EdgeSettings(precisions=("fp32",)), None)
    assert fp32.input_layout == "NC" and fp32.inputs[0]["shape"] == [-1, 4]
    features = np.ones((3, 4), np.float32)
    (got,) = run_tflite(fp32.path, {"input": features}, fp32.outputs, fp32.names)
    np.testing.assert_allclose(got, features @ (np.arange(8, dtype=np.float32).reshape(4, 2) / 8), atol=1e-5)
