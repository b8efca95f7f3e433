"""The decoder gate at the lengths users send: past every sliding window and every prefill chunk.

The short cases of the decoder gate (causal_lm.py: eight prompts of about 18 tokens, 16 new tokens) cannot
see a graph that is right for short texts and wrong past a window: a real Gemma 3 (a 512-token window on
5 of every 6 layers) passed them and then answered every prompt past 512 tokens wrongly. These cases reach
`long_length(...)` tokens (pipeline/verify/lm_judge.py): twice the smallest window, at least 1,024, at most
the context; optimize reads every variant at that length too (pipeline/optimize/decoder.py).

- `teacher-forced N tokens`: one text of N tokens fed to the graph in 256-token chunks with its past
  growing, as pipe serve prefills, every position's logits against the model's own forward pass over the
  whole text. A failure names the first position past tolerance: where the graph starts to differ.
- `greedy across the window`: a left-padded batch of two prompts, one ending just before the smallest
  window (its decode crosses it) and one of N less `steps` tokens, continued greedily against transformers'
  `generate`, as the short cases are.

Imports torch only inside (the model runs there); the graph runs in onnxruntime.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from pipeline.artifact.generation import CacheLayout, Generation
from pipeline.runtime.generate import greedy
from pipeline.runtime.runners import Runner
from pipeline.verify.generation import greedy_rows
from pipeline.verify.lm_judge import long_length, long_text, read_in_chunks
from pipeline.verify.report import Row

if TYPE_CHECKING:
    import torch


def long_rows(
    run: Runner, model: torch.nn.Module, generation: Generation, ids: np.ndarray, steps: int, atol: float, rtol: float
) -> list[Row]:
    """Both cases on `ids` (a real text's tokens) repeated to `long_length` tokens."""
    cache = generation.cache
    text = long_text(ids, long_length(cache, generation.context_length))
    window, eos, pad = cache.smallest_window(), generation.eos_token_ids, generation.padding_id
    return [
        teacher_forced_row(run, model, cache, text, atol, rtol),
        *across_window_rows(run, model, cache, text, window, steps, eos, pad, atol, rtol),
    ]


def teacher_forced_row(
    run: Runner, model: torch.nn.Module, cache: CacheLayout, text: np.ndarray, atol: float, rtol: float
) -> Row:
    """The graph's logits for `text` fed in chunks against the model's over the whole text at once."""
    import torch

    length = len(text)
    with torch.no_grad():
        ids = torch.from_numpy(text[None])
        want = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].float().numpy()
    got = read_in_chunks(run, cache, text)
    case = f"teacher-forced {length} tokens"
    if not (np.isfinite(want).all() and np.isfinite(got).all()):
        return Row(case, "logits", False, "NaN or Inf in the logits")
    a, b = want.astype(np.float64), got.astype(np.float64)
    diff = np.abs(a - b)
    over = (diff > atol + rtol * np.abs(a)).any(axis=1)  # [length]: a position with any logit past tolerance
    worst_abs = float(diff.max(initial=0.0))
    worst_rel = float((diff / np.maximum(np.abs(a), atol)).max(initial=0.0))
    if not over.any():
        return Row(case, "logits", True, f"every position within atol {atol:g} + rtol {rtol:g}*|ref|",
                   worst_abs, worst_rel)  # fmt: skip
    first = int(np.argmax(over))
    detail = (f"first differs at token {first + 1} of {length} (max abs {diff[first].max():.3g} there); "
              f"{int(over.sum())} positions past tolerance")  # fmt: skip
    return Row(case, "logits", False, detail, worst_abs, worst_rel)


def across_window_rows(
    run: Runner,
    model: torch.nn.Module,
    cache: CacheLayout,
    text: np.ndarray,
    window: int | None,
    steps: int,
    eos: list[int],
    padding: int,
    atol: float,
    rtol: float,
) -> list[Row]:
    """Greedy from two left-padded prompts of `text`: one whose decode crosses the smallest window, one long."""
    from pipeline.export.lm_module import reference_greedy

    long = len(text) - steps
    short = max(1, window - steps // 2) if window else long // 2
    short = min(short, long)
    ids = np.full((2, long), padding, dtype=np.int64)
    mask = np.zeros((2, long), dtype=np.int64)
    ids[0, long - short :], mask[0, long - short :] = text[:short], 1
    ids[1], mask[1] = text[:long], 1
    got = greedy(run, cache, ids, mask, steps, eos, padding)
    want = reference_greedy(model, ids, mask, steps, eos, padding)
    where = f"across the window ({window})" if window else "long"
    return greedy_rows(f"greedy {where}, prompts of {short} and {long} tokens", want, got, atol, rtol)
