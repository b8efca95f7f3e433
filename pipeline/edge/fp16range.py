"""Why an fp16 edge model would answer nonsense: a value of model.onnx past fp16's range.

A TFLite fp16 model stores every float constant in fp16, whose largest finite value is 65,504: a
regression head that adds a baked-in target mean of 206,070 holds inf there and answers -87,386
USD. The gate catches the wrong answers, but "exceeds atol" does not say why. This module names
the cause, read from model.onnx itself:

- constants: every float initializer and Constant node value past the range, by name and the
  node that uses it (wrong on every runtime), when the fp16 file holds a constant at fp16's limit:
  the converter saturates a value past it to 65,504 (a house-price head's bias, measured) rather than
  inf. A constant the conversion folds away, such as a BatchNorm's variance (9.79e7 in PP-OCRv4's text
  detector) multiplied into its conv's weights, leaves none there, and is a passing row that says so;
  the split's budget still judges the model;
- activations: every float tensor that reaches past the range on the evaluation samples (an fp16
  runtime, e.g. a GPU delegate, computes them in fp16 and overflows there; the CPU kernels of a
  TFLite fp16 model compute in fp32, so this is where such a model breaks, not always on the host).

Each finding is a failed row of the gate's table (`check` "fp16 range"), put before the element-by-
element rows, so the variant's reason names the constant or tensor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.arrays import Arrays
from pipeline.verify.report import Row

FP16_MAX = 65504.0  # float16's largest finite value
CHECK = "fp16 range"
SAMPLES = 8  # evaluation samples the activations are measured on, one per run (every tensor kept)
SHOWN = 3  # findings listed one by one; more are counted in the last row


def fp16_range_rows(onnx_path: Path, inputs: Arrays | None, scratch: Path, fp16: Path | None = None) -> list[Row]:
    """Failed rows naming each constant (then each activation on `inputs`) of `onnx_path` past fp16's range.

    `fp16`: the fp16 .tflite made from it; its constants' largest |value| decides whether model.onnx's
    constants past the range reached the file (see the module doc). None: every such constant fails."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(onnx_path))
    users: dict[str, str] = {}
    for node in model.graph.node:
        for name in node.input:
            users.setdefault(name, node.name or node.op_type)
    found: list[tuple[str, float, str]] = []  # (name, largest |value|, what it is)
    tensors = [(t.name, t) for t in model.graph.initializer]
    tensors += [(n.output[0], a.t) for n in model.graph.node if n.op_type == "Constant" for a in n.attribute
                if a.name == "value" and a.type == onnx.AttributeProto.TENSOR]  # fmt: skip
    for name, tensor in tensors:
        if tensor.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE):
            continue
        largest = _largest(numpy_helper.to_array(tensor))
        if largest > FP16_MAX:
            used = f" (used by node {users[name]!r})" if name in users else ""
            found.append((name, largest, f"constant {name!r}{used} holds {largest:,.6g}"))
    stored = _largest_constant(fp16) if fp16 is not None and found else None
    if stored is not None and stored < FP16_MAX:  # folded away by the conversion: not in the fp16 file
        rows = [Row(CHECK, name, True, f"{what}, past fp16's largest value 65,504 in model.onnx, but not in the fp16 "
                    f"model: the conversion folded it (its largest constant is {stored:,.6g})")
                for name, _, what in found[:SHOWN]]  # fmt: skip  # no max abs: no difference was measured
    else:
        rows = _rows(found, "the fp16 model stores it as 65,504 or inf; keep this model at fp32, or scale the value "
                     "out of the graph")  # fmt: skip
    if inputs:
        seen = {name for name, _, _ in found} | {n.output[0] for n in model.graph.node if n.op_type == "Constant"}
        acts = [a for a in _activations(model, inputs, scratch) if a[0] not in seen]
        rows += _rows(acts, "an fp16 runtime (GPU delegate, NPU) overflows there; keep this model at fp32")
    return rows


def _largest_constant(path: Path) -> float:
    """The largest |value| of the float16 constants of the TFLite model at `path` (inf when one is inf)."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    interpreter.allocate_tensors()
    largest = 0.0
    for detail in interpreter.get_tensor_details():
        if np.dtype(detail["dtype"]) != np.float16:  # an fp16 model's constants; its activations are float32
            continue
        try:
            value = np.abs(interpreter.get_tensor(detail["index"]).astype(np.float64))
        except ValueError:  # a tensor without data (none seen among float16 ones)
            continue
        largest = max(largest, float(value.max()) if value.size else 0.0)
    return largest


def _largest(array: np.ndarray) -> float:
    finite = np.abs(array[np.isfinite(array)]) if array.size else np.zeros(0)
    return float(finite.max()) if finite.size else 0.0


def _rows(found: list[tuple[str, float, str]], why: str) -> list[Row]:
    rows = [Row(CHECK, name, False, f"{what}, past fp16's largest value 65,504: {why}", largest)
            for name, largest, what in found[:SHOWN]]  # fmt: skip
    if len(found) > SHOWN:
        rows.append(Row(CHECK, "-", False, f"and {len(found) - SHOWN} more past 65,504"))
    return rows


def _activations(model: Any, inputs: Arrays, scratch: Path) -> list[tuple[str, float, str]]:
    """Every float node output whose largest |value| on the first SAMPLES inputs passes fp16's range."""
    import onnx

    from pipeline.runtime.session import create_session

    inferred = onnx.shape_inference.infer_shapes(model)
    floats = {v.name for v in [*inferred.graph.value_info, *inferred.graph.output]
              if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}  # fmt: skip
    known = {o.name for o in model.graph.output}
    extra = [name for node in model.graph.node if node.op_type != "Constant"
             for name in node.output if name in floats and name not in known]  # fmt: skip
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in extra)
    path = scratch / "fp16-range.onnx"
    onnx.save(probe, str(path))
    session = create_session(path, intra_op_threads=1)
    path.unlink()
    names = [o.name for o in session.get_outputs()]
    fed = {i.name: np.asarray(inputs[i.name]) for i in session.get_inputs() if i.name in inputs}
    largest: dict[str, float] = {}
    for k in range(min(SAMPLES, min(len(a) for a in fed.values()))):  # one sample a run: every tensor is kept
        for name, value in zip(names, session.run(names, {n: a[k : k + 1] for n, a in fed.items()}), strict=True):
            if np.asarray(value).dtype.kind == "f":
                largest[name] = max(largest.get(name, 0.0), _largest(np.asarray(value)))
    return [(name, value, f"activation {name!r} reaches {value:,.6g} on the evaluation samples")
            for name, value in largest.items() if value > FP16_MAX]  # fmt: skip
