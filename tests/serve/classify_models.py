"""Classifier and token-id artifacts for the classification, token-limit and strict-JSON tests.

A real digits classifier (multinomial logistic regression fitted on sklearn's bundled digits, written
as MatMul + Add), a tiny token classifier (embedding Gather, mean over the sequence, linear head) and
a BOOL model, saved as artifacts with the manifest facts the server reads: labels and token limits.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from pipeline.artifact.directory import Artifact
from pipeline.artifact.golden import Golden, save_golden
from pipeline.artifact.manifest import Manifest
from pipeline.artifact.tensors import TensorSpec, TokenInput
from pipeline.artifact.variants import FP32, Variant, variant_file
from tests.serve.serve_models import run_reference

OPSET = [helper.make_opsetid("", 18)]
DIGIT_NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
VOCAB, MAX_LENGTH = 10, 6


def _model(nodes: list, inputs: list, outputs: list, inits: list) -> onnx.ModelProto:
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, inits), opset_imports=OPSET, ir_version=10)
    onnx.checker.check_model(model)
    return model


def digits() -> tuple[np.ndarray, np.ndarray]:
    """sklearn's bundled digits: x FP32 [1797, 64] (0..16), y [1797]."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.data.astype(np.float32), bunch.target


@functools.cache
def fitted_digits() -> tuple[np.ndarray, np.ndarray]:
    """W [64, 10] (for raw 0..16 pixels) and b [10], fitted once per run (7 s on a loaded 2-core machine)."""
    from sklearn.linear_model import LogisticRegression

    x, y = digits()
    fit = LogisticRegression(max_iter=300).fit(x[:1200] / 16, y[:1200])
    return (fit.coef_.T / 16).astype(np.float32), fit.intercept_.astype(np.float32)


def digits_classifier() -> onnx.ModelProto:
    """x FP32 [batch, 64] -> logits FP32 [batch, 10], fitted on the digits."""
    w, b = fitted_digits()
    return _model(
        [helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["logits"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )


def token_classifier() -> onnx.ModelProto:
    """ids INT64 [batch, sequence] -> logits FP32 [batch, 3]: embedding, mean over the sequence, head.

    Gather wraps a negative id around (-1 is the last row) and would take any length: only the
    manifest's limits stop such requests.
    """
    rng = np.random.default_rng(3)
    table = rng.standard_normal((VOCAB, 4)).astype(np.float32)
    head = rng.standard_normal((4, 3)).astype(np.float32)
    return _model(
        [
            helper.make_node("Gather", ["table", "ids"], ["embedded"]),
            helper.make_node("ReduceMean", ["embedded", "axis"], ["pooled"], keepdims=0),
            helper.make_node("MatMul", ["pooled", "head"], ["logits"]),
        ],
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])],
        [
            numpy_helper.from_array(table, "table"),
            numpy_helper.from_array(head, "head"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "axis"),
        ],
    )


def negation() -> onnx.ModelProto:
    """flags BOOL [batch, 2] -> negated BOOL [batch, 2]."""
    return _model(
        [helper.make_node("Not", ["flags"], ["negated"])],
        [helper.make_tensor_value_info("flags", TensorProto.BOOL, ["batch", 2])],
        [helper.make_tensor_value_info("negated", TensorProto.BOOL, ["batch", 2])],
        [],
    )


def summed() -> onnx.ModelProto:
    """a, b FP32 [batch, 3] -> scores = a + b: two inputs, one classifier-like output."""
    return _model(
        [helper.make_node("Add", ["a", "b"], ["scores"])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 3]) for n in ("a", "b")],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 3])],
        [],
    )


def save(
    repo: Path,
    name: str,
    model: onnx.ModelProto,
    inputs: list[TensorSpec],
    outputs: list[TensorSpec],
    feeds: dict[str, np.ndarray],
    labels: list[str] | None = None,
) -> None:
    """artifacts/<name>/1 with the manifest's specs as given (labels make it a classifier)."""
    manifest = Manifest(
        name=name,
        version=1,
        task="classification" if labels else "regression",
        inputs=inputs,
        outputs=outputs,
        labels=labels or [],
    )
    root = repo / name / "1"
    root.mkdir(parents=True)
    artifact = Artifact(root, manifest)
    artifact.write_file(variant_file(FP32), model.SerializeToString())
    artifact.add_variant(FP32, Variant(file=variant_file(FP32), precision="fp32", format="onnx", stage="export"))
    save_golden(artifact, Golden(feeds, run_reference(model, feeds)))
    artifact.save()


def write_repository(repo: Path) -> None:
    """digits (labeled), tokens (limits with a padding id), tokens-nopad (limits, no padding id),
    flags (BOOL) and summed (two inputs, no labels)."""
    x, _ = digits()
    save(
        repo,
        "digits",
        digits_classifier(),
        [TensorSpec("x", "float32", ["batch", 64])],
        [TensorSpec("logits", "float32", ["batch", 10])],
        {"x": x[1200:1210]},
        labels=DIGIT_NAMES,
    )
    ids = np.array([[1, 2, 3, 0, 0, 0], [4, 5, 6, 7, 8, 9]], dtype=np.int64)
    for name, limits in (
        ("tokens", TokenInput(vocab_size=VOCAB, max_length=MAX_LENGTH, padding_id=0)),
        ("tokens-nopad", TokenInput(vocab_size=VOCAB)),
    ):
        save(
            repo,
            name,
            token_classifier(),
            [TensorSpec("ids", "int64", ["batch", "sequence"], "NT", tokens=limits)],
            [TensorSpec("logits", "float32", ["batch", 3])],
            {"ids": ids},
            labels=["neg", "neutral", "pos"],
        )
    flags = np.array([[True, False]])
    save(
        repo,
        "flags",
        negation(),
        [TensorSpec("flags", "bool", ["batch", 2])],
        [TensorSpec("negated", "bool", ["batch", 2])],
        {"flags": flags},
    )
    pair = {"a": np.ones((1, 3), np.float32), "b": np.arange(3, dtype=np.float32)[None]}
    save(
        repo,
        "summed",
        summed(),
        [TensorSpec(n, "float32", ["batch", 3]) for n in "ab"],
        [TensorSpec("scores", "float32", ["batch", 3])],
        pair,
    )
