"""`pipe predict`: one variant of a real (imported) artifact run on an .npz, a JSON file or an image."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest
from click.testing import CliRunner, Result
from PIL import Image

from pipeline.artifact.directory import Artifact
from pipeline.artifact.variants import Variant
from pipeline.cli import main
from pipeline.core.fsutil import sha256_file
from pipeline.runtime.session import create_session
from tests.conftest import LINEAR, train_record

W = np.array([[1.0, -1.0, 0.5], [0.5, 2.0, -1.0], [-1.5, 0.0, 1.0], [0.0, 1.0, 2.0]], dtype=np.float32)
B = np.array([0.1, -0.2, 0.3], dtype=np.float32)
KERNEL = np.random.default_rng(0).standard_normal((3, 1, 8, 8)).astype(np.float32).round(3) / 16


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def imported(tmp_path: Path, text: str, name: str, labels: str) -> Path:
    """`pipe import` of a model written in ONNX's text syntax; the version directory."""
    source = tmp_path / f"{name}.onnx"
    onnx.save(onnx.parser.parse_model(text), source)
    result = invoke("import", source, "--name", name, "--labels", labels, "--repository", tmp_path / "artifacts")
    assert result.exit_code == 0, result.output
    return tmp_path / "artifacts" / name / "1"


@pytest.fixture
def linear(tmp_path: Path) -> Path:
    return imported(tmp_path, LINEAR, "linear", "a,b,c")


@pytest.fixture
def cnn(tmp_path: Path) -> Path:
    """A one-layer CNN on 8x8 grey images: a conv over the whole image per class, [N, 1, 8, 8] -> [N, 3]."""
    weights = ", ".join(str(float(v)) for v in KERNEL.reshape(-1))
    text = f"""
    <ir_version: 8, opset_import: ["" : 18], producer_name: "handwritten">
    cnn (float[N, 1, 8, 8] image) => (float[N, 3] logits)
    <float[3, 1, 8, 8] K = {{{weights}}}>
    {{
        c = Conv(image, K)
        logits = Flatten(c)
    }}
    """
    return imported(tmp_path, text, "cnn", "zero,one,two")


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_top_k_labels_with_softmax_probabilities_as_text_and_json(linear: Path, tmp_path: Path) -> None:
    x = np.array([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 2.0]], dtype=np.float32)
    probs = softmax(x @ W + B)
    np.savez(tmp_path / "in.npz", x=x)

    result = invoke("predict", linear, "--input", tmp_path / "in.npz", "--top-k", "2", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert (out["variant"], out["file"], out["format"]) == ("fp32", "model.onnx", "onnx")
    for sample, top in zip(probs, out["top_k"], strict=True):
        order = np.argsort(-sample)[:2]
        assert [c["label"] for c in top] == [["a", "b", "c"][i] for i in order]
        assert [c["probability"] for c in top] == pytest.approx(sample[order].tolist(), rel=1e-5)
    np.testing.assert_allclose(out["outputs"]["y"]["values"], x @ W + B, rtol=1e-5)

    text = invoke("predict", linear, "--input", tmp_path / "in.npz", "--top-k", "1")
    assert text.exit_code == 0, text.output
    assert f"sample 0\n  a  {probs[0].max():.4f}\nsample 1\n  c  {probs[1].max():.4f}" in text.output


def test_one_sample_gets_its_batch_axis_from_an_unnamed_npz_or_a_json_list(linear: Path, tmp_path: Path) -> None:
    x = np.array([0.5, -1.0, 2.0, 0.0], dtype=np.float32)
    np.savez(tmp_path / "one.npz", x)  # unnamed: arr_0
    (tmp_path / "one.json").write_text(json.dumps(x.tolist()))
    for file in ("one.npz", "one.json"):
        result = invoke("predict", linear, "--input", tmp_path / file, "--json")
        assert result.exit_code == 0, result.output
        out = json.loads(result.output)
        assert out["outputs"]["y"]["shape"] == [1, 3]
        np.testing.assert_allclose(out["outputs"]["y"]["values"], [x @ W + B], rtol=1e-5)
        assert len(out["top_k"]) == 1 and len(out["top_k"][0]) == 3  # --top-k 5 clipped to the 3 classes


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"x": [1.0, "2", 3.0, 4.0]}, "input 'x'[1] is \"2\" (a string); 'x' is float32: give numbers"),
        ({"x": [[1.0, 2.0, None, 4.0]]}, "input 'x'[0][2] is null; 'x' is float32: give numbers"),
        ({"x": [1.0, True, 3.0, 4.0]}, "input 'x'[1] is true (a boolean)"),
        ({"x": [[1.0, 2.0], [3.0]]}, "nested lists of different shapes"),
        ({"x": [1.0, 2.0, 3.0]}, "has shape [3], the model takes ['N', 4]: give [4] for one sample or ['n', 4]"),
        ({"x": [1e39, 0.0, 0.0, 0.0]}, "a number too large for float32"),
        ({"z": [1.0, 2.0, 3.0, 4.0]}, "no input(s) ['x']; unknown name(s) ['z']; the model takes x: float32['N', 4]"),
        ("x", "holds a JSON str; give an object keyed by input name"),
    ],
)
def test_json_input_is_refused_rather_than_cast(linear: Path, tmp_path: Path, body: object, message: str) -> None:
    (tmp_path / "in.json").write_text(json.dumps(body))
    result = invoke("predict", linear, "--input", tmp_path / "in.json")
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1  # one line, naming the value and the fix


def test_npz_names_and_dtypes_must_match_the_manifest(linear: Path, tmp_path: Path) -> None:
    np.savez(tmp_path / "named.npz", features=np.zeros((2, 4), np.float32))
    result = invoke("predict", linear, "--input", tmp_path / "named.npz")
    assert result.exit_code == 2
    assert "no input(s) ['x']; unknown name(s) ['features']; the model takes x: float32['N', 4]" in result.output

    np.savez(tmp_path / "f64.npz", x=np.zeros((2, 4)))
    result = invoke("predict", linear, "--input", tmp_path / "f64.npz")
    assert result.exit_code == 2
    assert "input 'x' is float64, the model takes float32" in result.output

    result = invoke("predict", linear, "--input", tmp_path / "in.txt")
    assert result.exit_code == 2 and "unsupported input file 'in.txt'; give one of .npz, .json, .csv" in result.output
    (tmp_path / "in.csv").write_text("a,b,c,d\n1,2,3,4\n")  # a CSV feeds a model trained on a table only
    result = invoke("predict", linear, "--input", tmp_path / "in.csv")
    assert result.exit_code == 2 and "in.csv: a CSV feeds a model trained on a table" in result.output


def record_variant(root: Path, name: str, file: str, **fields: object) -> None:
    """Record `file` (already inside the artifact) as variant `name` made from model.onnx, through the Artifact API."""
    artifact = Artifact.load(root)
    parent = sha256_file(root / "model.onnx")
    fmt = "tflite" if file.endswith(".tflite") else "onnx"
    fields = {"precision": "fp32", "format": fmt, "stage": "optimize", "parent": parent, **fields}
    artifact.add_variant(name, Variant(file=file, **fields))  # type: ignore[arg-type]
    artifact.save()


def test_a_failed_variant_is_refused_with_its_reason_unless_allowed(linear: Path, tmp_path: Path) -> None:
    (linear / "variants").mkdir()
    (linear / "variants" / "model.int8.onnx").write_bytes((linear / "model.onnx").read_bytes())
    record_variant(linear, "int8", "variants/model.int8.onnx", status="failed", reason="accuracy drop 0.2 > 0.01")
    np.savez(tmp_path / "in.npz", x=np.ones((1, 4), np.float32))

    refused = invoke("predict", linear, "--variant", "int8", "--input", tmp_path / "in.npz")
    assert refused.exit_code == 2
    assert "variant 'int8' is not usable: failed optimize: accuracy drop 0.2 > 0.01" in refused.output
    assert "--allow-failed" in refused.output

    allowed = invoke("predict", linear, "--variant", "int8", "--input", tmp_path / "in.npz", "--allow-failed")
    assert allowed.exit_code == 0, allowed.output
    assert "note: variant 'int8' is not usable (failed optimize" in allowed.output
    assert "variant int8 (variants/model.int8.onnx, onnx)" in allowed.output

    missing = invoke("predict", linear, "--variant", "fp16", "--input", tmp_path / "in.npz")
    assert missing.exit_code == 2
    assert "variant 'fp16' does not exist" in missing.output and "its variants: fp32, int8" in missing.output


def cnn_probabilities(root: Path, image: np.ndarray) -> np.ndarray:
    (logits,) = create_session(root / "model.onnx").run(None, {"image": image})
    return softmax(logits)


def test_an_image_needs_the_manifest_to_say_its_pixel_values(cnn: Path, tmp_path: Path) -> None:
    pixels = np.random.default_rng(1).integers(0, 256, (8, 8), dtype=np.uint8)
    Image.fromarray(pixels, mode="L").save(tmp_path / "digit.png")

    refused = invoke("predict", cnn, "--input", tmp_path / "digit.png")
    assert refused.exit_code == 2
    assert "lacks inputs[].preprocessing.image" in refused.output and "--image-preprocessing" in refused.output

    # A digits model trained by pipe takes raw 0..16 values: its train record says so.
    artifact = Artifact.load(cnn)
    artifact.manifest.stages.train = train_record({"data": {"source": "digits", "as_image": True}}, {})
    artifact.save()
    result = invoke("predict", cnn, "--input", tmp_path / "digit.png", "--json", "--top-k", "3")
    assert result.exit_code == 0, result.output
    expected = cnn_probabilities(cnn, (pixels / 255.0 * 16.0).astype(np.float32)[None, None])[0]
    top = json.loads(result.output)["top_k"][0]
    assert [c["probability"] for c in top] == pytest.approx(sorted(expected, reverse=True), rel=1e-5)
    assert top[0]["label"] == ["zero", "one", "two"][int(expected.argmax())]


def test_an_image_is_converted_to_the_channels_and_size_the_input_declares(cnn: Path, tmp_path: Path) -> None:
    artifact = Artifact.load(cnn)
    artifact.manifest.inputs[0].preprocessing = {"image": {"mode": "L", "size": [8, 8], "scale": 1 / 255}}
    artifact.save()
    rgb = np.random.default_rng(2).integers(0, 256, (16, 12, 3), dtype=np.uint8)
    Image.fromarray(rgb, mode="RGB").save(tmp_path / "photo.png")

    result = invoke("predict", cnn, "--input", tmp_path / "photo.png", "--json")
    assert result.exit_code == 0, result.output
    grey = Image.open(tmp_path / "photo.png").convert("L").resize((8, 8), Image.Resampling.BILINEAR)
    expected = cnn_probabilities(cnn, (np.asarray(grey, np.float32) / 255.0)[None, None])[0]
    top = json.loads(result.output)["top_k"][0]
    assert [c["index"] for c in top] == np.argsort(-expected).tolist()
    assert [c["probability"] for c in top] == pytest.approx(np.sort(expected)[::-1].tolist(), rel=1e-5)

    refused = invoke("predict", imported(tmp_path, LINEAR, "flat", "a,b,c"), "--input", tmp_path / "photo.png")
    assert refused.exit_code == 2 and "an image feeds a model with one image input" in refused.output


def linear_tflite(path: Path) -> None:
    """y = x @ W + b as a .tflite file whose signature names its input x and its output y."""
    import tensorflow as tf

    class Linear(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
        def __call__(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"y": tf.matmul(x, tf.constant(W)) + tf.constant(B)}

    module = Linear()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([module.__call__.get_concrete_function()], module)
    path.write_bytes(converter.convert())


def test_a_tflite_variant_runs_through_the_edge_runner(linear: Path, tmp_path: Path) -> None:
    (linear / "edge").mkdir()
    linear_tflite(linear / "edge" / "model.fp32.tflite")
    record_variant(linear, "tflite-fp32", "edge/model.fp32.tflite", stage="edge")
    x = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)

    result = invoke("predict", linear, "--variant", "tflite-fp32", "--input", tmp_path / "in.npz", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert (out["file"], out["format"]) == ("edge/model.fp32.tflite", "tflite")
    np.testing.assert_allclose(out["outputs"]["y"]["values"], x @ W + B, rtol=1e-5, atol=1e-6)
    assert [t[0]["index"] for t in out["top_k"]] == (x @ W + B).argmax(1).tolist()


@pytest.mark.parametrize("side", [12, 30])  # past Pillow's limit (a warning), past twice it (an error)
def test_an_image_too_large_to_decode_is_one_line_naming_its_size(
    cnn: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, side: int
) -> None:
    artifact = Artifact.load(cnn)
    artifact.manifest.inputs[0].preprocessing = {"image": {"mode": "L", "size": [8, 8], "scale": 1 / 255}}
    artifact.save()
    Image.new("L", (side, side)).save(tmp_path / "huge.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # a 20000x20000 picture, scaled down to keep the test fast

    result = invoke("predict", cnn, "--input", tmp_path / "huge.png")
    assert result.exit_code == 2, result.output
    assert f"{side * side} pixels" in result.output and "smaller" in result.output


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"x": [' + "9" * 5000 + ", 0, 0, 0]}", "a number in it cannot be read"),  # was ValueError, exit 3
        ('{"x": [NaN, 0, 0, 0]}', "NaN is not a JSON number"),  # was "too large for float32"
        ('{"x": [Infinity, 0, 0, 0]}', "Infinity is not a JSON number"),
    ],
)
def test_json_numbers_python_reads_but_json_has_not_are_one_line(
    linear: Path, tmp_path: Path, text: str, message: str
) -> None:
    (tmp_path / "in.json").write_text(text)
    result = invoke("predict", linear, "--input", tmp_path / "in.json")
    assert result.exit_code == 2 and message in result.output, result.output[-300:]
    assert len(result.output.strip().splitlines()) == 1 and len(result.output) < 500


def test_an_npz_whose_header_claims_more_than_it_holds_is_refused_before_allocating(
    linear: Path, tmp_path: Path
) -> None:
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (10**9, 4)})
    with zipfile.ZipFile(tmp_path / "forged.npz", "w") as archive:  # numpy would allocate 16 GB for it
        archive.writestr("x.npy", header.getvalue() + np.zeros((2, 4), np.float32).tobytes())
    result = invoke("predict", linear, "--input", tmp_path / "forged.npz")
    assert result.exit_code == 2, result.output
    assert (
        "array 'x' claims shape (1000000000, 4) of float32 (16,000,000,000 bytes) but holds 32 bytes" in result.output
    )
