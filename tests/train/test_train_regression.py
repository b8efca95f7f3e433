"""`pipe train` on a regression recipe: targets standardized for the loss, predictions in target units."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
import yaml
from click.testing import CliRunner

from pipeline.artifact.directions import metric_drop
from pipeline.artifact.directory import Artifact
from pipeline.artifact.golden import load_golden
from pipeline.cli import main
from pipeline.recipe.file import load_recipe
from pipeline.train.objective import Objective
from pipeline.train.restore import load_trained_model
from pipeline.verify.metrics import regression_metrics

MODELS = Path(__file__).resolve().parents[2] / "models"


def pipe(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def diabetes(tmp_path_factory: pytest.TempPathFactory) -> Artifact:
    """models/diabetes-mlp.yaml trained and exported through the gate (about 8 s)."""
    out = tmp_path_factory.mktemp("artifacts")
    code, output = pipe("train", str(MODELS / "diabetes-mlp.yaml"), "--out", str(out), "--quiet")
    assert code == 0, output
    root = out / "diabetes-mlp" / "1"
    code, output = pipe("export", str(root))
    assert code == 0, output
    return Artifact.load(root)


def test_the_diabetes_recipe_trains_a_regressor_that_beats_the_mean(diabetes: Artifact) -> None:
    m = diabetes.manifest
    assert m.task == "regression" and m.labels == []
    assert [(o.name, o.shape) for o in m.outputs] == [("predictions", ["batch", 1])]
    assert set(m.metrics) == {"loss", "mae", "rmse", "r2"}
    # a linear model reaches R^2 0.54 on this split; predicting the mean is 0 and its MAE about 64
    assert m.metrics["r2"] > 0.45 and m.metrics["mae"] < 50, m.metrics
    assert m.stages.train.kept.startswith(f"kept epoch {m.stages.train.best_epoch}: lowest val_loss ")


def test_predictions_are_in_target_units_and_onnx_matches_golden(diabetes: Artifact) -> None:
    golden = load_golden(diabetes)
    session = ort.InferenceSession(str(diabetes.path("model.onnx")), providers=["CPUExecutionProvider"])
    (onnx_out,) = session.run(None, {"input": golden.inputs["input"]})
    np.testing.assert_allclose(onnx_out, golden.outputs["predictions"], rtol=1e-5, atol=1e-3)
    # the recorded metrics are these outputs scored against the raw targets (golden holds the whole test split)
    figures = regression_metrics(onnx_out, golden.target)
    for name in ("mae", "rmse", "r2"):
        assert figures[name] == pytest.approx(diabetes.manifest.metrics[name], rel=1e-4), name
    assert 25 < golden.target.min() and golden.target.max() < 350  # diabetes progression units, not z-scores
    assert abs(float(onnx_out.mean()) - float(golden.target.mean())) < 20
    export = diabetes.manifest.stages.export
    assert export.metric["name"] == "mae" and export.parity["passed"]


def test_restored_model_ends_in_the_target_scale_the_train_split_had(diabetes: Artifact) -> None:
    data = diabetes.manifest.stages.train.data
    model = load_trained_model(diabetes)
    assert float(model.net.mean) == pytest.approx(data["target_mean"])
    assert float(model.net.std) == pytest.approx(data["target_std"]) and data["target_std"] > 10


def test_the_loss_is_measured_on_standardized_targets() -> None:
    target = torch.tensor([100.0, 200.0, 300.0])
    off_by_one_std = target + 50.0
    for loss, expected in (("mse", 1.0), ("huber", 0.5)):  # huber: delta 1 std, so 0.5 * 1^2
        assert Objective(loss, 200.0, 50.0)(off_by_one_std.reshape(-1, 1), target).item() == pytest.approx(expected)
    far = target + 150.0  # 3 std: huber grows linearly past delta, mse quadratically
    assert Objective("huber", 200.0, 50.0)(far.reshape(-1, 1), target).item() == pytest.approx(2.5)
    assert Objective("mse", 200.0, 50.0)(far.reshape(-1, 1), target).item() == pytest.approx(9.0)


def test_huber_trains_a_csv_regressor_with_val_r2_as_monitor(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 3))
    y = 1000.0 + 250.0 * x[:, 0] - 100.0 * x[:, 1] + rng.normal(scale=10.0, size=300)
    rows = "".join(f"{a:.5f},{b:.5f},{c:.5f},{t:.3f}\n" for (a, b, c), t in zip(x, y, strict=True))
    (tmp_path / "d.csv").write_text("a,b,c,price\n" + rows)
    recipe = {"name": "prices", "task": "regression", "model": {"arch": "mlp", "hidden": [16]},
              "data": {"source": "csv", "path": "d.csv", "label_column": "price"},
              "train": {"epochs": 40, "batch_size": 32, "lr": 0.01, "loss": "huber", "monitor": "val_r2"}}  # fmt: skip
    (tmp_path / "prices.yaml").write_text(yaml.safe_dump(recipe))
    code, output = pipe("train", str(tmp_path / "prices.yaml"), "--out", str(tmp_path / "a"), "--quiet")
    assert code == 0, output
    artifact = Artifact.load(tmp_path / "a" / "prices" / "1")
    assert artifact.manifest.metrics["r2"] > 0.95, artifact.manifest.metrics
    summary = json.loads(artifact.path("reports/train.json").read_text())
    best = summary["history"][summary["best_epoch"] - 1]
    assert summary["monitor"] == "val_r2" and summary["best_val_r2"] == best["r2"]
    assert best["r2"] == max(r["r2"] for r in summary["history"])
    assert "highest val_r2" in summary["kept"]


def test_a_text_target_is_refused_for_regression_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("a,y\n" + "".join(f"{i},{'big' if i % 2 else 3.5}\n" for i in range(40)))
    recipe = {"name": "t", "task": "regression", "model": {"arch": "mlp"},
              "data": {"source": "csv", "path": "d.csv", "label_column": "y"}}  # fmt: skip
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(recipe))
    code, output = pipe("train", str(tmp_path / "t.yaml"), "--out", str(tmp_path / "a"), "--quiet")
    assert code == 2 and len(output.strip().splitlines()) == 1, output
    assert "holds 'big', not a number; a regression target must be numeric" in output
    assert not (tmp_path / "a").exists()


def test_check_knows_which_way_each_regression_metric_goes() -> None:
    assert metric_drop("mae", 40.0, 41.0) == 1.0 and metric_drop("rmse", 50.0, 49.0) == -1.0
    assert metric_drop("r2", 0.5, 0.4) == pytest.approx(0.1)
    assert load_recipe(MODELS / "diabetes-mlp.yaml").budgets.for_metric("r2").max_drop == 0.01
