"""The shapes an edge model is converted at (pipeline/edge/shapes.py) and the order onnx2tf settings are tried in
(pipeline/edge/attempts.py): fast, no conversion."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from pipeline.artifact.manifest import Manifest
from pipeline.artifact.records import ConvertAttempt, ImportRecord, Reading
from pipeline.artifact.tensors import TensorSpec, TokenInput
from pipeline.cli import main
from pipeline.core.errors import InputError
from pipeline.edge.attempts import ATTEMPTS, ULTRALYTICS, attempts_for, attempts_markdown
from pipeline.edge.shapes import device_specs, fitted_evaluation, guessed_advice, is_picture
from pipeline.samples.evaluation import EvaluationSet

LETTERBOX = {"mode": "RGB", "letterbox": {"size": [48, 192], "pad": 114}, "resize": "bilinear", "scale": 1 / 255}


def manifest(inputs: list[TensorSpec], outputs: list[TensorSpec] | None = None) -> Manifest:
    outs = outputs or [TensorSpec("y", "float32", ["batch", 4])]
    return Manifest(name="m", version=1, task="classification", inputs=inputs, outputs=outs)


def image(**preprocessing: object) -> TensorSpec:
    return TensorSpec(
        "x", "float32", ["batch", 3, "x_dim2", "x_dim3"], layout="NCHW", preprocessing=dict(preprocessing)
    )


def test_free_spatial_dims_are_fixed_from_the_golden_inputs_and_the_batch_stays_free() -> None:
    m = manifest([image()], [TensorSpec("y", "float32", ["batch", 4, "x_dim2"])])
    inputs, outputs, fixed = device_specs(m, {"x": np.zeros((5, 3, 48, 192), np.float32)}, {})
    assert inputs[0].shape == ["batch", 3, 48, 192] and outputs[0].shape == ["batch", 4, 48]
    assert [(f.axis, f.dim, f.size) for f in fixed] == [(2, "x_dim2", 48), (3, "x_dim3", 192)]
    assert "golden.npz's inputs (in.x is [5, 3, 48, 192])" == fixed[0].source
    assert m.inputs[0].shape == ["batch", 3, "x_dim2", "x_dim3"]  # the manifest (serving) is unchanged


def test_the_recorded_image_size_wins_over_the_golden_inputs_and_input_shape_over_both() -> None:
    golden = {"x": np.zeros((2, 3, 32, 32), np.float32)}
    inputs, _, fixed = device_specs(manifest([image(image=LETTERBOX)]), golden, {})
    assert inputs[0].shape[2:] == [48, 192] and "image preprocessing (48x192)" in fixed[0].source
    m = manifest([image()])
    read = {"image_size": Reading(value=[64, 96], source="imgsz")}
    m.stages.import_ = ImportRecord(source="m.onnx", source_sha256="0", producer="p", ir_version=8, opset=17,
                                    golden="generated", read=read)  # fmt: skip
    inputs, _, fixed = device_specs(m, golden, {})
    assert inputs[0].shape[2:] == [64, 96] and fixed[1].source == "the recorded image size: imgsz"
    inputs, _, fixed = device_specs(m, golden, {"x": ["?", 3, 16, "?"]})
    assert inputs[0].shape == ["batch", 3, 16, 96]
    assert [(f.size, f.source) for f in fixed] == [(16, "--input-shape"), (96, "the recorded image size: imgsz")]


def test_a_size_taken_from_generated_golden_inputs_is_said_to_be_guessed_with_the_flag_that_gives_it() -> None:
    # a PaddleOCR direction classifier, [-1, 3, ?, ?], imported without flags: its golden inputs are 32x32 noise
    m = manifest([image()])
    m.stages.import_ = ImportRecord(source="cls.onnx", source_sha256="0", producer="p", ir_version=8, opset=17,
                                    golden="generated")  # fmt: skip
    inputs, _, fixed = device_specs(m, {"x": np.zeros((2, 3, 32, 32), np.float32)}, {})
    assert [(f.size, f.guessed) for f in fixed] == [(32, True), (32, True)]
    assert fixed[0].source == "guessed: golden.npz's generated inputs (in.x is [2, 3, 32, 32])"
    advice = guessed_advice(fixed, inputs)
    assert advice is not None and "made at a guessed size (x axis 2 (x_dim2) = 32, x axis 3 (x_dim3) = 32" in advice
    assert "--input-shape x:?,3,<x_dim2>,<x_dim3>" in advice
    given, _, fixed = device_specs(m, {"x": np.zeros((2, 3, 32, 32), np.float32)}, {"x": ["?", 3, 48, 192]})
    assert not any(f.guessed for f in fixed) and guessed_advice(fixed, given) is None
    m.stages.import_ = None  # a trained model's golden inputs are real: its size is known, not guessed
    _, _, fixed = device_specs(m, {"x": np.zeros((2, 3, 32, 32), np.float32)}, {})
    assert not any(f.guessed for f in fixed)


def test_input_shape_errors_name_the_input_and_the_fix() -> None:
    m = manifest([image()])
    with pytest.raises(InputError, match="'nope', which is not a model input"):
        device_specs(m, {}, {"nope": [1, 2]})
    with pytest.raises(InputError, match="axis 1 is fixed at 3 by the model"):
        device_specs(m, {}, {"x": ["?", 4, 8, 8]})


def test_a_token_input_takes_its_golden_length_and_else_its_recorded_max_length() -> None:
    tokens = TensorSpec("ids", "int64", ["batch", "sequence"], layout="NT", tokens=TokenInput(64, max_length=32))
    inputs, _, fixed = device_specs(manifest([tokens]), {"ids": np.zeros((4, 12), np.int64)}, {})
    assert inputs[0].shape == ["batch", 12]
    inputs, _, fixed = device_specs(manifest([tokens]), {}, {})
    assert inputs[0].shape == ["batch", 32] and fixed[0].source == "the recorded max_length of 'ids'"
    bare = TensorSpec("ids", "int64", ["batch", "sequence"], layout="NT")
    with pytest.raises(InputError, match="--input-shape ids:"):
        device_specs(manifest([bare]), {}, {})


def test_images_are_resampled_to_a_given_size_and_other_inputs_refused() -> None:
    x = np.arange(2 * 3 * 4 * 6, dtype=np.float32).reshape(2, 3, 4, 6)
    evaluation = EvaluationSet.of({"x": x}, ({"x": x}, None), recorded={"y": np.zeros((2, 4), np.float32)})
    inputs, _, _ = device_specs(manifest([image()]), {"x": x}, {"x": ["?", 3, 8, 3]})
    fitted, resampled = fitted_evaluation(evaluation, inputs)
    assert resampled and fitted.samples["x"].shape == (2, 3, 8, 3) and fitted.data["x"].shape == (2, 3, 8, 3)
    assert fitted.recorded is None  # the reference runs again on the resampled inputs
    np.testing.assert_array_equal(fitted.samples["x"][0, 0, ::2, 0], x[0, 0, :, 0])  # nearest pixel
    same, resampled = fitted_evaluation(evaluation, device_specs(manifest([image()]), {"x": x}, {})[0])
    assert same is evaluation and not resampled
    rows = TensorSpec("t", "float32", ["batch", "steps"])
    t = np.zeros((2, 5), np.float32)
    inputs, _, _ = device_specs(manifest([rows]), {"t": t}, {"t": ["?", 7]})
    with pytest.raises(InputError, match=r"evaluation inputs are \[2, 5\]"):
        fitted_evaluation(EvaluationSet.of({"t": t}), inputs)


def test_pictures_are_image_inputs_and_tabular_rows_are_not() -> None:
    assert is_picture(image()) and is_picture(image(image=LETTERBOX))
    assert not is_picture(TensorSpec("x", "float32", ["batch", 64]))
    assert not is_picture(TensorSpec("ids", "int64", ["batch", 16], layout="NT"))


def test_a_detector_tries_the_ultralytics_settings_first_and_every_attempt_is_reported() -> None:
    assert attempts_for("classification") == ATTEMPTS and ATTEMPTS[0].options == {} and ATTEMPTS[0].slim
    assert attempts_for("detection")[0].options == ULTRALYTICS and sorted(
        a.name for a in attempts_for("detection")
    ) == sorted(a.name for a in ATTEMPTS)
    assert not ATTEMPTS[-1].slim and not ATTEMPTS[-2].slim  # onnx2tf alone, with its own onnxsim, comes last
    tried = [ConvertAttempt(name="onnxslim", reason="onnx2tf could not convert | at node 'a'"),
             ConvertAttempt(name="onnxslim + ultralytics", options=ULTRALYTICS, used=True)]  # fmt: skip
    text = attempts_markdown(tried, [])
    assert "| 1 | onnxslim (defaults) | yes | 0.0 | left: onnx2tf could not convert \\| at node 'a' |" in text
    assert "disable_group_convolution, enable_batchmatmul_unfold) | yes | 0.0 | used |" in text


def test_input_shape_is_an_edge_option() -> None:
    result = CliRunner().invoke(main, ["export", "nowhere", "--input-shape", "x:1,3,8,8"])
    assert result.exit_code == 2 and "--input-shape is an edge option" in result.output
