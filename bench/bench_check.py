"""Benchmark `pipe check`'s side-by-side latency check: false alarms on the same model, and a slower one caught.

    .venv/bin/python bench/bench_check.py [--repeats 20] [--slow-repeats 5] [--latency-seconds 2]
                                          [--out bench/results/check.json]

The digits CNN recipe (models/digits-cnn.yaml) is trained, exported and optimized by `pipe train`,
`pipe export` and `pipe optimize` into a temporary repository. Then, each a real `pipe check` in a child process:
  1. the artifact against itself, `--repeats` times, at the default latency budget and at
     `--max-latency-increase 0.10`: the false alarms (a latency failure of a model against itself)
     and the distribution of the measured ratios;
  2. slower candidates: the trained model.onnx with a needless heavy op added (a K x K MatMul of
     a broadcast of the input's sum, multiplied by zero and added to the output: the outputs are
     bit for bit the same, checked on the golden inputs, and onnxruntime cannot fold it away because
     it depends on the input), imported with the artifact's golden test split as evaluation data;
     `--slow-repeats` checks each against the trained model.onnx imported the same way (so latency
     is all that differs): the exit code and the ratio each time.

The machine is shared: absolute milliseconds move between runs; ratios measured side by side in one
run are what `pipe check` judges. Results: the printed lines, bench/results/check.json and a copy of
the printed output in bench/results/check.txt.
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

import numpy as np
from benchkit import Out

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "models" / "digits-cnn.yaml"
HEAVY_SIZES = (32, 48, 96, 192)  # K of the needless K x K MatMul: from about 10% slower to several times
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}", "CI": "true"}


def pipe(*args: str, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[str]:
    """A `pipe` command as a user runs it; raises with its output on an exit code not in `ok`."""
    proc = subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, env=ENV,
                          cwd=ROOT)  # fmt: skip
    if proc.returncode not in ok:
        raise RuntimeError(f"pipe {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def train(work: Path, out: Out) -> Path:
    """`pipe train`, `pipe export` and `pipe optimize` of the digits CNN recipe (TFLite plays no part in a check)."""
    path = work / "digits-cnn.yaml"
    path.write_text(RECIPE.read_text())
    start, root = time.perf_counter(), work / "artifacts" / "digits-cnn" / "1"
    pipe("train", str(path), "--out", str(work / "artifacts"), "--quiet")
    pipe("export", str(root))
    pipe("optimize", str(root))
    out(f"pipe train, export, optimize digits-cnn.yaml: {time.perf_counter() - start:.1f} s -> {root}")
    return root


def with_heavy_op(source: Path, target: Path, k: int) -> None:
    """model.onnx plus a needless K x K MatMul that depends on the input, times zero, added to the first output."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(source))
    graph = model.graph
    x, y = graph.input[0].name, graph.output[0].name
    inner = f"{y}__before_heavy"
    for node in graph.node:  # the node that made the output now makes `inner`; the output is inner + 0 * heavy
        node.output[:] = [inner if name == y else name for name in node.output]
    graph.initializer.extend([
        helper.make_tensor("heavy__shape", TensorProto.INT64, [2], [k, k]),
        helper.make_tensor("heavy__zero", TensorProto.FLOAT, [], [0.0]),
    ])  # fmt: skip
    graph.node.extend([
        helper.make_node("ReduceSum", [x], ["heavy__sum"], keepdims=0),  # a scalar that depends on the input
        helper.make_node("Expand", ["heavy__sum", "heavy__shape"], ["heavy__big"]),  # [K, K]
        helper.make_node("MatMul", ["heavy__big", "heavy__big"], ["heavy__square"]),  # K^3 multiply-adds
        helper.make_node("ReduceSum", ["heavy__square"], ["heavy__total"], keepdims=0),
        helper.make_node("Mul", ["heavy__total", "heavy__zero"], ["heavy__nothing"]),
        helper.make_node("Add", [inner, "heavy__nothing"], [y]),
    ])  # fmt: skip
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(target))


def same_outputs(a: Path, b: Path, inputs: dict[str, np.ndarray]) -> bool:
    import onnxruntime as ort

    run = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, inputs) for p in (a, b)]
    return all(np.array_equal(u, v) for u, v in zip(*run, strict=True))


def check(candidate: Path, baseline: Path, report: Path, seconds: float, *budget: str) -> dict[str, Any]:
    """One `pipe check`: its exit code and the latency check's figures from --json."""
    proc = pipe("check", str(candidate), "--baseline", str(baseline), "--json", str(report),
                "--latency-seconds", str(seconds), *budget, ok=(0, 1))  # fmt: skip
    checks = {c["name"]: c for c in json.loads(report.read_text())["checks"]}
    failed = [name for name, c in checks.items() if c["status"] == "failed"]
    return {"exit": proc.returncode, "failed": failed, **checks["latency"]["figures"]}


def fmt(ratios: list[float]) -> str:
    return ", ".join(f"{r:.3f}" for r in ratios)


def spread(ratios: list[float]) -> dict[str, float]:
    return {"min": min(ratios), "median": statistics.median(ratios), "max": max(ratios)}


def self_checks(root: Path, work: Path, repeats: int, seconds: float, out: Out) -> dict[str, Any]:
    from pipeline.recipe.budgets import BudgetSpec

    default = BudgetSpec().max_latency_increase
    results = {}
    for increase in sorted({default, 0.10}):
        label = f"{increase:g}" + (" (default)" if increase == default else "")
        runs = []
        for i in range(repeats):
            runs.append(check(root, root, work / "self.json", seconds, "--max-latency-increase", str(increase)))
            r = runs[-1]
            again = f" (measured {len(r['ratios'])} times: {fmt(r['ratios'])})" if len(r["ratios"]) > 1 else ""
            out(
                f"  self {i + 1:2}/{repeats} budget x{1 + increase:.2f}: exit {r['exit']}, "
                f"ratio {r['ratio']:.3f}{again}"
            )
        alarms = sum(r["exit"] != 0 for r in runs)
        first = [r["ratios"][0] for r in runs]  # the first measurement of each check, before any re-measure
        results[label] = {"max_latency_increase": increase, "false_alarms": alarms, "runs": runs,
                          "ratio": spread([r["ratio"] for r in runs]), "first_ratio": spread(first),
                          "re_measured": sum(len(r["ratios"]) > 1 for r in runs)}  # fmt: skip
        s = results[label]
        out(f"same model x{repeats}, budget x{1 + increase:.2f}: {alarms} false alarm(s); ratio min "
            f"{s['ratio']['min']:.3f} median {s['ratio']['median']:.3f} max {s['ratio']['max']:.3f}; "
            f"{s['re_measured']} check(s) re-measured")  # fmt: skip
    return results


def slow_checks(root: Path, work: Path, repeats: int, seconds: float, out: Out) -> dict[str, Any]:
    from pipeline.artifact.directory import Artifact
    from pipeline.artifact.golden import load_golden

    golden = load_golden(Artifact.load(root))
    data = work / "eval.npz"
    np.savez(data, **golden.inputs, target=golden.target)
    labels = ",".join(json.loads((root / "manifest.json").read_text())["labels"])
    repo = work / "artifacts"
    pipe("import", str(root / "model.onnx"), "--name", "digits-cnn-plain", "--eval-data", str(data), "--labels",
         labels, "--repository", str(repo))  # fmt: skip
    plain = repo / "digits-cnn-plain" / "1"
    results = {}
    for k in HEAVY_SIZES:
        source = work / f"heavy-{k}.onnx"
        with_heavy_op(root / "model.onnx", source, k)
        identical = same_outputs(root / "model.onnx", source, golden.inputs)
        name = f"digits-cnn-heavy-{k}"
        pipe("import", str(source), "--name", name, "--eval-data", str(data), "--labels", labels,
             "--repository", str(repo))  # fmt: skip
        runs = [check(repo / name / "1", plain, work / "slow.json", seconds) for _ in range(repeats)]
        caught = sum(r["exit"] == 1 and r["failed"] == ["latency"] for r in runs)
        results[name] = {"k": k, "identical_outputs": identical, "caught": caught, "runs": runs,
                         "ratio": spread([r["ratio"] for r in runs])}  # fmt: skip
        out(
            f"heavy op K={k}: outputs identical {identical}; caught {caught}/{repeats} (latency alone failed, "
            f"exit 1); ratios {fmt([r['ratio'] for r in runs])}; budget x{runs[0]['budget']:.2f}; failed "
            f"{sorted({n for r in runs for n in r['failed']})}"
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20, help="self-checks per budget")
    parser.add_argument("--slow-repeats", type=int, default=5, help="checks of each slower candidate")
    parser.add_argument("--latency-seconds", type=float, default=2.0, help="pipe check --latency-seconds")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "check.json")
    args = parser.parse_args()
    out = Out()
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    out(f"pipe at commit {commit.stdout.strip()}; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-check-") as tmp:
        work = Path(tmp)
        root = train(work, out)
        out(f"\n== 1. the same model against itself, {args.repeats} times per budget "
            f"(--latency-seconds {args.latency_seconds:g})")  # fmt: skip
        same = self_checks(root, work, args.repeats, args.latency_seconds, out)
        out(f"\n== 2. slower candidates: a needless heavy op added ({args.slow_repeats} checks each)")
        slow = slow_checks(root, work, args.slow_repeats, args.latency_seconds, out)
    out(f"\ntotal {time.perf_counter() - started:.0f} s; load average at the end {os.getloadavg()[0]:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results = {"commit": commit.stdout.strip(), "cores": os.cpu_count(), "latency_seconds": args.latency_seconds,
               "repeats": args.repeats, "self": same, "slow": slow}  # fmt: skip
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    args.out.with_suffix(".txt").write_text("\n".join(out.lines) + "\n")
    print(f"wrote {args.out} and {args.out.with_suffix('.txt')}")


if __name__ == "__main__":
    main()
