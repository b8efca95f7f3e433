"""`pipe run RECIPE`: every stage in order, skipping those whose output is already up to date.

A trained version is up to date when its manifest records the same recipe digest and dataset
fingerprint as the recipe and data on disk now, and was trained from the recipe as written (not
with `pipe train --epochs N`, which keeps the file's digest); its export is up to date when the manifest records
an export stage and lists model.onnx (the export stage only records both after the parity gate
passed). Each stage is the same function its own command calls, so `pipe run` adds no behaviour
of its own beyond choosing what to run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.artifact import Artifact, versions
from pipeline.recipe import Recipe, load_recipe


@dataclass
class StageResult:
    stage: str
    ran: bool  # False: skipped because its output was up to date
    detail: str


@dataclass
class RunSummary:
    root: Path  # the artifact version the run ended on
    stages: list[StageResult] = field(default_factory=list)


def up_to_date_version(recipe: Recipe, out_root: Path) -> Path | None:
    """The newest complete version trained from exactly this recipe and data, if any."""
    from pipeline.data.sources import read_source
    from pipeline.data.splits import fingerprint

    model_root = out_root / recipe.name
    found = versions(model_root)
    if not found:
        return None
    data_fingerprint = fingerprint(read_source(recipe))
    as_written = recipe.model_dump(mode="json")
    for number in reversed(found):
        manifest = Artifact.load(model_root / str(number), verify=False).manifest
        if (
            manifest.lineage.recipe_digest == recipe.digest
            and manifest.lineage.dataset_fingerprint == data_fingerprint
            and manifest.stages.get("train", {}).get("recipe") == as_written
        ):
            return model_root / str(number)
    return None


def is_exported(root: Path) -> bool:
    manifest = Artifact.load(root, verify=False).manifest
    return "export" in manifest.stages and "model.onnx" in manifest.files


def run_recipe(
    recipe_path: str | Path,
    *,
    out_root: Path = Path("artifacts"),
    force: bool = False,
    echo: Callable[[str], None] = print,
) -> RunSummary:
    """Train (unless up to date) then export (unless already exported); verify the result."""
    from pipeline.export.stage import export_artifact
    from pipeline.train.run import train_recipe

    recipe = load_recipe(recipe_path)
    existing = None if force else up_to_date_version(recipe, out_root)
    if existing is not None:
        root = existing
        train = StageResult("train", False, f"{root} was trained from this recipe and data")
    else:
        echo(f"[train] {recipe_path}")
        root = train_recipe(recipe_path, out_root=out_root)
        train = StageResult("train", True, str(root))
    summary = RunSummary(root, [train])
    echo(f"[train] {'done' if train.ran else 'up to date'}: {train.detail}")

    if not force and is_exported(root):
        summary.stages.append(StageResult("export", False, "model.onnx passed the parity gate earlier"))
    else:
        echo(f"[export] {root}")
        outcome = export_artifact(root)
        echo(outcome.report.table())
        summary.stages.append(StageResult("export", True, f"{root / 'model.onnx'} (opset {outcome.result.opset})"))
    echo(f"[export] {'done' if summary.stages[-1].ran else 'up to date'}: {summary.stages[-1].detail}")

    artifact = Artifact.load(root)  # the finished artifact verifies end to end
    metrics = "  ".join(f"{k}={v:.4f}" for k, v in sorted(artifact.manifest.metrics.items()))
    echo(f"[done] {root}  {metrics}")
    return summary
