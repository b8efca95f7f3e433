"""Turn a finished ORT training run into a complete artifact: golden.npz, reports, the manifest.

The worker has written the trained inference model (`checkpoint/model.onnx`, the kept epoch's
weights) and that model's outputs on the test split, computed by ONNX Runtime training's eval
model. Those outputs become golden.npz's reference outputs and the test metrics, so `pipe export`
checks the model.onnx that onnxruntime serves against what the training runtime computed. The
manifest is the same contract as the torch backend's, with `lineage.backend: ort` (and, for a
model continued from another artifact, `lineage.parent_digest`); it is saved last.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.artifact.directory import Artifact
from pipeline.artifact.golden import Golden, save_golden
from pipeline.artifact.manifest import Lineage, Manifest
from pipeline.artifact.records import CheckpointRecord
from pipeline.data import Splits
from pipeline.recipe.schema import Recipe, recipe_location
from pipeline.train.loop import Progress
from pipeline.train.ort_start import Start
from pipeline.train.record import Outcome, golden_record


def finish_ort(
    root: Path,
    recipe: Recipe,
    splits: Splits,
    start: Start,
    result: dict[str, Any],
    outputs: np.ndarray,
    *,
    plan: Any,
    weights: str,
    state: Path | None,
) -> None:
    """Write golden.npz, reports/train.json and the manifest.

    `weights` is the trained model (relative to `root`), `state` the last checkpoint directory.
    """
    info, p = splits.info, result["progress"]
    parent = start.parent
    manifest = Manifest(
        name=recipe.name,
        version=int(root.name),
        task=recipe.task,
        inputs=start.inputs,
        outputs=start.outputs,
        labels=start.labels,
        lineage=Lineage(
            recipe_digest=recipe.digest,
            dataset_fingerprint=splits.fingerprint,
            parent_digest=parent.manifest.identity_digest() if parent else None,
            backend="ort",
            seed=recipe.train.seed,
        ),
        metrics=result["test"],  # accuracy and loss on the test split, from the training runtime's eval model
    )
    artifact = Artifact(root, manifest)

    golden = golden_record(len(splits.test))
    count = golden.samples
    golden_inputs = {start.inputs[0].name: splits.test.inputs[info.input_name][:count]}
    golden_outputs = {start.outputs[0].name: outputs[:count].astype(np.float32)}
    save_golden(artifact, Golden(golden_inputs, golden_outputs, splits.test.target[:count]))

    outcome = Outcome(Progress(**p), result["test"], result["wall_s"], result["cpu_s"], result["samples_per_s"])
    extra = {"backend": "ort", "trainable": start.trainable, "timings": result["timings"]}
    summary = outcome.summary(recipe, extra)
    artifact.write_file("reports/train.json", (json.dumps(summary, indent=2) + "\n").encode())
    for folder in ("checkpoint", "reports"):
        for path in sorted(q for q in (root / folder).rglob("*") if q.is_file()):
            artifact.add_file(path.relative_to(root).as_posix())

    inputs = {"recipe": recipe.digest, "data": splits.fingerprint}
    if parent is not None:
        inputs["parent"] = parent.manifest.identity_digest()
    manifest.stages.train = outcome.record(
        recipe,
        splits,
        inputs=inputs,
        recipe_path=recipe_location(Path(plan.recipe_path), root) if plan.recipe_path else None,
        checkpoint=CheckpointRecord(
            weights=weights,  # the trained inference model: the kept epoch's weights
            state=state.relative_to(root).as_posix() if state else None,
        ),
        golden=golden,
        backend="ort",
        device="cpu",
        precision="fp32",
        framework=result["runtime"],
    )
    artifact.save()
