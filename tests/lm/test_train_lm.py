"""`pipe train` of a causal LM (task text-generation): from a config on plain text, LoRA SFT on alpaca rows,
then `pipe export` of each through the KV-cache gate; and the recipe's refusals."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.artifact.directory import Artifact
from pipeline.cli.group import main
from pipeline.core.errors import RecipeError
from pipeline.recipe.schema import parse_recipe
from tests.lm.lm_models import LINES, save_bpe_tokenizer, save_llama


def pipe(*args: str) -> object:
    return CliRunner().invoke(main, list(args))


def write_recipe(path: Path, body: str) -> Path:
    path.write_text(body + "train: {epochs: 2, batch_size: 8, lr: 0.003, threads: 1}\nedge: {enabled: false}\n")
    return path


@pytest.mark.slow  # two short trainings and an export: about 40 s of CPU
def test_a_llama_trains_from_a_config_on_plain_text_and_exports(tmp_path: Path) -> None:
    from transformers import LlamaConfig

    scratch = save_bpe_tokenizer(tmp_path / "scratch")  # a tokenizer and a config, no weights
    LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, bos_token_id=1,
                eos_token_id=2).save_pretrained(scratch)  # fmt: skip
    (tmp_path / "corpus.txt").write_text("\n".join(LINES * 30))
    recipe = write_recipe(tmp_path / "lm.yaml", "name: tiny-lm\ntask: text-generation\nmodel: {arch: hf, path: "
                          "scratch}\ndata: {source: text, path: corpus.txt, max_length: 32}\n")  # fmt: skip
    result = pipe("train", str(recipe), "--out", str(tmp_path / "artifacts"))
    assert result.exit_code == 0, result.output
    assert "text rows: the loss on" in result.output
    root = tmp_path / "artifacts" / "tiny-lm" / "1"
    history = json.loads((root / "reports" / "train.json").read_text())["history"]
    assert history[-1]["perplexity"] < history[0]["perplexity"] < 320  # learning, and below uniform
    m = Artifact.load(root).manifest
    assert m.task == "text-generation" and m.metrics["perplexity"] < 320
    assert m.generation is not None and m.generation.cache.layers == 2 and m.tokenizer.padding_side == "left"
    result = pipe("export", str(root))
    assert result.exit_code == 0, result.output
    m = Artifact.load(root).manifest
    rows = m.stages.export.parity["rows"]
    assert all(r["passed"] for r in rows) and {"golden (recorded)", "greedy batch 4, left-padded tokens"} <= {
        r["check"] for r in rows
    }
    assert m.variants["fp32"].passed


@pytest.mark.slow  # a LoRA fine-tune and an export: about 25 s of CPU
def test_lora_sft_on_alpaca_rows_keeps_adapters_and_exports_merged(tmp_path: Path) -> None:
    save_llama(tmp_path / "llama")
    rows = [
        {"instruction": f"What is {a} plus {b}?", "input": "", "output": str(a + b)} for a in range(8) for b in range(6)
    ]
    (tmp_path / "sums.json").write_text(json.dumps(rows))
    recipe = write_recipe(tmp_path / "sft.yaml", "name: sums\ntask: text-generation\nmodel: {arch: hf, path: llama}\n"
                          "data: {source: text, path: sums.json, max_length: 48}\n"
                          "lora: {rank: 4, alpha: 8, target_modules: [q_proj, v_proj]}\n")  # fmt: skip
    result = pipe("train", str(recipe), "--out", str(tmp_path / "artifacts"))
    assert result.exit_code == 0, result.output
    assert "alpaca or sharegpt rows: the loss on" in result.output
    root = tmp_path / "artifacts" / "sums" / "1"
    from safetensors.numpy import load_file

    saved = load_file(root / "checkpoint" / "model.safetensors")
    assert saved and all("lora_" in k for k in saved)  # the adapters alone: the base comes from model.path
    result = pipe("export", str(root))
    assert result.exit_code == 0, result.output
    assert Artifact.load(root).manifest.variants["fp32"].passed


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("model: {arch: mlp, hidden: [8]}\ndata: {source: digits}\n", "task text-generation trains a transformers"),
        ("model: {arch: hf, path: m}\ndata: {source: text, path: t.txt, label_column: y}\n", "data.label_column: a "),
        ("model: {arch: hf, path: m}\ndata: {source: text, path: t.txt}\ntrain: {monitor: val_accuracy}\n",
         "train.monitor 'val_accuracy' is not measured for a text-generation model"),
    ],
)  # fmt: skip
def test_text_generation_recipes_refuse_what_nothing_reads(body: str, message: str) -> None:
    import yaml

    with pytest.raises((RecipeError, ValueError), match=message):
        parse_recipe(yaml.safe_load("name: t\ntask: text-generation\n" + body))


def test_data_format_belongs_to_text_generation() -> None:
    import yaml

    body = "name: t\nmodel: {arch: hf, path: m}\ndata: {source: text, path: t.csv, format: alpaca}\n"
    with pytest.raises((RecipeError, ValueError), match="data.format reads language-model data"):
        parse_recipe(yaml.safe_load(body))


@pytest.mark.slow  # a short full fine-tune and an export: about 25 s of CPU
def test_full_sft_on_sharegpt_conversations_trains_and_exports(tmp_path: Path) -> None:
    """`data.format: sharegpt` end to end: multi-turn conversations (a system turn, two human/gpt exchanges)
    rendered with the chat template, only the gpt turns scored, every weight fine-tuned, then the KV-cache
    export gated on greedy generation."""
    save_llama(tmp_path / "llama")
    rows = [
        {
            "conversations": [
                {"from": "system", "value": "Answer with a number."},
                {"from": "human", "value": f"What is {a} plus {b}?"},
                {"from": "gpt", "value": str(a + b)},
                {"from": "human", "value": f"And {a} times {b}?"},
                {"from": "gpt", "value": str(a * b)},
            ]
        }
        for a in range(6)
        for b in range(5)
    ]
    (tmp_path / "chats.json").write_text(json.dumps(rows))
    recipe = write_recipe(tmp_path / "chat.yaml", "name: chats\ntask: text-generation\nmodel: {arch: hf, path: llama}\n"
                          "data: {source: text, path: chats.json, format: sharegpt, max_length: 96}\n")  # fmt: skip
    result = pipe("train", str(recipe), "--out", str(tmp_path / "artifacts"))
    assert result.exit_code == 0, result.output
    scored = re.search(r"sharegpt rows: the loss on (\d+) of (\d+) tokens", result.output)
    assert scored is not None, result.output
    assert int(scored[1]) < 0.15 * int(scored[2])  # the gpt turns (a number and its EOS each), nothing else
    root = tmp_path / "artifacts" / "chats" / "1"
    history = json.loads((root / "reports" / "train.json").read_text())["history"]
    assert history[-1]["perplexity"] < history[0]["perplexity"]  # the answers are learned
    m = Artifact.load(root).manifest
    assert m.stages.train.settings["data"]["format"] == "sharegpt" and "lora" not in m.stages.train.settings
    result = pipe("export", str(root))
    assert result.exit_code == 0, result.output
    m = Artifact.load(root).manifest
    assert m.variants["fp32"].passed and all(r["passed"] for r in m.stages.export.parity["rows"])
    result = pipe("benchmark", str(root), "--seconds", "0.2")  # the torch row: the trained checkpoint
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads((root / "reports" / "benchmark.json").read_text())["rows"]}
    assert list(rows) == ["torch", "fp32"] and all(r["timed"] and r["decode_tokens_per_s"] > 0 for r in rows.values())
