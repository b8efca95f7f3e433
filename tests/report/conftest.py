"""Artifacts the report tests read: one trained and exported here (built once), one imported."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest
import yaml
from click.testing import CliRunner, Result

from pipeline.cli import main
from tests.conftest import LINEAR

# Stops early on purpose: patience 1 over 6 epochs of a tiny MLP, so the curves show a kept epoch and a stop.
TINY = {
    "name": "rep-tiny",
    "description": "a tiny MLP | for the report tests",  # a pipe the card must escape
    "model": {"arch": "mlp", "hidden": [16]},
    "data": {"source": "digits"},
    "train": {"epochs": 6, "batch_size": 64, "lr": 0.05, "early_stopping": 1},
    "budgets": {"max_accuracy_drop": 0.02, "max_size_increase": 0.3},
}


def invoke(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="session")
def trained_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the recipe and artifacts/rep-tiny/1, trained and exported once for the session."""
    base = tmp_path_factory.mktemp("trained")
    (base / "rep-tiny.yaml").write_text(yaml.safe_dump(TINY))
    trained = invoke("train", base / "rep-tiny.yaml", "--out", base / "artifacts", "--quiet")
    assert trained.exit_code == 0, trained.output
    exported = invoke("export", base / "artifacts" / "rep-tiny" / "1")
    assert exported.exit_code == 0, exported.output
    return base


@pytest.fixture
def trained(trained_repository: Path, tmp_path: Path) -> Path:
    """A copy of the trained artifact (with its recipe beside it, where the train record points) to change."""
    shutil.copytree(trained_repository, tmp_path / "repo")
    return tmp_path / "repo" / "artifacts" / "rep-tiny" / "1"


@pytest.fixture
def imported(tmp_path: Path) -> Path:
    """`pipe import` of a linear layer written in ONNX text, with labelled evaluation data."""
    onnx.save(onnx.parser.parse_model(LINEAR), tmp_path / "linear.onnx")
    x = np.random.default_rng(0).standard_normal((60, 4)).astype(np.float32)
    w = np.array([[1.0, -1.0, 0.5], [0.5, 2.0, -1.0], [-1.5, 0.0, 1.0], [0.0, 1.0, 2.0]], dtype=np.float32)
    np.savez(tmp_path / "eval.npz", x=x, target=(x @ w).argmax(1))
    result = invoke("import", tmp_path / "linear.onnx", "--name", "linear", "--eval-data", tmp_path / "eval.npz",
                    "--labels", "a,b,c", "--repository", tmp_path / "artifacts")  # fmt: skip
    assert result.exit_code == 0, result.output
    return tmp_path / "artifacts" / "linear" / "1"
