"""A causal LM with its KV cache as explicit tensors: the module exported, and the one training's golden runs.

`CachedDecoder` wraps a transformers `*ForCausalLM` so that forward takes `input_ids`, `attention_mask`
[batch, past + sequence], `position_ids` and one key and one value tensor per layer (`[batch, kv_heads,
past, head_size]`; past may be 0), and returns the logits and the present keys and values (past +
sequence long). transformers 5 takes the cache as `cache` (a `DynamicCache`; `past_key_values` before
5.24): the wrapper builds one from the tensors, so the exported graph holds no Python cache object.
`cache_layout` reads the layout the model really makes.

Every layer keeps its whole past, a sliding-window layer's too (Mistral, Phi-3, Qwen2's, Gemma 2 and 3): all
presents are one length, as the KV pool and the scheduler of pipe serve keep them. Such a layer's window is
then its attention mask's, and it is measured in positions, not in columns: a server's cache may hold holes
(masked columns) between a row's tokens and the new one, so transformers' own window (the query's column less
the key's) would be wrong there. `window_masks` builds each layer type's mask from the 2-D mask and the
positions instead; a model without windows gets the 2-D mask as before.

Below the stages: the export (pipeline/export/causal_lm.py) and training (its golden first step) share it.
Imports torch and transformers at the top: the server never loads it.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

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
        self.windows = sliding_windows(model.config)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, *past: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        from transformers import DynamicCache

        # Every layer keeps its whole past (no config: built from one, a windowed layer's cache would keep only
        # its window, and its presents would be shorter than the others')
        cache = DynamicCache()
        for layer in range(len(past) // 2):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        mask: torch.Tensor | dict[str, torch.Tensor] = attention_mask
        if self.windows is not None:
            dtype = self.model.get_input_embeddings().weight.dtype
            mask = window_masks(attention_mask, position_ids, input_ids.shape[1], self.windows, dtype)
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids,
            use_cache=True,
            **{self.cache_word: cache},
        )
        present = getattr(out, "cache", None) or out.past_key_values
        flat = [t for layer in present.layers for t in (layer.keys, layer.values)]
        return (out.logits, *flat)  # logits [B, T, vocab]; each present [B, kv_heads, past + T, head_size]


@dataclass(frozen=True)
class Windows:
    """A model's sliding windows as its config says: the window, and whether its layers say their type."""

    size: int  # a windowed layer's query sees the keys of the last `size` positions, its own included
    by_layer_type: bool  # config.layer_types names each layer's: the model takes a mask per type (a dict)


def sliding_windows(config: Any) -> Windows | None:
    """The model's sliding windows (None: every layer attends to the whole past). Gemma 2 and 3, Qwen2 and 3 say
    each layer's type in `layer_types`; Mistral and Phi-3 slide every layer when `sliding_window` is set."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if not window:
        return None
    if types is not None:
        return Windows(int(window), True) if "sliding_attention" in types else None
    return Windows(int(window), False)


def window_masks(
    attention_mask: torch.Tensor, position_ids: torch.Tensor, sequence: int, windows: Windows, dtype: torch.dtype
) -> torch.Tensor | dict[str, torch.Tensor]:
    """Additive masks [batch, 1, sequence, total] for the full and the windowed layers: a key is seen where the
    2-D mask holds it, at a column no later than the query's (the new tokens are the last `sequence` columns),
    and, for a windowed layer, at a position within the window before the query's. A key's position is the
    count of held columns before it, as the positions fed with it were."""
    total = attention_mask.shape[1]
    held = attention_mask.bool()[:, None, :]  # [B, 1, total]
    key_column = torch.arange(total, device=attention_mask.device)
    query_column = key_column[total - sequence :]
    causal = key_column[None, None, :] <= query_column[None, :, None]  # [1, T, total]
    key_position = torch.cumsum(attention_mask, dim=1) - 1  # [B, total]
    behind = position_ids[:, :, None] - key_position[:, None, :]  # [B, T, total]: how far back each key is
    full = held & causal
    windowed = full & (behind < windows.size)
    low = torch.finfo(dtype).min
    full_mask, windowed_mask = (torch.where(m, 0.0, low).to(dtype)[:, None] for m in (full, windowed))
    if windows.by_layer_type:
        return {"full_attention": full_mask, "sliding_attention": windowed_mask}
    return windowed_mask


def cache_layout(decoder: CachedDecoder) -> CacheLayout:
    """The cache as the model really makes it: one step on a 1-token prompt, the presents' shapes read; each
    layer's window as its config says."""
    ids = torch.zeros((1, 1), dtype=torch.int64)
    with torch.no_grad():
        out = decoder(ids, torch.ones_like(ids), torch.zeros_like(ids))
    keys = out[1]  # [1, kv_heads, 1, head_size]
    dtype = str(keys.dtype).removeprefix("torch.")
    layers = (len(out) - 1) // 2
    return CacheLayout(
        layers=layers,
        kv_heads=int(keys.shape[1]),
        head_size=int(keys.shape[3]),
        dtype=dtype,
        windows=layer_windows(decoder.model.config, layers),
    )


def layer_windows(config: Any, layers: int) -> list[int] | None:
    """Each layer's sliding window (0: the whole past), as the manifest's cache record keeps them; None when
    no layer slides."""
    windows = sliding_windows(config)
    if windows is None:
        return None
    types = getattr(config, "layer_types", None) if windows.by_layer_type else None
    if types is None:
        return [windows.size] * layers
    return [windows.size if kind == "sliding_attention" else 0 for kind in types[:layers]]
