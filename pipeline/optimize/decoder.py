"""`pipe optimize` of a decoder (task text-generation): its variants judged on text and timed by tokens/s.

A decoder's graph takes its KV cache as inputs (docs/language-models.md), so the classifier's judge and
timer, which feed golden samples through one call, do not say what matters. Here:

- `DecoderJudge` holds each variant to its budget teacher-forced on held-out text (the test split's
  token blocks, else golden.npz's prompts; pipeline/verify/lm_judge.py): the lossy kinds to
  `TokenAgreement` (next-token agreement and KL), a graph-only variant to `Exact` on the logits;
  perplexity is reported beside, as the variant's metric;
- `time_decoders` times model.onnx and every variant side by side as prefill and decode tokens/s
  (pipeline/runtime/lm_speed.py) on the first golden prompt, batch 1: what one person waits for;
- `keep_smallest`: `--quantize auto` keeps the smallest weight-only variant within budget and says its
  speed beside fp32 in words, slower included.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.artifact.directory import Artifact
from pipeline.artifact.golden import load_golden
from pipeline.core.arrays import Arrays
from pipeline.core.errors import ArtifactError
from pipeline.optimize.judge import Verdict
from pipeline.optimize.kind import Made, Say
from pipeline.optimize.trial import NOISE
from pipeline.runtime.lm_speed import LmSpeed, measure_lm, ort_decoders
from pipeline.runtime.runners import Runner, ort_runner
from pipeline.verify.gate import structural_checks
from pipeline.verify.lm_judge import (
    TokenAgreement,
    held_out_blocks,
    long_length,
    long_text,
    read_in_chunks,
    scored,
    teacher_forced,
    text_figures,
)
from pipeline.verify.policies import Policy
from pipeline.verify.report import GateReport, Row

SPEED_TOKENS = 16  # decode steps per timed generation
SPEED_SECONDS = 1.0  # timed steps per model, as latency.py times every other model


class DecoderJudge:
    """Judges variant files of one decoder against its model.onnx on held-out text (made once for all)."""

    def __init__(self, artifact: Artifact, reference: Path, data: Arrays, policy: Policy, lossless: Policy) -> None:
        generation = artifact.manifest.generation
        if generation is None:
            raise ArtifactError(f"{artifact.root}: a text-generation manifest without its generation record")
        self.cache = generation.cache
        self.policy, self.lossless = policy, lossless
        self.ids, self.mask = held_out_blocks(data)
        self.where = scored(self.mask)
        run = ort_runner(reference)
        self.want = teacher_forced(run, self.cache, self.ids, self.mask)
        # the held-out text repeated past every window and prefill chunk, read as pipe serve prefills it
        self.long = long_text(self.ids[self.mask == 1], long_length(self.cache, generation.context_length))
        self.want_long = read_in_chunks(run, self.cache, self.long)

    @property
    def source(self) -> str:
        return f"{len(self.ids)} held-out blocks, {int(self.where.sum())} next tokens, teacher-forced"

    def __call__(self, candidate: Path, policy: Policy | None = None, scratch: Path | None = None) -> Verdict:
        policy = policy or self.policy
        rows = structural_checks(candidate, scratch)
        try:
            runner = ort_runner(candidate)
        except ArtifactError as exc:
            rows.append(Row("onnxruntime load", "-", False, str(exc)))
            return Verdict(False, float("nan"), float("-inf"), f"onnxruntime load: {exc}", GateReport(rows))
        got = teacher_forced(runner, self.cache, self.ids, self.mask)
        if not np.isfinite(got).all():
            detail = f"{int((~np.isfinite(got)).sum())} NaN/Inf logits on the held-out text"
            rows.append(Row("teacher-forced next tokens", "logits", False, detail))
            return Verdict(False, float("nan"), float("-inf"), detail, GateReport(rows))
        figures = text_figures(got, self.want, self.ids, self.mask)
        if isinstance(policy, TokenAgreement):  # the figures text_figures measured, judged
            judged = policy.judge(figures.agreement, figures.kl)
            figure, margin, detail = figures.agreement, policy.margin(figures.agreement, figures.kl), judged.detail
        else:  # a graph-only variant: the logits themselves, element by element
            mine, theirs = got[self.where].astype(np.float64), self.want[self.where].astype(np.float64)
            judged = policy.compare(mine, theirs)
            worst = float(np.abs(mine - theirs).max(initial=0.0))
            figure, margin = worst, (0.0 if judged.passed else -worst)
            detail = f"logits max abs difference {worst:.3g} over {figures.tokens} positions"
        detail = f"{detail}; perplexity {figures.perplexity:.3f} (fp32 {figures.reference_perplexity:.3f})"
        rows.append(Row("teacher-forced next tokens", "logits", judged.passed, judged.detail or detail,
                        judged.max_abs, judged.max_rel, judged.share, judged.worst))  # fmt: skip
        rows.append(self._long_row(runner, policy, got[self.where]))
        rows.append(Row("perplexity (reported)", "-", True, f"{figures.perplexity:.4f}, fp32 "
                        f"{figures.reference_perplexity:.4f}, over {figures.tokens} next tokens"))  # fmt: skip
        metric = {
            "name": "perplexity",
            "reference": figures.reference_perplexity,
            "onnx": figures.perplexity,
            "difference": figures.perplexity - figures.reference_perplexity,
            "samples": figures.tokens,
            "agreement": figures.agreement,
            "kl": figures.kl,
        }
        passed = judged.passed and all(r.passed for r in rows)
        if not passed and judged.passed:
            detail = next(f"{r.check}: {r.detail}" for r in rows if not r.passed)
        return Verdict(passed, figure, margin, detail, GateReport(rows, metric))

    def _long_row(self, runner: Runner, policy: Policy, short: np.ndarray) -> Row:
        """The candidate on the long text against model.onnx: a variant right on short blocks and wrong past a
        window or a prefill chunk fails here. A lossy budget (token agreement) judges every next token read, the
        held-out blocks' (`short`, the candidate's logits there) and the long text's together: a few hundred
        positions of one repeated text alone are too few for its bound; a lossless one the long text's logits."""
        case = f"teacher-forced {len(self.long)} tokens"
        got = read_in_chunks(runner, self.cache, self.long)
        if not np.isfinite(got).all():
            return Row(case, "logits", False, f"{int((~np.isfinite(got)).sum())} NaN/Inf logits")
        if isinstance(policy, TokenAgreement):
            judged = policy.compare(
                np.concatenate([short, got]), np.concatenate([self.want[self.where], self.want_long])
            )
            detail = f"{judged.detail}, with the held-out blocks' {len(short)} next tokens"
        else:
            judged = policy.compare(got.astype(np.float64), self.want_long.astype(np.float64))
            detail = judged.detail or f"logits within tolerance over {len(self.long)} positions"
        return Row(case, "logits", judged.passed, detail, judged.max_abs, judged.max_rel, judged.share, judged.worst)


def time_decoders(artifact: Artifact, models: dict[str, Path], threads: int, progress: Say) -> dict[str, LmSpeed]:
    """Prefill and decode tokens/s of each decoder file, side by side, on the first golden prompt (batch 1)."""
    generation = artifact.manifest.generation
    if generation is None:
        raise ArtifactError(f"{artifact.root}: a text-generation manifest without its generation record")
    golden = load_golden(artifact).inputs
    ids, mask = golden["input_ids"][:1], golden["attention_mask"][:1]
    return measure_lm(ort_decoders(models, threads), generation.cache, ids, mask, SPEED_TOKENS, threads,
                      SPEED_SECONDS, progress=progress)  # fmt: skip


def speed_words(speed: LmSpeed, fp32: LmSpeed) -> str:
    """One sentence: the variant's prefill and decode tokens/s beside fp32's, faster or slower said plainly (within
    the search's noise band of 1: on par)."""

    def versus(mine: float, theirs: float) -> str:
        ratio = mine / theirs if theirs else float("nan")
        word = ("faster than fp32" if ratio >= 1 + NOISE else "SLOWER than fp32" if ratio <= 1 / (1 + NOISE)
                else f"on par with fp32 (within {NOISE:.0%}, timing noise)")  # fmt: skip
        return f"{mine:,.0f} tokens/s, {ratio:.2f}x fp32's {theirs:,.0f}: {word}"

    return (f"prefill {versus(speed.prefill_tokens_per_s, fp32.prefill_tokens_per_s)}; decode "
            f"{versus(speed.decode_tokens_per_s, fp32.decode_tokens_per_s)}")  # fmt: skip


def keep_smallest(made: list[Made], weight_kinds: set[str]) -> tuple[list[Made], str]:
    """`--quantize auto` for a decoder: of the weight-only variants made, the smallest that passed (none
    passed: the one nearest its budget, as failed); the others are dropped. Returns what is kept and why."""
    candidates = [m for m in made if m.name in weight_kinds and m.written]
    if not candidates:
        return made, ""
    passed = [m for m in candidates if m.verdict.passed]
    if passed:
        chosen = min(passed, key=lambda m: m.size or 0)
        why = f"auto keeps {chosen.name}: the smallest within budget ({(chosen.size or 0) / 2**20:.2f} MiB)"
    else:
        chosen = max(candidates, key=lambda m: m.verdict.margin)
        why = f"auto: no weight-only variant met the budget; {chosen.name} came nearest and is kept, as failed"
    dropped = [m.name for m in candidates if m is not chosen]
    if dropped:
        why += f"; dropped {', '.join(dropped)}"
    return [m for m in made if m.name not in weight_kinds or m is chosen], why
