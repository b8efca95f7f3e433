"""`pipe export`: model.onnx through the parity gate, TFLite edge models (`--target edge`), or a Triton repository."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from pipeline.cli.gate_options import BUDGET_FLAGS, GATE_FLAGS, gate_flags, gate_options, refuse
from pipeline.cli.group import main
from pipeline.cli.params import Whole


@main.command()
@click.argument("artifact", type=click.Path())
@click.option(
    "--target",
    type=click.Choice(["server", "edge", "triton"]),
    default="server",
    show_default=True,
    help="server: model.onnx in the artifact, parity-gated against torch; edge: TFLite fp32/fp16/int8 from "
    "model.onnx, verified on LiteRT; triton: a Triton model repository from model.onnx (needs --out).",
)
@click.option("--precision", "precisions", multiple=True, type=click.Choice(["fp32", "fp16", "int8"]),
              help="Edge: TFLite models to make (repeatable) [default: recipe edge.precisions].")  # fmt: skip
@click.option("--layout", type=click.Choice(["nhwc", "nchw"], case_sensitive=False), default=None,
              help="Edge: image input layout, NHWC for devices or the server's NCHW [default: recipe].")  # fmt: skip
@click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME:D0,D1,...",
              help="Edge: dims of input NAME on the device (repeatable), as pipe import takes them, e.g. "
              "x:?,3,48,192 [default: free dims but the batch fixed from what the artifact knows].")  # fmt: skip
@click.option("--convert-timeout", "convert_timeout", type=click.FloatRange(min=1, max=86_400), default=None,
              metavar="SECONDS", help="Edge: seconds all onnx2tf attempts together may take, each at most a third "
              "[default: recipe edge.timeout_s, 1800].")  # fmt: skip
@click.option("--opset", type=Whole(7, 100), default=None, help="ONNX opset [default: recipe export.opset]")
@click.option(
    "--exporter",
    type=click.Choice(["dynamo", "torchscript"]),
    default=None,
    help="dynamo falls back to torchscript and logs why [default: the recipe's export.dynamo]",
)
@gate_options("the recipe's export or edge section")
@click.option("--recipe", type=click.Path(), default=None,
              help="Recipe to read export settings from [default: the one it was trained from].")  # fmt: skip
@click.option("--out", type=click.Path(), default=None, help="Triton: the model repository directory to write into.")
@click.option("--max-batch-size", type=Whole(1, 1 << 20), default=64, show_default=True, help="Triton batching.")
@click.option("--instance-kind", type=click.Choice(["cpu", "gpu"]), default=None,
              help="Triton: pin the model to CPU or GPU instances [default: none written; Triton uses its GPUs "
              "when it has them, else the CPU].")  # fmt: skip
def export(
    artifact: str,
    target: str,
    precisions: tuple[str, ...],
    layout: str | None,
    input_shapes: tuple[str, ...],
    convert_timeout: float | None,
    opset: int | None,
    exporter: str | None,
    recipe: str | None,
    out: str | None,
    max_batch_size: int,
    instance_kind: str | None,
    settings_file: str | None,
    **options: Any,
) -> None:
    """Export a trained ARTIFACT to ONNX through the parity gate (exit 1 when it drifts).

    Settings come from the recipe's export section as it is now (or edge's, with --target edge), then a
    --settings file's, then the flags for this run.
    """
    from pipeline.stagekit.settings_file import layered

    gate = gate_flags(options)
    if input_shapes and target != "edge":
        from pipeline.core.errors import InputError

        raise InputError(f"--input-shape is an edge option (the device's dims); it is not read with --target {target}")
    if convert_timeout is not None and target != "edge":
        from pipeline.core.errors import InputError

        raise InputError(f"--convert-timeout is an edge option (onnx2tf's time); it is not read with --target {target}")
    if target == "edge":
        from pipeline.artifact.dims import parse_input_shapes
        from pipeline.edge.stage import edge_artifact

        shapes = parse_input_shapes(input_shapes) or None
        flags = {"precisions": list(precisions) or None, "layout": layout and layout.lower(), "input_shapes": shapes,
                 "timeout_s": convert_timeout}  # fmt: skip
        overrides = layered(settings_file, "edge", {**flags, **gate})
        outcome = edge_artifact(artifact, overrides, Path(recipe) if recipe else None, progress=click.echo)
        for note in outcome.notes:
            click.secho(f"note: {note}", err=True, fg="yellow")
        for m in outcome.made:
            click.echo(f"  {m.name:<13} passed  {m.converted.path.name}  ({m.converted.seconds:.1f} s to convert)")
        return
    if target == "triton":
        from pipeline.artifact.directory import Artifact, resolve_artifact
        from pipeline.core.errors import InputError
        from pipeline.export.triton import write_repository

        untaken = {**GATE_FLAGS, "settings": "--settings"}
        refuse(
            {**gate, "settings": settings_file},
            untaken,
            "--target triton copies model.onnx into a model repository and judges nothing; leave it out",
        )
        if out is None:
            raise InputError("--target triton writes a model repository: pass --out DIR (e.g. --out triton-models)")
        model_dir = write_repository(
            Artifact.load(resolve_artifact(artifact)), Path(out), max_batch_size, instance_kind
        )
        click.echo(f"Triton model repository: {model_dir} (config.pbtxt + version directory)")
        return
    from pipeline.artifact.variants import MODEL_FILE
    from pipeline.export.stage import export_artifact

    refuse(gate, BUDGET_FLAGS, "a budget of lossy candidates (fp16, int8); pipe export --target server makes only "
           "the lossless model.onnx, held to --atol, --rtol, --metric-tolerance, --max-out-of-tolerance")  # fmt: skip
    dynamo = None if exporter is None else exporter == "dynamo"
    overrides = layered(settings_file, "export", {"opset": opset, "dynamo": dynamo, **gate})
    outcome = export_artifact(artifact, overrides, Path(recipe) if recipe else None, progress=lambda _: None)
    for note in outcome.notes:
        click.secho(f"note: {note}", err=True, fg="yellow")
    result = outcome.result
    via = result.exporter + (f" (fallback: {result.fallback_reason})" if result.fallback_reason else "")
    click.echo(outcome.report.table())
    click.echo(f"exported {outcome.artifact.root / MODEL_FILE}: opset {result.opset}, exporter {via}")
