"""A decoder judged on text, teacher-forced: next-token agreement and KL to its reference over held-out blocks.

A quantized decoder is not judged by comparing generated text alone: one changed token early on makes
everything after it differ, so a greedy comparison says little about how close two models are. Here
both models read the same held-out token blocks in one step each (the KV-cache graph fed a
zero-length past: teacher forcing), and at every position that has a next token:

- **top-1 agreement**: the share of positions where both pick the same next token;
- **KL**: the mean KL divergence of the candidate's next-token distribution from the reference's
  (nats per token, KL(reference || candidate));
- **perplexity** of each on the text itself (the next token as it is written), reported beside.

`TokenAgreement` is the budget (both bounds must hold); `pipeline/verify/choose.py:hop_policy` picks it
for a text-generation model, with the defaults below, measured on a Llama trained here
(docs/language-models.md). The held-out blocks are golden.npz's: a trained model's first test blocks,
left-padded, or an imported model's prompts (pipeline/samples/evaluation.py:held_out_text).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from pipeline.artifact.generation import CacheLayout
from pipeline.core.arrays import Arrays
from pipeline.core.errors import ArtifactError, InputError
from pipeline.runtime.generate import empty_past, first_step
from pipeline.runtime.runners import Runner
from pipeline.verify.policies import Judgement, Policy

# Measured on python-llama trained here (docs/language-models.md): weight-only int8 kept agreement 0.993 and KL
# 9e-5 nats/token, int4 (block 32) 0.918 and 0.007 (perplexity +0.4%); a real 135M model's int8 0.94 and 0.012, its
# int4 0.51 and 1.6 (issue 29). The bounds pass the first three and fail the last.
DEFAULT_MIN_TOKEN_AGREEMENT = 0.90  # at most 1 next token in 10 chosen otherwise than the reference chooses it
DEFAULT_MAX_KL = 0.05  # nats per token: the candidate's next-token distribution stays close to the reference's
JUDGE_BLOCKS = 32  # held-out blocks read at most (golden.npz keeps a trained model's first 16)
ROWS_PER_CALL = 4  # blocks per teacher-forced call: [4, 128, vocab] float32 logits at a time
# A long text read past every sliding window and prefill chunk: a graph right on short texts may not be there
LONG_TOKENS = 1024  # the length every decoder is read at (less where its context is shorter)
CHUNK = 256  # tokens fed per call when a long text is read: pipe serve's default prefill chunk


@dataclass(frozen=True)
class TokenAgreement(Policy):
    """Decoders: next-token top-1 agreement with the reference and the mean KL from it, over [positions, vocab]
    logits (the positions that have a next token, chosen by the caller)."""

    name: ClassVar[str] = "token agreement"
    over_split: ClassVar[bool] = True
    min_agreement: float = DEFAULT_MIN_TOKEN_AGREEMENT
    max_kl: float = DEFAULT_MAX_KL

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_agreement <= 1.0 or not self.max_kl >= 0.0:  # `not >=` also refuses NaN
            raise InputError(
                f"token agreement budget: min_token_agreement {self.min_agreement!r} must be from 0 to 1 and max_kl "
                f"{self.max_kl!r} a number >= 0"
            )

    def compare(self, got: np.ndarray, want: np.ndarray) -> Judgement:
        return self.judge(*agreement_and_kl(got, want))

    def statistic(self, got: np.ndarray, want: np.ndarray) -> tuple[float, float, str]:
        """(agreement, margin, one line): the margin is the nearer bound's, in its own units (negative: missed)."""
        agreement, kl = agreement_and_kl(got, want)
        return agreement, self.margin(agreement, kl), self.describe(agreement, kl)

    def judge(self, agreement: float, kl: float) -> Judgement:
        """The verdict on figures already measured (`text_figures`)."""
        return Judgement(agreement >= self.min_agreement and kl <= self.max_kl, self.describe(agreement, kl))

    def margin(self, agreement: float, kl: float) -> float:
        return min(agreement - self.min_agreement, self.max_kl - kl)

    def describe(self, agreement: float, kl: float) -> str:
        return (f"top-1 agreement {agreement:.4f} (budget >= {self.min_agreement:g}), KL {kl:.4g} nats/token "
                f"(budget <= {self.max_kl:g})")  # fmt: skip


def agreement_and_kl(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """Top-1 agreement and mean KL(want || got) of two logit arrays [..., vocab], over every leading position."""
    got2, want2 = got.reshape(-1, got.shape[-1]), want.reshape(-1, want.shape[-1])
    if not len(want2):
        return float("nan"), float("nan")
    agreement = float((got2.argmax(-1) == want2.argmax(-1)).mean())
    kl = 0.0
    for start in range(0, len(want2), 1024):  # float64 log-softmax a slice at a time
        p_log, q_log = _log_softmax(want2[start : start + 1024]), _log_softmax(got2[start : start + 1024])
        kl += float((np.exp(p_log) * (p_log - q_log)).sum())
    return agreement, kl / len(want2)


@dataclass(frozen=True)
class TextFigures:
    """A candidate decoder against its reference on held-out text (see the module doc)."""

    tokens: int  # positions judged: each has a next token
    agreement: float
    kl: float  # nats per token
    perplexity: float  # the candidate's, on the text itself
    reference_perplexity: float

    def to_dict(self) -> dict[str, float]:
        return {"tokens": self.tokens, "agreement": self.agreement, "kl": self.kl, "perplexity": self.perplexity,
                "reference_perplexity": self.reference_perplexity}  # fmt: skip


def held_out_blocks(data: Arrays, limit: int = JUDGE_BLOCKS) -> tuple[np.ndarray, np.ndarray]:
    """The first `limit` blocks (ids, mask [B, T] int64) of an evaluation split or of golden.npz's prompts."""
    if "input_ids" not in data or "attention_mask" not in data:
        raise ArtifactError(f"a decoder's held-out text needs input_ids and attention_mask; it holds {sorted(data)}")
    ids, mask = data["input_ids"][:limit], data["attention_mask"][:limit]
    return np.ascontiguousarray(ids, dtype=np.int64), np.ascontiguousarray(mask, dtype=np.int64)


def teacher_forced(run: Runner, cache: CacheLayout, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The logits [B, T, vocab] of each block read in one step (a zero-length past), ROWS_PER_CALL blocks a call."""
    parts = [
        run(first_step(ids[i : i + ROWS_PER_CALL], mask[i : i + ROWS_PER_CALL], cache))["logits"].astype(np.float32)
        for i in range(0, len(ids), ROWS_PER_CALL)
    ]
    return np.concatenate(parts)


def long_length(cache: CacheLayout, context: int | None) -> int:
    """How long a text every decoder is read at: twice its smallest window, at least LONG_TOKENS, at most its
    context."""
    window = cache.smallest_window()
    length = max(LONG_TOKENS, 2 * window if window else 0)
    return min(length, context) if context else length


def long_text(ids: np.ndarray, length: int) -> np.ndarray:
    """`ids` (a real text's tokens) repeated to `length` tokens, [length] int64."""
    return np.resize(np.asarray(ids, dtype=np.int64), length)


def read_in_chunks(run: Runner, cache: CacheLayout, text: np.ndarray) -> np.ndarray:
    """The logits [length, vocab] of one text fed CHUNK tokens a call, the past growing, as pipe serve prefills."""
    length = len(text)
    logits: list[np.ndarray] = []
    past: Arrays = empty_past(cache, 1)
    for start in range(0, length, CHUNK):
        end = min(start + CHUNK, length)
        out = run({"input_ids": text[None, start:end], "attention_mask": np.ones((1, end), dtype=np.int64),
                   "position_ids": np.arange(start, end, dtype=np.int64)[None], **past})  # fmt: skip
        logits.append(out["logits"][0].astype(np.float32))
        past = dict(zip(cache.past_names(), (out[n] for n in cache.present_names()), strict=True))
    return np.concatenate(logits)


def scored(mask: np.ndarray) -> np.ndarray:
    """[B, T] bool: positions that are real and whose next position is real (they predict a written token)."""
    have = np.zeros(mask.shape, dtype=bool)
    have[:, :-1] = (mask[:, :-1] == 1) & (mask[:, 1:] == 1)
    return have


def perplexity(logits: np.ndarray, ids: np.ndarray, where: np.ndarray) -> float:
    """exp of the mean next-token negative log-likelihood at the `where` positions (logits [B, T, V], ids [B, T])."""
    rows, cols = np.nonzero(where)
    if not len(rows):
        return float("nan")
    nll = 0.0
    for start in range(0, len(rows), 1024):
        r, c = rows[start : start + 1024], cols[start : start + 1024]
        log_p = _log_softmax(logits[r, c])
        nll -= float(log_p[np.arange(len(r)), ids[r, c + 1]].sum())
    return float(np.exp(nll / len(rows)))


def text_figures(got: np.ndarray, want: np.ndarray, ids: np.ndarray, mask: np.ndarray) -> TextFigures:
    """The figures of a candidate's teacher-forced logits `got` against the reference's `want` (both [B, T, V])."""
    where = scored(mask)
    agreement, kl = agreement_and_kl(got[where], want[where])
    return TextFigures(int(where.sum()), agreement, kl, perplexity(got, ids, where), perplexity(want, ids, where))


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))
