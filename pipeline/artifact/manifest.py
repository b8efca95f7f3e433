"""manifest.json: the contract between stages, as typed dataclasses validated field by field.

Every nested value is checked on load (pipeline/core/jsontypes.py): a shape given as a string, a dtype
numpy does not know, a size given as a string, `stages: []`, an unsafe name are each refused with
their dotted path; then what the fields say against each other (a variant recorded in another
variant's file or in a file `files` does not list, no inputs, labels that do not match the
classes, an image record that cannot be applied to its input: pipeline/artifact/preprocessing.py).
The inputs and outputs are `TensorSpec`s (pipeline/artifact/tensors.py). Standard library only, so the
server and the CLI load it cheaply.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Literal

from pipeline import __version__
from pipeline.artifact.checks import one_of, positive, unprintable
from pipeline.artifact.generation import Generation, generation_problems
from pipeline.artifact.preprocessing import preprocessing_problems
from pipeline.artifact.records import Stages
from pipeline.artifact.tensors import PinnedInput, TensorSpec
from pipeline.artifact.tokens import TokenizerRecord, tokenizer_problems
from pipeline.artifact.variants import Variant, check_variant_name, variant_file
from pipeline.core.errors import ArtifactError
from pipeline.core.jsontypes import decode, encode

SCHEMA_VERSION = 2  # 2: typed stage records and variant records (1 held free-form stage dicts)
MANIFEST_NAME = "manifest.json"
# What a model's outputs mean (docs/export.md, "Tasks"): classification ([batch, classes]), regression,
# embedding, detection (the Ultralytics head: one [batch, 4+classes, anchors] output), tensor (none of
# those: each output judged as a tensor), text-recognition (a CTC recognizer: one [batch, positions,
# classes] output read as text with its dictionary, the `Ctc` record) and text-generation (a causal LM:
# logits [batch, sequence, vocab] and its KV cache, docs/language-models.md).
TASKS = ("classification", "regression", "embedding", "detection", "tensor", "text-recognition", "text-generation")
Task = Literal[
    "classification", "regression", "embedding", "detection", "tensor", "text-recognition", "text-generation"
]
# A model name is a directory name in every repository and URL it reaches: one safe path segment.
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
NAME_RULE = "1-128 lowercase letters, digits, '.', '_' and '-', starting with a letter or digit"
BACKENDS = ("torch", "ort", "import")


def check_name(name: str) -> str | None:
    """None when `name` is a safe model name, else the problem and the rule."""
    if NAME.match(name):
        return None
    return f"name {name[:60]!r} is not a safe directory name: use {NAME_RULE}"


def _check_sha256(value: str) -> str | None:
    return None if re.fullmatch(r"[0-9a-f]{64}", value) else f"expected 64 lowercase hex digits, got {value[:70]!r}"


def _non_negative(value: int) -> str | None:
    return None if value >= 0 else f"expected a size >= 0, got {value}"


def _check_files(files: dict[str, Any]) -> str | None:
    for rel in files:
        try:
            check_relative(rel)
        except ArtifactError as exc:
            return str(exc)
    return None


def _check_variants(variants: dict[str, Variant]) -> str | None:
    for name in variants:
        if problem := check_variant_name(name):
            return problem
    return None


def label_problem(label: str) -> str | None:
    """Why `label` cannot be a class name, or None: a class name is one line of printable text (labels.txt
    holds one per line, the card and the reports show them)."""
    if bad := unprintable(label):
        return f"class name {label!r} holds {bad}: a class name is one line of printable text"
    return None


def _check_labels(labels: list[str]) -> str | None:
    if problems := [p for p in map(label_problem, labels) if p]:
        return problems[0]
    return None  # distinct, but for a recognizer's dictionary: `_task_contradictions`


def _fraction(value: float) -> str | None:
    return None if 0.0 <= value <= 1.0 else f"expected a number from 0 to 1, got {value}"


@dataclass(frozen=True)
class Detection:
    """How a detector's output becomes boxes (task `detection`): the Ultralytics head layout, one output
    [batch, 4 + classes, anchors] holding cx, cy, w, h in input pixels, then one score per class.

    The defaults are Ultralytics' own for prediction (cfg/default.yaml: conf 0.25, iou 0.7, max_det 300).
    """

    confidence: float = field(default=0.25, metadata={"check": _fraction})  # a box is kept if its best score is above
    iou: float = field(
        default=0.7, metadata={"check": _fraction}
    )  # NMS: drop a box overlapping a kept one of its class more
    max_detections: int = field(default=300, metadata={"check": positive})  # boxes kept per picture, best first
    stride: int | None = field(default=None, metadata={"omit_none": True, "check": positive})  # the head's largest


def _blank(value: int) -> str | None:
    return None if value == 0 else f"expected 0 (the blank is class 0, as in PaddleOCR), got {value}"


@dataclass(frozen=True)
class Ctc:
    """How a CTC text recognizer's classes read as text (task `text-recognition`; pipeline/runtime/ctc.py):
    the manifest's `labels` are its dictionary, one entry per class in order, without the blank.

    PaddleOCR's convention: class 0 is the blank, then the dictionary's lines, then a space when the
    model was trained with `use_space_char` (6,625 classes for the 6,623 lines of ppocr_keys_v1).
    """

    blank: int = field(default=0, metadata={"check": _blank})  # the blank's class
    space: bool = False  # a space class follows the dictionary's last entry

    def classes(self, dictionary: int) -> int:
        """The classes a model with this convention and a `dictionary` of so many entries answers."""
        return dictionary + 1 + int(self.space)


@dataclass
class FileEntry:
    """What a listed file must hash to; anything else is a tampered or truncated artifact."""

    sha256: str = field(metadata={"check": _check_sha256})
    size: int = field(metadata={"check": _non_negative})


@dataclass
class Lineage:
    """Where the model came from, so two artifacts can be told apart and reproduced."""

    recipe_digest: str | None = None  # sha256 of the recipe file the run used
    dataset_fingerprint: str | None = None  # sha256 of the data content (features + labels)
    code_version: str = __version__  # pipe version that wrote the artifact
    parent_digest: str | None = None  # identity digest of the artifact this one derives from
    backend: str | None = field(default=None, metadata={"check": lambda v: None if v is None else one_of(BACKENDS)(v)})
    seed: int | None = None


@dataclass(frozen=True)
class ModelSpec:
    """What a gate needs to know of a model besides its files: its inputs, outputs and task."""

    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    task: str = "classification"


@dataclass
class Manifest:
    """manifest.json: the contract between stages."""

    name: str = field(metadata={"check": check_name})
    version: int = field(metadata={"check": lambda v: None if v >= 1 else f"expected a version >= 1, got {v}"})
    task: Task
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    labels: list[str] = field(default_factory=list, metadata={"check": _check_labels})
    # graph inputs given one value at import (`--input-value`), written into model.onnx as constants: not fed
    pinned: list[PinnedInput] | None = field(default=None, metadata={"omit_none": True})
    detection: Detection | None = field(default=None, metadata={"omit_none": True})  # task detection only
    ctc: Ctc | None = field(default=None, metadata={"omit_none": True})  # task text-recognition only
    # a text model's tokenizer, carried in the version (pipeline/artifact/tokens.py); None: token ids only
    tokenizer: TokenizerRecord | None = field(default=None, metadata={"omit_none": True})
    # a text-generation model's KV cache layout, EOS ids and chat template (pipeline/artifact/generation.py)
    generation: Generation | None = field(default=None, metadata={"omit_none": True})
    lineage: Lineage = field(default_factory=Lineage)
    files: dict[str, FileEntry] = field(default_factory=dict, metadata={"check": _check_files})
    variants: dict[str, Variant] = field(default_factory=dict, metadata={"check": _check_variants})
    metrics: dict[str, float] = field(default_factory=dict)  # eval metrics of the trained model
    stages: Stages = field(default_factory=Stages)  # one typed record per stage that ran
    created: str = field(default_factory=lambda: _dt.datetime.now(_dt.UTC).isoformat())
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return encode(self)

    @property
    def spec(self) -> ModelSpec:
        return ModelSpec(self.inputs, self.outputs, self.task)

    @classmethod
    def from_dict(cls, data: Any, source: str = MANIFEST_NAME) -> Manifest:
        """Build a manifest from parsed JSON, naming every missing, unknown or mistyped field."""
        if not isinstance(data, dict):
            raise ArtifactError(f"{source}: expected a JSON object, got {type(data).__name__}")
        found = data.get("schema_version")
        if type(found) is int and found < SCHEMA_VERSION:
            raise ArtifactError(
                f"{source}: schema_version {found} was written by an older pipe; this pipe {__version__} reads "
                f"schema {SCHEMA_VERSION}: re-create the artifact (pipe train, or pipe import)"
            )
        if type(found) is not int or found > SCHEMA_VERSION:
            raise ArtifactError(
                f"{source}: schema_version {str(found)[:20]} is not supported by pipe {__version__} "
                f"(it reads up to {SCHEMA_VERSION}); upgrade pipe or re-create the artifact"
            )
        try:
            manifest = decode(cls, data)
        except ValueError as exc:
            raise ArtifactError(f"{source}: {exc}; fix the manifest or re-create the artifact") from None
        if problems := _contradictions(manifest):
            raise ArtifactError(f"{source}: {'; '.join(problems[:8])}; fix the manifest or re-create the artifact")
        return manifest

    def identity_digest(self) -> str:
        """sha256 of what identifies the model (not files, metrics or variants, which later stages add).

        Stamped into model.onnx's metadata so a model file can be matched to its manifest.
        """
        ident = {k: v for k, v in self.to_dict().items() if k in _IDENTITY_FIELDS}
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


def _feature_contradictions(inputs: list[TensorSpec]) -> list[str]:
    """Feature names must be distinct and one per column of a `[batch, F]` input."""
    problems = []
    for i, spec in enumerate(inputs):
        if spec.features is None:
            continue
        names = [f.name for f in spec.features]
        if len(spec.shape) != 2 or (isinstance(spec.shape[1], int) and spec.shape[1] != len(names)):
            problems.append(f"inputs[{i}].features: {len(names)} columns, but {spec.name!r} has shape {spec.shape}")
        if repeated := sorted({n for n in names if names.count(n) > 1}):
            problems.append(f"inputs[{i}].features: names must be distinct, {repeated[:3]} repeated")
    return problems


def _contradictions(manifest: Manifest) -> list[str]:
    """What each field is fine alone but the manifest says against itself (a hand edit, a bad merge)."""
    problems = []
    for key, specs in (("inputs", manifest.inputs), ("outputs", manifest.outputs)):
        names = [spec.name for spec in specs]
        if not names:
            problems.append(f"{key}: empty; a model has at least one (name, dtype, shape)")
        elif repeated := sorted({n for n in names if names.count(n) > 1}):
            problems.append(f"{key}: names must be distinct, {repeated[:3]} repeated")
    for name, variant in manifest.variants.items():
        where, file = f"variants.{name}", variant_file(name)
        if variant.file != file:
            problems.append(f"{where}.file: {variant.file[:60]!r}, but variant {name!r} lives in {file!r}")
        elif variant.passed and file not in manifest.files:
            problems.append(f"{where}.file: {file!r} is not listed in files, so it cannot be verified")
        if variant.format != (fmt := file.rsplit(".", 1)[-1]):
            problems.append(f"{where}.format: {variant.format!r}, but {file!r} is in format {fmt!r}")
    for key, specs in (("inputs", manifest.inputs), ("outputs", manifest.outputs)):
        for i, spec in enumerate(specs):
            if spec.batch_axis is not None and spec.batch_axis >= max(len(spec.shape), 1):
                dims = len(spec.shape)
                problems.append(f"{key}[{i}].batch_axis: {spec.batch_axis}, but {spec.name!r} has {dims} dims")
    fed = {spec.name for spec in manifest.inputs}
    if clash := sorted(fed & {p.name for p in manifest.pinned or []}):
        problems.append(f"pinned: {clash[:3]} are also fed inputs; a pinned input is a constant of the model")
    for i, spec in enumerate(manifest.inputs):
        if spec.tokens is not None and not spec.dtype.startswith(("int", "uint")):
            problems.append(f"inputs[{i}].tokens: token ids are integers, but {spec.name!r} is {spec.dtype}")
    problems += tokenizer_problems(manifest.tokenizer, manifest.inputs, manifest.files)
    problems += _feature_contradictions(manifest.inputs)
    problems += preprocessing_problems(manifest.inputs)  # an image record that cannot be applied: refused up front
    problems += _task_contradictions(manifest)
    ids = next((s.tokens for s in manifest.inputs if s.tokens is not None and s.tokens.role == "ids"), None)
    problems += generation_problems(
        manifest.generation,
        manifest.task,
        [s.name for s in manifest.inputs],
        [s.name for s in manifest.outputs],
        manifest.files,
        ids.vocab_size if ids is not None else None,
    )
    return problems


def _task_contradictions(manifest: Manifest) -> list[str]:
    """Labels that do not match the classes the task's output holds; detection settings without detection."""
    first = manifest.outputs[0] if manifest.outputs else None
    if manifest.task == "detection" and manifest.detection is None:
        return ["detection: missing; a task 'detection' model records how its output becomes boxes"]
    if manifest.task != "detection" and manifest.detection is not None:
        return [f"detection: recorded for task {manifest.task!r}; it belongs to task 'detection' alone"]
    if (manifest.task == "text-recognition") != (manifest.ctc is not None):
        return ["ctc: a task 'text-recognition' model records how its classes read as text, and only it"]
    if manifest.task != "text-recognition" and len(set(manifest.labels)) != len(manifest.labels):
        return ["labels: class names must be distinct"]  # a recognizer's dictionary may repeat an entry
    if first is None or not manifest.labels:
        return []
    if manifest.ctc is not None and len(first.shape) == 3 and isinstance(first.shape[2], int):
        if (classes := manifest.ctc.classes(len(manifest.labels))) == first.shape[2]:
            return []
        space = " and a space" if manifest.ctc.space else ""
        return [f"labels: a dictionary of {len(manifest.labels)} entries with the blank{space} makes {classes} "
                f"classes, but output {first.name!r} has {first.shape[2]}"]  # fmt: skip
    if manifest.task == "classification" and first.shape and isinstance(first.shape[-1], int):
        classes = first.shape[-1]
    elif manifest.task == "detection" and len(first.shape) == 3 and isinstance(first.shape[1], int):
        classes = first.shape[1] - 4  # [batch, 4 + classes, anchors]
    else:
        return []
    if len(manifest.labels) == classes:
        return []
    return [f"labels: {len(manifest.labels)} class names, but output {first.name!r} has {classes} classes"]


_IDENTITY_FIELDS = (
    "name", "version", "task", "inputs", "outputs", "labels", "pinned", "detection", "ctc", "tokenizer", "generation",
    "lineage",
    "created",
)  # fmt: skip


def check_relative(rel: str) -> PurePosixPath:
    """Refuse a manifest path that could point outside the artifact directory."""
    path = PurePosixPath(rel)
    if path.is_absolute() or rel.startswith(("/", "\\")) or ".." in path.parts or not path.parts or "\x00" in rel:
        raise ArtifactError(
            f"path {rel[:80]!r} escapes the artifact directory; manifest paths must be relative and "
            "stay inside it (no '..', no absolute paths)"
        )
    return path
