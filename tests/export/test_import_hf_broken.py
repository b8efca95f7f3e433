"""Broken transformers directories: refused by name (exit 2) in `pipe import DIR` and in LoRA training.

Before, each was exit 3 (an internal error) or, for weights that do not fit the architecture, a random
model with exit 0 and no word of it. The directories are a 2-layer BERT saved here
(tests/text_models.py) and copies of it broken one way each.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.artifact.directory import Artifact
from pipeline.cli import main
from pipeline.core.errors import InputError
from pipeline.data import DataInfo
from pipeline.recipe.architectures import LoraSpec
from tests.text_models import save_bert


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("hf")
    return {"classifier": save_bert(tmp / "classifier", "classification"), "encoder": save_bert(tmp / "encoder")}


def _config(**changes: object) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **changes}))

    return change


def _pickle_only(folder: Path) -> None:
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b'\x80\x04cos\nsystem\n(S"echo owned"\ntR.')  # a pickle, not tensors


def _truncated(folder: Path) -> None:
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])


BROKEN = {
    "config-misfit": (_config(hidden_size=64, intermediate_size=128), "config.json does not fit its weights"),
    "pickle-only": (_pickle_only, "a pickle holding more than tensors"),
    "truncated": (_truncated, "model.safetensors is truncated or corrupt"),
    "gpt2-over-bert": (_config(model_type="gpt2", architectures=["GPT2Model"]), "none of the"),
}


def broken(dirs: dict[str, Path], tmp_path: Path, how: str) -> Path:
    folder = tmp_path / how
    shutil.copytree(dirs["classifier"], folder)
    BROKEN[how][0](folder)
    return folder


@pytest.mark.parametrize("how", sorted(BROKEN))
def test_a_broken_directory_is_refused_by_import_and_by_lora_training(
    dirs: dict[str, Path], tmp_path: Path, how: str
) -> None:
    from pipeline.train.hf import build_text_classifier

    folder, expected = broken(dirs, tmp_path, how), BROKEN[how][1]
    for task in ("classification", "embedding"):
        result = CliRunner().invoke(
            main, ["import", str(folder), "--name", "m", "--task", task, "--repository", str(tmp_path / "a")]
        )
        assert result.exit_code == 2, result.output
        assert expected in result.output and str(folder) in result.output
        assert not (tmp_path / "a").exists()
    info = DataInfo("text", [8], 2, ["neg", "pos"])
    with pytest.raises(InputError, match=expected):
        build_text_classifier(folder, info, LoraSpec(rank=2, alpha=4, target_modules=["query"]))


def test_a_base_model_imported_as_a_classifier_says_its_head_is_random(dirs: dict[str, Path], tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["import", str(dirs["encoder"]), "--name", "clf", "--task", "classification",
                                       "--repository", str(tmp_path / "a")])  # fmt: skip
    assert result.exit_code == 0, result.output
    said = "2 of 41 weights are not in the checkpoint and start random (classifier.bias, classifier.weight)"
    assert said in result.output and "holds no classification head" in result.output
    record = Artifact.load(tmp_path / "a" / "clf" / "1").manifest.stages.import_
    assert record is not None and any(said in note for note in record.notes)
