"""The rows of a benchmark: every model an artifact holds, in table order, with what its records say.

One row per model file: the trained torch model (only when this artifact was trained here, by the
torch backend: its weights are in `checkpoint/`), `model.onnx` (the fp32 variant), each other ONNX
variant, then each TFLite edge model, in the order the manifest recorded them. The figures that
are not timed come from the records, never measured again here: the size of the file, its
precision, its status (a failed or stale variant says why, through `pipeline.artifact.variants.unusable`)
and the task metric its stage measured on the evaluation split.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.artifact.directions import HIGHER_IS_BETTER, metric_drop
from pipeline.artifact.directory import Artifact
from pipeline.artifact.golden import GOLDEN_NAME
from pipeline.artifact.variants import FP32, MODEL_FILE, Variant, unusable
from pipeline.core.errors import InputError

TORCH = "torch"  # the name of the trained model's row
RUNTIMES = {"torch": "torch", "onnx": "onnxruntime", "tflite": "litert"}  # format -> the runtime that times it
REFERENCE, PASSED, FAILED, STALE = "reference", "passed", "failed", "stale"


@dataclass(frozen=True)
class Row:
    """One model of the artifact as the benchmark lists it."""

    name: str  # torch, fp32, opt, int8-static, tflite-fp16, ...
    format: str  # torch | onnx | tflite
    precision: str  # fp32 | fp16 | int8 | mixed
    file: str  # the file timed, relative to the artifact (torch: the weights it loads)
    size: int  # bytes of that file
    status: str  # reference (torch) | passed | failed | stale
    reason: str = ""  # why it failed or is stale
    metric: float | None = None  # the task metric recorded for it (None: none recorded)
    variant: Variant | None = None  # its variant record (None for torch)

    @property
    def runtime(self) -> str:
        return RUNTIMES[self.format]

    @property
    def usable(self) -> bool:
        """Whether pipe would serve or ship it: a failed or stale variant is timed, but marked."""
        return self.status in (REFERENCE, PASSED)


def plan_rows(artifact: Artifact) -> tuple[list[Row], list[str]]:
    """The rows to time, in table order, and notes on what is left out (an imported model has no torch row).

    InputError when the artifact has no model.onnx yet: nothing to compare the other formats with.
    """
    manifest = artifact.manifest
    if MODEL_FILE not in manifest.files or FP32 not in manifest.variants:
        raise InputError(
            f"artifact {artifact.root} has no model.onnx yet, so there is nothing to benchmark; "
            f"run `pipe export {artifact.root}` first (or `pipe import` a model)"
        )
    name = metric_name(artifact)
    notes: list[str] = []
    rows: list[Row] = []
    torch_row = _torch_row(artifact, name, notes)
    if torch_row is not None:
        rows.append(torch_row)
    listed = {entry.sha256 for entry in manifest.files.values()}
    onnx = [(n, v) for n, v in manifest.variants.items() if v.format == "onnx"]
    onnx.sort(key=lambda pair: pair[0] != FP32)  # model.onnx first, the others in recorded order
    tflite = [(n, v) for n, v in manifest.variants.items() if v.format == "tflite"]
    for variant_name, variant in [*onnx, *tflite]:
        why = unusable(variant, listed)
        status = PASSED if why is None else (FAILED if not variant.passed else STALE)
        entry = manifest.files.get(variant.file)
        rows.append(
            Row(
                name=variant_name,
                format=variant.format,
                precision=variant.precision,
                file=variant.file,
                size=entry.size if entry is not None else (variant.size or 0),
                status=status,
                reason=why or "",
                metric=variant.metrics.get(name) if name else None,
                variant=variant,
            )
        )
    if not tflite:
        notes.append(f"no TFLite rows: no edge models recorded (`pipe export {artifact.root} --target edge`)")
    return rows, notes


def metric_name(artifact: Artifact) -> str | None:
    """The task metric the rows are compared on: the one model.onnx's record holds (accuracy, mae), if any."""
    manifest = artifact.manifest
    fp32 = manifest.variants.get(FP32)
    for metrics in (fp32.metrics if fp32 else {}, manifest.metrics):
        for key in metrics:
            if key in HIGHER_IS_BETTER:
                return key
    return None


def drop(name: str | None, fp32: float | None, value: float | None) -> float | None:
    """How much worse `value` is than fp32's (negative: better; for MAE a rise), or None when one is missing."""
    if name is None or fp32 is None or value is None:
        return None
    return metric_drop(name, fp32, value)


def timed_files(artifact: Artifact, rows: list[Row]) -> dict[str, str]:
    """{relative path: sha256} of every file the rows load, and of golden.npz, the inputs they are fed."""
    files = artifact.manifest.files
    paths = [row.file for row in rows] + [GOLDEN_NAME]
    return {path: files[path].sha256 for path in sorted(paths) if path in files}


def _torch_row(artifact: Artifact, name: str | None, notes: list[str]) -> Row | None:
    """The trained model's row, when this artifact was trained here by the torch backend; else a note."""
    manifest = artifact.manifest
    backend, record = manifest.lineage.backend, manifest.stages.train
    if backend == "import":
        notes.append("no torch row: the model was imported (`pipe import`), so model.onnx is the first format here")
        return None
    if backend != "torch" or record is None:
        notes.append(f"no torch row: the artifact records no torch training (lineage.backend: {backend})")
        return None
    weights = record.checkpoint.weights
    entry = manifest.files.get(weights)
    return Row(
        name=TORCH,
        format="torch",
        precision="fp32",  # the backend loads it in fp32 whatever precision it was trained in
        file=weights,
        size=entry.size if entry is not None else 0,
        status=REFERENCE,
        reason="" if entry is not None else f"{weights} is not listed in the manifest",
        metric=manifest.metrics.get(name) if name else None,
    )
