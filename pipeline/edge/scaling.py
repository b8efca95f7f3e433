"""Ranges int8 cannot share: what the edge conversion moves out of the graph it converts (issue 18).

int8 gives each tensor one scale. Two kinds of model people put on devices break that, and both
are fixed on the copy of model.onnx that onnx2tf converts (every precision is made from it, so all
edge models of an artifact are fed the same way), never on model.onnx:

- **A detector's boxes** (`normalize_boxes`). The YOLOv8 head `output0` [batch, 4 + classes,
  anchors] concatenates boxes in input pixels (0..320) with 0..1 scores, and TFLite's int8 Concat
  gives its inputs and output one scale: the scores move in steps of 1.25 px / 255 and boxes near
  the confidence threshold come and go. Ultralytics' own TFLite export divides the boxes by the image
  size first; so does this: a Mul by [1/W, 1/H, 1/W, 1/H] on the box channels where the head
  concatenates them with the scores (after the output when it cannot tell them apart). The edge
  model gives boxes in 0..1, recorded per output as `boxes_normalized_by: [W, H]`; the gate's
  candidate and the stand-alone runner multiply them back into pixels.
- **A tabular model's columns** (`take_normalization`). A model that starts with (x - mean) / std
  per column gets, as int8 with float I/O, one quantize op right after its input: one scale over
  columns from 0.5..15 to 3..35,000 leaves the small ones a few steps. The leading Sub/Div is taken
  out of the copy, so the edge model takes the normalized features (about N(0, 1) each, one scale
  fits), and its mean and std are recorded per input (`normalize`); the candidate and the runner
  apply them in float before feeding, as a device program must.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
from onnx import numpy_helper

BOX_CHANNELS = 4  # cx, cy, w, h: the first channels of axis 1 of a YOLOv8 head's output


def take_normalization(model: Any, names: list[str]) -> dict[str, dict[str, list[float]]]:
    """Remove, in place, each named [batch, F] input's leading `Sub(x, mean)` then `Div(., std)` (or `Mul(., 1/std)`).

    Only when the input feeds that Sub alone, the Sub feeds that Div alone, and mean and std are
    constants of 1 or F values. Returns input name -> {"mean": [F floats], "std": [F floats]} for each
    one taken out; the edge model then takes (x - mean) / std.
    """
    graph = model.graph
    found: dict[str, dict[str, list[float]]] = {}
    for value in graph.input:
        dims = value.type.tensor_type.shape.dim
        if value.name not in names or len(dims) != 2 or not dims[1].HasField("dim_value"):
            continue
        width = dims[1].dim_value
        sub = _only_consumer(graph, value.name)
        if sub is None or sub.op_type != "Sub" or sub.input[0] != value.name:
            continue
        div = _only_consumer(graph, sub.output[0])
        if div is None or div.op_type not in ("Div", "Mul") or div.input[0] != sub.output[0]:
            continue
        mean, scale = _constant(graph, sub.input[1]), _constant(graph, div.input[1])
        if mean is None or scale is None or {mean.size, scale.size} - {1, width}:
            continue
        if {sub.output[0], div.output[0]} & {o.name for o in graph.output}:
            continue
        std = scale if div.op_type == "Div" else 1.0 / scale
        found[value.name] = {
            "mean": [float(v) for v in np.broadcast_to(mean.reshape(-1), (width,)).astype(np.float32)],
            "std": [float(v) for v in np.broadcast_to(std.reshape(-1), (width,)).astype(np.float32)],
        }
        for node in graph.node:
            node.input[:] = [value.name if t == div.output[0] else t for t in node.input]
        graph.node.remove(sub)
        graph.node.remove(div)
        used = {t for node in graph.node for t in node.input}
        for init in [i for i in graph.initializer if i.name in (sub.input[1], div.input[1]) and i.name not in used]:
            graph.initializer.remove(init)
    return found


def normalize_boxes(model: Any, output: str, width: int, height: int) -> str:
    """Divide, in place, the box channels of `output` ([batch, 4 + classes, anchors]) by the image size.

    The Mul goes on each input of the head's Concat ops (along the anchors, then along the channels)
    that holds box channels only, so the scores never share an int8 scale with pixels; where a
    tensor mixes boxes and scores, the Mul goes on that whole tensor, scaling its box channels.
    Returns where it went ("before the scores are concatenated" or "after the output").
    """
    import onnx

    original, model = model, copy.deepcopy(model)  # changed whole or not at all
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    channels = {v.name: _channels(v) for v in [*inferred.graph.value_info, *inferred.graph.output]}
    per_channel = np.array([1.0 / width, 1.0 / height] * 2, np.float32)
    producers = {t: node for node in model.graph.node for t in node.output}
    placed: list[bool] = []  # True per Mul put on boxes alone
    done: set[str] = set()

    def scale(tensor: str, first: int) -> None:
        """Scale channels [first, first + its channels) of `tensor` that are box channels."""
        if tensor in done:  # one tensor reached twice holds the same channels: scaled once
            return
        done.add(tensor)
        node = producers.get(tensor)
        count = channels.get(tensor)
        axis = _concat_axis(node) if node is not None else None
        if axis == 2:  # along the anchors: every input holds the same channels
            for t in node.input:
                scale(t, first)
            return
        if axis == 1 and all(channels.get(t) for t in node.input):
            offset = first
            for t in node.input:
                if offset < BOX_CHANNELS:
                    scale(t, offset)
                offset += channels[t]
            return
        if count is None:
            raise ValueError(f"the channel count of {tensor!r} is not known")
        factors = np.ones(count, np.float32)
        boxes = min(count, BOX_CHANNELS - first)
        factors[:boxes] = per_channel[first : first + boxes]
        _multiply(model.graph, tensor, factors, producers)
        placed.append(count <= BOX_CHANNELS - first)

    scale(output, 0)
    original.CopyFrom(model)
    return "before the scores are concatenated" if all(placed) else "on a tensor holding boxes and scores"


def _multiply(graph: Any, tensor: str, factors: np.ndarray, producers: dict[str, Any]) -> None:
    """Insert `tensor * factors` (per channel of axis 1) right after `tensor`'s producer; consumers see the product."""
    from onnx import helper

    scaled = f"{tensor}_boxes_normalized"
    constant = f"{tensor}_box_scale"
    outputs = {o.name for o in graph.output}
    source = f"{tensor}_pixels" if tensor in outputs else tensor
    if tensor in outputs:  # the graph output keeps its name: the producer writes the pixels under a new one
        producer = producers[tensor]
        producer.output[:] = [source if t == tensor else t for t in producer.output]
        scaled = tensor
    else:
        for node in graph.node:
            node.input[:] = [scaled if t == tensor else t for t in node.input]
    graph.initializer.append(numpy_helper.from_array(factors.reshape(1, -1, 1), constant))
    graph.node.append(helper.make_node("Mul", [source, constant], [scaled], f"{tensor}_normalize_boxes"))
    _sort(graph)


def _sort(graph: Any) -> None:
    """Order the nodes topologically (a node appended after its consumers would break the graph)."""
    ready = {v.name for v in [*graph.input, *graph.initializer]} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        progress = [n for n in pending if all(t in ready for t in n.input)]
        if not progress:  # inputs from outer scopes or unknown: keep the rest as they were
            ordered += pending
            break
        for node in progress:
            ordered.append(node)
            ready.update(node.output)
        done = {id(n) for n in progress}
        pending = [n for n in pending if id(n) not in done]
    copies = [type(n).FromString(n.SerializeToString()) for n in ordered]  # deleting below detaches the originals
    del graph.node[:]
    graph.node.extend(copies)


def _concat_axis(node: Any) -> int | None:
    if node.op_type != "Concat":
        return None
    axis = next((a.i for a in node.attribute if a.name == "axis"), None)
    return axis + 3 if axis is not None and axis < 0 else axis  # the head's tensors are 3-D


def _channels(value: Any) -> int | None:
    dims = value.type.tensor_type.shape.dim
    return dims[1].dim_value if len(dims) == 3 and dims[1].HasField("dim_value") else None


def _only_consumer(graph: Any, tensor: str) -> Any | None:
    users = [node for node in graph.node if tensor in node.input]
    return users[0] if len(users) == 1 else None


def _constant(graph: Any, name: str) -> np.ndarray | None:
    for init in graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init).astype(np.float32)
    for node in graph.node:
        if node.op_type == "Constant" and node.output[0] == name:
            attr = next((a for a in node.attribute if a.name == "value"), None)
            return None if attr is None else numpy_helper.to_array(attr.t).astype(np.float32)
    return None
