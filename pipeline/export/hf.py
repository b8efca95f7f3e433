"""`pipe import DIR`: a local transformers model directory (save_pretrained output) into an artifact.

The directory holds `config.json`, the weights (safetensors or a pytorch bin) and a fast tokenizer
(`tokenizer.json`; `--tokenizer DIR` when it lives elsewhere). The model is loaded with transformers
in torch, wrapped so that it returns the task's output (classification: the logits; embedding: the
last hidden state pooled, `mean` over the attention mask or the `cls` token, optionally L2-normalized),
and exported with dynamic `batch` and `sequence` axes. The export passes the same gate as every
hop, against the transformers model in torch, on real text tokenized as a served request is:
sentences of different lengths, so padded and unpadded rows, at batch 1, 2 and 8 and at the
sequence cut to half. Labels come from `id2label`; the tokenizer is copied into the version and the
token limits recorded from the config and the tokenizer (pipeline/artifact/tokens.py).

torch and transformers are imported inside `import_hf` only.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx

from pipeline.artifact.directory import Artifact
from pipeline.artifact.golden import Golden, save_golden
from pipeline.artifact.manifest import Lineage, Manifest, ModelSpec, check_name, label_problem
from pipeline.artifact.records import ImportRecord, Reading
from pipeline.artifact.tensors import TensorSpec
from pipeline.artifact.tokens import (
    TokenizerSource,
    TokenLimits,
    hf_limits,
    limits_reading,
    read_tokenizer,
    write_tokenizer,
)
from pipeline.artifact.variants import MODEL_FILE
from pipeline.core.errors import InputError
from pipeline.export.metadata import stamp
from pipeline.export.new_version import new_version
from pipeline.export.opset import default_opset
from pipeline.runtime.pretrained import source_digest
from pipeline.runtime.runners import ort_runner, torch_runner
from pipeline.runtime.text import TextEncoder
from pipeline.samples.evaluation import EvaluationSet
from pipeline.stagekit.model_record import record_model
from pipeline.verify.choose import GateSettings, hop_policy
from pipeline.verify.gate import verify

if TYPE_CHECKING:
    import torch

    from pipeline.export.hf_texts import Texts
    from pipeline.export.onnx_export import ExportResult
    from pipeline.verify.report import GateReport

HF_TASKS = ("classification", "embedding")
POOLINGS = ("mean", "cls")
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
ROLE_ORDER = ("ids", "mask", "type_ids")  # the exported graph's inputs, in this order
OPSET = 18
# The golden inputs: real sentences of different lengths, so a batch holds padded and unpadded rows.
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Hello world",
    "A model is a directory; every stage reads it, adds files and rewrites its manifest.",
    "Short one.",
    "It rained all day in the city, and the streets were quiet by nightfall.",
    "Tokens in, vectors out",
    "Cats and dogs",
    "She read a book by the window while the kettle boiled and the radio played softly in the next room.",
)


def is_transformers_dir(path: Path) -> bool:
    """True for a directory that holds a transformers config.json."""
    return Path(path).is_dir() and (Path(path) / "config.json").is_file()


def not_a_model(path: Path) -> InputError:
    """The one line for a MODEL argument that is neither an ONNX file nor a transformers directory."""
    path = Path(path)
    expected = "pipe import takes an ONNX file (.onnx) or a transformers model directory (save_pretrained output: "
    expected += "config.json, model.safetensors, tokenizer.json)"
    if path.is_dir():
        return InputError(f"{path} is a directory without config.json, so not a transformers model; {expected}")
    if path.suffix.lower() == ".json":
        where = f"; for a transformers model pass its directory: pipe import {path.parent}" if path.is_file() else ""
        return InputError(f"{path} is a JSON file, not a model; {expected}{where}")
    return InputError(f"{path}: {expected}")


@dataclass(frozen=True)
class HFSettings:
    """What `pipe import DIR` was asked for (recorded as stages.import.settings)."""

    task: str = "embedding"  # classification (the logits) or embedding (the pooled last hidden state)
    pooling: str = "mean"  # embedding: mean over the attention mask, or the first (CLS) token
    normalize: bool = False  # embedding: L2-normalize each vector
    gate: dict[str, Any] = field(default_factory=dict)  # the gate settings given: atol, rtol, metric_tolerance, ...


def import_hf(
    source: Path,
    name: str,
    repository: Path = Path("artifacts"),
    settings: HFSettings | None = None,
    tokenizer_dir: Path | None = None,
    progress: Any = print,
    gate: dict[str, Any] | None = None,
    texts: Texts | None = None,
) -> Artifact:
    """Create `repository/<name>/<next version>/` from the transformers directory `source` and return it.

    `gate`: the import's gate settings given (atol, rtol, ...), recorded and read by `hop_policy`.
    `texts`: the user's evaluation texts (`--eval-data`, hf_texts.py); None: the built-in SENTENCES, generated."""
    if gate:
        settings = replace(settings or HFSettings(), gate=dict(gate))
    settings = settings or HFSettings()
    source = Path(source)
    if problem := check_name(name):
        raise InputError(f"--name: {problem}")
    if settings.task not in HF_TASKS:
        raise InputError(f"--task {settings.task!r}: a transformers directory imports as {' or '.join(HF_TASKS)}")
    if settings.pooling not in POOLINGS:
        raise InputError(f"--pooling {settings.pooling!r} is not one of {', '.join(POOLINGS)}")
    config = read_config(source)
    tokenizer = read_tokenizer(tokenizer_dir or source)
    started = time.perf_counter()
    module, names, config_obj, notes = _load(source, settings)
    loaded_s = time.perf_counter() - started
    limits = hf_limits(source, names, tokenizer)
    inputs = limits.apply([TensorSpec(n, "int64", ["batch", "sequence"], "NT") for n in names])
    labels = _labels(config_obj) if settings.task == "classification" else []
    width = len(labels) if settings.task == "classification" else int(config_obj.hidden_size)
    output = "logits" if settings.task == "classification" else "embedding"
    outputs = [TensorSpec(output, "float32", ["batch", width])]
    read = _Read(source, module, inputs, outputs, labels, limits, tokenizer, settings, config, loaded_s, notes, texts)
    with new_version(repository, name) as root:
        return _build(root, read)


def read_config(source: Path) -> dict[str, Any]:
    """config.json, checked to be a transformers model's with its weights beside it."""
    if not is_transformers_dir(source):
        raise not_a_model(source)
    try:
        config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{source}/config.json is not JSON ({str(exc)[:120]}): not a transformers model") from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise InputError(
            f"{source}/config.json has no model_type, so it is not a transformers model config; "
            "pass the directory save_pretrained wrote"
        )
    if not any((source / w).is_file() for w in WEIGHTS):
        raise InputError(
            f"{source} holds config.json but no weights ({', '.join(WEIGHTS)}); save the model with save_pretrained"
        )
    return config


def _load(source: Path, settings: HFSettings) -> tuple[torch.nn.Module, list[str], Any, list[str]]:
    """The transformers model in torch, wrapped to return the task's output, its input names in order, and
    notes (which weights start random: a base model imported as a classifier gets a random head)."""
    import inspect

    try:
        import transformers
    except ImportError:
        raise InputError(
            f"{source} is a transformers model; importing it needs transformers: pip install 'pipe-ml[hf]'"
        ) from None

    transformers.utils.logging.disable_progress_bar()  # pipe reports its own progress
    auto = (
        transformers.AutoModelForSequenceClassification if settings.task == "classification" else transformers.AutoModel
    )
    from pipeline.runtime.pretrained import load_pretrained, random_note

    with _quiet(transformers):
        model, missing = load_pretrained(auto, source)
    model.eval()
    notes = [random_note(missing, len(model.state_dict()))] if missing else []
    taken = inspect.signature(model.forward).parameters
    words = {"ids": "input_ids", "mask": "attention_mask", "type_ids": "token_type_ids"}
    names = [words[role] for role in ROLE_ORDER if words[role] in taken]
    if "input_ids" not in names:
        raise InputError(f"{type(model).__name__} takes no input_ids; pipe imports text models fed token ids")
    from pipeline.export.hf_module import TaskHead

    return TaskHead(model, names, settings.task, settings.pooling, settings.normalize), names, model.config, notes


@contextlib.contextmanager
def _quiet(transformers: Any) -> Any:
    """transformers prints a load report of missing weights; pipe says it itself (a note). Restored afterwards."""
    level = transformers.utils.logging.get_verbosity()
    transformers.utils.logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers.utils.logging.set_verbosity(level)


def _labels(config: Any) -> list[str]:
    """Class names from id2label, in index order, checked like every label."""
    id2label = {int(k): str(v) for k, v in (getattr(config, "id2label", None) or {}).items()}
    labels = [id2label.get(i, f"LABEL_{i}") for i in range(int(config.num_labels))]
    if problems := [p for p in map(label_problem, labels) if p]:
        raise InputError(f"config.json id2label: {problems[0]}")
    if len(set(labels)) != len(labels):
        raise InputError(f"config.json id2label: class names must be distinct, got {labels}")
    return labels


@dataclass(frozen=True)
class _Read:
    """The transformers directory as read: the wrapped module, its specs and labels, the token limits and
    tokenizer, config.json, how long loading took, notes so far, and the user's evaluation texts."""

    source: Path
    module: torch.nn.Module
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    labels: list[str]
    limits: TokenLimits
    tokenizer: TokenizerSource
    settings: HFSettings
    config: dict[str, Any]
    loaded_s: float
    notes: list[str]
    texts: Texts | None


def _build(root: Path, read: _Read) -> Artifact:
    import torch

    from pipeline.export.onnx_export import export_module

    inputs, outputs, settings, texts = read.inputs, read.outputs, read.settings, read.texts
    manifest = Manifest(
        name=root.parent.name,
        version=int(root.name),
        task=settings.task,  # type: ignore[arg-type]  # checked against HF_TASKS
        inputs=inputs,
        outputs=outputs,
        labels=read.labels,
        lineage=Lineage(backend="import"),
    )
    artifact = Artifact(root, manifest)
    manifest.tokenizer, written = write_tokenizer(root, read.tokenizer)
    for rel in written:
        artifact.add_file(rel)
    encoder = TextEncoder.of(root, manifest)
    assert encoder is not None  # the tokenizer and the ids input were just recorded
    samples = encoder.encode(list(SENTENCES))  # [8, longest]: padded and unpadded rows
    example = tuple(torch.from_numpy(samples[s.name]) for s in inputs)  # padded rows: the mask path is traced
    path = root / MODEL_FILE
    started = time.perf_counter()
    result = export_module(read.module, example, inputs, outputs, path, opset=OPSET, exporter="torchscript")
    export_s = time.perf_counter() - started
    stamp(path, manifest)
    reference = torch_runner(read.module, inputs, outputs)
    run = ort_runner(path)
    spec = ModelSpec(inputs, outputs, settings.task)
    notes = read.notes
    if texts is not None:  # the user's texts: the gate, golden.npz and every later hop are judged on them
        samples = encoder.encode(texts.texts)
        if texts.skipped:
            notes = [*notes, f"--eval-data {texts.path}: the first {len(texts.texts)} texts kept, {texts.skipped} "
                             "past --eval-limit left out"]  # fmt: skip
    given = EvaluationSet.of(samples, source=f"{len(samples[inputs[0].name])} tokenized texts")
    policy = hop_policy("import", "fp32", settings.task, False, GateSettings.read(settings.gate))
    report = verify(path, reference, given, spec, policy, session=run.session)
    report.raise_on_failure(f"the ONNX export of {read.source}")
    save_golden(artifact, Golden(samples, reference(samples)))
    digest = source_digest(read.source)
    notes = [*notes, f"loaded in {read.loaded_s:.1f} s, exported in {export_s:.1f} s ({result.exporter})"]
    graph = onnx.load(str(path), load_external_data=False)
    manifest.stages.import_ = _import_record(read, digest, graph, result, report, notes)
    record_model(artifact, stage="import", parent=digest, parity=report.summary())
    artifact.save()
    return artifact


def _import_record(
    read: _Read, digest: str, graph: onnx.ModelProto, result: ExportResult, report: GateReport, notes: list[str]
) -> ImportRecord:
    """stages.import of a transformers directory: the settings and exporter, what config.json and the tokenizer
    said, the texts the gate ran on, its report."""
    settings, texts = read.settings, read.texts
    readings = {
        "task": Reading(value=settings.task, source="--task"),
        "tokens": Reading(value=limits_reading(read.limits), source="config.json and the tokenizer"),
    }
    if read.labels:
        readings["labels"] = Reading(value=len(read.labels), source="config.json id2label")
    return ImportRecord(
        settings={
            "task": settings.task,
            **({"pooling": settings.pooling, "normalize": settings.normalize} if settings.task == "embedding" else {}),
            "exporter": result.exporter,
            **settings.gate,
        },
        inputs={"source": digest, **({"eval_data": texts.digest} if texts is not None else {})},
        source=str(read.source),
        source_sha256=digest,
        producer=f"transformers {importlib.metadata.version('transformers')} ({read.config.get('model_type')})",
        ir_version=graph.ir_version,
        opset=default_opset(graph),
        golden="eval-data" if texts is not None else "generated",
        eval_data=str(texts.path) if texts is not None else None,
        parity=report.to_dict(),
        convention="Hugging Face",
        read=readings,
        notes=notes,
    )
