"""Weight-only int8 and int4 of the python-llama model trained by `pipe train`: size, next-token agreement and
KL to fp32, perplexity, and prefill / decode tokens/s beside fp32 and torch eager, in one run.

    .venv/bin/python bench/bench_lm_quant.py [--artifact artifacts/python-llama/1] [--out bench/results/lm_quant.json]
    .venv/bin/python bench/bench_lm_quant.py --config hidden_size=256 --config intermediate_size=768 \
        --config num_hidden_layers=6 --config num_attention_heads=8 --config num_key_value_heads=4 \
        --epochs 4 --lr 0.002 --out bench/results/lm_quant_wide.json      # the wider model (5.2 M parameters)

1. **The model**: `--artifact`, a python-llama version trained by `pipe train models/python-llama.yaml` and
   exported by `pipe export`; without it the bench makes one the same way in a temporary directory
   (`python -m pipeline.data.make_lm`, `pipe train`, `pipe export`: about 5 minutes here), its
   config.json changed by each `--config KEY=VALUE` and the recipe's epochs and lr by `--epochs`, `--lr`.
2. **The variants**: `pipe optimize` of a copy, as a user runs it: `int8-weights` and `int4-weights` with
   the defaults (block 32, symmetric, accuracy level 4), then the settings the defaults were chosen
   against (accuracy level 0; asymmetric; block 128; the embedding in the same bits). Each is judged by
   `pipe optimize` itself, teacher-forced on golden.npz's held-out blocks (pipeline/verify/lm_judge.py):
   agreement, KL and perplexity are read from its report.
3. **Speed**: torch eager (the trained transformers model behind the same cache wrapper the graph was
   exported from), model.onnx and each variant timed side by side by pipeline/runtime/lm_speed.py on
   the first golden prompt (batch 1), --new-tokens greedy tokens, one thread each.

The machine is shared (2 cores, other work running): ratios from one window hold better than the absolute
tokens/s, which are what this run got.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from benchkit import pipe  # noqa: E402

RUNS = {  # label -> the optimize flags (besides --quantize) its variants are made with
    "default": [],
    "accuracy level 0": ["--weight-accuracy-level", "0"],
    "asymmetric": ["--weight-asymmetric"],
    "block 128": ["--weight-block-size", "128"],
    "embeddings too": ["--weight-embeddings"],
}


def make_python_llama(work: Path, config: dict[str, int], epochs: int, lr: float) -> Path:
    """models/python-llama.yaml's model, made as its comment says (make_lm, pipe train, pipe export), with
    `config` over the config.json make_lm writes and the recipe's epochs and learning rate."""
    recipe = work / "models" / "python-llama.yaml"
    recipe.parent.mkdir(parents=True)
    text = (ROOT / "models" / "python-llama.yaml").read_text()
    recipe.write_text(text.replace("  epochs: 6\n", f"  epochs: {epochs}\n").replace("  lr: 0.003\n", f"  lr: {lr}\n"))
    from pipeline.data.make_lm import make_lm

    made = make_lm(work / "models" / "data" / "python-llama")
    config_file = made / "scratch" / "config.json"
    config_file.write_text(json.dumps(json.loads(config_file.read_text()) | config, indent=2))
    begin = time.perf_counter()
    pipe("train", str(recipe), "--out", str(work / "artifacts"))
    root = work / "artifacts" / "python-llama" / "1"
    pipe("export", str(root))
    print(f"trained and exported {root} in {time.perf_counter() - begin:.0f} s", flush=True)
    return root


def optimized(source: Path, work: Path, label: str, flags: list[str]) -> tuple[Path, dict[str, Any]]:
    """A copy of `source` through `pipe optimize` with `flags`; its root and its report."""
    manifest = json.loads((source / "manifest.json").read_text())
    root = work / label.replace(" ", "-") / manifest["name"] / str(manifest["version"])
    shutil.copytree(source, root, ignore=shutil.ignore_patterns("variants", "checkpoint"))
    shutil.copytree(source / "checkpoint", root / "checkpoint")  # torch eager reads the trained weights
    pipe("optimize", str(root), "--graph", "none", "--quantize", "int8-weights", "--quantize", "int4-weights", *flags)
    return root, json.loads((root / "reports" / "optimize.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--artifact", type=Path, default=None, help="a trained and exported python-llama version")
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="without --artifact: a config.json key of the model made (hidden_size=256)",
    )
    parser.add_argument("--epochs", type=int, default=6, help="without --artifact: the recipe's epochs")
    parser.add_argument("--lr", type=float, default=0.003, help="without --artifact: the recipe's learning rate")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "lm_quant.json")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    from pipeline.artifact.directory import Artifact
    from pipeline.artifact.golden import load_golden
    from pipeline.runtime.decoder import CachedDecoder
    from pipeline.runtime.lm_speed import measure_lm, ort_decoders
    from pipeline.runtime.runners import torch_runner
    from pipeline.train.restore import load_trained_model

    out: dict[str, Any] = {"threads": 1, "new_tokens": args.new_tokens, "variants": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        config = {k: int(v) for k, v in (item.split("=", 1) for item in args.config)}
        source = args.artifact.resolve() if args.artifact else make_python_llama(work, config, args.epochs, args.lr)
        artifact = Artifact.load(source)
        m = artifact.manifest
        fp32_size = m.files["model.onnx"].size
        out["model"] = {"name": m.name, "parameters": None, "size": fp32_size, "test_perplexity": m.metrics.get(
            "perplexity"), "cache": str(m.generation.cache) if m.generation else None}  # fmt: skip
        files: dict[str, Path] = {"fp32": source / "model.onnx"}
        for label, flags in RUNS.items():
            root, report = optimized(source, work, label, flags)
            print(f"{label}: judged on {report['evaluation']}", flush=True)
            for v in report["variants"]:
                metric = v["gate"]["metric"]
                row = {
                    "run": label, "variant": v["variant"], "status": v["status"], "settings": v["settings"],
                    "size": v["size"], "size_ratio": v["size"] / fp32_size, "agreement": metric["agreement"],
                    "kl": metric["kl"], "perplexity": metric["onnx"], "fp32_perplexity": metric["reference"],
                    "tokens": metric["samples"], "optimize_speed": v["latency"],
                }  # fmt: skip
                out["variants"].append(row)
                files[f"{v['variant']} ({label})"] = root / v["file"]
                print(f"  {v['variant']:<13} {v['status']:<7} {row['size_ratio']:.2f}x  agreement "
                      f"{row['agreement']:.4f}  KL {row['kl']:.3g}  perplexity {row['perplexity']:.3f} "
                      f"(fp32 {row['fp32_perplexity']:.3f})", flush=True)  # fmt: skip
        out["judged_on"] = report["evaluation"]
        model = load_trained_model(artifact)
        net = getattr(model, "net", model)
        out["model"]["parameters"] = sum(p.numel() for p in net.parameters())
        decoder = CachedDecoder(net).eval()
        runners = {"torch eager": torch_runner(decoder, m.inputs, m.outputs), **ort_decoders(files)}
        golden = load_golden(artifact).inputs
        ids, mask = golden["input_ids"][:1], golden["attention_mask"][:1]
        assert m.generation is not None
        speeds = measure_lm(runners, m.generation.cache, ids, mask, args.new_tokens, 1, args.seconds,
                            progress=print)  # fmt: skip
        base = speeds["fp32"]
        out["speed"] = {name: s.to_dict() for name, s in speeds.items()}
        print(f"\nbatch 1, a {base.prompt_tokens}-token prompt, {args.new_tokens} new tokens, one thread:")
        for name, s in speeds.items():
            prefill, decode = s.prefill_tokens_per_s, s.decode_tokens_per_s
            print(f"  {name:<32} prefill {prefill:>9,.0f} tokens/s ({prefill / base.prefill_tokens_per_s:.2f}x)  "
                  f"decode {decode:>7,.0f} tokens/s ({decode / base.decode_tokens_per_s:.2f}x)  {s.runs} runs",
                  flush=True)  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()
