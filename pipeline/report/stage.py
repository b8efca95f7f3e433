"""`pipe report ARTIFACT`: the model card and the training curves, written into the artifact.

The stage reads the artifact (verified), the recipe it was trained from as that file is now (its
description and `budgets:`), reports/train.json and reports/metrics.jsonl (the curves) and
reports/benchmark.json (when `pipe benchmark` ran); it draws reports/training-curves.png (trained
artifacts only) and writes reports/model-card.md through `StageWrite`, so both are listed in the
manifest with their hashes and an interrupted run leaves no half file. The `ReportRecord`'s
`inputs` are the digests of everything the card shows, so `report_fresh` can tell when the card
is out of date: any other change to the manifest (a new variant, a re-export, a benchmark), a
report it reads, or the recipe file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pipeline.artifact.directory import Artifact, resolve_artifact
from pipeline.artifact.records import ReportRecord, settings_digest
from pipeline.artifact.stagewrite import StageWrite
from pipeline.core.errors import InputError
from pipeline.core.fsutil import sha256_file
from pipeline.recipe.current import current_recipe, section_settings
from pipeline.report.card import CARD_MD, CardFacts, model_card
from pipeline.report.curves import CURVES_PNG, METRICS_JSONL, TRAIN_JSON, plot_curves, read_curves
from pipeline.report.variants import BENCHMARK_JSON
from pipeline.stagekit.contract import Context, Progress, Stage

OWN_FILES = (CARD_MD, CURVES_PNG)  # what this stage writes: left out of its own inputs and its load's check


@dataclass
class ReportOutcome:
    artifact: Artifact
    card: Path
    curves: Path | None  # None: no training curves (an imported model); `notes` says why
    notes: list[str] = field(default_factory=list)


def report_artifact(path: str | Path, *, progress: Progress = print) -> ReportOutcome:
    """Write the model card (and the training curves, for a trained artifact) into the artifact at `path`.

    The card has no settings of its own: it shows the artifact and its recipe as they are.
    """
    artifact = Artifact.load(resolve_artifact(path), replacing=OWN_FILES)
    inputs = report_inputs(artifact)
    facts = card_facts(artifact)
    with StageWrite(artifact.root, "report") as write:
        (write.scratch / "reports").mkdir()
        files = []
        if facts.curves is not None:
            progress(f"[report] training curves: {len(facts.curves.epochs)} epochs")
            title = f"{artifact.name} v{artifact.version}: training curves"
            plot_curves(facts.curves, title, write.scratch / CURVES_PNG)
            files.append(CURVES_PNG)
        (write.scratch / CARD_MD).write_text(model_card(artifact, facts))
        files.append(CARD_MD)  # after the plot it links to

        def record(fresh: Artifact) -> None:
            if CURVES_PNG not in files and CURVES_PNG in fresh.manifest.files:
                fresh.remove_file(CURVES_PNG)  # an earlier card's curves, of a history this artifact no longer has
            fresh.manifest.stages.report = ReportRecord(
                inputs=inputs, card=CARD_MD, curves=CURVES_PNG if CURVES_PNG in files else None
            )

        artifact = write.commit(files, record)
    notes = [*facts.notes, *([facts.curves_note] if facts.curves is None else [])]
    curves = artifact.root / CURVES_PNG if CURVES_PNG in files else None
    return ReportOutcome(artifact, artifact.root / CARD_MD, curves, notes)


def report_fresh(root: Path) -> str | None:
    """Why the card at `root` is up to date, or None when it must be made (again)."""
    artifact = Artifact.load(resolve_artifact(root), verify=False)
    record = artifact.manifest.stages.report
    if record is None:
        return None
    for rel in filter(None, (record.card, record.curves)):
        entry = artifact.manifest.files.get(rel)
        path = artifact.root / rel
        if entry is None or not path.is_file() or sha256_file(path) != entry.sha256:
            return None
    if record.inputs != report_inputs(artifact):
        return None
    return f"{record.card} was made from this manifest, its reports and its recipe as they are now"


def report_inputs(artifact: Artifact) -> dict[str, str]:
    """Digests of everything the card shows: the manifest without this stage's own record and files, each
    report the card reads, and the recipe file (description and budgets)."""
    data = artifact.manifest.to_dict()
    data["stages"].pop("report", None)
    data["files"] = {rel: entry for rel, entry in data["files"].items() if rel not in OWN_FILES}
    inputs = {"manifest": settings_digest(data)}
    benchmark = artifact.manifest.stages.benchmark
    for rel in (TRAIN_JSON, METRICS_JSONL, benchmark.report if benchmark else BENCHMARK_JSON):
        if (path := artifact.path(rel)).is_file():
            inputs[rel] = sha256_file(path)
    if (recipe := _recipe_file(artifact)) is not None:
        inputs["recipe"] = sha256_file(recipe)
    return inputs


def _recipe_file(artifact: Artifact) -> Path | None:
    """The recipe file the train record names, where it is now (relative to the artifact), if it is there."""
    train = artifact.manifest.stages.train
    if train is None or train.recipe_path is None:
        return None
    path = artifact.root / train.recipe_path
    return path if path.is_file() else None


def card_facts(artifact: Artifact) -> CardFacts:
    """The recipe's description and budgets, and the curves: what the card shows besides the manifest."""
    notes: list[str] = []
    recipe, description = None, ""
    budgets_from = "the defaults: an imported model has no recipe (pipe check flags override them)"
    if artifact.manifest.stages.train is not None:
        try:
            recipe, recipe_notes = current_recipe(artifact)
        except InputError as exc:  # the recipe file is there but no longer valid, or names another model
            notes.append(f"the recipe could not be read, so the budgets shown are the defaults: {exc}")
            budgets_from = "the defaults: the recipe could not be read"
        else:
            notes += recipe_notes
            description = recipe.description
            found = _recipe_file(artifact) is not None
            budgets_from = "the recipe's `budgets:` section" if found else "the defaults: the recipe file is not there"
    curves, curves_note = read_curves(artifact)
    return CardFacts(
        description=description,
        budgets=section_settings(recipe, "budgets", {}),
        budgets_from=budgets_from,
        recipe_now=sha256_file(path) if (path := _recipe_file(artifact)) else None,
        curves=curves,
        curves_note=curves_note,
        notes=notes,
    )


def _fresh(ctx: Context) -> str | None:
    return report_fresh(ctx.version)


def _run(ctx: Context) -> str:
    return str(report_artifact(ctx.version, progress=ctx.progress).card)


STAGE = Stage("report", _fresh, _run)
