"""A constant past fp16's range that the conversion folds away does not fail the fp16 model.

PP-OCRv4's text detector has a BatchNorm whose variance holds 9.79e7; onnx2tf multiplies it into the
conv's weights, and the fp16 TFLite's constants stay small. Its fp16 model was refused for that constant
alone (its budget over the split passed). A constant that reaches the fp16 file is stored as 65,504 (the
converter saturates it, measured): that still fails, naming it. Both measured on real conversions here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.edge.convert import EdgeSettings, convert
from pipeline.edge.fp16range import fp16_range_rows

pytestmark = pytest.mark.slow


def conv_then(path: Path, op: str, big: float) -> Path:
    """x [batch, 2, 6, 6] -> Conv 3x3 -> a BatchNorm of variance `big` (op "bn") or an Add of `big` (op "add")."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 1, (2, 2, 3, 3)).astype(np.float32), "c")]
    nodes = [helper.make_node("Conv", ["x", "c"], ["h"], "conv", pads=[1] * 4)]
    if op == "bn":
        for name, value in (("s", 1.0), ("b", 0.0), ("mean", 0.0), ("var", big)):
            inits.append(numpy_helper.from_array(np.full(2, value, np.float32), name))
        nodes.append(helper.make_node("BatchNormalization", ["h", "s", "b", "mean", "var"], ["y"], "bn"))
    else:
        inits.append(numpy_helper.from_array(np.full((1, 2, 1, 1), big, np.float32), "k"))
        nodes.append(helper.make_node("Add", ["h", "k"], ["y"], "add"))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2, 6, 6])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def fp16_of(model: Path, work: Path) -> Path:
    (made,) = convert(model, work, EdgeSettings(("fp16",), input_dims={"x": ["batch", 2, 6, 6]}), None)
    return made.path


def test_a_folded_constant_passes_and_a_stored_one_fails(tmp_path: Path) -> None:
    folded = conv_then(tmp_path / "bn.onnx", "bn", 9.79e7)
    rows = fp16_range_rows(folded, None, tmp_path, fp16_of(folded, tmp_path / "bn"))
    assert [(r.output, r.passed) for r in rows] == [("var", True)], rows
    assert "but not in the fp16 model: the conversion folded it" in rows[0].detail
    assert rows[0].max_abs is None  # the variant's max abs stays the outputs' own, not the constant's value
    assert not fp16_range_rows(folded, None, tmp_path)[0].passed  # without the file: as before, refused

    stored = conv_then(tmp_path / "add.onnx", "add", 2.06e5)
    rows = fp16_range_rows(stored, None, tmp_path, fp16_of(stored, tmp_path / "add"))
    assert [(r.output, r.passed) for r in rows] == [("k", False)], rows
    assert "the fp16 model stores it as 65,504 or inf" in rows[0].detail
