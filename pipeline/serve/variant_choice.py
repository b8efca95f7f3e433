"""Which variant of an artifact to serve: `--variant` against the manifest's variant records.

fp32 (`model.onnx`) by default; `--variant NAME` for every model, `--variant MODEL=NAME` for one.
A failed variant is never served, nor a stale one (made from a model.onnx since exported again).
A server-wide choice is a preference: a model whose variant is missing, failed or stale serves
fp32 with a warning, so a failed optimize run never takes a working model offline. A per-model
choice is a requirement: a variant that is missing, failed or stale refuses the version with the
reason. A failed fp32 refuses the version whatever was asked for. Files come
from `pipeline.artifact.variants.variant_file`, the one mapping of a variant name to its file.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pipeline.artifact.directory import Artifact
from pipeline.artifact.variants import FP32, Variant, check_variant_name, unusable, variant_file
from pipeline.core.errors import ArtifactError, InputError

log = logging.getLogger("pipe.serve")

EVERY_MODEL = "*"  # the key of a server-wide choice in the model -> variant map
BEST = "best"  # not a variant: the fastest servable one, by the latency `pipe optimize` recorded
# --variant best leaves fp32 only for a variant faster by more than this share of fp32's p50: closer
# figures are timing noise (two runs of one model side by side differ by a few percent on a shared CPU)
NOISE = 0.05


class VariantRefused(ArtifactError):
    """The manifest is sound, and says this version cannot serve the variant asked for."""


class NotExported(ArtifactError):
    """A version that training wrote but export has not reached yet: a step to take, not a fault."""


@dataclass(frozen=True)
class Choice:
    """The variant a version serves. Two equal choices run the same model file."""

    variant: str  # fp32, opt, int8 ...
    file: str  # relative to the artifact
    sha256: str  # the file's digest in the manifest: a new digest is a new model to load


def check_choices(chosen: dict[str, str]) -> None:
    """Refuse an invalid variant name before anything loads (exit 2)."""
    for model, variant in chosen.items():
        if variant != BEST and (problem := check_variant_name(variant)):
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
    listed = {entry.sha256 for entry in artifact.manifest.files.values()}

    def problem(variant: str) -> str | None:
        record = records.get(variant)
        if record is None:
            return None if variant == FP32 else "does not exist"  # fp32 is model.onnx, recorded or not
        if why := unusable(record, listed):
            return why
        return None if record.format == "onnx" else f"is a {record.format} model; pipe serve runs onnx variants"

    # fp32 (model.onnx) unless its record says it cannot serve, then every servable ONNX variant
    servable = [k for k in dict.fromkeys([FP32, *records]) if problem(k) is None]
    if name == BEST:
        name = fastest(artifact, servable)
    why = problem(name)
    if why is not None and name != FP32:
        record = records.get(name)
        if explicit:
            if record is None:
                raise VariantRefused(f"{artifact.root}: variant {name!r} does not exist; available: {servable}")
            raise VariantRefused(_refusal(artifact, name, why, record, servable))
        # A server-wide preference: a model whose variant is missing, failed or stale keeps serving fp32.
        fallback = (
            f"{artifact.root} has no variant {name!r} (available {servable}); serving fp32"
            if record is None
            else f"{artifact.root}: variant {name!r} {why}; serving fp32 instead (available {servable})"
        )
        name, why = FP32, problem(FP32)
    record = records.get(name)
    if why is not None and record is not None:  # fp32 itself failed: nothing of this version is served
        raise VariantRefused(_refusal(artifact, name, why, record, servable))
    file = variant_file(name)
    if record is not None and record.file != file:
        raise ArtifactError(
            f"{artifact.root}: the manifest records variant {name!r} in {record.file!r}, but it belongs in "
            f"{file!r}; re-create the variant with the stage that made it"
        )
    entry = artifact.manifest.files.get(file)
    if entry is None and name == FP32:
        raise NotExported(
            f"{artifact.root} is trained but not exported yet (no {file}); run `pipe export {artifact.root}` "
            "and it is served at the next scan"
        )
    if entry is None:
        raise ArtifactError(
            f"{artifact.root}: {file} is not listed in the manifest's files, so it cannot be verified; "
            "re-create the artifact with pipe export / pipe import"
        )
    return Choice(name, file, entry.sha256), fallback


def fastest(artifact: Artifact, servable: list[str]) -> str:
    """The servable variant with the lowest recorded p50 at batch 1 (then 32), or at its fixed batch, or, for a
    decoder, the lowest decode step at batch 1 (then prefill: what a stream waits per token), when it beats
    fp32's by more than NOISE; else fp32, the model every figure of the artifact was checked on.

    `pipe optimize` times model.onnx and every variant side by side in one run and records it, so
    these figures compare; a variant without a timing (made elsewhere) is not a candidate.
    """
    records = artifact.manifest.variants
    timed = []
    for name in servable:
        latency = records[name].latency if name in records else {}
        fixed = latency.get("fixed_batch")  # a fixed batch dimension: timed at that batch only
        first, then = (f"p50_ms_b{int(fixed)}" if fixed else "p50_ms_b1"), "p50_ms_b32"
        if first not in latency:  # a decoder's record (pipeline/runtime/lm_speed.py)
            first, then = "decode_ms", "prefill_ms"
        if first in latency:
            timed.append((latency[first], latency.get(then, 0.0), name))
    if not timed:
        return FP32
    best = min(timed)
    fp32 = next((t for t in timed if t[2] == FP32), None)
    if fp32 is not None and best[2] != FP32 and best[0] >= fp32[0] * (1 - NOISE):
        log.info("--variant best: %s is not faster than fp32 beyond timing noise (p50 %.4g against %.4g ms, "
                 "margin %.0f%%); serving fp32", best[2], best[0], fp32[0], NOISE * 100)  # fmt: skip
        return FP32
    return best[2]


def _refusal(artifact: Artifact, name: str, why: str, record: Variant, servable: list[str]) -> str:
    kind = "failed" if not record.passed else "stale" if why.startswith("is stale") else "non-ONNX"
    return (
        f"{artifact.root}: variant {name!r} {why}; a {kind} variant is never served: choose one of {servable} "
        f"or re-run {record.stage}"
    )
