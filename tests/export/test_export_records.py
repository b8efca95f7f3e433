"""A train record edited by hand: `pipe export` refuses it in one line naming the field, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from pipeline.cli import main
from pipeline.recipe.schema import parse_recipe, stage_settings
from tests.conftest import build_artifact, train_record

RECIPE = {"name": "toy", "model": {"arch": "mlp", "hidden": [8]}, "data": {"source": "digits"}}
DATA = {"kind": "features", "sample_shape": [4], "num_classes": 3}


def trained_toy(root: Path, data: dict[str, object]) -> Path:
    """The toy artifact with a train record whose data-shape record is `data` and weights of another model."""
    artifact = build_artifact(root)
    artifact.manifest.lineage.backend = "torch"
    (root / "checkpoint").mkdir()
    save_file({"other.weight": torch.zeros(2, 2)}, root / "checkpoint" / "model.safetensors")
    artifact.add_file("checkpoint/model.safetensors")
    artifact.manifest.stages.train = train_record(stage_settings(parse_recipe(RECIPE), "train"), data)
    artifact.save()
    return root


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({}, "stages.train.data: missing key(s) ['kind', 'num_classes', 'sample_shape']"),
        ({**DATA, "sample_shape": "4"}, "stages.train.data.sample_shape: expected a list, got '4'"),
        ({**DATA, "num_classes": -1}, "stages.train.data does not build a model (Trying to create tensor"),
        (DATA, "checkpoint/model.safetensors does not fit the recorded model (Error(s) in loading state_dict"),
    ],
)
def test_a_train_record_that_does_not_rebuild_the_model_is_one_line(
    tmp_path: Path, data: dict[str, object], needle: str
) -> None:
    root = trained_toy(tmp_path / "artifacts" / "toy" / "1", data)
    result = CliRunner().invoke(main, ["export", str(root)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], result.output
