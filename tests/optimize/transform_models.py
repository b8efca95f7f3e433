"""Tiny models for the graph and quantization tests, and the data they run on.

The MLP and the CNN are written in onnx's text syntax (weights attached from numpy, scaled like a
trained layer's); the transformer is a real torch TransformerEncoderLayer exported with the dynamo
exporter, because quantization and graph fusions need the graphs real exporters write (Gather,
LayerNormalization, attention MatMuls, Gemm). Node names are left empty in the text models on
purpose: ONNX allows it, and exclusion by name must still work.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.parser
import onnxruntime as ort

HEADER = '<ir_version: 8, opset_import: ["" : 18]>'
VOCAB, SEQ = 40, 8


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _weights(shape: tuple[int, ...], fan_in: int, seed: int) -> np.ndarray:
    return (rng(seed).standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)


def _save(path: Path, text: str, weights: dict[str, np.ndarray]) -> Path:
    model = onnx.parser.parse_model(f"{HEADER}\n{text}")
    model.graph.initializer.extend(onnx.numpy_helper.from_array(w, name) for name, w in weights.items())
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def mlp(tmp_path: Path, width: int = 256) -> Path:
    """x [N, 64] -> 3 dense layers -> y [N, 10]: weight-heavy (about 90k weights), unnamed nodes."""
    text = """
    g (float[N, 64] x) => (float[N, 10] y) {
        h1 = MatMul(x, w1)
        b1o = Add(h1, b1)
        r1 = Relu(b1o)
        h2 = MatMul(r1, w2)
        b2o = Add(h2, b2)
        r2 = Relu(b2o)
        h3 = MatMul(r2, w3)
        y = Add(h3, b3)
    }"""
    weights = {
        "w1": _weights((64, width), 64, 1),
        "b1": np.full(width, 0.01, np.float32),
        "w2": _weights((width, width), width, 2),
        "b2": np.full(width, 0.01, np.float32),
        "w3": _weights((width, 10), width, 3),
        "b3": np.zeros(10, np.float32),
    }
    return _save(tmp_path / "mlp.onnx", text, weights)


def cnn(tmp_path: Path) -> Path:
    """x [N, 1, 8, 8] -> Conv, BatchNormalization, Relu, MaxPool, Conv, Relu, pool, Gemm -> y [N, 10]."""
    text = """
    g (float[N, 1, 8, 8] x) => (float[N, 10] y) {
        c1 = Conv <pads = [1, 1, 1, 1]> (x, k1, kb1)
        n1 = BatchNormalization (c1, gamma, beta, mean, var)
        r1 = Relu(n1)
        p1 = MaxPool <kernel_shape = [2, 2], strides = [2, 2]> (r1)
        c2 = Conv <pads = [1, 1, 1, 1]> (p1, k2, kb2)
        r2 = Relu(c2)
        p2 = GlobalAveragePool(r2)
        f = Flatten(p2)
        y = Gemm <transB = 1> (f, wf, bf)
    }"""
    weights = {
        "k1": _weights((16, 1, 3, 3), 9, 4),
        "kb1": np.zeros(16, np.float32),
        "gamma": np.linspace(0.5, 1.5, 16, dtype=np.float32),
        "beta": np.linspace(-0.1, 0.1, 16, dtype=np.float32),
        "mean": np.linspace(-0.2, 0.2, 16, dtype=np.float32),
        "var": np.linspace(0.5, 2.0, 16, dtype=np.float32),
        "k2": _weights((32, 16, 3, 3), 144, 5),
        "kb2": np.zeros(32, np.float32),
        "wf": _weights((10, 32), 32, 6),
        "bf": np.zeros(10, np.float32),
    }
    return _save(tmp_path / "cnn.onnx", text, weights)


def mobile_cnn(path: Path, head: tuple[np.ndarray, np.ndarray] | None = None) -> Path:
    """x [N, 3, 32, 32] -> a MobileNet-like stack -> y [N, classes]: a stem conv, two depthwise-separable
    blocks with hard-swish, a global mean and a Gemm `head` (weights [classes, 64], bias; None: the 64
    features themselves). 93% of the weights are in Conv; nodes unnamed."""
    wf, bf = head if head is not None else (np.eye(64, dtype=np.float32), np.zeros(64, np.float32))
    text = f"""
    g (float[N, 3, 32, 32] x) => (float[N, {len(wf)}] y) {{
        c0 = Conv <pads = [1, 1, 1, 1], strides = [2, 2]> (x, k0, b0)
        h0 = HardSwish(c0)
        d1 = Conv <pads = [1, 1, 1, 1], group = 16> (h0, dk1, db1)
        e1 = HardSwish(d1)
        p1 = Conv (e1, pk1, pb1)
        h1 = HardSwish(p1)
        d2 = Conv <pads = [1, 1, 1, 1], strides = [2, 2], group = 32> (h1, dk2, db2)
        e2 = HardSwish(d2)
        p2 = Conv (e2, pk2, pb2)
        h2 = HardSwish(p2)
        m = ReduceMean <keepdims = 0> (h2, axes)
        y = Gemm <transB = 1> (m, wf, bf)
    }}"""
    weights = {
        "k0": _weights((16, 3, 3, 3), 27, 11), "b0": np.zeros(16, np.float32),
        "dk1": _weights((16, 1, 3, 3), 9, 12), "db1": np.full(16, 0.1, np.float32),
        "pk1": _weights((32, 16, 1, 1), 16, 13), "pb1": np.zeros(32, np.float32),
        "dk2": _weights((32, 1, 3, 3), 9, 14), "db2": np.full(32, 0.1, np.float32),
        "pk2": _weights((64, 32, 1, 1), 32, 15), "pb2": np.zeros(64, np.float32),
        "axes": np.array([2, 3], np.int64), "wf": wf.astype(np.float32), "bf": bf.astype(np.float32),
    }  # fmt: skip
    return _save(path, text, weights)


def mobile_data(count: int, classes: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Pictures for `mobile_cnn` and their classes: a smooth pattern per class plus noise."""
    patterns = rng(99).standard_normal((classes, 3, 4, 4)).astype(np.float32).repeat(8, axis=2).repeat(8, axis=3)
    r = rng(seed)
    label = r.integers(0, classes, count)
    noise = r.standard_normal((count, 3, 32, 32)).astype(np.float32)
    return (patterns[label] + 0.5 * noise).astype(np.float32), label


def mobile_classifier(directory: Path, classes: int = 4, samples: int = 128) -> tuple[Path, Path]:
    """`mobile_cnn` with its head fitted (ridge regression on the features to one-hot classes) and an
    NPZ of `samples` labelled pictures it was not fitted on: (model, eval data)."""
    features = directory / "mobile_features.onnx"
    x, label = mobile_data(512, classes, seed=1)
    m = ort.InferenceSession(str(mobile_cnn(features)), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    m = np.concatenate([m, np.ones((len(m), 1), np.float32)], axis=1)
    w = np.linalg.solve(m.T @ m + 1e-3 * np.eye(m.shape[1]), m.T @ np.eye(classes)[label])
    path = mobile_cnn(directory / "mobile.onnx", (w[:-1].T.astype(np.float32), w[-1].astype(np.float32)))
    x, label = mobile_data(samples, classes, seed=2)
    np.savez(directory / "mobile.npz", x=x, target=label)
    return path, directory / "mobile.npz"


_exported: dict[str, Path] = {}


def transformer(directory: Path) -> Path:
    """tokens [batch, 8] int64 -> embedding, one encoder layer (4 heads), mean, linear -> [batch, 5].

    Exported once per test session (into the first `directory` asked for): tests only read it.
    """
    if "transformer" in _exported:
        return _exported["transformer"]
    path = directory / "transformer.onnx"
    import torch
    from torch import nn

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, 64)
            self.encoder = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
            self.head = nn.Linear(64, 5)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.head(self.encoder(self.embed(tokens)).mean(dim=1))

    torch.manual_seed(0)
    model = Tiny().eval()
    with warnings.catch_warnings():  # torch.export's own deprecations; the project runs warnings as errors
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (torch.zeros(2, SEQ, dtype=torch.int64),),
            str(path),
            dynamo=True,
            external_data=False,
            input_names=["tokens"],
            output_names=["logits"],
            dynamic_shapes={"tokens": {0: torch.export.Dim("batch")}},
            verbose=False,
        )
    _exported["transformer"] = path
    return path


def wide_channel_mlp(path: Path, rng: np.random.Generator, outputs: int, wide: float) -> tuple[np.ndarray, np.ndarray]:
    """x [batch, 16] -> MatMul `hidden` -> Relu -> MatMul `head` -> logits [batch, outputs], saved at `path`.

    Hidden channel 0 is `wide` times the rest and `head` scales it back: fp32 computes what it would
    without the wide channel, but int8 with one scale per tensor rounds every other channel away.
    Returns the two weights (w1, w2) so a test can compute the fp32 answer.
    """
    w1 = rng.standard_normal((16, 32)).astype(np.float32)
    w2 = rng.standard_normal((32, outputs)).astype(np.float32)
    w1[:, 0] *= wide
    w2[0, :] /= wide
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", "w1"], ["h"], name="hidden"),
         onnx.helper.make_node("Relu", ["h"], ["r"], name="relu"),
         onnx.helper.make_node("MatMul", ["r", "w2"], ["logits"], name="head")],
        "wide_channel",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 16])],
        [onnx.helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["batch", outputs])],
        [onnx.numpy_helper.from_array(w1, "w1"), onnx.numpy_helper.from_array(w2, "w2")],
    )  # fmt: skip
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)], producer_name="handwritten")
    model.ir_version = 9
    onnx.save(model, str(path))
    return w1, w2


def digits(count: int, offset: int = 0) -> dict[str, np.ndarray]:
    """Real images: sklearn's bundled 8x8 digits, scaled to [0, 1], as x [count, 1, 8, 8]."""
    from sklearn.datasets import load_digits

    images = load_digits().images[offset : offset + count].astype(np.float32) / 16.0
    return {"x": images[:, None]}


def features(count: int, seed: int = 0) -> dict[str, np.ndarray]:
    return {"x": rng(seed).standard_normal((count, 64)).astype(np.float32)}


def tokens(count: int, seed: int = 0) -> dict[str, np.ndarray]:
    return {"tokens": rng(seed).integers(0, VOCAB, (count, SEQ)).astype(np.int64)}


def run(path: Path, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """The first output of the model at `path` on CPU."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, inputs)[0]


def relative_error(reference: np.ndarray, other: np.ndarray) -> float:
    """Largest difference over the largest reference value: scale-free closeness."""
    return float(np.abs(reference - other).max() / np.abs(reference).max())


def cosine(reference: np.ndarray, other: np.ndarray) -> float:
    """Smallest per-row cosine similarity."""
    a, b = reference.reshape(len(reference), -1), other.reshape(len(other), -1)
    return float((np.sum(a * b, 1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).min())
