"""Checkpoints: state round trips without pickle, only complete files count, unreadable ones are named."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.core.errors import ArtifactError, InputError
from pipeline.train.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    read_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
)


def test_optimizer_and_rng_state_round_trip(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, betas=(0.8, 0.9))
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    state = {"optimizer": opt.state_dict(), "rng": [rng_state()], "progress": {"step": 7, "best": -float("inf")}}
    expected = (random.random(), np.random.rand(), torch.rand(3))

    path = save_checkpoint(tmp_path, 7, model.state_dict(), model.state_dict(), state)
    assert latest_checkpoint(tmp_path) == path
    assert [p.name for p in path.parent.iterdir()] == ["step-000007.safetensors"]  # one file, nothing pickled
    weights, best, loaded = load_checkpoint(path)
    assert torch.equal(best["bias"], model.bias)
    assert torch.equal(weights["weight"], model.weight)

    fresh = torch.optim.AdamW(torch.nn.Linear(4, 3).parameters())
    fresh.load_state_dict(loaded["optimizer"])
    assert fresh.param_groups[0]["betas"] == (0.8, 0.9)
    assert torch.equal(fresh.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    set_rng_state(loaded["rng"][0])
    assert (random.random(), np.random.rand()) == expected[:2]
    assert torch.equal(torch.rand(3), expected[2])
    assert loaded["progress"] == {"step": 7, "best": -float("inf")}


def test_a_newer_checkpoint_replaces_the_older(tmp_path: Path) -> None:
    weights = {"w": torch.ones(2)}
    save_checkpoint(tmp_path, 1, weights, weights, {"progress": {}})
    (tmp_path / "checkpoint" / ".step-000002.safetensors.x1.tmp").write_bytes(b"half")  # a SIGKILL mid-write
    assert latest_checkpoint(tmp_path).name == "step-000001.safetensors"  # a temp file is never a checkpoint
    second = save_checkpoint(tmp_path, 2, {"w": torch.zeros(2)}, weights, {"progress": {}})
    assert sorted(p.name for p in (tmp_path / "checkpoint").iterdir()) == ["step-000002.safetensors"]
    assert latest_checkpoint(tmp_path) == second
    assert torch.equal(load_checkpoint(second)[0]["w"], torch.zeros(2))


def test_an_unreadable_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "checkpoint" / "step-000003.safetensors"
    bad.parent.mkdir()
    bad.write_bytes(b"not safetensors" * 10)  # e.g. a disk that lost it
    for read in (read_state, load_checkpoint):
        with pytest.raises(ArtifactError, match="step-000003.safetensors is unreadable .*without --resume"):
            read(bad)


def test_resume_reads_the_newest_checkpoint_by_step_and_needs_the_same_process_count(tmp_path: Path) -> None:
    from pipeline.recipe.schema import parse_recipe
    from pipeline.train.stage import choose_version

    recipe = parse_recipe({"name": "t", "model": {"arch": "mlp"}, "data": {"source": "digits"}})
    root = tmp_path / "t" / "1"
    weights = {"w": torch.ones(1)}
    state = {"recipe_digest": recipe.digest, "epochs": 10, "rng": [rng_state(), rng_state()]}  # two ranks
    save_checkpoint(root, 1_000_000, weights, weights, state)
    (root / "checkpoint" / "step-999999.safetensors").write_bytes(b"older, and sorts last by name")
    assert choose_version(tmp_path / "t", recipe, resume=True, processes=2) == root
    with pytest.raises(InputError, match=r"started with 2 process\(es\), this run has 1; resume with --nproc 2"):
        choose_version(tmp_path / "t", recipe, resume=True)
