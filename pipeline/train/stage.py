"""The train stage: recipe in, complete artifact version out.

    train_recipe("models/digits-cnn.yaml") -> Path("artifacts/digits-cnn/3")

Order matters for "nothing written on bad input": the recipe, the data, the device and the model's
fit to the data are all checked before a version directory is created. The manifest is written
last, so a run that dies leaves `checkpoint/` and no `manifest.json`: every reader ignores it and
`--resume` continues it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.artifact.directory import Artifact, allocate_version, version_dirs
from pipeline.artifact.manifest import MANIFEST_NAME
from pipeline.artifact.records import settings_digest
from pipeline.core.errors import ArtifactError, InputError, first_line
from pipeline.data import Splits, load_splits
from pipeline.recipe.file import load_recipe
from pipeline.recipe.schema import Recipe, stage_settings
from pipeline.stagekit.contract import Context, Stage


@dataclass(frozen=True)
class Plan:
    """Settings resolved from the recipe and the command line, shared with torchrun workers."""

    recipe_path: str
    epochs: int | None
    device: str  # cpu | cuda (resolved)
    precision: str  # fp32 | bf16 | fp16 (resolved)
    quiet: bool = False

    def to_json(self) -> str:
        return json.dumps(self.__dict__)


def train_recipe(
    recipe_path: str | Path | Recipe,
    *,
    resume: bool = False,
    epochs: int | None = None,
    device: str | None = None,
    nproc: int = 1,
    out_root: Path = Path("artifacts"),
    quiet: bool = False,
    backend: str | None = None,
) -> Path:
    """Train the recipe's model and return the new version directory `out_root/<name>/<version>`.

    With `nproc > 1`, launches torchrun on this machine; under a torchrun the caller started, joins
    its process group. `resume` continues the newest unfinished version instead of starting one.
    `backend` (torch | ort) overrides `train.backend`; `recipe_path` may be a recipe built in code
    (`pipe train --from`), which has no file.
    """
    loaded = recipe_path if isinstance(recipe_path, Recipe) else load_recipe(recipe_path)
    recipe = effective_recipe(loaded, epochs, backend)
    where = "" if isinstance(recipe_path, Recipe) else str(recipe_path)
    if recipe.train.backend == "ort":
        from pipeline.train.ort_train import train_ort

        resolved = "cpu" if (device or recipe.train.device) == "auto" else (device or recipe.train.device)
        plan = Plan(where, epochs, resolved, "fp32", quiet)
        splits = load_splits(recipe)
        return train_ort(plan, recipe, splits, Path(out_root) / recipe.name, resume=resume, nproc=nproc)
    if recipe.model.arch == "onnx":
        raise InputError("model.arch 'onnx' trains only with --backend ort (train.backend: ort)")
    resolved = resolve_device(device or recipe.train.device)
    plan = Plan(where, epochs, resolved, resolve_precision(recipe.train.precision, resolved), quiet)
    from pipeline.train.distributed import under_torchrun

    if nproc < 1:
        raise InputError(f"--nproc must be 1 or more (got {nproc})")
    if nproc > 1 and under_torchrun():
        raise InputError("--nproc launches torchrun itself; under your own torchrun, leave --nproc out")
    if resolved == "cuda" and nproc > (gpus := _cuda_device_count()):
        raise InputError(
            f"--nproc {nproc} on CUDA needs a GPU per process; this machine has {gpus}: use --nproc {gpus}"
        )
    splits = load_splits(recipe)
    check_model_fits(recipe, splits)  # everything above raises before anything is written
    if not quiet and os.environ.get("RANK", "0") == "0":  # what was read, before minutes of training
        for line in splits.summary:
            print(line, flush=True)

    model_root = Path(out_root) / recipe.name
    if nproc > 1:
        from pipeline.train.distributed import launch

        root = choose_version(model_root, recipe, resume, processes=nproc)
        launch(nproc, [plan.to_json(), str(root)], threads_per_process(recipe, nproc))
        if not (root / MANIFEST_NAME).is_file():
            raise InputError(f"torchrun finished but {root} holds no manifest; see the worker output above")
        return root
    return train_in_process(plan, recipe, splits, model_root, resume=resume)


def train_in_process(
    plan: Plan, recipe: Recipe, splits: Splits, model_root: Path, *, resume: bool, root: Path | None = None
) -> Path:
    """Run the loop in this process (one of several under torchrun, or alone) and finish the artifact."""
    import torch

    from pipeline.train import distributed as dist_
    from pipeline.train.checkpoint import checkpoint_step, latest_checkpoint
    from pipeline.train.finish import finish_artifact
    from pipeline.train.loop import Run, fit
    from pipeline.train.observe import Monitor
    from pipeline.train.zoo import build_model

    world = dist_.init_world(plan.device)
    try:
        with _torch_settings(recipe):
            if root is None:  # rank 0 picks (or creates) the version directory, the others follow
                picked = str(choose_version(model_root, recipe, resume, world.size)) if world.main else None
                root = Path(dist_.broadcast(world, picked))
            resume_from = latest_checkpoint(root) if resume else None
            device = torch.device(plan.device, world.local_rank if plan.device == "cuda" else None)
            torch.manual_seed(recipe.train.seed)  # identical initial weights on every rank
            model = build_model(recipe.model, splits.info, lora=recipe.lora, base_dir=recipe.base_dir)
            torch.manual_seed(recipe.train.seed + world.rank)  # distinct dropout masks per rank
            step = checkpoint_step(resume_from) if resume_from else 0
            monitor = Monitor(root, enabled=world.main, resume_step=step, quiet=plan.quiet)
            try:
                result = fit(Run(recipe, root, world, device, plan.precision, monitor, resume_from), model, splits)
            finally:
                monitor.close()
            if world.main:
                finish_artifact(root, recipe, splits, result, plan=plan, world=world)
            # Tear the process group down together: a rank that destroys it and exits while rank 0
            # is still writing the artifact was seen to abort in gloo ("terminate called without an
            # active exception").
            dist_.barrier(world)
            return root
    finally:
        dist_.close_world(world)


def choose_version(model_root: Path, recipe: Recipe, resume: bool, processes: int = 1) -> Path:
    """A new version directory, or with `resume` the newest unfinished one (checkpoint, no manifest).

    A run resumes with the recipe, `--epochs` and number of processes it started with: the data
    order, the position within the epoch and the per-rank RNG states all depend on them.
    """
    if not resume:
        return allocate_version(model_root)
    unfinished = sorted(
        (p for p in model_root.glob("[0-9]*") if p.name.isdigit() and not (p / MANIFEST_NAME).exists()),
        key=lambda p: int(p.name),
    )
    from pipeline.train.checkpoint import latest_checkpoint, read_state

    candidates = [p for p in unfinished if latest_checkpoint(p) is not None]
    if not candidates:
        raise InputError(
            f"nothing to resume: {model_root} holds no unfinished run of {recipe.name!r} (a version folder with "
            "checkpoint/step-*.safetensors and no manifest.json); run without --resume to start a new one"
        )
    root = candidates[-1]
    saved = unflatten_top(read_state(latest_checkpoint(root)))  # newest by step number, not by name
    digest, epochs = saved.get("recipe_digest"), saved.get("epochs")
    if digest != recipe.digest or epochs != recipe.train.epochs:
        raise InputError(
            f"cannot resume {root}: it was started from another recipe or --epochs (recipe digest "
            f"{str(digest)[:12]}, epochs {epochs}; now {recipe.digest[:12]}, epochs {recipe.train.epochs}); "
            "resume with the same recipe file and --epochs, or start a new run without --resume"
        )
    started = len(saved.get("rng", [])) or processes  # one RNG state per rank
    if started != processes:
        raise InputError(
            f"cannot resume {root}: it was started with {started} process(es), this run has {processes}; "
            f"resume with --nproc {started}, or start a new run without --resume"
        )
    return root


def unflatten_top(skeleton: Any) -> dict[str, Any]:
    """The top level of a checkpoint's state skeleton as a dict (values may still be skeletons)."""
    return dict(skeleton.get("__dict__", [])) if isinstance(skeleton, dict) else {}


def check_model_fits(recipe: Recipe, splits: Splits) -> None:
    """Build the model and run two training samples through it: a shape mismatch fails here, with nothing written."""
    import torch

    from pipeline.train.zoo import build_model

    try:
        model = build_model(recipe.model, splits.info, lora=recipe.lora, base_dir=recipe.base_dir).eval()
    except (RuntimeError, ValueError, TypeError, OverflowError, MemoryError) as exc:  # sizes torch cannot allocate
        raise InputError(
            f"model arch {recipe.model.arch!r} cannot be built for the data ({first_line(exc, 200)}); make the model's "
            "sizes (hidden, channels, dim, experts...) ones that fit in memory"
        ) from None
    sample = [torch.from_numpy(splits.train.inputs[name][:2]) for name in splits.info.input_names]
    given = f"{splits.info.dtype} {['batch', *splits.info.sample_shape]}"
    try:
        with torch.no_grad():
            out = model(*sample)
    except (RuntimeError, ValueError, IndexError, TypeError) as exc:
        raise InputError(
            f"model arch {recipe.model.arch!r} cannot take the data's {given} input ({first_line(exc, 10**6)}); "
            "change the model so its input matches the data, or the data (data.source, data.as_image, data.image_size)"
        ) from None
    if splits.info.kind == "lm":  # a causal LM: logits for every position
        wanted_lm = (2, splits.info.sample_shape[0], splits.info.num_classes)
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != wanted_lm:
            shape = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise InputError(
                f"the causal LM returned {shape} for 2 rows, not logits {list(wanted_lm)} (rows, tokens, the "
                "config's vocab_size): config.json vocab_size must cover the tokenizer"
            )
        return
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, splits.info.num_classes):
        shape = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        wanted = (
            "a regression model must return one prediction per sample, [batch, 1]"
            if recipe.task == "regression"
            else f"a classifier must return logits [batch, {splits.info.num_classes}] "
            f"({splits.info.num_classes} classes in the data)"
        )
        raise InputError(f"model arch {recipe.model.arch!r} returned {shape} for 2 samples; {wanted}")


def resolve_device(requested: str) -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise InputError(
            f"device 'cuda' requested but this torch ({torch.__version__}) sees no CUDA GPU; "
            "use --device cpu (or train.device: auto)"
        )
    if requested not in ("cpu", "cuda"):
        raise InputError(f"unknown device {requested!r}; valid choices: auto, cpu, cuda")
    return requested


def _cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count()


def resolve_precision(requested: str, device: str) -> str:
    if requested == "auto":
        return "fp16" if device == "cuda" else "fp32"
    if requested == "fp16" and device != "cuda":
        raise InputError("train.precision fp16 needs a CUDA device (it uses a grad scaler); on CPU use bf16 or fp32")
    return requested


def effective_recipe(recipe: Recipe, epochs: int | None, backend: str | None = None) -> Recipe:
    """The recipe as this run trains it (`--epochs`, `--backend` applied), refusing tasks the trainer lacks."""
    if recipe.task not in ("classification", "regression", "text-generation"):  # the recipe schema refuses it first
        raise InputError(
            f"pipe train trains classification, regression and text-generation models; task {recipe.task!r} is not"
        )
    update: dict[str, Any] = {}
    if epochs is not None:
        if epochs < 1:
            raise InputError(f"--epochs must be 1 or more (got {epochs})")
        update["epochs"] = epochs
    if backend is not None:
        if backend not in ("torch", "ort"):
            raise InputError(f"unknown --backend {backend!r}; valid choices: torch, ort")
        update["backend"] = backend
    if not update:
        return recipe
    return recipe.model_copy(update={"train": recipe.train.model_copy(update=update)})


def threads_per_process(recipe: Recipe, processes: int) -> int:
    """train.threads, or with 0 the machine's cores shared out (small models run fastest on one thread)."""
    return recipe.train.threads or max(1, (os.cpu_count() or 1) // processes)


@contextlib.contextmanager
def _torch_settings(recipe: Recipe) -> Iterator[None]:
    """Fixed thread count and deterministic kernels, so a resumed run replays the same arithmetic.

    Restored afterwards: a caller in the same process (a test, `pipe run`) keeps its own settings.
    """
    import torch

    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads_per_process(recipe, int(os.environ.get("WORLD_SIZE", "1"))))
    if recipe.train.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # required by deterministic cuBLAS
        torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def up_to_date_version(recipe: Recipe, out_root: Path) -> Path | None:
    """The newest version trained from exactly this recipe's training sections and data, if any."""
    from pipeline.data.sources import read_source
    from pipeline.data.splits import fingerprint

    found = version_dirs(out_root / recipe.name)
    if not found:
        return None
    wanted = settings_digest(stage_settings(recipe, "train"))
    data_fingerprint = fingerprint(read_source(recipe))
    base = base_model_digest(recipe)
    for root in reversed(found.values()):
        try:
            record = Artifact.load(root, verify=False).manifest.stages.train
        except ArtifactError:  # a damaged or hand-broken version is never up to date; `pipe info` says why
            continue
        if (
            record is not None
            and record.settings_digest() == wanted
            and record.inputs.get("data") == data_fingerprint
            and record.inputs.get("base_model") == base
        ):
            return root
    return None


def base_model_digest(recipe: Recipe) -> str | None:
    """model.arch hf: the digest of the transformers directory trained from (None for the zoo's models)."""
    model_dir = recipe.model_dir()
    if model_dir is None:
        return None
    from pipeline.data.text import base_digest

    return base_digest(model_dir)


def _fresh(ctx: Context) -> str | None:
    ctx.root = up_to_date_version(ctx.recipe, ctx.out_root)
    return None if ctx.root is None else f"{ctx.root} was trained from these sections and data"


def _run(ctx: Context) -> str:  # train.backend in the recipe chooses the backend
    ctx.root = train_recipe(ctx.recipe_path, out_root=ctx.out_root)
    return str(ctx.root)


STAGE = Stage("train", _fresh, _run)
