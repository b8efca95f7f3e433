"""Stage records: one typed record per stage that ran, in `manifest.stages`.

Every record says what the stage ran with (`settings`: its recipe section as it was read, plus
command-line overrides), what it read (`inputs`: name -> sha256), when it finished and which pipe
wrote it, then its own results. `pipe run` compares `settings_digest()` with the recipe's section
as it is now to decide whether a stage is up to date. Records are validated on load like the rest
of the manifest (pipeline/core/jsontypes.py): a mistyped field is refused by its dotted path.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from pipeline import __version__


def now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat()


def settings_digest(settings: dict[str, Any]) -> str:
    """sha256 of settings as canonical JSON: equal settings, equal digest, whatever the key order."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def parity_problem(parity: dict[str, Any]) -> str | None:
    """What is wrong with a parity record (`ParityReport.to_dict`) edited by hand; None when nothing is.

    Readers index `rows` and read `passed`: a string for the rows, or a number for the verdict, would
    pass the type check of a free-form object and break a reader later, so they are checked here.
    """
    rows = parity.get("rows", [])
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        return f"rows must be a list of objects (one per check the gate ran), got {str(rows)[:40]!r}"
    if "passed" in parity and not isinstance(parity["passed"], bool):
        return f"passed must be true or false, got {str(parity['passed'])[:40]!r}"
    return None


@dataclass(kw_only=True)
class StageRecord:
    """What every stage records."""

    settings: dict[str, Any] = field(default_factory=dict)  # the settings it ran with
    inputs: dict[str, str] = field(default_factory=dict)  # what it read: name or path -> sha256
    finished: str = field(default_factory=now)  # ISO 8601 UTC
    code_version: str = __version__  # pipe version that ran it

    def settings_digest(self) -> str:
        return settings_digest(self.settings)


@dataclass(kw_only=True)
class GoldenRecord:
    """Which samples golden.npz holds."""

    split: str  # the split they come from: test
    samples: int
    whole_split: bool  # golden.npz holds the whole split, so a metric on it is the split's metric
    split_size: int


@dataclass(kw_only=True)
class CheckpointRecord:
    weights: str  # the final (best validation epoch) weights, safetensors, relative to the artifact
    state: str | None = None  # the last resumable training state


@dataclass(kw_only=True)
class TrainRecord(StageRecord):
    """`pipe train`: settings are the recipe's name, task, model, data and train sections as trained."""

    recipe_path: str | None = None  # the recipe file relative to the artifact directory, so it can move
    data: dict[str, Any]  # the data-shape record the model factory takes (DataInfo)
    checkpoint: CheckpointRecord
    golden: GoldenRecord
    splits: dict[str, int]  # samples per split
    backend: str = "torch"
    device: str
    precision: str
    world_size: int = 1
    strategy: str = "single"
    framework: str = ""  # e.g. "torch 2.13.0"
    python: str = ""
    best_epoch: int
    kept: str = ""  # why best_epoch's weights were kept: train.monitor, its value, how the run ended
    epochs_run: int
    steps: int
    stopped_early: bool = False
    wall_s: float
    cpu_s: float
    samples_per_s: float
    parameters: dict[str, int] = field(default_factory=dict)  # {"trainable", "total"}: LoRA trains a few percent


@dataclass(kw_only=True)
class ExportRecord(StageRecord):
    """`pipe export`: settings are the recipe's export section and the command-line overrides."""

    # dynamo | torchscript; fused: a decoder written from its weights (export/fused_decoder.py);
    # ort: the ORT backend's trained ONNX model, gated as it is
    exporter: str
    opset: int  # the opset the file declares
    requested_opset: int
    external_data: bool
    fallback_reason: str | None = None  # why dynamo was not used
    parity: dict[str, Any] = field(default_factory=dict, metadata={"check": parity_problem})  # rows and metric
    metric: dict[str, Any] = field(default_factory=dict)  # {"name", "reference", "onnx", "difference", "samples"}


@dataclass(kw_only=True)
class PictureFolder:
    """`pipe import --eval-data DIR` given a folder of pictures: what went into golden.npz."""

    found: int  # pictures in the folder (png, jpg, jpeg, bmp, webp)
    used: int  # converted into golden.npz: all, or `limit` of them chosen with seed 0
    limit: int  # --eval-limit, lowered when the samples would pass 512 MiB together
    classes: dict[str, int] = field(default_factory=dict)  # class folder -> label index; empty: a flat folder


@dataclass(kw_only=True)
class Reading:
    """One thing `pipe import` set from what the model's exporter recorded, or from the flag that overrode it."""

    value: Any  # what was set: the task, the number of labels, the image size, ...
    source: str  # where it came from: "metadata_props['names'] (Ultralytics)", "--labels", "default", ...


@dataclass(kw_only=True)
class ImportRecord(StageRecord):
    """`pipe import`: a model made elsewhere."""

    source: str  # the path it was imported from, as given
    source_sha256: str
    producer: str
    ir_version: int
    opset: int | None
    # where golden.npz's inputs came from: `generated` means every judgement of this model and its
    # variants is on generated inputs (agreement on noise, not accuracy)
    golden: Literal["eval-data", "generated"]
    eval_data: str | None = None
    pictures: PictureFolder | None = field(default=None, metadata={"omit_none": True})  # --eval-data DIR
    parity: dict[str, Any] = field(default_factory=dict, metadata={"check": parity_problem})
    # What the exporter recorded (pipeline/export/conventions.py): the model's metadata_props as found
    # (keys and values verbatim, each value cut at 2,000 characters, at most 64 keys), the convention
    # recognised in them (Ultralytics, Paddle, Hugging Face), what pipe set from them or from flags
    # (task, labels, image size, letterbox, stride, detection) with the source of each, and a line
    # for each value ignored or refused and why.
    metadata: dict[str, str] = field(default_factory=dict)
    convention: str | None = None
    read: dict[str, Reading] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def judged_on_generated(self) -> bool:
        return self.golden == "generated"


@dataclass(kw_only=True)
class OptimizeRecord(StageRecord):
    """`pipe optimize`: settings are the recipe's optimize section and the command-line overrides."""

    parent: str  # sha256 of the model.onnx every variant was made from and judged against
    policy: dict[str, Any] = field(default_factory=dict)  # the budget the lossy variants were held to
    variants: list[str] = field(default_factory=list)  # the variants this run made, passed or failed
    failed: list[str] = field(default_factory=list)  # those that missed their budget
    report: str = "reports/optimize.json"


@dataclass(kw_only=True)
class FixedDim:
    """A free dim of model.onnx that the edge models take at one size (devices run fixed spatial shapes)."""

    input: str  # the model.onnx input
    axis: int
    dim: str  # the dim's name in model.onnx (every input and output axis of that name took the size)
    size: int
    source: str  # where the size came from: "--input-shape", "the recorded image preprocessing (48x192)", ...
    # the size is a guess: golden.npz's generated inputs of a model imported without --eval-data or --input-shape
    guessed: bool = False


@dataclass(kw_only=True)
class ConvertAttempt:
    """One onnx2tf setting the edge stage tried, in order, and what became of it."""

    name: str  # e.g. "onnxslim", "onnxslim + ultralytics"
    options: dict[str, Any] = field(default_factory=dict)  # onnx2tf.convert keyword arguments on top of pipe's own
    slim: bool = True  # the graph went through onnxslim first (and onnx2tf's own onnxsim was off)
    used: bool = False  # its models are the ones recorded
    reason: str = ""  # why it was left (onnx2tf's reason, the gate's conversion fault), or why the search stopped at it
    seconds: float = 0.0


@dataclass(kw_only=True)
class EdgeRecord(StageRecord):
    """`pipe export --target edge`: settings are the recipe's edge section and the command-line overrides."""

    parent: str  # sha256 of the model.onnx every edge model was converted from and judged against
    converter: str  # e.g. "onnx2tf 1.28.8"
    variants: list[str] = field(default_factory=list)  # the edge variants this run made, passed or failed
    failed: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)  # conversion wall time per variant
    # the machine the conversion times and checks were taken on (this host, not a device): cpu, cpus, system
    host: dict[str, Any] = field(default_factory=dict)
    fixed_dims: list[FixedDim] = field(default_factory=list)  # free non-batch dims converted at a fixed size
    attempts: list[ConvertAttempt] = field(default_factory=list)  # every conversion tried, in order


@dataclass(kw_only=True)
class CheckRecord(StageRecord):
    """`pipe run`'s check against the committed baseline: inputs are the baseline file's sha256 and the digest
    of the candidate's summary (what the checks read); settings are the budgets."""

    baseline: str  # the baseline file, as given
    passed: bool
    failures: list[str] = field(default_factory=list)  # the checks that failed
    reports: list[str] = field(default_factory=list)  # reports/check.json, .md, .xml


@dataclass(kw_only=True)
class BenchmarkRecord(StageRecord):
    """`pipe benchmark`: every format timed side by side; inputs are the timed files' sha256 by path."""

    report: str = "reports/benchmark.json"
    plot: str | None = "reports/benchmark.png"
    formats: list[str] = field(default_factory=list)  # the rows measured, in table order
    failed: list[str] = field(default_factory=list)  # rows that could not be timed (the report says why)


@dataclass(kw_only=True)
class ReportRecord(StageRecord):
    """`pipe report`: the model card and the training curves, made from the manifest and reports/ as they were."""

    card: str = "reports/model-card.md"
    curves: str | None = None  # reports/training-curves.png, when the artifact was trained here


@dataclass(kw_only=True)
class Stages:
    """manifest.stages: the record of each stage that ran (absent when it did not)."""

    train: TrainRecord | None = field(default=None, metadata={"omit_none": True})
    export: ExportRecord | None = field(default=None, metadata={"omit_none": True})
    import_: ImportRecord | None = field(default=None, metadata={"json": "import", "omit_none": True})
    optimize: OptimizeRecord | None = field(default=None, metadata={"omit_none": True})
    edge: EdgeRecord | None = field(default=None, metadata={"omit_none": True})
    check: CheckRecord | None = field(default=None, metadata={"omit_none": True})
    benchmark: BenchmarkRecord | None = field(default=None, metadata={"omit_none": True})
    report: ReportRecord | None = field(default=None, metadata={"omit_none": True})

    def names(self) -> list[str]:
        """The stages that ran, in pipeline order."""
        return [name for name, record in self.items()]

    def items(self) -> list[tuple[str, StageRecord]]:
        pairs = (
            ("train", self.train),
            ("import", self.import_),
            ("export", self.export),
            ("optimize", self.optimize),
            ("edge", self.edge),
            ("check", self.check),
            ("benchmark", self.benchmark),
            ("report", self.report),
        )
        return [(name, record) for name, record in pairs if record is not None]
