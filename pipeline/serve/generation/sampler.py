"""How the next token is chosen from a row's logits: greedy at temperature 0, else temperature, top-k and
top-p (nucleus) sampling with the sequence's own random generator.

Each sequence owns its `Sampler`, seeded by the request's `seed` (or fresh entropy without one), so a
seeded request draws the same tokens whichever other sequences share its steps. Greedy is numpy's
argmax (the first of equal maxima), as the export gate's `pipeline/runtime/generate.py` chooses.
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

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class Sampler:
    """One sequence's token choice."""

    def __init__(self, sampling: Sampling) -> None:
        self.sampling = sampling
        self._rng = None if sampling.greedy else np.random.default_rng(sampling.seed)

    def choose(self, logits: np.ndarray) -> int:
        """The next token from one row's logits [vocab]."""
        s = self.sampling
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
