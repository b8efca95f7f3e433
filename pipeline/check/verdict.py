"""`pipe check CANDIDATE --baseline BASELINE`: all checks run, then a verdict (exit 0, or 1 naming each regression)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.artifact.directory import Artifact, resolve_artifact
from pipeline.artifact.golden import load_golden
from pipeline.artifact.variants import MODEL_FILE
from pipeline.check.baseline import Baseline, load_baseline, summarize
from pipeline.check.checks import CheckResult, check_metrics, check_signature, check_size, check_variants
from pipeline.check.lm_checks import check_decoder
from pipeline.core.errors import ArtifactError, CheckFailed, InputError
from pipeline.recipe.budgets import BudgetSpec
from pipeline.recipe.current import current_recipe, section_settings
from pipeline.runtime.latency import measure
from pipeline.samples.evaluation import GENERATED_NOTE, judged_on_generated
from pipeline.stagekit.contract import lm_refusal


@dataclass(frozen=True)
class CheckRun:
    """The outcome: the two sides, the budgets held to, and every check's result in order."""

    candidate: Baseline
    baseline: Baseline
    budgets: BudgetSpec
    results: list[CheckResult]
    notes: list[str]
    # which side is which, as the user named them: {"candidate": path, "baseline": path} and what each is
    sides: dict[str, str] = field(default_factory=dict)
    recipe_changes: list[str] = field(default_factory=list)  # both artifacts: "train.lr 0.003 -> 0.01", ...

    def side(self, which: str) -> str:
        """`art/house/2 (house v2, an artifact)`: one side by the path it was given, its name and version."""
        summary = self.candidate if which == "candidate" else self.baseline
        path = self.sides.get(which, "")
        kind = "a baseline file" if path.endswith(".json") else "an artifact"
        return f"{path} ({summary.name} v{summary.version}, {kind})" if path else f"{summary.name} v{summary.version}"

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
    refused = lm_refusal("check", artifact.manifest.task, artifact.root)
    if refused:
        raise InputError(refused)
    candidate = summarize(artifact)
    if candidate.task != baseline.task:
        raise InputError(
            f"candidate {artifact.root} is a {candidate.task} model, the baseline {baseline_path} a {baseline.task} "
            "model: there is nothing to compare; pass a baseline of the same task"
        )
    budgets, notes = budgets_for(artifact, overrides or {})
    if candidate.name != baseline.name:
        notes.append(f"the candidate is {candidate.name!r}, the baseline {baseline.name!r}")
    if judged_on_generated(artifact.manifest):  # its variants' figures are agreement on noise
        notes.append(f"the candidate's variants were {GENERATED_NOTE}")
    generating = artifact.manifest.task == "text-generation"  # a decoder: its text compared (lm_checks.py)
    results = [
        *check_metrics(candidate, baseline, budgets),
        *(check_decoder(artifact, baseline_artifact, budgets) if generating else []),
        *check_variants(candidate, baseline, budgets),
        *check_signature(candidate, baseline),
        check_size(candidate, baseline, budgets),
        check_latency(artifact, baseline_artifact, budgets, latency_seconds),
    ]
    sides = {"candidate": str(candidate_path), "baseline": str(baseline_path)}
    changes = recipe_changes(artifact, baseline_artifact)
    return CheckRun(candidate, baseline, budgets, results, notes, sides, changes)


RECIPE_CHANGES_SHOWN = 20  # differing recipe keys listed before "and N more"


def recipe_changes(candidate: Artifact, baseline: Artifact | None) -> list[str]:
    """The recipe keys the two were trained with that differ, as `train.lr 0.003 -> 0.01`: what a reviewer
    asks first when a metric moved. Empty when either side was not trained here or is a baseline file."""
    trained = [a.manifest.stages.train for a in (baseline, candidate) if a is not None]
    if len(trained) != 2 or any(t is None for t in trained):
        return []
    before, after = (_flat(t.settings) for t in trained)  # type: ignore[union-attr]
    missing = "(unset)"
    changed = [
        f"{key} {before.get(key, missing)!s} -> {after.get(key, missing)!s}"
        for key in sorted(set(before) | set(after))
        if before.get(key, missing) != after.get(key, missing)
    ]
    if len(changed) > RECIPE_CHANGES_SHOWN:
        changed = [*changed[:RECIPE_CHANGES_SHOWN], f"and {len(changed) - RECIPE_CHANGES_SHOWN} more"]
    return changed


def _flat(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"train": {"lr": 0.01}} -> {"train.lr": 0.01}"""
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def budgets_for(artifact: Artifact, overrides: dict[str, Any]) -> tuple[BudgetSpec, list[str]]:
    """The recipe's `budgets:` when the candidate was trained here, else the defaults; flags on top."""
    recipe, notes = (None, []) if artifact.manifest.stages.train is None else current_recipe(artifact)
    return section_settings(recipe, "budgets", overrides), list(notes)


LATENCY_MEASURES = 3  # at most: a ratio past the budget is measured again, twice, and the median judged
MAX_RUNS = 1_000_000  # runs per model: high enough that --latency-seconds, not a count, ends a fast model's timing


def check_latency(artifact: Artifact, baseline: Artifact | None, budgets: BudgetSpec, seconds: float) -> CheckResult:
    """The candidate's model.onnx timed beside the baseline's in this run: p50 ratio within 1 + max_latency_increase.

    One measurement decides a pass. A ratio past the budget is measured again in two fresh windows
    (new sessions) and the median of the three ratios decides: a burst of load from elsewhere that
    lands on one model in one window does not fail the gate, while a model that is really slower is
    slower in every window.
    """
    if baseline is None:
        why = "the baseline is a JSON summary: latency is only compared side by side with a baseline artifact"
        return CheckResult("latency", "skipped", why)
    models = {"baseline": baseline.path(MODEL_FILE), "candidate": artifact.path(MODEL_FILE)}
    inputs, limit = load_golden(artifact).inputs, 1 + budgets.max_latency_increase
    timings: list[tuple[float, float, float, int, int]] = []  # (ratio, baseline p50, candidate p50, runs, batch)
    while len(timings) < LATENCY_MEASURES and (not timings or timings[0][0] > limit):
        try:  # the candidate's golden inputs, both models in one interleaved run (pipeline/runtime/latency.py)
            timed = measure(models, inputs, batches=(1,), threads=1, seconds=seconds, max_runs=MAX_RUNS)
            base, cand = timed["baseline"], timed["candidate"]
            batch = base.fixed_batch or cand.fixed_batch or 1
            b, c = base.at(batch).p50_ms, cand.at(batch).p50_ms  # two different fixed batches: no shared one
        except (InputError, ArtifactError) as exc:  # e.g. a renamed input: the signature check reports that
            return CheckResult("latency", "skipped", f"the two models cannot be timed on the same inputs: {exc}")
        timings.append((c / b, b, c, cand.at(batch).runs, batch))
    ratio, base_ms, cand_ms, runs, batch = sorted(timings)[len(timings) // 2]  # the median measurement
    ratios = [t[0] for t in timings]
    again = (
        f", the median of {len(ratios)} measurements x{', x'.join(f'{r:.3f}' for r in ratios)}"
        if len(ratios) > 1
        else ""
    )
    return CheckResult(
        "latency",
        "passed" if ratio <= limit else "failed",
        f"p50 at batch {batch} {base_ms:.4g} -> {cand_ms:.4g} ms side by side: x{ratio:.3f} "
        f"(budget x{limit:.3f}, {runs} runs each{again})",
        {"baseline_ms": base_ms, "candidate_ms": cand_ms, "ratio": ratio, "budget": limit, "runs": runs,
         "ratios": ratios},
    )  # fmt: skip
