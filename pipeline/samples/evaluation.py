"""An artifact's evaluation set: the golden samples every hop runs, and the split its metric is measured on.

Where the split comes from, in order:

1. golden.npz, when training stored the whole test split there with its targets (a small test
   split: the train record's `golden.whole_split`);
2. the test split the model was trained with, read again through `pipeline.data.load_splits`
   (the trained data sections, relative paths resolved from the recipe's directory);
3. for an imported model, the evaluation data given at import (golden.npz, with `target`);
4. otherwise golden.npz's inputs without targets: no task metric, only agreement with the
   reference's outputs. For a model imported without `--eval-data` those inputs were generated:
   `generated` is set and `source` says GENERATED_NOTE, which every report that shows a judgement
   repeats (`judged_on_generated`).

`source` says which, in words, for the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pipeline.artifact.golden import load_golden
from pipeline.core.arrays import Arrays
from pipeline.core.errors import ArtifactError, InputError

GENERATED_NOTE = "judged on generated inputs: agreement on noise is not accuracy"

if TYPE_CHECKING:
    from pipeline.artifact.directory import Artifact
    from pipeline.artifact.manifest import Manifest
    from pipeline.artifact.records import TrainRecord
    from pipeline.data import Splits
    from pipeline.recipe.schema import Recipe


@dataclass
class EvaluationSet:
    """What a gate runs a candidate on: `verify(candidate, reference, evaluation, spec)`."""

    samples: Arrays  # golden inputs: the batch 1/2/N cases and the recorded check run on these
    recorded: Arrays | None  # the reference's outputs for `samples`, stored when the artifact was made
    data: Arrays | None  # the split the metric and the budgets are measured on (None: the samples only)
    target: np.ndarray | None  # its ground truth; None: no task metric, only agreement
    source: str  # where `data` came from, in words
    generated: bool = False  # the samples were generated (an import without --eval-data): GENERATED_NOTE

    @classmethod
    def of(
        cls,
        samples: Arrays,
        split: tuple[Arrays, np.ndarray | None] | None = None,
        recorded: Arrays | None = None,
        source: str = "the given samples",
    ) -> EvaluationSet:
        """An evaluation set from arrays in hand (an import before its artifact exists, a test)."""
        data, target = split if split is not None else (None, None)
        return cls(samples, recorded, data, target, source)

    @property
    def split(self) -> tuple[Arrays, np.ndarray | None] | None:
        """`data` and `target`, or None when there is no split beyond the samples."""
        return None if self.data is None else (self.data, self.target)

    def __len__(self) -> int:
        return len(next(iter((self.data if self.data is not None else self.samples).values())))


def evaluation_set(artifact: Artifact, recipe: Recipe | None = None) -> EvaluationSet:
    """The evaluation set of `artifact`; see the module doc for where each part comes from.

    `recipe`: the recipe as it is now, whose directory relative data paths are read from (else
    the directory of the recipe file the train record names, else the artifact's). Raises
    InputError when a trained model's test split is needed but its data cannot be read.
    """
    golden = load_golden(artifact)
    train = artifact.manifest.stages.train
    given = "the evaluation data given at import" if artifact.manifest.stages.import_ else "golden.npz"

    def from_golden(source: str, target: np.ndarray | None) -> EvaluationSet:
        return EvaluationSet(golden.inputs, golden.outputs, golden.inputs, target, source)

    if train is not None and train.golden.whole_split and golden.target is not None:
        return from_golden(f"golden.npz: the whole {train.golden.split} split ({len(golden)} samples)", golden.target)
    if train is not None:
        inputs, target = _trained_split(artifact, train, recipe)
        source = f"the {train.golden.split} split read again from the training data ({len(target)} samples)"
        return EvaluationSet(golden.inputs, golden.outputs, inputs, target, source)
    if recipe is not None:
        from pipeline.data import load_splits

        test = load_splits(recipe).test
        source = f"the test split of recipe {recipe.name!r} ({len(test)} samples)"
        return EvaluationSet(golden.inputs, golden.outputs, test.inputs, test.target, source)
    if golden.target is not None:
        return from_golden(f"{given} with targets ({len(golden)} samples)", golden.target)
    if judged_on_generated(artifact.manifest):
        source = f"golden.npz generated inputs ({len(golden)} samples): {GENERATED_NOTE}"
        return EvaluationSet(golden.inputs, golden.outputs, golden.inputs, None, source, generated=True)
    return from_golden(f"golden.npz inputs without targets ({len(golden)} samples): agreement only", None)


def held_out_text(artifact: Artifact) -> EvaluationSet:
    """A decoder's evaluation set: golden.npz's first step, read teacher-forced (pipeline/verify/lm_judge.py).

    A trained decoder's golden.npz holds its test split's first blocks, left-padded (pipeline/train/finish_lm.py),
    an imported one's the prompts it was gated on; both are in the version, so judging it needs no training
    data read again (a copied artifact judges alike)."""
    golden = load_golden(artifact)
    rows, tokens = golden.inputs["input_ids"].shape
    what = "test split's first blocks" if artifact.manifest.stages.train is not None else "import's prompts"
    source = f"golden.npz: the {what} ({rows} x {tokens} tokens)"
    return EvaluationSet(golden.inputs, golden.outputs, golden.inputs, None, source)


def judged_on_generated(manifest: Manifest) -> bool:
    """Whether the model is judged on generated inputs only: imported without --eval-data (import record)."""
    imported = manifest.stages.import_
    return manifest.stages.train is None and imported is not None and imported.judged_on_generated


def _trained_split(artifact: Artifact, train: TrainRecord, recipe: Recipe | None) -> tuple[Arrays, np.ndarray]:
    """The test split the model was trained with: its trained data sections, read again."""
    try:
        test = trained_splits(artifact, recipe).test
    except InputError as exc:
        raise InputError(
            f"the gate measures the metric on the whole test split, which golden.npz holds only part of, and the "
            f"data could not be read again: {exc}. A relative data.path is resolved against the recipe's "
            "directory (the train record's recipe_path, or --recipe)"
        ) from exc
    return test.inputs, test.target


def trained_splits(artifact: Artifact, recipe: Recipe | None = None) -> Splits:
    """The train/val/test splits a trained model was trained with, read again from its trained data sections.

    `recipe`: the recipe as it is now, whose directory relative data paths are read from (else the
    directory of the recipe file the train record names, else the artifact's). Raises InputError
    when the data cannot be read, ArtifactError when the artifact was not trained.
    """
    from pipeline.data import load_splits
    from pipeline.recipe.schema import parse_recipe

    train = artifact.manifest.stages.train
    if train is None:
        raise ArtifactError(f"artifact {artifact.root} was not trained by pipe train: it has no training data")
    if recipe is not None:
        base = recipe.base_dir
    elif train.recipe_path is not None and (artifact.root / train.recipe_path).is_file():
        base = (artifact.root / train.recipe_path).parent
    else:
        base = Path(artifact.root)
    trained = parse_recipe(train.settings, f"{artifact.root}/manifest.json stages.train.settings", base)
    return load_splits(trained)
