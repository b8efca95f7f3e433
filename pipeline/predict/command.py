"""`pipe predict ARTIFACT --input FILE`: load and verify, choose the variant, read the input, run once."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from pipeline.artifact.manifest import Detection, Manifest
from pipeline.artifact.variants import FP32
from pipeline.core.arrays import Arrays
from pipeline.core.errors import ArtifactError, InputError
from pipeline.predict.inputs import read_inputs, read_texts
from pipeline.predict.model import choose_variant, load_runner
from pipeline.predict.result import Detections, Prediction, Texts
from pipeline.runtime.ctc import characters, greedy
from pipeline.runtime.detection import detect
from pipeline.runtime.images import Placement

DETECTION_FLAGS = {"confidence": "--confidence", "iou": "--iou", "max_detections": "--max-detections"}


def predict_file(
    artifact_path: str | Path,
    input_path: str | Path | None,
    variant: str = FP32,
    allow_failed: bool = False,
    detection: dict[str, Any] | None = None,
    texts: list[str] | None = None,
) -> Prediction:
    """Run `variant` of the artifact at `artifact_path` (a version, or a model: its latest) on `input_path`,
    or on `texts` (one row each, tokenized with the tokenizer the artifact carries).

    The artifact is verified on load; the input is checked against the manifest's input specs
    before anything runs. Bad input, an unknown variant, or a failed or stale one without
    `allow_failed` raise InputError (exit 2). A detector's output is decoded into boxes with the
    artifact's detection settings, or those `detection` gives (`confidence`, `iou`, `max_detections`),
    in the picture's pixels when the input is a picture. A text recognizer's output is read as text.
    """
    from pipeline.artifact.directory import Artifact, resolve_artifact

    artifact = Artifact.load(resolve_artifact(artifact_path))
    settings = _detection_settings(artifact.manifest, detection or {})
    chosen = choose_variant(artifact, variant, allow_failed)
    notes = [chosen.note] if chosen.note else []
    if (input_path is None) == (not texts):
        raise InputError("give the input as --input FILE or as --text TEXT (repeatable), one of the two")
    if texts:
        inputs, placement, source = read_texts(artifact.root, artifact.manifest, texts), None, "the texts"
    else:
        assert input_path is not None
        inputs, placement = read_inputs(Path(input_path), artifact.manifest, notes)
        source = Path(input_path).name
    runner = load_runner(artifact, chosen)
    try:
        outputs = runner(inputs)
    except Exception as exc:  # onnxruntime's and LiteRT's errors share no base class
        from pipeline.core.errors import first_line

        # the input already fits the manifest's specs, so the model file disagrees with its manifest
        raise ArtifactError(
            f"variant {chosen.name!r} ({chosen.file}) failed on {source}, which fits the "
            f"manifest's input specs: {first_line(exc)}"
        ) from exc
    return Prediction(
        artifact=str(artifact.root),
        variant=chosen.name,
        file=chosen.file,
        format=chosen.format,
        manifest=artifact.manifest,
        outputs=outputs,
        notes=notes,
        detections=_detections(artifact.manifest, outputs, placement, settings) if settings else None,
        texts=_texts(artifact.manifest, outputs),
    )


def _detection_settings(manifest: Manifest, given: dict[str, Any]) -> Detection | None:
    """A detector's recorded settings with the options given on top; None for any other model (which
    refuses the options)."""
    given = {key: value for key, value in given.items() if value is not None}
    if manifest.task != "detection" or manifest.detection is None:
        if given:
            flags = ", ".join(DETECTION_FLAGS[key] for key in given)
            raise InputError(f"{flags} set how a detector's boxes are decoded; this is a {manifest.task} model: "
                             "leave them out")  # fmt: skip
        return None
    return replace(manifest.detection, **given)


def _detections(manifest: Manifest, outputs: Arrays, placement: Placement | None, settings: Detection) -> Detections:
    """The head output decoded into each sample's boxes, in the picture's pixels for a picture (the
    letterbox undone), else in input pixels."""
    name = manifest.outputs[0].name
    name = name if name in outputs else next(iter(outputs))  # a runner naming outputs its own way
    head = outputs[name]
    placements = [placement] * len(head) if placement is not None else None
    try:
        boxes = detect(head, settings.confidence, settings.iou, settings.max_detections, placements)
    except ValueError as exc:  # a variant answering another shape than the manifest's head
        raise ArtifactError(f"output {name!r} is not a detection head's output: {exc}") from None
    return Detections(name, boxes, "picture" if placement is not None else "input", settings)


def _texts(manifest: Manifest, outputs: Arrays) -> Texts | None:
    """A text recognizer's output read as each sample's text and confidence; None for any other model."""
    if manifest.ctc is None:
        return None
    name = manifest.outputs[0].name
    name = name if name in outputs else next(iter(outputs))  # a runner naming outputs its own way
    table = characters(manifest.labels, manifest.ctc.blank, manifest.ctc.space)
    try:
        reads = greedy(outputs[name], manifest.ctc.blank)
    except ValueError as exc:  # a variant answering another shape than the manifest's
        raise ArtifactError(f"output {name!r} is not a CTC recognizer's output: {exc}") from None
    return Texts(name, [(r.text(table), r.confidence) for r in reads])
