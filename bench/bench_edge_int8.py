"""int8 edge models where one int8 scale per tensor does not fit (issue 18): every row of the gate.

    .venv/bin/python bench/bench_edge_int8.py /tmp/edge-int8 [--precision int8 ...]   # the checkout it lies in

Two models built here (nothing downloaded), imported and converted as a user would (`pipe import`, then
`pipe export --target edge`), then the int8 model is judged again by the gate on LiteRT to print every
row (the manifest keeps only the summary of a passed model):

- the YOLOv8-layout colour detector (tests/export/real_models.py `colour_detector`, boxes 0..320 px and scores
  0..1 in one output), imported with 16 pictures of shapes: box agreement against the 0.9 budget;
- the house-price regression MLP (tests/edge/test_edge_conversion.py `houses`: eight raw columns from 0.5..15 to
  3..35,000, a leading (x - mean) / std, outputs -59,000..431,000), 200 rows: relative error against 0.01.

The candidate is the stand-alone runner on the edge model with feeding.json beside it, so the same script
measures a checkout before this change (which has no `normalize`/`boxes`) and after it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "edge")]

from test_edge_conversion import houses  # noqa: E402

from pipeline.artifact.directory import Artifact  # noqa: E402
from pipeline.artifact.manifest import ModelSpec  # noqa: E402
from pipeline.cli import main as pipe  # noqa: E402
from pipeline.edge.shapes import device_specs, fitted_evaluation  # noqa: E402
from pipeline.edge.stage import policy_for  # noqa: E402
from pipeline.recipe.schema import EdgeSpec  # noqa: E402
from pipeline.runtime.runners import Candidate, ort_runner  # noqa: E402
from pipeline.runtime.tflite_runner import TFLiteRunner  # noqa: E402
from pipeline.samples.evaluation import evaluation_set  # noqa: E402
from pipeline.verify.gate import verify  # noqa: E402
from tests.export.real_models import SIZES, colour_detector, shapes_picture  # noqa: E402


def convert(root: Path, precisions: list[str]) -> None:
    flags = [f for p in precisions for f in ("--precision", p)]
    result = CliRunner().invoke(pipe, ["export", str(root), "--target", "edge", *flags])
    print("\n".join(line for line in result.output.splitlines() if line.startswith(("[edge] tflite", "edge:"))))
    for name, variant in Artifact.load(root).manifest.variants.items():
        if name.startswith("tflite-"):
            print(f"{name}: {variant.status}; settings {variant.settings}; parity {variant.parity}")


def judge_int8(root: Path, scratch: Path) -> None:
    artifact = Artifact.load(root)
    manifest = artifact.manifest
    evaluation = evaluation_set(artifact)
    inputs, outputs, _ = device_specs(manifest, evaluation.samples, {})
    evaluation, _ = fitted_evaluation(evaluation, inputs)
    policy = policy_for("int8", EdgeSpec(), manifest.task, evaluation.target is not None, manifest.detection)
    candidate = Candidate(TFLiteRunner(root / "edge" / "model.int8.tflite"), "TFLite", "LiteRT")
    spec = ModelSpec(inputs, outputs, manifest.task)
    print(verify(candidate, ort_runner(root / "model.onnx"), evaluation, spec, policy, scratch=scratch).table())


def imported(repo: Path, model: Path, name: str, data: Path, *flags: str) -> Path:
    args = ["import", str(model), "--name", name, "--eval-data", str(data), "--repository", str(repo), *flags]
    result = CliRunner().invoke(pipe, args)
    assert result.exit_code == 0, result.output
    return repo / name / "1"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--precision", action="append", default=None)
    args = parser.parse_args()
    out, precisions = args.out, args.precision or ["int8"]
    (out / "pictures").mkdir(parents=True, exist_ok=True)
    for i in range(16):
        shapes_picture(SIZES[i % len(SIZES)], seed=i).save(out / "pictures" / f"p{i:02d}.png")
    detector = imported(out / "repo", colour_detector(out / "colour.onnx"), "colour", out / "pictures")
    print("== colour detector")
    convert(detector, precisions)
    judge_int8(detector, out / "scratch-colour")
    model, x = houses(out / "houses.onnx")
    np.savez(out / "eval.npz", x=x)
    house = imported(out / "repo", model, "houses", out / "eval.npz", "--task", "regression")
    print("== house prices")
    convert(house, precisions)
    judge_int8(house, out / "scratch-houses")


if __name__ == "__main__":
    main()
