"""A causal LM with its KV cache as explicit tensors: the module exported, and the one training's golden runs.

`CachedDecoder` wraps a transformers `*ForCausalLM` so that forward takes `input_ids`, `attention_mask`
[batch, past + sequence], `position_ids` and one key and one value tensor per layer (`[batch, kv_heads,
past, head_size]`; past may be 0), and returns the logits and the present keys and values (past +
sequence long). transformers 5 takes the cache as `cache` (a `DynamicCache`; `past_key_values` before
5.24): the wrapper builds one from the tensors, so the exported graph holds no Python cache object.
`cache_layout` reads the layout the model really makes.

Below the stages: the export (pipeline/export/causal_lm.py) and training (its golden first step) share it.
Imports torch and transformers at the top: the server never loads it.
"""

from __future__ import annotations

import inspect

import torch

from pipeline.artifact.generation import CacheLayout


class CachedDecoder(torch.nn.Module):
    """(input_ids, attention_mask, position_ids, *past) -> (logits, *present), past and present flat:
    layer 0 key, layer 0 value, layer 1 key, ..."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        taken = inspect.signature(model.forward).parameters
        self.cache_word = "cache" if "cache" in taken else "past_key_values"  # renamed in transformers 5.24

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, *past: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        for layer in range(len(past) // 2):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            **{self.cache_word: cache},
        )
        present = getattr(out, "cache", None) or out.past_key_values
        flat = [t for layer in present.layers for t in (layer.keys, layer.values)]
        return (out.logits, *flat)  # logits [B, T, vocab]; each present [B, kv_heads, past + T, head_size]


def cache_layout(decoder: CachedDecoder) -> CacheLayout:
    """The cache as the model really makes it: one step on a 1-token prompt, the presents' shapes read."""
    ids = torch.zeros((1, 1), dtype=torch.int64)
    with torch.no_grad():
        out = decoder(ids, torch.ones_like(ids), torch.zeros_like(ids))
    keys = out[1]  # [1, kv_heads, 1, head_size]
    dtype = str(keys.dtype).removeprefix("torch.")
    return CacheLayout(
        layers=(len(out) - 1) // 2, kv_heads=int(keys.shape[1]), head_size=int(keys.shape[3]), dtype=dtype
    )
