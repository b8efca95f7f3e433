"""Writing an ONNX graph node by node from a model's weights: what the fused decoder writer builds with.

`Graph` holds the nodes and weights as they are added (a model past 1.8 GB writes each weight of 1 KiB and more
straight to its external data file, so no second copy of the model is held), and names each node once; the
helpers write what every layer repeats: an RMSNorm in standard ops, a Reshape, a projection with its biases,
a soft cap. pipeline/export/fused_decoder.py writes the decoder; pipeline/export/fused_attention.py its attention.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from pipeline.runtime.external_data import SMALL_TENSOR

MS = "com.microsoft"  # onnxruntime's contrib kernels' domain


@dataclass
class Graph:
    """Nodes and weights as they are added; with `data` (a model past EXTERNAL_BYTES), each weight of 1 KiB and more
    is written to that file as it comes and the graph keeps only where it lies, so no second copy of the model
    is held in memory."""

    nodes: list[onnx.NodeProto]
    weights: list[onnx.TensorProto]
    data: BinaryIO | None = None
    location: str = ""
    made: int = 0  # nodes made so far, branches' included: each node's name is unique

    def weight(self, name: str, value: np.ndarray) -> str:
        contiguous = value if value.flags.c_contiguous else np.ascontiguousarray(value)  # which makes a scalar 1-D
        if self.data is None or contiguous.nbytes < SMALL_TENSOR:
            self.weights.append(numpy_helper.from_array(contiguous, name))
            return name
        tensor = onnx.TensorProto(name=name, dims=contiguous.shape,
                                  data_type=helper.np_dtype_to_tensor_dtype(contiguous.dtype))  # fmt: skip
        offset = self.data.tell()
        contiguous.tofile(self.data)
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, v in (("location", self.location), ("offset", offset), ("length", contiguous.nbytes)):
            tensor.external_data.add(key=key, value=str(v))
        self.weights.append(tensor)
        return name

    def shared(self, name: str, value: np.ndarray) -> str:
        """A small constant several nodes read, added the first time it is named."""
        if not any(w.name == name for w in self.weights):
            self.weight(name, value)
        return name

    def node(self, op: str, inputs: list[str], outputs: list[str], domain: str = "", **attrs: Any) -> list[str]:
        self.nodes.append(helper.make_node(op, inputs, outputs, name=f"{op}_{self.made}", domain=domain, **attrs))
        self.made += 1
        return outputs

    def branch(self, name: str, make: Callable[[], list[str]]) -> onnx.GraphProto:
        """A subgraph of the nodes `make` adds (their weights stay in the graph), its outputs the names it returns."""
        outer, self.nodes = self.nodes, []
        try:
            outputs = make()
            made = self.nodes
        finally:
            self.nodes = outer
        return helper.make_graph(
            made, name, [], [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
        )


def rms_norm(
    g: Graph, x: str, weight: np.ndarray, eps: float, name: str = "norm0", out: str = "x0", fusable: bool = False
) -> str:
    """RMSNorm over the last axis in standard ops (onnxruntime's SimplifiedLayerNormalization is not ONNX's: the
    checker refuses it): the first layer's, and Qwen3's per head. `fusable` squares by Pow(x, 2), the pattern
    onnxruntime's optimizer fuses into its kernel (Qwen3's head norms, two a layer); the first layer's squares by
    Mul(x, x), which it leaves as six nodes, once a graph (kept so: the written Llama graph is unchanged)."""
    if fusable:
        g.node("Pow", [x, g.shared("float_two", np.array(2, np.float32))], [name + "_squares"])
    else:
        g.node("Mul", [x, x], [name + "_squares"])
    g.node("ReduceMean", [name + "_squares", g.shared("axis_last", np.array([-1], np.int64))], [name + "_mean"])
    g.node("Add", [name + "_mean", g.weight(name + "_eps", np.array(eps, np.float32))], [name + "_var"])
    g.node("Sqrt", [name + "_var"], [name + "_rms"])
    g.node("Div", [x, name + "_rms"], [name + "_unit"])
    return g.node("Mul", [name + "_unit", g.weight(name + "_weight", weight)], [out])[0]


def reshape(g: Graph, x: str, name: str, shape: list[int]) -> str:
    return g.node("Reshape", [x, g.weight(name + "_shape", np.array(shape, np.int64))], [name])[0]


def linear(g: Graph, x: str, name: str, weights: dict[str, np.ndarray], keys: list[str]) -> str:
    """x @ the named projections' weights side by side, plus their biases when any has one (zeros for the rest)."""
    matrices = [weights[k + ".weight"] for k in keys]
    out = g.node("MatMul", [x, g.weight(name, np.concatenate(matrices).T)], [name + "_out"])[0]
    if any(k + ".bias" in weights for k in keys):
        zeros = [np.zeros(m.shape[0], np.float32) for m in matrices]
        parts = [weights.get(k + ".bias", z) for k, z in zip(keys, zeros, strict=True)]
        out = g.node("Add", [out, g.weight(name + "_bias", np.concatenate(parts))], [name + "_biased"])[0]
    return out


def soft_cap(g: Graph, x: str, name: str, cap: float, out: str) -> str:
    """cap x tanh(x / cap), Gemma's soft-capping of attention scores and logits."""
    g.node("Div", [x, g.weight(name, np.array(cap, np.float32))], [name + "_scaled"])
    g.node("Tanh", [name + "_scaled"], [name + "_tanh"])
    return g.node("Mul", [name + "_tanh", name], [out])[0]
