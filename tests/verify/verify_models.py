"""Tiny ONNX models for the verifier tests, written in onnx's text syntax, and the data they run on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.parser

from pipeline.artifact.tensors import TensorSpec

OPSET = '<ir_version: 8, opset_import: ["" : 18]>'
X = TensorSpec("x", "float32", ["batch", 4])


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def inputs(count: int, seed: int = 0) -> dict[str, np.ndarray]:
    return {"x": rng(seed).standard_normal((count, 4)).astype(np.float32)}


def weights(width: int, seed: int = 1) -> np.ndarray:
    return rng(seed).standard_normal((4, width)).astype(np.float32)


def spec(width: int) -> TensorSpec:
    return TensorSpec("y", "float32", ["batch", width])


def literal(array: np.ndarray) -> str:
    """An initializer's values as the text syntax writes them: {v0, v1, ...} in row-major order."""
    return "{" + ", ".join(repr(v.item()) for v in array.reshape(-1)) + "}"


def save(tmp_path: Path, text: str, name: str = "model") -> Path:
    model = onnx.parser.parse_model(f"{OPSET}\n{text}")
    onnx.checker.check_model(model)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return path


def graph(tmp_path: Path, body: str, batch: str = "N", width: int = 4, name: str = "model") -> Path:
    """y = <body over x>, both [batch, 4] unless `width` says otherwise."""
    return save(tmp_path, f"g (float[{batch}, 4] x) => (float[{batch}, {width}] y) {{ {body} }}", name)


def linear(tmp_path: Path, w: np.ndarray, name: str = "model", batch: str = "N") -> Path:
    """y = x @ w in fp32: a classifier's logits, an embedding or a regression, by the width of w."""
    width = w.shape[1]
    return save(
        tmp_path,
        f"g (float[{batch}, 4] x) => (float[{batch}, {width}] y)\n"
        f"<float[4, {width}] w = {literal(w)}>\n{{ y = MatMul(x, w) }}",
        name,
    )


def int8_linear(tmp_path: Path, w: np.ndarray, name: str = "int8") -> Path:
    """y = x @ dequantize(int8 weights): w rounded onto a symmetric int8 grid, as weight quantization does."""
    scale = np.float32(np.abs(w).max() / 127)
    quantized = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
    width = w.shape[1]
    return save(
        tmp_path,
        f"g (float[N, 4] x) => (float[N, {width}] y)\n"
        f"<int8[4, {width}] wq = {literal(quantized)}, float s = {{{scale.item()!r}}}>\n"
        "{ w = DequantizeLinear(wq, s)\n  y = MatMul(x, w) }",
        name,
    )


def bumped_linear(tmp_path: Path, w: np.ndarray, name: str = "bumped") -> Path:
    """x @ w, plus 100 * relu(x[:, 0] - 5) on the last class: equal to `linear` unless x[:, 0] > 5."""
    width = w.shape[1]
    bump = np.zeros((4, width), np.float32)
    bump[0, -1] = 100.0
    threshold = np.array([5.0, 1e9, 1e9, 1e9], np.float32)  # only feature 0 can exceed its threshold
    return save(
        tmp_path,
        f"g (float[N, 4] x) => (float[N, {width}] y)\n"
        f"<float[4, {width}] w = {literal(w)}, float[4, {width}] e = {literal(bump)},"
        f" float[4] t = {literal(threshold)}>\n"
        "{ xw = MatMul(x, w)\n  shifted = Sub(x, t)\n  over = Relu(shifted)\n"
        "  extra = MatMul(over, e)\n  y = Add(xw, extra) }",
        name,
    )
