"""What a candidate is checked against: an artifact, or the JSON summary `--write-baseline` commits.

The summary holds only what the checks read (identity, task, labels, the I/O signature, metrics,
each variant's status, precision, size and metrics, and model.onnx's size), so a repository can
commit it instead of the model. Read back field by field like the manifest: a problem names its
dotted path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pipeline.artifact import Artifact, resolve_artifact
from pipeline.errors import InputError
from pipeline.fsutil import atomic_write_bytes
from pipeline.jsontypes import decode, encode
from pipeline.manifest import TensorSpec
from pipeline.variants import MODEL_FILE, unusable

FORMAT = "pipe-baseline/1"  # the `format` key of a baseline file; bumped when its meaning changes


@dataclass(kw_only=True)
class VariantSummary:
    """A variant as the checks see it."""

    status: Literal["passed", "failed", "stale"]  # stale: made from a model.onnx the artifact no longer holds
    precision: str
    size: int | None = None  # bytes
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(kw_only=True)
class Baseline:
    """What `pipe check` compares a candidate with."""

    format: str = FORMAT
    name: str
    version: int
    task: Literal["classification", "regression", "embedding"]
    labels: list[str] = field(default_factory=list)
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    metrics: dict[str, float] = field(default_factory=dict)
    variants: dict[str, VariantSummary] = field(default_factory=dict)
    model_size: int | None = None  # bytes of model.onnx (and model.onnx.data)
    created: str


def summarize(artifact: Artifact) -> Baseline:
    """The summary of a loaded artifact; a variant that is not usable now is failed or stale."""
    manifest = artifact.manifest
    listed = {entry.sha256 for entry in manifest.files.values()}
    variants = {}
    for name, variant in manifest.variants.items():
        status = "failed" if not variant.passed else "stale" if unusable(variant, listed) else "passed"
        variants[name] = VariantSummary(
            status=status,
            precision=variant.precision,
            size=variant.size,
            metrics=dict(variant.metrics),
        )
    sizes = [manifest.files[f].size for f in (MODEL_FILE, MODEL_FILE + ".data") if f in manifest.files]
    return Baseline(
        name=manifest.name,
        version=manifest.version,
        task=manifest.task,
        labels=list(manifest.labels),
        inputs=list(manifest.inputs),
        outputs=list(manifest.outputs),
        metrics=dict(manifest.metrics),
        variants=variants,
        model_size=sum(sizes) if sizes else None,
        created=manifest.created,
    )


def load_baseline(path: str | Path) -> tuple[Baseline, Artifact | None]:
    """The baseline at `path` and, when it is an artifact (`artifacts/NAME[/VERSION]`), the artifact
    (latency is timed on its model file); a `.json` file gives no artifact. InputError (exit 2) otherwise.
    """
    path = Path(path)
    if path.suffix == ".json" or path.is_file():
        return _read_file(path), None
    if not path.exists():
        raise InputError(f"baseline {path} does not exist; pass artifacts/<name>[/<version>] or a baseline .json file")
    artifact = Artifact.load(resolve_artifact(path))
    return summarize(artifact), artifact


def write_baseline(artifact: Artifact, path: Path) -> Baseline:
    """Write the artifact's summary to `path` (atomically) and return it."""
    baseline = summarize(artifact)
    text = json.dumps(encode(baseline), indent=2, sort_keys=True) + "\n"
    atomic_write_bytes(Path(path), text.encode())
    return baseline


def _read_file(path: Path) -> Baseline:
    if not path.is_file():
        raise InputError(
            f"baseline {path} does not exist; write one with `pipe check ARTIFACT --write-baseline {path}`"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise InputError(
            f"baseline {path} is not valid JSON ({str(exc)[:120]}); write it again with --write-baseline"
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise InputError(
            f"baseline {path}: format {str(found)[:40]!r} is not {FORMAT!r}; write it with --write-baseline"
        )
    try:
        return decode(Baseline, data)
    except ValueError as exc:
        raise InputError(f"baseline {path}: {exc}; write it again with --write-baseline") from None
