"""The check as a stage of `pipe run`: the artifact against the baseline committed beside its recipe.

`pipe run models/NAME.yaml` checks the version it ends on against `models/NAME.baseline.json` when
that file exists (written by `pipe check ARTIFACT --write-baseline models/NAME.baseline.json`). The
verdict is kept in the artifact, as any stage's output: reports/check.json, .md and .xml and a
`check` record whose inputs are the baseline file's sha256 and the digest of what the checks read
of the candidate (its summary), and whose settings are the budgets. The stage is up to date while
those are unchanged and the last verdict passed; a failed verdict is never up to date, so every
run that ends on a regressed model fails again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline.artifact.directory import Artifact
from pipeline.artifact.records import CheckRecord
from pipeline.artifact.stagewrite import StageWrite
from pipeline.check.baseline import summarize
from pipeline.check.reports import to_json, to_junit, to_markdown, to_table
from pipeline.check.verdict import CheckRun, budgets_for, check_candidate
from pipeline.core.fsutil import sha256_file
from pipeline.core.jsontypes import encode
from pipeline.stagekit.contract import Context, Stage, lm_off

REPORTS: dict[str, Callable[[CheckRun], str]] = {
    "reports/check.json": to_json,
    "reports/check.md": to_markdown,
    "reports/check.xml": to_junit,
}


def committed_baseline(recipe_path: Path, name: str) -> Path:
    """Where a repository commits the baseline of recipe `name`: beside the recipe."""
    return Path(recipe_path).parent / f"{name}.baseline.json"


@dataclass(frozen=True)
class CheckOutcome:
    run: CheckRun
    reports: list[Path]


def _inputs(artifact: Artifact, baseline: Path) -> dict[str, str]:
    summary = json.dumps(encode(summarize(artifact)), sort_keys=True, separators=(",", ":"))
    return {"baseline": sha256_file(baseline), "candidate": hashlib.sha256(summary.encode()).hexdigest()}


def _settings(artifact: Artifact) -> dict[str, object]:
    return budgets_for(artifact, {})[0].model_dump(mode="json")


def check_fresh(root: Path, baseline: Path) -> str | None:
    """Why the kept verdict still holds (it passed, on the same baseline, summary and budgets), or None."""
    artifact = Artifact.load(root, verify=False)
    record = artifact.manifest.stages.check
    if record is None or not record.passed:
        return None
    if record.inputs != _inputs(artifact, baseline) or record.settings != _settings(artifact):
        return None
    return f"it passed against {baseline} with this model and these budgets"


def check_stage(root: Path, baseline: Path, *, latency_seconds: float = 2.0) -> CheckOutcome:
    """Check the artifact at `root` against `baseline` and keep the verdict in the artifact.

    The verdict is recorded whether it passed or not; the caller decides what a failure means
    (`pipe run` fails the run with exit 1 after its other stages).
    """
    run = check_candidate(root, baseline, latency_seconds=latency_seconds)
    artifact = Artifact.load(root, verify=False)
    inputs, settings = _inputs(artifact, baseline), _settings(artifact)
    with StageWrite(root, "check") as write:
        for rel, render in REPORTS.items():
            path = write.scratch / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(render(run), encoding="utf-8")

        def record(fresh: Artifact) -> None:
            fresh.manifest.stages.check = CheckRecord(
                settings=settings,
                inputs=inputs,
                baseline=str(baseline),
                passed=not run.failures,
                failures=[r.name for r in run.failures],
                reports=list(REPORTS),
            )

        write.commit(list(REPORTS), record)
    return CheckOutcome(run, [Path(root) / rel for rel in REPORTS])


def _baseline(ctx: Context) -> Path:
    return committed_baseline(ctx.recipe_path, ctx.recipe.name)


def _off(ctx: Context) -> str | None:
    if refused := lm_off("check")(ctx):
        return refused
    baseline = _baseline(ctx)
    if baseline.is_file():
        return None
    return f"no baseline committed at {baseline} (write one: pipe check ARTIFACT --write-baseline {baseline})"


def _fresh(ctx: Context) -> str | None:
    return check_fresh(ctx.version, _baseline(ctx))


def _run(ctx: Context) -> str:
    outcome = check_stage(ctx.version, _baseline(ctx))
    ctx.progress(to_table(outcome.run))
    outcome.run.raise_on_failure()
    return f"{len(outcome.run.results)} checks hold against {_baseline(ctx)}; {outcome.reports[1]}"


STAGE = Stage("check", _fresh, _run, _off, judges=True)
