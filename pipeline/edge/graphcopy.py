"""The copy of model.onnx that onnx2tf converts: its free input dims fixed, its names made ones onnx2tf takes.

onnx2tf overwrites its input, so pipe converts a copy (pipeline/edge/convert.py); before it is
saved, `write_input_dims` fixes the device shapes (pipeline/edge/shapes.py) and `sanitize` renames
what onnx2tf would reject, keeping old -> new so its errors can name the original node.
"""

from __future__ import annotations

import re
from typing import Any


def write_input_dims(graph: Any, dims: dict[str, list[int | str]]) -> None:
    """Fix the copy's input dims given as ints (the device shapes); names and `?` leave a dim as it is.

    The inferred shapes inside the graph are dropped where they name a dim fixed here, so onnxslim
    (or onnx2tf's onnxsim) infers them again from the fixed inputs.
    """
    names = set()
    for value in graph.input:
        for dim, wanted in zip(value.type.tensor_type.shape.dim, dims.get(value.name, []), strict=False):
            if isinstance(wanted, int):
                names.add(dim.dim_param)
                dim.dim_value = wanted
    names.discard("")
    if names:
        kept = [v for v in graph.value_info if not {d.dim_param for d in v.type.tensor_type.shape.dim} & names]
        del graph.value_info[:]
        graph.value_info.extend(kept)


def sanitize(graph: Any) -> dict[str, str]:
    """Rename, in place, every node and tensor name onnx2tf rejects; returns old -> new.

    onnx2tf turns names into TensorFlow op and scope names, which must match
    `[A-Za-z0-9.][A-Za-z0-9_.\\/>-]*`: `Softmax@0` stops it, and `:` and a leading `/` need its own
    rewrites. A name that is not a plain identifier becomes one (`/conv/Conv` -> `conv_Conv`,
    `Softmax@0` -> `Softmax_0`), made unique, and the same in nodes, graph inputs and outputs,
    initializers, value_info and subgraphs. Empty names (an omitted optional input) stay empty.
    """
    taken: set[str] = set()
    for g in _graphs(graph):
        taken.update(n.name for n in g.node)
        taken.update(t for n in g.node for t in [*n.input, *n.output])
        taken.update(v.name for v in [*g.input, *g.output, *g.value_info, *g.initializer])
    mapping: dict[str, str] = {}

    def new(name: str) -> str:
        if not name or re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name):
            return name
        if name not in mapping:
            base = re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9_]", "_", name)).strip("_") or "t"
            base = base if base[0].isalpha() else f"t_{base}"
            candidate, k = base, 1
            while candidate in taken:
                k += 1
                candidate = f"{base}_{k}"
            taken.add(candidate)
            mapping[name] = candidate
        return mapping[name]

    for g in _graphs(graph):
        for node in g.node:
            node.name = new(node.name)
            node.input[:] = [new(t) for t in node.input]
            node.output[:] = [new(t) for t in node.output]
        for v in [*g.input, *g.output, *g.value_info, *g.initializer, *g.sparse_initializer]:
            target = v.values if hasattr(v, "values") and hasattr(v, "indices") else v
            target.name = new(target.name)
    return mapping


def _graphs(graph: Any) -> list[Any]:
    """`graph` and every subgraph (If, Loop, Scan bodies) in it."""
    found = [graph]
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("g"):
                found += _graphs(attr.g)
            for sub in attr.graphs:
                found += _graphs(sub)
    return found


def dims_of(value: Any) -> list[int | str]:
    """A graph input's or output's dims: ints, names of free dims, "?" for an unnamed free dim."""
    return [d.dim_param or (d.dim_value if d.HasField("dim_value") else "?") for d in value.type.tensor_type.shape.dim]
