"""Greedy generation from a decoder graph with an explicit KV cache, numpy only (no torch).

The graph (docs/language-models.md) takes `input_ids`, `attention_mask`, `position_ids` and the past
keys and values, and gives `logits` [batch, sequence, vocab] and the present keys and values. The first
step feeds the whole (left-padded) prompt with a zero-length past; each later step feeds the one token
chosen, the mask grown by one, the next position, and the presents as the pasts. Positions count real
tokens only (the cumulative sum of the mask, less one), as transformers' generate does, so a
left-padded row generates what it generates alone. A row that produced an EOS id is finished: it gets
the padding id from then on, as generate writes it.

Any `Runner` drives it (an onnxruntime session, a torch module in a test); the export gate compares it
with transformers' `generate(do_sample=False)`, and a server can run it as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.artifact.generation import CacheLayout
from pipeline.artifact.tensors import TensorSpec
from pipeline.artifact.tokens import TokenLimits
from pipeline.core.arrays import Arrays
from pipeline.runtime.runners import Runner


@dataclass
class Generated:
    """What one greedy run gave: the new tokens and each step's last-position logits."""

    tokens: np.ndarray  # [batch, steps] int64; a finished row holds the padding id
    logits: np.ndarray  # [batch, steps, vocab] float32: the logits each token was chosen from
    lengths: np.ndarray  # [batch]: tokens each row generated, its EOS included (the rest is padding)


def ended(tokens: np.ndarray, eos_ids: list[int]) -> np.ndarray:
    """Each row's length up to and including its first EOS id (the whole row when it has none)."""
    hit = np.isin(tokens, eos_ids)
    first = np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, tokens.shape[1])
    return first.astype(np.int64)


def empty_past(cache: CacheLayout, batch: int) -> Arrays:
    """A zero-length past for the first step: [batch, kv_heads, 0, head_size] per key and value."""
    shape = (batch, cache.kv_heads, 0, cache.head_size)
    return {name: np.zeros(shape, dtype=np.dtype(cache.dtype)) for name in cache.past_names()}


def positions(mask: np.ndarray) -> np.ndarray:
    """Position ids of a left-padded batch: each real token's index among its row's real tokens
    (padding gets 1, as transformers fills it; the mask hides it anyway). mask [B, T] -> [B, T] int64."""
    pos = np.cumsum(mask, axis=1) - 1
    return np.where(mask == 0, 1, pos).astype(np.int64)


def decoder_specs(limits: TokenLimits, layout: CacheLayout, vocab: int) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The graph's inputs and outputs as the manifest records them."""
    cache_in = ["batch", layout.kv_heads, "past_sequence", layout.head_size]
    cache_out = ["batch", layout.kv_heads, "total_sequence", layout.head_size]
    inputs = [
        TensorSpec("input_ids", "int64", ["batch", "sequence"], "NT"),
        TensorSpec("attention_mask", "int64", ["batch", "total_sequence"], "NT"),
        TensorSpec("position_ids", "int64", ["batch", "sequence"], "NT"),
        *(TensorSpec(n, layout.dtype, list(cache_in)) for n in layout.past_names()),
    ]
    outputs = [
        TensorSpec("logits", "float32", ["batch", "sequence", vocab]),
        *(TensorSpec(n, layout.dtype, list(cache_out)) for n in layout.present_names()),
    ]
    return limits.apply(inputs), outputs


def first_step(input_ids: np.ndarray, attention_mask: np.ndarray, cache: CacheLayout) -> Arrays:
    """The first step's inputs for a left-padded prompt batch: ids, mask, positions, a zero-length past."""
    return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": positions(attention_mask),
            **empty_past(cache, len(attention_mask))}  # fmt: skip


def greedy(
    run: Runner,
    cache: CacheLayout,
    input_ids: np.ndarray,
    attention_mask: np.ndarray,
    steps: int,
    eos_ids: list[int],
    padding_id: int,
) -> Generated:
    """`steps` (>= 1) greedy tokens for each row of a left-padded prompt batch (ids and mask [B, T] int64);
    fewer when every row has ended."""
    batch = len(input_ids)
    ids, mask = input_ids.astype(np.int64), attention_mask.astype(np.int64)
    pos = positions(mask)
    past = empty_past(cache, batch)
    done = np.zeros(batch, dtype=bool)
    tokens, logits = [], []
    for _ in range(steps):
        out = run({"input_ids": ids, "attention_mask": mask, "position_ids": pos, **past})
        last = out["logits"][:, -1].astype(np.float32)  # [B, vocab]
        chosen = np.where(done, padding_id, last.argmax(axis=-1)).astype(np.int64)
        done |= np.isin(chosen, eos_ids)
        tokens.append(chosen)
        logits.append(last)
        past = dict(zip(cache.past_names(), (out[n] for n in cache.present_names()), strict=True))
        ids = chosen[:, None]
        mask = np.concatenate([mask, np.ones((batch, 1), dtype=np.int64)], axis=1)
        pos = pos[:, -1:] + 1
        if done.all():
            break
    made = np.stack(tokens, axis=1)
    return Generated(made, np.stack(logits, axis=1), ended(made, eos_ids))


def stitch(rows: list[Generated], padding_id: int) -> Generated:
    """Runs of one row each as one batch: tokens padded with `padding_id`, logits with zeros past each row's end."""
    steps = max(g.tokens.shape[1] for g in rows)
    vocab = rows[0].logits.shape[2]
    tokens = np.full((len(rows), steps), padding_id, dtype=np.int64)
    logits = np.zeros((len(rows), steps, vocab), dtype=np.float32)
    for i, g in enumerate(rows):
        tokens[i, : g.tokens.shape[1]] = g.tokens[0]
        logits[i, : g.logits.shape[1]] = g.logits[0]
    return Generated(tokens, logits, np.concatenate([g.lengths for g in rows]))
