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
import platform
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.artifact.directory import Artifact
from pipeline.artifact.golden import Golden, save_golden
from pipeline.artifact.manifest import Lineage, Manifest
from pipeline.artifact.records import CheckpointRecord, GoldenRecord, TrainRecord
from pipeline.data import Splits
from pipeline.recipe.schema import Recipe, recipe_location, stage_settings
from pipeline.train.ort_start import Start

GOLDEN_WHOLE_SPLIT_MAX = 1000  # as the torch backend: test splits up to this size go into golden.npz whole
GOLDEN_SAMPLES = 512


def kept_line(monitor: str, p: dict[str, Any], epochs: int, patience: int | None) -> str:
    """Which epoch's weights are kept and why (the torch backend's `objective.kept_reason`)."""
    from types import SimpleNamespace

    from pipeline.train.objective import kept_reason

    return kept_reason(monitor, SimpleNamespace(**p), epochs, patience)


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

    whole = len(splits.test) <= GOLDEN_WHOLE_SPLIT_MAX
    count = len(splits.test) if whole else GOLDEN_SAMPLES
    golden_inputs = {start.inputs[0].name: splits.test.inputs[info.input_name][:count]}
    golden_outputs = {start.outputs[0].name: outputs[:count].astype(np.float32)}
    save_golden(artifact, Golden(golden_inputs, golden_outputs, splits.test.target[:count]))

    monitor = recipe.train.monitor
    kept = kept_line(monitor, p, recipe.train.epochs, recipe.train.early_stopping)
    summary = {
        "test": result["test"], "best_epoch": p["best_epoch"], "monitor": monitor, f"best_{monitor}": p["best_metric"],
        "best_val_loss": p["best_loss"], "kept": kept, "epochs_run": p["epoch"], "steps": p["step"],
        "stopped_early": p["stopped_early"], "wall_s": result["wall_s"], "cpu_s": result["cpu_s"],
        "samples_per_s": result["samples_per_s"], "backend": "ort", "trainable": start.trainable,
        "timings": result["timings"],
        "history": p["history"],
    }  # fmt: skip
    artifact.write_file("reports/train.json", (json.dumps(summary, indent=2) + "\n").encode())
    for folder in ("checkpoint", "reports"):
        for path in sorted(q for q in (root / folder).rglob("*") if q.is_file()):
            artifact.add_file(path.relative_to(root).as_posix())

    inputs = {"recipe": recipe.digest, "data": splits.fingerprint}
    if parent is not None:
        inputs["parent"] = parent.manifest.identity_digest()
    manifest.stages.train = TrainRecord(
        settings=stage_settings(recipe, "train"),
        inputs=inputs,
        recipe_path=recipe_location(Path(plan.recipe_path), root) if plan.recipe_path else None,
        data=info.to_dict(),
        checkpoint=CheckpointRecord(
            weights=weights,  # the trained inference model: the kept epoch's weights
            state=state.relative_to(root).as_posix() if state else None,
        ),
        golden=GoldenRecord(split="test", samples=count, whole_split=whole, split_size=len(splits.test)),
        splits={"train": len(splits.train), "val": len(splits.val), "test": len(splits.test)},
        backend="ort",
        device="cpu",
        precision="fp32",
        framework=result["runtime"],
        python=platform.python_version(),
        best_epoch=p["best_epoch"],
        kept=kept,
        epochs_run=p["epoch"],
        steps=p["step"],
        stopped_early=p["stopped_early"],
        wall_s=result["wall_s"],
        cpu_s=result["cpu_s"],
        samples_per_s=result["samples_per_s"],
    )
    artifact.save()
