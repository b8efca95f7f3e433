"""Real processes: a `pipe train` killed with SIGKILL and resumed, torchrun with 2 workers (DDP, FSDP),
and torchrun's workers ending with a killed `pipe train`.

The kill uses the documented fault-injection hook PIPE_TRAIN_FAULT_STEP=K: the training process
sends itself SIGKILL right after optimizer step K, between two checkpoints, so the work since the
last checkpoint is lost exactly as with an external `kill -9`, at a reproducible moment.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pipeline.artifact.directory import Artifact
from pipeline.train.checkpoint import latest_checkpoint

TOKENS = Path(__file__).resolve().parents[2] / "models" / "data" / "tokens.npz"


def pipe(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    bin_dir = str(Path(sys.executable).parent)
    full_env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CI": "true", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "train", *args], capture_output=True, text=True, env=full_env, timeout=300
    )


def recipe(tmp_path: Path, name: str, model: dict, data: dict, **train: object) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "model": model, "data": data, "train": train}))
    return path


@pytest.mark.slow
def test_sigkill_then_resume_equals_uninterrupted_bit_for_bit(tmp_path: Path) -> None:
    # dropout, warmup + cosine, gradient accumulation and early-stopping state all cross the kill
    path = recipe(tmp_path, "resume", {"arch": "mlp", "hidden": [64], "dropout": 0.2}, {"source": "digits"},
                  epochs=3, batch_size=32, grad_accum=2, warmup_steps=5, checkpoint_every=7, lr=0.005)  # fmt: skip
    clean = pipe(str(path), "--out", str(tmp_path / "clean"))
    assert clean.returncode == 0, clean.stderr

    killed = pipe(str(path), "--out", str(tmp_path / "killed"), env={"PIPE_TRAIN_FAULT_STEP": "17"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    root = tmp_path / "killed" / "resume" / "1"
    assert not (root / "manifest.json").exists()
    assert latest_checkpoint(root).name == "step-000014.safetensors"  # steps 15-17 are lost

    resumed = pipe(str(path), "--out", str(tmp_path / "killed"), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stderr and f"trained {root}" in resumed.stdout

    a = Artifact.load(tmp_path / "clean" / "resume" / "1")
    b = Artifact.load(root)
    assert (a.root / "checkpoint/model.safetensors").read_bytes() == (
        b.root / "checkpoint/model.safetensors"
    ).read_bytes()
    assert a.manifest.metrics == b.manifest.metrics
    assert a.manifest.files["golden.npz"].sha256 == b.manifest.files["golden.npz"].sha256
    steps = [json.loads(line)["step"] for line in (root / "reports/metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps)  # the replayed steps 15-17 were not logged twice
    a_losses = [r for r in map(json.loads, (a.root / "reports/metrics.jsonl").read_text().splitlines())]
    b_losses = [r for r in map(json.loads, (root / "reports/metrics.jsonl").read_text().splitlines())]
    assert [r.get("loss") for r in a_losses] == [r.get("loss") for r in b_losses]


@pytest.mark.slow
def test_two_processes_ddp_reach_the_single_process_accuracy_band(tmp_path: Path) -> None:
    path = recipe(tmp_path, "ddp", {"arch": "mlp", "hidden": [64]}, {"source": "digits"},
                  epochs=8, batch_size=32, lr=0.005)  # fmt: skip
    one = pipe(str(path), "--out", str(tmp_path / "one"))
    two = pipe(str(path), "--out", str(tmp_path / "two"), "--nproc", "2")
    assert one.returncode == 0, one.stderr
    assert two.returncode == 0, two.stderr
    single = Artifact.load(tmp_path / "one" / "ddp" / "1").manifest
    ddp = Artifact.load(tmp_path / "two" / "ddp" / "1").manifest
    assert ddp.stages.train.world_size == 2 and ddp.stages.train.strategy == "ddp"
    assert ddp.stages.train.steps * 2 == pytest.approx(single.stages.train.steps, abs=8)  # data split
    assert single.metrics["accuracy"] > 0.9 and ddp.metrics["accuracy"] > 0.9
    assert abs(single.metrics["accuracy"] - ddp.metrics["accuracy"]) < 0.05
    # only rank 0 wrote: one events file, one metrics stream
    assert len(list((tmp_path / "two" / "ddp" / "1" / "reports" / "tensorboard").iterdir())) == 1


@pytest.mark.slow
def test_fsdp_two_processes_train_and_resume_bit_for_bit(tmp_path: Path) -> None:
    path = recipe(tmp_path, "fsdp", {"arch": "moe", "d_model": 16, "heads": 2, "layers": 2, "ff_mult": 2,
                  "max_len": 32, "experts": 2, "top_k": 1}, {"source": "tokens", "path": str(TOKENS)},
                  epochs=2, batch_size=64, lr=0.003, strategy="fsdp", checkpoint_every=5,
                  grad_checkpointing=True)  # fmt: skip
    clean = pipe(str(path), "--out", str(tmp_path / "a"), "--nproc", "2")
    assert clean.returncode == 0, clean.stderr
    killed = pipe(str(path), "--out", str(tmp_path / "b"), "--nproc", "2", env={"PIPE_TRAIN_FAULT_STEP": "8"})
    assert killed.returncode == 2 and "torchrun exited" in killed.stderr
    resumed = pipe(str(path), "--out", str(tmp_path / "b"), "--nproc", "2", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    a = Artifact.load(tmp_path / "a" / "fsdp" / "1")
    b = Artifact.load(tmp_path / "b" / "fsdp" / "1")
    assert a.manifest.stages.train.strategy == "fsdp"
    assert (a.root / "checkpoint/model.safetensors").read_bytes() == (
        b.root / "checkpoint/model.safetensors"
    ).read_bytes()


@pytest.mark.slow
def test_killing_pipe_train_stops_torchrun_and_its_workers(tmp_path: Path) -> None:
    import psutil

    path = recipe(tmp_path, "orphan", {"arch": "mlp", "hidden": [32]}, {"source": "digits"}, epochs=100_000)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "CI": "true"}
    cmd = [sys.executable, "-m", "pipeline", "train", str(path), "--out", str(tmp_path / "a"), "--nproc", "2"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    descendants: list[psutil.Process] = []
    try:
        parent = psutil.Process(proc.pid)
        for _ in range(600):  # up to a minute for torchrun to start both workers
            descendants = parent.children(recursive=True)
            if sum("pipeline.train.worker" in " ".join(p.cmdline()) for p in descendants) >= 2:
                break
            time.sleep(0.1)
        else:
            pytest.fail("torchrun did not start two workers within a minute")
        proc.kill()  # SIGKILL: pipe itself gets no chance to clean up
        proc.wait()
        _, alive = psutil.wait_procs(descendants, timeout=30)  # untended, they would train for hours
        assert not alive, f"still running after pipe was killed: {[p.cmdline() for p in alive]}"
    finally:
        for p in descendants:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        proc.kill()
        proc.wait()
