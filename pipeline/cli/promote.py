"""`pipe promote`: point a version label (stable, canary ...) at one version."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.cli.group import main


@main.command()
@click.argument("artifact", metavar="ARTIFACT_VERSION", type=click.Path())
@click.option("--label", default="stable", show_default=True, help="The label to point at this version (stable, "
              "canary ...); `stable` also takes the requests that name no version.")  # fmt: skip
@click.option("--force", is_flag=True, help="Promote a version whose recorded check failed.")
def promote(artifact: str, label: str, force: bool) -> None:
    """Point a version label (artifacts/NAME/labels.json) at ARTIFACT_VERSION (artifacts/NAME/N).

    A running `pipe serve` picks the label up on its next scan: `/v1/models/NAME/labels/LABEL` and
    `/v2/models/NAME/labels/LABEL/...` reach the version, and with `--versions promoted` only labelled
    versions are served.
    """
    from pipeline.artifact.directory import Artifact
    from pipeline.artifact.labels import check_label, write_label
    from pipeline.artifact.manifest import MANIFEST_NAME
    from pipeline.core.errors import InputError

    check_label(label)
    path = Path(artifact)
    if not (path / MANIFEST_NAME).is_file():
        raise InputError(f"{artifact}: no {MANIFEST_NAME} in it; give one version directory, artifacts/NAME/N")
    loaded = Artifact.load(path, verify=True)
    manifest, check = loaded.manifest, loaded.manifest.stages.check
    if check is not None and not check.passed and not force:
        raise InputError(
            f"{artifact}: its recorded check failed ({'; '.join(check.failures[:3]) or 'see its check report'}); "
            "fix the model, or pass --force to promote it anyway"
        )
    previous = write_label(loaded.root.parent, label, manifest.version)
    was = "" if previous is None else " (unchanged)" if previous == manifest.version else f" (was v{previous})"
    status = "no check record" if check is None else "check passed" if check.passed else "check FAILED"
    click.echo(f"{manifest.name}: {label} -> v{manifest.version}{was}; {status}")
