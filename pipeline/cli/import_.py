"""`pipe import`: make an artifact from an ONNX model made elsewhere, or from a transformers model directory.

Named `import_` because `import` is a Python keyword."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from pipeline.cli.gate_options import BUDGET_FLAGS, gate_flags, gate_options, refuse
from pipeline.cli.group import main
from pipeline.cli.params import FRACTION, REPOSITORY, Whole

if TYPE_CHECKING:
    from pipeline.export.hf_texts import Texts


@main.command("import")
@click.argument("model", type=click.Path())
@click.option("--name", required=True, help="Artifact name: artifacts/NAME/<next version>/.")
@click.option(
    "--eval-data",
    type=click.Path(),
    default=None,
    help="Real inputs: an NPZ (one array per input name, optional 'target'), or a folder of pictures "
    "(class sub-folders label them), converted with the image preprocessing; for a transformers directory a "
    ".txt file, one text per line. See docs/export.md.",
)
@click.option(
    "--eval-limit",
    type=Whole(1, 1_000_000),  # the samples' 512 MiB cap lowers it further
    default=500,
    show_default=True,
    help="At most this many pictures from an --eval-data folder (chosen with seed 0), or texts (the first).",
)
@click.option("--labels", default=None, help="Class names, comma separated: --labels cat,dog.")
@click.option(
    "--labels-file",
    type=click.Path(),
    default=None,
    help="Class names, one per line; with --task text-recognition the dictionary, every line kept.",
)
@click.option(
    "--task",
    type=click.Choice(
        ["classification", "regression", "embedding", "detection", "text-recognition", "tensor", "text-generation"]
    ),
    default=None,
    help="What the outputs are. Default: the task the exporter recorded (Ultralytics; a PaddleOCR recognizer's "
    "dictionary), else classification when the outputs fit a classifier, else tensor; a transformers causal LM "
    "directory: text-generation. See docs/export.md and docs/language-models.md.",
)
@REPOSITORY
@click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME:D0,D1,...",
              help="Dims of input NAME (repeatable): an int fixes one, a name names one, ? or -1 leaves it free, "
              "e.g. x:1,3,48,192 for a model declaring [-1, 3, ?, ?]. See docs/export.md.")  # fmt: skip
@click.option("--input-value", "input_values", multiple=True, metavar="NAME=VALUE",
              help="Pin input NAME to one value (JSON: 16000, [1, 2]), written into the model as a constant: no hop "
              "or client feeds it, e.g. sr=16000 for Silero VAD. Repeatable. See docs/export.md.")  # fmt: skip
@click.option("--batch-axis", "batch_axes", multiple=True, metavar="NAME:AXIS",
              help="The axis of tensor NAME that holds the samples, when not the first (state:1 for a state "
              "[2, batch, 128]). Repeatable. Default: a dim named batch/N/batch_size. See docs/export.md.")  # fmt: skip
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
@gate_options("a --settings file's import section")
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
    input_values: tuple[str, ...],
    batch_axes: tuple[str, ...],
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
    settings_file: str | None,
    **options: Any,
) -> None:
    """Make an artifact from an ONNX MODEL produced elsewhere (JAX, TensorFlow, Paddle, Ultralytics, ...) or
    from a local transformers model directory (save_pretrained output; --task classification or embedding)."""
    from pipeline.artifact.dims import parse_input_shapes
    from pipeline.artifact.golden import load_golden
    from pipeline.cli.artifact_views import reading_text
    from pipeline.export.batch_axes import parse_batch_axes
    from pipeline.export.hf import is_transformers_dir, not_a_model
    from pipeline.export.hf_texts import read_texts
    from pipeline.export.importer import GraphOptions, import_onnx
    from pipeline.export.pins import parse_input_values
    from pipeline.export.token_graph import TokenOptions
    from pipeline.samples.evaluation import GENERATED_NOTE
    from pipeline.stagekit.settings_file import layered

    flags = gate_flags(options)
    refuse(flags, BUDGET_FLAGS, "a budget of lossy candidates (fp16, int8); pipe import makes only the lossless "
           "model.onnx, held to --atol, --rtol, --metric-tolerance, --max-out-of-tolerance (lossy budgets are "
           "pipe optimize's and pipe export --target edge's)")  # fmt: skip
    gate = layered(settings_file, "import", flags)
    path = Path(model)
    if is_transformers_dir(path):
        texts = read_texts(Path(eval_data), eval_limit) if eval_data else None
        _import_transformers(path, name, out_root, task, pooling, normalize, tokenizer_dir, gate, texts)
        return
    if path.is_dir() or path.suffix.lower() == ".json":
        raise not_a_model(path)
    shapes = parse_input_shapes(input_shapes)
    names = _labels(labels, Path(labels_file) if labels_file else None, task)
    evaluation = Path(eval_data) if eval_data else None
    detection = {"confidence": confidence, "iou": iou, "max_detections": max_detections}
    tokens = TokenOptions(vocab_size, padding_id, max_length, Path(tokenizer_dir) if tokenizer_dir else None)
    graph = GraphOptions(parse_input_values(input_values), parse_batch_axes(batch_axes))
    artifact = import_onnx(Path(model), name, Path(out_root), evaluation, names, task, image_preprocessing,
                           shapes, eval_limit, detection=detection, tokens=tokens, graph=graph, gate=gate)  # fmt: skip
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
    for pin in artifact.manifest.pinned or []:
        click.echo(f"  pinned {pin.name}: {pin.value} ({pin.dtype}{pin.shape}), written into the model")


def _labels(inline: str | None, file: Path | None, task: str | None) -> list[str]:
    """The labels flags: a recognizer's dictionary file read verbatim (its space lines are entries), else names."""
    from pipeline.core.errors import InputError
    from pipeline.export.class_names import read_class_names
    from pipeline.export.recognizer import read_dictionary

    if task != "text-recognition":
        return read_class_names(inline, file)
    if inline:
        raise InputError("--labels with --task text-recognition: give the dictionary with --labels-file FILE, one "
                         "entry per line (a comma or a space is an entry too)")  # fmt: skip
    return read_dictionary(file) if file is not None else []


def _import_transformers(
    path: Path,
    name: str,
    repository: str,
    task: str | None,
    pooling: str,
    normalize: bool,
    tokenizer: str | None,
    gate: dict[str, Any],
    texts: Texts | None,
) -> None:
    """`pipe import DIR` of a transformers model directory (`texts`: its --eval-data, else built-in sentences)."""
    import time

    from pipeline.core.errors import InputError
    from pipeline.export.causal_lm import TASK, DecoderGate, architecture_of, import_causal_lm
    from pipeline.export.hf import HFSettings, import_hf

    started = time.perf_counter()
    architecture = architecture_of(path)
    if task in (None, TASK) and architecture is not None:
        if texts is not None:  # never ignored: the causal LM import gates on its own prompts
            raise InputError(f"--eval-data {texts.path}: texts are evaluation data of --task classification or "
                             f"embedding; a {TASK} import takes none (drop --eval-data)")  # fmt: skip
        lm_gate = DecoderGate(**{k: gate[k] for k in ("atol", "rtol") if gate.get(k) is not None})
        artifact = import_causal_lm(path, name, Path(repository), Path(tokenizer) if tokenizer else None, lm_gate)
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
    tokenizer_path = Path(tokenizer) if tokenizer else None
    artifact = import_hf(path, name, Path(repository), settings, tokenizer_path, gate=gate, texts=texts)
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
