"""`pipe predict ARTIFACT --input FILE`: load and verify, choose the variant, read the input, run once."""

from __future__ import annotations

from pathlib import Path

from pipeline.artifact.variants import FP32
from pipeline.core.errors import ArtifactError
from pipeline.predict.inputs import read_inputs
from pipeline.predict.model import choose_variant, load_runner
from pipeline.predict.result import Prediction


def predict_file(
    artifact_path: str | Path, input_path: str | Path, variant: str = FP32, allow_failed: bool = False
) -> Prediction:
    """Run `variant` of the artifact at `artifact_path` (a version, or a model: its latest) on `input_path`.

    The artifact is verified on load; the input is checked against the manifest's input specs
    before anything runs. Bad input, an unknown variant, or a failed or stale one without
    `allow_failed` raise InputError (exit 2).
    """
    from pipeline.artifact.directory import Artifact, resolve_artifact

    artifact = Artifact.load(resolve_artifact(artifact_path))
    chosen = choose_variant(artifact, variant, allow_failed)
    inputs = read_inputs(Path(input_path), artifact.manifest)
    runner = load_runner(artifact, chosen)
    try:
        outputs = runner(inputs)
    except Exception as exc:  # onnxruntime's and LiteRT's errors share no base class
        from pipeline.core.errors import first_line

        # the input already fits the manifest's specs, so the model file disagrees with its manifest
        raise ArtifactError(
            f"variant {chosen.name!r} ({chosen.file}) failed on {Path(input_path).name}, which fits the "
            f"manifest's input specs: {first_line(exc)}"
        ) from exc
    return Prediction(
        artifact=str(artifact.root),
        variant=chosen.name,
        file=chosen.file,
        format=chosen.format,
        manifest=artifact.manifest,
        outputs=outputs,
        notes=[chosen.note] if chosen.note else [],
    )
