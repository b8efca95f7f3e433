"""`pipe check`: a candidate against a baseline (metrics, variants, I/O signature, size, latency)."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.cli.group import main
from pipeline.cli.params import Number


@main.command()
@click.argument("candidate", type=click.Path())
@click.option("--baseline", type=click.Path(), default=None,
              help="An artifact (artifacts/NAME[/VERSION]) or a .json written by --write-baseline.")  # fmt: skip
@click.option("--write-baseline", type=click.Path(), default=None, help="Write CANDIDATE's summary to this .json.")
@click.option("--max-accuracy-drop", type=float, default=None, help="Budget: metric drop allowed [default: recipe].")
@click.option("--max-latency-increase", type=float, default=None, help="Budget: 0.10 = 10% slower [default: recipe].")
@click.option("--max-size-increase", type=float, default=None, help="Budget: 0.10 = 10% larger [default: recipe].")
@click.option(
    "--max-perplexity-increase",
    type=float,
    default=None,
    help="Decoders: 0.05 = perplexity 5% higher on held-out text fails [default: recipe, 0.05].",
)
@click.option(
    "--min-greedy-agreement",
    type=float,
    default=None,
    help="Decoders: the least share of the baseline's greedy tokens generated alike [default: reported].",
)
@click.option("--latency-seconds", type=Number(0, 600, low_open=True), default=2.0, show_default=True,
              help="Time spent timing both models side by side.")  # fmt: skip
@click.option("--junit", type=click.Path(), default=None, help="Write JUnit XML (one testcase per check).")
@click.option("--markdown", type=click.Path(), default=None, help="Write Markdown (e.g. $GITHUB_STEP_SUMMARY).")
@click.option("--json", "json_file", type=click.Path(), default=None, help="Write every check as JSON.")
def check(
    candidate: str,
    baseline: str | None,
    write_baseline: str | None,
    latency_seconds: float,
    junit: str | None,
    markdown: str | None,
    json_file: str | None,
    **budgets: float | None,
) -> None:
    """Check CANDIDATE against a baseline: metrics, variants, I/O signature, size, latency (exit 1: a regression)."""
    from pipeline.core.errors import InputError

    if (baseline is None) == (write_baseline is None):
        raise InputError("pass --baseline BASELINE to check CANDIDATE, or --write-baseline FILE to write one, not both")
    if write_baseline is not None:
        from pipeline.artifact.directory import Artifact, resolve_artifact
        from pipeline.check.baseline import write_baseline as write

        loaded = Artifact.load(resolve_artifact(candidate))
        written = write(loaded, Path(write_baseline))
        click.echo(f"baseline: {written.name} v{written.version} -> {write_baseline}")
        return
    from pipeline.check.reports import to_table, write_reports
    from pipeline.check.verdict import check_candidate

    outcome = check_candidate(candidate, baseline, budgets, latency_seconds)
    for note in outcome.notes:
        click.secho(f"note: {note}", err=True, fg="yellow")
    click.echo(to_table(outcome))
    paths = [Path(p) if p else None for p in (junit, markdown, json_file)]
    for path in write_reports(outcome, *paths):
        click.echo(f"report: {path}")
    outcome.raise_on_failure()
