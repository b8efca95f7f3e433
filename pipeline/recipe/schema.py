"""Recipes: one YAML file per model, declaring it end to end (docs/recipes.md).

Every section is a strict schema: an unknown key or a wrong type is refused with the key's dotted
path and what is allowed. The `model` section is a union keyed on `arch` and the `lora` section
adapts an `hf` model: both are in `pipeline/recipe/architectures.py`; every section's base is
`recipe/strict.Strict`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field, ValidationError, model_validator

from pipeline.artifact.directions import HIGHER_IS_BETTER
from pipeline.artifact.manifest import NAME as MODEL_NAME
from pipeline.core.errors import RecipeError
from pipeline.recipe.architectures import HFSpec, LoraSpec, ModelSpec
from pipeline.recipe.budgets import BudgetSpec
from pipeline.recipe.defaults import MAX_EXCLUSIONS, QUANTIZE_CHOICES, SEARCH_SECONDS
from pipeline.recipe.gates import Gate, LosslessGate
from pipeline.recipe.strict import Strict

# --- data ----------------------------------------------------------------------------------------

BUILTIN_DATASETS = ("digits", "iris", "wine", "breast_cancer", "diabetes")
REGRESSION_DATASETS = ("diabetes",)  # bundled sets whose target is a number, not a class
FILE_SOURCES = ("csv", "npz", "images", "tokens", "text")


HeightWidth = Annotated[list[Annotated[int, Field(gt=0)]], Field(min_length=2, max_length=2)]  # [height, width]


class DataSpec(Strict):
    source: Literal["digits", "iris", "wine", "breast_cancer", "diabetes", "csv", "npz", "images", "tokens", "text"]
    path: str | None = None  # file or folder, relative to the recipe; file sources only
    label_column: str | None = None  # csv: the column holding the target; text: the label's column ("label")
    text_column: str | None = None  # text: the column (CSV) or key (JSONL) holding the text ("text")
    max_length: int | None = Field(None, gt=1)  # text: tokens per row at most (None: the model's own limit)
    # text, task text-generation: plain text (.txt, packed into max_length blocks), or instruction rows in
    # alpaca or sharegpt form (.json/.jsonl); None: text for .txt, else found from the first row
    format: Literal["text", "alpaca", "sharegpt"] | None = None
    feature_columns: list[str] | None = None  # csv: None means every other column
    exclude_columns: list[str] | None = None  # csv: columns left out of "every other column" (IDs, free text)
    delimiter: Literal[",", ";", "\t", "|"] | None = None  # csv: None finds it from the file's first lines
    categorical_columns: list[str] | None = None  # csv: columns read as categories even when they hold numbers
    # csv: a category the model was not trained on, at serving and predict: refused (error), or sent as an
    # "unknown" index the model one-hot encodes as all zeros, so the column adds nothing (unknown)
    unseen_categories: Literal["error", "unknown"] = "error"
    image_size: HeightWidth | None = None  # images: resize every image to this
    as_image: bool = False  # digits: serve the 8x8 images as 1x8x8 (for CNNs) instead of 64 features
    val_fraction: float = Field(0.15, gt=0, lt=0.5)
    test_fraction: float = Field(0.15, gt=0, lt=0.5)
    normalize: bool = True  # standardize features with train-split mean/std (recorded in the manifest)

    @model_validator(mode="after")
    def _path_when_needed(self) -> DataSpec:
        if self.source in FILE_SOURCES and not self.path:
            raise ValueError(f"source {self.source!r} reads a file: set data.path")
        if self.source not in FILE_SOURCES and self.path:
            raise ValueError(f"source {self.source!r} is a bundled dataset and takes no path; remove data.path")
        if self.source == "csv" and not self.label_column:
            raise ValueError("source 'csv' needs data.label_column (the column holding the target)")
        if self.source != "csv" and self.unseen_categories != "error":
            raise ValueError(f"data.unseen_categories applies to source 'csv' only (source is {self.source!r})")
        if self.source != "csv" and (self.delimiter is not None or self.categorical_columns is not None):
            raise ValueError(
                f"data.delimiter and data.categorical_columns apply to source 'csv' only (source is "
                f"{self.source!r}); remove them"
            )
        if self.as_image and self.source != "digits":
            raise ValueError(f"data.as_image applies to the digits dataset only (source is {self.source!r}); remove it")
        if self.exclude_columns is not None and self.feature_columns is not None:
            raise ValueError(
                "data.exclude_columns leaves columns out of every other column, data.feature_columns lists the "
                "columns to use: give one of them"
            )
        for key, applies_to in (
            ("label_column", ("csv", "text")),
            ("feature_columns", ("csv",)),
            ("exclude_columns", ("csv",)),
            ("image_size", ("images",)),
            ("text_column", ("text",)),
            ("max_length", ("text",)),
            ("format", ("text",)),
        ):
            if getattr(self, key) is not None and self.source not in applies_to:  # nothing would read it
                raise ValueError(
                    f"data.{key} applies to source {' or '.join(map(repr, applies_to))} only (source is "
                    f"{self.source!r}); remove it"
                )
        return self


# --- training ------------------------------------------------------------------------------------


# What `train.monitor` may name: the validation figure that picks the kept epoch and drives early
# stopping, and whether higher is better: `val_<metric>` is <metric> on the validation split, judged the
# way artifact/directions.py's HIGHER_IS_BETTER judges it. `val_loss` is the training loss there.
MONITORS: dict[str, bool] = {
    f"val_{metric}": HIGHER_IS_BETTER[metric] for metric in ("loss", "accuracy", "mae", "rmse", "r2", "perplexity")
}
TASK_MONITORS = {
    "classification": ("val_loss", "val_accuracy"),
    "regression": ("val_loss", "val_mae", "val_rmse", "val_r2"),
    "text-generation": ("val_loss", "val_perplexity"),
}
TASK_LOSSES = {
    "classification": ("auto", "cross_entropy"),
    "regression": ("auto", "mse", "huber"),
    "text-generation": ("auto",),  # next-token cross-entropy on the labelled tokens (pipeline/train/causal_lm.py)
}


class TrainSpec(Strict):
    epochs: int = Field(10, gt=0)
    batch_size: int = Field(64, gt=0)
    optimizer: Literal["adamw", "sgd"] = "adamw"
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    momentum: float = Field(0.9, ge=0, lt=1)  # sgd only
    warmup_steps: int = Field(0, ge=0)  # linear warmup, then cosine decay to min_lr_ratio * lr
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    grad_accum: int = Field(1, gt=0)  # micro-batches per optimizer step
    grad_clip: float | None = Field(1.0, gt=0)  # max global grad norm; None disables clipping
    precision: Literal["fp32", "bf16", "fp16", "auto"] = "fp32"  # auto: fp16 on CUDA, fp32 on CPU
    grad_checkpointing: bool = False  # recompute transformer blocks in backward to save memory
    # auto: cross_entropy for classifiers, mse for regression; huber: delta 1 in normalized target units
    loss: Literal["auto", "cross_entropy", "mse", "huber"] = "auto"
    # the validation figure the kept weights and early stopping follow (MONITORS); ties go to the lower loss
    monitor: Literal["val_loss", "val_accuracy", "val_mae", "val_rmse", "val_r2", "val_perplexity"] = "val_loss"
    early_stopping: int | None = Field(None, gt=0)  # epochs without val improvement before stopping
    checkpoint_every: int = Field(200, gt=0)  # optimizer steps between checkpoints (and at epoch end)
    seed: int = 0
    deterministic: bool = True  # deterministic kernels, so a resumed run matches bit for bit on CPU
    strategy: Literal["ddp", "fsdp"] = "ddp"  # with --nproc > 1
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int = Field(1, ge=0)  # CPU threads per process; 0: the cores shared out among processes
    # torch, or ort: ONNX Runtime training on the exported graph, in its own runtime (docs/training.md)
    backend: Literal["torch", "ort"] = "torch"
    # ort: glob patterns of the parameters (ONNX initializers) to train; empty: every trainable parameter
    trainable: list[Annotated[str, Field(min_length=1)]] = []


# --- later stages --------------------------------------------------------------------------------


class ExportSpec(LosslessGate):
    """`pipe export`: the ONNX file made from the trained model, held to it by atol, rtol, metric_tolerance."""

    opset: int = Field(18, ge=7)
    dynamo: bool = True  # torch.onnx.export(dynamo=True); the TorchScript exporter is the fallback


class OptimizeSpec(Gate):
    """`pipe optimize`: which variants to make from model.onnx, and the budget each must meet (recipe/gates.py:
    the graph-only variant is held to atol, rtol, metric_tolerance; the others to their budget)."""

    graph: Literal["none", "basic", "extended"] = "extended"  # onnxruntime offline level for variants/model.opt.onnx
    slim: bool = True  # onnxslim after onnxruntime's passes
    quantize: list[Literal[QUANTIZE_CHOICES]] = ["dynamic", "static"]  # auto: the budget search
    # int8 weights: one scale per output channel (True) or one per tensor (False); None: each kind's default,
    # per channel for dynamic int8 (docs/gates.md "Embeddings": as fast, and closer), per tensor for static
    per_channel: bool | None = None
    reduce_range: bool = False  # 7-bit weights, for CPUs without VNNI where 8-bit saturates
    activation_type: Literal["uint8", "int8"] = "uint8"  # static: activations' int8 type
    calibration: Literal["minmax", "entropy", "percentile"] = "minmax"  # static: how activation ranges are set
    calibration_samples: int = Field(256, gt=0, le=100_000)  # real training samples the static ranges are measured on
    max_exclusions: int = Field(MAX_EXCLUSIONS, ge=0, le=100_000)  # auto: nodes the search may leave in fp32
    # auto: no new candidate is started after this many seconds; the best passed so far is kept
    search_seconds: float = Field(SEARCH_SECONDS, gt=0, le=86_400)
    threads: int = Field(1, gt=0, le=256)  # intra-op threads the variants are timed with (100,000 crashed libgomp)
    # decoders' weight-only int8/int4 (optimize/weight_only.py): values sharing one scale, along the input axis
    weight_block_size: Literal[16, 32, 64, 128, 256] = 32
    weight_symmetric: bool = True  # no zero point
    # MatMulNBits' CPU compute precision: 0 as stored (fp32 math), 4 int8 activations (fastest; wrong greedy tokens
    # reported on some models: onnxruntime issue 29849)
    weight_accuracy_level: Literal[0, 1, 2, 3, 4] = 4
    weight_embeddings: bool = False  # the token embedding stored in the same bits too (GatherBlockQuantized)
    strict: bool = False  # a variant that misses its budget fails the command (exit 1), not only its record


class EdgeSpec(Gate):
    """`pipe export --target edge`: TFLite models made from model.onnx, and what each must meet (recipe/gates.py:
    fp32 is held to atol, rtol, metric_tolerance, max_out_of_tolerance; fp16 and int8 to the task's budget)."""

    enabled: bool = True  # `pipe run` makes the edge models
    precisions: list[Literal["fp32", "fp16", "int8"]] = ["fp32", "fp16", "int8"]
    layout: Literal["nhwc", "nchw"] = "nhwc"  # image inputs: NHWC for devices, or keep the server's NCHW
    # fp32 TFLite against model.onnx: a value's tolerance in units of its output's scale (plus rtol * |ref|;
    # docs/gates.md); `atol_fp32`, its name before, is read too
    atol: float = Field(1e-4, gt=0, validation_alias=AliasChoices("atol", "atol_fp32"))
    calibration_samples: int = Field(256, gt=0)  # real training samples full-integer int8 calibrates on
    # free non-batch dims fixed for devices, as `--input-shape NAME:d0,d1,...` gives them ({} = from the artifact)
    input_shapes: dict[str, list[int | str]] = {}
    # seconds all onnx2tf attempts together may take (each at most a third of it); past it the conversion fails,
    # naming this key. A refusal tries five settings, 3-4 min for a 90 MB transformer on 2 busy cores
    timeout_s: float = Field(1800.0, gt=0, le=86_400)


class BenchmarkSpec(Strict):
    """`pipe benchmark` as `pipe run` calls it: every format of the artifact timed side by side."""

    enabled: bool = True  # `pipe run` benchmarks the version it ends on
    seconds: float = Field(1.0, gt=0, le=60)  # timed runs per format and batch size
    threads: int = Field(1, gt=0, le=256)  # the threads every runtime gets (onnxruntime, torch, LiteRT)


class Recipe(Strict):
    name: str = Field(pattern=MODEL_NAME.pattern)  # also the artifact directory name
    task: Literal["classification", "regression", "embedding", "text-generation"] = "classification"
    description: str = ""
    model: ModelSpec
    data: DataSpec
    lora: LoraSpec | None = None  # model.arch hf: train LoRA adapters instead of every weight
    train: TrainSpec = TrainSpec()
    export: ExportSpec = ExportSpec()
    optimize: OptimizeSpec = OptimizeSpec()
    edge: EdgeSpec = EdgeSpec()
    benchmark: BenchmarkSpec = BenchmarkSpec()
    budgets: BudgetSpec = BudgetSpec()

    # Set by load_recipe, not by the YAML: where relative data paths start, and the file's digest.
    base_dir: Path = Field(Path("."), exclude=True)
    digest: str = Field("", exclude=True)

    @model_validator(mode="after")
    def _task_fits(self) -> Recipe:
        """What the task asks of the data and of training; every key given is one something reads."""
        if self.task == "embedding":
            raise ValueError(
                "task 'embedding' is not available yet in recipes: pipe train trains classification and regression "
                "(an embedding model can be brought in with pipe import --task embedding)"
            )
        self._hf_fits()
        source = self.data.source
        classes_only = source == "images" or (source in BUILTIN_DATASETS and source not in REGRESSION_DATASETS)
        if self.task == "regression" and classes_only:
            raise ValueError(
                f"task 'regression' needs numeric targets, and data.source {source!r} holds classes; use "
                f"{', '.join(REGRESSION_DATASETS)}, csv, npz or tokens with numeric targets, or task: classification"
            )
        if self.task == "classification" and source in REGRESSION_DATASETS:
            raise ValueError(f"data.source {source!r} holds numeric targets, not classes; set task: regression")
        if self.train.loss not in TASK_LOSSES[self.task]:
            raise ValueError(
                f"train.loss {self.train.loss!r} does not train a {self.task} model; valid choices: "
                f"{', '.join(TASK_LOSSES[self.task])}"
            )
        if self.model.arch == "onnx" and self.train.backend != "ort":
            raise ValueError(
                "model.arch 'onnx' continues training an ONNX model, which only train.backend 'ort' can do; "
                "set train.backend: ort"
            )
        if self.train.trainable and self.train.backend != "ort":
            raise ValueError(
                "train.trainable chooses ONNX parameters for train.backend 'ort'; set train.backend: ort, or leave "
                "train.trainable out"
            )
        if self.train.monitor not in TASK_MONITORS[self.task]:
            raise ValueError(
                f"train.monitor {self.train.monitor!r} is not measured for a {self.task} model; valid choices: "
                f"{', '.join(TASK_MONITORS[self.task])}"
            )
        return self

    def _hf_fits(self) -> None:
        """A transformers model reads text through its own tokenizer; LoRA adapts a transformers model only."""
        hf = isinstance(self.model, HFSpec)
        if self.lora is not None and not hf:
            raise ValueError(
                f"lora: applies to model.arch hf (a transformers directory), not {self.model.arch!r}; remove lora: "
                "or set model: {arch: hf, path: DIR}"
            )
        if hf != (self.data.source == "text"):
            raise ValueError(
                "model.arch hf trains on data.source text (tokenized with the model directory's tokenizer), and "
                f"data.source text needs model.arch hf; got model.arch {self.model.arch!r} with data.source "
                f"{self.data.source!r}"
            )
        if hf and self.task not in ("classification", "text-generation"):
            raise ValueError(
                f"model.arch hf trains classifiers and causal LMs (task: classification or text-generation); task is "
                f"{self.task!r}"
            )
        generating = self.task == "text-generation"
        if generating and not hf:
            raise ValueError(
                "task text-generation trains a transformers causal LM: set model: {arch: hf, path: DIR} (a directory "
                "with its weights, or only config.json and a tokenizer to train from scratch) and data.source: text"
            )
        if generating and self.data.label_column is not None:
            raise ValueError("data.label_column: a text-generation model learns the text itself; remove it")
        if not generating and self.data.format is not None:
            raise ValueError(f"data.format reads language-model data (task: text-generation); task is {self.task!r}")
        if hf and self.train.backend != "torch":
            raise ValueError("model.arch hf trains with train.backend torch (PEFT is torch); remove train.backend")

    def model_dir(self) -> Path | None:
        """model.arch hf: the transformers directory, resolved against the recipe's directory."""
        return self.base_dir / self.model.path if isinstance(self.model, HFSpec) else None

    def data_path(self) -> Path | None:
        """The data file or folder, resolved against the recipe's directory."""
        return None if self.data.path is None else (self.base_dir / self.data.path)


# The recipe sections each stage reads: a stage is up to date while its sections are unchanged, so
# editing `export:` re-runs export alone and never retrains.
STAGE_SECTIONS: dict[str, tuple[str, ...]] = {
    "train": ("name", "task", "model", "data", "lora", "train"),
    "export": ("export",),
    "optimize": ("optimize",),
    "edge": ("edge",),
    "benchmark": ("benchmark",),
}

OPTIONAL_SECTIONS = ("lora",)


def stage_settings(recipe: Recipe, stage: str) -> dict[str, Any]:
    """The recipe sections `stage` reads, as JSON (a train record's settings rebuild the model)."""
    dumped = recipe.model_dump(mode="json")
    # An optional section left out (lora: None) is not recorded: the recipes trained before it existed keep
    # their settings digest, so `pipe run` does not retrain them.
    return {
        key: dumped[key] for key in STAGE_SECTIONS[stage] if key not in OPTIONAL_SECTIONS or dumped[key] is not None
    }


def recipe_location(recipe_path: Path, artifact_root: Path) -> str:
    """The recipe file relative to the artifact, as POSIX text: valid wherever the two move together."""
    return Path(os.path.relpath(recipe_path.resolve(), artifact_root.resolve())).as_posix()


def _dotted(loc: tuple[Any, ...], raw: Any) -> str:
    """Turn a pydantic location into the key path as written in the YAML.

    The `model` union adds its tag (e.g. 'cnn') to the location; it is not a key in the file, so
    walking the raw data alongside drops it.
    """
    parts: list[str] = []
    node = raw
    for item in loc:
        if isinstance(node, dict) and item not in node and item == node.get("arch"):
            continue  # the union tag
        parts.append(f"[{item}]" if isinstance(item, int) else str(item))
        if isinstance(node, dict):
            node = node.get(item)
        elif isinstance(node, list) and isinstance(item, int) and item < len(node):
            node = node[item]
        else:
            node = None
    return ".".join(parts).replace(".[", "[") or "<top level>"


def format_errors(exc: ValidationError, raw: Any, source: str) -> str:
    """One line per problem: the dotted key path, what was wrong, and what is allowed."""
    lines = []
    for err in exc.errors():
        path = _dotted(tuple(err["loc"]), raw)
        if err["type"] == "extra_forbidden":
            lines.append(f"{path}: unknown key; remove it or check its spelling")
            continue
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "value_error" and not err["loc"]:  # a check across sections: its message names the keys
            lines.append(msg)
            continue
        if err["type"] in ("literal_error", "union_tag_invalid"):
            msg += f" (got {err['input']!r})"
        elif err["type"] not in ("missing",):
            msg += f" (got {err.get('input')!r})"
        lines.append(f"{path}: {msg}")
    if len(lines) == 1:  # one problem: one line
        return f"recipe {source} is invalid: {lines[0]}"
    return f"recipe {source} is invalid:\n  " + "\n  ".join(lines)


def parse_recipe(raw: Any, source: str = "<recipe>", base_dir: Path = Path(".")) -> Recipe:
    """Validate an already-parsed recipe mapping."""
    if not isinstance(raw, dict):
        raise RecipeError(f"recipe {source} must be a mapping of sections, got {type(raw).__name__}")
    try:
        recipe = Recipe.model_validate(raw)
    except ValidationError as exc:
        raise RecipeError(format_errors(exc, raw, source)) from None
    return recipe.model_copy(update={"base_dir": base_dir})
