"""Calibration data for static quantization: real training samples, never made-up or downloaded ones.

Static int8 fixes each activation's range ahead of time from the samples it is calibrated on, so
they must be the inputs the model will see, in the layout its graph expects (the model's own
input specs; normalization is inside the model, so raw inputs are right). A trained artifact's
training split is read again (deterministic subset); an imported model has only the evaluation
data given at import, which golden.npz holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.artifact.directory import Artifact
from pipeline.artifact.golden import load_golden
from pipeline.core.arrays import Arrays
from pipeline.core.errors import InputError
from pipeline.recipe.schema import Recipe
from pipeline.samples.evaluation import trained_splits

SEED = 0  # the subset is the same on every run, so a re-run quantizes the same way


@dataclass
class Calibration:
    inputs: Arrays  # one array per model input, `samples` rows
    source: str  # where they came from, in words, for the report

    def __len__(self) -> int:
        return len(next(iter(self.inputs.values())))


def calibration_set(artifact: Artifact, recipe: Recipe | None, samples: int) -> Calibration:
    """Up to `samples` real inputs for `artifact`: its training split, or the data given at import."""
    if samples < 1:
        raise InputError(f"calibration_samples must be at least 1 (got {samples})")
    if artifact.manifest.stages.train is not None:
        split = trained_splits(artifact, recipe).train
        pool, source = split.inputs, "the training split"
    elif has_real_samples(artifact):
        pool, source = load_golden(artifact).inputs, "golden.npz (the evaluation data given at import)"
    else:
        raise InputError(
            f"artifact {artifact.root} was imported without --eval-data: its golden.npz inputs are generated, "
            "and static int8 calibrated on made-up inputs would fix wrong ranges; re-import it with "
            "--eval-data FILE (real inputs), or use --quantize dynamic, fp16 or auto (which then tries dynamic only)"
        )
    names = [spec.name for spec in artifact.manifest.inputs]
    missing = [n for n in names if n not in pool]
    if missing:
        raise InputError(f"calibration data from {source} lacks model inputs {missing}; it has {sorted(pool)}")
    count = len(pool[names[0]])
    take = np.sort(np.random.default_rng(SEED).permutation(count)[: min(samples, count)])
    return Calibration({n: pool[n][take] for n in names}, f"{len(take)} of {count} samples of {source}")


def has_real_samples(artifact: Artifact) -> bool:
    """Whether the artifact holds real inputs to calibrate on: trained here, or imported with --eval-data."""
    imported = artifact.manifest.stages.import_
    return artifact.manifest.stages.train is not None or imported is None or imported.golden != "generated"
