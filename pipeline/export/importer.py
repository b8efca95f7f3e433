"""`pipe import`: make an artifact from an ONNX model produced elsewhere (JAX, TensorFlow, Paddle...).

The graph's inputs and outputs, with their dtypes and symbolic dims, become the manifest's specs;
the model runs in onnxruntime (a file that does not load is refused); golden outputs are recorded
on the user's evaluation data or, without it, on generated inputs of the right dtype and shape;
the parity gate then checks structure and that batched runs equal per-sample runs. Free dims
(`-1`, a shared `?`, no value or name) are told apart and can be fixed with `--input-shape`
(shapes.py). What the exporter recorded in `metadata_props` is read (conventions.py) and, under
the flags, decides the task, labels, image preprocessing and detection settings (readings.py).
External data is copied in, and a location that escapes the model's directory is refused.
Nothing is left behind on failure: the new version directory is removed, and so are the model and
repository directories when this import made them.
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from pipeline.artifact.dims import Shapes, apply_input_shapes
from pipeline.artifact.directory import Artifact, allocate_version
from pipeline.artifact.golden import Golden, save_golden
from pipeline.artifact.manifest import TASKS, Lineage, Manifest, ModelSpec, check_name
from pipeline.artifact.records import ImportRecord, Reading
from pipeline.artifact.tensors import PinnedInput, TensorSpec
from pipeline.artifact.tokens import limits_reading, write_tokenizer
from pipeline.artifact.variants import MODEL_FILE
from pipeline.core.arrays import Arrays
from pipeline.core.errors import ArtifactError, CheckFailed, InputError, first_line
from pipeline.core.fsutil import sha256_file
from pipeline.data.picture_folder import DEFAULT_LIMIT, MAX_BYTES
from pipeline.export.batch_axes import computed_outputs, declare_input_axes
from pipeline.export.conventions import Found, read_conventions
from pipeline.export.evaldata import EvalData, read_eval_data
from pipeline.export.graph import check_specs, graph_specs, load_graph
from pipeline.export.metadata import stamp
from pipeline.export.opset import default_opset, missing_operators, opset_advice
from pipeline.export.pins import pin_inputs
from pipeline.export.readings import Readings, decide
from pipeline.export.recognizer import target_classes
from pipeline.export.shapes import GENERATED_BATCH, Probe, choose_sizes, generated_inputs, guessed_sizes, write_dims
from pipeline.export.token_graph import TokenModel, TokenOptions, token_model
from pipeline.runtime.external_data import external_files
from pipeline.runtime.runners import Candidate, OrtRunner, Runner, ort_runner, run_chunked
from pipeline.runtime.sample_axes import SampleAxes, sample_leading
from pipeline.samples.evaluation import EvaluationSet
from pipeline.stagekit.model_record import record_model
from pipeline.verify.choose import GateSettings, hop_policy
from pipeline.verify.gate import LARGE_BATCH, verify
from pipeline.verify.metrics import task_metric, text_metrics

if TYPE_CHECKING:
    import onnxruntime as ort
GOLDEN_CHUNK = 32  # samples per onnxruntime call when recording golden outputs on the evaluation data
VARY_ADVICE = (
    "onnxruntime refused an input size above: a dim the graph declares free that the model cannot vary "
    "is fixed with --input-shape NAME:d0,d1,... (an int per fixed dim, ? for one left free)"
)


@dataclass(frozen=True)
class GraphOptions:
    """How a graph as shipped is read: inputs pinned to one value, batch axes declared."""

    values: dict[str, str] = field(default_factory=dict)  # --input-value NAME=VALUE (pins.py)
    batch_axes: dict[str, int] = field(default_factory=dict)  # --batch-axis NAME:AXIS (batch_axes.py)


def import_onnx(
    source: Path,
    name: str,
    repository: Path = Path("artifacts"),
    eval_data: Path | None = None,
    labels: list[str] | None = None,
    task: str | None = None,
    image_preprocessing: str | None = None,
    input_shapes: Shapes | None = None,
    eval_limit: int = DEFAULT_LIMIT,
    detection: dict[str, Any] | None = None,
    tokens: TokenOptions | None = None,
    gate: dict[str, Any] | None = None,
    graph: GraphOptions | None = None,
) -> Artifact:
    """Create `repository/<name>/<next version>/` from the ONNX file `source` and return it.

    `eval_data`: an NPZ or a folder of pictures (pipeline/export/evaldata.py), at most `eval_limit`
    pictures of it. `image_preprocessing`: the JSON of `--image-preprocessing`, how pictures feed the
    image input (pipeline/runtime/images.py, `record_image_option`). `input_shapes`: `--input-shape` as
    parsed by `pipeline.artifact.dims.parse_input_shapes`, the dims the user fixes or names; recorded
    as `stages.import.settings.input_shapes`. `task`: None takes the metadata's, else classification
    when the outputs fit a classifier, else tensor (pipeline/export/tasks.py). `labels`: None (or empty)
    takes the metadata's. `detection`: `confidence`, `iou` and `max_detections` given for a detector
    (None values: the defaults). `tokens`: `--vocab-size`, `--padding-id`, `--max-length`, `--tokenizer`
    for a token model (pipeline/export/token_graph.py); its limits are recorded on the token inputs.
    `gate`: the import's gate settings given (`atol`, `rtol`, `metric_tolerance`, `max_out_of_tolerance`),
    recorded with the settings and read by `hop_policy`.
    `graph`: `--input-value` (inputs pinned to a constant) and `--batch-axis` (pipeline/export/pins.py,
    batch_axes.py).
    """
    source = Path(source)
    if problem := check_name(name):
        raise InputError(f"--name: {problem}")
    if task is not None and task not in TASKS:
        raise InputError(f"task {task!r} is not one of {', '.join(TASKS)}")
    model = load_graph(source)
    declared = default_opset(model)
    if declared is not None and (gaps := missing_operators(model, declared)):
        raise InputError(
            f"{source} declares opset {declared} but "
            + opset_advice(gaps, declared, "re-export it at opset {opset} or later")
        )
    extra = external_files(model, source.parent)
    graph = graph or GraphOptions()
    pinned = pin_inputs(model, graph.values)  # before the specs: a pinned input is no longer one
    inputs, outputs = graph_specs(model)
    check_specs(source, inputs, outputs)
    if input_shapes:
        apply_input_shapes(input_shapes, inputs, outputs)
    shape_notes: list[str] = []
    declare_input_axes(inputs, outputs, graph.batch_axes, shape_notes)
    tokens = tokens or TokenOptions()
    text = token_model(model, inputs, tokens)
    if text.limits is not None:
        inputs = text.limits.apply(inputs)
    found = read_conventions(model)
    readings = decide(found, inputs, outputs, task, labels, image_preprocessing, detection)
    evaluation = None
    if eval_data is not None:
        evaluation = read_eval_data(eval_data, inputs, readings.labels, readings.task, eval_limit)
        if readings.ctc is not None:  # a recognizer's target texts, as class sequences
            evaluation = target_classes(evaluation, readings.labels, readings.ctc, eval_data)
        if evaluation.labels != readings.labels:  # a model without labels takes its class folders' names
            readings.labels = evaluation.labels
            readings.read["labels"] = Reading(value=len(evaluation.labels), source=f"--eval-data {eval_data} folders")
    settings: dict[str, object] = {"input_shapes": input_shapes} if input_shapes else {}
    if graph.values:
        settings["input_values"] = {p.name: p.value for p in pinned}
    if graph.batch_axes:
        settings["batch_axes"] = dict(graph.batch_axes)
    settings.update(gate or {})
    if tokens.given:
        settings["tokens"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(tokens).items() if v is not None}
    if (limits := text.limits) is not None:
        flags = [f"--{k.replace('_', '-')}" for k, v in vars(tokens).items() if v is not None]
        readings.read["tokens"] = Reading(
            value=limits_reading(limits),
            source=", ".join(["the graph's embedding tables", *flags]),
        )  # fmt: skip
    model_root = Path(repository) / name
    made = [d for d in (model_root, model_root.parent) if not d.exists()]  # removed again if the import fails
    root = allocate_version(model_root)
    try:
        imported = _Imported(source, model, extra, evaluation, eval_data, settings, text, pinned, graph, shape_notes)
        return _build(root, imported, inputs, outputs, readings, found)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)  # nothing half-written
        for directory in made:  # nor a model or repository directory this import made, unless another filled it
            with contextlib.suppress(OSError):
                directory.rmdir()
        raise


def _refuse_heavy_batches(samples: Arrays, readings: Readings, eval_data: Path | None) -> None:
    """The parity gate runs the samples at batch LARGE_BATCH (repeating them): refused before it allocates
    more than MAX_BYTES, naming where the sample's size came from (an exporter's `imgsz 4096` made 192 MiB
    pictures, 3 GiB a batch, and the failure then offered --input-shape for a dim that was not the problem)."""
    per_sample = sum(array[:1].nbytes for array in samples.values())
    if per_sample * LARGE_BATCH <= MAX_BYTES:
        return
    shapes = ", ".join(f"{name} {list(array.shape[1:])} {array.dtype}" for name, array in samples.items())
    image = readings.read.get("image")
    source = f"; the picture size comes from {image.source}" if image is not None else ""
    raise InputError(
        f"--eval-data {eval_data}: one sample ({shapes}) takes {per_sample / 2**20:,.0f} MiB, and the parity gate "
        f"runs batches of {LARGE_BATCH} ({per_sample * LARGE_BATCH / 2**30:,.1f} GiB), past the "
        f"{MAX_BYTES // 2**20} MiB pipe allows{source}; give the size the model was trained at with "
        "--image-preprocessing (its size, crop or letterbox size), or smaller samples"
    )


@dataclass(frozen=True)
class _Imported:
    """The source as read: its graph, external data files, evaluation data and settings."""

    source: Path
    model: onnx.ModelProto
    extra: list[str]  # external data files, relative to the source's directory
    evaluation: EvalData | None
    eval_data: Path | None
    settings: dict[str, object]
    text: TokenModel  # the token inputs: generated values' ranges, limits, the tokenizer to carry
    pinned: list[PinnedInput]  # inputs written into the graph as constants
    graph: GraphOptions
    notes: list[str]  # what was read or guessed about the dims: batch axes, computed output shapes, sizes


def _build(
    root: Path,
    imported: _Imported,
    inputs: list[TensorSpec],
    outputs: list[TensorSpec],
    readings: Readings,
    found: Found,
) -> Artifact:
    source, model, eval_data, evaluation = imported.source, imported.model, imported.eval_data, imported.evaluation
    task, path = readings.task, root / MODEL_FILE
    if write_dims(model, inputs, outputs) or imported.pinned:  # the graph says what it holds
        onnx.save(model, str(path))
    else:
        shutil.copyfile(source, path)
    for rel in imported.extra:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source.parent / rel, root / rel)
    try:
        loaded = ort_runner(path, SampleAxes())
    except ArtifactError as exc:  # the model does not load
        raise InputError(f"onnxruntime cannot load {source}: {first_line(exc.__cause__ or exc)}") from exc
    if evaluation is not None:
        samples, target = evaluation.inputs, evaluation.target
        if all(spec.shape and isinstance(spec.shape[spec.sample_axis], str) for spec in inputs):
            _refuse_heavy_batches(samples, readings, eval_data)
    else:
        ranges = imported.text.ranges
        sizes = choose_sizes(inputs, _probe(loaded.session), str(source), readings.hints, ranges)
        imported.notes.extend(guessed_sizes(inputs, sizes, readings.hints))
        generated = generated_inputs(inputs, sizes, GENERATED_BATCH, ranges=ranges)
        samples, target = {s.name: sample_leading(s, generated[s.name]) for s in inputs}, None
    feeding = SampleAxes.of_specs(inputs, [])
    try:  # outputs as computed, and where their samples are
        outputs[:] = computed_outputs(OrtRunner(loaded.session, feeding), samples, inputs, outputs,
                                      imported.graph.batch_axes, imported.notes)  # fmt: skip
        if write_dims(model, inputs, outputs):  # the outputs as computed, written where the graph declared others
            onnx.save(model, str(path))
            loaded = ort_runner(path, SampleAxes())
    except InputError:
        raise
    except Exception as exc:  # the model loads but does not run on inputs of its declared shape
        raise InputError(f"onnxruntime cannot run {source} on inputs shaped like its graph inputs: {exc}") from exc
    run = OrtRunner(loaded.session, SampleAxes.of_specs(inputs, outputs))
    batched = all(spec.shape and isinstance(spec.shape[spec.sample_axis], str) for spec in [*inputs, *outputs])
    try:  # a few hundred pictures: run in chunks, so a large model's activations stay bounded
        golden_out = run_chunked(run, samples, chunk=GOLDEN_CHUNK) if batched else run(samples)
    except Exception as exc:  # the model loads but does not run on inputs of its declared shape
        raise InputError(f"onnxruntime cannot run {source} on inputs shaped like its graph inputs: {exc}") from exc
    try:
        readings.check_labels(outputs, golden_out)
    except InputError as exc:
        if evaluation is None or evaluation.pictures is None or not readings.read["labels"].source.endswith("folders"):
            raise
        raise InputError(  # the labels came from the class folders
            f"--eval-data {eval_data}: its class folders became the labels, but {exc}; give the model's labels in "
            "output order with --labels or --labels-file, and the folders are matched to them by name"
        ) from None
    manifest = Manifest(
        name=root.parent.name,
        version=int(root.name),
        task=task,
        inputs=inputs,
        outputs=outputs,
        labels=readings.labels,
        pinned=imported.pinned or None,
        detection=readings.detection,
        ctc=readings.ctc,
        lineage=Lineage(backend="import", dataset_fingerprint=evaluation.digest if evaluation else None),
    )
    artifact = Artifact(root, manifest)
    if imported.text.tokenizer is not None:  # before the stamp: the tokenizer is part of the identity
        manifest.tokenizer, written = write_tokenizer(root, imported.text.tokenizer)
        for rel in written:
            artifact.add_file(rel)
    stamp(path, manifest)  # the session above read the same graph and weights; stamping adds metadata only
    reference = _one_at_a_time(run, inputs)
    given = EvaluationSet.of(samples, source="the import's samples")
    policy = hop_policy("import", "fp32", task, False, GateSettings.read(imported.settings))
    candidate = Candidate(run, "ONNX", "onnxruntime", path)  # fed as the specs say: batch axes, a fixed batch
    report = verify(candidate, reference, given, ModelSpec(inputs, outputs, task), policy)
    try:
        report.raise_on_failure(f"imported model {source}")
    except CheckFailed as exc:
        if any("refused the input" in row.detail or "reference failed" in row.detail for row in report.failures):
            raise CheckFailed(f"{exc}\n{VARY_ADVICE}") from None
        raise
    save_golden(artifact, Golden(samples, golden_out, target))
    if target is not None and outputs and (metric := _metric(task, golden_out[outputs[0].name], target)):
        manifest.metrics.update(metric)
    source_sha256 = sha256_file(source)
    manifest.stages.import_ = ImportRecord(
        settings=imported.settings,
        inputs={"source": source_sha256, **({"eval_data": evaluation.digest} if evaluation is not None else {})},
        source=str(source),
        source_sha256=source_sha256,
        producer=f"{model.producer_name} {model.producer_version}".strip(),
        ir_version=model.ir_version,
        opset=default_opset(model),
        golden="eval-data" if evaluation is not None else "generated",
        eval_data=str(eval_data) if eval_data is not None else None,
        pictures=evaluation.pictures if evaluation is not None else None,
        parity=report.to_dict(),
        metadata=found.metadata,
        convention=found.convention,
        read=readings.read,
        notes=[*readings.notes, *imported.notes],
    )
    record_model(artifact, stage="import", parent=source_sha256, parity=report.summary(), precision=_precision(outputs),
                 metrics=manifest.metrics)  # fmt: skip
    artifact.save()
    return artifact


def _probe(session: ort.InferenceSession) -> Probe:
    """Run the model once on some inputs; why it failed, or None. Failures are expected: onnxruntime keeps quiet."""
    import onnxruntime as ort

    quiet = ort.RunOptions()
    quiet.log_severity_level = 4

    def probe(arrays: Arrays) -> str | None:
        try:
            session.run(None, arrays, quiet)
        except Exception as exc:  # onnxruntime's errors share no base class
            return first_line(exc)
        return None

    return probe


def _one_at_a_time(run: Runner, inputs: list[TensorSpec]) -> Runner:
    """Reference for the gate: each sample run alone, so a batched run must match per-sample runs."""
    batched = all(spec.shape and isinstance(spec.shape[spec.sample_axis], str) for spec in inputs)

    def reference(arrays: Arrays) -> Arrays:
        if not batched:
            return run(arrays)
        count = len(next(iter(arrays.values())))
        parts = [run({k: v[i : i + 1] for k, v in arrays.items()}) for i in range(count)]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    return reference


def _precision(outputs: list[TensorSpec]) -> str:
    """What the file computes in, judged by its outputs: fp32 unless they are all half or double."""
    kinds = {spec.dtype for spec in outputs}
    return {frozenset({"float16"}): "fp16", frozenset({"float64"}): "fp64"}.get(frozenset(kinds), "fp32")


def _metric(task: str, logits: np.ndarray, target: np.ndarray) -> dict[str, float]:
    if task == "text-recognition":  # texts read exactly, and the character error rate
        return text_metrics(logits, target)
    measured = task_metric(task, logits, target)
    return {measured[0]: measured[1]} if measured else {}
