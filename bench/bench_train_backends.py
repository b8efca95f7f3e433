"""Benchmark the two training backends on one recipe: test accuracy and time, side by side.

    .venv/bin/python bench/bench_train_backends.py [--repeats 3] [--out bench/results/train_backends.json]

`pipe train models/digits-mlp-ort.yaml` as a user runs it (a subprocess each time: python start,
imports, data, training, test evaluation, golden.npz, manifest), once with `--backend torch` and
once with `--backend ort` (ONNX Runtime training in `.venv-ort`, built by `make ort-runtime`),
alternating torch, ort, torch, ort ... so both see the same machine load. Reported per backend
(medians): end-to-end wall time, the training loop's wall and CPU time (the train record's
`wall_s`/`cpu_s`: the loop alone, inside pipe or inside the ORT worker), samples/s, epochs run and
test accuracy; and the ORT/torch ratios. The ORT run's end-to-end time includes exporting the
starting model to ONNX, generating the training graphs and starting the worker process.

The machine is shared: absolute times move between runs; quote the ratios of one run.
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
RECIPE = ROOT / "models" / "digits-mlp-ort.yaml"
BACKENDS = ("torch", "ort")


def one_run(backend: str, out: Path) -> dict[str, Any]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "CI": "true"}
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "pipeline", "train", str(RECIPE), "--backend", backend, "--out", str(out), "--quiet"]
    subprocess.run(cmd, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    manifest = json.loads(next(out.glob("digits-mlp-ort/*/manifest.json")).read_text())
    train = manifest["stages"]["train"]
    report = json.loads(next(out.glob("digits-mlp-ort/*/reports/train.json")).read_text())
    return {
        "wall_s": wall,
        "loop_wall_s": train["wall_s"],
        "loop_cpu_s": train["cpu_s"],
        "samples_per_s": train["samples_per_s"],
        "epochs_run": train["epochs_run"],
        "steps": train["steps"],
        "test_accuracy": manifest["metrics"]["accuracy"],
        "framework": train["framework"],
        "ort_timings": report.get("timings"),  # ort: starting model, worker, graph generation, sessions
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "train_backends.json")
    args = parser.parse_args()

    runs: dict[str, list[dict[str, Any]]] = {b: [] for b in BACKENDS}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for backend in BACKENDS:
                result = one_run(backend, Path(tmp) / f"{backend}-{i}")
                runs[backend].append(result)
                print(f"{backend:5} run {i + 1}: {json.dumps(result)}", flush=True)

    def median(backend: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[backend])

    keys = ("wall_s", "loop_wall_s", "loop_cpu_s", "samples_per_s", "test_accuracy", "epochs_run", "steps")
    summary = {b: {k: median(b, k) for k in keys} | {"framework": runs[b][0]["framework"]} for b in BACKENDS}
    ratios = {f"ort/torch {k}": median("ort", k) / median("torch", k) for k in ("wall_s", "loop_wall_s", "loop_cpu_s")}
    report = {
        "recipe": str(RECIPE.relative_to(ROOT)),
        "repeats": args.repeats,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "load": os.getloadavg()},
        "median": summary,
        "ratios": ratios,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'backend':8} {'test acc':>8} {'wall s':>8} {'loop s':>8} {'loop cpu s':>10} {'epochs':>6}")
    for b in BACKENDS:
        s = summary[b]
        print(f"{b:8} {s['test_accuracy']:8.4f} {s['wall_s']:8.1f} {s['loop_wall_s']:8.2f} {s['loop_cpu_s']:10.2f} "
              f"{s['epochs_run']:6.0f}")  # fmt: skip
    print(" ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
