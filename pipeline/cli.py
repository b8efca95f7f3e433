"""The `pipe` command line: thin click commands over the stages.

Each command imports its stage inside its body, so `pipe --help` and `pipe serve` never pay for
torch or tensorflow. This module is the one place that turns a PipelineError into a message and an
exit code: 0 ok, 1 a check failed, 2 bad usage or bad input.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from pipeline import __version__
from pipeline.errors import PipelineError


class PipeGroup(click.Group):
    """A click group that reports PipelineErrors as one clear message and the right exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PipelineError as exc:
            click.secho(f"error: {exc}", err=True, fg="red")
            sys.exit(exc.exit_code)


@click.group(cls=PipeGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pipe")
def main() -> None:
    """pipe: train a model, export it once to ONNX, verify, optimize, serve and ship it."""


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON instead of a table.")
@click.option("--no-verify", is_flag=True, help="Skip checking file hashes (inspect a damaged artifact).")
def info(artifact: str, as_json: bool, no_verify: bool) -> None:
    """Show an artifact's manifest (ARTIFACT: artifacts/NAME[/VERSION])."""
    from pipeline.artifact import Artifact, resolve_artifact
    from pipeline.report import manifest_table

    loaded = Artifact.load(resolve_artifact(artifact), verify=not no_verify)
    if as_json:
        click.echo(json.dumps(loaded.manifest.to_dict(), indent=2))
    else:
        click.echo(manifest_table(loaded))
