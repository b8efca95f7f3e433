"""`pipe run`: every stage of a recipe in turn, skipping those already up to date."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.cli.group import main
from pipeline.cli.params import REPOSITORY


@main.command("run")
@click.argument("recipe", type=click.Path())
@REPOSITORY
@click.option("--force", is_flag=True, help="Run every stage even when its output is up to date.")
def run_cmd(recipe: str, out_root: str, force: bool) -> None:
    """Run RECIPE's stages (train, export, optimize, edge, check, benchmark, report), skipping those up to date."""
    from pipeline.chain.chain import run_recipe

    run_recipe(recipe, out_root=Path(out_root), force=force, progress=click.echo)
