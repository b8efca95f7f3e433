"""`pipe import`: make an artifact from an ONNX model made elsewhere, or from a transformers model directory.

Named `import_` because `import` is a Python keyword."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from pipeline.cli.group import main
from pipeline.cli.params import FRACTION, REPOSITORY, Whole


@main.command("import")
@click.argument("model", type=click.Path())
@click.option("--name", required=True, help="Artifact name: artifacts/NAME/<next version>/.")
@click.option(
    "--eval-data",
    type=click.Path(),
    default=None,
    help="Real inputs: an NPZ (one array per input name, optional 'target'), or a folder of pictures "
    "(class sub-folders label them), converted with the image preprocessing. See docs/export.md.",
)
@click.option(
    "--eval-limit",
    type=Whole(1, 1_000_000),  # the samples' 512 MiB cap lowers it further
    default=500,
    show_default=True,
    help="At most this many pictures from an --eval-data folder (chosen with seed 0).",
)
@click.option("--labels", default=None, help="Class names, comma separated: --labels cat,dog.")
@click.option("--labels-file", type=click.Path(), default=None, help="Class names, one per line.")
@click.option(
    "--task",
    type=click.Choice(["classification", "regression", "embedding", "detection", "tensor", "text-generation"]),
    default=None,
    help="What the outputs are. Default: the task the exporter recorded (Ultralytics), else classification "
    "when the outputs fit a classifier, else tensor; a transformers causal LM directory: text-generation. "
    "See docs/export.md and docs/language-models.md.",
)
@REPOSITORY
@click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME:D0,D1,...",
              help="Dims of input NAME (repeatable): an int fixes one, a name names one, ? or -1 leaves it free, "
              "e.g. x:1,3,48,192 for a model declaring [-1, 3, ?, ?]. See docs/export.md.")  # fmt: skip
@click.option(
    "--image-preprocessing",
    default=None,
    help='How pictures feed the image input, as JSON: \'{"mode": "RGB", "resize_short": 256, "crop": [224, 224], '
    '"scale": 0.00392156862745098, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}\' '
    '(or "size": [H, W] to stretch, "letterbox": {"size": [H, W], "pad": 114}; "resize": a Pillow filter; '
    "mean/std: applied outside the model; also layout NCHW|NHWC, input NAME). See docs/artifact.md.",
)
@click.option("--confidence", type=FRACTION, default=None, help="Detection: keep boxes scoring above this. [0.25]")
@click.option("--iou", type=FRACTION, default=None, help="Detection: NMS IoU above which a box is dropped. [0.7]")
@click.option("--max-detections", type=Whole(1, 100_000), default=None, help="Detection: boxes kept per picture. [300]")
@click.option("--pooling", type=click.Choice(["mean", "cls"]), default="mean", show_default=True,
              help="A transformers directory imported as --task embedding: mean over the attention mask, or the "
              "first (CLS) token.")  # fmt: skip
@click.option("--normalize", is_flag=True, help="A transformers directory, --task embedding: L2-normalize vectors.")
@click.option("--tokenizer", "tokenizer_dir", type=click.Path(), default=None,
              help="A directory with the model's fast tokenizer (tokenizer.json): carried in the artifact, so "
              "the model is served text; its limits are recorded. A transformers directory: its own.")  # fmt: skip
@click.option("--vocab-size", type=Whole(1, 1 << 31), default=None,
              help="A token model: the vocabulary size (ids below it). Default: read from the graph.")  # fmt: skip
@click.option("--padding-id", type=Whole(0, 1 << 31), default=None, help="A token model: the id padding a row.")
@click.option("--max-length", type=Whole(1, 1 << 24), default=None, help="A token model: its longest sequence.")
def import_cmd(
    model: str,
    name: str,
    eval_data: str | None,
    eval_limit: int,
    labels: str | None,
    labels_file: str | None,
    task: str | None,
    out_root: str,
    input_shapes: tuple[str, ...],
    image_preprocessing: str | None,
    confidence: float | None,
    iou: float | None,
    max_detections: int | None,
    pooling: str,
    normalize: bool,
    tokenizer_dir: str | None,
    vocab_size: int | None,
    padding_id: int | None,
    max_length: int | None,
) -> None:
    """Make an artifact from an ONNX MODEL produced elsewhere (JAX, TensorFlow, Paddle, Ultralytics, ...) or
    from a local transformers model directory (save_pretrained output; --task classification or embedding)."""
    from pipeline.artifact.dims import parse_input_shapes
    from pipeline.artifact.golden import load_golden
    from pipeline.cli.artifact_views import reading_text
    from pipeline.export.hf import is_transformers_dir, not_a_model
    from pipeline.export.importer import import_onnx, read_labels
    from pipeline.export.token_graph import TokenOptions
    from pipeline.samples.evaluation import GENERATED_NOTE

    path = Path(model)
    if is_transformers_dir(path):
        _import_transformers(path, name, out_root, task, pooling, normalize, tokenizer_dir)
        return
    if path.is_dir() or path.suffix.lower() == ".json":
        raise not_a_model(path)
    shapes = parse_input_shapes(input_shapes)
    names = read_labels(labels, Path(labels_file) if labels_file else None)
    evaluation = Path(eval_data) if eval_data else None
    detection = {"confidence": confidence, "iou": iou, "max_detections": max_detections}
    tokens = TokenOptions(vocab_size, padding_id, max_length, Path(tokenizer_dir) if tokenizer_dir else None)
    artifact = import_onnx(Path(model), name, Path(out_root), evaluation, names, task, image_preprocessing,
                           shapes, eval_limit, detection=detection, tokens=tokens)  # fmt: skip
    imported = artifact.manifest.stages.import_
    golden = imported.golden if imported else "?"
    click.echo(f"imported {model} -> {artifact.root} (golden outputs from {golden} inputs)")
    for what, reading in imported.read.items() if imported else ():
        click.echo(f"  {what}: {reading_text(what, reading.value)} ({reading.source})")
    for note in imported.notes if imported else ():
        click.echo(f"  note: {note}")
    if imported is not None and (pictures := imported.pictures) is not None:
        labelled = f", {len(pictures.classes)} class folders" if pictures.classes else ", unlabelled (a flat folder)"
        click.echo(f"  pictures: {pictures.used} of {pictures.found} (at most {pictures.limit}){labelled}")
    if imported is not None and imported.judged_on_generated:
        click.echo(f"  note: {GENERATED_NOTE}; give --eval-data (an .npz or a folder of pictures) to judge it")
    arrays = load_golden(artifact).inputs
    for spec in artifact.manifest.inputs:  # which sizes the free dims were run at
        shape = ", ".join(str(d) for d in spec.shape)
        click.echo(f"  golden {spec.name}: {list(arrays[spec.name].shape)} for [{shape}]")


def _import_transformers(
    path: Path, name: str, repository: str, task: str | None, pooling: str, normalize: bool, tokenizer: str | None
) -> None:
    """`pipe import DIR` of a transformers model directory."""
    import time

    from pipeline.core.errors import InputError
    from pipeline.export.causal_lm import TASK, architecture_of, import_causal_lm
    from pipeline.export.hf import HFSettings, import_hf

    started = time.perf_counter()
    architecture = architecture_of(path)
    if task in (None, TASK) and architecture is not None:
        artifact = import_causal_lm(path, name, Path(repository), Path(tokenizer) if tokenizer else None)
        _print_import(artifact, f"imported {path} -> {artifact.root} in {time.perf_counter() - started:.1f} s "
                      f"(transformers {architecture}, {TASK})")  # fmt: skip
        return
    if task is None:
        raise InputError(
            f"{path} is a transformers model but not a causal LM (config.json architectures name no *ForCausalLM "
            "or *LMHeadModel): say what it is for with --task classification or embedding"
        )
    if task == TASK:
        raise InputError(f"--task {TASK}: {path}/config.json names no *ForCausalLM or *LMHeadModel in architectures")
    settings = HFSettings(task=task, pooling=pooling, normalize=normalize)
    artifact = import_hf(path, name, Path(repository), settings, Path(tokenizer) if tokenizer else None)
    _print_import(artifact, f"imported {path} -> {artifact.root} in {time.perf_counter() - started:.1f} s "
                  f"(transformers, {task})")  # fmt: skip


def _print_import(artifact: Any, headline: str) -> None:
    """What a transformers import read and noted, under one headline."""
    imported = artifact.manifest.stages.import_
    click.echo(headline)
    for what, reading in imported.read.items() if imported else ():
        click.echo(f"  {what}: {reading.value} ({reading.source})")
    for note in imported.notes if imported else ():
        click.echo(f"  note: {note}")
