"""Which variant of an artifact to serve: `--variant` against the manifest's variant records.

fp32 (`model.onnx`) by default; `--variant NAME` for every model, `--variant MODEL=NAME` for one.
A server-wide choice a model lacks falls back to fp32 with a warning; a per-model choice that does
not exist refuses the version. A variant recorded as failed is never served: choosing it (or the
fp32 default, were it failed) refuses the version with the variant's recorded reason. Files come
from `pipeline.variants.variant_file`, the one mapping of a variant name to its file.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pipeline.artifact import Artifact
from pipeline.errors import ArtifactError, InputError
from pipeline.variants import FP32, Variant, check_variant_name, variant_file

log = logging.getLogger("pipe.serve")

EVERY_MODEL = "*"  # the key of a server-wide choice in the model -> variant map


class VariantRefused(ArtifactError):
    """The manifest is sound, and says this version cannot serve the variant asked for."""


@dataclass(frozen=True)
class Choice:
    """The variant a version serves. Two equal choices run the same model file."""

    variant: str  # fp32, opt, int8 ...
    file: str  # relative to the artifact
    sha256: str  # the file's digest in the manifest: a new digest is a new model to load


def check_choices(chosen: dict[str, str]) -> None:
    """Refuse an invalid variant name before anything loads (exit 2)."""
    for model, variant in chosen.items():
        if problem := check_variant_name(variant):
            where = "" if model == EVERY_MODEL else f"{model}="
            raise InputError(f"--variant {where}{variant}: {problem}")


def choose(artifact: Artifact, chosen: dict[str, str]) -> Choice:
    """The variant to serve for `artifact`; a server-wide choice it lacks falls back to fp32 with a warning.

    Raises VariantRefused when the variant asked for does not exist, failed or is not ONNX, and
    ArtifactError when the manifest contradicts itself about the variant's file.
    """
    choice, fallback = choose_quietly(artifact, chosen)
    if fallback:
        log.warning("%s", fallback)
    return choice


def choose_quietly(artifact: Artifact, chosen: dict[str, str]) -> tuple[Choice, str | None]:
    """`choose`, with the fallback warning returned instead of logged (None when there is none)."""
    check_choices(chosen)
    fallback = None
    explicit = chosen.get(artifact.name)
    name = explicit or chosen.get(EVERY_MODEL, FP32)
    records = artifact.manifest.variants
    # fp32 (model.onnx) unless its record says it failed, then every passed ONNX variant
    servable = [k for k in dict.fromkeys([FP32, *records]) if k not in records or _servable(records[k])]
    if name != FP32 and name not in records:
        if explicit:
            raise VariantRefused(f"{artifact.root}: variant {name!r} does not exist; available: {servable}")
        fallback = f"{artifact.root} has no variant {name!r} (available {servable}); serving fp32"
        name = FP32
    file = variant_file(name)
    record = records.get(name)
    if record is not None:
        if not record.passed:
            raise VariantRefused(
                f"{artifact.root}: variant {name!r} failed {record.stage}: {record.reason or 'no reason recorded'}; "
                f"a failed variant is never served: choose one of {servable} or re-run {record.stage}"
            )
        if record.format != "onnx":
            raise VariantRefused(
                f"{artifact.root}: variant {name!r} is a {record.format} model; pipe serve runs onnx variants: "
                f"{servable}"
            )
        if record.file != file:
            raise ArtifactError(
                f"{artifact.root}: the manifest records variant {name!r} in {record.file!r}, but it belongs in "
                f"{file!r}; re-create the variant with the stage that made it"
            )
    entry = artifact.manifest.files.get(file)
    if entry is None:
        raise ArtifactError(
            f"{artifact.root}: {file} is not listed in the manifest's files, so it cannot be verified; "
            "re-create the artifact with pipe export / pipe import"
        )
    return Choice(name, file, entry.sha256), fallback


def _servable(record: Variant) -> bool:
    return record.format == "onnx" and record.passed
