"""`pipe benchmark`: every format of an artifact side by side (size, metric, latency)."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.cli.group import main
from pipeline.cli.params import THREADS, Number


@main.command()
@click.argument("artifact", type=click.Path())
@click.option(
    "--seconds", type=Number(0, 60, low_open=True), default=1.0, show_default=True, help="Timed runs per row and batch."
)
@click.option("--threads", type=THREADS, default=1, show_default=True, help="Threads every runtime runs with.")
@click.option("--json", "json_copy", type=click.Path(), default=None, help="Also write the JSON report to this file.")
@click.option("--no-plot", is_flag=True, help="Write no reports/benchmark.png.")
def benchmark(artifact: str, seconds: float, threads: int, json_copy: str | None, no_plot: bool) -> None:
    """Time every format of ARTIFACT side by side: torch, ONNX and its variants, TFLite (size, metric, latency)."""
    from pipeline.artifact.directory import resolve_artifact
    from pipeline.benchmark.stage import benchmark_artifact
    from pipeline.benchmark.table import render
    from pipeline.core.fsutil import write_user_file

    overrides = {"seconds": seconds, "threads": threads}
    outcome = benchmark_artifact(resolve_artifact(artifact), overrides, progress=click.echo, plot=not no_plot)
    click.echo(render(outcome))
    for note in outcome.notes:
        click.secho(f"note: {note}", err=True, fg="yellow")
    if json_copy is not None:
        write_user_file(Path(json_copy), outcome.report.read_bytes(), "--json")
    for path in (outcome.report, outcome.plot, json_copy):
        if path is not None:
            click.echo(f"report: {path}")
