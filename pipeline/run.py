"""`pipe run RECIPE`: every stage in order, each skipped while the recipe sections it reads are unchanged.

Orchestration is a list of stages, each with a name, a freshness test and the function its own
command calls, so `pipe run` adds no behaviour of its own beyond choosing what to run, and adding
a stage is one line in `STAGES`:

- train is up to date when a version records the same settings (the recipe's name, task, model,
  data and train sections, as trained: a `--epochs` override is not the recipe) and the same
  dataset fingerprint; editing `export:` never retrains.
- export is up to date when that version records an export with the recipe's `export:` section
  as it is now, from the weights it holds now, and a passed fp32 variant.
- optimize is up to date when its record has the recipe's `optimize:` section as it is now, was
  made from the model.onnx the version holds now, and every variant it made is still recorded.
- edge likewise, with the `edge:` section; it is skipped when the recipe says `edge.enabled: false`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.artifact import Artifact, version_dirs
from pipeline.errors import ArtifactError
from pipeline.recipe import Recipe, load_recipe, stage_settings
from pipeline.records import settings_digest
from pipeline.variants import FP32, MODEL_FILE


@dataclass
class Context:
    """What the stages of one run share: the recipe, where artifacts go, and the version worked on."""

    recipe: Recipe
    recipe_path: Path
    out_root: Path
    echo: Callable[[str], None]
    root: Path | None = None  # the artifact version; set by train (ran or found up to date)


@dataclass(frozen=True)
class Stage:
    name: str
    fresh: Callable[[Context], str | None]  # why the stage's output is up to date, or None to run it
    run: Callable[[Context], str]  # do the work; returns what it made
    off: Callable[[Context], str | None] = lambda ctx: None  # why the recipe turns it off (even with --force)


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
    """The newest version trained from exactly this recipe's training sections and data, if any."""
    from pipeline.data.sources import read_source
    from pipeline.data.splits import fingerprint

    found = version_dirs(out_root / recipe.name)
    if not found:
        return None
    wanted = settings_digest(stage_settings(recipe, "train"))
    data_fingerprint = fingerprint(read_source(recipe))
    for root in reversed(found.values()):
        try:
            record = Artifact.load(root, verify=False).manifest.stages.train
        except ArtifactError:  # a damaged or hand-broken version is never up to date; `pipe info` says why
            continue
        if record is not None and record.settings_digest() == wanted and record.inputs.get("data") == data_fingerprint:
            return root
    return None


def _train_fresh(ctx: Context) -> str | None:
    ctx.root = up_to_date_version(ctx.recipe, ctx.out_root)
    return None if ctx.root is None else f"{ctx.root} was trained from these sections and data"


def _train_run(ctx: Context) -> str:
    from pipeline.train.run import train_recipe

    ctx.root = train_recipe(ctx.recipe_path, out_root=ctx.out_root)
    return str(ctx.root)


def _export_fresh(ctx: Context) -> str | None:
    assert ctx.root is not None  # train ran or was found up to date first
    manifest = Artifact.load(ctx.root, verify=False).manifest
    record, variant = manifest.stages.export, manifest.variants.get(FP32)
    if record is None or variant is None or not variant.passed or MODEL_FILE not in manifest.files:
        return None
    weights = manifest.stages.train.checkpoint.weights if manifest.stages.train else None
    same_weights = weights in manifest.files and record.inputs.get(weights) == manifest.files[weights].sha256
    same_settings = record.settings_digest() == settings_digest(ctx.recipe.export.model_dump(mode="json"))
    return "model.onnx passed the parity gate with these export settings" if same_weights and same_settings else None


def _export_run(ctx: Context) -> str:
    from pipeline.export.stage import export_artifact

    outcome = export_artifact(ctx.root, recipe_path=ctx.recipe_path)
    ctx.echo(outcome.report.table())
    return f"{ctx.root / MODEL_FILE} (opset {outcome.result.opset})"


def _derived_fresh(ctx: Context, stage: str, what: str) -> str | None:
    """Up to date when the stage's record has the recipe's section as it is now, was made from the model.onnx
    the version holds now, and every variant it made is still recorded and none failed fatally."""
    assert ctx.root is not None
    manifest = Artifact.load(ctx.root, verify=False).manifest
    record = getattr(manifest.stages, stage)
    if record is None or MODEL_FILE not in manifest.files or record.parent != manifest.files[MODEL_FILE].sha256:
        return None  # never ran, or model.onnx was exported again since
    if record.settings_digest() != settings_digest(getattr(ctx.recipe, stage).model_dump(mode="json")):
        return None
    if any(name not in manifest.variants for name in record.variants):
        return None
    if stage == "edge" and (record.failed or not record.variants):
        return None  # a failed edge model fails the run again (exit 1) rather than pass as up to date
    return f"its {what} ({', '.join(record.variants)}) were made from this model.onnx with these settings"


def _optimize_fresh(ctx: Context) -> str | None:
    return _derived_fresh(ctx, "optimize", "variants")


def _optimize_run(ctx: Context) -> str:
    from pipeline.optimize.stage import optimize_artifact

    outcome = optimize_artifact(ctx.root, recipe_path=ctx.recipe_path, say=ctx.echo)
    failed = f"; failed their budget (not served): {', '.join(outcome.failed)}" if outcome.failed else ""
    return f"{', '.join(m.name for m in outcome.made)} in {ctx.root / 'variants'}{failed}"


def _edge_fresh(ctx: Context) -> str | None:
    return _derived_fresh(ctx, "edge", "edge models")


def _edge_run(ctx: Context) -> str:
    from pipeline.edge.stage import edge_artifact

    outcome = edge_artifact(ctx.root, recipe_path=ctx.recipe_path, say=ctx.echo)
    return f"{', '.join(m.name for m in outcome.made)} in {ctx.root / 'edge'}"


STAGES = [
    Stage("train", _train_fresh, _train_run),
    Stage("export", _export_fresh, _export_run),
    Stage("optimize", _optimize_fresh, _optimize_run),
    Stage("edge", _edge_fresh, _edge_run, lambda ctx: None if ctx.recipe.edge.enabled else "edge.enabled: false"),
]


def run_recipe(
    recipe_path: str | Path,
    *,
    out_root: Path = Path("artifacts"),
    force: bool = False,
    echo: Callable[[str], None] = print,
) -> RunSummary:
    """Run each stage unless its output is up to date; verify the finished artifact end to end."""
    ctx = Context(load_recipe(recipe_path), Path(recipe_path), Path(out_root), echo)
    results = []
    for stage in STAGES:
        off = stage.off(ctx)
        reason = off or (None if force else stage.fresh(ctx))
        if reason is None:
            echo(f"[{stage.name}] running")
            result = StageResult(stage.name, True, stage.run(ctx))
        else:
            result = StageResult(stage.name, False, reason)
        state = "done" if result.ran else "skipped" if off else "up to date"
        echo(f"[{stage.name}] {state}: {result.detail}")
        results.append(result)

    assert ctx.root is not None
    artifact = Artifact.load(ctx.root)  # the finished artifact verifies end to end
    metrics = "  ".join(f"{k}={v:.4f}" for k, v in sorted(artifact.manifest.metrics.items()))
    echo(f"[done] {ctx.root}  {metrics}")
    return RunSummary(ctx.root, results)
