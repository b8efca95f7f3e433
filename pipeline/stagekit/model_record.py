"""How a stage that makes model.onnx records it: one function for every exporter and importer.

`pipe export`, `pipe import FILE`, `pipe import DIR` (an encoder, a causal LM) each end with model.onnx
written in the version; `record_model` then lists it in the manifest with what belongs to it:

- its external data files, the locations the graph names (checked to stay inside the version by
  `runtime/external_data.py`), each hashed: a model past 2 GB keeps its weights in `model.onnx.data`,
  and weights left unhashed would be weights no one can check;
- a `model.onnx.data` left listed by an earlier export that this graph no longer names, forgotten and
  deleted (a re-export that fits in one file again);
- model.onnx itself, and the fp32 `Variant` whose size counts the external data too.

    record_model(artifact, stage="import", parent=digest, parity=report.summary())
"""

from __future__ import annotations

from typing import Any

from pipeline.artifact.directory import Artifact
from pipeline.artifact.variants import FP32, MODEL_FILE, Variant
from pipeline.runtime.external_data import DATA_SUFFIX, external_files, graph_only


def record_model(
    artifact: Artifact,
    *,
    stage: str,
    parent: str,
    parity: dict[str, Any],
    precision: str = "fp32",
    settings: dict[str, Any] | None = None,
    metrics: dict[str, float] | None = None,
) -> Variant:
    """Record `artifact`'s model.onnx (already in place) as the fp32 variant made by `stage` from `parent` (the
    sha256 of what it was made from), with its external data files listed and hashed; returns the variant.

    `precision`: what the file computes in (an imported graph may be fp16 throughout); `settings`, `metrics`,
    `parity`: as the Variant records them."""
    path = artifact.path(MODEL_FILE)
    data = external_files(graph_only(path), path.parent)
    stale = MODEL_FILE + DATA_SUFFIX
    if stale not in data:
        artifact.remove_file(stale)
    for rel in data:
        artifact.add_file(rel)
    variant = Variant(
        file=MODEL_FILE,
        precision=precision,
        format="onnx",
        stage=stage,
        parent=parent,
        settings=dict(settings or {}),
        metrics=dict(metrics or {}),
        parity=parity,
        size=sum(artifact.path(rel).stat().st_size for rel in [*data, MODEL_FILE]),  # with its external data
    )
    artifact.add_variant(FP32, variant)
    return variant
