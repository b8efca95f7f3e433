"""Grouped-query attention without copying the keys and values per query head, for the decoder's export.

transformers' eager attention repeats each KV head's keys and values for the query heads that share it
(`repeat_kv`: an Expand and a Reshape in the graph) before two MatMuls. In an exported decoder that copy
runs every step over the whole cache: at 16 sequences of 256 tokens on SmolLM-135M's shape (3 KV heads
for 9 query heads) it writes three times the cache per layer. `grouped` computes the same products with
the query heads of a group stacked instead ([batch, kv_heads, group x sequence, head_size] against the
group's keys as they are), so the graph reads the cache once. Each score is the same dot product as
eager's: on a random Llama of that shape the two give bitwise-equal logits in torch; the two exported
graphs' decode steps are timed side by side by bench/bench_decoder_graphs.py (docs/language-models.md).

The export (lm_module.py) switches a model to it only for the trace, and only for the families whose
attention is transformers' plain `eager_attention_forward` (no logit soft-capping, no attention sinks);
the export gate then compares the graph with the model run eagerly, as for any export.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

NAME = "pipe_grouped"
# model_type values whose attention calls the plain eager function with (query, key, value, mask, scaling)
PLAIN_EAGER = frozenset({"llama", "mistral", "qwen2", "qwen3", "phi3", "granite", "olmo2", "smollm3"})


def grouped(
    module: torch.nn.Module,
    query: torch.Tensor,  # [batch, heads, sequence, head_size]
    key: torch.Tensor,  # [batch, kv_heads, total, head_size]
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,  # additive, [batch, 1, sequence, >= total]
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager attention's result (output [batch, sequence, heads, head_size], weights), heads grouped by KV head."""
    b, h, s, d = query.shape
    kv, total = key.shape[1], key.shape[2]
    group = h // kv  # query head i reads KV head i // group, as repeat_kv orders them
    weights = torch.matmul(query.reshape(b, kv, group * s, d), key.transpose(2, 3)) * scaling
    weights = weights.view(b, kv, group, s, total)
    if attention_mask is not None:
        weights = weights + attention_mask[:, :, :, :total].unsqueeze(1)
    weights = torch.nn.functional.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = torch.nn.functional.dropout(weights, p=dropout, training=module.training)
    out = torch.matmul(weights.view(b, kv, group * s, total), value)
    return out.view(b, h, s, d).transpose(1, 2).contiguous(), weights.view(b, h, s, total)


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(NAME, grouped)
    AttentionMaskInterface.register(NAME, eager_mask)  # the additive float mask eager attention takes


def applies(model: torch.nn.Module) -> bool:
    """The model's attention is the plain eager kind, with fewer KV heads than query heads."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) not in PLAIN_EAGER:
        return False
    if getattr(config, "_attn_implementation", None) != "eager" or not hasattr(model, "set_attn_implementation"):
        return False
    heads = getattr(config, "num_attention_heads", 0)
    return 0 < getattr(config, "num_key_value_heads", heads) < heads


@contextlib.contextmanager
def grouped_while(model: torch.nn.Module, enabled: bool = True) -> Iterator[bool]:
    """The model's attention grouped while inside (True), eager again after; unchanged (False) where it does
    not apply, or when not `enabled` (bench/bench_decoder_graphs.py exports both to compare them)."""
    if not (enabled and applies(model)):
        yield False
        return
    _register()
    model.set_attn_implementation(NAME)
    try:
        yield True
    finally:
        model.set_attn_implementation("eager")
