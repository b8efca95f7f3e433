"""A causal LM under FSDP2 (`train.strategy: fsdp`): which modules are sharded, and a LoRA fine-tune in two
real torchrun processes (gloo) killed after a step, resumed from its full-state checkpoint and exported
through the KV-cache gate by a single process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.artifact.directory import Artifact
from pipeline.cli.group import main
from pipeline.train.checkpoint import latest_checkpoint
from tests.lm.lm_models import save_llama


def _llama_config(**extra: object) -> object:
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **extra)  # fmt: skip


def test_each_decoder_layer_is_a_unit_with_or_without_lora() -> None:
    from transformers import LlamaForCausalLM

    from pipeline.recipe.architectures import LoraSpec
    from pipeline.train.causal_lm import with_lora
    from pipeline.train.distributed import shard_units
    from pipeline.train.hf import TextClassifier

    net = LlamaForCausalLM(_llama_config())
    units, names = shard_units(TextClassifier(net, lora=False))
    assert names == ["LlamaDecoderLayer"] and units == list(net.model.layers)
    peft = with_lora(net, LoraSpec(rank=2, alpha=4, target_modules=["q_proj", "v_proj"]))
    units, names = shard_units(TextClassifier(peft, lora=True))  # PEFT wraps the model: the layers are found inside
    assert names == ["LlamaDecoderLayer"] and len(units) == 3


def test_a_block_tied_to_a_weight_outside_it_stays_with_the_root() -> None:
    from torch import nn
    from transformers import BertConfig, BertForMaskedLM

    from pipeline.train.distributed import shard_units

    # BertForMaskedLM names BertEmbeddings and BertLayer unsplittable; its word embedding is the MLM decoder's
    # weight, so sharding BertEmbeddings alone would put one parameter in two FSDP units.
    bert = BertForMaskedLM(BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=32))  # fmt: skip
    assert bert.cls.predictions.decoder.weight is bert.bert.embeddings.word_embeddings.weight
    units, names = shard_units(bert)
    assert names == ["BertLayer"] and units == list(bert.bert.encoder.layer)
    assert shard_units(nn.Sequential(nn.Linear(4, 4), nn.ReLU())) == ([], [])  # names none: the root alone


def pipe_train(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    bin_dir = str(Path(sys.executable).parent)
    full_env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CI": "true", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "train", *args], capture_output=True, text=True, env=full_env, timeout=300
    )


@pytest.mark.slow  # two torchrun launches of 2 processes each and an export: about 63 s of CPU
def test_fsdp_lora_is_killed_resumes_and_exports_through_the_gate(tmp_path: Path) -> None:
    save_llama(tmp_path / "llama")
    rows = [
        {"instruction": f"What is {a} plus {b}?", "input": "", "output": str(a + b)} for a in range(8) for b in range(6)
    ]
    (tmp_path / "sums.json").write_text(json.dumps(rows))
    recipe = tmp_path / "sft.yaml"
    recipe.write_text(
        "name: sums\ntask: text-generation\nmodel: {arch: hf, path: llama}\n"
        "data: {source: text, path: sums.json, max_length: 48}\n"
        "lora: {rank: 4, alpha: 8, target_modules: [q_proj, v_proj]}\n"
        "train: {epochs: 2, batch_size: 8, lr: 0.003, threads: 1, strategy: fsdp, checkpoint_every: 3}\n"
        "edge: {enabled: false}\n"
    )
    out = tmp_path / "artifacts"
    killed = pipe_train(str(recipe), "--out", str(out), "--nproc", "2", env={"PIPE_TRAIN_FAULT_STEP": "4"})
    assert killed.returncode != 0 and "torchrun exited" in killed.stderr, killed.stderr[-2000:]
    assert "fsdp: 2 LlamaDecoderLayer block(s) sharded one by one" in killed.stderr
    root = out / "sums" / "1"
    assert not (root / "manifest.json").exists() and latest_checkpoint(root).name == "step-000003.safetensors"

    resumed = pipe_train(str(recipe), "--out", str(out), "--nproc", "2", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from" in resumed.stderr and "at step 3" in resumed.stderr
    m = Artifact.load(root).manifest
    assert m.stages.train.strategy == "fsdp" and m.stages.train.world_size == 2
    records = [json.loads(line) for line in (root / "reports" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3, 4, 5, 6]  # step 4 replayed, once
    val = [r["loss"] for r in records if r["kind"] == "val"]
    assert len(val) == 2 and val[1] < val[0]  # learning across the kill

    from safetensors.numpy import load_file

    saved = load_file(root / "checkpoint" / "model.safetensors")  # a full (unsharded) state dict: the adapters
    assert len(saved) == 8 and all("lora_" in k for k in saved)  # 2 layers x (q, v) x (A, B), every row of each
    assert saved["net.base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"].shape == (4, 64)

    result = CliRunner().invoke(main, ["export", str(root)])  # one process reads it, merges, gates the KV cache
    assert result.exit_code == 0, result.output
    m = Artifact.load(root).manifest
    assert m.variants["fp32"].passed and all(r["passed"] for r in m.stages.export.parity["rows"])
