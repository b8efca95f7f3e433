"""LoRA fine-tuning of a transformers directory (`model: {arch: hf}` + `lora:`) on text data.

A 2-layer BERT (hidden 32) and a WordPiece tokenizer trained on the texts themselves are built from a
config and saved with save_pretrained (tests/text_models.py): nothing is downloaded. The texts hold
one positive or negative word among filler words; the label says which.
"""

from __future__ import annotations

import csv
import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from safetensors import safe_open

from pipeline.artifact.directory import Artifact
from pipeline.artifact.tokens import TokenLimits
from pipeline.core.errors import ArtifactError, InputError, RecipeError
from pipeline.data import load_splits
from pipeline.recipe.file import load_recipe
from pipeline.train.checkpoint import latest_checkpoint
from pipeline.train.restore import load_trained_model
from pipeline.train.stage import check_model_fits, train_recipe, up_to_date_version
from tests.text_models import save_bert

POSITIVE = ["good", "great", "fine", "nice", "happy", "lovely"]
NEGATIVE = ["bad", "awful", "poor", "sad", "ugly", "boring"]
FILLER = ["the", "movie", "was", "a", "day", "it", "film", "plot", "show", "this", "that", "very", "quite", "and"]
LORA = {"rank": 4, "alpha": 8, "target_modules": ["query", "value"]}
TRAIN = {"epochs": 12, "batch_size": 16, "lr": 0.02, "checkpoint_every": 20}


def reviews(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """`n` texts of 3-8 filler words around one sentiment word, half of each label."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        words = [rng.choice(FILLER) for _ in range(rng.randint(3, 8))]
        words.insert(rng.randint(0, len(words)), rng.choice(POSITIVE if i % 2 else NEGATIVE))
        rows.append((" ".join(words), "pos" if i % 2 else "neg"))
    return rows


def write_csv(path: Path, rows: list[tuple[str, str]]) -> Path:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(rows)
    return path


def write_recipe(folder: Path, name: str = "tiny-lora", **sections: object) -> Path:
    body = {
        "name": name,
        "model": {"arch": "hf", "path": "base"},
        "data": {"source": "text", "path": "reviews.csv"},
        "lora": LORA,
        "train": TRAIN,
        **sections,
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with base/ (the BERT and its tokenizer), reviews.csv (400 texts) and tiny-lora.yaml."""
    folder = tmp_path_factory.mktemp("lora")
    rows = reviews(400)
    save_bert(folder / "base", task="classification", lines=[text for text, _ in rows])
    write_csv(folder / "reviews.csv", rows)
    write_recipe(folder)
    return folder


@pytest.fixture(scope="module")
def trained(project: Path) -> Path:
    return train_recipe(project / "tiny-lora.yaml", out_root=project / "artifacts", quiet=True)


def test_lora_learns_the_texts_training_under_5_percent_of_the_parameters(project: Path, trained: Path) -> None:
    artifact = Artifact.load(trained)
    manifest, record = artifact.manifest, artifact.manifest.stages.train
    assert manifest.metrics["accuracy"] >= 0.85  # chance is 0.5 (60 test texts)
    assert record.parameters["trainable"] / record.parameters["total"] < 0.05
    assert json.loads(artifact.path("reports/train.json").read_text())["parameters"] == record.parameters
    # checkpoint/ holds the adapters and the new head alone, a fraction of the base's weights
    with safe_open(artifact.path("checkpoint/model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert keys and all(".lora_A." in k or ".lora_B." in k or ".modules_to_save." in k for k in keys)
    base_bytes = (project / "base" / "model.safetensors").stat().st_size
    assert artifact.path("checkpoint/model.safetensors").stat().st_size < base_bytes / 5
    # the tokenizer and its limits are in the version: pipe serve takes text with them
    limits = TokenLimits.read(manifest.inputs)
    assert limits == TokenLimits({"ids": "input_ids", "mask": "attention_mask"}, 128, 0, 32)
    assert manifest.tokenizer is not None and manifest.tokenizer.file in manifest.files
    assert (trained / "reports" / "tensorboard").is_dir()
    assert up_to_date_version(load_recipe(project / "tiny-lora.yaml"), project / "artifacts") == trained


def test_the_merged_model_exports_through_the_gate(trained: Path) -> None:
    from pipeline.export.stage import export_artifact

    outcome = export_artifact(trained, progress=lambda _: None)
    assert outcome.report.passed
    model = onnx.load(str(trained / "model.onnx"))
    assert [i.name for i in model.graph.input] == ["input_ids", "attention_mask"]
    assert not [t.name for t in model.graph.initializer if "lora" in t.name.lower()]  # merged: a plain graph
    import onnxruntime as ort

    from pipeline.artifact.golden import load_golden

    golden = load_golden(Artifact.load(trained))
    session = ort.InferenceSession(str(trained / "model.onnx"), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, dict(golden.inputs))
    np.testing.assert_allclose(logits, golden.outputs["logits"], atol=1e-4)
    assert (logits.argmax(1) == golden.target).mean() >= 0.85


def test_a_changed_or_missing_base_model_is_refused_when_the_model_is_rebuilt(
    project: Path, trained: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(project, copy)
    artifact = Artifact.load(copy / "artifacts" / "tiny-lora" / trained.name)
    assert load_trained_model(artifact).lora is False  # merged
    config = copy / "base" / "config.json"
    config.write_text(config.read_text().replace('"layer_norm_eps": 1e-12', '"layer_norm_eps": 1e-06'))
    with pytest.raises(ArtifactError, match="changed since"):
        load_trained_model(artifact)
    assert up_to_date_version(load_recipe(copy / "tiny-lora.yaml"), copy / "artifacts") is None  # retrains
    shutil.rmtree(copy / "base")
    with pytest.raises(ArtifactError, match="is not there"):
        load_trained_model(artifact)


def test_bad_lora_settings_are_refused_by_name(project: Path) -> None:
    with pytest.raises(RecipeError, match=r"lora\.rnak: unknown key"):
        load_recipe(write_recipe(project, "typo", lora={"rnak": 4}))
    with pytest.raises(RecipeError, match=r"lora\.rank: Input should be greater than 0"):
        load_recipe(write_recipe(project, "zero", lora={"rank": 0}))
    with pytest.raises(RecipeError, match="lora: applies to model.arch hf"):
        load_recipe(write_recipe(project, "mlp", model={"arch": "mlp"}, data={"source": "iris"}))
    recipe = load_recipe(write_recipe(project, "quer", lora={"target_modules": ["quer"]}))
    with pytest.raises(InputError, match=r"lora.target_modules \['quer'\] do not name modules.*'query'"):
        check_model_fits(recipe, load_splits(recipe))
    beside = load_recipe(write_recipe(project, "beside", lora={"target_modules": ["query", "valeu"]}))
    with pytest.raises(InputError, match=r"lora.target_modules \['valeu'\] do not name modules.*'value'"):
        check_model_fits(beside, load_splits(beside))  # before: trained with adapters on query alone


def test_text_data_from_jsonl_is_tokenized_as_the_model_takes_it(project: Path, tmp_path: Path) -> None:
    folder = tmp_path / "jsonl"
    folder.mkdir()
    (folder / "base").symlink_to(project / "base")
    rows = reviews(40)
    lines = [json.dumps({"review": text, "stars": label}) for text, label in rows]
    (folder / "reviews.jsonl").write_text("\n".join(lines) + "\n")
    data = {"source": "text", "path": "reviews.jsonl", "text_column": "review", "label_column": "stars"}
    recipe = load_recipe(write_recipe(folder, data=data | {"max_length": 6}))
    splits = load_splits(recipe)
    ids, mask = splits.train.inputs["input_ids"], splits.train.inputs["attention_mask"]
    assert ids.shape[1] == 6 and ids.dtype == np.int64 and mask.shape == ids.shape
    assert splits.info.labels == ["neg", "pos"] and splits.info.max_length == 6 and splits.info.padding_id == 0
    assert (ids[mask == 0] == 0).all() and (mask.sum(1) <= 6).all()
    assert (ids[:, -1][mask[:, -1] == 1] == 3).all()  # a cut row still ends with [SEP] (id 3)

    write_csv(folder / "bad.csv", [("", "pos"), *rows])
    bad = load_recipe(write_recipe(folder, "bad", data={"source": "text", "path": "bad.csv"}))
    with pytest.raises(InputError, match=r"bad.csv line 2: column 'text' holds '', not a text"):
        load_splits(bad)
    missing = load_recipe(write_recipe(folder, "missing", data={"source": "text", "path": "reviews.jsonl"}))
    with pytest.raises(InputError, match=r"line 1: no 'text' column .*set data.text_column"):
        load_splits(missing)
    with pytest.raises(RecipeError, match="data.source text needs model.arch hf"):
        load_recipe(write_recipe(folder, "no-hf", model={"arch": "mlp"}, lora=None))


def test_the_version_carries_the_tokenizer_the_texts_were_tokenized_with(project: Path, tmp_path: Path) -> None:
    """A tokenizer.json swapped in the base directory while the run trains: the version still gets the one
    that made the ids, and the base's digest as it was then (before: the swapped one, read at the end)."""
    from pipeline.data.text import base_digest
    from pipeline.train.stage import Plan, effective_recipe, train_in_process
    from tests.text_models import save_tokenizer

    copy = tmp_path / "copy"
    shutil.copytree(project, copy, ignore=shutil.ignore_patterns("artifacts"))
    recipe = effective_recipe(load_recipe(copy / "tiny-lora.yaml"), 1)
    used, digest = (copy / "base" / "tokenizer.json").read_bytes(), base_digest(copy / "base")
    splits = load_splits(recipe)  # the texts tokenized: the run's start
    save_tokenizer(copy / "base", lines=["zebra quokka " * 9, "other words entirely"])  # swapped mid-run
    assert (copy / "base" / "tokenizer.json").read_bytes() != used
    plan = Plan(str(copy / "tiny-lora.yaml"), 1, "cpu", "fp32", quiet=True)
    root = train_in_process(plan, recipe, splits, copy / "artifacts" / "tiny-lora", resume=False)
    artifact = Artifact.load(root)
    assert artifact.path("tokenizer/tokenizer.json").read_bytes() == used
    assert artifact.manifest.stages.train.inputs["base_model"] == digest != base_digest(copy / "base")


def pipe_train(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    bin_dir = str(Path(sys.executable).parent)
    full_env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CI": "true", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "train", *args], capture_output=True, text=True, env=full_env, timeout=600
    )


@pytest.mark.slow
def test_lora_sigkill_then_resume_equals_uninterrupted(project: Path, tmp_path: Path) -> None:
    short = {**TRAIN, "epochs": 2, "checkpoint_every": 5, "precision": "bf16"}  # AMP on CPU crosses the kill too
    path = write_recipe(project, "resume", train=short)
    clean = pipe_train(str(path), "--out", str(tmp_path / "clean"))
    assert clean.returncode == 0, clean.stderr
    killed = pipe_train(str(path), "--out", str(tmp_path / "killed"), env={"PIPE_TRAIN_FAULT_STEP": "12"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    root = tmp_path / "killed" / "resume" / "1"
    assert latest_checkpoint(root).name == "step-000010.safetensors"
    resumed = pipe_train(str(path), "--out", str(tmp_path / "killed"), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    a, b = (tmp_path / "clean" / "resume" / "1" / "checkpoint"), root / "checkpoint"
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert Artifact.load(root).manifest.stages.train.precision == "bf16"


@pytest.mark.slow
def test_lora_trains_under_torchrun_with_two_processes(project: Path, tmp_path: Path) -> None:
    path = write_recipe(project, "ddp", train={**TRAIN, "epochs": 2})
    run = pipe_train(str(path), "--out", str(tmp_path), "--nproc", "2")
    assert run.returncode == 0, run.stderr
    record = Artifact.load(tmp_path / "ddp" / "1").manifest.stages.train
    assert (record.world_size, record.strategy) == (2, "ddp")
    assert record.parameters["trainable"] / record.parameters["total"] < 0.05
