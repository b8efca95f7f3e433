"""`pipe predict`: run one variant on an input file or on texts, locally."""

from __future__ import annotations

import click

from pipeline.cli.group import main
from pipeline.cli.params import FRACTION, Whole


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--input", "input_file", default=None, type=click.Path(),
              help="FILE.npz (one array per input name), FILE.json (an object keyed by input name, or a list for "
              "one input), a PNG/JPEG for a model with one image input, or for a model trained on a table "
                   "FILE.json of rows keyed by column name or FILE.csv with a header row.")  # fmt: skip
@click.option("--text", "texts", multiple=True, help="A text for a model that carries its tokenizer, one row each "
              "(repeatable); instead of --input.")  # fmt: skip
@click.option("--variant", default="fp32", show_default=True, help="The variant to run: fp32 (model.onnx), opt, "
              "int8, tflite-fp16 ... (pipe info lists them).")  # fmt: skip
@click.option("--top-k", default=5, show_default=True, type=Whole(1, 100_000), help="Classes shown per sample.")
@click.option("--allow-failed", is_flag=True, help="Run a failed or stale variant anyway (a note says why it is not "
              "usable).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print JSON: top_k or detections per sample and the outputs.")
@click.option("--confidence", type=FRACTION, default=None, help="Detection: keep boxes scoring above this. [recorded]")
@click.option("--iou", type=FRACTION, default=None, help="Detection: NMS IoU above which a box is dropped. [recorded]")
@click.option("--max-detections", type=Whole(1, 100_000), default=None, help="Detection: boxes kept per sample. "
              "[recorded]")  # fmt: skip
def predict(
    artifact: str,
    input_file: str | None,
    texts: tuple[str, ...],
    variant: str,
    top_k: int,
    allow_failed: bool,
    as_json: bool,
    confidence: float | None,
    iou: float | None,
    max_detections: int | None,
) -> None:
    """Run one variant of ARTIFACT on an input file or on texts, locally, for a quick look (top-k labels for
    classifiers, boxes for detectors)."""
    from pipeline.predict.command import predict_file

    detection = {"confidence": confidence, "iou": iou, "max_detections": max_detections}
    result = predict_file(artifact, input_file, variant, allow_failed, detection, list(texts))
    for note in result.notes:
        click.secho(f"note: {note}", err=True, fg="yellow")
    click.echo(result.to_json(top_k) if as_json else result.text(top_k))
