"""A foreign ONNX file as pipe reads it: the graph without its weights, and its inputs and outputs as
the manifest's specs (its external data files: pipeline/runtime/external_data.py).

Shared by `pipe import` (importer.py) and `pipe export --target triton` (triton.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from pipeline.artifact.tensors import TensorSpec, tensor_name_problem
from pipeline.core.errors import InputError
from pipeline.export.shapes import graph_dims


def load_graph(path: Path) -> onnx.ModelProto:
    """Parse an ONNX file without its weights, refusing anything that is not one."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"ONNX model {path} not found; pass the path of a .onnx file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, OSError) as exc:
        raise InputError(f"{path} is not an ONNX model ({exc}); pass a file written by an ONNX exporter") from exc
    if not model.HasField("graph"):  # an empty file, or another message (a TensorProto) parses as an empty model
        what = "is empty" if path.stat().st_size == 0 else "holds no graph (another protobuf message, not a model)"
        raise InputError(f"{path} {what}: it is not an ONNX model; pass a .onnx file written by an ONNX exporter")
    return model


def graph_specs(model: onnx.ModelProto) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Inputs (minus initializers, which old IR versions also list as inputs) and outputs as specs."""
    weights = {t.name for t in model.graph.initializer}
    inputs = [_spec(v) for v in model.graph.input if v.name not in weights]
    outputs = [_spec(v) for v in model.graph.output]
    return inputs, outputs


def _spec(value: onnx.ValueInfoProto) -> TensorSpec:
    if problem := tensor_name_problem(value.name):  # the name goes into shell lines, config.pbtxt and reports
        raise InputError(f"{problem}; rename it in the graph (onnx.utils or onnx-graphsurgeon) and import again")
    tensor = value.type.tensor_type
    if not value.type.HasField("tensor_type") or not tensor.HasField("shape"):
        raise InputError(f"graph value {value.name!r} is not a tensor of known rank; pipe imports tensor models only")
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)).name
    except KeyError:  # 0 (UNDEFINED) or a type this onnx release does not know
        raise InputError(
            f"graph value {value.name!r} has element type {tensor.elem_type}, which has no numpy dtype; "
            "re-export the model with a declared element type on every input and output"
        ) from None
    if dtype == "object":  # STRING: no numpy dtype golden.npz can hold without pickling, nor one pipe serves
        raise InputError(
            f"graph value {value.name!r} holds strings; pipe imports numeric and boolean tensors only. "
            "Re-export the model with the string handling (tokenizer, lookup) outside the graph"
        )
    shape = graph_dims(value)  # free dims (-1, ?, unnamed) each get a name of their own (shapes.py)
    layout = {2: "NT" if dtype.startswith("int") else "NC", 4: "NCHW"}.get(len(shape), "NC")
    return TensorSpec(value.name, dtype, shape, layout)


def check_specs(source: Path, inputs: list[TensorSpec], outputs: list[TensorSpec]) -> None:
    """Refuse what no artifact can hold: no inputs or outputs, or an input without a sample axis."""
    if not inputs or not outputs:
        raise InputError(
            f"{source} has {len(inputs)} graph inputs (initializers aside) and {len(outputs)} outputs; "
            "pipe imports models with at least one of each"
        )
    if scalars := [spec.name for spec in inputs if not spec.shape]:
        raise InputError(
            f"{source}: inputs {scalars} are scalars (rank 0), which no sample axis can carry. A setting the model "
            f"always gets (a sample rate, a flag) is pinned at import: --input-value {scalars[0]}=VALUE; "
            "else re-export the model with inputs shaped [batch, ...]"
        )
