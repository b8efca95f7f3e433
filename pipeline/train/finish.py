"""Turn a finished training run into a complete artifact: test metrics, golden.npz, reports, manifest.

Runs on rank 0 after the loop. The trained (best-validation) weights are loaded into a fresh fp32
model on the CPU, the way every later stage will load them, so the test metrics and the golden
outputs are what `restore.load_trained_model` reproduces. The manifest is saved last.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from pipeline.artifact.directory import Artifact
from pipeline.artifact.golden import Golden, save_golden
from pipeline.artifact.manifest import Lineage, Manifest
from pipeline.artifact.records import CheckpointRecord, GoldenRecord
from pipeline.artifact.tensors import Feature, TensorSpec, TokenInput
from pipeline.artifact.tokens import TokenLimits, write_tokenizer
from pipeline.core.fsutil import atomic_path
from pipeline.data import DataInfo, Splits
from pipeline.data.splits import TEXT_IDS, TEXT_MASK
from pipeline.recipe.schema import Recipe, recipe_location
from pipeline.train.checkpoint import CHECKPOINT_DIR, FINAL_WEIGHTS
from pipeline.train.loop import FitResult
from pipeline.train.objective import evaluate, objective_for
from pipeline.train.record import Outcome, golden_record
from pipeline.train.zoo import build_model, inference_model


def output_spec(task: str, info: DataInfo) -> TensorSpec:
    """The model output: class logits, or one prediction per sample in the target's units (regression)."""
    if task == "regression":
        return TensorSpec("predictions", "float32", ["batch", 1], "NC")
    return TensorSpec("logits", "float32", ["batch", info.num_classes], "NC")


def finish_artifact(root: Path, recipe: Recipe, splits: Splits, result: FitResult, *, plan: Any, world: Any) -> None:
    """Write the kept weights, golden.npz, reports/train.json and, last, the manifest of the trained version."""
    info = splits.info
    weights_rel = f"{CHECKPOINT_DIR}/{FINAL_WEIGHTS}"
    with atomic_path(root / weights_rel) as tmp:
        save_file({k: v.contiguous() for k, v in result.best_weights.items()}, tmp)

    model = build_model(recipe.model, info, lora=recipe.lora, base_dir=recipe.base_dir)
    model.load_state_dict(result.best_weights)
    parameters = parameter_counts(model)
    model = inference_model(model).float().eval()  # LoRA: the adapters merged, as restore rebuilds it for export
    test_x = {name: torch.from_numpy(splits.test.inputs[name]) for name in info.input_names}
    test = evaluate(model, test_x, torch.from_numpy(splits.test.target), objective_for(recipe, info))
    outcome = Outcome(result.progress, test, result.wall_s, result.cpu_s, result.samples_per_s)

    model_dir = recipe.model_dir()
    lm = None
    if info.kind == "lm":  # a causal LM: the decoder's specs, generation record, tokenizer, golden first step
        from pipeline.train.finish_lm import language_model_parts

        assert model_dir is not None  # the recipe schema: text-generation trains model.arch hf
        lm = language_model_parts(root, model, splits, model_dir)
    manifest = Manifest(
        name=recipe.name,
        version=int(root.name),
        task=recipe.task,
        inputs=lm.inputs if lm else input_specs(info, recipe.model),
        outputs=lm.outputs if lm else [output_spec(recipe.task, info)],
        labels=info.labels,
        lineage=Lineage(
            recipe_digest=recipe.digest, dataset_fingerprint=splits.fingerprint, backend="torch", seed=recipe.train.seed
        ),
        metrics=test,  # accuracy and loss; regression: mae, rmse, r2 (target units) and loss; lm: perplexity
    )
    artifact = Artifact(root, manifest)
    base = splits.base  # a text model: the tokenizer the ids were made with, read when the run started

    if lm is not None:
        manifest.generation, manifest.tokenizer = lm.generation, lm.tokenizer
        for rel, data in lm.files.items():
            artifact.write_file(rel, data)
        for rel in lm.tokenizer_files:
            artifact.add_file(rel)
        save_golden(artifact, lm.golden)
        golden = GoldenRecord(split="test", samples=len(lm.golden), whole_split=False, split_size=len(splits.test))
    else:
        # golden.npz: real test inputs, this model's outputs on them, and the targets.
        golden = golden_record(len(splits.test))
        count = golden.samples
        with torch.no_grad():
            outputs = model(*(t[:count] for t in test_x.values())).numpy()
        golden_inputs = {name: splits.test.inputs[name][:count] for name in info.input_names}
        if base is not None:  # a text model carries its tokenizer: pipe serve takes text with it
            manifest.tokenizer, written = write_tokenizer(root, base.tokenizer)
            for rel in written:
                artifact.add_file(rel)
        golden_outputs = {manifest.outputs[0].name: outputs.astype(np.float32)}
        save_golden(artifact, Golden(golden_inputs, golden_outputs, splits.test.target[:count]))

    summary = outcome.summary(recipe, {}) | {"parameters": parameters}  # trainable and total: LoRA trains a few %
    artifact.write_file("reports/train.json", (json.dumps(summary, indent=2) + "\n").encode())
    for path in sorted(q for q in (root / CHECKPOINT_DIR).rglob("*") if q.is_file()):
        artifact.add_file(path.relative_to(root).as_posix())
    for path in sorted(q for q in (root / "reports").rglob("*") if q.is_file()):
        artifact.add_file(path.relative_to(root).as_posix())

    manifest.stages.train = outcome.record(
        recipe,
        splits,
        inputs={"recipe": recipe.digest, "data": splits.fingerprint}
        | ({"base_model": base.digest} if base is not None else {}),  # what the adapters build on, as tokenized
        recipe_path=recipe_location(Path(plan.recipe_path), root),
        checkpoint=CheckpointRecord(
            weights=weights_rel,  # final weights: the best validation epoch
            state=result.checkpoint.relative_to(root).as_posix() if result.checkpoint else None,
        ),
        golden=golden,
        backend="torch",
        device=plan.device,
        precision=plan.precision,
        framework=f"torch {torch.__version__}",
        world_size=world.size,
        strategy=recipe.train.strategy if world.size > 1 else "single",
        parameters=parameters,
    )
    artifact.save()


def parameter_counts(model: torch.nn.Module) -> dict[str, int]:
    """The parameters training updated, and all of the model's."""
    params = list(model.parameters())
    return {"trainable": sum(p.numel() for p in params if p.requires_grad), "total": sum(p.numel() for p in params)}


def input_specs(info: DataInfo, model: Any) -> list[TensorSpec]:
    """The model inputs as the manifest states them: one, or a text model's ids and attention mask with the
    tokenizer's limits (vocabulary, padding id, longest row), so a server checks and pads token rows."""
    if info.kind != "text":
        return [input_spec(info, model)]
    specs = [TensorSpec(name, "int64", ["batch", "sequence"], "NT") for name in info.input_names]
    limits = TokenLimits(
        names={"ids": TEXT_IDS, "mask": TEXT_MASK},
        vocab_size=info.vocab_size or 1,
        padding_id=info.padding_id,
        max_length=info.max_length,
    )
    return limits.apply(specs)


def input_spec(info: DataInfo, model: Any) -> TensorSpec:
    """The model input as the manifest states it; normalization is recorded but applied inside the model.

    Token ids: the embedding's size (the recipe's model.vocab_size, else the data's) and the longest
    sequence its position embedding covers (model.max_len), so a server can refuse what the model
    cannot embed instead of wrapping a negative id or failing inside onnxruntime.
    """
    if info.kind == "tokens":
        vocab = getattr(model, "vocab_size", None) or info.vocab_size or 1
        limits = TokenInput(vocab_size=vocab, max_length=getattr(model, "max_len", info.sample_shape[0]), padding_id=0)
        return TensorSpec("tokens", "int64", ["batch", "sequence"], "NT", tokens=limits)
    preprocessing: dict[str, Any] = {}
    if info.mean is not None:
        preprocessing = {"mean": info.mean, "std": info.std, "applied_in_model": True}
    if info.image is not None:  # how a picture becomes this input: pipe predict and pipe serve read it
        preprocessing["image"] = info.image
    features = None if info.features is None else [Feature(**f) for f in info.features]  # the columns, in order
    return TensorSpec("input", "float32", ["batch", *info.sample_shape], info.layout, preprocessing, features=features)
