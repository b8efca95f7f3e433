"""Which int8 candidates `--quantize auto` tries, chosen by what the graph holds.

onnxruntime's two int8 paths suit different graphs. Dynamic int8 quantizes weights ahead of time and
activations at run time; it pays on MatMul/Gemm (transformers: 1.0-1.1x here, smaller) and never
touches Conv: onnxruntime would make it ConvInteger, measured 7.8x slower than fp32 on a PP-LCNet
(docs/optimize.md). Static QDQ int8 fixes activation ranges from real samples; it is the int8
of conv nets (per-channel weights, uint8 activations: int8 activations were 3x slower on that
PP-LCNet). So the weight bytes in Conv against those in MatMul/Gemm/Gather decide the order of the
families, and whether dynamic is tried at all.

A family is a list of settings that make the same kernels and differ only in how they round
(weight scales, calibration method): its candidates run at one speed, so the search tries the next
only when the one before missed the budget, and drops the family when its first is slower than fp32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
from onnx import helper

from pipeline.core.errors import InputError
from pipeline.optimize.graph import load
from pipeline.optimize.nodes import DYNAMIC_OPS, candidates
from pipeline.optimize.quantize import QuantSettings

CONV_OPS = ("Conv", "ConvTranspose")
MATMUL_OPS = ("MatMul", "Gemm", "Attention", "LSTM", "GRU")
CONV_HEAVY = 0.5  # share of the weight bytes in Conv from which a graph is a conv net: static first, no dynamic
CALIBRATIONS = ("minmax", "entropy", "percentile")  # each family's fallbacks, cheapest and plainest first


@dataclass(frozen=True)
class Family:
    """Candidates that make the same kernels and differ in rounding only, tried in order until one passes."""

    name: str
    candidates: tuple[QuantSettings, ...]
    why: str  # why this family is tried, for the report

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "why": self.why, "candidates": [c.describe() for c in self.candidates]}


@dataclass
class Plan:
    """The families to try, in order, what the graph holds, and what was left out and why."""

    families: list[Family]
    weights: dict[str, int]  # weight bytes by kind: conv, matmul (MatMul/Gemm/attention/RNN), embedding, other
    depthwise: int  # depthwise convs (group == channels > 1): the kernels int8 gains least on
    notes: list[str] = field(default_factory=list)

    @property
    def conv_share(self) -> float:
        total = sum(self.weights.values())
        return self.weights.get("conv", 0) / total if total else 0.0

    def candidates(self) -> list[QuantSettings]:
        return [c for family in self.families for c in family.candidates]

    def to_dict(self) -> dict[str, Any]:
        return {
            "weights": self.weights,
            "conv_share": round(self.conv_share, 4),
            "depthwise_convs": self.depthwise,
            "families": [f.to_dict() for f in self.families],
            "notes": self.notes,
        }


def plan_for(model: Path, has_calibration: bool, task: str = "classification") -> Plan:
    """The candidate families for the ONNX model at `model`; `has_calibration`: real samples exist.

    A detector's static candidates keep its decode tail in fp32 (nodes.decode_tail: one int8 scale
    cannot hold pixel boxes and 0..1 scores).

    Raises InputError when no family fits: a conv net without MatMul/Gemm weights and without
    real samples has nothing int8 can make faster (dynamic leaves Conv in fp32; static needs samples).
    """
    graph = load(model)
    weights, depthwise = composition(graph)
    share = _share(weights)
    conv_heavy = share >= CONV_HEAVY
    dynamic_nodes = candidates(graph, "dynamic")
    notes: list[str] = []
    tail = task == "detection"
    static = [
        Family(
            "static int8, uint8 activations",
            tuple(QuantSettings("static", per_channel=True, calibration=m, float_tail=tail) for m in CALIBRATIONS),
            "static QDQ with per-channel weights and uint8 activations: the int8 that suits conv nets on CPU",
        ),
        Family(
            "static int8, int8 activations",
            tuple(
                QuantSettings("static", per_channel=True, activation_type="int8", calibration=m, float_tail=tail)
                for m in CALIBRATIONS
            ),
            "int8 activations: what some accelerators want; on CPU usually slower (dropped when its first is)",
        ),
    ]
    dynamic = Family(
        "dynamic int8",
        # per-channel: one scale per output channel keeps a wide channel from rounding the rest away, at the
        # speed of one per tensor. Not 7-bit weights (reduce_range): they are for CPUs without VNNI, where
        # 8-bit products saturate (`--quantize dynamic --reduce-range`), and only round coarser elsewhere
        (QuantSettings("dynamic", per_channel=True),),
        f"dynamic int8 on the {len(dynamic_nodes)} MatMul/Gemm/Gather node(s) with constant weights "
        f"({_percent(1 - share)} of the weights); Conv stays fp32",
    )
    families: list[Family] = []
    if not has_calibration:
        notes.append(
            "no static int8: there are no real samples to calibrate on (an artifact imported without --eval-data)"
        )
    if not dynamic_nodes:
        notes.append("no dynamic int8: the graph has no MatMul/Gemm/Gather with constant weights")
    elif conv_heavy and has_calibration:
        notes.append(
            f"no dynamic int8: {_percent(share)} of the weights are in Conv, which dynamic int8 leaves in fp32 "
            "(onnxruntime's ConvInteger is slower than fp32); static QDQ quantizes them"
        )
    if weights.get("conv") and not has_calibration:
        notes.append(
            f"the convolutions ({_percent(share)} of the weights) stay fp32: dynamic int8 never quantizes Conv, "
            "and static int8 needs real samples: re-import with --eval-data to quantize them"
        )
    use_dynamic = bool(dynamic_nodes) and (not conv_heavy or not has_calibration)
    if conv_heavy:
        families = [*(static if has_calibration else []), *([dynamic] if use_dynamic else [])]
    else:
        families = [*([dynamic] if use_dynamic else []), *(static if has_calibration else [])]
    if not families:
        raise InputError(
            f"--quantize auto has no int8 candidate for {model.name}: " + "; ".join(notes) + ". Re-import it with "
            "--eval-data FILE (real inputs) so static int8 can calibrate, or use --quantize fp16"
        )
    return Plan(families, weights, depthwise, notes)


def composition(model: onnx.ModelProto) -> tuple[dict[str, int], int]:
    """Weight bytes by the kind of node that reads them, and the number of depthwise convs."""
    sizes = {init.name: _bytes(init) for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None:
                sizes[node.output[0]] = _bytes(value)
    weights = {"conv": 0, "matmul": 0, "embedding": 0}
    depthwise = 0
    for node in model.graph.node:
        kind = (
            "conv" if node.op_type in CONV_OPS
            else "matmul" if node.op_type in MATMUL_OPS or node.op_type in DYNAMIC_OPS - {"Gather"}
            else "embedding" if node.op_type == "Gather"
            else None
        )  # fmt: skip
        if kind is None:
            continue
        read = [sizes[name] for name in node.input if name in sizes]
        if kind == "embedding":
            read = [sizes[node.input[0]]] if node.input and node.input[0] in sizes else []
        weights[kind] += sum(read)
        if kind == "conv" and _group(node) > 1:
            depthwise += 1
    return weights, depthwise


def _group(node: onnx.NodeProto) -> int:
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == "group"), 1)


def _bytes(tensor: onnx.TensorProto) -> int:
    if tensor.data_type == onnx.TensorProto.STRING:
        return 0
    itemsize = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return itemsize * math.prod(tensor.dims)


def _share(weights: dict[str, int]) -> float:
    total = sum(weights.values())
    return weights.get("conv", 0) / total if total else 0.0


def _percent(share: float) -> str:
    return f"{100 * share:.0f}%"
