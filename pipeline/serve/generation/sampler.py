"""How the next token is chosen from a row's logits: greedy at temperature 0, else temperature, top-k and
top-p (nucleus) sampling with the sequence's own random generator; penalties on tokens already seen first.

Each sequence owns its `Sampler`, seeded by the request's `seed` (or fresh entropy without one), so a
seeded request draws the same tokens whichever other sequences share its steps. Greedy is numpy's
argmax (the first of equal maxima), as the export gate's `pipeline/runtime/generate.py` chooses.

The penalties change the logits before either, in the order transformers and vLLM apply them:
`repetition_penalty` as transformers' RepetitionPenaltyLogitsProcessor (every token of the prompt and
the answer so far: a positive logit divided by it, a negative one multiplied; 1 is off), then OpenAI's
`frequency_penalty` and `presence_penalty` over the answer's tokens (each token's logit less its count
times the first, less the second once it appears; 0 is off).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Sampling:
    """A request's sampling settings (checked by the protocol that read them)."""

    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0  # keep the most likely tokens whose probabilities add up to this; 1: all
    top_k: int = 0  # keep the k most likely tokens; 0: all
    seed: int | None = None  # the same seed and prompt give the same tokens
    repetition_penalty: float = 1.0  # transformers' (module doc); 1: off
    frequency_penalty: float = 0.0  # OpenAI's, -2..2; 0: off
    presence_penalty: float = 0.0  # OpenAI's, -2..2; 0: off

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0


class Sampler:
    """One sequence's token choice."""

    def __init__(self, sampling: Sampling) -> None:
        self.sampling = sampling
        self._rng = None if sampling.greedy else np.random.default_rng(sampling.seed)

    def choose(self, logits: np.ndarray, tokens: list[int], prompt: int) -> int:
        """The next token from one row's logits [vocab], after `tokens` (the first `prompt` of them the prompt's)."""
        s = self.sampling
        if s.penalized:
            logits = penalized(logits, s, tokens, prompt)
        if self._rng is None:
            return int(np.argmax(logits))
        x = logits.astype(np.float64) / s.temperature
        if 0 < s.top_k < x.size:
            kth = np.partition(x, -s.top_k)[-s.top_k]
            x = np.where(x < kth, -np.inf, x)
        p = np.exp(x - x.max())
        p /= p.sum()
        if s.top_p < 1.0:
            order = np.argsort(-p, kind="stable")
            ranked = p[order]
            before = np.cumsum(ranked) - ranked  # probability of the tokens ranked above each one
            cut = np.zeros_like(p)
            cut[order] = np.where(before < s.top_p, ranked, 0.0)  # the first token is always kept
            p = cut / cut.sum()
        cumulative = np.cumsum(p)
        return int(min(np.searchsorted(cumulative, self._rng.random() * cumulative[-1], side="right"), p.size - 1))


def penalized(logits: np.ndarray, s: Sampling, tokens: list[int], prompt: int) -> np.ndarray:
    """A copy of one row's logits with the sampling's penalties applied (module doc)."""
    out = logits.astype(np.float32, copy=True)
    if s.repetition_penalty != 1.0:
        seen = np.unique(np.asarray(tokens, dtype=np.int64))
        scores = out[seen]
        out[seen] = np.where(scores < 0, scores * s.repetition_penalty, scores / s.repetition_penalty)
    if (s.frequency_penalty != 0.0 or s.presence_penalty != 0.0) and len(tokens) > prompt:
        ids, counts = np.unique(np.asarray(tokens[prompt:], dtype=np.int64), return_counts=True)
        out[ids] -= (counts * s.frequency_penalty + s.presence_penalty).astype(np.float32)
    return out
