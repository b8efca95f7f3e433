"""The training loop, top to bottom: batches -> loss -> backward -> clip -> step -> evaluate -> checkpoint.

One function, `fit`, in the style of nanoGPT's train.py; its phases that are a unit of their own are
named functions beside it: `resume`, `optimizer_step` (clip and step), `end_epoch` (the validation
record, the kept epoch, early stopping) and `save_checkpoint`. The whole dataset lives on the device as
tensors (these datasets are small), so a batch is an index into them: no DataLoader workers, and
the data order is a pure function of (seed, epoch), which is what makes resuming exact.

Exact resume: a checkpoint records the optimizer step, the epoch, the next micro-batch within it,
the optimizer/scaler state, every RNG state (python, numpy, torch; per rank), the best weights
and the early-stopping counters. Restoring all of it and replaying the same deterministic
kernels gives the same weights, bit for bit, as a run that was never interrupted (CPU, same
thread count, `train.deterministic: true`).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.core.errors import PipelineError
from pipeline.data import Splits
from pipeline.recipe.schema import Recipe
from pipeline.train import distributed as dist_
from pipeline.train.checkpoint import CheckpointWriter, load_checkpoint, rng_state, set_rng_state
from pipeline.train.objective import evaluate, improves, kept_reason, objective_for
from pipeline.train.observe import Monitor

FAULT_ENV = "PIPE_TRAIN_FAULT_STEP"  # test-only fault injection: SIGKILL this process after step K


class TrainingDiverged(PipelineError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


@dataclass
class Progress:
    """Where the run is, saved in every checkpoint."""

    step: int = 0  # optimizer steps done
    epoch: int = 0  # the epoch in progress (or the next one, after its checkpoint)
    batch: int = 0  # the next micro-batch of this epoch on this rank
    best_metric: float = math.nan  # the kept epoch's value of train.monitor (e.g. val_loss)
    best_loss: float = math.inf  # the kept epoch's validation loss: breaks ties on the monitored value
    best_epoch: int = -1  # the epoch whose weights are kept (-1: none evaluated yet)
    stale_epochs: int = 0  # epochs since the kept epoch (early stopping)
    stopped_early: bool = False
    history: list[dict[str, float]] = field(default_factory=list)  # one validation record per epoch


@dataclass
class Run:
    """What `fit` needs besides the model and the data."""

    recipe: Recipe
    root: Path  # the version directory (rank 0 writes into it)
    world: dist_.World
    device: torch.device
    precision: str  # fp32 | bf16 | fp16 (resolved, never auto)
    monitor: Monitor
    resume_from: Path | None = None  # the step-*.safetensors checkpoint to continue from


@dataclass
class FitResult:
    best_weights: dict[str, torch.Tensor]  # full state dict on CPU (rank 0; other ranks may hold {})
    progress: Progress
    wall_s: float
    cpu_s: float  # process CPU time over the loop: steadier than wall time on a shared machine
    samples_per_s: float
    checkpoint: Path | None  # the last checkpoint file written (or resumed from)


def fit(run: Run, model: nn.Module, splits: Splits) -> FitResult:
    """Train `model` on `splits` as `run.recipe.train` says, from scratch or from `run.resume_from`: the kept
    epoch's weights, the run's progress and figures, the last checkpoint."""
    cfg, world, device = run.recipe.train, run.world, run.device
    # The dataset on the device: each model input x [N, ...] by name, in the order forward takes them
    # (one for the zoo's models; input_ids and attention_mask [N, T] for a text model), and y [N].
    x_train = on_device(splits.train.inputs, splits.info.input_names, device)
    y_train = torch.from_numpy(splits.train.target).to(device)
    x_val = on_device(splits.val.inputs, splits.info.input_names, device)
    y_val = torch.from_numpy(splits.val.target).to(device)

    model.to(device)
    if cfg.grad_checkpointing:
        for module in model.modules():
            if hasattr(module, "grad_checkpointing"):
                module.grad_checkpointing = True
    model = dist_.wrap(model, world, cfg.strategy, device, say=run.monitor.message)
    objective = objective_for(run.recipe, splits.info)  # cross-entropy, or MSE / Huber on standardized targets
    optimizer = make_optimizer(model, cfg)
    scaler = torch.amp.GradScaler(device.type, enabled=run.precision == "fp16")
    autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(run.precision)

    # Each rank takes every world.size-th sample of a permutation seeded by (seed, epoch).
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(
        range(len(y_train)), num_replicas=world.size, rank=world.rank, shuffle=True, seed=cfg.seed
    )
    batches_per_epoch = math.ceil(len(sampler) / cfg.batch_size)
    steps_per_epoch = math.ceil(batches_per_epoch / cfg.grad_accum)
    total_steps = cfg.epochs * steps_per_epoch

    progress = Progress()
    best_weights: dict[str, torch.Tensor] = {}  # the kept epoch's weights, on the CPU
    if run.resume_from is not None:
        progress, best_weights = resume(run, run.resume_from, model, optimizer, scaler)

    writer = CheckpointWriter(run.root)

    def checkpoint() -> None:
        save_checkpoint(run, writer, model, optimizer, scaler, progress, best_weights)

    fault_step = int(os.environ.get(FAULT_ENV, "0"))
    samples, first_step, t0, cpu0 = 0, progress.step, time.perf_counter(), time.process_time()
    try:
        while progress.epoch < cfg.epochs and not progress.stopped_early:
            sampler.set_epoch(progress.epoch)
            order = torch.tensor(list(sampler), device=device)  # this rank's sample indices for the epoch
            batches = order.split(cfg.batch_size)
            model.train()
            step_loss = 0.0
            for b in range(progress.batch, len(batches)):
                idx = batches[b]
                last_micro = (b + 1) % cfg.grad_accum == 0 or b + 1 == len(batches)
                # Micro-batches in this accumulation group: the epoch's last group may be shorter, and
                # its gradient and logged loss are still the mean over the micro-batches it has.
                group = min(cfg.grad_accum, len(batches) - b + b % cfg.grad_accum)
                # DDP all-reduces gradients only on the micro-batch that ends an accumulation group.
                no_sync = not last_micro and hasattr(model, "no_sync")
                with model.no_sync() if no_sync else contextlib.nullcontext():
                    with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                        outputs = model(*rows(x_train, idx))  # [B, classes] logits, or [B, 1] predictions
                        loss = objective(outputs.float(), y_train[idx])
                    value = loss.item()
                    if not math.isfinite(value):
                        kept = writer.wait() or run.resume_from
                        raise _diverged(value, progress, lr_at(progress.step, cfg, total_steps), run.precision, kept)
                    scaler.scale(loss / group).backward()
                step_loss += value / group
                samples += len(idx)
                if not last_micro:
                    continue

                lr = lr_at(progress.step, cfg, total_steps)  # warmup, then cosine decay
                optimizer_step(model, optimizer, scaler, lr, cfg.grad_clip)
                progress.step += 1
                progress.batch = b + 1

                rate = samples * world.size / max(time.perf_counter() - t0, 1e-9)
                run.monitor.log({"kind": "train", "epoch": progress.epoch + 1, "step": progress.step,
                                 "loss": step_loss, "lr": lr, "samples_per_s": rate})  # fmt: skip
                eta = (total_steps - progress.step) * (time.perf_counter() - t0) / (progress.step - first_step)
                run.monitor.progress(epoch=progress.epoch, epochs=cfg.epochs, step=progress.step,
                                     total_steps=total_steps, loss=step_loss, rate=rate, eta=eta)  # fmt: skip
                step_loss = 0.0
                if progress.step % cfg.checkpoint_every == 0:
                    checkpoint()
                if progress.step == fault_step and world.main:
                    writer.wait()  # a reproducible kill point: the last checkpoint is on disk
                    os.kill(os.getpid(), signal.SIGKILL)  # documented fault-injection hook (docs/training.md)

            # End of epoch: evaluate on the validation split, keep the weights of the epoch best on
            # train.monitor (ties: the lower validation loss), maybe stop early on the same figure.
            figures = evaluate(dist_.unwrap(model) if cfg.strategy == "ddp" else model, x_val, y_val, objective)
            if end_epoch(run, figures, progress):  # the best epoch so far: keep its weights
                best = dist_.full_weights(model, cfg.strategy, world)  # not the optimizer state: FSDP gathers
                best_weights = {k: v.detach().to("cpu").clone() for k, v in best.items()}
            checkpoint()
    finally:
        last = writer.wait() or run.resume_from  # every checkpoint on disk before returning or raising
    run.monitor.message(kept_reason(cfg.monitor, progress, cfg.epochs, cfg.early_stopping))

    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0  # all threads of this process: writer threads count too
    return FitResult(best_weights, progress, wall, cpu, samples * world.size / max(wall, 1e-9), last)


def resume(
    run: Run, checkpoint: Path, model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler
) -> tuple[Progress, dict[str, torch.Tensor]]:
    """Load `checkpoint` into the model, optimizer, scaler and this rank's RNGs; the progress it saved and
    the kept epoch's weights (none when it was saved before the first evaluation)."""
    cfg, world = run.recipe.train, run.world
    weights, best_weights, state = load_checkpoint(checkpoint)
    dist_.load_full_state(model, optimizer, weights, state["optimizer"], cfg.strategy, world)
    if state["scaler"]:
        scaler.load_state_dict(state["scaler"])
    set_rng_state(state["rng"][world.rank])
    progress = Progress(**state["progress"])
    if progress.best_epoch < 0:
        best_weights = {}  # saved before the first evaluation: there is no best yet
    run.monitor.message(f"resumed from {checkpoint} at step {progress.step}")
    return progress, best_weights


def save_checkpoint(
    run: Run,
    writer: CheckpointWriter,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    progress: Progress,
    best_weights: dict[str, torch.Tensor],
) -> None:
    """Every rank takes part (FSDP gathers shards, RNG states are collected); rank 0 writes, in the background."""
    cfg, world = run.recipe.train, run.world
    weights, optim_state = dist_.full_state(model, optimizer, cfg.strategy, world)
    rngs = _gather(world, rng_state())
    if not world.main:
        return
    state = {
        "recipe_digest": run.recipe.digest,  # resume refuses another recipe
        "epochs": cfg.epochs,
        "progress": asdict(progress),
        "optimizer": optim_state,
        "scaler": scaler.state_dict(),
        "rng": rngs,
    }
    run.monitor.flush()  # the metrics of every step this checkpoint covers are on disk first
    writer.submit(progress.step, weights, best_weights or weights, state)


def optimizer_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, lr: float, clip: float | None
) -> None:
    """One optimizer step on the accumulated gradients at learning rate `lr`, clipped to a global norm of `clip`."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    if clip is not None:
        scaler.unscale_(optimizer)  # clip the true gradients, not the fp16 loss-scaled ones
        nn.utils.clip_grad_norm_(model.parameters(), clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)


def end_epoch(run: Run, figures: dict[str, float], progress: Progress) -> bool:
    """Record the epoch's validation `figures` and move `progress` past the epoch: the kept epoch by
    train.monitor, early stopping on the same figure. Whether this epoch is now the kept one."""
    cfg = run.recipe.train
    record = {"epoch": progress.epoch + 1, **figures}
    progress.history.append(record)
    run.monitor.log({"kind": "val", "step": progress.step, **record})
    shown = " ".join(f"{k} {v:.4f}" for k, v in figures.items())
    run.monitor.message(f"epoch {progress.epoch + 1}/{cfg.epochs}: val {shown}")
    kept = improves(cfg.monitor, record, progress)
    if kept:
        progress.best_metric, progress.best_loss = record[cfg.monitor.removeprefix("val_")], record["loss"]
        progress.best_epoch, progress.stale_epochs = progress.epoch + 1, 0
    else:
        progress.stale_epochs += 1
    progress.epoch, progress.batch = progress.epoch + 1, 0
    if cfg.early_stopping is not None and progress.stale_epochs >= cfg.early_stopping:
        progress.stopped_early = True
        run.monitor.message(f"early stop: {cfg.early_stopping} epochs without a better {cfg.monitor}")
    return kept


def on_device(inputs: dict[str, Any], names: list[str], device: torch.device) -> dict[str, torch.Tensor]:
    """The named numpy inputs as tensors on `device`, in the order the model's forward takes them."""
    return {name: torch.from_numpy(inputs[name]).to(device) for name in names}


def rows(x: dict[str, torch.Tensor], idx: torch.Tensor | slice) -> tuple[torch.Tensor, ...]:
    """The rows `idx` of every input, as the model's positional arguments."""
    return tuple(t[idx] for t in x.values())


def _diverged(value: float, progress: Progress, lr: float, precision: str, kept: Path | None) -> TrainingDiverged:
    where = f"the last good checkpoint is kept in {kept}" if kept else "no checkpoint was written yet"
    return TrainingDiverged(
        f"loss became {value} at epoch {progress.epoch + 1}, step {progress.step + 1} (lr {lr:.3g}, precision "
        f"{precision}); {where}. Lower "
        "train.lr, set train.grad_clip, or use precision fp32, then train again"
    )


def make_optimizer(model: nn.Module, cfg: Any) -> torch.optim.Optimizer:
    """AdamW or SGD; weight decay on matrices and embeddings only, not on biases and norms."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum)
    return torch.optim.AdamW(groups, lr=cfg.lr)


def lr_at(step: int, cfg: Any, total_steps: int) -> float:
    """Linear warmup over warmup_steps, then cosine decay from lr, reaching min_lr_ratio * lr at total_steps."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    decay = (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (1.0 + math.cos(math.pi * min(decay, 1.0))) * (cfg.lr - floor)


def _gather(world: dist_.World, value: Any) -> list[Any]:
    """Every rank's `value`, in rank order (a one-element list with one process)."""
    if not world.distributed:
        return [value]
    import torch.distributed as dist

    out: list[Any] = [None] * world.size
    dist.all_gather_object(out, value)
    return out
