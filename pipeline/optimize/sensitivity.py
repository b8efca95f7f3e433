"""Which nodes a quantized model loses its accuracy at: fp32 and quantized activations compared node by node.

Quantization keeps the names of the tensors it does not replace (a quantized MatMul still writes
the tensor its fp32 node wrote, through a dequantizing tail), so the same name in both graphs is
the same value computed two ways. Copies of both graphs expose every such float tensor as an
extra output; both run on the same real inputs, and each tensor gets its relative error
||quantized - fp32|| / ||fp32|| over all samples.

A node's score is the error it adds: the error at its output minus the worst error already at its
inputs. Error arriving from upstream is not the node's fault: excluding a node that only passes on
its producer's error would cost speed and fix nothing. An input not visible in the quantized graph
(a Relu folded into the quantized node before it) takes the worst error visible further up.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper

from pipeline.core.errors import ArtifactError, first_line
from pipeline.runtime.session import create_session

FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16)
DEAD_CHANNEL = 1e-3  # a channel below this share of the median channel's energy is measured against that share
CHUNK = 16  # samples per run: every intermediate tensor of both models is held for one chunk at a time,
CHUNK_BYTES = 4 << 20  # and at most this many input bytes a run: a conv net at 224x224 holds ~20 MB of
# activations per picture and model, in float64 here, so 16 pictures took GBs; 4 MB is 6 such pictures
EXTERNAL_DATA_OVER = 1 << 30  # copies of models larger than this (bytes) keep their weights beside them
REMOVABLE = ("Relu", "Clip")  # activations static quantization folds into the node before them
Fold = Callable[[np.ndarray], np.ndarray] | None  # re-applies a folded activation to a quantized tensor
TINY = 1e-30  # a tensor whose fp32 values are all zero: its error is relative to this, not to zero


@dataclass(frozen=True)
class NodeScore:
    """How much relative error one fp32 node adds once the model is quantized."""

    node: str  # the node's name in the fp32 graph, as `nodes_to_exclude` takes it
    op_type: str
    score: float  # output_error - input_error: the error this node adds (inf: its output is NaN/Inf)
    output_error: float  # relative error at its worst output
    input_error: float  # the worst relative error already at its inputs (0: weights and graph inputs)
    output: str  # the tensor its output_error was measured on

    def why(self) -> str:
        """One line for a report: where the error appears and how much came in."""
        return (
            f"relative error {self.output_error:.3g} at its output {self.output!r} against "
            f"{self.input_error:.3g} at its inputs (adds {self.score:.3g})"
        )


def sensitivity(
    fp32: Path,
    quantized: Path,
    inputs: Mapping[str, np.ndarray],
    scratch: Path,
    nodes: Collection[str] | None = None,
    threads: int = 1,
) -> list[NodeScore]:
    """Every scoreable fp32 node (or those named in `nodes`), the one adding the most error first.

    `fp32` must be the graph `quantized` was made from (after any pre-processing), so node names
    match what quantization excludes. `inputs`: real samples by input name, batch first; use a few
    dozen, every intermediate tensor is compared. A node none of whose outputs exists in both
    graphs cannot be scored and is left out.
    """
    reference, candidate = onnx.load(str(fp32)), onnx.load(str(quantized))
    types = _float_tensors(reference), _float_tensors(candidate)
    shared = _comparable(reference.graph, candidate.graph, types[0].keys() & types[1].keys())
    with tempfile.TemporaryDirectory(dir=scratch, prefix="sensitivity-") as tmp:
        errors = _relative_errors(
            _exposed(reference, {n: types[0][n] for n in shared}, Path(tmp) / "fp32.onnx"),
            _exposed(candidate, {n: types[1][n] for n in shared}, Path(tmp) / "quantized.onnx"),
            shared,
            inputs,
            threads,
        )
    folded = {name for name, fold in shared.items() if fold is not None}
    return _scores(reference.graph, errors, folded, nodes)


def _float_tensors(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Every float tensor a node writes (graph inputs and weights are the same on both sides), with its type."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        raise ArtifactError(f"cannot infer the tensor types of {model.graph.name!r}: {first_line(exc)}") from exc
    graph = inferred.graph
    typed = {v.name: v for v in (*graph.value_info, *graph.output)}
    written = {name for node in graph.node for name in node.output if name}
    return {
        name: info
        for name, info in typed.items()
        if name in written and info.type.HasField("tensor_type") and info.type.tensor_type.elem_type in FLOAT_TYPES
    }


def _comparable(reference: onnx.GraphProto, candidate: onnx.GraphProto, names: Collection[str]) -> dict[str, Fold]:
    """The shared names that hold the same value on both sides, each with what to apply to the quantized one.

    Static QDQ quantization drops a Relu or Clip after a quantized node (the quantized range does
    its work) and gives the node before it the activation's output name: that name then holds the
    values before the activation. Applying the activation to them gives back the value the fp32
    graph holds; a Clip whose bounds are not constants cannot be re-applied, and its name is skipped.
    """
    writer = [{out: node for node in graph.node for out in node.output} for graph in (reference, candidate)]
    constants = {init.name: onnx.numpy_helper.to_array(init) for init in reference.initializer}
    comparable: dict[str, Fold] = {}
    for name in names:
        fp32_node, quantized_node = writer[0][name], writer[1][name]
        if fp32_node.op_type not in REMOVABLE or quantized_node.op_type == fp32_node.op_type:
            comparable[name] = None
        elif (fold := _activation(fp32_node, constants)) is not None:
            comparable[name] = fold
    return comparable


def _activation(node: onnx.NodeProto, constants: Mapping[str, np.ndarray]) -> Fold:
    """The Relu or Clip `node` as a numpy function, or None when its bounds are not constants."""
    if node.op_type == "Relu":
        return lambda x: np.maximum(x, 0.0)
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    bounds = [attributes.get("min", -np.inf), attributes.get("max", np.inf)]  # opset < 11 keeps them as attributes
    for i, name in enumerate(node.input[1:3]):
        if name:
            if name not in constants:
                return None
            bounds[i] = float(constants[name])
    low, high = bounds
    return lambda x: np.clip(x, low, high)


def _exposed(model: onnx.ModelProto, tensors: Mapping[str, onnx.ValueInfoProto], path: Path) -> Path:
    """A copy of `model` at `path` whose outputs are its own followed by every tensor in `tensors`."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    present = {o.name for o in copy.graph.output}
    for name in sorted(tensors.keys() - present):
        info = onnx.ValueInfoProto()
        info.name = name
        info.type.tensor_type.elem_type = tensors[name].type.tensor_type.elem_type  # shape left free
        copy.graph.output.append(info)
    large = copy.ByteSize() > EXTERNAL_DATA_OVER
    onnx.save(copy, str(path), save_as_external_data=large, location=f"{path.name}.data" if large else None)
    return path


def _relative_errors(
    reference: Path, candidate: Path, folds: Mapping[str, Fold], inputs: Mapping[str, np.ndarray], threads: int
) -> dict[str, float]:
    """Per shared output tensor: the mean over its channels of ||candidate - reference|| / ||reference||.

    Per channel, not over the whole tensor: one channel thousands of times wider than the rest
    (the case int8 with one scale per tensor ruins) would otherwise dominate both norms and hide
    that every other channel was rounded away. A channel is axis 1 of a 4-D (NCHW) tensor, else
    the last axis. A channel whose reference is all but zero (a dead ReLU unit) is measured
    against the tensor's typical channel, so its noise does not blow up.
    """
    sessions = [create_session(p, "cpu", intra_op_threads=threads, inter_op_threads=1) for p in (reference, candidate)]
    names = [o.name for o in sessions[1].get_outputs() if o.name in {r.name for r in sessions[0].get_outputs()}]
    diff2: dict[str, np.ndarray | float] = dict.fromkeys(names, 0.0)
    ref2: dict[str, np.ndarray | float] = dict.fromkeys(names, 0.0)
    mismatched: set[str] = set()  # same name, different shape: not the same value, not compared
    count = len(next(iter(inputs.values())))
    chunk = min(CHUNK, max(1, CHUNK_BYTES // max(1, sum(v[:1].nbytes for v in inputs.values()))))
    for start in range(0, count, chunk):
        feed = {k: np.ascontiguousarray(v[start : start + chunk]) for k, v in inputs.items()}
        want, got = (dict(zip(names, s.run(names, feed), strict=True)) for s in sessions)
        for name in names:
            a, b = np.asarray(got[name], np.float64), np.asarray(want[name], np.float64)
            if (fold := folds.get(name)) is not None:
                a = fold(a)
            if a.shape != b.shape:
                mismatched.add(name)
                continue
            with np.errstate(invalid="ignore", over="ignore"):
                diff2[name] = diff2[name] + _per_channel(np.square(a - b))
                ref2[name] = ref2[name] + _per_channel(np.square(b))
    errors = {}
    for name in names:
        if name in mismatched:
            continue
        d, r = np.atleast_1d(diff2[name]), np.atleast_1d(ref2[name])
        if not np.isfinite(d).all():
            errors[name] = float("inf")
            continue
        floor = max(float(np.median(r)) * DEAD_CHANNEL, TINY)
        errors[name] = float(np.mean(np.sqrt(d / np.maximum(r, floor))))
    return errors


def _per_channel(squares: np.ndarray) -> np.ndarray:
    """Sum of squares per channel: axis 1 of a 4-D tensor, else the last axis (a scalar: one channel)."""
    if squares.ndim == 0:
        return np.atleast_1d(squares)
    axis = 1 if squares.ndim == 4 else squares.ndim - 1
    return np.moveaxis(squares, axis, -1).reshape(-1, squares.shape[axis]).sum(axis=0)


def _scores(
    graph: onnx.GraphProto, errors: Mapping[str, float], folded: Collection[str], only: Collection[str] | None
) -> list[NodeScore]:
    """Each named node's added error, worst first (NaN/Inf outputs count as the worst).

    A folded activation is not a node of the quantized graph: its error is its producer's (the
    activation's input takes the error measured at its output), and it is not scored itself.
    """
    errors = dict(errors)
    for node in graph.node:
        if node.output and node.output[0] in folded and node.input[0] not in errors:
            errors[node.input[0]] = errors[node.output[0]]
    # The error already in each tensor: measured where both graphs have it; 0 for weights and graph
    # inputs; else the worst error flowing into the node that writes it (nodes are in topological order).
    level: dict[str, float] = {}
    for node in graph.node:
        incoming = max((level.get(t, 0.0) for t in node.input if t), default=0.0)
        for out in node.output:
            level[out] = errors.get(out, incoming)

    scores = []
    for node in graph.node:
        if not node.name or (only is not None and node.name not in only) or any(t in folded for t in node.output):
            continue
        measured = [(errors[t], t) for t in node.output if t in errors]
        if not measured:
            continue
        output_error, output = max(measured)
        input_error = max((level.get(t, 0.0) for t in node.input if t), default=0.0)
        added = output_error - input_error if np.isfinite(output_error) else float("inf")
        scores.append(NodeScore(node.name, node.op_type, added, output_error, input_error, output))
    return sorted(scores, key=lambda s: (-s.score, s.node))
