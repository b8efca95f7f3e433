"""Tiny real ONNX models and artifacts for the server's tests and benchmark.

Models are written with onnx.helper (fixed random weights from a seed), saved into artifact
directories with the artifact API, with golden.npz holding onnxruntime's outputs on real inputs.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from pipeline.artifact.directory import Artifact
from pipeline.artifact.golden import Golden, save_golden
from pipeline.artifact.manifest import Manifest
from pipeline.artifact.tensors import TensorSpec
from pipeline.artifact.variants import FP32, Variant, variant_file

OPSET = [helper.make_opsetid("", 18)]
_NP = {TensorProto.FLOAT: "float32", TensorProto.INT64: "int64", TensorProto.STRING: "str"}


def _model(nodes: list, inputs: list, outputs: list, inits: list) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=OPSET, ir_version=10)
    onnx.checker.check_model(model)
    return model


def mlp(sizes: list[int], seed: int = 0, batch: str | int = "batch", scale: float = 1.0) -> onnx.ModelProto:
    """x FP32 [batch, sizes[0]] -> logits FP32 [batch, sizes[-1]]: MatMul + Add + Relu layers."""
    rng = np.random.default_rng(seed)
    nodes, inits, current = [], [], "x"
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
        w = (rng.standard_normal((fan_in, fan_out)) * scale / np.sqrt(fan_in)).astype(np.float32)
        b = (rng.standard_normal(fan_out) * 0.1).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        last = i == len(sizes) - 2
        nodes.append(helper.make_node("MatMul", [current, f"w{i}"], [f"mm{i}"]))
        nodes.append(helper.make_node("Add", [f"mm{i}", f"b{i}"], ["logits" if last else f"pre{i}"]))
        if not last:
            nodes.append(helper.make_node("Relu", [f"pre{i}"], [f"h{i}"]))
            current = f"h{i}"
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, sizes[0]])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, sizes[-1]])],
        inits,
    )


def two_in_two_out() -> onnx.ModelProto:
    """a, b FP32 [batch, 3] -> sum = a + b, prod = a * b."""
    shape = ["batch", 3]
    return _model(
        [helper.make_node("Add", ["a", "b"], ["sum"]), helper.make_node("Mul", ["a", "b"], ["prod"])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("a", "b")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("sum", "prod")],
        [],
    )


def embed(vocab: int = 10, dim: int = 3) -> onnx.ModelProto:
    """ids INT64 [batch, 2] -> vectors FP32 [batch, 2, dim] (Gather) and doubled INT64 [batch, 2]."""
    table = np.arange(vocab * dim, dtype=np.float32).reshape(vocab, dim)
    return _model(
        [
            helper.make_node("Gather", ["table", "ids"], ["vectors"]),
            helper.make_node("Add", ["ids", "ids"], ["doubled"]),
        ],
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 2])],
        [
            helper.make_tensor_value_info("vectors", TensorProto.FLOAT, ["batch", 2, dim]),
            helper.make_tensor_value_info("doubled", TensorProto.INT64, ["batch", 2]),
        ],
        [numpy_helper.from_array(table, "table")],
    )


def strings() -> onnx.ModelProto:
    """text STRING [batch] -> echo STRING [batch] (Identity): exercises BYTES end to end."""
    return _model(
        [helper.make_node("Identity", ["text"], ["echo"])],
        [helper.make_tensor_value_info("text", TensorProto.STRING, ["batch"])],
        [helper.make_tensor_value_info("echo", TensorProto.STRING, ["batch"])],
        [],
    )


def _specs(values: list) -> list[TensorSpec]:
    specs = []
    for v in values:
        dims = [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        specs.append(TensorSpec(v.name, _NP[v.type.tensor_type.elem_type], dims))
    return specs


def sample_inputs(model: onnx.ModelProto, rows: int = 8, seed: int = 1) -> dict[str, np.ndarray]:
    """Real inputs of the right dtypes (ids in range for `embed`)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in _specs(list(model.graph.input)):
        shape = [rows if isinstance(d, str) else d for d in spec.shape]
        if spec.dtype == "str":
            feeds[spec.name] = np.array([f"text {i}" for i in range(int(np.prod(shape)))], dtype=object).reshape(shape)
        elif spec.dtype == "int64":
            feeds[spec.name] = rng.integers(0, 10, shape).astype(np.int64)
        else:
            feeds[spec.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def run_reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs from a plain onnxruntime session: what the server must reproduce."""
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def write_artifact(
    repo: Path, name: str, version: int, model: onnx.ModelProto, variants: dict[str, onnx.ModelProto] | None = None
) -> Artifact:
    """Save `model` as artifacts/<name>/<version>/ (the fp32 variant) with golden.npz and optional ONNX variants."""
    root = repo / name / str(version)
    manifest = Manifest(
        name=name,
        version=version,
        task="regression",
        inputs=_specs(list(model.graph.input)),
        outputs=_specs(list(model.graph.output)),
    )
    artifact = Artifact(root, manifest)
    root.mkdir(parents=True, exist_ok=True)
    artifact.write_file(variant_file(FP32), model.SerializeToString())
    artifact.add_variant(FP32, Variant(file=variant_file(FP32), precision="fp32", format="onnx", stage="export"))
    inputs = sample_inputs(model)
    save_golden(artifact, Golden(inputs, run_reference(model, inputs)))
    for variant_name, variant_model in (variants or {}).items():
        add_variant(artifact, variant_name, variant_model)
    artifact.save()
    return artifact


def add_variant(artifact: Artifact, name: str, model: onnx.ModelProto, reason: str = "") -> None:
    """Write `model` as variant `name` made from model.onnx: passed, or failed with `reason` (save() to keep it)."""
    file = variant_file(name)
    artifact.write_file(file, model.SerializeToString())
    status = "failed" if reason else "passed"
    parent = artifact.manifest.files[variant_file(FP32)].sha256
    variant = Variant(
        file=file, precision="fp32", format="onnx", stage="optimize", parent=parent, status=status, reason=reason
    )
    artifact.add_variant(name, variant)
