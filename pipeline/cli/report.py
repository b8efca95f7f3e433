"""`pipe report`: an artifact's model card and training curves."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.cli.group import main


@main.command()
@click.argument("artifact", type=click.Path())
def report(artifact: str) -> None:
    """Write ARTIFACT's model card (reports/model-card.md) and training curves (reports/training-curves.png)."""
    from pipeline.report.stage import report_artifact

    outcome = report_artifact(Path(artifact), progress=click.echo)
    for note in outcome.notes:
        click.secho(f"note: {note}", err=True, fg="yellow")
    click.echo(f"card: {outcome.card}")
    click.echo(f"curves: {outcome.curves or 'none (see the note)'}")
