"""Where a quantized model spends its time against fp32: onnxruntime's own profiler, summed by kind of op.

When no int8 model is faster than fp32, the report must say why, and a timing cannot: it gives one
number per model. onnxruntime's profiler gives every kernel's time in a run. Summed by kind (the op
with its QLinear/Integer/Fused prefix taken off, convs split into depthwise and dense, since int8
gains least on depthwise), the two profiles show what int8 made slower (a depthwise QLinearConv
against fp32's NCHWc depthwise Conv), what it costs to convert (QuantizeLinear/DequantizeLinear),
and which ops stay float between those conversions (hard-swish's HardSigmoid and Mul, a squeeze-
excite's ReduceMean): each such op is paid for twice, once in float and once in converting.

The sessions are made as the latency's are (the CPU provider, default graph optimization, the same
threads), run at batch 1, and the first runs (allocations) are left out.
"""

from __future__ import annotations

import bisect
import json
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper

from pipeline.runtime.latency import batch_of
from pipeline.runtime.session import create_session

WARMUP, RUNS = 5, 50  # untimed runs first (allocations), then the profiled ones, alternating between models
CONVERSIONS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})
LAYOUT = frozenset({"ReorderInput", "ReorderOutput"})  # fp32's NCHWc layout changes around its blocked convs
INTEGER = frozenset({"QGemm", "MatMulInteger", "ConvInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat",
                     "QAttention", "DynamicQuantizeLSTM", "QEmbedLayerNormalization"})  # fmt: skip
SLOWER = 1.1  # a kind counts as slower in int8 when it takes this many times fp32's time, or more


@dataclass
class KindTime:
    """One kind of op in one model: milliseconds per run, kernels per run, and the ops that ran it."""

    kind: str  # e.g. "Conv (depthwise)", "Mul", "QuantizeLinear"
    role: str  # integer | conversion | layout | float
    ms: float
    nodes: float
    ops: list[str]  # the op types onnxruntime ran for it: QLinearConv, Conv ...

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "role": self.role, "ms": round(self.ms, 4), "nodes": self.nodes, "ops": self.ops}


@dataclass
class Profile:
    """One model's profile: kernel time per kind of op, and the median run as the session timed it."""

    kinds: dict[str, KindTime]
    run_ms: float  # median of the profiled runs (kernels plus onnxruntime's own work between them)

    @property
    def kernels_ms(self) -> float:
        return sum(t.ms for t in self.kinds.values())

    @property
    def nodes(self) -> float:
        return sum(t.nodes for t in self.kinds.values())


def profile_side_by_side(
    models: Mapping[str, Path], samples: Mapping[str, np.ndarray], threads: int, scratch: Path
) -> dict[str, Profile]:
    """Each model's profile at batch 1, their runs alternating so a burst of load lands on all alike."""
    sessions, feeds = {}, {}
    for name, path in models.items():
        (scratch / name).mkdir(parents=True, exist_ok=True)
        sessions[name] = create_session(path, "cpu", intra_op_threads=threads, inter_op_threads=1,
                                        profile=scratch / name)  # fmt: skip
        feeds[name] = {spec.name: batch_of(samples[spec.name], 1) for spec in sessions[name].get_inputs()}
    for _ in range(WARMUP + RUNS):
        for name, session in sessions.items():
            session.run(None, feeds[name])
    return {name: read_profile(Path(session.end_profiling()), scratch / name) for name, session in sessions.items()}


def read_profile(trace: Path, scratch: Path) -> Profile:
    """A profile from onnxruntime's trace (`create_session(..., profile=scratch)`), leaving out the first
    WARMUP runs.

    Each kind's time is its median over the runs: on a shared machine a run now and then is
    descheduled mid-kernel, and a mean would charge that to whichever kernel was running.
    """
    events = json.loads(trace.read_text())
    groups = _groups(scratch / "optimized.onnx")
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run")[WARMUP:]
    starts = [start for start, _ in runs]
    per_run: dict[str, np.ndarray] = {}
    nodes: dict[str, float] = defaultdict(float)
    ops: dict[str, set[str]] = defaultdict(set)
    for event in events:
        name = event.get("name", "")
        if event.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        index = bisect.bisect_right(starts, event["ts"]) - 1
        if index < 0 or event["ts"] > runs[index][1]:  # a warm-up run's
            continue
        op = event.get("args", {}).get("op_name", "?")
        kind = _kind(op, groups.get(name.removesuffix("_kernel_time"), 1))
        per_run.setdefault(kind, np.zeros(len(runs)))[index] += event["dur"] / 1000
        nodes[kind] += 1 / len(runs)
        ops[kind].add(op)
    medians = {kind: float(np.median(times)) for kind, times in per_run.items()}
    kinds = {
        kind: KindTime(kind, _role(ops[kind]), ms, round(nodes[kind], 2), sorted(ops[kind]))
        for kind, ms in sorted(medians.items(), key=lambda item: -item[1])
    }
    run_ms = float(np.median([(stop - start) / 1000 for start, stop in runs])) if runs else 0.0
    return Profile(kinds, run_ms)


@dataclass
class Comparison:
    """fp32's and the quantized model's profiles side by side, and the reason in words."""

    fp32: Profile
    quantized: Profile
    threads: int

    def to_dict(self) -> dict[str, Any]:
        kinds = list(dict.fromkeys([*self.quantized.kinds, *self.fp32.kinds]))
        rows = []
        for kind in kinds:
            mine, theirs = self.quantized.kinds.get(kind), self.fp32.kinds.get(kind)
            rows.append({
                "kind": kind,
                "role": (mine or theirs).role if (mine or theirs) else "float",
                "fp32_ms": round(theirs.ms, 4) if theirs else 0.0,
                "quantized_ms": round(mine.ms, 4) if mine else 0.0,
                "quantized_ops": mine.ops if mine else [],
            })  # fmt: skip
        return {
            "batch": 1,
            "threads": self.threads,
            "fp32": {
                "run_ms": round(self.fp32.run_ms, 4),
                "kernels_ms": round(self.fp32.kernels_ms, 4),
                "nodes": self.fp32.nodes,
            },
            "quantized": {
                "run_ms": round(self.quantized.run_ms, 4),
                "kernels_ms": round(self.quantized.kernels_ms, 4),
                "nodes": self.quantized.nodes,
            },
            "rows": rows,
            "why": self.why(),
        }

    def why(self) -> str:
        """One paragraph: what int8 made slower, what converting costs, what stays float, what got faster."""
        mine, theirs = self.quantized.kinds, self.fp32.kinds
        q, f = self.quantized, self.fp32
        parts = [
            f"onnxruntime's profile at batch 1 ({self.threads} thread{'s' if self.threads != 1 else ''}, the two "
            f"models' runs alternating): a run of the int8 model takes {q.run_ms:.2f} ms against fp32's "
            f"{f.run_ms:.2f} ms, {q.nodes:.0f} kernels against {f.nodes:.0f} ({q.kernels_ms:.2f} ms in them "
            f"against {f.kernels_ms:.2f} ms, the rest onnxruntime's own work between kernels: "
            f"{max(q.run_ms - q.kernels_ms, 0):.2f} ms against {max(f.run_ms - f.kernels_ms, 0):.2f} ms)"
        ]
        compared = [(k, t, theirs[k]) for k, t in mine.items() if k in theirs and t.role == "integer"]
        slower = sorted((c for c in compared if c[1].ms >= SLOWER * c[2].ms), key=lambda c: c[2].ms - c[1].ms)
        faster = sorted((c for c in compared if c[1].ms * SLOWER <= c[2].ms), key=lambda c: c[1].ms - c[2].ms)
        level = [c for c in compared if c not in slower and c not in faster]
        if slower:
            parts.append("slower in int8: " + ", ".join(
                f"{k} ({'/'.join(t.ops)} {t.ms:.2f} ms against {f.ms:.2f} ms in fp32)" for k, t, f in slower
            ))  # fmt: skip
        alone = sorted((t for k, t in mine.items() if k not in theirs and t.role == "integer"), key=lambda t: -t.ms)
        if alone:
            parts.append("int8 runs kernels of its own where fp32 runs none (fp32 fuses these ops into its convs): "
                         + ", ".join(f"{t.kind} ({'/'.join(t.ops)} {t.ms:.2f} ms)" for t in alone))  # fmt: skip
        converting = [t for t in mine.values() if t.role == "conversion"]
        floating = [t for t in mine.values() if t.role == "float"]
        if converting:
            spent = sum(t.ms for t in converting)
            count = sum(t.nodes for t in converting)
            text = (
                f"{spent:.2f} ms go to converting between int8 and float ({count:.0f} QuantizeLinear/DequantizeLinear)"
            )
            if floating:
                top = sorted(floating, key=lambda t: -t.ms)[:4]
                text += (
                    f", around the {sum(t.nodes for t in floating):.0f} ops left in float between them ("
                    + ", ".join(f"{t.kind} {t.ms:.2f} ms" for t in top)
                    + (", ..." if len(floating) > len(top) else "")
                    + ")"
                )
            parts.append(text)
        for words, rows in (("faster in int8", faster), ("about as fast", level)):
            if rows:
                parts.append(f"{words}: " + ", ".join(f"{k} ({t.ms:.2f} ms against {f.ms:.2f} ms)" for k, t, f in rows))
        return "; ".join(parts) + "."


def compare_profiles(
    fp32: Path, quantized: Path, samples: Mapping[str, np.ndarray], threads: int, scratch: Path
) -> Comparison:
    """Both models profiled side by side at batch 1."""
    profiles = profile_side_by_side({"fp32": fp32, "quantized": quantized}, samples, threads, scratch)
    return Comparison(profiles["fp32"], profiles["quantized"], threads)


def _kind(op: str, group: int) -> str:
    """The op with its quantized or fused spelling taken off; convs split by depthwise (grouped) or dense."""
    base = op
    for prefix in ("QLinear", "Fused", "Dynamic"):
        if base.startswith(prefix) and base not in CONVERSIONS:
            base = base.removeprefix(prefix)
    base = {"QGemm": "Gemm", "MatMulInteger": "MatMul", "ConvInteger": "Conv", "QuantizeMatMul": "MatMul",
            "MatMulIntegerToFloat": "MatMul", "QAttention": "Attention"}.get(base, base)  # fmt: skip
    if base == "Conv":
        return "Conv (depthwise)" if group > 1 else "Conv (dense)"
    return base


def _role(ops: set[str]) -> str:
    if ops & CONVERSIONS:
        return "conversion"
    if ops & LAYOUT:
        return "layout"
    if any(op.startswith("QLinear") or op in INTEGER for op in ops):
        return "integer"
    return "float"


def _groups(optimized: Path) -> dict[str, int]:
    """Node name -> its `group` attribute, in the graph as the session ran it (absent: 1)."""
    if not optimized.is_file():
        return {}
    model = onnx.load(str(optimized), load_external_data=False)
    return {
        node.name: int(helper.get_attribute_value(attr))
        for node in model.graph.node
        for attr in node.attribute
        if attr.name == "group"
    }
