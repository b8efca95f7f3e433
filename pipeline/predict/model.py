"""Which variant to run, and a runner for it: named arrays in -> named arrays out.

fp32 (`model.onnx`) by default. A failed or stale variant (`pipeline.artifact.variants.unusable`) is refused
with the reason unless `allow_failed`: looking at what a failed int8 model answers is a fair
reason to run it, but it must be asked for, and it is never silent (a note says why it is not
usable). Its file must still be listed in the manifest, so it was verified on load like every other.
ONNX variants run through `create_session` on CPU; TFLite variants through the edge runner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.artifact.variants import FP32, MODEL_FILE, Variant, check_variant_name, unusable, variant_file
from pipeline.core.errors import ArtifactError, InputError, first_line

if TYPE_CHECKING:
    from pathlib import Path

    from pipeline.artifact.directory import Artifact
    from pipeline.runtime.runners import Runner


@dataclass(frozen=True)
class Chosen:
    """The variant to run and what the user should know about it."""

    name: str  # fp32, int8, tflite-fp16 ...
    file: str  # relative to the artifact
    format: str  # onnx | tflite
    note: str | None = None  # why it is not usable, when run anyway with allow_failed


def choose_variant(artifact: Artifact, name: str = FP32, allow_failed: bool = False) -> Chosen:
    """The variant `name` of `artifact`, refused (InputError) when it is missing, failed or stale."""
    if problem := check_variant_name(name):
        raise InputError(f"--variant {name}: {problem}")
    manifest = artifact.manifest
    record = manifest.variants.get(name)
    if record is None and name != FP32:
        known = ", ".join(dict.fromkeys([FP32, *manifest.variants])) if MODEL_FILE in manifest.files else "none"
        raise InputError(f"variant {name!r} does not exist in {artifact.root}; its variants: {known}")
    note = None
    if record is not None and (why := unusable(record, {e.sha256 for e in manifest.files.values()})):
        if not allow_failed:
            raise InputError(
                f"variant {name!r} is not usable: {why}. Pass --allow-failed to run it anyway for a look, "
                "or choose a passed variant"
            )
        note = f"variant {name!r} is not usable ({why}); running it because --allow-failed was given"
    file = variant_file(name)
    if file not in manifest.files:
        if note:
            raise ArtifactError(f"variant {name!r} failed and its file {file} was not kept: there is nothing to run")
        how = "pipe export (or pipe import)" if name == FP32 else "the stage that makes it"
        raise ArtifactError(f"{artifact.root} lists no {file} (variant {name!r}); make it with {how} first")
    return Chosen(name, file, record.format if record else "onnx", note)


def load_runner(artifact: Artifact, chosen: Chosen) -> Runner:
    """A runner for the chosen variant's file: onnxruntime for ONNX, the edge runner for TFLite."""
    path = artifact.path(chosen.file)
    if chosen.format == "tflite":
        return _tflite_runner(path, chosen.name, artifact.manifest.variants[chosen.name])
    from pipeline.runtime.runners import OrtRunner
    from pipeline.runtime.session import create_session

    return OrtRunner(create_session(path, "cpu"))


def _tflite_runner(path: Path, name: str, record: Variant) -> Runner:
    """The edge runner on `path`, fed NCHW as the manifest says, with the layout and names the edge stage recorded."""
    from pipeline.runtime.tflite_runner import TFLiteRunner

    edge = record.edge  # the edge stage's record of the converted model's I/O
    layout = (edge.layout if edge is not None else str(record.settings.get("layout") or "NCHW")).upper()
    names = dict(edge.names) if edge is not None else {}
    # inputs whose (x - mean) / std the caller applies, outputs whose boxes come divided by [W, H] (edge/scaling.py)
    normalize = {t.name: t.normalize for t in edge.inputs if t.normalize} if edge is not None else None
    boxes = {t.name: t.boxes_normalized_by for t in edge.outputs if t.boxes_normalized_by} if edge is not None else None
    try:
        return TFLiteRunner(path, names=names, layout=layout, normalize=normalize, boxes=boxes)
    except ImportError as exc:
        raise InputError(
            f"variant {name!r} is a TFLite model and no TFLite interpreter is installed ({exc}); install the "
            "edge profile: pip install -c requirements.lock '.[edge]'"
        ) from None
    except (ValueError, RuntimeError, OSError) as exc:
        raise ArtifactError(f"{path}: cannot load it as a TFLite model: {first_line(exc)}") from exc
