"""The ONNX Runtime training worker: one stand-alone script, run in the isolated runtime (`.venv-ort`).

onnxruntime-training 1.19.2 is the same `onnxruntime` module as the main environment's newer
onnxruntime, so it cannot be imported by pipe itself. `pipe train --backend ort`
(pipeline/train/ort_train.py) runs this file as a script with PYTHONPATH pointing at that runtime,
and the two talk through files:

    python ort_worker.py JOB.json

- in: `JOB.json` (paths and the recipe's train settings), the starting inference model
  (`start`, IR version <= 10) and the splits (`data`, an NPZ: train_x, train_y, val_x, val_y, test_x);
- out: the training artifacts (`artifacts/`: training, eval and optimizer models, first
  checkpoint), checkpoints (`checkpoints/ort-step-NNNNNN/`: the ORT checkpoint with the optimizer
  state, the kept epoch's weights, the progress as JSON), the trained inference model (`model_out`),
  the test split's outputs (`test_out`) and the run's figures (`result_out`);
- on stdout: one JSON object a line, `{"log": record}`, `{"progress": {...}}` or `{"message": text}`,
  which pipe turns into metrics.jsonl, TensorBoard and the progress display; and `{"checkpoint":
  step}` before a checkpoint is renamed into place, which pipe answers with `ok` on stdin once the
  metrics up to that step are on disk.

It imports numpy, onnx and onnxruntime (training) and nothing of pipe; an import-linter contract
(`ort-worker-alone`) keeps it so. The loop mirrors pipeline/train/loop.py: a permutation seeded by
(seed, epoch) cut into batches, the learning rate set every step (linear warmup, then cosine decay),
evaluation at each epoch end, the kept epoch by `monitor` with ties to the lower loss, early
stopping, and a checkpoint every `checkpoint_every` steps and at each epoch end.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

# What this script copies from pipe (it may import none of it), held equal to the originals by
# tests/train/test_ort_worker_copies.py: these tables, `lr_at`, `improves` and `evaluate`'s figures.
# pipe's side reads MAX_IR_VERSION and CHECKPOINT_PREFIX from here (ort_start.py, ort_train.py).
MAX_IR_VERSION = 10  # onnxruntime-training 1.19 loads IR version 10 at most; onnx >= 1.18 writes 11 and up
CHECKPOINT_PREFIX = "ort-step-"  # a checkpoint directory: ort-step-NNNNNN, the optimizer steps done
EVAL_BATCH = 512  # pipeline/train/objective.py's EVAL_BATCH
MONITORS = {"val_loss": False, "val_accuracy": True, "val_mae": False, "val_rmse": False, "val_r2": True,
            "val_perplexity": False}  # fmt: skip  # pipeline/recipe/schema.py's: train.monitor -> higher is better


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python ort_worker.py JOB.json", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[0]).read_text())
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)  # errors only: the training graph builder logs every transformer
    artifacts = Path(job["artifacts"])
    started = time.perf_counter()
    if not (artifacts / "training_model.onnx").is_file():
        generate(job, artifacts)
    train(job, artifacts, generate_s=time.perf_counter() - started)
    return 0


def emit(**event: Any) -> None:
    """One event for pipe, a JSON line on stdout."""
    print(json.dumps(event), flush=True)


def generate(job: dict[str, Any], artifacts: Path) -> None:
    """The training, eval and optimizer models and the first checkpoint, from the starting model.

    Parameters not chosen as trainable are frozen (kept as parameters, never updated), so they
    cannot be folded into other constants and leave the run bit-identical.
    """
    import onnx
    from onnxruntime.training import artifacts as ort_artifacts
    from onnxruntime.training import onnxblock

    model = onnx.load(job["start"])
    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    trainable = job["trainable"]
    frozen = [i.name for i in model.graph.initializer if i.name not in set(trainable)]
    cfg = job["train"]
    clip = onnxblock.optim.ClipGradNorm(cfg["grad_clip"]) if cfg["grad_clip"] else None
    if cfg["optimizer"] == "sgd":
        optimizer = onnxblock.optim.SGD(clip_grad=clip)
    else:  # torch's AdamW defaults, as the torch backend uses them
        optimizer = onnxblock.optim.AdamW(
            betas=(0.9, 0.999), eps=1e-8, weight_decay=cfg["weight_decay"], clip_grad=clip
        )
    partial = artifacts.with_name(artifacts.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    if job["loss"] == "mse":  # regression: MSE on standardized values, as the torch backend's objective
        loss: Any = _standardized_mse(onnxblock, job["target_std"])
    else:
        loss = ort_artifacts.LossType.CrossEntropyLoss
    ort_artifacts.generate_artifacts(
        model,
        requires_grad=trainable,
        frozen_params=frozen,
        loss=loss,
        optimizer=optimizer,
        artifact_directory=partial,
        additional_output_names=[job["output"]],  # the eval model answers loss and logits
    )
    for path in partial.glob("*.onnx"):  # the optimizer graph is written by this onnx, at its newest IR version
        graph = onnx.load(path)
        if graph.ir_version > MAX_IR_VERSION:
            graph.ir_version = MAX_IR_VERSION
            onnx.save(graph, path)
    shutil.rmtree(artifacts, ignore_errors=True)
    os.replace(partial, artifacts)


def _standardized_mse(onnxblock: Any, std: float) -> Any:
    """MSE of (prediction - target) / std: the model predicts [B, 1] in target units, the target comes as [B, 1].

    The mean cancels in the difference, so only the train split's target std scales the loss (as
    pipeline/train/objective.py's regression loss).
    """

    class StandardizedMSE(onnxblock.Block):
        def __init__(self) -> None:
            super().__init__()
            self._mse = onnxblock.loss.MSELoss()
            self._scale = onnxblock.blocks.Constant(std)
            self._output, self._target = onnxblock.blocks.Div(), onnxblock.blocks.Div()

        def build(self, output: str, target: str = "target") -> str:
            target = onnxblock.blocks.InputLike(output)(target)  # a graph input shaped like the output
            scale = self._scale()
            return self._mse(self._output(output, scale), self._target(target, scale))

    return StandardizedMSE()


def lr_at(step: int, cfg: dict[str, Any], total_steps: int) -> float:
    """Linear warmup over warmup_steps, then cosine decay to min_lr_ratio * lr (pipeline/train/loop.py's lr_at)."""
    lr, warmup = cfg["lr"], cfg["warmup_steps"]
    if step < warmup:
        return lr * (step + 1) / warmup
    decay = (step - warmup) / max(1, total_steps - warmup)
    floor = lr * cfg["min_lr_ratio"]
    return floor + 0.5 * (1.0 + math.cos(math.pi * min(decay, 1.0))) * (lr - floor)


def improves(monitor: str, record: dict[str, float], progress: dict[str, Any]) -> bool:
    """Better on the monitored figure, or equal on it with a lower loss (pipeline/train/objective.py's rule)."""
    value, loss = record[monitor.removeprefix("val_")], record["loss"]
    if not math.isfinite(value):
        return False
    if progress["best_epoch"] < 0:
        return True
    if value != progress["best_metric"]:
        return value > progress["best_metric"] if MONITORS[monitor] else value < progress["best_metric"]
    return loss < progress["best_loss"]


def latest_checkpoint(directory: Path) -> Path | None:
    found = sorted(
        directory.glob(f"{CHECKPOINT_PREFIX}[0-9]*"), key=lambda p: int(p.name.removeprefix(CHECKPOINT_PREFIX))
    )
    return found[-1] if found else None


def evaluate(module: Any, x: np.ndarray, y: np.ndarray, regression: bool) -> tuple[dict[str, float], np.ndarray]:
    """Mean loss and the task's figures over a whole split, and the outputs, in eval mode.

    Classifiers: accuracy. Regression ([N, 1] predictions in target units): MAE, RMSE and R^2 as
    pipeline/verify/metrics.py's regression_metrics computes them.
    """
    module.eval()
    total, outputs = 0.0, []
    for start in range(0, len(y), EVAL_BATCH):
        loss, out = module(x[start : start + EVAL_BATCH], y[start : start + EVAL_BATCH])
        total += float(loss) * len(out)  # the loss is the batch mean
        outputs.append(np.asarray(out, dtype=np.float32))
    module.train()
    out = np.concatenate(outputs)
    figures = {"loss": total / len(y)}
    if not regression:
        return figures | {"accuracy": int((out.argmax(axis=1) == y).sum()) / len(y)}, out
    error = out.astype(np.float64).reshape(len(y), -1) - y.astype(np.float64).reshape(len(y), -1)
    want = y.astype(np.float64)
    ss_res, ss_tot = float((error**2).sum()), float(((want - want.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)
    return figures | {"mae": float(np.abs(error).mean()), "rmse": float(np.sqrt((error**2).mean())), "r2": r2}, out


def _targets(y: np.ndarray, regression: bool) -> np.ndarray:
    """Class indices as int64 [N], or regression targets as float32 [N, 1] (the loss's target input)."""
    return y.astype(np.float32).reshape(-1, 1) if regression else y.astype(np.int64)


def train(job: dict[str, Any], artifacts: Path, generate_s: float) -> None:
    """The loop: batches -> loss and gradients -> step, each epoch evaluated, checkpointed, maybe stopped early;
    then the kept epoch's weights exported with their test outputs and the run's figures."""
    started = time.perf_counter()
    cfg = job["train"]
    data = np.load(job["data"])
    regression = job["loss"] == "mse"
    x_train, y_train = data["train_x"], _targets(data["train_y"], regression)  # [N, ...]; [N] classes or [N, 1]
    x_val, y_val = data["val_x"], _targets(data["val_y"], regression)
    checkpoints = Path(job["checkpoints"])
    checkpoints.mkdir(parents=True, exist_ok=True)

    resume_from = latest_checkpoint(checkpoints) if job["resume"] else None
    state, module, optimizer = open_training(artifacts, resume_from, cfg["threads"])
    trainable = job["trainable"]
    sessions_s = time.perf_counter() - started  # loading the training runtime and its three graphs

    batches_per_epoch = math.ceil(len(y_train) / cfg["batch_size"])
    total_steps = cfg["epochs"] * batches_per_epoch
    progress, best = new_progress(), {}
    if resume_from is not None:
        progress, best = resume(resume_from, trainable)

    def checkpoint() -> None:
        save_checkpoint(job, checkpoints / f"{CHECKPOINT_PREFIX}{progress['step']:06d}", state, progress, best)

    fault_step = int(job.get("fault_step") or 0)
    samples, first_step, t0, cpu0 = 0, progress["step"], time.perf_counter(), time.process_time()
    module.train()
    while progress["epoch"] < cfg["epochs"] and not progress["stopped_early"]:
        # The epoch's order: a permutation seeded by (seed, epoch), so a resumed run sees the same batches.
        order = np.random.default_rng([cfg["seed"], progress["epoch"]]).permutation(len(y_train))
        for b in range(progress["batch"], batches_per_epoch):
            idx = order[b * cfg["batch_size"] : (b + 1) * cfg["batch_size"]]
            lr = lr_at(progress["step"], cfg, total_steps)
            optimizer.set_learning_rate(lr)
            loss, _ = module(x_train[idx], y_train[idx])  # forward and backward: gradients accumulate in the module
            value = float(loss)
            if not math.isfinite(value):  # the last line of the log: pipe's error quotes it
                print(
                    f"loss became {value} at epoch {progress['epoch'] + 1}, step {progress['step'] + 1} (lr {lr:.3g}); "
                    "the last good checkpoint is kept. Lower train.lr or set train.grad_clip, then train again",
                    file=sys.stderr,
                )
                sys.exit(4)
            optimizer.step()
            module.lazy_reset_grad()
            progress["step"] += 1
            progress["batch"] = b + 1
            samples += len(idx)
            rate = samples / max(time.perf_counter() - t0, 1e-9)
            emit(log={"kind": "train", "epoch": progress["epoch"] + 1, "step": progress["step"], "loss": value,
                      "lr": lr, "samples_per_s": rate})  # fmt: skip
            eta = (total_steps - progress["step"]) * (time.perf_counter() - t0) / (progress["step"] - first_step)
            emit(progress={"epoch": progress["epoch"], "epochs": cfg["epochs"], "step": progress["step"],
                           "total_steps": total_steps, "loss": value, "rate": rate, "eta": eta})  # fmt: skip
            if progress["step"] % cfg["checkpoint_every"] == 0:
                checkpoint()
            if progress["step"] == fault_step:
                # The documented fault-injection hook (docs/training.md): kill `pipe train` itself, as an
                # external `kill -9` would, right after a step; this process follows it (PR_SET_PDEATHSIG).
                os.kill(os.getppid(), signal.SIGKILL)
                os.kill(os.getpid(), signal.SIGKILL)

        if end_epoch(module, x_val, y_val, regression, cfg, progress):  # the best epoch so far: keep its weights
            best = {n: np.array(state.parameters[n].data, copy=True) for n in trainable}
        checkpoint()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0

    # The kept epoch's weights, its outputs on the test split, and the inference model that holds them.
    for name, value in best.items():
        state.parameters[name].data = value
    test_x, test_y = data["test_x"], _targets(data["test_y"], regression)
    test, outputs = evaluate(module, test_x, test_y, regression)
    np.savez(job["test_out"], outputs=outputs)
    module.export_model_for_inferencing(job["model_out"], [job["output"]])
    result = {"progress": progress, "test": test, "wall_s": wall, "cpu_s": cpu,
              "samples_per_s": samples / max(wall, 1e-9), "runtime": f"onnxruntime-training {_version()}",
              "generate_s": generate_s, "sessions_s": sessions_s}  # fmt: skip
    Path(job["result_out"]).write_text(json.dumps(result))


def open_training(artifacts: Path, resume_from: Path | None, threads: int) -> tuple[Any, Any, Any]:
    """The checkpoint state (the first one, or `resume_from`'s), the training module and its optimizer."""
    from onnxruntime import SessionOptions
    from onnxruntime.training.api import CheckpointState, Module, Optimizer

    state = CheckpointState.load_checkpoint(resume_from / "state" if resume_from else artifacts / "checkpoint")
    options = SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.use_deterministic_compute = True  # the same arithmetic every run: a resumed run replays it
    module = Module(artifacts / "training_model.onnx", state, artifacts / "eval_model.onnx", "cpu", options)
    return state, module, Optimizer(artifacts / "optimizer_model.onnx", module)


def new_progress() -> dict[str, Any]:
    """Where a new run is (pipeline/train/loop.py's Progress, as JSON); saved in every checkpoint."""
    return {
        "step": 0, "epoch": 0, "batch": 0, "best_metric": math.nan, "best_loss": math.inf, "best_epoch": -1,
        "stale_epochs": 0, "stopped_early": False, "history": [],
    }  # fmt: skip


def resume(checkpoint: Path, trainable: list[str]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The progress saved in `checkpoint`, and the kept epoch's weights (none before the first evaluation)."""
    progress = json.loads((checkpoint / "progress.json").read_text())["progress"]
    best: dict[str, np.ndarray] = {}
    if progress["best_epoch"] >= 0:
        with np.load(checkpoint / "best.npz") as kept:
            best = {name: kept[name] for name in trainable}
    emit(message=f"resumed from {checkpoint} at step {progress['step']}")
    return progress, best


def save_checkpoint(
    job: dict[str, Any], final: Path, state: Any, progress: dict[str, Any], best: dict[str, np.ndarray]
) -> None:
    """ORT state (weights and optimizer moments), the kept weights and the progress, renamed into place whole
    as `final`, once pipe has the metrics up to this step on disk; older checkpoints are then removed."""
    from onnxruntime.training.api import CheckpointState

    partial = final.with_name(f".{final.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    CheckpointState.save_checkpoint(state, partial / "state", include_optimizer_state=True)
    np.savez(partial / "best.npz", **(best or {n: state.parameters[n].data for n in job["trainable"]}))
    saved = {"recipe_digest": job["recipe_digest"], "epochs": job["train"]["epochs"], "progress": progress}
    (partial / "progress.json").write_text(json.dumps(saved))
    for path in partial.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    # pipe writes metrics.jsonl up to this step and answers; only then does the checkpoint count, so a
    # kill at any moment never leaves a checkpoint covering steps whose metrics are not on disk.
    emit(checkpoint=progress["step"])
    if sys.stdin.readline().strip() != "ok":
        sys.exit(5)  # pipe is gone
    shutil.rmtree(final, ignore_errors=True)
    os.replace(partial, final)
    for older in final.parent.glob(f"{CHECKPOINT_PREFIX}[0-9]*"):
        if older != final:
            shutil.rmtree(older, ignore_errors=True)


def end_epoch(
    module: Any, x_val: np.ndarray, y_val: np.ndarray, regression: bool, cfg: dict[str, Any], progress: dict[str, Any]
) -> bool:
    """Evaluate the epoch on the validation split and move `progress` past it (the kept epoch by `monitor`,
    early stopping on the same figure); whether this epoch is now the kept one, whose weights the caller keeps."""
    figures, _ = evaluate(module, x_val, y_val, regression)
    record = {"epoch": progress["epoch"] + 1, **figures}
    progress["history"].append(record)
    emit(log={"kind": "val", "step": progress["step"], **record})
    shown = " ".join(f"{k} {v:.4f}" for k, v in figures.items())
    emit(message=f"epoch {progress['epoch'] + 1}/{cfg['epochs']}: val {shown}")
    monitor = cfg["monitor"]
    kept = improves(monitor, record, progress)
    if kept:
        progress["best_metric"], progress["best_loss"] = record[monitor.removeprefix("val_")], record["loss"]
        progress["best_epoch"], progress["stale_epochs"] = progress["epoch"] + 1, 0
    else:
        progress["stale_epochs"] += 1
    progress["epoch"], progress["batch"] = progress["epoch"] + 1, 0
    if cfg["early_stopping"] is not None and progress["stale_epochs"] >= cfg["early_stopping"]:
        progress["stopped_early"] = True
        emit(message=f"early stop: {cfg['early_stopping']} epochs without a better {monitor}")
    return kept


def _version() -> str:
    import onnxruntime

    return onnxruntime.__version__


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
