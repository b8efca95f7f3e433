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

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pipeline.artifact.directory import Artifact, version_dirs
from pipeline.artifact.records import settings_digest
from pipeline.artifact.variants import FP32, MODEL_FILE
from pipeline.core.errors import ArtifactError, CheckFailed
from pipeline.recipe.file import load_recipe
from pipeline.recipe.schema import Recipe, stage_settings


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
    off: Callable[[Context], str | None] = lambda ctx: None  # why it does not apply (even with --force)
    judges: bool = False  # a CheckFailed here is recorded and the later stages still run (see the module doc)


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
    from pipeline.train.stage import train_recipe

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


def _baseline(ctx: Context) -> Path:
    from pipeline.check.stage import committed_baseline

    return committed_baseline(ctx.recipe_path, ctx.recipe.name)


def _check_off(ctx: Context) -> str | None:
    baseline = _baseline(ctx)
    if baseline.is_file():
        return None
    return f"no baseline committed at {baseline} (write one: pipe check ARTIFACT --write-baseline {baseline})"


def _check_fresh(ctx: Context) -> str | None:
    from pipeline.check.stage import check_fresh

    assert ctx.root is not None
    return check_fresh(ctx.root, _baseline(ctx))


def _check_run(ctx: Context) -> str:
    from pipeline.check.reports import to_table
    from pipeline.check.stage import check_stage

    outcome = check_stage(ctx.root, _baseline(ctx))
    ctx.echo(to_table(outcome.run))
    outcome.run.raise_on_failure()
    return f"{len(outcome.run.results)} checks hold against {_baseline(ctx)}; {outcome.reports[1]}"


def _benchmark_fresh(ctx: Context) -> str | None:
    """Up to date while it timed the files the version holds, with the recipe's `benchmark:` settings."""
    from pipeline.benchmark.stage import benchmark_fresh

    record, wanted = Artifact.load(ctx.root, verify=False).manifest.stages.benchmark, ctx.recipe.benchmark
    same = record is not None and [record.settings.get(k) for k in ("seconds", "threads")] == [
        wanted.seconds,
        wanted.threads,
    ]
    return benchmark_fresh(ctx.root) if same else None


def _benchmark_run(ctx: Context) -> str:
    from pipeline.benchmark.stage import benchmark_artifact

    wanted = ctx.recipe.benchmark
    benchmark_artifact(ctx.root, seconds=wanted.seconds, threads=wanted.threads, say=ctx.echo)
    return str(ctx.root / "reports" / "benchmark.json")


def _report_fresh(ctx: Context) -> str | None:
    from pipeline.report.stage import report_fresh

    return report_fresh(ctx.root)


def _report_run(ctx: Context) -> str:
    from pipeline.report.stage import report_artifact

    report_artifact(ctx.root, say=ctx.echo)
    return str(ctx.root / "reports" / "model-card.md")


STAGES = [
    Stage("train", _train_fresh, _train_run),
    Stage("export", _export_fresh, _export_run),
    Stage("optimize", _optimize_fresh, _optimize_run),
    Stage(
        "edge",
        _edge_fresh,
        _edge_run,
        lambda ctx: None if ctx.recipe.edge.enabled else "edge.enabled: false",
        judges=True,
    ),
    Stage("check", _check_fresh, _check_run, _check_off, judges=True),
    Stage(
        "benchmark",
        _benchmark_fresh,
        _benchmark_run,
        lambda ctx: None if ctx.recipe.benchmark.enabled else "benchmark.enabled: false",
    ),
    Stage("report", _report_fresh, _report_run),
]


def run_recipe(
    recipe_path: str | Path,
    *,
    out_root: Path = Path("artifacts"),
    force: bool = False,
    echo: Callable[[str], None] = print,
) -> RunSummary:
    """Run each stage unless its output is up to date, verify the finished artifact end to end, and
    print the summary; CheckFailed (exit 1) after the summary when a stage found the model wrong."""
    ctx = Context(load_recipe(recipe_path), Path(recipe_path), Path(out_root), echo)
    results = []
    for stage in STAGES:
        off = stage.off(ctx)
        reason = off or (None if force else stage.fresh(ctx))
        if reason is not None:
            result = StageResult(stage.name, "off" if off else "up to date", reason)
        else:
            echo(f"[{stage.name}] running")
            started = time.perf_counter()
            try:
                result = StageResult(stage.name, "ran", stage.run(ctx))
            except CheckFailed as exc:
                if not stage.judges:
                    raise
                result = StageResult(stage.name, "failed", str(exc))
            result.seconds = time.perf_counter() - started
        shown = {"ran": "done", "off": "skipped"}.get(result.state, result.state)
        echo(f"[{stage.name}] {shown}: {result.detail.splitlines()[0]}")
        results.append(result)

    assert ctx.root is not None
    artifact = Artifact.load(ctx.root)  # the finished artifact verifies end to end
    summary = RunSummary(ctx.root, results)
    echo(summary_text(summary, artifact))
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
    onnx = [v for v in variants if not v.startswith("tflite-")]
    edge = [v for v in variants if v.startswith("tflite-")]
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
