"""`pipe check CANDIDATE --baseline BASELINE`: all checks run, then a verdict (exit 0, or 1 naming each regression)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.artifact import Artifact, resolve_artifact
from pipeline.artifact_recipe import current_recipe, section_settings
from pipeline.check.baseline import Baseline, load_baseline, summarize
from pipeline.check.checks import CheckResult, check_metrics, check_signature, check_size, check_variants
from pipeline.check.latency import time_side_by_side
from pipeline.errors import CheckFailed, InputError
from pipeline.recipe import BudgetSpec
from pipeline.variants import MODEL_FILE


@dataclass(frozen=True)
class CheckRun:
    """The outcome: the two sides, the budgets held to, and every check's result in order."""

    candidate: Baseline
    baseline: Baseline
    budgets: BudgetSpec
    results: list[CheckResult]
    notes: list[str]

    @property
    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if r.failed]

    def raise_on_failure(self) -> None:
        """CheckFailed (exit 1) naming every regression with its numbers."""
        if failed := self.failures:
            lines = "\n".join(f"  {r.name}: {r.detail}" for r in failed)
            raise CheckFailed(f"{len(failed)} of {len(self.results)} checks failed:\n{lines}")


def check_candidate(
    candidate_path: str | Path,
    baseline_path: str | Path,
    overrides: dict[str, Any] | None = None,
    latency_seconds: float = 2.0,
) -> CheckRun:
    """Run every check of the candidate artifact against the baseline (an artifact or a baseline .json)."""
    baseline, baseline_artifact = load_baseline(baseline_path)
    artifact = Artifact.load(resolve_artifact(candidate_path))
    candidate = summarize(artifact)
    if candidate.task != baseline.task:
        raise InputError(
            f"candidate {artifact.root} is a {candidate.task} model, the baseline {baseline_path} a {baseline.task} "
            "model: there is nothing to compare; pass a baseline of the same task"
        )
    budgets, notes = budgets_for(artifact, overrides or {})
    if candidate.name != baseline.name:
        notes.append(f"the candidate is {candidate.name!r}, the baseline {baseline.name!r}")
    results = [
        *check_metrics(candidate, baseline, budgets),
        *check_variants(candidate, baseline, budgets),
        *check_signature(candidate, baseline),
        check_size(candidate, baseline, budgets),
        check_latency(artifact, baseline_artifact, budgets, latency_seconds),
    ]
    return CheckRun(candidate, baseline, budgets, results, notes)


def budgets_for(artifact: Artifact, overrides: dict[str, Any]) -> tuple[BudgetSpec, list[str]]:
    """The recipe's `budgets:` when the candidate was trained here, else the defaults; flags on top."""
    recipe, notes = (None, []) if artifact.manifest.stages.train is None else current_recipe(artifact)
    return section_settings(recipe, "budgets", overrides), list(notes)


def check_latency(artifact: Artifact, baseline: Artifact | None, budgets: BudgetSpec, seconds: float) -> CheckResult:
    """The candidate's model.onnx timed beside the baseline's in this run: p50 ratio within 1 + max_latency_increase."""
    if baseline is None:
        why = "the baseline is a JSON summary: latency is only compared side by side with a baseline artifact"
        return CheckResult("latency", "skipped", why)
    timed = time_side_by_side(baseline.path(MODEL_FILE), artifact.path(MODEL_FILE), seconds)
    limit = 1 + budgets.max_latency_increase
    return CheckResult(
        "latency",
        "passed" if timed.ratio <= limit else "failed",
        f"p50 at batch 1 {timed.baseline_p50_ms:.4g} -> {timed.candidate_p50_ms:.4g} ms side by side: "
        f"x{timed.ratio:.3f} (budget x{limit:.3f}, {timed.rounds} rounds)",
        {"baseline_ms": timed.baseline_p50_ms, "candidate_ms": timed.candidate_p50_ms, "ratio": timed.ratio,
         "budget": limit, "rounds": timed.rounds},
    )  # fmt: skip
