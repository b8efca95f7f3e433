"""`pipe run RECIPE`: every stage in order, each skipped while the recipe sections it reads are unchanged.

Orchestration is a list of stage packages, each of whose `stage.py` holds its `STAGE` (the stage
contract, pipeline/stagekit/contract.py: a name, a freshness test, the function its own command
calls), so `pipe run` adds no behaviour of its own beyond choosing what to run, and adding a stage
is one package and one line in `STAGES`:

- train is up to date when a version records the same settings (the recipe's name, task, model,
  data and train sections, as trained: a `--epochs` override is not the recipe) and the same
  dataset fingerprint; editing `export:` never retrains.
- export is up to date when that version records an export with the recipe's `export:` section
  as it is now, from the weights it holds now, and a passed fp32 variant.
- optimize is up to date when its record has the recipe's `optimize:` section as it is now, was
  made from the model.onnx the version holds now, and every variant it made is still recorded.
- edge likewise, with the `edge:` section; it is skipped when the recipe says `edge.enabled: false`.
- check runs when a baseline is committed beside the recipe (`models/NAME.baseline.json`); it is up
  to date while its last verdict passed on the same baseline, model summary and budgets.
- benchmark is up to date while the files it timed are the files the version holds.
- report (the model card and training curves) is up to date while what it shows is unchanged.

A stage that finds the model wrong (an edge model failing its check, a regression against the
baseline) does not stop the run: the stages after it still run, so the benchmark and the model
card show the failure, and the run exits 1 at the end. Bad input and a failed export stop at once.
The run ends with a summary: what ran, what was up to date or turned off, what failed, and where
each output is.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pipeline.artifact.directory import Artifact
from pipeline.artifact.variants import EDGE_PREFIX, FP32, MODEL_FILE
from pipeline.core.errors import CheckFailed
from pipeline.recipe.file import load_recipe
from pipeline.stagekit.contract import Context, Stage

# The stage packages in the order `pipe run` walks them; each one's `stage.py` holds its STAGE.
STAGES = ("train", "export", "optimize", "edge", "check", "benchmark", "report")


def stage_of(name: str) -> Stage:
    """The STAGE of stage package `name`, imported when the run reaches it (train imports torch)."""
    return importlib.import_module(f"pipeline.{name}.stage").STAGE


@dataclass
class StageResult:
    stage: str
    state: Literal["ran", "up to date", "off", "failed"]
    detail: str
    seconds: float = 0.0  # wall time of its work (0 when it did not run)


@dataclass
class RunSummary:
    root: Path  # the artifact version the run ended on
    stages: list[StageResult] = field(default_factory=list)

    @property
    def failed(self) -> list[StageResult]:
        return [r for r in self.stages if r.state == "failed"]


def run_recipe(
    recipe_path: str | Path,
    *,
    out_root: Path = Path("artifacts"),
    force: bool = False,
    progress: Callable[[str], None] = print,
) -> RunSummary:
    """Run each stage unless its output is up to date, verify the finished artifact end to end, and
    print the summary; CheckFailed (exit 1) after the summary when a stage found the model wrong."""
    ctx = Context(load_recipe(recipe_path), Path(recipe_path), Path(out_root), progress)
    results = []
    for stage in map(stage_of, STAGES):
        off = stage.off(ctx)
        reason = off or (None if force else stage.fresh(ctx))
        if reason is not None:
            result = StageResult(stage.name, "off" if off else "up to date", reason)
        else:
            progress(f"[{stage.name}] running")
            started = time.perf_counter()
            try:
                result = StageResult(stage.name, "ran", stage.run(ctx))
            except CheckFailed as exc:
                if not stage.judges:
                    raise
                result = StageResult(stage.name, "failed", str(exc))
            result.seconds = time.perf_counter() - started
        shown = {"ran": "done", "off": "skipped"}.get(result.state, result.state)
        progress(f"[{stage.name}] {shown}: {result.detail.splitlines()[0]}")
        results.append(result)

    assert ctx.root is not None
    artifact = Artifact.load(ctx.root)  # the finished artifact verifies end to end
    summary = RunSummary(ctx.root, results)
    progress(summary_text(summary, artifact))
    if summary.failed:
        names = ", ".join(r.stage for r in summary.failed)
        raise CheckFailed(f"pipe run: {names} failed for {ctx.root} (see the summary above)")
    return summary


def summary_text(summary: RunSummary, artifact: Artifact) -> str:
    """The end of a run: each stage's state and time, the metrics, and where every output is."""
    manifest, root = artifact.manifest, summary.root
    total = sum(r.seconds for r in summary.stages)
    lines = ["", f"pipe run: {manifest.name} v{manifest.version} in {root} ({total:.1f} s of work)"]
    for r in summary.stages:
        first, *rest = r.detail.splitlines() or [""]
        took = f"{r.seconds:6.1f} s" if r.state in ("ran", "failed") else " " * 8
        lines.append(f"  {r.stage:<10} {r.state:<10} {took}  {first}")
        lines += [f"  {'':<30}  {line.strip()}" for line in rest]
    metrics = "  ".join(f"{k}={v:.4f}" for k, v in sorted(manifest.metrics.items()))
    lines.append(f"  {'metrics':<10} {metrics or 'none recorded'}")
    for label, value in _outputs(artifact):
        lines.append(f"  {label:<10} {value}")
    return "\n".join(lines)


def _outputs(artifact: Artifact) -> list[tuple[str, str]]:
    """Where each output of the run is, by kind, for the summary."""
    files, root = artifact.manifest.files, artifact.root
    variants = [name for name, v in artifact.manifest.variants.items() if name != FP32]
    onnx = [v for v in variants if not v.startswith(EDGE_PREFIX)]
    edge = [v for v in variants if v.startswith(EDGE_PREFIX)]
    shown = [("model", str(root / MODEL_FILE))]
    if onnx:
        shown.append(("variants", f"{', '.join(onnx)} in {root / 'variants'}"))
    if edge:
        shown.append(("edge", f"{', '.join(edge)} in {root / 'edge'}"))
    for label, rel in (
        ("card", "reports/model-card.md"),
        ("curves", "reports/training-curves.png"),
        ("benchmark", "reports/benchmark.png"),
        ("check", "reports/check.md"),
    ):
        if rel in files:
            shown.append((label, str(root / rel)))
    if any(f.startswith("reports/tensorboard/") for f in files):
        shown.append(("logs", f"tensorboard --logdir {root / 'reports' / 'tensorboard'}"))
    shown.append(("serve it", f"pipe serve {root.parent}"))
    return shown
