"""What a candidate is checked against: an artifact, or the JSON summary `--write-baseline` commits.

The summary holds only what the checks read (identity, task, labels, the I/O signature, metrics,
each variant's status, precision, size and metrics, and model.onnx's size), so a repository can
commit it instead of the model. Read back field by field like the manifest: a problem names its
dotted path.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pipeline.artifact.directory import Artifact, resolve_artifact
from pipeline.artifact.manifest import Task
from pipeline.artifact.tensors import TensorSpec
from pipeline.artifact.variants import MODEL_FILE, unusable
from pipeline.core.errors import InputError
from pipeline.core.fsutil import write_user_file
from pipeline.core.jsontypes import decode, encode

FORMAT = "pipe-baseline/1"  # the `format` key of a baseline file; bumped when its meaning changes
# Text a baseline cannot hold: the checks put its names in the terminal, JUnit XML and Markdown, where a
# control character (an escape sequence, a newline) forges or breaks lines, and a lone surrogate cannot
# be written as UTF-8 at all.
CONTROL, SURROGATE = re.compile("[\x00-\x1f\x7f-\x9f]"), re.compile("[\ud800-\udfff]")


def _positive_size(value: int | None) -> str | None:
    if value is None or value > 0:
        return None
    return f"expected a positive number of bytes, got {value if value > -(10**18) else 'a huge negative number'}"


@dataclass(kw_only=True)
class VariantSummary:
    """A variant as the checks see it."""

    status: Literal["passed", "failed", "stale"]  # stale: made from a model.onnx the artifact no longer holds
    precision: str
    size: int | None = field(default=None, metadata={"check": _positive_size})  # bytes
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(kw_only=True)
class Baseline:
    """What `pipe check` compares a candidate with."""

    format: str = FORMAT
    name: str
    version: int
    task: Task
    labels: list[str] = field(default_factory=list)
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    metrics: dict[str, float] = field(default_factory=dict)
    variants: dict[str, VariantSummary] = field(default_factory=dict)
    model_size: int | None = field(default=None, metadata={"check": _positive_size})  # bytes of model.onnx (+ .data)
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
    write_user_file(Path(path), text.encode(), "--write-baseline")
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
    if problems := _unprintable(data, ""):
        more = f"; and {len(problems) - 5} more" if len(problems) > 5 else ""
        raise InputError(f"baseline {path}: {'; '.join(problems[:5])}{more}; write it again with --write-baseline")
    try:
        return decode(Baseline, data)
    except ValueError as exc:
        raise InputError(f"baseline {path}: {exc}; write it again with --write-baseline") from None


def _unprintable(data: Any, where: str) -> list[str]:
    """Each string (key or value) in parsed JSON holding a control character or a lone surrogate, by dotted path."""
    if isinstance(data, str):
        return [f"{where or 'top level'}: {data[:40]!r} holds {bad}"] if (bad := _bad_text(data)) else []
    problems = []
    if isinstance(data, dict):
        for key, value in data.items():
            if bad := _bad_text(key):
                problems.append(f"{where or 'top level'}: key {key[:40]!r} holds {bad}")
            else:
                problems += _unprintable(value, f"{where}.{key}" if where else key)
    elif isinstance(data, list):
        for i, value in enumerate(data):
            problems += _unprintable(value, f"{where}[{i}]")
    return problems


def _bad_text(text: str) -> str | None:
    return "a control character" if CONTROL.search(text) else "a lone surrogate" if SURROGATE.search(text) else None
