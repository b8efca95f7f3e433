"""How a stage that works from model.onnx (optimize, edge) opens its artifact, and when it is up to date.

    opened = open_for_model(path, "optimize", rewrites, overrides, recipe_path, flags="--quantize, ...")
    opened.artifact, opened.recipe, opened.settings, opened.evaluation, opened.parent, opened.notes

`opened` is an `Opened[OptimizeSpec]` (an `Opened[EdgeSpec]` for "edge"): its settings are typed.

The steps, the same for every such stage: resolve the path (a model directory means its latest
version); load the artifact with full verification except for the files this stage rewrites (an
interrupted run of the same stage left them, and it replaces them); refuse a version without a
model.onnx that passed its gate; refuse `--recipe` for an imported model (it has no recipe: its
settings come from flags and a `--settings` file, pipeline/stagekit/settings_file.py); read the
stage's recipe section as it is now with the command line's values on top; and the evaluation set
every candidate is judged on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Generic, Literal, TypeVar, overload

from pipeline.artifact.directory import Artifact, resolve_artifact
from pipeline.artifact.records import settings_digest
from pipeline.artifact.variants import FP32, MODEL_FILE
from pipeline.core.errors import ArtifactError, InputError
from pipeline.recipe.current import current_recipe, section_settings
from pipeline.samples.evaluation import EvaluationSet, evaluation_set, held_out_text
from pipeline.stagekit.contract import lm_refusal

if TYPE_CHECKING:
    from pipeline.recipe.schema import EdgeSpec, OptimizeSpec, Recipe
    from pipeline.stagekit.contract import Context, Overrides

Settings = TypeVar("Settings")  # the stage's recipe section: OptimizeSpec, EdgeSpec


@dataclass
class Opened(Generic[Settings]):
    """An artifact opened for a stage that derives files from its model.onnx."""

    artifact: Artifact
    recipe: Recipe | None  # the recipe as it is now; None for an imported model
    settings: Settings  # the stage's recipe section with the overrides on top
    evaluation: EvaluationSet
    rewritten: list[str]  # the files of an earlier run of this stage, which this run replaces
    notes: list[str] = field(default_factory=list)  # where the settings came from, when not the recipe file

    @property
    def parent(self) -> str:
        """The sha256 of the model.onnx every file this stage makes derives from."""
        return self.artifact.manifest.files[MODEL_FILE].sha256

    @property
    def model(self) -> Path:
        return self.artifact.path(MODEL_FILE)


@overload
def open_for_model(
    path: str | Path,
    stage: Literal["optimize"],
    rewrites: Callable[[str], bool],
    overrides: Overrides | None,
    recipe_path: Path | None,
    *,
    flags: str,
) -> Opened[OptimizeSpec]: ...


@overload
def open_for_model(
    path: str | Path,
    stage: Literal["edge"],
    rewrites: Callable[[str], bool],
    overrides: Overrides | None,
    recipe_path: Path | None,
    *,
    flags: str,
) -> Opened[EdgeSpec]: ...


def open_for_model(
    path: str | Path,
    stage: Literal["optimize", "edge"],
    rewrites: Callable[[str], bool],
    overrides: Overrides | None,
    recipe_path: Path | None,
    *,
    flags: str,
) -> Opened[OptimizeSpec] | Opened[EdgeSpec]:
    """Open the artifact at `path` for `stage`; see the module doc. `rewrites(rel)` says whether the stage
    writes that file anew; `flags` names the stage's settings flags for the imported-model refusal."""
    root = resolve_artifact(path)
    loaded = Artifact.load(root, verify=False)  # which files this stage rewrites: left out of the check below
    rewritten = [rel for rel in loaded.manifest.files if rewrites(rel)]
    artifact = Artifact.load(root, replacing=rewritten)
    manifest = artifact.manifest
    refused = lm_refusal(stage, manifest.task, artifact.root)
    if refused:
        raise InputError(refused)
    fp32 = manifest.variants.get(FP32)
    if MODEL_FILE not in manifest.files or (fp32 is not None and not fp32.passed):
        raise ArtifactError(
            f"artifact {artifact.root} has no model.onnx that passed its gate; "
            "run `pipe export` (or `pipe import`) first"
        )
    if recipe_path is not None and manifest.stages.train is None:
        raise InputError(
            f"--recipe {recipe_path}: artifact {artifact.root} was imported, not trained from a recipe; "
            f"give its {stage} settings on the command line ({flags}) or in a settings file's {stage} section "
            "(--settings FILE)"
        )
    recipe, notes = current_recipe(artifact, recipe_path) if manifest.stages.train else (None, [])
    settings = section_settings(recipe, stage, dict(overrides or {}))
    generating = manifest.task == "text-generation"  # a decoder is judged on its held-out text, in golden.npz
    evaluation = held_out_text(artifact) if generating else evaluation_set(artifact, recipe)
    return Opened(artifact, recipe, settings, evaluation, rewritten, notes)


def made_from_model_fresh(ctx: Context, stage: str, what: str) -> str | None:
    """Up to date when the stage's record has the recipe's section as it is now, was made from the model.onnx
    the version holds now, and every variant it made is still recorded; a stage whose record lists failed
    variants it must not pass over (edge) checks that itself."""
    manifest = Artifact.load(ctx.version, verify=False).manifest
    record = getattr(manifest.stages, stage)
    if record is None or MODEL_FILE not in manifest.files or record.parent != manifest.files[MODEL_FILE].sha256:
        return None  # never ran, or model.onnx was exported again since
    if record.settings_digest() != settings_digest(getattr(ctx.recipe, stage).model_dump(mode="json")):
        return None
    if any(name not in manifest.variants for name in record.variants):
        return None
    return f"its {what} ({', '.join(record.variants)}) were made from this model.onnx with these settings"
