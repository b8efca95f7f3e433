"""Benchmark `pipe train` on digits-cnn: wall time, accuracy, and the loop's overhead over bare PyTorch.

    .venv/bin/python bench/bench_train.py [--repeats 3] [--out bench/results/train.json]

Two measurements, side by side in one run:
  1. end to end: `pipe train models/digits-cnn.yaml` as a user runs it (a subprocess: python start,
     imports, data, training, test evaluation, golden.npz, manifest), its wall time and test accuracy;
     goal <= 60 s and >= 98%.
  2. loop overhead: pipe's loop (`pipeline.train.loop.fit` via `train_recipe`: warmup + cosine
     schedule, per-step metrics.jsonl + TensorBoard, per-epoch validation, a checkpoint every epoch,
     best-weights tracking) against a bare PyTorch loop (shuffle, forward, cross-entropy, backward,
     AdamW step) on the same model, data, batch size, epoch count, thread count and deterministic
     setting, early stopping off so both run every epoch. Two comparisons:
       - machinery (the goal, <= 1.05): the same arithmetic on both sides, i.e. the bare loop also
         evaluates the validation split each epoch and uses pipe's two AdamW parameter groups (no
         weight decay on biases), and pipe runs with grad_clip off;
       - as configured: the recipe as written (gradient clipping on) against the minimal bare loop
         (no validation), which adds the cost of those two features on top.
     Runs alternate (bare, pipe, bare, pipe ...) and medians are compared, in process CPU time
     (all threads; steady on a shared machine) and in wall time (what a user waits; noisy here).

The machine is shared: absolute times move between runs; the ratio measured in one run is what to
quote.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "models" / "digits-cnn.yaml"


def end_to_end(out: Path) -> dict[str, Any]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "CI": "true"}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pipeline", "train", str(RECIPE), "--out", str(out), "--quiet"],
                   check=True, env=env, cwd=ROOT)  # fmt: skip
    wall = time.perf_counter() - start
    manifest = json.loads(next(out.glob("digits-cnn/*/manifest.json")).read_text())
    train = manifest["stages"]["train"]
    return {"wall_s": wall, "loop_s": train["wall_s"], "test_accuracy": manifest["metrics"]["accuracy"],
            "epochs_run": train["epochs_run"], "steps": train["steps"]}  # fmt: skip


def pipe_loop(recipe_path: Path, out: Path) -> tuple[float, float]:
    """(wall, CPU) seconds spent in pipe's `fit` (the loop alone: no imports, data loading or artifact writing)."""
    from pipeline.train.stage import train_recipe

    root = train_recipe(recipe_path, out_root=out, quiet=True)
    train = json.loads((root / "manifest.json").read_text())["stages"]["train"]
    return float(train["wall_s"]), float(train["cpu_s"])


def bare_loop(recipe_path: Path, validate: bool) -> tuple[float, float]:
    """The loop a person writes first, timed over the same scope as `fit`.

    With `validate`, it does the arithmetic pipe does (validation each epoch, decay-free biases), so
    the difference is pipe's machinery alone.
    """
    import torch
    from torch.nn import functional as F

    from pipeline.data import load_splits
    from pipeline.recipe.file import load_recipe
    from pipeline.train.stage import threads_per_process
    from pipeline.train.zoo import build_model

    recipe = load_recipe(recipe_path)
    cfg = recipe.train
    splits = load_splits(recipe)
    torch.set_num_threads(threads_per_process(recipe, 1))  # the count pipe's loop runs with
    torch.use_deterministic_algorithms(cfg.deterministic)
    torch.manual_seed(cfg.seed)
    model = build_model(recipe.model, splits.info)
    x = torch.from_numpy(splits.train.inputs["input"])
    y = torch.from_numpy(splits.train.target)
    x_val, y_val = torch.from_numpy(splits.val.inputs["input"]), torch.from_numpy(splits.val.target)
    if validate:  # same arithmetic as pipe: weight decay on matrices only (nanoGPT's grouping)
        params = list(model.parameters())
        optimizer = torch.optim.AdamW(
            [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}], lr=cfg.lr)  # fmt: skip
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    start, cpu = time.perf_counter(), time.process_time()
    model.train()
    for _ in range(cfg.epochs):
        for idx in torch.randperm(len(y)).split(cfg.batch_size):
            loss = F.cross_entropy(model(x[idx]), y[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        if validate:
            model.eval()
            with torch.no_grad():
                logits = model(x_val)
                F.cross_entropy(logits, y_val).item(), (logits.argmax(1) == y_val).float().mean().item()
            model.train()
    return time.perf_counter() - start, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs of each loop")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "train.json")
    args = parser.parse_args()

    import yaml

    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        work = Path(tmp)
        e2e = end_to_end(work / "e2e")
        print(f"pipe train digits-cnn: {e2e['wall_s']:.1f} s end to end (loop {e2e['loop_s']:.1f} s, "
              f"{e2e['epochs_run']} epochs), test accuracy {e2e['test_accuracy']:.4f}")  # fmt: skip

        raw = yaml.safe_load(RECIPE.read_text())
        raw["train"]["early_stopping"] = None  # both loops run every epoch
        configured = work / "digits-cnn.yaml"
        configured.write_text(yaml.safe_dump(raw))
        raw["train"]["grad_clip"] = None  # the bare loop does not clip
        same_work = work / "digits-cnn-noclip.yaml"
        same_work.write_text(yaml.safe_dump(raw))
        runs: dict[str, list[tuple[float, float]]] = {
            "bare": [], "bare_validating": [], "pipe_same_work": [], "pipe_configured": []
        }  # fmt: skip
        for i in range(args.repeats):
            runs["bare"].append(bare_loop(configured, validate=False))
            runs["pipe_same_work"].append(pipe_loop(same_work, work / f"same{i}"))
            runs["bare_validating"].append(bare_loop(configured, validate=True))
            runs["pipe_configured"].append(pipe_loop(configured, work / f"conf{i}"))
            print(
                f"  run {i + 1} (wall/cpu s):", ", ".join(f"{k} {v[-1][0]:.2f}/{v[-1][1]:.2f}" for k, v in runs.items())
            )
    wall = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
    ratios = {
        "same_work_cpu": cpu["pipe_same_work"] / cpu["bare_validating"],
        "same_work_wall": wall["pipe_same_work"] / wall["bare_validating"],
        "as_configured_cpu": cpu["pipe_configured"] / cpu["bare"],
        "as_configured_wall": wall["pipe_configured"] / wall["bare"],
    }
    print(
        f"loop overhead, same work: pipe / bare = {ratios['same_work_cpu']:.3f} CPU time, "
        f"{ratios['same_work_wall']:.3f} wall (medians of {args.repeats}; goal <= 1.05)"
    )
    print(f"as configured (+ grad clipping, + validation each epoch) over the minimal bare loop: "
          f"{ratios['as_configured_cpu']:.3f} CPU time, {ratios['as_configured_wall']:.3f} wall")  # fmt: skip

    results = {
        "benchmark": "train",
        "recipe": str(RECIPE.relative_to(ROOT)),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "load_avg": os.getloadavg()},
        "end_to_end": e2e,
        "loop": {"epochs": raw["train"]["epochs"], "runs_wall_cpu_s": runs, "median_wall_s": wall,
                 "median_cpu_s": cpu, "pipe_over_bare": ratios},
        "goals": {"wall_s_max": 60, "accuracy_min": 0.98, "pipe_over_bare_max": 1.05},
        "met": {"wall": e2e["wall_s"] <= 60, "accuracy": e2e["test_accuracy"] >= 0.98,
                "overhead": ratios["same_work_cpu"] <= 1.05},
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
