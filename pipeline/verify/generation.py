"""The gate of a text-generation model: greedy tokens equal to the reference's, logits within tolerance.

A decoder is judged on what it generates, not on one forward pass: the candidate (the ONNX graph driven
by pipeline/runtime/generate.py) and the reference (transformers' `generate(do_sample=False)`) each
continue the same prompts, and the rows say, per case (a batch size, a left-padded batch, each row
alone), whether every token is the same and how far the logits the tokens were chosen from are apart.
Logits are compared only up to the first differing token of a row, and up to its EOS: after it the two
continue different texts (or none), and their logits mean nothing side by side. Every case runs; the
caller raises on the report.
"""

from __future__ import annotations

import numpy as np

from pipeline.runtime.generate import Generated
from pipeline.verify.report import Row


def greedy_rows(case: str, reference: Generated, candidate: Generated, atol: float, rtol: float) -> list[Row]:
    """Two rows for one case: `<case> tokens` (all equal) and `<case> logits` (within atol + rtol*|ref|)."""
    ref, got = reference.tokens, candidate.tokens
    rows_n, steps = ref.shape[0], max(ref.shape[1], got.shape[1])
    first = _first_difference(reference, candidate)
    if first is None:
        tokens = Row(f"{case} tokens", "tokens", True, f"{rows_n} rows x {steps} tokens equal")
    else:
        r, s = first
        mine = int(got[r, s]) if s < got.shape[1] else "nothing (stopped)"
        theirs = int(ref[r, s]) if s < ref.shape[1] else "nothing (stopped)"
        tokens = Row(f"{case} tokens", "tokens", False, f"row {r}, token {s}: onnx {mine}, reference {theirs}")
    return [tokens, _logit_row(case, reference, candidate, atol, rtol)]


def _first_difference(reference: Generated, candidate: Generated) -> tuple[int, int] | None:
    """(row, step) of the first token that differs while either run still generates that row (after both
    ended, at their EOS, what follows is padding or a run that stopped: nothing to compare)."""
    ref, got = reference.tokens, candidate.tokens
    steps = max(ref.shape[1], got.shape[1])
    for s in range(steps):
        for r in range(ref.shape[0]):
            if s >= reference.lengths[r] and s >= candidate.lengths[r]:
                continue
            a = ref[r, s] if s < ref.shape[1] else None
            b = got[r, s] if s < got.shape[1] else None
            if a != b:
                return r, s
    return None


def _logit_row(case: str, reference: Generated, candidate: Generated, atol: float, rtol: float) -> Row:
    """The logits of every step both runs took on the same text (each row up to its first differing token)."""
    worst_abs, worst_rel, bad, total = 0.0, 0.0, 0, 0
    steps = min(reference.logits.shape[1], candidate.logits.shape[1])
    for r in range(reference.logits.shape[0]):
        agree = min(steps, int(reference.lengths[r]), int(candidate.lengths[r]))  # a row ends at its EOS
        for s in range(agree):
            if reference.tokens[r, s] != candidate.tokens[r, s]:
                agree = s + 1  # the differing token's own logits are still on the same text
                break
        a = reference.logits[r, :agree].astype(np.float64)
        b = candidate.logits[r, :agree].astype(np.float64)
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            return Row(f"{case} logits", "logits", False, f"row {r}: NaN or Inf in the logits")
        diff = np.abs(a - b)
        worst_abs = max(worst_abs, float(diff.max(initial=0.0)))
        worst_rel = max(worst_rel, float((diff / np.maximum(np.abs(a), atol)).max(initial=0.0)))
        bad += int((diff > atol + rtol * np.abs(a)).sum())
        total += diff.size
    detail = f"{bad} of {total} values exceed atol {atol:g} + rtol {rtol:g}*|ref|" if bad else f"{total} values"
    return Row(f"{case} logits", "logits", bad == 0, detail, worst_abs, worst_rel)
