"""pipeline/runtime/tflite_runner.py: the stand-alone TFLite runner, on tiny models built here, and in the verifier.

The models are made by tensorflow's own converter from small tf.functions (no onnx2tf: seconds,
not minutes), in a subprocess so this process never imports tensorflow; the same subprocess
records tensorflow's outputs on fixed inputs, which the runner must reproduce. The slow test
builds `.venv-edge` (numpy<2 + tflite-runtime 2.14, nothing else) with `make edge-runtime` and
runs the runner there, as a device would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.artifact.manifest import ModelSpec
from pipeline.artifact.tensors import TensorSpec
from pipeline.core.errors import ArtifactError
from pipeline.runtime.runners import tflite_candidate
from pipeline.runtime.tflite_runner import TFLiteRunner, dequantize, quantize
from pipeline.samples.evaluation import EvaluationSet
from pipeline.verify.budgets import Top1Agreement
from pipeline.verify.gate import verify
from pipeline.verify.policies import Exact, Policy
from pipeline.verify.report import GateReport

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "pipeline" / "runtime" / "tflite_runner.py"
EDGE_PYTHON = ROOT / ".venv-edge" / "bin" / "python"
NAMES = {"logits": "Identity"}  # tensorflow names a tf.function's output Identity
X_SPEC = [TensorSpec("x", "float32", ["batch", 8])]
LOGITS_SPEC = [TensorSpec("logits", "float32", ["batch", 3])]

# Writes the models and tensorflow's outputs into argv[1]. dense: x[N, 8] -> relu(x W1 + b1) W2 + b2
# -> logits[N, 3]; image: an NHWC pixels[N, 3, 4, 2] flattened into a dense layer (any transposition
# mistake changes every output).
BUILD = r"""
import sys
from pathlib import Path
import numpy as np
import tensorflow as tf

out = Path(sys.argv[1])
rng = np.random.default_rng(0)
w = {k: rng.normal(size=s).astype("float32") for k, s in
     {"w1": (8, 16), "b1": (16,), "w2": (16, 3), "b2": (3,), "w3": (24, 3), "w4": (8, 256)}.items()}
np.savez(out / "weights.npz", **w)
x = rng.normal(size=(32, 8)).astype("float32")
pixels = rng.normal(size=(32, 3, 4, 2)).astype("float32")

def dense_fn(w2, batch=None):
    @tf.function(input_signature=[tf.TensorSpec([batch, 8], tf.float32, name="x")])
    def dense(x):
        return tf.matmul(tf.nn.relu(tf.matmul(x, w["w1"]) + w["b1"]), w2) + w["b2"]
    return dense

@tf.function(input_signature=[tf.TensorSpec([None, 3, 4, 2], tf.float32, name="pixels")])
def image(pixels):
    return tf.matmul(tf.reshape(pixels, [-1, 24]), w["w3"])

@tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x")])
def wide(x):  # a weight of 2048 values: big enough for dynamic-range quantization to quantize it
    return tf.reduce_sum(tf.nn.relu(tf.matmul(x, w["w4"])), axis=1, keepdims=True)

w5 = np.random.default_rng(5).normal(size=(8, 12)).astype("float32")
np.save(out / "head.npy", w5)

@tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x")])
def head(x):  # [N, 6, 2]: a detector head's layout, channels 0..3 boxes, then scores
    return tf.reshape(tf.matmul(x, w5), [-1, 6, 2])

def convert(fn, name, int8=False, dynamic=False):
    converter = tf.lite.TFLiteConverter.from_concrete_functions([fn.get_concrete_function()], fn)
    if int8 or dynamic:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if int8:  # full integer, int8 in and out, calibrated on the inputs the tests feed (none clipped)
        converter.representative_dataset = lambda: ([x[i : i + 1]] for i in range(len(x)))
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = tf.int8
        converter.inference_output_type = tf.int8
    (out / name).write_bytes(converter.convert())

dense = dense_fn(w["w2"])
signed = tf.Module()  # a SavedModel's signature names the output, as onnx2tf's models do
signed.f = tf.function(lambda x: {"logits": dense(x)}, input_signature=dense.input_signature)
tf.saved_model.save(signed, str(out / "signed"), signatures={"serving_default": signed.f})
(out / "dense.signed.tflite").write_bytes(tf.lite.TFLiteConverter.from_saved_model(str(out / "signed")).convert())
convert(dense, "dense.fp32.tflite")
convert(dense, "dense.int8.tflite", int8=True)
convert(wide, "wide.dynamic.tflite", dynamic=True)
convert(dense_fn(w["w2"] + 0.05), "dense.perturbed.tflite")
convert(dense_fn(w["w2"], batch=1), "dense.batch1.tflite")
convert(image, "image.fp32.tflite")
convert(head, "head.fp32.tflite")
np.savez(out / "dense.golden.npz", **{"in.x": x, "out.logits": dense(x).numpy()})
np.savez(out / "wide.golden.npz", **{"in.x": x, "out.y": wide(x).numpy()})
np.savez(out / "image.golden.npz", **{"in.pixels": pixels.transpose(0, 3, 1, 2), "out.y": image(pixels).numpy()})
"""


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tflite")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", BUILD, str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def golden(models: Path, name: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    with np.load(models / f"{name}.golden.npz") as data:
        return {k[3:]: data[k] for k in data.files if k.startswith("in.")}, {
            k[4:]: data[k] for k in data.files if k.startswith("out.")
        }


def numpy_dense(models: Path):
    """The dense model in float64 numpy: the verifier's reference."""
    with np.load(models / "weights.npz") as w:
        w1, b1, w2, b2 = (w[k].astype(np.float64) for k in ("w1", "b1", "w2", "b2"))

    def run(inputs: dict[str, np.ndarray], /) -> dict[str, np.ndarray]:
        return {"logits": (np.maximum(inputs["x"] @ w1 + b1, 0) @ w2 + b2).astype(np.float32)}

    return run


def run_cli(python: Path | str, runner: Path, *args: str) -> tuple[int, dict]:
    proc = subprocess.run([str(python), "-I", str(runner), *args], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout.strip().splitlines()[-1])


def test_runner_matches_tensorflow_at_every_batch_size(models: Path) -> None:
    inputs, outputs = golden(models, "dense")
    runner = TFLiteRunner(models / "dense.fp32.tflite", names=NAMES)
    assert runner.runtime == "ai_edge_litert"
    for batch in (1, 5, 32, 1):  # grows, then shrinks back: resized each time
        got = runner({"x": inputs["x"][:batch]})
        assert set(got) == {"logits"} and got["logits"].shape == (batch, 3)
        np.testing.assert_allclose(got["logits"], outputs["logits"][:batch], atol=1e-5)


def test_float64_inputs_are_cast_and_a_missing_input_is_named(models: Path) -> None:
    inputs, outputs = golden(models, "dense")
    runner = TFLiteRunner(models / "dense.fp32.tflite")
    got = runner({"x": inputs["x"][:5].astype(np.float64)})
    np.testing.assert_allclose(got["Identity"], outputs["logits"][:5], atol=1e-5)  # without names: the model's own
    with pytest.raises(ValueError, match=r"missing input\(s\) \['x'\].*names="):
        runner({"pixels": inputs["x"]})


def test_a_signature_names_the_tensors_and_names_renames_them(models: Path) -> None:
    inputs, outputs = golden(models, "dense")
    runner = TFLiteRunner(models / "dense.signed.tflite")  # tensors serving_default_x:0 and PartitionedCall:0
    assert [d["tensor"] for d in runner.details()["inputs"]] == ["serving_default_x:0"]
    np.testing.assert_allclose(runner(inputs)["logits"], outputs["logits"], atol=1e-5)
    renamed = TFLiteRunner(models / "dense.signed.tflite", names={"features": "x", "scores": "logits"})
    np.testing.assert_allclose(renamed({"features": inputs["x"]})["scores"], outputs["logits"], atol=1e-5)
    with pytest.raises(
        ValueError, match=r"names maps to tensor\(s\) \['X'\] the model lacks; it has \['logits', 'x'\]"
    ):
        TFLiteRunner(models / "dense.signed.tflite", names={"x": "X"})


def test_a_fixed_batch_is_refused_not_resized(models: Path) -> None:
    runner = TFLiteRunner(models / "dense.batch1.tflite", names=NAMES)
    inputs, outputs = golden(models, "dense")
    np.testing.assert_allclose(runner({"x": inputs["x"][:1]})["logits"], outputs["logits"][:1], atol=1e-5)
    with pytest.raises(Exception, match="(?i)dim"):  # the interpreter's strict resize names the fixed dimension
        runner({"x": inputs["x"][:5]})


def test_quantize_round_trips_within_half_a_step() -> None:
    x = np.linspace(-3, 3, 1001, dtype=np.float32)
    scale, zero_point = 6 / 255, -1
    q = quantize(x, scale, zero_point, np.dtype(np.int8))
    assert q.dtype == np.int8
    assert np.abs(dequantize(q, scale, zero_point) - x).max() <= scale / 2 + 1e-6
    assert quantize(np.array([1e6, -1e6]), scale, zero_point, np.dtype(np.int8)).tolist() == [127, -128]  # clipped


def test_int8_model_takes_floats_and_gives_floats_within_quantization_error(models: Path) -> None:
    inputs, outputs = golden(models, "dense")
    runner = TFLiteRunner(models / "dense.int8.tflite", names=NAMES)
    (x_detail,) = runner.details()["inputs"]
    (y_detail,) = runner.details()["outputs"]
    assert x_detail["dtype"] == y_detail["dtype"] == "int8"
    assert x_detail["quantization"]["scale"] > 0 and x_detail["shape"] == [None, 8]
    got = runner({"x": inputs["x"]})["logits"]
    assert got.dtype == np.float32
    # A few output steps: the input, the hidden layer and the output are each rounded once.
    step = y_detail["quantization"]["scale"]
    error = np.abs(got - outputs["logits"]).max()
    assert error <= 8 * step, (error, step)
    assert (got.argmax(1) == outputs["logits"].argmax(1)).mean() >= 0.9


def test_nchw_images_are_transposed_for_an_nhwc_model(models: Path) -> None:
    inputs, outputs = golden(models, "image")  # the golden inputs are NCHW [N, 2, 3, 4]
    runner = TFLiteRunner(models / "image.fp32.tflite", names={"y": "Identity"}, layout="NHWC")
    np.testing.assert_allclose(runner(inputs)["y"], outputs["y"], atol=1e-5)
    assert runner.details()["inputs"][0] | {"quantization": None} == {
        "name": "pixels",
        "tensor": "pixels",
        "dtype": "float32",
        "shape": [None, 3, 4, 2],
        "quantization": None,
        "layout": "NHWC",
    }
    as_given = TFLiteRunner(models / "image.fp32.tflite", names={"y": "Identity"})  # no layout: refused, not guessed
    with pytest.raises(ValueError, match=r"^input 'pixels' \[32, 2, 3, 4\] .* takes NHWC; give --layout NHWC") as e:
        as_given(inputs)
    assert "\n" not in str(e.value)  # one line, naming the flag
    with pytest.raises(ValueError, match=r"unknown layout 'NWHC'; choose one of \['NCHW', 'NHWC', 'NC', 'NT'\]"):
        TFLiteRunner(models / "image.fp32.tflite", layout="NWHC")


def feeding_beside(models: Path, tmp_path: Path, model: str, entry: dict) -> Path:
    """A copy of `model` with a feeding.json beside it, as `pipe export --target edge` writes one in edge/."""
    shutil.copyfile(models / model, tmp_path / model)
    (tmp_path / "feeding.json").write_text(json.dumps({"models": {model: entry}}))
    return tmp_path / model


def test_feeding_json_beside_the_model_replaces_layout_and_name(models: Path, tmp_path: Path) -> None:
    model = feeding_beside(models, tmp_path, "image.fp32.tflite", {"layout": "NHWC", "names": {"y": "Identity"}})
    inputs, outputs = golden(models, "image")
    runner = TFLiteRunner(model)  # no names, no layout: read from feeding.json
    assert runner.feeding == tmp_path / "feeding.json"
    np.testing.assert_allclose(runner(inputs)["y"], outputs["y"], atol=1e-5)
    code, result = run_cli(sys.executable, RUNNER, str(model), str(models / "image.golden.npz"), "--atol", "1e-5")
    assert code == 0 and result["feeding"] == str(tmp_path / "feeding.json"), result
    (tmp_path / "feeding.json").write_text(json.dumps({"models": {"other.tflite": {}}}))
    with pytest.raises(ValueError, match="feeding.json has no readable entry for image.fp32.tflite"):
        TFLiteRunner(model)


def test_feeding_json_normalizes_the_inputs_and_gives_the_boxes_back_in_pixels(models: Path, tmp_path: Path) -> None:
    """An edge model that takes (x - mean) / std and gives boxes divided by [W, H] answers as model.onnx does."""
    mean, std = np.linspace(-3, 3, 8), np.linspace(0.5, 4, 8)
    entry = {"names": {"y": "Identity"},
             "inputs": [{"name": "x", "normalize": {"mean": mean.tolist(), "std": std.tolist()}}],
             "outputs": [{"name": "y", "boxes_normalized_by": [320, 240]}]}  # fmt: skip
    model = feeding_beside(models, tmp_path, "head.fp32.tflite", entry)
    x = np.random.default_rng(1).normal(5, 10, size=(4, 8)).astype(np.float32)
    plain = (((x - mean) / std) @ np.load(models / "head.npy")).reshape(-1, 6, 2)
    got = TFLiteRunner(model)({"x": x})["y"]
    np.testing.assert_allclose(got, plain * np.array([320, 240, 320, 240, 1, 1]).reshape(1, 6, 1), rtol=1e-4, atol=1e-3)
    given = TFLiteRunner(model, normalize={}, boxes={})({"x": (x - mean) / std})["y"]  # the caller's own: as it is
    np.testing.assert_allclose(given, plain, rtol=1e-4, atol=1e-4)


def test_tolerance_is_relative_to_the_outputs_scale(models: Path, tmp_path: Path) -> None:
    """--atol alone is absolute; with --rtol the output's own scale (its largest |golden| value) widens it."""
    inputs, _ = golden(models, "dense")
    got = TFLiteRunner(models / "dense.fp32.tflite", names=NAMES)(inputs)["logits"].astype(np.float64)
    off = tmp_path / "off.golden.npz"  # every value 0.01 away: a few fp32 steps of an output ~1e5
    np.savez(off, **{"in.x": inputs["x"], "out.logits": got + 0.01})
    args = [str(models / "dense.fp32.tflite"), str(off), "--name", "logits=Identity", "--atol", "1e-3"]
    code, result = run_cli(sys.executable, RUNNER, *args)
    assert code == 1 and result["outputs"]["logits"]["within"] is False, result
    code, result = run_cli(sys.executable, RUNNER, *args, "--rtol", "0.01")
    entry = result["outputs"]["logits"]
    assert code == 0 and entry["within"] and entry["tolerance"] == pytest.approx(1e-3 + 0.01 * entry["scale"]), result
    assert entry["scale"] == pytest.approx(np.abs(got + 0.01).max())


def test_feeding_metadata_stamped_into_a_model_reads_back_and_leaves_its_answers(models: Path, tmp_path: Path) -> None:
    from pipeline.artifact.manifest import Manifest
    from pipeline.edge.feeding import read_metadata, stamp_metadata

    model = tmp_path / "dense.fp32.tflite"
    shutil.copyfile(models / "dense.fp32.tflite", model)
    manifest = Manifest("dense", 1, "classification", inputs=X_SPEC, outputs=LOGITS_SPEC, labels=["a", "b", "c"])
    assert read_metadata(model) is None
    assert stamp_metadata(model, {"layout": "NCHW", "names": NAMES}, manifest)
    size = model.stat().st_size
    assert stamp_metadata(model, {"layout": "NCHW", "names": NAMES}, manifest) and model.stat().st_size == size
    stamped = read_metadata(model)  # a second stamp replaced the first, in place
    assert stamped["feeding"] == {"layout": "NCHW", "names": NAMES} and stamped["labels"] == ["a", "b", "c"]
    inputs, _ = golden(models, "dense")
    before = TFLiteRunner(models / "dense.fp32.tflite", names=NAMES)(inputs)["logits"]
    np.testing.assert_array_equal(TFLiteRunner(model, names=NAMES)(inputs)["logits"], before)


def test_the_stand_alone_file_imports_nothing_of_pipe(models: Path, tmp_path: Path) -> None:
    """A copy of the file, run in isolated mode (-I: no cwd or PYTHONPATH on sys.path), loads no pipe module."""
    copy = Path(shutil.copy(RUNNER, tmp_path / "runner.py"))
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import runner; "
        "r = runner.TFLiteRunner(sys.argv[2]); r({'x': __import__('numpy').zeros((2, 8), 'float32')}); "
        "print(json.dumps(sorted(sys.modules)))"
    )
    proc = subprocess.run(
        [sys.executable, "-I", "-c", code, str(tmp_path), str(models / "dense.fp32.tflite")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    loaded = {name.split(".")[0] for name in json.loads(proc.stdout)}
    assert not loaded & {"pipeline", "torch", "tensorflow", "onnx", "onnxruntime", "onnx2tf", "keras"}, loaded
    assert "ai_edge_litert" in loaded

    code, result = run_cli(
        sys.executable,
        copy,
        str(models / "dense.fp32.tflite"),
        str(models / "dense.golden.npz"),
        "--name",
        "logits=Identity",
        "--atol",
        "1e-5",
    )
    assert code == 0 and result["runtime"] == "ai_edge_litert" and result["samples"] == 32, result
    assert result["outputs"]["logits"]["max_abs"] <= 1e-5 and result["outputs"]["logits"]["non_finite"] == 0


def test_cli_exits_1_when_over_atol_or_an_output_is_missing(models: Path) -> None:
    model, npz = str(models / "dense.perturbed.tflite"), str(models / "dense.golden.npz")
    code, result = run_cli(sys.executable, RUNNER, model, npz, "--name", "logits=Identity", "--atol", "1e-4")
    assert code == 1 and result["max_abs"] > 1e-4
    code, result = run_cli(sys.executable, RUNNER, model, npz)  # the output goes by the model's own name
    assert code == 1 and "has no output 'logits'" in result["outputs"]["logits"]["error"]


def test_fixed_batch_model_runs_golden_one_sample_at_a_time(models: Path) -> None:
    model, npz = str(models / "dense.batch1.tflite"), str(models / "dense.golden.npz")
    code, result = run_cli(sys.executable, RUNNER, model, npz, "--name", "logits=Identity", "--atol", "1e-5")
    assert code == 0 and result["samples"] == 32, result


def gate(models: Path, model: str, policy: Policy | None = None, split: bool = False) -> GateReport:
    """The dense model's .tflite `model` through the verifier against the numpy reference."""
    reference = numpy_dense(models)
    evaluation = None
    if split:  # targets the reference gets right: accuracy 1, so any flip is a drop
        data = {"x": np.random.default_rng(3).normal(size=(300, 8)).astype(np.float32)}
        evaluation = (data, reference(data)["logits"].argmax(1))
    candidate = tflite_candidate(models / model, names=NAMES)
    given = EvaluationSet.of(golden(models, "dense")[0], evaluation)
    return verify(candidate, reference, given, ModelSpec(X_SPEC, LOGITS_SPEC), policy)


def test_tflite_candidate_passes_the_gate_and_a_perturbed_model_fails(models: Path) -> None:
    good = gate(models, "dense.fp32.tflite", Exact(), split=True)
    assert good.passed, good.table()
    assert {"batch 1", "batch 2", "batch 16", "metric accuracy"} <= {r.check for r in good.rows}
    assert good.metric["tflite"] == good.metric["reference"] == 1.0

    bad = gate(models, "dense.perturbed.tflite", Exact(), split=True)
    assert {"batch 1", "batch 2", "batch 16"} <= {r.check for r in bad.failures}, bad.table()
    assert "exceed atol" in bad.failures[0].detail

    int8 = gate(models, "dense.int8.tflite", Top1Agreement(0.9), split=True)
    assert int8.passed, int8.table()


def test_tflite_candidate_reports_a_fixed_batch_as_a_refusal(models: Path) -> None:
    failed = {r.check: r.detail for r in gate(models, "dense.batch1.tflite").failures}
    assert "batch 1" not in failed and failed["batch 2"].startswith("LiteRT refused the input"), failed


def test_tflite_candidate_names_a_file_it_cannot_load(tmp_path: Path) -> None:
    bogus = tmp_path / "model.tflite"
    bogus.write_bytes(b"not a flatbuffer")
    with pytest.raises(ArtifactError, match="cannot load .*model.tflite as a TFLite model"):
        tflite_candidate(bogus)
    with pytest.raises(ArtifactError, match="no TFLite model at"):
        tflite_candidate(tmp_path / "missing.tflite")


@pytest.mark.slow
def test_runner_in_the_tflite_runtime_environment(models: Path, tmp_path: Path) -> None:
    """`make edge-runtime`, then the runner file run by .venv-edge's Python: tflite_runtime 2.14 on numpy 1.x."""
    fed = feeding_beside(models, tmp_path, "image.fp32.tflite", {"layout": "NHWC", "names": {"y": "Identity"}})
    make = subprocess.run(["make", "edge-runtime"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert make.returncode == 0, make.stdout + make.stderr
    for heavy in ("tensorflow", "torch", "ai_edge_litert", "pipeline"):
        probe = subprocess.run([str(EDGE_PYTHON), "-I", "-c", f"import {heavy}"], capture_output=True, text=True)
        assert probe.returncode != 0, f"{heavy} is importable in .venv-edge"

    dense, image = str(models / "dense.golden.npz"), str(models / "image.golden.npz")
    cases = [
        ("dense.fp32.tflite", dense, ["--name", "logits=Identity", "--atol", "1e-5"]),
        ("dense.int8.tflite", dense, ["--name", "logits=Identity", "--atol", "0.5"]),
        ("dense.batch1.tflite", dense, ["--name", "logits=Identity", "--atol", "1e-5"]),
        ("dense.signed.tflite", dense, ["--atol", "1e-5"]),
        ("image.fp32.tflite", image, ["--name", "y=Identity", "--layout", "NHWC", "--atol", "1e-5"]),
        (str(fed), image, ["--atol", "1e-5"]),  # layout and names from the feeding.json beside it
    ]
    for model, npz, args in cases:
        code, result = run_cli(EDGE_PYTHON, RUNNER, str(models / model), npz, *args)
        assert code == 0, (model, result)
        assert result["runtime"] == "tflite_runtime" and result["runtime_version"] == "2.14.0", result
        assert result["numpy"].startswith("1."), result

    # The TF 2.21 converter's dynamic-range models do not run on tflite-runtime 2.14 (docs/edge.md, The
    # device-like check; they do on LiteRT): the edge stage must not ship one for this runtime by default.
    model, npz = str(models / "wide.dynamic.tflite"), str(models / "wide.golden.npz")
    code, result = run_cli(sys.executable, RUNNER, model, npz, "--name", "y=Identity")
    assert code == 0 and result["runtime"] == "ai_edge_litert" and 0 < result["max_abs"] < 1, result
    code, result = run_cli(EDGE_PYTHON, RUNNER, model, npz, "--name", "y=Identity")
    assert code == 1 and result["runtime"] == "tflite_runtime", result
    assert "Didn't find op for builtin opcode 'FULLY_CONNECTED' version" in result["error"], result


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--threads", "0"], "--threads"),
        (["--atol", "nan"], "--atol"),
        (["--atol", "-1"], "--atol"),
        ([], "no-such.npz"),
    ],
)
def test_cli_bad_usage_exits_2_naming_the_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], named: str
) -> None:
    from pipeline.runtime.tflite_runner import main

    model = tmp_path / "m.tflite"
    model.write_bytes(b"not read: usage is checked first")
    with pytest.raises(SystemExit) as exc:
        main([str(model), str(tmp_path / "no-such.npz"), *args])
    assert exc.value.code == 2
    assert named in capsys.readouterr().err
