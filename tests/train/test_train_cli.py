"""`pipe train` end to end, in process: the artifact it writes, restoring from it, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner

from pipeline.artifact.directory import Artifact, versions
from pipeline.artifact.golden import load_golden
from pipeline.cli import main
from pipeline.train.checkpoint import checkpoint_step, latest_checkpoint
from pipeline.train.restore import example_inputs, load_trained_model

MODELS = Path(__file__).resolve().parents[2] / "models"


def write_recipe(tmp_path: Path, **sections: dict) -> Path:
    raw = {"name": "tiny", "model": {"arch": "mlp", "hidden": [32]}, "data": {"source": "digits"},
           "train": {"epochs": 2, "batch_size": 64, "lr": 0.01}}  # fmt: skip
    for key, value in sections.items():
        raw[key] = value
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def pipe_train(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["train", *args, "--quiet"])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def test_train_writes_a_complete_artifact_that_restores(tmp_path: Path) -> None:
    out = tmp_path / "artifacts"
    code, output = pipe_train(str(write_recipe(tmp_path)), "--out", str(out))
    assert code == 0, output
    root = out / "tiny" / "1"
    assert f"trained {root}" in output
    artifact = Artifact.load(root)  # verifies every recorded file
    m = artifact.manifest
    assert m.task == "classification" and m.labels == [str(i) for i in range(10)]
    assert [(i.name, i.dtype, i.shape, i.layout) for i in m.inputs] == [("input", "float32", ["batch", 64], "NC")]
    assert m.inputs[0].preprocessing["applied_in_model"] is True
    assert [(o.name, o.shape) for o in m.outputs] == [("logits", ["batch", 10])]
    assert 0.5 < m.metrics["accuracy"] <= 1.0 and m.metrics["loss"] > 0
    assert m.lineage.backend == "torch" and len(m.lineage.dataset_fingerprint) == 64 and m.lineage.seed == 0
    train = m.stages.train
    assert train.settings["model"]["hidden"] == [32] and train.data["kind"] == "features"
    assert set(train.settings) == {"name", "task", "model", "data", "train"}  # not export: editing it never retrains
    assert (train.golden.samples, train.golden.whole_split, train.golden.split_size) == (270, True, 270)
    for rel in ("checkpoint/model.safetensors", "golden.npz", "reports/metrics.jsonl", "reports/train.json"):
        assert rel in m.files
    assert any(f.startswith("reports/tensorboard/events.out.tfevents") for f in m.files)
    records = [json.loads(line) for line in (root / "reports/metrics.jsonl").read_text().splitlines()]
    assert {r["kind"] for r in records} == {"train", "val"} and records[-1]["step"] == train.steps

    # The artifact alone rebuilds the model: its outputs on golden inputs match the recorded ones.
    model = load_trained_model(artifact)
    assert not model.training
    golden = load_golden(artifact)
    with torch.no_grad():
        logits = model(torch.from_numpy(golden.inputs["input"])).numpy()
    np.testing.assert_allclose(logits, golden.outputs["logits"], rtol=1e-5, atol=1e-5)
    accuracy = float((logits.argmax(1) == golden.target).mean())
    assert accuracy == pytest.approx(m.metrics["accuracy"])  # golden holds the whole test split
    (x,) = example_inputs(artifact, 300)  # more than golden holds: samples repeat
    assert x.shape == (300, 64) and x.dtype == torch.float32

    code, _ = pipe_train(str(write_recipe(tmp_path)), "--out", str(out), "--epochs", "1")
    assert code == 0 and versions(out / "tiny") == [1, 2]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tokens-transformer", "tokens-moe"])
def test_token_recipes_train_well_above_chance(tmp_path: Path, name: str) -> None:
    code, output = pipe_train(str(MODELS / f"{name}.yaml"), "--out", str(tmp_path))
    assert code == 0, output
    artifact = Artifact.load(tmp_path / name / "1")
    assert artifact.manifest.metrics["accuracy"] > 0.8  # chance is 0.25
    assert artifact.manifest.inputs[0].shape == ["batch", "sequence"] and artifact.manifest.inputs[0].dtype == "int64"
    (tokens,) = example_inputs(artifact, 4)
    assert load_trained_model(artifact)(tokens[:, :20]).shape == (4, 4)  # shorter sequences work too


@pytest.mark.slow
def test_digits_cnn_recipe_reaches_98_percent(tmp_path: Path) -> None:
    code, output = pipe_train(str(MODELS / "digits-cnn.yaml"), "--out", str(tmp_path))
    assert code == 0, output
    manifest = Artifact.load(tmp_path / "digits-cnn" / "1").manifest
    assert manifest.metrics["accuracy"] >= 0.98
    assert manifest.inputs[0].shape == ["batch", 1, 8, 8] and manifest.inputs[0].layout == "NCHW"


@pytest.mark.parametrize(("sections", "expected"), [
    ({"model": {"arch": "resnet"}}, "Input tag 'resnet' found using 'arch' does not match any of the expected tags"),
    ({"data": {"source": "npz", "path": "nope.npz"}}, "data file {tmp}/nope.npz does not exist"),
    ({"data": {"source": "csv", "path": "d.csv", "label_column": "target"}},
     "label column 'target' is not in {tmp}/d.csv; its columns are ['a', 'b', 'label']. Set data.label_column"),
    ({"model": {"arch": "cnn"}}, "model arch 'cnn' does not fit the data: samples are features shaped [64]; "
     "a CNN needs images [C, H, W] (digits: set data.as_image: true)"),
    ({"model": {"arch": "custom", "factory": "torch.nn:Identity"}},
     "model arch 'custom' returned [2, 64] for 2 samples; a classifier must return logits [batch, 10]"),
    ({"train": {"device": "cuda"}}, "device 'cuda' requested but this torch"),
    ({"model": {"arch": "mlp", "hidden": [10**20]}},  # torch's TypeError (overflow) was exit 3
     "model arch 'mlp' cannot be built for the data (empty(): argument 'size'"),
])  # fmt: skip
def test_bad_input_is_one_clear_line_exit_2_nothing_written(tmp_path: Path, sections: dict, expected: str) -> None:
    if torch.cuda.is_available() and sections.get("train", {}).get("device") == "cuda":
        pytest.skip("CUDA is present here")
    (tmp_path / "d.csv").write_text("a,b,label\n" + "".join(f"{i},{i % 3},{i % 2}\n" for i in range(40)))
    out = tmp_path / "artifacts"
    code, output = pipe_train(str(write_recipe(tmp_path, **sections)), "--out", str(out))
    assert code == 2
    assert expected.format(tmp=tmp_path) in output
    assert not out.exists()
    assert len(output.strip().splitlines()) == 1, output  # one line names the problem and the fix


def test_resume_without_an_unfinished_run_is_refused(tmp_path: Path) -> None:
    code, output = pipe_train(str(write_recipe(tmp_path)), "--out", str(tmp_path / "a"), "--resume")
    assert code == 2 and "nothing to resume" in output and "run without --resume" in output


def test_diverging_loss_stops_with_a_clear_error_and_keeps_the_checkpoint(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, train={"epochs": 3, "lr": 1e12, "grad_clip": None, "checkpoint_every": 1,
                                           "optimizer": "sgd", "momentum": 0.0})  # fmt: skip
    code, output = pipe_train(str(recipe), "--out", str(tmp_path / "a"))
    assert code == 2
    assert "loss became" in output and "last good checkpoint is kept in" in output and "Lower train.lr" in output
    root = tmp_path / "a" / "tiny" / "1"
    assert not (root / "manifest.json").exists()  # not an artifact: no reader will pick it up
    kept = latest_checkpoint(root)
    assert kept is not None and checkpoint_step(kept) >= 1 and str(kept) in output


def test_bf16_autocast_trains_on_cpu_and_fp16_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "a"
    code, output = pipe_train(
        str(write_recipe(tmp_path, train={"epochs": 2, "lr": 0.01, "precision": "bf16"})), "--out", str(out)
    )
    assert code == 0, output
    manifest = Artifact.load(out / "tiny" / "1").manifest
    assert manifest.stages.train.precision == "bf16" and manifest.metrics["accuracy"] > 0.3
    code, output = pipe_train(
        str(write_recipe(tmp_path, train={"precision": "fp16"})), "--out", str(out), "--device", "cpu"
    )
    assert code == 2 and "fp16 needs a CUDA device" in output and "use bf16 or fp32" in output


def test_learning_rate_warms_up_then_decays_to_the_floor() -> None:
    from pipeline.recipe.schema import TrainSpec
    from pipeline.train.loop import lr_at

    cfg = TrainSpec(lr=0.1, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(0, cfg, 100) == pytest.approx(0.01)
    assert lr_at(9, cfg, 100) == pytest.approx(0.1)
    assert lr_at(55, cfg, 100) == pytest.approx(0.055)  # halfway through the cosine
    assert lr_at(100, cfg, 100) == pytest.approx(0.01)
    assert all(lr_at(s, cfg, 100) >= lr_at(s + 1, cfg, 100) for s in range(10, 100))


def test_more_cuda_processes_than_gpus_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.train import stage

    monkeypatch.setattr(stage, "resolve_device", lambda requested: "cuda")  # as on a one-GPU machine
    monkeypatch.setattr(stage, "_cuda_device_count", lambda: 1)
    code, output = pipe_train(str(write_recipe(tmp_path)), "--out", str(tmp_path / "a"), "--nproc", "2")
    assert code == 2 and "--nproc 2 on CUDA needs a GPU per process; this machine has 1: use --nproc 1" in output
    assert not (tmp_path / "a").exists()


def test_a_short_last_accumulation_group_logs_and_steps_on_its_mean_loss(tmp_path: Path) -> None:
    # 1,257 train samples / 64 = 20 micro-batches an epoch: groups of 3, 3, 3, 3, 3, 3 and a last one of 2
    recipe = write_recipe(tmp_path, train={"epochs": 2, "batch_size": 64, "grad_accum": 3, "lr": 1e-7})
    code, output = pipe_train(str(recipe), "--out", str(tmp_path / "a"))
    assert code == 0, output
    lines = (tmp_path / "a" / "tiny" / "1" / "reports" / "metrics.jsonl").read_text().splitlines()
    losses = [r["loss"] for r in map(json.loads, lines) if r["kind"] == "train"]
    assert len(losses) == 14  # 7 optimizer steps an epoch
    median = sorted(losses)[len(losses) // 2]
    assert all(abs(loss - median) < 0.1 * median for loss in losses), losses  # lr ~0: the loss barely moves
