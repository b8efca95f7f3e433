"""reports/model-card.md: what the model is, where it came from, how good it is, and how to use it.

Sections, in order: identity, lineage, data, metrics (with the training curves), variants, edge
models, benchmark, how to serve it, how to run it on a device, how to check a candidate against
it. Every figure is read from the artifact (the manifest, its stage records, reports/ and
golden.npz) or from the recipe it was trained from as that file is now (description, budgets);
where something is missing the card says so instead of guessing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.artifact.directions import IN_TARGET_UNITS
from pipeline.artifact.directory import Artifact
from pipeline.artifact.golden import GOLDEN_NAME, load_golden
from pipeline.recipe.budgets import BudgetSpec
from pipeline.report.curves import CURVES_PNG, Curves
from pipeline.report.markdown import cell, code, number, shape, table
from pipeline.report.usage import check_section, device_section, serve_section
from pipeline.report.variants import benchmark_section, edge_section, variants_section
from pipeline.samples.evaluation import GENERATED_NOTE, judged_on_generated

CARD_MD = "reports/model-card.md"
CONFUSION_CLASSES = 12  # a confusion matrix up to this many classes; more are shown per class only
LABELS_SHOWN = 30  # a card lists this many class names; more are counted


@dataclass
class CardFacts:
    """What the card needs besides the artifact: the recipe's parts and the curves, as the stage read them."""

    description: str  # the recipe's description ("" when none)
    budgets: BudgetSpec  # what `pipe check` holds a candidate to against this version
    budgets_from: str  # where those budgets came from, in words
    recipe_now: str | None  # sha256 of the recipe file as it is now (None: not found)
    curves: Curves | None
    curves_note: str  # why there are no curves (empty when there are)
    notes: list[str] = field(default_factory=list)  # anything the stage could not read, said on the card


def model_card(artifact: Artifact, facts: CardFacts) -> str:
    """The whole card as Markdown."""
    sections = [
        identity_section(artifact, facts),
        lineage_section(artifact, facts),
        data_section(artifact),
        use_section(artifact, facts),
        metrics_section(artifact, facts),
        variants_section(artifact),
        edge_section(artifact),
        benchmark_section(artifact),
        serve_section(artifact),
        device_section(artifact),
        check_section(artifact, facts.budgets, facts.budgets_from),
    ]
    return "\n\n".join("\n".join(lines) for lines in sections) + "\n"


def identity_section(artifact: Artifact, facts: CardFacts) -> list[str]:
    m = artifact.manifest
    lines = [f"# {m.name} v{m.version}: model card", ""]
    if facts.description:
        lines += [cell(facts.description), ""]
    stages = [name for name in m.stages.names() if name != "report"]  # the card's own record says nothing new
    lines += table(["field", "value"], [
        ["name", code(m.name)], ["version", m.version], ["task", m.task], ["created", m.created],
        ["identity digest", code(m.identity_digest())], ["stages run", ", ".join(stages) or "-"],
    ])  # fmt: skip
    for note in facts.notes:
        lines += ["", f"> note: {cell(note)}"]
    if judged_on_generated(m):  # imported without --eval-data: every figure below compares outputs on noise
        lines += ["", f"> **{GENERATED_NOTE}**: imported without `--eval-data`, so every variant's figure on this "
                      "card compares outputs on generated inputs"]  # fmt: skip
    return lines


def lineage_section(artifact: Artifact, facts: CardFacts) -> list[str]:
    m = artifact.manifest
    lineage, train, imported = m.lineage, m.stages.train, m.stages.import_
    rows: list[list[Any]] = []
    if train is not None:
        data = train.settings.get("data", {})
        source = data.get("source", "?") + (f" ({code(data['path'])})" if data.get("path") else "")
        rows += [
            ["recipe", f"{code(train.recipe_path)} (relative to the artifact)" if train.recipe_path else "-"],
            ["recipe sha256", _recipe_digest(lineage.recipe_digest, facts.recipe_now)],
            ["data source", source],
            ["dataset fingerprint", code(lineage.dataset_fingerprint)],
            ["backend", lineage.backend],
            ["device, precision", f"{train.device}, {train.precision}"],
            ["processes", f"{train.world_size} ({train.strategy})"],
            ["framework", train.framework or "-"], ["python", train.python or "-"],
            ["seed", lineage.seed],
            ["run", f"{train.epochs_run} epochs, {train.steps} steps, {number(train.wall_s, 3)} s wall, "
                    f"{train.samples_per_s:,.0f} samples/s"],
        ]  # fmt: skip
    if imported is not None:
        rows += [
            ["imported from", code(imported.source)],
            ["source sha256", code(imported.source_sha256)],
            ["producer", imported.producer or "-"],
            ["ONNX IR version, opset", f"{imported.ir_version}, {imported.opset}"],
            ["golden outputs from", f"{imported.golden} inputs" + (f" ({code(imported.eval_data)})"
                                                                  if imported.eval_data else "")],
            ["exporter's metadata", f"{len(imported.metadata)} key(s), convention {imported.convention or '-'}"],
        ]  # fmt: skip
        rows += [[f"{what} from", reading.source] for what, reading in imported.read.items()]
        rows += [["import note", note] for note in imported.notes]
    if m.stages.export is not None:
        e = m.stages.export
        via = e.exporter + (f" (fallback: {e.fallback_reason})" if e.fallback_reason else "")
        rows.append(["exported", f"{via}, opset {e.opset}, {e.finished}"])
    rows += [["pipe version", lineage.code_version], ["parent artifact", code(lineage.parent_digest)
                                                      if lineage.parent_digest else "-"]]  # fmt: skip
    return ["## Lineage", "", *table(["what", "value"], rows)]


def _recipe_digest(trained: str | None, now: str | None) -> str:
    if trained is None:
        return "-"
    if now is None:
        return f"{code(trained)} (the file is not there now)"
    return code(trained) + ("" if now == trained else f" (the file has changed since: now {code(now[:12])})")


def data_section(artifact: Artifact) -> list[str]:
    m = artifact.manifest
    lines = ["## Data", ""]
    train, imported = m.stages.train, m.stages.import_
    if train is not None:
        splits = ", ".join(f"{name} {count}" for name, count in train.splits.items())
        g = train.golden
        lines.append(f"Splits: {splits}. `{GOLDEN_NAME}` holds {g.samples} samples of the {g.split} split"
                     f"{' (the whole split)' if g.whole_split else f' (of {g.split_size})'}.")  # fmt: skip
    elif imported is not None and GOLDEN_NAME in m.files:
        inputs = load_golden(artifact).inputs
        count = len(next(iter(inputs.values()))) if inputs else 0
        lines.append(f"Imported: `{GOLDEN_NAME}` holds {count} evaluation samples, from {imported.golden} inputs.")
    rows = [[kind, code(s.name), s.dtype, shape(s.shape), s.layout, _preprocessing(s.preprocessing)]
            for kind, specs in (("input", m.inputs), ("output", m.outputs)) for s in specs]  # fmt: skip
    lines += ["", *table(["tensor", "name", "dtype", "shape", "layout", "preprocessing"], rows)]
    for spec in m.inputs:
        if spec.features:  # a table: the columns a client keys a row by, and what a categorical one takes
            lines += ["", f"Columns of `{spec.name}`, in input order ({len(spec.features)}):", ""]
            lines += table(["#", "column", "kind"], [
                [i, code(f.name), f"categorical: {', '.join(code(c) for c in f.categories)}" if f.categories
                 else "number"] for i, f in enumerate(spec.features)])  # fmt: skip
    if m.labels:
        shown = ", ".join(code(label) for label in m.labels[:LABELS_SHOWN])
        more = f" and {len(m.labels) - LABELS_SHOWN} more" if len(m.labels) > LABELS_SHOWN else ""
        lines += ["", f"Labels ({len(m.labels)}, index = output position): {shown}{more}."]
    return lines


def use_section(artifact: Artifact, facts: CardFacts) -> list[str]:
    """Intended use and limits: what the model was made for (the recipe's description) and what its data bounds."""
    m, train = artifact.manifest, artifact.manifest.stages.train
    lines = ["## Intended use and limits", ""]
    if facts.description:
        lines.append(f"Intended use: {cell(facts.description)}.")
    else:
        lines.append("Intended use: not stated (the recipe has no `description`); say what it is for before sharing.")
    limits = []
    if train is not None:
        data = train.settings.get("data", {})
        source = data.get("path") or data.get("source", "?")
        limits.append(f"It knows only what its {sum(train.splits.values())} samples from "
                      f"{code(source)} show; inputs unlike them (other ranges, other populations) are "
                      "answered without warning.")  # fmt: skip
    for spec in m.inputs:
        for f in spec.features or []:
            if f.categories:
                limits.append(f"Column {code(f.name)} takes only the categories it was trained on "
                              f"({len(f.categories)}); any other value is refused, not guessed.")  # fmt: skip
    if m.task == "regression":
        limits.append("It predicts a number with the error shown under Metrics; it gives no interval per prediction.")
    elif m.task == "classification":
        limits.append("Its scores are not calibrated probabilities unless checked; a class it never saw is never "
                      "answered.")  # fmt: skip
    limits.append("Figures below hold for the test split and, for timings, this machine only.")
    return [*lines, "", "Limits:", "", *(f"- {line}" for line in limits)]


def _units(artifact: Artifact) -> dict[str, str]:
    """Each metric's units: a regression's MAE and RMSE are in the target's (a price's USD), the rest none."""
    m, train = artifact.manifest, artifact.manifest.stages.train
    if m.task != "regression":
        return {k: "fraction" if k == "accuracy" else "" for k in m.metrics}
    label = (train.settings.get("data", {}).get("label_column") if train is not None else None) or "the target"
    target = f"the units of {code(label)}" if label != "the target" else "the target's units"
    return {k: target if k in IN_TARGET_UNITS else "none" if k == "r2" else "" for k in m.metrics}


def _uncertainty(artifact: Artifact, budgets: BudgetSpec) -> list[str]:
    """How much one test sample moves accuracy, and its standard error: a small split cannot show small drops."""
    m, train = artifact.manifest, artifact.manifest.stages.train
    count = train.splits.get("test") if train is not None else None
    if not count or "accuracy" not in m.metrics:
        return []
    p, one = m.metrics["accuracy"], 1 / count
    se = math.sqrt(max(p * (1 - p), 0.0) / count)
    gate = budgets.for_metric("accuracy")
    line = (f"The test split holds {count} samples: one sample moves accuracy by 1/{count} = {one:.4f}, and its "
            f"standard error is ±{se:.4f} (binomial).")  # fmt: skip
    if gate.max_drop is not None and gate.max_drop < 2 * one:
        line += (f" `pipe check`'s budget of {gate.max_drop:g} is {gate.max_drop / one:.2g} samples: single samples "
                 "decide it; a larger test split (data.test_fraction) measures finer.")  # fmt: skip
    return ["", line]


def per_class_section(artifact: Artifact) -> list[str]:
    """A classifier's precision, recall and support per class, and its confusion matrix, on golden.npz."""
    m = artifact.manifest
    if m.task != "classification" or not m.labels or GOLDEN_NAME not in m.files:
        return []
    golden = load_golden(artifact)
    scores = golden.outputs.get(m.outputs[0].name) if m.outputs else None
    if golden.target is None or scores is None or scores.ndim != 2 or scores.shape[1] != len(m.labels):
        return []
    k, predicted, truth = len(m.labels), scores.argmax(axis=1), golden.target.astype(int)
    confusion = np.zeros((k, k), dtype=int)
    np.add.at(confusion, (truth, predicted), 1)
    rows = []
    for i, label in enumerate(m.labels):
        tp, said, real = confusion[i, i], confusion[:, i].sum(), confusion[i].sum()
        rows.append([code(label), number(tp / said) if said else "-", number(tp / real) if real else "-", int(real)])
    lines = ["", f"Per class on `{GOLDEN_NAME}` ({len(truth)} samples):", ""]
    lines += table(["class", "precision", "recall", "support"], rows)
    if k <= CONFUSION_CLASSES:
        lines += ["", "Confusion matrix (rows: true class, columns: predicted):", ""]
        lines += table(["true / predicted", *(code(x) for x in m.labels)],
                       [[code(x), *confusion[i].tolist()] for i, x in enumerate(m.labels)])  # fmt: skip
    return lines


def _preprocessing(pre: dict[str, Any]) -> str:
    if not pre:
        return "none"
    parts = []
    for key, value in pre.items():
        shown = "[" + ", ".join(number(v) for v in value) + "]" if isinstance(value, list) else number(value)
        parts.append(f"{key} {shown}")
    return "; ".join(parts)


def metrics_section(artifact: Artifact, facts: CardFacts) -> list[str]:
    m = artifact.manifest
    lines = ["## Metrics", ""]
    split = "test split" if m.stages.train is not None else "evaluation data"
    if m.metrics:
        units = _units(artifact)
        rows = [[k, number(v), units.get(k, "")] for k, v in m.metrics.items()]
        lines += table(["metric", f"on the {split}", "units"], rows)
        lines += _uncertainty(artifact, facts.budgets)
        lines += per_class_section(artifact)
    elif m.task in ("detection", "tensor", "embedding"):
        judged = {"detection": "box agreement", "tensor": "cosine or relative error, by output",
                  "embedding": "cosine similarity"}[m.task]  # fmt: skip
        lines.append(f"No task metric: a {m.task} model has none here; its variants are judged against model.onnx "
                     f"by {judged} (see Variants).")  # fmt: skip
    else:
        lines.append("No task metrics recorded (no labelled evaluation data).")
    curves, train = facts.curves, m.stages.train
    if train is not None:
        stop = "stopped early" if train.stopped_early else "ran every epoch"
        if train.stopped_early and curves is not None and curves.patience:
            stop += f" after {curves.patience} epochs without improvement"
        best = ""
        if curves is not None and curves.best_epoch in curves.epochs:
            best = f" (validation {curves.metric} {number(curves.val_metric[curves.epochs.index(curves.best_epoch)])})"
        lines += ["", f"Kept the weights of epoch {train.best_epoch}{best} of {train.epochs_run} run; {stop}."]
        if train.kept:  # which validation figure chose it (train.monitor), as training printed it
            lines.append(f"Training: {cell(train.kept)}.")
    if curves is not None:
        lines += ["", f"![training curves]({CURVES_PNG.removeprefix('reports/')})"]
    else:
        lines += ["", f"No training curves: {facts.curves_note}."]
    return lines
