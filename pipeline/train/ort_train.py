"""`pipe train --backend ort`: training with ONNX Runtime on the ONNX graph itself.

    train_ort(plan, recipe, splits, model_root, resume=False) -> Path("artifacts/digits-mlp/3")

Steps: refuse the recipe keys ONNX Runtime training cannot honour (by name, before anything is
written); write the starting model (`ort_start`) and the splits into the version directory; run
the worker (`ort_worker.py`, in the isolated runtime of `ort_runtime`) on a job file, turning the
events it prints into metrics.jsonl, TensorBoard and the progress display (`observe.Monitor`, as
the torch loop does); then finish the artifact (`ort_finish`). A killed run leaves
`checkpoint/ort-step-*/` and no manifest; `--resume` continues it from there.

Version directory while training (all of it but `.ort-job/` is listed in the manifest at the end):

    checkpoint/start.onnx                     the starting inference model (IR <= 10)
    checkpoint/ort/{training,eval,optimizer}_model.onnx, checkpoint/ort/checkpoint
                                              onnxruntime.training.artifacts' output
    checkpoint/ort-step-NNNNNN/               the last checkpoint: ORT state with the optimizer
                                              moments, best.npz (the kept epoch's weights), progress.json
    checkpoint/model.onnx                     the trained inference model (the kept epoch's weights)
    .ort-job/                                 job.json, data.npz, the worker's outputs and log; removed at the end
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.artifact.directory import allocate_version
from pipeline.artifact.manifest import MANIFEST_NAME
from pipeline.core.errors import InputError
from pipeline.data import Splits
from pipeline.recipe.schema import Recipe
from pipeline.train.ort_runtime import run_worker, runtime_dir
from pipeline.train.ort_worker import CHECKPOINT_PREFIX  # the worker's name for a checkpoint directory

if TYPE_CHECKING:
    from pipeline.train.ort_start import Start

JOB_DIR = ".ort-job"
ARTIFACTS_DIR = "checkpoint/ort"
TRAINED_MODEL = "checkpoint/model.onnx"
START_MODEL = "checkpoint/start.onnx"  # the model training starts from (IR <= 10)
FAULT_ENV = "PIPE_TRAIN_FAULT_STEP"  # test-only fault injection, as in the torch loop (docs/training.md)


def refusals(recipe: Recipe, *, nproc: int, device: str) -> list[str]:
    """Each recipe key or flag the ORT backend cannot honour, with the fix; empty when it can train the recipe."""
    cfg, found = recipe.train, []
    if recipe.task == "regression" and cfg.loss == "huber":
        found.append("train.loss 'huber': the ORT backend trains regression with mse; use loss mse (or auto)")
    if nproc != 1:
        found.append(f"--nproc {nproc}: the ORT backend trains in one process; leave --nproc out")
    if device == "cuda":
        found.append("train.device 'cuda': the ORT backend trains on the CPU here; use device cpu or auto")
    if cfg.precision not in ("fp32", "auto"):
        found.append(f"train.precision {cfg.precision!r}: the ORT backend trains in fp32; use precision fp32")
    if cfg.grad_checkpointing:
        found.append("train.grad_checkpointing: ONNX Runtime training does not recompute activations; set it false")
    if cfg.grad_accum != 1:
        found.append(f"train.grad_accum {cfg.grad_accum}: the ORT backend steps after every batch; set it to 1")
    if cfg.optimizer == "sgd" and cfg.momentum:
        found.append(
            f"train.momentum {cfg.momentum}: ONNX Runtime's SGD has no momentum; set train.momentum: 0, or use adamw"
        )
    dropout = getattr(recipe.model, "dropout", 0.0)
    if dropout:
        found.append(
            f"model.dropout {dropout}: the ORT backend trains the exported inference graph, which holds no dropout; "
            "set model.dropout: 0"
        )
    return found


def train_ort(plan: Any, recipe: Recipe, splits: Splits, model_root: Path, *, resume: bool, nproc: int = 1) -> Path:
    """Train `recipe` with ONNX Runtime into a new (or, with `resume`, the unfinished) version directory."""
    from pipeline.train.observe import Monitor
    from pipeline.train.ort_finish import finish_ort

    if problems := refusals(recipe, nproc=nproc, device=plan.device):
        raise InputError("the ORT backend cannot train this recipe: " + "; ".join(problems))
    runtime_dir()  # a missing runtime is refused before anything is written
    root = choose_ort_version(model_root, recipe) if resume else None
    if root is None:
        root = allocate_version(model_root)
    job_dir = root / JOB_DIR
    job_dir.mkdir(exist_ok=True)
    started = time.perf_counter()
    try:
        from pipeline.train.ort_start import start_model

        start = start_model(recipe, splits, root / START_MODEL)
        splits = start.splits  # --from: the targets as the parent's class indices
    except BaseException:
        if not resume:  # nothing trained yet: leave no empty version (nor an empty model directory) behind
            shutil.rmtree(root, ignore_errors=True)
            with contextlib.suppress(OSError):
                model_root.rmdir()
        raise
    write_splits(job_dir / "data.npz", splits)
    job = job_file(root, job_dir, recipe, splits, start, resume=resume)
    (job_dir / "job.json").write_text(json.dumps(job, indent=1))
    start_s, started = time.perf_counter() - started, time.perf_counter()
    resumed_step = _checkpoint_step(root) if resume else 0
    monitor = Monitor(root, enabled=True, resume_step=resumed_step, quiet=plan.quiet)
    try:
        run_worker(job_dir / "job.json", lambda event: _route(event, monitor), job_dir / "worker.log")
    finally:
        monitor.close()
    result = json.loads((job_dir / "result.json").read_text())
    # Where the time went: the starting model, the worker's graphs and sessions, its loop (wall_s), the rest
    result["timings"] = {"start_model_s": start_s, "worker_s": time.perf_counter() - started,
                         "generate_s": result.pop("generate_s"), "sessions_s": result.pop("sessions_s")}  # fmt: skip
    with np.load(job_dir / "test.npz") as test:
        outputs = test["outputs"]
    last = _checkpoints(root)
    finish_ort(
        root, recipe, splits, start, result, outputs, plan=plan, weights=TRAINED_MODEL, state=last[-1] if last else None
    )
    shutil.rmtree(job_dir, ignore_errors=True)
    return root


def write_splits(path: Path, splits: Splits) -> None:
    """The three splits as the worker reads them: one NPZ of train_x, train_y, val_x, ..., test_y."""
    name = splits.info.input_name
    np.savez(
        path,
        train_x=splits.train.inputs[name], train_y=splits.train.target,
        val_x=splits.val.inputs[name], val_y=splits.val.target,
        test_x=splits.test.inputs[name], test_y=splits.test.target,
    )  # fmt: skip


def job_file(
    root: Path, job_dir: Path, recipe: Recipe, splits: Splits, start: Start, *, resume: bool
) -> dict[str, Any]:
    """job.json, what the worker is told (ort_worker.py's doc): where its inputs and outputs are, and the
    recipe's train settings it honours."""
    cfg = recipe.train
    return {
        "start": str(start.path),
        "artifacts": str(root / ARTIFACTS_DIR),
        "trainable": start.trainable,
        "output": start.outputs[0].name,
        "loss": "mse" if recipe.task == "regression" else "cross_entropy",
        "target_std": splits.info.target_std or 1.0,
        "data": str(job_dir / "data.npz"),
        "checkpoints": str(root / "checkpoint"),
        "resume": resume,
        "recipe_digest": recipe.digest,
        "fault_step": int(os.environ.get(FAULT_ENV, "0")),
        "model_out": str(root / TRAINED_MODEL),
        "test_out": str(job_dir / "test.npz"),
        "result_out": str(job_dir / "result.json"),
        "train": {
            "epochs": cfg.epochs,
            "batch_size": cfg.batch_size,
            "optimizer": cfg.optimizer,
            "lr": cfg.lr,
            "weight_decay": cfg.weight_decay,
            "warmup_steps": cfg.warmup_steps,
            "min_lr_ratio": cfg.min_lr_ratio,
            "grad_clip": cfg.grad_clip,
            "monitor": cfg.monitor,
            "early_stopping": cfg.early_stopping,
            "checkpoint_every": cfg.checkpoint_every,
            "seed": cfg.seed,
            "threads": cfg.threads or os.cpu_count() or 1,
        },
    }


def _route(event: dict[str, Any], monitor: Any) -> None:
    """One event from the worker, to the sink the torch loop would have sent it to."""
    if "log" in event:
        monitor.log(event["log"])
    elif "progress" in event:
        monitor.progress(**event["progress"])
    elif "message" in event:
        monitor.message(event["message"])
    elif "checkpoint" in event:
        monitor.flush()  # every step the checkpoint covers is in metrics.jsonl before the worker keeps it


def _checkpoint_step(root: Path) -> int:
    found = _checkpoints(root)
    return int(found[-1].name.removeprefix(CHECKPOINT_PREFIX)) if found else 0


def _checkpoints(root: Path) -> list[Path]:
    found = (root / "checkpoint").glob(f"{CHECKPOINT_PREFIX}[0-9]*")
    return sorted(found, key=lambda p: int(p.name.removeprefix(CHECKPOINT_PREFIX)))


def choose_ort_version(model_root: Path, recipe: Recipe) -> Path:
    """The newest unfinished ORT run of this recipe (a checkpoint, no manifest), refusing another recipe's."""
    unfinished = sorted(
        (p for p in model_root.glob("[0-9]*") if p.name.isdigit() and not (p / MANIFEST_NAME).exists()),
        key=lambda p: int(p.name),
    )
    candidates = [p for p in unfinished if _checkpoints(p)]
    if not candidates:
        raise InputError(
            f"nothing to resume: {model_root} holds no unfinished ORT run of {recipe.name!r} (a version folder with "
            "checkpoint/ort-step-*/ and no manifest.json); run without --resume to start a new one"
        )
    root = candidates[-1]
    saved = json.loads((_checkpoints(root)[-1] / "progress.json").read_text())
    if saved.get("recipe_digest") != recipe.digest or saved.get("epochs") != recipe.train.epochs:
        raise InputError(
            f"cannot resume {root}: it was started from another recipe or --epochs (recipe digest "
            f"{str(saved.get('recipe_digest'))[:12]}, epochs {saved.get('epochs')}; now {recipe.digest[:12]}, epochs "
            f"{recipe.train.epochs}); resume with the same recipe and --epochs, or start a new run without --resume"
        )
    return root


def recipe_from_artifact(parent: str, recipe_path: str | None, data_file: str | None, trainable: list[str]) -> Recipe:
    """`pipe train --from ARTIFACT`: a recipe continuing that artifact's model.onnx with the ORT backend.

    With RECIPE, its data and train sections (and name); otherwise the parent's name and `--data`,
    an NPZ of X and y, with the train section's defaults. The model section is `arch: onnx` naming
    the parent, and `train.trainable` the `--trainable` patterns. The recipe's digest is that of its
    sections, so `--resume` with the same flags continues the same run.
    """
    import hashlib

    from pipeline.artifact.directory import Artifact, resolve_artifact
    from pipeline.recipe.file import load_recipe
    from pipeline.recipe.schema import parse_recipe

    root = resolve_artifact(parent).resolve()
    manifest = Artifact.load(root, verify=False).manifest  # train_ort loads it again with verification
    if recipe_path is not None:
        if data_file is not None:
            raise InputError("--data and RECIPE both give the data; pass one (a recipe's data section, or --data)")
        base = load_recipe(recipe_path)
        if base.name != manifest.name:  # the new version goes into the parent's model directory, under its name
            raise InputError(
                f"recipe {recipe_path} is named {base.name!r}, but --from {parent} continues {manifest.name!r} and "
                f"puts the new version beside it ({root.parent}); set the recipe's name to {manifest.name!r}"
            )
        raw = base.model_dump(mode="json")
        raw["model"] = {"arch": "onnx", "artifact": str(root)}
        raw["train"] = {**raw["train"], "backend": "ort", "trainable": trainable or raw["train"]["trainable"]}
        digest_of, base_dir = base.digest, base.base_dir
    else:
        if data_file is None:
            raise InputError(
                f"--from {parent} needs data to train on: --data FILE.npz (arrays X and y), or a RECIPE whose data "
                "section names it"
            )
        raw = {
            "name": manifest.name,
            "task": manifest.task,
            "model": {"arch": "onnx", "artifact": str(root)},
            "data": {"source": "npz", "path": str(Path(data_file).resolve()), "normalize": False},
            "train": {"backend": "ort", "trainable": trainable},
        }
        digest_of, base_dir = "", Path(".")
    recipe = parse_recipe(raw, f"pipe train --from {parent}", base_dir)
    digest = hashlib.sha256((digest_of + json.dumps(raw, sort_keys=True)).encode()).hexdigest()
    return recipe.model_copy(update={"digest": digest})
