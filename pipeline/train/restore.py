"""The torch training backend as later stages see it: rebuild the trained model from the artifact alone.

The manifest's `stages.train` holds the recipe sections as trained, the data-shape record and the
path of the final weights; this module turns them back into the module that was trained, without
the recipe file or the data. Later stages reach it through `pipeline.runtime.backends` by the artifact's
`lineage.backend`, never by importing it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.artifact.directory import Artifact
from pipeline.core.errors import ArtifactError
from pipeline.core.jsontypes import decode

if TYPE_CHECKING:
    import torch


def load_trained_model(artifact: Artifact) -> torch.nn.Module:
    """The trained model in eval mode, fp32, on the CPU, with the weights from checkpoint/."""
    from safetensors.torch import load_file

    from pipeline.data import DataInfo
    from pipeline.recipe.schema import parse_recipe
    from pipeline.train.zoo import build_model, inference_model

    record = artifact.manifest.stages.train
    if record is None:
        raise ArtifactError(
            f"artifact {artifact.root} has no train record (manifest stages.train); it was not made by "
            "`pipe train`, so there is no torch model to rebuild"
        )
    recipe = parse_recipe(record.settings, f"{artifact.root}/manifest.json stages.train.settings")
    try:
        info = decode(DataInfo, record.data, "stages.train.data")
    except ValueError as exc:
        raise ArtifactError(f"{artifact.root}/manifest.json: {exc}; re-train the model") from None
    base_dir = _recipe_dir(artifact, record.recipe_path)
    _check_base(artifact, recipe.model_copy(update={"base_dir": base_dir}), record.inputs.get("base_model"))
    try:
        model = build_model(recipe.model, info, lora=recipe.lora, base_dir=base_dir)
    except (RuntimeError, ValueError) as exc:  # e.g. torch refusing a negative size from a hand-edited record
        raise ArtifactError(
            f"{artifact.root}/manifest.json: stages.train.data does not build a model ({_one_line(exc)}); re-train"
        ) from None
    weights_rel = record.checkpoint.weights
    if weights_rel not in artifact.manifest.files:
        raise ArtifactError(f"{weights_rel} is not listed in {artifact.root}/manifest.json; re-train the model")
    try:
        model.load_state_dict(load_file(artifact.path(weights_rel)))
    except RuntimeError as exc:
        raise ArtifactError(f"{weights_rel} does not fit the recorded model ({_one_line(exc)}); re-train") from None
    return inference_model(model).float().cpu().eval()  # LoRA: the adapters merged into the base weights


def _recipe_dir(artifact: Artifact, recipe_path: str | None) -> Path:
    """The folder of the recipe the model was trained from: what model.path (arch hf) is relative to."""
    return (artifact.root / recipe_path).parent if recipe_path else artifact.root


def _check_base(artifact: Artifact, recipe: Any, recorded: str | None) -> None:
    """model.arch hf: the transformers directory trained from must still be there, with the same files."""
    model_dir = recipe.model_dir()
    if model_dir is None:
        return
    from pipeline.data.text import base_digest

    if not model_dir.is_dir():
        raise ArtifactError(
            f"{artifact.root} was fine-tuned from the transformers directory {model_dir} (model.path, relative to "
            "the recipe it was trained from), which is not there; its checkpoint holds the adapters alone. Put the "
            "base model back there, or re-train"
        )
    if recorded is not None and base_digest(model_dir) != recorded:
        raise ArtifactError(
            f"the transformers directory {model_dir} changed since {artifact.root} was fine-tuned from it (its "
            "config, weight or tokenizer files differ from the recorded digest); restore the base model, or re-train"
        )


def _one_line(exc: BaseException) -> str:
    """torch's messages span lines (one per mismatched tensor): one line, the first few mismatches."""
    return " ".join(str(exc).split())[:300]


def example_inputs(artifact: Artifact, batch: int) -> tuple[torch.Tensor, ...]:
    """`batch` real samples from golden.npz, one tensor per model input in manifest order (for tracing)."""
    import numpy as np
    import torch

    from pipeline.artifact.golden import load_golden

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


class TorchBackend:
    """`lineage.backend: torch`: the trained nn.Module, real inputs to trace it with, and its runner."""

    name = "torch"

    def load_model(self, artifact: Artifact) -> torch.nn.Module:
        return load_trained_model(artifact)

    def example_inputs(self, artifact: Artifact, batch: int) -> tuple[torch.Tensor, ...]:
        return example_inputs(artifact, batch)

    def reference(self, artifact: Artifact, model: Any) -> Any:
        """Named numpy arrays in, named numpy arrays out: the trained model as the verifier calls it."""
        from pipeline.runtime.runners import torch_runner

        return torch_runner(model, artifact.manifest.inputs, artifact.manifest.outputs)


BACKEND = TorchBackend()
