"""`pipe train --backend ort`: ONNX Runtime training in its own runtime, into the same artifact contract.

Real parts throughout: the worker runs in `.venv-ort` (built by `make ort-runtime`, which `make
test` runs first), the export gate checks the trained model with onnxruntime, the kill is a real
SIGKILL of `pipe train` (the documented fault hook, PIPE_TRAIN_FAULT_STEP), and the foreign model
is an ONNX graph written with onnx.helper from weights fitted by scikit-learn.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from pipeline.artifact.directory import Artifact
from pipeline.core.errors import InputError
from pipeline.recipe.schema import parse_recipe
from pipeline.runtime.backends import backend_for
from pipeline.runtime.runners import ort_runner
from pipeline.train.ort_train import refusals

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / ".venv-ort"
pytestmark = pytest.mark.slow

MLP = {"arch": "mlp", "hidden": [32], "dropout": 0.0}
TRAIN = {"backend": "ort", "epochs": 3, "batch_size": 64, "lr": 0.005, "checkpoint_every": 7}


@pytest.fixture(autouse=True, scope="module")
def _runtime() -> None:
    if not (RUNTIME / "onnxruntime" / "training").is_dir():
        pytest.fail(f"{RUNTIME} is not built: run `make ort-runtime` (make test builds it first)")


def write_recipe(tmp_path: Path, name: str = "ortmlp", **train: object) -> Path:
    path = tmp_path / f"{name}.yaml"
    raw = {"name": name, "model": MLP, "data": {"source": "digits"}, "train": {**TRAIN, **train}}
    path.write_text(yaml.safe_dump(raw))
    return path


def pipe(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        timeout=600,
        check=False,
    )


def initializers(path: Path) -> dict[str, bytes]:
    return {i.name: numpy_helper.to_array(i).tobytes() for i in onnx.load(path).graph.initializer}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One uninterrupted ORT run of a small digits MLP (the reference for the resume test too)."""
    tmp = tmp_path_factory.mktemp("ort")
    proc = pipe("train", str(write_recipe(tmp)), "--out", str(tmp / "a"), "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return tmp / "a" / "ortmlp" / "1"


def test_an_ort_run_writes_the_artifact_contract_and_passes_the_export_gate(trained: Path) -> None:
    from pipeline.export.stage import export_artifact

    artifact = Artifact.load(trained)
    m = artifact.manifest
    assert m.lineage.backend == "ort" and m.stages.train.backend == "ort"
    assert m.stages.train.framework == "onnxruntime-training 1.19.2"
    assert m.metrics["accuracy"] > 0.85  # 3 epochs of a 32-wide MLP on digits
    assert m.stages.train.checkpoint.weights == "checkpoint/model.onnx"
    records = [json.loads(line) for line in (trained / "reports/metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records if r["kind"] == "val"] == [1, 2, 3]
    assert [r["step"] for r in records if r["kind"] == "train"] == list(range(1, m.stages.train.steps + 1))
    assert any((trained / "reports/tensorboard").iterdir())
    assert onnx.load(trained / "checkpoint/model.onnx").ir_version <= 10

    backend = backend_for(artifact)
    assert backend.name == "ort"
    outcome = export_artifact(trained, progress=lambda _: None)
    assert outcome.report.passed and outcome.result.exporter == "ort"
    exported = Artifact.load(trained)
    assert exported.manifest.variants["fp32"].passed
    # model.onnx in this environment's onnxruntime answers what the training runtime's eval model answered
    golden = np.load(trained / "golden.npz")
    logits = ort_runner(trained / "model.onnx")({"input": golden["in.input"]})["logits"]
    np.testing.assert_allclose(logits, golden["out.logits"], atol=1e-5)


def test_the_main_environment_keeps_its_own_onnxruntime(trained: Path) -> None:
    """The worker trained with onnxruntime-training 1.19.2; this process still has the lock's onnxruntime."""
    import onnxruntime

    pins = dict(line.split("==", 1) for line in (ROOT / "requirements.lock").read_text().split() if "==" in line)
    assert onnxruntime.__version__ == pins["onnxruntime"] != "1.19.2"
    assert ".venv-ort" not in onnxruntime.__file__
    assert Artifact.load(trained).manifest.stages.train.framework == "onnxruntime-training 1.19.2"


def test_kill_9_then_resume_ends_bit_identical_to_the_uninterrupted_run(trained: Path, tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path)  # the same recipe text: the same digest
    out = tmp_path / "b"
    killed = pipe("train", str(recipe), "--out", str(out), "--quiet", env={"PIPE_TRAIN_FAULT_STEP": "30"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    root = out / "ortmlp" / "1"
    assert not (root / "manifest.json").exists()
    assert [p.name for p in (root / "checkpoint").glob("ort-step-*")] == ["ort-step-000028"]  # every 7 steps
    resumed = pipe("train", str(recipe), "--out", str(out), "--quiet", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert (root / "checkpoint/model.onnx").read_bytes() == (trained / "checkpoint/model.onnx").read_bytes()
    before = (trained / "reports/metrics.jsonl").read_text().splitlines()
    after = (root / "reports/metrics.jsonl").read_text().splitlines()
    strip = [{k: v for k, v in json.loads(line).items() if k != "samples_per_s"} for line in before]
    assert [{k: v for k, v in json.loads(line).items() if k != "samples_per_s"} for line in after] == strip


@functools.cache
def _fitted_mlp() -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """scikit-learn's MLP on the digits, its weights by name, and the digits: fitted once per run (5 s on a
    loaded 2-core machine; this module and tests/train/test_train_from.py both use it)."""
    from sklearn.datasets import load_digits
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    digits = load_digits()
    x, y = digits.data.astype(np.float32), digits.target
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf = MLPClassifier(hidden_layer_sizes=(32,), max_iter=200, random_state=0).fit(x, y)
    arrays = {
        "hidden/W": clf.coefs_[0],
        "hidden/b": clf.intercepts_[0],
        "head/W": clf.coefs_[1],
        "head/b": clf.intercepts_[1],
    }
    return arrays, x, y


def foreign_classifier(tmp_path: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    """A digits classifier born in scikit-learn, written as ONNX with onnx.helper (MatMul/Add/Relu)."""
    arrays, x, y = _fitted_mlp()
    x, y = x.copy(), y.copy()
    nodes = [
        helper.make_node("MatMul", ["x", "hidden/W"], ["h0"]),
        helper.make_node("Add", ["h0", "hidden/b"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "head/W"], ["l0"]),
        helper.make_node("Add", ["l0", "head/b"], ["scores"]),
    ]
    graph = helper.make_graph(
        nodes,
        "sklearn-mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(a.astype(np.float32), n) for n, a in arrays.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "clf.onnx"
    onnx.save(model, path)
    return path, x, y


def test_fine_tuning_an_imported_classifier_trains_only_its_last_layer(tmp_path: Path) -> None:
    onnx_file, x, y = foreign_classifier(tmp_path)
    np.savez(tmp_path / "eval.npz", x=x[:200], target=y[:200])
    repo = tmp_path / "artifacts"
    imported = pipe("import", str(onnx_file), "--name", "skclf", "--eval-data", str(tmp_path / "eval.npz"),
                    "--repository", str(repo))  # fmt: skip
    assert imported.returncode == 0, imported.stderr[-2000:]
    parent = repo / "skclf" / "1"

    listed = pipe("info", str(parent), "--trainable")
    assert listed.returncode == 0 and all(n in listed.stdout for n in ("hidden/W", "head/W", "head/b"))
    swapped = y.copy()  # data it does poorly on: 3s and 8s swapped
    swapped[y == 3], swapped[y == 8] = 8, 3
    np.savez(tmp_path / "swapped.npz", X=x, y=swapped)
    nothing = pipe("train", "--from", str(parent), "--trainable", "fc*", "--data", str(tmp_path / "swapped.npz"),
                   "--out", str(repo))  # fmt: skip
    assert nothing.returncode == 2 and "matches no parameter" in nothing.stderr and "head/W" in nothing.stderr
    assert not (repo / "skclf" / "2").exists()

    recipe = tmp_path / "tune.yaml"  # --from with a recipe: its data and train sections (its model is the parent)
    recipe.write_text(yaml.safe_dump({"name": "skclf", "model": {"arch": "mlp"},
                                      "data": {"source": "npz", "path": "swapped.npz"},
                                      "train": {"epochs": 8, "lr": 0.01}}))  # fmt: skip
    tuned = pipe("train", str(recipe), "--from", str(parent), "--trainable", "head/*", "--out", str(repo), "--quiet")
    assert tuned.returncode == 0, tuned.stderr[-2000:]
    child = Artifact.load(repo / "skclf" / "2")
    assert child.manifest.lineage.parent_digest == Artifact.load(parent).manifest.identity_digest()
    assert child.manifest.stages.train.settings["train"]["trainable"] == ["head/*"]
    before, after = initializers(parent / "model.onnx"), initializers(child.path("checkpoint/model.onnx"))
    assert before.keys() == after.keys()
    assert before["hidden/W"] == after["hidden/W"] and before["hidden/b"] == after["hidden/b"]  # bit-identical
    assert before["head/W"] != after["head/W"]
    golden = np.load(child.path("golden.npz"))
    parent_accuracy = float(
        (ort_runner(parent / "model.onnx")({"x": golden["in.x"]})["scores"].argmax(1) == golden["target"]).mean()
    )
    assert child.manifest.metrics["accuracy"] > parent_accuracy + 0.05, (parent_accuracy, child.manifest.metrics)


def test_a_regression_model_trains_on_standardized_targets_and_passes_the_gate(tmp_path: Path) -> None:
    from pipeline.export.stage import export_artifact

    path = tmp_path / "reg.yaml"
    path.write_text(yaml.safe_dump({"name": "reg", "task": "regression", "model": {**MLP, "hidden": [16]},
                                    "data": {"source": "diabetes"},
                                    "train": {**TRAIN, "epochs": 25, "lr": 0.01, "batch_size": 32,
                                              "monitor": "val_mae"}}))  # fmt: skip
    proc = pipe("train", str(path), "--out", str(tmp_path / "a"), "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    root = tmp_path / "a" / "reg" / "1"
    m = Artifact.load(root).manifest
    assert m.outputs[0].name == "predictions" and m.outputs[0].shape == ["batch", 1]
    assert set(m.metrics) == {"loss", "mae", "rmse", "r2"} and m.metrics["r2"] > 0.2, m.metrics
    assert "lowest val_mae" in m.stages.train.kept
    outcome = export_artifact(root, progress=lambda _: None)
    assert outcome.report.passed and outcome.report.metric["name"] == "mae"


def test_keys_the_ort_backend_cannot_honour_are_refused_by_name(tmp_path: Path) -> None:
    recipe = parse_recipe({
        "name": "r", "model": {"arch": "mlp", "dropout": 0.2}, "data": {"source": "digits"},
        "train": {"backend": "ort", "precision": "bf16", "grad_checkpointing": True, "grad_accum": 2,
                  "optimizer": "sgd", "momentum": 0.9},
    })  # fmt: skip
    huber = parse_recipe({"name": "h", "task": "regression", "model": MLP, "data": {"source": "diabetes"},
                          "train": {"backend": "ort", "loss": "huber"}})  # fmt: skip
    assert refusals(huber, nproc=1, device="cpu") == [
        "train.loss 'huber': the ORT backend trains regression with mse; use loss mse (or auto)"
    ]
    found = " | ".join(refusals(recipe, nproc=2, device="cuda"))
    for key in ("--nproc 2", "train.device 'cuda'", "train.precision 'bf16'", "train.grad_checkpointing",
                "train.grad_accum 2", "train.momentum 0.9", "model.dropout 0.2"):  # fmt: skip
        assert key in found
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"name": "r", "model": MLP, "data": {"source": "digits"},
                                    "train": {**TRAIN, "grad_accum": 2}}))  # fmt: skip
    proc = pipe("train", str(path), "--out", str(tmp_path / "a"))
    assert proc.returncode == 2 and "train.grad_accum 2" in proc.stderr and not (tmp_path / "a").exists()


def test_a_diverging_loss_stops_with_the_step_and_the_fix(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, lr=1e12, grad_clip=None)
    proc = pipe("train", str(recipe), "--out", str(tmp_path / "a"), "--quiet")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "loss became nan" in proc.stderr and "Lower train.lr" in proc.stderr and "--resume" in proc.stderr
    assert not (tmp_path / "a" / "ortmlp" / "1" / "manifest.json").exists()


def test_recipe_keys_of_the_ort_backend_need_it(tmp_path: Path) -> None:
    base = {"name": "r", "data": {"source": "digits"}}
    with pytest.raises(InputError, match="only train.backend 'ort' can do"):
        parse_recipe({**base, "model": {"arch": "onnx", "artifact": "artifacts/x"}})
    with pytest.raises(InputError, match="train.trainable chooses ONNX parameters"):
        parse_recipe({**base, "model": MLP, "train": {"trainable": ["fc*"]}})


def test_a_recipe_continuing_a_missing_artifact_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "tune.yaml"  # model.arch onnx: the artifact path is relative to the recipe
    path.write_text(yaml.safe_dump({"name": "tune", "model": {"arch": "onnx", "artifact": "gone/clf"},
                                    "data": {"source": "digits"}, "train": {"backend": "ort"}}))  # fmt: skip
    proc = pipe("train", str(path), "--out", str(tmp_path / "a"))
    assert proc.returncode == 2 and str(tmp_path / "gone" / "clf") in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "a" / "tune").exists()


def test_a_missing_runtime_is_one_line_naming_the_make_target(tmp_path: Path) -> None:
    proc = pipe("train", str(write_recipe(tmp_path)), "--out", str(tmp_path / "a"),
                env={"PIPE_ORT_RUNTIME": str(tmp_path / "nowhere")})  # fmt: skip
    assert proc.returncode == 2 and "make ort-runtime" in proc.stderr and not (tmp_path / "a").exists()
    assert len(proc.stderr.strip().splitlines()) == 1
