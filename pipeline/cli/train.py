"""`pipe train`: train a recipe into a new artifact version, or continue an artifact's model with ONNX Runtime."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from pipeline.cli.group import main
from pipeline.cli.params import REPOSITORY, Whole


@main.command()
@click.argument("recipe", type=click.Path(), required=False)
@click.option("--resume", is_flag=True, help="Continue the newest unfinished run of this recipe from its checkpoint.")
@click.option("--epochs", type=Whole(1, 100_000), help="Override train.epochs.")
@click.option(
    "--device", type=click.Choice(["auto", "cpu", "cuda"]), help="Override train.device (auto: CUDA if present)."
)
@click.option(
    "--nproc",
    default=1,
    show_default=True,
    type=Whole(1, 1024),
    help="Processes on this machine (torchrun; DDP or FSDP).",
)
@click.option(
    "--backend",
    type=click.Choice(["torch", "ort"]),
    default=None,
    help="Override train.backend: torch, or ort (ONNX Runtime training on the ONNX graph; make ort-runtime).",
)
@click.option(
    "--from",
    "from_artifact",
    type=click.Path(),
    default=None,
    help="Continue training this artifact's model.onnx (any artifact, imported ones too) with the ort backend.",
)
@click.option(
    "--trainable",
    multiple=True,
    metavar="PATTERN",
    help="With --from: glob pattern of the parameters to train (repeatable); `pipe info ARTIFACT --trainable` "
    "lists them. Default: all.",
)
@click.option(
    "--data", "data_file", type=click.Path(), default=None, help="With --from: an NPZ of X and y to train on."
)
@REPOSITORY
@click.option("--quiet", is_flag=True, help="No progress display (metrics still go to reports/).")
def train(
    recipe: str | None,
    resume: bool,
    epochs: int | None,
    device: str | None,
    nproc: int,
    backend: str | None,
    from_artifact: str | None,
    trainable: tuple[str, ...],
    data_file: str | None,
    out_root: str,
    quiet: bool,
) -> None:
    """Train RECIPE (models/NAME.yaml) into a new artifact version: artifacts/NAME/VERSION.

    Also runs under your own torchrun (e.g. `torchrun --nnodes 2 ... -m pipeline train RECIPE`).
    With --from ARTIFACT, continues training that artifact's model with ONNX Runtime (the parent's
    model directory gets the new version): on --data, or on RECIPE's data and train sections.
    """
    import os

    from pipeline.core.errors import InputError
    from pipeline.train.observe import TENSORBOARD_DIR
    from pipeline.train.stage import train_recipe

    source: Any = recipe
    if from_artifact is not None:
        from pipeline.train.ort_train import recipe_from_artifact

        if backend == "torch":
            raise InputError("--from continues an ONNX model, which only --backend ort trains; leave --backend out")
        source = recipe_from_artifact(from_artifact, recipe, data_file, list(trainable))
        out_root = str(_parent_repository(source.model.artifact, out_root))
    elif recipe is None:
        raise InputError("pipe train needs a RECIPE (models/NAME.yaml), or --from ARTIFACT to continue a model")
    elif trainable or data_file:
        raise InputError("--trainable and --data go with --from ARTIFACT; a recipe sets train.trainable and data")
    root = train_recipe(
        source,
        resume=resume,
        epochs=epochs,
        device=device,
        nproc=nproc,
        out_root=Path(out_root),
        quiet=quiet,
        backend=backend,
    )
    if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 alone reports
        click.echo(f"trained {root}")
        if not quiet:  # --quiet prints the version's path alone, for scripts
            click.echo(f"curves: tensorboard --logdir {root.parent}  (this run: {root / TENSORBOARD_DIR})")


def _parent_repository(parent: str, out_root: str) -> Path:
    """--from: the repository holding the parent's model directory, where the new version goes; a
    --repository given for another one is refused (the version belongs beside its parent)."""
    from click.core import ParameterSource

    from pipeline.core.errors import InputError

    repository = Path(parent).parent.parent  # <repository>/<name>/<version>, resolved by recipe_from_artifact
    given = click.get_current_context().get_parameter_source("out_root")
    if given is not ParameterSource.DEFAULT and Path(out_root).resolve() != repository:
        raise InputError(
            f"--repository {out_root}: with --from, the new version goes into the parent's model directory "
            f"({Path(parent).parent}); leave --repository out, or pass {repository}"
        )
    return repository
