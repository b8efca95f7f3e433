"""Which nodes of an ONNX graph each quantization mode works on (the candidates for exclusion), and which it did.

Exclusion works by node name, and ONNX allows empty names: `name_nodes` gives every unnamed node a
stable generated name, the same names `quantizable_nodes` lists and `quantize` uses in its scratch
copy, so a name a user (or the auto search) reads here is one nodes_to_exclude accepts.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Literal

import onnx
from onnxruntime.quantization.registry import IntegerOpsRegistry, QDQRegistry, QLinearOpsRegistry
from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST

from pipeline.core.errors import InputError
from pipeline.optimize.graph import load, op_counts

MODES = ("dynamic", "static", "fp16")
# op types each mode's quantizer works on: onnxruntime's own registries (dynamic turns Gemm into MatMul).
# Dynamic int8 never takes Conv: onnxruntime makes it ConvInteger, whose kernel is slow (7.8x slower than
# fp32 on a PP-LCNet at 224x224, docs/optimize.md): conv nets get static QDQ int8 instead.
DYNAMIC_OP_TYPES = tuple(sorted(set(IntegerOpsRegistry) - {"Conv"}))  # what quantize_dynamic is told to take
DYNAMIC_OPS = frozenset(DYNAMIC_OP_TYPES) | {"Gemm"}
STATIC_OPS = frozenset(QDQRegistry) | frozenset(QLinearOpsRegistry)

# ops that only exist in a quantized graph: how much of it runs in integer arithmetic
QUANT_OPS = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "MatMulInteger",
        "ConvInteger",
        "QLinearConv",
        "QLinearMatMul",
        "QGemm",
        "QAttention",
        "DynamicQuantizeMatMul",
        "MatMulIntegerToFloat",
        "DynamicQuantizeLSTM",
        "QEmbedLayerNormalization",
    }
)
Q_TENSOR_OPS = frozenset({"DequantizeLinear", "QuantizeLinear", "DynamicQuantizeLinear"})
# the ops that hold a model's arithmetic: after the last of them, a graph only rearranges and scales
WEIGHTED_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})


def already_int8(source: Path, kind: str) -> str:
    """Why `kind` (an int8 kind) is not made of the model at `source` when it is quantized already ('' when not).

    A model shipped quantized (ddddocr's recognizer: 21 ConvInteger, a MatMulInteger and a DynamicQuantizeLSTM,
    producer onnx.quantize) has its weights in int8 already; onnxruntime's quantizers cannot take it again (static
    int8 stopped on `KeyError: '140_scale'`), and there is nothing left for them to make smaller.
    """
    held = {op: n for op, n in op_counts(source).items() if op.split(".")[-1] in QUANT_OPS}
    if not held:
        return ""
    ops = ", ".join(f"{n} {op.split('.')[-1]}" for op, n in sorted(held.items(), key=lambda kv: -kv[1]))
    return (
        f"{kind} not made: the model is quantized already ({ops}): its weights are int8 as shipped, and "
        "onnxruntime's quantizers do not quantize a quantized graph again"
    )


def name_nodes(model: onnx.ModelProto) -> int:
    """Give every unnamed node a stable name (`<OpType>_<position>`), in place; returns how many."""
    nodes = list(model.graph.node)
    taken = {node.name for node in nodes if node.name}
    named = 0
    for position, node in enumerate(nodes):
        if node.name:
            continue
        name, suffix = f"{node.op_type}_{position}", 0
        while name in taken:
            suffix += 1
            name = f"{node.op_type}_{position}_{suffix}"
        node.name = name
        taken.add(name)
        named += 1
    return named


def quantizable_nodes(
    path: Path, mode: Literal["dynamic", "static", "fp16"] = "static", weighted: bool = False
) -> list[str]:
    """Names of the nodes `mode` would quantize, in graph order: the candidates for nodes_to_exclude.

    Unnamed nodes are listed under the names `quantize` gives them. Dynamic mode quantizes nodes
    with a constant weight (MatMul/Gemm with a constant B, Gather from a table, Attention; never Conv);
    static mode every op onnxruntime's QDQ quantizer knows (Add, Relu, Reshape... too); fp16 every
    node but those onnxruntime's converter keeps in fp32. `weighted` keeps only nodes that carry
    weights (MatMul, Gemm, Conv, ConvTranspose, Gather, Attention, LSTM...), where exclusion matters most.
    """
    if mode not in MODES:
        raise InputError(f"quantization mode {mode!r} is not one of {', '.join(MODES)}")
    model = load(path)
    name_nodes(model)
    return [node.name for node in candidates(model, mode) if not weighted or _has_weight(node, _constants(model))]


def candidates(model: onnx.ModelProto, mode: str) -> list[onnx.NodeProto]:
    """The nodes of `model`'s main graph that `mode`'s quantizer would convert."""
    constants = _constants(model)
    if mode == "fp16":
        return [n for n in model.graph.node if n.op_type not in DEFAULT_OP_BLOCK_LIST]
    if mode == "dynamic":  # onnxruntime's MatMulConstBOnly default, and Gemm rewritten as MatMul first
        return [n for n in model.graph.node if _has_weight(n, constants) and n.op_type in DYNAMIC_OPS]
    return [n for n in model.graph.node if n.op_type in STATIC_OPS]


def _constants(model: onnx.ModelProto) -> set[str]:
    return {i.name for i in model.graph.initializer} | {
        o for n in model.graph.node if n.op_type == "Constant" for o in n.output
    }


def _has_weight(node: onnx.NodeProto, constants: set[str]) -> bool:
    if node.op_type in ("Attention", "LSTM", "GRU", "EmbedLayerNormalization"):
        return True
    if node.op_type in ("MatMul", "Gemm", "Conv", "ConvTranspose"):
        return len(node.input) > 1 and node.input[1] in constants
    return node.op_type == "Gather" and node.input[0] in constants


def quantized_nodes(
    before: onnx.ModelProto, after: onnx.ModelProto, mode: str, excluded: list[str]
) -> tuple[dict[str, int], list[str]]:
    """Candidate nodes of `before` now quantized, by op type, and the names of those left in fp32.

    A candidate is quantized when it (or, once replaced, a node named after it such as `<name>_quant`)
    is an integer op or reads a quantized tensor: a (Dynamic)DequantizeLinear/QuantizeLinear output
    or an 8-bit constant. In fp16 every candidate not excluded is converted.
    """
    nodes = candidates(before, mode)
    if mode == "fp16":
        quantized = [n for n in nodes if n.name not in set(excluded)]
    else:
        eight_bit = {onnx.TensorProto.INT8, onnx.TensorProto.UINT8}
        quantized_tensors = {i.name for i in after.graph.initializer if i.data_type in eight_bit} | {
            o for n in after.graph.node if n.op_type in Q_TENSOR_OPS for o in n.output
        }

        def became_quantized(node: onnx.NodeProto) -> bool:
            same = [m for m in after.graph.node if m.name == node.name]
            # gone: replaced by nodes named after it (`<name>_quant`, a Gemm's `<name>_MatMul_quant`)
            related = same or [m for m in after.graph.node if m.name.startswith((f"{node.name}_", f"{node.name}/"))]
            return any(m.op_type in QUANT_OPS or set(m.input) & quantized_tensors for m in related)

        quantized = [n for n in nodes if became_quantized(n)]
    names = {n.name for n in quantized}
    return dict(sorted(Counter(n.op_type for n in quantized).items())), [n.name for n in nodes if n.name not in names]


def decode_tail(model: onnx.ModelProto) -> list[str]:
    """Names of the nodes after the last Conv, MatMul or Gemm on every way to the outputs, in graph order:
    the ones from which no such node can be reached (a detection head's decoding: sigmoid, anchor grid,
    box arithmetic and the Concat that joins boxes and scores into one output).

    Static QDQ int8 gives a Concat's inputs and output one scale: a YOLO head's output holds boxes in
    pixels (0..640) beside class scores (0..1), so one int8 step (~2.5 px) turns every score into 0 or
    one step. Left in float, the tail costs a few elementwise ops; the convolutions stay int8.
    """
    nodes = list(model.graph.node)
    consumers: dict[str, list[int]] = {}
    for index, node in enumerate(nodes):
        for name in node.input:
            consumers.setdefault(name, []).append(index)
    reaches = [False] * len(nodes)  # whether a weighted node lies downstream (itself included)
    for index in reversed(range(len(nodes))):  # consumers first: ONNX lists nodes in topological order
        node = nodes[index]
        below = (reaches[c] for output in node.output for c in consumers.get(output, ()))
        reaches[index] = node.op_type in WEIGHTED_OPS or any(below)
    return [node.name for node, weighted in zip(nodes, reaches, strict=True) if not weighted and node.name]


def nodes_behind(model: onnx.ModelProto, node: str, names: set[str], hops: int = 3) -> list[str]:
    """The nodes of `names` (a source graph's) that `node` of `model` (made from it) stands for: itself, the
    longest source name it extends (`conv1_quant`, `conv1/MatMulAddFusion`), or else the source nodes that
    read its outputs within `hops` nodes (a fused weight's DequantizeLinear feeding `conv1`). Sorted."""
    if node in names:
        return [node]
    prefixes = [name for name in names if node.startswith(name) and node[len(name) : len(name) + 1] in ("_", "/", ".")]
    if prefixes:
        return [max(prefixes, key=len)]
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for candidate in model.graph.node:
        for tensor in candidate.input:
            consumers.setdefault(tensor, []).append(candidate)
    frontier = [n for n in model.graph.node if n.name == node]
    found: set[str] = set()
    for _ in range(hops):
        following = [c for n in frontier for out in n.output for c in consumers.get(out, ())]
        for reader in following:
            found.update(nodes_behind(model, reader.name, names, hops=0) if reader.name else [])
        if found:
            break
        frontier = following
    return sorted(found)
