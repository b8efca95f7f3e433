"""Commands that make or change an artifact: train, import, export, optimize, and run, which chains them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from pipeline.cli.group import main
from pipeline.cli.params import FRACTION, REPOSITORY, TOLERANCE, Whole


@main.command()
@click.argument("recipe", type=click.Path(), required=False)
@click.option("--resume", is_flag=True, help="Continue the newest unfinished run of this recipe from its checkpoint.")
@click.option("--epochs", type=Whole(1, 100_000), help="Override train.epochs.")
@click.option(
    "--device", type=click.Choice(["auto", "cpu", "cuda"]), help="Override train.device (auto: CUDA if present)."
)
@click.option(
    "--nproc",
    default=1,
    show_default=True,
    type=Whole(1, 1024),
    help="Processes on this machine (torchrun; DDP or FSDP).",
)
@click.option(
    "--backend",
    type=click.Choice(["torch", "ort"]),
    default=None,
    help="Override train.backend: torch, or ort (ONNX Runtime training on the ONNX graph; make ort-runtime).",
)
@click.option(
    "--from",
    "from_artifact",
    type=click.Path(),
    default=None,
    help="Continue training this artifact's model.onnx (any artifact, imported ones too) with the ort backend.",
)
@click.option(
    "--trainable",
    multiple=True,
    metavar="PATTERN",
    help="With --from: glob pattern of the parameters to train (repeatable); `pipe info ARTIFACT --trainable` "
    "lists them. Default: all.",
)
@click.option(
    "--data", "data_file", type=click.Path(), default=None, help="With --from: an NPZ of X and y to train on."
)
@REPOSITORY
@click.option("--quiet", is_flag=True, help="No progress display (metrics still go to reports/).")
def train(
    recipe: str | None,
    resume: bool,
    epochs: int | None,
    device: str | None,
    nproc: int,
    backend: str | None,
    from_artifact: str | None,
    trainable: tuple[str, ...],
    data_file: str | None,
    out_root: str,
    quiet: bool,
) -> None:
    """Train RECIPE (models/NAME.yaml) into a new artifact version: artifacts/NAME/VERSION.

    Also runs under your own torchrun (e.g. `torchrun --nnodes 2 ... -m pipeline train RECIPE`).
    With --from ARTIFACT, continues training that artifact's model with ONNX Runtime (the parent's
    model directory gets the new version): on --data, or on RECIPE's data and train sections.
    """
    import os

    from pipeline.core.errors import InputError
    from pipeline.train.observe import TENSORBOARD_DIR
    from pipeline.train.stage import train_recipe

    source: Any = recipe
    if from_artifact is not None:
        from pipeline.train.ort_train import recipe_from_artifact

        if backend == "torch":
            raise InputError("--from continues an ONNX model, which only --backend ort trains; leave --backend out")
        source = recipe_from_artifact(from_artifact, recipe, data_file, list(trainable))
    elif recipe is None:
        raise InputError("pipe train needs a RECIPE (models/NAME.yaml), or --from ARTIFACT to continue a model")
    elif trainable or data_file:
        raise InputError("--trainable and --data go with --from ARTIFACT; a recipe sets train.trainable and data")
    root = train_recipe(
        source,
        resume=resume,
        epochs=epochs,
        device=device,
        nproc=nproc,
        out_root=Path(out_root),
        quiet=quiet,
        backend=backend,
    )
    if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 alone reports
        click.echo(f"trained {root}")
        if not quiet:  # --quiet prints the version's path alone, for scripts
            click.echo(f"curves: tensorboard --logdir {root.parent}  (this run: {root / TENSORBOARD_DIR})")


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
    type=click.Choice(["classification", "regression", "embedding", "detection", "tensor"]),
    default=None,
    help="What the outputs are. Default: the task the exporter recorded (Ultralytics), else classification "
    "when the outputs fit a classifier, else tensor. See docs/export.md.",
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
    from pipeline.cli.info import reading_text
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
    from pipeline.export.hf import HFSettings, import_hf

    if task is None:
        raise InputError(f"{path} is a transformers model: say what it is for with --task classification or embedding")
    started = time.perf_counter()
    settings = HFSettings(task=task, pooling=pooling, normalize=normalize)
    artifact = import_hf(path, name, Path(repository), settings, Path(tokenizer) if tokenizer else None)
    imported = artifact.manifest.stages.import_
    click.echo(f"imported {path} -> {artifact.root} in {time.perf_counter() - started:.1f} s (transformers, {task})")
    for what, reading in imported.read.items() if imported else ():
        click.echo(f"  {what}: {reading.value} ({reading.source})")
    for note in imported.notes if imported else ():
        click.echo(f"  note: {note}")


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
@click.option("--opset", type=Whole(7, 100), default=None, help="ONNX opset [default: recipe export.opset]")
@click.option(
    "--exporter",
    type=click.Choice(["dynamo", "torchscript"]),
    default=None,
    help="dynamo falls back to torchscript and logs why [default: the recipe's export.dynamo]",
)
@click.option("--atol", type=TOLERANCE, default=None, help="Parity: max abs difference [default: recipe export.atol]")
@click.option("--rtol", type=TOLERANCE, default=None, help="Parity: relative difference [default: recipe export.rtol]")
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
    opset: int | None,
    exporter: str | None,
    atol: float | None,
    rtol: float | None,
    recipe: str | None,
    out: str | None,
    max_batch_size: int,
    instance_kind: str | None,
) -> None:
    """Export a trained ARTIFACT to ONNX through the parity gate (exit 1 when it drifts).

    Settings come from the recipe's export section as it is now; --opset, --exporter, --atol and
    --rtol override it for this run.
    """
    if input_shapes and target != "edge":
        from pipeline.core.errors import InputError

        raise InputError(f"--input-shape is an edge option (the device's dims); it is not read with --target {target}")
    if target == "edge":
        from pipeline.artifact.dims import parse_input_shapes
        from pipeline.edge.stage import edge_artifact

        shapes = parse_input_shapes(input_shapes) or None
        overrides = {
            "precisions": list(precisions) or None,
            "layout": layout and layout.lower(),
            "input_shapes": shapes,
        }
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

        if out is None:
            raise InputError("--target triton writes a model repository: pass --out DIR (e.g. --out triton-models)")
        model_dir = write_repository(
            Artifact.load(resolve_artifact(artifact)), Path(out), max_batch_size, instance_kind
        )
        click.echo(f"Triton model repository: {model_dir} (config.pbtxt + version directory)")
        return
    from pipeline.artifact.variants import MODEL_FILE
    from pipeline.export.stage import export_artifact

    dynamo = None if exporter is None else exporter == "dynamo"
    overrides = {"opset": opset, "dynamo": dynamo, "atol": atol, "rtol": rtol}
    outcome = export_artifact(artifact, overrides, Path(recipe) if recipe else None, progress=lambda _: None)
    for note in outcome.notes:
        click.secho(f"note: {note}", err=True, fg="yellow")
    result = outcome.result
    via = result.exporter + (f" (fallback: {result.fallback_reason})" if result.fallback_reason else "")
    click.echo(outcome.report.table())
    click.echo(f"exported {outcome.artifact.root / MODEL_FILE}: opset {result.opset}, exporter {via}")


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--quantize", "quantize", multiple=True, type=click.Choice(["dynamic", "static", "fp16", "auto"]),
              help="Variants to make (repeatable) [default: the recipe's optimize.quantize].")  # fmt: skip
@click.option("--graph", type=click.Choice(["none", "basic", "extended"]), default=None,
              help="onnxruntime offline level for variants/model.opt.onnx [default: recipe].")  # fmt: skip
@click.option("--max-accuracy-drop", type=float, default=None, help="Budget: task-metric drop allowed (its units).")
@click.option(
    "--min-cosine",
    type=float,
    default=None,
    help="Budget for embeddings: minimum cosine similarity.",
)
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
@click.option("--max-exclusions", type=int, default=None, help="auto: nodes the search may leave in fp32.")
@click.option("--search-seconds", type=float, default=None,
              help="auto: start no new candidate after N seconds, keep the best so far [default: 120].")  # fmt: skip
@click.option("--threads", type=int, default=None, help="Intra-op threads the variants are timed with.")
@click.option("--strict/--no-strict", default=None, help="Exit 1 when a variant misses its budget [default: recipe].")
@click.option("--recipe", type=click.Path(), default=None, help="Recipe to read optimize settings from.")
def optimize(artifact: str, quantize: tuple[str, ...], recipe: str | None, **options: Any) -> None:
    """Graph-optimize and quantize ARTIFACT's model.onnx into verified variants (variants/, reports/optimize.md).

    Every variant is judged against model.onnx (the task metric's drop, or agreement, cosine or
    relative error without labels) and timed beside it. One that misses its budget is recorded as
    failed and never served by default; --strict also makes the command exit 1.
    """
    from pipeline.optimize.stage import optimize_artifact

    overrides = {**options, "quantize": list(quantize) or None}
    outcome = optimize_artifact(artifact, overrides, Path(recipe) if recipe else None, progress=click.echo)
    for note in outcome.notes:
        click.secho(f"note: {note}", err=True, fg="yellow")
    for m in outcome.made:
        status = "passed" if m.verdict.passed else "FAILED (not served)"
        click.echo(f"  {m.name:<13} {status:<20} {m.verdict.detail}")
    click.echo(f"report: {outcome.artifact.root / 'reports' / 'optimize.md'}")


@main.command("run")
@click.argument("recipe", type=click.Path())
@REPOSITORY
@click.option("--force", is_flag=True, help="Run every stage even when its output is up to date.")
def run_cmd(recipe: str, out_root: str, force: bool) -> None:
    """Run RECIPE's stages (train, export, optimize, edge, check, benchmark, report), skipping those up to date."""
    from pipeline.chain.chain import run_recipe

    run_recipe(recipe, out_root=Path(out_root), force=force, progress=click.echo)
