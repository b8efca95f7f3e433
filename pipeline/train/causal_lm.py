"""The causal LM objective: token rows with labels, the loss on the tokens that count, perplexity, LoRA.

- The rows (ids, mask, labels with IGNORE where the loss skips) come from pipeline/data/lm_tokens.py.
- `lm_loss`: cross-entropy of each next token against its label (logits [B, T, V], labels [B, T];
  position t predicts label t + 1), averaged over labelled tokens. `perplexity` is its exponential over a split.
- `causal_lm_from`: a transformers directory as a model to train: its weights, or (a directory with a
  config and no weights) a model of that shape, random-initialized, to train from scratch. `with_lora`
  adds PEFT adapters (merged before export with `merge_and_unload`); `build_causal_lm` is what
  `model: {arch: hf}` builds for task text-generation.

torch and transformers are imported at the top: training loads this module, the server never does.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import torch
from torch.nn import functional as F

from pipeline.core.errors import InputError
from pipeline.data.lm_tokens import IGNORE, LMRows
from pipeline.recipe.architectures import LoraSpec
from pipeline.train.hf import TextClassifier


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

    from pipeline.train.hf import transformers_quiet

    if not (model_dir / "config.json").is_file():
        raise InputError(f"{model_dir} has no config.json: give a transformers directory (a config at least)")
    weights = [*model_dir.glob("*.safetensors"), *model_dir.glob("*.bin")]
    with transformers_quiet():  # no loading bars: pipe prints its own progress
        try:
            if weights:
                return AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager")
            config = AutoConfig.from_pretrained(model_dir)
            return AutoModelForCausalLM.from_config(config, attn_implementation="eager")
        except (OSError, ValueError, KeyError) as exc:
            raise InputError(f"{model_dir} does not load as a transformers causal LM: {exc}"[:400]) from None


def build_causal_lm(model_dir: Path, lora: LoraSpec | None) -> TextClassifier:
    """The causal LM in `model_dir` as pipe trains it: called (input_ids, attention_mask) -> logits [B, T, vocab]
    (train/hf.py's wrapper, whose state is the adapters alone under LoRA and which merges them for export)."""
    from pipeline.train.hf import require_hf

    require_hf("transformers")
    net = causal_lm_from(model_dir).train()
    if lora is None:
        return TextClassifier(net, lora=False)
    require_hf("peft")
    return TextClassifier(with_lora(net, lora), lora=True)


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
        with warnings.catch_warnings():
            # peft 0.21 reads transformers' deprecated `is_gradient_checkpointing`; nothing pipe can change
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            return get_peft_model(model, config)
    except ValueError as exc:
        names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise InputError(
            f"lora.target_modules {list(lora.target_modules)} do not name modules of the model ({exc}); its linear "
            f"layers are named {names}"
        ) from None
