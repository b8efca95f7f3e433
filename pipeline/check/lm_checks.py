"""`pipe check` of a decoder (task text-generation): the candidate against the baseline on the same text.

The candidate's golden.npz holds held-out text (a trained decoder's first test blocks, an imported
one's prompts). Both model.onnx files read it, and two checks judge what changed:

- `perplexity`: both read the text teacher-forced (pipeline/verify/lm_judge.py); the candidate's
  perplexity may rise by at most `max_perplexity_increase` of the baseline's (default 5%);
- `greedy agreement`: both generate GREEDY_TOKENS greedy tokens from the first GREEDY_ROWS golden rows as
  prompts (pipeline/runtime/generate.py); the share of the baseline's tokens the candidate generates
  alike, up to each baseline row's end, is held to `min_greedy_agreement` when it is set (two sound
  trainings write different text, so by default it is reported, not judged).

Both need the two models to read token ids alike: a baseline with another tokenizer is a skip, said.
A baseline given as a JSON summary has no model to run: both are skipped, and the recorded test
metrics (`loss`) are still compared by the common checks.
"""

from __future__ import annotations

import numpy as np

from pipeline.artifact.directory import Artifact
from pipeline.artifact.golden import load_golden
from pipeline.artifact.variants import MODEL_FILE
from pipeline.check.checks import CheckResult
from pipeline.core.errors import ArtifactError
from pipeline.recipe.budgets import BudgetSpec
from pipeline.runtime.generate import greedy
from pipeline.runtime.runners import ort_runner
from pipeline.verify.lm_judge import held_out_blocks, perplexity, scored, teacher_forced

GREEDY_ROWS = 8  # golden rows used as prompts
GREEDY_TOKENS = 16  # greedy tokens generated from each


def check_decoder(candidate: Artifact, baseline: Artifact | None, budgets: BudgetSpec) -> list[CheckResult]:
    """The perplexity and greedy agreement checks of a decoder candidate against a baseline artifact."""
    names = ("perplexity", "greedy agreement")
    if baseline is None:
        why = "the baseline is a JSON summary: a decoder's text is only compared with a baseline artifact"
        return [CheckResult(name, "skipped", why) for name in names]
    if why := _tokenized_otherwise(candidate, baseline):
        return [CheckResult(name, "skipped", why) for name in names]
    generation, theirs = candidate.manifest.generation, baseline.manifest.generation
    if generation is None or theirs is None:
        raise ArtifactError("a text-generation manifest without its generation record")
    golden = load_golden(candidate).inputs
    ids, mask = held_out_blocks(golden)
    new, old = ort_runner(candidate.path(MODEL_FILE)), ort_runner(baseline.path(MODEL_FILE))
    where = scored(mask)
    mine = perplexity(teacher_forced(new, generation.cache, ids, mask), ids, where)
    before = perplexity(teacher_forced(old, theirs.cache, ids, mask), ids, where)
    rise, limit = mine / before - 1.0, budgets.max_perplexity_increase
    results = [
        CheckResult(
            "perplexity",
            "passed" if rise <= limit else "failed",
            f"perplexity {before:.4g} -> {mine:.4g} on {int(where.sum())} held-out next tokens: {rise:+.2%} "
            f"({'within' if rise <= limit else 'breaks'} max_perplexity_increase {limit:.2%})",
            {"baseline": before, "candidate": mine, "increase": rise, "budget": limit, "tokens": int(where.sum())},
        )
    ]
    prompts, prompt_mask = _prompts(ids, mask, generation.context_length)
    args = (prompts, prompt_mask, GREEDY_TOKENS)
    said = greedy(new, generation.cache, *args, generation.eos_token_ids, generation.padding_id)
    expected = greedy(old, theirs.cache, *args, theirs.eos_token_ids, theirs.padding_id)
    steps = min(said.tokens.shape[1], expected.tokens.shape[1])
    counted = np.arange(steps)[None, :] < np.minimum(expected.lengths, steps)[:, None]
    same = (said.tokens[:, :steps] == expected.tokens[:, :steps]) & counted
    agreement = float(same.sum() / max(int(counted.sum()), 1))
    rows_equal = int(((said.tokens[:, :steps] == expected.tokens[:, :steps]) | ~counted).all(axis=1).sum())
    floor = budgets.min_greedy_agreement
    held = floor is None or agreement >= floor
    bound = "reported (set --min-greedy-agreement to judge it)" if floor is None else (
        f"{'within' if held else 'breaks'} min_greedy_agreement {floor:g}"
    )  # fmt: skip
    results.append(
        CheckResult(
            "greedy agreement",
            "passed" if held else "failed",
            f"{agreement:.4f} of {int(counted.sum())} greedy tokens from {len(prompts)} golden prompts equal the "
            f"baseline's ({rows_equal} of {len(prompts)} rows whole): {bound}",
            {"agreement": agreement, "tokens": int(counted.sum()), "rows_equal": rows_equal, "budget": floor},
        )
    )
    return results


def _tokenized_otherwise(candidate: Artifact, baseline: Artifact) -> str:
    """Why the two cannot read the same token ids ('' when they can): another vocabulary or tokenizer."""
    a, b = candidate.manifest, baseline.manifest
    files = sorted(rel for rel in a.files if rel.startswith("tokenizer/") and not rel.endswith(".jinja"))
    differ = [rel for rel in files if rel not in b.files or b.files[rel].sha256 != a.files[rel].sha256]
    if differ:
        return (f"the two models tokenize otherwise ({', '.join(differ)} differ): the same ids would be other "
                "text to each; compare decoders that share a tokenizer")  # fmt: skip
    return ""


def _prompts(ids: np.ndarray, mask: np.ndarray, context: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The first GREEDY_ROWS rows as left-padded prompts, cut on the left to leave GREEDY_TOKENS of context."""
    keep = ids.shape[1] if context is None else max(1, min(ids.shape[1], context - GREEDY_TOKENS))
    rows_ids, rows_mask = ids[:GREEDY_ROWS, -keep:], mask[:GREEDY_ROWS, -keep:]
    live = rows_mask.any(axis=1)  # a row that was all padding has no prompt left
    return rows_ids[live], rows_mask[live]
