"""`--input-value NAME=VALUE`: a graph input given one value at import, written into the model as a constant.

Some graphs ship with an input that is a setting, not data: Silero VAD's `sr` (the sample rate, a
rank-0 int64 that must be 16000 or 8000), a flag, a fixed size. Such an input has no sample axis,
so no split, batch or request can carry it. Pinned, it becomes an initializer of the same name in
model.onnx (nodes and weights untouched), so every hop (the gate, optimize, edge, predict) and the
server run the model as its users do without feeding it, and the manifest's `pinned` records the
name, dtype, shape and value. A client that still sends it is answered by the value: the same is
accepted and dropped, another refused (docs/http-api.md).

VALUE is JSON: a number (`16000`, `0.5`, `true`) or nested lists for a small tensor (`[1, 2, 3]`).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import numpy_helper

from pipeline.artifact.tensors import PinnedInput
from pipeline.core.errors import InputError

MAX_PINNED_VALUES = 4096  # a pinned value is a setting, not data: a larger one belongs in --eval-data


def parse_input_values(given: list[str] | tuple[str, ...]) -> dict[str, str]:
    """`--input-value NAME=VALUE` (repeatable) -> {NAME: VALUE as given}; the name is what precedes the last `=`."""
    values: dict[str, str] = {}
    for item in given:
        name, sep, value = item.rpartition("=")
        if not sep or not name or not value.strip():
            raise InputError(f"--input-value {item!r}: expected NAME=VALUE, e.g. --input-value sr=16000")
        if name in values:
            raise InputError(f"--input-value gives input {name!r} twice; give each input once")
        values[name] = value
    return values


def pin_inputs(model: onnx.ModelProto, values: dict[str, str]) -> list[PinnedInput]:
    """Turn each named graph input of `model` into an initializer holding its value (in place); the records.

    Refuses an unknown input, a value that is not JSON numbers, a value whose shape the input does not
    take, or one too large to be a setting: each naming the input and the fix.
    """
    weights = {t.name for t in model.graph.initializer}
    graph_inputs = {v.name: v for v in model.graph.input if v.name not in weights}
    pinned = []
    for name, text in values.items():
        value = graph_inputs.get(name)
        if value is None:
            raise InputError(f"--input-value {name}=...: the model has no input {name!r}; its inputs are "
                             f"{sorted(graph_inputs)}")  # fmt: skip
        array = _array(name, text, value)
        model.graph.input.remove(value)
        model.graph.initializer.append(numpy_helper.from_array(array, name))
        pinned.append(PinnedInput(name, array.dtype.name, list(array.shape), array.tolist()))
    if values and len(graph_inputs) == len(values):
        raise InputError("--input-value pins every input of the model; leave at least one input to feed")
    if model.ir_version < 4:  # an initializer that is not also a graph input needs IR 4 or later
        model.ir_version = 4
    return pinned


def _array(name: str, text: str, value: onnx.ValueInfoProto) -> np.ndarray:
    tensor = value.type.tensor_type
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type))
    try:
        parsed = json.loads(text)
        array = np.asarray(parsed)
    except (ValueError, TypeError) as exc:
        raise InputError(f"--input-value {name}={text[:40]}: not a JSON number or list of numbers ({exc})") from None
    if array.dtype.kind not in "biuf" or array.dtype == object:
        raise InputError(f"--input-value {name}={text[:40]}: not a number or a list of numbers")
    if array.size > MAX_PINNED_VALUES:
        raise InputError(f"--input-value {name}: {array.size} values; a pinned input holds at most "
                         f"{MAX_PINNED_VALUES} (a setting): feed larger inputs through --eval-data")  # fmt: skip
    if dtype.kind in "iub" and not np.array_equal(array, array.astype(dtype)):
        raise InputError(f"--input-value {name}={text[:40]}: input {name!r} is {dtype.name}, which cannot hold it")
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tensor.shape.dim]
    fits = len(dims) == array.ndim and all(d is None or d == s for d, s in zip(dims, array.shape, strict=True))
    if tensor.HasField("shape") and not fits:
        declared = ["?" if d is None else d for d in dims]
        raise InputError(f"--input-value {name}: a value of shape {list(array.shape)}, but input {name!r} is "
                         f"declared {declared}; give a value of that shape")  # fmt: skip
    return array.astype(dtype)
