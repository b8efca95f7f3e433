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

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from pipeline.artifact.dims import Shapes, apply_input_shapes
from pipeline.artifact.directory import Artifact
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
from pipeline.export.new_version import new_version
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
from pipeline.verify.report import GateReport

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
    evaluation = _evaluation(eval_data, inputs, readings, eval_limit) if eval_data is not None else None
    settings = _settings(input_shapes, graph, pinned, gate, tokens)
    if (limits := text.limits) is not None:
        flags = [f"--{k.replace('_', '-')}" for k, v in vars(tokens).items() if v is not None]
        readings.read["tokens"] = Reading(
            value=limits_reading(limits),
            source=", ".join(["the graph's embedding tables", *flags]),
        )  # fmt: skip
    imported = _Imported(source, model, extra, evaluation, eval_data, settings, text, pinned, graph, shape_notes)
    with new_version(repository, name) as root:
        return _build(root, imported, inputs, outputs, readings, found)


def _evaluation(eval_data: Path, inputs: list[TensorSpec], readings: Readings, eval_limit: int) -> EvalData:
    """The user's evaluation data as the graph's inputs; a recognizer's target texts as class sequences, and a
    model without labels takes the names of the pictures' class folders."""
    evaluation = read_eval_data(eval_data, inputs, readings.labels, readings.task, eval_limit)
    if readings.ctc is not None:  # a recognizer's target texts, as class sequences
        evaluation = target_classes(evaluation, readings.labels, readings.ctc, eval_data)
    if evaluation.labels != readings.labels:  # a model without labels takes its class folders' names
        readings.labels = evaluation.labels
        readings.read["labels"] = Reading(value=len(evaluation.labels), source=f"--eval-data {eval_data} folders")
    return evaluation


def _settings(
    input_shapes: Shapes | None,
    graph: GraphOptions,
    pinned: list[PinnedInput],
    gate: dict[str, Any] | None,
    tokens: TokenOptions,
) -> dict[str, object]:
    """stages.import.settings: the flags given, as the record keeps them (paths as text)."""
    settings: dict[str, object] = {"input_shapes": input_shapes} if input_shapes else {}
    if graph.values:
        settings["input_values"] = {p.name: p.value for p in pinned}
    if graph.batch_axes:
        settings["batch_axes"] = dict(graph.batch_axes)
    settings.update(gate or {})
    if tokens.given:
        settings["tokens"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(tokens).items() if v is not None}
    return settings


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
    source, evaluation = imported.source, imported.evaluation
    path = _place(root, imported, inputs, outputs)
    try:
        loaded = ort_runner(path, SampleAxes())
    except ArtifactError as exc:  # the model does not load
        raise InputError(f"onnxruntime cannot load {source}: {first_line(exc.__cause__ or exc)}") from exc
    samples, target = _samples(imported, loaded.session, inputs, readings)
    try:  # outputs as computed, and where their samples are
        outputs[:] = computed_outputs(OrtRunner(loaded.session, SampleAxes.of_specs(inputs, [])), samples, inputs,
                                      outputs, imported.graph.batch_axes, imported.notes)  # fmt: skip
        if write_dims(imported.model, inputs, outputs):  # the outputs as computed, where the graph declared others
            onnx.save(imported.model, str(path))
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
    _check_labels(readings, outputs, golden_out, imported)
    manifest = Manifest(
        name=root.parent.name,
        version=int(root.name),
        task=readings.task,
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
    report = _gate(run, path, samples, manifest.spec, imported)
    save_golden(artifact, Golden(samples, golden_out, target))
    if target is not None and outputs and (metric := _metric(readings.task, golden_out[outputs[0].name], target)):
        manifest.metrics.update(metric)
    source_sha256 = sha256_file(source)
    manifest.stages.import_ = _import_record(imported, source_sha256, report, readings, found)
    record_model(artifact, stage="import", parent=source_sha256, parity=report.summary(), precision=_precision(outputs),
                 metrics=manifest.metrics)  # fmt: skip
    artifact.save()
    return artifact


def _place(root: Path, imported: _Imported, inputs: list[TensorSpec], outputs: list[TensorSpec]) -> Path:
    """model.onnx written into the version (the source copied, or rewritten when its dims or pins changed) with
    its external data files beside it; returns its path."""
    source, path = imported.source, root / MODEL_FILE
    if write_dims(imported.model, inputs, outputs) or imported.pinned:  # the graph says what it holds
        onnx.save(imported.model, str(path))
    else:
        shutil.copyfile(source, path)
    for rel in imported.extra:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source.parent / rel, root / rel)
    return path


def _samples(
    imported: _Imported, session: ort.InferenceSession, inputs: list[TensorSpec], readings: Readings
) -> tuple[Arrays, np.ndarray | None]:
    """The golden inputs and their target: the user's evaluation data, or inputs generated at sizes the model
    was seen to run (the sizes guessed are noted)."""
    evaluation = imported.evaluation
    if evaluation is not None:
        if all(spec.shape and isinstance(spec.shape[spec.sample_axis], str) for spec in inputs):
            _refuse_heavy_batches(evaluation.inputs, readings, imported.eval_data)
        return evaluation.inputs, evaluation.target
    ranges = imported.text.ranges
    sizes = choose_sizes(inputs, _probe(session), str(imported.source), readings.hints, ranges)
    imported.notes.extend(guessed_sizes(inputs, sizes, readings.hints))
    generated = generated_inputs(inputs, sizes, GENERATED_BATCH, ranges=ranges)
    return {s.name: sample_leading(s, generated[s.name]) for s in inputs}, None


def _check_labels(readings: Readings, outputs: list[TensorSpec], golden_out: Arrays, imported: _Imported) -> None:
    """The labels fit the outputs as computed; labels taken from class folders say so and how to give them."""
    evaluation = imported.evaluation
    try:
        readings.check_labels(outputs, golden_out)
    except InputError as exc:
        if evaluation is None or evaluation.pictures is None or not readings.read["labels"].source.endswith("folders"):
            raise
        raise InputError(  # the labels came from the class folders
            f"--eval-data {imported.eval_data}: its class folders became the labels, but {exc}; give the model's "
            "labels in output order with --labels or --labels-file, and the folders are matched to them by name"
        ) from None


def _gate(run: OrtRunner, path: Path, samples: Arrays, spec: ModelSpec, imported: _Imported) -> GateReport:
    """The import's parity gate: structure, and batched runs equal to each sample run alone; raises on failure,
    with the --input-shape advice when onnxruntime refused a size the graph declares free."""
    policy = hop_policy("import", "fp32", spec.task, False, GateSettings.read(imported.settings))
    candidate = Candidate(run, "ONNX", "onnxruntime", path)  # fed as the specs say: batch axes, a fixed batch
    given = EvaluationSet.of(samples, source="the import's samples")
    report = verify(candidate, _one_at_a_time(run, spec.inputs), given, spec, policy)
    try:
        report.raise_on_failure(f"imported model {imported.source}")
    except CheckFailed as exc:
        if any("refused the input" in row.detail or "reference failed" in row.detail for row in report.failures):
            raise CheckFailed(f"{exc}\n{VARY_ADVICE}") from None
        raise
    return report


def _import_record(
    imported: _Imported, source_sha256: str, report: GateReport, readings: Readings, found: Found
) -> ImportRecord:
    """stages.import: the source and what was read of it, the settings, how the golden outputs were made, the gate."""
    model, evaluation, eval_data = imported.model, imported.evaluation, imported.eval_data
    return ImportRecord(
        settings=imported.settings,
        inputs={"source": source_sha256, **({"eval_data": evaluation.digest} if evaluation is not None else {})},
        source=str(imported.source),
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
