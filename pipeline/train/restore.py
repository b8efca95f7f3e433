"""Rebuild a trained model from an artifact alone (what `pipe export` and later hops use).

The manifest's `stages.train` holds the validated recipe, the data-shape record and the path of
the final weights; this module turns them back into the module that was trained, without the
recipe file or the data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.artifact import Artifact
from pipeline.errors import ArtifactError

if TYPE_CHECKING:
    import torch


def load_trained_model(artifact: Artifact) -> torch.nn.Module:
    """The trained model in eval mode, fp32, on the CPU, with the weights from checkpoint/."""
    from safetensors.torch import load_file

    from pipeline.data import DataInfo
    from pipeline.recipe import parse_recipe
    from pipeline.train.zoo import build_model

    record = artifact.manifest.stages.get("train")
    if not record or not {"recipe", "data", "checkpoint"} <= set(record):
        raise ArtifactError(
            f"artifact {artifact.root} has no complete train record (manifest stages.train with recipe, data, "
            "checkpoint); it was not made by `pipe train`, so there is no torch model to rebuild"
        )
    recipe = parse_recipe(record["recipe"], f"{artifact.root}/manifest.json stages.train.recipe")
    model = build_model(recipe.model, DataInfo.from_dict(record["data"]))
    weights_rel = record["checkpoint"]["weights"]
    if weights_rel not in artifact.manifest.files:
        raise ArtifactError(f"{weights_rel} is not listed in {artifact.root}/manifest.json; re-train the model")
    try:
        model.load_state_dict(load_file(artifact.path(weights_rel)))
    except RuntimeError as exc:
        raise ArtifactError(f"{weights_rel} does not fit the recorded model ({str(exc)[:200]}); re-train") from None
    return model.float().cpu().eval()


def example_inputs(artifact: Artifact, batch: int) -> tuple[torch.Tensor, ...]:
    """`batch` real samples from golden.npz, one tensor per model input in manifest order (for tracing)."""
    import numpy as np
    import torch

    from pipeline.golden import load_golden

    if batch < 1:
        raise ArtifactError(f"example batch size must be 1 or more (got {batch})")
    golden = load_golden(artifact)
    tensors = []
    for spec in artifact.manifest.inputs:
        if spec.name not in golden.inputs:
            raise ArtifactError(f"golden.npz in {artifact.root} has no input {spec.name!r}; re-train the model")
        array = golden.inputs[spec.name]
        rows = np.resize(np.arange(len(array)), batch)  # repeat samples when batch > golden size
        tensors.append(torch.from_numpy(np.ascontiguousarray(array[rows])))
    return tuple(tensors)
