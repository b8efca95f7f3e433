"""`pipe export ARTIFACT`: the trained torch model -> model.onnx, recorded only if it passes the gate.

Steps: restore the trained module from the checkpoint; export to a scratch directory inside the
artifact; run the parity gate (structure, batch 1/2/N, a second sequence length, the recorded
golden outputs, the task metric over the whole test split); only then stamp the identity into the
file, move it into place and record it with its parity in the manifest. A failing export leaves the
artifact exactly as it was and raises CheckFailed (exit 1) with the table of failures.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.artifact import Artifact, resolve_artifact
from pipeline.errors import ArtifactError, InputError
from pipeline.export.metadata import stamp
from pipeline.export.onnx_export import ExportResult, export_module, torch_reference
from pipeline.export.parity import GateReport, Tolerance, verify
from pipeline.fsutil import fsync_dir
from pipeline.golden import Golden, load_golden
from pipeline.recipe import Recipe, parse_recipe

log = logging.getLogger(__name__)
MODEL_FILE = "model.onnx"


@dataclass
class ExportOutcome:
    artifact: Artifact
    result: ExportResult
    report: GateReport


def training_recipe(artifact: Artifact) -> Recipe:
    """The recipe the model was trained with, as the train stage recorded it in the manifest."""
    record = artifact.manifest.stages.get("train")
    if not record or "recipe" not in record:
        raise ArtifactError(
            f"artifact {artifact.root} has no stages.train.recipe: it was not trained by `pipe train`. "
            "Export works on trained artifacts; bring an ONNX model made elsewhere with `pipe import`"
        )
    base = Path(record.get("recipe_dir", "."))
    return parse_recipe(record["recipe"], f"{artifact.root}/manifest.json stages.train.recipe", base)


def export_artifact(path: str | Path, opset: int | None = None, exporter: str | None = None) -> ExportOutcome:
    """Export a trained artifact's model to model.onnx through the parity gate; see the module doc."""
    from pipeline.train.restore import example_inputs, load_trained_model

    artifact = Artifact.load(resolve_artifact(path))
    manifest = artifact.manifest
    recipe = training_recipe(artifact)
    opset = opset or recipe.export.opset
    exporter = exporter or ("dynamo" if recipe.export.dynamo else "torchscript")
    tol = Tolerance(recipe.export.atol, recipe.export.rtol, recipe.export.metric_tolerance)
    module = load_trained_model(artifact)
    golden = load_golden(artifact)
    evaluation = _evaluation_split(artifact, recipe, golden)

    scratch = Path(tempfile.mkdtemp(prefix=".export-", dir=artifact.root))
    try:
        candidate = scratch / MODEL_FILE
        result = export_module(
            module, example_inputs(artifact, 2), manifest.inputs, manifest.outputs, candidate, opset, exporter
        )
        reference = torch_reference(module, manifest.inputs, manifest.outputs)
        report = verify(
            candidate,
            reference,
            golden.inputs,
            manifest.inputs,
            manifest.outputs,
            tol,
            manifest.task,
            evaluation=evaluation,
            recorded=golden.outputs,
            scratch=scratch,
        )
        report.raise_on_failure(f"the ONNX export of {manifest.name} v{manifest.version}")
        stamp(candidate, manifest)
        _move_into_place(scratch, artifact.root)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    for rel in _exported_files(artifact.root, result):
        artifact.add_file(rel)
    manifest.stages["export"] = _record(result, tol, report, opset)
    artifact.save()
    return ExportOutcome(artifact, result, report)


def _evaluation_split(artifact: Artifact, recipe: Recipe, golden: Golden) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The whole test split with its targets: golden.npz when training stored the split whole, else re-read."""
    record = artifact.manifest.stages.get("train", {}).get("golden", {})
    if record.get("whole_split") and golden.target is not None:
        return golden.inputs, golden.target
    from pipeline.data import load_splits

    try:
        test = load_splits(recipe).test
    except InputError as exc:
        raise InputError(
            f"the gate measures the metric on the whole test split, which golden.npz holds only part of, and the "
            f"data could not be read again: {exc}. A relative data.path is resolved against the recipe's "
            "directory (recorded as stages.train.recipe_dir when present) or else the current directory"
        ) from exc
    return test.inputs, test.target


def _exported_files(root: Path, result: ExportResult) -> list[str]:
    files = [MODEL_FILE]
    if result.external_data:
        files.append(f"{MODEL_FILE}.data")
    return [f for f in files if (root / f).is_file()]


def _move_into_place(scratch: Path, root: Path) -> None:
    """Weights first, graph last: a crash in between leaves the manifest pointing at the old files."""
    names = sorted(p.name for p in scratch.iterdir() if p.is_file() and p.name.startswith(MODEL_FILE))
    for name in sorted(names, key=lambda n: n == MODEL_FILE):
        os.replace(scratch / name, root / name)
    fsync_dir(root)


def _record(result: ExportResult, tol: Tolerance, report: GateReport, opset: int) -> dict[str, Any]:
    """manifest.stages["export"]: how it was exported and the evidence that it matches."""
    return {
        **result.to_dict(),
        "requested_opset": opset,
        "tolerance": {"atol": tol.atol, "rtol": tol.rtol, "metric": tol.metric},
        "parity": report.to_dict(),
        "metric": report.metric,
    }
