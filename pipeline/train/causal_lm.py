"""The causal LM objective: token rows with labels, the loss on the tokens that count, perplexity, LoRA.

- `pack_text`: plain text for (continued) pre-training, tokenized and cut into blocks of `block` tokens
  (each block: ids [block], every token labelled).
- `tokenize_conversations`: instruction data (pipeline/data/instructions.py) rendered with the model's
  chat template; only the assistant's turns are labelled (the template's text around them and the
  user's words are -100), found by character offsets, so a merge across the turn's edge cannot shift
  them. Rows are right-padded; padding is unlabelled and masked.
- `lm_loss`: cross-entropy of each next token against its label (logits [B, T, V], labels [B, T];
  position t predicts label t + 1), averaged over labelled tokens. `perplexity` is its exponential over a split.
- `causal_lm_from`: a transformers directory as a model to train: its weights, or (a directory with a
  config and no weights) a model of that shape, random-initialized, to train from scratch. `with_lora`
  adds PEFT adapters (merged before export with `merge_and_unload`).

torch and transformers are imported at the top: training loads this module, the server never does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from pipeline.core.errors import InputError
from pipeline.data.instructions import Message
from pipeline.recipe.architectures import LoraSpec

IGNORE = -100  # the label of a token the loss skips (torch's cross_entropy ignore_index)


@dataclass
class LMRows:
    """Token rows for a causal LM: what the model reads and which next tokens it is scored on."""

    ids: np.ndarray  # [n, T] int64
    mask: np.ndarray  # [n, T] int64: 1 for a real token
    labels: np.ndarray  # [n, T] int64: the token itself where it counts, IGNORE elsewhere

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, rows: np.ndarray | slice) -> LMRows:
        return LMRows(self.ids[rows], self.mask[rows], self.labels[rows])


def pack_text(tokenizer: Any, texts: list[str], block: int, eos_id: int | None) -> LMRows:
    """Texts tokenized (each followed by EOS when given) and cut into blocks of `block` tokens; the tail is dropped."""
    stream: list[int] = []
    for text in texts:
        stream += tokenizer(text, add_special_tokens=False)["input_ids"]
        if eos_id is not None:
            stream.append(eos_id)
    count = len(stream) // block
    if count == 0:
        raise InputError(f"the text makes {len(stream)} tokens, fewer than one block of {block}; give more text")
    ids = np.asarray(stream[: count * block], dtype=np.int64).reshape(count, block)
    return LMRows(ids, np.ones_like(ids), ids.copy())


def tokenize_conversations(tokenizer: Any, conversations: list[list[Message]], max_length: int) -> LMRows:
    """Conversations rendered with the chat template, labels on the assistant's turns only, right-padded.

    A row longer than `max_length` is cut on the right; a row left with no labelled token is refused."""
    if not getattr(tokenizer, "chat_template", None):
        raise InputError(
            "instruction data needs the model's chat template, and its tokenizer has none; add chat_template to "
            "tokenizer_config.json (or chat_template.jinja), or train on plain text"
        )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rows: list[tuple[list[int], list[int]]] = []
    for n, messages in enumerate(conversations):
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        spans = _answer_spans(tokenizer, messages)
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = enc["input_ids"][:max_length]
        labels = [
            tok if any(lo <= start < hi for lo, hi in spans) else IGNORE
            for tok, (start, _) in zip(ids, enc["offset_mapping"], strict=False)
        ]
        if all(x == IGNORE for x in labels):
            raise InputError(
                f"conversation {n + 1}: no answer token within max_length {max_length}; raise max_length or "
                "shorten the prompt"
            )
        rows.append((ids, labels))
    longest = max(len(ids) for ids, _ in rows)
    ids = np.full((len(rows), longest), pad, dtype=np.int64)
    labels = np.full((len(rows), longest), IGNORE, dtype=np.int64)
    mask = np.zeros((len(rows), longest), dtype=np.int64)
    for i, (row, lab) in enumerate(rows):
        ids[i, : len(row)], labels[i, : len(row)], mask[i, : len(row)] = row, lab, 1
    return LMRows(ids, mask, labels)


def _answer_spans(tokenizer: Any, messages: list[Message]) -> list[tuple[int, int]]:
    """Character spans of the rendered conversation that the assistant wrote, each with what the template
    closes its turn with (the EOS the model must learn to say), up to the next turn's start."""
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
        through = tokenizer.apply_chat_template(messages[: i + 1], tokenize=False)
        spans.append((len(before), len(through)))
    return spans


def lm_loss(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy over labelled tokens: logits [B, T, V] at t scored against labels [B, T] at t + 1."""
    shifted = logits[:, :-1].reshape(-1, logits.shape[-1]).float()  # [B*(T-1), V]
    target = labels[:, 1:].reshape(-1)  # [B*(T-1)]
    return F.cross_entropy(shifted, target, ignore_index=IGNORE, reduction=reduction)


@torch.no_grad()
def perplexity(model: torch.nn.Module, rows: LMRows, batch: int = 16) -> dict[str, float]:
    """Mean next-token loss over every labelled token of `rows`, and its exponential (the perplexity)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for start in range(0, len(rows), batch):
        part = rows.take(slice(start, start + batch))
        ids, mask, labels = (torch.from_numpy(a) for a in (part.ids, part.mask, part.labels))
        logits = model(input_ids=ids, attention_mask=mask).logits
        total += lm_loss(logits, labels, reduction="sum").item()
        count += int((labels[:, 1:] != IGNORE).sum())
    model.train(was_training)
    loss = total / max(count, 1)
    return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), "tokens": float(count)}


def causal_lm_from(model_dir: Path) -> torch.nn.Module:
    """The causal LM in `model_dir`: its weights, or a random-initialized model of its config when it has none
    (training from scratch). Eager attention: what the export and the gate run."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if not (model_dir / "config.json").is_file():
        raise InputError(f"{model_dir} has no config.json: give a transformers directory (a config at least)")
    weights = [*model_dir.glob("*.safetensors"), *model_dir.glob("*.bin")]
    if weights:
        return AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager")
    config = AutoConfig.from_pretrained(model_dir)
    return AutoModelForCausalLM.from_config(config, attn_implementation="eager")


def with_lora(model: torch.nn.Module, lora: LoraSpec) -> torch.nn.Module:
    """PEFT LoRA adapters on `lora.target_modules` (e.g. q_proj, v_proj); every other weight frozen."""
    from peft import LoraConfig, TaskType, get_peft_model

    config = LoraConfig(
        task_type=TaskType.CAUSAL_LM,
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
    )
    try:
        return get_peft_model(model, config)
    except ValueError as exc:
        names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise InputError(
            f"lora.target_modules {list(lora.target_modules)} do not name modules of the model ({exc}); its linear "
            f"layers are named {names}"
        ) from None
