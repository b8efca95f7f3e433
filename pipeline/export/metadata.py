"""Identity stamped into model.onnx's metadata_props, so a model file found alone can be traced.

The manifest's `files` cannot hold model.onnx's own hash inside model.onnx; the identity digest
(docs/artifact.md) covers what identifies the model instead, and survives later stages adding
files, metrics and variants. Keys are prefixed `pipe.`; metadata the producer wrote is kept.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx

from pipeline import __version__
from pipeline.artifact.manifest import Manifest
from pipeline.runtime.sample_axes import METADATA_KEY, SampleAxes

PREFIX = "pipe."


def identity(manifest: Manifest) -> dict[str, str]:
    """The metadata_props pipe writes: digest, name, version, task, labels and preprocessing per input, and
    the batch axes of tensors that do not keep the samples first (read back by `ort_runner`)."""
    axes = SampleAxes.of_specs(manifest.inputs, manifest.outputs)
    moved = {METADATA_KEY: axes.metadata()} if not axes.trivial else {}
    return {
        **moved,
        f"{PREFIX}identity_digest": manifest.identity_digest(),
        f"{PREFIX}name": manifest.name,
        f"{PREFIX}version": str(manifest.version),
        f"{PREFIX}task": manifest.task,
        f"{PREFIX}labels": json.dumps(manifest.labels),
        f"{PREFIX}preprocessing": json.dumps({s.name: s.preprocessing for s in manifest.inputs}, sort_keys=True),
        f"{PREFIX}code_version": __version__,
    }


def stamp(path: Path, manifest: Manifest) -> None:
    """Rewrite `path` in place with pipe's metadata (replacing earlier pipe keys, keeping the rest).

    Of the producer's entries, the first of a repeated key is kept (onnx's checker refuses a key given
    twice) and one that is not UTF-8 text is left out (protobuf hands it over as bytes): what
    `pipe import` reads (pipeline/export/conventions.py, which notes both). Weights stored as external
    data stay where they are: only the graph file is rewritten.
    """
    model = onnx.load(str(path), load_external_data=False)
    kept: dict[str, str] = {}
    for p in model.metadata_props:
        if isinstance(p.key, str) and isinstance(p.value, str) and not p.key.startswith(PREFIX):
            kept.setdefault(p.key, p.value)
    del model.metadata_props[:]
    for key, value in [*kept.items(), *identity(manifest).items()]:
        model.metadata_props.add(key=key, value=value)
    onnx.save(model, str(path))


def read_metadata(path: Path) -> dict[str, str]:
    """Every metadata_props entry of an ONNX file (weights are not loaded)."""
    model = onnx.load(str(path), load_external_data=False)
    return {p.key: p.value for p in model.metadata_props}
