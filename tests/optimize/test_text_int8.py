"""int8 on a transformers text encoder: `pipe optimize --quantize auto --min-cosine 0.99` finds what per-tensor misses.

The model: a 2-layer BERT (hidden 32) built from a config, mean-pooled over the attention mask, then a
projection head whose output channels differ 100-fold in scale and are rescaled after it (as a folded
norm leaves them): one int8 scale for the whole head's weight rounds the small channels away, one per
output channel keeps them. Its evaluation data is text tokenized with a tokenizer trained on a few lines.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from pipeline.artifact.directory import Artifact
from pipeline.cli import main
from tests.text_models import LINES, save_tokenizer

WIDE = 100.0  # how much larger the head's first output channel is before its rescale


def text_encoder(tmp_path: Path) -> tuple[Path, Path]:
    """model.onnx (input_ids, attention_mask -> sentence_embedding [batch, 16]) and eval.npz of tokenized text."""
    import torch
    from tokenizers import Tokenizer
    from transformers import BertConfig, BertModel

    tokenizer = Tokenizer.from_file(str(save_tokenizer(tmp_path / "tok") / "tokenizer.json"))
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    words = " ".join(LINES).split()
    texts = [" ".join(words[i : i + 3 + i % 9]) for i in range(48)]  # 3-11 words each: padded rows too
    encodings = tokenizer.encode_batch(texts)
    ids = np.array([e.ids for e in encodings], dtype=np.int64)
    mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
    np.savez(tmp_path / "eval.npz", input_ids=ids, attention_mask=mask)

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            config = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=64, max_position_embeddings=64,
                                attn_implementation="eager")  # fmt: skip
            self.bert = BertModel(config, add_pooling_layer=False)
            self.head = torch.nn.Linear(32, 16)
            scale = torch.ones(16)
            scale[0] = WIDE
            with torch.no_grad():
                self.head.weight.mul_(scale[:, None])
                self.head.bias.mul_(scale)
            self.register_buffer("rescale", 1.0 / scale)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # [B, T, 32]
            keep = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * keep).sum(1) / keep.sum(1).clamp(min=1.0)  # [B, 32]
            return self.head(pooled) * self.rescale  # [B, 16]

    torch.manual_seed(0)
    dims = {0: "batch", 1: "sequence"}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's own deprecations (pytest makes warnings errors)
        program = torch.onnx.export(
            Encoder().eval(), (torch.from_numpy(ids[:2]), torch.from_numpy(mask[:2])),
            input_names=["input_ids", "attention_mask"], output_names=["sentence_embedding"], opset_version=18,
            dynamo=True, dynamic_shapes=(dims, dims), external_data=False, verbose=False,
        )  # fmt: skip
    program.save(str(tmp_path / "model.onnx"), external_data=False)
    return tmp_path / "model.onnx", tmp_path / "eval.npz"


@pytest.mark.slow
def test_auto_keeps_per_channel_int8_within_min_cosine_where_per_tensor_misses(tmp_path: Path) -> None:
    model, eval_data = text_encoder(tmp_path)
    args = ["import", str(model), "--name", "enc", "--task", "embedding", "--eval-data", str(eval_data),
            "--repository", str(tmp_path / "repo")]  # fmt: skip
    imported = CliRunner().invoke(main, args)
    assert imported.exit_code == 0, imported.output
    root = tmp_path / "repo" / "enc" / "1"
    # int8-dynamic per tensor; the search tries per channel
    args = ["optimize", str(root), "--quantize", "dynamic", "--quantize", "auto", "--min-cosine", "0.99"]
    args += ["--per-tensor", "--graph", "none"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    variants = Artifact.load(root).manifest.variants
    per_tensor, kept = variants["int8-dynamic"], variants["int8"]
    assert not per_tensor.passed and "cosine" in per_tensor.reason  # --per-tensor: one scale per weight tensor
    assert kept.passed, kept.reason
    assert kept.settings["mode"] == "dynamic" and kept.settings["per_channel"] is True
    assert not kept.settings.get("nodes_to_exclude")  # the whole graph int8: per-channel scales alone did it
    report = json.loads((root / "reports" / "optimize.json").read_text())
    figures = {v["variant"]: v["budget_figure"] for v in report["variants"]}
    assert figures["int8"] >= 0.99 > figures["int8-dynamic"], figures
