"""`pipe info`: a version's manifest, or every version of a model (the views: pipeline/cli/artifact_views.py)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from pipeline.cli.group import main


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON instead of a table.")
@click.option("--no-verify", is_flag=True, help="Skip checking file hashes (inspect a damaged artifact).")
@click.option(
    "--trainable", is_flag=True, help="List model.onnx's parameters, the names `pipe train --from --trainable` takes."
)
def info(artifact: str, as_json: bool, no_verify: bool, trainable: bool) -> None:
    """Show a version's manifest (artifacts/NAME/VERSION), or every version of a model (artifacts/NAME).

    A model directory lists each version with its stages and status; --json prints its newest
    version's manifest.
    """
    if trainable:
        from pipeline.cli.artifact_views import trainable_table

        click.echo(trainable_table(artifact, verify=not no_verify))
        return
    from pipeline.artifact.directory import Artifact, is_version_name, resolve_artifact
    from pipeline.artifact.manifest import MANIFEST_NAME
    from pipeline.cli.artifact_views import describe_path, manifest_table
    from pipeline.core.errors import ArtifactError

    path = Path(artifact)
    is_version = (path / MANIFEST_NAME).is_file() or is_version_name(path.name) or path.name.isdigit()
    if not is_version and (not as_json or path.is_file()):  # a bare .onnx is pointed at pipe import
        overview, damaged = describe_path(path)
        click.echo(overview)
        if damaged:
            raise ArtifactError(f"{len(damaged)} version(s) did not load: {', '.join(damaged)} (reasons above)")
        return
    loaded = Artifact.load(resolve_artifact(artifact), verify=not no_verify)
    if as_json:
        click.echo(json.dumps(loaded.manifest.to_dict(), indent=2))
    else:
        click.echo(manifest_table(loaded))
