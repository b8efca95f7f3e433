"""`pipe optimize`: graph-optimized and quantized variants of model.onnx, each judged and timed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from pipeline.cli.gate_options import gate_flags, gate_options
from pipeline.cli.group import main
from pipeline.recipe.defaults import MAX_EXCLUSIONS, QUANTIZE_CHOICES, SEARCH_SECONDS


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--quantize", "quantize", multiple=True, type=click.Choice(QUANTIZE_CHOICES),
              help="Variants to make (repeatable) [default: the recipe's optimize.quantize].")  # fmt: skip
@click.option("--graph", type=click.Choice(["none", "basic", "extended"]), default=None,
              help="onnxruntime offline level for variants/model.opt.onnx [default: recipe].")  # fmt: skip
@gate_options("the recipe's optimize section")
@click.option("--per-channel/--per-tensor", default=None, help="int8 weight scales [default: recipe].")
@click.option("--calibration", type=click.Choice(["minmax", "entropy", "percentile"]), default=None,
              help="Static int8: how activation ranges are set [default: recipe].")  # fmt: skip
@click.option("--reduce-range/--full-range", default=None, help="int8 weights in 7 bits (CPUs without VNNI).")
@click.option("--activation-type", type=click.Choice(["uint8", "int8"]), default=None, help="Static int8 activations.")
@click.option(
    "--calibration-samples",
    type=int,
    default=None,
    help="Real training samples static int8 calibrates on.",
)
@click.option("--slim/--no-slim", default=None, help="onnxslim after onnxruntime's passes for the opt variant.")
@click.option(
    "--max-exclusions",
    type=int,
    default=None,
    help=f"auto: nodes the search may leave in fp32 [default: {MAX_EXCLUSIONS}].",
)
@click.option(
    "--search-seconds",
    type=float,
    default=None,
    help=f"auto: no new candidate after N seconds, the best so far kept [default: {SEARCH_SECONDS:g}].",
)
@click.option(
    "--weight-block-size",
    type=click.Choice(["16", "32", "64", "128", "256"]),
    default=None,
    help="Decoders' int8-weights/int4-weights: weight values sharing one scale [default: recipe, 32].",
)
@click.option(
    "--weight-symmetric/--weight-asymmetric",
    default=None,
    help="Decoders' weight-only kinds: symmetric (no zero point) or not [default: recipe, symmetric].",
)
@click.option(
    "--weight-accuracy-level",
    type=click.IntRange(0, 4),
    default=None,
    help="Decoders' weight-only kinds: MatMulNBits' CPU compute precision, 0 (as stored) to 4 (int8 "
    "activations) [default: recipe, 4].",
)
@click.option(
    "--weight-embeddings/--no-weight-embeddings",
    default=None,
    help="Decoders' weight-only kinds: store the token embedding in the same bits too [default: recipe, no].",
)
@click.option("--threads", type=int, default=None, help="Intra-op threads the variants are timed with.")
@click.option("--strict/--no-strict", default=None, help="Exit 1 when a variant misses its budget [default: recipe].")
@click.option("--recipe", type=click.Path(), default=None, help="Recipe to read optimize settings from.")
def optimize(
    artifact: str, quantize: tuple[str, ...], recipe: str | None, settings_file: str | None, **options: Any
) -> None:
    """Graph-optimize and quantize ARTIFACT's model.onnx into verified variants (variants/, reports/optimize.md).

    Every variant is judged against model.onnx (the graph-only variant as lossless: --atol, --rtol,
    --metric-tolerance; the others by the task metric's drop, or agreement, cosine or relative error
    without labels) and timed beside it; a --settings file's optimize section sits under the flags. One
    that misses its budget is recorded as failed and never served by default; --strict also makes the
    command exit 1.
    """
    from pipeline.optimize.stage import optimize_artifact
    from pipeline.stagekit.settings_file import layered

    gate = gate_flags(options)
    if options.get("weight_block_size") is not None:
        options["weight_block_size"] = int(options["weight_block_size"])
    overrides = layered(settings_file, "optimize", {**options, **gate, "quantize": list(quantize) or None})
    outcome = optimize_artifact(artifact, overrides, Path(recipe) if recipe else None, progress=click.echo)
    for note in outcome.notes:
        click.secho(f"note: {note}", err=True, fg="yellow")
    for m in outcome.made:
        status = "passed" if m.verdict.passed else "FAILED (not served)"
        click.echo(f"  {m.name:<13} {status:<20} {m.verdict.detail}")
    click.echo(f"report: {outcome.artifact.root / 'reports' / 'optimize.md'}")
