"""The recipe an artifact's later stages read: the file it was trained from, as that file is now.

Each stage after training reads its own recipe section as it is now (editing `export:` or
`optimize:` takes effect on the next run of that stage alone), while the model itself is always
rebuilt from the sections it was trained with, which the train record keeps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pipeline.artifact.directory import Artifact
from pipeline.artifact.records import TrainRecord
from pipeline.core.errors import ArtifactError, InputError
from pipeline.recipe.file import load_recipe
from pipeline.recipe.schema import Recipe, parse_recipe


def train_record(artifact: Artifact) -> TrainRecord:
    """The artifact's train record, or an error saying it was not trained here."""
    record = artifact.manifest.stages.train
    if record is None:
        raise ArtifactError(
            f"artifact {artifact.root} has no stages.train record: it was not trained by `pipe train`. "
            "Export works on trained artifacts; bring an ONNX model made elsewhere with `pipe import`"
        )
    return record


def current_recipe(artifact: Artifact, recipe_path: Path | None = None) -> tuple[Recipe, list[str]]:
    """The recipe as it is now, for the later stages' sections, and notes on where it came from.

    The model is always rebuilt from the sections it was trained with (the train record); the
    recipe file is read for the later stages' sections. It is the file given on the command line,
    else the one the train record points at (relative to the artifact). Without either, the
    trained sections are used with default settings for the rest, and a note says so.
    """
    record = train_record(artifact)
    where = f"{artifact.root}/manifest.json stages.train.settings"
    if recipe_path is None and record.recipe_path is not None:
        candidate = artifact.root / record.recipe_path
        if candidate.is_file():
            recipe_path = candidate
    if recipe_path is not None:
        recipe = load_recipe(recipe_path)
        if recipe.name != artifact.manifest.name:
            raise InputError(
                f"recipe {recipe_path} is for model {recipe.name!r}, but the artifact is {artifact.manifest.name!r}; "
                "pass the recipe this model was trained from (--recipe)"
            )
        return recipe, []
    note = (
        f"the recipe this model was trained from ({record.recipe_path}, relative to {artifact.root}) is not there; "
        "using the trained sections and default settings for the later stages (pass --recipe to read another)"
    )
    if record.recipe_path is None:  # `pipe train --from ARTIFACT --data FILE`: no recipe file was given
        note = (
            "this model was trained without a recipe file; using the trained sections and default settings for the "
            "later stages (pass --recipe to read one)"
        )
    return parse_recipe(record.settings, where, artifact.root), [note]


def section_settings(recipe: Recipe | None, section: str, overrides: dict[str, Any]) -> Any:
    """A later stage's recipe section (its defaults without a recipe) with the command line's values on top.

    Validated like the recipe; each problem names the flag (`--threads`) or the recipe key it came from.
    """
    spec = type(Recipe.model_fields[section].default)  # OptimizeSpec, EdgeSpec ...
    base = (getattr(recipe, section) if recipe is not None else spec()).model_dump()
    update = {k: v for k, v in overrides.items() if v is not None}
    try:
        return spec.model_validate({**base, **update})
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            key = str(err["loc"][0]) if err["loc"] else section
            where = f"--{key.replace('_', '-')}" if key in update else "the recipe's"
            problems.append(f"{where} {section}.{key}: {err['msg']} (got {err.get('input')!r})")
        raise InputError(f"{section} settings are invalid: {'; '.join(problems)}") from None
