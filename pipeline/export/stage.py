"""`pipe export ARTIFACT`: the trained model -> model.onnx, recorded only if it passes the gate.

Steps: get the trained model through the artifact's training backend (`lineage.backend`); read
the export settings from the recipe's `export:` section as it is now (overridden by the command
line); export into a scratch directory inside the artifact; run the parity gate (structure, batch
1/2/N, a second sequence length, the recorded golden outputs, the task metric over the whole test
split); stamp the identity into the file; then, under the artifact's lock, move it into place and
record the export stage and the fp32 variant. A failing export leaves the artifact exactly as it
was and raises CheckFailed (exit 1) with the table of failures.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.artifact.directory import Artifact, resolve_artifact
from pipeline.artifact.records import ExportRecord, settings_digest
from pipeline.artifact.stagewrite import StageWrite
from pipeline.artifact.variants import FP32, MODEL_FILE
from pipeline.export.metadata import stamp
from pipeline.export.onnx_export import ExportResult, export_module
from pipeline.recipe.current import current_recipe, section_settings, train_record
from pipeline.recipe.schema import ExportSpec
from pipeline.runtime.backends import backend_for, trained_onnx
from pipeline.samples.evaluation import evaluation_set
from pipeline.stagekit.contract import Context, Overrides, Progress, Stage
from pipeline.stagekit.model_record import record_model
from pipeline.verify.choose import GateSettings, hop_policy
from pipeline.verify.gate import verify
from pipeline.verify.report import GateReport

log = logging.getLogger(__name__)
EXPORTED_FILES = (MODEL_FILE, f"{MODEL_FILE}.data")  # what `pipe export` writes (weights past 1.8 GB)


@dataclass
class ExportOutcome:
    artifact: Artifact
    result: ExportResult
    report: GateReport
    notes: list[str] = field(default_factory=list)  # where the settings came from, when not the recipe file


def export_artifact(
    path: str | Path, overrides: Overrides | None = None, recipe_path: Path | None = None, progress: Progress = print
) -> ExportOutcome:
    """Export a trained artifact's model to model.onnx through the parity gate; see the module doc.

    `overrides`: the command line's values of the recipe's `export:` keys (opset, dynamo, atol, rtol).
    """
    # model.onnx is what this stage writes: a copy left by an interrupted export is replaced, not refused.
    artifact = Artifact.load(resolve_artifact(path), replacing=EXPORTED_FILES)
    manifest = artifact.manifest
    train = train_record(artifact)
    recipe, notes = current_recipe(artifact, recipe_path)
    settings: ExportSpec = section_settings(recipe, "export", dict(overrides or {}))
    exporter = "dynamo" if settings.dynamo else "torchscript"
    tol = hop_policy("export", "fp32", manifest.task, False, GateSettings.read(settings.model_dump()))
    backend = backend_for(artifact)
    model = backend.load_model(artifact)
    ready = trained_onnx(backend, artifact)  # ort: the trained model is already ONNX, so it is gated as it is
    generating = manifest.task == "text-generation"  # a causal LM: its KV cache graph, judged on generated text
    evaluation = None if generating else evaluation_set(artifact, recipe)
    weights = train.checkpoint.weights
    how = (
        f"the {backend.name} backend's trained ONNX model" if ready else f"{exporter} exporter, opset {settings.opset}"
    )
    on = "greedy generation against transformers" if evaluation is None else evaluation.source
    progress(f"[export] {artifact.root}: {how}; gate on {on}")

    with StageWrite(artifact.root, "export") as write:
        candidate = write.scratch / MODEL_FILE
        if evaluation is None:
            from pipeline.export.causal_lm import DecoderGate, export_trained

            gate = DecoderGate(atol=settings.atol, rtol=settings.rtol)
            result, report = export_trained(model, artifact, candidate, settings.opset, gate)
        elif ready is not None:
            result = copy_trained(ready, candidate, backend.name)
        else:
            result = export_module(
                model,
                backend.example_inputs(artifact, 2),
                manifest.inputs,
                manifest.outputs,
                candidate,
                settings.opset,
                exporter,
            )
        if evaluation is not None:
            reference = backend.reference(artifact, model)
            report = verify(candidate, reference, evaluation, manifest.spec, tol, scratch=write.scratch)
        report.raise_on_failure(f"the ONNX export of {manifest.name} v{manifest.version}")
        stamp(candidate, manifest)
        files = list(EXPORTED_FILES[::-1]) if result.external_data else [MODEL_FILE]  # weights, then the graph

        def record(fresh: Artifact) -> None:
            parent = fresh.manifest.files[weights].sha256
            fresh.manifest.stages.export = _export_record(settings, weights, parent, result, report)
            record_model(
                fresh,
                stage="export",
                parent=parent,
                parity=report.summary(),
                settings={"exporter": result.exporter, "opset": result.opset},
                metrics={report.metric["name"]: report.metric["onnx"]} if report.metric else {},
            )

        artifact = write.commit(files, record)
    return ExportOutcome(artifact, result, report, notes)


def _export_record(
    settings: ExportSpec, weights: str, parent: str, result: ExportResult, report: GateReport
) -> ExportRecord:
    """stages.export: the settings, the weights it was made from (`parent`, their sha256), the exporter and
    opset used, why the preferred exporter was not, and the gate's report."""
    return ExportRecord(
        settings=settings.model_dump(mode="json"),
        inputs={weights: parent},
        exporter=result.exporter,
        opset=result.opset,
        requested_opset=settings.opset,
        external_data=result.external_data,
        fallback_reason=result.fallback_reason,
        parity=report.to_dict(),
        metric=report.metric,
    )


def copy_trained(trained: Path, candidate: Path, backend: str) -> ExportResult:
    """A backend's trained ONNX model copied as the candidate; its own opset is kept (recorded as it is)."""
    import shutil

    import onnx

    shutil.copyfile(trained, candidate)
    model = onnx.load(str(candidate), load_external_data=False)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    return ExportResult(exporter=backend, opset=opset, external_data=False)


def _fresh(ctx: Context) -> str | None:
    """Up to date while model.onnx passed the gate with the recipe's `export:` section as it is now, from
    the weights the version holds now."""
    manifest = Artifact.load(ctx.version, verify=False).manifest
    record, variant = manifest.stages.export, manifest.variants.get(FP32)
    if record is None or variant is None or not variant.passed or MODEL_FILE not in manifest.files:
        return None
    weights = manifest.stages.train.checkpoint.weights if manifest.stages.train else None
    same_weights = weights in manifest.files and record.inputs.get(weights) == manifest.files[weights].sha256
    same_settings = record.settings_digest() == settings_digest(ctx.recipe.export.model_dump(mode="json"))
    return "model.onnx passed the parity gate with these export settings" if same_weights and same_settings else None


def _run(ctx: Context) -> str:
    outcome = export_artifact(ctx.version, recipe_path=ctx.recipe_path, progress=ctx.progress)
    ctx.progress(outcome.report.table())
    return f"{ctx.version / MODEL_FILE} (opset {outcome.result.opset})"


STAGE = Stage("export", _fresh, _run)
